// The core's block layer for requests of any size (bio): splitting on the
// device's limits against a model (random sizes, offsets and limits: every
// byte lands once, in order, and the byte count is exact), tag waiting,
// errors in the middle, write-zeroes emulation, and the zone API through a
// small fake zoned target (report, management, append sector through both
// the asynchronous path and execute()).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <softblk/device.hpp>
#include <softblk/target.hpp>

#include "../support/fake_zoned_target.hpp"

using namespace softblk;

namespace {

// ---------------------------------------------------------------- "split_model"
// A memory target whose limits come from its options. It logs every request
// it receives, fails (with -EIO) a write or read that covers `fail_block`
// after doing the blocks before it, and completes in the order it was told:
// at once (inline) or from poll() in reverse order (so pieces finish out of
// order).

struct piece {
    io_op op;
    uint64_t offset;
    uint32_t length;
    const void* buffer;
    uint32_t flags;
};

struct model_state {
    std::vector<uint8_t> data;
    std::vector<piece> log;
    uint64_t fail_block = UINT64_MAX;   // byte offset of a block that fails
    std::vector<unsigned> write_count;  // per block: how many times written
};

model_state& state()
{
    static model_state s;
    return s;
}

class model_queue final : public target_queue {
public:
    model_queue(const block_limits& limits, completion_sink& sink, bool delayed)
        : _limits(limits), _sink(sink), _delayed(delayed)
    {
    }

    void submit(io_request& r) override
    {
        model_state& st = state();
        st.log.push_back(piece{r.op, r.offset, r.length, r.buffer, r.flags});
        int result = run(r);
        if (_delayed) {
            r.target_scratch[0] = static_cast<uint64_t>(static_cast<int64_t>(result));
            _held.push_back(&r);
            return;
        }
        _sink.complete(r, result);
    }

    unsigned poll() override
    {
        // Last in, first out: pieces of one bio complete out of order.
        unsigned n = 0;
        while (!_held.empty()) {
            io_request* r = _held.back();
            _held.pop_back();
            _sink.complete(*r, static_cast<int>(static_cast<int64_t>(r->target_scratch[0])));
            ++n;
        }
        return n;
    }
    bool busy() const override { return !_held.empty(); }

private:
    int run(io_request& r)
    {
        model_state& st = state();
        const uint32_t bs = _limits.logical_block_size;
        switch (r.op) {
        case io_op::read:
        case io_op::write:
        case io_op::write_zeroes:
        case io_op::discard: {
            for (uint32_t done = 0; done < r.length; done += bs) {
                const uint64_t at = r.offset + done;
                if (at == st.fail_block) {
                    r.transferred = done;
                    return -EIO;
                }
                uint8_t* block = st.data.data() + at;
                if (r.op == io_op::read) {
                    std::memcpy(static_cast<char*>(r.buffer) + done, block, bs);
                } else if (r.op == io_op::write) {
                    std::memcpy(block, static_cast<const char*>(r.buffer) + done, bs);
                    ++st.write_count[at / bs];
                } else {
                    std::memset(block, 0, bs);
                    ++st.write_count[at / bs];
                }
            }
            return r.op == io_op::read || r.op == io_op::write ? static_cast<int>(r.length) : 0;
        }
        case io_op::flush:
            return 0;
        case io_op::report_extents: {
            auto* out = static_cast<extent*>(r.buffer);
            out[0] = extent{r.offset, r.length, true, false};
            return 1;
        }
        default:
            return -EOPNOTSUPP;
        }
    }

