// Control submissions (io_queue::post / call, device::execute_control): a
// second thread puts bios on a queue that an owner thread drives from a
// loop of its own, woken through the function it attached with. The bios
// run on the owner's thread, behind what the owner submitted before; with
// no owner they run on the caller's thread; an owner leaves only once no
// posted bio waits. The last case runs owners and posters at full speed,
// for ThreadSanitizer (label tsan).
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <poll.h>
#include <sys/eventfd.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include <softblk/device.hpp>
#include <softblk/target.hpp>

using namespace softblk;

namespace {

// "post_test" target: 1 MiB of memory, 4 KiB blocks, completes at once in
// submission order (the core's irqmode decides when callbacks run).
constexpr uint64_t k_post_capacity = 1 << 20;
constexpr uint32_t k_post_block = 4096;

class memory_queue final : public target_queue {
public:
    memory_queue(completion_sink& sink, std::vector<char>& data) : _sink(sink), _data(data) {}
    void submit(io_request& r) override
    {
        if (r.op == io_op::write) {
            std::memcpy(_data.data() + r.offset, r.buffer, r.length);
        } else if (r.op == io_op::read) {
            std::memcpy(r.buffer, _data.data() + r.offset, r.length);
        }
        _sink.complete(r, static_cast<int>(r.length));
    }

private:
    completion_sink& _sink;
    std::vector<char>& _data;
};

class memory_target final : public target {
public:
    memory_target() : _data(k_post_capacity)
    {
        _limits.capacity_bytes = k_post_capacity;
        _limits.logical_block_size = k_post_block;
        _limits.physical_block_size = k_post_block;
        _limits.max_transfer_bytes = 64 << 10;
    }
    const block_limits& limits() const override { return _limits; }
    result<std::unique_ptr<target_queue>> open_queue(unsigned, completion_sink& sink) override
    {
        // Queues of one device share the data: a test that uses several
        // queues keeps their blocks apart.
        return std::make_unique<memory_queue>(sink, _data);
    }

private:
    block_limits _limits;
    std::vector<char> _data;
};

[[maybe_unused]] const bool k_post_test_registered = register_target_type(target_type{
    .name = "post_test",
    .description = "test target of the core's control-submission tests",
    .options = {},
    .create = [](const option_set&) -> result<std::unique_ptr<target>> {
        return std::make_unique<memory_target>();
    },
    .submit_queues = {},
});

std::unique_ptr<device> make_post_device(std::initializer_list<const char*> opts)
{
    std::vector<std::string> args(opts.begin(), opts.end());
    auto dev = device::create("p0", "post_test", args);
    EXPECT_TRUE(dev) << (dev ? "" : dev.error().message);
    return dev ? std::move(*dev) : nullptr;
}

// An eventfd the owner's loop sleeps on (what a front end's loop has).
struct wake_fd {
    int fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    ~wake_fd() { ::close(fd); }
    void signal() const { eventfd_write(fd, 1); }
    // Sleeps until signalled or `ms` passed; clears the count.
    void sleep(int ms) const
    {
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, ms) > 0) {
            eventfd_t v;
            eventfd_read(fd, &v);
        }
    }
};

struct seen {
    std::thread::id thread;
    int status = 1;
};

void record(bio& b, int status)
{
    auto* s = static_cast<seen*>(b.user_data);
    s->thread = std::this_thread::get_id();
    s->status = status;
}

}  // namespace

TEST(post, runs_on_the_owner_behind_what_it_submitted)
{
    auto dev = make_post_device({"irqmode=1"});
    ASSERT_TRUE(dev);
    io_queue& q = dev->queue(0);
    wake_fd wake;
    std::vector<char> got(k_post_block, 0);
    seen posted;
    bio read = make_bio(io_op::read, 0, k_post_block, got.data());
    read.on_complete = record;
    read.user_data = &posted;
    std::atomic<bool> attached{false};
    std::thread::id owner_id;
    std::thread owner([&] {
        owner_id = std::this_thread::get_id();
        q.attach_owner([&] { wake.signal(); });
        attached = true;
        // Woken for the posted read: submit a write of our own first; the
        // read, taken by process(), goes behind it and sees its data.
        while (q.in_flight() == 0) {
            wake.sleep(1000);
        }
        std::vector<char> data(k_post_block, 0x5a);
        bio write = make_bio(io_op::write, 0, k_post_block, data.data());
        q.submit(write);
        while (q.in_flight() != 0) {
            q.process();
        }
        while (!q.detach_owner()) {
            q.process();
        }
    });
    while (!attached) {
        std::this_thread::yield();
    }
    q.post(read);
    owner.join();
    EXPECT_EQ(posted.status, 0);
    EXPECT_EQ(posted.thread, owner_id);
    EXPECT_EQ(got, std::vector<char>(k_post_block, 0x5a));
}

