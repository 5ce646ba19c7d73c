// The core's queues through the consumer API, on a small target defined
// here: completion modes, tags, validation, timeouts, execute().
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <vector>

#include <softblk/device.hpp>
#include <softblk/external_data.hpp>
#include <softblk/target.hpp>

#include <nlohmann/json.hpp>

using namespace softblk;

namespace {

// "core_test" target: 1 MiB, 512-byte blocks, max transfer 64 KiB.
// Reads fill the buffer with the block number's low byte; a request at
// offset 0x80000 (the "black hole") is never completed by the target.
constexpr uint64_t k_black_hole = 0x80000;

class test_queue final : public target_queue {
public:
    explicit test_queue(completion_sink& sink) : _sink(sink) {}
    void submit(io_request& r) override
    {
        if (r.op == io_op::read && r.offset == k_black_hole) {
            _held = &r;
            return;
        }
        if (r.op == io_op::read) {
            for (uint32_t done = 0; done < r.length; done += 512) {
                std::memset(static_cast<char*>(r.buffer) + done,
                            static_cast<int>(((r.offset + done) / 512) & 0xff), 512);
            }
        }
        _sink.complete(r, static_cast<int>(r.length));
    }
    bool timed_out(io_request& r) override
    {
        if (_held == &r) {
            _held = nullptr;
        }
        return true;
    }

private:
    completion_sink& _sink;
    io_request* _held = nullptr;
};

class test_target final : public target {
public:
    explicit test_target(bool kernel_buffers = false, bool read_only = false)
        : _kernel_buffers(kernel_buffers)
    {
        _limits.read_only = read_only;
        _limits.capacity_bytes = 1 << 20;
        _limits.logical_block_size = 512;
        _limits.physical_block_size = 512;
        _limits.max_transfer_bytes = 64 << 10;
        _limits.max_discard_bytes = 0;
        _limits.max_write_zeroes_bytes = 1 << 20;
    }
    const block_limits& limits() const override { return _limits; }
    external_data_support takes_external_data() const override
    {
        return {.kernel_buffers = _kernel_buffers};
    }
    result<std::unique_ptr<target_queue>> open_queue(unsigned, completion_sink& sink) override
    {
        return std::make_unique<test_queue>(sink);
    }

private:
    block_limits _limits;
    bool _kernel_buffers;
};

const bool k_registered = register_target_type(target_type{
    .name = "core_test",
    .description = "test target of the core's unit tests",
    .options = {},
    .create = [](const option_set&) -> result<std::unique_ptr<target>> {
        return std::make_unique<test_target>();
    },
    .submit_queues = {},
});

// The same, taking writes whose data is in the kernel (kernel_buffer).
const bool k_registered_kernel_buffers = register_target_type(target_type{
    .name = "core_test_kernel_buffers",
    .description = "test target of the core's unit tests that takes kernel buffers",
    .options = {},
    .create = [](const option_set&) -> result<std::unique_ptr<target>> {
        return std::make_unique<test_target>(true);
    },
    .submit_queues = {},
});

// The same, read-only.
const bool k_registered_read_only = register_target_type(target_type{
    .name = "core_test_read_only",
    .description = "read-only test target of the core's unit tests",
    .options = {},
    .create = [](const option_set&) -> result<std::unique_ptr<target>> {
        return std::make_unique<test_target>(false, true);
    },
    .submit_queues = {},
});

std::unique_ptr<device> make(std::initializer_list<const char*> opts, const char* name = "t0",
                             const char* type = "core_test")
{
    std::vector<std::string> args(opts.begin(), opts.end());
    auto dev = device::create(name, type, args);
    EXPECT_TRUE(dev) << (dev ? "" : dev.error().message);
    return dev ? std::move(*dev) : nullptr;
}

struct counter {
    int calls = 0;
    int last = 0;
};

void count_cb(io_request& r, int res)
{
    auto* c = static_cast<counter*>(r.user_data);
    ++c->calls;
    c->last = res;
}

io_request* prepare(io_queue& q, counter& c, io_op op, uint64_t off, uint32_t len, void* buf)
{
    io_request* r = q.get_request();
    if (r == nullptr) {
        return nullptr;
    }
    r->op = op;
    r->offset = off;
    r->length = len;
    r->buffer = buf;
    r->on_complete = count_cb;
    r->user_data = &c;
    return r;
}

}  // namespace

