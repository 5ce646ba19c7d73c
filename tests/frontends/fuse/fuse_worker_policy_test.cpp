// The FUSE export's worker count (option threads, worker_policy.hpp):
// what threads=auto measures (1 .. one per CPU, at least one per submit
// queue) and what it keeps, driven with a fake clock against a model of a
// machine whose rate per worker count the test sets; a number given is
// never measured.
#include "worker_policy.hpp"

#include <gtest/gtest.h>

namespace softblk::fuse {
namespace {

constexpr uint64_t k_ms = 1'000'000;

// `ms` milliseconds of a machine serving rate(active workers) requests per
// second, one step per 100 us, the chooser deciding the active count.
void run(level_chooser& c, uint64_t& now, uint64_t ms, double (*rate)(uint64_t))
{
    double owed = 0;
    for (uint64_t step = 0; step < ms * 10; ++step) {
        now += k_ms / 10;
        owed += rate(c.level()) / 10'000;
        const auto events = static_cast<uint64_t>(owed);
        owed -= static_cast<double>(events);
        c.served(now, events);
    }
}

TEST(fuse_worker_policy, auto_sweeps_one_worker_up_to_one_per_cpu)
{
    const worker_plan p = plan_workers("auto", 1, 2, false);
    EXPECT_EQ(p.threads, 2u);
    EXPECT_EQ(p.choice.levels, (std::vector<uint64_t>{1, 2}));
    EXPECT_EQ(p.choice.unit, "workers");
    // Longer than a whole poll-window sweep (14 epochs of 10 ms).
    EXPECT_GT(p.choice.epoch_ns, 140'000'000u);
    // At least one per submit queue, so that each may own one; at most 8.
    EXPECT_EQ(plan_workers("auto", 4, 2, false).threads, 4u);
    EXPECT_EQ(plan_workers("auto", 1, 64, false).threads, k_max_auto_workers);
    const worker_plan one = plan_workers("auto", 1, 1, false);
    EXPECT_EQ(one.choice.levels, (std::vector<uint64_t>{1}));
    EXPECT_NE(one.why.find("one CPU"), std::string::npos) << one.why;
}

TEST(fuse_worker_policy, two_workers_where_they_serve_more)
{
    // Two jobs on two CPUs: a second worker takes a request while the
    // first replies (the ring-off 2-job writes against one worker).
    level_chooser c(plan_workers("auto", 1, 2, false).choice);
    EXPECT_EQ(c.level(), 1u);  // starts with one
    uint64_t now = 1'000 * k_ms;
    run(c, now, 1'000, [](uint64_t n) { return n == 2 ? 30'000.0 : 20'000.0; });
    EXPECT_GE(c.sweeps(), 1u);
    EXPECT_EQ(c.level(), 2u);
    const auto d = c.describe();
    EXPECT_EQ(d["mode"], "auto");
    EXPECT_NE(d["why"].get<std::string>().find("2 workers"), std::string::npos) << d.dump();
    EXPECT_NEAR(d["rates_per_s"]["1"].get<double>(), 20'000, 1'000);
    EXPECT_NEAR(d["rates_per_s"]["2"].get<double>(), 30'000, 1'000);
}

TEST(fuse_worker_policy, one_worker_where_a_second_does_not_pay)
{
    // One job at queue depth 1: a second worker only alternates with the
    // first (the kernel wakes readers in turn); within 5% the fewer wins.
    level_chooser c(plan_workers("auto", 1, 2, false).choice);
    uint64_t now = 1'000 * k_ms;
    run(c, now, 1'000, [](uint64_t n) { return n == 2 ? 40'500.0 : 40'000.0; });
    EXPECT_GE(c.sweeps(), 1u);
    EXPECT_EQ(c.level(), 1u);
    // The load changes: now two pay, and a later sweep finds it.
    run(c, now, 300'000, [](uint64_t n) { return n == 2 ? 60'000.0 : 30'000.0; });
    EXPECT_EQ(c.level(), 2u);
}

TEST(fuse_worker_policy, a_number_given_is_kept_and_never_measured)
{
    for (const char* text : {"3", "1"}) {
        const worker_plan p = plan_workers(text, 1, 2, false);
        level_chooser c(p.choice);
        EXPECT_TRUE(c.fixed());
        uint64_t now = 1'000 * k_ms;
        run(c, now, 500, [](uint64_t n) { return n == 1 ? 90'000.0 : 10'000.0; });
        EXPECT_EQ(c.level(), std::stoull(text));
        EXPECT_EQ(c.sweeps(), 0u);
        EXPECT_EQ(p.why, "given");
    }
    const worker_plan zero = plan_workers("0", 3, 2, false);
    EXPECT_EQ(zero.choice.levels, (std::vector<uint64_t>{3}));
    EXPECT_NE(zero.why.find("one per submit queue"), std::string::npos) << zero.why;
    // Ring threads are not measured: one per submit queue.
    const worker_plan ring = plan_workers("auto", 2, 2, true);
    EXPECT_EQ(ring.choice.levels, (std::vector<uint64_t>{2}));
    EXPECT_NE(ring.why.find("ring"), std::string::npos) << ring.why;
}

TEST(fuse_worker_policy, the_option_takes_auto_or_a_count)
{
    EXPECT_TRUE(check_threads("auto"));
    EXPECT_TRUE(check_threads("0"));
    EXPECT_TRUE(check_threads("64"));
    auto r = check_threads("65");
    ASSERT_FALSE(r);
    EXPECT_NE(r.error().message.find("auto, or a number of workers"), std::string::npos)
        << r.error().message;
    EXPECT_FALSE(check_threads("many"));
}

}  // namespace
}  // namespace softblk::fuse
