// `softblk fat mount`: the FUSE mount serves POSIX I/O, and the image is
// clean (fsck.fat) and readable by mtools after fusermount3 -u. The mount
// is always taken down, even when an assertion fails.
#include "fat_test_util.hpp"
#include "fuse_util.hpp"

#include <softblk/support/colocation.hpp>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <sched.h>
#include <sstream>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <thread>

using namespace fat_test;

namespace {

TEST(FatFuse, MountServesPosixIoAndLeavesACleanImage)
{
    if (access("/dev/fuse", R_OK | W_OK) != 0) {
        GTEST_SKIP() << "SKIP: /dev/fuse is not available";
    }
    FAT_REQUIRE_TOOL("fusermount3");
    FAT_REQUIRE_TOOL("fsck.fat");
    FAT_REQUIRE_TOOL("mtype");
    temp_dir tmp;
    std::string img = tmp / "fuse.img";
    {
        auto dev = file_block_device::create(img, 32u << 20);
        ASSERT_TRUE(dev.has_value());
        ASSERT_TRUE(format(**dev).has_value());
    }
    std::string mnt = tmp / "mnt";
    fs::create_directories(mnt);
    std::mt19937_64 rng(3);
    std::string big = random_bytes(rng, 3u << 20);
    {
        fuse_mount m(img, mnt);
        ASSERT_TRUE(m.ok()) << "the FUSE mount did not come up";
        write_file(mnt + "/Big File.bin", big);
        fs::create_directories(mnt + "/dir/sub");
        write_file(mnt + "/dir/sub/note.txt", "note\n");
        fs::rename(mnt + "/dir/sub/note.txt", mnt + "/dir/renamed.txt");
        write_file(mnt + "/gone", "x");
        fs::remove(mnt + "/gone");
        {
            int fd = open((mnt + "/sparse").c_str(), O_CREAT | O_RDWR, 0644);
            ASSERT_GE(fd, 0);
            ASSERT_EQ(pwrite(fd, "end", 3, 100000), 3);
            ASSERT_EQ(fsync(fd), 0);
            ASSERT_EQ(ftruncate(fd, 50000), 0);
            close(fd);
        }
        auto got = load_file(mnt + "/Big File.bin");
        EXPECT_TRUE(std::string(got.begin(), got.end()) == big);
        EXPECT_EQ(fs::file_size(mnt + "/sparse"), 50000u);
        std::set<std::string> names;
        for (auto& e : fs::directory_iterator(mnt)) {
            names.insert(e.path().filename().string());
        }
        EXPECT_EQ(names, (std::set<std::string>{"Big File.bin", "dir", "sparse"}));
        EXPECT_EQ(m.unmount(), 0);
    }
    EXPECT_TRUE(fsck_clean(img));
    auto t = run("mtype -i " + img + " ::/dir/renamed.txt");
    EXPECT_EQ(t.output, "note\n");
    std::string out = tmp / "big.out";
    ASSERT_EQ(run("mcopy -n -i " + img + " '::/Big File.bin' " + out).status, 0);
    auto got = load_file(out);
    EXPECT_TRUE(std::string(got.begin(), got.end()) == big);
}

// A fresh 32 MiB FAT image for a mount test.
std::string make_image(const temp_dir& tmp)
{
    std::string img = tmp / "fuse.img";
    auto dev = file_block_device::create(img, 32u << 20);
    EXPECT_TRUE(dev.has_value());
    if (dev) {
        EXPECT_TRUE(format(**dev).has_value());
    }
    return img;
}

bool exists(const std::string& path)
{
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0;
}

bool create_file(const std::string& path)
{
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd < 0) {
        return false;
    }
    ::close(fd);
    return true;
}

#define FAT_REQUIRE_FUSE()                                      \
    do {                                                        \
        if (access("/dev/fuse", R_OK | W_OK) != 0) {            \
            GTEST_SKIP() << "SKIP: /dev/fuse is not available"; \
        }                                                       \
        FAT_REQUIRE_TOOL("fusermount3");                        \
        FAT_REQUIRE_TOOL("fsck.fat");                           \
    } while (0)

