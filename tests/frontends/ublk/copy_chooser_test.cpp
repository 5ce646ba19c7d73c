// The per-size choice between ublk zero copy and copying a write in
// (src/frontends/ublk/copy_chooser.hpp), with made-up timings.
#include "copy_chooser.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <utility>

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

// Writes taken the other way in `n` after the warm-up, where that way costs
// `behind` times the favourite: runs of k_explore_run, one in
// k_explore_every times behind² (within 1 and k_max_stretch).
unsigned explored(unsigned n, double behind)
{
    const double stretch = std::clamp(behind * behind, 1.0, copy_chooser::k_max_stretch);
    const auto runs = static_cast<unsigned>(n / (copy_chooser::k_explore_every * stretch));
    return runs * copy_chooser::k_explore_run;
}
constexpr unsigned k_run = copy_chooser::k_explore_run;

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
    const unsigned w = copy_chooser::k_warmup_takes;
    EXPECT_EQ(run(c, 4096, w, 100'000, 300'000), w / 2);
    EXPECT_EQ(run(c, 131072, w, 900'000, 400'000), w / 2);
    // Then small writes are copied, large ones go zero copy, and runs try
    // the other way, rarer the further behind it is.
    const unsigned n = 64 * copy_chooser::k_explore_every;
    EXPECT_NEAR(run(c, 4096, n, 100'000, 300'000), explored(n, 3), k_run);
    EXPECT_NEAR(run(c, 131072, n, 900'000, 400'000), n - explored(n, 2.25), k_run);
    EXPECT_EQ(c.zero_copy_from(), 131072u);

    // The machine changes (copying got cheap): the next exploring run sees
    // it and the choice follows.
    const unsigned stretched = 6 * copy_chooser::k_explore_every;  // 2.25²: every 5th chance
    EXPECT_FALSE(c.zero_copy_from() == 0u);
    run(c, 131072, stretched, 100'000, 400'000);
    EXPECT_EQ(c.zero_copy_from(), 0u) << "within one stretched exploration";
    EXPECT_NEAR(run(c, 131072, n, 100'000, 400'000), explored(n, 4), k_run);
    EXPECT_EQ(c.zero_copy_from(), 0u);
}

TEST(CopyChooser, FollowsTheLoadBackWithinAFewExplorations)
{
    // What the zoned benchmark does to one queue: 4 KiB writes at QD 32,
    // where both ways queue and zero copy is a little faster, then at QD 1,
    // where a copied write is written by the queue's thread at once and
    // takes a third of a zero-copy one.
    copy_chooser c;
    run(c, 4096, copy_chooser::k_warmup_takes, 10'000'000, 8'000'000);
    const unsigned n = 64 * copy_chooser::k_explore_every;
    EXPECT_NEAR(run(c, 4096, n, 10'000'000, 8'000'000), n - explored(n, 1.25), k_run);
    // At QD 1 the slow copies of QD 32 are forgotten within one exploring
    // run (the copies 1.25 times behind are tried at every chance or the
    // next), not after hundreds of writes.
    run(c, 4096, 2 * copy_chooser::k_explore_every + k_run, 1'000'000, 3'000'000);
    EXPECT_EQ(c.zero_copy_from(), 0u);
    EXPECT_NEAR(run(c, 4096, n, 1'000'000, 3'000'000), explored(n, 3), k_run);
    // One odd exploring write (zero copy at once, say) does not throw the
    // choice over: it moves that way's mean halfway at most (and brings
    // the next exploring run closer).
    c.record(4096, true, 0);
    EXPECT_NEAR(run(c, 4096, n, 1'000'000, 3'000'000), explored(n, 3), 2 * k_run)
        << "after an outlier";
}