TEST(queue, registered)
{
    EXPECT_TRUE(k_registered);
    EXPECT_TRUE(k_registered_kernel_buffers);
}

TEST(queue, inline_mode_completes_inside_submit)
{
    auto dev = make({"irqmode=0", "poll_queues=0"});
    ASSERT_TRUE(dev);
    std::vector<char> buf(4096);
    counter c;
    io_queue& q = dev->queue(0);
    q.submit(*prepare(q, c, io_op::read, 4096, 4096, buf.data()));
    EXPECT_EQ(c.calls, 1);
    EXPECT_EQ(c.last, 4096);
    EXPECT_EQ(buf[0], 8);
    EXPECT_EQ(q.in_flight(), 0u);
}

TEST(queue, deferred_mode_completes_in_process)
{
    auto dev = make({"irqmode=1"});
    ASSERT_TRUE(dev);
    std::vector<char> buf(512);
    counter c;
    io_queue& q = dev->queue(0);
    q.submit(*prepare(q, c, io_op::read, 0, 512, buf.data()));
    EXPECT_EQ(c.calls, 0);
    EXPECT_EQ(q.in_flight(), 1u);
    EXPECT_EQ(q.process(), 1u);
    EXPECT_EQ(c.calls, 1);
}

TEST(queue, timer_mode_waits_completion_nsec)
{
    auto dev = make({"irqmode=2", "completion_nsec=2000000"});
    ASSERT_TRUE(dev);
    std::vector<char> buf(512);
    io_queue& q = dev->queue(0);
    for (int i = 0; i < 5; ++i) {
        counter c;
        auto t0 = std::chrono::steady_clock::now();
        q.submit(*prepare(q, c, io_op::read, 0, 512, buf.data()));
        EXPECT_EQ(q.process(), 0u);
        q.wait(1);
        const auto us = std::chrono::duration_cast<std::chrono::microseconds>(
                            std::chrono::steady_clock::now() - t0)
                            .count();
        EXPECT_EQ(c.calls, 1);
        EXPECT_GE(us, 2000);
        EXPECT_LT(us, 50000);
    }
}

TEST(queue, timer_mode_keeps_requests_concurrent)
{
    // 32 requests of 5 ms each take about 5 ms together, not 160 ms.
    auto dev = make({"irqmode=2", "completion_nsec=5000000", "hw_queue_depth=32"});
    ASSERT_TRUE(dev);
    std::vector<char> buf(512);
    io_queue& q = dev->queue(0);
    counter c;
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 32; ++i) {
        q.submit(*prepare(q, c, io_op::read, 0, 512, buf.data()));
    }
    q.wait(32);
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
            .count();
    EXPECT_EQ(c.calls, 32);
    EXPECT_GE(ms, 5);
    EXPECT_LT(ms, 80);
}

TEST(queue, poll_queue_completes_only_when_polled)
{
    auto dev = make({"irqmode=0", "submit_queues=2", "poll_queues=1"});
    ASSERT_TRUE(dev);
    ASSERT_EQ(dev->queue_count(), 3u);
    io_queue& q = dev->queue(2);
    EXPECT_TRUE(q.is_poll_queue());
    EXPECT_FALSE(dev->queue(1).is_poll_queue());
    std::vector<char> buf(512);
    counter c;
    q.submit(*prepare(q, c, io_op::read, 0, 512, buf.data()));
    EXPECT_EQ(c.calls, 0);
    EXPECT_EQ(q.process(), 1u);
    EXPECT_EQ(c.calls, 1);
}

