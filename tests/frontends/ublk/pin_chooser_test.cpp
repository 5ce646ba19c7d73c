// queue_affinity=auto's choice (src/frontends/ublk/pin_chooser.hpp): a
// made-up queue whose requests take one time free and another pinned; and
// the device's share of it among its queues' threads (device_pinning.hpp).
#include "device_pinning.hpp"
#include "pin_chooser.hpp"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

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

// Two queues of one device, each thread's loop in turn: a request on
// queue 0, then one on queue 1 where `both`, else a wait of queue 1 for
// a request that goes to queue 0. Each takes `free_ns` or `pinned_ns` as
// the device last said.
struct fake_device {
    device_pinning device;
    uint64_t now = 0;

    // One turn of a queue thread's loop that takes one 4 KiB request.
    void turn()
    {
        if (device.due()) {
            device.update(now);
        }
        device.served(4096);
    }
    double serve(uint64_t ns, uint64_t free_ns, uint64_t pinned_ns, bool both = true)
    {
        const uint64_t until = now + ns;
        uint64_t pinned_time = 0;
        while (now < until) {
            const uint64_t before = device.requests();
            const bool pin = device.pinned();
            const uint64_t cost = pin ? pinned_ns : free_ns;
            turn();
            now += cost;
            pinned_time += pin ? cost : 0;
            if (both) {
                turn();
            } else {
                // Queue 1 woke after a long wait: queue 0 served meanwhile.
                device.waited(pin_chooser::config{}.idle_break_ns * 2, before);
            }
        }
        return static_cast<double>(pinned_time) / static_cast<double>(ns);
    }
};

TEST(DevicePinning, ChoosesFromWhatTheWholeDeviceServed)
{
    // Two queues, both busy: the device's rate is pinned faster.
    fake_device d;
    d.serve(k_s, 120'000, 100'000);
    EXPECT_TRUE(d.device.pinned());
    // Two requests of 4 KiB per turn: half the turn's time per block.
    EXPECT_NEAR(d.device.ns_per_block(false), 60'000, 600);
    EXPECT_NEAR(d.device.ns_per_block(true), 50'000, 500);
    EXPECT_GT(d.serve(4 * k_s, 120'000, 100'000), 0.9);
    // And where pinning costs, the device goes free.
    fake_device slower;
    slower.serve(k_s, 100'000, 145'000);
    EXPECT_LT(slower.serve(4 * k_s, 100'000, 145'000), 0.06);
}

TEST(DevicePinning, AQueueWaitingWhileAnotherServesIsNoIdleDevice)
{
    // All requests go to queue 0 (the program runs on its CPUs); queue 1
    // sleeps through them. The device is busy: its epochs count.
    fake_device d;
    d.serve(k_s, 120'000, 100'000, false);
    EXPECT_TRUE(d.device.pinned());
    EXPECT_NEAR(d.device.ns_per_block(true), 100'000, 1'000);
}

TEST(DevicePinning, AnIdleDeviceDropsTheEpoch)
{
    const pin_chooser::config cfg;
    device_pinning d;
    ASSERT_TRUE(d.due()) << "the first turn starts the first epoch";
    d.update(0);
    EXPECT_FALSE(d.due());
    for (uint64_t i = 0; i < cfg.epoch_requests; ++i) {
        d.served(4096);
    }
    EXPECT_TRUE(d.due());
    // A thread slept an idle break with nothing served meanwhile.
    d.waited(cfg.idle_break_ns, d.requests());
    d.update(cfg.epoch_ns * 2);
    EXPECT_EQ(d.epochs(), 0u) << "the idle epoch is not measured";
    // A busy epoch after it is.
    for (uint64_t i = 0; i < cfg.epoch_requests; ++i) {
        d.served(4096);
    }
    d.waited(cfg.idle_break_ns, d.requests() - 1);  // another queue served
    ASSERT_TRUE(d.due());
    d.update(cfg.epoch_ns * 3);
    EXPECT_EQ(d.epochs(), 1u);
}

TEST(DevicePinning, ThreadsShareItWhileServing)
{
    // Real threads, as a device's queues run (TSan sees the sharing): each
    // serves, and ends epochs on a made-up clock; every request counts,
    // and both ways get measured.
    device_pinning d;
    std::atomic<uint64_t> clock{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
        threads.emplace_back([&] {
            for (int i = 0; i < 20'000; ++i) {
                if (d.due()) {
                    d.update(clock.fetch_add(100'000));
                }
                d.served(d.pinned() ? 8192 : 4096);
            }
        });
    }
    for (auto& t : threads) {
        t.join();
    }
    EXPECT_EQ(d.requests(), 80'000u);
    EXPECT_GT(d.ns_per_block(false), 0u);
    EXPECT_GT(d.ns_per_block(true), 0u);
}

}  // namespace
}  // namespace softblk::ublk
