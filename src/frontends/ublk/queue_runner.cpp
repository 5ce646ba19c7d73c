#include "queue_runner.hpp"

#include <softblk/support/clock.hpp>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fmt/core.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>
#include <utility>

#include <softblk/support/cpu_relax.hpp>

namespace softblk::ublk {

namespace {

// Entries for `requests` requests at once (a command each, plus the wake
// read and the event poll), at least 8, a power of two.
unsigned ring_entries(unsigned requests)
{
    return std::bit_ceil(std::max(8u, requests + 2));
}

}  // namespace

queue_runner::queue_runner(io_queue& dq, const queue_config& cfg) : _dq(dq), _cfg(cfg)
{
    const uint64_t max_us = std::max<uint64_t>(1, _cfg.idle_spin_max_ns / 1'000);
    level_chooser::config spin =
        poll_window_config(_cfg.idle_spin == idle_spin_mode::never    ? "0"
                           : _cfg.idle_spin == idle_spin_mode::always ? std::to_string(max_us)
                                                                      : "auto");
    // Measured: the windows up to idle_spin_max.
    std::erase_if(spin.levels, [max_us](uint64_t us) { return us > max_us; });
    _spin.emplace(std::move(spin));
}

queue_runner::~queue_runner()
{
    if (_thread.joinable()) {
        request_exit();
        _thread.join();
    }
}

result<void> queue_runner::start()
{
    std::promise<result<void>> ready;
    auto ready_future = ready.get_future();
    _thread = std::thread([this, &ready] { run(ready); });
    auto r = ready_future.get();
    if (!r) {
        _thread.join();
    }
    return r;
}

void queue_runner::request_exit()
{
    _exit_requested.store(true, std::memory_order_release);
    if (_wake_fd >= 0) {
        const uint64_t one = 1;
        [[maybe_unused]] ssize_t n = ::write(_wake_fd, &one, sizeof(one));
    }
}

bool queue_runner::wait_exit(int timeout_ms)
{
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (!_exited.load(std::memory_order_acquire)) {
        if (timeout_ms >= 0 && std::chrono::steady_clock::now() >= until) {
            return false;
        }
        ::usleep(2000);
    }
    return true;
}

void queue_runner::join()
{
    if (_thread.joinable()) {
        _thread.join();
    }
}

queue_counters queue_runner::counters() const
{
    return queue_counters{.requests = _requests.load(std::memory_order_relaxed),
                          .errors = _errors.load(std::memory_order_relaxed),
                          .aborted_tags = _aborted_count.load(std::memory_order_relaxed),
                          .linked_commits = _linked_commits.load(std::memory_order_relaxed),
                          .buffer_registers = _buffer_registers.load(std::memory_order_relaxed),
                          .zero_copy_from = _zero_copy_from.load(std::memory_order_relaxed),
                          .idle_spinning = _idle_spinning.load(std::memory_order_relaxed),
                          .idle_spin_us = _spin->level(),
                          .idle_waits = _idle_waits.load(std::memory_order_relaxed),
                          .idle_spins = _idle_spins.load(std::memory_order_relaxed),
                          .pin_switches = _pin_switches.load(std::memory_order_relaxed)};
}

result<void> queue_runner::setup()
{
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    const unsigned depth = _cfg.depth;

    _descs_len = cmd_buf_length(depth, page);
    void* descs = ::mmap(nullptr, _descs_len, PROT_READ, MAP_SHARED | MAP_POPULATE, _cfg.char_fd,
                         static_cast<off_t>(cmd_buf_offset(_cfg.q_id, page)));
    if (descs == MAP_FAILED) {
        const int e = errno;
        return make_error(e, fmt::format("ublk queue {}: mmap of the request descriptors: {}",
                                         _cfg.q_id, std::strerror(e)));
    }
    _descs = static_cast<const io_desc*>(descs);

    // Per-tag buffers; pages are committed only as requests touch them.
    _buffers_len = size_t{depth} * _cfg.buf_bytes;
    void* bufs = ::mmap(nullptr, _buffers_len, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (bufs == MAP_FAILED) {
        const int e = errno;
        return make_error(e, fmt::format("ublk queue {}: {} bytes of I/O buffers: {}", _cfg.q_id,
                                         _buffers_len, std::strerror(e)));
    }
    _buffers = static_cast<char*>(bufs);
    _slots = std::make_unique<tag_slot[]>(depth);
    _backlog = std::make_unique<uint16_t[]>(depth);
    for (unsigned t = 0; t < depth; ++t) {
        _slots[t].runner = this;
        _slots[t].tag = static_cast<uint16_t>(t);
        _slots[t].buffer = _buffers + size_t{t} * _cfg.buf_bytes;
        _slots[t].data_in_kernel =
            external_data{.where = external_data::place::kernel,
                          .kernel = kernel_buffer{.prep_register = &prep_register_buffer,
                                                  .prep_unregister = &prep_unregister_buffer,
                                                  .prep_completion = nullptr,
                                                  .owner = this,
                                                  .fd = _cfg.char_fd,
                                                  .queue = static_cast<uint16_t>(_cfg.q_id),
                                                  .tag = static_cast<uint16_t>(t),
                                                  .index = static_cast<uint16_t>(t),
                                                  .slots = static_cast<uint16_t>(depth),
                                                  .in_table = _cfg.auto_buf_reg}};
        _slots[t].data_in_window = external_data{
            .where = external_data::place::window,
            .window = data_window{.fd = _cfg.char_fd,
                                  .offset = user_copy_offset(_cfg.q_id, static_cast<uint16_t>(t))}};
    }

    _wake_fd = ::eventfd(0, EFD_CLOEXEC);
    if (_wake_fd < 0) {
        const int e = errno;
        return make_error(e,
                          fmt::format("ublk queue {}: eventfd: {}", _cfg.q_id, std::strerror(e)));
    }

    // The ring belongs to this thread: SINGLE_ISSUER + DEFER_TASKRUN run the
    // kernel's task work (request dispatch) only when we ask for events;
    // TASKRUN_FLAG shows such work waiting to a thread that spins (idle()).
    // Older kernels refuse those flags: fall back step by step.
    const unsigned attempts[] = {
        IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_TASKRUN_FLAG,
        IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG,
        IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG,
        0,
    };
    int r = -EINVAL;
    for (unsigned flags : attempts) {
        io_uring_params p{};
        p.flags = flags;
        // Shared with the file ring: a write can add three entries
        // (register its pages, write, unregister) to its commit.
        r = io_uring_queue_init_params(ring_entries(_cfg.shared_ring ? 4 * depth : depth), &_ring,
                                       &p);
        if (r != -EINVAL) {
            break;
        }
    }
    if (r < 0) {
        return make_error(
            -r, fmt::format("ublk queue {}: io_uring setup: {}", _cfg.q_id, std::strerror(-r)));
    }
    _ring_ok = true;
    // The device queue's file I/O may run in this ring (its files take
    // the fixed-file table); otherwise, best effort, our descriptor does:
    // a registered file saves a lookup per command.
    _shared = _cfg.shared_ring ? _dq.ring_sharing() : nullptr;
    _ring_shared = _shared != nullptr && _shared->share_ring(&_ring);
    _fixed_file = !_ring_shared && io_uring_register_files(&_ring, &_cfg.char_fd, 1) == 0;
    if (_cfg.auto_buf_reg) {
        // The kernel puts each request's pages at the index its tag's last
        // FETCH or COMMIT named (the tag's own), whether a write then goes
        // zero copy or not: the table's slots are the tags', and the file
        // I/O uses none for anything else (kernel_buffer::in_table). The
        // ring's teardown drops whatever is still in it.
        if (const int rc = io_uring_register_buffers_sparse(&_ring, depth); rc < 0) {
            return make_error(-rc, fmt::format("ublk queue {}: fixed-buffer table: {}", _cfg.q_id,
                                               std::strerror(-rc)));
        }
        // Only the file I/O in this ring can write from that table.
        _cfg.zero_copy = _cfg.zero_copy && _ring_shared;
    }
    if (_cfg.batch) {
        return setup_batch();
    }

    for (unsigned t = 0; t < depth; ++t) {
        prep_fetch(_slots[t]);
    }
    prep_wake_poll();
    r = io_uring_submit(&_ring);
    if (r < 0) {
        return make_error(-r, fmt::format("ublk queue {}: submitting FETCH_REQ: {}", _cfg.q_id,
                                          std::strerror(-r)));
    }
    // A FETCH_REQ the kernel refuses completes at once; START_DEV would wait
    // forever for a queue that is not ready, so look before saying ready.
    io_uring_get_events(&_ring);
    io_uring_cqe* cqe = nullptr;
    while (io_uring_peek_cqe(&_ring, &cqe) == 0) {
        const int res = cqe->res;
        const uint64_t data = cqe->user_data;
        if (data != k_wake_data && res < 0) {
            io_uring_cqe_seen(&_ring, cqe);
            return make_error(-res, fmt::format("ublk queue {}: FETCH_REQ for tag {}: {}",
                                                _cfg.q_id, data & 0xffff, std::strerror(-res)));
        }
        // A request already (the device is being recovered and I/O was
        // queued): handle it in the loop.
        io_uring_cqe cqe_copy = *cqe;
        io_uring_cqe_seen(&_ring, cqe);
        handle_cqe(cqe_copy);
    }
    return {};
}

void queue_runner::teardown()
{
    if (_ring_shared) {
        // Nothing is in flight by now (the loop ends only then, setup()
        // has submitted none): the queue gives the ring back.
        _ring_shared = !_shared->share_ring(nullptr);
    }
    if (_ring_ok) {
        io_uring_queue_exit(&_ring);
        _ring_ok = false;
    }
    teardown_batch();
    if (_descs != nullptr) {
        ::munmap(const_cast<io_desc*>(_descs), _descs_len);
        _descs = nullptr;
    }
    if (_buffers != nullptr) {
        ::munmap(_buffers, _buffers_len);
        _buffers = nullptr;
    }
    if (_wake_fd >= 0) {
        ::close(_wake_fd);
        _wake_fd = -1;
    }
}

io_uring_sqe* queue_runner::next_sqe()
{
    io_uring_sqe* sqe = io_uring_get_sqe(&_ring);
    if (sqe == nullptr) {
        // Rare: the ring has room for a command per tag and, shared, for
        // the file I/O of every tag; never drop a command.
        io_uring_submit(&_ring);
        sqe = io_uring_get_sqe(&_ring);
    }
    return sqe;
}

void queue_runner::set_target(io_uring_sqe* sqe) const
{
    if (_fixed_file) {
        sqe->fd = 0;
        sqe->flags = IOSQE_FIXED_FILE;
    } else {
        sqe->fd = _cfg.char_fd;
    }
}

void queue_runner::prep_fetch(tag_slot& slot)
{
    io_uring_sqe* sqe = next_sqe();
    std::memset(sqe, 0, sizeof(*sqe));
    sqe->opcode = IORING_OP_URING_CMD;
    set_target(sqe);
    sqe->cmd_op = io_op_code(k_io_fetch_req, _cfg.ioctl_encode);
    io_cmd cmd{.q_id = static_cast<uint16_t>(_cfg.q_id),
               .tag = slot.tag,
               .result = -1,
               .addr = _cfg.user_copy ? 0 : reinterpret_cast<uint64_t>(slot.buffer)};
    std::memcpy(sqe->cmd, &cmd, sizeof(cmd));
    set_auto_buf_reg(*sqe, slot);
    io_uring_sqe_set_data64(sqe, k_own_data | slot.tag);
}

void queue_runner::prep_commit(tag_slot& slot, int result, uint64_t addr)
{
    if (_cfg.batch) {
        add_batch_commit(slot.tag, result, addr);
        return;
    }
    io_uring_sqe* sqe = next_sqe();
    std::memset(sqe, 0, sizeof(*sqe));
    sqe->opcode = IORING_OP_URING_CMD;
    set_target(sqe);
    sqe->cmd_op = io_op_code(k_io_commit_and_fetch_req, _cfg.ioctl_encode);
    io_cmd cmd{
        .q_id = static_cast<uint16_t>(_cfg.q_id), .tag = slot.tag, .result = result, .addr = addr};
    std::memcpy(sqe->cmd, &cmd, sizeof(cmd));
    // The kernel takes the request's pages out of the table as it commits
    // (this ring registered them), and puts the next one's at this index.
    set_auto_buf_reg(*sqe, slot);
    io_uring_sqe_set_data64(sqe, k_own_data | slot.tag);
}

void queue_runner::prep_wake_poll()
{
    io_uring_sqe* sqe = next_sqe();
    io_uring_prep_read(sqe, _wake_fd, &_wake_buf, sizeof(_wake_buf), 0);
    io_uring_sqe_set_data64(sqe, k_wake_data);
}

void queue_runner::on_complete(io_request& request, int result)
{
    tag_slot& slot = *static_cast<tag_slot*>(request.user_data);
    queue_runner& self = *slot.runner;
    int res = result;
    if (slot.timed) {
        slot.timed = false;
        self._chooser.record(slot.length, slot.in_kernel, monotonic_ns() - slot.start_ns);
        if ((++self._timed_writes & 63) == 0) {
            self._zero_copy_from.store(self._chooser.zero_copy_from(), std::memory_order_relaxed);
        }
    }
    if (std::exchange(slot.linked, false) && res == static_cast<int>(slot.length)) {
        // The write ended the request in full, so the commit linked after
        // it ran: the kernel has completed the request, and may have sent
        // the tag's next one already.
        self._linked_commits.fetch_add(1, std::memory_order_relaxed);
        if (std::exchange(slot.refetched, false)) {
            self._backlog[(self._backlog_head + self._backlog_count) % self._cfg.depth] = slot.tag;
            ++self._backlog_count;
        }
        return;
    }
    uint64_t addr = self._cfg.user_copy ? 0 : reinterpret_cast<uint64_t>(slot.buffer);
    if (res >= 0) {
        switch (slot.kernel_op) {
        case k_op_read:
            if (self._cfg.user_copy && !slot.windowed) {
                res = self.copy_to_kernel(slot, static_cast<size_t>(res), res);
            }
            break;
        case k_op_write:
            break;
        case k_op_zone_append:
            // With USER_COPY the commit's addr carries the sector the data
            // landed on (zone_append_lba).
            addr = request.result_offset >> 9;
            break;
        case k_op_report_zones: {
            // blk_zone entries into the kernel's buffer, which it zeroed: a
            // zero-length entry ends a short report. The result must cover
            // the whole request, or the block layer requeues the rest; the
            // kernel cuts it to the request's size.
            const auto filled = static_cast<uint32_t>(res);
            zones_to_blk_zones(slot.buffer, filled);
            res = self.copy_to_kernel(slot, size_t{filled} * sizeof(::blk_zone),
                                      static_cast<int>(self._cfg.buf_bytes));
            break;
        }
        default:
            res = 0;  // flush, discard, write zeroes, zone management move no data
            break;
        }
    }
    if (res < 0) {
        self._errors.fetch_add(1, std::memory_order_relaxed);
    }
    self.prep_commit(slot, res, addr);
}

int queue_runner::copy_to_kernel(const tag_slot& slot, size_t bytes, int result) const
{
    if (bytes == 0) {
        return result;
    }
    const ssize_t n = ::pwrite(_cfg.char_fd, slot.buffer, bytes,
                               static_cast<off_t>(user_copy_offset(_cfg.q_id, slot.tag)));
    if (n != static_cast<ssize_t>(bytes)) {
        return n < 0 ? -errno : -EIO;
    }
    return result;
}

bool queue_runner::dispatch(tag_slot& slot)
{
    const io_desc& d = _descs[slot.tag];
    const uint32_t op_flags = __atomic_load_n(&d.op_flags, __ATOMIC_ACQUIRE);
    const uint8_t op = static_cast<uint8_t>(op_flags & 0xff);
    const uint64_t offset = d.start_sector << 9;
    const uint32_t length = d.nr_sectors << 9;

    io_op dop;
    switch (op) {
    case k_op_read:
        dop = io_op::read;
        break;
    case k_op_write:
        dop = io_op::write;
        break;
    case k_op_flush:
        dop = io_op::flush;
        break;
    case k_op_discard:
        dop = io_op::discard;
        break;
    case k_op_write_zeroes:
        dop = io_op::write_zeroes;
        break;
    // Zone operations arrive only on a zoned device (UBLK_F_ZONED).
    case k_op_zone_open:
        dop = io_op::zone_open;
        break;
    case k_op_zone_close:
        dop = io_op::zone_close;
        break;
    case k_op_zone_finish:
        dop = io_op::zone_finish;
        break;
    case k_op_zone_reset:
        dop = io_op::zone_reset;
        break;
    case k_op_zone_reset_all:
        dop = io_op::zone_reset_all;
        break;
    case k_op_zone_append:
        dop = io_op::zone_append;
        break;
    case k_op_report_zones:
        dop = io_op::report_zones;
        break;
    default:
        // WRITE_SAME (never sent by 6.x kernels).
        _errors.fetch_add(1, std::memory_order_relaxed);
        prep_commit(slot, -EOPNOTSUPP,
                    _cfg.user_copy ? 0 : reinterpret_cast<uint64_t>(slot.buffer));
        return true;
    }
    // Data comes from the kernel for writes and zone appends.
    const bool data_in = dop == io_op::write || dop == io_op::zone_append;
    const bool moves_data = dop == io_op::read || data_in;
    if (moves_data && length > _cfg.buf_bytes) {
        _errors.fetch_add(1, std::memory_order_relaxed);
        prep_commit(slot, -EIO, _cfg.user_copy ? 0 : reinterpret_cast<uint64_t>(slot.buffer));
        return true;
    }

    io_request* r = _dq.get_request();
    if (r == nullptr) {
        return false;
    }
    bool in_kernel = false;
    slot.timed = false;
    if (data_in && _cfg.zero_copy) {
        if (_cfg.zero_copy_min_bytes >= 0) {
            in_kernel = length >= _cfg.zero_copy_min_bytes;
        } else {
            in_kernel = _chooser.zero_copy(length, _dq.in_flight() == 0, slot.timed);
            if (slot.timed) {
                slot.in_kernel = in_kernel;
                slot.start_ns = monotonic_ns();
            }
        }
    }
    // With USER_COPY a target that takes a data_window copies the data
    // between the request and where it keeps it itself; for others it goes
    // through the tag's buffer, copied in here (writes) or out in
    // on_complete (reads).
    slot.windowed = moves_data && _cfg.user_copy && !in_kernel && _cfg.target_takes_window;
    if (data_in && _cfg.user_copy && !in_kernel && !slot.windowed) {
        const ssize_t n = ::pread(_cfg.char_fd, slot.buffer, length,
                                  static_cast<off_t>(user_copy_offset(_cfg.q_id, slot.tag)));
        if (n != static_cast<ssize_t>(length)) {
            _dq.put_request(*r);
            _errors.fetch_add(1, std::memory_order_relaxed);
            prep_commit(slot, n < 0 ? -errno : -EIO, 0);
            return true;
        }
    }
    r->op = dop;
    r->flags = 0;
    if ((op_flags & k_io_f_fua) != 0) {
        r->flags |= k_io_fua;
    }
    if ((op_flags & k_io_f_nounmap) != 0) {
        r->flags |= k_io_no_unmap;
    }
    r->offset = dop == io_op::flush || dop == io_op::zone_reset_all ? 0 : offset;
    r->length = moves_data || dop == io_op::discard || dop == io_op::write_zeroes ? length : 0;
    r->buffer = moves_data && !in_kernel && !slot.windowed ? slot.buffer : nullptr;
    r->external = in_kernel ? &slot.data_in_kernel : slot.windowed ? &slot.data_in_window : nullptr;
    // Only a plain write's result is known before it is done (a zone
    // append's sector is the target's to say).
    slot.data_in_kernel.kernel.prep_completion =
        _links && in_kernel && op == k_op_write ? &prep_linked_commit : nullptr;
    if (dop == io_op::report_zones) {
        // The descriptor's nr_sectors is nr_zones here; the slot's buffer
        // holds them, as 64-byte blk_zone entries once converted.
        r->buffer = slot.buffer;
        r->report_capacity = std::min<uint32_t>(d.nr_sectors, _cfg.buf_bytes / sizeof(::blk_zone));
    }
    r->on_complete = &queue_runner::on_complete;
    r->user_data = &slot;
    slot.kernel_op = op;
    slot.length = length;
    _requests.fetch_add(1, std::memory_order_relaxed);
    if (_measuring_pin) {
        _cfg.pinning->served(length);
    }
    _dq.submit(*r);
    return true;
}

void queue_runner::start_request(tag_slot& slot)
{
    if (slot.linked) {
        // Batched: the commit linked after the tag's last write completed
        // that request, and the kernel handed the tag out again, before its
        // write's completion reached us (its own order of CQEs). The new
        // request waits for on_complete of the old.
        slot.refetched = true;
        return;
    }
    if (_backlog_count != 0 || !dispatch(slot)) {
        // Keep arrival order: behind whatever already waits for a request.
        _backlog[(_backlog_head + _backlog_count) % _cfg.depth] = slot.tag;
        ++_backlog_count;
    }
}

void queue_runner::retry_backlog()
{
    while (_backlog_count != 0) {
        tag_slot& slot = _slots[_backlog[_backlog_head]];
        if (!dispatch(slot)) {
            return;
        }
        _backlog_head = (_backlog_head + 1) % _cfg.depth;
        --_backlog_count;
    }
}

// While device requests are in flight the thread sleeps in the ring until
// the device queue's next event (next_event_ns(): a completion timer, a
// throttle, the timeout scan) or its event_fd(); shorter waits are spun,
// as the core's wait() does.
int queue_runner::wait_with_device()
{
    if (!_event_poll_armed && _dq.event_fd() >= 0) {
        io_uring_sqe* sqe = next_sqe();
        io_uring_prep_poll_multishot(sqe, _dq.event_fd(), POLLIN);
        io_uring_sqe_set_data64(sqe, k_event_data);
        _event_poll_armed = true;
    }
    const uint64_t wake = _dq.next_event_ns();
    const uint64_t now = monotonic_ns();
    if (wake <= now || io_uring_cq_ready(&_ring) != 0) {
        return io_uring_submit(&_ring);
    }
    if (wake - now < k_spin_wait_ns) {
        // Shorter than a sleep's wake-up latency: spin, watching the ring.
        const int r = io_uring_submit(&_ring);
        while (monotonic_ns() < wake && io_uring_cq_ready(&_ring) == 0) {
            cpu_relax();
        }
        return r;
    }
    if (wake == UINT64_MAX) {
        return io_uring_submit_and_wait(&_ring, 1);
    }
    const uint64_t delta = wake - now;
    __kernel_timespec ts{.tv_sec = static_cast<int64_t>(delta / 1'000'000'000u),
                         .tv_nsec = static_cast<long long>(delta % 1'000'000'000u)};
    io_uring_cqe* cqe = nullptr;
    const int r = io_uring_submit_and_wait_timeout(&_ring, &cqe, 1, &ts, nullptr);
    return r == -ETIME ? 0 : r;
}

bool queue_runner::idle() const
{
    if (io_uring_cq_ready(&_ring) != 0 ||
        (IO_URING_READ_ONCE(*_ring.sq.kflags) & IORING_SQ_TASKRUN) != 0) {
        return false;
    }
    return _dq.in_flight() == 0 || _dq.next_event_ns() > monotonic_ns();
}

bool queue_runner::spin_until(uint64_t until)
{
    // What is prepared (commits, fetches) goes out first: the kernel
    // answers with the next request.
    io_uring_submit(&_ring);
    while (idle()) {
        if (monotonic_ns() >= until) {
            return false;
        }
        cpu_relax();
    }
    return true;
}

int queue_runner::wait_idle()
{
    const auto wait = [this] {
        return _dq.in_flight() == 0 ? io_uring_submit_and_wait(&_ring, 1) : wait_with_device();
    };
    // Only for the next request: our own file I/O completes in an io-wq
    // worker or the kernel's task work, which may need this very CPU.
    if (_dq.in_flight() != 0 || !idle()) {
        return wait();
    }
    _idle_waits.fetch_add(1, std::memory_order_relaxed);
    // What the queue served since its last wait counts towards the window.
    const uint64_t served = _requests.load(std::memory_order_relaxed) - _requests_counted;
    _requests_counted += served;
    const uint64_t window_ns = _spin->level() * 1'000;
    if (window_ns == 0 && !_measuring_pin) {
        _spin->served(monotonic_ns(), served);
        _idle_spinning.store(false, std::memory_order_relaxed);
        return wait();
    }
    const bool spin = window_ns != 0;
    const uint64_t from = monotonic_ns();
    const uint64_t device_requests = _measuring_pin ? _cfg.pinning->requests() : 0;
    if (spin) {
        _idle_spins.fetch_add(1, std::memory_order_relaxed);
    }
    // The wait ends at work: a CQE, task work (the ring's own wait runs
    // it), a device event.
    const int r =
        spin && spin_until(from + window_ns) ? io_uring_submit_and_get_events(&_ring) : wait();
    const uint64_t waited = monotonic_ns() - from;
    if (_measuring_pin) {
        _cfg.pinning->waited(waited, device_requests);
    }
    _spin->served(from + waited, served, spin ? std::min(waited, window_ns) : 0);
    _idle_spinning.store(spin, std::memory_order_relaxed);
    return r;
}

void queue_runner::handle_cqe(const io_uring_cqe& cqe)
{
    if ((cqe.user_data & k_own_data) == 0) {
        // The device queue's file I/O, in the shared ring.
        _shared->ring_completion(cqe.user_data, cqe.res);
        return;
    }
    if (cqe.user_data == k_event_data) {
        // The device queue has completions; the loop's process() takes them.
        _event_poll_armed = (cqe.flags & IORING_CQE_F_MORE) != 0;
        return;
    }
    if (cqe.user_data == k_wake_data) {
        if (!_exit_requested.load(std::memory_order_acquire)) {
            prep_wake_poll();
        }
        return;
    }
    if (_cfg.batch) {
        handle_batch_cqe(cqe);
        return;
    }
    tag_slot& slot = _slots[static_cast<uint16_t>(cqe.user_data)];
    if (cqe.res == k_io_res_ok) {
        start_request(slot);
        return;
    }
    // -ENODEV (UBLK_IO_RES_ABORT): the device is stopping; any other error
    // means the kernel refused our command and will not hand this tag out
    // again either.
    if (cqe.res != -ENODEV) {
        _errors.fetch_add(1, std::memory_order_relaxed);
    }
    if (!slot.aborted) {
        slot.aborted = true;
        ++_aborted;
        _aborted_count.fetch_add(1, std::memory_order_relaxed);
    }
}

void queue_runner::run(std::promise<result<void>>& ready)
{
    pin_thread();
    if (auto r = setup(); !r) {
        teardown();
        _exited.store(true, std::memory_order_release);
        ready.set_value(std::unexpected(r.error()));
        return;
    }
    pin_io_workers();
    ready.set_value({});
    // This thread drives the device queue: control submissions (the
    // daemon's `softblk zone`) come through its inbox, and the wake read
    // armed in setup() wakes the loop for them; in_flight() counts them.
    _dq.attach_owner([this] {
        const uint64_t one = 1;
        [[maybe_unused]] ssize_t n = ::write(_wake_fd, &one, sizeof(one));
    });

    for (;;) {
        if (_measuring_pin && !_pin_stuck) {
            follow_device_pinning();
        }
        if (_dq.in_flight() > 0) {
            _dq.process();
        }
        if (_backlog_count != 0) {
            retry_backlog();
        }
        // Leaving: the queue's owner goes only once no control submission
        // waits for it (detach_owner refuses while one does).
        if (_dq.in_flight() == 0 && _backlog_count == 0 &&
            (_aborted == _cfg.depth || _exit_requested.load(std::memory_order_acquire)) &&
            _dq.detach_owner()) {
            break;
        }
        if (_cfg.batch) {
            flush_batch_commits();
        }
        const int r = wait_idle();
        if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY && r != -ETIME) {
            // The ring itself failed: nothing more can be fetched.
            _errors.fetch_add(1, std::memory_order_relaxed);
            _exit_requested.store(true, std::memory_order_release);
        }
        io_uring_cqe* cqe = nullptr;
        unsigned seen = 0;
        unsigned head;
        io_uring_for_each_cqe(&_ring, head, cqe)
        {
            handle_cqe(*cqe);
            ++seen;
        }
        io_uring_cq_advance(&_ring, seen);
    }
    // Commits prepared by the last callbacks go out before the ring closes.
    if (_cfg.batch) {
        flush_batch_commits();
    }
    io_uring_submit(&_ring);
    teardown();
    _exited.store(true, std::memory_order_release);
}

}  // namespace softblk::ublk
