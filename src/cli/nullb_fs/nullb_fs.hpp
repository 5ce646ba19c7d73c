// `softblk nullb mount DIR`: a FUSE file system shaped like null_blk's
// configfs tree (/sys/kernel/config/nullb), served by a client of the
// daemon, so that a null_blk script runs against softblk with only its
// configfs path changed (docs/null.md, "The configfs tree"):
//
//   DIR/features                 the attribute names (read-only)
//   mkdir DIR/NAME               a powered-off null device with the defaults
//                                (the daemon's `add ... power=0`)
//   DIR/NAME/ATTRIBUTE           reads and writes as configfs does: each
//                                write() is one store, its errno the
//                                kernel's (daemon `get`/`set`)
//   DIR/NAME/timeout_inject/...  the fault-injection fields
//   echo 1 > DIR/NAME/power      powers on and exports the device
//   DIR/NAME/device              where it is exported (/dev/ublkbN, ...)
//   rmdir DIR/NAME               deletes the device (daemon `del`)
//
// It is a control-plane tool of the CLI, not a block front end: it holds
// no device, only a connection to the daemon that does. Every null device
// of the daemon appears in it, whoever made it.
#pragma once

#include <string>
#include <vector>

#include "run_dir.hpp"

namespace softblk::cli {

// The host library (src/host): the device table, run directory, memory
// budget and zone requests the command line and the daemon use.
using namespace softblk::host;

struct nullb_fs_options {
    std::string mount_point;                  // an existing directory
    bool foreground = false;                  // else daemonizes once mounted
    std::string export_type;                  // for devices made by mkdir ("": default)
    std::vector<std::string> export_options;  // likewise
};

// Mounts the tree at `o.mount_point` and serves it until it is unmounted
// (`softblk nullb umount`, fusermount3 -u) or the process gets SIGTERM or
// SIGINT. Connects to (or starts) the daemon of `paths` first. Returns the
// exit status; errors go to stderr before daemonizing. Main thread.
int run_nullb_fs(const run_paths& paths, const nullb_fs_options& o);

// Unmounts a tree mounted by run_nullb_fs (umount2 as root, fusermount3 -u
// otherwise). Returns the exit status. Main thread.
int unmount_nullb_fs(const std::string& mount_point);

}  // namespace softblk::cli
