// The receive-coalescing policy (src/frontends/nbd/coalesce.hpp) driven by
// a simulated client whose request rate depends on how long its receives
// are held back. No sockets, no clock.
#include <gtest/gtest.h>

#include <functional>

#include "coalesce.hpp"

using namespace softblk::nbd;

namespace {

constexpr uint64_t k_us = 1000;
constexpr uint64_t k_ms = 1000 * k_us;
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

uint64_t indifferent(uint64_t)
{
    return 200'000;
}

}  // namespace

TEST(coalesce_policy, never_holds_one_request_at_a_time)
{
    sim s(50 * k_us);
    for (int i = 0; i < 10'000; ++i) {
        s.now += 50 * k_us;
        EXPECT_EQ(s.policy.next_hold(1, s.now), 0u);
    }
    EXPECT_FALSE(s.policy.pipelining());
}

TEST(coalesce_policy, zero_window_never_holds)
{
    sim s(0);
    s.run(indifferent, 1'000 * k_ms);
    EXPECT_EQ(s.held_receives, 0u);
    EXPECT_TRUE(s.policy.describe().is_null());
}

TEST(coalesce_policy, measures_every_window_up_to_the_longest)
{
    sim s(50 * k_us);
    s.run(indifferent, 200 * k_ms);  // a sweep: 2 epochs of 10 ms per window
    const auto d = s.policy.describe();
    ASSERT_GE(d["sweeps"].get<unsigned>(), 1u) << d.dump();
    for (const char* w : {"0", "5", "10", "20", "40", "50"}) {
        EXPECT_TRUE(d["rates_per_s"].contains(w)) << w << " " << d.dump();
    }
}

TEST(coalesce_policy, keeps_the_longest_window_where_holding_costs_no_requests)
{
    sim s(50 * k_us);
    s.run(indifferent, 300 * k_ms);
    EXPECT_TRUE(s.policy.pipelining());
    EXPECT_EQ(s.policy.window_ns(), 50 * k_us) << s.policy.describe().dump();
}

TEST(coalesce_policy, keeps_the_longest_window_that_costs_no_requests)
{
    sim s(50 * k_us);
    s.run(helps_up_to_20us, 300 * k_ms);
    EXPECT_EQ(s.policy.window_ns(), 20 * k_us) << s.policy.describe().dump();
    // Then most receives are held (all but those of later sweeps' 0 us).
    s.held_receives = s.receives = 0;
    s.run(helps_up_to_20us, 5'000 * k_ms);
    EXPECT_GT(s.held_receives * 100, s.receives * 85);
}

TEST(coalesce_policy, does_not_hold_where_every_window_costs_requests)
{
    sim s(50 * k_us);
    auto hurts = [](uint64_t hold) -> uint64_t { return hold != 0 ? 150'000 : 200'000; };
    s.run(hurts, 300 * k_ms);
    EXPECT_EQ(s.policy.window_ns(), 0u);
    s.held_receives = s.receives = 0;
    s.run(hurts, 5'000 * k_ms);
    EXPECT_LT(s.held_receives * 100, s.receives * 10);  // only while sweeping
}

TEST(coalesce_policy, follows_a_client_that_changes)
{
    sim s(50 * k_us);
    s.run(helps_up_to_20us, 300 * k_ms);
    ASSERT_EQ(s.policy.window_ns(), 20 * k_us);
    // Now any window helps: the next sweeps find the longest.
    s.run(indifferent, 3'000 * k_ms);
    EXPECT_EQ(s.policy.window_ns(), 50 * k_us) << s.policy.describe().dump();
}

TEST(coalesce_policy, stops_when_the_client_goes_idle)
{
    sim s(50 * k_us);
    s.run(indifferent, 300 * k_ms);
    ASSERT_TRUE(s.policy.pipelining());
    // Nearly idle: a request now and then.
    for (int i = 0; i < 40 && s.policy.pipelining(); ++i) {
        s.now += 10 * k_ms;
        s.policy.next_hold(0, s.now);
    }
    EXPECT_FALSE(s.policy.pipelining());
    s.now += 100 * k_us;
    EXPECT_EQ(s.policy.next_hold(1, s.now), 0u);
}
