// The file engine against temporary files: opening (and every refusal),
// each ring operation, short transfers, the allocation map, ENOSPC on a
// small tmpfs, the O_DIRECT fall-back on ramfs, a loop block device, and
// the ring's thread rules (DEFER_TASKRUN, eventfd wake-ups, hand-over).
#include "file_engine_fixture.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <linux/falloc.h>
#include <liburing.h>
#include <poll.h>
#include <string>
#include <sys/mount.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

namespace softblk {
namespace {

using namespace file_engine_test;

std::vector<extent> map_of(const backing_file& f, uint64_t offset, uint64_t length)
{
    std::vector<extent> out;
    EXPECT_EQ(file_engine::map_extents(f.buffered_fd(), offset, length, k_block, out), 0);
    return out;
}

// Bytes the file system holds for the file (st_blocks).
uint64_t allocated_bytes(const backing_file& f)
{
    struct stat st {};
    EXPECT_EQ(::fstat(f.buffered_fd(), &st), 0);
    return static_cast<uint64_t>(st.st_blocks) * 512;
}

// ---------------------------------------------------------------- opening

TEST(BackingFile, RefusesBadPathsNamingPathAndCause)
{
    temp_dir dir;
    const std::string missing = dir.file("missing.img");
    int code = 0;
    std::string msg = open_error(missing, {}, &code);
    EXPECT_EQ(code, ENOENT);
    EXPECT_NE(msg.find(missing), std::string::npos) << msg;
    EXPECT_NE(msg.find("no such file"), std::string::npos) << msg;

    msg = open_error(missing, {.create = true});
    EXPECT_NE(msg.find("size="), std::string::npos) << msg;
    EXPECT_NE(::access(missing.c_str(), F_OK), 0) << "a refused open created the file";

    msg = open_error("relative.img", {});
    EXPECT_NE(msg.find("absolute"), std::string::npos) << msg;

    msg = open_error(dir.path(), {}, &code);
    EXPECT_EQ(code, EISDIR);
    EXPECT_NE(msg.find("directory"), std::string::npos) << msg;

    msg = open_error("/dev/null", {});
    EXPECT_NE(msg.find("not a regular file or a block device"), std::string::npos) << msg;

    make_file(dir.file("a.img"), 1 << 20);
    msg = open_error(dir.file("a.img"), {.read_only = true, .create = true, .grow_to = 1 << 20});
    EXPECT_NE(msg.find("read_only=1"), std::string::npos) << msg;
}

TEST(BackingFile, PermissionDeniedNamesTheAccessNeeded)
{
    temp_dir dir;
    const std::string path = dir.file("private.img");
    make_file(path, 1 << 20);
    ASSERT_EQ(::chmod(path.c_str(), 0600), 0);
    ASSERT_EQ(::chmod(dir.path().c_str(), 0755), 0);
    // Root may open anything: the refusal is checked as nobody, in a child.
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        if (::setgid(65534) != 0 || ::setuid(65534) != 0) {
            _exit(77);
        }
        auto f = backing_file::open(path, {});
        if (f) {
            _exit(2);
        }
        const std::string& m = f.error().message;
        _exit(m.find(path) != std::string::npos && m.find("permission denied") != std::string::npos
                  ? 0
                  : 3);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status));
    if (WEXITSTATUS(status) == 77) {
        GTEST_SKIP() << "cannot drop privileges to uid 65534 here";
    }
    EXPECT_EQ(WEXITSTATUS(status), 0) << "2: opened; 3: message lacks the path or the cause";
}

TEST(BackingFile, CreatesSparseGrowsNeverTruncates)
{
    temp_dir dir;
    const std::string path = dir.file("new.img");
    {
        auto f = open_file(path, {.create = true, .grow_to = 64 << 20});
        ASSERT_TRUE(f);
        EXPECT_EQ(f->size(), 64u << 20);
        struct stat st {};
        ASSERT_EQ(::stat(path.c_str(), &st), 0);
        EXPECT_LT(st.st_blocks * 512, 1 << 20) << "the new file is not sparse";
        ASSERT_EQ(::pwrite(f->buffered_fd(), "persist", 7, 4096), 7);
    }
    {
        // Asked for less than it has: the file keeps its size and data.
        auto f = open_file(path, {.create = true, .grow_to = 1 << 20});
        ASSERT_TRUE(f);
        EXPECT_EQ(f->size(), 64u << 20);
    }
    auto f = open_file(path, {.create = true, .grow_to = 128 << 20});
    ASSERT_TRUE(f);
    EXPECT_EQ(f->size(), 128u << 20);
    char back[8] = {};
    ASSERT_EQ(::pread(f->buffered_fd(), back, 7, 4096), 7);
    EXPECT_STREQ(back, "persist");
}

