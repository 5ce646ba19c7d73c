// `softblk fat mount`'s serving loop (src/fs/fat/fuse_serve.cpp): one
// thread serves unless -o threads=N says more, its busy-poll window
// (poll_us) and where it runs (colocate). The mount is always taken down,
// even when an assertion fails.
#include "fat_test_util.hpp"
#include "fuse_util.hpp"

#include <softblk/support/colocation.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <sched.h>
#include <set>
#include <sstream>
#include <sys/stat.h>
#include <thread>

using namespace fat_test;

namespace {

// The server's threads (ids from /proc/PID/task).
std::set<std::string> threads_of(pid_t pid)
{
    std::set<std::string> ids;
    std::error_code ec;
    for (auto& e : fs::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
        ids.insert(e.path().filename().string());
    }
    return ids;
}

// One thread serves the mount. libfuse's pool, as configured before, started
// a thread whenever a request arrived while none was idle (a RELEASE with the
// next LOOKUP behind it) and ended one when more than two were idle: a thread
// was made and destroyed every third create, which with the hand-offs
// between threads made a create cost 30-140 us instead of 15-20.
TEST(FatFuse, ServesRequestsWithoutStartingThreads)
{
    FAT_REQUIRE_FUSE();
    temp_dir tmp;
    std::string img = make_image(tmp);
    std::string mnt = tmp / "mnt";
    fs::create_directories(mnt);
    {
        fuse_mount m(img, mnt);
        ASSERT_TRUE(m.ok()) << "the FUSE mount did not come up";
        ASSERT_TRUE(create_file(mnt + "/warm"));
        auto before = threads_of(m.pid());
        for (int i = 0; i < 100 && before.size() > 1; ++i) {
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
            before = threads_of(m.pid());
        }
        EXPECT_EQ(before.size(), 1u);
        ASSERT_EQ(::mkdir((mnt + "/many").c_str(), 0755), 0);
        std::set<std::string> started;
        for (int i = 0; i < 300; ++i) {
            std::string name = mnt + "/many/f" + std::to_string(i) + ".dat";
            ASSERT_TRUE(create_file(name)) << name;
            if (i % 3 == 2) {
                ASSERT_EQ(::unlink(name.c_str()), 0);
            }
            for (auto& id : threads_of(m.pid())) {
                if (before.count(id) == 0) {
                    started.insert(id);
                }
            }
        }
        EXPECT_TRUE(started.empty()) << started.size() << " threads were started";
        EXPECT_EQ(m.unmount(), 0);
    }
    EXPECT_TRUE(fsck_clean(img));
}

// -o threads=N serves with a pool of up to N threads (more throughput for
// streaming reads on a busy machine, slower metadata): concurrent readers
// get their data, the pool stays within N, the image stays clean; a
// number out of range is refused with a message.
TEST(FatFuse, ThreadsOptionServesWithAPoolOfAtMostN)
{
    FAT_REQUIRE_FUSE();
    temp_dir tmp;
    std::string img = make_image(tmp);
    std::string mnt = tmp / "mnt";
    fs::create_directories(mnt);
    {
        std::string log = tmp / "bad.log";
        fuse_mount bad(img, mnt, {"-o", "threads=0"}, log);
        EXPECT_FALSE(bad.ok());
        auto text = load_file(log);
        EXPECT_NE(std::string(text.begin(), text.end()).find("takes a number of threads"),
                  std::string::npos);
    }
    std::mt19937_64 rng(9);
    std::string data = random_bytes(rng, 8u << 20);
    {
        fuse_mount m(img, mnt, {"-o", "threads=3"});
        ASSERT_TRUE(m.ok()) << "the FUSE mount did not come up";
        write_file(mnt + "/data.bin", data);
        std::vector<std::thread> readers;
        std::atomic<int> good{0};
        size_t most = 0;
        std::atomic<bool> done{false};
        std::thread watch([&] {
            while (!done) {
                most = std::max(most, threads_of(m.pid()).size());
                std::this_thread::sleep_for(std::chrono::milliseconds(1));
            }
        });
        for (int r = 0; r < 4; ++r) {
            readers.emplace_back([&] {
                for (int round = 0; round < 3; ++round) {
                    auto got = load_file(mnt + "/data.bin");
                    if (std::string(got.begin(), got.end()) == data) {
                        ++good;
                    }
                }
            });
        }
        for (auto& t : readers) {
            t.join();
        }
        done = true;
        watch.join();
        EXPECT_EQ(good.load(), 12);
        EXPECT_LE(most, 4u) << "the main thread and at most 3 workers";
        EXPECT_EQ(m.unmount(), 0);
    }
    EXPECT_TRUE(fsck_clean(img));
}

// The server's CPU time so far (ns), from /proc/PID/task/*/schedstat.
uint64_t cpu_ns_of(pid_t pid)
{
    uint64_t total = 0;
    std::error_code ec;
    for (auto& e : fs::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
        std::ifstream in(e.path() / "schedstat");
        uint64_t ns = 0;
        if (in >> ns) {
            total += ns;
        }
    }
    return total;
}

// -o poll_us=N|auto is the serving loop's busy-poll window after each
// request (the core's level_chooser, as for the FUSE export's poll_us):
// a value out of range is refused with a message; a given window serves
// creates, writes and reads and leaves a clean image; polling stops when
// the requests stop (an idle mount does not spin). Before the option, the
// loop passed poll_us=... to libfuse, which refused to mount.
TEST(FatFuse, PollOptionSetsTheServingLoopsWindow)
{
    FAT_REQUIRE_FUSE();
    temp_dir tmp;
    std::string img = make_image(tmp);
    std::string mnt = tmp / "mnt";
    fs::create_directories(mnt);
    for (std::string bad : {"poll_us=abc", "poll_us=5000", "poll_us="}) {
        std::string log = tmp / "bad.log";
        fuse_mount m(img, mnt, {"-o", bad}, log);
        EXPECT_FALSE(m.ok()) << bad;
        auto text = load_file(log);
        EXPECT_NE(std::string(text.begin(), text.end()).find("poll_us takes auto, or a window"),
                  std::string::npos)
            << bad << ": " << std::string(text.begin(), text.end());
    }
    std::mt19937_64 rng(11);
    std::string data = random_bytes(rng, 3u << 20);
    for (std::string window : {"poll_us=500", "poll_us=auto", "poll_us=0"}) {
        {
            fuse_mount m(img, mnt, {"-o", window});
            ASSERT_TRUE(m.ok()) << window << ": the FUSE mount did not come up";
            std::string dir = mnt + "/d" + window.substr(8);
            ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0) << dir;
            for (int i = 0; i < 200; ++i) {
                ASSERT_TRUE(create_file(dir + "/f" + std::to_string(i) + ".dat")) << window << i;
            }
            write_file(dir + "/data.bin", data);
            auto got = load_file(dir + "/data.bin");
            EXPECT_TRUE(std::string(got.begin(), got.end()) == data) << window;
            // Idle: after at most one window the server sleeps in read().
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
            uint64_t before = cpu_ns_of(m.pid());
            std::this_thread::sleep_for(std::chrono::milliseconds(500));
            uint64_t spent = cpu_ns_of(m.pid()) - before;
            EXPECT_LT(spent, 50'000'000u) << window << ": the idle server ran " << spent << " ns";
            EXPECT_EQ(m.unmount(), 0);
        }
        EXPECT_TRUE(fsck_clean(img)) << window;
    }
    // What was written survives the unmounts.
    fuse_mount m(img, mnt);
    ASSERT_TRUE(m.ok());
    for (std::string d : {"/d500", "/dauto", "/d0"}) {
        auto got = load_file(mnt + d + "/data.bin");
        EXPECT_TRUE(std::string(got.begin(), got.end()) == data) << d;
        EXPECT_TRUE(exists(mnt + d + "/f199.dat")) << d;
    }
    EXPECT_EQ(m.unmount(), 0);
}

