// The decorators over an inner target that completes nothing inside
// submit(): every request finishes from poll(), as an io_uring-based file
// target's would. Shows that the cache's write-back, its blocked writes and
// FLUSH work through the asynchronous target_queue / completion_sink path.
#include "test_util.hpp"

#include <functional>

#include <atomic>
#include <cerrno>

#include <softblk/target.hpp>

#include <softblk/memory_store.hpp>

using namespace softblk;
using namespace softblk::test;

namespace {

std::atomic<uint64_t> g_inner_writes{0};
std::atomic<uint64_t> g_inner_flushes{0};

class async_queue final : public target_queue {
public:
    async_queue(memory_store& store, completion_sink& sink) : _store(store), _sink(sink) {}

    void submit(io_request& r) override
    {
        r.next = nullptr;
        (_tail != nullptr ? _tail->next : _head) = &r;
        _tail = &r;
    }

    unsigned poll() override
    {
        io_request* list = _head;
        _head = _tail = nullptr;
        unsigned n = 0;
        while (list != nullptr) {
            io_request* r = list;
            list = list->next;
            int result = 0;
            switch (r->op) {
            case io_op::read:
                _store.read(r->offset, r->buffer, r->length);
                result = static_cast<int>(r->length);
                break;
            case io_op::write:
                result = _store.write(r->offset, r->buffer, r->length) < 0
                             ? -ENOSPC
                             : static_cast<int>(r->length);
                g_inner_writes.fetch_add(1);
                break;
            case io_op::flush:
                g_inner_flushes.fetch_add(1);
                break;
            default:
                result = -EOPNOTSUPP;
            }
            _sink.complete(*r, result);
            ++n;
        }
        return n;
    }