TEST(BackingFile, FlockRefusesASecondWriterButSharesReadOnly)
{
    temp_dir dir;
    const std::string path = dir.file("shared.img");
    make_file(path, 1 << 20);
    {
        auto first = open_file(path, {});
        int code = 0;
        const std::string msg = open_error(path, {}, &code);
        EXPECT_EQ(code, EBUSY);
        EXPECT_NE(msg.find(path), std::string::npos) << msg;
        EXPECT_NE(msg.find("in use by another device"), std::string::npos) << msg;
        open_error(path, {.read_only = true});
    }
    auto a = open_file(path, {.read_only = true});
    auto b = open_file(path, {.read_only = true});
    EXPECT_TRUE(a && b);
    open_error(path, {});
}

TEST(BackingFile, DirectIoByDefaultWithAlignment)
{
    temp_dir dir;
    const std::string path = dir.file("direct.img");
    make_file(path, 1 << 20);
    auto f = open_file(path, {});
    ASSERT_TRUE(f);
    EXPECT_TRUE(f->direct()) << f->direct_refused();
    EXPECT_TRUE(f->direct_refused().empty());
    EXPECT_GE(f->min_block_size(), 512u);
    EXPECT_NE(f->fd(), f->buffered_fd());
    EXPECT_EQ(::fcntl(f->fd(), F_GETFL) & O_DIRECT, O_DIRECT);

    open_error(path, {.read_only = true, .buffered_io = true});  // a writer holds it
    f.reset();
    auto g = open_file(path, {.buffered_io = true});
    ASSERT_TRUE(g);
    EXPECT_FALSE(g->direct());
    EXPECT_TRUE(g->direct_refused().empty()) << "buffered_io=1 is not a refusal";
    EXPECT_EQ(g->fd(), g->buffered_fd());
}

TEST(BackingFile, RamfsRefusesODirectAndFallsBackToBuffered)
{
    if (::geteuid() != 0) {
        GTEST_SKIP() << "mounting ramfs needs root";
    }
    temp_dir dir;
    const std::string mnt = dir.mount("ramfs", "ramfs", "");
    if (mnt.empty()) {
        GTEST_SKIP() << "cannot mount ramfs: " << std::strerror(errno);
    }
    const std::string path = mnt + "/image";
    auto f = open_file(path, {.create = true, .grow_to = 1 << 20});
    ASSERT_TRUE(f);
    if (f->direct()) {
        GTEST_SKIP() << "this kernel's ramfs accepts O_DIRECT";
    }
    EXPECT_NE(f->direct_refused().find("ramfs"), std::string::npos) << f->direct_refused();
    EXPECT_NE(f->direct_refused().find("O_DIRECT"), std::string::npos) << f->direct_refused();
    ring_fixture t(*f);
    aligned_buffer w(8192), r(8192);
    fill(w.data, w.size, 3);
    EXPECT_EQ(t.write(4096, w.data, 8192), 8192);
    EXPECT_EQ(t.read(4096, r.data, 8192), 8192);
    EXPECT_EQ(std::memcmp(w.data, r.data, 8192), 0);
}

// ---------------------------------------------------------------- the ring

