// Where the daemon keeps its socket, state, log and the front ends' mount
// points: /run/softblk for root, $XDG_RUNTIME_DIR/softblk for other users,
// or $SOFTBLK_RUN_DIR when set (tests use it so that they never touch the
// real /run/softblk).
#pragma once

#include <string>

#include <softblk/types.hpp>

namespace softblk::cli {

struct run_paths {
    std::string dir;      // the run directory itself
    std::string socket;   // dir/control.sock: the control socket (mode 0600)
    std::string devices;  // dir/devices: one NAME.json state file per device
    std::string log;      // dir/daemon.log
    std::string pid;      // dir/daemon.pid: the running daemon's pid
    std::string lock;     // dir/daemon.lock: held (flock) by the running daemon
};

// The paths for this process (environment and effective uid). Returns an
// error when no directory can be chosen (not root and neither
// SOFTBLK_RUN_DIR nor XDG_RUNTIME_DIR set) or the choice is not absolute.
// Any thread.
result<run_paths> resolve_run_paths();

// The paths below an explicit directory (absolute).
run_paths run_paths_in(std::string dir);

// Creates `path` and its missing parents with `mode` (existing directories
// are left as they are). Returns an error naming the path.
result<void> make_directories(const std::string& path, unsigned mode);

}  // namespace softblk::cli
