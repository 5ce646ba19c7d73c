// softblk's virtio-blk driver (target "virtio") against back ends that do
// not play along (tests/virtio/fake_backend.hpp): a request the back end
// never completes fails with ETIMEDOUT after io_timeout and the device
// goes on with a new connection (the other requests resubmitted, the old
// connection's memory never reused although its back end writes into it
// late; on softblk's own back end, two busy queues lose one request
// only) or, when it cannot, fails its requests with EIO; connect_timeout
// bounds connecting and the whole handshake, however slowly the back end
// answers; a silent back end, a path that is no socket and a relative path
// get errors that say so, at once where waiting cannot help.
#include "fake_backend.hpp"
#include "virtio_test_util.hpp"

#include <atomic>
#include <chrono>
#include <fstream>

#include <softblk/support/clock.hpp>

using namespace softblk;
using namespace softblk::test;

namespace {

constexpr uint64_t k_ms = 1'000'000;

struct pending_io {
    bio b;
    std::vector<uint8_t> buf;
    bool done = false;
    int status = 1;
    uint64_t submitted_ns = 0;
    uint64_t took_ns = 0;
};

void submit(io_queue& q, pending_io& io, io_op op, uint64_t offset, uint32_t length,
            uint8_t fill = 0xee)
{
    io.buf.assign(length, fill);
    io.b.op = op;
    io.b.offset = offset;
    io.b.length = length;
    io.b.buffer = io.buf.data();
    io.b.user_data = &io;
    io.b.on_complete = [](bio& b, int status) {
        auto* p = static_cast<pending_io*>(b.user_data);
        p->done = true;
        p->status = status;
        p->took_ns = monotonic_ns() - p->submitted_ns;
    };
    io.submitted_ns = monotonic_ns();
    q.submit(io.b);
}

// Drives `q` (as its owner) until `io` is done or `ns` passed.
bool wait_for(io_queue& q, const pending_io& io, uint64_t ns)
{
    const uint64_t until = monotonic_ns() + ns;
    while (!io.done && monotonic_ns() < until) {
        q.wait(1, static_cast<int64_t>(std::min<uint64_t>(until - monotonic_ns(), 50 * k_ms)));
    }
    return io.done;
}

// Drives `q` for `ns`.
void run_for(io_queue& q, uint64_t ns)
{
    const uint64_t until = monotonic_ns() + ns;
    while (monotonic_ns() < until) {
        q.wait(1, static_cast<int64_t>(until - monotonic_ns()));
    }
}

bool same_as_disk(const fake_backend& f, uint64_t offset, const std::vector<uint8_t>& data)
{
    return std::memcmp(f.disk() + offset, data.data(), data.size()) == 0;
}

nlohmann::json target_of(const device& d)
{
    nlohmann::json j;
    d.describe(j);
    return j;
}

// Fails the creation of a virtio device with `options`; returns its error
// and how long it took.
std::pair<std::string, uint64_t> refused(std::vector<std::string> options)
{
    const uint64_t t0 = monotonic_ns();
    auto d = device::create("v", "virtio", options);
    const uint64_t took = monotonic_ns() - t0;
    EXPECT_FALSE(d) << "created: " << options[0];
    return {d ? std::string() : d.error().message, took};
}

}  // namespace