TEST(FileRing, ReadWriteFuaFlushRoundTrip)
{
    temp_dir dir;
    auto f = open_file(dir.file("rw.img"), {.create = true, .grow_to = 4 << 20});
    ASSERT_TRUE(f);
    ring_fixture t(*f);
    aligned_buffer w(65536), r(65536);
    fill(w.data, w.size, 1);
    EXPECT_EQ(t.write(0, w.data, 65536), 65536);
    EXPECT_EQ(t.write(1 << 20, w.data, 4096, true), 4096);
    EXPECT_EQ(t.flush(), 0);
    EXPECT_EQ(t.read(0, r.data, 65536), 65536);
    EXPECT_EQ(std::memcmp(w.data, r.data, 65536), 0);
    EXPECT_EQ(t.read(1 << 20, r.data, 4096), 4096);
    EXPECT_EQ(std::memcmp(w.data, r.data, 4096), 0);
    EXPECT_EQ(t.stats.unaligned_buffered.load(), 0u);
    EXPECT_EQ(t.ring->in_flight(), 0u);
    // What the ring wrote is in the file.
    char direct_check[16];
    ASSERT_EQ(::pread(f->buffered_fd(), direct_check, 16, 1 << 20), 16);
    EXPECT_EQ(std::memcmp(direct_check, w.data, 16), 0);
}

TEST(FileRing, AnAppendAloneIsWrittenByPollAndOneWithCompanyByTheRing)
{
    temp_dir dir;
    make_file(dir.file("zone"), 0);
    auto f = open_file(dir.file("zone"), {});
    ASSERT_TRUE(f);
    if (f->memory_file_system()) {
        GTEST_SKIP() << dir.path() << " is in RAM: appends there are copied like every write";
    }
    ring_fixture t(*f);
    aligned_buffer w(3 * 65536), r(3 * 65536);
    fill(w.data, w.size, 4);
    auto file_size = [&] {
        struct stat st {};
        EXPECT_EQ(::fstat(f->buffered_fd(), &st), 0);
        return static_cast<uint64_t>(st.st_size);
    };

    // Alone: held until poll(), which writes it on this thread.
    io_request a = ring_fixture::request(io_op::write, 0, 65536, w.data);
    t.ring->append(a, 0, 0, false);
    EXPECT_EQ(a.state, 0) << "an append completed inside the call, before the owner's poll()";
    EXPECT_EQ(t.ring->next_wakeup_ns(), 0u) << "the owner would sleep on a held append";
    EXPECT_EQ(t.ring->poll(), 1u);
    EXPECT_EQ(a.state, 1) << "poll() did not write the append it held";
    EXPECT_EQ(a.status, 65536);
    EXPECT_EQ(t.stats.held_appends.load(), 1u);
    EXPECT_EQ(file_size(), 65536u);

    // Two in one batch: the second's arrival puts the first in the ring
    // (ahead of it), and both go through the ring.
    io_request b = ring_fixture::request(io_op::write, 65536, 65536, w.data + 65536);
    io_request c = ring_fixture::request(io_op::write, 131072, 65536, w.data + 131072);
    t.ring->append(b, 0, 65536, false);
    t.ring->append(c, 0, 131072, false);
    EXPECT_EQ(t.wait(b), 65536);
    EXPECT_EQ(t.wait(c), 65536);
    EXPECT_EQ(t.stats.held_appends.load(), 1u) << "an append with company was written by poll()";
    EXPECT_EQ(file_size(), 3u * 65536);
    EXPECT_EQ(t.read(0, r.data, 3 * 65536), 3 * 65536);
    EXPECT_EQ(std::memcmp(w.data, r.data, 3 * 65536), 0);

    // Behind a request already in the ring: not held.
    io_request rd = ring_fixture::request(io_op::read, 0, 4096, r.data);
    t.ring->read(rd, 0, 0);
    io_request d = ring_fixture::request(io_op::write, 3 * 65536, 4096, w.data);
    t.ring->append(d, 0, 3 * 65536, false);
    EXPECT_EQ(t.wait(rd), 4096);
    EXPECT_EQ(t.wait(d), 4096);
    EXPECT_EQ(t.stats.held_appends.load(), 1u);

    // An unaligned buffer goes to the buffered descriptor on the held path
    // too, and lands.
    io_request e = ring_fixture::request(io_op::write, 3 * 65536 + 4096, 1000, w.data + 1);
    t.ring->append(e, 0, 3 * 65536 + 4096, false);
    EXPECT_EQ(t.wait(e), 1000);
    EXPECT_EQ(t.stats.held_appends.load(), 2u);
    EXPECT_EQ(file_size(), 3u * 65536 + 4096 + 1000);
    char back[1000];
    ASSERT_EQ(::pread(f->buffered_fd(), back, sizeof back, 3 * 65536 + 4096), 1000);
    EXPECT_EQ(std::memcmp(back, w.data + 1, 1000), 0);
    EXPECT_EQ(t.ring->in_flight(), 0u);
}

