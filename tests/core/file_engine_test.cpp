// The file engine against temporary files: opening (and every refusal),
// each ring operation, short transfers, the allocation map, ENOSPC on a
// small tmpfs, the O_DIRECT fall-back on ramfs, a loop block device, and
// the ring's thread rules (DEFER_TASKRUN, eventfd wake-ups, hand-over).
#include <softblk/file_engine.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <csignal>
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
#include <thread>
#include <unistd.h>
#include <vector>

namespace softblk {
namespace {

constexpr uint32_t k_block = 4096;

// A directory of its own under /tmp, removed with what it holds.
class temp_dir {
public:
    temp_dir()
    {
        char name[] = "/tmp/softblk-file-engine-XXXXXX";
        _path = ::mkdtemp(name);
    }
    ~temp_dir()
    {
        for (const std::string& m : _mounts) {
            ::umount2(m.c_str(), MNT_DETACH);
        }
        std::string cmd = "rm -rf '" + _path + "'";
        [[maybe_unused]] int rc = std::system(cmd.c_str());
    }
    const std::string& path() const { return _path; }
    std::string file(const std::string& name) const { return _path + "/" + name; }
    // Mounts `type` with `data` on a new subdirectory; "" if the mount fails.
    std::string mount(const std::string& name, const char* type, const char* data)
    {
        const std::string dir = file(name);
        ::mkdir(dir.c_str(), 0755);
        if (::mount(type, dir.c_str(), type, 0, data) != 0) {
            return {};
        }
        _mounts.push_back(dir);
        return dir;
    }

private:
    std::string _path;
    std::vector<std::string> _mounts;
};

struct aligned_buffer {
    explicit aligned_buffer(size_t n) : size(n)
    {
        // aligned_alloc wants a size that is a multiple of the alignment
        // (ASan refuses the unaligned 8256 bytes of a test below).
        const size_t rounded = (n + 4095) / 4096 * 4096;
        data = static_cast<char*>(std::aligned_alloc(4096, rounded));
        std::memset(data, 0, rounded);
    }
    ~aligned_buffer() { std::free(data); }
    char* data;
    size_t size;
};

void fill(char* p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; ++i) {
        p[i] = static_cast<char>((i * 131 + seed * 17 + (i >> 12)) & 0xff);
    }
}

// Records completions; the requests are the test's own.
class recording_sink final : public completion_sink {
public:
    void complete(io_request& r, int result) override
    {
        r.status = result;
        r.state = 1;
        ++completed;
    }
    unsigned completed = 0;
};

std::unique_ptr<backing_file> open_file(const std::string& path, backing_file_options o)
{
    auto f = backing_file::open(path, o);
    EXPECT_TRUE(f.has_value()) << (f ? "" : f.error().message);
    return f ? std::move(*f) : nullptr;
}

std::string open_error(const std::string& path, backing_file_options o, int* code = nullptr)
{
    auto f = backing_file::open(path, o);
    EXPECT_FALSE(f.has_value()) << path << " opened but should be refused";
    if (f) {
        return {};
    }
    if (code != nullptr) {
        *code = f.error().code.value();
    }
    return f.error().message;
}

void make_file(const std::string& path, uint64_t size)
{
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(size)), 0);
    ::close(fd);
}

// One ring over one file, and a way to run one request to completion,
// sleeping on the ring's eventfd as a queue owner does.
struct ring_fixture {
    explicit ring_fixture(backing_file& f, unsigned depth = 8)
    {
        backing_file* files[] = {&f};
        auto r = file_ring::create(files, depth, sink, stats);
        EXPECT_TRUE(r.has_value()) << (r ? "" : r.error().message);
        ring = std::move(*r);
    }

    // Waits until `r` completed; returns its result (INT_MIN on timeout).
    int wait(io_request& r)
    {
        for (int i = 0; i < 5000 && r.state == 0; ++i) {
            ring->poll();
            if (r.state != 0 || ring->next_wakeup_ns() == 0) {
                continue;
            }
            pollfd p{ring->event_fd(), POLLIN, 0};
            ::poll(&p, 1, 10);
        }
        return r.state != 0 ? r.status : INT_MIN;
    }

    static io_request request(io_op op, uint64_t offset, uint32_t length, void* buffer)
    {
        io_request r;
        r.op = op;
        r.offset = offset;
        r.length = length;
        r.buffer = buffer;
        return r;
    }

