// The zone engine on its own: every transition of write, zone append, open,
// close, finish, reset and reset all, the open/active limits with the zone
// each model closes to make room, the errors, capacity below the zone size,
// conventional zones, a smaller last zone, reads beyond the write pointer,
// read-only/offline zones, and the zloop model's LRU, missing capacity check,
// failed-write refresh and restore from stored sizes. Expected values come
// from reading drivers/block/null_blk/zoned.c (6.12) and drivers/block/zloop.c
// (7.3); the VM lab compares the same sequences with the kernel's drivers.
#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>
#include <softblk/zone_engine.hpp>

using namespace softblk;

namespace {

constexpr uint64_t k_kib = 1024;
constexpr uint64_t k_zone = 64 * k_kib;
constexpr uint32_t k_block = 4096;
// The values blk_status_to_errno gives (x86-64): 109 and 75.
static_assert(k_zone_open_resource_error == 109 && k_zone_active_resource_error == 75);
constexpr int k_open_err = -k_zone_open_resource_error;
constexpr int k_active_err = -k_zone_active_resource_error;

// Remembers what the engine asks of the target; can be told to fail. The
// engine calls it from several threads in the concurrency test.
struct fake_backend final : zone_backend {
    std::mutex lock;
    std::vector<uint32_t> resets;
    std::vector<uint32_t> finishes;
    std::map<uint32_t, int64_t> stored;
    int reset_result = 0;
    int finish_result = 0;
    int reset_zone(uint32_t zone) override
    {
        std::lock_guard guard(lock);
        resets.push_back(zone);
        return reset_result;
    }
    int finish_zone(uint32_t zone) override
    {
        std::lock_guard guard(lock);
        finishes.push_back(zone);
        return finish_result;
    }
    int64_t stored_bytes(uint32_t zone) override
    {
        std::lock_guard guard(lock);
        auto it = stored.find(zone);
        return it == stored.end() ? -EIO : it->second;
    }
};

struct engine_fixture {
    fake_backend backend;
    std::unique_ptr<zone_engine> e;

    explicit engine_fixture(zone_engine_config c)
    {
        auto r = zone_engine::create(c, &backend);
        EXPECT_TRUE(r) << (r ? "" : r.error().message);
        if (r) {
            e = std::move(*r);
        }
    }

    uint64_t start(uint32_t zone) const { return uint64_t{zone} * k_zone; }