    const block_limits& _limits;
    completion_sink& _sink;
    bool _delayed;
    std::vector<io_request*> _held;
};

class model_target final : public target {
public:
    explicit model_target(const option_set& o)
    {
        _limits.logical_block_size = static_cast<uint32_t>(o.u64("bs"));
        _limits.physical_block_size = _limits.logical_block_size;
        _limits.capacity_bytes = o.u64("blocks") * _limits.logical_block_size;
        _limits.max_transfer_bytes = static_cast<uint32_t>(o.u64("max_transfer"));
        _limits.max_discard_bytes = static_cast<uint32_t>(o.u64("max_discard"));
        _limits.max_write_zeroes_bytes = static_cast<uint32_t>(o.u64("max_write_zeroes"));
        _delayed = o.flag("delayed");
        model_state& st = state();
        st.data.assign(_limits.capacity_bytes, 0);
        st.write_count.assign(o.u64("blocks"), 0);
        st.log.clear();
        st.fail_block = UINT64_MAX;
    }
    const block_limits& limits() const override { return _limits; }
    result<std::unique_ptr<target_queue>> open_queue(unsigned, completion_sink& sink) override
    {
        return std::make_unique<model_queue>(_limits, sink, _delayed);
    }

private:
    block_limits _limits;
    bool _delayed = false;
};

constexpr option_def k_model_options[] = {
    {.name = "bs", .default_value = "512", .min = 512, .max = 4096},
    {.name = "blocks", .default_value = "8192", .min = 1, .max = 1 << 20},
    {.name = "max_transfer", .default_value = "0"},
    {.name = "max_discard", .default_value = "0"},
    {.name = "max_write_zeroes", .default_value = "0"},
    {.name = "delayed", .kind = option_kind::boolean, .default_value = "0"},
};

const bool k_model_registered = register_target_type(target_type{
    .name = "split_model",
    .description = "test target of the bio tests",
    .options = k_model_options,
    .create = [](const option_set& o) -> result<std::unique_ptr<target>> {
        return std::make_unique<model_target>(o);
    },
    .submit_queues = {},
});

std::unique_ptr<device> make_model(std::vector<std::string> args)
{
    args.push_back("poll_queues=0");
    auto dev = device::create("m0", "split_model", args);
    EXPECT_TRUE(dev) << (dev ? "" : dev.error().message);
    return dev ? std::move(*dev) : nullptr;
}

struct bio_done {
    int calls = 0;
    int status = 1;
};

void count_bio(bio& b, int status)
{
    auto* d = static_cast<bio_done*>(b.user_data);
    ++d->calls;
    d->status = status;
}

// Runs queue `q` until every bio in `done` completed (or a pass makes no
// progress for too long, which fails the test).
void drain(io_queue& q, const std::vector<bio_done>& done)
{
    for (int spins = 0; spins < 100000; ++spins) {
        if (std::all_of(done.begin(), done.end(), [](const bio_done& d) { return d.calls > 0; })) {
            return;
        }
        q.wait(1, 10'000'000);
    }
    FAIL() << "bios did not complete";
}

}  // namespace

TEST(bio, registered)
{
    EXPECT_TRUE(k_model_registered);
}

