#include "run_dir.hpp"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <softblk/support/trusted_dir.hpp>

namespace softblk::host {

namespace {

// The run directory is the caller's own (docs/reliability.md, "Run
// directory").
constexpr directory_rules k_run_dir_rules{
    .role = "the run directory",
    .remedy = "use a directory of your own (SOFTBLK_RUN_DIR)",
};

result<void> check_ancestors(const std::string& path, bool existing_only = false)
{
    return check_dirs_above(path, k_run_dir_rules, existing_only);
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
    return check_trusted_dir(path, k_run_dir_rules);
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

result<std::string> read_small_file(const std::string& path, size_t max_bytes, bool follow_links)
{
    int fd = -1;
    if (follow_links) {
        fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            const int e = errno;
            return make_error(e, fmt::format("cannot open {}: {}", path, std::strerror(e)));
        }
    } else {
        auto opened = open_no_follow(path, O_RDONLY);
        if (!opened) {
            return std::unexpected(opened.error());
        }
        fd = *opened;
    }
    std::string text;
    char buf[65536];
    for (;;) {
        const ssize_t n = ::read(fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0) {
            const int e = errno;
            ::close(fd);
            return make_error(e, fmt::format("cannot read {}: {}", path, std::strerror(e)));
        }
        if (n == 0) {
            break;
        }
        text.append(buf, static_cast<size_t>(n));
        if (text.size() > max_bytes) {
            ::close(fd);
            return make_error(EFBIG, fmt::format("{} is larger than {} bytes", path, max_bytes));
        }
    }
    ::close(fd);
    return text;
}

}  // namespace softblk::host
