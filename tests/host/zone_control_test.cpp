// `softblk zone`'s two halves in-process: the protocol parameters, the
// daemon's run_zone_request on a null zoned=1 device (the checks before the
// core and the messages of the zone engine's errors), and blkzone's line
// format. tests/cli/zone_commands.sh runs the same through the daemon.
#include <gtest/gtest.h>

#include <cerrno>
#include <string>
#include <vector>

#include <softblk/device.hpp>

#include "zone_control.hpp"

using namespace softblk::host;
using nlohmann::json;

namespace {

constexpr uint64_t k_zone_sectors = 16384;  // 8 MiB

std::unique_ptr<softblk::device> zoned_null(std::vector<std::string> extra = {})
{
    std::vector<std::string> options{"zoned=1", "size=64", "zone_size=8", "zone_nr_conv=1",
                                     "zone_max_open=2"};
    options.insert(options.end(), extra.begin(), extra.end());
    auto dev = softblk::device::create("z", "null", options);
    EXPECT_TRUE(dev) << dev.error().message;
    return dev ? std::move(*dev) : nullptr;
}

std::string condition(softblk::device& dev, uint64_t zone)
{
    auto res = run_zone_request(dev, zone_request{.sector = zone * k_zone_sectors, .count = 1});
    EXPECT_TRUE(res) << res.error().message;
    return res ? (*res)["zones"][0]["cond_name"].get<std::string>() : "";
}

int error_of(softblk::device& dev, const zone_request& req, std::string& message)
{
    auto res = run_zone_request(dev, req);
    if (res) {
        return 0;
    }
    message = res.error().message;
    return res.error().code.value();
}

}  // namespace

TEST(zone_control, parameters_round_trip_and_errors_name_the_parameter)
{
    for (const zone_request& req :
         {zone_request{.action = zone_action::report, .sector = 16384, .count = 3},
          zone_request{.action = zone_action::finish, .sector = 0, .count = 0},
          zone_request{.action = zone_action::reset, .all = true}}) {
        auto back = parse_zone_params(zone_params(req));
        ASSERT_TRUE(back) << back.error().message;
        EXPECT_EQ(back->action, req.action);
        EXPECT_EQ(back->sector, req.sector);
        EXPECT_EQ(back->count, req.count);
        EXPECT_EQ(back->all, req.all);
    }
    auto bad = parse_zone_params(json{{"action", "explode"}});
    ASSERT_FALSE(bad);
    EXPECT_NE(bad.error().message.find("unknown zone action 'explode'"), std::string::npos);
    bad = parse_zone_params(json{{"action", "open"}, {"sector", -1}});
    ASSERT_FALSE(bad);
    EXPECT_NE(bad.error().message.find("\"sector\""), std::string::npos);
    bad = parse_zone_params(json{{"action", "open"}, {"count", uint64_t{1} << 32}});
    ASSERT_FALSE(bad);
    EXPECT_NE(bad.error().message.find("\"count\""), std::string::npos);
    bad = parse_zone_params(json{{"action", "open"}, {"all", true}});
    ASSERT_FALSE(bad);
    EXPECT_NE(bad.error().message.find("reset only"), std::string::npos);
    bad = parse_zone_params(json{{"action", "reset"}, {"all", true}, {"sector", 16384}});
    ASSERT_FALSE(bad);
    EXPECT_FALSE(parse_zone_params(json::object()));
}

TEST(zone_control, formats_zones_as_blkzone_does)
{
    EXPECT_EQ(format_zone_line(json{{"start", 0},
                                    {"len", 16384},
                                    {"cap", 16384},
                                    {"wptr", 16384},
                                    {"type", 1},
                                    {"cond", 0}}),
              "  start: 0x000000000, len 0x004000, cap 0x004000, wptr 0x000000 reset:0 "
              "non-seq:0, zcond: 0(nw) [type: 1(CONVENTIONAL)]");
    EXPECT_EQ(format_zone_line(json{{"start", 32768},
                                    {"len", 16384},
                                    {"cap", 8192},
                                    {"wptr", 32776},
                                    {"type", 2},
                                    {"cond", 2}}),
              "  start: 0x000008000, len 0x004000, cap 0x002000, wptr 0x000008 reset:0 "
              "non-seq:0, zcond: 2(oi) [type: 2(SEQ_WRITE_REQUIRED)]");
    // No write pointer (zloop's full zones): all ones minus the start.
    EXPECT_EQ(format_zone_line(json{{"start", 16384},
                                    {"len", 16384},
                                    {"cap", 16384},
                                    {"wptr", nullptr},
                                    {"type", 2},
                                    {"cond", 14}}),
              "  start: 0x000004000, len 0x004000, cap 0x004000, wptr 0xffffffffffffbfff "
              "reset:0 non-seq:0, zcond:14(fu) [type: 2(SEQ_WRITE_REQUIRED)]");
}