    int read(uint64_t offset, void* buffer, uint32_t length)
    {
        io_request r = request(io_op::read, offset, length, buffer);
        ring->read(r, 0, offset);
        return wait(r);
    }
    int write(uint64_t offset, const void* buffer, uint32_t length, bool fua = false)
    {
        io_request r = request(io_op::write, offset, length, const_cast<void*>(buffer));
        ring->write(r, 0, offset, fua);
        return wait(r);
    }
    int flush()
    {
        io_request r = request(io_op::flush, 0, 0, nullptr);
        ring->flush(r, 0);
        return wait(r);
    }
    int write_zeroes(uint64_t offset, uint32_t length, bool unmap)
    {
        io_request r = request(io_op::write_zeroes, offset, length, nullptr);
        ring->write_zeroes(r, 0, offset, length, unmap);
        return wait(r);
    }
    int discard(uint64_t offset, uint32_t length)
    {
        io_request r = request(io_op::discard, offset, length, nullptr);
        ring->discard(r, 0, offset, length);
        return wait(r);
    }

    recording_sink sink;
    file_engine_stats stats;
    std::unique_ptr<file_ring> ring;
};

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

// Data in the kernel (ublk's zero copy) cannot be made on this host
// without ublk: the register and unregister entries here are stand-ins
// that count themselves, and the VM test zero_copy_ublk writes real
// request pages. What is checked: each buffer registered once and
// unregistered once, after its write and before its completion, the
// write never held, a refused registration failing the write with its
// own errno and nothing to unregister.
struct kernel_buffer_counts {
    static inline int registers = 0;
    static inline int unregisters = 0;
};

void prep_nop_register(::io_uring_sqe& sqe, const kernel_buffer&)
{
    ++kernel_buffer_counts::registers;
    io_uring_prep_nop(&sqe);
}

void prep_nop_unregister(::io_uring_sqe& sqe, const kernel_buffer&)
{
    ++kernel_buffer_counts::unregisters;
    io_uring_prep_nop(&sqe);
}

// A command the file's driver does not have: the register entry fails.
void prep_refused_register(::io_uring_sqe& sqe, const kernel_buffer& kb)
{
    ++kernel_buffer_counts::registers;
    io_uring_prep_rw(IORING_OP_URING_CMD, &sqe, kb.fd, nullptr, 0, 0);
}

