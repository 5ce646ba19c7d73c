#include "queue_worker.hpp"

#include <algorithm>
#include <utility>
#include <cerrno>
#include <cstring>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <fmt/core.h>

#include <softblk/support/clock.hpp>
#include <softblk/support/cpu_relax.hpp>
#include <softblk/virtio/blk.hpp>

namespace softblk::vhost_user_blk {

namespace {

using virtio::segment;

enum command : int { k_none = 0, k_pause = 1, k_pause_drain = 2, k_stop = 3 };

// What completion does besides writing the status (request_slot::kind).
enum completion_kind : uint8_t {
    k_copy_out = 1 << 0,     // bounced read: copy the bounce buffer to the writable segments
    k_free_bounce = 1 << 1,  // give the bounce buffer back
    k_report = 1 << 2,       // zone report: convert the zones into the writable segments
    k_append = 1 << 3,       // zone append: write the landing sector first
};

// Waits shorter than this are spun (as the core's wait() does).
constexpr uint64_t k_spin_ns = 20'000;
// Without a kick eventfd the ring is polled at this interval.
constexpr uint64_t k_kickless_poll_ns = 50'000;
// Zones one report may ask for (3 MiB of softblk zone descriptors).
constexpr uint64_t k_max_report_zones = 65'536;

// Calls fn(p, at, n) for each piece of bytes [skip, skip + len) of
// `segs`: `n` bytes at `p`, which are bytes [at, at + n) of the range.
// Returns the bytes visited (less when the segments end first).
template <class F>
uint64_t for_each_piece(std::span<const segment> segs, uint64_t skip, uint64_t len, F fn)
{
    uint64_t done = 0;
    for (const segment& s : segs) {
        if (done == len) {
            break;
        }
        if (skip >= s.len) {
            skip -= s.len;
            continue;
        }
        const uint64_t n = std::min<uint64_t>(s.len - skip, len - done);
        fn(s.ptr + skip, done, n);
        done += n;
        skip = 0;
    }
    return done;
}

// Copies `len` bytes starting `skip` bytes into `segs` to `dst`.
uint64_t gather(std::span<const segment> segs, uint64_t skip, void* dst, uint64_t len)
{
    auto* out = static_cast<uint8_t*>(dst);
    return for_each_piece(segs, skip, len, [out](uint8_t* p, uint64_t at, uint64_t n) {
        std::memcpy(out + at, p, n);
    });
}

// Copies `len` bytes from `src` into `segs` from `skip` bytes on.
uint64_t scatter(std::span<const segment> segs, uint64_t skip, const void* src, uint64_t len)
{
    const auto* in = static_cast<const uint8_t*>(src);
    return for_each_piece(
        segs, skip, len, [in](uint8_t* p, uint64_t at, uint64_t n) { std::memcpy(p, in + at, n); });
}

// The host address of bytes [skip, skip + len) of `segs` when they are one
// contiguous range in this process (one segment, or segments that follow
// each other in the mapping), else nullptr.
uint8_t* contiguous(std::span<const segment> segs, uint64_t skip, uint64_t len)
{
    uint8_t* start = nullptr;
    uint8_t* next = nullptr;
    bool joined = true;
    const uint64_t found = for_each_piece(segs, skip, len, [&](uint8_t* p, uint64_t, uint64_t n) {
        if (start == nullptr) {
            start = p;
        } else if (p != next) {
            joined = false;
        }
        next = p + n;
    });
    return found == len && joined ? start : nullptr;
}

void bump(std::atomic<uint64_t>& c)
{
    c.store(c.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
}

void signal(int fd)
{
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(fd, &one, sizeof one);
}

void drain_eventfd(int fd)
{
    uint64_t v;
    [[maybe_unused]] ssize_t n = ::read(fd, &v, sizeof v);
}

}  // namespace

queue_worker::queue_worker(const worker_config& cfg) : _cfg(cfg), _queue(*cfg.queue)
{
}

queue_worker::~queue_worker()
{
    if (_thread.joinable()) {
        stop();
    }
    if (_wake_fd >= 0) {
        ::close(_wake_fd);
    }
}

const char* queue_worker::start()
{
    if (const char* err = _ring.attach(*_cfg.memory, _cfg.desc_addr, _cfg.avail_addr,
                                       _cfg.used_addr, _cfg.num, _cfg.event_idx, _cfg.indirect)) {
        return err;
    }
    _slots = std::make_unique<request_slot[]>(_cfg.num);
    for (uint32_t i = 0; i < _cfg.num; ++i) {
        _slots[i].owner = this;
        _slots[i].head = static_cast<uint16_t>(i);
    }
    // Direct descriptors (at most num) then one indirect table (at most
    // k_max_queue_size), some split where they cross memory regions.
    _scratch.resize(_cfg.num + virtio::k_max_queue_size + 64);
    _wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (_wake_fd < 0) {
        return "eventfd failed";
    }
    _enabled.store(_cfg.enabled, std::memory_order_relaxed);
    _thread = std::thread([this] { run(); });
    return nullptr;
}

void queue_worker::set_enabled(bool on)
{
    _enabled.store(on, std::memory_order_release);
    signal(_wake_fd);
}

void queue_worker::pause(bool drain)
{
    _command.store(drain ? k_pause_drain : k_pause, std::memory_order_release);
    signal(_wake_fd);
    std::unique_lock lock(_park_lock);
    _park_cv.wait(lock, [this] { return _parked; });
}

const char* queue_worker::reattach()
{
    const char* err = _ring.attach(*_cfg.memory, _cfg.desc_addr, _cfg.avail_addr, _cfg.used_addr,
                                   _cfg.num, _cfg.event_idx, _cfg.indirect);
    if (err != nullptr) {
        _broken = true;
    }
    return err;
}

void queue_worker::resume()
{
    {
        std::lock_guard lock(_park_lock);
        _release = true;
    }
    _park_cv.notify_all();
    std::unique_lock lock(_park_lock);
    _park_cv.wait(lock, [this] { return !_parked; });
}

uint16_t queue_worker::stop()
{
    if (_thread.joinable()) {
        _command.store(k_stop, std::memory_order_release);
        signal(_wake_fd);
        {
            // Under the lock: a thread about to park sees the stop.
            std::lock_guard lock(_park_lock);
        }
        _park_cv.notify_all();  // a parked thread goes on to drain and end
        _thread.join();
    }
    return _ring.last_avail();
}

bool queue_worker::idle() const
{
    return _queue.in_flight() == 0 && _ring.unpublished() == 0;
}

void queue_worker::park()
{
    {
        std::unique_lock lock(_park_lock);
        _parked = true;
        _park_cv.notify_all();
        _park_cv.wait(lock, [this] {
            return _release || _command.load(std::memory_order_acquire) == k_stop;
        });
        _release = false;
        _parked = false;
        // A stop that came while parked stays.
        int paused = k_pause;
        if (!_command.compare_exchange_strong(paused, k_none)) {
            paused = k_pause_drain;
            _command.compare_exchange_strong(paused, k_none);
        }
    }
    _park_cv.notify_all();
}

void queue_worker::log(const char* what, uint64_t value)
{
    if (_log_budget == 0) {
        return;
    }
    --_log_budget;
    fmt::print(stderr, "vhost-user-blk {}: ring {}: {} ({}){}\n", _cfg.settings->serial, _cfg.index,
               what, value,
               _log_budget == 0 ? "; further errors of this ring are counted, not logged" : "");
}

void queue_worker::bad_request(uint16_t head, const char* why)
{
    bump(_cfg.counters->bad_requests);
    log(why, head);
    _ring.push_used(head, 0);
    if (_inflight.attached()) {
        _inflight.returned(head);
    }
}

void queue_worker::break_ring(const char* why)
{
    if (!_broken) {
        _broken = true;
        bump(_cfg.counters->bad_requests);
        _log_budget = std::max(_log_budget, 1u);
        log(why, _ring.last_avail());
        if (_cfg.error_fd >= 0) {
            signal(_cfg.error_fd);
        }
    }
}

void queue_worker::run()
{
    ::prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
    const std::string name = fmt::format("vublk-q{}", _cfg.index);
    pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
    resubmit_inflight();
    // This thread drives device queue i: control submissions (the daemon's
    // `softblk zone`) come through its inbox and wake the loop here.
    _queue.attach_owner([this] { signal(_wake_fd); });
    shared_level_chooser& poll = *_cfg.counters->poll;
    uint64_t last_work = monotonic_ns();
    uint64_t spun_ns = 0;  // spent polling since the chooser last heard of it
    for (;;) {
        const int cmd = _command.load(std::memory_order_acquire);
        if (cmd != k_none && (cmd == k_pause || idle())) {
            if (cmd == k_stop) {
                if (_queue.detach_owner()) {
                    break;
                }
                continue;  // a control submission came in: run it first
            }
            park();
            continue;
        }
        const bool accepting =
            cmd == k_none && !_broken && _enabled.load(std::memory_order_acquire);
        bool progress = false;
        unsigned taken = 0;
        if (accepting) {
            taken = take_requests();
            progress = taken != 0;
        }
        if (_queue.in_flight() > 0 && _queue.process() > 0) {
            progress = true;
        }
        if (publish()) {
            progress = true;
        }
        const uint64_t window_ns = poll.level() * 1'000;
        if (progress) {
            if (taken != 0 || window_ns != 0) {
                const uint64_t now = monotonic_ns();
                if (taken != 0) {
                    poll.served(now, taken, std::exchange(spun_ns, 0));
                }
                last_work = now;
            }
            continue;
        }
        if (accepting && window_ns != 0) {
            const uint64_t now = monotonic_ns();
            if (now - last_work < window_ns) {
                cpu_relax();
                continue;
            }
            spun_ns += now - last_work;
        }
        sleep();
        last_work = monotonic_ns();
    }
    publish();
}

void queue_worker::resubmit_inflight()
{
    if (_cfg.inflight == nullptr) {
        _ring.set_last_avail(_cfg.base);
        return;
    }
    const bool in_use = _inflight.attach(_cfg.inflight, _cfg.num);
    std::vector<uint16_t> heads;
    const uint16_t used = _ring.used_idx_in_ring();
    const unsigned n = _inflight.recover(used, heads);
    if (!in_use) {
        _ring.set_last_avail(_cfg.base);
        return;
    }
    // Every chain the driver made available up to here was either
    // returned (the used index counts them) or is in flight.
    _ring.set_last_avail(static_cast<uint16_t>(used + n));
    for (uint16_t head : heads) {
        bump(_cfg.counters->resubmitted);
        start_request(head);
    }
    if (n != 0) {
        fmt::print(stderr, "vhost-user-blk {}: ring {}: resubmitted {} request{} in flight\n",
                   _cfg.settings->serial, _cfg.index, n, n == 1 ? "" : "s");
    }
}

unsigned queue_worker::take_requests()
{
    unsigned taken = 0;
    for (uint32_t n = 0; n < _ring.num() && !_broken; ++n) {
        uint16_t head;
        const int r = _ring.pop(head);
        if (r == 0) {
            break;
        }
        if (r < 0) {
            break_ring("the driver's available index ran more than the queue size ahead");
            break;
        }
        start_request(head);
        ++taken;
    }
    return taken;
}

void queue_worker::submit(request_slot& s, io_op op, uint64_t offset, uint64_t length, void* buffer,
                          uint32_t flags)
{
    bio& b = s.b;
    b.op = op;
    b.flags = flags;
    b.offset = offset;
    b.length = length;
    b.buffer = buffer;
    b.on_complete = &queue_worker::on_bio_done;
    b.user_data = &s;
    _queue.submit(b);
}

void queue_worker::finish(request_slot& s, uint8_t status)
{
    *s.status = status;
    s.busy = false;
    if (status != VIRTIO_BLK_S_OK) {
        bump(_cfg.counters->errors);
    }
    _ring.push_used(s.head, s.used_len);
    if (_inflight.attached()) {
        _inflight.returned(s.head);
    }
}

void queue_worker::on_bio_done(bio& b, int status)
{
    auto& s = *static_cast<request_slot*>(b.user_data);
    s.owner->complete(s, status);
}

void queue_worker::complete(request_slot& s, int status)
{
    if (status == 0) {
        if ((s.kind & k_copy_out) != 0) {
            scatter(s.in, 0, s.bounce, s.b.length);
        }
        if ((s.kind & k_append) != 0) {
            const uint64_t sector = s.b.result_offset / 512;
            scatter(s.in, 0, &sector, sizeof sector);
        }
        if ((s.kind & k_report) != 0) {
            const auto* zones = reinterpret_cast<const zone_descriptor*>(s.bounce);
            virtio::virtio_blk_zone_report head{};
            head.nr_zones = s.b.transferred;
            scatter(s.in, 0, &head, sizeof head);
            for (uint64_t i = 0; i < s.b.transferred; ++i) {
                virtio::virtio_blk_zone_descriptor d{};
                d.z_cap = zones[i].capacity / 512;
                d.z_start = zones[i].start / 512;
                d.z_wp = zones[i].write_pointer / 512;
                d.z_type = virtio::virtio_zone_type(zones[i].type);
                d.z_state = virtio::virtio_zone_state(zones[i].condition);
                scatter(s.in, sizeof head + i * sizeof d, &d, sizeof d);
            }
        }
    }
    if ((s.kind & k_free_bounce) != 0) {
        _bounce.put(s.bounce, s.bounce_class);
        s.bounce = nullptr;
    }
    finish(s, virtio::status_from_errno(status, s.zone_op));
}

void queue_worker::start_request(uint16_t head)
{
    if (head >= _ring.num()) {
        break_ring("head index beyond the queue size");
        return;
    }
    request_slot& s = _slots[head];
    if (s.busy) {
        break_ring("chain made available again while in flight");
        return;
    }
    if (_inflight.attached()) {
        _inflight.taken(head);
    }
    ring_counters& k = *_cfg.counters;
    bump(k.requests);
    virtio::chain c{.storage = _scratch};
    if (const virtio::chain_error err = _ring.walk(*_cfg.memory, head, c);
        err != virtio::chain_error::none) {
        bad_request(head, virtio::to_string(err));
        return;
    }
    if (c.writable_bytes == 0) {
        bad_request(head, "request without a writable status byte");
        return;
    }
    const std::span<segment> rd = c.readable_segments();
    const std::span<segment> wr = c.writable_segments();
    s.busy = true;
    s.kind = 0;
    s.zone_op = false;
    s.bounce = nullptr;
    s.status = wr.back().ptr + wr.back().len - 1;
    s.used_len = static_cast<uint32_t>(std::min<uint64_t>(c.writable_bytes, UINT32_MAX));
    s.b.report_capacity = 0;
    if (c.readable_bytes < virtio::k_blk_outhdr_bytes) {
        bump(k.bad_requests);
        log("request header shorter than 16 bytes", head);
        finish(s, VIRTIO_BLK_S_IOERR);
        return;
    }
    virtio_blk_outhdr h;
    gather(rd, 0, &h, sizeof h);
    const uint64_t out_len = c.readable_bytes - sizeof h;  // data after the header
    const uint64_t in_len = c.writable_bytes - 1;          // data before the status
    if (h.sector > UINT64_MAX / 512) {
        finish(s, VIRTIO_BLK_S_IOERR);
        return;
    }
    const uint64_t offset = h.sector * 512;
    const bool read_only = _cfg.limits->read_only || _cfg.settings->read_only;
    // Bytes [skip, skip + len) of `segs` as one buffer: in place when
    // contiguous in our mapping, else a bounce buffer (filled from `segs`
    // when `fill`). nullptr when it cannot be had (too large).
    auto buffer_for = [&](std::span<segment> segs, uint64_t skip, uint64_t len,
                          bool fill) -> void* {
        if (uint8_t* p = contiguous(segs, skip, len)) {
            return p;
        }
        s.bounce = _bounce.get(len, s.bounce_class);
        if (s.bounce == nullptr) {
            return nullptr;
        }
        bump(k.bounced);
        s.kind |= k_free_bounce;
        if (fill) {
            gather(segs, skip, s.bounce, len);
        }
        return s.bounce;
    };
    auto keep_in_segments = [&]() { s.in.assign(wr.begin(), wr.end()); };

    switch (h.type) {
    case VIRTIO_BLK_T_IN: {
        bump(k.reads);
        void* buf = buffer_for(wr, 0, in_len, false);
        if (buf == nullptr) {
            log("read too large to bounce", in_len);
            finish(s, VIRTIO_BLK_S_IOERR);
            return;
        }
        if (buf == s.bounce) {
            s.kind |= k_copy_out;
            keep_in_segments();
        }
        submit(s, io_op::read, offset, in_len, buf, 0);
        return;
    }
    case VIRTIO_BLK_T_OUT: {
        bump(k.writes);
        if (read_only) {
            finish(s, VIRTIO_BLK_S_IOERR);
            return;
        }
        void* buf = buffer_for(rd, sizeof h, out_len, true);
        if (buf == nullptr) {
            log("write too large to bounce", out_len);
            finish(s, VIRTIO_BLK_S_IOERR);
            return;
        }
        const bool write_back = _cfg.write_back->load(std::memory_order_relaxed);
        submit(s, io_op::write, offset, out_len, buf, write_back ? 0u : uint32_t{k_io_fua});
        return;
    }
    case VIRTIO_BLK_T_FLUSH:
        bump(k.flushes);
        submit(s, io_op::flush, 0, 0, nullptr, 0);
        return;
    case VIRTIO_BLK_T_GET_ID: {
        bump(k.get_id);
        char id[VIRTIO_BLK_ID_BYTES] = {};
        std::memcpy(id, _cfg.settings->serial.data(),
                    std::min<size_t>(_cfg.settings->serial.size(), sizeof id));
        scatter(wr, 0, id, std::min<uint64_t>(in_len, sizeof id));
        finish(s, VIRTIO_BLK_S_OK);
        return;
    }
    case VIRTIO_BLK_T_DISCARD:
    case VIRTIO_BLK_T_WRITE_ZEROES: {
        const bool discard = h.type == VIRTIO_BLK_T_DISCARD;
        bump(discard ? k.discards : k.write_zeroes);
        if (read_only) {
            finish(s, VIRTIO_BLK_S_IOERR);
            return;
        }
        if (out_len == 0 || out_len % virtio::k_blk_range_bytes != 0) {
            bump(k.bad_requests);
            log("discard/write zeroes data is not whole 16-byte ranges", out_len);
            finish(s, VIRTIO_BLK_S_IOERR);
            return;
        }
        virtio_blk_discard_write_zeroes range;
        gather(rd, sizeof h, &range, sizeof range);
        const uint32_t unknown_flags =
            range.flags & ~(discard ? 0u : uint32_t{VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP});
        if (out_len > sizeof range || unknown_flags != 0 || range.sector > UINT64_MAX / 512) {
            // One range (max_*_seg = 1), and discard takes no flags.
            bump(k.unsupported);
            finish(s, VIRTIO_BLK_S_UNSUPP);
            return;
        }
        const uint32_t flags = discard || (range.flags & VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP) != 0
                                   ? 0u
                                   : uint32_t{k_io_no_unmap};
        submit(s, discard ? io_op::discard : io_op::write_zeroes, range.sector * 512,
               uint64_t{range.num_sectors} * 512, nullptr, flags);
        return;
    }
    case VIRTIO_BLK_T_ZONE_APPEND: {
        bump(k.zone_appends);
        s.zone_op = true;
        if (read_only || in_len < sizeof(uint64_t)) {
            finish(s, VIRTIO_BLK_S_IOERR);
            return;
        }
        void* buf = buffer_for(rd, sizeof h, out_len, true);
        if (buf == nullptr) {
            log("zone append too large to bounce", out_len);
            finish(s, VIRTIO_BLK_S_IOERR);
            return;
        }
        s.kind |= k_append;
        keep_in_segments();
        submit(s, io_op::zone_append, offset, out_len, buf, 0);
        return;
    }
    case VIRTIO_BLK_T_ZONE_REPORT: {
        bump(k.report_zones);
        s.zone_op = true;
        if (in_len < sizeof(virtio::virtio_blk_zone_report)) {
            finish(s, VIRTIO_BLK_S_IOERR);
            return;
        }
        const uint64_t fit = std::min<uint64_t>((in_len - sizeof(virtio::virtio_blk_zone_report)) /
                                                    sizeof(virtio::virtio_blk_zone_descriptor),
                                                k_max_report_zones);
        if (fit == 0) {
            const virtio::virtio_blk_zone_report none{};
            scatter(wr, 0, &none, sizeof none);
            finish(s, VIRTIO_BLK_S_OK);
            return;
        }
        s.bounce = _bounce.get(fit * sizeof(zone_descriptor), s.bounce_class);
        if (s.bounce == nullptr) {
            finish(s, VIRTIO_BLK_S_IOERR);
            return;
        }
        s.kind |= k_free_bounce | k_report;
        keep_in_segments();
        s.b.report_capacity = static_cast<uint32_t>(fit);
        submit(s, io_op::report_zones, offset, 0, s.bounce, 0);
        return;
    }
    case VIRTIO_BLK_T_ZONE_OPEN:
    case VIRTIO_BLK_T_ZONE_CLOSE:
    case VIRTIO_BLK_T_ZONE_FINISH:
    case VIRTIO_BLK_T_ZONE_RESET:
    case VIRTIO_BLK_T_ZONE_RESET_ALL: {
        bump(k.zone_management);
        s.zone_op = true;
        if (read_only) {
            finish(s, VIRTIO_BLK_S_IOERR);
            return;
        }
        io_op op = io_op::zone_reset_all;
        switch (h.type) {
        case VIRTIO_BLK_T_ZONE_OPEN:
            op = io_op::zone_open;
            break;
        case VIRTIO_BLK_T_ZONE_CLOSE:
            op = io_op::zone_close;
            break;
        case VIRTIO_BLK_T_ZONE_FINISH:
            op = io_op::zone_finish;
            break;
        case VIRTIO_BLK_T_ZONE_RESET:
            op = io_op::zone_reset;
            break;
        default:
            break;
        }
        submit(s, op, op == io_op::zone_reset_all ? 0 : offset, 0, nullptr, 0);
        return;
    }
    default:
        bump(k.unsupported);
        finish(s, VIRTIO_BLK_S_UNSUPP);
        return;
    }
}

bool queue_worker::publish()
{
    if (_ring.unpublished() == 0) {
        return false;
    }
    const bool notify = _ring.publish_used();
    if (_inflight.attached()) {
        _inflight.published(_ring.used_idx());
    }
    if (notify && _cfg.call_fd >= 0) {
        signal(_cfg.call_fd);
        bump(_cfg.counters->notifications);
    }
    return true;
}

void queue_worker::sleep()
{
    const int cmd = _command.load(std::memory_order_acquire);
    const bool want_kicks = cmd == k_none && !_broken && _enabled.load(std::memory_order_acquire);
    if (want_kicks && _ring.enable_kicks()) {
        _ring.disable_kicks();
        return;  // chains arrived while we looked away
    }
    pollfd fds[3];
    nfds_t n = 0;
    int kick = -1;
    if (want_kicks && _cfg.kick_fd >= 0) {
        kick = static_cast<int>(n);
        fds[n++] = pollfd{_cfg.kick_fd, POLLIN, 0};
    }
    const int wake = static_cast<int>(n);
    fds[n++] = pollfd{_wake_fd, POLLIN, 0};
    const bool busy = _queue.in_flight() > 0;
    if (busy && _queue.event_fd() >= 0) {
        fds[n++] = pollfd{_queue.event_fd(), POLLIN, 0};
    }
    uint64_t deadline = busy ? _queue.next_event_ns() : UINT64_MAX;
    const uint64_t now = monotonic_ns();
    if (want_kicks && _cfg.kick_fd < 0) {
        deadline = std::min(deadline, now + k_kickless_poll_ns);
    }
    if (deadline != UINT64_MAX && deadline <= now + k_spin_ns) {
        while (monotonic_ns() < deadline) {
            cpu_relax();
        }
    } else {
        timespec ts{};
        const timespec* timeout = nullptr;
        if (deadline != UINT64_MAX) {
            const uint64_t d = deadline - now;
            ts.tv_sec = static_cast<time_t>(d / 1'000'000'000u);
            ts.tv_nsec = static_cast<long>(d % 1'000'000'000u);
            timeout = &ts;
        }
        if (::ppoll(fds, n, timeout, nullptr) > 0) {
            if (kick >= 0 && (fds[kick].revents & POLLIN) != 0) {
                drain_eventfd(_cfg.kick_fd);
            }
            if ((fds[wake].revents & POLLIN) != 0) {
                drain_eventfd(_wake_fd);
            }
        }
        bump(_cfg.counters->wakeups);
    }
    _ring.disable_kicks();
}

}  // namespace softblk::vhost_user_blk