TEST(CopyChooser, OneSlowWriteOfTheFavouriteDoesNotHandTheChoiceOver)
{
    // The lab's 4 KiB QD 1 timings (copied 0.2 ms, zero copy 0.56 ms),
    // then one copied write of 8 ms (a preempted queue thread): it counts
    // as 0.8 ms at most, so the copied mean stays well ahead.
    const unsigned n = 64 * copy_chooser::k_explore_every;
    copy_chooser c;
    run(c, 4096, copy_chooser::k_warmup_takes + n, 200'000, 560'000);
    EXPECT_EQ(c.zero_copy_from(), 0u);
    unsigned zero = 0;
    bool outlier_recorded = false;
    for (unsigned i = 0; i < n; ++i) {
        const bool z = c.zero_copy(4096);
        zero += z ? 1 : 0;
        const bool outlier = !z && !std::exchange(outlier_recorded, true);
        c.record(4096, z, z ? 560'000 : (outlier ? 8'000'000 : 200'000));
    }
    EXPECT_NEAR(zero, explored(n, 2.8), k_run) << "only the explored runs went zero copy";

    // Uncapped, the same write moves the copied mean past zero copy's
    // ((8 - 0.2) / 16 = 0.49 ms more) until the copies explored bring it back.
    way_chooser uncapped({.margin = 1.0,
                          .explore_every = copy_chooser::k_explore_every,
                          .run = copy_chooser::k_explore_run});
    for (unsigned i = 0; i < copy_chooser::k_warmup_takes + n; ++i) {
        const bool z = uncapped.take_second();
        uncapped.record(z, z ? 560'000 : 200'000);
    }
    ASSERT_FALSE(uncapped.second_ahead());
    const bool z = uncapped.take_second();
    ASSERT_FALSE(z);
    uncapped.record(z, 8'000'000);
    EXPECT_TRUE(uncapped.second_ahead());
}

TEST(CopyChooser, AWriteWithOthersInFlightGoesZeroCopyUnmeasured)
{
    // Measured alone, 128 KiB writes copy faster (a copy from a fast user
    // copy, zero copy through a worker).
    copy_chooser c;
    run(c, 131072, copy_chooser::k_warmup_takes + 64, 100'000, 400'000);
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
    const unsigned n = 64 * copy_chooser::k_explore_every;
    EXPECT_NEAR(run(c, 131072, n, 100'000, 400'000), explored(n, 4), k_run);
}

// The VM lab's 4 KiB writes at QD 1 on ext4 (docs/benchmarks.md at
// 46583e9): copied 0.2 ms, zero copy 0.56 ms when taken again, and the
// first write after a switch of way 0.45 ms dearer; the first copied writes
// into fresh zone files take 4.5 ms. Returns how many of the last `tail`
// writes went zero copy.
unsigned lab_qd1(copy_chooser& c, unsigned n, unsigned tail)
{
    unsigned copies = 0;
    unsigned zero = 0;
    bool last = false;
    for (unsigned i = 0; i < n; ++i) {
        const bool z = c.zero_copy(4096);
        uint64_t ns = z ? 560'000 : (copies++ < 8 ? 4'500'000 : 200'000);
        if (i != 0 && z != last) {
            ns += 450'000;
        }
        last = z;
        c.record(4096, z, ns);
        zero += z && i >= n - tail ? 1 : 0;
    }
    return zero;
}

TEST(CopyChooser, AWayAheadOnlyByWhatASwitchCostsDoesNotKeepTheChoice)
{
    const unsigned n = copy_chooser::k_warmup_takes + 96 * copy_chooser::k_explore_every;
    const unsigned tail = 64 * copy_chooser::k_explore_every;
    copy_chooser c;
    EXPECT_NEAR(lab_qd1(c, n, tail), explored(tail, 2.8), k_run)
        << "copied, as it is 2.8 times as fast, with zero copy explored";
    EXPECT_EQ(c.zero_copy_from(), 0u);

    // What it did with single explored writes, each measured with the
    // switch's cost: the cold copies put zero copy ahead, and the copies
    // explored among zero-copy writes (0.65 ms) never caught up.
    way_chooser single;  // one take in 32, every take measured
    unsigned zero = 0;
    unsigned copies = 0;
    bool last = false;
    for (unsigned i = 0; i < n; ++i) {
        const bool z = single.take_second();
        uint64_t ns = z ? 560'000 : (copies++ < 8 ? 4'500'000 : 200'000);
        if (i != 0 && z != last) {
            ns += 450'000;
        }
        last = z;
        single.record(z, ns);
        zero += z && i >= n - tail ? 1 : 0;
    }
    EXPECT_GT(zero, tail / 2);
}

}  // namespace
}  // namespace softblk::ublk