    // A write of `length` bytes at `offset` whose data all lands.
    int write(uint64_t offset, uint64_t length)
    {
        io_request r;
        r.op = io_op::write;
        r.offset = offset;
        r.length = static_cast<uint32_t>(length);
        zone_hold h;
        const int rc = e->begin_write(r, h);
        if (rc == 0) {
            e->end_write(h, length);
        }
        return rc;
    }
    // Writes `blocks` blocks at the zone's write pointer.
    int fill(uint32_t zone, uint64_t blocks)
    {
        return write(report(zone).write_pointer, blocks * k_block);
    }
    int append(uint32_t zone, uint64_t length, uint64_t* where = nullptr)
    {
        io_request r;
        r.op = io_op::zone_append;
        r.offset = start(zone);
        r.length = static_cast<uint32_t>(length);
        zone_hold h;
        const int rc = e->begin_write(r, h);
        if (rc == 0) {
            if (where != nullptr) {
                *where = h.offset;
            }
            e->end_write(h, length);
        }
        return rc;
    }
    int manage(io_op op, uint32_t zone)
    {
        io_request r;
        r.op = op;
        r.offset = start(zone);
        return e->manage(r);
    }
    int open(uint32_t zone) { return manage(io_op::zone_open, zone); }
    int close(uint32_t zone) { return manage(io_op::zone_close, zone); }
    int finish(uint32_t zone) { return manage(io_op::zone_finish, zone); }
    int reset(uint32_t zone) { return manage(io_op::zone_reset, zone); }
    int reset_all() { return manage(io_op::zone_reset_all, 0); }
    zone_descriptor report(uint32_t zone)
    {
        zone_descriptor d;
        EXPECT_EQ(e->report(zone, &d, 1), 1u);
        return d;
    }
    zone_condition cond(uint32_t zone) { return report(zone).condition; }
    uint64_t wp(uint32_t zone) { return report(zone).write_pointer; }
    int read(uint64_t offset, uint32_t length)
    {
        io_request r;
        r.op = io_op::read;
        r.offset = offset;
        r.length = length;
        zone_hold h;
        const int rc = e->begin_read(r, h);
        if (rc >= 0) {
            e->end_read(h);
        }
        return rc;
    }
};

// 8 zones of 64 KiB with 48 KiB capacity, zone 0 conventional.
zone_engine_config null_config(uint32_t max_open = 0, uint32_t max_active = 0)
{
    zone_engine_config c;
    c.flavor = zone_flavor::null_blk;
    c.capacity_bytes = 8 * k_zone;
    c.zone_size_bytes = k_zone;
    c.zone_capacity_bytes = 48 * k_kib;
    c.conventional_zones = 1;
    c.max_open_zones = max_open;
    c.max_active_zones = max_active;
    c.block_size = k_block;
    return c;
}

zone_engine_config zloop_config(uint32_t max_open = 0, uint32_t max_active = 0)
{
    zone_engine_config c = null_config(max_open, max_active);
    c.flavor = zone_flavor::zloop;
    c.lock_reads = false;
    return c;
}

using zc = zone_condition;

// ---------------------------------------------------------------- geometry

TEST(zone_engine, geometry_and_report)
{
    engine_fixture f(null_config());
    ASSERT_EQ(f.e->zone_count(), 8u);
    const zone_descriptor conv = f.report(0);
    EXPECT_EQ(conv.type, zone_type::conventional);
    EXPECT_EQ(conv.condition, zc::not_write_pointer);
    EXPECT_EQ(conv.capacity, k_zone);
    EXPECT_EQ(conv.write_pointer, k_zone);  // null_blk: start + length
    const zone_descriptor seq = f.report(3);
    EXPECT_EQ(seq.type, zone_type::sequential_write_required);
    EXPECT_EQ(seq.condition, zc::empty);
    EXPECT_EQ(seq.start, 3 * k_zone);
    EXPECT_EQ(seq.length, k_zone);
    EXPECT_EQ(seq.capacity, 48 * k_kib);
    EXPECT_EQ(seq.write_pointer, 3 * k_zone);

    // A report from a zone on, stopping at the last one.
    zone_descriptor many[16];
    EXPECT_EQ(f.e->report(5, many, 16), 3u);
    EXPECT_EQ(many[2].start, 7 * k_zone);
    io_request r;
    r.op = io_op::report_zones;
    r.offset = 6 * k_zone + 4096;  // any byte of zone 6
    r.buffer = many;
    r.report_capacity = 16;
    EXPECT_EQ(f.e->report(r), 2);

    block_limits l;
    f.e->apply_limits(l);
    EXPECT_TRUE(l.zoned);
    EXPECT_EQ(l.zone_size_bytes, k_zone);
    EXPECT_EQ(l.zone_capacity_bytes, 48 * k_kib);
    EXPECT_EQ(l.conventional_zones, 1u);
}

TEST(zone_engine, smaller_last_zone)
{
    zone_engine_config c = null_config();
    c.zone_capacity_bytes = 0;  // = zone size
    c.capacity_bytes = 4 * k_zone + 16 * k_kib;
    engine_fixture f(c);
    ASSERT_EQ(f.e->zone_count(), 5u);
    EXPECT_EQ(f.report(4).length, 16 * k_kib);
    EXPECT_EQ(f.report(4).capacity, 16 * k_kib);
    EXPECT_EQ(f.report(3).capacity, k_zone);
    EXPECT_EQ(f.fill(4, 4), 0);
    EXPECT_EQ(f.cond(4), zc::full);
    EXPECT_EQ(f.wp(4), 4 * k_zone + 16 * k_kib);
    EXPECT_EQ(f.finish(3), 0);
    EXPECT_EQ(f.wp(3), 4 * k_zone);
}

// The zone descriptors count against a memory budget while the engine
// lives; a geometry whose descriptors do not fit is refused with ENOMEM
// naming them (null_blk's 2^32 - 2 zones are 256 GiB of them), never
// allocated or thrown as std::bad_alloc.
TEST(zone_engine, descriptors_are_charged_to_the_budget_and_refused_past_it)
{
    memory_budget budget(1 << 20);
    zone_engine_config c = null_config();
    c.budget = &budget;
    {
        auto e = zone_engine::create(c);
        ASSERT_TRUE(e) << e.error().message;
        EXPECT_GE((*e)->memory_bytes(), 8 * 32u);
        EXPECT_EQ(budget.used(), (*e)->memory_bytes());
    }
    EXPECT_EQ(budget.used(), 0u);
    c = zone_engine_config{};
    c.block_size = k_block;
    c.zone_size_bytes = k_block;
    c.capacity_bytes = (uint64_t{UINT32_MAX} - 1) * k_block;
    c.budget = &budget;
    auto r = zone_engine::create(c);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code.value(), ENOMEM);
    const std::string& message = r.error().message;
    EXPECT_NE(message.find("4294967294 zone descriptors"), std::string::npos) << message;
    EXPECT_NE(message.find("memory_limit of 1.0 MiB"), std::string::npos) << message;
    EXPECT_EQ(budget.used(), 0u);
    // Without a budget of its own: the process's.
    const uint64_t before = process_memory_budget().used();
    auto e = zone_engine::create(null_config());
    ASSERT_TRUE(e);
    EXPECT_EQ(process_memory_budget().used(), before + (*e)->memory_bytes());
    e->reset();
    EXPECT_EQ(process_memory_budget().used(), before);
}

