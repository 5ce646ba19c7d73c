// The file target through the in-process API: creation and every refusal
// (naming the path and the cause, creating nothing), I/O on every queue,
// the allocation map, persistence across devices, read-only sharing, and
// every decorator stacked on it.
#include "test_util.hpp"

#include <cerrno>
#include <cstdlib>
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>

#include <softblk/device.hpp>
#include <softblk/target.hpp>

namespace softblk::test {
namespace {

class file_target_test : public ::testing::Test {
protected:
    void SetUp() override
    {
        char name[] = "/tmp/softblk-file-target-XXXXXX";
        _dir = ::mkdtemp(name);
    }
    void TearDown() override
    {
        if (!_mount.empty()) {
            ::umount2(_mount.c_str(), MNT_DETACH);
        }
        const std::string cmd = "rm -rf '" + _dir + "'";
        [[maybe_unused]] int rc = std::system(cmd.c_str());
    }
    std::string path(const std::string& name) const { return _dir + "/" + name; }

    std::unique_ptr<device> make(std::vector<std::string> options, std::string name = "filetest")
    {
        auto d = device::create(std::move(name), "file", options);
        EXPECT_TRUE(d.has_value()) << (d ? "" : d.error().message);
        return d ? std::move(*d) : nullptr;
    }
    static std::string refused(std::vector<std::string> options, int* code = nullptr)
    {
        return create_error(std::move(options), code, "file");
    }
    static bool exists(const std::string& p) { return ::access(p.c_str(), F_OK) == 0; }
    static uint64_t file_size(const std::string& p)
    {
        struct stat st {};
        return ::stat(p.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
    }
    static void make_file(const std::string& p, uint64_t size)
    {
        const int fd = ::open(p.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
        ASSERT_GE(fd, 0);
        ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(size)), 0);
        ::close(fd);
    }