// Random limits, sizes and offsets; several bios in flight on a queue with
// few tags, pieces completing inline or out of order: every byte lands
// once, in order within its bio, every piece is within the limits, the data
// reads back, and each bio completes once with its exact byte count.
TEST(bio, splitter_matches_model)
{
    std::mt19937_64 rng(20261201);
    for (int round = 0; round < 60; ++round) {
        const uint32_t bs = 512u << (rng() % 4);
        const uint64_t blocks = 2048;
        const uint32_t max_transfer =
            (rng() % 3 == 0) ? 0 : bs * static_cast<uint32_t>(1 + rng() % 37);
        const unsigned depth = 1 + static_cast<unsigned>(rng() % 6);
        const bool delayed = rng() % 2 == 0;
        const unsigned irqmode = static_cast<unsigned>(rng() % 3);
        auto dev = make_model({"bs=" + std::to_string(bs), "blocks=" + std::to_string(blocks),
                               "max_transfer=" + std::to_string(max_transfer),
                               "hw_queue_depth=" + std::to_string(depth),
                               "irqmode=" + std::to_string(irqmode), "completion_nsec=1000",
                               std::string("delayed=") + (delayed ? "1" : "0")});
        ASSERT_TRUE(dev);
        io_queue& q = dev->queue(0);
        const uint64_t capacity = blocks * bs;

        // Non-overlapping bios (sorted random cut points), written with a
        // pattern, all submitted before any completes.
        const unsigned count = 1 + static_cast<unsigned>(rng() % 8);
        std::vector<uint64_t> cuts;
        for (unsigned i = 0; i < 2 * count; ++i) {
            cuts.push_back((rng() % (blocks + 1)) * bs);
        }
        std::sort(cuts.begin(), cuts.end());
        std::vector<bio> bios(count);
        std::vector<bio_done> done(count);
        std::vector<std::vector<uint8_t>> buffers(count);
        for (unsigned i = 0; i < count; ++i) {
            bio& b = bios[i];
            b.op = io_op::write;
            b.offset = cuts[2 * i];
            b.length = std::max<uint64_t>(cuts[2 * i + 1] - cuts[2 * i], bs);
            if (b.offset + b.length > capacity) {
                b.offset = capacity - b.length;
            }
            buffers[i].resize(b.length);
            for (auto& byte : buffers[i]) {
                byte = static_cast<uint8_t>(rng());
            }
            b.buffer = buffers[i].data();
            b.on_complete = count_bio;
            b.user_data = &done[i];
        }
        // Overlapping bios would make "written once" ambiguous: drop them.
        for (unsigned i = 1; i < count; ++i) {
            if (bios[i].offset < bios[i - 1].offset + bios[i - 1].length) {
                bios[i].length = 0;
            }
        }
        std::vector<unsigned> live;
        for (unsigned i = 0; i < count; ++i) {
            if (bios[i].length != 0) {
                live.push_back(i);
            } else {
                done[i].calls = 1;
            }
        }
        state().log.clear();
        for (unsigned i : live) {
            q.submit(bios[i]);
        }
        drain(q, done);
        for (unsigned i : live) {
            const bio& b = bios[i];
            ASSERT_EQ(done[i].calls, 1) << "round " << round << " bio " << i;
            ASSERT_EQ(done[i].status, 0);
            ASSERT_EQ(b.transferred, b.length);
            // Its pieces, in submission order, tile [offset, offset+length).
            uint64_t next = b.offset;
            for (const piece& p : state().log) {
                const auto* base = static_cast<const uint8_t*>(b.buffer);
                if (p.buffer < base || p.buffer >= base + b.length) {
                    continue;
                }
                ASSERT_EQ(p.op, io_op::write);
                ASSERT_EQ(p.offset, next) << "round " << round;
                ASSERT_EQ(static_cast<const uint8_t*>(p.buffer) - base,
                          static_cast<ptrdiff_t>(p.offset - b.offset));
                ASSERT_EQ(p.length % bs, 0u);
                ASSERT_GT(p.length, 0u);
                if (max_transfer != 0) {
                    ASSERT_LE(p.length, max_transfer);
                }
                next += p.length;
            }
            ASSERT_EQ(next, b.offset + b.length);
            ASSERT_EQ(0, std::memcmp(state().data.data() + b.offset, b.buffer, b.length));
            for (uint64_t at = b.offset; at < b.offset + b.length; at += bs) {
                ASSERT_EQ(state().write_count[at / bs], 1u) << "block " << at / bs;
            }
        }
        ASSERT_EQ(q.in_flight(), 0u);

        // Read everything back in one bio, far beyond max_transfer.
        std::vector<uint8_t> all(capacity);
        bio r;
        r.op = io_op::read;
        r.offset = 0;
        r.length = capacity;
        r.buffer = all.data();
        ASSERT_EQ(dev->execute(r), 0);
        ASSERT_EQ(r.transferred, capacity);
        ASSERT_EQ(all, state().data);
    }
}