TEST(zone_control, reports_and_manages_zones_through_the_device)
{
    auto dev = zoned_null();
    ASSERT_TRUE(dev);
    auto all = run_zone_request(*dev, zone_request{});
    ASSERT_TRUE(all) << all.error().message;
    EXPECT_EQ((*all)["nr_zones"], 8);
    EXPECT_EQ((*all)["zone_sectors"], k_zone_sectors);
    EXPECT_EQ((*all)["zones"].size(), 8u);
    EXPECT_FALSE((*all)["more"].get<bool>());
    EXPECT_EQ((*all)["zones"][1]["wptr"], k_zone_sectors);

    // A write makes zone 1 implicitly open; its write pointer moves.
    std::vector<char> block(4096, 'x');
    ASSERT_EQ(dev->execute(softblk::io_op::write, k_zone_sectors * 512, 4096, block.data()), 4096);
    EXPECT_EQ(condition(*dev, 1), "implicit-open");
    auto one = run_zone_request(*dev, zone_request{.sector = k_zone_sectors + 3, .count = 1});
    ASSERT_TRUE(one);
    EXPECT_EQ((*one)["zones"][0]["start"], k_zone_sectors);
    EXPECT_EQ((*one)["zones"][0]["wptr"], k_zone_sectors + 8);

    ASSERT_TRUE(run_zone_request(
        *dev, zone_request{.action = zone_action::close, .sector = k_zone_sectors, .count = 1}));
    EXPECT_EQ(condition(*dev, 1), "closed");
    auto opened = run_zone_request(
        *dev, zone_request{.action = zone_action::open, .sector = 2 * k_zone_sectors, .count = 2});
    ASSERT_TRUE(opened) << opened.error().message;
    EXPECT_EQ((*opened)["zones"], json({2 * k_zone_sectors, 3 * k_zone_sectors}));
    EXPECT_EQ(condition(*dev, 2), "explicit-open");
    ASSERT_TRUE(run_zone_request(
        *dev,
        zone_request{.action = zone_action::finish, .sector = 2 * k_zone_sectors, .count = 1}));
    EXPECT_EQ(condition(*dev, 2), "full");
    // A whole-device range is a reset-all, as in the kernel.
    auto reset = run_zone_request(*dev, zone_request{.action = zone_action::reset});
    ASSERT_TRUE(reset) << reset.error().message;
    EXPECT_TRUE((*reset)["all"].get<bool>());
    for (uint64_t z = 1; z < 4; ++z) {
        EXPECT_EQ(condition(*dev, z), "empty") << "zone " << z;
    }
}

TEST(zone_control, errors_name_the_device_the_zone_and_the_limit)
{
    auto dev = zoned_null();
    ASSERT_TRUE(dev);
    std::string msg;
    EXPECT_EQ(error_of(*dev, {.action = zone_action::open, .sector = 100}, msg), EINVAL);
    EXPECT_NE(msg.find("sector 100 is not the start of a zone"), std::string::npos) << msg;
    EXPECT_EQ(error_of(*dev, {.action = zone_action::report, .sector = 8 * k_zone_sectors}, msg),
              EINVAL);
    EXPECT_NE(msg.find("beyond the device's end (131072 sectors"), std::string::npos) << msg;
    EXPECT_EQ(error_of(*dev, {.action = zone_action::finish, .sector = 0, .count = 1}, msg), EIO);
    EXPECT_NE(msg.find("(zone 0, conventional)"), std::string::npos) << msg;

    // The open limit: null_blk's ETOOMANYREFS, after the zones before it.
    EXPECT_EQ(
        error_of(*dev, {.action = zone_action::open, .sector = k_zone_sectors, .count = 3}, msg),
        ETOOMANYREFS);
    EXPECT_NE(msg.find("zone open of the zone at sector 49152 (zone 3, empty)"), std::string::npos)
        << msg;
    EXPECT_NE(msg.find("max_open_zones=2"), std::string::npos) << msg;
    EXPECT_NE(msg.find("(2 zones before it done)"), std::string::npos) << msg;
    EXPECT_EQ(condition(*dev, 3), "empty");

    auto plain = softblk::device::create("p", "null", std::vector<std::string>{"size=16"});
    ASSERT_TRUE(plain);
    EXPECT_EQ(error_of(**plain, {}, msg), EOPNOTSUPP);
    EXPECT_NE(msg.find("p is not a zoned device"), std::string::npos) << msg;

    ASSERT_TRUE(dev->set_power(false));
    EXPECT_EQ(error_of(*dev, {}, msg), ENODEV);
    EXPECT_NE(msg.find("powered off"), std::string::npos) << msg;
}
