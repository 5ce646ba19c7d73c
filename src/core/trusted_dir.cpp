#include <softblk/support/trusted_dir.hpp>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <pwd.h>
#include <unistd.h>
#include <vector>

#include <fmt/format.h>

namespace softblk {

namespace {

std::string mode_text(mode_t mode)
{
    return fmt::format("{:04o}", mode & 07777);
}

// A directory above the checked one: owned by root or us, and if others
// may write it, sticky (nobody can rename what is ours in it).
result<void> check_above(const std::string& path, const std::string& dir,
                         const directory_rules& rules)
{
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) {
        return make_error(errno, fmt::format("{} (above {} {}): {}", path, rules.role, dir,
                                             std::strerror(errno)));
    }
    const uid_t me = ::geteuid();
    if (st.st_uid != 0 && st.st_uid != me) {
        return make_error(EPERM, fmt::format("{} (above {} {}) is owned by {}, not by root or {}: "
                                             "that user could replace {}; {}",
                                             path, rules.role, dir, describe_uid(st.st_uid),
                                             describe_uid(me), rules.role, rules.remedy));
    }
    if (S_ISLNK(st.st_mode)) {
        return {};  // owned by root or us: only we can change where it points
    }
    if (!S_ISDIR(st.st_mode)) {
        return make_error(
            ENOTDIR, fmt::format("{} (above {} {}) is not a directory", path, rules.role, dir));
    }
    const mode_t writers = rules.trust_root_groups && st.st_uid == 0 ? S_IWOTH : S_IWGRP | S_IWOTH;
    if ((st.st_mode & writers) != 0 && (st.st_mode & S_ISVTX) == 0) {
        return make_error(
            EPERM,
            fmt::format("{} (above {} {}) has mode {}: other users may write it without "
                        "the sticky bit, so they could replace {}; {}",
                        path, rules.role, dir, mode_text(st.st_mode), rules.role, rules.remedy));
    }
    return {};
}

}  // namespace

std::string describe_uid(uid_t uid)
{
    passwd pw{};
    passwd* found = nullptr;
    char buf[1024];
    if (::getpwuid_r(uid, &pw, buf, sizeof buf, &found) == 0 && found != nullptr) {
        return fmt::format("uid {} ({})", uid, found->pw_name);
    }
    return fmt::format("uid {}", uid);
}

result<void> check_dirs_above(const std::string& path, const directory_rules& rules,
                              bool existing_only)
{
    std::vector<std::string> chain;
    auto add = [&chain](const std::string& p) {
        for (size_t pos = p.find('/', 1); pos != std::string::npos; pos = p.find('/', pos + 1)) {
            chain.push_back(p.substr(0, pos));
        }
    };
    add(path);
    char resolved[PATH_MAX];
    if (::realpath(path.c_str(), resolved) != nullptr) {
        add(resolved);
    }
    for (const std::string& dir : chain) {
        struct stat st {};
        if (existing_only && ::lstat(dir.c_str(), &st) != 0) {
            continue;
        }
        if (auto ok = check_above(dir, path, rules); !ok) {
            return ok;
        }
    }
    return {};
}

result<void> check_trusted_dir(const std::string& path, const struct stat& st,
                               const directory_rules& rules)
{
    if (S_ISLNK(st.st_mode)) {
        return make_error(ELOOP, fmt::format("{} is a symbolic link; the daemon keeps its files "
                                             "only in a directory of its own: remove the link",
                                             path));
    }
    if (!S_ISDIR(st.st_mode)) {
        return make_error(ENOTDIR, fmt::format("{} is not a directory", path));
    }
    const uid_t me = ::geteuid();
    if (st.st_uid != me && !(rules.root_may_own && st.st_uid == 0)) {
        return make_error(
            EPERM, fmt::format("{} is owned by {}, not by {} (who runs softblk){}: another user "
                               "could plant files in it; {} or chown it",
                               path, describe_uid(st.st_uid), describe_uid(me),
                               rules.root_may_own && me != 0 ? " or root" : "", rules.remedy));
    }
    if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
        return make_error(EPERM, fmt::format("{} has mode {}: it is writable by other users, who "
                                             "could plant files in it; `chmod go-w {}` or use "
                                             "another directory",
                                             path, mode_text(st.st_mode), path));
    }
    return {};
}

result<void> check_trusted_dir(const std::string& path, const directory_rules& rules)
{
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) {
        return make_error(errno, fmt::format("{}: {}", path, std::strerror(errno)));
    }
    return check_trusted_dir(path, st, rules);
}

file_identity identity_of(const struct stat& st)
{
    return {.dev = static_cast<uint64_t>(st.st_dev), .ino = static_cast<uint64_t>(st.st_ino)};
}

bool remove_if_same(int dir_fd, const std::string& name, const file_identity& id, bool directory)
{
    struct stat st {};
    if (::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || identity_of(st) != id ||
        S_ISDIR(st.st_mode) != directory) {
        return false;
    }
    return ::unlinkat(dir_fd, name.c_str(), directory ? AT_REMOVEDIR : 0) == 0;
}

result<int> open_no_follow(const std::string& path, int flags, unsigned mode)
{
    const int fd = ::open(path.c_str(), flags | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd >= 0) {
        return fd;
    }
    const int e = errno;
    struct stat st {};
    if (e == ELOOP || (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode))) {
        return make_error(e, fmt::format("{} is a symbolic link, which softblk does not follow "
                                         "here; remove it",
                                         path));
    }
    return make_error(e, fmt::format("cannot open {}: {}", path, std::strerror(e)));
}

result<void> write_file_atomically(const std::string& path, const std::string& text, unsigned mode,
                                   bool durable)
{
    const std::string tmp = path + ".tmp";
    // A leftover of ours (an interrupted write) or something planted: gone
    // either way, and O_EXCL makes sure we write a file of our own.
    if (::unlink(tmp.c_str()) != 0 && errno != ENOENT) {
        return make_error(errno, fmt::format("cannot remove {}: {}", tmp, std::strerror(errno)));
    }
    auto fd = open_no_follow(tmp, O_WRONLY | O_CREAT | O_EXCL, mode);
    if (!fd) {
        return std::unexpected(fd.error());
    }
    size_t done = 0;
    while (done < text.size()) {
        const ssize_t n = ::write(*fd, text.data() + done, text.size() - done);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0) {
            const int e = errno;
            ::close(*fd);
            ::unlink(tmp.c_str());
            return make_error(e, fmt::format("cannot write {}: {}", tmp, std::strerror(e)));
        }
        done += static_cast<size_t>(n);
    }
    int e = durable && ::fsync(*fd) != 0 ? errno : 0;
    if (::close(*fd) != 0 && e == 0) {
        e = errno;
    }
    if (e != 0) {
        ::unlink(tmp.c_str());
        return make_error(e, fmt::format("cannot write {}: {}", tmp, std::strerror(e)));
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
        e = errno;
        ::unlink(tmp.c_str());
        return make_error(e,
                          fmt::format("cannot rename {} to {}: {}", tmp, path, std::strerror(e)));
    }
    return {};
}

}  // namespace softblk
