// `softblk fat mount`: serves a mounted volume through FUSE (libfuse3).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <softblk/fat/volume.hpp>

struct fuse_in_header;  // <linux/fuse.h>

namespace softblk::fat::detail {

// Runs the FUSE session until the mount point is unmounted (fusermount3 -u)
// or the process gets SIGINT/SIGTERM. `foreground` false daemonises after
// mounting. Returns the process exit code. Requests are served on the
// calling thread, or with "threads=N" among `fuse_options` by a pool of up
// to N threads that call into `vol`, whose lock serialises them;
// "direct_io" bypasses the page cache; "poll_us=auto|N" is the calling
// thread's busy-poll window and "colocate=auto|0|1" where it runs
// (serve_session). Other options go to libfuse.
int serve_fuse(volume& vol, const std::string& mountpoint, bool foreground, bool read_only,
               const std::vector<std::string>& fuse_options);

// The serving loop of one thread, as serve_fuse runs it (fuse_serve.cpp):
// after each request it busy-polls /dev/fuse for up to `poll_us` (auto:
// the window the core's level_chooser measures best here; a number: that
// window, 0 never) before sleeping in poll(); `colocate` says where the
// thread runs (support/colocation.hpp: auto measures whether serving from
// the client's CPU pays, 0 never does, 1 always); `direct_io`: the mount
// reads past the page cache (no READ is the kernel's read-ahead, which
// is served from any CPU). `session` is a libfuse fuse_session* (also for
// benchmarks that serve another file system the same way); `shortcut`, if
// given, is offered every request read into memory first. Returns 0 when
// the file system was unmounted, 1 on an error.
//
// A shortcut serves a request (its header, `bytes` read in all) past
// libfuse and writes the reply to the FUSE device `fd` itself, or returns
// false to leave it to libfuse.
using request_shortcut = bool (*)(const ::fuse_in_header& in, size_t bytes, int fd);
int serve_session(void* session, std::string_view poll_us, std::string_view colocate,
                  bool direct_io, request_shortcut shortcut = nullptr);

}  // namespace softblk::fat::detail
