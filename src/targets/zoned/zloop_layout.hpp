// The kernel's zloop directory layout (drivers/block/zloop.c, Linux 6.15+):
// BASE_DIR/ID/cnv-NNNNNN for a conventional zone (always zone-size bytes)
// and BASE_DIR/ID/seq-NNNNNN for a sequential zone (its size is the write
// pointer: 0 empty, the capacity full, anything between closed). This file
// opens such a directory for the zloop target (control path only): it finds
// out whether the device is new or restored, as zloop does (a restore when
// cnv-000000 or seq-000000 exists), refuses a directory that does not match
// the configuration, and opens every zone file on the file engine, below
// a directory that no other user can plant a link in.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <softblk/file_engine.hpp>
#include <softblk/types.hpp>

namespace softblk::targets::zloop {

struct geometry {
    uint64_t zone_size = 0;      // bytes, a power of two
    uint64_t zone_capacity = 0;  // bytes, at most zone_size
    uint32_t nr_zones = 0;
    uint32_t conv_zones = 0;
    bool buffered_io = false;
};

// "cnv-000003" / "seq-000003": zloop's names (six digits, wider past 999999).
std::string zone_file_name(uint32_t zone, bool conventional);

// BASE_DIR/ID of one device, opened, checked and locked: owns the
// descriptor and its flock (LOCK_EX), which the destructor releases.
struct zone_dir {
    int fd = -1;
    int64_t id = -1;
    std::string path;  // BASE_DIR/ID

    zone_dir() = default;
    zone_dir(zone_dir&& other) noexcept;
    zone_dir& operator=(zone_dir&& other) noexcept;
    zone_dir(const zone_dir&) = delete;
    ~zone_dir();
};

// Opens BASE_DIR/ID for a device (docs/reliability.md, "File and zone-file
// safety"): `base` (absolute) and `base`/ID must be directories owned by
// the daemon's user or root that no one else may write, and every
// directory above them owned by root or that user and, if others may
// write it, sticky; `base` may be a link owned by root or that user, ID
// may not. `id` -1 picks the lowest ID whose directory exists and is not
// locked by another zloop device (of this daemon or another: flock on the
// directory); an explicit ID whose directory is locked is EEXIST. Errors
// name the directory, its owner or mode, or the option. Control thread.
result<zone_dir> open_zone_dir(std::string base, int64_t id);

// The opened zone files of one device. Owns the files and the directory.
struct zone_files {
    std::vector<std::unique_ptr<backing_file>> files;  // one per zone, in order
    // The device's block size as zloop chooses it: the file system's block
    // size when at most 4 KiB, else direct I/O's alignment.
    uint32_t block_size = 512;
    bool restored = false;  // the zone files existed (zloop's restore)
    zone_dir dir;           // BASE_DIR/ID, for syncfs (zloop's flush)
    // Sequential zones whose file ended in a partial block (a torn write),
    // cut back to the last whole block when they were opened.
    std::vector<uint32_t> torn_writes_cut;
    // The zone files this open created (a new device), by name in `dir`.
    std::vector<std::pair<std::string, file_identity>> created;

    // Undoes the creation: removes each file in `created` that is still
    // the one created (device and inode; never through a link). Control
    // thread.
    void remove_created();

    zone_files() = default;
    zone_files(zone_files&& other) noexcept = default;
    zone_files& operator=(zone_files&&) = delete;
    zone_files(const zone_files&) = delete;
};

// Opens (restore) or creates (new device) the zone files of `dir`. Every
// zone file is opened below the directory's descriptor with O_NOFOLLOW and
// must be a regular file; new ones are created with O_EXCL, mode 0600. A
// restore refuses: a missing zone file (saying whether it was deleted or
// the directory has fewer zones), a conventional file that is not
// zone_size bytes, a sequential file larger than the zone, a zone file of
// the other type or beyond the configured zones (a configuration that does
// not match the directory). A sequential file that ends in a partial block
// (a torn write) is cut back to whole blocks. A new device gets zone-size
// conventional files (sparse) and empty sequential ones; files already
// there are used as they are. A refusal removes the files this call
// created. Errors name the file and the cause. Control thread.
result<zone_files> open_zone_files(zone_dir dir, const geometry& g);

// The bytes sequential zone file `fd` holds, as the zone engine wants them:
// its size, where a file of exactly zone_size bytes in a zone whose capacity
// is smaller counts as full (the kernel's finish truncates to the zone
// size). -errno when fstat fails. Any thread.
int64_t stored_bytes(int fd, const geometry& g);

// Whether preallocating a zone file's rest (fallocate with KEEP_SIZE, which
// leaves the file's size, the write pointer, as it is) lets a direct append
// go without blocking where it would block otherwise. XFS takes such an
// append without blocking once its blocks exist, so io_uring writes it in
// the submitting thread instead of handing it to an io-wq worker; ext4
// blocks on every append that extends its file, preallocated or not.
// Tried on two unnamed files in `dir_fd` (O_TMPFILE, gone when closed) with
// blocks of `block_size`. Control thread.
bool preallocation_unblocks_appends(int dir_fd, uint32_t block_size);

}  // namespace softblk::targets::zloop
