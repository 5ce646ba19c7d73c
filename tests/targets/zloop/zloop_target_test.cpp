// The zloop target through the in-process API: the kernel's zloop layout
// (files and their sizes), zloop's options and refusals, writes at and off
// the write pointer, zone append, reset and finish on the files, restore
// from the files after a restart (open zones come back closed), a torn
// write cut back, files edited behind the daemon's back, configurations
// that do not match the directory, the open limit, and
// discard_write_cache. The cases that do not depend on files run for the
// RAM variant (zloop-ram) too (zloop_variants), which has its own for
// memory. The zone engine's transitions have their own tests
// (tests/core/zone_engine_test.cpp).
#include "test_util.hpp"

#include <cerrno>
#include <cstdlib>
#include <fcntl.h>
#include <fmt/core.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <softblk/device.hpp>

using namespace softblk;
using namespace softblk::test;

namespace {

using zc = zone_condition;

struct aligned_buffer {
    explicit aligned_buffer(size_t n)
        : size(n), data(static_cast<char*>(std::aligned_alloc(4096, n)))
    {
        std::memset(data, 0, n);
    }
    ~aligned_buffer() { std::free(data); }
    size_t size;
    char* data;
};

class zloop_test : public ::testing::Test {
protected:
    void SetUp() override
    {
        char name[] = "/tmp/softblk-zloop-XXXXXX";
        _base = ::mkdtemp(name);
        ::mkdir((_base + "/0").c_str(), 0755);
    }
    void TearDown() override
    {
        const std::string cmd = "rm -rf '" + _base + "'";
        [[maybe_unused]] int rc = std::system(cmd.c_str());
    }

