#include "vhost_user_client.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <fmt/core.h>

#include <softblk/support/clock.hpp>

namespace softblk::virtio_driver {

namespace vu = virtio::vhost_user;

namespace {

vu::message make(uint32_t request, uint32_t size)
{
    vu::message m;
    m.hdr.request = request;
    m.hdr.flags = vu::k_version;
    m.hdr.size = size;
    return m;
}

void set_socket_timeouts(int fd, uint32_t ms)
{
    const timeval tv{static_cast<time_t>(ms / 1000), static_cast<suseconds_t>((ms % 1000) * 1000)};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

constexpr const char* k_start_hint =
    " (start the back end first: softblk add ... --export vhost-user-blk, or "
    "qemu-storage-daemon --export type=vhost-user-blk)";

}  // namespace

vhost_user_client::~vhost_user_client()
{
    if (_fd >= 0) {
        ::close(_fd);
    }
}

vhost_user_client::vhost_user_client(vhost_user_client&& other) noexcept
    : _fd(other._fd),
      _path(std::move(other._path)),
      _reply_ack(other._reply_ack),
      _deadline_ns(other._deadline_ns),
      _timeout_ms(other._timeout_ms),
      _cancel_fd(other._cancel_fd)
{
    other._fd = -1;
}

vhost_user_client& vhost_user_client::operator=(vhost_user_client&& other) noexcept
{
    if (this != &other) {
        if (_fd >= 0) {
            ::close(_fd);
        }
        _fd = other._fd;
        _path = std::move(other._path);
        _reply_ack = other._reply_ack;
        _deadline_ns = other._deadline_ns;
        _timeout_ms = other._timeout_ms;
        _cancel_fd = other._cancel_fd;
        other._fd = -1;
    }
    return *this;
}

result<vhost_user_client> vhost_user_client::connect(const std::string& path, uint32_t timeout_ms,
                                                     int cancel_fd)
{
    sockaddr_un addr{};
    if (path.empty() || path.size() >= sizeof addr.sun_path) {
        return make_error(EINVAL, fmt::format("path={}: a unix socket path of 1 to {} bytes", path,
                                              sizeof addr.sun_path - 1));
    }
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    const uint64_t deadline = monotonic_ns() + uint64_t{timeout_ms} * 1'000'000;
    int err = 0;
    for (;;) {
        // Non-blocking: a back end busy with another front end, whose
        // backlog is full, makes connect() fail with EAGAIN instead of
        // blocking past the deadline.
        const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) {
            err = errno;
            break;
        }
        if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
            ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
            // A bound for whoever reads the socket directly (the tests);
            // the client's own calls wait against the deadline first.
            set_socket_timeouts(fd, timeout_ms);
            vhost_user_client c;
            c._fd = fd;
            c._path = path;
            c._deadline_ns = deadline;
            c._timeout_ms = timeout_ms;
            c._cancel_fd = cancel_fd;
            return c;
        }
        err = errno;
        ::close(fd);
        if (err == ECONNREFUSED) {
            // Refused: a stale socket (the back end restarting), or no
            // socket at all. Only the first is worth waiting for.
            struct stat st;
            if (::stat(path.c_str(), &st) == 0 && !S_ISSOCK(st.st_mode)) {
                return make_error(ENOTSOCK,
                                  fmt::format("path={}: not a unix socket (a {}): give the "
                                              "vhost-user-blk back end's socket",
                                              path,
                                              S_ISDIR(st.st_mode)   ? "directory"
                                              : S_ISREG(st.st_mode) ? "regular file"
                                                                    : "file of another kind"));
            }
        }
        if ((err != ENOENT && err != ECONNREFUSED && err != EAGAIN) || monotonic_ns() >= deadline) {
            break;
        }
        pollfd p{cancel_fd, POLLIN, 0};
        if (::poll(&p, cancel_fd >= 0 ? 1 : 0, 20) > 0) {
            err = ECANCELED;
            break;
        }
    }
    const bool waited = err == ENOENT || err == ECONNREFUSED || err == EAGAIN;
    return make_error(
        err, fmt::format(
                 "path={}: cannot connect to a vhost-user back end{}: {}{}", path,
                 waited ? fmt::format(" within connect_timeout={} ms", timeout_ms) : std::string(),
                 err == EAGAIN ? "its backlog is full (is it busy with another "
                                 "front end?)"
                               : std::strerror(err),
                 err == ENOENT || err == ECONNREFUSED ? k_start_hint : ""));
}

