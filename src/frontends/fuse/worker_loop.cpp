// The /dev/fuse workers' loop: reading requests, the busy-poll window,
// the asynchronous mode of a lone worker (requests in flight, replies from
// completions), parking and waking workers as the worker count changes.
// fuse_export.cpp starts and stops them; ring mode's threads are in
// fuse_ring.cpp.
#include "session.hpp"

#include <softblk/support/buffer_pool.hpp>
#include <softblk/support/clock.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <linux/fuse.h>
#include <mutex>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <thread>
#include <unistd.h>

#include <fmt/core.h>

namespace softblk::fuse {

namespace {

void on_async_complete(bio& request, int status)
{
    auto* p = static_cast<pending_io*>(request.user_data);
    worker& w = *p->owner;
    if (status < 0) {
        p->reply.error(-status);
    } else if (p->is_read) {
        p->reply.data(p->data + p->skip, p->size);
    } else {
        fuse_write_out out{};
        out.size = static_cast<uint32_t>(p->size);
        p->reply.value(out);
    }
    if (p->data != nullptr && p->pooled) {
        w.buffers.put(p->data, p->data_class);
    }
    p->data = nullptr;
    if (p->receive_mem != nullptr) {
        std::free(p->receive_mem);
        p->receive_mem = nullptr;
    }
    p->completed = true;
    --w.in_flight;
    w.pending_free.push_back(p);
}

}  // namespace

void fuse_export::run_worker(worker& w)
{
    t_worker = &w;
    // Whatever the creating thread blocked, the wake signal must get through.
    sigset_t wake;
    sigemptyset(&wake);
    sigaddset(&wake, wake_signal());
    pthread_sigmask(SIG_UNBLOCK, &wake, nullptr);
    const std::string thread_name = fmt::format("fuse-{}", w.index);
    pthread_setname_np(pthread_self(), thread_name.c_str());

    fuse_buf buf{};
    w.receive = &buf;
    while (!fuse_session_exited(_session)) {
        if (w.index == 0) {
            if (_worker_count->level() != _active.load(std::memory_order_relaxed)) {
                apply_worker_count(w);
            }
        } else if (w.index >= _active.load(std::memory_order_acquire)) {
            park(w);
            continue;
        }
        if (w.in_flight != 0) {
            w.queue->process();
        }
        if (w.in_flight != 0) {
            // Requests in flight (async mode): wait for whichever comes
            // first, a new request or a completion.
            set_fd_nonblocking(w, true);
            if (!wait_request_or_completion(w)) {
                continue;
            }
            const int rc = fuse_session_receive_buf(_session, &buf);
            if (rc == -EINTR || rc == -EAGAIN) {
                continue;
            }
            if (rc <= 0) {
                break;
            }
            if (!_poll->fixed() || !_worker_count->fixed()) {
                const uint64_t now = monotonic_ns();
                _poll->served(now);
                _worker_count->served(now);
            }
            if (!serve_direct(w, buf, static_cast<size_t>(rc))) {
                fuse_session_process_buf(_session, &buf);
            }
            continue;
        }
        if (w.fd_nonblocking) {
            set_fd_nonblocking(w, false);
        }
        // Before sleeping in read(/dev/fuse), one worker polls for a while:
        // at queue depth 1 the next request often comes within tens of
        // microseconds, and a sleeping worker costs a wake-up on its path
        // (the window is the one measured to pay on this machine).
        const uint64_t window_ns = _poll->level() * 1'000;
        uint64_t polled_ns = 0;
        bool caught = false;
        if (window_ns != 0 && !_polling.exchange(true, std::memory_order_acquire)) {
            const uint64_t start = monotonic_ns();
            caught = poll_for_request(start + window_ns);
            _polling.store(false, std::memory_order_release);
            polled_ns = monotonic_ns() - start;
            w.poll_time_ns.fetch_add(polled_ns, std::memory_order_relaxed);
        }
        const int rc = fuse_session_receive_buf(_session, &buf);
        if (rc == -EINTR || rc == -EAGAIN) {
            continue;
        }
        if (rc <= 0) {
            break;  // -ENODEV: unmounted; 0: the connection is gone
        }
        (caught ? w.polled_requests : w.slept_requests).fetch_add(1, std::memory_order_relaxed);
        // The clock only for a chooser that measures (not for given values).
        if (!_poll->fixed() || !_worker_count->fixed()) {
            const uint64_t now = monotonic_ns();
            _poll->served(now, 1, polled_ns);
            _worker_count->served(now);
        }
        if (!serve_direct(w, buf, static_cast<size_t>(rc))) {
            fuse_session_process_buf(_session, &buf);
        }
    }
    // Completions still owed reply into the session, which lives until
    // the workers are joined.
    while (w.in_flight != 0) {
        w.queue->wait(1, 10'000'000);
    }
    if (w.fd_nonblocking) {
        set_fd_nonblocking(w, false);
    }
    w.receive = nullptr;
    std::free(buf.mem);
    w.done.store(true, std::memory_order_release);
}

void fuse_export::park(worker& w)
{
    std::unique_lock lock(_park_lock);
    w.parked.store(true, std::memory_order_seq_cst);
    while (w.index >= _active.load(std::memory_order_seq_cst) && !fuse_session_exited(_session)) {
        // Bounded: stop() ends the session without taking the lock.
        _park_wake.wait_for(lock, std::chrono::milliseconds(100));
    }
    w.parked.store(false, std::memory_order_seq_cst);
}

void fuse_export::apply_worker_count(worker& w)
{
    const auto want = static_cast<unsigned>(_worker_count->level());
    const unsigned active = _active.load(std::memory_order_relaxed);
    // A device that keeps requests in flight (a file, completion_nsec)
    // gets as many overlapping as the kernel sends from one asynchronous
    // worker; synchronous workers would have one each. The chooser then
    // measures one worker under the higher count too, and keeps the lower.
    constexpr uint64_t k_deferred_recently_ns = 1'000'000'000;
    const bool hold = want > active && w.async && w.last_deferred_ns != 0 &&
                      monotonic_ns() - w.last_deferred_ns < k_deferred_recently_ns;
    _held_async.store(hold, std::memory_order_relaxed);
    if (hold) {
        return;
    }
    if (want > active) {
        // The others will share the queue through device::execute: what
        // this worker has in flight on it completes first, and /dev/fuse
        // blocks again for all of them.
        while (w.in_flight != 0) {
            w.queue->wait(1, 10'000'000);
        }
        if (w.fd_nonblocking) {
            set_fd_nonblocking(w, false);
        }
        w.async = false;
        if (_shared_queues) {
            w.queue = nullptr;
        }
        {
            std::lock_guard lock(_park_lock);
            _active.store(want, std::memory_order_seq_cst);
        }
        _park_wake.notify_all();
        // Until they run again: a parked flag seen later is a new parking.
        for (unsigned i = active; i < want; ++i) {
            while (_workers[i]->parked.load(std::memory_order_seq_cst) &&
                   !fuse_session_exited(_session)) {
                std::this_thread::yield();
            }
        }
        return;
    }
    _active.store(want, std::memory_order_seq_cst);
    for (unsigned i = want; i < active; ++i) {
        // A worker blocked in read(/dev/fuse) leaves it on EINTR; one that
        // is serving a request finishes it first. A signal sent just
        // before it blocks is lost, so keep sending.
        while (!_workers[i]->parked.load(std::memory_order_seq_cst) &&
               !fuse_session_exited(_session)) {
            pthread_kill(_workers[i]->handle, wake_signal());
            std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
    }
    if (want == 1 && w.solo_queue != nullptr) {
        w.queue = w.solo_queue;
    }
    w.async = want == 1 && w.queue != nullptr;
}

void fuse_export::set_fd_nonblocking(worker& w, bool on) const
{
    const int fd = fuse_session_fd(_session);
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags >= 0) {
        ::fcntl(fd, F_SETFL, on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK));
    }
    w.fd_nonblocking = on;
}

