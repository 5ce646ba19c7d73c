// The FUSE export in-process, without a loop device: the file's size and
// attributes, aligned and unaligned I/O, fallocate (punch hole, zero
// range, plain allocation), SEEK_DATA/SEEK_HOLE from the allocation map,
// fsync reaching the device, the end of the device, stop and stale-mount
// cleanup; as root with a loop device, that a loop device no longer
// attached to the export's file is never detached or shown as its own.
#include <gtest/gtest.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <linux/loop.h>
#include <memory>
#include <string>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include <softblk/device.hpp>
#include <softblk/frontend.hpp>

using softblk::k_mib;

namespace {

bool fuse_usable(std::string& why)
{
    if (::geteuid() != 0) {
        why = "needs root (allow_other mounts of the FUSE export)";
        return false;
    }
    const int fd = ::open("/dev/fuse", O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        why = std::string("/dev/fuse: ") + std::strerror(errno);
        return false;
    }
    ::close(fd);
    return true;
}

bool mounted(const std::string& mount_point, std::string* fstype = nullptr)
{
    std::ifstream in("/proc/self/mounts");
    std::string source, point, type, rest;
    bool found = false;
    while (in >> source >> point >> type && std::getline(in, rest)) {
        if (point == mount_point) {
            found = true;
            if (fstype != nullptr) {
                *fstype = type;  // the last one: the mount on top
            }
        }
    }
    return found;
}

std::string make_run_dir()
{
    char tmpl[] = "/tmp/softblk-fuse-test.XXXXXX";
    const char* dir = ::mkdtemp(tmpl);
    EXPECT_NE(dir, nullptr);
    return dir != nullptr ? dir : "";
}

const softblk::export_type& fuse_type()
{
    const softblk::export_type* t = softblk::find_export_type("fuse");
    EXPECT_NE(t, nullptr);
    return *t;
}

std::unique_ptr<softblk::device> make_device(const std::string& name,
                                             std::vector<std::string> options)
{
    auto dev = softblk::device::create(name, "null", options);
    EXPECT_TRUE(dev) << (dev ? "" : dev.error().message);
    return dev ? std::move(*dev) : nullptr;
}

uint64_t submitted(const softblk::device& dev)
{
    nlohmann::json out;
    dev.describe(out);
    return out["stats"]["submitted"].get<uint64_t>();
}

TEST(fuse_export_options, unknown_and_out_of_range_options_are_errors)
{
    auto dev = make_device("opts", {"size=4", "memory_backed=1"});
    ASSERT_NE(dev, nullptr);
    softblk::export_context ctx{.run_dir = "/tmp/softblk-never-created", .privileged = false};
    auto r = fuse_type().start(*dev, ctx, std::vector<std::string>{"lop=0"});
    ASSERT_FALSE(r);
    EXPECT_NE(r.error().message.find("lop"), std::string::npos) << r.error().message;
    r = fuse_type().start(*dev, ctx, std::vector<std::string>{"threads=65"});
    ASSERT_FALSE(r);
    EXPECT_NE(r.error().message.find("threads"), std::string::npos) << r.error().message;
    r = fuse_type().start(*dev, softblk::export_context{.run_dir = "relative"},
                          std::vector<std::string>{"loop=0"});
    ASSERT_FALSE(r);
}

class fuse_export_test : public ::testing::Test {
protected:
    void SetUp() override
    {
        std::string why;
        if (!fuse_usable(why)) {
            GTEST_SKIP() << why;
        }
        _run_dir = make_run_dir();
        _dev = make_device("d0", {"size=16", "memory_backed=1", "blocksize=4096", "discard=1",
                                  "cache_size=1", "submit_queues=2"});
        ASSERT_NE(_dev, nullptr);
        softblk::export_context ctx{.run_dir = _run_dir, .privileged = true};
        std::vector<std::string> options{"loop=0", "threads=2"};
        // tests/frontends/fuse/fuse_ring.sh runs these through FUSE over io_uring.
        const char* ring = std::getenv("SOFTBLK_FUSE_TEST_RING");
        if (ring != nullptr) {
            options.push_back(std::string("ring=") + ring);
        }
        auto exp = fuse_type().start(*_dev, ctx, options);
        ASSERT_TRUE(exp) << exp.error().message;
        _export = std::move(*exp);
        if (ring != nullptr && std::string(ring) == "on") {
            ASSERT_EQ(_export->describe()["ring"], "on");
        }
        _file = _export->describe()["file"].get<std::string>();
        _fd = ::open(_file.c_str(), O_RDWR | O_CLOEXEC);
        ASSERT_GE(_fd, 0) << _file << ": " << std::strerror(errno);
    }

