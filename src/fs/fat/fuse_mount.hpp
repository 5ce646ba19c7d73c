// `softblk fat mount`: serves a mounted volume through FUSE (libfuse3).
#pragma once

#include <string>
#include <vector>

#include <softblk/fat/volume.hpp>

namespace softblk::fat::detail {

// Runs the FUSE session until the mount point is unmounted (fusermount3 -u)
// or the process gets SIGINT/SIGTERM. `foreground` false daemonises after
// mounting. Returns the process exit code. Requests are served on the
// calling thread, or with "threads=N" among `fuse_options` by a pool of up
// to N threads that call into `vol`, whose lock serialises them;
// "direct_io" bypasses the page cache. Other options go to libfuse.
int serve_fuse(volume& vol, const std::string& mountpoint, bool foreground, bool read_only,
               const std::vector<std::string>& fuse_options);

}  // namespace softblk::fat::detail
