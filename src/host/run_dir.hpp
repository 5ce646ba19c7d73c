// Where the daemon keeps its socket, state, log and the front ends' mount
// points: /run/softblk for root, $XDG_RUNTIME_DIR/softblk for other users,
// or $SOFTBLK_RUN_DIR when set (tests use it so that they never touch the
// real /run/softblk).
//
// The directory is trusted only when it is the caller's own
// (docs/reliability.md, "Run directory"): it and its `devices`
// subdirectory must be owned by the caller and writable by no one else, and
// every directory above it owned by root or the caller and, if others may
// write it, sticky (as /tmp). Files in it are opened with O_NOFOLLOW and
// O_CLOEXEC (open_run_file) and temporary files are created afresh with
// O_EXCL, so a link planted there is never followed. The checks are
// softblk/support/trusted_dir.hpp's, which the zloop target's base_dir
// passes too.
#pragma once

#include <cstddef>
#include <string>

#include <softblk/types.hpp>

namespace softblk::host {

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

// Checks an existing run directory, its `devices` subdirectory if present,
// and every directory above (see the top of this file), creating nothing.
// Returns an error naming the directory, its owner and mode. Any thread.
result<void> check_run_dir(const run_paths& paths);

// Creates the run directory (mode 0755: the FUSE export's files below it
// are reached by other users through allow_other) and its `devices`
// subdirectory (0700) if missing, then checks both and every directory
// above (see the top of this file). Returns an error naming the directory,
// its owner and mode. Any thread.
result<void> prepare_run_dir(const run_paths& paths);

// Checks that directory `path` is safe to keep the daemon's files in: a
// directory (not a symbolic link), owned by the effective uid, writable by
// no one else. Returns an error naming it, its owner and its mode.
result<void> check_private_directory(const std::string& path);

// Reads a whole small file (state files, device files); an error names it
// when it is missing, unreadable or larger than `max_bytes`. A symbolic link
// is refused unless `follow_links` (files an administrator keeps in /etc).
// Any thread.
result<std::string> read_small_file(const std::string& path, size_t max_bytes,
                                    bool follow_links = false);

}  // namespace softblk::host
