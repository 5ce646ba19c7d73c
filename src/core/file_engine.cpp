// file_ring: one io_uring per device queue (include/softblk/file_engine.hpp),
// and the allocation map from SEEK_DATA/SEEK_HOLE.
//
// Per-request state lives in io_request::target_scratch, so the hot path
// allocates nothing:
//   target_scratch[0]  byte offset in the file where the request starts
//   target_scratch[1]  bits  0..31  bytes done (read/write) or the length
//                                   (fallocate family)
//                      bits 32..47  file number
//                      bits 48..51  step (enum step)
//                      bits 52..59  fallocate mode; for a write whose data
//                                   is in the kernel, enum kernel_buffer_state
//                      bits 60..63  EAGAIN/EINTR retries without progress
// The SQE's user_data is the request's address; the entries that register
// and unregister a kernel buffer post a completion only when they fail, and
// carry the address with a tag in its low bits (enum buffer_note).
#include <softblk/file_engine.hpp>

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

namespace {

// Linux 6.12 (block/ioctl.c): asynchronous discard through
// IORING_OP_URING_CMD on a block device; addr = start, addr3 = length.
constexpr uint32_t k_block_uring_cmd_discard = _IO(0x12, 0);

// Retries of EAGAIN/EINTR in a row (without progress) before the error is
// returned: a device that keeps saying "try again" must not hold a request
// for ever.
constexpr unsigned k_max_retries = 15;

enum step : unsigned {
    k_read = 0,
    k_write = 1,
    k_write_fua = 2,
    k_fsync = 3,
    k_fallocate = 4,      // any mode; the result is the request's
    k_zero_unmap = 5,     // PUNCH_HOLE for write zeroes; EOPNOTSUPP -> ZERO_RANGE
    k_zero_range = 6,     // ZERO_RANGE; EOPNOTSUPP on a file -> punch + allocate
    k_zero_punch = 7,     // emulated ZERO_RANGE, part 1: punch
    k_zero_allocate = 8,  // emulated ZERO_RANGE, part 2: allocate
    k_discard_cmd = 9,    // BLOCK_URING_CMD_DISCARD
};

// A write with kernel_data: where its buffer is (the mode bits).
enum kernel_buffer_state : int {
    k_kb_registered = 1,  // in the table: unregister before completing
    k_kb_buffered = 2,    // direct I/O refused the pages: buffered descriptor
};

// user_data tags (io_request is 8-byte aligned).
enum buffer_note : uintptr_t {
    k_note_register = 1,
    k_note_unregister = 2,
    k_note_mask = 3,
};

constexpr uint64_t k_count_mask = 0xffff'ffffull;

inline uint32_t count_of(const io_request& r)
{
    return static_cast<uint32_t>(r.target_scratch[1] & k_count_mask);
}
inline unsigned file_of(const io_request& r)
{
    return static_cast<unsigned>((r.target_scratch[1] >> 32) & 0xffff);
}
inline step step_of(const io_request& r)
{
    return static_cast<step>((r.target_scratch[1] >> 48) & 0xf);
}
inline int mode_of(const io_request& r)
{
    return static_cast<int>((r.target_scratch[1] >> 52) & 0xff);
}
inline unsigned retries_of(const io_request& r)
{
    return static_cast<unsigned>(r.target_scratch[1] >> 60);
}
inline void set_mode(io_request& r, int mode)
{
    r.target_scratch[1] =
        (r.target_scratch[1] & ~(uint64_t{0xff} << 52)) | (uint64_t(mode & 0xff) << 52);
}
inline void set_state(io_request& r, uint64_t offset, uint32_t count, unsigned file, step s,
                      int mode = 0, unsigned retries = 0)
{
    r.target_scratch[0] = offset;
    r.target_scratch[1] = uint64_t{count} | (uint64_t{file & 0xffff} << 32) | (uint64_t{s} << 48) |
                          (uint64_t(mode & 0xff) << 52) | (uint64_t{retries & 0xf} << 60);
}

// The thread identity the single-issuer check compares: a number unique per
// thread for the process's life, with no system call. (Not a thread_local's
// address: a new thread often gets the TLS block of one that exited, and
// would pass for the ring's owner while the kernel refuses it: -EEXIST.)
uint64_t this_thread_id()
{
    static std::atomic<uint64_t> next{1};
    thread_local const uint64_t id = next.fetch_add(1, std::memory_order_relaxed);
    return id;
}

// io_uring_enter's errors that a later call may not repeat: completions
// backed up (EBUSY, until poll() reaps them), no memory for a request
// (EAGAIN), a signal (EINTR). Any other error will come back every time.
bool transient_enter_error(int rc)
{
    return rc == -EBUSY || rc == -EAGAIN || rc == -EINTR;
}

}  // namespace

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