TEST(FileRing, AHeldAppendThatFailsCompletesWithTheError)
{
    temp_dir dir;
    const std::string path = dir.file("ro-zone");
    make_file(path, 0);
    auto f = open_file(path, {.read_only = true});
    ASSERT_TRUE(f);
    ring_fixture t(*f);
    aligned_buffer w(4096);
    io_request a = ring_fixture::request(io_op::write, 0, 4096, w.data);
    t.ring->append(a, 0, 0, false);
    EXPECT_LT(t.wait(a), 0);
    EXPECT_EQ(t.ring->in_flight(), 0u);
}

TEST(FileRing, UnalignedBufferGoesThroughThePageCache)
{
    temp_dir dir;
    auto f = open_file(dir.file("unaligned.img"), {.create = true, .grow_to = 1 << 20});
    ASSERT_TRUE(f);
    ASSERT_TRUE(f->direct());
    ring_fixture t(*f);
    aligned_buffer w(8192 + 64), r(8192 + 64);
    fill(w.data + 8, 8192, 2);
    EXPECT_EQ(t.write(8192, w.data + 8, 8192), 8192);
    // A direct read of the same range sees the buffered write.
    EXPECT_EQ(t.read(8192, r.data, 8192), 8192);
    EXPECT_EQ(std::memcmp(w.data + 8, r.data, 8192), 0);
    EXPECT_EQ(t.read(8192, r.data + 8, 8192), 8192);
    EXPECT_EQ(std::memcmp(w.data + 8, r.data + 8, 8192), 0);
    EXPECT_EQ(t.stats.unaligned_buffered.load(), 2u);
}

TEST(FileRing, ShortReadAtEndOfFileIsFinishedWithZeros)
{
    temp_dir dir;
    const std::string path = dir.file("short.img");
    make_file(path, 6000);
    auto f = open_file(path, {.buffered_io = true});
    ASSERT_TRUE(f);
    ASSERT_EQ(::pwrite(f->fd(), std::string(6000, 'x').data(), 6000, 0), 6000);
    ring_fixture t(*f);
    std::vector<char> r(8192, 'q');
    EXPECT_EQ(t.read(0, r.data(), 8192), 8192) << "a short read must not complete short";
    EXPECT_EQ(r[5999], 'x');
    EXPECT_EQ(r[6000], 0);
    EXPECT_EQ(r[8191], 0);
    EXPECT_GE(t.stats.short_transfers.load(), 1u);
}

TEST(FileRing, DiscardPunchesAHoleAndTheMapShowsIt)
{
    temp_dir dir;
    auto f = open_file(dir.file("holes.img"), {.create = true, .grow_to = 8 << 20});
    ASSERT_TRUE(f);
    ring_fixture t(*f);

    // A new sparse file is one hole.
    auto m = map_of(*f, 0, 8 << 20);
    ASSERT_EQ(m.size(), 1u);
    EXPECT_FALSE(m[0].allocated);
    EXPECT_TRUE(m[0].zero);

    aligned_buffer w(1 << 20);
    fill(w.data, w.size, 4);
    ASSERT_EQ(t.write(1 << 20, w.data, 1 << 20), 1 << 20);
    ASSERT_EQ(t.flush(), 0);
    m = map_of(*f, 0, 8 << 20);
    ASSERT_EQ(m.size(), 3u);
    EXPECT_EQ(m[0].offset, 0u);
    EXPECT_FALSE(m[0].allocated);
    EXPECT_EQ(m[1].offset, 1u << 20);
    EXPECT_EQ(m[1].length, 1u << 20);
    EXPECT_TRUE(m[1].allocated);
    EXPECT_FALSE(m[1].zero);
    EXPECT_EQ(m[2].offset, 2u << 20);
    EXPECT_EQ(m[2].length, 6u << 20);
    EXPECT_FALSE(m[2].allocated);

    // Punch the middle of the data.
    ASSERT_EQ(t.discard((1 << 20) + 65536, 65536), 0);
    m = map_of(*f, 1 << 20, 1 << 20);
    ASSERT_EQ(m.size(), 3u);
    EXPECT_TRUE(m[0].allocated);
    EXPECT_EQ(m[0].length, 65536u);
    EXPECT_FALSE(m[1].allocated);
    EXPECT_EQ(m[1].length, 65536u);
    EXPECT_TRUE(m[2].allocated);
    aligned_buffer r(65536);
    std::memset(r.data, 0x5a, r.size);
    ASSERT_EQ(t.read((1 << 20) + 65536, r.data, 65536), 65536);
    EXPECT_EQ(std::memcmp(r.data, aligned_buffer(65536).data, 65536), 0);

    // A map asked with a larger block counts a partial hole as data.
    std::vector<extent> coarse;
    ASSERT_EQ(file_engine::map_extents(f->buffered_fd(), 1 << 20, 1 << 20, 1 << 20, coarse), 0);
    ASSERT_EQ(coarse.size(), 1u);
    EXPECT_TRUE(coarse[0].allocated);
}

