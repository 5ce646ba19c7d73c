// file_ring's kernel-buffer path (include/softblk/file_engine.hpp): writes
// whose data stays in the kernel (io_request::external, ublk's zero
// copy) are registered in the ring's fixed-buffer table, written with
// WRITE_FIXED and unregistered before they complete; a DEFER_TASKRUN ring
// is rebuilt as COOP_TASKRUN for the first of them.
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

void file_ring::start_kernel_write(io_request& r)
{
    const kernel_buffer& kb = *kernel_data(r);
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
    const kernel_buffer& kb = *kernel_data(r);
    kb.prep_unregister(*sqe, kb);
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

}  // namespace softblk