    void TearDown() override
    {
        if (_fd >= 0) {
            ::close(_fd);
        }
        if (_export) {
            EXPECT_TRUE(_export->stop());
        }
        _export.reset();
        _dev.reset();
        if (!_run_dir.empty()) {
            ::rmdir((_run_dir + "/fuse").c_str());
            ::rmdir(_run_dir.c_str());
        }
    }

    std::vector<char> read_at(uint64_t offset, size_t length)
    {
        std::vector<char> out(length);
        EXPECT_EQ(::pread(_fd, out.data(), length, static_cast<off_t>(offset)),
                  static_cast<ssize_t>(length));
        return out;
    }

    void fill(uint64_t offset, size_t length, char value)
    {
        std::vector<char> data(length, value);
        ASSERT_EQ(::pwrite(_fd, data.data(), length, static_cast<off_t>(offset)),
                  static_cast<ssize_t>(length));
    }

    static bool all(const std::vector<char>& data, char value)
    {
        for (char c : data) {
            if (c != value) {
                return false;
            }
        }
        return true;
    }

    std::string _run_dir;
    std::unique_ptr<softblk::device> _dev;
    std::unique_ptr<softblk::device_export> _export;
    std::string _file;
    int _fd = -1;
};

TEST_F(fuse_export_test, file_is_mounted_with_the_device_size)
{
    std::string fstype;
    const std::string mount_point = _export->describe()["mount_point"].get<std::string>();
    ASSERT_TRUE(mounted(mount_point, &fstype));
    EXPECT_EQ(fstype, "fuse.softblk");
    EXPECT_EQ(_file, _run_dir + "/fuse/d0/d0");
    struct stat st {};
    ASSERT_EQ(::fstat(_fd, &st), 0);
    EXPECT_TRUE(S_ISREG(st.st_mode));
    EXPECT_EQ(static_cast<uint64_t>(st.st_size), 16 * k_mib);
    EXPECT_FALSE(_export->describe().contains("loop"));
    // Two workers, two submit queues: each worker drives its own.
    EXPECT_EQ(_export->describe()["queues"], "per_worker");
}

TEST_F(fuse_export_test, direct_io_round_trip)
{
    const int fd = ::open(_file.c_str(), O_RDWR | O_DIRECT | O_CLOEXEC);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    void* buf = nullptr;
    ASSERT_EQ(::posix_memalign(&buf, 4096, 1 * k_mib), 0);
    for (size_t i = 0; i < k_mib; ++i) {
        static_cast<unsigned char*>(buf)[i] = static_cast<unsigned char>(i * 7 + 3);
    }
    ASSERT_EQ(::pwrite(fd, buf, k_mib, 3 * k_mib), static_cast<ssize_t>(k_mib));
    std::vector<char> back(k_mib);
    void* rbuf = nullptr;
    ASSERT_EQ(::posix_memalign(&rbuf, 4096, k_mib), 0);
    ASSERT_EQ(::pread(fd, rbuf, k_mib, 3 * k_mib), static_cast<ssize_t>(k_mib));
    EXPECT_EQ(std::memcmp(buf, rbuf, k_mib), 0);
    std::free(buf);
    std::free(rbuf);
    ::close(fd);
}

TEST_F(fuse_export_test, unaligned_writes_keep_the_rest_of_the_block)
{
    fill(0, 16384, 'a');
    fill(4000, 200, 'b');  // crosses the block boundary at 4096
    fill(9000, 10, 'c');   // inside one block
    auto data = read_at(0, 16384);
    for (size_t i = 0; i < data.size(); ++i) {
        const char want = (i >= 4000 && i < 4200) ? 'b' : (i >= 9000 && i < 9010) ? 'c' : 'a';
        ASSERT_EQ(data[i], want) << "byte " << i;
    }
    // An unaligned read in the middle.
    auto part = read_at(3990, 20);
    EXPECT_EQ(std::string(part.data(), 10), std::string(10, 'a'));
    EXPECT_EQ(std::string(part.data() + 10, 10), std::string(10, 'b'));
}

TEST_F(fuse_export_test, punch_hole_reads_zeros_and_shows_in_seek_hole)
{
    fill(0, 4 * k_mib, 'x');
    // Unaligned: the edges are zeroed, the aligned middle is discarded.
    ASSERT_EQ(
        ::fallocate(_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, k_mib - 100, k_mib + 200), 0)
        << std::strerror(errno);
    EXPECT_TRUE(all(read_at(0, k_mib - 100), 'x'));
    EXPECT_TRUE(all(read_at(k_mib - 100, k_mib + 200), 0));
    EXPECT_TRUE(all(read_at(2 * k_mib + 100, 2 * k_mib - 100), 'x'));

    EXPECT_EQ(::lseek(_fd, 0, SEEK_HOLE), static_cast<off_t>(k_mib));
    EXPECT_EQ(::lseek(_fd, k_mib, SEEK_DATA), static_cast<off_t>(2 * k_mib));
    EXPECT_EQ(::lseek(_fd, 100, SEEK_DATA), 100);
    // Nothing was ever written past 4 MiB.
    EXPECT_EQ(::lseek(_fd, 4 * k_mib, SEEK_HOLE), static_cast<off_t>(4 * k_mib));
    errno = 0;
    EXPECT_EQ(::lseek(_fd, 4 * k_mib, SEEK_DATA), -1);
    EXPECT_EQ(errno, ENXIO);
    errno = 0;
    EXPECT_EQ(::lseek(_fd, 16 * k_mib, SEEK_HOLE), -1);
    EXPECT_EQ(errno, ENXIO);
}

TEST_F(fuse_export_test, zero_range_reads_zeros)
{
    fill(0, 2 * k_mib, 'z');
    ASSERT_EQ(::fallocate(_fd, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE, 5000, 70000), 0)
        << std::strerror(errno);
    EXPECT_TRUE(all(read_at(0, 5000), 'z'));
    EXPECT_TRUE(all(read_at(5000, 70000), 0));
    EXPECT_TRUE(all(read_at(75000, 10000), 'z'));
}

TEST_F(fuse_export_test, plain_allocation_succeeds_only_where_allocated)
{
    fill(0, 64 * 1024, 'p');
    EXPECT_EQ(::fallocate(_fd, 0, 0, 64 * 1024), 0) << std::strerror(errno);
    errno = 0;
    EXPECT_EQ(::fallocate(_fd, 0, 8 * k_mib, 64 * 1024), -1);
    EXPECT_EQ(errno, EOPNOTSUPP);
    // The file cannot grow.
    errno = 0;
    EXPECT_EQ(::fallocate(_fd, 0, 16 * k_mib, 4096), -1);
    EXPECT_EQ(errno, EFBIG);
}

TEST_F(fuse_export_test, fsync_reaches_the_device_as_flush)
{
    fill(0, 4096, 'f');
    const uint64_t before = submitted(*_dev);
    ASSERT_EQ(::fsync(_fd), 0) << std::strerror(errno);
    EXPECT_EQ(submitted(*_dev), before + 1);
}

TEST_F(fuse_export_test, end_of_device_and_fixed_size)
{
    char buf[4096] = {};
    EXPECT_EQ(::pread(_fd, buf, sizeof buf, 16 * k_mib), 0);
    errno = 0;
    EXPECT_EQ(::pwrite(_fd, buf, sizeof buf, 16 * k_mib), -1);
    EXPECT_EQ(errno, ENOSPC);
    // A write that crosses the end is cut short.
    EXPECT_EQ(::pwrite(_fd, buf, sizeof buf, 16 * k_mib - 1024), 1024);
    EXPECT_EQ(::ftruncate(_fd, 16 * k_mib), 0);
    errno = 0;
    EXPECT_EQ(::ftruncate(_fd, 8 * k_mib), -1);
    EXPECT_EQ(errno, EPERM);
}

TEST_F(fuse_export_test, stop_unmounts_and_is_idempotent)
{
    const std::string mount_point = _export->describe()["mount_point"].get<std::string>();
    ::close(_fd);
    _fd = -1;
    ASSERT_TRUE(_export->stop());
    EXPECT_FALSE(mounted(mount_point));
    struct stat st {};
    EXPECT_NE(::stat(mount_point.c_str(), &st), 0);
    EXPECT_TRUE(_export->stop());
}

TEST(fuse_export_unprivileged, no_loop_device_by_default_and_a_clear_error_when_asked)
{
    std::string why;
    if (!fuse_usable(why)) {
        GTEST_SKIP() << why;
    }
    const std::string run_dir = make_run_dir();
    auto dev = make_device("user", {"size=4"});
    ASSERT_NE(dev, nullptr);
    softblk::export_context ctx{.run_dir = run_dir, .privileged = false};
    auto exp = fuse_type().start(*dev, ctx, std::vector<std::string>{});
    ASSERT_TRUE(exp) << exp.error().message;
    EXPECT_FALSE((*exp)->describe().contains("loop"));
    EXPECT_TRUE((*exp)->stop());
    auto refused = fuse_type().start(*dev, ctx, std::vector<std::string>{"loop=1"});
    ASSERT_FALSE(refused);
    EXPECT_EQ(refused.error().code.value(), EPERM);
    EXPECT_NE(refused.error().message.find("loop=0"), std::string::npos) << refused.error().message;
    EXPECT_FALSE(mounted(run_dir + "/fuse/user"));
    ::rmdir((run_dir + "/fuse").c_str());
    ::rmdir(run_dir.c_str());
}

TEST(fuse_export_stale, cleanup_removes_the_mount_of_a_dead_process)
{
    std::string why;
    if (!fuse_usable(why)) {
        GTEST_SKIP() << why;
    }
    const std::string run_dir = make_run_dir();
    const std::string mount_point = run_dir + "/fuse/crashed";
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        // Export and die without stopping anything.
        auto dev = softblk::device::create("crashed", "null", std::vector<std::string>{"size=4"});
        if (!dev) {
            std::_Exit(2);
        }
        softblk::export_context ctx{.run_dir = run_dir, .privileged = true};
        auto exp = softblk::find_export_type("fuse")->start(**dev, ctx,
                                                            std::vector<std::string>{"loop=0"});
        std::_Exit(exp ? 0 : 3);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status));
    ASSERT_EQ(WEXITSTATUS(status), 0);
    ASSERT_TRUE(mounted(mount_point)) << "the dead process left no mount: nothing to clean";

    softblk::export_context ctx{.run_dir = run_dir, .privileged = true};
    fuse_type().cleanup_stale(ctx);
    EXPECT_FALSE(mounted(mount_point));
    struct stat st {};
    EXPECT_NE(::stat(mount_point.c_str(), &st), 0);
    ::rmdir((run_dir + "/fuse").c_str());
    ::rmdir(run_dir.c_str());
}