// An error in the middle: the bio completes once with that error and the
// exact number of bytes before it; no piece starts after the failure is
// known (inline completion), and nothing is left in flight.
TEST(bio, error_in_the_middle_counts_bytes_before_it)
{
    std::mt19937_64 rng(7);
    for (int round = 0; round < 40; ++round) {
        const bool delayed = rng() % 2 == 0;
        auto dev = make_model({"bs=512", "blocks=4096", "max_transfer=8192", "hw_queue_depth=4",
                               std::string("delayed=") + (delayed ? "1" : "0"), "irqmode=0"});
        ASSERT_TRUE(dev);
        const uint64_t offset = (rng() % 1024) * 512;
        const uint64_t length = (1 + rng() % 2048) * 512;
        const uint64_t fail = offset + (rng() % (length / 512)) * 512;
        state().fail_block = fail;
        std::vector<uint8_t> buf(length, 0xab);
        bio b;
        b.op = io_op::write;
        b.offset = offset;
        b.length = length;
        b.buffer = buf.data();
        bio_done d;
        b.on_complete = count_bio;
        b.user_data = &d;
        dev->queue(0).submit(b);
        while (d.calls == 0) {
            dev->queue(0).wait(1, 10'000'000);
        }
        EXPECT_EQ(d.calls, 1);
        EXPECT_EQ(d.status, -EIO);
        EXPECT_EQ(b.transferred, fail - offset) << "round " << round;
        EXPECT_EQ(dev->queue(0).in_flight(), 0u);
        // Every block before the failure was written.
        for (uint64_t at = offset; at < fail; at += 512) {
            ASSERT_EQ(state().data[at], 0xab);
        }
    }
}

TEST(bio, refused_at_once_with_the_block_layer_errors)
{
    auto dev = make_model({"bs=4096", "blocks=16", "irqmode=1"});
    ASSERT_TRUE(dev);
    std::vector<uint8_t> buf(8192);
    struct {
        io_op op;
        uint64_t offset;
        uint64_t length;
        int status;
    } cases[] = {
        {io_op::read, 512, 4096, -EINVAL},       // misaligned offset
        {io_op::read, 0, 1000, -EINVAL},         // misaligned length
        {io_op::read, 0, 0, -EINVAL},            // empty
        {io_op::read, 15 * 4096, 8192, -EIO},    // beyond the end
        {io_op::discard, 0, 4096, -EOPNOTSUPP},  // the target has no discard
        {io_op::zone_open, 0, 0, -EOPNOTSUPP},   // not zoned
        {io_op::zone_append, 0, 4096, -EOPNOTSUPP},
        {io_op::report_zones, 0, 0, -EOPNOTSUPP},
    };
    for (const auto& c : cases) {
        bio b;
        b.op = c.op;
        b.offset = c.offset;
        b.length = c.length;
        b.buffer = buf.data();
        b.report_capacity = 4;
        EXPECT_EQ(dev->execute(b), c.status)
            << to_string(c.op) << " " << c.offset << "+" << c.length;
    }
}

// Write zeroes on a target without it: written as zero buffers no larger
// than the transfer limit (and 1 MiB), keeping FUA; refused with
// -EOPNOTSUPP when the caller asks for a fast zero. On a target with write
// zeroes: passed down, split on max_write_zeroes.
TEST(bio, write_zeroes_emulated_with_zero_writes)
{
    auto dev = make_model({"bs=512", "blocks=8192", "max_transfer=65536", "irqmode=0"});
    ASSERT_TRUE(dev);
    std::vector<uint8_t> ones(4 << 20, 0xff);
    ASSERT_EQ(dev->execute(io_op::write, 0, 4 << 20, ones.data()), 4 << 20);
    state().log.clear();
    bio b;
    b.op = io_op::write_zeroes;
    b.flags = k_io_fua | k_io_no_unmap;
    b.offset = 4096;
    b.length = 3 << 20;
    ASSERT_EQ(dev->execute(b), 0);
    EXPECT_EQ(b.transferred, b.length);
    uint64_t covered = 0;
    for (const piece& p : state().log) {
        ASSERT_EQ(p.op, io_op::write);
        ASSERT_LE(p.length, 65536u);
        ASSERT_EQ(p.flags, uint32_t{k_io_fua});  // no write-zeroes flags on a write
        covered += p.length;
    }
    EXPECT_EQ(covered, b.length);
    for (uint64_t i = 0; i < (4u << 20); ++i) {
        const uint8_t expect = i >= 4096 && i < 4096 + (3u << 20) ? 0 : 0xff;
        ASSERT_EQ(state().data[i], expect) << "byte " << i;
    }

    bio fast;
    fast.op = io_op::write_zeroes;
    fast.flags = k_io_fast_zero;
    fast.offset = 0;
    fast.length = 4096;
    state().log.clear();
    EXPECT_EQ(dev->execute(fast), -EOPNOTSUPP);
    EXPECT_TRUE(state().log.empty());

    auto native = make_model({"bs=512", "blocks=8192", "max_write_zeroes=1048576", "irqmode=0"});
    ASSERT_TRUE(native);
    state().log.clear();
    bio z;
    z.op = io_op::write_zeroes;
    z.flags = k_io_fast_zero;
    z.offset = 0;
    z.length = 3 << 20;
    ASSERT_EQ(native->execute(z), 0);
    ASSERT_EQ(state().log.size(), 3u);
    for (const piece& p : state().log) {
        EXPECT_EQ(p.op, io_op::write_zeroes);
        EXPECT_EQ(p.length, 1u << 20);
        EXPECT_EQ(p.flags, uint32_t{k_io_fast_zero});
    }
}

