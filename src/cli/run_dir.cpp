#include "run_dir.hpp"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

namespace softblk::cli {

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

}  // namespace softblk::cli
