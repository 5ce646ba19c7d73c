// file_ring's operations and their state machine
// (include/softblk/file_engine.hpp): how each request becomes ring entries
// (or a copy on this thread), and what each completion does next (finish
// short transfers, retry EAGAIN/EINTR, fall back from ZERO_RANGE and
// uring discard). file_ring_state.hpp says how the state is kept.
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
        kernel_data(r) == nullptr) {
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
        (kernel_data(r) == nullptr &&
         (reinterpret_cast<uintptr_t>(static_cast<char*>(r.buffer) + done) &
          (f.memory_alignment() - 1)) != 0)) {
        _stats.unaligned_buffered.fetch_add(1, std::memory_order_relaxed);
        return false;
    }
    return true;
}

void file_ring::start_rw(io_request& r)
{
    if (kernel_data(r) != nullptr) {
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
    if (kernel_data(r) != nullptr && step_of(r) <= k_write_fua &&
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
        if (kernel_data(r) != nullptr) {
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

}  // namespace softblk
