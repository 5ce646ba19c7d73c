// The state behind a mounted FAT volume, internal to softblk_fat. The
// public classes (volume, file: include/softblk/fat/volume.hpp) hold a
// shared_ptr to a volume_state; its member functions are defined by
// concern:
//
//   fat_table.hpp/.cpp  the allocation table: FAT entries in every copy,
//                       chain steps, the free-cluster map, allocation
//   chains.cpp          files' cluster chains: extent maps, growing,
//                       shrinking, freeing
//   directory.cpp       directories and names: parsing a directory into an
//                       index (long names), lookup, path resolution,
//                       creating and removing entries, entry fields
//   file_io.cpp         file data: the data path (cached, direct,
//                       write-behind), read/write/truncate, open nodes,
//                       and class file
//   path_ops.cpp        volume's path operations (open, mkdir, rename, ...)
//   mount.cpp           boot sector, mount, FSInfo, dirty bits, write-back,
//                       sync, unmount, and volume's volume-wide calls
//
// Threads: everything here runs under volume_state::mu (op_guard), taken by
// the public calls; nothing below locks.
#pragma once

#include <cstdint>
#include <ctime>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <softblk/fat/volume.hpp>

#include "fat_table.hpp"
#include "layout.hpp"
#include "names.hpp"
#include "sector_cache.hpp"

namespace softblk::fat {

namespace detail {

// Directory indexes kept between operations; more are dropped (between
// operations only, when nobody holds one).
inline constexpr size_t k_max_cached_dirs = 512;

// A run of clusters of one file that are contiguous on disk.
struct extent_run {
    uint32_t logical;
    uint32_t disk;
    uint32_t count;
};

// One live entry of a directory (the short entry's slot; a long name's
// entries sit in the `lfn_slots` slots before it).
struct dir_record {
    std::string name;
    short_name sname{};
    uint32_t slot = 0;
    uint8_t lfn_slots = 0;
    bool dot = false;
};

// A directory parsed once: its clusters, which slots are used, and hashes
// of folded long names and of short names (directory.cpp). `key` is the
// first cluster, 0 for the fixed FAT12/16 root.
struct dir_index {
    uint32_t key = 0;
    bool fixed = false;
    std::vector<uint32_t> clusters;
    uint32_t capacity = 0;
    uint32_t end_slot = 0;
    std::vector<uint8_t> used;
    std::map<uint32_t, dir_record> records;
    std::unordered_map<std::string, uint32_t> by_name;
    std::unordered_map<std::string, uint32_t> by_short;
    uint32_t free_hint = 0;
};

inline std::string short_key(const short_name& n)
{
    return std::string(reinterpret_cast<const char*>(n.data()), 11);
}

// Where a directory entry is (the index key of its directory and its
// slot) and what it says about its file.
struct entry_ref {
    uint32_t parent_key = 0;
    uint32_t slot = 0;
    bool is_root = false;
    bool is_dir = false;
    uint32_t first_cluster = 0;
    uint32_t size = 0;
};

// An entry as path resolution found it.
struct entry_info : entry_ref {
    uint8_t attr = 0;
};

// The directory a new or renamed entry goes into.
struct parent_dir {
    entry_info info;
    dir_index* index = nullptr;
    std::string leaf;  // the entry's name, without trailing dots and spaces
};

// "/a/./b/../c" -> {"a", "c"}.
std::vector<std::string> split_path(std::string_view path);
// The first `count` parts joined with '/' ("a/c"), for messages.
std::string join_parts(const std::vector<std::string>& parts, size_t count);

}  // namespace detail

// A file or directory that is open (or being worked on): where its entry
// is, its size, and its chain mapped into extents (chains.cpp).
struct node : detail::entry_ref {
    std::vector<detail::extent_run> extents;
    uint32_t mapped = 0;
    bool chain_end = false;
    int open_count = 0;
    bool unlinked = false;
};

struct volume_state {
    block_device& dev;
    mount_options opts;
    detail::geometry g;
    std::unique_ptr<detail::sector_cache> meta;
    std::unique_ptr<detail::sector_cache> data;
    std::unique_ptr<detail::fat_table> fat;
    std::unordered_map<uint32_t, std::unique_ptr<detail::dir_index>> dirs;
    std::unordered_map<uint64_t, std::shared_ptr<node>> open_nodes;
    mutable std::mutex mu;
    bool mounted = true;
    bool dead = false;
    bool read_only = false;
    bool was_dirty = false;
    bool fsinfo_valid = false;
    uint32_t volume_id = 0;
    std::string label;
    detail::damage_log damage;
    cache_stats counters;
    std::vector<uint8_t> zeros = std::vector<uint8_t>(64 * 1024, 0);
    // Write-behind run: sequential direct writes gathered into one request.
    std::vector<uint8_t> pending;
    uint64_t pending_sector = 0;
    uint32_t pending_bytes = 0;
    // The local-time conversion of the current second, kept: every write
    // stamps its entry, and localtime_r costs more than a small write.
    std::time_t stamp_second = -1;
    detail::fat_time stamp_value{};

    volume_state(block_device& d, const mount_options& o);

    // ------------------------------------------------ errors (volume_state.cpp)
    // The error for a failed operation on `what`: the damage just recorded
    // for EIO and ELOOP, else a text per errno that says what limits it.
    std::unexpected<error> fail(int rc, std::string_view what);
    // -EIO after a crash or unmount, -EROFS for writes to a read-only mount.
    int check_usable(bool write) const;

