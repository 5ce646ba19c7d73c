// The read-ahead and writeback limits of one FUSE mount's own backing
// device (its bdi, /sys/class/bdi/MAJOR:MINOR). The kernel gives every
// FUSE mount strict_limit 1 and max_ratio 1: its dirty pages are held to
// about 1% of the dirty threshold and the writer is paced to the writeback
// bandwidth the kernel has estimated so far (100 MB/s at first, updated
// every 200 ms), so a burst of buffered writes crawls. Its read-ahead
// starts at the kernel's default (128 KiB), which INIT only ever lowers to
// the server's max_readahead. The bdi is created with the mount and
// removed with it: setting it touches nothing but the mount softblk made.
// The system-wide limits (vm.dirty_*) are never changed.
#pragma once

#include <string>

#include <softblk/fat/volume.hpp>

namespace softblk::fat::detail {

// What lift_writeback_limits did, for the mount's log.
struct bdi_change {
    std::string directory;  // /sys/class/bdi/MAJOR:MINOR
    std::string summary;    // "strict_limit 1 -> 0, max_ratio 1 -> 100"
};

// The source name (fsname) of every FAT mount softblk serves, as
// /proc/self/mountinfo shows it: how its own mounts are told from others.
inline constexpr const char* k_mount_source = "softblk-fat";

// The "MAJOR:MINOR" of the mount on `mount_point` (an absolute path without
// symbolic links, as /proc/self/mountinfo shows it) when the top one there
// is one of ours (source k_mount_source), read from mountinfo (a stat of
// the mount would wait for the server, which has not started serving yet).
result<std::string> fuse_mount_device(const std::string& mount_point);

// Lets the mount on `mount_point` keep dirty pages as a local disk's bdi
// does: max_ratio 100 and strict_limit 0 (the kernel's defaults for block
// devices; dirty pages are then bounded by the system's vm.dirty_* limits).
// `sysfs_bdi` is where bdi directories are (a test may point elsewhere).
// An error when the mount is not found or a knob is missing or cannot be
// written (not root, an older kernel); nothing is changed then.
result<bdi_change> lift_writeback_limits(const std::string& mount_point,
                                         const std::string& sysfs_bdi = "/sys/class/bdi");

// Sets the read-ahead of the mount on `mount_point` (just mounted, before
// INIT is answered, which lowers it to max_readahead if that is smaller)
// to `kib`: "read_ahead_kb 128 -> 1024". An error when the mount or the
// knob is not found or cannot be written (not root); nothing is changed
// then.
result<bdi_change> set_read_ahead(const std::string& mount_point, unsigned kib,
                                  const std::string& sysfs_bdi = "/sys/class/bdi");

}  // namespace softblk::fat::detail
