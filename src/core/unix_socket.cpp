// Unix sockets that exports listen on. See include/softblk/support/unix_socket.hpp.
#include <softblk/support/unix_socket.hpp>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <grp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <vector>

#include <fmt/core.h>

namespace softblk {

namespace {

// Fills `addr` for `path`; false when the path does not fit sun_path.
bool socket_address(const std::string& path, sockaddr_un& addr)
{
    addr = {};
    if (path.size() >= sizeof addr.sun_path) {
        return false;
    }
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    return true;
}

std::string too_long(const std::string& path)
{
    return fmt::format("socket={}: longer than {} bytes", path, sizeof(sockaddr_un::sun_path) - 1);
}

}  // namespace

std::string claim_socket_path(const std::string& path)
{
    sockaddr_un addr;
    if (!socket_address(path, addr)) {
        return too_long(path);
    }
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0) {
        return errno == ENOENT ? std::string()
                               : fmt::format("socket={}: {}", path, std::strerror(errno));
    }
    if (S_ISLNK(st.st_mode)) {
        return fmt::format(
            "socket={}: is a symbolic link; softblk neither follows nor removes it: choose "
            "another path",
            path);
    }
    if (!S_ISSOCK(st.st_mode)) {
        return fmt::format(
            "socket={}: exists and is not a socket; softblk does not remove it: choose another "
            "path",
            path);
    }
    if (st.st_uid != ::geteuid()) {
        return fmt::format(
            "socket={}: a socket of uid {}, not this server's; it is left alone: choose another "
            "path",
            path, st.st_uid);
    }
    const int probe = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (probe < 0) {
        return fmt::format("socket: {}", std::strerror(errno));
    }
    const int rc = ::connect(probe, reinterpret_cast<const sockaddr*>(&addr), sizeof addr);
    const int e = errno;
    ::close(probe);
    if (rc == 0) {
        return fmt::format("socket={}: another server listens there", path);
    }
    if (e != ECONNREFUSED) {
        return fmt::format("socket={}: cannot tell whether a server listens there ({})", path,
                           std::strerror(e));
    }
    ::unlink(path.c_str());  // stale: nobody listens
    return {};
}

result<unix_listener> listen_unix_socket(const std::string& path, unsigned mode, int64_t group,
                                         int backlog, int socket_flags)
{
    sockaddr_un addr;
    if (!socket_address(path, addr)) {
        return make_error(ENAMETOOLONG, too_long(path));
    }
    if (std::string why = claim_socket_path(path); !why.empty()) {
        return make_error(EEXIST, why);
    }
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | socket_flags, 0);
    if (fd < 0) {
        return make_error(errno, fmt::format("socket: {}", std::strerror(errno)));
    }
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
        const int e = errno;
        ::close(fd);
        return make_error(e, fmt::format("socket={}: {}", path, std::strerror(e)));
    }
    // Nobody can connect before listen(): set the mode (whatever the umask
    // made it) and the group first.
    struct stat st;
    std::string failed;
    int e = 0;
    if (::lstat(path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) {
        e = errno != 0 ? errno : EEXIST;
        failed = "replaced while it was being set up";
    } else if (group >= 0 &&
               ::lchown(path.c_str(), static_cast<uid_t>(-1), static_cast<gid_t>(group)) != 0) {
        e = errno;
        failed = fmt::format("group={}: {}", group, std::strerror(e));
    } else if (::chmod(path.c_str(), mode) != 0) {
        e = errno;
        failed = fmt::format("mode={:04o}: {}", mode, std::strerror(e));
    } else if (::listen(fd, backlog) != 0) {
        e = errno;
        failed = std::strerror(e);
    }
    if (!failed.empty()) {
        ::close(fd);
        struct stat now;
        if (::lstat(path.c_str(), &now) == 0 && now.st_dev == st.st_dev &&
            now.st_ino == st.st_ino) {
            ::unlink(path.c_str());
        }
        return make_error(e, fmt::format("socket={}: {}", path, failed));
    }
    return unix_listener{.fd = fd, .dev = st.st_dev, .ino = st.st_ino};
}

void remove_socket_file(const std::string& path, const unix_listener& listener)
{
    struct stat st;
    if (listener.ino != 0 && ::lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode) &&
        st.st_dev == listener.dev && st.st_ino == listener.ino) {
        ::unlink(path.c_str());
    }
}

result<unsigned> parse_socket_mode(const std::string& value)
{
    unsigned mode = 0;
    const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), mode, 8);
    if (value.empty() || ec != std::errc() || end != value.data() + value.size() || mode > 0777) {
        return make_error(
            EINVAL,
            fmt::format("mode={}: expected octal permissions 0000..0777, e.g. 0660", value));
    }
    return mode;
}

result<int64_t> parse_socket_group(const std::string& value)
{
    if (value.empty()) {
        return int64_t{-1};
    }
    unsigned gid = 0;
    const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), gid);
    if (ec == std::errc() && end == value.data() + value.size()) {
        return int64_t{gid};
    }
    group g{};
    group* found = nullptr;
    std::vector<char> buf(16384);
    const int rc = ::getgrnam_r(value.c_str(), &g, buf.data(), buf.size(), &found);
    if (rc != 0 || found == nullptr) {
        return make_error(EINVAL, fmt::format("group={}: no such group", value));
    }
    return int64_t{found->gr_gid};
}

}  // namespace softblk