    // 8 zones of 2 MiB (1 MiB capacity), the first two conventional; in
    // _base/0 for the zone files.
    std::vector<std::string> options(std::vector<std::string> more = {}) const
    {
        std::vector<std::string> o{"capacity_mb=16",     "zone_size_mb=2", "conv_zones=2",
                                   "zone_capacity_mb=1", "irqmode=0",      "poll_queues=0"};
        if (on_files()) {
            o.insert(o.begin(), {"base_dir=" + _base, "id=0"});
        }
        o.insert(o.end(), more.begin(), more.end());
        return o;
    }
    std::unique_ptr<device> make(std::vector<std::string> more = {})
    {
        auto d = device::create("zltest", _type, options(std::move(more)));
        EXPECT_TRUE(d.has_value()) << (d ? "" : d.error().message);
        return d ? std::move(*d) : nullptr;
    }
    std::string refused(std::vector<std::string> more, int* code = nullptr) const
    {
        return create_error(options(std::move(more)), code, _type);
    }
    bool on_files() const { return _type == "zloop"; }
    std::string file(const std::string& name) const { return _base + "/0/" + name; }
    // Zone file `name` holds `size` bytes (zloop); the RAM variant makes no
    // file at all.
    void expect_stored(const std::string& name, int64_t size) const
    {
        EXPECT_EQ(file_size(file(name)), on_files() ? size : -1) << name;
    }
    static int64_t file_size(const std::string& p)
    {
        struct stat st {};
        return ::stat(p.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
    }
    static void set_size(const std::string& p, uint64_t size)
    {
        ASSERT_EQ(::truncate(p.c_str(), static_cast<off_t>(size)), 0) << p;
    }

    static int run(device& d, io_op op, uint64_t offset, uint64_t length = 0,
                   void* buffer = nullptr, uint64_t* result_offset = nullptr)
    {
        bio b;
        b.op = op;
        b.offset = offset;
        b.length = length;
        b.buffer = buffer;
        const int rc = d.execute(b);
        if (result_offset != nullptr) {
            *result_offset = b.result_offset;
        }
        return rc;
    }
    static zone_descriptor zone_of(device& d, uint32_t zone)
    {
        auto z = d.report_zones(uint64_t{zone} * 2 * k_mib, 1);
        EXPECT_TRUE(z) << (z ? "" : z.error().message);
        return z && !z->empty() ? (*z)[0] : zone_descriptor{};
    }

    std::string _base;
    // The target type under test: "zloop" (zone files) or "zloop-ram".
    std::string _type = "zloop";
};

// The cases both zloop targets share: the same options, zone model and
// queue logic; only the store differs.
class zloop_variants : public zloop_test, public ::testing::WithParamInterface<const char*> {
protected:
    void SetUp() override
    {
        zloop_test::SetUp();
        _type = GetParam();
    }
};

INSTANTIATE_TEST_SUITE_P(targets, zloop_variants, ::testing::Values("zloop", "zloop-ram"),
                         [](const auto& case_info) {
                             return std::string(case_info.param) == "zloop" ? "files" : "ram";
                         });

TEST_P(zloop_variants, new_device_has_zloops_files_and_geometry)
{
    auto d = make();
    ASSERT_TRUE(d);
    const block_limits& l = d->limits();
    EXPECT_TRUE(l.zoned);
    EXPECT_EQ(l.capacity_bytes, 16 * k_mib);
    EXPECT_EQ(l.zone_size_bytes, 2 * k_mib);
    EXPECT_EQ(l.zone_capacity_bytes, 1 * k_mib);
    EXPECT_EQ(l.conventional_zones, 2u);
    EXPECT_EQ(l.max_zone_append_bytes, 1 * k_mib);
    EXPECT_EQ(l.max_transfer_bytes, 1 * k_mib);
    // FLUSH syncs the zone files; in RAM there is nothing to flush.
    EXPECT_EQ(l.volatile_write_cache, on_files());
    EXPECT_FALSE(l.fua);
    EXPECT_EQ(l.max_discard_bytes, 0u);
    // ext4/tmpfs: the file system's block size (4 KiB), as zloop takes it.
    EXPECT_EQ(l.logical_block_size, 4096u);
    expect_stored("cnv-000000", int64_t(2 * k_mib));
    expect_stored("cnv-000001", int64_t(2 * k_mib));
    for (int i = 2; i < 8; ++i) {
        expect_stored(fmt::format("seq-{:06}", i), 0);
    }
    expect_stored("seq-000008", -1);
    const auto j = describe(*d);
    if (on_files()) {
        EXPECT_EQ(j["target"]["restored"], false);
    }
    EXPECT_EQ(j["submit_queues"], 1);
    // zloop's queue_depth (128) sets the device's.
    EXPECT_EQ(j["queue_depth"], 128);
    const zone_descriptor c = zone_of(*d, 0);
    EXPECT_EQ(c.type, zone_type::conventional);
    EXPECT_EQ(c.write_pointer, UINT64_MAX);
}

TEST_P(zloop_variants, writes_at_the_write_pointer_land_in_the_zone_file)
{
    auto d = make();
    ASSERT_TRUE(d);
    aligned_buffer w(64 << 10);
    std::memset(w.data, 0x5a, w.size);
    const uint64_t z2 = 4 * k_mib;
    EXPECT_EQ(run(*d, io_op::write, z2, w.size, w.data), 0);
    expect_stored("seq-000002", int64_t(w.size));
    zone_descriptor z = zone_of(*d, 2);
    EXPECT_EQ(z.condition, zc::implicit_open);
    EXPECT_EQ(z.write_pointer, z2 + w.size);
    // Off the write pointer: zloop's "unaligned write", -EIO.
    EXPECT_EQ(run(*d, io_op::write, z2, 4096, w.data), -EIO);
    EXPECT_EQ(run(*d, io_op::write, z2 + w.size + 4096, 4096, w.data), -EIO);
    // Zone append returns the sector it wrote.
    uint64_t at = 0;
    EXPECT_EQ(run(*d, io_op::zone_append, z2, 8192, w.data, &at), 0);
    EXPECT_EQ(at, z2 + w.size);
    expect_stored("seq-000002", int64_t(w.size + 8192));
    // Reads: the data, then zeros past the write pointer.
    aligned_buffer r(128 << 10);
    std::memset(r.data, 0xee, r.size);
    EXPECT_EQ(run(*d, io_op::read, z2, r.size, r.data), 0);
    EXPECT_EQ(r.data[0], 0x5a);
    EXPECT_EQ(r.data[w.size + 8191], 0x5a);
    EXPECT_EQ(r.data[w.size + 8192], 0);
    // Conventional zones take writes anywhere.
    EXPECT_EQ(run(*d, io_op::write, 1 * k_mib, 4096, w.data), 0);
    EXPECT_EQ(run(*d, io_op::write, 0, 4096, w.data), 0);
    // Fill zone 3 to its capacity: full, write pointer "none".
    aligned_buffer big(1 * k_mib);
    EXPECT_EQ(run(*d, io_op::write, 6 * k_mib, big.size, big.data), 0);
    z = zone_of(*d, 3);
    EXPECT_EQ(z.condition, zc::full);
    EXPECT_EQ(z.write_pointer, UINT64_MAX);
    EXPECT_EQ(run(*d, io_op::zone_append, 6 * k_mib, 4096, w.data), -EIO);
    EXPECT_EQ(run(*d, io_op::flush, 0), 0);
}

TEST_P(zloop_variants, reset_and_finish_truncate_the_zone_file)
{
    auto d = make();
    ASSERT_TRUE(d);
    aligned_buffer w(16 << 10);
    ASSERT_EQ(run(*d, io_op::write, 4 * k_mib, w.size, w.data), 0);
    EXPECT_EQ(run(*d, io_op::zone_finish, 4 * k_mib), 0);
    expect_stored("seq-000002", int64_t(1 * k_mib));
    EXPECT_EQ(zone_of(*d, 2).condition, zc::full);
    EXPECT_EQ(run(*d, io_op::zone_reset, 4 * k_mib), 0);
    expect_stored("seq-000002", 0);
    EXPECT_EQ(zone_of(*d, 2).condition, zc::empty);
    ASSERT_EQ(run(*d, io_op::write, 6 * k_mib, w.size, w.data), 0);
    ASSERT_EQ(run(*d, io_op::write, 8 * k_mib, w.size, w.data), 0);
    EXPECT_EQ(run(*d, io_op::zone_reset_all, 0), 0);
    expect_stored("seq-000003", 0);
    expect_stored("seq-000004", 0);
    // Conventional zones have no zone operations: -EIO, as zloop.
    EXPECT_EQ(run(*d, io_op::zone_reset, 0), -EIO);
}

TEST_F(zloop_test, restart_restores_every_zone_from_its_file)
{
    aligned_buffer w(64 << 10);
    std::memset(w.data, 0x77, w.size);
    {
        auto d = make();
        ASSERT_TRUE(d);
        ASSERT_EQ(run(*d, io_op::write, 4 * k_mib, w.size, w.data), 0);  // zone 2: open
        ASSERT_EQ(run(*d, io_op::zone_open, 6 * k_mib), 0);              // zone 3: open, empty
        ASSERT_EQ(run(*d, io_op::zone_finish, 8 * k_mib), 0);            // zone 4: full
        ASSERT_EQ(run(*d, io_op::write, 10 * k_mib, w.size, w.data), 0);
        ASSERT_EQ(run(*d, io_op::zone_close, 10 * k_mib), 0);            // zone 5: closed
        ASSERT_EQ(run(*d, io_op::write, 1 * k_mib, w.size, w.data), 0);  // conventional
        ASSERT_EQ(run(*d, io_op::flush, 0), 0);
    }
    auto d = make();
    ASSERT_TRUE(d);
    EXPECT_EQ(describe(*d)["target"]["restored"], true);
    zone_descriptor z = zone_of(*d, 2);
    EXPECT_EQ(z.condition, zc::closed);  // open zones come back closed
    EXPECT_EQ(z.write_pointer, 4 * k_mib + w.size);
    EXPECT_EQ(zone_of(*d, 3).condition, zc::empty);
    EXPECT_EQ(zone_of(*d, 4).condition, zc::full);
    EXPECT_EQ(zone_of(*d, 5).condition, zc::closed);
    EXPECT_EQ(zone_of(*d, 6).condition, zc::empty);
    aligned_buffer r(w.size);
    ASSERT_EQ(run(*d, io_op::read, 4 * k_mib, r.size, r.data), 0);
    EXPECT_EQ(std::memcmp(r.data, w.data, w.size), 0);
    ASSERT_EQ(run(*d, io_op::read, 1 * k_mib, r.size, r.data), 0);
    EXPECT_EQ(std::memcmp(r.data, w.data, w.size), 0);
    // Writing goes on at the restored write pointer.
    EXPECT_EQ(run(*d, io_op::write, 4 * k_mib + w.size, 4096, w.data), 0);
}

TEST_F(zloop_test, files_edited_behind_the_daemons_back_and_torn_writes)
{
    {
        auto d = make();
        ASSERT_TRUE(d);
    }
    set_size(file("seq-000002"), 12288);       // someone wrote 3 blocks
    set_size(file("seq-000003"), 8192 + 100);  // a torn write
    set_size(file("seq-000004"), 1 * k_mib);   // at the capacity: full
    set_size(file("seq-000005"), 2 * k_mib);   // the kernel's finish: the zone size
    auto d = make();
    ASSERT_TRUE(d);
    EXPECT_EQ(zone_of(*d, 2).write_pointer, 4 * k_mib + 12288);
    EXPECT_EQ(zone_of(*d, 2).condition, zc::closed);
    EXPECT_EQ(zone_of(*d, 3).write_pointer, 6 * k_mib + 8192);
    expect_stored("seq-000003", 8192);
    EXPECT_EQ(describe(*d)["target"]["torn_writes_cut"], nlohmann::json::array({3}));
    EXPECT_EQ(zone_of(*d, 4).condition, zc::full);
    EXPECT_EQ(zone_of(*d, 5).condition, zc::full);
    d.reset();

    set_size(file("seq-000006"), 1 * k_mib + 4096);  // beyond the capacity
    const std::string e = refused({});
    EXPECT_NE(e.find("seq-000006"), std::string::npos) << e;
    EXPECT_NE(e.find("capacity"), std::string::npos) << e;
}

TEST_F(zloop_test, a_configuration_that_does_not_match_the_directory_is_refused)
{
    {
        auto d = make();
        ASSERT_TRUE(d);
    }
    int code = 0;
    // Fewer zones than the files.
    std::string e = refused({"capacity_mb=12"}, &code);
    EXPECT_EQ(code, EINVAL);
    EXPECT_NE(e.find("seq-000006"), std::string::npos) << e;
    // Other zone types.
    e = refused({"conv_zones=1"});
    EXPECT_NE(e.find("cnv-000001"), std::string::npos) << e;
    e = refused({"conv_zones=3"});
    EXPECT_NE(e.find("seq-000002"), std::string::npos) << e;
    // Another zone size: the conventional files are not zone-size.
    e = refused({"zone_size_mb=1", "zone_capacity_mb=0", "capacity_mb=8"});
    EXPECT_NE(e.find("cnv-000000"), std::string::npos) << e;
    // More zones than the files: a missing file.
    e = refused({"capacity_mb=32"});
    EXPECT_NE(e.find("seq-000008"), std::string::npos) << e;
    EXPECT_NE(e.find("missing"), std::string::npos) << e;
    // The configuration it was made with still opens.
    EXPECT_TRUE(make());
}

TEST_P(zloop_variants, option_checks_name_the_option)
{
    EXPECT_NE(refused({"zone_size_mb=3"}).find("zone_size_mb=3"), std::string::npos);
    EXPECT_NE(refused({"zone_capacity_mb=4"}).find("zone_capacity_mb=4"), std::string::npos);
    EXPECT_NE(refused({"conv_zones=8"}).find("conv_zones=8"), std::string::npos);
    EXPECT_NE(refused({"capacity_mb=1"}).find("capacity_mb=1"), std::string::npos);
    EXPECT_NE(refused({"max_open_zones=7"}).find("max_open_zones=7"), std::string::npos);
    if (on_files()) {
        EXPECT_NE(refused({"id=5"}).find("mkdir"), std::string::npos);
        EXPECT_NE(refused({"base_dir=relative"}).find("absolute"), std::string::npos);
    } else {
        // The zone files' options are not the RAM variant's.
        for (const char* file_option :
             {"base_dir=/tmp", "id=0", "buffered_io=1", "discard_write_cache=1"}) {
            int code = 0;
            refused({file_option}, &code);
            EXPECT_EQ(code, ENOENT) << file_option;
        }
    }
    EXPECT_NE(refused({"zone_append=0", "ordered_zone_append=1"}).find("zone_append"),
              std::string::npos);
    // Nothing was created by a refusal.
    expect_stored("seq-000002", -1);
}

TEST_F(zloop_test, id_minus_one_picks_a_free_directory_and_two_devices_do_not_share_one)
{
    ::mkdir((_base + "/1").c_str(), 0755);
    auto a = device::create("zl-a", "zloop", options({"id=-1"}));
    ASSERT_TRUE(a) << a.error().message;
    auto b = device::create("zl-b", "zloop", options({"id=-1"}));
    ASSERT_TRUE(b) << b.error().message;
    EXPECT_EQ(describe(**a)["target"]["id"], 0);
    EXPECT_EQ(describe(**b)["target"]["id"], 1);
    EXPECT_EQ(file_size(_base + "/1/seq-000002"), 0);
    int code = 0;
    create_error(options({"id=1"}), &code, "zloop");
    EXPECT_EQ(code, EEXIST);
}

TEST_P(zloop_variants, open_limit_closes_the_least_recently_used_implicitly_open_zone_only)
{
    auto d = make({"max_open_zones=2"});
    ASSERT_TRUE(d);
    EXPECT_EQ(d->limits().max_open_zones, 2u);
    aligned_buffer w(4096);
    ASSERT_EQ(run(*d, io_op::write, 4 * k_mib, 4096, w.data), 0);         // zone 2
    ASSERT_EQ(run(*d, io_op::write, 6 * k_mib, 4096, w.data), 0);         // zone 3
    ASSERT_EQ(run(*d, io_op::write, 4 * k_mib + 4096, 4096, w.data), 0);  // zone 2 used again
    ASSERT_EQ(run(*d, io_op::write, 8 * k_mib, 4096, w.data), 0);         // zone 4: closes zone 3
    EXPECT_EQ(zone_of(*d, 2).condition, zc::implicit_open);
    EXPECT_EQ(zone_of(*d, 3).condition, zc::closed);
    EXPECT_EQ(zone_of(*d, 4).condition, zc::implicit_open);
    // An explicit open does not close an implicitly open zone: -EIO.
    EXPECT_EQ(run(*d, io_op::zone_open, 10 * k_mib), -EIO);
    ASSERT_EQ(run(*d, io_op::zone_close, 4 * k_mib), 0);
    ASSERT_EQ(run(*d, io_op::zone_close, 8 * k_mib), 0);
    ASSERT_EQ(run(*d, io_op::zone_open, 10 * k_mib), 0);
    ASSERT_EQ(run(*d, io_op::zone_open, 12 * k_mib), 0);
    // Two explicitly open zones: a write elsewhere has nothing to close.
    EXPECT_EQ(run(*d, io_op::write, 14 * k_mib, 4096, w.data), -EIO);
    EXPECT_EQ(zone_of(*d, 7).condition, zc::empty);
}

TEST_F(zloop_test, discard_write_cache_cuts_zones_back_to_the_last_flush)
{
    aligned_buffer w(16 << 10);
    {
        auto d = make({"discard_write_cache=1"});
        ASSERT_TRUE(d);
        ASSERT_EQ(run(*d, io_op::write, 4 * k_mib, w.size, w.data), 0);
        ASSERT_EQ(run(*d, io_op::flush, 0), 0);
        ASSERT_EQ(run(*d, io_op::write, 4 * k_mib + w.size, w.size, w.data), 0);
        ASSERT_EQ(run(*d, io_op::write, 6 * k_mib, w.size, w.data), 0);
        expect_stored("seq-000002", int64_t(2 * w.size));
    }
    expect_stored("seq-000002", int64_t(w.size));
    expect_stored("seq-000003", 0);
    // Without the option, nothing is cut.
    {
        auto d = make();
        ASSERT_TRUE(d);
        ASSERT_EQ(run(*d, io_op::write, 4 * k_mib + w.size, w.size, w.data), 0);
    }
    expect_stored("seq-000002", int64_t(2 * w.size));
}

// Bytes the file system holds for zone file `name` (st_blocks).
int64_t allocated(const std::string& path)
{
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_blocks) * 512 : -1;
}

TEST_F(zloop_test, prealloc_allocates_a_zones_rest_and_leaves_its_write_pointer)
{
    aligned_buffer w(16 << 10);
    std::memset(w.data, 0x5a, w.size);
    {
        auto d = make({"prealloc=1"});
        ASSERT_TRUE(d);
        EXPECT_EQ(describe(*d)["target"]["prealloc"], true);
        ASSERT_EQ(run(*d, io_op::write, 4 * k_mib, w.size, w.data), 0);
        if (describe(*d)["target"]["prealloc_failures"] != 0) {
            GTEST_SKIP() << "/tmp's file system refuses fallocate";
        }
        ASSERT_EQ(run(*d, io_op::write, 4 * k_mib + w.size, w.size, w.data), 0);
        // The zone's rest (to its 1 MiB capacity) is allocated, once; the
        // file's size is still the write pointer; other zones have nothing.
        expect_stored("seq-000002", int64_t(2 * w.size));
        EXPECT_GE(allocated(file("seq-000002")), int64_t(k_mib));
        EXPECT_EQ(allocated(file("seq-000003")), 0);
        EXPECT_EQ(describe(*d)["target"]["preallocated_zones"], 1);
        EXPECT_EQ(zone_of(*d, 2).write_pointer, 4 * k_mib + 2 * w.size);
        // A read past the write pointer still sees zeros.
        aligned_buffer r(w.size);
        std::memset(r.data, 0xff, r.size);
        ASSERT_EQ(run(*d, io_op::read, 4 * k_mib + 2 * w.size, r.size, r.data), 0);
        EXPECT_EQ(r.data[0], 0);
        EXPECT_EQ(r.data[r.size - 1], 0);
        // A reset frees the blocks; the zone's next first write takes them
        // again.
        ASSERT_EQ(run(*d, io_op::zone_reset, 4 * k_mib), 0);
        expect_stored("seq-000002", 0);
        EXPECT_EQ(allocated(file("seq-000002")), 0);
        ASSERT_EQ(run(*d, io_op::write, 4 * k_mib, w.size, w.data), 0);
        EXPECT_EQ(describe(*d)["target"]["preallocated_zones"], 2);
        // Finish: the capacity, zeros after the data.
        ASSERT_EQ(run(*d, io_op::zone_finish, 4 * k_mib), 0);
        expect_stored("seq-000002", int64_t(k_mib));
        ASSERT_EQ(run(*d, io_op::read, 5 * k_mib - r.size, r.size, r.data), 0);
        EXPECT_EQ(r.data[0], 0);
        ASSERT_EQ(run(*d, io_op::write, 6 * k_mib, w.size, w.data), 0);
    }
    // Restored: zone 3 (closed at 16 KiB) gets its rest before its next
    // write, from the write pointer on.
    auto d = make({"prealloc=1"});
    ASSERT_TRUE(d);
    EXPECT_EQ(zone_of(*d, 3).condition, zc::closed);
    ASSERT_EQ(run(*d, io_op::write, 6 * k_mib + w.size, w.size, w.data), 0);
    expect_stored("seq-000003", int64_t(2 * w.size));
    EXPECT_GE(allocated(file("seq-000003")), int64_t(k_mib));
    aligned_buffer r(2 * w.size);
    ASSERT_EQ(run(*d, io_op::read, 6 * k_mib, r.size, r.data), 0);
    EXPECT_EQ(std::memcmp(r.data, w.data, w.size), 0);
    EXPECT_EQ(std::memcmp(r.data + w.size, w.data, w.size), 0);
    // Without the option nothing is allocated ahead.
    d.reset();
    d = make({"prealloc=0"});
    ASSERT_TRUE(d);
    ASSERT_EQ(run(*d, io_op::write, 8 * k_mib, w.size, w.data), 0);
    EXPECT_LT(allocated(file("seq-000004")), int64_t(k_mib));
    EXPECT_EQ(describe(*d)["target"]["preallocated_zones"], 0);
    d.reset();
    const std::string msg = refused({"prealloc=yes"});
    EXPECT_NE(msg.find("prealloc=yes: auto, 0 or 1"), std::string::npos) << msg;
}

// prealloc=auto asks the file system: on XFS a preallocated append goes
// without blocking, so it is on; ext4 blocks on every extending direct
// write, so it is off. Each on a small image mounted over a loop device.
TEST_F(zloop_test, prealloc_auto_is_on_where_the_file_system_then_takes_appends_without_blocking)
{
    if (::geteuid() != 0 || ::access("/dev/loop-control", F_OK) != 0) {
        GTEST_SKIP() << "mounting file system images needs root and /dev/loop-control";
    }
    for (const auto& [fs, want] : {std::pair{"xfs", true}, std::pair{"ext4", false}}) {
        SCOPED_TRACE(fs);
        const std::string image = _base + "/" + fs + ".img";
        const std::string mnt = _base + "/" + fs;
        ::mkdir(mnt.c_str(), 0755);
        const std::string mkfs = fmt::format(
            "truncate -s 320M '{0}' && mkfs.{1} -q {2} '{0}' >/dev/null 2>&1 && "
            "mount -o loop '{0}' '{3}' && mkdir '{3}/0'",
            image, fs, std::string(fs) == "xfs" ? "-f" : "-F", mnt);
        if (std::system(mkfs.c_str()) != 0) {
            GTEST_SKIP() << "cannot make and mount a " << fs << " image (mkfs." << fs
                         << ", mount -o loop)";
        }
        struct unmount {
            std::string dir;
            ~unmount() { ::umount2(dir.c_str(), MNT_DETACH); }
        } unmount_after{mnt};
        const std::vector<std::string> o{"base_dir=" + mnt, "id=0", "capacity_mb=16",
                                         "zone_size_mb=2", "conv_zones=0"};
        auto d = device::create("zltest", "zloop", o);
        ASSERT_TRUE(d) << d.error().message;
        EXPECT_EQ(describe(**d)["target"]["prealloc"], want);
    }
}

TEST_P(zloop_variants, two_queues_write_different_zones)
{
    auto d = make({"nr_queues=2"});
    ASSERT_TRUE(d);
    EXPECT_EQ(describe(*d)["submit_queues"], 2);
    aligned_buffer w(4096);
    std::memset(w.data, 0x31, w.size);
    for (unsigned q = 0; q < 2; ++q) {
        for (int i = 0; i < 16; ++i) {
            const uint64_t off = (4 + 2 * q) * k_mib + uint64_t(i) * 4096;
            completion c = run_one(d->queue(q), io_op::write, off, 4096, w.data);
            ASSERT_TRUE(c.done);
            EXPECT_EQ(c.result, 4096) << q << " " << i;
        }
    }
    expect_stored("seq-000002", 16 * 4096);
    expect_stored("seq-000003", 16 * 4096);
}

TEST_F(zloop_test, ram_variant_copies_through_a_data_window)
{
    _type = "zloop-ram";
    auto d = make();
    ASSERT_TRUE(d);
    EXPECT_TRUE(d->takes_external_data().data_windows);
    const auto data = pattern(72 << 10, 3);
    window_file file(data, 4096);
    io_queue& q = d->queue(0);
    const data_window first{.fd = file.fd, .offset = 4096};
    EXPECT_EQ(run_one_windowed(q, io_op::write, 4 * k_mib, 64 << 10, first).result, 64 << 10);
    const data_window rest{.fd = file.fd, .offset = 4096 + (64 << 10)};
    const completion appended = run_one_windowed(q, io_op::zone_append, 4 * k_mib, 8 << 10, rest);
    EXPECT_EQ(appended.result, 8 << 10);
    EXPECT_EQ(appended.result_offset, 4 * k_mib + (64 << 10));
    EXPECT_EQ(read_back(*d, 4 * k_mib, 72 << 10), data);
    // Read through a window: the data, then zeros past the write pointer
    // (as past the end of a zone file).
    window_file out(std::vector<char>(80 << 10, 'r'));
    const data_window into{.fd = out.fd, .offset = 0};
    EXPECT_EQ(run_one_windowed(q, io_op::read, 4 * k_mib, 80 << 10, into).result, 80 << 10);
    EXPECT_EQ(out.bytes(0, 72 << 10), data);
    EXPECT_TRUE(all_zero(out.bytes(72 << 10, 8 << 10)));
    // A window that ends early fails the write; the write pointer comes
    // back to what the store holds.
    const data_window beyond{.fd = file.fd, .offset = 4096 + (68 << 10)};
    EXPECT_EQ(run_one_windowed(q, io_op::write, 4 * k_mib + (72 << 10), 8 << 10, beyond).result,
              -EIO);
    EXPECT_EQ(zone_of(*d, 2).write_pointer, 4 * k_mib + (72 << 10));
}

TEST_F(zloop_test, ram_variant_keeps_the_zones_in_a_memory_store_with_its_limit)
{
    _type = "zloop-ram";
    auto d = make({"memory_limit=2"});
    ASSERT_TRUE(d);
    EXPECT_EQ(describe(*d)["target"]["memory_limit_bytes"], 2 * k_mib);
    aligned_buffer w(1 * k_mib);
    std::memset(w.data, 0x77, w.size);
    const uint64_t before = d->memory_bytes();
    ASSERT_EQ(run(*d, io_op::write, 4 * k_mib, 4096, w.data), 0);
    EXPECT_GE(d->memory_bytes(), before + 4096);
    // The store takes memory in chunks, 1 MiB this close to its limit: a
    // second one is past the limit, and the write fails with ENOSPC; its
    // write pointer had moved (zloop_rw), and comes back to what the store
    // holds.
    EXPECT_EQ(run(*d, io_op::write, 6 * k_mib, w.size, w.data), -ENOSPC);
    zone_descriptor z = zone_of(*d, 3);
    EXPECT_EQ(z.write_pointer, 6 * k_mib);
    EXPECT_EQ(z.condition, zc::empty);
    EXPECT_EQ(describe(*d)["target"]["zones"]["refreshed"], 1);
    // memory_limit is live: raised, the same write lands.
    ASSERT_TRUE(d->set_option("memory_limit", "8"));
    EXPECT_EQ(run(*d, io_op::write, 6 * k_mib, w.size, w.data), 0);
    EXPECT_EQ(zone_of(*d, 3).condition, zc::full);
    // A reset frees the zone's pages: the store keeps them for the zone's
    // rewrite, within its bound (1/8 of memory_limit: 1 MiB here), so the
    // memory stays; a lower memory_limit gives what is past the new bound
    // back.
    const uint64_t full = d->memory_bytes();
    const uint64_t data = describe(*d)["target"]["data_page_bytes"];
    EXPECT_EQ(run(*d, io_op::zone_reset, 6 * k_mib), 0);
    nlohmann::json t = describe(*d)["target"];
    EXPECT_EQ(t["store_free_page_limit_bytes"], k_mib);
    EXPECT_EQ(t["store_free_page_bytes"], data - t["data_page_bytes"].get<uint64_t>());
    EXPECT_EQ(t["store_free_page_bytes"], k_mib);
    EXPECT_EQ(d->memory_bytes(), full);
    ASSERT_TRUE(d->set_option("memory_limit", "4"));
    EXPECT_EQ(describe(*d)["target"]["store_free_page_bytes"], k_mib / 2);
    EXPECT_EQ(d->memory_bytes(), full - k_mib / 2);
    aligned_buffer r(4096);
    EXPECT_EQ(run(*d, io_op::read, 4 * k_mib, r.size, r.data), 0);
    EXPECT_EQ(r.data[0], 0x77);
    // The data goes with the device: a new one starts empty.
    d.reset();
    d = make();
    ASSERT_TRUE(d);
    EXPECT_EQ(zone_of(*d, 2).condition, zc::empty);
}

TEST_F(zloop_test, ram_variant_takes_huge_pages_and_shows_its_chunks)
{
    // huge_pages as the null target's: at creation and live, "chunks" in
    // describe says what the store took; anything but auto, 0 or 1 is
    // refused.
    _type = "zloop-ram";
    auto d = make({"huge_pages=0"});
    ASSERT_TRUE(d);
    aligned_buffer w(4096);
    std::memset(w.data, 0x55, w.size);
    ASSERT_EQ(run(*d, io_op::write, 4 * k_mib, w.size, w.data), 0);
    nlohmann::json chunks = describe(*d)["target"]["chunks"];
    EXPECT_EQ(chunks["huge_pages"], "0") << chunks;
    EXPECT_EQ(chunks["kind"], "small") << chunks;
    EXPECT_EQ(chunks["small_chunks"], 1u) << chunks;
    ASSERT_TRUE(d->set_option("huge_pages", "auto"));
    EXPECT_EQ(describe(*d)["target"]["chunks"]["huge_pages"], "auto");
    EXPECT_FALSE(d->set_option("huge_pages", "yes"));
    EXPECT_NE(refused({"huge_pages=2"}).find("auto"), std::string::npos);
}

}  // namespace
