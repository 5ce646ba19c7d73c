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

constexpr unsigned k_n = 64 * way_chooser::k_explore_every;

TEST(WayChooser, NeedsTheMarginToLeaveTheFirstWay)
{
    // Idle spin: waking up costs nothing extra when spinning brings the
    // next request only a little sooner (5%), so the thread keeps sleeping
    // and spins once in k_explore_every to keep looking.
    way_chooser c(0.9);
    EXPECT_FALSE(c.second_ahead()) << "an opinion before any measurement";
    EXPECT_EQ(run(c, 2 * way_chooser::k_warmup, 100'000, 95'000), way_chooser::k_warmup);
    EXPECT_EQ(run(c, k_n, 100'000, 95'000), k_n / way_chooser::k_explore_every);
    EXPECT_FALSE(c.second_ahead());
    // Spinning gets the next request a fifth sooner (a dear wake-up): it
    // is taken within a few explorations.
    run(c, 3 * way_chooser::k_explore_every, 100'000, 80'000);
    EXPECT_TRUE(c.second_ahead());
    EXPECT_EQ(run(c, k_n, 100'000, 80'000), k_n - k_n / way_chooser::k_explore_every);
    // And left again when it stops paying (the load moved to another CPU).
    run(c, 3 * way_chooser::k_explore_every, 100'000, 100'000);
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

}  // namespace
}  // namespace softblk::ublk