// A queue of depth 1 with bios from several "connections": submit returns
// at once, the bios take turns at the tag (a large bio does not hold up the
// others), each bio's pieces still go out in order, and each completes once.
TEST(bio, waits_for_tags_without_blocking_and_takes_turns)
{
    auto dev = make_model({"bs=512", "blocks=1024", "max_transfer=1024", "hw_queue_depth=1",
                           "irqmode=1", "delayed=1"});
    ASSERT_TRUE(dev);
    io_queue& q = dev->queue(0);
    std::vector<uint8_t> buf(4 * 4096);
    std::vector<bio> bios(4);
    std::vector<bio_done> done(4);
    state().log.clear();
    for (unsigned i = 0; i < 4; ++i) {
        bios[i].op = io_op::read;
        bios[i].offset = i * 4096;
        bios[i].length = 4096;
        bios[i].buffer = buf.data() + i * 4096;
        bios[i].on_complete = count_bio;
        bios[i].user_data = &done[i];
        q.submit(bios[i]);  // returns at once although only one tag exists
    }
    // One piece in the target, and the four bios waiting for a tag.
    EXPECT_EQ(q.in_flight(), 5u);
    EXPECT_EQ(state().log.size(), 1u);
    drain(q, done);
    ASSERT_EQ(state().log.size(), 16u);
    std::vector<uint64_t> next = {0, 4096, 8192, 12288};
    for (size_t n = 0; n < state().log.size(); ++n) {
        const piece& p = state().log[n];
        const unsigned owner = static_cast<unsigned>(p.offset / 4096);
        EXPECT_EQ(p.offset, next[owner]) << "piece " << n;
        next[owner] += p.length;
        if (n >= 1 && n < 5) {
            // Then every bio in turn, the first one again first: no bio gets
            // a third piece before each got a second.
            EXPECT_EQ(owner, static_cast<unsigned>(n - 1)) << "piece " << n;
        }
    }
    for (unsigned i = 0; i < 4; ++i) {
        EXPECT_EQ(next[i], (i + 1) * 4096u);
        EXPECT_EQ(done[i].calls, 1);
        EXPECT_EQ(done[i].status, 0);
    }
    EXPECT_EQ(q.in_flight(), 0u);
}

// ---------------------------------------------------------------- zones
// "zoned_fake": 8 zones of 64 KiB (capacity 48 KiB), the first one
// conventional (the shared fake's default geometry), a sequential zone
// model just rich enough to show that the API carries report, management
// and append.

const bool k_zoned_registered =
    test::register_fake_zoned("zoned_fake", "fake zoned target of the bio tests", {});

