#include "control_server.hpp"

#include <softblk/support/unix_socket.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <new>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace softblk::cli {

using clock = std::chrono::steady_clock;

struct control_server::client {
    int fd = -1;
    uint64_t number = 0;
    uid_t uid = 0;
    pid_t pid = 0;
    std::string in;
    std::string out;
    size_t out_pos = 0;
    clock::time_point last_progress;    // last byte read or written
    clock::time_point request_started;  // first byte of the pending request
    bool close_after_write = false;
    bool closed = false;
    // A request's reply is deferred: nothing more is read or handled
    // until it comes; `resume` then handles the lines already read.
    bool awaiting = false;
    bool resume = false;
    // Refused (wrong uid, too many clients): gets its error reply, its input
    // is read and dropped (closing a unix socket with unread data would
    // reset the connection before the peer reads the reply), and it is
    // closed at refuse_deadline.
    bool refused = false;
    clock::time_point refuse_deadline;

    ~client()
    {
        if (fd >= 0) {
            ::close(fd);
        }
    }
    bool has_output() const { return out_pos < out.size(); }
};

control_server::control_server(std::string socket_path, unix_listener listener,
                               server_limits limits)
    : _socket_path(std::move(socket_path)),
      _listener(listener),
      _listen_fd(listener.fd),
      _limits(limits)
{
}

control_server::~control_server()
{
    close();
}

result<std::unique_ptr<control_server>> control_server::listen(std::string socket_path,
                                                               server_limits limits)
{
    // Mode 0600 from bind() on; a stale socket of a daemon that died is
    // replaced (the caller holds the run directory's lock, so no live daemon
    // owns it), anything else at the path is left alone and named.
    auto listener = listen_unix_socket(socket_path, 0600, -1, 64, SOCK_NONBLOCK);
    if (!listener) {
        return std::unexpected(listener.error());
    }
    return std::unique_ptr<control_server>(
        new control_server(std::move(socket_path), *listener, limits));
}

void control_server::close()
{
    if (_listen_fd >= 0) {
        ::close(_listen_fd);
        _listen_fd = -1;
        // Only while it is still the socket bound here.
        remove_socket_file(_socket_path, _listener);
    }
    _clients.clear();
}

void control_server::accept_clients()
{
    for (;;) {
        const int fd = ::accept4(_listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR &&
                errno != ECONNABORTED) {
                spdlog::warn("accept: {}", std::strerror(errno));
            }
            return;
        }
        auto c = std::make_unique<client>();
        c->fd = fd;
        c->number = _next_client++;
        c->last_progress = clock::now();
        ucred cred{};
        socklen_t len = sizeof cred;
        if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
            spdlog::warn("client {}: SO_PEERCRED: {}", c->number, std::strerror(errno));
            continue;
        }
        c->uid = cred.uid;
        c->pid = cred.pid;
        std::string refusal;
        int code = 0;
        const size_t active = static_cast<size_t>(std::count_if(
            _clients.begin(), _clients.end(), [](const auto& other) { return !other->refused; }));
        if (cred.uid != 0 && cred.uid != ::geteuid()) {
            refusal = fmt::format(
                "permission denied: uid {} may not control this daemon (only root and uid {})",
                cred.uid, ::geteuid());
            code = EACCES;
        } else if (active >= _limits.max_clients) {
            refusal = fmt::format("too many clients ({}); try again later", _limits.max_clients);
            code = EBUSY;
        }
        if (!refusal.empty()) {
            spdlog::warn("client {} (pid {}, uid {}) refused: {}", c->number, cred.pid, cred.uid,
                         refusal);
            c->out = format_error(nullptr,
                                  error{std::error_code(code, std::generic_category()), refusal});
            if (_clients.size() >= 2 * _limits.max_clients) {
                // Too many even to refuse politely: best effort, then close.
                (void)::send(fd, c->out.data(), c->out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
                continue;
            }
            c->refused = true;
            c->refuse_deadline = c->last_progress + std::chrono::seconds(1);
        }
        _clients.push_back(std::move(c));
    }
}