    // ------------------------------------------------ chains (chains.cpp)
    // Frees the chain from `first` (after writing the write-behind run, so a
    // freed cluster is never written after its next owner's data).
    int free_chain(uint32_t first);
    void forget_cluster_caches(uint32_t c);
    // Maps logical cluster `index` of `n` to its disk cluster; `run` is how
    // many clusters from there on are contiguous on disk.
    int map_cluster(node& n, uint32_t index, uint32_t& disk, uint32_t& run);
    // Walks the chain until `want` clusters are mapped or it ends.
    int extend_map(node& n, uint32_t want);
    void append_extent(node& n, uint32_t disk);
    // Makes the chain at least `want` clusters long. -ENOSPC before any change.
    int ensure_clusters(node& n, uint32_t want);
    // Cuts the chain to `keep` clusters, freeing the rest.
    int shrink_clusters(node& n, uint32_t keep);

    // ------------------------------------------------ directories (directory.cpp)
    int entry_at(detail::dir_index& d, uint32_t slot, uint8_t*& p, bool for_write);
    void index_record(detail::dir_index& d, detail::dir_record rec);
    int load_dir(uint32_t key, detail::dir_index*& out);
    int find_slots(detail::dir_index& d, uint32_t n, uint32_t& slot);
    int zero_dir_cluster(uint32_t c);
    int add_entry(detail::dir_index& d, std::string_view name, const uint8_t* tmpl,
                  uint32_t& out_slot);
    int remove_entry(detail::dir_index& d, uint32_t slot);
    int lookup(detail::dir_index& d, std::string_view name, uint32_t& slot);
    int read_info(detail::dir_index& d, uint32_t slot, detail::entry_info& info);
    // Resolves the first `count` of `parts` from the root.
    int resolve_parts(const std::vector<std::string>& parts, size_t count, detail::entry_info& out);
    int resolve_path(std::string_view path, detail::entry_info& out);
    // Resolves all but the last of `parts` (not empty) as a directory
    // (-ENOTDIR if it is a file) and loads its index.
    int resolve_parent(const std::vector<std::string>& parts, detail::parent_dir& out);
    // Points `e` at the 32-byte short entry of `ref` (valid until the next
    // cache call); marks its sector dirty when `for_write`.
    int entry_of(const detail::entry_ref& ref, uint8_t*& e, bool for_write);
    // The first cluster an entry holds (the high half only on FAT32).
    uint32_t entry_cluster(const uint8_t* e) const;
    void set_entry_cluster(uint8_t* e, uint32_t cluster) const;
    uint32_t dir_key_of(const detail::entry_info& info) const
    {
        return info.is_root ? g.root_key() : info.first_cluster;
    }
    void stamp(uint8_t* e, bool modified, bool created);
    int write_entry(node& n, bool modified);
    void fill_stat(const uint8_t* e, file_stat& st);
    int stat_of(const detail::entry_info& info, file_stat& st);
    int remove_file(detail::dir_index& d, const detail::entry_info& info);
    int dir_is_empty(uint32_t key, bool& empty);
    int remove_dir(detail::dir_index& parent, const detail::entry_info& info);

    // ------------------------------------------------ file data (file_io.cpp)
    static uint64_t node_key(uint32_t parent, uint32_t slot)
    {
        return (uint64_t{parent} << 32) | slot;
    }
    std::shared_ptr<node> node_for(const detail::entry_info& info);
    void close_node(const std::shared_ptr<node>& n);
    int flush_pending();
    int cached_read(uint64_t sector, uint64_t run_end, uint32_t in, uint32_t len, uint8_t* out);
    int transfer_read(uint64_t pos, uint64_t len, uint8_t* out, uint64_t run_end);
    int transfer_write(uint64_t pos, uint64_t len, const uint8_t* src, uint64_t init_from);
    int64_t read_node(node& n, uint8_t* out, size_t len, uint64_t off);
    int write_range(node& n, const uint8_t* src, uint64_t len, uint64_t off, uint64_t old_size);
    int64_t write_node(node& n, const uint8_t* src, size_t len, uint64_t off);
    int truncate_node(node& n, uint64_t size);

    // ------------------------------------------------ mount and sync (mount.cpp)
    int update_fsinfo();
    int write_back_all();
    int sync_all();
    // End of a modifying operation: write back if enough is dirty.
    void op_end();
    int set_dirty_state(bool dirty);
    result<void> mount_volume();
    result<void> unmount_volume();
};

namespace detail {

// Holds the volume for one operation: clears the last damage message,
// drops cached directory indexes beyond k_max_cached_dirs, and at the end
// writes back when enough metadata is dirty.
struct op_guard {
    std::unique_lock<std::mutex> lock;
    volume_state& v;
    explicit op_guard(volume_state& vol) : lock(vol.mu), v(vol)
    {
        v.damage.clear_last();
        if (v.dirs.size() > k_max_cached_dirs) {
            v.dirs.clear();  // only between operations: nobody holds an index
        }
    }
    ~op_guard()
    {
        if (!v.dead && v.mounted && !v.read_only) {
            v.op_end();
        }
    }
    op_guard(const op_guard&) = delete;
    op_guard& operator=(const op_guard&) = delete;
};

}  // namespace detail

}  // namespace softblk::fat
