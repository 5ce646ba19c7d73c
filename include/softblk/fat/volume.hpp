// FAT12/16/32 with VFAT long names on a fat::block_device.
//
// Threads: a volume may be used from any number of threads. Each operation
// (a lookup, an allocation, a write) holds the volume for its whole length,
// so concurrent creators in one directory never lose a file.
//
// Errors: metadata operations return result<T> (std::expected with an
// errno-style code and a message); file I/O returns bytes done or -errno.
// A corrupt image gives EIO with a message naming the cluster or entry; a
// path through a directory entry that leads back to one of its ancestors
// (a directory cycle, the root included) gives ELOOP naming that entry's
// path. volume::problems() keeps what was seen. To walk a tree, use
// fat::walk (walk.hpp), which also refuses cycles and cross-links.
//
// Ownership: the caller owns the block_device and keeps it alive while the
// volume is mounted. A file handle that outlives its volume only closes.
#pragma once

#include <cstdint>
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <softblk/fat/block_device.hpp>
#include <softblk/types.hpp>

namespace softblk::fat {

enum class fat_type : uint8_t { fat12 = 12, fat16 = 16, fat32 = 32 };

// Largest file FAT can hold: 4 GiB - 1. Writes or truncates beyond give EFBIG.
inline constexpr uint64_t k_max_file_size = 0xFFFFFFFFull;

struct format_options {
    std::optional<fat_type> type;   // default: chosen as mkfs.fat does (FAT32 from 512 MiB)
    uint32_t cluster_size = 0;      // bytes, power of two; 0: as mkfs.fat would
    uint32_t sector_size = 0;       // bytes per logical sector; 0: the device's (at least 512)
    std::string label = "NO NAME";  // up to 11 characters
    uint32_t volume_id = 0;         // 0: derived from the clock
    unsigned fat_count = 2;
    uint32_t root_entries = 512;  // FAT12/16 fixed root directory
    uint64_t size_bytes = 0;      // 0: the whole device
};

// Writes an empty file system on `device`. Errors explain which option to
// change ("FAT32 needs at least 65525 clusters ... use FAT16 or at least 33 MiB").
// Any thread; the device must not be mounted.
result<void> format(block_device& device, const format_options& options = {});

struct mount_options {
    bool read_only = false;
    // Sectors of FAT and directory cache, and of file data cache (separate).
    uint32_t meta_cache_sectors = 8192;
    uint32_t data_cache_sectors = 4096;
    // A cache miss reads this many following sectors in one request.
    uint32_t read_ahead_sectors = 64;
    // Dirty metadata sectors that trigger a write-back at the end of an
    // operation (metadata is only written between operations, so the image
    // on the device is always the state after some complete operation).
    uint32_t meta_dirty_limit = 2048;
    // Sequential direct writes are gathered (copied) into one device
    // request of up to this many bytes; 0: every aligned write of 4 KiB or
    // more goes straight from the caller's buffer to the device.
    // k_write_behind_auto: as block_device::write_gather_bytes() says (0 for
    // in-process memory, 1 MiB for files and remote devices), asked at the
    // first direct write.
    static constexpr uint32_t k_write_behind_auto = UINT32_MAX;
    uint32_t write_behind_bytes = k_write_behind_auto;
};

enum open_flag : unsigned {
    k_open_read = 1u << 0,
    k_open_write = 1u << 1,
    k_open_create = 1u << 2,
    k_open_exclusive = 1u << 3,
    k_open_truncate = 1u << 4,
    k_open_append = 1u << 5,
    k_open_directory = 1u << 6,  // succeed on a directory (read-only handle, for fsync)
};

inline constexpr uint8_t k_attr_read_only = 0x01;
inline constexpr uint8_t k_attr_hidden = 0x02;
inline constexpr uint8_t k_attr_system = 0x04;
inline constexpr uint8_t k_attr_volume_id = 0x08;
inline constexpr uint8_t k_attr_directory = 0x10;
inline constexpr uint8_t k_attr_archive = 0x20;

struct file_stat {
    uint64_t size = 0;       // 0 for directories
    uint64_t allocated = 0;  // bytes in clusters, as the size implies
    bool is_directory = false;
    uint8_t attributes = 0;
    uint32_t first_cluster = 0;
    std::time_t modified = 0;  // local time stored by FAT, as time_t
    std::time_t created = 0;
    std::time_t accessed = 0;
};

struct dir_entry {
    std::string name;        // long name (UTF-8), or the 8.3 name with the NT case bits applied
    std::string short_name;  // "README.TXT"
    file_stat stat;
};

struct volume_stat {
    fat_type type = fat_type::fat32;
    uint32_t sector_size = 0;
    uint32_t cluster_size = 0;
    uint32_t total_clusters = 0;
    uint32_t free_clusters = 0;
    uint32_t volume_id = 0;
    std::string label;
    bool was_dirty = false;  // the dirty bit was set when mounted (not cleanly unmounted)
};

struct cache_stats {
    uint64_t meta_hits = 0, meta_misses = 0;
    uint64_t data_hits = 0, data_misses = 0;
    uint64_t direct_reads = 0, direct_writes = 0;
    uint64_t writeback_runs = 0;
};

class volume;
struct node;
struct volume_state;

// An open file. Movable; closes itself when destroyed. Every call locks the
// volume. Offsets are bytes; results are bytes done or -errno.
class file {
public:
    file() = default;
    file(file&& other) noexcept;
    file& operator=(file&& other) noexcept;
    file(const file&) = delete;
    file& operator=(const file&) = delete;
    ~file();