TEST(post, without_an_owner_runs_on_the_caller)
{
    auto dev = make_post_device({"irqmode=2", "completion_nsec=1000"});
    ASSERT_TRUE(dev);
    std::vector<char> data(2 * k_post_block, 0x33);
    bio write = make_bio(io_op::write, k_post_block, data.size(), data.data());
    seen s;
    write.on_complete = record;
    write.user_data = &s;
    dev->queue(0).post(write);  // completes before post returns
    EXPECT_EQ(s.status, 0);
    EXPECT_EQ(s.thread, std::this_thread::get_id());
    std::vector<char> back(2 * k_post_block);
    bio read = make_bio(io_op::read, k_post_block, back.size(), back.data());
    EXPECT_EQ(dev->execute_control(read), 0);
    EXPECT_EQ(read.transferred, back.size());
    EXPECT_EQ(back, data);
    // The core's checks apply as to any submission.
    bio beyond = make_bio(io_op::read, k_post_capacity, k_post_block, back.data());
    EXPECT_EQ(dev->execute_control(beyond), -EIO);
    ASSERT_TRUE(dev->set_power(false));
    EXPECT_EQ(dev->execute_control(read), -ENODEV);
}

TEST(post, owner_stays_until_posted_bios_are_taken)
{
    auto dev = make_post_device({"irqmode=1"});
    ASSERT_TRUE(dev);
    io_queue& q = dev->queue(0);
    wake_fd wake;
    q.attach_owner([&] { wake.signal(); });  // this thread owns the queue
    std::vector<char> buf(k_post_block);
    bio read = make_bio(io_op::read, 0, k_post_block, buf.data());
    seen s;
    read.on_complete = record;
    read.user_data = &s;
    std::thread poster([&] { q.post(read); });
    poster.join();
    wake.sleep(1000);  // woken by the post
    EXPECT_EQ(q.in_flight(), 1u);
    EXPECT_EQ(q.next_event_ns(), 0u);
    EXPECT_FALSE(q.detach_owner());
    EXPECT_EQ(s.status, 1);  // not run yet
    while (q.in_flight() != 0) {
        q.wait(1, 1'000'000'000);
    }
    EXPECT_EQ(s.status, 0);
    EXPECT_EQ(s.thread, std::this_thread::get_id());
    EXPECT_TRUE(q.detach_owner());
}

// Two owners (one per queue) run their own writes and verify reads while
// three threads call() on both queues, and the owners leave and come back
// (posts then run on the callers), all at once: every control request
// completes once with the right data.
TEST(post, concurrent_posters_and_owners_that_come_and_go)
{
    auto dev = make_post_device({"irqmode=1", "submit_queues=2"});
    ASSERT_TRUE(dev);
    ASSERT_GE(dev->queue_count(), 2u);
    constexpr unsigned k_posters = 3;
    constexpr unsigned k_calls = 1000;
    std::atomic<bool> stop{false};
    std::atomic<unsigned> owner_errors{0};
    auto owner_loop = [&](unsigned index) {
        io_queue& q = dev->queue(index);
        wake_fd wake;
        // The owner's blocks: 200 + index.
        const uint64_t offset = (200 + index) * uint64_t{k_post_block};
        std::vector<char> out(k_post_block), in(k_post_block);
        unsigned round = 0;
        while (!stop) {
            q.attach_owner([&] { wake.signal(); });
            for (unsigned i = 0; i < 50; ++i, ++round) {
                std::memset(out.data(), static_cast<int>(round & 0xff), k_post_block);
                bio w = make_bio(io_op::write, offset, k_post_block, out.data());
                bio r = make_bio(io_op::read, offset, k_post_block, in.data());
                q.submit(w);
                q.submit(r);
                while (q.in_flight() != 0) {
                    q.process();
                    wake.sleep(0);
                }
                if (in != out) {
                    ++owner_errors;
                }
            }
            while (!q.detach_owner()) {
                q.process();
            }
            std::this_thread::yield();  // posts now run on their callers
        }
    };
    std::thread owners[2] = {std::thread(owner_loop, 0), std::thread(owner_loop, 1)};
    std::atomic<unsigned> poster_errors{0};
    std::vector<std::thread> posters;
    for (unsigned p = 0; p < k_posters; ++p) {
        posters.emplace_back([&, p] {
            const uint64_t offset = p * uint64_t{k_post_block};
            std::vector<char> out(k_post_block), in(k_post_block);
            for (unsigned i = 0; i < k_calls; ++i) {
                io_queue& q = dev->queue(i % 2);
                std::memset(out.data(), static_cast<int>((p * 31 + i) & 0xff), k_post_block);
                bio w = make_bio(io_op::write, offset, k_post_block, out.data());
                bio r = make_bio(io_op::read, offset, k_post_block, in.data());
                if (q.call(w) != 0 || w.transferred != k_post_block || q.call(r) != 0 ||
                    in != out) {
                    ++poster_errors;
                }
            }
        });
    }
    for (auto& t : posters) {
        t.join();
    }
    stop = true;
    for (auto& t : owners) {
        t.join();
    }
    EXPECT_EQ(poster_errors, 0u);
    EXPECT_EQ(owner_errors, 0u);
    EXPECT_EQ(dev->queue(0).in_flight(), 0u);
    EXPECT_EQ(dev->queue(1).in_flight(), 0u);
}