TEST(queue, depth_limits_tags_and_completion_frees_them)
{
    auto dev = make({"hw_queue_depth=4", "irqmode=1"});
    ASSERT_TRUE(dev);
    io_queue& q = dev->queue(0);
    std::vector<char> buf(512);
    counter c;
    std::vector<io_request*> reqs;
    for (int i = 0; i < 4; ++i) {
        reqs.push_back(prepare(q, c, io_op::read, 0, 512, buf.data()));
        ASSERT_NE(reqs.back(), nullptr);
    }
    EXPECT_EQ(q.get_request(), nullptr);
    q.put_request(*reqs[3]);
    reqs.pop_back();
    for (auto* r : reqs) {
        q.submit(*r);
    }
    EXPECT_EQ(q.get_request() != nullptr, true);  // the returned one
    EXPECT_EQ(q.get_request(), nullptr);
    q.wait(3);
    EXPECT_EQ(c.calls, 3);
    int free_tags = 0;
    while (q.get_request() != nullptr) {
        ++free_tags;
    }
    EXPECT_EQ(free_tags, 3);
}

namespace {
struct chain {
    io_queue* q;
    int left;
};
void resubmit_cb(io_request& r, int)
{
    auto* ch = static_cast<chain*>(r.user_data);
    if (--ch->left > 0) {
        ch->q->submit(r);
    }
}
}  // namespace

TEST(queue, resubmitting_from_the_callback_does_not_recurse)
{
    auto dev = make({"irqmode=0", "hw_queue_depth=1"});
    ASSERT_TRUE(dev);
    io_queue& q = dev->queue(0);
    std::vector<char> buf(512);
    chain ch{&q, 1'000'000};
    io_request* r = q.get_request();
    r->op = io_op::read;
    r->length = 512;
    r->buffer = buf.data();
    r->on_complete = resubmit_cb;
    r->user_data = &ch;
    q.submit(*r);
    EXPECT_EQ(ch.left, 0);
    EXPECT_EQ(q.in_flight(), 0u);
    EXPECT_NE(q.get_request(), nullptr);
    EXPECT_EQ(q.stats().completed, 1'000'000u);
}

TEST(queue, validation_errors)
{
    auto dev = make({"irqmode=0"});
    ASSERT_TRUE(dev);
    io_queue& q = dev->queue(0);
    std::vector<char> buf(128 << 10);
    struct {
        io_op op;
        uint64_t off;
        uint32_t len;
        int expect;
    } cases[] = {
        {io_op::read, 100, 512, -EINVAL},            // misaligned offset
        {io_op::read, 0, 100, -EINVAL},              // misaligned length
        {io_op::read, (1 << 20) - 512, 1024, -EIO},  // beyond the end
        {io_op::read, 0, 128 << 10, -EINVAL},        // above max transfer
        {io_op::discard, 0, 512, -EOPNOTSUPP},       // not supported by this target
        {io_op::zone_reset, 0, 512, -EOPNOTSUPP},    // not zoned
        {io_op::read, 0, 0, -EINVAL},                // empty
        {io_op::write_zeroes, 0, 1 << 20, 1 << 20},  // fine
        {io_op::flush, 0, 0, 0},                     // fine
    };
    for (const auto& tc : cases) {
        counter c;
        q.submit(*prepare(q, c, tc.op, tc.off, tc.len, buf.data()));
        EXPECT_EQ(c.calls, 1);
        EXPECT_EQ(c.last, tc.expect) << to_string(tc.op) << " " << tc.off << " " << tc.len;
    }
    EXPECT_EQ(q.stats().errors, 7u);
}

