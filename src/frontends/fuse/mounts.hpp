// The FUSE mounts of this front end as /proc/self/mountinfo shows them, the
// live ones of this process, and the removal of what a crashed daemon left.
#pragma once

#include <string>
#include <sys/types.h>
#include <vector>

namespace softblk::fuse {

// File system type and source name of our mounts: "fuse.softblk" and
// "softblk:<daemon pid>:<device name>".
inline constexpr const char* k_subtype = "softblk";
inline constexpr const char* k_fstype = "fuse.softblk";

struct mount_entry {
    std::string mount_point;
    std::string fstype;
    std::string source;
};

// Every mount of the calling process's mount namespace.
std::vector<mount_entry> read_mounts();

// The daemon pid recorded in a source name "softblk:<pid>:<name>", or -1.
pid_t source_pid(const std::string& source);

// Mount points served by exports of this process (registered while they
// run). Any thread.
void register_live_mount(const std::string& mount_point);
void unregister_live_mount(const std::string& mount_point);
bool is_live_mount(const std::string& mount_point);

// True when `entry` (one of ours) has no daemon any more: not a live export
// of this process, and its recorded daemon is gone or the connection is
// aborted (statfs fails with ENOTCONN).
bool is_stale(const mount_entry& entry);

// Detaches the loop devices backed by files below the mount point,
// lazy-unmounts it and removes its directory. Best effort; returns false
// when something could not be removed (a loop device still mounted).
bool remove_stale_mount(const std::string& mount_point);

// Cleans everything stale under `fuse_dir` ($RUN_DIR/fuse): stale mounts,
// loop devices backed by files there whose mount is gone, and empty
// directories that no live export uses.
void cleanup_stale_under(const std::string& fuse_dir);

}  // namespace softblk::fuse