TEST(FileRing, AKernelBufferIsRegisteredOnceAndUnregisteredBeforeItCompletes)
{
    temp_dir dir;
    make_file(dir.file("zone"), 0);
    auto f = open_file(dir.file("zone"), {});
    ASSERT_TRUE(f);
    ring_fixture t(*f);
    const bool deferred = t.ring->mode() == ring_mode::defer_taskrun;
    kernel_buffer_counts::registers = kernel_buffer_counts::unregisters = 0;
    // A request in flight when the first kernel buffer comes: a
    // DEFER_TASKRUN ring is rebuilt only after it completed.
    aligned_buffer first(4096);
    fill(first.data, first.size, 3);
    io_request before = ring_fixture::request(io_op::write, 8192, 4096, first.data);
    t.ring->write(before, 0, 8192, false);
    const kernel_buffer kb{.prep_register = &prep_nop_register,
                           .prep_unregister = &prep_nop_unregister,
                           .fd = f->buffered_fd(),
                           .index = 3,
                           .slots = 8};
    io_request a = ring_fixture::request(io_op::write, 0, 65536, nullptr);
    a.kernel_data = &kb;
    t.ring->append(a, 0, 0, false);
    EXPECT_EQ(kernel_buffer_counts::registers, deferred ? 0 : 1)
        << "registered while the ring still had DEFER_TASKRUN";
    EXPECT_EQ(t.wait(before), 4096);
    EXPECT_NE(t.ring->mode(), ring_mode::defer_taskrun);
    EXPECT_EQ(t.stats.kernel_buffer_rings.load(), deferred ? 1u : 0u);
    EXPECT_EQ(kernel_buffer_counts::registers, 1);
    EXPECT_EQ(kernel_buffer_counts::unregisters, 0) << "unregistered before its write ran";
    // Slot 3 holds nothing (the stand-in registered nothing): the kernel
    // fails the write, and the buffer is still unregistered.
    EXPECT_EQ(t.wait(a), -EFAULT);
    EXPECT_EQ(kernel_buffer_counts::registers, 1);
    EXPECT_EQ(kernel_buffer_counts::unregisters, 1);
    EXPECT_EQ(t.stats.held_appends.load(), 0u) << "data in the kernel was held for pwritev2";
    EXPECT_EQ(t.stats.kernel_buffer_writes.load(), 1u);
    EXPECT_EQ(t.stats.kernel_buffer_errors.load(), 0u);
    EXPECT_EQ(t.ring->in_flight(), 0u);
    t.ring->poll();  // the unregister entry goes to the kernel
    EXPECT_EQ(t.ring->next_wakeup_ns(), UINT64_MAX) << "the ring kept work after the last entry";

    // A slot beyond the table: refused without an entry.
    const kernel_buffer beyond{.prep_register = &prep_nop_register,
                               .prep_unregister = &prep_nop_unregister,
                               .fd = f->buffered_fd(),
                               .index = 8,
                               .slots = 8};
    io_request b = ring_fixture::request(io_op::write, 0, 4096, nullptr);
    b.kernel_data = &beyond;
    t.ring->write(b, 0, 0, false);
    EXPECT_EQ(t.wait(b), -EINVAL);
    EXPECT_EQ(kernel_buffer_counts::registers, 1);

    // A registration the kernel refuses: the write fails with its errno
    // (not the ECANCELED of a broken link) and nothing is unregistered.
    const kernel_buffer refused{.prep_register = &prep_refused_register,
                                .prep_unregister = &prep_nop_unregister,
                                .fd = f->buffered_fd(),
                                .index = 0,
                                .slots = 8};
    io_request c = ring_fixture::request(io_op::write, 0, 4096, nullptr);
    c.kernel_data = &refused;
    t.ring->write(c, 0, 0, true);
    const int rc = t.wait(c);
    EXPECT_LT(rc, 0);
    EXPECT_NE(rc, -ECANCELED);
    EXPECT_NE(rc, INT_MIN) << "the refused registration left its write in flight";
    EXPECT_EQ(kernel_buffer_counts::registers, 2);
    EXPECT_EQ(kernel_buffer_counts::unregisters, 1);
    EXPECT_EQ(t.stats.kernel_buffer_errors.load(), 1u);

    // The ring still serves ordinary requests; the file holds what they
    // wrote, and nothing of the failed writes.
    aligned_buffer w(4096), back(12288);
    fill(w.data, w.size, 7);
    EXPECT_EQ(t.write(0, w.data, 4096), 4096);
    struct stat st {};
    ASSERT_EQ(::fstat(f->buffered_fd(), &st), 0);
    EXPECT_EQ(st.st_size, 12288);
    EXPECT_EQ(t.read(0, back.data, 12288), 12288);
    EXPECT_EQ(std::memcmp(back.data, w.data, 4096), 0);
    EXPECT_EQ(std::memcmp(back.data + 8192, first.data, 4096), 0);
    EXPECT_EQ(std::count(back.data + 4096, back.data + 8192, 0), 4096);
}

// A queue owner's io_uring lent to the file ring (ublk's queue thread):
// the file ring's entries go there, the owner submits them with its own
// and passes back the completions that are not its own (bit 63 clear).
struct owner_ring {
    owner_ring()
    {
        io_uring_params p{};
        p.flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN;
        if (io_uring_queue_init_params(64, &ring, &p) < 0) {
            io_uring_params plain{};
            EXPECT_EQ(io_uring_queue_init_params(64, &ring, &plain), 0);
        }
    }
    ~owner_ring() { io_uring_queue_exit(&ring); }

    // An entry of the owner's own.
    void own_nop()
    {
        io_uring_sqe* sqe = io_uring_get_sqe(&ring);
        io_uring_prep_nop(sqe);
        io_uring_sqe_set_data64(sqe, (uint64_t{1} << 63) | 7);
    }

