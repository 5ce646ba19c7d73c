// The kernel's zloop directory layout (drivers/block/zloop.c, Linux 6.15+):
// BASE_DIR/ID/cnv-NNNNNN for a conventional zone (always zone-size bytes)
// and BASE_DIR/ID/seq-NNNNNN for a sequential zone (its size is the write
// pointer: 0 empty, the capacity full, anything between closed). This file
// opens such a directory for the zloop target (control path only): it finds
// out whether the device is new or restored, as zloop does (a restore when
// cnv-000000 or seq-000000 exists), refuses a directory that does not match
// the configuration, and opens every zone file on the file engine.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
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

// The opened zone files of one device. Owns the files and the directory's
// descriptor (closed by the destructor).
struct zone_files {
    std::vector<std::unique_ptr<backing_file>> files;  // one per zone, in order
    // The device's block size as zloop chooses it: the file system's block
    // size when at most 4 KiB, else direct I/O's alignment.
    uint32_t block_size = 512;
    bool restored = false;  // the zone files existed (zloop's restore)
    int dir_fd = -1;        // BASE_DIR/ID, for syncfs (zloop's flush)
    std::string dir;
    // Sequential zones whose file ended in a partial block (a torn write),
    // cut back to the last whole block when they were opened.
    std::vector<uint32_t> torn_writes_cut;

    zone_files() = default;
    zone_files(zone_files&& other) noexcept;
    zone_files& operator=(zone_files&&) = delete;
    zone_files(const zone_files&) = delete;
    ~zone_files();
};

// Opens (restore) or creates (new device) the zone files of `dir` (BASE_DIR/
// ID, which must exist, as zloop requires). A restore refuses: a missing zone
// file, a conventional file that is not zone_size bytes, a sequential file
// larger than the zone, a zone file of the other type
// or beyond the configured zones (a configuration that does not match the
// directory). A sequential file that ends in a partial block (a torn write)
// is cut back to whole blocks. A new device gets zone-size conventional files (sparse) and
// empty sequential ones; files already there are used as they are. Errors
// name the file and the cause. Control thread.
result<zone_files> open_zone_files(const std::string& dir, const geometry& g);

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
