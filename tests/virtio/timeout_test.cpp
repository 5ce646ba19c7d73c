// softblk's virtio-blk driver (target "virtio") against back ends that do
// not play along (tests/virtio/fake_backend.hpp): connect_timeout bounds
// connecting and the whole handshake, however slowly the back end
// answers; a silent back end, a path that is no socket and a relative path
// get errors that say so, at once where waiting cannot help.
#include "fake_backend.hpp"
#include "virtio_test_util.hpp"

#include <fstream>

#include <softblk/support/clock.hpp>

using namespace softblk;
using namespace softblk::test;

namespace {

constexpr uint64_t k_ms = 1'000'000;

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

TEST(virtio_connect, connect_timeout_bounds_the_whole_handshake)
{
    temp_dir dir;
    // About 14 replies at 300 ms each: 4.2 s in all, each within 1000 ms.
    fake_backend fake(dir.path + "/slow.sock", [](unsigned) {
        fake_behaviour b;
        b.reply_delay_ms = 300;
        return b;
    });
    ASSERT_TRUE(fake.ok());
    auto [message, took] =
        refused({"path=" + dir.path + "/slow.sock", "poll_queues=0", "connect_timeout=1000"});
    EXPECT_NE(message.find("within connect_timeout=1000 ms"), std::string::npos) << message;
    EXPECT_LT(took, 1700 * k_ms) << message;
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
    EXPECT_LT(took, 1000 * k_ms);
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