TEST(FileRing, WriteZeroesUnmapPunchesNoUnmapKeepsAllocated)
{
    temp_dir dir;
    auto f = open_file(dir.file("zero.img"), {.create = true, .grow_to = 4 << 20});
    ASSERT_TRUE(f);
    ring_fixture t(*f);
    aligned_buffer w(1 << 20), r(1 << 20), zeros(1 << 20);
    fill(w.data, w.size, 5);
    ASSERT_EQ(t.write(0, w.data, 1 << 20), 1 << 20);

    ASSERT_EQ(t.flush(), 0);
    const uint64_t blocks_before = allocated_bytes(*f);
    ASSERT_EQ(t.write_zeroes(0, 262144, false), 0);
    // ZERO_RANGE keeps the space (SEEK_DATA may call the unwritten extent a
    // hole: it reads as zeros either way).
    EXPECT_EQ(allocated_bytes(*f), blocks_before) << "ZERO_RANGE must keep the range allocated";
    auto m = map_of(*f, 0, 262144);
    ASSERT_EQ(m.size(), 1u);
    EXPECT_TRUE(!m[0].allocated || !m[0].zero);
    ASSERT_EQ(t.read(0, r.data, 262144), 262144);
    EXPECT_EQ(std::memcmp(r.data, zeros.data, 262144), 0);

    ASSERT_EQ(t.write_zeroes(524288, 262144, true), 0);
    EXPECT_EQ(allocated_bytes(*f), blocks_before - 262144) << "unmap must deallocate";
    m = map_of(*f, 524288, 262144);
    ASSERT_EQ(m.size(), 1u);
    EXPECT_FALSE(m[0].allocated);
    ASSERT_EQ(t.read(262144, r.data, 786432), 786432);
    EXPECT_EQ(std::memcmp(r.data, w.data + 262144, 262144), 0);
    EXPECT_EQ(std::memcmp(r.data + 262144, zeros.data, 262144), 0);
    EXPECT_EQ(std::memcmp(r.data + 524288, w.data + 786432, 262144), 0);
}

TEST(FileRing, ZeroRangeIsEmulatedWhereTheFileSystemLacksIt)
{
    if (::geteuid() != 0) {
        GTEST_SKIP() << "mounting tmpfs needs root";
    }
    temp_dir dir;
    const std::string mnt = dir.mount("tmpfs", "tmpfs", "size=16m");
    if (mnt.empty()) {
        GTEST_SKIP() << "cannot mount tmpfs: " << std::strerror(errno);
    }
    auto f = open_file(mnt + "/image", {.create = true, .grow_to = 4 << 20});
    ASSERT_TRUE(f);
    const int probe =
        ::fallocate(f->buffered_fd(), FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE, 0, 4096);
    if (probe == 0) {
        GTEST_SKIP() << "this kernel's tmpfs has FALLOC_FL_ZERO_RANGE";
    }
    ring_fixture t(*f);
    aligned_buffer w(65536), r(65536), zeros(65536);
    fill(w.data, w.size, 6);
    ASSERT_EQ(t.write(0, w.data, 65536), 65536);
    const uint64_t before = allocated_bytes(*f);
    ASSERT_EQ(t.write_zeroes(0, 65536, false), 0);
    EXPECT_TRUE(t.stats.no_zero_range.load());
    EXPECT_EQ(t.stats.zero_range_emulated.load(), 1u);
    EXPECT_EQ(allocated_bytes(*f), before) << "punch + allocate leaves the range allocated";
    ASSERT_EQ(t.read(0, r.data, 65536), 65536);
    EXPECT_EQ(std::memcmp(r.data, zeros.data, 65536), 0);
}