// A line of /proc/PID/task/TID/status ("Cpus_allowed_list:" ...), its value.
std::string task_status(pid_t pid, const std::string& tid, const std::string& key)
{
    std::ifstream in("/proc/" + std::to_string(pid) + "/task/" + tid + "/status");
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind(key, 0) == 0) {
            auto value = line.substr(key.size());
            return value.substr(value.find_first_not_of(" \t"));
        }
    }
    return {};
}

// The scheduling policy of a thread: field 41 of /proc/PID/task/TID/stat.
int task_policy(pid_t pid, const std::string& tid)
{
    std::ifstream in("/proc/" + std::to_string(pid) + "/task/" + tid + "/stat");
    std::string text;
    std::getline(in, text);
    std::istringstream fields(text.substr(text.rfind(')') + 1));
    std::string field;
    for (int i = 3; i <= 41 && (fields >> field); ++i) {
    }
    return std::stoi(field);
}

// -o colocate=auto|0|1 is where the serving thread runs (the core's
// support/colocation.hpp): with 1 it is pinned to the CPU of the thread
// that sends the requests (this test's, pinned itself) and waits for the
// next request under its normal policy (SCHED_IDLE only while it replies,
// and from one request to the next when they come back to back); with
// 0 it is never pinned; another value is refused with a message. Creates,
// writes and reads keep their data and the image clean either way.
TEST(FatFuse, ColocateOptionServesFromTheClientsCpu)
{
    FAT_REQUIRE_FUSE();
    if (std::thread::hardware_concurrency() < 2) {
        GTEST_SKIP() << "one CPU: nothing to choose";
    }
    if (auto ok = softblk::colocation::check(); !ok) {
        GTEST_SKIP() << "cannot leave SCHED_IDLE here: " << ok.error().message;
    }
    temp_dir tmp;
    std::string img = make_image(tmp);
    std::string mnt = tmp / "mnt";
    fs::create_directories(mnt);
    for (std::string bad : {"colocate=2", "colocate="}) {
        std::string log = tmp / "bad.log";
        fuse_mount m(img, mnt, {"-o", bad}, log);
        EXPECT_FALSE(m.ok()) << bad;
        auto text = load_file(log);
        EXPECT_NE(std::string(text.begin(), text.end()).find("colocate takes auto (measured)"),
                  std::string::npos)
            << bad << ": " << std::string(text.begin(), text.end());
    }
    cpu_set_t mine;
    ASSERT_EQ(::sched_getaffinity(0, sizeof mine, &mine), 0);
    int client_cpu = -1;
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
        if (CPU_ISSET(cpu, &mine)) {
            client_cpu = cpu;  // the last one allowed
        }
    }
    std::mt19937_64 rng(12);
    std::string data = random_bytes(rng, 1u << 20);
    for (std::string mode : {"colocate=1", "colocate=0"}) {
        fuse_mount m(img, mnt, {"-o", mode});
        ASSERT_TRUE(m.ok()) << mode << ": the FUSE mount did not come up";
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(client_cpu, &one);
        ASSERT_EQ(::sched_setaffinity(0, sizeof one, &one), 0);
        std::string dir = mnt + "/d" + mode.substr(9);
        ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0) << dir;
        for (int i = 0; i < 300; ++i) {
            ASSERT_TRUE(create_file(dir + "/f" + std::to_string(i) + ".dat")) << mode << i;
        }
        write_file(dir + "/data.bin", data);
        // Right after a reply the server may still be under SCHED_IDLE,
        // preempted by this thread on their CPU: it finishes when this
        // thread sleeps.
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        unsigned pinned_to_client = 0;
        unsigned pinned_elsewhere = 0;
        for (auto& tid : threads_of(m.pid())) {
            const auto cpus = task_status(m.pid(), tid, "Cpus_allowed_list:");
            if (cpus == std::to_string(client_cpu)) {
                ++pinned_to_client;
            } else if (cpus.find_first_of(",-") == std::string::npos) {
                ++pinned_elsewhere;
            }
            EXPECT_EQ(task_policy(m.pid(), tid), SCHED_OTHER) << mode << " thread " << tid;
        }
        ASSERT_EQ(::sched_setaffinity(0, sizeof mine, &mine), 0);
        EXPECT_EQ(pinned_to_client, mode == "colocate=1" ? 1u : 0u) << mode;
        EXPECT_EQ(pinned_elsewhere, 0u) << mode;
        auto got = load_file(dir + "/data.bin");
        EXPECT_TRUE(std::string(got.begin(), got.end()) == data) << mode;
        EXPECT_EQ(m.unmount(), 0);
        EXPECT_TRUE(fsck_clean(img)) << mode;
    }
}