    // Runs the owner's loop until `r` completed: the queue's poll(), a
    // submit and wait, the completions handed out. Returns r's result
    // (INT_MIN on timeout).
    int wait(file_ring& fr, io_request& r)
    {
        for (int i = 0; i < 5000 && r.state == 0; ++i) {
            fr.poll();
            if (r.state != 0) {
                break;
            }
            __kernel_timespec ts{.tv_sec = 0, .tv_nsec = 10'000'000};
            io_uring_cqe* cqe = nullptr;
            io_uring_submit_and_wait_timeout(&ring, &cqe, 1, &ts, nullptr);
            unsigned head;
            unsigned seen = 0;
            io_uring_for_each_cqe(&ring, head, cqe)
            {
                if ((cqe->user_data >> 63) != 0) {
                    ++own_completions;
                } else {
                    fr.on_completion(cqe->user_data, cqe->res);
                }
                ++seen;
            }
            io_uring_cq_advance(&ring, seen);
        }
        return r.state != 0 ? r.status : INT_MIN;
    }

    io_uring ring{};
    unsigned own_completions = 0;
};

TEST(FileRing, ABorrowedRingCarriesTheRequestsAndIsGivenBack)
{
    temp_dir dir;
    make_file(dir.file("zone"), 0);
    auto f = open_file(dir.file("zone"), {});
    ASSERT_TRUE(f);
    ring_fixture t(*f);
    owner_ring owner;
    ASSERT_TRUE(t.ring->borrow_ring(&owner.ring));
    EXPECT_TRUE(t.ring->borrowed());
    EXPECT_EQ(t.stats.borrowed_rings.load(), 1u);
    EXPECT_EQ(t.ring->event_fd(), -1) << "the owner's ring wakes it, not the eventfd";
    owner_ring other;
    EXPECT_FALSE(t.ring->borrow_ring(&other.ring)) << "a second ring while one is borrowed";

    aligned_buffer w(3 * 65536), back(3 * 65536);
    fill(w.data, w.size, 11);
    // Written through the owner's ring, with an entry of the owner's beside.
    owner.own_nop();
    io_request a = ring_fixture::request(io_op::write, 0, 65536, w.data);
    t.ring->write(a, 0, 0, false);
    EXPECT_EQ(t.ring->next_wakeup_ns(), UINT64_MAX) << "the owner submits: nothing for poll()";
    EXPECT_FALSE(t.ring->borrow_ring(nullptr)) << "given back with a request in flight";
    EXPECT_EQ(owner.wait(*t.ring, a), 65536);
    EXPECT_EQ(owner.own_completions, 1u);
    // An append alone is still held and written by poll(); two together go
    // through the owner's ring.
    io_request b = ring_fixture::request(io_op::write, 65536, 65536, w.data + 65536);
    t.ring->append(b, 0, 65536, false);
    EXPECT_EQ(t.ring->next_wakeup_ns(), 0u) << "the owner would sleep on a held append";
    EXPECT_EQ(owner.wait(*t.ring, b), 65536);
    EXPECT_EQ(t.stats.held_appends.load(), 1u);
    io_request c = ring_fixture::request(io_op::write, 131072, 32768, w.data + 131072);
    io_request d = ring_fixture::request(io_op::write, 163840, 32768, w.data + 163840);
    t.ring->append(c, 0, 131072, false);
    t.ring->append(d, 0, 163840, false);
    EXPECT_EQ(owner.wait(*t.ring, c), 32768);
    EXPECT_EQ(owner.wait(*t.ring, d), 32768);
    EXPECT_EQ(t.stats.held_appends.load(), 1u);
    io_request rd = ring_fixture::request(io_op::read, 0, 3 * 65536, back.data);
    t.ring->read(rd, 0, 0);
    EXPECT_EQ(owner.wait(*t.ring, rd), 3 * 65536);
    EXPECT_EQ(std::memcmp(back.data, w.data, 3 * 65536), 0);

    // A kernel buffer: registered in the borrowed ring's table as it is
    // (no DEFER_TASKRUN rebuild: that is the owner's ring), unregistered
    // before the write completes; the stand-in registers nothing, so the
    // kernel fails the write.
    kernel_buffer_counts::registers = kernel_buffer_counts::unregisters = 0;
    const kernel_buffer kb{.prep_register = &prep_nop_register,
                           .prep_unregister = &prep_nop_unregister,
                           .fd = f->buffered_fd(),
                           .index = 1,
                           .slots = 4};
    io_request k = ring_fixture::request(io_op::write, 3 * 65536, 4096, nullptr);
    k.kernel_data = &kb;
    t.ring->append(k, 0, 3 * 65536, false);
    EXPECT_EQ(owner.wait(*t.ring, k), -EFAULT);
    EXPECT_EQ(kernel_buffer_counts::registers, 1);
    EXPECT_EQ(kernel_buffer_counts::unregisters, 1);
    EXPECT_EQ(t.stats.kernel_buffer_rings.load(), 0u);
    EXPECT_EQ(t.ring->in_flight(), 0u);

    // Given back: the own ring (and its eventfd) serve again.
    EXPECT_TRUE(t.ring->borrow_ring(nullptr));
    EXPECT_FALSE(t.ring->borrowed());
    EXPECT_EQ(t.stats.borrowed_rings.load(), 0u);
    EXPECT_GE(t.ring->event_fd(), 0);
    EXPECT_EQ(t.read(65536, back.data, 65536), 65536);
    EXPECT_EQ(std::memcmp(back.data, w.data + 65536, 65536), 0);
    // The owner's ring holds none of the files any more: it can be lent again.
    EXPECT_TRUE(t.ring->borrow_ring(&owner.ring));
    EXPECT_TRUE(t.ring->borrow_ring(nullptr));
}

