// The core's table of operation properties (src/core/op_properties.hpp),
// which plan() and validate() both read: every io_op has its row, and each
// row says what the block layer's and the queue's checks did per op before
// the table existed.
#include <gtest/gtest.h>

#include <string>

#include <softblk/types.hpp>

#include "core/op_properties.hpp"

namespace softblk::core {
namespace {

constexpr auto none = op_payload::none;
constexpr auto data = op_payload::data;
constexpr auto report = op_payload::report;
constexpr auto pieces = op_split::pieces;
constexpr auto one_piece = op_split::one_piece;
constexpr auto never = op_split::never;
constexpr auto no_length = op_split::no_length;
constexpr auto nothing = op_result::none;
constexpr auto length = op_result::length;
constexpr auto entries = op_result::entries;
constexpr auto k_transfer = &block_limits::max_transfer_bytes;
constexpr auto k_discard = &block_limits::max_discard_bytes;
constexpr auto k_zeroes = &block_limits::max_write_zeroes_bytes;
constexpr auto k_append = &block_limits::max_zone_append_bytes;

// What each op must be, written out op by op (not from the table), in
// op_properties' field order.
// clang-format off
const op_properties k_expected[] = {
    // op                      payload split      result   chg    q_ro   zone   limit       cap    zfill  len    d<ro   incap  range  cross  zstart  off
    {io_op::read,              data,   pieces,    length,  false, false, false, k_transfer, false, false, true,  true,  false, true,  false, 0,      false},
    {io_op::write,             data,   pieces,    length,  true,  true,  false, k_transfer, false, false, true,  true,  false, true,  false, 0,      false},
    {io_op::flush,             none,   no_length, nothing, false, false, false, nullptr,    false, false, false, false, false, false, false, 0,      false},
    {io_op::discard,           none,   pieces,    length,  true,  true,  false, k_discard,  true,  false, true,  false, false, true,  false, 0,      false},
    {io_op::write_zeroes,      none,   pieces,    length,  true,  true,  false, k_zeroes,   true,  true,  true,  false, false, true,  false, 0,      false},
    {io_op::zone_open,         none,   no_length, nothing, true,  false, true,  nullptr,    false, false, false, false, true,  true,  false, EINVAL, false},
    {io_op::zone_close,        none,   no_length, nothing, true,  false, true,  nullptr,    false, false, false, false, true,  true,  false, EINVAL, false},
    {io_op::zone_finish,       none,   no_length, nothing, true,  false, true,  nullptr,    false, false, false, false, true,  true,  false, EINVAL, false},
    {io_op::zone_reset,        none,   no_length, nothing, true,  false, true,  nullptr,    false, false, false, false, true,  true,  false, EINVAL, false},
    {io_op::zone_reset_all,    none,   no_length, nothing, true,  false, true,  nullptr,    false, false, false, false, true,  false, false, 0,      false},
    {io_op::zone_append,       data,   never,     length,  true,  true,  true,  k_append,   true,  false, true,  false, false, true,  false, EIO,    true},
    {io_op::report_zones,      report, no_length, entries, false, false, true,  nullptr,    false, false, false, false, true,  false, false, 0,      false},
    {io_op::report_extents,    report, one_piece, entries, false, false, false, nullptr,    false, false, true,  false, false, true,  true,  0,      false},
};
// clang-format on

// A row as text, so that a failure shows which property differs.
std::string describe(const op_properties& p)
{
    auto limit = [](uint32_t block_limits::*l) {
        return l == nullptr      ? "none"
               : l == k_transfer ? "max_transfer"
               : l == k_discard  ? "max_discard"
               : l == k_zeroes   ? "max_write_zeroes"
               : l == k_append   ? "max_zone_append"
                                 : "other";
    };
    std::string out = std::string(to_string(p.op));
    auto add = [&](const char* name, auto value) {
        out += std::string(" ") + name + "=" + std::to_string(static_cast<int>(value));
    };
    add("payload", p.payload);
    add("split", p.split);
    add("result", p.result);
    add("changes_media", p.changes_media);
    add("queue_checks_read_only", p.queue_checks_read_only);
    add("zone_op", p.zone_op);
    out += std::string(" length_limit=") + limit(p.length_limit);
    add("limit_is_capability", p.limit_is_capability);
    add("zero_fill_fallback", p.zero_fill_fallback);
    add("needs_length", p.needs_length);
    add("data_checked_before_read_only", p.data_checked_before_read_only);
    add("offset_in_capacity", p.offset_in_capacity);
    add("checks_range", p.checks_range);
    add("may_cross_zones", p.may_cross_zones);
    add("zone_start_error", p.zone_start_error);
    add("returns_offset", p.returns_offset);
    return out;
}

TEST(op_properties, table_has_a_row_per_op_in_enum_order)
{
    static_assert(k_op_table.size() == io_op_count());
    ASSERT_EQ(std::size(k_expected), io_op_count());
    for (std::size_t i = 0; i < io_op_count(); ++i) {
        const auto op = static_cast<io_op>(i);
        ASSERT_NE(properties_of(op), nullptr) << i;
        EXPECT_EQ(properties_of(op)->op, op) << to_string(op);
        EXPECT_EQ(k_expected[i].op, op) << to_string(op);
        // Every op in the count has a name: the count is not short.
        EXPECT_STRNE(to_string(op), "unknown") << i;
    }
    // The first value past the count is no op: the count is not long, and
    // an op added to the enum (and to to_string) but not to the count
    // shows here.
    const auto past = static_cast<io_op>(io_op_count());
    EXPECT_STREQ(to_string(past), "unknown");
    EXPECT_EQ(properties_of(past), nullptr);
}

TEST(op_properties, each_op_has_the_properties_the_checks_need)
{
    for (const op_properties& e : k_expected) {
        const op_properties* p = properties_of(e.op);
        ASSERT_NE(p, nullptr) << to_string(e.op);
        EXPECT_EQ(describe(*p), describe(e));
        EXPECT_TRUE(*p == e) << describe(*p);
    }
}

TEST(op_properties, rows_are_consistent)
{
    for (const op_properties& p : k_op_table) {
        SCOPED_TRACE(to_string(p.op));
        // plan() splits by the limit: an op split in pieces has one.
        if (p.split == op_split::pieces) {
            EXPECT_NE(p.length_limit, nullptr);
        }
        // What the queue refuses on a read-only device, the block layer
        // refuses first.
        if (p.queue_checks_read_only) {
            EXPECT_TRUE(p.changes_media);
        }
        if (p.limit_is_capability || p.zero_fill_fallback) {
            EXPECT_NE(p.length_limit, nullptr);
        }
        if (p.zone_start_error != 0) {
            EXPECT_TRUE(p.zone_op);
        }
    }
}

}  // namespace
}  // namespace softblk::core
