// The FUSE mounts of this front end as /proc/self/mountinfo shows them, the
// live ones of this process, and the removal of what a crashed daemon left.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <sys/types.h>
#include <vector>

#include <softblk/support/mountinfo.hpp>

namespace softblk::fuse {

// File system type and source name of our mounts: "fuse.softblk" and
// "softblk:<daemon pid>:<device name>".
inline constexpr const char* k_subtype = "softblk";
inline constexpr const char* k_fstype = "fuse.softblk";

// The mounts as mountinfo lists them: the core's reader.
using softblk::mount_entry;
using softblk::read_mounts;
using softblk::top_mount_at;

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

// Detaches the loop devices backed by files of the stale mount `entry`
// (their backing device is its device: a path alone proves nothing),
// lazy-unmounts it if it is still the top mount on its path, and removes
// its directory if empty. Best effort; returns false when something could
// not be removed (a loop device still mounted, another mount on top).
bool remove_stale_mount(const mount_entry& entry);

// Cleans everything stale under `fuse_dir` ($RUN_DIR/fuse): stale mounts
// with their loop devices, and empty directories that no live export uses.
// A loop device whose backing file merely lies under fuse_dir, not on a
// stale mount of ours, is left alone: it is a file of the file system
// beneath (not ours) or of a mount in another mount namespace.
void cleanup_stale_under(const std::string& fuse_dir);

}  // namespace softblk::fuse
