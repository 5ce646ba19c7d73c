// The null target's attributes through the in-process API: geometry,
// memory backing, discard, power, index, NUMA options, completion modes and
// option errors. (The decorators' attributes: decorators_test.cpp.)
#include "test_util.hpp"

#include "core/chunk_policy.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <filesystem>
#include <set>
#include <thread>

using namespace softblk;
using namespace softblk::test;

namespace {

TEST(null_target, defaults_are_null_blks)
{
    auto d = make_null({});
    ASSERT_TRUE(d);
    const block_limits& l = d->limits();
    EXPECT_EQ(l.capacity_bytes, 256000ull << 20);  // gb=250
    EXPECT_EQ(l.logical_block_size, 512u);
    EXPECT_EQ(l.physical_block_size, 512u);
    EXPECT_EQ(l.max_transfer_bytes, 255u * 512);  // BLK_SAFE_MAX_SECTORS
    EXPECT_EQ(l.max_discard_bytes, 0u);
    EXPECT_EQ(l.max_write_zeroes_bytes, 0u);
    EXPECT_FALSE(l.rotational);
    EXPECT_FALSE(l.volatile_write_cache);
    EXPECT_FALSE(l.fua);
    EXPECT_EQ(l.virt_boundary_bytes, 0u);
    EXPECT_EQ(d->info().queues.queue_depth, 64u);
    EXPECT_EQ(d->info().queues.submit_queues, 1u);
    EXPECT_EQ(d->info().queues.poll_queues, 1u);
    EXPECT_EQ(d->info().queues.completion_nsec, 10'000u);
    EXPECT_EQ(d->info().queues.mode, completion_mode::deferred);
    EXPECT_EQ(d->memory_bytes(), 0u);
}

TEST(null_target, size_is_in_mib)
{
    auto d = make_null({"size=3"});
    ASSERT_TRUE(d);
    EXPECT_EQ(d->limits().capacity_bytes, 3ull << 20);
    char buf[512];
    EXPECT_EQ(d->execute(io_op::read, (3ull << 20) - 512, 512, buf), 512);
    EXPECT_EQ(d->execute(io_op::read, 3ull << 20, 512, buf), -EIO);  // beyond the end
}

TEST(null_target, gb_is_the_module_parameter_in_gib)
{
    auto d = make_null({"gb=2"});
    ASSERT_TRUE(d);
    EXPECT_EQ(d->limits().capacity_bytes, 2ull << 30);
    EXPECT_EQ(d->get_option("size").value(), "2048\n");  // written back, as null_alloc_dev
    // size (the configfs attribute) wins over the module's gb.
    auto both = make_null({"gb=2", "size=100"});
    ASSERT_TRUE(both);
    EXPECT_EQ(both->limits().capacity_bytes, 100ull << 20);
}

TEST(null_target, size_zero_makes_an_empty_disk)
{
    // null_blk accepts size=0 and makes a disk of no sectors.
    auto d = make_null({"size=0", "memory_backed=1"});
    ASSERT_TRUE(d);
    EXPECT_EQ(d->limits().capacity_bytes, 0u);
    char buf[512];
    EXPECT_EQ(d->execute(io_op::read, 0, 512, buf), -EIO);
    const std::string e = create_error({"size=17592186044416"});
    EXPECT_NE(e.find("size=17592186044416"), std::string::npos) << e;
    EXPECT_NE(e.find("MiB"), std::string::npos) << e;
}

TEST(null_target, blocksize_and_its_alias_bs)
{
    for (const char* opt : {"blocksize=4096", "bs=4096"}) {
        auto d = make_null({opt, "size=1"});
        ASSERT_TRUE(d);
        EXPECT_EQ(d->limits().logical_block_size, 4096u);
        EXPECT_EQ(d->limits().physical_block_size, 4096u);
        char buf[4096];
        EXPECT_EQ(d->execute(io_op::read, 512, 512, buf), -EINVAL);  // not block aligned
        EXPECT_EQ(d->execute(io_op::read, 4096, 4096, buf), 4096);
    }
    for (const char* opt : {"blocksize=1024", "bs=2048"}) {
        auto d = make_null({opt});
        ASSERT_TRUE(d);
    }
}

TEST(null_target, blocks_up_to_64_kib_keep_their_data)
{
    // Linux 6.15 accepts logical blocks up to 64 KiB (BLK_MAX_BLOCK_SIZE).
    for (const char* opt : {"bs=8192", "bs=65536"}) {
        auto d = make_null({opt, "size=4", "memory_backed=1"});
        ASSERT_TRUE(d) << opt;
        const uint32_t bs = d->limits().logical_block_size;
        EXPECT_GE(d->limits().max_transfer_bytes, bs);
        auto data = pattern(2 * bs, 9);
        ASSERT_EQ(d->execute(io_op::write, bs, 2 * bs, data.data()), static_cast<int>(2 * bs));
        std::vector<char> back(2 * bs);
        ASSERT_EQ(d->execute(io_op::read, bs, 2 * bs, back.data()), static_cast<int>(2 * bs));
        EXPECT_EQ(back, data);
        EXPECT_EQ(d->execute(io_op::read, 4096, 4096, back.data()), -EINVAL);
    }
}

TEST(null_target, blocksize_errors_name_the_attribute_and_range)
{
    std::string e = create_error({"bs=1000"});
    EXPECT_NE(e.find("blocksize=1000"), std::string::npos) << e;
    EXPECT_NE(e.find("power of two"), std::string::npos) << e;
    e = create_error({"blocksize=131072"});
    EXPECT_NE(e.find("blocksize"), std::string::npos) << e;
    EXPECT_NE(e.find("512 to 65536"), std::string::npos) << e;
    e = create_error({"blocksize=256"});
    EXPECT_NE(e.find("512 to 65536"), std::string::npos) << e;
}

TEST(null_target, max_sectors_limits_requests)
{
    auto d = make_null({"max_sectors=16", "size=1"});
    ASSERT_TRUE(d);
    EXPECT_EQ(d->limits().max_transfer_bytes, 8192u);
    std::vector<char> buf(16384);
    // The queue refuses what is larger; execute() splits it.
    completion c = run_one(d->queue(0), io_op::read, 0, 16384, buf.data());
    EXPECT_EQ(c.result, -EINVAL);
    EXPECT_EQ(d->execute(io_op::read, 0, 16384, buf.data()), 16384);
}

TEST(null_target, max_sectors_default_and_rounding_to_blocks)
{
    auto d = make_null({"bs=4096"});
    ASSERT_TRUE(d);
    EXPECT_EQ(d->limits().max_transfer_bytes, 248u * 512);  // 255 rounded down to 8-sector blocks
    auto e = make_null({"bs=4096", "max_sectors=20"});
    ASSERT_TRUE(e);
    EXPECT_EQ(e->limits().max_transfer_bytes, 16u * 512);
}

TEST(null_target, max_sectors_below_a_page_is_refused)
{
    const std::string e = create_error({"max_sectors=4"});
    EXPECT_NE(e.find("max_sectors=4"), std::string::npos) << e;
    EXPECT_NE(e.find("at least 8"), std::string::npos) << e;
    // Beyond what a request can carry: accepted (an unsigned int, as in
    // null_blk), requests stop at 4 GiB.
    auto big = make_null({"max_sectors=4294967295", "size=1"});
    ASSERT_TRUE(big);
    EXPECT_EQ(big->limits().max_transfer_bytes, (UINT32_MAX / 512) * 512);
    int code = 0;
    (void)create_error({"max_sectors=4294967296"}, &code);
    EXPECT_EQ(code, ERANGE);
}

TEST(null_target, without_memory_data_is_not_kept_and_buffers_untouched)
{
    auto d = make_null({"size=1"});
    ASSERT_TRUE(d);
    std::vector<char> w(4096, 'w');
    EXPECT_EQ(d->execute(io_op::write, 0, 4096, w.data()), 4096);
    std::vector<char> r(4096, 'r');
    EXPECT_EQ(d->execute(io_op::read, 0, 4096, r.data()), 4096);
    EXPECT_TRUE(std::all_of(r.begin(), r.end(), [](char c) { return c == 'r'; }));
    EXPECT_EQ(d->memory_bytes(), 0u);
    EXPECT_EQ(d->execute(io_op::flush, 0, 0, nullptr), 0);
}

TEST(null_target, memory_backed_keeps_data_and_unwritten_blocks_read_zero)
{
    auto d = make_null({"size=4", "memory_backed=1"});
    ASSERT_TRUE(d);
    auto data = pattern(3 * 4096 + 1024, 1);
    EXPECT_EQ(d->execute(io_op::write, 512, static_cast<uint32_t>(data.size()), data.data()),
              static_cast<int>(data.size()));
    std::vector<char> back(data.size());
    EXPECT_EQ(d->execute(io_op::read, 512, static_cast<uint32_t>(back.size()), back.data()),
              static_cast<int>(back.size()));
    EXPECT_EQ(back, data);
    // Sector 0 of the same page was never written: zeros.
    std::vector<char> z(512, 'x');
    EXPECT_EQ(d->execute(io_op::read, 0, 512, z.data()), 512);
    EXPECT_TRUE(std::all_of(z.begin(), z.end(), [](char c) { return c == 0; }));
    // Far away: zeros too.
    std::vector<char> far(8192, 'x');
    EXPECT_EQ(d->execute(io_op::read, 2 << 20, 8192, far.data()), 8192);
    EXPECT_TRUE(std::all_of(far.begin(), far.end(), [](char c) { return c == 0; }));
}

TEST(null_target, a_data_window_goes_straight_to_and_from_the_store_unless_a_cache_is_in_front)
{
    auto d = make_null({"size=4", "memory_backed=1", "bs=512", "irqmode=0"});
    ASSERT_TRUE(d);
    EXPECT_TRUE(d->takes_external_data().data_windows);
    const auto data = pattern(3 * 4096 + 1024, 2);
    window_file file(data, 512);
    const data_window src{.fd = file.fd, .offset = 512};
    EXPECT_EQ(
        run_one_windowed(d->queue(0), io_op::write, 1536, static_cast<uint32_t>(data.size()), src)
            .result,
        static_cast<int>(data.size()));
    EXPECT_EQ(read_back(*d, 1536, static_cast<uint32_t>(data.size())), data);
    // Read through a window: the blocks written and the zeros around them.
    window_file out(std::vector<char>(5 * 4096, 'r'));
    const data_window into{.fd = out.fd, .offset = 0};
    EXPECT_EQ(run_one_windowed(d->queue(0), io_op::read, 0, 5 * 4096, into).result, 5 * 4096);
    EXPECT_EQ(out.bytes(0, 5 * 4096), read_back(*d, 0, 5 * 4096));
    EXPECT_EQ(out.bytes(1536, data.size()), data);
    EXPECT_TRUE(all_zero(out.bytes(0, 1536)));

    // The write-back cache copies what is written and what is read: no
    // data_window there.
    auto cached = make_null({"size=4", "memory_backed=1", "cache_size=1", "irqmode=0"});
    ASSERT_TRUE(cached);
    EXPECT_FALSE(cached->takes_external_data().data_windows);
    EXPECT_EQ(run_one_windowed(cached->queue(0), io_op::write, 0, 4096, src).result, -EINVAL);
    EXPECT_EQ(run_one_windowed(cached->queue(0), io_op::read, 0, 4096, into).result, -EINVAL);
}

TEST(null_target, memory_backed_allocation_map)
{
    auto d = make_null({"size=1", "memory_backed=1"});
    ASSERT_TRUE(d);
    std::vector<char> data(1024, 'a');
    ASSERT_EQ(d->execute(io_op::write, 8192, 1024, data.data()), 1024);
    auto m = d->map(0, 1 << 20);
    ASSERT_TRUE(m);
    ASSERT_EQ(m->size(), 3u);
    EXPECT_EQ((*m)[0].offset, 0u);
    EXPECT_EQ((*m)[0].length, 8192u);
    EXPECT_FALSE((*m)[0].allocated);
    EXPECT_TRUE((*m)[0].zero);
    EXPECT_EQ((*m)[1].offset, 8192u);
    EXPECT_EQ((*m)[1].length, 1024u);
    EXPECT_TRUE((*m)[1].allocated);
    EXPECT_EQ((*m)[2].offset, 9216u);
    EXPECT_EQ((*m)[2].offset + (*m)[2].length, 1u << 20);
    EXPECT_FALSE((*m)[2].allocated);
}

// The map travels through the queues as report_extents requests: a
// powered-off device refuses it like any I/O, a fragmented map longer than
// one reply's 64 entries comes back whole, and unaligned ranges are cut
// from whole blocks.
TEST(null_target, allocation_map_goes_through_the_queues)
{
    auto d = make_null({"size=4", "memory_backed=1", "blocksize=512"});
    ASSERT_TRUE(d);
    std::vector<char> data(512, 'a');
    for (uint64_t at = 0; at < 200 * 1024; at += 1024) {
        ASSERT_EQ(d->execute(io_op::write, at, 512, data.data()), 512);
    }
    auto m = d->map(0, 200 * 1024);
    ASSERT_TRUE(m) << m.error().message;
    ASSERT_EQ(m->size(), 400u);
    for (size_t i = 0; i < m->size(); ++i) {
        EXPECT_EQ((*m)[i].offset, i * 512);
        EXPECT_EQ((*m)[i].allocated, i % 2 == 0) << i;
    }
    auto part = d->map(100, 1000);
    ASSERT_TRUE(part);
    ASSERT_EQ(part->size(), 3u);
    EXPECT_EQ((*part)[0].offset, 100u);
    EXPECT_EQ((*part)[0].length, 412u);
    EXPECT_TRUE((*part)[0].allocated);
    EXPECT_EQ((*part)[2].offset + (*part)[2].length, 1100u);
    // Past the end: clipped.
    auto tail = d->map((4 << 20) - 512, 1 << 20);
    ASSERT_TRUE(tail);
    ASSERT_EQ(tail->size(), 1u);
    EXPECT_EQ(tail->front().length, 512u);

    ASSERT_TRUE(d->set_power(false));
    auto off = d->map(0, 4096);
    ASSERT_FALSE(off);
    EXPECT_EQ(off.error().code.value(), ENODEV);
    ASSERT_TRUE(d->set_power(true));
    EXPECT_TRUE(d->map(0, 4096));
}

TEST(null_target, discard_frees_memory_at_block_granularity)
{
    auto d = make_null({"size=16", "memory_backed=1", "discard=1"});
    ASSERT_TRUE(d);
    EXPECT_GT(d->limits().max_discard_bytes, 1u << 30);
    auto data = pattern(8 << 20, 2);
    ASSERT_EQ(d->execute(io_op::write, 0, static_cast<uint32_t>(data.size()), data.data()),
              static_cast<int>(data.size()));
    const uint64_t full = d->memory_bytes();
    EXPECT_GE(full, 8u << 20);
    // Two sectors of the first page: the page stays, those sectors read zero.
    ASSERT_EQ(d->execute(io_op::discard, 1024, 1024, nullptr), 0);
    std::vector<char> b(4096);
    ASSERT_EQ(d->execute(io_op::read, 0, 4096, b.data()), 4096);
    EXPECT_TRUE(std::equal(b.begin(), b.begin() + 1024, data.begin()));
    EXPECT_TRUE(std::all_of(b.begin() + 1024, b.begin() + 2048, [](char c) { return c == 0; }));
    EXPECT_TRUE(std::equal(b.begin() + 2048, b.end(), data.begin() + 2048));
    // Most of it: memory goes back, all but the free pages the store keeps
    // for the next writes (at most 1/8 of the device: 2 MiB).
    ASSERT_EQ(d->execute(io_op::discard, 4096, (8 << 20) - 4096, nullptr), 0);
    auto j = describe(*d);
    EXPECT_EQ(j["target"]["store_free_page_limit_bytes"], 2 << 20);
    EXPECT_EQ(j["target"]["store_free_page_bytes"], 2 << 20);
    EXPECT_EQ(j["target"]["store_returned_bytes"], (6 << 20) - 4096);
    EXPECT_EQ(d->memory_bytes(), full - ((6 << 20) - 4096));
    EXPECT_LT(d->memory_bytes(), full / 2);
    ASSERT_EQ(d->execute(io_op::read, 1 << 20, 4096, b.data()), 4096);
    EXPECT_TRUE(std::all_of(b.begin(), b.end(), [](char c) { return c == 0; }));
    EXPECT_EQ(j["target"]["data_page_bytes"], 4096);
}

TEST(null_target, discard_off_means_unsupported)
{
    auto d = make_null({"size=1", "memory_backed=1"});
    ASSERT_TRUE(d);
    EXPECT_EQ(d->execute(io_op::discard, 0, 4096, nullptr), -EOPNOTSUPP);
}

TEST(null_target, discard_without_memory_is_ignored_and_reset)
{
    // null_config_discard: "discard option is ignored without memory
    // backing", and the attribute reads 0 afterwards.
    auto d = make_null({"discard=1", "size=1"});
    ASSERT_TRUE(d);
    EXPECT_EQ(d->limits().max_discard_bytes, 0u);
    EXPECT_EQ(d->get_option("discard").value(), "0\n");
    ASSERT_FALSE(d->notes().empty());
    EXPECT_NE(d->notes().front().find("discard=1 ignored"), std::string::npos);
}

TEST(null_target, memory_limit_fails_writes_with_enospc_and_discard_gives_room)
{
    auto d = make_null({"size=64", "bs=4096", "memory_backed=1", "discard=1", "memory_limit=4"});
    ASSERT_TRUE(d);
    auto data = pattern(1 << 20, 5);
    int rc = 0;
    uint32_t stored = 0;
    for (uint32_t i = 0; i < 8 && rc >= 0; ++i) {
        rc = d->execute(io_op::write, uint64_t{i} << 20, 1 << 20, data.data());
        stored += rc > 0 ? 1 : 0;
    }
    EXPECT_EQ(rc, -ENOSPC);  // null_blk's BLK_STS_NOSPC
    EXPECT_GE(stored, 2u);
    EXPECT_LE(d->memory_bytes(), 4u << 20);
    auto j = describe(*d);
    EXPECT_EQ(j["target"]["memory_limit_bytes"], 4u << 20);
    EXPECT_GT(j["target"]["memory_refused"].get<uint64_t>(), 0u);
    // The device goes on: what it holds reads back, a rewrite needs nothing.
    std::vector<char> b(1 << 20);
    ASSERT_EQ(d->execute(io_op::read, 0, 1 << 20, b.data()), 1 << 20);
    EXPECT_EQ(b, data);
    EXPECT_EQ(d->execute(io_op::write, 0, 1 << 20, data.data()), 1 << 20);
    ASSERT_EQ(d->execute(io_op::discard, 0, stored << 20, nullptr), 0);
    EXPECT_EQ(d->execute(io_op::write, uint64_t{32} << 20, 1 << 20, data.data()), 1 << 20);
}

TEST(null_target, huge_pages_chooses_the_chunks_and_describe_says_why)
{
    // The default measures (auto); 0 and 1 decide, at creation and while
    // the device runs. describe shows the kind and why under "chunks".
    auto d = make_null({"size=64", "bs=4096", "memory_backed=1", "huge_pages=0"});
    ASSERT_TRUE(d);
    auto data = pattern(4 << 20, 6);
    ASSERT_EQ(d->execute(io_op::write, 0, 4 << 20, data.data()), 4 << 20);
    nlohmann::json chunks = describe(*d)["target"]["chunks"];
    EXPECT_EQ(chunks["kind"], "small") << chunks;
    EXPECT_EQ(chunks["huge_pages"], "0");
    EXPECT_EQ(chunks["small_chunks"], 4u);
    EXPECT_EQ(chunks["huge_chunks"], 0u);
    ASSERT_TRUE(d->set_option("huge_pages", "1\n"));
    ASSERT_EQ(d->execute(io_op::write, 4 << 20, 4 << 20, data.data()), 4 << 20);
    chunks = describe(*d)["target"]["chunks"];
    EXPECT_EQ(chunks["huge_pages"], "1");
    std::string no_thp;
    if (softblk::core::chunk_policy::thp_usable_here(no_thp)) {
        EXPECT_EQ(chunks["kind"], "huge") << chunks;
        EXPECT_EQ(chunks["huge_chunks"], 2u);
    } else {
        EXPECT_EQ(chunks["kind"], "small") << chunks;  // and why: THP is off
        EXPECT_NE(chunks["why"].get<std::string>().find(no_thp), std::string::npos) << chunks;
    }
    ASSERT_TRUE(d->set_option("huge_pages", "auto"));
    chunks = describe(*d)["target"]["chunks"];
    EXPECT_EQ(chunks["huge_pages"], "auto");
    EXPECT_FALSE(chunks["why"].get<std::string>().empty());
    // Anything else is refused, naming what it takes.
    const auto bad = d->set_option("huge_pages", "2");
    ASSERT_FALSE(bad);
    EXPECT_EQ(bad.error().code.value(), EINVAL);
    EXPECT_NE(bad.error().message.find("huge_pages=2"), std::string::npos) << bad.error().message;
    EXPECT_NE(bad.error().message.find("auto"), std::string::npos) << bad.error().message;
    // Without memory there are no chunks: a note says it does nothing.
    auto plain = make_null({"huge_pages=1"});
    ASSERT_TRUE(plain);
    ASSERT_FALSE(plain->notes().empty());
    EXPECT_NE(plain->notes().back().find("huge_pages=1 ignored"), std::string::npos);
}

TEST(null_target, memory_limit_without_memory_is_refused)
{
    const std::string e = create_error({"memory_limit=16"});
    EXPECT_NE(e.find("memory_limit=16"), std::string::npos) << e;
    EXPECT_NE(e.find("memory_backed=1"), std::string::npos) << e;
}

TEST(null_target, rotational_and_virt_boundary_reach_the_limits)
{
    auto d = make_null({"rotational=1", "virt_boundary=1"});
    ASSERT_TRUE(d);
    EXPECT_TRUE(d->limits().rotational);
    EXPECT_EQ(d->limits().virt_boundary_bytes, 4096u);
}

TEST(null_target, home_node_is_checked_against_this_machine)
{
    // configfs' home_node is an unsigned int: NUMA_NO_NODE reads 4294967295
    // and -1 is not a value it takes.
    auto none = make_null({"home_node=4294967295"});
    ASSERT_TRUE(none);
    EXPECT_EQ(describe(*none)["target"]["home_node"], -1);
    auto d = make_null({"home_node=0", "memory_backed=1", "size=4"});
    ASSERT_TRUE(d);
    std::vector<char> data(4096, 'n');
    EXPECT_EQ(d->execute(io_op::write, 0, 4096, data.data()), 4096);
    // A node this machine lacks is ignored with a note (the attribute
    // keeps the value).
    auto far = make_null({"home_node=1000"});
    ASSERT_TRUE(far);
    EXPECT_EQ(describe(*far)["target"]["home_node"], -1);
    EXPECT_EQ(far->get_option("home_node").value(), "1000\n");
    ASSERT_FALSE(far->notes().empty());
    EXPECT_NE(far->notes().front().find("home_node=1000 ignored"), std::string::npos);
    int code = 0;
    EXPECT_NE(create_error({"home_node=-1"}, &code).find("home_node"), std::string::npos);
    EXPECT_EQ(code, EINVAL);
}

TEST(null_target, use_per_node_hctx_sets_one_queue_per_node)
{
    // null_blk forces submit_queues to the number of online NUMA nodes,
    // whatever was given; count them as /sys shows them.
    unsigned nodes = 0;
    for (const auto& e : std::filesystem::directory_iterator("/sys/devices/system/node")) {
        const std::string n = e.path().filename().string();
        nodes +=
            n.size() > 4 && n.starts_with("node") && std::isdigit(static_cast<unsigned char>(n[4]))
                ? 1
                : 0;
    }
    nodes = std::max(nodes, 1u);
    for (const char* given : {"submit_queues=1", "submit_queues=7"}) {
        auto d = make_null({"use_per_node_hctx=1", given});
        ASSERT_TRUE(d) << given;
        EXPECT_EQ(d->info().queues.submit_queues, nodes) << given;
        EXPECT_EQ(d->queue_count(), nodes + d->info().queues.poll_queues) << given;
    }
    // Without it, submit_queues is clamped to the CPUs (nr_cpu_ids).
    auto plain = make_null({"submit_queues=100000"});
    ASSERT_TRUE(plain);
    EXPECT_EQ(plain->info().queues.submit_queues, possible_cpus());
    EXPECT_EQ(plain->get_option("submit_queues").value(), std::to_string(possible_cpus()) + "\n");
}

TEST(null_target, no_sched_is_reported)
{
    auto d = make_null({"no_sched=1"});
    ASSERT_TRUE(d);
    EXPECT_EQ(describe(*d)["target"]["no_sched"], true);
    auto args = d->options().to_args();
    EXPECT_NE(std::find(args.begin(), args.end(), "no_sched=1"), args.end());
}

TEST(null_target, power_off_fails_io_and_power_on_keeps_the_data)
{
    auto d = make_null({"size=1", "memory_backed=1"});
    ASSERT_TRUE(d);
    auto data = pattern(4096, 3);
    ASSERT_EQ(d->execute(io_op::write, 0, 4096, data.data()), 4096);
    ASSERT_TRUE(d->set_power(false));
    EXPECT_FALSE(d->powered());
    std::vector<char> b(4096);
    EXPECT_EQ(d->execute(io_op::read, 0, 4096, b.data()), -ENODEV);
    ASSERT_TRUE(d->set_power(true));
    EXPECT_EQ(d->execute(io_op::read, 0, 4096, b.data()), 4096);
    EXPECT_EQ(b, data);  // null_blk keeps the data store across power cycles
}

TEST(null_target, power_zero_at_creation_makes_a_powered_off_device)
{
    auto d = make_null({"power=0", "size=1", "memory_backed=1"});
    ASSERT_TRUE(d);
    EXPECT_FALSE(d->powered());
    EXPECT_EQ(d->queue_count(), 0u);
    EXPECT_EQ(d->get_option("power").value(), "0\n");
    char buf[512];
    EXPECT_EQ(d->execute(io_op::read, 0, 512, buf), -ENODEV);
    ASSERT_TRUE(d->set_power(true));
    EXPECT_EQ(d->execute(io_op::read, 0, 512, buf), 512);
    EXPECT_TRUE(make_null({"power=1"}));
}

TEST(null_target, index_is_the_lowest_free_one)
{
    auto a = make_null({});
    auto b = make_null({});
    ASSERT_TRUE(a && b);
    const int ia = describe(*a)["target"]["index"];
    const int ib = describe(*b)["target"]["index"];
    EXPECT_NE(ia, ib);
    EXPECT_EQ(a->get_option("index").value(), std::to_string(ia) + "\n");
    // A value written is ignored (null_add_dev assigns it), with a note.
    auto c = make_null({"index=777"});
    ASSERT_TRUE(c);
    EXPECT_NE(describe(*c)["target"]["index"], 777);
    ASSERT_FALSE(c->notes().empty());
    EXPECT_NE(c->notes().back().find("index=777 ignored"), std::string::npos);
    c.reset();
    // Freed indexes are reused, lowest first (no other device exists here).
    EXPECT_EQ(std::min(ia, ib), 0);
    a.reset();
    auto again = make_null({});
    ASSERT_TRUE(again);
    EXPECT_EQ(describe(*again)["target"]["index"], ia);
}

TEST(null_target, features_name_every_null_blk_attribute)
{
    // null_blk's configfs attributes (Linux 6.12) that are not zoned, plus
    // the module parameters gb and bs and the fault injection groups.
    const std::set<std::string> expected = {"badblocks",
                                            "badblocks_once",
                                            "badblocks_partial_io",
                                            "blocking",
                                            "blocksize",
                                            "cache_size",
                                            "completion_nsec",
                                            "discard",
                                            "fua",
                                            "home_node",
                                            "hw_queue_depth",
                                            "index",
                                            "irqmode",
                                            "max_sectors",
                                            "mbps",
                                            "memory_backed",
                                            "no_sched",
                                            "poll_queues",
                                            "power",
                                            "rotational",
                                            "shared_tag_bitmap",
                                            "shared_tags",
                                            "size",
                                            "submit_queues",
                                            "use_per_node_hctx",
                                            "virt_boundary",
                                            "gb",
                                            "timeout",
                                            "requeue",
                                            "init_hctx"};
    std::set<std::string> names;
    std::set<std::string> aliases;
    for (const option_def& o : options_for("null")) {
        names.emplace(o.name);
        EXPECT_FALSE(o.help.empty()) << o.name;
        if (!o.alias.empty()) {
            aliases.emplace(o.alias);
        }
    }
    for (const std::string& n : expected) {
        EXPECT_TRUE(names.contains(n)) << n;
    }
    for (const char* a : {"bs", "timeout_inject", "requeue_inject", "init_hctx_fault_inject"}) {
        EXPECT_TRUE(aliases.contains(a)) << a;
    }
}

TEST(null_target, unknown_and_malformed_options_are_errors)
{
    EXPECT_NE(create_error({"sise=4"}).find("sise"), std::string::npos);
    EXPECT_NE(create_error({"memory_backed=maybe"}).find("memory_backed"), std::string::npos);
    EXPECT_NE(create_error({"size=-1"}).find("size"), std::string::npos);
}

// ---------------------------------------------------------------- queues

TEST(null_target, irqmode_0_completes_inside_submit)
{
    auto d = make_null({"irqmode=0", "size=1"});
    ASSERT_TRUE(d);
    char buf[512];
    bool inside = false;
    completion c = run_one(d->queue(0), io_op::read, 0, 512, buf, 0, 1'000'000'000, &inside);
    EXPECT_TRUE(inside);
    EXPECT_EQ(c.result, 512);
}

TEST(null_target, irqmode_1_completes_on_the_queues_next_run)
{
    auto d = make_null({"irqmode=1", "size=1"});
    ASSERT_TRUE(d);
    char buf[512];
    bool inside = true;
    completion c = run_one(d->queue(0), io_op::read, 0, 512, buf, 0, 1'000'000'000, &inside);
    EXPECT_FALSE(inside);
    EXPECT_EQ(c.result, 512);
}

TEST(null_target, irqmode_2_waits_completion_nsec)
{
    auto d = make_null({"irqmode=2", "completion_nsec=2000000", "size=1"});
    ASSERT_TRUE(d);
    char buf[512];
    for (int i = 0; i < 3; ++i) {
        uint64_t start = 0;
        bool inside = true;
        completion c =
            run_one(d->queue(0), io_op::read, 0, 512, buf, 0, 1'000'000'000, &inside, &start);
        EXPECT_FALSE(inside);
        EXPECT_EQ(c.result, 512);
        EXPECT_GE(c.at_ns - start, 2'000'000u);
        EXPECT_LT(c.at_ns - start, 50'000'000u);
    }
}

TEST(null_target, poll_queues_complete_only_when_polled)
{
    // poll_queues is clamped to the module's (1 by default), as null_blk.
    auto d = make_null({"irqmode=0", "submit_queues=2", "poll_queues=2", "size=1"});
    ASSERT_TRUE(d);
    const unsigned submit = std::min(2u, possible_cpus());
    ASSERT_EQ(d->queue_count(), submit + 1);
    EXPECT_EQ(d->get_option("poll_queues").value(), "1\n");
    io_queue& pq = d->queue(submit);
    EXPECT_TRUE(pq.is_poll_queue());
    EXPECT_FALSE(d->queue(0).is_poll_queue());
    char buf[512];
    bool inside = true;
    completion c = run_one(pq, io_op::read, 0, 512, buf, 0, 1'000'000'000, &inside);
    EXPECT_FALSE(inside);
    EXPECT_EQ(c.result, 512);
}

TEST(null_target, hw_queue_depth_is_the_number_of_tags)
{
    auto d = make_null({"hw_queue_depth=4", "size=1"});
    ASSERT_TRUE(d);
    io_queue& q = d->queue(0);
    std::vector<io_request*> taken;
    while (io_request* r = q.get_request()) {
        taken.push_back(r);
        ASSERT_LE(taken.size(), 4u);
    }
    EXPECT_EQ(taken.size(), 4u);
    for (io_request* r : taken) {
        q.put_request(*r);
    }
}

TEST(null_target, queues_run_concurrently_on_the_memory_store)
{
    auto d = make_null({"submit_queues=2", "memory_backed=1", "size=8", "bs=4096", "irqmode=0"});
    ASSERT_TRUE(d);
    ASSERT_GE(d->queue_count(), 2u);
    // Each thread owns one queue and writes then verifies its own pages,
    // interleaved with the other thread's pages (shared leaf nodes).
    auto worker = [&](unsigned qi) {
        io_queue& q = d->queue(qi);
        for (unsigned round = 0; round < 20; ++round) {
            for (unsigned p = qi; p < 512; p += 2) {
                auto data = pattern(4096, p * 31 + round);
                completion c = run_one(q, io_op::write, uint64_t{p} * 4096, 4096, data.data());
                ASSERT_EQ(c.result, 4096);
                std::vector<char> b(4096);
                c = run_one(q, io_op::read, uint64_t{p} * 4096, 4096, b.data());
                ASSERT_EQ(c.result, 4096);
                ASSERT_EQ(b, data);
            }
        }
    };
    std::thread t0(worker, 0);
    std::thread t1(worker, 1);
    t0.join();
    t1.join();
}

}  // namespace

TEST(null_options, queue_mode_follows_null_blk)
{
    std::vector<std::string> legacy = {"queue_mode=1"};
    auto bad = softblk::device::create("qm1", "null", legacy);
    ASSERT_FALSE(bad);
    EXPECT_NE(bad.error().message.find("queue_mode"), std::string::npos);
    for (const char* ok : {"queue_mode=0", "queue_mode=2", "queue_mode=3"}) {
        std::vector<std::string> args = {ok, "size=16"};
        auto dev = softblk::device::create("qm", "null", args);
        ASSERT_TRUE(dev) << ok;
        // 0 becomes 2 (null_validate_conf); 3 is no mode and stays.
        EXPECT_EQ((*dev)->get_option("queue_mode").value(),
                  std::string(ok) == "queue_mode=3" ? "3\n" : "2\n");
    }
}