// Which error a request gets when several apply depends on the op (the
// checks read src/core/op_properties.hpp): a request straight to a queue
// is checked for its data before the device's read-only state when it is
// a read or write, after it for discard and write zeroes; a bio meets the
// block layer's read-only check before anything else.
TEST(queue, read_only_errors_in_the_order_of_each_op)
{
    auto dev = make({"irqmode=0"}, "ro0", "core_test_read_only");
    ASSERT_TRUE(dev);
    io_queue& q = dev->queue(0);
    std::vector<char> buf(4096);
    struct {
        io_op op;
        uint32_t len;
        int expect;
    } requests[] = {
        {io_op::read, 4096, 4096},           {io_op::write, 4096, -EPERM},
        {io_op::write, 0, -EINVAL},           // data before read-only
        {io_op::discard, 4096, -EOPNOTSUPP},  // the target has none
        {io_op::write_zeroes, 0, -EPERM},     // read-only before length
        {io_op::write_zeroes, 4096, -EPERM}, {io_op::zone_reset, 0, -EOPNOTSUPP},  // not zoned
        {io_op::report_extents, 0, -EINVAL}, {io_op::flush, 0, 0},
    };
    for (const auto& tc : requests) {
        counter c;
        q.submit(*prepare(q, c, tc.op, 0, tc.len, buf.data()));
        EXPECT_EQ(c.calls, 1);
        EXPECT_EQ(c.last, tc.expect) << "request " << to_string(tc.op) << " " << tc.len;
    }
    const struct {
        io_op op;
        uint64_t len;
        int expect;
    } bios[] = {
        {io_op::read, 4096, 0},
        {io_op::write, 0, -EPERM},       // read-only before anything
        {io_op::discard, 4096, -EPERM},  // before "no discard"
        {io_op::zone_reset, 0, -EPERM},  // before "not zoned"
        {io_op::write_zeroes, 0, -EPERM},
        {io_op::report_zones, 0, -EOPNOTSUPP},
        {io_op::flush, 0, 0},
    };
    for (const auto& tc : bios) {
        bio b = make_bio(tc.op, 0, tc.len, buf.data());
        b.report_capacity = 4;
        EXPECT_EQ(dev->execute(b), tc.expect) << "bio " << to_string(tc.op) << " " << tc.len;
    }
}

TEST(queue, kernel_data_only_for_writes_on_devices_that_take_it)
{
    const external_data kb{.where = external_data::place::kernel};
    const external_data window{.where = external_data::place::window};
    // The data in the kernel unless `data` says where else.
    auto submit = [&](device& dev, io_op op, void* buffer, const external_data* data = nullptr) {
        io_queue& q = dev.queue(0);
        counter c;
        io_request* r = prepare(q, c, op, 0, 4096, buffer);
        r->external = data != nullptr ? data : &kb;
        q.submit(*r);
        EXPECT_EQ(c.calls, 1);
        return c.last;
    };
    std::vector<char> buf(4096);
    auto plain = make({"irqmode=0"});
    ASSERT_TRUE(plain);
    EXPECT_FALSE(plain->takes_external_data().kernel_buffers);
    EXPECT_EQ(submit(*plain, io_op::write, nullptr), -EINVAL) << "a target that needs the bytes";
    auto taking = make({"irqmode=0"}, "t1", "core_test_kernel_buffers");
    ASSERT_TRUE(taking);
    // What the target says reaches the consumer through the decorators
    // every device has (bad blocks, fault injection).
    EXPECT_TRUE(taking->takes_external_data().kernel_buffers);
    EXPECT_FALSE(taking->takes_external_data().data_windows);
    EXPECT_EQ(submit(*taking, io_op::write, nullptr), 4096);
    EXPECT_EQ(submit(*taking, io_op::write, nullptr, &window), -EINVAL)
        << "a data window where only kernel buffers are taken";
    EXPECT_EQ(submit(*plain, io_op::read, nullptr, &window), -EINVAL)
        << "a data window where none is taken";
    EXPECT_EQ(submit(*taking, io_op::read, nullptr), -EINVAL) << "a read into the kernel's pages";
    EXPECT_EQ(submit(*taking, io_op::write, buf.data()), -EINVAL)
        << "both a buffer and kernel data";
}

