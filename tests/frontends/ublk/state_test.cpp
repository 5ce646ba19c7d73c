// The per-device state file that `softblk recover` reads.
#include "state.hpp"

#include "abi.hpp"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <gtest/gtest.h>
#include <iterator>
#include <unistd.h>

namespace softblk::ublk {
namespace {

export_state sample()
{
    export_state s;
    s.device = "d0";
    s.dev_id = 3;
    s.flags = 0x1d8;
    s.nr_queues = 4;
    s.depth = 128;
    s.max_io_buf_bytes = 126976;
    s.daemon_pid = 4242;
    s.cookie = 0x5eed'0000'0000'0042;
    return s;
}

class temp_dir {
public:
    temp_dir()
    {
        char tmpl[] = "/tmp/softblk-ublk-state-XXXXXX";
        _path = ::mkdtemp(tmpl);
    }
    ~temp_dir() { std::filesystem::remove_all(_path); }
    const std::string& path() const { return _path; }

private:
    std::string _path;
};

TEST(ublk_state, json_round_trip)
{
    const export_state s = sample();
    auto back = state_from_json(to_json(s));
    ASSERT_TRUE(back) << back.error().message;
    EXPECT_EQ(back->device, s.device);
    EXPECT_EQ(back->dev_id, s.dev_id);
    EXPECT_EQ(back->flags, s.flags);
    EXPECT_EQ(back->nr_queues, s.nr_queues);
    EXPECT_EQ(back->depth, s.depth);
    EXPECT_EQ(back->max_io_buf_bytes, s.max_io_buf_bytes);
    EXPECT_EQ(back->daemon_pid, s.daemon_pid);
    EXPECT_EQ(back->cookie, s.cookie);
}

// The ublk export saves its own kernel facts only: the device's target
// type and options, and the export's options, are the host library's
// (RUN_DIR/devices/NAME.json), so there is one owner of saved settings.
TEST(ublk_state, holds_kernel_facts_only)
{
    const auto j = to_json(sample());
    for (const char* key : {"target_type", "device_options", "export_options"}) {
        EXPECT_FALSE(j.contains(key)) << key << " in " << j.dump();
    }
    EXPECT_EQ(j.at("version").get<int>(), k_state_version);
}

// A state file of the previous version (which also held the device's
// settings) still reads: its kernel facts are the same, the rest is left.
TEST(ublk_state, a_version_1_file_still_reads)
{
    nlohmann::json j = to_json(sample());
    j["version"] = 1;
    j["target_type"] = "null";
    j["device_options"] = {"memory_backed=1", "size=512"};
    j["export_options"] = {"recovery=reissue"};
    auto back = state_from_json(j);
    ASSERT_TRUE(back) << back.error().message;
    EXPECT_EQ(back->dev_id, 3u);
    EXPECT_EQ(back->cookie, sample().cookie);

    j["version"] = k_state_version + 1;
    auto newer = state_from_json(j);
    ASSERT_FALSE(newer);
    EXPECT_NE(newer.error().message.find("this build reads 1 to"), std::string::npos)
        << newer.error().message;
}

TEST(ublk_state, missing_or_wrong_fields_are_named)
{
    auto j = to_json(sample());
    j.erase("dev_id");
    auto r = state_from_json(j);
    ASSERT_FALSE(r);
    EXPECT_NE(r.error().message.find("dev_id"), std::string::npos);

    j = to_json(sample());
    j["version"] = 99;
    r = state_from_json(j);
    ASSERT_FALSE(r);
    EXPECT_NE(r.error().message.find("version 99"), std::string::npos);

    j = to_json(sample());
    j["depth"] = 0;
    EXPECT_FALSE(state_from_json(j));

    EXPECT_FALSE(state_from_json(nlohmann::json::array()));
}

TEST(ublk_state, file_round_trip)
{
    temp_dir dir;
    const std::string path = state_path(dir.path(), "d0");
    EXPECT_EQ(path, dir.path() + "/ublk/d0.json");
    auto missing = read_state(path);
    ASSERT_FALSE(missing);
    EXPECT_EQ(missing.error().code.value(), ENOENT);

    ASSERT_TRUE(write_state(path, sample()));
    auto back = read_state(path);
    ASSERT_TRUE(back) << back.error().message;
    EXPECT_EQ(back->dev_id, 3u);
    EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));

    std::ofstream(path) << "{not json";
    auto bad = read_state(path);
    ASSERT_FALSE(bad);
    EXPECT_EQ(bad.error().code.value(), EINVAL);
}

// The state file is written through a fresh temporary file: a link planted
// under the temporary name is replaced, never followed (docs/reliability.md,
// "Run directory"), and the file is the daemon's alone (0600).
TEST(ublk_state, a_planted_temporary_link_is_not_followed)
{
    temp_dir dir;
    const std::string path = state_path(dir.path(), "d0");
    std::filesystem::create_directories(dir.path() + "/ublk");
    const std::string victim = dir.path() + "/victim";
    std::ofstream(victim) << "keep me";
    std::filesystem::create_symlink(victim, path + ".tmp");

    ASSERT_TRUE(write_state(path, sample()));
    std::ifstream in(victim);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(text, "keep me");
    EXPECT_FALSE(std::filesystem::is_symlink(path));
    auto back = read_state(path);
    ASSERT_TRUE(back) << back.error().message;
    const auto perms = std::filesystem::status(path).permissions();
    EXPECT_EQ(perms & (std::filesystem::perms::group_all | std::filesystem::perms::others_all),
              std::filesystem::perms::none);
}

// A device id is reused as soon as the device is deleted: before a daemon
// stops, deletes or re-attaches the kernel's device dev_id, it must be the
// one its state file saved (the cookie given at ADD_DEV, or for a state
// file of an older build the pid and geometry).
TEST(ublk_state, only_the_saved_device_is_ours)
{
    const export_state s = sample();
    dev_info info{};
    info.dev_id = s.dev_id;
    info.nr_hw_queues = static_cast<uint16_t>(s.nr_queues);
    info.queue_depth = static_cast<uint16_t>(s.depth);
    info.max_io_buf_bytes = s.max_io_buf_bytes;
    info.ublksrv_pid = 999;  // recovered since by another daemon of ours
    info.ublksrv_flags = s.cookie;
    EXPECT_TRUE(is_ours(s, info));
    info.ublksrv_flags = 0;  // another server's device of the same id and shape
    info.ublksrv_pid = s.daemon_pid;
    EXPECT_FALSE(is_ours(s, info));

    export_state old = s;  // a state file without a cookie
    old.cookie = 0;
    auto back = state_from_json([&] {
        auto j = to_json(old);
        j.erase("cookie");
        return j;
    }());
    ASSERT_TRUE(back) << back.error().message;
    EXPECT_EQ(back->cookie, 0u);
    EXPECT_TRUE(is_ours(*back, info));
    info.ublksrv_pid = 1234;
    EXPECT_FALSE(is_ours(*back, info));
    info.ublksrv_pid = s.daemon_pid;
    info.queue_depth = 64;
    EXPECT_FALSE(is_ours(*back, info));

    EXPECT_NE(new_cookie(), 0u);
    EXPECT_NE(new_cookie(), new_cookie());
}

}  // namespace
}  // namespace softblk::ublk