// ---------------------------------------------------------------- operations

bool file_ring::admit(io_request& r)
{
    if (!owner_ok()) {
        // A second thread while the first still has requests in the ring
        // (docs/file.md): refused rather than lost.
        _sink.complete(r, -EBUSY);
        return false;
    }
    if (_broken != 0) {
        // The kernel refused this thread (submit_queued): every request
        // fails until another thread takes the ring over (owner_ok).
        _sink.complete(r, _broken);
        return false;
    }
    if (_held != nullptr) {
        // Another request joins the held append: it is no longer alone, so
        // the ring takes it (first, keeping the order).
        io_request& held = *std::exchange(_held, nullptr);
        start_rw(held);
    }
    ++_in_flight;
    return true;
}

void file_ring::read(io_request& r, unsigned file, uint64_t file_offset)
{
    if (!admit(r)) {
        return;
    }
    set_state(r, file_offset, 0, file, k_read);
    start_rw(r);
}

void file_ring::write(io_request& r, unsigned file, uint64_t file_offset, bool fua)
{
    if (!admit(r)) {
        return;
    }
    set_state(r, file_offset, 0, file, fua ? k_write_fua : k_write);
    start_rw(r);
}

void file_ring::append(io_request& r, unsigned file, uint64_t file_offset, bool fua)
{
    if (!admit(r)) {
        return;
    }
    set_state(r, file_offset, 0, file, fua ? k_write_fua : k_write);
    const backing_file& f = *_files[file];
    // (A block device takes direct writes without blocking; a file in RAM
    // is copied inside start_rw anyway; data in the kernel can only go
    // through the ring.)
    if (_in_flight == 1 && _unsubmitted == 0 && !f.block_device() && !f.memory_file_system() &&
        r.kernel_data == nullptr) {
        // Alone so far: held until the owner's next poll(), which writes it
        // here unless another request joined it by then (admit).
        _held = &r;
        return;
    }
    start_rw(r);
}

void file_ring::flush(io_request& r, unsigned file)
{
    if (!admit(r)) {
        return;
    }
    set_state(r, 0, 0, file, k_fsync);
    start_fsync(r);
}

void file_ring::start_fsync(io_request& r)
{
    io_uring_sqe* sqe = next_sqe(r);
    if (sqe == nullptr) {
        return;
    }
    io_uring_prep_fsync(sqe, static_cast<int>(2 * file_of(r)), IORING_FSYNC_DATASYNC);
    sqe->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data(sqe, &r);
    ++_unsubmitted;
}

void file_ring::fallocate(io_request& r, unsigned file, int mode, uint64_t file_offset,
                          uint64_t length)
{
    if (!admit(r)) {
        return;
    }
    set_state(r, file_offset, static_cast<uint32_t>(length), file, k_fallocate, mode);
    start_fallocate(r, mode, file_offset, length);
}

void file_ring::write_zeroes(io_request& r, unsigned file, uint64_t file_offset, uint64_t length,
                             bool unmap, bool fast_only)
{
    if (!admit(r)) {
        return;
    }
    const uint32_t len = static_cast<uint32_t>(length);
    const bool bdev = _files[file]->block_device();
    if (bdev && fast_only) {
        // Only the device's own write-zeroes is fast: PUNCH_HOLE on a block
        // device never falls back to writing zeros (BLKDEV_ZERO_NOFALLBACK).
        set_state(r, file_offset, len, file, k_fallocate,
                  FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE);
        start_fallocate(r, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, file_offset, len);
        return;
    }
    if (unmap) {
        // Deallocating is the cheapest way to zero: a hole in a file, an
        // unmapping write-zeroes on a block device (which refuses rather
        // than write zeroes itself).
        set_state(r, file_offset, len, file, k_zero_unmap,
                  FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE);
        start_fallocate(r, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, file_offset, len);
        return;
    }
    if (!bdev && _stats.no_zero_range.load(std::memory_order_relaxed)) {
        set_state(r, file_offset, len, file, k_zero_punch,
                  FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE);
        start_fallocate(r, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, file_offset, len);
        return;
    }
    set_state(r, file_offset, len, file, k_zero_range, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE);
    start_fallocate(r, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE, file_offset, len);
}