    bool is_open() const { return _volume != nullptr; }

    // Reads up to `length` bytes at `offset`; 0 at or past the end.
    int64_t pread(void* buffer, size_t length, uint64_t offset);
    // Writes `length` bytes at `offset`; a gap past the end reads back as
    // zeros. -EFBIG beyond 4 GiB - 1, -ENOSPC with nothing written.
    int64_t pwrite(const void* buffer, size_t length, uint64_t offset);
    // Sequential variants using the handle's position (append honoured).
    int64_t read(void* buffer, size_t length);
    int64_t write(const void* buffer, size_t length);
    uint64_t tell() const { return _position; }
    void seek(uint64_t position) { _position = position; }

    // Grows (zeros) or shrinks the file. 0 or -errno.
    int truncate(uint64_t size);
    // Writes the file's data, its directory entry, the FAT copies and
    // FSInfo, then flushes the device. 0 or -errno.
    int fsync();
    uint64_t size() const;
    result<file_stat> stat() const;
    // Closes; frees the clusters of a file unlinked while open. 0 or -errno.
    int close();
    // The same for every open handle of one file, and for no other file
    // while one is open: for callers that keep state per open file.
    const void* identity() const { return _node.get(); }

private:
    friend class volume;
    // Shared with the volume, so a handle closed after unmount is harmless.
    std::shared_ptr<struct volume_state> _volume;
    std::shared_ptr<node> _node;
    unsigned _flags = 0;
    uint64_t _position = 0;
};

class volume {
public:
    // Mounts the FAT on `device`. A read-write mount sets the dirty bits
    // (boot sector and FAT[1]) until unmount(). Errors say what is wrong
    // with the image ("boot sector: bytes per sector is 384, must be ...").
    static result<std::unique_ptr<volume>> mount(block_device& device,
                                                 const mount_options& options = {});

    // Unmounts if still mounted (errors then only logged to problems()).
    ~volume();
    volume(const volume&) = delete;
    volume& operator=(const volume&) = delete;

    // Writes everything, clears the dirty bits and flushes. Open handles
    // stay usable only for close().
    result<void> unmount();
    // Writes every dirty sector (data first, then directories, FATs and
    // FSInfo) and flushes the device.
    result<void> sync();

    // Paths are absolute or relative to the root, '/'-separated UTF-8;
    // names compare without regard to ASCII case, as FAT does.
    result<file> open(std::string_view path, unsigned flags);
    result<file> create(std::string_view path)
    {
        return open(path, k_open_read | k_open_write | k_open_create | k_open_truncate);
    }
    result<void> mkdir(std::string_view path);
    result<void> rmdir(std::string_view path);
    result<void> unlink(std::string_view path);
    // Moves a file or directory, across directories too; replaces an
    // existing file, or an empty directory by a directory (POSIX rename).
    result<void> rename(std::string_view from, std::string_view to);
    result<void> truncate(std::string_view path, uint64_t size);
    result<file_stat> stat(std::string_view path);
    result<std::vector<dir_entry>> readdir(std::string_view path);
    result<void> set_times(std::string_view path, std::time_t modified, std::time_t accessed);
    result<void> set_attributes(std::string_view path, uint8_t attributes);
    result<volume_stat> statfs();

    // Messages about damage seen so far (bad names, odd chains).
    std::vector<std::string> problems() const;
    cache_stats stats() const;
    block_device& device();

    // Test hook: forgets every dirty cached sector without writing it, as a
    // power cut would, and makes the volume refuse further work.
    void crash_for_testing();

private:
    friend class file;
    explicit volume(std::shared_ptr<volume_state> state);
    std::shared_ptr<volume_state> _impl;
};

}  // namespace softblk::fat