TEST(zone_engine, creation_errors_name_the_field)
{
    zone_engine_config c = null_config();
    c.zone_size_bytes = 48 * k_kib;
    EXPECT_FALSE(zone_engine::create(c));
    c = null_config();
    c.zone_capacity_bytes = 2 * k_zone;
    auto r = zone_engine::create(c);
    ASSERT_FALSE(r);
    EXPECT_NE(r.error().message.find("zone capacity"), std::string::npos);
    c = null_config();
    c.conventional_zones = 8;
    r = zone_engine::create(c);
    ASSERT_FALSE(r);
    EXPECT_NE(r.error().message.find("conventional"), std::string::npos);
    c = zloop_config(8);  // 7 sequential zones
    r = zone_engine::create(c);
    ASSERT_FALSE(r);
    EXPECT_NE(r.error().message.find("max_open_zones"), std::string::npos);
    c = zloop_config(3, 2);
    EXPECT_FALSE(zone_engine::create(c));
}

TEST(zone_engine, null_blk_normalises_limits)
{
    // 7 sequential zones: a limit of 7 or more is no limit; open <= active.
    engine_fixture none(null_config(7, 9));
    EXPECT_EQ(none.e->effective().max_open_zones, 0u);
    EXPECT_EQ(none.e->effective().max_active_zones, 0u);
    engine_fixture clamp(null_config(5, 3));
    EXPECT_EQ(clamp.e->effective().max_open_zones, 3u);
    EXPECT_EQ(clamp.e->effective().max_active_zones, 3u);
    engine_fixture open_only(null_config(6, 0));
    EXPECT_EQ(open_only.e->effective().max_open_zones, 6u);
}

// ---------------------------------------------------------------- writes

TEST(zone_engine, null_writes_only_at_the_write_pointer_and_within_capacity)
{
    engine_fixture f(null_config());
    EXPECT_EQ(f.write(f.start(2) + k_block, k_block), -EIO);  // not at the wp
    EXPECT_EQ(f.cond(2), zc::empty);
    EXPECT_EQ(f.write(f.start(2), 2 * k_block), 0);
    EXPECT_EQ(f.cond(2), zc::implicit_open);
    EXPECT_EQ(f.wp(2), f.start(2) + 2 * k_block);
    EXPECT_EQ(f.write(f.start(2), k_block), -EIO);  // behind the wp
    // 48 KiB capacity: 10 more blocks do not fit, 9 do and fill the zone.
    EXPECT_EQ(f.write(f.wp(2), 11 * k_block), -EIO);
    EXPECT_EQ(f.cond(2), zc::implicit_open);
    EXPECT_EQ(f.write(f.wp(2), 10 * k_block), 0);
    EXPECT_EQ(f.cond(2), zc::full);
    EXPECT_EQ(f.wp(2), f.start(2) + 48 * k_kib);  // start + capacity
    EXPECT_EQ(f.write(f.start(2) + 48 * k_kib, k_block), -EIO);
    // Conventional zones take writes anywhere, any number of times.
    EXPECT_EQ(f.write(7 * k_block, k_block), 0);
    EXPECT_EQ(f.write(7 * k_block, k_block), 0);
    EXPECT_EQ(f.cond(0), zc::not_write_pointer);
}

TEST(zone_engine, zone_append_returns_the_sector_it_wrote)
{
    engine_fixture f(null_config());
    uint64_t where = 0;
    EXPECT_EQ(f.append(3, 2 * k_block, &where), 0);
    EXPECT_EQ(where, f.start(3));
    EXPECT_EQ(f.append(3, 3 * k_block, &where), 0);
    EXPECT_EQ(where, f.start(3) + 2 * k_block);
    EXPECT_EQ(f.cond(3), zc::implicit_open);
    EXPECT_EQ(f.append(3, 8 * k_block), -EIO);  // 5 + 8 blocks > 12
    EXPECT_EQ(f.append(3, 7 * k_block, &where), 0);
    EXPECT_EQ(f.cond(3), zc::full);
    EXPECT_EQ(f.append(3, k_block), -EIO);
    EXPECT_EQ(f.append(0, k_block), -EIO);  // conventional
    EXPECT_EQ(f.finish(4), 0);
    EXPECT_EQ(f.append(4, k_block), -EIO);  // finished: wp at start + length
}