// FAT finds an entry under any ASCII case of its name and under its 8.3
// alias; the kernel caches names exactly. A miss must therefore not be
// cached: a lookup of "foo" that failed must not hide "FOO" created next
// through the mount, nor may "LONGNA~1.TXT" stay missing once "long name
// here.txt" exists, nor "dir" after mkdir "DIR", nor "b" after a rename to
// "B". (With the hour-long negative cache all four stayed missing.)
TEST(FatFuse, MissesAreNotCachedSoOtherSpellingsFindNewEntries)
{
    FAT_REQUIRE_FUSE();
    temp_dir tmp;
    std::string img = make_image(tmp);
    std::string mnt = tmp / "mnt";
    fs::create_directories(mnt);
    {
        fuse_mount m(img, mnt);
        ASSERT_TRUE(m.ok()) << "the FUSE mount did not come up";
        EXPECT_FALSE(exists(mnt + "/foo"));
        EXPECT_FALSE(exists(mnt + "/LONGNA~1.TXT"));
        EXPECT_FALSE(exists(mnt + "/dir"));
        EXPECT_FALSE(exists(mnt + "/b"));
        ASSERT_TRUE(create_file(mnt + "/FOO"));
        ASSERT_TRUE(create_file(mnt + "/long name here.txt"));
        ASSERT_EQ(::mkdir((mnt + "/DIR").c_str(), 0755), 0);
        ASSERT_TRUE(create_file(mnt + "/a"));
        ASSERT_EQ(::rename((mnt + "/a").c_str(), (mnt + "/B").c_str()), 0);
        EXPECT_TRUE(exists(mnt + "/foo"));
        EXPECT_TRUE(exists(mnt + "/LONGNA~1.TXT"));
        EXPECT_TRUE(exists(mnt + "/dir"));
        EXPECT_TRUE(exists(mnt + "/b"));
        // A miss after a removal through the name it was made with.
        ASSERT_EQ(::unlink((mnt + "/FOO").c_str()), 0);
        ASSERT_EQ(::rmdir((mnt + "/DIR").c_str()), 0);
        EXPECT_FALSE(exists(mnt + "/FOO"));
        EXPECT_FALSE(exists(mnt + "/DIR"));
        ASSERT_TRUE(create_file(mnt + "/Foo"));
        EXPECT_TRUE(exists(mnt + "/FOO"));
        EXPECT_EQ(m.unmount(), 0);
    }
    EXPECT_TRUE(fsck_clean(img));
}

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