void file_ring::discard(io_request& r, unsigned file, uint64_t file_offset, uint64_t length)
{
    if (!admit(r)) {
        return;
    }
    start_discard(r, file, file_offset, length);
}

void file_ring::start_discard(io_request& r, unsigned file, uint64_t file_offset, uint64_t length)
{
    const uint32_t len = static_cast<uint32_t>(length);
    if (!_files[file]->block_device()) {
        set_state(r, file_offset, len, file, k_fallocate,
                  FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE);
        start_fallocate(r, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, file_offset, len);
        return;
    }
    set_state(r, file_offset, len, file, k_discard_cmd);
    if (!_stats.no_uring_discard.load(std::memory_order_relaxed)) {
        start_discard_bdev(r);
        return;
    }
    // Kernels before 6.12 have no asynchronous discard: BLKDISCARD is an
    // ioctl, run here on the queue's thread. A discard takes the device
    // milliseconds at most, and discards are rare next to reads and writes;
    // a worker thread would cost every device a thread for that.
    uint64_t range[2] = {file_offset, length};
    _stats.sync_discards.fetch_add(1, std::memory_order_relaxed);
    finish(r, ::ioctl(_files[file]->fd(), BLKDISCARD, range) == 0 ? 0 : -errno);
}

bool file_ring::direct_ok(const io_request& r)
{
    const backing_file& f = *_files[file_of(r)];
    const uint32_t done = count_of(r);
    // Direct I/O needs the offset and length in whole blocks and the
    // buffer aligned; a request that is not goes through the page cache
    // (coherent with direct I/O on the same file: the kernel writes back
    // and drops cached pages around each direct transfer).
    if (!f.direct()) {
        return false;
    }
    // (The pages of a kernel buffer are the block layer's: aligned for the
    // device that sent them; where the file system wants more, the write
    // fails with EINVAL and on_cqe sends it to the buffered descriptor.)
    if ((((r.target_scratch[0] + done) | (r.length - done)) & (f.min_block_size() - 1)) != 0 ||
        (r.kernel_data == nullptr &&
         (reinterpret_cast<uintptr_t>(static_cast<char*>(r.buffer) + done) &
          (f.memory_alignment() - 1)) != 0)) {
        _stats.unaligned_buffered.fetch_add(1, std::memory_order_relaxed);
        return false;
    }
    return true;
}

void file_ring::start_rw(io_request& r)
{
    if (r.kernel_data != nullptr) {
        start_kernel_write(r);
        return;
    }
    const unsigned file = file_of(r);
    const backing_file& f = *_files[file];
    if (f.memory_file_system()) {
        _stats.memory_copies.fetch_add(1, std::memory_order_relaxed);
        copy_rw(r, f.buffered_fd());
        return;
    }
    const uint32_t done = count_of(r);
    const uint64_t offset = r.target_scratch[0] + done;
    const uint32_t length = r.length - done;
    char* buffer = static_cast<char*>(r.buffer) + done;
    const int slot = static_cast<int>(2 * file + (direct_ok(r) ? 0 : 1));
    io_uring_sqe* sqe = next_sqe(r);
    if (sqe == nullptr) {
        return;
    }
    const step s = step_of(r);
    if (s == k_read) {
        io_uring_prep_read(sqe, slot, buffer, length, offset);
    } else {
        io_uring_prep_write(sqe, slot, buffer, length, offset);
        if (s == k_write_fua) {
            // FUA: durable on completion. RWF_DSYNC has been in every
            // kernel with io_uring (4.7+), so there is no write + fdatasync
            // fall-back to keep.
            sqe->rw_flags = RWF_DSYNC;
        }
    }
    sqe->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data(sqe, &r);
    ++_unsubmitted;
}

