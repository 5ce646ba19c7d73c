#include "vhost_user_client.hpp"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <sys/socket.h>
#include <sys/un.h>
#include <thread>
#include <unistd.h>

#include <fmt/core.h>

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

}  // namespace

vhost_user_client::~vhost_user_client()
{
    if (_fd >= 0) {
        ::close(_fd);
    }
}

vhost_user_client::vhost_user_client(vhost_user_client&& other) noexcept
    : _fd(other._fd), _path(std::move(other._path)), _reply_ack(other._reply_ack)
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
        other._fd = -1;
    }
    return *this;
}

result<vhost_user_client> vhost_user_client::connect(const std::string& path, uint32_t timeout_ms)
{
    sockaddr_un addr{};
    if (path.empty() || path.size() >= sizeof addr.sun_path) {
        return make_error(EINVAL, fmt::format("path={}: a unix socket path of 1 to {} bytes", path,
                                              sizeof addr.sun_path - 1));
    }
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    int err = 0;
    for (;;) {
        const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            err = errno;
            break;
        }
        if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
            const timeval tv{static_cast<time_t>(timeout_ms / 1000),
                             static_cast<suseconds_t>((timeout_ms % 1000) * 1000)};
            ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
            ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
            vhost_user_client c;
            c._fd = fd;
            c._path = path;
            return c;
        }
        err = errno;
        ::close(fd);
        if ((err != ENOENT && err != ECONNREFUSED) || std::chrono::steady_clock::now() >= until) {
            break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return make_error(err, fmt::format("path={}: cannot connect to a vhost-user back end: {}{}",
                                       path, std::strerror(err),
                                       err == ENOENT || err == ECONNREFUSED
                                           ? " (start the back end first: softblk add ... --export "
                                             "vhost-user-blk, or qemu-storage-daemon --export "
                                             "type=vhost-user-blk)"
                                           : ""));
}

error vhost_user_client::failure(const vu::message& m, const std::string& what) const
{
    return error{std::error_code(EPROTO, std::generic_category()),
                 fmt::format("vhost-user back end at {}: {}: {}", _path,
                             vu::request_name(m.hdr.request), what)};
}

result<vu::message> vhost_user_client::await_reply(const vu::message& m, uint32_t size)
{
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
    if (const int rc = vu::send(_fd, m); rc < 0) {
        return std::unexpected(failure(m, std::strerror(-rc)));
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
