// The two-way choice under copy_chooser and the queue thread's idle spin
// (src/frontends/ublk/way_chooser.hpp), with made-up costs.
#include "way_chooser.hpp"

#include <gtest/gtest.h>

namespace softblk::ublk {
namespace {

// `n` choices, each costing `first` or `second` the way it went; returns
// how many went the second way.
unsigned run(way_chooser& c, unsigned n, uint64_t first, uint64_t second)
{
    unsigned taken = 0;
    for (unsigned i = 0; i < n; ++i) {
        const bool s = c.take_second();
        taken += s ? 1 : 0;
        c.record(s, s ? second : first);
    }
    return taken;
}

constexpr unsigned k_every = way_chooser::config{}.explore_every;
constexpr unsigned k_n = 64 * k_every;

TEST(WayChooser, NeedsTheMarginToLeaveTheFirstWay)
{
    // Idle spin: waking up costs nothing extra when spinning brings the
    // next request only a little sooner (5%), so the thread keeps sleeping
    // and spins once in k_explore_every to keep looking.
    way_chooser c({.margin = 0.9});
    EXPECT_FALSE(c.second_ahead()) << "an opinion before any measurement";
    EXPECT_EQ(run(c, 2 * way_chooser::k_warmup, 100'000, 95'000), way_chooser::k_warmup);
    EXPECT_EQ(run(c, k_n, 100'000, 95'000), k_n / k_every);
    EXPECT_FALSE(c.second_ahead());
    // Spinning gets the next request a fifth sooner (a dear wake-up): it
    // is taken within a few explorations.
    run(c, 3 * k_every, 100'000, 80'000);
    EXPECT_TRUE(c.second_ahead());
    EXPECT_EQ(run(c, k_n, 100'000, 80'000), k_n - k_n / k_every);
    // And left again when it stops paying (the load moved to another CPU).
    run(c, 3 * k_every, 100'000, 100'000);
    EXPECT_FALSE(c.second_ahead());
}

TEST(WayChooser, WithoutAMarginTheCheaperWins)
{
    way_chooser c;
    run(c, 2 * way_chooser::k_warmup, 100'000, 99'000);
    EXPECT_TRUE(c.second_ahead());
    EXPECT_EQ(c.mean(false), 100'000.0);
    EXPECT_EQ(c.mean(true), 99'000.0);
}

TEST(WayChooser, InRunsTheFirstTakeAfterASwitchIsNotMeasured)
{
    // Each way costs 100 when taken again, 10,000 the first time after the
    // other: runs of 4 measure 100 for both, so the margin decides.
    way_chooser c({.margin = 1.0, .explore_every = 32, .run = 4});
    bool last = false;
    bool first = true;
    // Warm-up: 3 runs of each way in turn, 3 measured takes per run.
    for (unsigned i = 0; i < 24; ++i) {
        EXPECT_EQ(c.warm(), i == 23) << "take " << i << ": warm at the 8th measured of each";
        const bool s = c.take_second();
        EXPECT_EQ(s, (i / 4) % 2 == 0) << "take " << i;
        c.record(s, first || s != last ? 10'000 : (s ? 99 : 100));
        first = false;
        last = s;
    }
    EXPECT_TRUE(c.warm());
    EXPECT_EQ(c.mean(false), 100.0);
    EXPECT_EQ(c.mean(true), 99.0);
    EXPECT_TRUE(c.second_ahead());
    // Then one run of 4 of the first way in every 32 takes.
    unsigned firsts = 0;
    for (unsigned i = 0; i < 32 * 32; ++i) {
        const bool s = c.take_second();
        firsts += s ? 0 : 1;
        c.record(s, s != last ? 10'000 : (s ? 99 : 100));
        last = s;
    }
    EXPECT_EQ(firsts, 32u * 4);
    EXPECT_TRUE(c.second_ahead()) << "the switches' cost went into no mean";
}

TEST(WayChooser, TriesAWayFarBehindLessOften)
{
    // Behind by r, the other way is tried at one chance in r² (at most
    // max_stretch): its price stays small however dear it is.
    const auto explorations = [](uint64_t behind) {
        way_chooser c({.margin = 1.0, .explore_every = 32, .run = 1, .max_stretch = 8});
        run(c, 2 * way_chooser::k_warmup, 100, behind);
        return run(c, k_n, 100, behind);
    };
    EXPECT_EQ(explorations(100), k_n / k_every) << "level: tried at every chance";
    EXPECT_NEAR(explorations(110), k_n / k_every / 1.21, 1);
    EXPECT_NEAR(explorations(200), k_n / k_every / 4, 1);
    EXPECT_NEAR(explorations(10'000), k_n / k_every / 8, 1) << "at most max_stretch times rarer";

    // The default (max_stretch 1): one chance in explore_every, however far behind.
    way_chooser plain({.margin = 1.0, .explore_every = 32});
    run(plain, 2 * way_chooser::k_warmup, 100, 10'000);
    EXPECT_EQ(run(plain, k_n, 100, 10'000), k_n / k_every);
}

}  // namespace
}  // namespace softblk::ublk