void file_ring::start_kernel_write(io_request& r)
{
    const kernel_buffer& kb = *r.kernel_data;
    const step s = step_of(r);
    if (s == k_read) {
        // Nothing to read into: the core refuses such a request.
        finish(r, -EINVAL);
        return;
    }
    if (kb.in_table || kb.prep_completion != nullptr) {
        // Both need the front end's own ring: its table, its entry.
        if (_borrowed == nullptr) {
            finish(r, -EINVAL);
            return;
        }
    } else if (_mode == ring_mode::defer_taskrun && _borrowed == nullptr) {
        // With the pages of ublk requests registered and written through a
        // DEFER_TASKRUN ring, requests that the kernel handed to ublk
        // afterwards sometimes never reached the daemon (Linux 7.3.4: five
        // test runs in six stalled, none in four with COOP_TASKRUN;
        // docs/file.md).
        // The ring is rebuilt without it first.
        r.next = nullptr;
        (_awaiting_tail != nullptr ? _awaiting_tail->next : _awaiting_head) = &r;
        _awaiting_tail = &r;
        ++_awaiting;
        leave_defer_taskrun();
        return;
    }
    if (!kb.in_table && _buffer_slots == 0 && _broken == 0) {
        // The table is made at the first kernel buffer: rings that never
        // see one carry none.
        const int rc = io_uring_register_buffers_sparse(ring(), kb.slots);
        if (rc < 0) {
            _stats.kernel_buffer_errors.fetch_add(1, std::memory_order_relaxed);
            finish(r, rc);
            return;
        }
        _buffer_slots = kb.slots;
    }
    if (kb.index >= (kb.in_table ? kb.slots : _buffer_slots)) {
        finish(r, -EINVAL);
        return;
    }
    const unsigned file = file_of(r);
    const int mode = mode_of(r);
    const bool to_register = !kb.in_table && (mode & k_kb_registered) == 0;
    // The register entry, the write and the front end's completion go in
    // together (linked: each runs only if the one before it did all its
    // work): all need room.
    const unsigned entries = 1 + (to_register ? 1 : 0) + (kb.prep_completion != nullptr ? 1 : 0);
    if (_broken == 0 && io_uring_sq_space_left(ring()) < entries) {
        make_room();
    }
    if (_broken != 0 || io_uring_sq_space_left(ring()) < entries) {
        finish(r, _broken != 0 ? _broken : _submit_error);
        return;
    }
    if (to_register) {
        io_uring_sqe* reg = io_uring_get_sqe(ring());
        kb.prep_register(*reg, kb);
        reg->flags |= IOSQE_IO_LINK | IOSQE_CQE_SKIP_SUCCESS;
        io_uring_sqe_set_data64(reg, reinterpret_cast<uintptr_t>(&r) | k_note_register);
        ++_unsubmitted;
        set_mode(r, mode | k_kb_registered);
    }
    if (count_of(r) == 0 && retries_of(r) == 0 && (mode & k_kb_buffered) == 0) {
        // The request's first write (not a retry, the rest or the
        // page-cache fallback).
        _stats.kernel_buffer_writes.fetch_add(1, std::memory_order_relaxed);
    }
    io_uring_sqe* sqe = io_uring_get_sqe(ring());
    const uint32_t done = count_of(r);
    const bool direct = (mode & k_kb_buffered) == 0 && direct_ok(r);
    // A fixed kernel buffer is addressed from 0: the address is the offset
    // into the request's data.
    io_uring_prep_rw(IORING_OP_WRITE_FIXED, sqe, static_cast<int>(2 * file + (direct ? 0 : 1)),
                     reinterpret_cast<void*>(uintptr_t{done}), r.length - done,
                     r.target_scratch[0] + done);
    sqe->buf_index = kb.index;
    if (s == k_write_fua) {
        sqe->rw_flags = RWF_DSYNC;
    }
    sqe->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data(sqe, &r);
    ++_unsubmitted;
    if (kb.prep_completion != nullptr) {
        // This write ends the request if it writes all it asks for (a short
        // one fails the link, and the rest goes with a link of its own):
        // the front end's completion follows it in the same context.
        sqe->flags |= IOSQE_IO_LINK;
        kb.prep_completion(*io_uring_get_sqe(ring()), kb);
    }
}