    bool busy() const override { return _head != nullptr; }
    uint64_t next_wakeup_ns() const override { return _head != nullptr ? 0 : UINT64_MAX; }

private:
    memory_store& _store;
    completion_sink& _sink;
    io_request* _head = nullptr;
    io_request* _tail = nullptr;
};

// Its data outlives power cycles, as a target's must (target_data).
struct async_data final : target_data {
    std::unique_ptr<memory_store> store =
        memory_store::create({.capacity_bytes = 8 << 20, .block_size = 4096});
};

// The last async_target's watch_capacity callback: the tests resize the
// device through it, as the rbd target does when its image is resized.
std::function<void(uint64_t)> g_resized;

class async_target final : public target {
public:
    explicit async_target(std::shared_ptr<async_data> data) : _data(std::move(data))
    {
        _limits.capacity_bytes = 8 << 20;
        _limits.logical_block_size = 4096;
        _limits.physical_block_size = 4096;
        _limits.max_transfer_bytes = 128 << 10;
    }
    const block_limits& limits() const override { return _limits; }
    result<std::unique_ptr<target_queue>> open_queue(unsigned, completion_sink& sink) override
    {
        return std::make_unique<async_queue>(*_data->store, sink);
    }
    void watch_capacity(std::function<void(uint64_t)> resized) override
    {
        g_resized = std::move(resized);
    }

private:
    std::shared_ptr<async_data> _data;
    block_limits _limits;
};

[[maybe_unused]] const bool k_registered = register_target_type(target_type{
    .name = "async_test",
    .description = "test target that completes only from poll()",
    .options = {},
    .create = [](const option_set&) -> result<std::unique_ptr<target>> {
        return std::make_unique<async_target>(std::make_shared<async_data>());
    },
    .submit_queues = {},
    .power_on = [](option_set&, std::shared_ptr<target_data>& kept,
                   std::vector<std::string>&) -> result<std::unique_ptr<target>> {
        auto data = std::dynamic_pointer_cast<async_data>(kept);
        if (!data) {
            data = std::make_shared<async_data>();
            kept = data;
        }
        return std::make_unique<async_target>(data);
    },
});

std::unique_ptr<device> make_async(std::vector<std::string> options)
{
    auto d = device::create("async", "async_test", options);
    EXPECT_TRUE(d.has_value()) << (d ? "" : d.error().message);
    return d ? std::move(*d) : nullptr;
}

TEST(cache_over_async_target, write_back_flush_and_power_cycle)
{
    auto d = make_async({"cache_size=1", "irqmode=0"});
    ASSERT_TRUE(d);
    EXPECT_TRUE(d->limits().volatile_write_cache);
    const uint64_t writes_before = g_inner_writes.load();
    // 4 MiB through a 1 MiB cache: writes must wait for write-back that
    // completes only when the queue is polled.
    auto data = pattern(4 << 20, 21);
    for (uint32_t off = 0; off < (4u << 20); off += 64 << 10) {
        completion c = run_one(d->queue(0), io_op::write, off, 64 << 10, data.data() + off);
        ASSERT_EQ(c.result, 64 << 10) << off;
    }
    EXPECT_GE(g_inner_writes.load() - writes_before, 768u);  // at least 3 MiB written back
    std::vector<char> back(4 << 20);
    for (uint32_t off = 0; off < (4u << 20); off += 64 << 10) {
        ASSERT_EQ(run_one(d->queue(0), io_op::read, off, 64 << 10, back.data() + off).result,
                  64 << 10);
    }
    EXPECT_EQ(back, data);
    const uint64_t flushes_before = g_inner_flushes.load();
    ASSERT_EQ(run_one(d->queue(0), io_op::flush, 0, 0, nullptr).result, 0);
    EXPECT_EQ(g_inner_flushes.load() - flushes_before, 1u);  // passed on after the write-back
    EXPECT_EQ(describe(*d)["target"]["cache"]["unflushed_pages"], 0);
    ASSERT_TRUE(d->set_power(false));
    ASSERT_TRUE(d->set_power(true));
    std::fill(back.begin(), back.end(), 0);
    ASSERT_EQ(d->execute(io_op::read, 0, 4 << 20, back.data()), 4 << 20);
    EXPECT_EQ(back, data);
}

TEST(cache_over_async_target, fua_bypasses_and_is_completed_by_the_inner_target)
{
    auto d = make_async({"cache_size=1", "irqmode=0"});
    ASSERT_TRUE(d);
    auto data = pattern(4096, 22);
    const uint64_t writes_before = g_inner_writes.load();
    ASSERT_EQ(run_one(d->queue(0), io_op::write, 8192, 4096, data.data(), k_io_fua).result, 4096);
    EXPECT_EQ(g_inner_writes.load() - writes_before, 1u);
    ASSERT_TRUE(d->set_power(false));
    ASSERT_TRUE(d->set_power(true));
    std::vector<char> b(4096);
    ASSERT_EQ(d->execute(io_op::read, 8192, 4096, b.data()), 4096);
    EXPECT_EQ(b, data);
}

TEST(badblocks_over_async_target, partial_io_completes_from_poll)
{
    auto d = make_async({"badblocks=+16-16", "badblocks_partial_io=1", "irqmode=0"});
    ASSERT_TRUE(d);
    auto data = pattern(16384, 23);
    completion c = run_one(d->queue(0), io_op::write, 0, 16384, data.data());
    EXPECT_EQ(c.result, -EIO);
    EXPECT_EQ(c.transferred, 8192u);
}

TEST(mbps_over_async_target, throttled_requests_complete)
{
    // The bucket holds one tick (20 ms, 2 MiB at 100 MiB/s) and refills on
    // a grid of ticks that starts when the device is made: timed from
    // before that, 4 MiB take at least one tick (timed from after it, a
    // slow setup under a sanitizer once left 16.9 ms).
    const uint64_t start = now_ns();
    auto d = make_async({"mbps=100", "irqmode=0"});
    ASSERT_TRUE(d);
    std::vector<char> buf(128 << 10, 'm');
    for (int i = 0; i < 32; ++i) {  // 4 MiB at 100 MiB/s
        ASSERT_EQ(
            run_one(d->queue(0), io_op::write, uint64_t(i) << 17, 128 << 10, buf.data()).result,
            128 << 10);
    }
    EXPECT_GE(now_ns() - start, 20'000'000u);
}

TEST(resize, the_target_changes_the_capacity_listeners_and_the_range_check)
{
    // Through a decorator (the cache), which passes the callback on.
    g_resized = nullptr;
    auto d = make_async({"cache_size=1", "irqmode=0"});
    ASSERT_TRUE(d);
    ASSERT_TRUE(g_resized) << "the core gave the target no capacity callback";
    std::vector<uint64_t> seen;
    const uint64_t handle =
        d->add_capacity_listener([&](uint64_t bytes) { seen.push_back(bytes); });
    std::vector<char> buf(4096, 'r');
    ASSERT_EQ(run_one(d->queue(0), io_op::write, 6 << 20, 4096, buf.data()).result, 4096);

    g_resized(4 << 20);  // shrunk
    EXPECT_EQ(current_capacity(d->limits()), 4u << 20);
    EXPECT_EQ(seen, (std::vector<uint64_t>{4 << 20}));
    EXPECT_EQ(run_one(d->queue(0), io_op::write, 6 << 20, 4096, buf.data()).result, -EIO);
    EXPECT_EQ(run_one(d->queue(0), io_op::read, (4 << 20) - 4096, 8192, buf.data()).result, -EIO);
    EXPECT_EQ(run_one(d->queue(0), io_op::read, (4 << 20) - 4096, 4096, buf.data()).result, 4096);
    EXPECT_EQ(d->execute(io_op::read, 4 << 20, 4096, buf.data()), -EIO);

    g_resized((4 << 20) + 100);  // within a block: rounded down, no change
    EXPECT_EQ(seen.size(), 1u);
    g_resized(8 << 20);  // grown back: the data beyond the old end is there
    EXPECT_EQ(seen.back(), 8u << 20);
    std::fill(buf.begin(), buf.end(), 0);
    ASSERT_EQ(run_one(d->queue(0), io_op::read, 6 << 20, 4096, buf.data()).result, 4096);
    EXPECT_EQ(buf, std::vector<char>(4096, 'r'));

    d->remove_capacity_listener(handle);
    g_resized(2 << 20);
    EXPECT_EQ(seen.size(), 2u) << "a removed listener was called";
    EXPECT_EQ(describe(*d)["capacity_bytes"], 2u << 20);
    EXPECT_EQ(describe(*d)["resizes"], 3);
}

}  // namespace
