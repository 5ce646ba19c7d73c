// `softblk fat mount`: the FUSE mount serves POSIX I/O, and the image is
// clean (fsck.fat) and readable by mtools after fusermount3 -u. The mount
// is always taken down, even when an assertion fails.
#include "fat_test_util.hpp"
#include "fuse_util.hpp"

#include <atomic>
#include <chrono>
#include <csignal>
#include <fcntl.h>
#include <sys/stat.h>
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

}  // namespace