void file_ring::leave_defer_taskrun()
{
    if (_awaiting == 0 || _in_flight != _awaiting || _unsubmitted != 0 || _held != nullptr) {
        return;  // again from poll(), once the rest has completed
    }
    io_request* waiting = std::exchange(_awaiting_head, nullptr);
    _awaiting_tail = nullptr;
    _awaiting = 0;
    auto rebuilt = setup(ring_mode::coop_taskrun);
    if (rebuilt) {
        _stats.kernel_buffer_rings.fetch_add(1, std::memory_order_relaxed);
    }
    while (waiting != nullptr) {
        io_request& r = *waiting;
        waiting = std::exchange(r.next, nullptr);
        if (rebuilt) {
            start_kernel_write(r);
        } else {
            finish(r, -static_cast<int>(rebuilt.error().code.value()));
        }
    }
}

void file_ring::release_kernel_buffer(io_request& r)
{
    set_mode(r, mode_of(r) & ~k_kb_registered);
    io_uring_sqe* sqe = _broken == 0 ? io_uring_get_sqe(ring()) : nullptr;
    if (sqe == nullptr && _broken == 0) {
        make_room();
        sqe = _broken == 0 ? io_uring_get_sqe(ring()) : nullptr;
    }
    if (sqe == nullptr) {
        // The kernel refuses the ring: the pages stay in the table, and the
        // front end's request with them, until the ring is closed.
        _stats.kernel_buffer_errors.fetch_add(1, std::memory_order_relaxed);
        return;
    }
    // Sent now, before the request completes and its front end commits it
    // (the order ublk's own servers keep; the kernel would also let the
    // request end later, when the last reference to its pages goes).
    r.kernel_data->prep_unregister(*sqe, *r.kernel_data);
    sqe->flags |= IOSQE_CQE_SKIP_SUCCESS;
    io_uring_sqe_set_data64(sqe, reinterpret_cast<uintptr_t>(&r) | k_note_unregister);
    ++_unsubmitted;
    submit_queued();
}

void file_ring::on_buffer_note(uintptr_t data, int res)
{
    _stats.kernel_buffer_errors.fetch_add(1, std::memory_order_relaxed);
    if ((data & k_note_mask) != k_note_register) {
        // An unregister that failed: its request completed already (and
        // may be another one now); nothing to tell it.
        return;
    }
    // The pages are not in the table, and the linked write was failed
    // without a completion of its own (a failed entry that skips its
    // success takes its links' completions with it): the request ends here,
    // with the cause, and nothing to unregister.
    io_request& r = *reinterpret_cast<io_request*>(data & ~uintptr_t{k_note_mask});
    set_mode(r, mode_of(r) & ~k_kb_registered);
    finish(r, res);
}

void file_ring::write_held()
{
    io_request& r = *std::exchange(_held, nullptr);
    const backing_file& f = *_files[file_of(r)];
    _stats.held_appends.fetch_add(1, std::memory_order_relaxed);
    copy_rw(r, direct_ok(r) ? f.fd() : f.buffered_fd());
}

void file_ring::copy_rw(io_request& r, int fd)
{
    // A file in RAM: io_uring could only hand the request to a worker thread
    // (no FMODE_NOWAIT), which costs two thread switches to do one memory
    // copy. The copy is done here; it waits for nothing but memory (a page
    // swapped out, or allocated, on a write). A held append: see append().
    const step s = step_of(r);
    char* buffer = static_cast<char*>(r.buffer);
    uint32_t done = count_of(r);
    unsigned retries = 0;
    while (done < r.length) {
        const off_t at = static_cast<off_t>(r.target_scratch[0] + done);
        iovec v{buffer + done, r.length - done};
        const ssize_t n = s == k_read ? ::preadv2(fd, &v, 1, at, 0)
                                      : ::pwritev2(fd, &v, 1, at, s == k_write_fua ? RWF_DSYNC : 0);
        if (n < 0) {
            const int err = errno;
            if ((err == EINTR || err == EAGAIN) && ++retries <= k_max_retries) {
                _stats.retries.fetch_add(1, std::memory_order_relaxed);
                continue;
            }
            finish(r, -err);
            return;
        }
        if (n == 0) {
            if (s != k_read) {
                finish(r, -EIO);
                return;
            }
            // The end of the file: zeros, as on the ring's path.
            std::memset(buffer + done, 0, r.length - done);
            break;
        }
        if (static_cast<uint32_t>(n) < r.length - done) {
            _stats.short_transfers.fetch_add(1, std::memory_order_relaxed);
        }
        done += static_cast<uint32_t>(n);
        retries = 0;
    }
    finish(r, static_cast<int>(r.length));
}

