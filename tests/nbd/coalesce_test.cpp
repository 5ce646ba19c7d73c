// The receive-coalescing policy (src/frontends/nbd/coalesce.hpp) driven by
// a simulated client whose request rate depends on how long its receives
// are held back. No sockets, no clock.
#include <gtest/gtest.h>

#include <functional>

#include "coalesce.hpp"

using namespace softblk::nbd;

namespace {

constexpr uint64_t k_us = 1000;
constexpr uint64_t k_step_ns = 100 * k_us;  // one receive every 100 us

// A client: requests per second when its receives are held back for
// `hold` ns (0: not held).
using client = std::function<uint64_t(uint64_t hold)>;

struct sim {
    coalesce_policy policy;
    uint64_t now = 1'000'000'000;
    uint64_t hold = 0;  // what the policy said last
    uint64_t held_receives = 0;
    uint64_t receives = 0;

    explicit sim(uint64_t max_ns) : policy(max_ns) {}

    // Runs `ns` of receives from `c`.
    void run(const client& c, uint64_t ns)
    {
        for (uint64_t end = now + ns; now < end;) {
            now += k_step_ns;
            const uint64_t got = c(hold) * k_step_ns / 1'000'000'000u;
            hold = policy.next_hold(got, now);
            ++receives;
            held_receives += hold != 0 ? 1 : 0;
        }
    }
};

// Holding helps up to 20 us (the client keeps its rate), beyond it the
// client idles (10% fewer requests).
uint64_t helps_up_to_20us(uint64_t hold)
{
    return hold <= 20 * k_us ? 200'000 : 180'000;
}

}  // namespace

TEST(coalesce_policy, never_holds_one_request_at_a_time)
{
    sim s(50 * k_us);
    for (int i = 0; i < 10'000; ++i) {
        s.now += 50 * k_us;
        EXPECT_EQ(s.policy.next_hold(1, s.now), 0u);
    }
    EXPECT_EQ(s.policy.state(), coalesce_policy::phase::off);
}

TEST(coalesce_policy, zero_window_never_holds)
{
    sim s(0);
    s.run([](uint64_t) { return 200'000; }, 100'000'000);
    EXPECT_EQ(s.held_receives, 0u);
}

TEST(coalesce_policy, measures_plain_then_held_at_the_longest_window)
{
    sim s(50 * k_us);
    EXPECT_EQ(s.policy.next_hold(2, s.now), 0u);  // pipelining: measure
    EXPECT_EQ(s.policy.state(), coalesce_policy::phase::measure_plain);
    s.run([](uint64_t) { return 200'000; }, coalesce_policy::k_epoch_ns);
    EXPECT_EQ(s.policy.state(), coalesce_policy::phase::measure_held);
    EXPECT_EQ(s.hold, 50 * k_us);
}

TEST(coalesce_policy, keeps_a_window_that_costs_no_requests)
{
    sim s(50 * k_us);
    s.policy.next_hold(2, s.now);
    s.run([](uint64_t) { return 200'000; }, 2 * coalesce_policy::k_epoch_ns);
    EXPECT_EQ(s.policy.state(), coalesce_policy::phase::exploit);
    EXPECT_TRUE(s.policy.holding());
    EXPECT_EQ(s.policy.window_ns(), 50 * k_us);
}

TEST(coalesce_policy, halves_a_window_that_costs_requests_until_one_does_not)
{
    sim s(50 * k_us);
    s.policy.next_hold(2, s.now);
    // plain, held 50 us (loses), held 25 us (loses), held 12.5 us (wins).
    s.run(helps_up_to_20us, 4 * coalesce_policy::k_epoch_ns);
    EXPECT_EQ(s.policy.state(), coalesce_policy::phase::exploit);
    EXPECT_TRUE(s.policy.holding());
    EXPECT_EQ(s.policy.window_ns(), 12'500u);
}

TEST(coalesce_policy, tries_a_longer_window_after_a_win_and_settles)
{
    sim s(50 * k_us);
    s.policy.next_hold(2, s.now);
    s.run(helps_up_to_20us, 4 * coalesce_policy::k_epoch_ns);
    ASSERT_EQ(s.policy.window_ns(), 12'500u);
    // Ten more cycles: each tries 25 us, loses, and goes back to 12.5 us.
    s.held_receives = s.receives = 0;
    s.run(helps_up_to_20us, 10 * 19 * coalesce_policy::k_epoch_ns);
    EXPECT_TRUE(s.policy.window_ns() == 12'500u || s.policy.window_ns() == 25'000u);
    // Most receives are held (all but the plain and losing epochs).
    EXPECT_GT(s.held_receives * 100, s.receives * 80);
}

TEST(coalesce_policy, stops_holding_when_no_window_helps)
{
    sim s(50 * k_us);
    s.policy.next_hold(2, s.now);
    auto hurts = [](uint64_t hold) -> uint64_t { return hold != 0 ? 150'000 : 200'000; };
    // plain, then 50, 25, 12.5, 6.25 us all lose: the window would go
    // under k_min_window_ns, so it stops holding.
    s.run(hurts, 5 * coalesce_policy::k_epoch_ns);
    EXPECT_EQ(s.policy.state(), coalesce_policy::phase::exploit);
    EXPECT_FALSE(s.policy.holding());
    s.held_receives = s.receives = 0;
    s.run(hurts, (coalesce_policy::k_exploit_epochs - 1) * coalesce_policy::k_epoch_ns);
    EXPECT_EQ(s.held_receives, 0u);
    // The next measurement starts again from the longest window.
    EXPECT_EQ(s.policy.window_ns(), 50 * k_us);
}

TEST(coalesce_policy, follows_a_client_that_changes)
{
    sim s(50 * k_us);
    s.policy.next_hold(2, s.now);
    s.run(helps_up_to_20us, 4 * coalesce_policy::k_epoch_ns);
    ASSERT_EQ(s.policy.window_ns(), 12'500u);
    // Now any window helps: it grows back to the longest.
    s.run([](uint64_t) { return 200'000; }, 4 * 19 * coalesce_policy::k_epoch_ns);
    EXPECT_EQ(s.policy.window_ns(), 50 * k_us);
    EXPECT_TRUE(s.policy.holding());
}

TEST(coalesce_policy, goes_off_when_the_client_goes_idle)
{
    sim s(50 * k_us);
    s.policy.next_hold(2, s.now);
    s.run([](uint64_t) { return 200'000; }, 2 * coalesce_policy::k_epoch_ns);
    ASSERT_TRUE(s.policy.holding());
    // Nearly idle: a request now and then.
    for (int i = 0; i < 40 && s.policy.state() != coalesce_policy::phase::off; ++i) {
        s.now += coalesce_policy::k_epoch_ns;
        s.policy.next_hold(0, s.now);
    }
    EXPECT_EQ(s.policy.state(), coalesce_policy::phase::off);
    s.now += 100 * k_us;
    EXPECT_EQ(s.policy.next_hold(1, s.now), 0u);
}