TEST(FileRing, MemoryFileSystemIsCopiedWithoutTheRing)
{
    if (::geteuid() != 0) {
        GTEST_SKIP() << "mounting tmpfs needs root";
    }
    temp_dir dir;
    const std::string mnt = dir.mount("mem", "tmpfs", "size=16m");
    if (mnt.empty()) {
        GTEST_SKIP() << "cannot mount tmpfs: " << std::strerror(errno);
    }
    auto f = open_file(mnt + "/image", {.create = true, .grow_to = 4 << 20});
    ASSERT_TRUE(f);
    EXPECT_TRUE(f->memory_file_system());
    ring_fixture t(*f);
    aligned_buffer w(65536), r(65536);
    fill(w.data, w.size, 10);
    // Done inside the call: no ring round trip, no worker thread.
    io_request req = ring_fixture::request(io_op::write, 0, 65536, w.data);
    t.ring->write(req, 0, 0, true);
    EXPECT_EQ(req.state, 1) << "a tmpfs write did not complete inside the call";
    EXPECT_EQ(req.status, 65536);
    EXPECT_EQ(t.read(0, r.data, 65536), 65536);
    EXPECT_EQ(std::memcmp(w.data, r.data, 65536), 0);
    EXPECT_EQ(t.stats.memory_copies.load(), 2u);
    EXPECT_EQ(t.ring->in_flight(), 0u);
    // A file on a disk's file system (the test's /tmp, unless that is
    // tmpfs too) goes through the ring.
    auto g = open_file(dir.file("disk.img"), {.create = true, .grow_to = 1 << 20});
    ASSERT_TRUE(g);
    struct statfs fs {};
    ASSERT_EQ(::statfs(dir.path().c_str(), &fs), 0);
    if (fs.f_type != TMPFS_MAGIC) {
        EXPECT_FALSE(g->memory_file_system());
    }
}

TEST(FileRing, EnospcFailsTheRequestAndTheRingKeepsServing)
{
    if (::geteuid() != 0) {
        GTEST_SKIP() << "mounting tmpfs needs root";
    }
    temp_dir dir;
    const std::string mnt = dir.mount("small", "tmpfs", "size=1m");
    if (mnt.empty()) {
        GTEST_SKIP() << "cannot mount tmpfs: " << std::strerror(errno);
    }
    auto f = open_file(mnt + "/sparse.img", {.create = true, .grow_to = 16 << 20});
    ASSERT_TRUE(f);
    ring_fixture t(*f);
    aligned_buffer w(1 << 20), r(1 << 20);
    fill(w.data, w.size, 7);
    ASSERT_EQ(t.write(0, w.data, 262144), 262144);
    int rc = 0;
    for (uint64_t off = 1 << 20; off < (16u << 20) && rc >= 0; off += 1 << 20) {
        rc = t.write(off, w.data, 1 << 20);
    }
    EXPECT_EQ(rc, -ENOSPC) << "a full file system must fail the write, never complete it short";
    // The device keeps serving: reads and rewrites of allocated blocks.
    EXPECT_EQ(t.read(0, r.data, 262144), 262144);
    EXPECT_EQ(std::memcmp(r.data, w.data, 262144), 0);
    EXPECT_EQ(t.write(0, w.data + 4096, 4096), 4096);
    EXPECT_EQ(t.flush(), 0);
}

TEST(FileRing, ReadOnlyFileRefusesWrites)
{
    temp_dir dir;
    const std::string path = dir.file("ro.img");
    make_file(path, 1 << 20);
    auto f = open_file(path, {.read_only = true});
    ASSERT_TRUE(f);
    EXPECT_EQ(f->max_discard_bytes(), 0u);
    ring_fixture t(*f);
    aligned_buffer w(4096);
    EXPECT_LT(t.write(0, w.data, 4096), 0);
    EXPECT_EQ(t.read(0, w.data, 4096), 4096);
}