void file_ring::start_fallocate(io_request& r, int mode, uint64_t offset, uint64_t length)
{
    io_uring_sqe* sqe = next_sqe(r);
    if (sqe == nullptr) {
        return;
    }
    // fallocate runs in the kernel's io-wq workers: the queue's thread
    // never blocks on it.
    io_uring_prep_fallocate(sqe, static_cast<int>(2 * file_of(r)), mode, static_cast<off_t>(offset),
                            static_cast<off_t>(length));
    sqe->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data(sqe, &r);
    ++_unsubmitted;
}

void file_ring::start_discard_bdev(io_request& r)
{
    io_uring_sqe* sqe = next_sqe(r);
    if (sqe == nullptr) {
        return;
    }
    io_uring_prep_rw(IORING_OP_URING_CMD, sqe, static_cast<int>(2 * file_of(r)), nullptr, 0, 0);
    sqe->cmd_op = k_block_uring_cmd_discard;
    sqe->addr = r.target_scratch[0];
    sqe->addr3 = count_of(r);
    sqe->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data(sqe, &r);
    ++_unsubmitted;
}

// ---------------------------------------------------------------- completion

void file_ring::finish(io_request& r, int result)
{
    if (r.kernel_data != nullptr && step_of(r) <= k_write_fua &&
        (mode_of(r) & k_kb_registered) != 0) {
        release_kernel_buffer(r);
    }
    --_in_flight;
    ++_finished;
    _sink.complete(r, result);
}