// -o writeback=0 (the default: each write(2) goes to the volume, the page
// cache serves reads) and -o writeback=1 (the kernel's writeback cache)
// both keep POSIX semantics that the two modes implement differently:
// O_APPEND (the server places appends without the cache, the kernel with
// it), overwrites inside a page, a file opened write-only; the data
// survives the unmount and the image is clean. Another value is refused.
// Before the option, writeback=... went to libfuse, which refused to mount.
TEST(FatFuse, WritebackOptionWritesThroughOrCachesAlike)
{
    FAT_REQUIRE_FUSE();
    temp_dir tmp;
    std::string img = make_image(tmp);
    std::string mnt = tmp / "mnt";
    fs::create_directories(mnt);
    {
        std::string log = tmp / "bad.log";
        fuse_mount bad(img, mnt, {"-o", "writeback=2"}, log);
        EXPECT_FALSE(bad.ok());
        auto text = load_file(log);
        EXPECT_NE(std::string(text.begin(), text.end()).find("writeback takes 0"),
                  std::string::npos);
    }
    for (std::string mode : {"writeback=0", "writeback=1"}) {
        std::string name = "/" + mode.substr(10) + ".txt";
        {
            fuse_mount m(img, mnt, {"-o", mode});
            ASSERT_TRUE(m.ok()) << mode << ": the FUSE mount did not come up";
            for (const char* piece : {"one ", "two ", "three"}) {
                int fd = ::open((mnt + name).c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
                ASSERT_GE(fd, 0) << mode;
                ASSERT_EQ(::write(fd, piece, std::strlen(piece)),
                          static_cast<ssize_t>(std::strlen(piece)));
                ::close(fd);
            }
            int fd = ::open((mnt + name).c_str(), O_WRONLY);
            ASSERT_GE(fd, 0) << mode;
            ASSERT_EQ(::pwrite(fd, "TWO", 3, 4), 3);
            ::close(fd);
            auto got = load_file(mnt + name);
            EXPECT_EQ(std::string(got.begin(), got.end()), "one TWO three") << mode;
            EXPECT_EQ(m.unmount(), 0);
        }
        EXPECT_TRUE(fsck_clean(img)) << mode;
        auto t = run("mtype -i " + img + " ::" + name);
        EXPECT_EQ(t.output, "one TWO three") << mode;
    }
}

// The mount's bdi knobs ("" where the kernel has none).
std::string bdi_knob(const std::string& mnt, const char* knob)
{
    struct stat st {};
    if (::stat(mnt.c_str(), &st) != 0) {
        return "";
    }
    std::ifstream in("/sys/class/bdi/" + std::to_string(major(st.st_dev)) + ":" +
                     std::to_string(minor(st.st_dev)) + "/" + knob);
    std::string value;
    in >> value;
    return value;
}

// Whether `fd` can be mapped MAP_SHARED: not where its open skips the page
// cache (FOPEN_DIRECT_IO, which makes the kernel refuse with ENODEV:
// libfuse 3.14 does not ask for FUSE_DIRECT_IO_ALLOW_MMAP).
bool maps_shared(int fd, size_t length)
{
    void* p = ::mmap(nullptr, length, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        EXPECT_EQ(errno, ENODEV);
        return false;
    }
    ::munmap(p, length);
    return true;
}

// Writing through (the default), a write-only open of a file nobody else
// has open skips the page cache (a copy fewer per byte), and until it is
// released the file's other opens skip it too, so that none caches what
// it writes (kernels before 2025 left such pages stale): a reader opened
// meanwhile cannot map the file shared, and reads every write at once. A
// reader opened before the writer keeps the cache (and shared mmap), and
// so does the writer then; every open caches again once the writer is
// gone. Data and fsck stay clean. Before, every open kept the cache.
TEST(FatFuse, WriteOnlyOpenSkipsThePageCacheWhileAlone)
{
    FAT_REQUIRE_FUSE();
    temp_dir tmp;
    std::string img = make_image(tmp);
    std::string mnt = tmp / "mnt";
    fs::create_directories(mnt);
    std::mt19937_64 rng(23);
    const std::string first = random_bytes(rng, 1u << 20);
    const std::string second = random_bytes(rng, 1u << 20);
    const std::string path = mnt + "/w.bin";
    std::string got(first.size(), '\0');
    {
        fuse_mount m(img, mnt);
        ASSERT_TRUE(m.ok());
        int w = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        ASSERT_GE(w, 0);
        for (size_t off = 0; off < first.size(); off += 16384) {
            ASSERT_EQ(::pwrite(w, first.data() + off, 16384, static_cast<off_t>(off)), 16384);
        }
        int r = ::open(path.c_str(), O_RDONLY);
        ASSERT_GE(r, 0);
        EXPECT_FALSE(maps_shared(r, first.size())) << "a reader beside a direct writer cached";
        ASSERT_EQ(::pread(r, got.data(), got.size(), 0), static_cast<ssize_t>(got.size()));
        EXPECT_TRUE(got == first);
        ASSERT_EQ(::pwrite(w, second.data(), 4096, 8192), 4096);
        ASSERT_EQ(::pread(r, got.data(), 4096, 8192), 4096);
        EXPECT_EQ(std::memcmp(got.data(), second.data(), 4096), 0);
        ::close(r);
        ::close(w);

        // A reader first: it and a writer opened after it keep the cache.
        r = ::open(path.c_str(), O_RDONLY);
        ASSERT_GE(r, 0);
        EXPECT_TRUE(maps_shared(r, first.size()));
        ASSERT_EQ(::pread(r, got.data(), got.size(), 0), static_cast<ssize_t>(got.size()));
        w = ::open(path.c_str(), O_WRONLY);
        ASSERT_GE(w, 0);
        ASSERT_EQ(::pwrite(w, second.data(), second.size(), 0),
                  static_cast<ssize_t>(second.size()));
        ASSERT_EQ(::pread(r, got.data(), got.size(), 0), static_cast<ssize_t>(got.size()));
        EXPECT_TRUE(got == second) << "the cached reader missed the writer's data";
        int r2 = ::open(path.c_str(), O_RDONLY);
        ASSERT_GE(r2, 0);
        EXPECT_TRUE(maps_shared(r2, first.size()));
        ::close(r2);
        ::close(w);
        ::close(r);
        EXPECT_EQ(m.unmount(), 0);
    }
    EXPECT_TRUE(fsck_clean(img));
    {
        fuse_mount m(img, mnt);
        ASSERT_TRUE(m.ok());
        auto data = load_file(path);
        EXPECT_TRUE(std::string(data.begin(), data.end()) == second);
        EXPECT_EQ(m.unmount(), 0);
    }
}

// WRITE requests are served past high-level libfuse (fuse_mount.cpp,
// write_past_libfuse): a write the volume refuses still gets its error back
// (ENOSPC once the 32 MiB volume is full, through a write-only open and a
// read-write one), the mount goes on serving, what was written before reads
// back, and fsck accepts the image.
TEST(FatFuse, WritesTheVolumeRefusesGetTheirErrorAndTheMountGoesOn)
{
    FAT_REQUIRE_FUSE();
    temp_dir tmp;
    std::string img = make_image(tmp);
    std::string mnt = tmp / "mnt";
    fs::create_directories(mnt);
    std::mt19937_64 rng(29);
    const std::string chunk = random_bytes(rng, 1u << 20);
    const std::string note = "still served\n";
    {
        fuse_mount m(img, mnt);
        ASSERT_TRUE(m.ok());
        for (const int access : {O_WRONLY, O_RDWR}) {
            const std::string path = mnt + (access == O_WRONLY ? "/fill-wo" : "/fill-rw");
            int fd = ::open(path.c_str(), access | O_CREAT | O_TRUNC, 0644);
            ASSERT_GE(fd, 0);
            int error = 0;
            for (off_t off = 0; off < (64 << 20) && error == 0; off += 1 << 20) {
                const ssize_t n = ::pwrite(fd, chunk.data(), chunk.size(), off);
                if (n < 0) {
                    error = errno;
                }
            }
            EXPECT_EQ(error, ENOSPC) << path;
            ::close(fd);
            ASSERT_EQ(::unlink(path.c_str()), 0);
        }
        write_file(mnt + "/note.txt", note);
        auto got = load_file(mnt + "/note.txt");
        EXPECT_EQ(std::string(got.begin(), got.end()), note);
        EXPECT_EQ(m.unmount(), 0);
    }
    EXPECT_TRUE(fsck_clean(img));
}

// The mount raises its own bdi's read-ahead to one 1 MiB request (the
// kernel starts every FUSE bdi at 128 KiB and INIT only lowers it, so
// max_readahead alone left sequential reads at eight requests per MiB),
// and it is still so once INIT has been answered and a file read through
// it. Before, read_ahead_kb stayed 128.
TEST(FatFuse, MountReadsAheadOneMaxSizedRequest)
{
    FAT_REQUIRE_FUSE();
    if (geteuid() != 0 || access("/sys/class/bdi", F_OK) != 0) {
        GTEST_SKIP() << "SKIP: needs root and /sys/class/bdi to set the mount's bdi";
    }
    temp_dir tmp;
    std::string img = make_image(tmp);
    std::string mnt = tmp / "mnt";
    fs::create_directories(mnt);
    std::mt19937_64 rng(5);
    const std::string data = random_bytes(rng, 3u << 20);
    {
        fuse_mount m(img, mnt);
        ASSERT_TRUE(m.ok());
        {
            std::ofstream out(mnt + "/ahead.bin", std::ios::binary);
            out.write(data.data(), static_cast<std::streamsize>(data.size()));
        }
        auto got = load_file(mnt + "/ahead.bin");
        EXPECT_TRUE(std::string(got.begin(), got.end()) == data);
        EXPECT_EQ(bdi_knob(mnt, "read_ahead_kb"), "1024");
        EXPECT_EQ(m.unmount(), 0);
    }
    EXPECT_TRUE(fsck_clean(img));
}

// -o writeback=1 lifts the limits of the mount's own bdi (strict_limit 0,
// max_ratio 100; the kernel's FUSE defaults of 1 and 1 pace a writer to an
// early bandwidth estimate) and says so in its log; the default
// (writeback=0) leaves them alone. Nothing written is lost: a writer killed
// (SIGKILL) without fsync or close, then the unmount, leave a clean image
// holding all it wrote, as does a file closed without fsync. Before, the
// writeback cache kept strict_limit 1 and max_ratio 1.
TEST(FatFuse, WritebackCacheLiftsOnlyThisMountsLimitsAndKeepsData)
{
    FAT_REQUIRE_FUSE();
    if (geteuid() != 0 || access("/sys/class/bdi", F_OK) != 0) {
        GTEST_SKIP() << "SKIP: needs root and /sys/class/bdi to set the mount's bdi";
    }
    temp_dir tmp;
    std::string img = make_image(tmp);
    std::string mnt = tmp / "mnt";
    fs::create_directories(mnt);
    {
        fuse_mount m(img, mnt);
        ASSERT_TRUE(m.ok());
        if (bdi_knob(mnt, "strict_limit").empty()) {
            GTEST_SKIP() << "SKIP: the kernel has no strict_limit for the mount's bdi";
        }
        EXPECT_EQ(bdi_knob(mnt, "strict_limit"), "1");
        EXPECT_EQ(bdi_knob(mnt, "max_ratio"), "1");
        EXPECT_EQ(m.unmount(), 0);
    }
    std::mt19937_64 rng(17);
    const std::string killed = random_bytes(rng, 6u << 20);
    const std::string closed = random_bytes(rng, 3u << 20);
    {
        std::string log = tmp / "mount.log";
        fuse_mount m(img, mnt, {"-o", "writeback=1"}, log);
        ASSERT_TRUE(m.ok());
        EXPECT_EQ(bdi_knob(mnt, "strict_limit"), "0");
        EXPECT_EQ(bdi_knob(mnt, "max_ratio"), "100");
        auto text = load_file(log);
        EXPECT_NE(
            std::string(text.begin(), text.end()).find("strict_limit 1 -> 0, max_ratio 1 -> 100"),
            std::string::npos)
            << std::string(text.begin(), text.end());
        int ready[2];
        ASSERT_EQ(::pipe(ready), 0);
        pid_t writer = fork();
        if (writer == 0) {
            int fd = ::open((mnt + "/killed.bin").c_str(), O_WRONLY | O_CREAT, 0644);
            if (fd < 0) {
                _exit(1);
            }
            for (size_t off = 0; off < killed.size(); off += 16384) {
                if (::pwrite(fd, killed.data() + off, 16384, static_cast<off_t>(off)) != 16384) {
                    _exit(1);
                }
            }
            (void)!::write(ready[1], "x", 1);
            ::pause();  // killed here, the data still dirty in the page cache
            _exit(0);
        }
        ::close(ready[1]);
        char c = 0;
        EXPECT_EQ(::read(ready[0], &c, 1), 1);
        ::close(ready[0]);
        ::kill(writer, SIGKILL);
        int st = 0;
        ::waitpid(writer, &st, 0);
        write_file(mnt + "/closed.bin", closed);  // closed, never fsynced
        EXPECT_EQ(m.unmount(), 0);
    }
    EXPECT_TRUE(fsck_clean(img));
    fuse_mount m(img, mnt);
    ASSERT_TRUE(m.ok());
    auto got = load_file(mnt + "/killed.bin");
    EXPECT_TRUE(std::string(got.begin(), got.end()) == killed) << got.size() << " bytes";
    got = load_file(mnt + "/closed.bin");
    EXPECT_TRUE(std::string(got.begin(), got.end()) == closed) << got.size() << " bytes";
    EXPECT_EQ(m.unmount(), 0);
}

}  // namespace
