// Unix stream sockets that front ends listen on: whether a socket file
// left in the run directory still has a server behind it. Any thread.
#pragma once

#include <cstring>
#include <string>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

namespace softblk {

// True when a connect() to the unix socket at `path` succeeds, i.e. some
// process listens on it; false for a stale socket file, no file, or a
// path too long for sockaddr_un. The probe connection is closed at once
// (the server sees a client that goes away without a word).
inline bool unix_socket_listened_on(const std::string& path)
{
    sockaddr_un addr{};
    if (path.size() >= sizeof addr.sun_path) {
        return false;
    }
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const bool alive =
        fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    if (fd >= 0) {
        ::close(fd);
    }
    return alive;
}

}  // namespace softblk
