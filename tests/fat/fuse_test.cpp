// `softblk fat mount`: the FUSE mount serves POSIX I/O, and the image is
// clean (fsck.fat) and readable by mtools after fusermount3 -u; names,
// the page cache, writeback and read-ahead as the mount sets them up (the
// serving loop's own tests are fuse_serve_test.cpp). The mount is always
// taken down, even when an assertion fails.
#include "fat_test_util.hpp"
#include "fuse_util.hpp"

#include <chrono>
#include <csignal>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

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
