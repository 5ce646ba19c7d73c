// The NBD server: listeners, the export table, and starting and stopping
// the loop threads. See server.hpp; the loops are in loop.hpp.
#include "server.hpp"

#include <arpa/inet.h>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <fmt/core.h>

#include "loop.hpp"
#include "tls.hpp"

namespace softblk::nbd {

namespace {

result<int> listen_unix(const std::string& path)
{
    sockaddr_un addr{};
    if (path.size() >= sizeof addr.sun_path) {
        return make_error(ENAMETOOLONG, fmt::format("socket={}: longer than {} bytes", path,
                                                    sizeof addr.sun_path - 1));
    }
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return make_error(errno, fmt::format("socket: {}", std::strerror(errno)));
    }
    // A socket left by a crashed server: replace it only if nobody listens.
    struct stat st;
    if (::lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) {
        const int probe = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        const bool alive = ::connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
        ::close(probe);
        if (alive) {
            ::close(fd);
            return make_error(EADDRINUSE,
                              fmt::format("socket={}: another server listens there", path));
        }
        ::unlink(path.c_str());
    }
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        ::listen(fd, 1024) != 0) {
        const int e = errno;
        ::close(fd);
        return make_error(e, fmt::format("socket={}: {}", path, std::strerror(e)));
    }
    return fd;
}

result<int> listen_tcp(const std::string& host, uint16_t port, uint16_t& bound)
{
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    addrinfo* list = nullptr;
    const std::string service = std::to_string(port);
    const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &list);
    if (rc != 0) {
        return make_error(EINVAL, fmt::format("tcp={}:{}: {}", host, port, gai_strerror(rc)));
    }
    int fd = -1;
    int err = 0;
    for (addrinfo* a = list; a != nullptr; a = a->ai_next) {
        fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        const int one = 1;
        ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 1024) == 0) {
            break;
        }
        err = errno;
        ::close(fd);
        fd = -1;
    }
    ::freeaddrinfo(list);
    if (fd < 0) {
        return make_error(err, fmt::format("tcp={}:{}: {}", host, port, std::strerror(err)));
    }
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
    bound = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                           : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
    return fd;
}

}  // namespace

server::server(const server_config& config) : _config(config)
{
}

server::~server()
{
    stop();
}

result<std::shared_ptr<server>> server::start(const server_config& config)
{
    std::shared_ptr<server> s(new server(config));
    if (config.threads == 0) {
        return make_error(EINVAL, "threads=0: need at least one loop thread");
    }
    if (config.tls != tls_mode::off) {
        auto creds = tls_credentials::load(config.tls_certs_dir, config.tls_psk_file,
                                           config.tls_verify_peer);
        if (!creds) {
            return std::unexpected(creds.error());
        }
        s->_tls = *creds;
    }
    if (config.socket_path.empty() && config.tcp_host.empty()) {
        return make_error(EINVAL, "nbd: neither a unix socket nor tcp= to listen on");
    }
    if (!config.socket_path.empty()) {
        auto fd = listen_unix(config.socket_path);
        if (!fd) {
            return std::unexpected(fd.error());
        }
        s->_listen_fds.push_back(*fd);
    }
    if (!config.tcp_host.empty()) {
        auto fd = listen_tcp(config.tcp_host, config.tcp_port, s->_bound_tcp_port);
        if (!fd) {
            s->stop();
            return std::unexpected(fd.error());
        }
        s->_listen_fds.push_back(*fd);
    }
    for (unsigned i = 0; i < config.threads; ++i) {
        auto loop = std::make_unique<event_loop>(*s, i);
        if (auto r = loop->init(); !r) {
            s->stop();
            return std::unexpected(r.error());
        }
        s->_loops.push_back(std::move(loop));
    }
    for (unsigned i = 0; i < config.threads; ++i) {
        s->_threads.emplace_back([srv = s.get(), i] {
            // Signals belong to the program's main thread.
            sigset_t all;
            sigfillset(&all);
            pthread_sigmask(SIG_BLOCK, &all, nullptr);
            srv->_loops[i]->run();
        });
    }
    return s;
}

void server::stop()
{
    if (_stopped) {
        return;
    }
    _stopped = true;
    for (auto& l : _loops) {
        l->request_stop();
    }
    for (auto& t : _threads) {
        t.join();
    }
    _threads.clear();
    _loops.clear();
    for (int fd : _listen_fds) {
        ::close(fd);
    }
    _listen_fds.clear();
    if (!_config.socket_path.empty()) {
        ::unlink(_config.socket_path.c_str());
    }
}

result<void> server::add_export(device& dev, bool read_only, std::string description)
{
    const device_info& info = dev.info();
    const block_limits& lim = info.limits;
    if (lim.zoned) {
        return make_error(EOPNOTSUPP,
                          fmt::format("{}: zoned devices cannot be exported over NBD, which has "
                                      "no zone commands",
                                      info.name));
    }
    auto e = std::make_shared<server_export>();
    e->name = info.name;
    e->description = description.empty() ? fmt::format("softblk {} device", info.target_type)
                                         : std::move(description);
    e->size = lim.capacity_bytes;
    e->min_block = lim.logical_block_size;
    e->preferred_block = std::max<uint32_t>(lim.physical_block_size, 4096);
    e->max_block = 32u << 20;
    e->read_only = read_only || lim.read_only;
    e->rotational = lim.rotational;
    e->can_trim = lim.max_discard_bytes != 0;
    // Every connection reaches the same device object, whose flush covers
    // what any queue wrote and whose data any queue reads back: a flush
    // on one connection serves all of them.
    e->can_multi_conn = true;
    e->dev = &dev;
    std::lock_guard lock(_mutex);
    if (_exports.count(e->name) != 0) {
        return make_error(EEXIST, fmt::format("{}: already exported on this NBD server", e->name));
    }
    _exports.emplace(e->name, std::move(e));
    return {};
}

result<void> server::remove_export(const std::string& name)
{
    std::shared_ptr<server_export> e;
    {
        std::lock_guard lock(_mutex);
        auto it = _exports.find(name);
        if (it == _exports.end()) {
            return make_error(ENOENT, fmt::format("{}: not exported on this NBD server", name));
        }
        e = it->second;
        _exports.erase(it);
    }
    e->removed.store(true);
    for (auto& l : _loops) {
        l->drop_export();
    }
    std::unique_lock lock(_mutex);
    _closed.wait(lock, [&] { return e->connections.load() == 0; });
    // The loops drop their hold (queue_binding) on it with their last connection.
    return {};
}

void server::connection_closed(server_export& exp)
{
    std::lock_guard lock(_mutex);
    exp.connections.fetch_sub(1);
    _closed.notify_all();
}

size_t server::export_count() const
{
    std::lock_guard lock(_mutex);
    return _exports.size();
}

std::shared_ptr<const export_details> server::find(std::string_view name) const
{
    std::lock_guard lock(_mutex);
    if (name.empty()) {
        if (_exports.size() == 1) {
            return _exports.begin()->second;
        }
        return nullptr;
    }
    auto it = _exports.find(name);
    if (it == _exports.end()) {
        return nullptr;
    }
    return it->second;
}

std::vector<std::shared_ptr<const export_details>> server::list() const
{
    std::lock_guard lock(_mutex);
    std::vector<std::shared_ptr<const export_details>> out;
    for (const auto& [name, e] : _exports) {
        out.push_back(e);
    }
    return out;
}

}  // namespace softblk::nbd