TEST(zone_engine, partial_write_moves_the_write_pointer_over_what_landed)
{
    engine_fixture f(null_config());
    io_request r;
    r.op = io_op::write;
    r.offset = f.start(2);
    r.length = 4 * k_block;
    zone_hold h;
    ASSERT_EQ(f.e->begin_write(r, h), 0);
    EXPECT_TRUE(h.locked);  // the zone stays locked while the data moves
    f.e->end_write(h, k_block);
    EXPECT_EQ(f.wp(2), f.start(2) + k_block);
    EXPECT_EQ(f.cond(2), zc::implicit_open);
    // Nothing landed: still implicitly open, the wp where it was.
    r.offset = f.wp(2);
    ASSERT_EQ(f.e->begin_write(r, h), 0);
    f.e->end_write(h, 0);
    EXPECT_EQ(f.wp(2), f.start(2) + k_block);
}

TEST(zone_engine, reads_beyond_the_write_pointer)
{
    engine_fixture f(null_config());
    ASSERT_EQ(f.fill(2, 2), 0);
    EXPECT_EQ(f.read(f.start(2), 2 * k_block), static_cast<int>(2 * k_block));
    EXPECT_EQ(f.read(f.start(2), 4 * k_block), static_cast<int>(2 * k_block));
    EXPECT_EQ(f.read(f.start(2) + 3 * k_block, k_block), 0);
    EXPECT_EQ(f.read(f.start(0), 4 * k_block), static_cast<int>(4 * k_block));
    // zloop reads the store whatever the wp (its file gives zeros).
    engine_fixture z(zloop_config());
    EXPECT_EQ(z.read(z.start(2), 4 * k_block), static_cast<int>(4 * k_block));
}

// ---------------------------------------------------------------- management

TEST(zone_engine, null_open_close_finish_reset_transitions)
{
    engine_fixture f(null_config());
    // open: empty, implicitly open and closed zones become explicitly open.
    EXPECT_EQ(f.open(1), 0);
    EXPECT_EQ(f.cond(1), zc::explicit_open);
    EXPECT_EQ(f.open(1), 0);  // again: not an error
    ASSERT_EQ(f.fill(2, 1), 0);
    EXPECT_EQ(f.open(2), 0);
    EXPECT_EQ(f.cond(2), zc::explicit_open);
    ASSERT_EQ(f.fill(3, 1), 0);
    ASSERT_EQ(f.close(3), 0);
    EXPECT_EQ(f.cond(3), zc::closed);
    EXPECT_EQ(f.open(3), 0);
    EXPECT_EQ(f.cond(3), zc::explicit_open);
    EXPECT_EQ(f.open(0), -EIO);  // conventional
    // close: without data back to empty, with data closed.
    EXPECT_EQ(f.close(1), 0);
    EXPECT_EQ(f.cond(1), zc::empty);
    EXPECT_EQ(f.close(1), -EIO);  // empty
    EXPECT_EQ(f.close(3), 0);
    EXPECT_EQ(f.cond(3), zc::closed);
    EXPECT_EQ(f.close(3), 0);  // closed again: not an error
    EXPECT_EQ(f.close(0), -EIO);
    // finish: any zone becomes full with the wp at start + length.
    EXPECT_EQ(f.finish(3), 0);
    EXPECT_EQ(f.cond(3), zc::full);
    EXPECT_EQ(f.wp(3), f.start(4));
    EXPECT_EQ(f.finish(3), 0);
    EXPECT_EQ(f.finish(5), 0);  // empty
    EXPECT_EQ(f.cond(5), zc::full);
    EXPECT_EQ(f.open(5), -EIO);   // full
    EXPECT_EQ(f.close(5), -EIO);  // full
    EXPECT_EQ(f.finish(0), -EIO);
    // reset: empty again, data discarded after the state changed.
    EXPECT_EQ(f.reset(3), 0);
    EXPECT_EQ(f.cond(3), zc::empty);
    EXPECT_EQ(f.wp(3), f.start(3));
    EXPECT_EQ(f.reset(4), 0);  // empty: not an error
    EXPECT_EQ(f.reset(0), -EIO);
    EXPECT_EQ(f.backend.resets, (std::vector<uint32_t>{3, 4}));
    // reset all: every sequential zone not empty.
    f.backend.resets.clear();
    EXPECT_EQ(f.reset_all(), 0);
    EXPECT_EQ(f.backend.resets, (std::vector<uint32_t>{2, 5}));
    for (uint32_t z = 1; z < 8; ++z) {
        EXPECT_EQ(f.cond(z), zc::empty) << z;
    }
}

