// Types shared by the consumer API (device.hpp) and the provider API
// (target.hpp): the I/O request, its operations and flags, block limits and
// the control-path error type.
#pragma once

#include <cstdint>
#include <expected>
#include <string>
#include <system_error>
#include <utility>

namespace softblk {

// ---------------------------------------------------------------- errors

// Control-path error: an errno-style code plus a message a person can act
// on, e.g. "size=0: size must be at least one block (4096 bytes)".
struct error {
    std::error_code code;
    std::string message;
};

template <class T>
using result = std::expected<T, error>;

// Builds an unexpected error from an errno value and a message.
inline std::unexpected<error> make_error(int errno_value, std::string message)
{
    return std::unexpected<error>(
        error{std::error_code(errno_value, std::generic_category()), std::move(message)});
}

// ---------------------------------------------------------------- requests

// What a request asks for. Zone operations belong to the zoned targets; a
// target that is not zoned completes them with -EOPNOTSUPP.
enum class io_op : uint8_t {
    read,
    write,
    flush,
    discard,
    write_zeroes,
    zone_open,
    zone_close,
    zone_finish,
    zone_reset,
    zone_reset_all,
    zone_append,
    report_zones,
};

const char* to_string(io_op op);

// Request flags (bit set in io_request::flags).
enum io_flag : uint32_t {
    // Force unit access: the data is durable when the request completes.
    k_io_fua = 1u << 0,
    // Write zeroes: keep the blocks allocated (do not punch a hole).
    k_io_no_unmap = 1u << 1,
    // Write zeroes: fail with -EOPNOTSUPP rather than fall back to writing
    // zero buffers when zeroing is not cheap (NBD_CMD_FLAG_FAST_ZERO).
    k_io_fast_zero = 1u << 2,
};

struct io_request;

// Called once per request when it completes, on the thread that drives the
// request's queue. `result` is the number of bytes done (0 for operations
// that move no data) or a negative errno. The request may be submitted again
// from inside the callback; otherwise its tag is released when the callback
// returns.
using io_completion_fn = void (*)(io_request& request, int result);

// One I/O. Requests are preallocated per tag by the queue (io_queue::
// get_request); the consumer fills the public fields and submits.
// Offsets and lengths are in bytes and must be multiples of the device's
// logical block size.
struct io_request {
    // ---- filled by the consumer
    io_op op = io_op::read;
    uint32_t flags = 0;
    uint64_t offset = 0;
    uint32_t length = 0;
    // Data buffer of `length` bytes for read, write and zone_append; the
    // report buffer for report_zones. Owned by the consumer.
    void* buffer = nullptr;
    io_completion_fn on_complete = nullptr;
    void* user_data = nullptr;

    // ---- filled by the target on completion
    // Bytes transferred before an error (partial I/O, e.g.
    // badblocks_partial_io); equals the result on success.
    uint32_t transferred = 0;
    // zone_append: byte offset where the data landed.
    uint64_t result_offset = 0;

    // ---- owned by the core (read-only for others)
    uint32_t tag = 0;
    uint16_t queue_index = 0;
    uint8_t state = 0;
    uint8_t attempts = 0;
    uint64_t submit_ns = 0;
    uint64_t deadline_ns = 0;
    int status = 0;
    io_request* next = nullptr;  // intrusive list link, free for whoever holds the request
    // Scratch space a target or decorator may use while it holds the request.
    uint64_t target_scratch[2] = {0, 0};
};

// ---------------------------------------------------------------- geometry

// What a block device looks like to whoever uses it: the values a kernel
// front end hands to the block layer (ublk SET_PARAMS, NBD_INFO_BLOCK_SIZE).
struct block_limits {
    uint64_t capacity_bytes = 0;
    uint32_t logical_block_size = 512;
    uint32_t physical_block_size = 512;
    // Largest request in bytes (max_sectors * 512).
    uint32_t max_transfer_bytes = 0;
    // 0: operation unsupported.
    uint32_t max_discard_bytes = 0;
    uint32_t max_write_zeroes_bytes = 0;
    // Request buffers must not cross this boundary inside (0: none); the
    // kernel's virt_boundary_mask + 1.
    uint32_t virt_boundary_bytes = 0;
    bool rotational = false;
    // The device has a volatile write cache: FLUSH matters.
    bool volatile_write_cache = false;
    // FUA is honoured (as opposed to emulated with a flush by the kernel).
    bool fua = false;
    bool read_only = false;
    bool zoned = false;
};

// An extent of the allocation map: `allocated` false means a hole that
// reads as zeros (SEEK_HOLE, NBD base:allocation NBD_STATE_HOLE);
// `zero` true means it reads as zeros whether allocated or not.
struct extent {
    uint64_t offset = 0;
    uint64_t length = 0;
    bool allocated = true;
    bool zero = false;
};

}  // namespace softblk
