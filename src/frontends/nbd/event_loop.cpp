// The NBD server's event loop: the io_uring ring, the loop (device
// completions, flushing replies, dispatching completions) and how it waits
// (polling the completion ring for the measured window, then sleeping).
// Receiving is receive.cpp's, sending send.cpp's. See loop.hpp.
#include "loop.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <poll.h>
#include <sched.h>
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
    _place.emplace();
    if (_placing.level() != 0 || !_placing.fixed()) {
        if (auto ok = colocation::check(); !ok) {
            _placing_why = fmt::format("serves from any CPU: {}", ok.error().message);
            _placing_refused.store(true, std::memory_order_release);
        }
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
        // Next to its client under SCHED_IDLE, the client ran as soon as
        // the replies woke it, and its next requests may be in already:
        // then the loop takes them without a wait and without switching
        // its policy back and forth (two system calls, about 0.9 us).
        if (_place->replying() && next_is_in()) {
            count_placed();
            place_after_wait();
        } else {
            wait(device_fd, device_wake);
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
    _place.reset();
    for (auto& b : _bindings) {
        b.reset();
    }
}

// Waits for the next event (or until `device_wake`, or briefly where a
// queue completes on a descriptor the ring does not watch: `device_fd`),
// back under the thread's own policy (colocate), and places the loop for
// what it brings.
void event_loop::wait(bool device_fd, uint64_t device_wake)
{
    place_before_wait();
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
    place_after_wait();
}

bool event_loop::next_is_in()
{
    io_uring_submit_and_get_events(&_ring);
    return io_uring_cq_ready(&_ring) != 0;
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

void event_loop::place_before_wait()
{
    _place->reply_done();
    count_placed();
}

void event_loop::count_placed()
{
    if (_placing_refused.load(std::memory_order_relaxed)) {
        return;
    }
    const uint64_t served = _requests_parsed - _requests_placed;
    _requests_placed = _requests_parsed;
    if (served != 0 || !_placing.fixed()) {
        _placing.served(monotonic_ns(), served);
    }
}

void event_loop::place_after_wait()
{
    // By requests per second, next to a client with several requests in
    // flight the loop only takes its CPU (at QD 32, 0.65-0.8x the requests
    // per second). One pass that took in more than one request says so,
    // and the loop serves from anywhere for k_pipelined_ns. By requests
    // per CPU time the chooser measures both placements under that load.
    const uint64_t now = monotonic_ns();
    if (!_srv.config().poll_per_cpu && _requests_parsed - _parsed_at_wait > 1) {
        _pipelined_until_ns = now + k_pipelined_ns;
    }
    _parsed_at_wait = _requests_parsed;
    if (_placing_refused.load(std::memory_order_relaxed) || _placing.level() == 0 ||
        now < _pipelined_until_ns) {
        _place->release();
        return;
    }
    // Next to the one client of a unix socket (its process); otherwise,
    // or until then, where the loop is: a reply sent under SCHED_IDLE
    // brings the client it wakes (WF_SYNC, by the socket) to this CPU.
    if (_conns.size() == 1 && _conns.front()->peer_pid > 0) {
        _place->follow(_conns.front()->peer_pid, now);
    }
    if (_place->cpu() < 0) {
        _place->pin_to(::sched_getcpu());
    }
    _place->reply_begins();
}

}  // namespace softblk::nbd
