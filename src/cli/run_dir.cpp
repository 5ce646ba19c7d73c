#include "run_dir.hpp"

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

#include <fmt/format.h>

namespace softblk::cli {

namespace {

// "uid 65534 (nobody)".
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

std::string mode_text(mode_t mode)
{
    return fmt::format("{:04o}", mode & 07777);
}

// A directory above the run directory: owned by root or us, and if others
// may write it, sticky (nobody can rename what is ours in it).
result<void> check_ancestor(const std::string& path, const std::string& run_dir)
{
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) {
        return make_error(errno, fmt::format("{} (above the run directory {}): {}", path, run_dir,
                                             std::strerror(errno)));
    }
    const uid_t me = ::geteuid();
    if (st.st_uid != 0 && st.st_uid != me) {
        return make_error(EPERM,
                          fmt::format("{} (above the run directory {}) is owned by {}, not by root "
                                      "or {}: that user could replace the run directory; use a "
                                      "directory of your own (SOFTBLK_RUN_DIR)",
                                      path, run_dir, describe_uid(st.st_uid), describe_uid(me)));
    }
    if (S_ISLNK(st.st_mode)) {
        return {};  // owned by root or us: only we can change where it points
    }
    if (!S_ISDIR(st.st_mode)) {
        return make_error(ENOTDIR, fmt::format("{} (above the run directory {}) is not a directory",
                                               path, run_dir));
    }
    if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0 && (st.st_mode & S_ISVTX) == 0) {
        return make_error(
            EPERM, fmt::format("{} (above the run directory {}) has mode {}: other users may "
                               "write it without the sticky bit, so they could replace the "
                               "run directory; use a directory of your own",
                               path, run_dir, mode_text(st.st_mode)));
    }
    return {};
}

// Every directory above `path`, as given and as resolved, passes
// check_ancestor; `existing_only` skips those that do not exist (yet).
result<void> check_ancestors(const std::string& path, bool existing_only = false)
{
    std::vector<std::string> chain;
    auto add_prefixes = [&chain](const std::string& p) {
        for (size_t pos = p.find('/', 1); pos != std::string::npos; pos = p.find('/', pos + 1)) {
            chain.push_back(p.substr(0, pos));
        }
    };
    add_prefixes(path);
    char resolved[PATH_MAX];
    if (::realpath(path.c_str(), resolved) != nullptr) {
        add_prefixes(resolved);
    }
    for (const std::string& dir : chain) {
        struct stat st {};
        if (existing_only && ::lstat(dir.c_str(), &st) != 0) {
            continue;
        }
        if (auto ok = check_ancestor(dir, path); !ok) {
            return ok;
        }
    }
    return {};
}

}  // namespace

run_paths run_paths_in(std::string dir)
{
    while (dir.size() > 1 && dir.back() == '/') {
        dir.pop_back();
    }
    run_paths p;
    p.dir = dir;
    p.socket = dir + "/control.sock";
    p.devices = dir + "/devices";
    p.log = dir + "/daemon.log";
    p.pid = dir + "/daemon.pid";
    p.lock = dir + "/daemon.lock";
    return p;
}

result<run_paths> resolve_run_paths()
{
    std::string dir;
    if (const char* env = std::getenv("SOFTBLK_RUN_DIR"); env != nullptr && env[0] != '\0') {
        dir = env;
    } else if (::geteuid() == 0) {
        dir = "/run/softblk";
    } else if (const char* xdg = std::getenv("XDG_RUNTIME_DIR"); xdg != nullptr && xdg[0] != '\0') {
        dir = std::string(xdg) + "/softblk";
    } else {
        return make_error(ENOENT,
                          "no run directory: XDG_RUNTIME_DIR is not set and softblk is not run as "
                          "root; set SOFTBLK_RUN_DIR to a directory of your own");
    }
    if (dir[0] != '/') {
        return make_error(EINVAL, fmt::format("run directory '{}' must be an absolute path", dir));
    }
    // sockaddr_un::sun_path holds 108 bytes including the terminator.
    if (dir.size() + std::strlen("/control.sock") >= 108) {
        return make_error(
            ENAMETOOLONG,
            fmt::format("run directory '{}' is too long for a unix socket path (at most {} "
                        "characters)",
                        dir, 107 - std::strlen("/control.sock")));
    }
    return run_paths_in(std::move(dir));
}

