// Connection lifecycle of the NBD server: accept, the hand-off to the loop
// that drives the device's queue (its queue bindings), the handshake and
// idle timer, export removal, and closing and freeing. The handshake itself
// is handshake.cpp's. See loop.hpp.
#include "loop.hpp"

#include <arpa/inet.h>
#include <cassert>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/core.h>

#include <softblk/support/clock.hpp>

namespace softblk::nbd {

namespace {

// Who is at the other end of `fd`, for log lines: ADDRESS:PORT over TCP,
// the process id (SO_PEERCRED) on a unix socket.
std::string peer_name(int fd)
{
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0) {
        char host[INET6_ADDRSTRLEN] = "";
        if (ss.ss_family == AF_INET) {
            const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
            ::inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
            return fmt::format("{}:{}", host, ntohs(a->sin_port));
        }
        if (ss.ss_family == AF_INET6) {
            const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
            ::inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
            return fmt::format("[{}]:{}", host, ntohs(a->sin6_port));
        }
        ucred cred{};
        socklen_t n = sizeof cred;
        if (ss.ss_family == AF_UNIX && ::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &n) == 0) {
            return fmt::format("pid {} on the unix socket", cred.pid);
        }
    }
    return fmt::format("on fd {}", fd);
}

}  // namespace

void event_loop::adopt_inbox()
{
    std::vector<connection*> in;
    {
        std::lock_guard lock(_inbox_mutex);
        in.swap(_inbox);
    }
    for (connection* c : in) {
        c->loop = this;
        _conns.push_back(c);
        if (_stopping) {
            begin_close(*c);
            maybe_free(*c);
            continue;
        }
        enter_transmission(*c);
    }
}

void event_loop::check_exports()
{
    for (connection* c : _conns) {
        if (c->exp != nullptr && c->exp->removed.load()) {
            begin_close(*c);
        }
    }
    // Connections with nothing posted are freed now.
    std::vector<connection*> copy = _conns;
    for (connection* c : copy) {
        maybe_free(*c);
    }
}

// ---------------------------------------------------------------- connections

void event_loop::on_accept(int listener, int fd)
{
    auto& count = _srv.connection_count();
    if (_stopping || count.load() >= _srv.config().max_connections) {
        ::close(fd);
        return;
    }
    count.fetch_add(1);
    auto* c = new connection();
    if (_accept_addr[static_cast<unsigned>(listener)].ss_family != AF_UNIX) {
        // TCP: no Nagle delay, and a peer that vanished (no FIN or RST: a
        // cable pulled, a host gone) is noticed by keepalive probes while
        // the connection is quiet and by the user timeout while it sends.
        c->tcp = true;
        const int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
        ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &k_keepalive_idle_s, sizeof(int));
        ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &k_keepalive_interval_s, sizeof(int));
        ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &k_keepalive_count, sizeof(int));
        ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &k_tcp_user_timeout_ms, sizeof(unsigned));
    } else {
        // The client process, for serving next to it (colocate).
        ucred cred{};
        socklen_t len = sizeof cred;
        if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
            c->peer_pid = cred.pid;
        }
    }
    c->loop = this;
    c->fd = fd;
    c->coalesce = coalesce_policy(_coalesce_ns);
    c->rbuf = static_cast<uint8_t*>(std::aligned_alloc(4096, k_recv_buffer));
    c->hs = std::make_unique<handshake>(_srv, _srv.config().tls);
    c->hs->greet(c->out_bytes);
    if (const uint32_t ms = _srv.config().handshake_timeout_ms; ms != 0) {
        c->handshake_deadline_ns = monotonic_ns() + uint64_t{ms} * 1'000'000u;
        post_timer();
    }
    _conns.push_back(c);
    mark_dirty(*c);
    post_recv(*c);
}

