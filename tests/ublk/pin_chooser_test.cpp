// queue_affinity=auto's choice (src/frontends/ublk/pin_chooser.hpp): a
// made-up queue whose requests take one time free and another pinned.
#include "pin_chooser.hpp"

#include <gtest/gtest.h>

namespace softblk::ublk {
namespace {

// A queue thread's loop: each turn serves one request of 4 KiB (or
// `pinned_blocks` of them pinned), which takes `free_ns` or `pinned_ns` as
// the chooser last said.
struct fake_queue {
    pin_chooser chooser;
    uint64_t now = 0;
    uint64_t requests = 0;
    uint64_t blocks = 0;

    // Serves for `ns` of made-up time; returns the share of it pinned.
    double serve(uint64_t ns, uint64_t free_ns, uint64_t pinned_ns, uint64_t pinned_blocks = 1)
    {
        const uint64_t until = now + ns;
        uint64_t pinned_time = 0;
        while (now < until) {
            const bool pin = chooser.update(now, requests, blocks);
            const uint64_t cost = pin ? pinned_ns : free_ns;
            now += cost;
            pinned_time += pin ? cost : 0;
            ++requests;
            blocks += pin ? pinned_blocks : 1;
        }
        return static_cast<double>(pinned_time) / static_cast<double>(ns);
    }
};

constexpr uint64_t k_s = 1'000'000'000;

TEST(PinChooser, KeepsToOneCpuWhereThatServesFaster)
{
    // 128 KiB sequential zone writes on the Intel Xeon host: about a fifth
    // faster pinned.
    fake_queue q;
    q.serve(k_s, 120'000, 100'000);
    EXPECT_TRUE(q.chooser.pinned_ahead());
    EXPECT_NEAR(q.chooser.mean_ns(false), 120'000, 1);
    EXPECT_NEAR(q.chooser.mean_ns(true), 100'000, 1);
    // Warmed up, it keeps to the CPU but for the explorations.
    EXPECT_GT(q.serve(4 * k_s, 120'000, 100'000), 0.9);
}

TEST(PinChooser, StaysFreeWherePinningCostsOrWinsTooLittle)
{
    // 128 KiB random writes on an AMD host: a third slower pinned.
    fake_queue q;
    q.serve(k_s, 100'000, 145'000);
    EXPECT_FALSE(q.chooser.pinned_ahead());
    EXPECT_LT(q.serve(4 * k_s, 100'000, 145'000), 0.06);
    // 3% faster pinned is within the margin: a free thread also follows a
    // load that moves.
    fake_queue tie;
    tie.serve(k_s, 100'000, 97'000);
    EXPECT_FALSE(tie.chooser.pinned_ahead());
    EXPECT_LT(tie.serve(4 * k_s, 100'000, 97'000), 0.12);
}

TEST(PinChooser, ComparesDataServedNotRequests)
{
    // Sequential writes: pinned, the block layer merges them into requests
    // of 8 blocks that take 4 times as long each; twice the data per second.
    fake_queue q;
    q.serve(k_s, 100'000, 400'000, 8);
    EXPECT_TRUE(q.chooser.pinned_ahead());
    EXPECT_NEAR(q.chooser.mean_ns(true), 50'000, 1);
}

TEST(PinChooser, FollowsAChangeOfLoad)
{
    fake_queue q;
    q.serve(2 * k_s, 120'000, 100'000);
    ASSERT_TRUE(q.chooser.pinned_ahead());
    // The next job loses by pinning: within a second the thread is free.
    q.serve(k_s, 100'000, 150'000);
    EXPECT_FALSE(q.chooser.pinned_ahead());
    EXPECT_LT(q.serve(2 * k_s, 100'000, 150'000), 0.1);
}

TEST(PinChooser, AnEpochWithALongWaitIsNotMeasured)
{
    pin_chooser::config cfg;
    pin_chooser c(cfg);
    uint64_t now = 0;
    uint64_t requests = 0;
    const bool first = c.update(now, requests, requests);
    // An epoch's worth of requests, then a wait of an idle device.
    requests += cfg.epoch_requests;
    now += cfg.epoch_ns / 2;
    c.waited(cfg.idle_break_ns);
    now += cfg.epoch_ns;
    EXPECT_EQ(c.update(now, requests, requests), first) << "a dropped epoch changes nothing";
    EXPECT_EQ(c.epochs(), 0u);
    // The next epoch, busy, counts.
    requests += cfg.epoch_requests;
    now += cfg.epoch_ns;
    c.waited(cfg.idle_break_ns - 1);
    c.update(now, requests, requests);
    EXPECT_EQ(c.epochs(), 1u);
}

TEST(PinChooser, AnEpochNeedsItsRequestsAndItsTime)
{
    pin_chooser::config cfg;
    pin_chooser c(cfg);
    EXPECT_TRUE(c.due(0)) << "not started";
    c.update(0, 0, 0);
    EXPECT_FALSE(c.due(cfg.epoch_requests - 1));
    EXPECT_TRUE(c.due(cfg.epoch_requests));
    c.update(cfg.epoch_ns, cfg.epoch_requests - 1, 100 * cfg.epoch_requests);
    EXPECT_EQ(c.epochs(), 0u);
    c.update(cfg.epoch_ns - 1, 10 * cfg.epoch_requests, 10 * cfg.epoch_requests);
    EXPECT_EQ(c.epochs(), 0u);
    c.update(cfg.epoch_ns, cfg.epoch_requests, cfg.epoch_requests);
    EXPECT_EQ(c.epochs(), 1u);
}

}  // namespace
}  // namespace softblk::ublk
