// colocation: a serving thread pinned next to its client, under SCHED_IDLE
// while it replies. What it buys (the kernel keeping the client it wakes
// on that CPU) is measured by the front ends' benchmarks: a socket pair
// ping-pong here went from 25% to 100% of the replies together with or
// without it from one run to the next, so no test asserts it.
#include <softblk/support/colocation.hpp>

#include <atomic>
#include <chrono>
#include <pthread.h>
#include <sched.h>
#include <thread>
#include <unistd.h>

#include <gtest/gtest.h>

namespace softblk {
namespace {

int allowed_cpus()
{
    cpu_set_t set;
    CPU_ZERO(&set);
    EXPECT_EQ(::sched_getaffinity(0, sizeof set, &set), 0);
    return CPU_COUNT(&set);
}

int first_allowed_cpu()
{
    cpu_set_t set;
    CPU_ZERO(&set);
    EXPECT_EQ(::sched_getaffinity(0, sizeof set, &set), 0);
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
        if (CPU_ISSET(cpu, &set)) {
            return cpu;
        }
    }
    return -1;
}

TEST(colocation, last_cpu_of_reads_the_cpu_a_thread_runs_on)
{
    colocation place;
    const int cpu = first_allowed_cpu();
    place.pin_to(cpu);
    ASSERT_EQ(place.cpu(), cpu);
    EXPECT_EQ(::sched_getcpu(), cpu);
    EXPECT_EQ(last_cpu_of(::gettid()), cpu);
    // A thread of this process that is gone, and no process at all.
    pid_t gone = 0;
    std::thread([&gone] { gone = ::gettid(); }).join();
    EXPECT_EQ(last_cpu_of(gone), -1);
    EXPECT_EQ(last_cpu_of(-5), -1);
}

TEST(colocation, pin_to_and_release_keep_to_the_cpus_allowed_at_start)
{
    const int before = allowed_cpus();
    {
        colocation place;
        const int cpu = first_allowed_cpu();
        place.pin_to(cpu);
        EXPECT_EQ(allowed_cpus(), 1);
        // Outside the start set (or no CPU): ignored.
        place.pin_to(CPU_SETSIZE + 3);
        place.pin_to(-1);
        EXPECT_EQ(place.cpu(), cpu);
        place.release();
        EXPECT_EQ(place.cpu(), -1);
        EXPECT_EQ(allowed_cpus(), before);
        place.pin_to(cpu);
    }
    // The destructor gives the CPUs back.
    EXPECT_EQ(allowed_cpus(), before);
}

TEST(colocation, follow_pins_to_the_cpu_the_client_runs_on)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    ASSERT_EQ(::sched_getaffinity(0, sizeof set, &set), 0);
    int last = -1;
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
        if (CPU_ISSET(cpu, &set)) {
            last = cpu;
        }
    }
    colocation place;
    // A client thread on the last allowed CPU, waiting for the test.
    std::atomic<pid_t> client{0};
    std::atomic<bool> done{false};
    std::thread t([&] {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(last, &one);
        ::sched_setaffinity(0, sizeof one, &one);
        client = ::gettid();
        while (!done) {
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
    });
    while (client == 0) {
        std::this_thread::yield();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    place.follow(client, 1'000'000'000);
    EXPECT_EQ(place.cpu(), last);
    EXPECT_EQ(::sched_getcpu(), last);
    // Released, the same client is looked up again at once.
    place.release();
    place.follow(client, 1'000'000'001);
    EXPECT_EQ(place.cpu(), last);
    // Not a thread: nothing changes.
    place.follow(0, 2'000'000'000);
    EXPECT_EQ(place.cpu(), last);
    done = true;
    t.join();
}

TEST(colocation, the_reply_runs_under_sched_idle_and_the_policy_comes_back)
{
    if (auto ok = colocation::check(); !ok) {
        GTEST_SKIP() << "this thread cannot leave SCHED_IDLE: " << ok.error().message;
    }
    colocation place;
    place.reply_begins();
    EXPECT_EQ(::sched_getscheduler(0), SCHED_IDLE);
    place.reply_begins();  // once is enough
    place.reply_done();
    EXPECT_EQ(::sched_getscheduler(0), SCHED_OTHER);
    place.reply_done();
    EXPECT_EQ(::sched_getscheduler(0), SCHED_OTHER);
}

TEST(colocation, a_real_time_thread_is_left_where_its_priority_puts_it)
{
    std::string message;
    std::thread t([&message] {
        sched_param p{};
        p.sched_priority = 1;
        if (::pthread_setschedparam(::pthread_self(), SCHED_FIFO, &p) != 0) {
            message = "skip";
            return;
        }
        auto ok = colocation::check();
        message = ok ? "allowed" : ok.error().message;
    });
    t.join();
    if (message == "skip") {
        GTEST_SKIP() << "SCHED_FIFO needs CAP_SYS_NICE";
    }
    EXPECT_NE(message.find("real-time"), std::string::npos) << message;
}

TEST(colocation, the_option_and_its_levels)
{
    EXPECT_TRUE(check_colocation("auto"));
    EXPECT_TRUE(check_colocation("0"));
    EXPECT_TRUE(check_colocation("1"));
    EXPECT_FALSE(check_colocation("2"));
    EXPECT_FALSE(check_colocation("yes"));
    EXPECT_EQ(colocation_config("auto").levels, (std::vector<uint64_t>{0, 1}));
    EXPECT_EQ(colocation_config("0").levels, (std::vector<uint64_t>{0}));
    EXPECT_EQ(colocation_config("1").levels, (std::vector<uint64_t>{1}));
}

}  // namespace
}  // namespace softblk