result<void> make_directories(const std::string& path, unsigned mode)
{
    for (size_t pos = 1; pos <= path.size(); ++pos) {
        if (pos != path.size() && path[pos] != '/') {
            continue;
        }
        const std::string part = path.substr(0, pos);
        if (::mkdir(part.c_str(), mode) != 0 && errno != EEXIST) {
            return make_error(
                errno, fmt::format("cannot create directory {}: {}", part, std::strerror(errno)));
        }
    }
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
        return make_error(ENOTDIR, fmt::format("{} is not a directory", path));
    }
    return {};
}

result<void> check_private_directory(const std::string& path)
{
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) {
        return make_error(errno, fmt::format("{}: {}", path, std::strerror(errno)));
    }
    if (S_ISLNK(st.st_mode)) {
        return make_error(ELOOP, fmt::format("{} is a symbolic link; the daemon keeps its files "
                                             "only in a directory of its own: remove the link",
                                             path));
    }
    if (!S_ISDIR(st.st_mode)) {
        return make_error(ENOTDIR, fmt::format("{} is not a directory", path));
    }
    const uid_t me = ::geteuid();
    if (st.st_uid != me) {
        return make_error(EPERM, fmt::format("{} is owned by {}, not by {} (who runs softblk): "
                                             "another user could plant files in it; use a "
                                             "directory of your own (SOFTBLK_RUN_DIR) or chown it",
                                             path, describe_uid(st.st_uid), describe_uid(me)));
    }
    if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
        return make_error(EPERM, fmt::format("{} has mode {}: it is writable by other users, who "
                                             "could plant files in it; `chmod go-w {}` or use "
                                             "another directory",
                                             path, mode_text(st.st_mode), path));
    }
    return {};
}

result<void> check_run_dir(const run_paths& paths)
{
    if (auto ok = check_ancestors(paths.dir); !ok) {
        return ok;
    }
    if (auto ok = check_private_directory(paths.dir); !ok) {
        return ok;
    }
    struct stat st {};
    if (::lstat(paths.devices.c_str(), &st) == 0) {
        return check_private_directory(paths.devices);
    }
    return {};
}

result<void> prepare_run_dir(const run_paths& paths)
{
    // Nothing is created below a directory another user controls.
    if (auto ok = check_ancestors(paths.dir, true); !ok) {
        return ok;
    }
    if (auto made = make_directories(paths.dir, 0755); !made) {
        return made;
    }
    // The run directory is checked before anything is created in it.
    if (auto ok = check_run_dir(paths); !ok) {
        return ok;
    }
    if (::mkdir(paths.devices.c_str(), 0700) != 0 && errno != EEXIST) {
        return make_error(errno, fmt::format("cannot create directory {}: {}", paths.devices,
                                             std::strerror(errno)));
    }
    return check_private_directory(paths.devices);
}

result<int> open_run_file(const std::string& path, int flags, unsigned mode)
{
    const int fd = ::open(path.c_str(), flags | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd >= 0) {
        return fd;
    }
    const int e = errno;
    struct stat st {};
    if (e == ELOOP || (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode))) {
        return make_error(e, fmt::format("{} is a symbolic link, which softblk does not follow in "
                                         "its run directory; remove it",
                                         path));
    }
    return make_error(e, fmt::format("cannot open {}: {}", path, std::strerror(e)));
}

result<void> write_run_file(const std::string& path, const std::string& text, unsigned mode,
                            bool durable)
{
    const std::string tmp = path + ".tmp";
    // A leftover of ours (an interrupted write) or something planted: gone
    // either way, and O_EXCL makes sure we write a file of our own.
    if (::unlink(tmp.c_str()) != 0 && errno != ENOENT) {
        return make_error(errno, fmt::format("cannot remove {}: {}", tmp, std::strerror(errno)));
    }
    auto fd = open_run_file(tmp, O_WRONLY | O_CREAT | O_EXCL, mode);
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
        const int e = errno;
        ::unlink(tmp.c_str());
        return make_error(e,
                          fmt::format("cannot rename {} to {}: {}", tmp, path, std::strerror(e)));
    }
    return {};
}

}  // namespace softblk::cli
