// `softblk zone` on a zoned device while it is exported: the daemon serves
// a null zoned=1 device over vhost-user-blk, and this process reaches the
// export with softblk's own virtio-blk driver (target type "virtio"), as a
// guest would. The zone commands go through the export's queue thread
// (io_queue::post), in order with the driver's I/O: the state they set is
// what a report through the export shows, a reset zone has lost its data
// (reads past the write pointer give null_blk's 0xff) and takes writes at
// its reset write pointer only, and errors and limits are the zone
// engine's (null_blk's), shared with the driver's zones.
#include "daemon_fixture.hpp"

#include <softblk/device.hpp>

#include <atomic>

using namespace softblk;
using namespace softblk::test;

namespace {

constexpr uint64_t k_sector = 512;
constexpr uint64_t k_zone_sectors = 16384;  // 8 MiB
constexpr uint64_t k_zone_bytes = k_zone_sectors * k_sector;

class zone_export_test : public daemon_test {
protected:
    // Adds a null zoned=1 device (8 zones of 8 MiB, the first
    // conventional, at most 2 open) exported over vhost-user-blk and
    // connects the driver to it; skips when the export is not built.
    void SetUp() override
    {
        daemon_test::SetUp();
        json features = softblk_json({"features"});
        bool vhost = false;
        for (const json& e : features.value("exports", json::array())) {
            vhost = vhost || e.value("name", "") == "vhost-user-blk";
        }
        if (!vhost) {
            GTEST_SKIP() << "the vhost-user-blk export is not built";
        }
        run_result add = softblk({"add", "null", "zoned=1", "size=64", "zone_size=8",
                                  "zone_nr_conv=1", "zone_max_open=2", "memory_backed=1", "--name",
                                  "z", "--export", "vhost-user-blk"});
        ASSERT_EQ(add.status, 0) << add.err;
        std::string socket;
        for (const json& d : list()) {
            if (d.value("name", "") == "z") {
                socket = d["export"].value("socket", "");
            }
        }
        ASSERT_FALSE(socket.empty()) << "the export names no socket: " << list().dump();
        // Before a driver is there no thread drives the queues: the
        // daemon runs the request itself.
        EXPECT_EQ(cond(1), 1) << "zone 1 of a new device is not empty";
        std::vector<std::string> options{"path=" + socket};
        auto dev = device::create("client", "virtio", options);
        ASSERT_TRUE(dev) << dev.error().message;
        _client = std::move(*dev);
        ASSERT_TRUE(_client->limits().zoned) << "the export carries no zones";
    }

    void TearDown() override
    {
        _client.reset();  // the driver lets go before the daemon stops
        daemon_test::TearDown();
    }

    // Zone `zone` as `softblk zone report --json` gives it.
    json daemon_zone(uint64_t zone)
    {
        json r = softblk_json({"zone", "report", "z", "--offset",
                               std::to_string(zone * k_zone_sectors), "--count", "1"});
        EXPECT_EQ(r["zones"].size(), 1u) << r.dump();
        return r["zones"].empty() ? json::object() : r["zones"][0];
    }
    int cond(uint64_t zone) { return daemon_zone(zone).value("cond", -1); }

    // Zone `zone` as a report through the export gives it.
    zone_descriptor client_zone(uint64_t zone)
    {
        auto z = _client->report_zones(zone * k_zone_bytes, 1);
        EXPECT_TRUE(z && z->size() == 1) << (z ? "no zone" : z.error().message);
        return z && !z->empty() ? z->front() : zone_descriptor{};
    }

    // `softblk zone ACTION z SECTOR`: its exit status and stderr.
    run_result zone(const char* action, uint64_t sector)
    {
        return softblk({"zone", action, "z", std::to_string(sector)});
    }

    int write(uint64_t offset, std::vector<char>& data)
    {
        return _client->execute(io_op::write, offset, static_cast<uint32_t>(data.size()),
                                data.data());
    }

