#include "queue.hpp"

#include "device_impl.hpp"
#include "op_properties.hpp"

#include <cassert>
#include <cerrno>
#include <ctime>
#include <poll.h>
#include <sys/prctl.h>

#include <softblk/support/cpu_relax.hpp>

namespace softblk::core {

namespace {

// How soon a queue looks again for a free tag of a shared pool when bios
// wait for one and nothing of its own is in flight.
constexpr uint64_t k_shared_tag_retry_ns = 50'000;

inline void bump(std::atomic<uint64_t>& counter, uint64_t by = 1)
{
    // Single writer (the queue thread): no locked instruction needed.
    counter.store(counter.load(std::memory_order_relaxed) + by, std::memory_order_relaxed);
}

// Short sleeps are the point of the timer completion mode: ask the kernel
// for no timer slack on threads that run queues (default slack is 50 us).
void lower_timer_slack()
{
    thread_local bool done = false;
    if (!done) {
        prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
        done = true;
    }
}

}  // namespace

// ---------------------------------------------------------------- shared tags

shared_tag_pool::shared_tag_pool(unsigned depth)
    : _depth(depth),
      _words(new std::atomic<uint64_t>[(depth + 63) / 64]),
      _word_count((depth + 63) / 64)
{
    for (unsigned i = 0; i < _word_count; ++i) {
        _words[i].store(0, std::memory_order_relaxed);
    }
}

int shared_tag_pool::get()
{
    const unsigned start = _hint.load(std::memory_order_relaxed) % _word_count;
    for (unsigned n = 0; n < _word_count; ++n) {
        const unsigned w = (start + n) % _word_count;
        uint64_t bits = _words[w].load(std::memory_order_relaxed);
        for (;;) {
            const unsigned valid = std::min(64u, _depth - w * 64);
            const uint64_t mask = valid == 64 ? ~0ull : ((1ull << valid) - 1);
            const uint64_t free_bits = ~bits & mask;
            if (free_bits == 0) {
                break;
            }
            const unsigned bit = static_cast<unsigned>(__builtin_ctzll(free_bits));
            if (_words[w].compare_exchange_weak(bits, bits | (1ull << bit),
                                                std::memory_order_acquire,
                                                std::memory_order_relaxed)) {
                _hint.store(w, std::memory_order_relaxed);
                return static_cast<int>(w * 64 + bit);
            }
        }
    }
    return -1;
}

void shared_tag_pool::put(unsigned tag)
{
    _words[tag / 64].fetch_and(~(1ull << (tag % 64)), std::memory_order_release);
}

// ---------------------------------------------------------------- queue

queue_impl::queue_impl(device_impl& dev, unsigned index, bool poll_queue, unsigned depth,
                       std::shared_ptr<shared_tag_pool> shared_tags)
    : _dev(dev),
      _mode(dev.info().queues.mode),
      _completion_nsec(dev.info().queues.completion_nsec),
      _timeout_ns(dev.info().queues.io_timeout_ms * uint64_t{1'000'000}),
      _index(index),
      _poll_queue(poll_queue),
      _depth(shared_tags ? shared_tags->depth() : depth),
      _requests(new io_request[_depth]),
      _shared_tags(std::move(shared_tags))
{
    for (unsigned t = 0; t < _depth; ++t) {
        _requests[t].tag = t;
        _requests[t].queue_index = static_cast<uint16_t>(index);
    }
    if (!_shared_tags) {
        _free_tags.reserve(_depth);
        for (unsigned t = _depth; t > 0; --t) {
            _free_tags.push_back(t - 1);
        }
    }
}

queue_impl::~queue_impl()
{
    // The target's half goes first, while the requests it may still hold
    // exist: a target whose library still owns requests (the rbd target)
    // waits for them in its destructor.
    _tq.reset();
}

result<void> queue_impl::open(target& t)
{
    auto tq = t.open_queue(_index, *this);
    if (!tq) {
        return std::unexpected(tq.error());
    }
    _tq = std::move(*tq);
    _tq_ring = _tq->ring_sharing();
    _external = t.takes_external_data();
    return {};
}

const block_limits& queue_impl::limits() const
{
    return _dev.info().limits;
}

io_request* queue_impl::get_request()
{
    int tag;
    if (_shared_tags) {
        tag = _shared_tags->get();
        if (tag < 0) {
            return nullptr;
        }
    } else {
        if (_free_tags.empty()) {
            return nullptr;
        }
        tag = static_cast<int>(_free_tags.back());
        _free_tags.pop_back();
    }
    io_request& r = _requests[tag];
    assert(r.state == k_free);
    r.op = io_op::read;
    r.flags = 0;
    r.offset = 0;
    r.length = 0;
    r.buffer = nullptr;
    r.external = nullptr;
    r.on_complete = nullptr;
    r.user_data = nullptr;
    r.transferred = 0;
    r.result_offset = 0;
    r.state = k_owned;
    return &r;
}

void queue_impl::release_tag(io_request& r)
{
    // A bio waiting for a tag takes this one as it is.
    if (!_bios_waiting.empty() && give_tag_to_waiting(r)) {
        return;
    }
    free_tag(r);
}

void queue_impl::free_tag(io_request& r)
{
    r.state = k_free;
    if (_shared_tags) {
        _shared_tags->put(r.tag);
    } else {
        _free_tags.push_back(r.tag);
    }
}

void queue_impl::put_request(io_request& r)
{
    assert(r.state == k_owned);
    release_tag(r);
}

int queue_impl::validate(const io_request& r) const
{
    if (!_dev.powered()) {
        return -ENODEV;
    }
    const op_properties* p = properties_of(r.op);
    if (p == nullptr) {
        return -EOPNOTSUPP;
    }
    const block_limits& lim = _dev.info().limits;
    // A request's data is in a buffer, or outside the process where the
    // target takes that (external_data: in the kernel for writes only, or
    // in a data_window), and in one place only.
    auto has_data = [&]() {
        if (r.external == nullptr) {
            return r.buffer != nullptr;
        }
        if (r.buffer != nullptr) {
            return false;
        }
        switch (r.external->where) {
        case external_data::place::kernel:
            return r.op != io_op::read && _external.kernel_buffers;
        case external_data::place::window:
            return _external.data_windows;
        }
        return false;
    };
    // What a request of this op must carry: its data, or room for a report.
    auto malformed = [&]() {
        switch (p->payload) {
        case op_payload::data:
            return !has_data();
        case op_payload::report:
            return r.buffer == nullptr || r.report_capacity == 0;
        case op_payload::none:
            break;
        }
        return false;
    };
    if (p->zone_op && !lim.zoned) {
        return -EOPNOTSUPP;
    }
    const uint32_t limit = p->length_limit != nullptr ? lim.*(p->length_limit) : 0;
    if (p->limit_is_capability && limit == 0) {
        return -EOPNOTSUPP;
    }
    if (p->data_checked_before_read_only && (r.length == 0 || malformed())) {
        return -EINVAL;
    }
    if (p->queue_checks_read_only && lim.read_only) {
        return -EPERM;
    }
    if ((p->needs_length && r.length == 0) || malformed() || (limit != 0 && r.length > limit)) {
        return -EINVAL;
    }
    if (p->offset_in_capacity && r.offset >= current_capacity(lim)) {
        return -EIO;
    }
    if (!p->checks_range) {
        return 0;
    }
    if (const int rc = check_block_range(lim, r.offset, r.length); rc != 0) {
        return rc;
    }
    // A data request stays inside one zone (the block layer splits bios on
    // chunk_sectors; a single request cannot be split).
    if (lim.zoned && lim.zone_size_bytes != 0 && r.length != 0 && !p->may_cross_zones &&
        r.offset / lim.zone_size_bytes != (r.offset + r.length - 1) / lim.zone_size_bytes) {
        return -EINVAL;
    }
    // Zone operations name a zone by its first byte.
    if (p->zone_start_error != 0 && lim.zone_size_bytes != 0 &&
        r.offset % lim.zone_size_bytes != 0) {
        return -p->zone_start_error;
    }
    return 0;
}

void queue_impl::submit(io_request& r)
{
    assert(r.state == k_owned || r.state == k_in_callback);
    r.state = k_in_target;
    r.status = 0;
    r.transferred = 0;
    r.attempts = 0;
    r.submit_ns = timeout_ns() != 0 ? coarse_monotonic_ns() : 0;
    ++_in_flight;
    ++_in_target;
    bump(_submitted);
    const int err = validate(r);
    if (err != 0) {
        complete(r, err);
        return;
    }
    _tq->submit(r);
}

void queue_impl::complete(io_request& r, int result)
{
    if (r.state != k_in_target) {
        // Completed after the core timed it out (and the target claimed to
        // have let go): the block layer ignores such late completions too.
        return;
    }
    --_in_target;
    r.state = k_pending;
    r.status = result;
    if (result >= 0) {
        r.transferred = static_cast<uint32_t>(result);
    }
    if (_poll_queue || _mode == completion_mode::deferred) {
        _deferred.push(r);
        return;
    }
    if (_mode == completion_mode::timer) {
        r.deadline_ns = monotonic_ns() + _completion_nsec;
        _timer.push(r);
        return;
    }
    deliver(r, result);
}

void queue_impl::deliver(io_request& r, int result)
{
    if (_delivering) {
        // A callback resubmitted and the target completed inline: run it
        // after the current callback returns instead of recursing.
        _inline_backlog.push(r);
        return;
    }
    _delivering = true;
    deliver_now(r, result);
    while (io_request* next = _inline_backlog.pop()) {
        deliver_now(*next, next->status);
    }
    _delivering = false;
}

void queue_impl::deliver_now(io_request& r, int result)
{
    --_in_flight;
    ++_delivered;
    bump(_completed);
    if (result < 0) {
        bump(_errors);
    } else if (r.op == io_op::read) {
        bump(_bytes_read, static_cast<uint64_t>(result));
    } else if (r.op == io_op::write || r.op == io_op::zone_append) {
        bump(_bytes_written, static_cast<uint64_t>(result));
    }
    r.state = k_in_callback;
    if (r.on_complete != nullptr) {
        r.on_complete(r, result);
    }
    if (r.state == k_in_callback) {
        release_tag(r);
    }
}

unsigned queue_impl::check_timeouts(uint64_t now)
{
    unsigned n = 0;
    for (unsigned t = 0; t < _depth && _in_target > 0; ++t) {
        io_request& r = _requests[t];
        if (r.state == k_in_target && now - r.submit_ns >= timeout_ns()) {
            if (_tq->timed_out(r)) {
                bump(_timeouts);
                complete(r, -ETIMEDOUT);
                ++n;
            }
        }
    }
    return n;
}

unsigned queue_impl::process()
{
    const unsigned before = _delivered;
    if (_posted_count.load(std::memory_order_acquire) != 0) {
        take_posted();
    }
    if (!_bios_waiting.empty()) {
        serve_waiting();
    }
    if (_tq->busy()) {
        _tq->poll();
    }
    if (!_deferred.empty()) {
        // Only what is due now: callbacks that resubmit land on the next pass.
        io_request* list = _deferred.take_all();
        _delivering = true;
        while (list != nullptr) {
            io_request* next = list->next;
            deliver_now(*list, list->status);
            list = next;
        }
        while (io_request* r = _inline_backlog.pop()) {
            deliver_now(*r, r->status);
        }
        _delivering = false;
    }
    if (!_timer.empty()) {
        const uint64_t now = monotonic_ns();
        fifo due;
        while (!_timer.empty() && _timer.front()->deadline_ns <= now) {
            due.push(*_timer.pop());
        }
        _delivering = true;
        while (io_request* r = due.pop()) {
            deliver_now(*r, r->status);
        }
        while (io_request* r = _inline_backlog.pop()) {
            deliver_now(*r, r->status);
        }
        _delivering = false;
    }
    if (_in_target > 0 && timeout_ns() != 0) {
        const uint64_t now = coarse_monotonic_ns();
        if (now >= _next_timeout_scan) {
            check_timeouts(now);
            _next_timeout_scan =
                now + std::min<uint64_t>(timeout_ns() / 4 + 1, uint64_t{100'000'000});
        }
    }
    return _delivered - before;
}

uint64_t queue_impl::next_event_ns() const
{
    if (_posted_count.load(std::memory_order_relaxed) != 0) {
        return 0;  // posted bios wait for process()
    }
    if (_in_flight == 0) {
        // Bios can wait with nothing of ours in flight only for a tag of a
        // shared pool, which another queue frees: look again soon.
        return _bios_waiting.empty() ? UINT64_MAX : monotonic_ns() + k_shared_tag_retry_ns;
    }
    if (!_deferred.empty() || !_inline_backlog.empty()) {
        return 0;
    }
    uint64_t wake = _tq->next_wakeup_ns();
    if (!_timer.empty()) {
        wake = std::min(wake, _timer.front()->deadline_ns);
    }
    if (_tq->busy() && _tq->wait_fd() < 0 && !_ring_shared) {
        // The target holds requests and named neither a time nor a
        // descriptor (nor completes them in the owner's ring): look again
        // soon (as wait() does).
        wake = std::min(wake, monotonic_ns() + uint64_t{1'000'000});
    }
    if (_in_target > 0 && timeout_ns() != 0) {
        // The scan runs on the coarse clock, which may lag the precise one
        // by a tick: never ask for a wake-up sooner than 1 ms from now for
        // it, or the owner would spin until the coarse clock catches up.
        wake = std::min(wake, std::max(_next_timeout_scan, monotonic_ns() + uint64_t{1'000'000}));
    }
    return wake;
}

int queue_impl::event_fd() const
{
    return _tq->wait_fd();
}

bool queue_impl::share_ring(io_uring* ring)
{
    if (ring != nullptr && in_flight() != 0) {
        return false;
    }
    if (!_tq_ring->share_ring(ring)) {
        return false;
    }
    _ring_shared = ring != nullptr;
    return true;
}

bool queue_impl::links_completions() const
{
    // (Deferred completions, irqmode=1, only run later in the same loop; a
    // timer's, irqmode=2, must not end before it.)
    return _ring_shared && !_poll_queue && _mode != completion_mode::timer &&
           _tq_ring->ends_with_ring_write();
}

unsigned queue_impl::wait(unsigned min_completions, int64_t timeout_ns)
{
    lower_timer_slack();
    const uint64_t start = monotonic_ns();
    const uint64_t give_up =
        timeout_ns < 0 ? UINT64_MAX : start + static_cast<uint64_t>(timeout_ns);
    unsigned done = 0;
    for (;;) {
        done += process();
        if (done >= min_completions || in_flight() == 0) {
            return done;
        }
        if (_in_flight == 0) {
            // Only bios waiting for a shared tag that another queue holds.
            const uint64_t now = monotonic_ns();
            if (now >= give_up) {
                return done;
            }
            const uint64_t wake = std::min(give_up, now + k_shared_tag_retry_ns);
            timespec ts{static_cast<time_t>(wake / uint64_t{1'000'000'000}),
                        static_cast<long>(wake % uint64_t{1'000'000'000})};
            clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr);
            continue;
        }
        if (!_deferred.empty()) {
            continue;
        }
        const uint64_t now = monotonic_ns();
        if (now >= give_up) {
            return done;
        }
        uint64_t wake = give_up;
        if (!_timer.empty()) {
            wake = std::min(wake, _timer.front()->deadline_ns);
        }
        wake = std::min(wake, _tq->next_wakeup_ns());
        if (_tq->busy() && _tq->wait_fd() < 0) {
            // The target holds requests and named no time: look again soon.
            wake = std::min(wake, now + uint64_t{1'000'000});
        }
        if (_in_target > 0 && this->timeout_ns() != 0) {
            // Timed-out requests must be noticed even when nothing else
            // happens; coarse clock granularity is a few ms.
            wake = std::min(
                wake, now + std::min<uint64_t>(this->timeout_ns() / 4 + 1, uint64_t{100'000'000}));
        }
        if (wake <= now) {
            continue;
        }
        const uint64_t delta = wake - now;
        const int fd = _tq->wait_fd();
        if (fd >= 0 && _tq->busy()) {
            pollfd p{fd, POLLIN, 0};
            timespec ts{static_cast<time_t>(delta / uint64_t{1'000'000'000}),
                        static_cast<long>(delta % uint64_t{1'000'000'000})};
            ppoll(&p, 1, &ts, nullptr);
            continue;
        }
        if (delta < k_spin_wait_ns) {
            // Shorter than a sleep's wake-up latency: spin.
            while (monotonic_ns() < wake) {
                cpu_relax();
            }
            continue;
        }
        timespec ts{static_cast<time_t>(wake / uint64_t{1'000'000'000}),
                    static_cast<long>(wake % uint64_t{1'000'000'000})};
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr);
    }
}

// ---------------------------------------------------------------- control submissions

void queue_impl::attach_owner(std::function<void()> wake)
{
    std::lock_guard lock(_owner_mutex);
    _owner_wake = std::move(wake);
}

bool queue_impl::detach_owner()
{
    std::lock_guard lock(_owner_mutex);
    if (in_flight() != 0) {
        return false;  // posted bios (or the owner's own) are not done yet
    }
    _owner_wake = nullptr;
    return true;
}

void queue_impl::post(bio& b)
{
    std::unique_lock lock(_owner_mutex);
    if (_owner_wake) {
        // Counted before it is on the list, so that the owner's in_flight()
        // is not 0 from the moment it can take it; wake() runs inside the
        // push, while the owner (and what it sleeps on) cannot go.
        _posted_count.fetch_add(1, std::memory_order_release);
        _posted.push(b, [this] { _owner_wake(); });
        return;
    }
    // Nobody drives the queue: run it here, excluding device::execute's
    // callers and (through _owner_mutex) an owner that would attach.
    int status;
    {
        std::lock_guard sync(_sync_lock);
        status = run(b);
    }
    lock.unlock();
    if (b.on_complete != nullptr) {
        b.on_complete(b, status);
    }
}

void queue_impl::take_posted()
{
    for (bio* b = _posted.take(); b != nullptr;) {
        bio* next = b->next;
        _posted_count.fetch_sub(1, std::memory_order_relaxed);
        submit(*b);  // may complete at once: `b` is not touched after
        b = next;
    }
}

queue_stats queue_impl::stats() const
{
    queue_stats s;
    s.submitted = _submitted.load(std::memory_order_relaxed);
    s.completed = _completed.load(std::memory_order_relaxed);
    s.errors = _errors.load(std::memory_order_relaxed);
    s.bytes_read = _bytes_read.load(std::memory_order_relaxed);
    s.bytes_written = _bytes_written.load(std::memory_order_relaxed);
    s.timeouts = _timeouts.load(std::memory_order_relaxed);
    return s;
}

}  // namespace softblk::core