// Threads of the mount's process allowed a single CPU.
unsigned pinned_threads(pid_t pid)
{
    unsigned pinned = 0;
    for (auto& tid : threads_of(pid)) {
        if (task_status(pid, tid, "Cpus_allowed_list:").find_first_of(",-") == std::string::npos) {
            ++pinned;
        }
    }
    return pinned;
}

// Even with colocate=1 the kernel's read-ahead is served from any CPU:
// the reader does not wait for the window being filled, it copies the one
// before, and beside it the server would only take its CPU. A reader
// pinned to one CPU first gets a thread pinned next to it (a create, a
// 4 KiB read), and none while it streams a file. Before, the thread stayed
// next to the reader.
TEST(FatFuse, ColocateLeavesReadAheadToAnyCpu)
{
    FAT_REQUIRE_FUSE();
    if (std::thread::hardware_concurrency() < 2) {
        GTEST_SKIP() << "one CPU: nothing to choose";
    }
    if (auto ok = softblk::colocation::check(); !ok) {
        GTEST_SKIP() << "cannot leave SCHED_IDLE here: " << ok.error().message;
    }
    temp_dir tmp;
    std::string img = make_image(tmp);
    std::string mnt = tmp / "mnt";
    fs::create_directories(mnt);
    std::mt19937_64 rng(31);
    const std::string data = random_bytes(rng, 16u << 20);
    fuse_mount m(img, mnt, {"-o", "colocate=1"});
    ASSERT_TRUE(m.ok());
    write_file(mnt + "/stream.bin", data);
    cpu_set_t mine;
    ASSERT_EQ(::sched_getaffinity(0, sizeof mine, &mine), 0);
    cpu_set_t one;
    CPU_ZERO(&one);
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
        if (CPU_ISSET(cpu, &mine)) {
            CPU_ZERO(&one);
            CPU_SET(cpu, &one);  // the last one allowed
        }
    }
    ASSERT_EQ(::sched_setaffinity(0, sizeof one, &one), 0);
    for (int i = 0; i < 50; ++i) {
        ASSERT_TRUE(create_file(mnt + "/f" + std::to_string(i) + ".dat"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const unsigned after_creates = pinned_threads(m.pid());
    int fd = ::open((mnt + "/stream.bin").c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    std::string got(4u << 20, '\0');
    for (size_t off = 0; off < got.size(); off += 65536) {
        ASSERT_EQ(::pread(fd, got.data() + off, 65536, static_cast<off_t>(off)), 65536);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const unsigned while_streaming = pinned_threads(m.pid());
    ::close(fd);
    ASSERT_EQ(::sched_setaffinity(0, sizeof mine, &mine), 0);
    EXPECT_EQ(after_creates, 1u);
    EXPECT_EQ(while_streaming, 0u) << "the read-ahead was served next to the reader";
    EXPECT_TRUE(got == data.substr(0, got.size()));
    EXPECT_EQ(m.unmount(), 0);
    EXPECT_TRUE(fsck_clean(img));
}

}  // namespace
