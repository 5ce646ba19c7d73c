// file_ring, the ring itself (include/softblk/file_engine.hpp): setting it
// up and falling back to less capable modes, the single-issuer owner check,
// submitting and reaping, borrowing a front end's ring, and the eventfd
// its owner sleeps on. The operations and their state machine are in
// file_ring_ops.cpp, the kernel-buffer path in file_ring_kernel_buffers.cpp;
// file_ring_state.hpp says how a request's state is kept.
#include <softblk/file_engine.hpp>

#include "file_ring_state.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <linux/falloc.h>
#include <linux/fs.h>
#include <liburing.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>
#include <utility>

#include <fmt/core.h>

namespace softblk {

using namespace file_ring_detail;

const char* to_string(ring_mode mode)
{
    switch (mode) {
    case ring_mode::defer_taskrun:
        return "defer_taskrun";
    case ring_mode::coop_taskrun:
        return "coop_taskrun";
    case ring_mode::plain:
        return "plain";
    }
    return "?";
}

// ---------------------------------------------------------------- ring setup

file_ring::file_ring(std::span<backing_file* const> files, unsigned depth, completion_sink& sink,
                     file_engine_stats& stats)
    : _files(files.begin(), files.end()), _depth(depth), _sink(sink), _stats(stats)
{
    for (const backing_file* f : _files) {
        _registered.push_back(f->fd());
        _registered.push_back(f->buffered_fd());
    }
}

result<std::unique_ptr<file_ring>> file_ring::create(std::span<backing_file* const> files,
                                                     unsigned depth, completion_sink& sink,
                                                     file_engine_stats& stats, ring_mode best)
{
    std::unique_ptr<file_ring> r(new file_ring(files, std::max(depth, 1u), sink, stats));
    r->_event_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (r->_event_fd < 0) {
        return make_error(errno, fmt::format("eventfd: {}", std::strerror(errno)));
    }
    // The best mode asked for that the kernel has: DEFER_TASKRUN (completions
    // are run only when the owner asks, never interrupting it) needs 6.1,
    // COOP_TASKRUN 5.19.
    result<void> made = make_error(EINVAL, "no ring mode");
    for (ring_mode m : {ring_mode::defer_taskrun, ring_mode::coop_taskrun, ring_mode::plain}) {
        if (static_cast<uint8_t>(m) >= static_cast<uint8_t>(best) && !made) {
            made = r->setup(m);
        }
    }
    if (!made) {
        return std::unexpected(made.error());
    }
    return r;
}

result<void> file_ring::setup(ring_mode mode)
{
    teardown();
    io_uring_params p{};
    switch (mode) {
    case ring_mode::defer_taskrun:
        // Created disabled: SINGLE_ISSUER binds the ring to the thread that
        // enables it, which is the queue's thread (open_queue runs on the
        // control thread).
        p.flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN |
                  IORING_SETUP_TASKRUN_FLAG | IORING_SETUP_R_DISABLED;
        break;
    case ring_mode::coop_taskrun:
        p.flags = IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG;
        break;
    case ring_mode::plain:
        break;
    }
    // Room for every tag plus what decorators add of their own; more
    // requests than entries wait in the submission path (next_sqe).
    p.flags |= IORING_SETUP_CQSIZE;
    p.cq_entries = 4 * _depth;
    auto ring = std::make_unique<io_uring>();
    int rc = io_uring_queue_init_params(std::max(_depth, 8u), ring.get(), &p);
    if (rc < 0) {
        return make_error(
            -rc, fmt::format("io_uring_queue_init ({}): {}", to_string(mode), std::strerror(-rc)));
    }
    _ring = std::move(ring);
    _ring_ready = true;
    _buffer_slots = 0;
    _mode = mode;
    _enabled = mode != ring_mode::defer_taskrun;
    _owner = 0;
    _broken = 0;
    _submit_failures = 0;
    // Registered files save a file-table lookup and reference per I/O.
    rc = io_uring_register_files(_ring.get(), _registered.data(),
                                 static_cast<unsigned>(_registered.size()));
    if (rc == 0) {
        rc = io_uring_register_eventfd(_ring.get(), _event_fd);
    }
    if (rc < 0) {
        teardown();
        return make_error(
            -rc, fmt::format("io_uring_register ({}): {}", to_string(mode), std::strerror(-rc)));
    }
    return {};
}

void file_ring::teardown()
{
    if (_ring_ready) {
        // Give the files back now: the ring's own teardown runs later in a
        // kernel worker, and until then it would hold them open (a block
        // device's exclusive claim with them).
        io_uring_unregister_files(_ring.get());
        io_uring_queue_exit(_ring.get());
        _ring_ready = false;
    }
}

file_ring::~file_ring()
{
    if (_borrowed != nullptr) {
        // The ring is its owner's to close.
        _stats.borrowed_rings.fetch_sub(1, std::memory_order_relaxed);
    }
    teardown();
    if (_event_fd >= 0) {
        ::close(_event_fd);
    }
}

bool file_ring::owner_ok()
{
    if (_borrowed != nullptr) {
        return this_thread_id() == _borrower;
    }
    if (!_ring_ready) {
        return false;
    }
    if (_mode != ring_mode::defer_taskrun) {
        return true;
    }
    const uint64_t me = this_thread_id();
    if (!_enabled) {
        // liburing 2.3 declares io_uring_enable_rings but does not export it.
        if (::syscall(__NR_io_uring_register, _ring->ring_fd, IORING_REGISTER_ENABLE_RINGS, nullptr,
                      0) < 0) {
            return false;
        }
        _enabled = true;
        _owner = me;
        return true;
    }
    if (me == _owner) {
        return true;
    }
    // Another thread took the queue over (device::execute hands queues to
    // whichever thread calls). A single-issuer ring cannot follow it, and
    // its completions can only be reaped by the first thread: with nothing
    // in flight, rebuild it in the mode any thread may drive.
    if (_in_flight != 0 || !setup(ring_mode::coop_taskrun)) {
        return false;
    }
    _stats.ring_handovers.fetch_add(1, std::memory_order_relaxed);
    return true;
}

io_uring_sqe* file_ring::next_sqe(io_request& r)
{
    io_uring_sqe* sqe = _broken == 0 ? io_uring_get_sqe(ring()) : nullptr;
    if (sqe == nullptr && _broken == 0) {
        // The submission ring is full: hand it to the kernel and take the
        // next entry (submission empties it).
        make_room();
        sqe = _broken == 0 ? io_uring_get_sqe(ring()) : nullptr;
    }
    if (sqe == nullptr) {
        // The kernel refuses the ring (_broken), or takes nothing now and
        // the ring is full: the request fails rather than wait in a loop.
        finish(r, _broken != 0 ? _broken : _submit_error);
    }
    return sqe;
}

void file_ring::make_room()
{
    if (_borrowed == nullptr) {
        submit_queued();
        return;
    }
    // The owner's ring, with the owner's entries: they go too, as they
    // would at its next wait. An error stays the owner's to see again;
    // here it fails the request that found no room (next_sqe).
    if (const int rc = io_uring_submit(_borrowed); rc < 0) {
        _submit_error = rc;
    }
}

void file_ring::submit_queued()
{
    if (_borrowed != nullptr) {
        // The owner submits before it waits.
        _unsubmitted = 0;
        return;
    }
    if (_unsubmitted == 0 || _broken != 0) {
        return;
    }
    const int rc = _mode == ring_mode::defer_taskrun ? io_uring_submit_and_get_events(_ring.get())
                                                     : io_uring_submit(_ring.get());
    if (rc >= 0) {
        _unsubmitted -= std::min<unsigned>(_unsubmitted, static_cast<unsigned>(rc));
        _submit_failures = 0;
        return;
    }
    _submit_error = rc;
    if (transient_enter_error(rc) && ++_submit_failures <= k_max_retries) {
        // The entries stay queued and the next poll() submits them after
        // reaping; not for ever, as a request's own EAGAIN.
        return;
    }
    // The kernel will not take these entries. -EEXIST: this thread is not
    // the one a single-issuer ring is bound to; owner_ok() hands an idle
    // ring to a new thread, so only a caller that breaks the one-thread rule
    // (a thread the kernel and owner_ok() disagree about, e.g. a forked
    // child) gets here. A programming error, but on the hot path: the
    // requests fail (-EBUSY, as admit() refuses a second thread) and so does
    // every later one, instead of a retry loop that would never end.
    _broken = rc == -EEXIST ? -EBUSY : rc;
    _stats.ring_errors.fetch_add(1, std::memory_order_relaxed);
    fail_unsubmitted();
}

void file_ring::fail_unsubmitted()
{
    // liburing has handed the entries to the kernel (the SQ ring's tail),
    // which has not consumed them: take them back (the tail to the head)
    // so that no later io_uring_enter runs them, then fail their requests.
    // Every entry's user_data is its request. Completion callbacks cannot
    // queue new entries meanwhile: a broken ring refuses them (admit).
    io_uring_sq& sq = _ring->sq;
    const unsigned head = IO_URING_READ_ONCE(*sq.khead);
    const unsigned tail = sq.sqe_tail;
    sq.sqe_head = sq.sqe_tail = head;
    io_uring_smp_store_release(sq.ktail, head);
    _unsubmitted = 0;
    for (unsigned i = head; i != tail; ++i) {
        const uintptr_t data = sq.sqes[i & sq.ring_mask].user_data;
        auto* r = reinterpret_cast<io_request*>(data & ~uintptr_t{k_note_mask});
        if ((data & k_note_mask) == k_note_register) {
            // Never registered: its write (the next entry) fails as is.
            set_mode(*r, mode_of(*r) & ~k_kb_registered);
        } else if ((data & k_note_mask) == k_note_unregister) {
            // Its request completed already; the buffer stays in the table
            // until the ring is closed (which releases it).
            _stats.kernel_buffer_errors.fetch_add(1, std::memory_order_relaxed);
        } else {
            finish(*r, _broken);
        }
    }
}

unsigned file_ring::poll()
{
    if (_in_flight == 0 || !owner_ok()) {
        return 0;
    }
    const uint64_t finished_before = _finished;
    if (_held != nullptr) {
        // Still alone: written here (its completion may submit more).
        write_held();
    }
    if (_borrowed != nullptr) {
        // The owner submits what is queued and hands the completions to
        // on_completion().
        _unsubmitted = 0;
        return static_cast<unsigned>(_finished - finished_before);
    }
    io_uring* ring = _ring.get();
    if (_unsubmitted != 0) {
        submit_queued();
    } else if (_mode != ring_mode::plain && (IO_URING_READ_ONCE(*ring->sq.kflags) &
                                             (IORING_SQ_TASKRUN | IORING_SQ_CQ_OVERFLOW)) != 0) {
        // Completions wait as task work (DEFER/COOP_TASKRUN): run it.
        if (const int rc = io_uring_get_events(ring); rc < 0 && !transient_enter_error(rc)) {
            // -EEXIST: not the thread the kernel bound the ring to (see
            // submit_queued). Its task work is not this thread's to run.
            _broken = rc == -EEXIST ? -EBUSY : rc;
            _stats.ring_errors.fetch_add(1, std::memory_order_relaxed);
        }
    }
    for (;;) {
        // Copy a batch out and give the slots back before completing:
        // completion callbacks may submit again.
        struct {
            uintptr_t data;
            int res;
        } batch[64];
        unsigned count = 0;
        unsigned head;
        io_uring_cqe* cqe;
        io_uring_for_each_cqe(ring, head, cqe)
        {
            batch[count++] = {static_cast<uintptr_t>(cqe->user_data), cqe->res};
            if (count == std::size(batch)) {
                break;
            }
        }
        if (count == 0) {
            break;
        }
        io_uring_cq_advance(ring, count);
        for (unsigned i = 0; i < count; ++i) {
            if ((batch[i].data & k_note_mask) != 0) {
                on_buffer_note(batch[i].data, batch[i].res);
            } else {
                on_cqe(*reinterpret_cast<io_request*>(batch[i].data), batch[i].res);
            }
        }
    }
    // Resubmissions (short transfers, retries, second steps) and requests
    // submitted from completion callbacks go out now.
    submit_queued();
    if (_awaiting != 0) {
        leave_defer_taskrun();
        submit_queued();
    }
    if (_in_flight == 0) {
        // Idle: owners sleep on the eventfd with nothing else to wake them,
        // so it must not stay readable (next_wakeup_ns is not asked then).
        drain_event_fd();
    }
    return static_cast<unsigned>(_finished - finished_before);
}

void file_ring::on_completion(uint64_t user_data, int res)
{
    const auto data = static_cast<uintptr_t>(user_data);
    if ((data & k_note_mask) != 0) {
        on_buffer_note(data, res);
    } else {
        on_cqe(*reinterpret_cast<io_request*>(data), res);
    }
    _unsubmitted = 0;  // resubmissions go out with the owner's entries
}

bool file_ring::borrow_ring(io_uring* ring)
{
    if (ring == _borrowed) {
        return true;
    }
    if (_in_flight != 0 || _held != nullptr || _awaiting != 0) {
        return false;
    }
    if (ring == nullptr) {
        io_uring_unregister_files(_borrowed);
        if (_buffer_slots != 0) {
            io_uring_unregister_buffers(_borrowed);
        }
        _buffer_slots = std::exchange(_own_buffer_slots, 0);
        _borrowed = nullptr;
        _stats.borrowed_rings.fetch_sub(1, std::memory_order_relaxed);
        return true;
    }
    if (_borrowed != nullptr || _broken != 0 ||
        io_uring_register_files(ring, _registered.data(),
                                static_cast<unsigned>(_registered.size())) < 0) {
        return false;
    }
    _own_buffer_slots = std::exchange(_buffer_slots, 0);
    _borrowed = ring;
    _borrower = this_thread_id();
    _unsubmitted = 0;
    _stats.borrowed_rings.fetch_add(1, std::memory_order_relaxed);
    return true;
}

void file_ring::drain_event_fd() const
{
    uint64_t ticks = 0;
    [[maybe_unused]] const ssize_t n = ::read(_event_fd, &ticks, sizeof ticks);
}

uint64_t file_ring::next_wakeup_ns() const
{
    if (_borrowed != nullptr) {
        // Entries queued go out with the owner's before it waits, and their
        // completions wake it in its own ring: only a held append is work.
        return _held != nullptr ? 0 : UINT64_MAX;
    }
    if (_unsubmitted != 0 || _held != nullptr || (_awaiting != 0 && _in_flight == _awaiting)) {
        return 0;
    }
    if (_in_flight == 0 || !_ring_ready) {
        return UINT64_MAX;
    }
    // The owner asks before it sleeps: reset the eventfd, then look for
    // completions that arrived since the last poll(). One that lands after
    // the read signals the eventfd again, so none is slept through; and the
    // read costs a system call per sleep, not per poll().
    drain_event_fd();
    io_uring* ring = _ring.get();
    // Task work waiting is work only for a thread the kernel lets run it:
    // a broken ring's would make the owner spin on poll().
    if (io_uring_cq_ready(ring) != 0 || (_mode != ring_mode::plain && _broken == 0 &&
                                         (IO_URING_READ_ONCE(*ring->sq.kflags) &
                                          (IORING_SQ_TASKRUN | IORING_SQ_CQ_OVERFLOW)) != 0)) {
        return 0;
    }
    return UINT64_MAX;
}

}  // namespace softblk
