// The null target with zoned=1 through the in-process API: null_blk's zoned
// attributes (names, units, defaults, checks and clamps), data below and
// beyond the write pointer, zone append returning its sector through a
// request and through execute(), the core's zone checks (zone starts, one
// zone per request, bios split at zone boundaries), bad blocks applied
// after the zone checks at the sector a write really lands on (partial
// writes advance the write pointer), zone_readonly / zone_offline, and
// report_zones, reads and writes whose data is in a data_window (ublk's
// user copy) copied straight between it and the store. The zone engine's transitions have their own tests
// (tests/core/zone_engine_test.cpp).
#include "test_util.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string_view>
#include <vector>

#include <softblk/device.hpp>

using namespace softblk;
using namespace softblk::test;

namespace {

using zc = zone_condition;

// null_blk's zone sizes are in MiB, so a capacity below the size needs 2
// MiB zones: 16 MiB of 2 MiB zones with 1 MiB capacity, the first
// conventional, 4 KiB blocks.
std::vector<std::string> zoned_options(std::vector<std::string> more = {})
{
    std::vector<std::string> o{"zoned=1",         "size=16",        "zone_size=2",
                               "zone_capacity=1", "zone_nr_conv=1", "memory_backed=1",
                               "bs=4096",         "irqmode=0",      "poll_queues=0"};
    o.insert(o.end(), more.begin(), more.end());
    return o;
}

zone_descriptor zone_of(device& d, uint32_t zone)
{
    auto z = d.report_zones(uint64_t{zone} * 2 * k_mib, 1);
    EXPECT_TRUE(z) << (z ? "" : z.error().message);
    return z && !z->empty() ? (*z)[0] : zone_descriptor{};
}

int run(device& d, io_op op, uint64_t offset, uint64_t length = 0, void* buffer = nullptr,
        uint64_t* result_offset = nullptr, uint64_t* transferred = nullptr)
{
    bio b;
    b.op = op;
    b.offset = offset;
    b.length = length;
    b.buffer = buffer;
    const int rc = d.execute(b);
    if (result_offset != nullptr) {
        *result_offset = b.result_offset;
    }
    if (transferred != nullptr) {
        *transferred = b.transferred;
    }
    return rc;
}

TEST(null_zoned, geometry_from_null_blks_attributes)
{
    auto d = make_null(zoned_options({"zone_max_open=3", "zone_max_active=5"}));
    ASSERT_TRUE(d);
    const block_limits& l = d->limits();
    EXPECT_TRUE(l.zoned);
    EXPECT_EQ(l.zone_size_bytes, 2 * k_mib);
    EXPECT_EQ(l.zone_capacity_bytes, 1 * k_mib);
    EXPECT_EQ(l.conventional_zones, 1u);
    EXPECT_EQ(l.max_open_zones, 3u);
    EXPECT_EQ(l.max_active_zones, 5u);
    EXPECT_EQ(zone_count(l), 8u);
    // zone_append_max_sectors defaults to INT_MAX: bounded by the zone
    // capacity and the largest request (max_sectors 255 -> 248 at 4 KiB).
    EXPECT_EQ(l.max_zone_append_bytes, 248u * 512);
    EXPECT_EQ(l.max_discard_bytes, 0u);
    auto zones = d->report_zones(0, 16);
    ASSERT_TRUE(zones);
    ASSERT_EQ(zones->size(), 8u);
    EXPECT_EQ((*zones)[0].type, zone_type::conventional);
    EXPECT_EQ((*zones)[1].condition, zc::empty);
    EXPECT_EQ((*zones)[7].start, 14 * k_mib);
}

TEST(null_zoned, defaults_and_clamps_as_null_blk)
{
    // zone_size defaults to 256 MiB; limits at or above the sequential
    // zones are none; max_open above max_active becomes max_active;
    // zone_nr_conv is clamped to zones - 1.
    auto d = make_null({"zoned=1", "size=1024", "zone_max_open=9", "zone_max_active=4",
                        "zone_nr_conv=10", "max_sectors=2048", "zone_append_max_sectors=1001"});
    ASSERT_TRUE(d);
    const block_limits& l = d->limits();
    EXPECT_EQ(l.zone_size_bytes, 256 * k_mib);
    EXPECT_EQ(l.conventional_zones, 3u);
    EXPECT_EQ(l.max_active_zones, 0u);  // 4 >= 1 sequential zone
    EXPECT_EQ(l.max_open_zones, 0u);
    EXPECT_EQ(l.max_zone_append_bytes, 1001u * 512);
    // The clamps are written back, as null_init_zoned_dev writes them.
    EXPECT_EQ(*d->get_option("zone_nr_conv"), "3\n");
    EXPECT_EQ(*d->get_option("zone_max_active"), "0\n");
    EXPECT_EQ(*d->get_option("zone_max_open"), "0\n");
    EXPECT_EQ(*d->get_option("zone_capacity"), "256\n");
    EXPECT_EQ(*d->get_option("zone_append_max_sectors"), "1001\n");
    // Each clamp says so, as every other clamped value does (docs/null.md).
    const auto has_note = [](const auto& dev, std::string_view text) {
        return std::ranges::any_of(
            dev->notes(), [&](const std::string& n) { return n.find(text) != std::string::npos; });
    };
    EXPECT_TRUE(has_note(d, "zone_nr_conv=10 clamped to 3"));
    EXPECT_TRUE(has_note(d, "zone_max_active=4 clamped to 0"));
    EXPECT_TRUE(has_note(d, "zone_max_open=9 clamped to 0"));
    auto open_limit = make_null({"zoned=1", "size=1024", "zone_size=64", "zone_max_open=100"});
    ASSERT_TRUE(open_limit);
    EXPECT_EQ(*open_limit->get_option("zone_max_open"), "0\n");
    EXPECT_TRUE(has_note(open_limit, "zone_max_open=100 clamped to 0"));
    auto e = make_null({"zoned=1", "size=64", "zone_size=4", "zone_max_open=9", "zone_max_active=4",
                        "bs=4096", "zone_append_max_sectors=15"});
    ASSERT_TRUE(e);
    EXPECT_EQ(e->limits().max_open_zones, 4u);
    EXPECT_EQ(e->limits().max_zone_append_bytes, 8u * 512);  // whole 4 KiB blocks
    EXPECT_TRUE(has_note(e, "zone_max_open=9 clamped to 4"));
    EXPECT_TRUE(has_note(e, "zone_append_max_sectors=15 clamped to 8"));
    auto none = make_null({"zoned=1", "size=64", "zone_size=4", "zone_append_max_sectors=0"});
    ASSERT_TRUE(none);
    EXPECT_EQ(none->limits().max_zone_append_bytes, 0u);
    std::vector<char> buf(4096);
    EXPECT_EQ(run(*none, io_op::zone_append, 0, 4096, buf.data()), -EOPNOTSUPP);
}

TEST(null_zoned, refuses_what_null_blk_refuses)
{
    EXPECT_NE(create_error({"zoned=1", "size=64", "zone_size=3"}).find("power of two"),
              std::string::npos);
    EXPECT_NE(create_error({"zoned=1", "size=64", "zone_size=128"}).find("larger than the device"),
              std::string::npos);
    EXPECT_NE(create_error({"zoned=1", "size=64", "zone_size=4", "zone_capacity=8"})
                  .find("zone_capacity=8"),
              std::string::npos);
    EXPECT_NE(create_error({"zoned=1", "size=66", "zone_size=4", "zone_capacity=2"})
                  .find("smaller last zone"),
              std::string::npos);
    // zoned=0: the zone attributes are ignored (with a note), as null_blk
    // does; zoned=1: discard is ignored and reads 0 (null_config_discard).
    auto flat = make_null({"zone_size=3", "size=64"});
    ASSERT_TRUE(flat);
    EXPECT_FALSE(flat->limits().zoned);
    ASSERT_FALSE(flat->notes().empty());
    EXPECT_NE(flat->notes().front().find("zone_size=3 ignored"), std::string::npos);
    auto no_discard =
        make_null({"zoned=1", "size=64", "zone_size=4", "memory_backed=1", "discard=1"});
    ASSERT_TRUE(no_discard);
    EXPECT_EQ(no_discard->limits().max_discard_bytes, 0u);
    EXPECT_EQ(*no_discard->get_option("discard"), "0\n");
    EXPECT_NE(create_error({"zoned=1", "size=64", "zone_size=4", "memory_backed=1", "cache_size=4"})
                  .find("zoned"),
              std::string::npos);
    // A smaller last zone is fine with the full zone capacity.
    auto d = make_null({"zoned=1", "size=66", "zone_size=4"});
    ASSERT_TRUE(d);
    auto last = d->report_zones(64 * k_mib, 1);
    ASSERT_TRUE(last);
    EXPECT_EQ((*last)[0].length, 2 * k_mib);
    EXPECT_EQ((*last)[0].capacity, 2 * k_mib);
}

TEST(null_zoned, data_below_the_write_pointer_and_0xff_beyond)
{
    auto d = make_null(zoned_options());
    ASSERT_TRUE(d);
    const uint64_t z1 = 2 * k_mib;
    std::vector<char> data(16384, 'a');
    ASSERT_EQ(run(*d, io_op::write, z1, 8192, data.data()), 0);
    EXPECT_EQ(zone_of(*d, 1).condition, zc::implicit_open);
    EXPECT_EQ(zone_of(*d, 1).write_pointer, z1 + 8192);
    std::vector<char> back(16384, 0);
    ASSERT_EQ(run(*d, io_op::read, z1, 16384, back.data()), 0);
    EXPECT_EQ(std::memcmp(back.data(), data.data(), 8192), 0);
    EXPECT_EQ(back[8192], static_cast<char>(0xff));
    EXPECT_EQ(back[16383], static_cast<char>(0xff));
    // Not at the write pointer: refused, nothing written.
    EXPECT_EQ(run(*d, io_op::write, z1 + 16384, 4096, data.data()), -EIO);
    // Reset discards the data: below the new write pointer nothing, so
    // 0xff again.
    ASSERT_EQ(run(*d, io_op::zone_reset, z1), 0);
    ASSERT_EQ(run(*d, io_op::read, z1, 4096, back.data()), 0);
    EXPECT_EQ(back[0], static_cast<char>(0xff));
    // A bio larger than a request is split in order within the zone; one
    // that crosses into the next zone is split there and the second part
    // fails (not at that zone's write pointer).
    std::vector<char> big(k_mib, 'b');
    ASSERT_EQ(run(*d, io_op::write, z1, k_mib, big.data()), 0);
    EXPECT_EQ(zone_of(*d, 1).condition, zc::full);
    uint64_t done = 0;
    EXPECT_EQ(run(*d, io_op::write, 4 * k_mib - 8192, 16384, big.data(), nullptr, &done), -EIO);
    EXPECT_EQ(done, 0u);  // the first piece already failed: zone 1 is full
    // Conventional zone: random writes, reads give the data.
    ASSERT_EQ(run(*d, io_op::write, 8192, 4096, data.data()), 0);
    ASSERT_EQ(run(*d, io_op::write, 0, 4096, data.data()), 0);
    ASSERT_EQ(run(*d, io_op::read, 0, 4096, back.data()), 0);
    EXPECT_EQ(back[0], 'a');
}

TEST(null_zoned, zone_append_returns_its_sector_through_both_paths)
{
    auto d = make_null(zoned_options());
    ASSERT_TRUE(d);
    std::vector<char> data(8192, 'x');
    uint64_t where = 0;
    ASSERT_EQ(run(*d, io_op::zone_append, 4 * k_mib, 8192, data.data(), &where), 0);
    EXPECT_EQ(where, 4 * k_mib);
    ASSERT_EQ(run(*d, io_op::zone_append, 4 * k_mib, 4096, data.data(), &where), 0);
    EXPECT_EQ(where, 4 * k_mib + 8192);
    // Asynchronously on a queue.
    io_queue& q = d->queue(0);
    io_request* r = q.get_request();
    ASSERT_NE(r, nullptr);
    struct seen {
        int result = 1;
        uint64_t offset = 0;
    } s;
    r->op = io_op::zone_append;
    r->offset = 4 * k_mib;
    r->length = 4096;
    r->buffer = data.data();
    r->user_data = &s;
    r->on_complete = [](io_request& req, int result) {
        auto* p = static_cast<seen*>(req.user_data);
        p->result = result;
        p->offset = req.result_offset;
    };
    q.submit(*r);  // irqmode=0: completes inside submit
    EXPECT_EQ(s.result, 4096);
    EXPECT_EQ(s.offset, 4 * k_mib + 12288);
    // The block layer's checks: not at a zone start (-EIO), conventional
    // zone (the driver: -EIO), zone management not at a zone start (-EINVAL).
    EXPECT_EQ(run(*d, io_op::zone_append, 4 * k_mib + 4096, 4096, data.data()), -EIO);
    EXPECT_EQ(run(*d, io_op::zone_append, 0, 4096, data.data()), -EIO);
    EXPECT_EQ(run(*d, io_op::zone_open, 4 * k_mib + 4096), -EINVAL);
    EXPECT_EQ(run(*d, io_op::zone_open, 16 * k_mib), -EIO);
    std::vector<char> back(4096);
    ASSERT_EQ(run(*d, io_op::read, 4 * k_mib + 8192, 4096, back.data()), 0);
    EXPECT_EQ(back[0], 'x');
}

TEST(null_zoned, one_request_never_crosses_a_zone)
{
    auto d = make_null(zoned_options());
    ASSERT_TRUE(d);
    std::vector<char> data(8192);
    completion c = run_one(d->queue(0), io_op::read, 2 * k_mib - 4096, 8192, data.data());
    EXPECT_EQ(c.result, -EINVAL);
}

TEST(null_zoned, bad_blocks_fail_after_the_zone_checks)
{
    // Sector 4096+16 = 8 KiB into zone 1 is bad.
    auto d = make_null(zoned_options({"badblocks=+4112-4119"}));
    ASSERT_TRUE(d);
    const uint64_t z1 = 2 * k_mib;
    std::vector<char> data(16384, 'q');
    // The write starts at the wp and meets the bad block: the zone opens,
    // nothing lands (no partial I/O), -EIO.
    EXPECT_EQ(run(*d, io_op::write, z1, 16384, data.data()), -EIO);
    EXPECT_EQ(zone_of(*d, 1).condition, zc::implicit_open);
    EXPECT_EQ(zone_of(*d, 1).write_pointer, z1);
    // A write elsewhere than the wp fails on the wp check first.
    EXPECT_EQ(run(*d, io_op::write, z1 + 8192, 4096, data.data()), -EIO);
    // An append checks the sector it lands on, not the zone start.
    ASSERT_EQ(run(*d, io_op::zone_append, z1, 8192, data.data()), 0);
    EXPECT_EQ(run(*d, io_op::zone_append, z1, 4096, data.data()), -EIO);
    EXPECT_EQ(zone_of(*d, 1).write_pointer, z1 + 8192);
    nlohmann::json j;
    d->describe(j);
    EXPECT_EQ(j["target"]["badblocks"]["writes_checked_by_target"], true);
}

TEST(null_zoned, partial_bad_block_writes_advance_the_write_pointer)
{
    auto d = make_null(zoned_options({"badblocks=+4112-4119", "badblocks_partial_io=1"}));
    ASSERT_TRUE(d);
    const uint64_t z1 = 2 * k_mib;
    std::vector<char> data(16384, 'p');
    uint64_t done = 0;
    EXPECT_EQ(run(*d, io_op::write, z1, 16384, data.data(), nullptr, &done), -EIO);
    EXPECT_EQ(done, 8192u);
    EXPECT_EQ(zone_of(*d, 1).write_pointer, z1 + 8192);
    std::vector<char> back(8192);
    ASSERT_EQ(run(*d, io_op::read, z1, 8192, back.data()), 0);
    EXPECT_EQ(back[8191], 'p');
    // The zone's next write starts at the bad block: nothing lands.
    EXPECT_EQ(run(*d, io_op::zone_append, z1, 4096, data.data(), nullptr, &done), -EIO);
    EXPECT_EQ(zone_of(*d, 1).write_pointer, z1 + 8192);
    // badblocks_once clears the record met: the retry succeeds.
    auto once = make_null(
        zoned_options({"badblocks=+4112-4119", "badblocks_once=1", "badblocks_partial_io=1"}),
        "nulltest2");
    ASSERT_TRUE(once);
    EXPECT_EQ(run(*once, io_op::write, z1, 16384, data.data()), -EIO);
    EXPECT_EQ(run(*once, io_op::write, z1 + 8192, 8192, data.data()), 0);
    EXPECT_EQ(zone_of(*once, 1).write_pointer, z1 + 16384);
}

TEST(null_zoned, zone_readonly_and_zone_offline)
{
    auto d = make_null(zoned_options());
    ASSERT_TRUE(d);
    std::vector<char> data(4096, 'r');
    ASSERT_EQ(run(*d, io_op::write, 2 * k_mib, 4096, data.data()), 0);
    ASSERT_TRUE(d->set_zone_condition(2 * k_mib, zc::read_only));
    EXPECT_EQ(zone_of(*d, 1).condition, zc::read_only);
    EXPECT_EQ(zone_of(*d, 1).write_pointer, UINT64_MAX);
    EXPECT_EQ(run(*d, io_op::zone_append, 2 * k_mib, 4096, data.data()), -EIO);
    std::vector<char> back(4096);
    ASSERT_EQ(run(*d, io_op::read, 2 * k_mib, 4096, back.data()), 0);
    EXPECT_EQ(back[0], 'r');  // read-only zones keep their data
    ASSERT_TRUE(d->set_zone_condition(4 * k_mib + 512, zc::offline));
    EXPECT_EQ(run(*d, io_op::read, 4 * k_mib, 4096, back.data()), -EIO);
    EXPECT_EQ(run(*d, io_op::zone_reset, 4 * k_mib), -EIO);
    auto conv = d->set_zone_condition(0, zc::offline);
    ASSERT_FALSE(conv);
    EXPECT_EQ(conv.error().code.value(), EINVAL);
    EXPECT_NE(conv.error().message.find("conventional"), std::string::npos);
    EXPECT_FALSE(d->set_zone_condition(16 * k_mib, zc::offline));
    // Again: empty, and the data is gone.
    ASSERT_TRUE(d->set_zone_condition(2 * k_mib, zc::read_only));
    EXPECT_EQ(zone_of(*d, 1).condition, zc::empty);
    ASSERT_EQ(run(*d, io_op::read, 2 * k_mib, 4096, back.data()), 0);
    EXPECT_EQ(back[0], static_cast<char>(0xff));
    // The attribute written with what is not a sector says what it takes
    // (kstrtoull's EINVAL, as the kernel's write).
    auto negative = d->set_option("zone_readonly", "-1");
    ASSERT_FALSE(negative);
    EXPECT_EQ(negative.error().code.value(), EINVAL);
    EXPECT_NE(negative.error().message.find("zone_readonly=-1: not a sector; give a sector "
                                            "number (0 or more"),
              std::string::npos)
        << negative.error().message;
    auto plain = make_null({"size=4"}, "plain");
    ASSERT_TRUE(plain);
    EXPECT_EQ(plain->set_zone_condition(0, zc::read_only).error().code.value(), EOPNOTSUPP);
}

TEST(null_zoned, without_memory_the_zones_still_work)
{
    auto d = make_null({"zoned=1", "size=64", "zone_size=4", "zone_max_open=2", "irqmode=0"});
    ASSERT_TRUE(d);
    std::vector<char> data(4096);
    for (uint64_t zone : {1, 2, 3}) {
        ASSERT_EQ(run(*d, io_op::write, zone * 4 * k_mib, 4096, data.data()), 0);
    }
    auto zones = d->report_zones(0, 4);
    ASSERT_TRUE(zones);
    EXPECT_EQ((*zones)[0].condition, zc::empty);  // no conventional zones here
    EXPECT_EQ((*zones)[1].condition, zc::closed);
    EXPECT_EQ((*zones)[2].condition, zc::implicit_open);
    EXPECT_EQ((*zones)[3].condition, zc::implicit_open);
    EXPECT_EQ(run(*d, io_op::zone_reset_all, 0), 0);
    zones = d->report_zones(4 * k_mib, 1);
    ASSERT_TRUE(zones);
    EXPECT_EQ((*zones)[0].condition, zc::empty);
    nlohmann::json j;
    d->describe(j);
    EXPECT_EQ(j["target"]["zones"]["model"], "null_blk");
}

TEST(null_zoned, reads_writes_and_appends_through_a_data_window)
{
    auto d = make_null(zoned_options());
    ASSERT_TRUE(d);
    EXPECT_TRUE(d->takes_external_data().data_windows);
    const auto data = pattern(96 << 10, 5);
    const off_t at = 12288;  // the window's bytes start past its beginning
    window_file file(data, at);
    io_queue& q = d->queue(0);
    const uint64_t zone = 4 * k_mib;
    // 64 KiB written at the write pointer, then 32 KiB appended after it.
    const data_window first{.fd = file.fd, .offset = at};
    EXPECT_EQ(run_one_windowed(q, io_op::write, zone, 64 << 10, first).result, 64 << 10);
    const data_window rest{.fd = file.fd, .offset = at + (64 << 10)};
    const completion appended = run_one_windowed(q, io_op::zone_append, zone, 32 << 10, rest);
    EXPECT_EQ(appended.result, 32 << 10);
    EXPECT_EQ(appended.result_offset, zone + (64 << 10));
    EXPECT_EQ(read_back(*d, zone, 96 << 10), data);
    EXPECT_EQ(zone_of(*d, 2).write_pointer, zone + (96 << 10));

    // Read back through a window: below the write pointer the data, past it
    // null_blk's 0xff.
    window_file out(std::vector<char>(112 << 10, 'r'));
    const data_window into{.fd = out.fd, .offset = 0};
    EXPECT_EQ(run_one_windowed(q, io_op::read, zone, 112 << 10, into).result, 112 << 10);
    EXPECT_EQ(out.bytes(0, 96 << 10), data);
    const auto pattern_past = out.bytes(96 << 10, 16 << 10);
    EXPECT_TRUE(
        std::all_of(pattern_past.begin(), pattern_past.end(), [](char c) { return c == '\xff'; }));
    const data_window shut{.fd = -1, .offset = 0};
    EXPECT_EQ(run_one_windowed(q, io_op::read, zone, 4096, shut).result, -EBADF);

    // A window that ends early fails the write with its read's error and
    // moves no write pointer; nothing past it reads as data.
    const data_window beyond{.fd = file.fd, .offset = at + (80 << 10)};
    EXPECT_EQ(run_one_windowed(q, io_op::write, zone + (96 << 10), 32 << 10, beyond).result, -EIO);
    EXPECT_EQ(zone_of(*d, 2).write_pointer, zone + (96 << 10));
    const data_window closed{.fd = -1, .offset = 0};
    EXPECT_EQ(run_one_windowed(q, io_op::write, zone + (96 << 10), 4096, closed).result, -EBADF);
    EXPECT_EQ(zone_of(*d, 2).write_pointer, zone + (96 << 10));
    const auto past = read_back(*d, zone + (96 << 10), 4096);
    EXPECT_TRUE(std::all_of(past.begin(), past.end(), [](char c) { return c == '\xff'; }));

    // A window comes instead of a buffer, never with one.
    std::vector<char> buf(4096);
    EXPECT_EQ(run_one_windowed(q, io_op::write, zone + (96 << 10), 4096, first, buf.data()).result,
              -EINVAL);
    EXPECT_EQ(run_one_windowed(q, io_op::read, zone, 4096, into, buf.data()).result, -EINVAL);
}

TEST(null_zoned, without_memory_a_data_window_is_never_touched)
{
    auto d = make_null({"zoned=1", "size=64", "zone_size=4", "irqmode=0"});
    ASSERT_TRUE(d);
    const data_window nothing{.fd = -1, .offset = 0};
    EXPECT_EQ(run_one_windowed(d->queue(0), io_op::write, 4 * k_mib, 8192, nothing).result, 8192);
    auto zones = d->report_zones(4 * k_mib, 1);
    ASSERT_TRUE(zones);
    EXPECT_EQ((*zones)[0].write_pointer, 4 * k_mib + 8192);
}

}  // namespace