int vhost_user_client::remaining_ms() const
{
    const uint64_t now = monotonic_ns();
    if (now >= _deadline_ns) {
        return 0;
    }
    return static_cast<int>(
        std::min<uint64_t>((_deadline_ns - now + 999'999) / 1'000'000, INT32_MAX));
}

int vhost_user_client::wait_until_writable() const
{
    for (;;) {
        const int ms = remaining_ms();
        if (ms == 0) {
            return -ETIMEDOUT;
        }
        pollfd fds[2] = {{_fd, POLLOUT, 0}, {_cancel_fd, POLLIN, 0}};
        const int rc = ::poll(fds, _cancel_fd >= 0 ? 2 : 1, ms);
        if (rc < 0 && errno != EINTR) {
            return -errno;
        }
        if (rc > 0 && (fds[1].revents & POLLIN) != 0) {
            return -ECANCELED;
        }
        if (rc > 0 && fds[0].revents != 0) {
            // Room for a message (they are small); send() ends an error.
            set_socket_timeouts(_fd, static_cast<uint32_t>(std::max(remaining_ms(), 1)));
            return 0;
        }
    }
}

int vhost_user_client::wait_for_message() const
{
    for (;;) {
        // A whole message queued (its header says how long it is): receive()
        // reads it without blocking, whatever the back end does next.
        int queued = 0;
        if (::ioctl(_fd, FIONREAD, &queued) == 0 &&
            queued >= static_cast<int>(sizeof(vu::header))) {
            vu::header h;
            const ssize_t n = ::recv(_fd, &h, sizeof h, MSG_PEEK | MSG_DONTWAIT);
            if (n == static_cast<ssize_t>(sizeof h) &&
                (h.size > sizeof(vu::payload) || uint64_t(queued) >= sizeof h + uint64_t{h.size})) {
                return 0;
            }
        }
        const int ms = remaining_ms();
        if (ms == 0) {
            return -ETIMEDOUT;
        }
        pollfd fds[2] = {{_fd, POLLIN | POLLRDHUP, 0}, {_cancel_fd, POLLIN, 0}};
        const int rc = ::poll(fds, _cancel_fd >= 0 ? 2 : 1, ms);
        if (rc < 0 && errno != EINTR) {
            return -errno;
        }
        if (rc > 0 && (fds[1].revents & POLLIN) != 0) {
            return -ECANCELED;
        }
        if (rc > 0 && (fds[0].revents & (POLLHUP | POLLRDHUP | POLLERR)) != 0) {
            return 0;  // receive() reads the end (or what came before it)
        }
        if (rc > 0 && queued > 0) {
            // Part of a message: poll() says readable at once; look again
            // in a moment rather than spin.
            pollfd c{_cancel_fd, POLLIN, 0};
            ::poll(&c, _cancel_fd >= 0 ? 1 : 0, std::min(ms, 1));
        }
    }
}

error vhost_user_client::timeout(const vu::message& m, bool sending) const
{
    return error{std::error_code(ETIMEDOUT, std::generic_category()),
                 fmt::format("path={}: the back end did not {} {} within connect_timeout={} ms "
                             "(a vhost-user back end that is stuck, or busy with another front "
                             "end?)",
                             _path, sending ? "take" : "answer", vu::request_name(m.hdr.request),
                             _timeout_ms)};
}

error vhost_user_client::failure(const vu::message& m, const std::string& what) const
{
    return error{std::error_code(EPROTO, std::generic_category()),
                 fmt::format("vhost-user back end at {}: {}: {}", _path,
                             vu::request_name(m.hdr.request), what)};
}

result<vu::message> vhost_user_client::await_reply(const vu::message& m, uint32_t size)
{
    if (const int rc = wait_for_message(); rc < 0) {
        if (rc == -ETIMEDOUT) {
            return std::unexpected(timeout(m, false));
        }
        return std::unexpected(failure(m, std::strerror(-rc)));
    }
    vu::message r;
    const int rc = vu::receive(_fd, r);
    vu::close_fds(r);  // no reply the driver asks for carries descriptors
    if (rc <= 0) {
        return std::unexpected(
            failure(m, rc == 0 ? "the back end closed the connection" : std::strerror(-rc)));
    }
    if (const char* why = vu::check_reply(r, m.hdr.request, size)) {
        return std::unexpected(failure(m, why));
    }
    return r;
}

result<void> vhost_user_client::send(vu::message& m, bool ack)
{
    if (ack && _reply_ack) {
        m.hdr.flags |= vu::k_flag_need_reply;
    }
    if (const int rc = wait_until_writable(); rc < 0) {
        if (rc == -ETIMEDOUT) {
            return std::unexpected(timeout(m, true));
        }
        return std::unexpected(failure(m, std::strerror(-rc)));
    }
    if (const int rc = vu::send(_fd, m); rc < 0) {
        return std::unexpected(failure(m, std::strerror(-rc)));
    }
    if (!ack || !_reply_ack) {
        return {};
    }
    auto r = await_reply(m, sizeof(uint64_t));
    if (!r) {
        return std::unexpected(r.error());
    }
    if (r->body.u64 != 0) {
        return std::unexpected(failure(m, fmt::format("refused (status {})", r->body.u64)));
    }
    return {};
}

result<vu::message> vhost_user_client::call(vu::message& m, uint32_t reply_size)
{
    if (auto r = send(m, false); !r) {
        return std::unexpected(r.error());
    }
    return await_reply(m, reply_size);
}

result<uint64_t> vhost_user_client::get_u64(uint32_t request)
{
    vu::message m = make(request, 0);
    auto r = call(m, sizeof(uint64_t));
    if (!r) {
        return std::unexpected(r.error());
    }
    return r->body.u64;
}

result<void> vhost_user_client::set_u64(uint32_t request, uint64_t value)
{
    vu::message m = make(request, sizeof(uint64_t));
    m.body.u64 = value;
    return send(m, true);
}

result<void> vhost_user_client::set_owner()
{
    vu::message m = make(vu::k_set_owner, 0);
    return send(m, true);
}

result<void> vhost_user_client::set_state(uint32_t request, unsigned index, unsigned num)
{
    vu::message m = make(request, sizeof(vhost_vring_state));
    m.body.state = vhost_vring_state{index, num};
    return send(m, true);
}

result<void> vhost_user_client::set_vring_addr(const vhost_vring_addr& addr)
{
    vu::message m = make(vu::k_set_vring_addr, sizeof(vhost_vring_addr));
    m.body.addr = addr;
    return send(m, true);
}

result<void> vhost_user_client::set_vring_fd(uint32_t request, unsigned index, int fd)
{
    vu::message m = make(request, sizeof(uint64_t));
    m.body.u64 = index;
    if (fd >= 0) {
        m.fds[0] = fd;
        m.nfds = 1;
    } else {
        m.body.u64 |= vu::k_vring_nofd;
    }
    return send(m, true);
}

result<uint16_t> vhost_user_client::get_vring_base(unsigned index)
{
    vu::message m = make(vu::k_get_vring_base, sizeof(vhost_vring_state));
    m.body.state = vhost_vring_state{index, 0};
    auto r = call(m, sizeof(vhost_vring_state));
    if (!r) {
        return std::unexpected(r.error());
    }
    return static_cast<uint16_t>(r->body.state.num);
}

result<void> vhost_user_client::set_mem_table(const std::vector<vu::region_desc>& regions,
                                              const std::vector<int>& fds)
{
    vu::message m = make(vu::k_set_mem_table,
                         static_cast<uint32_t>(8 + regions.size() * sizeof(vu::region_desc)));
    m.body.table.nregions = static_cast<uint32_t>(regions.size());
    for (size_t i = 0; i < regions.size(); ++i) {
        m.body.table.regions[i] = regions[i];
        m.fds[i] = fds[i];
    }
    m.nfds = static_cast<unsigned>(fds.size());
    return send(m, true);
}

result<std::vector<uint8_t>> vhost_user_client::get_config(uint32_t size)
{
    vu::message m = make(vu::k_get_config, vu::k_config_header_bytes + size);
    m.body.config.offset = 0;
    m.body.config.size = size;
    m.body.config.flags = 0;
    auto r = call(m, 0);
    if (!r) {
        return std::unexpected(r.error());
    }
    if (r->hdr.size != vu::k_config_header_bytes + size || r->body.config.size != size) {
        return std::unexpected(
            failure(m, fmt::format("asked for {} bytes of config space, got {}", size,
                                   r->hdr.size < vu::k_config_header_bytes
                                       ? 0
                                       : r->hdr.size - vu::k_config_header_bytes)));
    }
    return std::vector<uint8_t>(r->body.config.payload, r->body.config.payload + size);
}

}  // namespace softblk::virtio_driver
