// The event loop and socket I/O of the NBD server: the io_uring ring, the
// loop (device completions, flushing replies, waiting, dispatching
// completions), receives and sends, and TLS records. See loop.hpp.
#include "loop.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <poll.h>
#include <sys/socket.h>

#include <fmt/core.h>

#include <softblk/support/clock.hpp>
#include <softblk/support/cpu_relax.hpp>

namespace softblk::nbd {

// ---------------------------------------------------------------- ring helpers

io_uring_sqe* event_loop::sqe()
{
    io_uring_sqe* s = io_uring_get_sqe(&_ring);
    while (s == nullptr) {
        io_uring_submit(&_ring);
        s = io_uring_get_sqe(&_ring);
    }
    return s;
}

void event_loop::post_wake_read()
{
    io_uring_sqe* s = sqe();
    io_uring_prep_read(s, _wake_fd, &_wake_value, sizeof _wake_value, 0);
    io_uring_sqe_set_data(s, make_user_data(this, k_token_wake));
}

void event_loop::post_accept(unsigned listener)
{
    io_uring_sqe* s = sqe();
    _accept_len[listener] = sizeof(sockaddr_storage);
    io_uring_prep_accept(s, _srv.listen_fds()[listener],
                         reinterpret_cast<sockaddr*>(&_accept_addr[listener]),
                         &_accept_len[listener], SOCK_CLOEXEC);
    // Listener index in the pointer bits: &_accept_len[listener] is 4-aligned,
    // so use the index shifted instead.
    io_uring_sqe_set_data(s, reinterpret_cast<void*>((uintptr_t{listener} << 3) | k_token_accept));
}

void event_loop::post_recv(connection& c)
{
    if (c.recv_posted || c.read_eof || c.closing) {
        return;
    }
    void* dst;
    size_t len;
    if (c.tls) {
        if (c.pipe.in_end == c.pipe.in.size()) {
            return;  // the session has not consumed what it has
        }
        dst = c.pipe.in.data() + c.pipe.in_end;
        len = c.pipe.in.size() - c.pipe.in_end;
        c.recv_direct = false;
    } else if (c.payload_left >= k_direct_recv && !c.payload_discard && c.rstart == c.rend) {
        dst = c.payload_op->buf + c.payload_pos;
        len = c.payload_left;
        c.recv_direct = true;
    } else {
        // Receives start at the buffer's start whenever what is left is
        // at most a partial header (28 bytes to move), so that they keep
        // to the same cache lines.
        if (c.rstart == c.rend) {
            c.rstart = c.rend = 0;
        } else if (c.rstart > 0 && (c.rend - c.rstart < k_request_size ||
                                    k_recv_buffer - c.rend < k_request_size * 4)) {
            std::memmove(c.rbuf, c.rbuf + c.rstart, c.rend - c.rstart);
            c.rend -= c.rstart;
            c.rstart = 0;
        }
        if (c.rend == k_recv_buffer) {
            return;  // full of unparsed bytes: parsing is blocked
        }
        dst = c.rbuf + c.rend;
        len = std::min(k_recv_buffer - c.rend, std::max(k_recv_chunk, size_t{4} * c.request_bytes));
        c.recv_direct = false;
    }
    io_uring_sqe* s = sqe();
    io_uring_prep_recv(s, c.fd, dst, len, 0);
    io_uring_sqe_set_data(s, make_user_data(&c, k_token_recv));
    c.recv_posted = true;
}

// While a connection's input is blocked (it takes no more requests until
// its replies go out) no recv would see its peer go: a poll does. It stays
// armed until the peer hangs up or the connection closes.
void event_loop::post_hup_poll(connection& c)
{
    if (c.hup_posted || c.closing) {
        return;
    }
    io_uring_sqe* s = sqe();
    io_uring_prep_poll_add(s, c.fd, POLLHUP | POLLERR);
    io_uring_sqe_set_data(s, make_user_data(&c, k_token_hup));
    c.hup_posted = true;
}

void event_loop::on_hup(connection& c, int res)
{
    c.hup_posted = false;
    if (!c.closing && res > 0 && (res & (POLLHUP | POLLERR)) != 0) {
        // Nobody will read the replies, nor send more: end it now rather
        // than at the idle timeout.
        c.read_eof = true;
        begin_close(c);
    }
    maybe_free(c);
}

// ---------------------------------------------------------------- loop

void event_loop::run()
{
    // One ring per thread, created on it (SINGLE_ISSUER), with DEFER_TASKRUN
    // where the kernel has it; older kernels get COOP_TASKRUN or nothing.
    io_uring_params p{};
    // TASKRUN_FLAG tells a polling loop that a completion waits to be run.
    const unsigned tries[] = {
        IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_TASKRUN_FLAG,
        IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN,
        IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG, IORING_SETUP_COOP_TASKRUN, 0};
    int rc = -EINVAL;
    for (unsigned flags : tries) {
        p = {};
        p.flags = flags;
        rc = io_uring_queue_init_params(k_ring_entries, &_ring, &p);
        if (rc == 0) {
            _taskrun_flag = (flags & IORING_SETUP_TASKRUN_FLAG) != 0;
            break;
        }
    }
    if (rc != 0) {
        fmt::print(stderr, "nbd: loop {}: io_uring_queue_init: {}\n", _index, std::strerror(-rc));
        std::abort();
    }
    const size_t listeners = _srv.listen_fds().size();
    _accept_addr.resize(listeners);
    _accept_len.resize(listeners);
    post_wake_read();
    if (_index == 0) {
        for (unsigned i = 0; i < listeners; ++i) {
            post_accept(i);
        }
    }

    for (;;) {
        if (_stop.load(std::memory_order_relaxed) && !_stopping) {
            _stopping = true;
            for (connection* c : _conns) {
                begin_close(*c);
            }
            std::vector<connection*> orphans;
            {
                std::lock_guard lock(_inbox_mutex);
                orphans.swap(_inbox);
            }
            for (connection* c : orphans) {
                _conns.push_back(c);
                c->loop = this;
                begin_close(*c);
            }
        }
        uint64_t deferred_wake = UINT64_MAX;
        // Receives held back (coalescing) are posted when their time comes;
        // the loop sleeps no longer than the earliest.
        if (!_deferred.empty()) {
            const uint64_t now = monotonic_ns();
            for (size_t i = 0; i < _deferred.size();) {
                connection* c = _deferred[i];
                if (c->recv_at_ns > now && !c->closing) {
                    deferred_wake = std::min(deferred_wake, c->recv_at_ns);
                    ++i;
                    continue;
                }
                _deferred[i] = _deferred.back();
                _deferred.pop_back();
                c->recv_deferred = false;
                if (c->closing) {
                    maybe_free(*c);
                } else {
                    post_recv(*c);
                }
            }
        }
        if (!_buffer_waiters.empty()) {
            retry_buffer_waiters();
            if (!_buffer_waiters.empty()) {
                // Buffers freed by other loops do not wake this one.
                deferred_wake =
                    std::min<uint64_t>(deferred_wake, monotonic_ns() + k_buffer_wait_ns);
            }
        }
        if (_stopping && _conns.empty()) {
            break;
        }
        // Device completions, which queue replies.
        // When the device queues next have completions that no new request
        // brings (a completion timer, a throttle): the loop wakes then.
        uint64_t device_wake = deferred_wake;
        bool device_fd = false;  // a queue whose descriptor the ring does not watch
        // process() runs completions, which may close a connection and
        // unbind its queue: retired bindings stay in the vector until the
        // sweep after this pass.
        for (auto& b : _bindings) {
            if (b->retired) {
                continue;
            }
            for (int round = 0; round < 4 && b->queue->process() != 0; ++round) {
            }
            if (b->queue->in_flight() != 0) {
                device_wake = std::min(device_wake, b->queue->next_event_ns());
                const int fd = b->queue->event_fd();
                if (fd >= 0 && !b->event_poll_armed) {
                    // The target completes on its own descriptor: the ring
                    // watches it (multishot), so the loop sleeps until a
                    // completion or a socket event, whichever comes first.
                    io_uring_sqe* s = sqe();
                    io_uring_prep_poll_multishot(s, fd, POLLIN);
                    io_uring_sqe_set_data(s, make_user_data(b.get(), k_token_device));
                    b->event_poll_armed = true;
                }
                device_fd = device_fd || (fd >= 0 && !b->event_poll_armed);
            }
        }
        while (connection* c = _dirty) {
            _dirty = c->next_dirty;
            c->next_dirty = nullptr;
            c->dirty = false;
            flush(*c);
            maybe_free(*c);
        }
        sweep_bindings();
        // Replies went out with direct sends in flush(): the loop waits for
        // one event, with no timeout unless the device or a held receive
        // asks for one (a timed wait arms and cancels a timer, which costs
        // more than a request in a VM: see "Sends" in docs/nbd.md).
        if (device_fd) {
            // The target completes on its own descriptor, which this ring
            // does not watch: look again soon.
            __kernel_timespec ts{0, 20'000};
            io_uring_cqe* cqe = nullptr;
            io_uring_submit_and_wait_timeout(&_ring, &cqe, 1, &ts, nullptr);
        } else if (device_wake != UINT64_MAX) {
            // Sleep until the device's next event, or a socket event first.
            const uint64_t now = monotonic_ns();
            if (device_wake <= now) {
                io_uring_submit(&_ring);
            } else {
                const uint64_t delta = device_wake - now;
                __kernel_timespec ts{static_cast<int64_t>(delta / 1'000'000'000u),
                                     static_cast<long long>(delta % 1'000'000'000u)};
                io_uring_cqe* cqe = nullptr;
                io_uring_submit_and_wait_timeout(&_ring, &cqe, 1, &ts, nullptr);
            }
        } else {
            wait_polling();
        }
        unsigned head;
        io_uring_cqe* cqe;
        unsigned seen = 0;
        io_uring_for_each_cqe(&_ring, head, cqe)
        {
            ++seen;
            const auto ud = static_cast<uintptr_t>(cqe->user_data);
            const int res = cqe->res;
            auto* conn = reinterpret_cast<connection*>(ud & ~k_token_mask);
            switch (static_cast<token>(ud & k_token_mask)) {
            case k_token_recv:
                on_recv(*conn, res);
                break;
            case k_token_send:
                on_send(*conn, res);
                break;
            case k_token_hup:
                on_hup(*conn, res);
                break;
            case k_token_accept: {
                const unsigned listener = static_cast<unsigned>(ud >> 3);
                if (res >= 0) {
                    on_accept(static_cast<int>(listener), res);
                }
                if (!_stopping &&
                    (res >= 0 || res == -EINTR || res == -ECONNABORTED || res == -EMFILE ||
                     res == -ENFILE || res == -ENOBUFS || res == -ENOMEM)) {
                    post_accept(listener);
                }
                break;
            }
            case k_token_timer:
                on_timer();
                break;
            case k_token_wake:
                if (!_stopping) {
                    post_wake_read();
                }
                adopt_inbox();
                if (_check_exports.exchange(false)) {
                    check_exports();
                }
                break;
            case k_token_device:
                // The next pass processes the queue; it re-arms the poll if
                // the kernel ended it. A binding that is gone is not found.
                if (queue_binding* b = binding_at(ud & ~k_token_mask)) {
                    b->event_poll_armed = (cqe->flags & IORING_CQE_F_MORE) != 0;
                }
                break;
            case k_token_ignore:
                break;
            }
        }
        io_uring_cq_advance(&_ring, seen);
    }
    // What is still posted (accepts, the wake read) dies with the ring.
    io_uring_queue_exit(&_ring);
    for (auto& b : _bindings) {
        b.reset();
    }
}

// Submits what is queued and waits for a completion, first by polling the
// completion ring for up to the measured window (which saves the sleep and
// the wake-up, each several microseconds, when the next request is that
// close), then by sleeping. Polled time is CPU time of the loop and shows
// in its utime.
void event_loop::wait_polling()
{
    const uint64_t served = _requests_parsed - _requests_counted;
    _requests_counted = _requests_parsed;
    const uint64_t window_ns = _poll.level() * 1'000;
    if (!_taskrun_flag || window_ns == 0) {
        if (served != 0 || !_poll.fixed()) {
            _poll.served(monotonic_ns(), served);
        }
        io_uring_submit_and_wait(&_ring, 1);
        return;
    }
    const uint64_t start = monotonic_ns();
    io_uring_submit(&_ring);
    uint64_t now = start;
    bool caught = false;
    do {
        if (io_uring_cq_ready(&_ring) != 0) {
            caught = true;
            break;
        }
        if ((IO_URING_READ_ONCE(*_ring.sq.kflags) & IORING_SQ_TASKRUN) != 0) {
            io_uring_get_events(&_ring);  // runs the completions, does not sleep
            continue;
        }
        cpu_relax();
        now = monotonic_ns();
    } while (now - start < window_ns);
    _poll.served(now, served, now - start);
    if (!caught) {
        io_uring_submit_and_wait(&_ring, 1);
    }
}

void event_loop::mark_dirty(connection& c)
{
    if (!c.dirty) {
        c.dirty = true;
        c.next_dirty = _dirty;
        _dirty = &c;
    }
}

void event_loop::on_recv(connection& c, int res)
{
    c.recv_posted = false;
    if (res <= 0) {
        if (res == -EINTR || res == -EAGAIN) {
            post_recv(c);
            return;
        }
        c.read_eof = true;
        begin_close(c);
        maybe_free(c);
        return;
    }
    const auto n = static_cast<size_t>(res);
    ++c.progress;
    if (c.tls) {
        c.pipe.in_end += n;
    } else if (c.recv_direct) {
        c.recv_direct = false;
        c.payload_pos += static_cast<uint32_t>(n);
        c.payload_left -= n;
    } else {
        c.rend += n;
    }
    pump_input(c);
    maybe_free(c);
}

// Moves plain text from the socket (or the TLS session) into the parser
// until it needs more bytes than are there or is blocked.
void event_loop::pump_input(connection& c)
{
    for (;;) {
        if (c.closing || c.close_after_send) {
            return;
        }
        if (c.ph == phase::tls_handshake) {
            run_tls_handshake(c);
            if (c.closing || c.close_after_send) {
                return;
            }
            if (c.ph == phase::tls_handshake) {
                post_recv(c);
                return;
            }
            continue;
        }
        if (!parse_input(c)) {
            return;  // blocked, handed off or closing
        }
        if (c.ph == phase::tls_handshake) {
            continue;  // STARTTLS: the session takes over the input
        }
        if (!c.tls) {
            if (!coalesce_receive(c)) {
                post_recv(c);
            }
            return;
        }
        // TLS: decrypt into the same place a plain recv would target.
        uint8_t* dst;
        size_t len;
        bool direct = false;
        if (c.payload_left >= k_direct_recv && !c.payload_discard && c.rstart == c.rend) {
            dst = c.payload_op->buf + c.payload_pos;
            len = c.payload_left;
            direct = true;
        } else {
            if (c.rstart == c.rend) {
                c.rstart = c.rend = 0;
            } else if (c.rstart > 0) {
                std::memmove(c.rbuf, c.rbuf + c.rstart, c.rend - c.rstart);
                c.rend -= c.rstart;
                c.rstart = 0;
            }
            if (c.rend == k_recv_buffer) {
                return;
            }
            dst = c.rbuf + c.rend;
            len = k_recv_buffer - c.rend;
        }
        const ssize_t n = gnutls_record_recv(c.session, dst, len);
        if (n == GNUTLS_E_AGAIN || n == GNUTLS_E_INTERRUPTED) {
            post_recv(c);
            return;
        }
        if (n <= 0) {
            c.read_eof = true;
            begin_close(c);
            return;
        }
        if (!c.pipe.out.empty()) {
            mark_dirty(c);  // the session had something to say (key update)
        }
        if (direct) {
            c.payload_pos += static_cast<uint32_t>(n);
            c.payload_left -= static_cast<uint64_t>(n);
        } else {
            c.rend += static_cast<size_t>(n);
        }
    }
}

// ---------------------------------------------------------------- output

void event_loop::flush(connection& c)
{
    if (c.send_posted || c.fd < 0) {
        return;
    }
    if (c.closing) {
        return;
    }
    if (c.tls && c.ph == phase::transmission && !c.replies.empty()) {
        // Encrypt every waiting reply into one batch of records.
        gnutls_record_cork(c.session);
        while (nbd_op* o = c.replies.pop()) {
            auto send_all = [&](const uint8_t* p, size_t n) {
                while (n > 0) {
                    const ssize_t w = gnutls_record_send(c.session, p, n);
                    if (w == GNUTLS_E_AGAIN || w == GNUTLS_E_INTERRUPTED) {
                        continue;
                    }
                    if (w < 0) {
                        return false;
                    }
                    p += w;
                    n -= static_cast<size_t>(w);
                }
                return true;
            };
            bool ok = send_all(o->hdr, o->hdr_len);
            if (ok && o->data_len != 0) {
                ok = send_all(o->buf, o->data_len);
            }
            if (ok && !o->extra.empty()) {
                ok = send_all(o->extra.data(), o->extra.size());
            }
            release_op(*o);
            if (!ok) {
                begin_close(c);
                return;
            }
        }
        while (gnutls_record_uncork(c.session, GNUTLS_RECORD_WAIT) == GNUTLS_E_AGAIN) {
        }
    }
    if (c.tls && !c.pipe.out.empty()) {
        c.out_bytes.insert(c.out_bytes.end(), c.pipe.out.begin(), c.pipe.out.end());
        c.pipe.out.clear();
    }
    // Batches of up to k_max_iov iovecs, each sent at once while the socket
    // takes them; the rest of one it does not take goes to the ring.
    while (!c.closing) {
        if (c.iov_first == c.iov_count) {
            fill_iov(c);
        }
        if (c.iov_first == c.iov_count || !send_direct(c)) {
            break;
        }
    }
    if (!c.closing && !c.send_posted && c.close_after_send) {
        begin_close(c);
    }
}

// Takes the next batch into c.iov: pending bytes (handshake replies, TLS
// records) or, in plain transmission, the replies that fit.
void event_loop::fill_iov(connection& c)
{
    c.iov_first = 0;
    c.iov_count = 0;
    if (!c.out_bytes.empty()) {
        c.out_inflight.swap(c.out_bytes);
        c.out_bytes.clear();
        c.iov[0] = {c.out_inflight.data(), c.out_inflight.size()};
        c.iov_op[0] = nullptr;
        c.iov_count = 1;
        return;
    }
    if (c.tls) {
        return;
    }
    unsigned n = 0;
    while (!c.replies.empty() && n + 3 <= k_max_iov) {
        nbd_op* o = c.replies.pop();
        c.iov[n] = {o->hdr, o->hdr_len};
        c.iov_op[n] = nullptr;
        ++n;
        if (o->data_len != 0) {
            c.iov[n] = {o->buf, o->data_len};
            c.iov_op[n] = nullptr;
            ++n;
        }
        if (!o->extra.empty()) {
            c.iov[n] = {o->extra.data(), o->extra.size()};
            c.iov_op[n] = nullptr;
            ++n;
        }
        c.iov_op[n - 1] = o;
    }
    c.iov_count = n;
}

// Sends c.iov[iov_first, iov_count) with one sendmsg that does not wait,
// which for a peer that reads takes all of it: no completion to wait for,
// no timer. True when all of it went out; otherwise the rest is posted to
// the ring (MSG_WAITALL, completed by on_send) or the connection is closing.
bool event_loop::send_direct(connection& c)
{
    msghdr m{};
    m.msg_iov = c.iov + c.iov_first;
    m.msg_iovlen = c.iov_count - c.iov_first;
    const ssize_t n = ::sendmsg(c.fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
            post_send(c);  // the socket is full: the ring waits for room
            return false;
        }
        c.read_eof = true;  // nothing more can go out
        begin_close(c);
        return false;
    }
    sent(c, static_cast<size_t>(n));
    if (c.iov_first < c.iov_count) {
        post_send(c);
        return false;
    }
    return !c.closing;
}

void event_loop::post_send(connection& c)
{
    c.msg = {};
    c.msg.msg_iov = c.iov + c.iov_first;
    c.msg.msg_iovlen = c.iov_count - c.iov_first;
    io_uring_sqe* s = sqe();
    // MSG_WAITALL: io_uring completes the send once all of it is out (it
    // waits for room itself), so a completion never leaves a tail to post.
    io_uring_prep_sendmsg(s, c.fd, &c.msg, MSG_NOSIGNAL | MSG_WAITALL);
    io_uring_sqe_set_data(s, make_user_data(&c, k_token_send));
    c.send_posted = true;
}

// `n` bytes of c.iov went out: releases the ops whose replies are all
// sent, and once the batch is done, what waited for it.
void event_loop::sent(connection& c, size_t n)
{
    ++c.progress;
    size_t left = n;
    while (c.iov_first < c.iov_count) {
        iovec& v = c.iov[c.iov_first];
        if (left < v.iov_len) {
            v.iov_base = static_cast<uint8_t*>(v.iov_base) + left;
            v.iov_len -= left;
            break;
        }
        left -= v.iov_len;
        if (c.iov_op[c.iov_first] != nullptr) {
            release_op(*c.iov_op[c.iov_first]);
            c.iov_op[c.iov_first] = nullptr;
        }
        ++c.iov_first;
    }
    if (c.iov_first < c.iov_count) {
        return;
    }
    c.iov_first = c.iov_count = 0;
    c.out_inflight.clear();
    if (c.disc && c.ops_in_device == 0 && c.replies.empty() && c.out_bytes.empty() &&
        c.free_ops.size() == k_max_ops) {
        begin_close(c);
    }
    if (c.input_blocked && !c.closing) {
        // Its replies went out: it may take requests again.
        c.input_blocked = false;
        pump_input(c);
    }
}

void event_loop::on_send(connection& c, int res)
{
    c.send_posted = false;
    if (res < 0) {
        if (res == -EINTR || res == -EAGAIN) {
            post_send(c);
            return;
        }
        c.read_eof = true;  // nothing more can go out
        begin_close(c);
        // Ops of the failed batch are released by maybe_free.
        maybe_free(c);
        return;
    }
    sent(c, static_cast<size_t>(res));
    if (c.iov_first < c.iov_count) {
        post_send(c);
    } else {
        mark_dirty(c);  // what queued meanwhile goes out in the next flush
    }
    maybe_free(c);
}

}  // namespace softblk::nbd