void control_server::process_lines(client& c, const request_handler& handler)
{
    size_t start = 0;
    for (;;) {
        const size_t newline = c.in.find('\n', start);
        if (newline == std::string::npos) {
            break;
        }
        std::string_view line(c.in.data() + start, newline - start);
        start = newline + 1;
        if (!line.empty() && line.back() == '\r') {
            line.remove_suffix(1);
        }
        if (line.find_first_not_of(" \t") == std::string_view::npos) {
            continue;
        }
        nlohmann::json id;
        auto req = parse_request(line, id);
        std::string reply;
        if (!req) {
            spdlog::warn("client {} (pid {}): bad request: {}", c.number, c.pid,
                         req.error().message);
            reply = format_error(id, req.error());
        } else {
            std::optional<result<nlohmann::json>> res = make_error(EIO, "internal error");
            try {
                res = handler(*req, reply_token{c.number, id, req->method});
            } catch (const std::bad_alloc& e) {
                // Memory ran out for one request (a device's tables, a
                // reply): that request fails, saying so; the daemon goes on.
                const nlohmann::json& name =
                    req->params.contains("name") ? req->params["name"] : nlohmann::json(nullptr);
                res = make_error(
                    ENOMEM,
                    fmt::format("{}{}: not enough memory to carry it out ({}); the "
                                "daemon and its other devices go on",
                                req->method, name.is_string() ? " " + name.get<std::string>() : "",
                                e.what()));
            } catch (const std::exception& e) {
                // The handlers return errors; this is the last line of
                // defence that keeps a bug from taking the daemon down.
                spdlog::error("client {}: {} threw: {}", c.number, req->method, e.what());
                res =
                    make_error(EIO, fmt::format("internal error in {}: {}", req->method, e.what()));
            }
            if (!res) {
                c.awaiting = true;
                break;
            }
            reply = format_reply(id, *res, req->method, _limits.max_reply_bytes);
        }
        c.out += reply;
        if (!_stop_reason.empty()) {
            break;
        }
    }
    if (start > 0) {
        c.in.erase(0, start);
        // The rest is the start of the next request.
        c.request_started = clock::now();
    }
}

void control_server::read_client(client& c, const request_handler& handler)
{
    char buf[65536];
    const ssize_t n = ::recv(c.fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            c.closed = true;
        }
        return;
    }
    if (c.refused) {
        c.closed = n == 0 && !c.has_output();
        return;
    }
    if (n == 0) {
        // End of the client's requests (it may still read): a last request
        // without its newline is handled as if it had one.
        if (!c.in.empty()) {
            c.in.push_back('\n');
            process_lines(c, handler);
        }
        c.close_after_write = true;
        if (!c.has_output() && !c.awaiting) {
            c.closed = true;
        }
        return;
    }
    const auto now = clock::now();
    if (c.in.empty()) {
        c.request_started = now;
    }
    c.last_progress = now;
    c.in.append(buf, static_cast<size_t>(n));
    process_lines(c, handler);
    if (c.in.size() > _limits.max_request_bytes) {
        spdlog::warn("client {} (pid {}): request longer than {} bytes, closing", c.number, c.pid,
                     _limits.max_request_bytes);
        c.out +=
            format_error(nullptr, error{std::error_code(E2BIG, std::generic_category()),
                                        fmt::format("request longer than the limit of {} bytes",
                                                    _limits.max_request_bytes)});
        c.in.clear();
        c.in.shrink_to_fit();
        c.close_after_write = true;
    }
    if (c.out.size() - c.out_pos > _limits.max_reply_backlog) {
        spdlog::warn("client {} (pid {}) does not read its replies, closing", c.number, c.pid);
        c.closed = true;
    }
}

void control_server::write_client(client& c)
{
    while (c.has_output()) {
        const ssize_t n = ::send(c.fd, c.out.data() + c.out_pos, c.out.size() - c.out_pos,
                                 MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
                return;
            }
            c.closed = true;
            return;
        }
        c.out_pos += static_cast<size_t>(n);
        c.last_progress = clock::now();
    }
    c.out.clear();
    c.out_pos = 0;
    if (c.close_after_write && !c.awaiting) {
        c.closed = true;
    }
}

void control_server::reply(const reply_token& token, const result<nlohmann::json>& result)
{
    for (auto& c : _clients) {
        if (c->number != token.client || c->closed || !c->awaiting) {
            continue;
        }
        c->out += format_reply(token.id, result, token.method, _limits.max_reply_bytes);
        c->awaiting = false;
        c->resume = true;
        c->request_started = clock::now();
        return;
    }
}