TEST(zones, geometry_in_the_limits)
{
    ASSERT_TRUE(k_zoned_registered);
    auto dev = device::create("z0", "zoned_fake", std::vector<std::string>{});
    ASSERT_TRUE(dev) << dev.error().message;
    const block_limits& l = (*dev)->limits();
    EXPECT_TRUE(l.zoned);
    EXPECT_EQ(zone_count(l), 8u);
    EXPECT_EQ(l.zone_capacity_bytes, 48u << 10);
    EXPECT_EQ(l.conventional_zones, 1u);
    EXPECT_EQ(l.max_open_zones, 4u);
    EXPECT_EQ(l.max_active_zones, 6u);
    EXPECT_EQ(l.max_zone_append_bytes, 16u << 10);
}

TEST(zones, report_and_management_through_execute)
{
    auto made = device::create("z0", "zoned_fake", std::vector<std::string>{});
    ASSERT_TRUE(made);
    device& dev = **made;
    auto zones = dev.report_zones(0, 16);
    ASSERT_TRUE(zones) << zones.error().message;
    ASSERT_EQ(zones->size(), 8u);
    EXPECT_EQ((*zones)[0].type, zone_type::conventional);
    EXPECT_EQ((*zones)[1].condition, zone_condition::empty);
    EXPECT_EQ((*zones)[3].start, 3u * (64 << 10));

    const uint64_t z2 = 2 * (64 << 10);
    EXPECT_EQ(dev.execute(io_op::zone_open, z2, 0, nullptr), 0);
    EXPECT_EQ(dev.report_zones(z2, 1).value()[0].condition, zone_condition::explicit_open);
    EXPECT_EQ(dev.execute(io_op::zone_finish, z2, 0, nullptr), 0);
    auto after = dev.report_zones(z2, 2).value();
    ASSERT_EQ(after.size(), 2u);
    EXPECT_EQ(after[0].condition, zone_condition::full);
    EXPECT_EQ(after[0].write_pointer, z2 + (48 << 10));
    EXPECT_EQ(dev.execute(io_op::zone_reset, z2, 0, nullptr), 0);
    EXPECT_EQ(dev.report_zones(z2, 1).value()[0].condition, zone_condition::empty);
    EXPECT_EQ(dev.execute(io_op::zone_finish, z2, 0, nullptr), 0);
    EXPECT_EQ(dev.execute(io_op::zone_reset_all, 0, 0, nullptr), 0);
    EXPECT_EQ(dev.report_zones(z2, 1).value()[0].condition, zone_condition::empty);
    // Beyond the capacity: the block layer's -EIO.
    EXPECT_EQ(dev.execute(io_op::zone_open, 8 * (64 << 10), 0, nullptr), -EIO);
}

TEST(zones, append_returns_its_sector_through_both_paths)
{
    auto made = device::create("z0", "zoned_fake", std::vector<std::string>{"irqmode=1"});
    ASSERT_TRUE(made);
    device& dev = **made;
    const uint64_t z3 = 3 * (64 << 10);
    std::vector<uint8_t> data(16 << 10, 0x5a);

    bio a;
    a.op = io_op::zone_append;
    a.offset = z3;
    a.length = 8 << 10;
    a.buffer = data.data();
    ASSERT_EQ(dev.execute(a), 0);
    EXPECT_EQ(a.result_offset, z3);
    EXPECT_EQ(a.transferred, 8u << 10);

    bio b = a;
    bio_done done;
    b.on_complete = count_bio;
    b.user_data = &done;
    dev.queue(0).submit(b);
    while (done.calls == 0) {
        dev.queue(0).wait(1, 10'000'000);
    }
    EXPECT_EQ(done.status, 0);
    EXPECT_EQ(b.result_offset, z3 + (8 << 10));

    // Larger than max_zone_append: refused, never split.
    bio big = a;
    big.length = 32 << 10;
    EXPECT_EQ(dev.execute(big), -EINVAL);
    // Writes are split at zone boundaries: 8 KiB from the last block of the
    // conventional zone puts its second half at zone 1's write pointer.
    std::vector<uint8_t> across(8 << 10);
    EXPECT_EQ(dev.execute(io_op::write, (64 << 10) - 4096, 8 << 10, across.data()), 8 << 10);
    EXPECT_EQ(dev.report_zones(64 << 10, 1).value()[0].write_pointer, (64u << 10) + 4096);
}