bool fuse_export::wait_request_or_completion(worker& w) const
{
    const uint64_t next = w.queue->next_event_ns();
    if (next == 0) {
        return true;
    }
    const int event_fd = w.queue->event_fd();
    // Nothing to wake us but a deadline: at most 10 ms, in case a target
    // completes in a way neither says (the loop then just processes).
    uint64_t wait_ns = event_fd >= 0 ? UINT64_MAX : 10'000'000;
    if (next != UINT64_MAX) {
        const uint64_t now = monotonic_ns();
        wait_ns = std::min(wait_ns, next > now ? next - now : 0);
    }
    if (wait_ns == 0) {
        return true;
    }
    pollfd fds[2] = {{.fd = fuse_session_fd(_session), .events = POLLIN, .revents = 0},
                     {.fd = event_fd, .events = POLLIN, .revents = 0}};
    struct timespec ts {};
    ts.tv_sec = static_cast<time_t>(wait_ns / 1'000'000'000u);
    ts.tv_nsec = static_cast<long>(wait_ns % 1'000'000'000u);
    if (::ppoll(fds, event_fd >= 0 ? 2 : 1, wait_ns == UINT64_MAX ? nullptr : &ts, nullptr) < 0) {
        return false;  // EINTR: the loop looks at the session first
    }
    return fds[0].revents != 0;
}

void fuse_export::submit_async(worker& w, const reply_to& r, io_op op, uint64_t offset,
                               uint32_t length, const char* data, uint64_t skip, size_t size)
{
    pending_io* p = w.take_pending();
    p->reply = r;
    p->is_read = op == io_op::read;
    p->completed = false;
    p->skip = skip;
    p->size = size;
    p->receive_mem = nullptr;
    p->data = nullptr;
    p->pooled = false;
    if (p->is_read) {
        // A read that needs no widening lands in the reply's own buffer
        // where it has one (a ring entry's payload): no copy at the reply.
        if (skip == 0 && length == size) {
            p->data = reinterpret_cast<uint8_t*>(r.buffer(size));
        }
        if (p->data == nullptr) {
            p->data = w.buffers.get(length, p->data_class);
            p->pooled = true;
        }
        if (p->data == nullptr) {
            w.pending_free.push_back(p);
            r.error(ENOMEM);
            return;
        }
    }
    bio& b = p->request;
    b.op = op;
    b.flags = 0;
    b.offset = offset;
    b.length = length;
    // The target only reads from the buffer of a write.
    b.buffer = p->is_read ? static_cast<void*>(p->data) : const_cast<char*>(data);
    b.on_complete = on_async_complete;
    b.user_data = p;
    ++w.in_flight;
    w.queue->submit(b);
    // Completions deferred to the queue's loop (irqmode=1) are due now.
    w.queue->process();
    if (!p->completed) {
        w.last_deferred_ns = monotonic_ns();
    }
    if (!p->completed && !p->is_read && w.receive != nullptr) {
        // The data lies in libfuse's receive buffer, which the next
        // request would overwrite: the write keeps it, libfuse allocates
        // another. (A ring entry keeps its payload until the reply.)
        p->receive_mem = w.receive->mem;
        w.receive->mem = nullptr;
    }
}

bool fuse_export::poll_for_request(uint64_t deadline) const
{
    pollfd fd{.fd = fuse_session_fd(_session), .events = POLLIN, .revents = 0};
    do {
        // POLLERR or POLLHUP (unmounted, aborted) counts as ready too: the
        // read then reports it.
        if (::poll(&fd, 1, 0) > 0) {
            return true;
        }
        // Poll on idle CPU time only: a thread that is ready to run here
        // (often the very client, loop worker or softirq thread that will
        // send the next request) goes first.
        ::sched_yield();
    } while (!fuse_session_exited(_session) && monotonic_ns() < deadline);
    return false;
}

}  // namespace softblk::fuse
