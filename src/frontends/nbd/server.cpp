// The NBD server: listeners, the export table, and starting and stopping
// the loop threads. See server.hpp; the loops are in loop.hpp.
#include "server.hpp"

#include <arpa/inet.h>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/core.h>

#include "loop.hpp"
#include "tls.hpp"

namespace softblk::nbd {

const char* const k_tcp_policy =
    "TCP without TLS lets anyone who reaches the port read and write the device: add "
    "tls=require (with tls-certs=DIR or tls-psk=FILE), or insecure=1 to accept that";

namespace {

// Servers whose loop threads did not end in time (server::stop): kept
// alive, since those threads still use them.
std::vector<std::shared_ptr<server>>& abandoned_servers()
{
    static std::vector<std::shared_ptr<server>> list;
    return list;
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
    (void)stop();
}

result<std::shared_ptr<server>> server::start(const server_config& config)
{
    std::shared_ptr<server> s(new server(config));
    if (config.threads == 0) {
        return make_error(EINVAL, "threads=0: need at least one loop thread");
    }
    if (!config.tcp_host.empty() && config.tls != tls_mode::require && !config.insecure) {
        return make_error(
            EPERM, fmt::format("tcp={}:{}: {}", config.tcp_host, config.tcp_port, k_tcp_policy));
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
        auto listener =
            listen_unix_socket(config.socket_path, config.socket_mode, config.socket_group, 1024);
        if (!listener) {
            return std::unexpected(listener.error());
        }
        s->_socket = *listener;
        s->_listen_fds.push_back(listener->fd);
    }
    if (!config.tcp_host.empty()) {
        auto fd = listen_tcp(config.tcp_host, config.tcp_port, s->_bound_tcp_port);
        if (!fd) {
            (void)s->stop();
            return std::unexpected(fd.error());
        }
        s->_listen_fds.push_back(*fd);
    }
    for (unsigned i = 0; i < config.threads; ++i) {
        auto loop = std::make_unique<event_loop>(*s, i);
        if (auto r = loop->init(); !r) {
            (void)s->stop();
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
            std::lock_guard lock(srv->_mutex);
            ++srv->_threads_done;
            srv->_closed.notify_all();
        });
    }
    return s;
}

result<void> server::stop()
{
    if (_stopped) {
        return {};
    }
    _stopped = true;
    for (auto& l : _loops) {
        l->request_stop();
    }
    // The loops shut every connection down and end once their device
    // requests completed; wait for that with a deadline, so that the
    // control thread is never stuck on a loop.
    bool ended;
    {
        std::unique_lock lock(_mutex);
        ended = _closed.wait_for(lock, std::chrono::milliseconds(_config.stop_timeout_ms),
                                 [&] { return _threads_done == _threads.size(); });
    }
    result<void> rc;
    if (ended) {
        for (auto& t : _threads) {
            t.join();
        }
        _threads.clear();
        _loops.clear();
    } else {
        // A loop still waits for device requests. It keeps running on this
        // object: leave it (and the object) to the process's end.
        for (auto& t : _threads) {
            t.detach();
        }
        _threads.clear();
        abandoned_servers().push_back(weak_from_this().lock());
        rc = make_error(ETIMEDOUT,
                        fmt::format("nbd: loop threads still busy {} ms after the server was "
                                    "told to stop (device requests not completed)",
                                    _config.stop_timeout_ms));
    }
    for (int fd : _listen_fds) {
        ::close(fd);
    }
    _listen_fds.clear();
    if (!_config.socket_path.empty() && _socket.ino != 0) {
        // Only the socket start() created: not a file someone put there since.
        remove_socket_file(_config.socket_path, _socket);
        _socket = {};
    }
    return rc;
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
    e->size = current_capacity(lim);
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
    // NBD has no resize: connections keep the size they were told (the
    // core refuses what lies beyond a shrunk device's end), new ones are
    // told the new size.
    e->capacity_listener =
        dev.add_capacity_listener([w = std::weak_ptr<server_export>(e)](uint64_t bytes) {
            if (auto held = w.lock()) {
                held->set_size(bytes);
            }
        });
    e->set_size(current_capacity(lim));  // a resize before the listener was there
    _exports.emplace(e->name, std::move(e));
    return {};
}

result<std::shared_ptr<server_export>> server::begin_remove_export(const std::string& name)
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
    e->dev->remove_capacity_listener(e->capacity_listener);
    e->removed.store(true);
    for (auto& l : _loops) {
        l->drop_export();
    }
    return e;
}

result<void> server::wait_closed(const server_export& exp)
{
    std::unique_lock lock(_mutex);
    // The loops drop their hold (queue_binding) on it with their last connection.
    if (_closed.wait_for(lock, std::chrono::milliseconds(_config.stop_timeout_ms),
                         [&] { return exp.connections.load() == 0; })) {
        return {};
    }
    return make_error(ETIMEDOUT,
                      fmt::format("nbd: {} connection(s) to {} still open {} ms after they were "
                                  "shut down (device requests not completed)",
                                  exp.connections.load(), exp.name, _config.stop_timeout_ms));
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

nlohmann::json server::colocate_choices() const
{
    nlohmann::json out = nlohmann::json::array();
    for (const auto& l : _loops) {
        out.push_back(l->colocate_choice());
    }
    return out;
}

nlohmann::json server::poll_choices() const
{
    nlohmann::json out = nlohmann::json::array();
    for (const auto& l : _loops) {
        out.push_back(l->poll_choice());
    }
    return out;
}

}  // namespace softblk::nbd