void control_server::check_timeouts(client& c, clock::time_point now)
{
    if (c.refused) {
        c.closed = now >= c.refuse_deadline;
        return;
    }
    if (c.awaiting) {
        return;  // the daemon is the slow one; the client may wait
    }
    if (c.has_output()) {
        if (now - c.last_progress > _limits.request_timeout) {
            spdlog::warn("client {} (pid {}) did not read its reply within {} ms, closing",
                         c.number, c.pid, _limits.request_timeout.count());
            c.closed = true;
        }
        return;
    }
    if (!c.in.empty()) {
        if (now - c.request_started > _limits.request_timeout) {
            spdlog::warn("client {} (pid {}): request incomplete after {} ms, closing", c.number,
                         c.pid, _limits.request_timeout.count());
            c.out += format_error(
                nullptr, error{std::error_code(ETIMEDOUT, std::generic_category()),
                               fmt::format("request not completed (no newline) within {} ms",
                                           _limits.request_timeout.count())});
            c.in.clear();
            c.close_after_write = true;
        }
        return;
    }
    if (now - c.last_progress > _limits.idle_timeout) {
        c.closed = true;
    }
}

std::string control_server::run(const request_handler& handler, const loop_hooks& hooks)
{
    std::vector<pollfd> fds;
    clock::time_point stop_deadline{};
    const size_t first_client = 1 + hooks.fds.size();
    for (;;) {
        if (!_stop_reason.empty()) {
            const auto now = clock::now();
            if (stop_deadline == clock::time_point{}) {
                stop_deadline = now + std::chrono::seconds(1);
            }
            const bool pending = std::any_of(_clients.begin(), _clients.end(), [](const auto& c) {
                return c->has_output() && !c->closed;
            });
            if (!pending || now >= stop_deadline) {
                return _stop_reason;
            }
        }
        // Clients whose deferred reply came: the requests they sent since.
        for (size_t i = 0; i < _clients.size() && _stop_reason.empty(); ++i) {
            client& c = *_clients[i];
            if (c.resume && !c.closed) {
                c.resume = false;
                process_lines(c, handler);
                if (c.close_after_write && !c.awaiting && !c.has_output()) {
                    c.closed = true;
                }
            }
        }
        fds.clear();
        fds.push_back({_listen_fd, static_cast<short>(_stop_reason.empty() ? POLLIN : 0), 0});
        for (int fd : hooks.fds) {
            fds.push_back({fd, POLLIN, 0});
        }
        for (const auto& c : _clients) {
            short events = 0;
            if (c->refused) {
                events = static_cast<short>(POLLIN | (c->has_output() ? POLLOUT : 0));
            } else if (c->has_output()) {
                events |= POLLOUT;
            } else if (!c->close_after_write && !c->awaiting && _stop_reason.empty()) {
                // Backpressure: a client's next request is read once its
                // previous replies are written.
                events |= POLLIN;
            }
            fds.push_back({c->fd, events, 0});
        }
        const int ready = ::poll(fds.data(), fds.size(), 200);
        if (ready < 0 && errno != EINTR) {
            spdlog::error("poll: {}", std::strerror(errno));
            return fmt::format("poll failed: {}", std::strerror(errno));
        }
        if (ready > 0) {
            // Clients first (fds indexes match _clients before accepting
            // and before the hooks run, which may reply to clients).
            const size_t clients = _clients.size();
            for (size_t i = 0; i < clients; ++i) {
                client& c = *_clients[i];
                const short rev = fds[first_client + i].revents;
                if ((rev & POLLOUT) != 0) {
                    write_client(c);
                }
                if (!c.closed && (rev & POLLIN) != 0) {
                    read_client(c, handler);
                    if (c.has_output()) {
                        write_client(c);
                    }
                } else if (!c.closed && (rev & (POLLHUP | POLLERR | POLLNVAL)) != 0 &&
                           !c.has_output()) {
                    c.closed = true;
                }
            }
            for (size_t i = 0; i < hooks.fds.size(); ++i) {
                if ((fds[1 + i].revents & POLLIN) != 0 && hooks.on_ready) {
                    hooks.on_ready(hooks.fds[i]);
                }
            }
            if ((fds[0].revents & POLLIN) != 0) {
                accept_clients();
            }
        }
        if (hooks.on_tick) {
            hooks.on_tick();
        }
        const auto now = clock::now();
        for (auto& c : _clients) {
            if (!c->closed) {
                check_timeouts(*c, now);
                if (c->has_output()) {
                    write_client(*c);
                }
            }
        }
        std::erase_if(_clients, [](const auto& c) { return c->closed; });
    }
}

}  // namespace softblk::cli
