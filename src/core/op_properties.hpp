// What the core's checks know of each io_op, in one table: the block layer
// (plan() in bio.cpp, which splits bios) and the queue (validate() in
// queue.cpp, which checks each request before the target sees it) both
// read it, so an operation's rules are written once. Internal to src/core.
#pragma once

#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>

#include <softblk/types.hpp>

namespace softblk::core {

// The number of io_ops. The switch names every op and has no default, so
// -Wswitch (-Wall, an error with SOFTBLK_WERROR) stops the build when an op
// joins the enum without joining it; add the op at its place in k_op_table
// too, or the static_asserts below fail.
constexpr std::size_t io_op_count()
{
    constexpr io_op last = io_op::report_extents;
    switch (last) {
    case io_op::read:
    case io_op::write:
    case io_op::flush:
    case io_op::discard:
    case io_op::write_zeroes:
    case io_op::zone_open:
    case io_op::zone_close:
    case io_op::zone_finish:
    case io_op::zone_reset:
    case io_op::zone_reset_all:
    case io_op::zone_append:
    case io_op::report_zones:
    case io_op::report_extents:
        break;
    }
    return static_cast<std::size_t>(last) + 1;
}

// What a request's buffer holds.
enum class op_payload : uint8_t {
    none,    // no buffer is looked at
    data,    // `length` bytes of data: a buffer, or a kernel buffer or data
             // window where the target takes those
    report,  // up to report_capacity entries the target fills in
};

// How plan() turns a bio into requests.
enum class op_split : uint8_t {
    pieces,     // pieces of at most length_limit bytes, in offset order
    one_piece,  // one request for the whole range, its length cut to whole
                // blocks (a report may answer part of a range)
    never,      // one request as it is: its pieces could land apart
    no_length,  // one request of length 0
};

// What a bio's `transferred` says when it succeeds.
enum class op_result : uint8_t {
    none,     // 0
    length,   // the bio's length
    entries,  // the number of entries the target reported
};

struct op_properties {
    io_op op = io_op::read;
    op_payload payload = op_payload::none;
    op_split split = op_split::no_length;
    op_result result = op_result::none;
    // Changes the device: refused on a read-only one (-EPERM) before
    // anything else by plan(), as the block layer's bio_check_ro does.
    bool changes_media = false;
    // validate() refuses it on a read-only device too. Zone management
    // is left to plan() and the front end's kernel, which refuse it first.
    bool queue_checks_read_only = false;
    // Only on a zoned device (-EOPNOTSUPP elsewhere).
    bool zone_op = false;
    // The limit its length must keep (-EINVAL above); nullptr: none.
    uint32_t block_limits::*length_limit = nullptr;
    // A limit of 0 means the target has not got the operation
    // (-EOPNOTSUPP); otherwise 0 means no limit.
    bool limit_is_capability = false;
    // plan() writes zeros itself when the target has not got it (unless
    // the bio asks for k_io_fast_zero).
    bool zero_fill_fallback = false;
    // A request of length 0 is malformed (-EINVAL).
    bool needs_length = false;
    // validate() refuses a request without its data (-EINVAL) before it
    // looks at whether the device is read-only.
    bool data_checked_before_read_only = false;
    // Its offset must lie inside the device (-EIO): zone operations name
    // a zone there.
    bool offset_in_capacity = false;
    // Its range is checked against the capacity and the block size.
    bool checks_range = false;
    // Its range may span zones of a zoned device (a report reads them).
    bool may_cross_zones = false;
    // Must start at a zone's first byte; the error otherwise (positive
    // errno; 0: any offset): blkdev_zone_mgmt says -EINVAL,
    // blk_check_zone_append BLK_STS_IOERR.
    int zone_start_error = 0;
    // The request returns where it wrote (io_request::result_offset).
    bool returns_offset = false;