std::string backing_file_of(unsigned number)
{
    std::ifstream in("/sys/block/loop" + std::to_string(number) + "/loop/backing_file");
    std::string line;
    std::getline(in, line);
    return line;
}

// A regular file of 1 MiB attached to /dev/loopN by "another user" (the
// test, through the ioctl losetup uses), with no descriptor left open (an
// open one would hold off a detach); detached and removed on scope exit,
// whatever the test's outcome.
struct foreign_loop {
    std::string file;
    std::string loop;
    bool attached = false;

    explicit foreign_loop(const std::string& path) : file(path)
    {
        const int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd >= 0) {
            EXPECT_EQ(::ftruncate(fd, 1 << 20), 0);
            ::close(fd);
        }
    }
    bool attach(unsigned number)
    {
        loop = "/dev/loop" + std::to_string(number);
        const int fd = ::open(file.c_str(), O_RDWR | O_CLOEXEC);
        const int loop_fd = ::open(loop.c_str(), O_RDWR | O_CLOEXEC);
        if (fd >= 0 && loop_fd >= 0) {
            loop_config config{};
            config.fd = static_cast<uint32_t>(fd);
            attached = ::ioctl(loop_fd, LOOP_CONFIGURE, &config) == 0;
        }
        if (fd >= 0) {
            ::close(fd);
        }
        if (loop_fd >= 0) {
            ::close(loop_fd);
        }
        return attached;
    }
    ~foreign_loop()
    {
        if (attached &&
            backing_file_of(static_cast<unsigned>(std::stoul(loop.substr(9)))) == file) {
            const int loop_fd = ::open(loop.c_str(), O_RDONLY | O_CLOEXEC);
            if (loop_fd >= 0) {
                ::ioctl(loop_fd, LOOP_CLR_FD, 0);
                ::close(loop_fd);
            }
        }
        ::unlink(file.c_str());
    }
};

