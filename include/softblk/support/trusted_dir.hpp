// Directories where softblk creates or opens files it names itself (the
// daemon's run directory, the zloop target's base_dir and its BASE_DIR/ID):
// they are trusted only when no other user could plant a file or a link in
// them or swap them for another directory (docs/reliability.md, "Run
// directory" and "File and zone-file safety"). And the undo of a creation:
// a file removed only when it is still the one that was created.
// Control path; any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <sys/stat.h>
#include <sys/types.h>

#include <softblk/types.hpp>

namespace softblk {

// "uid 65534 (nobody)".
std::string describe_uid(uid_t uid);

// What a directory must be, and how refusals name it.
struct directory_rules {
    // How messages name the directory checked: "the run directory",
    // "base_dir".
    std::string_view role;
    // What to do when a directory fails ("use a directory of your own
    // (SOFTBLK_RUN_DIR)").
    std::string_view remedy;
    // The directory may be root's as well as the caller's (base_dir:
    // /var/local/zloop); the run directory must be the caller's own.
    bool root_may_own = false;
    // Above the directory, a group-writable one that root owns is trusted:
    // root gave that group the right (Debian's /var/local is root:staff
    // 2775, the parent of zloop's default base_dir).
    bool trust_root_groups = false;
};

// Every directory above `path` (absolute), as given and as resolved, must be
// owned by root or the caller and, if others may write it, sticky (as /tmp),
// so that no one else can replace what is below it; a symbolic link there
// must be owned by root or the caller. `existing_only` skips what does not
// exist (yet). Errors name the directory, its owner or mode, `rules.role`
// and `rules.remedy`.
result<void> check_dirs_above(const std::string& path, const directory_rules& rules,
                              bool existing_only = false);

// Directory `path`, described by `st` (lstat, or fstat of a descriptor open
// on it), is trusted: a directory (not a link), owned by the caller (or by
// root with `rules.root_may_own`), writable by no one else (no group or
// other write bit). Errors name it, its owner and its mode.
result<void> check_trusted_dir(const std::string& path, const struct stat& st,
                               const directory_rules& rules);
// The same, with lstat of `path`.
result<void> check_trusted_dir(const std::string& path, const directory_rules& rules);

// A file as the kernel knows it: what a path named when it was created.
struct file_identity {
    uint64_t dev = 0;
    uint64_t ino = 0;
    bool operator==(const file_identity&) const = default;
};
file_identity identity_of(const struct stat& st);

// Removes `name` (relative to directory `dir_fd`, or a path with AT_FDCWD)
// only if it is still `id`, the file or directory (`directory`) this
// process created: not followed through a link, and left alone when
// someone replaced it since. Returns whether it was removed.
bool remove_if_same(int dir_fd, const std::string& name, const file_identity& id,
                    bool directory = false);

// Opens `path` with O_NOFOLLOW | O_CLOEXEC | `flags` (created with `mode`):
// for the files softblk names itself in a trusted directory. Returns the
// descriptor, or an error that names the file and says when it is a
// symbolic link.
result<int> open_no_follow(const std::string& path, int flags, unsigned mode = 0600);

// Writes `text` to `path` atomically: a fresh `path`.tmp (a leftover is
// removed first, never followed; created with O_EXCL and `mode`), fsynced
// when `durable`, renamed over `path`. Returns an error naming the file.
result<void> write_file_atomically(const std::string& path, const std::string& text, unsigned mode,
                                   bool durable);

}  // namespace softblk
