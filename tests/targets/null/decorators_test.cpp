// The decorators' attributes on the null target: cache_size with FLUSH, FUA
// and power cycles; mbps; each bad-block mode; timeout / requeue / init_hctx
// fault injection; their option errors; which of them pass external data
// (ublk's data windows) on.
#include "test_util.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <thread>

#include <softblk/memory_store.hpp>

using namespace softblk;
using namespace softblk::test;

namespace {

void power_cycle(device& d)
{
    ASSERT_TRUE(d.set_power(false));
    ASSERT_TRUE(d.set_power(true));
}

// ---------------------------------------------------------------- cache

TEST(cache_size, advertises_a_volatile_cache_and_fua)
{
    auto d = make_null({"memory_backed=1", "size=8", "cache_size=1"});
    ASSERT_TRUE(d);
    EXPECT_TRUE(d->limits().volatile_write_cache);
    EXPECT_TRUE(d->limits().fua);
    auto n = make_null({"memory_backed=1", "size=8", "cache_size=1", "fua=0"});
    ASSERT_TRUE(n);
    EXPECT_TRUE(n->limits().volatile_write_cache);
    EXPECT_FALSE(n->limits().fua);
}

TEST(cache_size, unflushed_writes_are_read_back_then_lost_at_power_off)
{
    auto d = make_null({"memory_backed=1", "size=8", "cache_size=1"});
    ASSERT_TRUE(d);
    auto data = pattern(64 << 10, 4);
    ASSERT_EQ(d->execute(io_op::write, 0, 64 << 10, data.data()), 64 << 10);
    EXPECT_EQ(read_back(*d, 0, 64 << 10), data);  // served by the cache
    EXPECT_EQ(describe(*d)["target"]["cache"]["pages"], 16);
    power_cycle(*d);
    EXPECT_TRUE(all_zero(read_back(*d, 0, 64 << 10)));
    EXPECT_EQ(describe(*d)["target"]["cache"]["pages"], 0);
}

TEST(cache_size, flush_makes_writes_survive_power_off)
{
    auto d = make_null({"memory_backed=1", "size=8", "cache_size=1"});
    ASSERT_TRUE(d);
    auto data = pattern(128 << 10, 5);
    ASSERT_EQ(d->execute(io_op::write, 4096, 128 << 10, data.data()), 128 << 10);
    ASSERT_EQ(d->execute(io_op::flush, 0, 0, nullptr), 0);
    EXPECT_EQ(describe(*d)["target"]["cache"]["unflushed_pages"], 0);
    auto after = pattern(4096, 6);
    ASSERT_EQ(d->execute(io_op::write, 1 << 20, 4096, after.data()), 4096);  // not flushed
    power_cycle(*d);
    EXPECT_EQ(read_back(*d, 4096, 128 << 10), data);
    EXPECT_TRUE(all_zero(read_back(*d, 1 << 20, 4096)));
}

TEST(cache_size, fua_writes_bypass_the_cache)
{
    auto d = make_null({"memory_backed=1", "size=8", "cache_size=1"});
    ASSERT_TRUE(d);
    auto cached = pattern(4096, 7);
    auto fua = pattern(4096, 8);
    ASSERT_EQ(d->execute(io_op::write, 0, 4096, cached.data()), 4096);
    // Overwrite a cached block with FUA: the cache must not shadow it.
    ASSERT_EQ(d->execute(io_op::write, 0, 4096, fua.data(), k_io_fua), 4096);
    ASSERT_EQ(d->execute(io_op::write, 8192, 4096, fua.data(), k_io_fua), 4096);
    EXPECT_EQ(read_back(*d, 0, 4096), fua);
    power_cycle(*d);
    EXPECT_EQ(read_back(*d, 0, 4096), fua);
    EXPECT_EQ(read_back(*d, 8192, 4096), fua);
}

TEST(cache_size, writes_go_back_to_the_store_when_the_cache_is_full)
{
    auto d = make_null({"memory_backed=1", "size=8", "cache_size=1"});
    ASSERT_TRUE(d);
    auto data = pattern(3 << 20, 9);
    // One request at a time (execute would send the pieces of one large
    // write at once, in no defined order), so that "oldest" means something.
    for (uint32_t at = 0; at < (3u << 20); at += 64 << 10) {
        ASSERT_EQ(d->execute(io_op::write, at, 64 << 10, data.data() + at), 64 << 10);
    }
    auto j = describe(*d)["target"]["cache"];
    EXPECT_LE(j["pages"].get<uint64_t>(), 256u);  // 1 MiB of 4 KiB pages
    EXPECT_GE(j["written_back_pages"].get<uint64_t>(), 512u);
    EXPECT_EQ(read_back(*d, 0, 3 << 20), data);  // cache and store together
    power_cycle(*d);
    // The oldest data was written back; the newest was still in the cache.
    auto b = read_back(*d, 0, 3 << 20);
    EXPECT_TRUE(std::equal(b.begin(), b.begin() + (1 << 20), data.begin()));
    EXPECT_TRUE(all_zero(std::vector<char>(b.end() - 4096, b.end())));
}

TEST(cache_size, partial_pages_with_small_blocks)
{
    auto d = make_null({"memory_backed=1", "size=4", "cache_size=1", "bs=512"});
    ASSERT_TRUE(d);
    // Every other sector of two pages: runs of one block each.
    std::vector<char> expect(8192, 0);
    for (int s = 0; s < 16; s += 2) {
        auto one = pattern(512, 10 + s);
        ASSERT_EQ(d->execute(io_op::write, s * 512, 512, one.data()), 512);
        std::copy(one.begin(), one.end(), expect.begin() + s * 512);
    }
    EXPECT_EQ(read_back(*d, 0, 8192), expect);
    ASSERT_EQ(d->execute(io_op::flush, 0, 0, nullptr), 0);
    power_cycle(*d);
    EXPECT_EQ(read_back(*d, 0, 8192), expect);
    auto m = d->map(0, 8192);
    ASSERT_TRUE(m);
    EXPECT_EQ(m->size(), 16u);  // data, hole, data, hole ...
}

TEST(cache_size, map_shows_cached_blocks_as_data)
{
    auto d = make_null({"memory_backed=1", "size=4", "cache_size=1"});
    ASSERT_TRUE(d);
    std::vector<char> data(4096, 'c');
    ASSERT_EQ(d->execute(io_op::write, 65536, 4096, data.data()), 4096);
    auto m = d->map(0, 4 << 20);
    ASSERT_TRUE(m);
    ASSERT_EQ(m->size(), 3u);
    EXPECT_TRUE((*m)[1].allocated);
    EXPECT_EQ((*m)[1].offset, 65536u);
    EXPECT_EQ((*m)[1].length, 4096u);
}

TEST(cache_size, discard_drops_cached_blocks)
{
    auto d = make_null({"memory_backed=1", "size=4", "cache_size=1", "discard=1"});
    ASSERT_TRUE(d);
    std::vector<char> data(8192, 'd');
    ASSERT_EQ(d->execute(io_op::write, 0, 8192, data.data()), 8192);
    ASSERT_EQ(d->execute(io_op::discard, 0, 4096, nullptr), 0);
    auto b = read_back(*d, 0, 8192);
    EXPECT_TRUE(all_zero(std::vector<char>(b.begin(), b.begin() + 4096)));
    EXPECT_TRUE(std::all_of(b.begin() + 4096, b.end(), [](char c) { return c == 'd'; }));
}

TEST(cache_size, queues_share_the_cache_under_write_back)
{
    // Two threads on two queues overflow a 1 MiB cache: each queue's writes
    // may wait for the other's write-back; every read must see the latest
    // data of its thread's pages, and all of it must survive FLUSH and a
    // power cycle.
    auto d = make_null(
        {"memory_backed=1", "size=8", "cache_size=1", "bs=4096", "submit_queues=2", "irqmode=0"});
    ASSERT_TRUE(d);
    std::atomic<bool> bad{false};
    auto worker = [&](unsigned qi) {
        io_queue& q = d->queue(qi);
        for (unsigned round = 0; round < 3 && !bad; ++round) {
            for (unsigned p = qi; p < 1024; p += 2) {
                auto data = pattern(4096, p * 7 + round);
                if (run_one(q, io_op::write, uint64_t{p} * 4096, 4096, data.data()).result !=
                    4096) {
                    bad = true;
                }
                std::vector<char> b(4096);
                if (run_one(q, io_op::read, uint64_t{p} * 4096, 4096, b.data()).result != 4096 ||
                    b != data) {
                    bad = true;
                }
            }
        }
    };
    std::thread t0(worker, 0);
    std::thread t1(worker, 1);
    t0.join();
    t1.join();
    ASSERT_FALSE(bad);
    ASSERT_EQ(d->execute(io_op::flush, 0, 0, nullptr), 0);
    power_cycle(*d);
    for (unsigned p = 0; p < 1024; ++p) {
        ASSERT_EQ(read_back(*d, uint64_t{p} * 4096, 4096), pattern(4096, p * 7 + 2)) << p;
    }
}

TEST(cache_size, is_ignored_without_memory_on_the_null_target)
{
    // null_validate_conf: "cache is meaningless" without memory_backed, so
    // cache_size becomes 0 (a read shows it).
    auto d = make_null({"cache_size=16", "size=1"});
    ASSERT_TRUE(d);
    EXPECT_FALSE(d->limits().volatile_write_cache);
    EXPECT_EQ(d->get_option("cache_size").value(), "0\n");
    ASSERT_FALSE(d->notes().empty());
    EXPECT_NE(d->notes().front().find("cache_size=16 ignored"), std::string::npos);
}

TEST(cache_size, counts_against_the_process_budget_and_writes_through_past_it)
{
    memory_budget& daemon = process_memory_budget();
    const uint64_t before = daemon.used();
    auto d = make_null({"memory_backed=1", "size=64", "bs=4096", "cache_size=16"});
    ASSERT_TRUE(d);
    const auto data = pattern(1 << 20, 3);
    for (uint32_t i = 0; i < 4; ++i) {
        ASSERT_EQ(
            d->execute(io_op::write, uint64_t{i} << 20, 1 << 20, const_cast<char*>(data.data())),
            1 << 20);
    }
    EXPECT_EQ(describe(*d)["target"]["cache"]["pages"], 1024);
    EXPECT_EQ(daemon.used() - before, d->memory_bytes());
    EXPECT_GE(d->memory_bytes(), uint64_t{4} << 20);

    // Little room left: the cache stops growing and writes go through to
    // the store, until the store is refused too (-ENOSPC).
    daemon.set_limit(daemon.used() + (uint64_t{2} << 20));
    int rc = 0;
    uint32_t stored = 0;
    for (uint32_t i = 4; i < 64 && rc >= 0; ++i) {
        rc = d->execute(io_op::write, uint64_t{i} << 20, 1 << 20, const_cast<char*>(data.data()));
        stored += rc > 0 ? 1 : 0;
    }
    EXPECT_EQ(rc, -ENOSPC);
    EXPECT_GE(stored, 1u);
    EXPECT_LT(stored, 4u);
    EXPECT_LE(daemon.used(), daemon.limit());
    EXPECT_GT(describe(*d)["target"]["cache"]["bypassed"].get<uint64_t>(), 0u);
    for (uint32_t i = 0; i < 4 + stored; ++i) {
        EXPECT_EQ(read_back(*d, uint64_t{i} << 20, 1 << 20), data) << i;
    }
    daemon.set_limit(0);
    d.reset();
    EXPECT_EQ(daemon.used(), before);  // the cache and the store gave everything back
}

// ---------------------------------------------------------------- mbps

uint64_t time_writes(device& d, uint32_t total, uint32_t chunk)
{
    std::vector<char> buf(chunk, 't');
    io_queue& q = d.queue(0);
    const uint64_t start = now_ns();
    uint32_t submitted = 0;
    uint32_t completed = 0;
    struct ctx {
        uint32_t* completed;
    } c{&completed};
    auto cb = [](io_request& r, int result) {
        EXPECT_GT(result, 0);
        ++*static_cast<ctx*>(r.user_data)->completed;
    };
    const uint32_t count = total / chunk;
    while (completed < count) {
        while (submitted < count) {
            io_request* r = q.get_request();
            if (r == nullptr) {
                break;
            }
            r->op = io_op::write;
            r->offset = uint64_t{submitted} * chunk;
            r->length = chunk;
            r->buffer = buf.data();
            r->on_complete = cb;
            r->user_data = &c;
            q.submit(*r);
            ++submitted;
        }
        q.wait(1, 1'000'000'000);
    }
    return now_ns() - start;
}

TEST(mbps, limits_the_bandwidth)
{
    // 50 MiB/s: 1 MiB per 20 ms tick. 4 MiB take about 60 ms after the
    // first tick's worth goes at once.
    auto d = make_null({"mbps=50", "size=64", "max_sectors=128"});
    ASSERT_TRUE(d);
    const uint64_t ns = time_writes(*d, 4 << 20, 64 << 10);
    EXPECT_GE(ns, 40'000'000u) << ns;
    EXPECT_LT(ns, 400'000'000u) << ns;
    EXPECT_GE(describe(*d)["target"]["throttle"]["admitted_bytes"].get<uint64_t>(), 4u << 20);
    // The same without a limit is far faster.
    auto f = make_null({"size=64", "max_sectors=128"});
    ASSERT_TRUE(f);
    EXPECT_LT(time_writes(*f, 4 << 20, 64 << 10), 20'000'000u);
}

TEST(mbps, is_shared_by_the_queues)
{
    auto d = make_null({"mbps=50", "size=64", "max_sectors=128", "submit_queues=2"});
    ASSERT_TRUE(d);
    uint64_t a = 0;
    uint64_t b = 0;
    std::thread t([&] {
        std::vector<char> buf(64 << 10, 's');
        io_queue& q = d->queue(1);
        const uint64_t start = now_ns();
        for (int i = 0; i < 32; ++i) {
            ASSERT_EQ(run_one(q, io_op::write, uint64_t(i) << 16, 64 << 10, buf.data()).result,
                      64 << 10);
        }
        b = now_ns() - start;
    });
    a = time_writes(*d, 2 << 20, 64 << 10);
    t.join();
    // 4 MiB in all at 50 MiB/s: the slower of the two needs most of 60 ms.
    EXPECT_GE(std::max(a, b), 40'000'000u) << a << " " << b;
}

TEST(mbps, counts_discard_as_null_blk_does)
{
    // blk_rq_bytes() of a discard is its length: 8 MiB at 50 MiB/s take
    // well over 100 ms, though no data moves.
    auto d = make_null({"mbps=50", "size=64", "memory_backed=1", "discard=1"});
    ASSERT_TRUE(d);
    const uint64_t start = now_ns();
    for (int i = 0; i < 8; ++i) {
        ASSERT_EQ(d->execute(io_op::discard, uint64_t(i) << 20, 1 << 20, nullptr), 0);
    }
    const uint64_t ns = now_ns() - start;
    EXPECT_GE(ns, 100'000'000u) << ns;
    EXPECT_GE(describe(*d)["target"]["throttle"]["admitted_bytes"].get<uint64_t>(), 8u << 20);
}

TEST(mbps, is_clamped_to_null_blks_maximum)
{
    auto d = make_null({"mbps=100000"});
    ASSERT_TRUE(d);
    EXPECT_EQ(d->options().u64("mbps"), 40960u);
}

// ---------------------------------------------------------------- bad blocks

TEST(badblocks, requests_touching_a_bad_sector_fail)
{
    auto d = make_null({"size=1", "badblocks=+8-15"});
    ASSERT_TRUE(d);
    char buf[4096];
    EXPECT_EQ(d->execute(io_op::read, 0, 4096, buf), 4096);      // sectors 0-7
    EXPECT_EQ(d->execute(io_op::read, 4096, 512, buf), -EIO);    // sector 8
    EXPECT_EQ(d->execute(io_op::write, 2048, 4096, buf), -EIO);  // 4-11
    EXPECT_EQ(d->execute(io_op::read, 8192, 512, buf), 512);     // 16
    EXPECT_EQ(d->execute(io_op::read, 4096, 512, buf), -EIO);    // still bad
}

TEST(badblocks, minus_clears_and_list_is_reported)
{
    auto d = make_null({"size=1", "badblocks=+8-15", "badblocks=-8-11", "badblocks=+100-100"});
    ASSERT_TRUE(d);
    char buf[512];
    EXPECT_EQ(d->execute(io_op::read, 8 * 512, 512, buf), 512);
    EXPECT_EQ(d->execute(io_op::read, 12 * 512, 512, buf), -EIO);
    EXPECT_EQ(d->execute(io_op::read, 100 * 512, 512, buf), -EIO);
    auto list = describe(*d)["target"]["badblocks"]["list"];
    ASSERT_EQ(list.size(), 2u);
    EXPECT_EQ(list[0], "12-15");
    EXPECT_EQ(list[1], "100-100");
}

TEST(badblocks, once_fails_then_succeeds)
{
    auto d = make_null({"size=1", "badblocks=+8-15", "badblocks_once=1"});
    ASSERT_TRUE(d);
    char buf[4096];
    EXPECT_EQ(d->execute(io_op::read, 4096, 4096, buf), -EIO);
    EXPECT_EQ(d->execute(io_op::read, 4096, 4096, buf), 4096);
    EXPECT_TRUE(describe(*d)["target"]["badblocks"]["list"].empty());
}

TEST(badblocks, partial_io_transfers_up_to_the_first_bad_block)
{
    auto d = make_null(
        {"size=1", "bs=4096", "memory_backed=1", "badblocks=+18-18", "badblocks_partial_io=1"});
    ASSERT_TRUE(d);
    auto data = pattern(16384, 11);
    // Sector 18 is in block 2 (sectors 16-23): blocks 0 and 1 are written.
    completion c = run_one(d->queue(0), io_op::write, 0, 16384, data.data());
    EXPECT_EQ(c.result, -EIO);
    EXPECT_EQ(c.transferred, 8192u);
    auto b = read_back(*d, 0, 8192);
    EXPECT_TRUE(std::equal(b.begin(), b.end(), data.begin()));
    std::vector<char> rest(8192);
    EXPECT_EQ(d->execute(io_op::read, 8192, 4096, rest.data()), -EIO);   // the bad block
    EXPECT_EQ(d->execute(io_op::read, 12288, 4096, rest.data()), 4096);  // after it: never written
    EXPECT_TRUE(all_zero(std::vector<char>(rest.begin(), rest.begin() + 4096)));
    // Starting on the bad block: nothing is transferred.
    c = run_one(d->queue(0), io_op::read, 8192, 8192, rest.data());
    EXPECT_EQ(c.result, -EIO);
    EXPECT_EQ(c.transferred, 0u);
}

TEST(badblocks, malformed_ranges_are_errors)
{
    for (const char* bad :
         {"badblocks=8-15", "badblocks=+15-8", "badblocks=+x-9", "badblocks=+8"}) {
        const std::string e = create_error({bad});
        EXPECT_NE(e.find("badblocks="), std::string::npos) << e;
        EXPECT_NE(e.find("+start-end"), std::string::npos) << e;
    }
}

// ---------------------------------------------------------------- external data

// A request whose data is outside the process (external_data.hpp; here a
// data window, as ublk's user copy hands it over) goes through every
// decorator that says it takes such data with that data, and is refused
// (-EINVAL) where one does not (the cache): it never reaches the target
// without its bytes.
TEST(external_data, goes_through_each_decorator_or_is_refused)
{
    struct stack {
        std::vector<std::string> options;
        bool takes;
    };
    const stack stacks[] = {
        {{}, true},  // bad blocks and fault injection, which every device has
        {{"mbps=1000"}, true},
        {{"requeue=1,100,0,2"}, true},  // run again, twice
        {{"badblocks=+600-607", "badblocks_partial_io=1"}, true},
        {{"cache_size=1"}, false},
    };
    const auto data = pattern(16384, 21);
    for (const stack& s : stacks) {
        std::vector<std::string> o{"size=1", "bs=4096", "memory_backed=1", "irqmode=0"};
        o.insert(o.end(), s.options.begin(), s.options.end());
        const std::string label = o.back();
        auto d = make_null(o);
        ASSERT_TRUE(d) << label;
        EXPECT_EQ(d->takes_external_data().data_windows, s.takes) << label;
        EXPECT_FALSE(d->takes_external_data().kernel_buffers) << label;
        window_file in(data, 4096);
        const data_window src{.fd = in.fd, .offset = 4096};
        window_file out(std::vector<char>(data.size(), 'r'));
        const data_window into{.fd = out.fd, .offset = 0};
        const auto length = static_cast<uint32_t>(data.size());
        if (!s.takes) {
            EXPECT_EQ(run_one_windowed(d->queue(0), io_op::write, 8192, length, src).result,
                      -EINVAL)
                << label;
            EXPECT_EQ(run_one_windowed(d->queue(0), io_op::read, 8192, length, into).result,
                      -EINVAL)
                << label;
            continue;
        }
        EXPECT_EQ(run_one_windowed(d->queue(0), io_op::write, 8192, length, src).result,
                  static_cast<int>(length))
            << label;
        EXPECT_EQ(read_back(*d, 8192, length), data) << label;
        EXPECT_EQ(run_one_windowed(d->queue(0), io_op::read, 8192, length, into).result,
                  static_cast<int>(length))
            << label;
        EXPECT_EQ(out.bytes(0, data.size()), data) << label;
    }
}

// badblocks_partial_io sends a request of its own for the blocks before
// the bad one: it carries a copy of the consumer's external data, so the
// prefix is written from, and read into, the window's first bytes.
TEST(external_data, partial_io_moves_the_prefix_through_the_window)
{
    auto d = make_null({"size=1", "bs=4096", "memory_backed=1", "badblocks=+18-18",
                        "badblocks_partial_io=1", "irqmode=0"});
    ASSERT_TRUE(d);
    const auto data = pattern(16384, 22);
    const std::vector<char> prefix(data.begin(), data.begin() + 8192);
    window_file in(data);
    // Sector 18 is in block 2: blocks 0 and 1 are written.
    completion c = run_one_windowed(d->queue(0), io_op::write, 0, 16384,
                                    data_window{.fd = in.fd, .offset = 0});
    EXPECT_EQ(c.result, -EIO);
    EXPECT_EQ(c.transferred, 8192u);
    EXPECT_EQ(read_back(*d, 0, 8192), prefix);
    window_file out(std::vector<char>(16384, 'r'));
    c = run_one_windowed(d->queue(0), io_op::read, 0, 16384,
                         data_window{.fd = out.fd, .offset = 0});
    EXPECT_EQ(c.result, -EIO);
    EXPECT_EQ(c.transferred, 8192u);
    EXPECT_EQ(out.bytes(0, 8192), prefix);
}

// ---------------------------------------------------------------- faults

TEST(fault_injection, timeout_leaves_the_request_to_the_io_timeout)
{
    // times=1: only the first request is lost.
    auto d = make_null({"size=1", "timeout=1,100,0,1", "io_timeout=100"});
    ASSERT_TRUE(d);
    char buf[512];
    uint64_t start = 0;
    completion c =
        run_one(d->queue(0), io_op::read, 0, 512, buf, 0, 5'000'000'000, nullptr, &start);
    EXPECT_EQ(c.result, -ETIMEDOUT);
    EXPECT_GE(c.at_ns - start, 100'000'000u);
    EXPECT_LT(c.at_ns - start, 2'000'000'000u);
    c = run_one(d->queue(0), io_op::read, 0, 512, buf);
    EXPECT_EQ(c.result, 512);
    EXPECT_EQ(d->queue(0).stats().timeouts, 1u);
    EXPECT_EQ(describe(*d)["target"]["fault_injection"]["timeout"]["failures"], 1);
}

TEST(fault_injection, timeout_interval_picks_every_nth_request)
{
    auto d = make_null({"size=1", "timeout_inject=3,100,0,-1", "io_timeout=50"});
    ASSERT_TRUE(d);
    char buf[512];
    int timeouts = 0;
    for (int i = 0; i < 6; ++i) {
        completion c = run_one(d->queue(0), io_op::read, 0, 512, buf);
        timeouts += c.result == -ETIMEDOUT ? 1 : 0;
        EXPECT_TRUE(c.result == 512 || ((i % 3 == 2) && c.result == -ETIMEDOUT))
            << i << " " << c.result;
    }
    EXPECT_EQ(timeouts, 2);
}

TEST(fault_injection, requeued_requests_run_again_and_succeed)
{
    auto d = make_null({"size=1", "memory_backed=1", "requeue=1,100,0,2"});
    ASSERT_TRUE(d);
    auto data = pattern(4096, 12);
    completion c = run_one(d->queue(0), io_op::write, 0, 4096, data.data());
    EXPECT_EQ(c.result, 4096);
    EXPECT_EQ(read_back(*d, 0, 4096), data);
    EXPECT_EQ(describe(*d)["target"]["fault_injection"]["requeue"]["failures"], 2);
}

TEST(fault_injection, space_lets_requests_pass_first)
{
    // The kernel's space: requests pass while space > 1 (decremented by
    // each), so space=4 lets 3 through.
    auto d = make_null({"size=1", "timeout=1,100,4,-1", "io_timeout=50"});
    ASSERT_TRUE(d);
    char buf[512];
    for (int i = 0; i < 3; ++i) {
        EXPECT_EQ(run_one(d->queue(0), io_op::read, 0, 512, buf).result, 512) << i;
    }
    EXPECT_EQ(run_one(d->queue(0), io_op::read, 0, 512, buf).result, -ETIMEDOUT);
}

TEST(fault_injection, probability_zero_never_fails)
{
    auto d = make_null({"size=1", "requeue=1,0,0,-1", "timeout=1,0,0,-1"});
    ASSERT_TRUE(d);
    char buf[512];
    for (int i = 0; i < 100; ++i) {
        ASSERT_EQ(d->execute(io_op::read, 0, 512, buf), 512);
    }
}

TEST(fault_injection, init_hctx_fails_device_creation)
{
    int code = 0;
    const std::string e = create_error({"init_hctx=1,100,0,-1", "size=1"}, &code);
    EXPECT_EQ(code, EFAULT);
    EXPECT_NE(e.find("init_hctx"), std::string::npos) << e;
    if (possible_cpus() < 2) {
        GTEST_SKIP() << "needs two CPUs for two submit queues";
    }
    // space=3: the first two queues open, the third fails.
    EXPECT_FALSE(device::create("x", "null",
                                std::vector<std::string>{"init_hctx_fault_inject=1,100,3,-1",
                                                         "submit_queues=2", "poll_queues=1"}));
    EXPECT_TRUE(device::create("x", "null",
                               std::vector<std::string>{"init_hctx_fault_inject=1,100,3,-1",
                                                        "submit_queues=1", "poll_queues=1"}));
}

TEST(fault_injection, malformed_specs_are_errors)
{
    // setup_fault_attr takes any probability (100 and above always fail) and
    // any times (below -1 counts down from there, failing all along).
    EXPECT_TRUE(make_null({"timeout=1,101,0,-1", "init_hctx=1,0,0,-5", "size=1"}));
    for (const char* bad : {"timeout=1,100,0", "requeue=a,b,c,d", "init_hctx=-1,50,0,1"}) {
        const std::string e = create_error({bad});
        const std::string key(bad, std::string_view(bad).find('='));
        EXPECT_NE(e.find(key + "="), std::string::npos) << e;
        EXPECT_NE(e.find("interval,probability,space,times"), std::string::npos) << e;
    }
}

}  // namespace
