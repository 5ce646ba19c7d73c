// Which CPUs a ublk queue's thread pins itself to (queue_affinity=1 and
// queue_affinity=one), or tries (queue_affinity=auto): cpus_to_pin() and
// cpus_to_measure() in src/frontends/ublk/queue_runner.cpp, with made-up maps.
#include "queue_runner.hpp"

#include <gtest/gtest.h>

namespace softblk::ublk {
namespace {

cpu_set_t set_of(std::initializer_list<unsigned> cpus)
{
    cpu_set_t s;
    CPU_ZERO(&s);
    for (const unsigned cpu : cpus) {
        CPU_SET(cpu, &s);
    }
    return s;
}

TEST(QueueAffinity, AQueueOfSomeCpusIsPinnedToThem)
{
    const std::vector<unsigned> q0{0, 1};
    const std::vector<unsigned> q1{2, 3};
    const cpu_set_t all = set_of({0, 1, 2, 3});
    EXPECT_EQ(cpus_to_pin(q0, all), (std::vector<unsigned>{0, 1}));
    EXPECT_EQ(cpus_to_pin(q1, all), (std::vector<unsigned>{2, 3}));
}

TEST(QueueAffinity, AQueueOfEveryAllowedCpuIsNotPinned)
{
    // One queue on a 4-CPU machine: the kernel maps every CPU to it.
    const std::vector<unsigned> q0{0, 1, 2, 3};
    EXPECT_TRUE(cpus_to_pin(q0, set_of({0, 1, 2, 3})).empty());
    // The daemon runs on CPUs 2 and 3 only (taskset, a cpuset): the queue
    // covers both, so there is nothing to choose either.
    EXPECT_TRUE(cpus_to_pin(q0, set_of({2, 3})).empty());
}

TEST(QueueAffinity, OnlyCpusTheDaemonMayUseAreTaken)
{
    const std::vector<unsigned> q0{0, 1};
    const std::vector<unsigned> q1{2, 3};
    const cpu_set_t daemon = set_of({1, 2, 3});
    EXPECT_EQ(cpus_to_pin(q0, daemon), (std::vector<unsigned>{1}));
    EXPECT_EQ(cpus_to_pin(q1, daemon), (std::vector<unsigned>{2, 3}));
    // None of the queue's CPUs is the daemon's: left to the scheduler.
    EXPECT_TRUE(cpus_to_pin(q0, set_of({2, 3})).empty());
    // CPUs beyond cpu_set_t's range are ignored, not a crash.
    const std::vector<unsigned> far{5000, 2};
    EXPECT_EQ(cpus_to_pin(far, daemon), (std::vector<unsigned>{2}));
}

TEST(QueueAffinity, OneCpuIsTheFirstTheDaemonMayUse)
{
    // One queue on a 4-CPU machine: queue_affinity=1 leaves it alone,
    // queue_affinity=one takes its first CPU (kublk's choice).
    const std::vector<unsigned> q0{0, 1, 2, 3};
    EXPECT_EQ(cpus_to_pin(q0, set_of({0, 1, 2, 3}), true), (std::vector<unsigned>{0}));
    // The first CPU of the queue's that the daemon may use.
    EXPECT_EQ(cpus_to_pin(q0, set_of({2, 3}), true), (std::vector<unsigned>{2}));
    const std::vector<unsigned> q1{2, 3};
    EXPECT_EQ(cpus_to_pin(q1, set_of({0, 1, 2, 3}), true), (std::vector<unsigned>{2}));
    // None of the queue's CPUs is the daemon's: left to the scheduler.
    EXPECT_TRUE(cpus_to_pin(q1, set_of({0, 1}), true).empty());
    EXPECT_TRUE(cpus_to_pin({}, set_of({0, 1}), true).empty());
}

TEST(QueueAffinity, AutoMeasuresTheFirstCpuTheDaemonMayUse)
{
    // Every queue's thread of the device tries the first CPU, whatever the
    // queue's map: the device's rate decides (device_pinning).
    EXPECT_EQ(cpus_to_measure(set_of({0, 1, 2, 3})), (std::vector<unsigned>{0}));
    EXPECT_EQ(cpus_to_measure(set_of({2, 3})), (std::vector<unsigned>{2}));
    EXPECT_EQ(cpus_to_measure(set_of({1, 7})), (std::vector<unsigned>{1}));
    // One CPU to run on: nothing to choose.
    EXPECT_TRUE(cpus_to_measure(set_of({1})).empty());
    EXPECT_TRUE(cpus_to_measure(set_of({})).empty());
}

}  // namespace
}  // namespace softblk::ublk