TEST(zone_engine, zone_full_starts_every_sequential_zone_full)
{
    zone_engine_config c = null_config();
    c.start_full = true;
    engine_fixture f(c);
    EXPECT_EQ(f.cond(0), zc::not_write_pointer);
    EXPECT_EQ(f.cond(1), zc::full);
    EXPECT_EQ(f.wp(1), f.start(1) + 48 * k_kib);
    EXPECT_EQ(f.write(f.start(1), k_block), -EIO);
    EXPECT_EQ(f.reset(1), 0);
    EXPECT_EQ(f.write(f.start(1), k_block), 0);
}

// ---------------------------------------------------------------- limits

TEST(zone_engine, null_open_limit_closes_implicitly_open_zones_round_robin)
{
    engine_fixture f(null_config(2));
    ASSERT_EQ(f.fill(1, 1), 0);
    ASSERT_EQ(f.fill(2, 1), 0);
    // The third implicit open closes the first implicitly open zone from
    // the first sequential zone on.
    ASSERT_EQ(f.fill(3, 1), 0);
    EXPECT_EQ(f.cond(1), zc::closed);
    EXPECT_EQ(f.cond(2), zc::implicit_open);
    EXPECT_EQ(f.cond(3), zc::implicit_open);
    // The search goes on after the zone closed last: zone 2, then 3.
    ASSERT_EQ(f.fill(4, 1), 0);
    EXPECT_EQ(f.cond(2), zc::closed);
    ASSERT_EQ(f.fill(1, 1), 0);  // a closed zone opens too, closing zone 3
    EXPECT_EQ(f.cond(3), zc::closed);
    EXPECT_EQ(f.cond(1), zc::implicit_open);
    ASSERT_EQ(f.fill(5, 1), 0);  // from zone 4 on: zone 4
    EXPECT_EQ(f.cond(4), zc::closed);
    EXPECT_EQ(f.e->stats().implicit_closes, 4u);
    // Explicitly open zones are never closed: with both slots explicit,
    // another open fails with the open resource error.
    ASSERT_EQ(f.open(1), 0);
    ASSERT_EQ(f.open(5), 0);
    EXPECT_EQ(f.fill(6, 1), k_open_err);
    EXPECT_EQ(f.cond(6), zc::empty);
    EXPECT_EQ(f.open(6), k_open_err);
    EXPECT_EQ(f.open(2), k_open_err);    // closed
    EXPECT_EQ(f.finish(2), k_open_err);  // null_blk finishes through the open check
    // An explicit open closes an implicitly open zone like a write does.
    ASSERT_EQ(f.close(5), 0);
    ASSERT_EQ(f.fill(6, 1), 0);
    EXPECT_EQ(f.open(7), 0);
    EXPECT_EQ(f.cond(6), zc::closed);
}

TEST(zone_engine, null_active_limit)
{
    engine_fixture f(null_config(2, 3));
    ASSERT_EQ(f.fill(1, 1), 0);
    ASSERT_EQ(f.fill(2, 1), 0);
    ASSERT_EQ(f.fill(3, 1), 0);  // closes zone 1: 1 closed + 2 open = 3 active
    EXPECT_EQ(f.cond(1), zc::closed);
    EXPECT_EQ(f.fill(4, 1), k_active_err);  // an empty zone would be a fourth
    EXPECT_EQ(f.cond(4), zc::empty);
    EXPECT_EQ(f.open(4), k_active_err);
    EXPECT_EQ(f.finish(4), k_active_err);  // null_blk checks resources to finish an empty zone
    // A closed zone stays active when it opens, but closing an implicitly
    // open zone to make room is refused at the active limit.
    EXPECT_EQ(f.fill(1, 1), k_open_err);
    EXPECT_EQ(f.e->stats().active_refused, 3u);
    // Finishing an open zone frees both limits.
    ASSERT_EQ(f.finish(2), 0);
    ASSERT_EQ(f.fill(1, 1), 0);
    ASSERT_EQ(f.finish(1), 0);
    ASSERT_EQ(f.fill(4, 1), 0);
    // Filling a zone frees its slots; an explicit open closes an
    // implicitly open zone when the active limit allows.
    ASSERT_EQ(f.fill(3, 11), 0);
    EXPECT_EQ(f.cond(3), zc::full);
    ASSERT_EQ(f.fill(5, 1), 0);
    EXPECT_EQ(f.open(6), 0);  // closes zone 4: 3 active
    EXPECT_EQ(f.cond(4), zc::closed);
    EXPECT_EQ(f.open(7), k_active_err);
    ASSERT_EQ(f.reset(4), 0);
    EXPECT_EQ(f.open(7), 0);
    EXPECT_EQ(f.cond(5), zc::closed);
}