    std::string _dir;
    std::string _mount;
};

TEST_F(file_target_test, CreatesASparseFileAndServesIt)
{
    const std::string img = path("disk.img");
    auto d = make({"path=" + img, "size=64M", "create=1"});
    ASSERT_TRUE(d);
    EXPECT_EQ(d->limits().capacity_bytes, 64u << 20);
    EXPECT_EQ(file_size(img), 64u << 20);
    EXPECT_TRUE(d->limits().volatile_write_cache);
    EXPECT_TRUE(d->limits().fua);
    EXPECT_GT(d->limits().max_discard_bytes, 0u);
    EXPECT_GT(d->limits().max_write_zeroes_bytes, 0u);
    const auto j = describe(*d);
    EXPECT_EQ(j["target"]["path"], img);
    EXPECT_EQ(j["target"]["direct_io"], true);
    EXPECT_FALSE(j["target"].contains("notice"));

    auto w = pattern(1 << 20, 1);
    ASSERT_EQ(d->execute(io_op::write, 4096, 1 << 20, w.data()), 1 << 20);
    ASSERT_EQ(d->execute(io_op::write, 32 << 20, 4096, w.data(), k_io_fua), 4096);
    ASSERT_EQ(d->execute(io_op::flush, 0, 0, nullptr), 0);
    std::vector<char> r(1 << 20);
    ASSERT_EQ(d->execute(io_op::read, 4096, 1 << 20, r.data()), 1 << 20);
    EXPECT_EQ(r, w);

    auto m = d->map(0, 64 << 20);
    ASSERT_TRUE(m.has_value());
    ASSERT_GE(m->size(), 3u);
    EXPECT_FALSE((*m)[0].allocated);
    uint64_t data = 0;
    for (const extent& e : *m) {
        data += e.allocated ? e.length : 0;
    }
    EXPECT_GE(data, (1u << 20) + 4096);
    EXPECT_LT(data, 4u << 20);

    ASSERT_EQ(d->execute(io_op::discard, 4096, 1 << 20, nullptr), 0);
    ASSERT_EQ(d->execute(io_op::read, 4096, 4096, r.data()), 4096);
    EXPECT_EQ(r[0], 0);
    ASSERT_EQ(d->execute(io_op::write_zeroes, 32 << 20, 4096, nullptr, k_io_no_unmap), 0);
    ASSERT_EQ(d->execute(io_op::read, 32 << 20, 4096, r.data()), 4096);
    EXPECT_EQ(std::count(r.begin(), r.begin() + 4096, 0), 4096);
}

TEST_F(file_target_test, DataPersistsAcrossDevices)
{
    const std::string img = path("persist.img");
    auto w = pattern(65536, 2);
    {
        auto d = make({"path=" + img, "size=16M", "create=1"});
        ASSERT_TRUE(d);
        ASSERT_EQ(d->execute(io_op::write, 1 << 20, 65536, w.data()), 65536);
        ASSERT_EQ(d->execute(io_op::flush, 0, 0, nullptr), 0);
    }
    // Re-created with the same options (as a daemon restart does): the file
    // is neither recreated nor truncated.
    auto d = make({"path=" + img, "size=16M", "create=1"});
    ASSERT_TRUE(d);
    std::vector<char> r(65536);
    ASSERT_EQ(d->execute(io_op::read, 1 << 20, 65536, r.data()), 65536);
    EXPECT_EQ(r, w);
    d.reset();
    // Without size: the whole file.
    d = make({"path=" + img});
    ASSERT_TRUE(d);
    EXPECT_EQ(d->limits().capacity_bytes, 16u << 20);
    // A smaller size: the first bytes of the file.
    d.reset();
    d = make({"path=" + img, "size=2M"});
    ASSERT_TRUE(d);
    EXPECT_EQ(d->limits().capacity_bytes, 2u << 20);
    ASSERT_EQ(d->execute(io_op::read, 1 << 20, 65536, r.data()), 65536);
    EXPECT_EQ(r, w);
    EXPECT_EQ(file_size(img), 16u << 20);
}

TEST_F(file_target_test, BadInputIsAClearErrorAndCreatesNothing)
{
    int code = 0;
    std::string msg = refused({}, &code);
    EXPECT_NE(msg.find("path=IMAGE"), std::string::npos) << msg;

    const std::string missing = path("missing.img");
    msg = refused({"path=" + missing}, &code);
    EXPECT_EQ(code, ENOENT);
    EXPECT_NE(msg.find(missing), std::string::npos) << msg;
    EXPECT_FALSE(exists(missing));

    msg = refused({"path=" + missing, "create=1"});
    EXPECT_NE(msg.find("size="), std::string::npos) << msg;
    EXPECT_FALSE(exists(missing));

    msg = refused({"path=" + missing, "create=1", "size=1000"});
    EXPECT_NE(msg.find("multiple"), std::string::npos) << msg;
    EXPECT_FALSE(exists(missing));

    msg = refused({"path=" + missing, "create=1", "size=64K", "bs=256"});
    EXPECT_NE(msg.find("blocksize"), std::string::npos) << msg;
    EXPECT_FALSE(exists(missing));

    msg = refused({"path=" + missing, "create=1", "size=lots"});
    EXPECT_NE(msg.find("size=lots"), std::string::npos) << msg;

    msg = refused({"path=" + _dir}, &code);
    EXPECT_EQ(code, EISDIR);
    EXPECT_NE(msg.find(_dir), std::string::npos) << msg;

    const std::string tiny = path("tiny.img");
    make_file(tiny, 100);
    msg = refused({"path=" + tiny, "buffered_io=1"});
    EXPECT_NE(msg.find("smaller than one block"), std::string::npos) << msg;
    EXPECT_EQ(file_size(tiny), 100u);

    const std::string odd = path("odd.img");
    make_file(odd, (1 << 20) + 512);
    msg = refused({"path=" + odd, "bs=4096"});
    EXPECT_NE(msg.find("not a multiple of the block size"), std::string::npos) << msg;
    EXPECT_NE(msg.find(odd), std::string::npos) << msg;
    EXPECT_EQ(file_size(odd), (1u << 20) + 512);

    const std::string small = path("small.img");
    make_file(small, 1 << 20);
    msg = refused({"path=" + small, "size=2M"});
    EXPECT_NE(msg.find("create=1"), std::string::npos) << msg;
    EXPECT_EQ(file_size(small), 1u << 20);

    msg = refused({"path=" + small, "read_only=1", "create=1", "size=1M"});
    EXPECT_NE(msg.find("read_only=1"), std::string::npos) << msg;

    msg = refused({"path=disk.img"});
    EXPECT_NE(msg.find("absolute"), std::string::npos) << msg;

    msg = refused({"path=" + small, "io_uring_mode=fast"});
    EXPECT_NE(msg.find("io_uring_mode=fast"), std::string::npos) << msg;
}

TEST_F(file_target_test, EveryRingModeServes)
{
    const std::string img = path("modes.img");
    make_file(img, 4 << 20);
    for (const char* mode : {"defer_taskrun", "coop_taskrun", "plain"}) {
        auto d = make({"path=" + img, std::string("io_uring_mode=") + mode});
        ASSERT_TRUE(d);
        auto w = pattern(65536, 9);
        ASSERT_EQ(d->execute(io_op::write, 65536, 65536, w.data()), 65536);
        std::vector<char> r(65536);
        ASSERT_EQ(d->execute(io_op::read, 65536, 65536, r.data()), 65536);
        EXPECT_EQ(r, w);
        // The mode the kernel gave (this one has all three since 6.1).
        EXPECT_EQ(describe(*d)["target"]["ring_mode"], mode);
    }
}

TEST_F(file_target_test, TwoDevicesOnOneFileOnlyWhenBothReadOnly)
{
    const std::string img = path("locked.img");
    make_file(img, 4 << 20);
    {
        auto a = make({"path=" + img}, "a");
        ASSERT_TRUE(a);
        int code = 0;
        const std::string msg = refused({"path=" + img}, &code);
        EXPECT_EQ(code, EBUSY);
        EXPECT_NE(msg.find(img), std::string::npos) << msg;
        EXPECT_NE(msg.find("in use by another device"), std::string::npos) << msg;
        refused({"path=" + img, "read_only=1"});
    }
    auto a = make({"path=" + img, "read_only=1"}, "a");
    auto b = make({"path=" + img, "read_only=1"}, "b");
    ASSERT_TRUE(a && b);
    EXPECT_TRUE(a->limits().read_only);
    EXPECT_EQ(a->limits().max_discard_bytes, 0u);
    EXPECT_FALSE(a->limits().volatile_write_cache);
    std::vector<char> buf(4096);
    EXPECT_EQ(a->execute(io_op::write, 0, 4096, buf.data()), -EPERM);
    EXPECT_EQ(a->execute(io_op::write_zeroes, 0, 4096, nullptr), -EPERM);
    EXPECT_EQ(a->execute(io_op::discard, 0, 4096, nullptr), -EPERM);
    EXPECT_EQ(b->execute(io_op::read, 0, 4096, buf.data()), 4096);
    refused({"path=" + img});
}

TEST_F(file_target_test, BlockSizeDefaultsToTheFilesAndAcceptsLarger)
{
    const std::string img = path("bs.img");
    make_file(img, 4 << 20);
    auto d = make({"path=" + img});
    ASSERT_TRUE(d);
    const uint32_t native = d->limits().logical_block_size;
    EXPECT_GE(native, 512u);
    d.reset();
    d = make({"path=" + img, "bs=4096"});
    ASSERT_TRUE(d);
    EXPECT_EQ(d->limits().logical_block_size, 4096u);
    EXPECT_EQ(d->options().u64("blocksize"), 4096u);
    if (native > 512) {
        d.reset();
        const std::string msg = refused({"path=" + img, "bs=512"});
        EXPECT_NE(msg.find("buffered_io=1"), std::string::npos) << msg;
    }
}

TEST_F(file_target_test, EveryQueueServesFromItsOwnThread)
{
    const std::string img = path("queues.img");
    auto d = make({"path=" + img, "size=32M", "create=1", "submit_queues=2", "poll_queues=0",
                   "hw_queue_depth=16"});
    ASSERT_TRUE(d);
    ASSERT_EQ(d->queue_count(), 2u);
    std::vector<std::thread> threads;
    std::atomic<int> bad{0};
    for (unsigned qi = 0; qi < 2; ++qi) {
        threads.emplace_back([&, qi] {
            io_queue& q = d->queue(qi);
            EXPECT_GE(q.event_fd(), 0);
            constexpr unsigned n = 16;
            std::vector<std::vector<char>> bufs(n);
            std::vector<completion> done(n);
            for (unsigned round = 0; round < 8; ++round) {
                for (unsigned i = 0; i < n; ++i) {
                    bufs[i] = pattern(16384, qi * 1000 + round * n + i);
                    io_request* r = q.get_request();
                    ASSERT_NE(r, nullptr);
                    done[i] = {};
                    r->op = io_op::write;
                    r->offset = (uint64_t{qi} * 16 + i) * 16384 * 8 + round * 16384;
                    r->length = 16384;
                    r->buffer = bufs[i].data();
                    r->on_complete = record_completion;
                    r->user_data = &done[i];
                    q.submit(*r);
                }
                for (unsigned i = 0; i < n; ++i) {
                    while (!done[i].done) {
                        q.wait(1, 1'000'000'000);
                    }
                    if (done[i].result != 16384) {
                        ++bad;
                    }
                }
            }
        });
    }
    for (auto& t : threads) {
        t.join();
    }
    EXPECT_EQ(bad.load(), 0);
    std::vector<char> r(16384);
    for (unsigned qi = 0; qi < 2; ++qi) {
        for (unsigned i = 0; i < 16; ++i) {
            const uint64_t off = (uint64_t{qi} * 16 + i) * 16384 * 8 + 7 * 16384;
            ASSERT_EQ(d->execute(io_op::read, off, 16384, r.data()), 16384);
            EXPECT_EQ(r, pattern(16384, qi * 1000 + 7 * 16 + i));
        }
    }
}

TEST_F(file_target_test, EveryDecoratorStacksOnIt)
{
    const std::string img = path("decorated.img");
    auto d = make({"path=" + img, "size=16M", "create=1", "mbps=200", "cache_size=1",
                   "badblocks=+2048-2055", "requeue=1,10,0,20"});
    ASSERT_TRUE(d);
    auto w = pattern(65536, 3);
    ASSERT_EQ(d->execute(io_op::write, 0, 65536, w.data()), 65536);
    ASSERT_EQ(d->execute(io_op::flush, 0, 0, nullptr), 0);
    std::vector<char> r(65536);
    ASSERT_EQ(d->execute(io_op::read, 0, 65536, r.data()), 65536);
    EXPECT_EQ(r, w);
    // The bad blocks (sectors 2048-2055 = bytes 1 MiB .. +4 KiB) fail.
    EXPECT_EQ(d->execute(io_op::read, 1 << 20, 4096, r.data()), -EIO);
    // What the cache flushed is in the file.
    d.reset();
    auto plain = make({"path=" + img});
    ASSERT_TRUE(plain);
    ASSERT_EQ(plain->execute(io_op::read, 0, 65536, r.data()), 65536);
    EXPECT_EQ(r, w);
}

TEST_F(file_target_test, ODirectRefusalIsShownInDescribe)
{
    if (::geteuid() != 0) {
        GTEST_SKIP() << "mounting ramfs needs root";
    }
    _mount = path("ramfs");
    ::mkdir(_mount.c_str(), 0755);
    if (::mount("ramfs", _mount.c_str(), "ramfs", 0, "") != 0) {
        _mount.clear();
        GTEST_SKIP() << "cannot mount ramfs";
    }
    auto d = make({"path=" + _mount + "/image", "size=4M", "create=1"});
    ASSERT_TRUE(d);
    const auto j = describe(*d);
    if (j["target"]["direct_io"] == true) {
        GTEST_SKIP() << "this kernel's ramfs accepts O_DIRECT";
    }
    ASSERT_TRUE(j["target"].contains("notice"));
    EXPECT_NE(j["target"]["notice"].get<std::string>().find("O_DIRECT"), std::string::npos);
    auto w = pattern(4096, 4);
    ASSERT_EQ(d->execute(io_op::write, 0, 4096, w.data()), 4096);
    std::vector<char> r(4096);
    ASSERT_EQ(d->execute(io_op::read, 0, 4096, r.data()), 4096);
    EXPECT_EQ(r, w);
}

// `size` written while powered on resizes the device (softblk set NAME
// size=...): grown (the file too, with create=1), shrunk (the file keeps
// its data), and size=0 re-reads a file grown by someone else (losetup -c).
// Every front end hears of it through the capacity listeners.
TEST_F(file_target_test, SizeWrittenLiveResizesTheDevice)
{
    const std::string img = path("grow.img");
    auto d = make({"path=" + img, "size=8M", "create=1"});
    ASSERT_TRUE(d);
    std::vector<uint64_t> seen;
    const uint64_t handle = d->add_capacity_listener([&](uint64_t b) { seen.push_back(b); });
    auto w = pattern(4096, 9);
    EXPECT_EQ(d->execute(io_op::write, 12u << 20, 4096, w.data()), -EIO);

    ASSERT_TRUE(d->set_option("size", "16M"));
    EXPECT_EQ(current_capacity(d->limits()), 16u << 20);
    EXPECT_EQ(file_size(img), 16u << 20) << "create=1 grows the file";
    EXPECT_EQ(seen, (std::vector<uint64_t>{16u << 20}));
    EXPECT_EQ(d->get_option("size").value_or(""), "16M\n");
    ASSERT_EQ(d->execute(io_op::write, (16u << 20) - 4096, 4096, w.data()), 4096);
    EXPECT_EQ(read_back(*d, (16u << 20) - 4096, 4096), w);

    ASSERT_TRUE(d->set_option("size", "4M"));
    EXPECT_EQ(current_capacity(d->limits()), 4u << 20);
    EXPECT_EQ(file_size(img), 16u << 20) << "shrinking the device leaves the file";
    EXPECT_EQ(d->execute(io_op::read, 4u << 20, 4096, w.data()), -EIO);
    EXPECT_EQ(d->execute(io_op::read, (4u << 20) - 4096, 8192, w.data()), -EIO);

    // Someone grows the image; size=0 takes the whole file as it is now.
    ASSERT_EQ(::truncate(img.c_str(), 32 << 20), 0);
    ASSERT_TRUE(d->set_option("size", "0"));
    EXPECT_EQ(current_capacity(d->limits()), 32u << 20);
    EXPECT_EQ(describe(*d)["target"]["file_size"], 32u << 20);
    EXPECT_EQ(read_back(*d, (16u << 20) - 4096, 4096), w) << "the data survived both resizes";
    EXPECT_EQ(seen, (std::vector<uint64_t>{16u << 20, 4u << 20, 32u << 20}));
    EXPECT_EQ(describe(*d)["resizes"], 3);
    d->remove_capacity_listener(handle);
}

TEST_F(file_target_test, SizeWrittenLiveRefusesWhatCreationRefuses)
{
    const std::string img = path("fixed.img");
    make_file(img, 8 << 20);
    auto d = make({"path=" + img});
    ASSERT_TRUE(d);
    auto larger = d->set_option("size", "16M");
    ASSERT_FALSE(larger);
    EXPECT_EQ(larger.error().code.value(), EINVAL);
    EXPECT_NE(larger.error().message.find("create=1"), std::string::npos) << larger.error().message;
    auto ragged = d->set_option("size", "1000");
    ASSERT_FALSE(ragged);
    EXPECT_NE(ragged.error().message.find("not a multiple of the block size"), std::string::npos)
        << ragged.error().message;
    EXPECT_EQ(current_capacity(d->limits()), 8u << 20);
    EXPECT_EQ(file_size(img), 8u << 20);
    EXPECT_EQ(d->get_option("size").value_or(""), "0\n") << "a refused value is not kept";

    // Powered off, the value waits for the next power on (null_blk's rule
    // for an attribute written while off).
    ASSERT_TRUE(d->set_power(false));
    ASSERT_TRUE(d->set_option("size", "4M"));
    ASSERT_TRUE(d->set_power(true));
    EXPECT_EQ(current_capacity(d->limits()), 4u << 20);
}

TEST_F(file_target_test, SizeIsCheckedWhenWrittenAlsoWhilePoweredOff)
{
    const std::string img = path("off.img");
    auto d = make({"path=" + img, "size=1M", "create=1"});
    ASSERT_TRUE(d);
    ASSERT_TRUE(d->set_power(false));
    // Refused now, not at the next power on.
    auto negative = d->set_option("size", "-1");
    ASSERT_FALSE(negative);
    EXPECT_EQ(negative.error().code.value(), EINVAL);
    EXPECT_NE(negative.error().message.find("size=-1: not a size"), std::string::npos)
        << negative.error().message;
    auto huge = d->set_option("size", "16E");
    ASSERT_FALSE(huge);
    EXPECT_EQ(huge.error().code.value(), ERANGE);
    EXPECT_NE(huge.error().message.find("size=16E: too large"), std::string::npos)
        << huge.error().message;
    EXPECT_EQ(d->get_option("size").value_or(""), "1M\n") << "a refused value is not kept";
    // A fraction that gives whole bytes is a size.
    ASSERT_TRUE(d->set_option("size", "1.5M"));
    ASSERT_TRUE(d->set_power(true));
    EXPECT_EQ(current_capacity(d->limits()), 3u << 19);
}

TEST_F(file_target_test, CreateWithSizeZeroTakesAnExistingImageSoSizeZeroSurvivesAPowerCycle)
{
    const std::string img = path("whole.img");
    auto d = make({"path=" + img, "size=8M", "create=1"});
    ASSERT_TRUE(d);
    ASSERT_EQ(::truncate(img.c_str(), 12 << 20), 0);
    ASSERT_TRUE(d->set_option("size", "0"));  // losetup -c: the whole file
    EXPECT_EQ(current_capacity(d->limits()), 12u << 20);
    // Power cycled (and after a daemon restart, which makes the device
    // from the same options), it comes back with the whole image.
    ASSERT_TRUE(d->set_power(false));
    auto on = d->set_power(true);
    ASSERT_TRUE(on) << on.error().message;
    EXPECT_EQ(current_capacity(d->limits()), 12u << 20);
    d.reset();
    auto again = make({"path=" + img, "size=0", "create=1"});
    ASSERT_TRUE(again);
    EXPECT_EQ(current_capacity(again->limits()), 12u << 20);
    again.reset();
    // A missing image still needs a size to be made.
    const std::string missing = path("missing.img");
    const std::string msg = refused({"path=" + missing, "size=0", "create=1"});
    EXPECT_NE(msg.find("create=1 needs size="), std::string::npos) << msg;
    EXPECT_FALSE(exists(missing));
}

TEST_F(file_target_test, PseudoFileSystemsAreRefusedAsImages)
{
    // Accepted once, and an NBD write renamed a daemon thread.
    int code = 0;
    std::string msg = refused({"path=/proc/self/comm", "size=4096", "create=1"}, &code);
    EXPECT_EQ(code, EINVAL);
    EXPECT_NE(msg.find("path=/proc/self/comm: a file of proc, a kernel interface rather than "
                       "storage"),
              std::string::npos)
        << msg;
    // Through a link too, and read-only.
    const std::string link = path("comm");
    ASSERT_EQ(::symlink("/proc/self/comm", link.c_str()), 0);
    msg = refused({"path=" + link, "read_only=1"});
    EXPECT_NE(msg.find("a file of proc"), std::string::npos) << msg;
    if (exists("/sys/kernel/uevent_seqnum")) {
        msg = refused({"path=/sys/kernel/uevent_seqnum", "read_only=1"});
        EXPECT_NE(msg.find("a file of sysfs"), std::string::npos) << msg;
    }
}

TEST_F(file_target_test, ANewImageIsReadableByItsOwnerOnly)
{
    ::umask(022);
    const std::string img = path("private.img");
    auto d = make({"path=" + img, "size=1M", "create=1"});
    ASSERT_TRUE(d);
    struct stat st {};
    ASSERT_EQ(::stat(img.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST_F(file_target_test, UndoCreateRemovesTheImageItMadeAndNothingElse)
{
    // The add that made the device failed (its export was refused).
    const std::string made = path("made.img");
    auto d = make({"path=" + made, "size=1M", "create=1"});
    ASSERT_TRUE(d);
    d->undo_create();
    EXPECT_FALSE(d->powered());
    d.reset();
    EXPECT_FALSE(exists(made));

    // An image that was there stays (grown, never truncated).
    const std::string kept = path("kept.img");
    make_file(kept, 1 << 20);
    d = make({"path=" + kept, "size=2M", "create=1"});
    ASSERT_TRUE(d);
    d->undo_create();
    d.reset();
    EXPECT_EQ(file_size(kept), 2u << 20);

    // A file someone put in the new image's place is not the one made.
    d = make({"path=" + made, "size=1M", "create=1"});
    ASSERT_TRUE(d);
    make_file(path("other.img"), 4096);
    ASSERT_EQ(::rename(path("other.img").c_str(), made.c_str()), 0);
    d->undo_create();
    d.reset();
    EXPECT_EQ(file_size(made), 4096u);
}

TEST_F(file_target_test, FeaturesListTheOptions)
{
    const target_type* t = find_target_type("file");
    ASSERT_NE(t, nullptr);
    bool size_in_bytes = false;
    for (const option_def& o : t->options) {
        if (o.name == "size") {
            size_in_bytes = o.unit.find("bytes") != std::string_view::npos;
        }
    }
    EXPECT_TRUE(size_in_bytes);
    const auto all = options_for("file");
    for (const char* name : {"path", "size", "create", "read_only", "buffered_io", "blocksize",
                             "hw_queue_depth", "submit_queues"}) {
        EXPECT_TRUE(std::any_of(all.begin(), all.end(), [&](const option_def& o) {
            return o.name == name;
        })) << name;
    }
}

}  // namespace
}  // namespace softblk::test
