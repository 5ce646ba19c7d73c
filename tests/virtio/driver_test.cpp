// softblk's virtio-blk driver (target type "virtio") on softblk's own
// vhost-user-blk back end, both in this process: data written through the
// driver is in the exported device and reads back (synchronously, and
// with 32 requests in flight on two queues, in interrupt, polling and
// indirect-descriptor modes); flush, discard and write zeroes reach the
// device; the zoned virtio-blk path carries a zoned device's geometry,
// reports, management and appends; a read-only export is read-only; a
// back end that goes away fails requests instead of hanging them. The driver
// also runs a verify workload on qemu-storage-daemon's export of a file.
#include "virtio_test_util.hpp"

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <random>
#include <spawn.h>
#include <sys/wait.h>
#include <thread>

#include <softblk/support/clock.hpp>

#include <fmt/format.h>

using namespace softblk;
using namespace softblk::test;

namespace {

std::vector<uint8_t> pattern(size_t n, uint32_t seed)
{
    std::vector<uint8_t> v(n);
    std::mt19937 rng(seed);
    for (auto& b : v) {
        b = static_cast<uint8_t>(rng());
    }
    return v;
}

struct async_io {
    bio b;
    std::vector<uint8_t> buf;
    std::vector<uint8_t> expect;
    bool done = false;
    int status = 1;
};

void async_done(bio& b, int status)
{
    auto* io = static_cast<async_io*>(b.user_data);
    io->done = true;
    io->status = status;
}

// `count` random writes then reads (4 KiB .. 256 KiB) with `depth` bios in
// flight on queue `q`, within its own `span` bytes from `base`; every read
// compares with what was written there.
void run_verify(device& d, unsigned q, uint64_t base, uint64_t span, unsigned count, unsigned depth,
                uint32_t seed)
{
    io_queue& queue = d.queue(q);
    std::mt19937 rng(seed);
    const uint64_t blocks = span / 4096;
    std::vector<uint8_t> shadow(span, 0);
    std::vector<bool> written(blocks, false);
    for (int pass = 0; pass < 2; ++pass) {
        std::vector<std::unique_ptr<async_io>> ios;
        // No two requests in flight overlap, so order does not matter.
        std::vector<bool> taken(blocks, false);
        unsigned issued = 0, finished = 0;
        std::vector<async_io*> inflight;
        while (finished < count) {
            while (issued < count && inflight.size() < depth) {
                const uint64_t nblk = 1 + rng() % 32;
                uint64_t start = rng() % (blocks - nblk);
                bool clash = false;
                for (uint64_t i = start; i < start + nblk; ++i) {
                    clash = clash || taken[i];
                }
                if (clash) {
                    continue;
                }
                for (uint64_t i = start; i < start + nblk; ++i) {
                    taken[i] = true;
                }
                auto io = std::make_unique<async_io>();
                io->b.op = pass == 0 ? io_op::write : io_op::read;
                io->b.offset = base + start * 4096;
                io->b.length = nblk * 4096;
                if (pass == 0) {
                    io->buf = pattern(io->b.length, static_cast<uint32_t>(rng()));
                    std::memcpy(shadow.data() + start * 4096, io->buf.data(), io->b.length);
                    for (uint64_t i = start; i < start + nblk; ++i) {
                        written[i] = true;
                    }
                } else {
                    io->buf.assign(io->b.length, 0xee);
                    io->expect.assign(shadow.begin() + start * 4096,
                                      shadow.begin() + (start + nblk) * 4096);
                }
                io->b.buffer = io->buf.data();
                io->b.on_complete = async_done;
                io->b.user_data = io.get();
                inflight.push_back(io.get());
                queue.submit(io->b);
                ios.push_back(std::move(io));
                ++issued;
            }
            queue.wait(1, 5'000'000'000);
            for (size_t i = 0; i < inflight.size();) {
                async_io* io = inflight[i];
                if (!io->done) {
                    ++i;
                    continue;
                }
                ASSERT_EQ(io->status, 0) << "offset " << io->b.offset;
                if (pass == 1) {
                    ASSERT_EQ(io->buf, io->expect) << "offset " << io->b.offset;
                }
                for (uint64_t b = (io->b.offset - base) / 4096;
                     b < (io->b.offset - base + io->b.length) / 4096; ++b) {
                    taken[b] = false;
                }
                inflight.erase(inflight.begin() + static_cast<long>(i));
                ++finished;
            }
        }
    }
}

class driver_modes : public ::testing::TestWithParam<const char*> {};

}  // namespace

TEST(virtio_driver, data_lands_in_the_exported_device)
{
    backend be("null",
               {"memory_backed=1", "size=64", "bs=4096", "submit_queues=2", "poll_queues=0"});
    ASSERT_TRUE(be.exp);
    auto v = make_virtio(be.socket, {"submit_queues=2", "poll_queues=0"});
    ASSERT_TRUE(v);
    EXPECT_EQ(v->limits().capacity_bytes, uint64_t{64} << 20);
    EXPECT_EQ(v->limits().logical_block_size, 4096u);
    EXPECT_FALSE(v->limits().read_only);

    auto data = pattern(3 << 20, 1);  // split by the core at max_transfer (1 MiB)
    ASSERT_EQ(v->execute(io_op::write, 8 << 20, static_cast<uint32_t>(data.size()), data.data()),
              static_cast<int>(data.size()));
    std::vector<uint8_t> back(data.size());
    ASSERT_EQ(
        be.dev->execute(io_op::read, 8 << 20, static_cast<uint32_t>(back.size()), back.data()),
        static_cast<int>(back.size()));
    EXPECT_EQ(back, data) << "the exported device holds what the driver wrote";
    std::fill(back.begin(), back.end(), 0);
    ASSERT_EQ(v->execute(io_op::read, 8 << 20, static_cast<uint32_t>(back.size()), back.data()),
              static_cast<int>(back.size()));
    EXPECT_EQ(back, data);
    EXPECT_GE(be.stat("write"), 3u);
    EXPECT_EQ(be.stat("bad_requests"), 0u);

    // Beyond the end: refused by the core before the ring.
    EXPECT_EQ(v->execute(io_op::read, 64 << 20, 4096, back.data()), -EIO);
    // GET_ID reached the back end? (the driver does not ask; the guest does)
    nlohmann::json j;
    v->describe(j);
    EXPECT_EQ(j["target"]["virtqueues"], 2);
    EXPECT_EQ(j["target"]["connected"], true);
}

TEST_P(driver_modes, verify_with_32_in_flight_on_two_queues)
{
    backend be("null",
               {"memory_backed=1", "size=64", "bs=4096", "submit_queues=2", "poll_queues=0"});
    ASSERT_TRUE(be.exp);
    std::vector<std::string> opts = {"submit_queues=2", "poll_queues=0", "hw_queue_depth=32",
                                     "max_transfer=128"};
    if (std::string(GetParam()) != "interrupts") {
        opts.push_back(std::string(GetParam()) + "=1");
    }
    auto v = make_virtio(be.socket, opts);
    ASSERT_TRUE(v);
    std::thread other([&] { run_verify(*v, 1, 32 << 20, 32 << 20, 400, 32, 7); });
    run_verify(*v, 0, 0, 32 << 20, 400, 32, 3);
    other.join();
    EXPECT_EQ(be.stat("bad_requests"), 0u);
    EXPECT_EQ(be.stat("errors"), 0u);
}

INSTANTIATE_TEST_SUITE_P(modes, driver_modes, ::testing::Values("interrupts", "poll", "indirect"));

TEST(virtio_driver, flush_discard_and_write_zeroes_reach_the_device)
{
    // A write-back cache (the cache decorator) gives the device a volatile
    // cache: the back end offers FLUSH and the driver sends it.
    backend be("null", {"memory_backed=1", "size=64", "bs=4096", "discard=1", "cache_size=8",
                        "submit_queues=1", "poll_queues=0"});
    ASSERT_TRUE(be.exp);
    auto v = make_virtio(be.socket, {"poll_queues=0"});
    ASSERT_TRUE(v);
    EXPECT_TRUE(v->limits().volatile_write_cache);
    EXPECT_GT(v->limits().max_discard_bytes, 0u);
    EXPECT_GT(v->limits().max_write_zeroes_bytes, 0u);

    auto data = pattern(1 << 20, 5);
    ASSERT_EQ(v->execute(io_op::write, 0, 1 << 20, data.data()), 1 << 20);
    const uint64_t flushes = be.stat("flush");
    ASSERT_EQ(v->execute(io_op::flush, 0, 0, nullptr), 0);
    EXPECT_EQ(be.stat("flush"), flushes + 1);

    // FUA writes: virtio 1.2 has none, the driver follows with a FLUSH.
    bio fua;
    fua.op = io_op::write;
    fua.flags = k_io_fua;
    fua.offset = 1 << 20;
    fua.length = 4096;
    fua.buffer = data.data();
    ASSERT_EQ(v->execute(fua), 0);
    EXPECT_EQ(be.stat("flush"), flushes + 2);

    ASSERT_EQ(v->execute(io_op::write_zeroes, 4096, 8192, nullptr), 0);
    std::vector<uint8_t> back(16384);
    ASSERT_EQ(v->execute(io_op::read, 0, 16384, back.data()), 16384);
    EXPECT_TRUE(
        std::all_of(back.begin() + 4096, back.begin() + 12288, [](uint8_t b) { return b == 0; }));
    EXPECT_EQ(std::memcmp(back.data(), data.data(), 4096), 0);
    EXPECT_EQ(std::memcmp(back.data() + 12288, data.data() + 12288, 4096), 0);
    EXPECT_EQ(be.stat("write_zeroes"), 1u);

    ASSERT_EQ(v->execute(io_op::flush, 0, 0, nullptr), 0);
    // The null device frees the discarded blocks' pages (and keeps them for
    // reuse: its memory_bytes() stays).
    auto data_pages = [&] {
        nlohmann::json d;
        be.dev->describe(d);
        return d["target"]["data_page_bytes"].get<uint64_t>();
    };
    const uint64_t before = data_pages();
    ASSERT_EQ(v->execute(io_op::discard, 0, 1 << 20, nullptr), 0);
    EXPECT_EQ(be.stat("discard"), 1u);
    ASSERT_EQ(v->execute(io_op::flush, 0, 0, nullptr), 0);
    EXPECT_LT(data_pages(), before) << "the null device freed the discarded blocks";
}

TEST(virtio_driver, read_only_export)
{
    backend be("null", {"memory_backed=1", "size=16", "submit_queues=1", "poll_queues=0"},
               {"readonly=1"});
    ASSERT_TRUE(be.exp);
    auto v = make_virtio(be.socket, {"poll_queues=0"});
    ASSERT_TRUE(v);
    EXPECT_TRUE(v->limits().read_only);
    std::vector<uint8_t> buf(4096);
    EXPECT_EQ(v->execute(io_op::read, 0, 4096, buf.data()), 4096);
    EXPECT_EQ(v->execute(io_op::write, 0, 4096, buf.data()), -EPERM);
}

TEST(virtio_driver, zoned_device_through_virtio)
{
    ASSERT_TRUE(k_vzoned_registered);
    backend be("vzoned_fake", {"submit_queues=1", "poll_queues=0"});
    ASSERT_TRUE(be.exp);
    auto v = make_virtio(be.socket, {"poll_queues=0"});
    ASSERT_TRUE(v);
    const block_limits& l = v->limits();
    ASSERT_TRUE(l.zoned);
    EXPECT_EQ(l.zone_size_bytes, k_vzoned.zone_bytes);
    EXPECT_EQ(l.zone_capacity_bytes, k_vzoned.capacity_bytes) << "learnt from a report";
    EXPECT_EQ(l.conventional_zones, 2u);
    EXPECT_EQ(l.max_open_zones, 4u);
    EXPECT_EQ(l.max_active_zones, 6u);
    EXPECT_EQ(l.max_zone_append_bytes, 64u << 10);
    EXPECT_EQ(zone_count(l), 16u);

    auto zones = v->report_zones(0, 32);
    ASSERT_TRUE(zones) << zones.error().message;
    ASSERT_EQ(zones->size(), 16u);
    EXPECT_EQ((*zones)[1].type, zone_type::conventional);
    EXPECT_EQ((*zones)[2].type, zone_type::sequential_write_required);
    EXPECT_EQ((*zones)[2].condition, zone_condition::empty);
    EXPECT_EQ((*zones)[5].start, 5 * k_vzoned.zone_bytes);
    EXPECT_EQ((*zones)[5].length, k_vzoned.zone_bytes);

    const uint64_t z3 = 3 * k_vzoned.zone_bytes;
    auto data = pattern(64 << 10, 9);
    ASSERT_EQ(v->execute(io_op::write, z3, 32 << 10, data.data()), 32 << 10);
    // Not at the write pointer: the device refuses, the error comes back.
    EXPECT_LT(v->execute(io_op::write, z3 + (128 << 10), 4096, data.data()), 0);
    bio append;
    append.op = io_op::zone_append;
    append.offset = z3;
    append.length = 16 << 10;
    append.buffer = data.data() + (32 << 10);
    ASSERT_EQ(v->execute(append), 0);
    EXPECT_EQ(append.result_offset, z3 + (32 << 10)) << "the append sector comes back";
    std::vector<uint8_t> back(48 << 10);
    ASSERT_EQ(v->execute(io_op::read, z3, 48 << 10, back.data()), 48 << 10);
    EXPECT_EQ(std::memcmp(back.data(), data.data(), 48 << 10), 0);

    zones = v->report_zones(z3, 1);
    ASSERT_TRUE(zones && zones->size() == 1);
    EXPECT_EQ((*zones)[0].write_pointer, z3 + (48 << 10));
    EXPECT_EQ((*zones)[0].condition, zone_condition::implicit_open);

    ASSERT_EQ(v->execute(io_op::zone_open, 4 * k_vzoned.zone_bytes, 0, nullptr), 0);
    ASSERT_EQ(v->execute(io_op::zone_close, z3, 0, nullptr), 0);
    ASSERT_EQ(v->execute(io_op::zone_finish, 5 * k_vzoned.zone_bytes, 0, nullptr), 0);
    zones = v->report_zones(z3, 3);
    ASSERT_TRUE(zones && zones->size() == 3);
    EXPECT_EQ((*zones)[0].condition, zone_condition::closed);
    EXPECT_EQ((*zones)[1].condition, zone_condition::explicit_open);
    EXPECT_EQ((*zones)[2].condition, zone_condition::full);
    EXPECT_EQ(v->execute(io_op::zone_open, 0, 0, nullptr), -EINVAL)
        << "a conventional zone: ZONE_INVALID_CMD";
    ASSERT_EQ(v->execute(io_op::zone_reset, z3, 0, nullptr), 0);
    ASSERT_EQ(v->execute(io_op::zone_reset_all, 0, 0, nullptr), 0);
    zones = v->report_zones(0, 16);
    ASSERT_TRUE(zones);
    for (unsigned i = 2; i < 16; ++i) {
        EXPECT_EQ((*zones)[i].condition, zone_condition::empty) << i;
    }
    EXPECT_GE(be.stat("zone_management"), 6u);
    EXPECT_EQ(be.stat("zone_append"), 1u);
    EXPECT_GE(be.stat("report_zones"), 4u);
}

TEST(virtio_driver, back_end_that_goes_away_fails_requests)
{
    backend be("null", {"size=16", "submit_queues=1", "poll_queues=0", "irqmode=2",
                        "completion_nsec=200000000"});
    ASSERT_TRUE(be.exp);
    auto v = make_virtio(be.socket, {"poll_queues=0"});
    ASSERT_TRUE(v);
    std::vector<uint8_t> buf(4096);
    ASSERT_EQ(v->execute(io_op::read, 0, 4096, buf.data()), 4096);
    // The export stops (its requests complete first), the connection goes.
    ASSERT_TRUE(be.exp->stop());
    const uint64_t t0 = monotonic_ns();
    EXPECT_EQ(v->execute(io_op::read, 0, 4096, buf.data()), -EIO);
    EXPECT_LT(monotonic_ns() - t0, uint64_t{5'000'000'000});
    nlohmann::json j;
    v->describe(j);
    EXPECT_EQ(j["target"]["connected"], false);
}

TEST(virtio_driver, refusals_name_the_option)
{
    temp_dir dir;
    auto missing = device::create("v", "virtio", std::vector<std::string>{"poll_queues=0"});
    ASSERT_FALSE(missing);
    EXPECT_NE(missing.error().message.find("path="), std::string::npos) << missing.error().message;
    auto absent = device::create(
        "v", "virtio",
        std::vector<std::string>{"path=" + dir.path + "/none.sock", "connect_timeout=100"});
    ASSERT_FALSE(absent);
    EXPECT_NE(absent.error().message.find("cannot connect"), std::string::npos);

    backend be("null", {"size=16", "submit_queues=1", "poll_queues=0"});
    ASSERT_TRUE(be.exp);
    auto too_many = device::create(
        "v", "virtio",
        std::vector<std::string>{"path=" + be.socket, "submit_queues=2", "poll_queues=0"});
    ASSERT_FALSE(too_many);
    EXPECT_NE(too_many.error().message.find("offers 1 virtqueue"), std::string::npos)
        << too_many.error().message;
    auto deep = device::create(
        "v", "virtio",
        std::vector<std::string>{"path=" + be.socket, "poll_queues=0", "hw_queue_depth=400"});
    ASSERT_FALSE(deep);
    EXPECT_NE(deep.error().message.find("hw_queue_depth=400"), std::string::npos);
    // The export took the refused front ends' connections and is free again.
    auto ok = make_virtio(be.socket, {"poll_queues=0", "indirect=1", "hw_queue_depth=400"});
    EXPECT_TRUE(ok);
}

#if defined(SOFTBLK_FAT_HAVE_DEVICE)
#include <softblk/fat/softblk_adapter.hpp>
#include <softblk/fat/volume.hpp>

namespace {

// A FAT volume made and filled through the driver; returns the number of
// FLUSH requests the back end saw while files were fsynced.
uint64_t fill_fat(device& v, backend& be)
{
    fat::softblk_block_device blk(v);
    EXPECT_TRUE(fat::format(blk));
    auto vol = fat::volume::mount(blk);
    EXPECT_TRUE(vol) << (vol ? "" : vol.error().message);
    if (!vol) {
        return 0;
    }
    EXPECT_TRUE((*vol)->mkdir("/dir"));
    const uint64_t before = be.stat("flush");
    for (int i = 0; i < 8; ++i) {
        auto f = (*vol)->create(fmt::format("/dir/file {}.bin", i));
        EXPECT_TRUE(f);
        auto data = pattern(100'000 + i * 4096, static_cast<uint32_t>(i));
        EXPECT_EQ(f->write(data.data(), data.size()), static_cast<int64_t>(data.size()));
        EXPECT_EQ(f->fsync(), 0);
        EXPECT_EQ(f->close(), 0);
    }
    const uint64_t flushes = be.stat("flush") - before;
    EXPECT_TRUE((*vol)->unmount());
    return flushes;
}

}  // namespace

TEST(virtio_driver, fat_fsync_reaches_the_device_as_flush)
{
    backend be("null",
               {"memory_backed=1", "size=64", "cache_size=4", "submit_queues=1", "poll_queues=0"});
    ASSERT_TRUE(be.exp);
    auto v = make_virtio(be.socket, {"poll_queues=0"});
    ASSERT_TRUE(v);
    ASSERT_TRUE(v->limits().volatile_write_cache);
    EXPECT_GE(fill_fat(*v, be), 8u) << "one FLUSH per fsync at least";
}

TEST(virtio_driver, fat_image_made_through_the_driver_passes_fsck_fat)
{
    if (std::system("command -v fsck.fat >/dev/null 2>&1") != 0) {
        GTEST_SKIP() << "fsck.fat is not installed (dosfstools)";
    }
    backend be("null", {"memory_backed=1", "size=64", "submit_queues=1", "poll_queues=0"});
    ASSERT_TRUE(be.exp);
    auto v = make_virtio(be.socket, {"poll_queues=0"});
    ASSERT_TRUE(v);
    fill_fat(*v, be);
    // The image as the exported device holds it.
    std::vector<uint8_t> image(be.dev->limits().capacity_bytes);
    ASSERT_EQ(be.dev->execute(io_op::read, 0, static_cast<uint32_t>(image.size()), image.data()),
              static_cast<int>(image.size()));
    const std::string path = be.dir.path + "/fat.img";
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(image.data()),
               static_cast<std::streamsize>(image.size()));
    const int rc = std::system(("fsck.fat -n '" + path + "' >/dev/null").c_str());
    EXPECT_EQ(rc, 0) << "fsck.fat -n " << path;
}
#endif

// ---------------------------------------------------------------- qemu-storage-daemon

namespace {

// qemu-storage-daemon exporting a raw image file over vhost-user-blk.
struct qsd_process {
    explicit qsd_process(uint64_t bytes, unsigned queues)
    {
        image = dir.path + "/disk.raw";
        socket = dir.path + "/qsd.sock";
        std::ofstream(image).close();
        std::filesystem::resize_file(image, bytes);
        const std::vector<std::string> args = {
            "qemu-storage-daemon", "--blockdev", "driver=file,node-name=f0,filename=" + image,
            "--export",
            fmt::format("type=vhost-user-blk,id=e0,node-name=f0,addr.type=unix,addr.path={},"
                        "writable=on,num-queues={}",
                        socket, queues)};
        std::vector<char*> argv;
        for (const auto& a : args) {
            argv.push_back(const_cast<char*>(a.c_str()));
        }
        argv.push_back(nullptr);
        if (posix_spawnp(&pid, "qemu-storage-daemon", nullptr, nullptr, argv.data(), environ) !=
            0) {
            pid = -1;
            return;
        }
        for (int i = 0; i < 200 && !std::filesystem::exists(socket); ++i) {
            std::this_thread::sleep_for(std::chrono::milliseconds(25));
        }
    }
    ~qsd_process() { stop(); }
    void stop()
    {
        if (pid > 0) {
            ::kill(pid, SIGTERM);
            ::waitpid(pid, nullptr, 0);
            pid = -1;
        }
    }
    temp_dir dir;
    std::string image;
    std::string socket;
    pid_t pid = -1;
};

bool have_qsd()
{
    return std::system("command -v qemu-storage-daemon >/dev/null 2>&1") == 0;
}

}  // namespace

TEST(virtio_driver_on_qemu_storage_daemon, verify_on_two_queues)
{
    if (!have_qsd()) {
        GTEST_SKIP() << "qemu-storage-daemon is not installed (qemu-system-common)";
    }
    qsd_process qsd(64 << 20, 2);
    ASSERT_GT(qsd.pid, 0);
    auto v = make_virtio(
        qsd.socket, {"submit_queues=2", "poll_queues=0", "hw_queue_depth=32", "max_transfer=128"});
    ASSERT_TRUE(v);
    EXPECT_EQ(v->limits().capacity_bytes, uint64_t{64} << 20);
    std::thread other([&] { run_verify(*v, 1, 32 << 20, 32 << 20, 300, 32, 11); });
    run_verify(*v, 0, 0, 32 << 20, 300, 32, 13);
    other.join();
    // qemu-storage-daemon offers FLUSH with wce=0 (write through): no
    // volatile cache, and a FLUSH sent anyway succeeds.
    EXPECT_FALSE(v->limits().volatile_write_cache);
    EXPECT_EQ(v->execute(io_op::flush, 0, 0, nullptr), 0);
    // What the driver wrote is in the image file.
    std::vector<uint8_t> through(4096), file(4096);
    ASSERT_EQ(v->execute(io_op::read, 1 << 20, 4096, through.data()), 4096);
    v.reset();
    qsd.stop();
    std::ifstream img(qsd.image, std::ios::binary);
    img.seekg(1 << 20);
    img.read(reinterpret_cast<char*>(file.data()), 4096);
    EXPECT_EQ(through, file);
}