bool loop_usable(std::string& why)
{
    if (!fuse_usable(why)) {
        return false;
    }
    if (::access("/dev/loop-control", R_OK | W_OK) != 0) {
        why = "no /dev/loop-control";
        return false;
    }
    return true;
}

// After a stop refused because the loop device was still open, the device
// detaches itself on its last close (autoclear); if another user then
// attaches their own file to the same /dev/loopN, the export must neither
// show it as its loop device nor detach it on the next stop.
TEST(fuse_export_loop, a_loop_device_reattached_by_another_user_is_left_alone)
{
    std::string why;
    if (!loop_usable(why)) {
        GTEST_SKIP() << why;
    }
    const std::string run_dir = make_run_dir();
    auto dev = make_device("own", {"size=16", "memory_backed=1"});
    ASSERT_NE(dev, nullptr);
    softblk::export_context ctx{.run_dir = run_dir, .privileged = true};
    auto exp = fuse_type().start(*dev, ctx, std::vector<std::string>{});
    ASSERT_TRUE(exp) << exp.error().message;
    const nlohmann::json before = (*exp)->describe();
    ASSERT_TRUE(before.contains("loop")) << before.dump();
    const std::string loop = before["loop"].get<std::string>();
    const unsigned number = static_cast<unsigned>(std::stoul(loop.substr(9)));
    foreign_loop foreign(run_dir + ".foreign.img");
    {
        // A program (fio, dd) holds the loop device open: stop() gives up.
        const int holder = ::open(loop.c_str(), O_RDONLY | O_CLOEXEC);
        ASSERT_GE(holder, 0) << loop << ": " << std::strerror(errno);
        auto refused = (*exp)->stop();
        ::close(holder);
        ASSERT_FALSE(refused) << "stop() detached " << loop << " while it was open";
        EXPECT_NE(refused.error().message.find("still open"), std::string::npos)
            << refused.error().message;
    }
    // Its last close detached it (autoclear).
    for (int i = 0; i < 500 && !backing_file_of(number).empty(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_EQ(backing_file_of(number), "") << loop << " did not detach itself on its last close";
    const nlohmann::json detached = (*exp)->describe();
    EXPECT_FALSE(detached.contains("loop"))
        << "describe still claims " << loop << ": " << detached.dump();
    EXPECT_NE(detached.value("warning", std::string()).find(loop), std::string::npos)
        << detached.dump();

    if (!foreign.attach(number)) {
        GTEST_SKIP() << loop << " was taken by another program before the test could attach it";
    }
    EXPECT_FALSE((*exp)->describe().contains("loop")) << "describe claims the foreign " << loop;
    EXPECT_EQ((*exp)->in_use(), "");
    auto stopped = (*exp)->stop();
    EXPECT_TRUE(stopped) << stopped.error().message;
    EXPECT_EQ(backing_file_of(number), foreign.file)
        << "the export's stop detached " << loop << ", which another user had attached";
    exp->reset();
    ::rmdir((run_dir + "/fuse").c_str());
    ::rmdir(run_dir.c_str());
}

// A loop device whose backing file lies under RUN_DIR/fuse but on no
// stale mount of ours (a plain file there, or a mount of another mount
// namespace) is not ours: the stale cleanup leaves it attached.
TEST(fuse_export_stale, cleanup_leaves_a_loop_device_on_a_file_that_is_not_ours)
{
    std::string why;
    if (!loop_usable(why)) {
        GTEST_SKIP() << why;
    }
    const std::string run_dir = make_run_dir();
    const std::string dir = run_dir + "/fuse/other";
    ASSERT_EQ(::mkdir((run_dir + "/fuse").c_str(), 0755), 0);
    ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
    {
        foreign_loop foreign(dir + "/other");
        const int control = ::open("/dev/loop-control", O_RDWR | O_CLOEXEC);
        ASSERT_GE(control, 0);
        const int number = ::ioctl(control, LOOP_CTL_GET_FREE);
        ::close(control);
        ASSERT_GE(number, 0);
        if (!foreign.attach(static_cast<unsigned>(number))) {
            GTEST_SKIP() << "could not attach a loop device: " << std::strerror(errno);
        }
        softblk::export_context ctx{.run_dir = run_dir, .privileged = true};
        fuse_type().cleanup_stale(ctx);
        EXPECT_EQ(backing_file_of(static_cast<unsigned>(number)), foreign.file)
            << "the stale cleanup detached a loop device that softblk did not attach";
    }
    ::rmdir(dir.c_str());
    ::rmdir((run_dir + "/fuse").c_str());
    ::rmdir(run_dir.c_str());
}

// Someone mounts their own file system over the export's mount point: the
// export's stop must not unmount it (the unmount goes by path, and the
// path now reaches their mount).
TEST(fuse_export_mount, stop_leaves_a_mount_on_top_of_its_own_alone)
{
    std::string why;
    if (!fuse_usable(why)) {
        GTEST_SKIP() << why;
    }
    const std::string run_dir = make_run_dir();
    auto dev = make_device("under", {"size=4"});
    ASSERT_NE(dev, nullptr);
    softblk::export_context ctx{.run_dir = run_dir, .privileged = true};
    auto exp = fuse_type().start(*dev, ctx, std::vector<std::string>{"loop=0"});
    ASSERT_TRUE(exp) << exp.error().message;
    const std::string mount_point = (*exp)->describe()["mount_point"].get<std::string>();
    ASSERT_EQ(::mount("other", mount_point.c_str(), "tmpfs", 0, "size=1m"), 0)
        << std::strerror(errno);
    std::string fstype;
    EXPECT_TRUE((*exp)->stop());
    const bool kept = mounted(mount_point, &fstype) && fstype == "tmpfs";
    // Whatever happened: the tmpfs, then our mount beneath it, go.
    while (::umount2(mount_point.c_str(), MNT_DETACH) == 0) {
    }
    EXPECT_TRUE(kept) << "stop unmounted the file system someone mounted over " << mount_point;
    exp->reset();
    ::rmdir(mount_point.c_str());
    ::rmdir((run_dir + "/fuse").c_str());
    ::rmdir(run_dir.c_str());
}

// A dead process's mount with someone's file system mounted over it: the
// stale cleanup must not unmount theirs.
TEST(fuse_export_stale, cleanup_leaves_a_mount_on_top_of_a_stale_one_alone)
{
    std::string why;
    if (!fuse_usable(why)) {
        GTEST_SKIP() << why;
    }
    const std::string run_dir = make_run_dir();
    const std::string mount_point = run_dir + "/fuse/covered";
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        auto dev = softblk::device::create("covered", "null", std::vector<std::string>{"size=4"});
        if (!dev) {
            std::_Exit(2);
        }
        softblk::export_context ctx{.run_dir = run_dir, .privileged = true};
        auto exp = softblk::find_export_type("fuse")->start(**dev, ctx,
                                                            std::vector<std::string>{"loop=0"});
        std::_Exit(exp ? 0 : 3);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    ASSERT_EQ(::mount("other", mount_point.c_str(), "tmpfs", 0, "size=1m"), 0)
        << std::strerror(errno);
    softblk::export_context ctx{.run_dir = run_dir, .privileged = true};
    fuse_type().cleanup_stale(ctx);
    std::string fstype;
    const bool kept = mounted(mount_point, &fstype) && fstype == "tmpfs";
    while (::umount2(mount_point.c_str(), MNT_DETACH) == 0) {
    }
    EXPECT_TRUE(kept) << "the stale cleanup unmounted the file system mounted over " << mount_point;
    ::rmdir(mount_point.c_str());
    ::rmdir((run_dir + "/fuse").c_str());
    ::rmdir(run_dir.c_str());
}

}  // namespace
