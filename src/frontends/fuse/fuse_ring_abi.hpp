// The kernel's FUSE-over-io_uring interface (FUSE protocol 7.42, Linux
// 6.14+, fs/fuse/dev_uring.c), which the system's <linux/fuse.h> (Debian
// 12: Linux 6.1, protocol 7.37) does not have yet. Layouts and values are
// the kernel's; the static_asserts below hold them to it.
//
// How it goes: the server makes an io_uring with 128-byte entries and
// sends IORING_OP_URING_CMD commands on /dev/fuse. REGISTER hands the
// kernel one ring entry of one queue (qid: one queue per possible CPU; a
// request goes to the queue of the CPU its sender runs on): an iovec pair,
// the 288-byte header buffer and the payload buffer. The command completes
// (res 0) when the kernel has put a request there: its fuse_in_header in
// `in_out`, the operation's fixed argument (fuse_read_in, ...) in `op_in`,
// the rest (names, write data) in the payload, with payload_sz and the
// commit_id in `ring_ent_in_out`. The server answers with
// COMMIT_AND_FETCH: fuse_out_header in `in_out`, the reply's arguments in
// the payload, their size in payload_sz, and the commit_id in the
// command; the same command then waits for the entry's next request.
// Nothing of this is used before the INIT reply carries
// FUSE_OVER_IO_URING, and REGISTER fails with EAGAIN until it was sent.
#pragma once

#include <cstddef>
#include <cstdint>

namespace softblk::fuse::ring_abi {

// fuse_init_in/out flags, bits 32..63 of which travel in flags2: the
// kernel offers the ring (enable_uring is Y) / the server will use it.
inline constexpr uint64_t k_over_io_uring = uint64_t{1} << 41;

// Commands (io_uring_sqe::cmd_op).
inline constexpr uint32_t k_cmd_register = 1;
inline constexpr uint32_t k_cmd_commit_and_fetch = 2;

// The header buffer of a ring entry (iov[0] of REGISTER).
inline constexpr size_t k_in_out_header_bytes = 128;
inline constexpr size_t k_op_in_bytes = 128;

struct entry_in_out {
    uint64_t flags;
    // What the server puts in its commit (the request's unique id).
    uint64_t commit_id;
    // Bytes used in the payload buffer: the kernel's, then the reply's.
    uint32_t payload_sz;
    uint32_t padding;
    uint64_t reserved;
};

struct request_header {
    // fuse_in_header from the kernel; fuse_out_header in the commit.
    char in_out[k_in_out_header_bytes];
    // The operation's first (fixed) argument; unused in the commit.
    char op_in[k_op_in_bytes];
    entry_in_out ring_ent_in_out;
};

// The command's data, in the 80-byte area of a 128-byte SQE.
struct cmd_req {
    uint64_t flags;
    uint64_t commit_id;  // COMMIT_AND_FETCH; 0 for REGISTER
    uint16_t qid;
    uint8_t padding[6];
};

// Commit and fetch go in one command: header and payload travel as an
// iovec pair (iov[0], iov[1]).
inline constexpr unsigned k_register_iovecs = 2;
// The SQE's command area with IORING_SETUP_SQE128.
inline constexpr size_t k_sqe128_cmd_bytes = 80;

static_assert(sizeof(entry_in_out) == 32);
static_assert(offsetof(entry_in_out, commit_id) == 8);
static_assert(offsetof(entry_in_out, payload_sz) == 16);
static_assert(sizeof(request_header) == 288);
static_assert(offsetof(request_header, op_in) == 128);
static_assert(offsetof(request_header, ring_ent_in_out) == 256);
static_assert(sizeof(cmd_req) == 24);
static_assert(offsetof(cmd_req, qid) == 16);
static_assert(sizeof(cmd_req) <= k_sqe128_cmd_bytes);

}  // namespace softblk::fuse::ring_abi
