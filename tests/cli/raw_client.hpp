// A raw connection to the daemon's control socket, for tests that speak
// the protocol line by line.
#pragma once

#include <cerrno>
#include <chrono>
#include <cstring>
#include <poll.h>
#include <string>
#include <string_view>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

namespace softblk::test {

using nlohmann::json;
using namespace std::chrono_literals;

// A raw connection to the control socket.
class raw_client {
public:
    explicit raw_client(const std::string& socket_path)
    {
        _fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_un addr{};
        addr.sun_family = AF_UNIX;
        std::strncpy(addr.sun_path, socket_path.c_str(), sizeof addr.sun_path - 1);
        if (::connect(_fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
            ::close(_fd);
            _fd = -1;
        }
    }
    ~raw_client() { close(); }
    raw_client(const raw_client&) = delete;
    raw_client& operator=(const raw_client&) = delete;

    bool connected() const { return _fd >= 0; }
    void close()
    {
        if (_fd >= 0) {
            ::close(_fd);
            _fd = -1;
        }
    }
    // Sends everything (blocking); false if the peer went away.
    bool send(std::string_view data)
    {
        size_t done = 0;
        while (done < data.size()) {
            const ssize_t n = ::send(_fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
            if (n < 0 && errno == EINTR) {
                continue;
            }
            if (n <= 0) {
                return false;
            }
            done += static_cast<size_t>(n);
        }
        return true;
    }
    // One reply line parsed; a discarded json on EOF or timeout.
    json read_reply(std::chrono::milliseconds timeout = 10s)
    {
        const auto deadline = std::chrono::steady_clock::now() + timeout;
        for (;;) {
            const size_t nl = _buffer.find('\n');
            if (nl != std::string::npos) {
                json reply = json::parse(_buffer.substr(0, nl), nullptr, false);
                _buffer.erase(0, nl + 1);
                return reply;
            }
            const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                deadline - std::chrono::steady_clock::now());
            if (left.count() <= 0) {
                return json(json::value_t::discarded);
            }
            pollfd p{_fd, POLLIN, 0};
            if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) {
                continue;
            }
            char buf[65536];
            const ssize_t n = ::recv(_fd, buf, sizeof buf, 0);
            if (n <= 0) {
                _eof = true;
                return json(json::value_t::discarded);
            }
            _buffer.append(buf, static_cast<size_t>(n));
        }
    }
    json call(const json& request)
    {
        if (!send(request.dump() + "\n")) {
            return json(json::value_t::discarded);
        }
        return read_reply();
    }
    // True when the daemon closed the connection within `timeout`.
    bool wait_closed(std::chrono::milliseconds timeout)
    {
        const auto deadline = std::chrono::steady_clock::now() + timeout;
        while (!_eof && std::chrono::steady_clock::now() < deadline) {
            json r = read_reply(std::chrono::duration_cast<std::chrono::milliseconds>(
                deadline - std::chrono::steady_clock::now()));
            (void)r;
        }
        return _eof;
    }
    int fd() const { return _fd; }

private:
    int _fd = -1;
    std::string _buffer;
    bool _eof = false;
};

inline int error_code(const json& reply)
{
    if (!reply.is_object() || !reply.contains("error")) {
        return 0;
    }
    return reply["error"].value("code", 0);
}

}  // namespace softblk::test
