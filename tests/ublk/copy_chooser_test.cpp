// The per-size choice between ublk zero copy and copying a write in
// (src/frontends/ublk/copy_chooser.hpp), with made-up timings.
#include "copy_chooser.hpp"

#include <gtest/gtest.h>

namespace softblk::ublk {
namespace {

// Runs `n` writes of `bytes` through the chooser, each taking `copied_ns`
// or `zero_copy_ns` the way it was sent; returns how many went zero copy.
unsigned run(copy_chooser& c, uint32_t bytes, unsigned n, uint64_t copied_ns, uint64_t zero_copy_ns)
{
    unsigned zero = 0;
    for (unsigned i = 0; i < n; ++i) {
        const bool z = c.zero_copy(bytes);
        zero += z ? 1 : 0;
        c.record(bytes, z, z ? zero_copy_ns : copied_ns);
    }
    return zero;
}

TEST(CopyChooser, SizeClassesArePowersOfTwoFrom4KiBTo1MiB)
{
    EXPECT_EQ(copy_chooser::class_of(512), 0u);
    EXPECT_EQ(copy_chooser::class_of(4096), 0u);
    EXPECT_EQ(copy_chooser::class_of(4097), 1u);
    EXPECT_EQ(copy_chooser::class_of(8192), 1u);
    EXPECT_EQ(copy_chooser::class_of(131072), 5u);
    EXPECT_EQ(copy_chooser::class_of(1u << 20), 8u);
    EXPECT_EQ(copy_chooser::class_of(4u << 20), 8u);
}

TEST(CopyChooser, TriesBothWaysThenTakesTheFasterPerSizeAndKeepsLooking)
{
    copy_chooser c;
    EXPECT_EQ(c.zero_copy_from(), 0u) << "an opinion before any measurement";
    // Warm-up: as many of each way, whatever they cost.
    EXPECT_EQ(run(c, 4096, 2 * copy_chooser::k_warmup, 100'000, 300'000), copy_chooser::k_warmup);
    EXPECT_EQ(run(c, 131072, 2 * copy_chooser::k_warmup, 900'000, 400'000), copy_chooser::k_warmup);
    // Then small writes are copied, large ones go zero copy, and one in
    // k_explore_every tries the other way.
    const unsigned n = 64 * copy_chooser::k_explore_every;
    EXPECT_EQ(run(c, 4096, n, 100'000, 300'000), n / copy_chooser::k_explore_every);
    EXPECT_EQ(run(c, 131072, n, 900'000, 400'000), n - n / copy_chooser::k_explore_every);
    EXPECT_EQ(c.zero_copy_from(), 131072u);

    // The machine changes (copying got cheap): the exploring writes see it
    // and the choice follows after a few of them.
    run(c, 131072, 3 * copy_chooser::k_explore_every, 100'000, 400'000);
    EXPECT_EQ(run(c, 131072, n, 100'000, 400'000), n / copy_chooser::k_explore_every);
    EXPECT_EQ(c.zero_copy_from(), 0u);
}

TEST(CopyChooser, FollowsTheLoadBackWithinAFewExplorations)
{
    // What the zoned benchmark does to one queue: 4 KiB writes at QD 32,
    // where both ways queue and zero copy is a little faster, then at QD 1,
    // where a copied write is written by the queue's thread at once and
    // takes a third of a zero-copy one.
    copy_chooser c;
    run(c, 4096, 2 * copy_chooser::k_warmup, 10'000'000, 8'000'000);
    const unsigned n = 64 * copy_chooser::k_explore_every;
    EXPECT_EQ(run(c, 4096, n, 10'000'000, 8'000'000), n - n / copy_chooser::k_explore_every);
    // At QD 1 the slow copies of QD 32 are forgotten after three exploring
    // writes, not after hundreds.
    run(c, 4096, 3 * copy_chooser::k_explore_every, 1'000'000, 3'000'000);
    EXPECT_EQ(run(c, 4096, n, 1'000'000, 3'000'000), n / copy_chooser::k_explore_every);
    // One odd exploring write (zero copy at once, say) does not throw the
    // choice over: it moves that way's mean halfway at most.
    c.record(4096, true, 0);
    EXPECT_EQ(run(c, 4096, n, 1'000'000, 3'000'000), n / copy_chooser::k_explore_every)
        << "after an outlier";
}

TEST(CopyChooser, AWriteWithOthersInFlightGoesZeroCopyUnmeasured)
{
    // Measured alone, 128 KiB writes copy faster (a copy from a fast user
    // copy, zero copy through a worker).
    copy_chooser c;
    run(c, 131072, 2 * copy_chooser::k_warmup + 64, 100'000, 400'000);
    bool timed = false;
    EXPECT_FALSE(c.zero_copy(131072, true, timed)) << "alone: the measured way";
    EXPECT_TRUE(timed);
    // With others in flight: zero copy every time, and nothing recorded,
    // so the choice for lone writes stays as measured.
    for (unsigned i = 0; i < 4 * copy_chooser::k_explore_every; ++i) {
        EXPECT_TRUE(c.zero_copy(131072, false, timed)) << "write " << i;
        EXPECT_FALSE(timed) << "write " << i;
    }
    EXPECT_EQ(c.zero_copy_from(), 0u);
    const unsigned n = 8 * copy_chooser::k_explore_every;
    EXPECT_EQ(run(c, 131072, n, 100'000, 400'000), n / copy_chooser::k_explore_every);
}

}  // namespace
}  // namespace softblk::ublk
