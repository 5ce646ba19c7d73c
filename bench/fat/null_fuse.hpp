// A FUSE file system that does nothing: the floor under a create through
// any FUSE mount on this machine (softblk-bench-fat measures it in the same
// run as the FAT mount).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace softblk::fat::bench {

struct null_fuse_figures {
    double create_us = 0;  // open(O_CREAT | O_EXCL) + close of a new name
    double statfs_us = 0;  // one request and its answer
    // One 16 KiB pwrite through a write-only open, which skips the page
    // cache as the FAT mount's does: the kernel copies the data to the
    // server, which answers without looking at it.
    double write_16k_us = 0;
    // The same through a read-write open, which keeps the page cache: the
    // kernel copies each write into cached pages (allocated for a new
    // file) and sends them to the server.
    double write_16k_rw_us = 0;
};

// Mounts the do-nothing file system (low-level libfuse, the kernel's
// LOOKUP, CREATE, WRITE and RELEASE answered at once, served by the FAT
// mount's loop on one thread with the busy-poll window `poll_us` and the
// placement `colocate`) on a temporary directory, times `files` creates,
// as many statfs calls and `write_bytes` of 16 KiB writes, unmounts.
// Nothing when /dev/fuse or the mount is not available.
std::optional<null_fuse_figures> measure_null_fuse(int files, uint64_t write_bytes,
                                                   const std::string& poll_us,
                                                   const std::string& colocate);

}  // namespace softblk::fat::bench
