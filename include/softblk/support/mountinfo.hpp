// The mounts of the calling process's mount namespace as
// /proc/self/mountinfo lists them: one reader for whoever needs a mount's
// device or type (the FUSE export's stale-mount cleanup, the FAT mount's
// own writeback limits). Control path; any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace softblk {

struct mount_entry {
    std::string mount_point;  // unescaped (mountinfo writes blanks and '\' as \ooo)
    std::string fstype;       // e.g. "fuse.softblk", "ext4"
    std::string source;       // unescaped
    uint64_t device = 0;      // st_dev of its files (makedev of mountinfo's major:minor)
};

// Every mount, in mountinfo's order (a mount comes after the one it covers).
std::vector<mount_entry> read_mounts();

// The mount that paths under `mount_point` (absolute, without symbolic
// links, as mountinfo shows it) reach now: the last one mounted there (it
// covers the others), or nullopt. Reads mountinfo only: no stat of the
// mount, which would wait for a FUSE server that is not serving yet.
std::optional<mount_entry> top_mount_at(const std::string& mount_point);

}  // namespace softblk
