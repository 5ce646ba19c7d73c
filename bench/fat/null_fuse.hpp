// A FUSE file system that does nothing: the floor under a create through
// any FUSE mount on this machine (softblk-bench-fat measures it in the same
// run as the FAT mount).
#pragma once

#include <optional>
#include <string>

namespace softblk::fat::bench {

struct null_fuse_figures {
    double create_us = 0;  // open(O_CREAT | O_EXCL) + close of a new name
    double statfs_us = 0;  // one request and its answer
};

// Mounts the do-nothing file system (low-level libfuse, the kernel's
// LOOKUP, CREATE and RELEASE answered at once, served by the FAT mount's
// loop on one thread with the busy-poll window `poll_us` and the placement
// `colocate`) on a temporary
// directory, times `files` creates and as many statfs calls, unmounts.
// Nothing when /dev/fuse or the mount is not available.
std::optional<null_fuse_figures> measure_null_fuse(int files, const std::string& poll_us,
                                                   const std::string& colocate);

}  // namespace softblk::fat::bench
