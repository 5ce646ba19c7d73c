// The ring threads of FUSE over io_uring: registering ring entries,
// serving the requests the kernel puts in them, committing the replies
// (fuse_ring.hpp has the design, fuse_ring_abi.hpp the protocol).
#include "fuse_ring.hpp"

#include <softblk/support/clock.hpp>
#include <softblk/support/cpu_relax.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fmt/core.h>
#include <linux/fuse.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

namespace softblk::fuse {

namespace {

// With device I/O in flight the thread sleeps in the ring until the device
// queue's next event; waits shorter than this are spun, as the core's
// wait() and the ublk queue threads do.
constexpr uint64_t k_spin_ns = 20'000;

// Submission entries for `commands` commands at once, plus the wake read,
// the device event poll and the /dev/fuse poll.
unsigned ring_size(size_t commands)
{
    unsigned n = 8;
    while (n < commands + 3) {
        n <<= 1;
    }
    return n;
}

template <class T>
const T& arg(const ring_abi::request_header& h)
{
    static_assert(sizeof(T) <= ring_abi::k_op_in_bytes);
    return *reinterpret_cast<const T*>(h.op_in);
}

}  // namespace

ring_thread::ring_thread(fuse_export& owner, worker& w, ring_thread_config cfg)
    : _owner(owner), _w(w), _cfg(std::move(cfg))
{
}

ring_thread::~ring_thread()
{
    if (_thread.joinable()) {
        request_exit();
        _thread.join();
    }
    // Only now: request_exit() may write it from another thread until the
    // thread is joined.
    if (_wake_fd >= 0) {
        ::close(_wake_fd);
    }
}

result<void> ring_thread::start()
{
    // Made here, before the thread: request_exit() may use it from any
    // thread from now on.
    _wake_fd = ::eventfd(0, EFD_CLOEXEC);
    if (_wake_fd < 0) {
        const int e = errno;
        return make_error(
            e, fmt::format("ring queue {}: eventfd: {}", _cfg.qids.front(), std::strerror(e)));
    }
    std::promise<result<void>> ready;
    auto ready_future = ready.get_future();
    _thread = std::thread([this, &ready] { run(ready); });
    auto r = ready_future.get();
    if (!r) {
        _thread.join();
    }
    return r;
}

void ring_thread::request_exit()
{
    _exit_requested.store(true, std::memory_order_release);
    if (_wake_fd >= 0) {
        const uint64_t one = 1;
        [[maybe_unused]] ssize_t n = ::write(_wake_fd, &one, sizeof(one));
    }
}

void ring_thread::join()
{
    if (_thread.joinable()) {
        _thread.join();
    }
}

result<void> ring_thread::setup()
{
    const auto fail = [this](int e, std::string_view what) {
        return make_error(
            e, fmt::format("ring queue {}: {}: {}", _cfg.qids.front(), what, std::strerror(e)));
    };
    _entry_count = _cfg.qids.size() * size_t{_cfg.entries};
    _entries = std::make_unique<entry[]>(_entry_count);
    _headers = std::make_unique<ring_abi::request_header[]>(_entry_count);
    // Payload pages are committed only as requests touch them (a 4 KiB
    // read uses one page of its entry's megabyte).
    _payloads_len = _entry_count * _cfg.payload_bytes;
    void* mem = ::mmap(nullptr, _payloads_len, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mem == MAP_FAILED) {
        return fail(errno, fmt::format("{} bytes of ring payload buffers", _payloads_len));
    }
    _payloads = static_cast<char*>(mem);
    for (size_t i = 0; i < _entry_count; ++i) {
        entry& e = _entries[i];
        e.header = &_headers[i];
        e.payload = _payloads + i * _cfg.payload_bytes;
        e.qid = _cfg.qids[i / _cfg.entries];
        e.iov[0] = {e.header, sizeof(ring_abi::request_header)};
        e.iov[1] = {e.payload, _cfg.payload_bytes};
    }
    // The ring belongs to this thread: SINGLE_ISSUER + DEFER_TASKRUN run
    // the kernel's task work (a request handed to an entry) only when we
    // wait, and TASKRUN_FLAG shows it waiting to a thread that spins.
    // URING_CMD needs 128-byte entries. Older kernels refuse some flags:
    // fall back step by step.
    const unsigned attempts[] = {
        IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_TASKRUN_FLAG,
        IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG,
        IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG,
        0,
    };
    int r = -EINVAL;
    for (const unsigned flags : attempts) {
        io_uring_params p{};
        p.flags = flags | IORING_SETUP_SQE128;
        r = io_uring_queue_init_params(ring_size(_entry_count), &_ring, &p);
        if (r != -EINVAL) {
            break;
        }
    }
    if (r < 0) {
        return fail(-r, "io_uring setup with 128-byte entries");
    }
    _ring_ok = true;
    // A registered file saves a lookup per command (best effort).
    _fixed_file = io_uring_register_files(&_ring, &_cfg.fuse_fd, 1) == 0;

    for (size_t i = 0; i < _entry_count; ++i) {
        prep_command(_entries[i], ring_abi::k_cmd_register);
    }
    prep_wake_read();
    if (_cfg.serves_dev_fuse) {
        arm_dev_fuse_poll();
    }
    r = io_uring_submit_and_get_events(&_ring);
    if (r < 0) {
        return fail(-r, "submitting FUSE_IO_URING_CMD_REGISTER");
    }
    // The kernel refuses a REGISTER at once; look before saying ready.
    // Anything else that came already (a request, once the last queue of
    // the connection has entries) is handled as the loop would.
    io_uring_cqe* cqe = nullptr;
    while (io_uring_peek_cqe(&_ring, &cqe) == 0) {
        const io_uring_cqe copy = *cqe;
        io_uring_cqe_seen(&_ring, cqe);
        if (copy.user_data > k_dev_fuse_data && copy.res < 0 && copy.res != -EAGAIN &&
            copy.res != -EINTR) {
            const auto& e = *reinterpret_cast<const entry*>(copy.user_data);
            return make_error(
                -copy.res,
                fmt::format("FUSE_IO_URING_CMD_REGISTER of an entry of queue {} "
                            "({} entries of {} bytes): {}",
                            e.qid, _cfg.entries, _cfg.payload_bytes, std::strerror(-copy.res)));
        }
        handle_cqe(copy);
    }
    return {};
}

void ring_thread::teardown()
{
    // Closing the ring cancels the entries still waiting in the kernel
    // (it completes them with ENOTCONN); a request handed to one meanwhile
    // is ended by the connection's abort at unmount.
    if (_ring_ok) {
        io_uring_queue_exit(&_ring);
        _ring_ok = false;
    }
    if (_payloads != nullptr) {
        ::munmap(_payloads, _payloads_len);
        _payloads = nullptr;
    }
    std::free(_dev_fuse_buf.mem);
    _dev_fuse_buf.mem = nullptr;
}

io_uring_sqe* ring_thread::next_sqe()
{
    io_uring_sqe* sqe = io_uring_get_sqe(&_ring);
    if (sqe == nullptr) {
        // The ring has room for a command per entry and our three others;
        // never drop a command.
        io_uring_submit(&_ring);
        sqe = io_uring_get_sqe(&_ring);
    }
    return sqe;
}

void ring_thread::prep_command(entry& e, uint32_t op)
{
    io_uring_sqe* sqe = next_sqe();
    // 128 bytes: the command area follows the classic 64.
    std::memset(sqe, 0, 2 * sizeof(io_uring_sqe));
    sqe->opcode = IORING_OP_URING_CMD;
    if (_fixed_file) {
        sqe->fd = 0;
        sqe->flags = IOSQE_FIXED_FILE;
    } else {
        sqe->fd = _cfg.fuse_fd;
    }
    sqe->cmd_op = op;
    if (op == ring_abi::k_cmd_register) {
        sqe->addr = reinterpret_cast<uint64_t>(e.iov);
        sqe->len = ring_abi::k_register_iovecs;
    }
    ring_abi::cmd_req cmd{};
    cmd.qid = e.qid;
    cmd.commit_id = op == ring_abi::k_cmd_commit_and_fetch ? e.commit_id : 0;
    std::memcpy(sqe->cmd, &cmd, sizeof(cmd));
    io_uring_sqe_set_data64(sqe, reinterpret_cast<uint64_t>(&e));
    e.last_cmd = op;
}

void ring_thread::prep_wake_read()
{
    io_uring_sqe* sqe = next_sqe();
    io_uring_prep_read(sqe, _wake_fd, &_wake_buf, sizeof(_wake_buf), 0);
    io_uring_sqe_set_data64(sqe, k_wake_data);
}

void ring_thread::arm_dev_fuse_poll()
{
    io_uring_sqe* sqe = next_sqe();
    io_uring_prep_poll_multishot(sqe, _cfg.fuse_fd, POLLIN);
    io_uring_sqe_set_data64(sqe, k_dev_fuse_data);
    _dev_fuse_armed = true;
}

bool ring_thread::work_waiting() const
{
    // A request handed to an entry is task work (DEFER_TASKRUN) until the
    // thread enters the ring; TASKRUN_FLAG shows it.
    return io_uring_cq_ready(&_ring) != 0 ||
           (IO_URING_READ_ONCE(*_ring.sq.kflags) & IORING_SQ_TASKRUN) != 0;
}

int ring_thread::wait_idle()
{
    fuse_export& x = _owner;
    // What this thread served since its last wait counts towards the
    // export's poll window (poll_us).
    const uint64_t served = _requests.load(std::memory_order_relaxed) - _requests_counted;
    _requests_counted += served;
    const uint64_t window_ns = x._poll->level() * 1'000;
    if (window_ns == 0) {
        x._poll->served(monotonic_ns(), served);
        return io_uring_submit_and_wait(&_ring, 1);
    }
    // As a /dev/fuse worker does (fuse_export.cpp): one thread at a time
    // busy-polls, on idle CPU time only, for the measured window; here it
    // watches the ring, after the commits went out.
    const uint64_t start = monotonic_ns();
    uint64_t polled_ns = 0;
    bool caught = false;
    if (!x._polling.exchange(true, std::memory_order_acquire)) {
        io_uring_submit_and_get_events(&_ring);
        const uint64_t deadline = start + window_ns;
        while (!(caught = work_waiting()) && monotonic_ns() < deadline &&
               !_exit_requested.load(std::memory_order_relaxed)) {
            ::sched_yield();
        }
        x._polling.store(false, std::memory_order_release);
        polled_ns = monotonic_ns() - start;
        _w.poll_time_ns.fetch_add(polled_ns, std::memory_order_relaxed);
    }
    x._poll->served(start + polled_ns, served, polled_ns);
    const int r = io_uring_submit_and_wait(&_ring, 1);
    (caught ? _w.polled_requests : _w.slept_requests).fetch_add(1, std::memory_order_relaxed);
    return r;
}

int ring_thread::wait()
{
    io_queue* q = _w.queue;
    if (q == nullptr || q->in_flight() == 0) {
        return wait_idle();
    }
    if (!_event_poll_armed && q->event_fd() >= 0) {
        io_uring_sqe* sqe = next_sqe();
        io_uring_prep_poll_multishot(sqe, q->event_fd(), POLLIN);
        io_uring_sqe_set_data64(sqe, k_event_data);
        _event_poll_armed = true;
    }
    const uint64_t due = q->next_event_ns();
    uint64_t now = monotonic_ns();
    if (due <= now || io_uring_cq_ready(&_ring) != 0) {
        return io_uring_submit_and_get_events(&_ring);
    }
    if (due == UINT64_MAX) {
        return io_uring_submit_and_wait(&_ring, 1);
    }
    if (due - now < k_spin_ns) {
        // Shorter than a sleep's wake-up: spin, watching the ring and the
        // task work the kernel queues for it (a new request).
        const int r = io_uring_submit_and_get_events(&_ring);
        while (now < due && !work_waiting()) {
            cpu_relax();
            now = monotonic_ns();
        }
        return r;
    }
    const uint64_t delta = due - now;
    __kernel_timespec ts{.tv_sec = static_cast<int64_t>(delta / 1'000'000'000u),
                         .tv_nsec = static_cast<long long>(delta % 1'000'000'000u)};
    io_uring_cqe* cqe = nullptr;
    const int r = io_uring_submit_and_wait_timeout(&_ring, &cqe, 1, &ts, nullptr);
    return r == -ETIME ? 0 : r;
}

void ring_thread::handle_cqe(const io_uring_cqe& cqe)
{
    switch (cqe.user_data) {
    case k_wake_data:
        if (!_exit_requested.load(std::memory_order_acquire)) {
            prep_wake_read();
        }
        return;
    case k_event_data:
        // The device queue has completions; the loop's process() takes them.
        _event_poll_armed = (cqe.flags & IORING_CQE_F_MORE) != 0;
        return;
    case k_dev_fuse_data:
        _dev_fuse_armed = (cqe.flags & IORING_CQE_F_MORE) != 0;
        if (_dev_fuse_gone) {
            return;
        }
        if (cqe.res < 0 || !_owner.serve_dev_fuse(_w, _dev_fuse_buf)) {
            _dev_fuse_gone = true;  // unmounted or aborted: nothing more comes
        } else if (!_dev_fuse_armed) {
            arm_dev_fuse_poll();
        }
        return;
    default:
        break;
    }
    entry& e = *reinterpret_cast<entry*>(cqe.user_data);
    if (cqe.res == 0) {
        serve(e);
    } else if (cqe.res == -EAGAIN || cqe.res == -EINTR) {
        prep_command(e, e.last_cmd);  // as libfuse does: the same again
    } else {
        // ENOTCONN, ECONNABORTED, ECANCELED: the connection is going away
        // (unmount, abort); the entry is the kernel's no more.
        e.gone = true;
    }
}

void ring_thread::serve(entry& e)
{
    const ring_abi::request_header& h = *e.header;
    fuse_in_header in;
    std::memcpy(&in, h.in_out, sizeof(in));
    e.unique = in.unique;
    e.commit_id = h.ring_ent_in_out.commit_id;
    const size_t payload = std::min<size_t>(h.ring_ent_in_out.payload_sz, _cfg.payload_bytes);
    _requests.fetch_add(1, std::memory_order_relaxed);
    const reply_to r{.sink = this, .request = &e};
    fuse_export& x = _owner;
    // What each operation finds where: its first argument in op_in, the
    // rest (a name, write data) in the payload.
    switch (in.opcode) {
    case FUSE_LOOKUP:
        x.serve_lookup(r, in.nodeid, std::string_view(e.payload, ::strnlen(e.payload, payload)));
        return;
    case FUSE_GETATTR:
        x.serve_getattr(r, in.nodeid);
        return;
    case FUSE_SETATTR: {
        const auto& a = arg<fuse_setattr_in>(h);
        x.serve_setattr(r, in.nodeid, a.valid, a.size);
        return;
    }
    case FUSE_OPEN:
        x.serve_open(r, in.nodeid, arg<fuse_open_in>(h).flags);
        return;
    case FUSE_OPENDIR:
        x.serve_opendir(r, in.nodeid);
        return;
    case FUSE_READDIR: {
        const auto& a = arg<fuse_read_in>(h);
        x.serve_readdir(r, in.nodeid, a.size, a.offset);
        return;
    }
    case FUSE_READ: {
        const auto& a = arg<fuse_read_in>(h);
        x.serve_read(r, a.size, static_cast<int64_t>(a.offset));
        return;
    }
    case FUSE_WRITE: {
        const auto& a = arg<fuse_write_in>(h);
        if (a.size > payload) {
            r.error(EINVAL);
            return;
        }
        x.serve_write(r, e.payload, a.size, static_cast<int64_t>(a.offset));
        return;
    }
    case FUSE_STATFS:
        x.serve_statfs(r);
        return;
    case FUSE_FSYNC:
        x.serve_fsync(r);
        return;
    case FUSE_FLUSH:
    case FUSE_RELEASE:
    case FUSE_RELEASEDIR:
        fuse_export::serve_nothing(r);
        return;
    case FUSE_FALLOCATE: {
        const auto& a = arg<fuse_fallocate_in>(h);
        x.serve_fallocate(r, static_cast<int>(a.mode), static_cast<int64_t>(a.offset),
                          static_cast<int64_t>(a.length));
        return;
    }
    case FUSE_LSEEK: {
        const auto& a = arg<fuse_lseek_in>(h);
        x.serve_lseek(r, static_cast<int64_t>(a.offset), static_cast<int>(a.whence));
        return;
    }
    default:
        // What libfuse answers for an operation the file system lacks;
        // the kernel then stops asking (xattrs, statx, ...).
        r.error(ENOSYS);
        return;
    }
}

void ring_thread::commit(entry& e, int error, size_t size)
{
    fuse_out_header out{};
    out.len = static_cast<uint32_t>(sizeof(out) + size);
    out.error = error;
    out.unique = e.unique;
    std::memcpy(e.header->in_out, &out, sizeof(out));
    e.header->ring_ent_in_out.payload_sz = static_cast<uint32_t>(size);
    prep_command(e, ring_abi::k_cmd_commit_and_fetch);
}

void ring_thread::error(void* request, int error)
{
    commit(*static_cast<entry*>(request), -error, 0);
}

void ring_thread::data(void* request, const void* bytes, size_t size)
{
    entry& e = *static_cast<entry*>(request);
    if (size > _cfg.payload_bytes) {
        commit(e, -EIO, 0);  // larger than the kernel asked for: cannot be
        return;
    }
    if (size != 0 && bytes != e.payload) {
        std::memmove(e.payload, bytes, size);
    }
    commit(e, 0, size);
}

char* ring_thread::buffer(void* request, size_t size)
{
    return size <= _cfg.payload_bytes ? static_cast<entry*>(request)->payload : nullptr;
}

void ring_thread::run(std::promise<result<void>>& ready)
{
    t_worker = &_w;
    const std::string name = fmt::format("fuse-ring-{}", _w.index);
    pthread_setname_np(pthread_self(), name.c_str());
    if (auto r = setup(); !r) {
        teardown();
        ready.set_value(std::unexpected(r.error()));
        return;
    }
    io_queue* q = _w.queue;
    if (q != nullptr) {
        // This thread drives the device queue: control submissions (the
        // daemon's `softblk zone`) come through its inbox, and the wake
        // read wakes the loop for them.
        q->attach_owner([this] {
            const uint64_t one = 1;
            [[maybe_unused]] ssize_t n = ::write(_wake_fd, &one, sizeof(one));
        });
    }
    ready.set_value({});
    for (;;) {
        if (q != nullptr && q->in_flight() != 0) {
            q->process();
        }
        // Leaving: once every request taken is answered (in flight in the
        // device: its completion commits it) and no control submission
        // waits (detach_owner refuses while one does).
        if (_exit_requested.load(std::memory_order_acquire) &&
            (q == nullptr || (q->in_flight() == 0 && q->detach_owner()))) {
            break;
        }
        const int r = wait();
        if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY && r != -ETIME) {
            // The ring itself failed: nothing more can come through it.
            fmt::print(stderr, "fuse: ring queue {}: {}\n", _cfg.qids.front(), std::strerror(-r));
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
    // Commits prepared by the last completions go out before the ring closes.
    io_uring_submit(&_ring);
    teardown();
}

}  // namespace softblk::fuse