TEST(FileRing, ARingWithAFileTableOfItsOwnIsNotBorrowed)
{
    temp_dir dir;
    make_file(dir.file("zone"), 4096);
    auto f = open_file(dir.file("zone"), {});
    ASSERT_TRUE(f);
    ring_fixture t(*f);
    owner_ring owner;
    const int fd = f->fd();
    ASSERT_EQ(io_uring_register_files(&owner.ring, &fd, 1), 0);
    EXPECT_FALSE(t.ring->borrow_ring(&owner.ring));
    EXPECT_FALSE(t.ring->borrowed());
    EXPECT_EQ(t.stats.borrowed_rings.load(), 0u);
    aligned_buffer back(4096);
    EXPECT_EQ(t.read(0, back.data, 4096), 4096) << "the own ring no longer serves";
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

TEST(FileRing, DeferTaskrunWakesTheOwnerThroughTheEventfd)
{
    temp_dir dir;
    auto f = open_file(dir.file("wake.img"), {.create = true, .grow_to = 1 << 20});
    ASSERT_TRUE(f);
    ring_fixture t(*f, 32);
    // This kernel (6.1+) has DEFER_TASKRUN; the mode is shown either way.
    RecordProperty("ring_mode", to_string(t.ring->mode()));
    aligned_buffer buf(32 * 4096);
    io_request reqs[32];
    for (unsigned i = 0; i < 32; ++i) {
        reqs[i] = ring_fixture::request(io_op::write, i * 4096u, 4096, buf.data + i * 4096);
        t.ring->write(reqs[i], 0, i * 4096u, false);
    }
    EXPECT_EQ(t.ring->in_flight(), 32u);
    EXPECT_EQ(t.ring->next_wakeup_ns(), 0u) << "queued requests need a poll() now";
    t.ring->poll();
    // Submitted: sleep on the eventfd (UINT64_MAX), or look again at once
    // (0) when some writes completed since poll(), which a fast disk may do.
    const uint64_t wakeup = t.ring->next_wakeup_ns();
    EXPECT_TRUE(wakeup == UINT64_MAX || wakeup == 0) << wakeup;
    // From here only the eventfd says when to look: sleep on it alone, as
    // an owner does (next_wakeup_ns before each sleep).
    unsigned done = t.sink.completed;
    for (int i = 0; i < 200 && done < 32; ++i) {
        if (t.ring->next_wakeup_ns() != 0) {
            pollfd p{t.ring->event_fd(), POLLIN, 0};
            // Generous: the writes go to a disk that other work may keep busy.
            const int n = ::poll(&p, 1, 20000);
            ASSERT_EQ(n, 1) << "completions pending but the eventfd stayed quiet for 20 s";
        }
        t.ring->poll();
        done = t.sink.completed;
    }
    EXPECT_EQ(done, 32u);
    pollfd p{t.ring->event_fd(), POLLIN, 0};
    EXPECT_EQ(::poll(&p, 1, 0), 0)
        << "an idle ring leaves its eventfd readable (owners would spin)";
}

TEST(FileRing, AnotherThreadTakesOverAnIdleQueue)
{
    temp_dir dir;
    auto f = open_file(dir.file("handover.img"), {.create = true, .grow_to = 1 << 20});
    ASSERT_TRUE(f);
    ring_fixture t(*f);
    aligned_buffer w(4096), r(4096);
    fill(w.data, 4096, 8);
    ASSERT_EQ(t.write(0, w.data, 4096), 4096);
    const ring_mode first = t.ring->mode();
    int rc = INT_MIN;
    std::thread other([&] { rc = t.read(0, r.data, 4096); });
    other.join();
    EXPECT_EQ(rc, 4096);
    EXPECT_EQ(std::memcmp(w.data, r.data, 4096), 0);
    if (first == ring_mode::defer_taskrun) {
        EXPECT_EQ(t.ring->mode(), ring_mode::coop_taskrun);
        EXPECT_EQ(t.stats.ring_handovers.load(), 1u);
    }
    // And back: the rebuilt ring serves any thread.
    EXPECT_EQ(t.read(0, r.data, 4096), 4096);
}

TEST(FileRing, AThreadAfterTheOwnerExitedTakesTheRingOver)
{
    // The owner thread ends, a new one drives the queue (a benchmark's or a
    // caller's thread per run). The new thread often reuses the old one's
    // thread-local storage: it must still be seen as another thread and get
    // the ring handed over, not be taken for the owner and have the kernel
    // refuse every submission (EEXIST) while poll() retries for ever.
    temp_dir dir;
    auto f = open_file(dir.file("after-exit.img"), {.create = true, .grow_to = 1 << 20});
    ASSERT_TRUE(f);
    ring_fixture t(*f);
    aligned_buffer w(4096), r(4096);
    fill(w.data, 4096, 9);
    int rc = INT_MIN;
    std::thread first([&] { rc = t.write(0, w.data, 4096); });
    first.join();
    ASSERT_EQ(rc, 4096);
    const ring_mode mode = t.ring->mode();
    rc = INT_MIN;
    std::thread second([&] { rc = t.read(0, r.data, 4096); });
    second.join();
    EXPECT_EQ(rc, 4096) << "INT_MIN: the request never completed";
    EXPECT_EQ(std::memcmp(w.data, r.data, 4096), 0);
    EXPECT_EQ(t.stats.ring_errors.load(), 0u);
    if (mode == ring_mode::defer_taskrun) {
        EXPECT_EQ(t.stats.ring_handovers.load(), 1u);
    }
}

TEST(FileRing, ThreadTheKernelRefusesFailsItsRequestsWithoutSpinning)
{
    // A thread the kernel did not bind the single-issuer ring to, but that
    // the ring takes for its owner: a forked child of the owner thread (the
    // same thread-local state, another task). io_uring_enter answers EEXIST
    // every time; the requests must fail with -EBUSY at once, not spin.
    temp_dir dir;
    auto f = open_file(dir.file("refused.img"), {.create = true, .grow_to = 1 << 20});
    ASSERT_TRUE(f);
    ring_fixture t(*f);
    aligned_buffer w(4096), r(4096);
    fill(w.data, 4096, 10);
    ASSERT_EQ(t.write(0, w.data, 4096), 4096);
    if (t.ring->mode() != ring_mode::defer_taskrun) {
        GTEST_SKIP() << "this kernel has no SINGLE_ISSUER/DEFER_TASKRUN ring ("
                     << to_string(t.ring->mode()) << ")";
    }
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        // Exit codes: 0 as expected; 1 the first request did not fail with
        // -EBUSY; 2 the next one was not refused; 3 not counted.
        int code = 0;
        if (t.read(0, r.data, 4096) != -EBUSY) {
            code = 1;
        } else if (t.write(4096, w.data, 4096) != -EBUSY) {
            code = 2;
        } else if (t.stats.ring_errors.load() != 1 || t.ring->in_flight() != 0 ||
                   t.ring->next_wakeup_ns() != UINT64_MAX) {
            code = 3;
        }
        ::_exit(code);
    }
    int status = 0;
    pid_t done = 0;
    for (int i = 0; i < 2000 && done == 0; ++i) {  // 20 s
        done = ::waitpid(child, &status, WNOHANG);
        if (done == 0) {
            ::usleep(10000);
        }
    }
    if (done == 0) {
        ::kill(child, SIGKILL);
        ::waitpid(child, &status, 0);
        FAIL() << "the child still ran after 20 s: the ring spins on EEXIST";
    }
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0);
    // The owner's ring is untouched.
    EXPECT_EQ(t.read(0, r.data, 4096), 4096);
    EXPECT_EQ(std::memcmp(w.data, r.data, 4096), 0);
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