TEST(zone_engine, limits_off_keep_no_counts)
{
    // Without limits null_blk keeps no counters: finishing and resetting
    // any condition works and nothing is ever refused.
    engine_fixture f(null_config());
    for (uint32_t z = 1; z < 8; ++z) {
        ASSERT_EQ(f.open(z), 0);
    }
    for (uint32_t z = 1; z < 8; ++z) {
        ASSERT_EQ(f.fill(z, 1), 0);
    }
    EXPECT_EQ(f.e->stats().implicit_closes, 0u);
    nlohmann::json j;
    f.e->describe(j);
    EXPECT_EQ(j["zones"]["explicit_open"], 7);
}

// ---------------------------------------------------------------- read-only / offline

TEST(zone_engine, read_only_and_offline_zones)
{
    engine_fixture f(null_config());
    ASSERT_EQ(f.fill(2, 3), 0);
    ASSERT_TRUE(f.e->set_condition(f.start(2) + 512, zc::read_only));
    EXPECT_EQ(f.cond(2), zc::read_only);
    EXPECT_EQ(f.wp(2), k_no_write_pointer);
    EXPECT_EQ(f.write(f.start(2), k_block), -EIO);
    EXPECT_EQ(f.append(2, k_block), -EIO);
    EXPECT_EQ(f.read(f.start(2), 8 * k_block), static_cast<int>(8 * k_block));
    for (io_op op : {io_op::zone_open, io_op::zone_close, io_op::zone_finish, io_op::zone_reset}) {
        EXPECT_EQ(f.manage(op, 2), -EIO);
    }
    ASSERT_TRUE(f.e->set_condition(f.start(3), zc::offline));
    EXPECT_EQ(f.read(f.start(3), k_block), -EIO);
    EXPECT_EQ(f.reset_all(), 0);  // skips read-only and offline zones
    EXPECT_EQ(f.cond(2), zc::read_only);
    EXPECT_EQ(f.cond(3), zc::offline);
    // Asking again for the same condition: empty again, data discarded.
    f.backend.resets.clear();
    ASSERT_TRUE(f.e->set_condition(f.start(2), zc::read_only));
    EXPECT_EQ(f.cond(2), zc::empty);
    EXPECT_EQ(f.wp(2), f.start(2));
    EXPECT_EQ(f.backend.resets, std::vector<uint32_t>{2});
    // Offline over read-only and back.
    ASSERT_TRUE(f.e->set_condition(f.start(2), zc::read_only));
    ASSERT_TRUE(f.e->set_condition(f.start(2), zc::offline));
    EXPECT_EQ(f.cond(2), zc::offline);
    // Refused: conventional zones, beyond the device, other conditions.
    auto r = f.e->set_condition(0, zc::read_only);
    ASSERT_FALSE(r);
    EXPECT_NE(r.error().message.find("conventional"), std::string::npos);
    EXPECT_FALSE(f.e->set_condition(8 * k_zone, zc::offline));
    EXPECT_FALSE(f.e->set_condition(f.start(4), zc::full));
    engine_fixture z(zloop_config());
    EXPECT_EQ(z.e->set_condition(z.start(2), zc::read_only).error().code.value(), EOPNOTSUPP);
}

TEST(zone_engine, read_only_on_a_closed_zone_at_the_open_limit_keeps_null_blks_count)
{
    // null_set_zone_cond finishes the zone first and ignores a refusal: a
    // closed zone whose finish the open limit refuses stays counted as
    // closed, which later refuses an active slot as null_blk does.
    engine_fixture f(null_config(1, 2));
    ASSERT_EQ(f.fill(1, 1), 0);
    ASSERT_EQ(f.close(1), 0);
    ASSERT_EQ(f.open(2), 0);
    ASSERT_TRUE(f.e->set_condition(f.start(1), zc::read_only));
    ASSERT_EQ(f.close(2), 0);  // empty again
    ASSERT_EQ(f.fill(3, 1), 0);
    EXPECT_EQ(f.fill(2, 1), k_active_err);
}

// ---------------------------------------------------------------- zloop

TEST(zone_engine, zloop_write_pointer_of_full_and_conventional_zones)
{
    engine_fixture f(zloop_config());
    EXPECT_EQ(f.wp(0), k_no_write_pointer);
    ASSERT_EQ(f.fill(2, 12), 0);
    EXPECT_EQ(f.cond(2), zc::full);
    EXPECT_EQ(f.wp(2), k_no_write_pointer);
    EXPECT_EQ(f.write(f.start(2) + 48 * k_kib, k_block), -EIO);
    EXPECT_EQ(f.finish(3), 0);
    EXPECT_EQ(f.wp(3), k_no_write_pointer);
    EXPECT_EQ(f.backend.finishes, std::vector<uint32_t>{3});
}