void file_ring::on_cqe(io_request& r, int res)
{
    const step s = step_of(r);
    const unsigned retries = retries_of(r);
    if ((res == -EAGAIN || res == -EINTR) && retries < k_max_retries) {
        _stats.retries.fetch_add(1, std::memory_order_relaxed);
        r.target_scratch[1] =
            (r.target_scratch[1] & ~(uint64_t{0xf} << 60)) | (uint64_t{retries + 1} << 60);
        if (s <= k_write_fua) {
            start_rw(r);
        } else if (s == k_fsync) {
            start_fsync(r);
        } else if (s == k_discard_cmd) {
            start_discard_bdev(r);
        } else {
            start_fallocate(r, mode_of(r), r.target_scratch[0], count_of(r));
        }
        return;
    }
    switch (s) {
    case k_read:
    case k_write:
    case k_write_fua: {
        if (r.kernel_data != nullptr) {
            const int mode = mode_of(r);
            if (res == -EINVAL && (mode & k_kb_buffered) == 0 && _files[file_of(r)]->direct()) {
                // The pages are not aligned as this file system's direct
                // I/O wants them: through the page cache, as a buffer would.
                _stats.unaligned_buffered.fetch_add(1, std::memory_order_relaxed);
                set_mode(r, mode | k_kb_buffered);
                start_rw(r);
                return;
            }
        }
        if (res < 0) {
            finish(r, res);
            return;
        }
        uint32_t done = count_of(r);
        if (res == 0) {
            if (s == k_read) {
                // The end of the file (it was shrunk under the device):
                // what lies beyond reads as zeros, as the loop driver does.
                std::memset(static_cast<char*>(r.buffer) + done, 0, r.length - done);
                finish(r, static_cast<int>(r.length));
            } else {
                finish(r, -EIO);
            }
            return;
        }
        done += static_cast<uint32_t>(res);
        if (done < r.length) {
            // A short transfer is never success: send the rest.
            _stats.short_transfers.fetch_add(1, std::memory_order_relaxed);
            set_state(r, r.target_scratch[0], done, file_of(r), s, mode_of(r));
            start_rw(r);
            return;
        }
        finish(r, static_cast<int>(r.length));
        return;
    }
    case k_zero_unmap:
        if (res == -EOPNOTSUPP) {
            // No deallocation here (a block device without write-zeroes
            // unmap, a file system without holes): zero in place.
            set_state(r, r.target_scratch[0], count_of(r), file_of(r), k_zero_range,
                      FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE);
            start_fallocate(r, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE, r.target_scratch[0],
                            count_of(r));
            return;
        }
        finish(r, res);
        return;
    case k_zero_range:
        if (res == -EOPNOTSUPP && !_files[file_of(r)]->block_device()) {
            // tmpfs and others have holes but no ZERO_RANGE: a hole then an
            // allocation is the same result (zeros, allocated).
            _stats.no_zero_range.store(true, std::memory_order_relaxed);
            set_state(r, r.target_scratch[0], count_of(r), file_of(r), k_zero_punch,
                      FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE);
            start_fallocate(r, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, r.target_scratch[0],
                            count_of(r));
            return;
        }
        finish(r, res);
        return;
    case k_zero_punch:
        if (res < 0) {
            finish(r, res);
            return;
        }
        _stats.zero_range_emulated.fetch_add(1, std::memory_order_relaxed);
        set_state(r, r.target_scratch[0], count_of(r), file_of(r), k_zero_allocate,
                  FALLOC_FL_KEEP_SIZE);
        start_fallocate(r, FALLOC_FL_KEEP_SIZE, r.target_scratch[0], count_of(r));
        return;
    case k_discard_cmd:
        if (res == -EOPNOTSUPP || res == -EINVAL || res == -ENOTTY) {
            // The kernel has no BLOCK_URING_CMD_DISCARD (before 6.12).
            _stats.no_uring_discard.store(true, std::memory_order_relaxed);
            start_discard(r, file_of(r), r.target_scratch[0], count_of(r));
            return;
        }
        finish(r, res);
        return;
    default:
        finish(r, res);
        return;
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

// ---------------------------------------------------------------- allocation map

int file_engine::map_extents(int fd, uint64_t offset, uint64_t length, uint32_t block,
                             std::vector<extent>& out)
{
    const uint64_t end = offset + length;
    const uint64_t mask = block == 0 ? 0 : uint64_t{block} - 1;
    auto append = [&](uint64_t start, uint64_t stop, bool data) {
        if (stop <= start) {
            return;
        }
        if (!out.empty() && out.back().allocated == data &&
            out.back().offset + out.back().length == start) {
            out.back().length += stop - start;
            return;
        }
        out.push_back(
            extent{.offset = start, .length = stop - start, .allocated = data, .zero = !data});
    };
    // A hole counts only in whole blocks: the rounded-off edges are data.
    auto append_hole = [&](uint64_t start, uint64_t stop) {
        const uint64_t a = std::min(stop, (start + mask) & ~mask);
        const uint64_t b = std::max(a, stop & ~mask);
        append(start, a, true);
        append(a, b, false);
        append(b, stop, true);
    };
    uint64_t pos = offset;
    while (pos < end) {
        const off_t data = ::lseek(fd, static_cast<off_t>(pos), SEEK_DATA);
        if (data < 0) {
            const int err = errno;
            if (err == ENXIO) {
                // No data from here to the end of the file.
                append_hole(pos, end);
                return 0;
            }
            if (err == EINVAL || err == EOPNOTSUPP) {
                // No SEEK_DATA here (a block device): everything is data.
                append(pos, end, true);
                return 0;
            }
            return -err;
        }
        const uint64_t d = std::min<uint64_t>(static_cast<uint64_t>(data), end);
        append_hole(pos, d);
        if (d >= end) {
            break;
        }
        const off_t hole = ::lseek(fd, data, SEEK_HOLE);
        if (hole < 0) {
            return -errno;
        }
        const uint64_t h = std::min<uint64_t>(static_cast<uint64_t>(hole), end);
        append(d, h, true);
        pos = h;
    }
    return 0;
}

}  // namespace softblk