TEST(queue, timeout_completes_a_lost_request_with_etimedout)
{
    auto dev = make({"irqmode=0", "io_timeout=50"});
    ASSERT_TRUE(dev);
    io_queue& q = dev->queue(0);
    std::vector<char> buf(512);
    counter c;
    auto t0 = std::chrono::steady_clock::now();
    q.submit(*prepare(q, c, io_op::read, k_black_hole, 512, buf.data()));
    EXPECT_EQ(c.calls, 0);
    q.wait(1, 2'000'000'000);
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
            .count();
    EXPECT_EQ(c.calls, 1);
    EXPECT_EQ(c.last, -ETIMEDOUT);
    EXPECT_GE(ms, 45);
    EXPECT_LT(ms, 1000);
    EXPECT_EQ(q.stats().timeouts, 1u);
}

TEST(queue, shared_tag_bitmap_is_one_budget_for_all_queues)
{
    auto dev =
        make({"submit_queues=2", "poll_queues=0", "hw_queue_depth=3", "shared_tag_bitmap=1"});
    ASSERT_TRUE(dev);
    int got = 0;
    while (dev->queue(0).get_request() != nullptr) {
        ++got;
    }
    EXPECT_EQ(got, 3);
    EXPECT_EQ(dev->queue(1).get_request(), nullptr);
}

TEST(queue, shared_tags_span_devices)
{
    auto a = make({"poll_queues=0", "hw_queue_depth=2", "shared_tags=1"}, "a");
    auto b = make({"poll_queues=0", "hw_queue_depth=2", "shared_tags=1"}, "b");
    auto c = make({"poll_queues=0", "hw_queue_depth=2"}, "c");
    ASSERT_TRUE(a && b && c);
    EXPECT_NE(a->queue(0).get_request(), nullptr);
    EXPECT_NE(b->queue(0).get_request(), nullptr);
    EXPECT_EQ(a->queue(0).get_request(), nullptr);
    EXPECT_EQ(b->queue(0).get_request(), nullptr);
    EXPECT_NE(c->queue(0).get_request(), nullptr);  // not sharing
}

TEST(device, execute_splits_on_limits)
{
    auto dev = make({});
    ASSERT_TRUE(dev);
    std::vector<unsigned char> buf(256 << 10);
    EXPECT_EQ(dev->execute(io_op::read, 0, static_cast<uint32_t>(buf.size()), buf.data()),
              static_cast<int>(buf.size()));
    // Each 512-byte block reads as its block number's low byte.
    EXPECT_EQ(buf[0], 0);
    EXPECT_EQ(buf[512 * 200], 200);
    EXPECT_EQ(buf[(64 << 10) + 512], ((64 << 10) / 512 + 1) & 0xff);
    EXPECT_EQ(dev->queue(0).stats().completed, 4u);
    EXPECT_EQ(dev->execute(io_op::read, 100, 512, buf.data()), -EINVAL);
}

TEST(device, power_off_fails_io_and_power_on_restores)
{
    auto dev = make({});
    ASSERT_TRUE(dev);
    std::vector<char> buf(512);
    ASSERT_TRUE(dev->set_power(false));
    EXPECT_FALSE(dev->powered());
    EXPECT_EQ(dev->execute(io_op::read, 0, 512, buf.data()), -ENODEV);
    ASSERT_TRUE(dev->set_power(true));
    EXPECT_EQ(dev->execute(io_op::read, 0, 512, buf.data()), 512);
}

TEST(device, create_errors)
{
    std::vector<std::string> none;
    auto unknown = device::create("x", "no_such_type", none);
    ASSERT_FALSE(unknown);
    EXPECT_NE(unknown.error().message.find("no_such_type"), std::string::npos);
    auto bad_name = device::create("../etc", "core_test", none);
    ASSERT_FALSE(bad_name);
    std::vector<std::string> bad = {"hw_queue_depth=0"};
    auto bad_opt = device::create("x", "core_test", bad);
    ASSERT_FALSE(bad_opt);
    EXPECT_NE(bad_opt.error().message.find("hw_queue_depth"), std::string::npos);
}

TEST(device, describe_reports_counters)
{
    auto dev = make({"irqmode=0"});
    ASSERT_TRUE(dev);
    std::vector<char> buf(512);
    ASSERT_EQ(dev->execute(io_op::read, 0, 512, buf.data()), 512);
    nlohmann::json j;
    dev->describe(j);
    EXPECT_EQ(j["name"], "t0");
    EXPECT_EQ(j["capacity_bytes"], 1u << 20);
    EXPECT_EQ(j["stats"]["bytes_read"], 512u);
}