    std::unique_ptr<device> _client;
};

TEST_F(zone_export_test, zone_commands_act_on_the_exported_device)
{
    if (!_client) {
        return;  // skipped or failed in SetUp
    }
    const uint64_t zone1 = k_zone_bytes;
    std::vector<char> data(64 << 10, 0x6b);
    ASSERT_EQ(write(zone1, data), static_cast<int>(data.size()));

    // The driver's write is seen by the daemon's report (implicitly open,
    // write pointer 128 sectors in).
    json z1 = daemon_zone(1);
    EXPECT_EQ(z1.value("cond", -1), 2) << z1.dump();
    EXPECT_EQ(z1.value("wptr", uint64_t{0}), k_zone_sectors + 128) << z1.dump();

    // finish: full, through the export too.
    run_result r = zone("finish", k_zone_sectors);
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(cond(1), 14);
    EXPECT_EQ(client_zone(1).condition, zone_condition::full);
    EXPECT_LT(write(zone1 + 2 * data.size(), data), 0) << "a full zone took a write";

    // reset: empty, the write pointer at the start, the data gone: a read
    // past the write pointer gives null_blk's 0xff, not what was written.
    r = zone("reset", k_zone_sectors);
    ASSERT_EQ(r.status, 0) << r.err;
    const zone_descriptor reset = client_zone(1);
    EXPECT_EQ(reset.condition, zone_condition::empty);
    EXPECT_EQ(reset.write_pointer, zone1);
    std::vector<char> back(data.size(), 1);
    auto read_back = [&] {
        return _client->execute(io_op::read, zone1, static_cast<uint32_t>(back.size()),
                                back.data());
    };
    ASSERT_EQ(read_back(), static_cast<int>(back.size()));
    EXPECT_EQ(back, std::vector<char>(back.size(), '\xff')) << "a reset zone kept its data";
    // Writes go at the reset write pointer, and nowhere else.
    std::vector<char> fresh(4096, 0x2c);
    EXPECT_LT(write(zone1 + 4096, fresh), 0) << "a write past the write pointer succeeded";
    EXPECT_EQ(write(zone1, fresh), 4096);
    EXPECT_EQ(client_zone(1).write_pointer, zone1 + 4096);
    ASSERT_EQ(read_back(), static_cast<int>(back.size()));
    EXPECT_EQ(std::vector<char>(back.begin(), back.begin() + 4096), fresh);
    EXPECT_EQ(std::vector<char>(back.begin() + 4096, back.end()),
              std::vector<char>(back.size() - 4096, '\xff'));

    // open: explicitly open, as the driver's report shows; close empties
    // an open zone that holds nothing (null_blk).
    r = zone("open", 2 * k_zone_sectors);
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(client_zone(2).condition, zone_condition::explicit_open);
    EXPECT_EQ(cond(2), 3);
    r = zone("close", 2 * k_zone_sectors);
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(client_zone(2).condition, zone_condition::empty);

    // reset --all: every sequential zone empty again.
    r = softblk({"zone", "reset", "z", "--all"});
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(client_zone(1).condition, zone_condition::empty);
    EXPECT_EQ(client_zone(1).write_pointer, zone1);
}

TEST_F(zone_export_test, errors_are_the_zone_engines)
{
    if (!_client) {
        return;
    }
    // Beyond the device, and not at a zone start: refused before the core.
    run_result r = zone("reset", 8 * k_zone_sectors);
    EXPECT_NE(r.status, 0);
    EXPECT_NE(r.err.find("beyond the device's end"), std::string::npos) << r.err;
    r = zone("open", k_zone_sectors + 8);
    EXPECT_NE(r.status, 0);
    EXPECT_NE(r.err.find("is not the start of a zone"), std::string::npos) << r.err;
    // A conventional zone takes no zone management (null_blk: EIO).
    r = zone("reset", 0);
    EXPECT_NE(r.status, 0);
    EXPECT_NE(r.err.find("conventional zones take no zone management"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("EIO"), std::string::npos) << r.err;
    // The open-zone limit counts the driver's open zones too: zone 1
    // opened through the export, zone 2 by the daemon, a third explicit
    // open is refused with null_blk's ETOOMANYREFS. (An implicitly open
    // zone would have been closed to make room, as null_blk does.)
    ASSERT_EQ(_client->execute(io_op::zone_open, k_zone_bytes, 0, nullptr), 0);
    r = zone("open", 2 * k_zone_sectors);
    ASSERT_EQ(r.status, 0) << r.err;
    r = zone("open", 3 * k_zone_sectors);
    EXPECT_NE(r.status, 0);
    EXPECT_NE(r.err.find("ETOOMANYREFS"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("max_open_zones=2"), std::string::npos) << r.err;
    EXPECT_EQ(client_zone(3).condition, zone_condition::empty);
    // The daemon's close frees room for the driver's open.
    r = zone("close", 2 * k_zone_sectors);
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(_client->execute(io_op::zone_open, 3 * k_zone_bytes, 0, nullptr), 0);
}

// Zone commands while the driver keeps writes in flight on the same queue:
// each command waits its turn behind the driver's bios and none is lost.
TEST_F(zone_export_test, commands_interleave_with_io_in_flight)
{
    if (!_client) {
        return;
    }
    std::atomic<bool> stop{false};
    std::atomic<unsigned> bad{0};
    std::atomic<unsigned> writes{0};
    // Zone 4, 4 KiB at a time at its write pointer up to 1 MiB in; the
    // daemon resets it meanwhile, after which a write at the old write
    // pointer fails and one at the zone's start succeeds.
    std::thread writer([&] {
        std::vector<char> data(4096, 0x11);
        const uint64_t start = 4 * k_zone_bytes;
        const uint64_t limit = start + (1 << 20);
        uint64_t at = start;
        while (!stop) {
            if (at < limit && write(at, data) == 4096) {
                at += 4096;
                ++writes;
                continue;
            }
            if (write(start, data) == 4096) {
                at = start + 4096;
                ++writes;
            } else if (at < limit) {
                ++bad;  // neither at the write pointer nor after a reset
            } else {
                std::this_thread::sleep_for(std::chrono::milliseconds(1));
            }
        }
    });
    for (unsigned i = 0; i < 6; ++i) {
        run_result r = zone("reset", 4 * k_zone_sectors);
        EXPECT_EQ(r.status, 0) << r.err;
        json z = daemon_zone(4);
        EXPECT_GE(z.value("wptr", uint64_t{0}), 4 * k_zone_sectors) << z.dump();
    }
    stop = true;
    writer.join();
    EXPECT_EQ(bad, 0u);
    EXPECT_GT(writes, 0u);
}

}  // namespace