TEST(FileRing, ManyRequestsBeyondTheRingSize)
{
    temp_dir dir;
    auto f = open_file(dir.file("many.img"), {.create = true, .grow_to = 8 << 20});
    ASSERT_TRUE(f);
    ring_fixture t(*f, 4);
    constexpr unsigned n = 256;
    aligned_buffer buf(n * 4096);
    for (unsigned i = 0; i < n; ++i) {
        fill(buf.data + i * 4096, 4096, i);
    }
    std::vector<io_request> reqs(n);
    for (unsigned i = 0; i < n; ++i) {
        reqs[i] = ring_fixture::request(io_op::write, i * 4096u, 4096, buf.data + i * 4096);
        t.ring->write(reqs[i], 0, i * 4096u, false);
    }
    for (unsigned i = 0; i < n; ++i) {
        ASSERT_EQ(t.wait(reqs[i]), 4096);
    }
    aligned_buffer r(n * 4096);
    ASSERT_EQ(t.read(0, r.data, n * 4096), static_cast<int>(n * 4096));
    EXPECT_EQ(std::memcmp(r.data, buf.data, n * 4096), 0);
}

// ---------------------------------------------------------------- block device

TEST(FileRing, LoopBlockDevice)
{
    if (::geteuid() != 0 || ::access("/dev/loop-control", F_OK) != 0) {
        GTEST_SKIP() << "needs root and /dev/loop-control";
    }
    temp_dir dir;
    const std::string backing = dir.file("loop-backing.img");
    make_file(backing, 16 << 20);
    const std::string cmd = "losetup --find --show '" + backing + "' 2>/dev/null";
    FILE* p = ::popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    char line[64] = {};
    const bool got = std::fgets(line, sizeof line, p) != nullptr;
    ::pclose(p);
    if (!got) {
        GTEST_SKIP() << "losetup found no free loop device";
    }
    std::string loop(line);
    loop.erase(loop.find_last_not_of('\n') + 1);
    struct detach {
        std::string dev;
        ~detach()
        {
            const std::string c = "losetup -d " + dev;
            [[maybe_unused]] int rc = std::system(c.c_str());
        }
    } detach_loop{loop};

    auto f = open_file(loop, {});
    ASSERT_TRUE(f);
    EXPECT_TRUE(f->block_device());
    EXPECT_EQ(f->size(), 16u << 20);
    EXPECT_EQ(f->min_block_size(), 512u);
    // A second writer (O_EXCL, flock) is refused.
    open_error(loop, {});
    // A block device cannot grow.
    f.reset();
    std::string msg = open_error(loop, {.create = true, .grow_to = 32 << 20});
    EXPECT_NE(msg.find("cannot grow"), std::string::npos) << msg;
    f = open_file(loop, {});
    ASSERT_TRUE(f);

    ring_fixture t(*f);
    aligned_buffer w(1 << 20), r(1 << 20), zeros(1 << 20);
    fill(w.data, w.size, 9);
    ASSERT_EQ(t.write(0, w.data, 1 << 20, true), 1 << 20);
    ASSERT_EQ(t.flush(), 0);
    ASSERT_EQ(t.read(0, r.data, 1 << 20), 1 << 20);
    EXPECT_EQ(std::memcmp(w.data, r.data, 1 << 20), 0);
    ASSERT_EQ(t.write_zeroes(0, 65536, false), 0);
    ASSERT_EQ(t.write_zeroes(65536, 65536, true), 0);
    ASSERT_EQ(t.read(0, r.data, 131072), 131072);
    EXPECT_EQ(std::memcmp(r.data, zeros.data, 131072), 0);
    if (f->max_discard_bytes() != 0) {
        EXPECT_EQ(t.discard(262144, 65536), 0);
    }
    // A block device has no SEEK_DATA: all data.
    auto m = map_of(*f, 0, 16 << 20);
    ASSERT_EQ(m.size(), 1u);
    EXPECT_TRUE(m[0].allocated);
}

}  // namespace
}  // namespace softblk