void event_loop::post_timer()
{
    if (_timer_posted || _stopping) {
        return;
    }
    const uint64_t at = monotonic_ns() + k_timer_period_ns;
    _timer_ts.tv_sec = static_cast<int64_t>(at / 1'000'000'000u);
    _timer_ts.tv_nsec = static_cast<long long>(at % 1'000'000'000u);
    io_uring_sqe* s = sqe();
    io_uring_prep_timeout(s, &_timer_ts, 0, IORING_TIMEOUT_ABS);
    io_uring_sqe_set_data(s, make_user_data(this, k_token_timer));
    _timer_posted = true;
}

// Closes the connections whose handshake outlived handshake_timeout_ms and
// those in transmission that made no progress for idle_timeout_ms, and
// posts the timer again while any connection has a deadline. The timer
// fires every k_timer_period_ns then (timeouts are whole seconds, so a
// deadline is at most that late): a deadline set after it was posted is
// never before it.
void event_loop::on_timer()
{
    _timer_posted = false;
    const uint64_t now = monotonic_ns();
    bool again = false;
    std::vector<std::pair<connection*, std::string>> expired;
    for (connection* c : _conns) {
        if (c->closing) {
            continue;
        }
        if (c->ph != phase::transmission) {
            if (c->handshake_deadline_ns == 0) {
                continue;
            }
            if (c->handshake_deadline_ns <= now) {
                expired.emplace_back(
                    c,
                    fmt::format("dropped: still in the {} {} ms after it connected "
                                "(handshake-timeout)",
                                c->ph == phase::tls_handshake ? "TLS handshake" : "NBD handshake",
                                _srv.config().handshake_timeout_ms));
            } else {
                again = true;
            }
            continue;
        }
        if (_idle_timeout_ns == 0) {
            continue;
        }
        // Progress since the last tick: bytes received or sent, or (for a
        // send the peer takes slowly, which completes late) a change in
        // what waits in the socket's send queue.
        bool moved = c->progress != c->progress_seen;
        c->progress_seen = c->progress;
        if (c->send_posted) {
            int queued = 0;
            if (::ioctl(c->fd, SIOCOUTQ, &queued) == 0) {
                moved = moved || queued != c->send_queue_seen;
                c->send_queue_seen = queued;
            }
        }
        if (moved) {
            c->last_progress_ns = now;
        }
        if (now - c->last_progress_ns >= _idle_timeout_ns) {
            expired.emplace_back(
                c, fmt::format("dropped: nothing received or sent for {} s (idle-timeout){}",
                               (now - c->last_progress_ns) / 1'000'000'000u,
                               c->send_posted ? ", its replies unread" : ""));
        } else {
            again = true;
        }
    }
    for (auto& [c, why] : expired) {
        log_client(*c, why);
        begin_close(*c);
        maybe_free(*c);
    }
    if (again) {
        post_timer();
    }
}

void event_loop::log_client(const connection& c, const std::string& what)
{
    fmt::print(stderr, "nbd: client {}: {}\n", peer_name(c.fd), what);
}

queue_binding* event_loop::bind(server_export& exp)
{
    for (auto& b : _bindings) {
        if (b->exp.get() == &exp && !b->retired) {
            ++b->users;
            return b.get();
        }
    }
    if (_index >= exp.dev->queue_count()) {
        return nullptr;
    }
    auto b = std::make_unique<queue_binding>();
    // Keep the export alive while this loop holds its queue.
    {
        auto shared = _srv.find(exp.name);
        b->exp = std::const_pointer_cast<server_export>(
            std::static_pointer_cast<const server_export>(shared));
    }
    if (!b->exp || b->exp.get() != &exp) {
        return nullptr;
    }
    b->queue = &exp.dev->queue(_index);
    b->users = 1;
    _bindings.push_back(std::move(b));
    return _bindings.back().get();
}

queue_binding* event_loop::binding_at(uintptr_t address) const
{
    for (const auto& b : _bindings) {
        if (reinterpret_cast<uintptr_t>(b.get()) == address && !b->retired) {
            return b.get();
        }
    }
    return nullptr;
}

void event_loop::unbind(queue_binding* b)
{
    if (--b->users != 0) {
        return;
    }
    assert(b->queue->in_flight() == 0);
    if (b->event_poll_armed) {
        // The poll's last completion finds no binding at this address.
        io_uring_sqe* s = sqe();
        io_uring_prep_poll_remove(s, reinterpret_cast<uint64_t>(make_user_data(b, k_token_device)));
        io_uring_sqe_set_data(s, make_user_data(this, k_token_ignore));
    }
    b->retired = true;
    _bindings_retired = true;
}

void event_loop::sweep_bindings()
{
    if (!_bindings_retired) {
        return;
    }
    _bindings_retired = false;
    std::erase_if(_bindings, [](const std::unique_ptr<queue_binding>& b) { return b->retired; });
}

void event_loop::begin_close(connection& c, bool graceful)
{
    if (c.closing) {
        return;
    }
    if (graceful && !c.read_eof && (c.send_posted || !c.out_bytes.empty() || !c.pipe.out.empty())) {
        // Say the last word (an option's reply) first.
        c.close_after_send = true;
        c.input_blocked = true;
        mark_dirty(c);
        return;
    }
    c.closing = true;
    // Wakes a posted recv (and fails a posted send) so that nothing of this
    // connection stays in the ring; the cancellation is for what a shut
    // down socket would not end (it makes them complete with -ECANCELED).
    ::shutdown(c.fd, SHUT_RDWR);
    if (c.recv_posted || c.send_posted || c.hup_posted) {
        io_uring_sqe* s = sqe();
        io_uring_prep_cancel_fd(s, c.fd, IORING_ASYNC_CANCEL_ALL);
        io_uring_sqe_set_data(s, reinterpret_cast<void*>(uintptr_t{k_token_ignore}));
        // Now, while the descriptor is surely still this connection's (it
        // is closed only once nothing is posted on it).
        io_uring_submit(&_ring);
    }
    if (c.buffer_wait) {
        std::erase(_buffer_waiters, &c);
        c.buffer_wait = false;
    }
}

void event_loop::maybe_free(connection& c)
{
    if (c.handoff && !c.recv_posted && !c.send_posted && !c.hup_posted && !c.closing) {
        // Move to the loop that drives the device's queue.
        c.handoff = false;
        if (c.dirty) {
            // Unlink from the flush list.
            connection** p = &_dirty;
            while (*p != nullptr && *p != &c) {
                p = &(*p)->next_dirty;
            }
            if (*p == &c) {
                *p = c.next_dirty;
            }
            c.dirty = false;
            c.next_dirty = nullptr;
        }
        if (!c.out_bytes.empty()) {
            // The GO reply must leave first: keep it here until sent.
            c.handoff = true;
            mark_dirty(c);
            return;
        }
        std::erase(_conns, &c);
        _srv.loop(c.handoff_to).adopt(&c);
        return;
    }
    if (!c.closing || c.recv_posted || c.recv_deferred || c.send_posted || c.hup_posted ||
        c.ops_in_device != 0) {
        return;
    }
    if (c.dirty) {
        return;  // freed from the flush pass, after its unlink
    }
    // Ops still queued for sending belong to this connection: release them.
    while (nbd_op* o = c.replies.pop()) {
        release_op(*o);
    }
    for (unsigned i = c.iov_first; i < c.iov_count; ++i) {
        if (c.iov_op[i] != nullptr) {
            release_op(*c.iov_op[i]);
        }
    }
    if (c.payload_op != nullptr) {
        release_op(*c.payload_op);
        c.payload_op = nullptr;
    }
    if (c.binding != nullptr) {
        unbind(c.binding);
        c.binding = nullptr;
    }
    if (c.session != nullptr) {
        gnutls_deinit(c.session);
    }
    ::close(c.fd);
    std::free(c.rbuf);
    std::erase(_conns, &c);
    server_export* exp = c.counted ? c.exp : nullptr;
    delete &c;
    _srv.connection_count().fetch_sub(1);
    if (exp != nullptr) {
        _srv.connection_closed(*exp);
    }
}

}  // namespace softblk::nbd
