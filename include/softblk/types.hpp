// Types shared by the consumer API (device.hpp) and the provider API
// (target.hpp): the I/O request, its operations and flags, block limits and
// the control-path error type. Data a request carries outside the process
// (ublk's zero copy and user copy) is an extension: external_data.hpp.
#pragma once

#include <atomic>
#include <cstdint>
#include <expected>
#include <string>
#include <system_error>
#include <utility>

namespace softblk {

// One mebibyte, for sizes in code and tests.
inline constexpr uint64_t k_mib = uint64_t{1} << 20;

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

// What a request asks for.
//   read, write          `length` bytes at `offset` to/from `buffer`
//   flush                make every completed write durable (offset, length 0)
//   discard              forget [offset, offset+length); reads then give zeros
//                        or old data, as the device's limits say
//   write_zeroes         make [offset, offset+length) read as zeros (flags
//                        k_io_no_unmap, k_io_fast_zero)
//   zone_open/close/finish/reset
//                        act on the zone that starts at `offset` (length 0)
//   zone_reset_all       reset every sequential zone (offset, length 0)
//   zone_append          write `length` bytes at the write pointer of the
//                        zone that starts at `offset`; where it landed comes
//                        back in `result_offset`
//   report_zones         fill `buffer` (an array of `report_capacity`
//                        zone_descriptor) with the zones from the one that
//                        holds `offset` on; the result is the number filled
//   report_extents       fill `buffer` (an array of `report_capacity` extent)
//                        with the allocation map of [offset, offset+length)
//                        from `offset` on, in order and without gaps; the
//                        result is the number filled (at least 1 when
//                        length > 0), which may cover less than the range
// Zone operations on a device that is not zoned complete with -EOPNOTSUPP.
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
    report_extents,
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
// external_data.hpp: data outside the process (ublk's zero copy and user
// copy), an extension only ublk and the targets that take it include.
struct external_data;

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
    // report_zones, report_extents: how many entries `buffer` holds.
    uint32_t report_capacity = 0;
    // Data buffer of `length` bytes for read, write and zone_append; the
    // entries of report_zones and report_extents. Owned by the consumer.
    void* buffer = nullptr;
    // Instead of `buffer`, on a device that takes it: where the data is
    // when it is outside the process's memory (external_data.hpp, the
    // ublk front end's extension). Owned by the consumer.
    const external_data* external = nullptr;
    io_completion_fn on_complete = nullptr;
    void* user_data = nullptr;

    // ---- filled by the target on completion
    // Bytes transferred before an error (partial I/O, e.g.
    // badblocks_partial_io); equals the result on success. Report
    // operations: entries filled.
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
    // The one value that may change while the device serves: a target whose
    // store is resized under it (an rbd image) reports it, and the core
    // changes the device's capacity (device::add_capacity_listener). Read
    // it with current_capacity() where I/O may run.
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

    // ---- zoned devices (the kernel's zoned block device model)
    bool zoned = false;
    // Size of every zone but possibly the last, which may be smaller; a
    // multiple of the logical block size.
    uint64_t zone_size_bytes = 0;
    // Writable bytes of a sequential zone (<= zone_size_bytes; the last zone
    // may have less). Conventional zones are writable in full.
    uint64_t zone_capacity_bytes = 0;
    // Zones at the start of the device that are conventional (random writes).
    uint32_t conventional_zones = 0;
    // Most zones open (implicitly or explicitly) / active (open or closed) at
    // once; 0: no limit.
    uint32_t max_open_zones = 0;
    uint32_t max_active_zones = 0;
    // Largest zone_append (0: zone append unsupported).
    uint32_t max_zone_append_bytes = 0;
};

// The capacity as it is now, read without a lock while the core may change
// it (block_limits::capacity_bytes). Any thread.
// The compiler's atomic built-ins rather than std::atomic_ref: the fuzzers
// build this header with clang-16's libc++, which has no atomic_ref (as the
// NBD codec's negotiated size, codec.hpp).
inline uint64_t current_capacity(const block_limits& l)
{
    return __atomic_load_n(&l.capacity_bytes, __ATOMIC_RELAXED);
}

// Sets `l.capacity_bytes` while other threads read it with
// current_capacity(). Any thread.
inline void set_capacity(block_limits& l, uint64_t bytes)
{
    __atomic_store_n(&l.capacity_bytes, bytes, __ATOMIC_RELAXED);
}

// Number of zones of a zoned device (0 for one that is not zoned).
inline uint64_t zone_count(const block_limits& l)
{
    if (!l.zoned || l.zone_size_bytes == 0) {
        return 0;
    }
    return (l.capacity_bytes + l.zone_size_bytes - 1) / l.zone_size_bytes;
}

// Zone types and conditions with the kernel's values (BLK_ZONE_TYPE_*,
// BLK_ZONE_COND_* in <linux/blkzoned.h>), so front ends pass them through.
enum class zone_type : uint8_t {
    conventional = 0x1,
    sequential_write_required = 0x2,
    sequential_write_preferred = 0x3,
};

enum class zone_condition : uint8_t {
    not_write_pointer = 0x0,  // conventional zones
    empty = 0x1,
    implicit_open = 0x2,
    explicit_open = 0x3,
    closed = 0x4,
    read_only = 0xd,
    full = 0xe,
    offline = 0xf,
};

const char* to_string(zone_type type);
const char* to_string(zone_condition condition);

// One zone as report_zones gives it. Offsets and sizes in bytes.
struct zone_descriptor {
    uint64_t start = 0;
    uint64_t length = 0;    // the zone's size
    uint64_t capacity = 0;  // writable bytes from `start`
    // Absolute byte offset of the next write, as the device's model reports
    // it: null_blk gives start + length for conventional zones and
    // UINT64_MAX for read-only and offline zones, zloop UINT64_MAX for
    // conventional and full zones (k_no_write_pointer in zone_engine.hpp).
    // Front ends pass UINT64_MAX on as "all ones" in their own unit.
    uint64_t write_pointer = 0;
    zone_type type = zone_type::sequential_write_required;
    zone_condition condition = zone_condition::empty;
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