TEST(zone_engine, zloop_checks_appends_but_not_writes_against_the_capacity)
{
    engine_fixture f(zloop_config());
    ASSERT_EQ(f.fill(2, 11), 0);
    EXPECT_EQ(f.append(2, 2 * k_block), -EIO);
    // A regular write at the wp runs past the capacity, as in zloop: the
    // zone does not become full and stays open.
    EXPECT_EQ(f.write(f.wp(2), 2 * k_block), 0);
    EXPECT_EQ(f.cond(2), zc::implicit_open);
    EXPECT_EQ(f.wp(2), f.start(2) + 52 * k_kib);
}

TEST(zone_engine, zloop_closes_the_least_recently_used_implicitly_open_zone)
{
    engine_fixture f(zloop_config(2));
    ASSERT_EQ(f.fill(1, 1), 0);
    ASSERT_EQ(f.fill(2, 1), 0);
    ASSERT_EQ(f.fill(1, 1), 0);  // zone 1 is now the most recently used
    ASSERT_EQ(f.fill(3, 1), 0);
    EXPECT_EQ(f.cond(2), zc::closed);
    EXPECT_EQ(f.cond(1), zc::implicit_open);
    ASSERT_EQ(f.fill(4, 1), 0);
    EXPECT_EQ(f.cond(1), zc::closed);
    // Explicit opens never close another zone: -EIO at the limit.
    EXPECT_EQ(f.open(5), -EIO);
    ASSERT_EQ(f.open(4), 0);     // already open: explicit now, moved to the back
    ASSERT_EQ(f.fill(5, 1), 0);  // closes zone 3, the only implicit one
    EXPECT_EQ(f.cond(3), zc::closed);
    ASSERT_EQ(f.open(5), 0);
    EXPECT_EQ(f.fill(6, 1), -EIO);  // nothing implicit to close
    EXPECT_EQ(f.e->stats().open_refused, 2u);
    // finish needs no resource in zloop.
    EXPECT_EQ(f.finish(6), 0);
    EXPECT_EQ(f.close(6), -EIO);  // full
    EXPECT_EQ(f.close(1), 0);     // closed: not an error
    EXPECT_EQ(f.close(7), -EIO);  // empty
    EXPECT_EQ(f.close(5), 0);
    EXPECT_EQ(f.cond(5), zc::closed);
    EXPECT_EQ(f.fill(6 - 5, 1), 0);  // zone 1 reopens in the freed slot
}

TEST(zone_engine, zloop_active_limit_is_softblks_addition)
{
    engine_fixture f(zloop_config(2, 3));
    ASSERT_EQ(f.fill(1, 1), 0);
    ASSERT_EQ(f.fill(2, 1), 0);
    ASSERT_EQ(f.fill(3, 1), 0);  // closes zone 1
    EXPECT_EQ(f.fill(4, 1), k_active_err);
    EXPECT_EQ(f.open(4), k_active_err);
    ASSERT_EQ(f.reset(1), 0);
    EXPECT_EQ(f.fill(4, 1), 0);  // closes zone 2 (LRU)
    EXPECT_EQ(f.cond(2), zc::closed);
}

TEST(zone_engine, zloop_reset_and_finish_ask_the_store_first)
{
    engine_fixture f(zloop_config());
    ASSERT_EQ(f.fill(2, 2), 0);
    EXPECT_EQ(f.reset(3), 0);  // empty: nothing to do
    EXPECT_TRUE(f.backend.resets.empty());
    f.backend.reset_result = -EIO;
    EXPECT_EQ(f.reset(2), -EIO);
    EXPECT_EQ(f.cond(2), zc::implicit_open);  // as it was, but marked failed
    // The next use re-reads the zone from the store (its file's size).
    f.backend.stored[2] = 3 * k_block;
    EXPECT_EQ(f.cond(2), zc::implicit_open);  // open zones stay open
    EXPECT_EQ(f.wp(2), f.start(2) + 3 * k_block);
    f.backend.reset_result = 0;
    EXPECT_EQ(f.reset(2), 0);
    EXPECT_EQ(f.cond(2), zc::empty);
    f.backend.finish_result = -ENOSPC;
    EXPECT_EQ(f.finish(4), -EIO);
    EXPECT_EQ(f.cond(4), zc::empty);
    f.backend.finish_result = 0;
    f.backend.stored[4] = 0;
    EXPECT_EQ(f.finish(4), 0);
    EXPECT_EQ(f.cond(4), zc::full);
    // Reset all resets every sequential zone and stops at the first failure.
    f.backend.resets.clear();
    f.backend.reset_result = -EIO;
    EXPECT_EQ(f.reset_all(), -EIO);
    EXPECT_EQ(f.backend.resets, std::vector<uint32_t>{4});
}