    friend constexpr bool operator==(const op_properties&, const op_properties&) = default;
};

namespace op_table_detail {

// read and write: data in pieces of at most max_transfer_bytes.
constexpr op_properties transfer(io_op op, bool writes)
{
    return {.op = op,
            .payload = op_payload::data,
            .split = op_split::pieces,
            .result = op_result::length,
            .changes_media = writes,
            .queue_checks_read_only = writes,
            .length_limit = &block_limits::max_transfer_bytes,
            .needs_length = true,
            .data_checked_before_read_only = true,
            .checks_range = true};
}

// discard and write_zeroes: no data; a limit that also says whether the
// target has the operation at all.
constexpr op_properties ranged(io_op op, uint32_t block_limits::*limit, bool zero_fill)
{
    return {.op = op,
            .split = op_split::pieces,
            .result = op_result::length,
            .changes_media = true,
            .queue_checks_read_only = true,
            .length_limit = limit,
            .limit_is_capability = true,
            .zero_fill_fallback = zero_fill,
            .needs_length = true,
            .checks_range = true};
}

// Zone management: open, close, finish and reset name one zone by its
// start; reset_all names the device.
constexpr op_properties zone_management(io_op op, bool one_zone)
{
    return {.op = op,
            .changes_media = true,
            .zone_op = true,
            .offset_in_capacity = true,
            .checks_range = one_zone,
            .zone_start_error = one_zone ? EINVAL : 0};
}

}  // namespace op_table_detail

// Indexed by io_op, in the enum's order.
inline constexpr std::array<op_properties, io_op_count()> k_op_table = {
    op_table_detail::transfer(io_op::read, false),
    op_table_detail::transfer(io_op::write, true),
    op_properties{.op = io_op::flush},
    op_table_detail::ranged(io_op::discard, &block_limits::max_discard_bytes, false),
    op_table_detail::ranged(io_op::write_zeroes, &block_limits::max_write_zeroes_bytes, true),
    op_table_detail::zone_management(io_op::zone_open, true),
    op_table_detail::zone_management(io_op::zone_close, true),
    op_table_detail::zone_management(io_op::zone_finish, true),
    op_table_detail::zone_management(io_op::zone_reset, true),
    op_table_detail::zone_management(io_op::zone_reset_all, false),
    // Never split: pieces of one append could land in different places.
    op_properties{.op = io_op::zone_append,
                  .payload = op_payload::data,
                  .split = op_split::never,
                  .result = op_result::length,
                  .changes_media = true,
                  .queue_checks_read_only = true,
                  .zone_op = true,
                  .length_limit = &block_limits::max_zone_append_bytes,
                  .limit_is_capability = true,
                  .needs_length = true,
                  .checks_range = true,
                  .zone_start_error = EIO,
                  .returns_offset = true},
    op_properties{.op = io_op::report_zones,
                  .payload = op_payload::report,
                  .result = op_result::entries,
                  .zone_op = true,
                  .offset_in_capacity = true},
    op_properties{.op = io_op::report_extents,
                  .payload = op_payload::report,
                  .split = op_split::one_piece,
                  .result = op_result::entries,
                  .needs_length = true,
                  .checks_range = true,
                  .may_cross_zones = true},
};

constexpr bool op_table_in_enum_order()
{
    for (std::size_t i = 0; i < k_op_table.size(); ++i) {
        if (static_cast<std::size_t>(k_op_table[i].op) != i) {
            return false;
        }
    }
    return true;
}
// A std::array of io_op_count() entries with fewer initialisers leaves the
// rest as default (io_op::read) entries: this catches a missing one too.
static_assert(op_table_in_enum_order(), "k_op_table must list every io_op in enum order");

// The properties of `op`; an op outside the enum (a corrupt request) gets
// none: plan() and validate() answer -EOPNOTSUPP as their switches did.
constexpr const op_properties* properties_of(io_op op)
{
    const auto i = static_cast<std::size_t>(op);
    return i < k_op_table.size() ? &k_op_table[i] : nullptr;
}

}  // namespace softblk::core
