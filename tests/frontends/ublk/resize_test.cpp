// The ublk export's capacity follower (resize.hpp) on a file device whose
// `size` is written live, with a fake UPDATE_SIZE in place of the control
// ring: what it sends and when, what a kernel without UBLK_F_UPDATE_SIZE
// gets (nothing, and one line in the log), and what describe() reports.
#include "resize.hpp"

#include <cerrno>
#include <cstdlib>
#include <fcntl.h>
#include <filesystem>
#include <gtest/gtest.h>
#include <memory>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <sstream>
#include <unistd.h>
#include <vector>

#include <softblk/device.hpp>

namespace softblk::ublk {
namespace {

class resize_test : public ::testing::Test {
protected:
    void SetUp() override
    {
        char tmpl[] = "/tmp/softblk-ublk-resize-XXXXXX";
        _dir = ::mkdtemp(tmpl);
        auto d = device::create("r0", "file",
                                std::vector<std::string>{"path=" + _dir + "/img", "size=8M",
                                                         "create=1", "buffered_io=1"});
        ASSERT_TRUE(d) << d.error().message;
        _dev = std::move(*d);
        // The follower's log lines, to count them.
        _saved_logger = spdlog::default_logger();
        auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(_log);
        spdlog::set_default_logger(std::make_shared<spdlog::logger>("resize_test", sink));
    }
    void TearDown() override
    {
        spdlog::set_default_logger(_saved_logger);
        _dev.reset();
        std::filesystem::remove_all(_dir);
    }

    // A follower whose UPDATE_SIZE records the sectors and answers `_answer`.
    std::unique_ptr<capacity_follower> follow(bool can_update, std::optional<uint64_t> kernel_bytes)
    {
        capacity_follower::config cfg{.device_name = "r0",
                                      .block_path = "/dev/ublkb7",
                                      .can_update = can_update,
                                      .kernel_release = "6.12.0-test",
                                      .kernel_bytes = kernel_bytes};
        return std::make_unique<capacity_follower>(*_dev, cfg, [this](uint64_t sectors) {
            _sent.push_back(sectors);
            return _answer;
        });
    }
    nlohmann::json describe(const capacity_follower& f)
    {
        nlohmann::json j;
        f.describe(j);
        return j;
    }
    size_t log_count(const std::string& text) const
    {
        const std::string all = _log.str();
        size_t n = 0;
        for (size_t at = all.find(text); at != std::string::npos; at = all.find(text, at + 1)) {
            ++n;
        }
        return n;
    }

    std::string _dir;
    std::unique_ptr<device> _dev;
    std::vector<uint64_t> _sent;
    result<void> _answer;
    std::ostringstream _log;
    std::shared_ptr<spdlog::logger> _saved_logger;
};

TEST_F(resize_test, sends_update_size_in_sectors_on_every_change)
{
    auto f = follow(true, 8 * k_mib);
    EXPECT_TRUE(_sent.empty()) << "the disk already has the device's size";
    ASSERT_TRUE(_dev->set_option("size", "16M"));
    ASSERT_TRUE(_dev->set_option("size", "4M"));  // shrinking: the kernel takes it as well
    EXPECT_EQ(_sent, (std::vector<uint64_t>{16 * k_mib / 512, 4 * k_mib / 512}));
    const auto j = describe(*f);
    EXPECT_EQ(j["kernel_capacity_bytes"], 4 * k_mib);
    EXPECT_EQ(j["resize"], "UPDATE_SIZE");
    EXPECT_EQ(j["resizes"], 2);
    EXPECT_FALSE(j.contains("resize_error"));
}

TEST_F(resize_test, a_change_before_the_listener_and_a_recovered_disk_are_sent_at_once)
{
    ASSERT_TRUE(_dev->set_option("size", "12M"));  // after SET_PARAMS said 8M
    auto f = follow(true, 8 * k_mib);
    EXPECT_EQ(_sent, (std::vector<uint64_t>{12 * k_mib / 512}));
    f.reset();
    _sent.clear();
    // Recovered: the size the dead daemon left is unknown, so it is sent.
    f = follow(true, std::nullopt);
    EXPECT_EQ(_sent, (std::vector<uint64_t>{12 * k_mib / 512}));
    EXPECT_EQ(describe(*f)["kernel_capacity_bytes"], 12 * k_mib);
}

TEST_F(resize_test, a_failed_update_is_reported_and_the_next_change_tries_again)
{
    auto f = follow(true, 8 * k_mib);
    _answer = make_error(ENODEV, "ublk UPDATE_SIZE on device 7 (32768 sectors): No such device");
    ASSERT_TRUE(_dev->set_option("size", "16M")) << "the device resizes whatever the kernel says";
    auto j = describe(*f);
    EXPECT_EQ(j["kernel_capacity_bytes"], 8 * k_mib);
    EXPECT_EQ(j["resizes"], 0);
    EXPECT_NE(j["resize_error"].get<std::string>().find("No such device"), std::string::npos);
    EXPECT_EQ(log_count("/dev/ublkb7 keeps 8388608 bytes"), 1u) << _log.str();
    _answer = {};
    ASSERT_TRUE(_dev->set_option("size", "20M"));
    j = describe(*f);
    EXPECT_EQ(j["kernel_capacity_bytes"], 20 * k_mib);
    EXPECT_FALSE(j.contains("resize_error"));
}

TEST_F(resize_test, without_update_size_the_disk_keeps_its_size_and_the_log_says_why_once)
{
    auto f = follow(false, 8 * k_mib);
    ASSERT_TRUE(_dev->set_option("size", "16M"));
    ASSERT_TRUE(_dev->set_option("size", "24M"));
    EXPECT_TRUE(_sent.empty());
    EXPECT_EQ(log_count("lacks UBLK_F_UPDATE_SIZE"), 1u) << _log.str();
    EXPECT_EQ(log_count("this kernel (6.12.0-test)"), 1u) << _log.str();
    const auto j = describe(*f);
    EXPECT_EQ(j["kernel_capacity_bytes"], 8 * k_mib);
    EXPECT_EQ(j["resize"], "none");
    // What `softblk list` shows: the device's own size.
    nlohmann::json dev;
    _dev->describe(dev);
    EXPECT_EQ(dev["capacity_bytes"], 24 * k_mib);
}

TEST_F(resize_test, a_destroyed_follower_sends_nothing)
{
    auto f = follow(true, 8 * k_mib);
    f.reset();
    ASSERT_TRUE(_dev->set_option("size", "16M"));
    EXPECT_TRUE(_sent.empty());
}

}  // namespace
}  // namespace softblk::ublk