TEST(virtio_timeouts, a_request_the_back_end_never_completes_fails_and_the_device_goes_on)
{
    temp_dir dir;
    pending_io r1, r2, w, back;
    std::unique_ptr<device> v;
    fake_backend* self = nullptr;
    unsigned late = 0;
    // The first connection holds every read. The second serves; before its
    // second request it returns the first connection's held reads late,
    // writing 0xab into their buffers (the first request goes to the slot
    // the timed-out read had lent).
    fake_backend fake(dir.path + "/fake.sock", [&](unsigned n) {
        fake_behaviour b;
        b.hold_reads = n == 1;
        if (n == 2) {
            b.before_request = [&](unsigned request) {
                if (request == 2) {
                    late = self->complete_held_late(0xab);
                }
            };
        }
        return b;
    });
    self = &fake;
    ASSERT_TRUE(fake.ok());
    v = make_virtio(dir.path + "/fake.sock",
                    {"poll_queues=0", "io_timeout=1000", "connect_timeout=3000"});
    ASSERT_TRUE(v);
    io_queue& q = v->queue(0);

    submit(q, r1, io_op::read, 0, 4096);
    run_for(q, 600 * k_ms);
    submit(q, r2, io_op::read, 1 << 20, 8192);
    ASSERT_TRUE(wait_for(q, r1, 5000 * k_ms)) << "the held read never ended";
    EXPECT_EQ(r1.status, -ETIMEDOUT);
    EXPECT_GE(r1.took_ns, 1000 * k_ms);
    EXPECT_LT(r1.took_ns, 2000 * k_ms) << "io_timeout=1000 and a scan every 100 ms";

    // The second read, out on the first connection when it was replaced,
    // is resubmitted on the second and completes within its own timeout.
    ASSERT_TRUE(wait_for(q, r2, 3000 * k_ms));
    EXPECT_EQ(r2.status, 0);
    EXPECT_TRUE(same_as_disk(fake, 1 << 20, r2.buf));
    EXPECT_EQ(fake.connections(), 2u);
    EXPECT_EQ(fake.held(), 2u);

    // A write into the slot the timed-out read lent: the old back end
    // writes 0xab into that read's buffer meanwhile, which is not this
    // write's.
    submit(q, w, io_op::write, 0, 4096, 0x5a);
    ASSERT_TRUE(wait_for(q, w, 3000 * k_ms));
    EXPECT_EQ(w.status, 0);
    EXPECT_EQ(late, 2u) << "the old connection's held reads were returned late";
    EXPECT_TRUE(same_as_disk(fake, 0, w.buf)) << "the late write of the old back end reached "
                                                 "the new request's data";
    submit(q, back, io_op::read, 0, 4096);
    ASSERT_TRUE(wait_for(q, back, 3000 * k_ms));
    EXPECT_EQ(back.status, 0);
    EXPECT_EQ(back.buf, w.buf);

    const nlohmann::json j = target_of(*v);
    EXPECT_EQ(j["stats"]["timeouts"], 1);
    EXPECT_EQ(j["target"]["connected"], true);
    EXPECT_EQ(j["target"]["reconnects"], 1);
    EXPECT_EQ(j["target"]["given_up"], 1);
    EXPECT_EQ(j["target"]["resubmitted"], 1);
}