TEST(zone_engine, zloop_failed_write_is_reread_before_the_next_use)
{
    engine_fixture f(zloop_config());
    ASSERT_EQ(f.fill(2, 4), 0);
    f.e->write_failed(2);
    f.backend.stored[2] = 2 * k_block;  // the file says: two blocks landed
    EXPECT_EQ(f.write(f.start(2) + 4 * k_block, k_block), -EIO);
    EXPECT_EQ(f.wp(2), f.start(2) + 2 * k_block);
    EXPECT_EQ(f.e->stats().refreshed, 1u);
    // A store that cannot be read fails the I/O and stays marked.
    f.e->write_failed(3);
    EXPECT_EQ(f.read(f.start(3), k_block), -EIO);
    f.backend.stored[3] = 0;
    EXPECT_EQ(f.read(f.start(3), k_block), static_cast<int>(k_block));
    // A store that grew past the capacity or to a partial block is refused.
    f.e->write_failed(4);
    f.backend.stored[4] = 64 * k_kib;
    EXPECT_EQ(f.open(4), -EINVAL);
    f.e->write_failed(4);
    f.backend.stored[4] = 5 * k_block + 512;
    EXPECT_EQ(f.open(4), -EINVAL);
    // Refreshed to empty, closed and full.
    f.e->write_failed(5);
    f.backend.stored[5] = 48 * k_kib;
    EXPECT_EQ(f.cond(5), zc::full);
    f.e->write_failed(5);
    f.backend.stored[5] = k_block;
    EXPECT_EQ(f.cond(5), zc::closed);
}

TEST(zone_engine, restore_from_stored_sizes)
{
    engine_fixture f(zloop_config(2, 3));
    ASSERT_TRUE(f.e->restore_zone(1, 0));
    ASSERT_TRUE(f.e->restore_zone(2, 48 * k_kib));
    ASSERT_TRUE(f.e->restore_zone(3, 5 * k_block));
    ASSERT_TRUE(f.e->restore_zone(4, k_block));
    EXPECT_EQ(f.cond(1), zc::empty);
    EXPECT_EQ(f.cond(2), zc::full);
    EXPECT_EQ(f.wp(2), k_no_write_pointer);
    EXPECT_EQ(f.cond(3), zc::closed);  // open zones come back closed
    EXPECT_EQ(f.wp(3), f.start(3) + 5 * k_block);
    EXPECT_FALSE(f.e->restore_zone(5, 49 * k_kib));
    EXPECT_FALSE(f.e->restore_zone(5, 100));
    EXPECT_FALSE(f.e->restore_zone(0, 0));  // conventional
    // Restored closed zones count as active.
    ASSERT_EQ(f.fill(3, 1), 0);
    ASSERT_EQ(f.fill(4, 1), 0);
    EXPECT_EQ(f.fill(5, 1), 0);  // closes zone 3 (LRU): 2 open + 1 closed
    EXPECT_EQ(f.fill(6, 1), k_active_err);
}

// ---------------------------------------------------------------- threads

// Queues on different zones at once, with limits: every counter stays
// coherent (no zone is lost from the open or active accounting) and the
// limits hold at the end.
TEST(zone_engine, concurrent_writers_keep_the_limits)
{
    for (zone_flavor flavor : {zone_flavor::null_blk, zone_flavor::zloop}) {
        zone_engine_config c = null_config(3, 5);
        c.flavor = flavor;
        c.capacity_bytes = 64 * k_zone;
        c.zone_capacity_bytes = k_zone;
        c.lock_reads = flavor == zone_flavor::null_blk;
        engine_fixture f(c);
        std::atomic<bool> stop{false};
        std::vector<std::thread> threads;
        for (unsigned t = 0; t < 4; ++t) {
            threads.emplace_back([&, t] {
                std::mt19937 rng(t);
                while (!stop.load(std::memory_order_relaxed)) {
                    const uint32_t zone = 1 + rng() % 63;
                    switch (rng() % 8) {
                    case 0:
                        (void)f.reset(zone);
                        break;
                    case 1:
                        (void)f.finish(zone);
                        break;
                    case 2:
                        (void)f.open(zone);
                        break;
                    case 3:
                        (void)f.close(zone);
                        break;
                    default:
                        (void)f.append(zone, k_block);
                        break;
                    }
                }
            });
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        stop = true;
        for (auto& t : threads) {
            t.join();
        }
        // Empty every zone: the engine's counts must then let exactly
        // max_active zones be active again.
        ASSERT_EQ(f.reset_all(), 0);
        for (uint32_t z = 1; z < 64; ++z) {
            ASSERT_EQ(f.cond(z), zc::empty) << to_string(flavor) << " zone " << z;
        }
        for (uint32_t z = 1; z <= 5; ++z) {
            ASSERT_EQ(f.fill(z, 1), 0) << to_string(flavor) << " zone " << z;
            ASSERT_EQ(f.close(z), 0);
        }
        EXPECT_EQ(f.fill(6, 1), k_active_err) << to_string(flavor);
    }
}

}  // namespace
