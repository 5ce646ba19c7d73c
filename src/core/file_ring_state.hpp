// Private to the file engine (src/core/file_ring*.cpp): how a request's
// state is kept in io_request::target_scratch while file_ring runs it, and
// the small helpers the ring, the op state machine and the kernel-buffer
// path share.
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
#pragma once

#include <softblk/target.hpp>

#include <atomic>
#include <cstdint>
#include <sys/ioctl.h>

namespace softblk::file_ring_detail {

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

// A write whose data is in the kernel: where its buffer is (the mode bits).
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
inline uint64_t this_thread_id()
{
    static std::atomic<uint64_t> next{1};
    thread_local const uint64_t id = next.fetch_add(1, std::memory_order_relaxed);
    return id;
}

// io_uring_enter's errors that a later call may not repeat: completions
// backed up (EBUSY, until poll() reaps them), no memory for a request
// (EAGAIN), a signal (EINTR). Any other error will come back every time.
inline bool transient_enter_error(int rc)
{
    return rc == -EBUSY || rc == -EAGAIN || rc == -EINTR;
}
}  // namespace softblk::file_ring_detail