TEST(virtio_timeouts, a_back_end_that_does_not_answer_again_fails_the_device)
{
    temp_dir dir;
    pending_io r1;
    std::unique_ptr<device> v;
    fake_backend fake(dir.path + "/fake.sock", [](unsigned n) {
        fake_behaviour b;
        b.hold_reads = true;
        b.silent = n > 1;
        return b;
    });
    ASSERT_TRUE(fake.ok());
    v = make_virtio(dir.path + "/fake.sock",
                    {"poll_queues=0", "io_timeout=500", "connect_timeout=500"});
    ASSERT_TRUE(v);
    io_queue& q = v->queue(0);
    submit(q, r1, io_op::read, 0, 4096);
    ASSERT_TRUE(wait_for(q, r1, 5000 * k_ms)) << "the held read never ended";
    EXPECT_EQ(r1.status, -ETIMEDOUT);
    EXPECT_LT(r1.took_ns, 1500 * k_ms);
    // The new connection's handshake gets no answer within connect_timeout:
    // the device fails.
    const uint64_t until = monotonic_ns() + 5000 * k_ms;
    while (target_of(*v)["target"]["connected"] == true && monotonic_ns() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_EQ(target_of(*v)["target"]["connected"], false);
    std::vector<uint8_t> buf(4096);
    const uint64_t t0 = monotonic_ns();
    EXPECT_EQ(v->execute(io_op::read, 0, 4096, buf.data()), -EIO);
    EXPECT_LT(monotonic_ns() - t0, 500 * k_ms);
    EXPECT_EQ(target_of(*v)["target"]["reconnects"], 0);
}

TEST(virtio_timeouts, deleting_the_device_ends_a_reconnection_at_once)
{
    temp_dir dir;
    pending_io r1;
    std::unique_ptr<device> v;
    fake_backend fake(dir.path + "/fake.sock", [](unsigned n) {
        fake_behaviour b;
        b.hold_reads = true;
        b.silent = n > 1;
        return b;
    });
    ASSERT_TRUE(fake.ok());
    v = make_virtio(dir.path + "/fake.sock",
                    {"poll_queues=0", "io_timeout=300", "connect_timeout=30000"});
    ASSERT_TRUE(v);
    io_queue& q = v->queue(0);
    submit(q, r1, io_op::read, 0, 4096);
    ASSERT_TRUE(wait_for(q, r1, 5000 * k_ms));
    EXPECT_EQ(r1.status, -ETIMEDOUT);
    for (int i = 0; i < 100 && fake.connections() < 2; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_EQ(fake.connections(), 2u) << "the driver did not connect again";
    const uint64_t t0 = monotonic_ns();
    v.reset();
    EXPECT_LT(monotonic_ns() - t0, 1000 * k_ms) << "waited for connect_timeout=30000";
}

// On softblk's own back end, whose device never completes its first
// request and gives up on it after its io_timeout (1.5 s): the driver gives
// up after its own (1 s) and connects again, which the export serves once
// it has finished the old connection's requests. Meanwhile two threads
// write and read back on two queues: exactly one request fails, all the
// others complete with the right data.
TEST(virtio_timeouts, two_busy_queues_go_on_after_a_reconnection_to_softblks_back_end)
{
    backend be("null", {"memory_backed=1", "size=64", "bs=4096", "submit_queues=2", "poll_queues=0",
                        "timeout=1,100,0,1", "io_timeout=1500"});
    ASSERT_TRUE(be.exp);
    auto v = make_virtio(
        be.socket, {"submit_queues=2", "poll_queues=0", "io_timeout=1000", "connect_timeout=5000"});
    ASSERT_TRUE(v);
    std::atomic<unsigned> timed_out{0}, other_errors{0}, mismatches{0}, done{0};
    auto worker = [&](unsigned qi) {
        io_queue& q = v->queue(qi);
        const uint64_t until = monotonic_ns() + 3500 * k_ms;
        for (uint32_t i = 0; monotonic_ns() < until; ++i) {
            const uint64_t offset = (uint64_t{qi} * 1024 + i % 1024) * 4096;
            pending_io w, r;
            submit(q, w, io_op::write, offset, 4096, static_cast<uint8_t>(i * 2 + qi));
            if (!wait_for(q, w, 5000 * k_ms)) {
                ++other_errors;
                return;
            }
            if (w.status != 0) {
                ++(w.status == -ETIMEDOUT ? timed_out : other_errors);
                continue;
            }
            submit(q, r, io_op::read, offset, 4096);
            if (!wait_for(q, r, 5000 * k_ms)) {
                ++other_errors;
                return;
            }
            if (r.status != 0) {
                ++(r.status == -ETIMEDOUT ? timed_out : other_errors);
                continue;
            }
            mismatches += r.buf != w.buf;
            ++done;
        }
    };
    std::thread other(worker, 1);
    worker(0);
    other.join();
    EXPECT_EQ(timed_out, 1u);
    EXPECT_EQ(other_errors, 0u);
    EXPECT_EQ(mismatches, 0u);
    EXPECT_GT(done, 100u);
    const nlohmann::json j = target_of(*v);
    EXPECT_EQ(j["stats"]["timeouts"], 1);
    EXPECT_EQ(j["target"]["reconnects"], 1);
    EXPECT_EQ(j["target"]["given_up"], 1);
    EXPECT_EQ(j["target"]["connected"], true);
}

TEST(virtio_connect, connect_timeout_bounds_the_whole_handshake)
{
    temp_dir dir;
    // About 14 replies at 300 ms each: 4.2 s in all, each within 1000 ms
    // (the bound below leaves room for a loaded machine under ASan).
    fake_backend fake(dir.path + "/slow.sock", [](unsigned) {
        fake_behaviour b;
        b.reply_delay_ms = 300;
        return b;
    });
    ASSERT_TRUE(fake.ok());
    auto [message, took] =
        refused({"path=" + dir.path + "/slow.sock", "poll_queues=0", "connect_timeout=1000"});
    EXPECT_NE(message.find("within connect_timeout=1000 ms"), std::string::npos) << message;
    EXPECT_LT(took, 3000 * k_ms) << message;
}

TEST(virtio_connect, a_silent_back_end_is_named_with_the_message_it_did_not_answer)
{
    temp_dir dir;
    fake_backend fake(dir.path + "/silent.sock", [](unsigned) {
        fake_behaviour b;
        b.silent = true;
        return b;
    });
    ASSERT_TRUE(fake.ok());
    auto [message, took] =
        refused({"path=" + dir.path + "/silent.sock", "poll_queues=0", "connect_timeout=300"});
    EXPECT_NE(message.find("the back end did not answer GET_FEATURES within "
                           "connect_timeout=300 ms"),
              std::string::npos)
        << message;
    EXPECT_LT(took, 2500 * k_ms);
}

TEST(virtio_connect, a_path_that_is_not_a_socket_fails_at_once)
{
    temp_dir dir;
    const std::string file = dir.path + "/disk.img";
    std::ofstream(file) << "not a socket";
    auto [message, took] = refused({"path=" + file, "poll_queues=0", "connect_timeout=5000"});
    EXPECT_NE(message.find("not a unix socket (a regular file)"), std::string::npos) << message;
    EXPECT_LT(took, 1000 * k_ms) << "waited for connect_timeout";
}

TEST(virtio_connect, a_relative_path_is_refused)
{
    auto [message, took] = refused({"path=vm0.sock", "poll_queues=0", "connect_timeout=100"});
    EXPECT_NE(message.find("path=vm0.sock: give an absolute path"), std::string::npos) << message;
}
