// The device files of `softblk apply` and its plan (src/host/device_config):
// parsing with FILE:LINE errors against the option tables, and the actions
// the plan chooses against a `list` reply (the null target; no daemon).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "device_config.hpp"

namespace {

using namespace softblk::host;
using nlohmann::json;

config_file parsed(const std::string& path, std::string_view text)
{
    config_file f;
    f.path = path;
    f.config = parse_device_config(path, text);
    f.name = f.config ? f.config->name : std::string();
    return f;
}

TEST(DeviceConfig, ParsesTheOptionsOfAdd)
{
    auto c = parse_device_config("/etc/x/nb0.conf",
                                 "# a comment\n\n type = null \nmemory_backed=1\nsize=64\n"
                                 "export=none\nbadblocks=+0-7\nbadblocks=-3-3\n");
    ASSERT_TRUE(c) << c.error().message;
    EXPECT_EQ(c->name, "nb0");
    EXPECT_EQ(c->type, "null");
    EXPECT_EQ(c->export_type, "none");
    EXPECT_EQ(c->options, (std::vector<std::string>{"memory_backed=1", "size=64", "badblocks=+0-7",
                                                    "badblocks=-3-3"}));
}

TEST(DeviceConfig, ErrorsNameFileLineAndKey)
{
    struct bad {
        std::string_view text;
        std::string_view want;
    };
    const bad cases[] = {
        {"type=null\nfrobnicate=1\n", "/d/a.conf:2: "},
        {"type=null\nsize=lots\n", "/d/a.conf:2: "},
        {"type=null\nsize=1\nsize=2\n", "/d/a.conf:3: option 'size' given again (first on line 2)"},
        {"size=64\n", "/d/a.conf:1: no type= line"},
        {"type=nosuch\n", "/d/a.conf:1: unknown target type 'nosuch'"},
        {"type=null\njust words\n", "/d/a.conf:2: 'just words' is not key=value"},
        {"type=null\nexport-opt.loop=0\n", "/d/a.conf:2: export option 'export-opt.loop' without"},
        {"type=null\nname=other\n", "/d/a.conf:2: 'name' is not an option"},
        {"type=null\ntype=null\n", "/d/a.conf:2: 'type' given again"},
    };
    for (const bad& b : cases) {
        auto c = parse_device_config("/d/a.conf", b.text);
        ASSERT_FALSE(c) << b.text;
        EXPECT_NE(c.error().message.find(b.want), std::string::npos)
            << b.text << " -> " << c.error().message;
    }
    auto unknown = parse_device_config("/d/a.conf", "type=null\nfrobnicate=1\n");
    EXPECT_NE(unknown.error().message.find("frobnicate"), std::string::npos);
    auto value = parse_device_config("/d/a.conf", "type=null\nsize=lots\n");
    EXPECT_NE(value.error().message.find("size"), std::string::npos);
    // Out of range, as add refuses it at power on.
    auto range = parse_device_config("/d/a.conf", "type=null\nio_timeout=0\n");
    ASSERT_FALSE(range);
    EXPECT_NE(range.error().message.find("/d/a.conf:2: "), std::string::npos);
    EXPECT_FALSE(parse_device_config("/d/-x.conf", "type=null\n"));
}

json listed(std::string name, std::vector<std::string> options, std::string state = "running")
{
    return {{"name", std::move(name)},
            {"type", "null"},
            {"state", std::move(state)},
            {"options", std::move(options)},
            {"export", {{"type", "none"}}}};
}

TEST(DeviceConfig, PlanCreatesUpdatesReportsAndPrunes)
{
    const std::vector<config_file> files = {
        parsed("/d/a.conf", "type=null\nsize=64\nio_timeout=5000\nexport=none\n"),
        parsed("/d/b.conf", "type=null\nsize=64\nio_timeout=7000\n"),
        parsed("/d/c.conf", "type=null\nsize=64\nblocksize=4096\n"),
        parsed("/d/d.conf", "type=null\n"),
        parsed("/d/e.conf", "type=null\nfrobnicate=1\n"),
    };
    const json running = json::array({
        listed("a", {"size=64", "power=1"}),
        listed("b", {"size=64", "power=1"}),
        listed("c", {"size=64", "blocksize=512", "power=1"}),
        listed("x", {"power=1"}),
    });
    // e failed to parse: an error step with the name from its file.
    std::vector<config_file> with_error = files;
    with_error[4].name = "e";
    auto plan = plan_apply(with_error, running, false);
    ASSERT_EQ(plan.size(), 5u);
    EXPECT_EQ(plan[0].action, plan_action::unchanged);
    EXPECT_EQ(plan[1].action, plan_action::update);
    EXPECT_EQ(plan[1].writes, std::vector<std::string>{"io_timeout=7000"});
    EXPECT_EQ(plan[2].action, plan_action::differs);
    EXPECT_TRUE(plan[2].writes.empty());
    ASSERT_FALSE(plan[2].details.empty());
    EXPECT_NE(plan[2].details[0].find("blocksize: running 512, file 4096"), std::string::npos);
    EXPECT_EQ(plan[3].action, plan_action::create);
    EXPECT_EQ(plan[4].action, plan_action::error);
    // x has no file: left alone unless prune.
    auto pruned = plan_apply(with_error, running, true);
    ASSERT_EQ(pruned.size(), 6u);
    EXPECT_EQ(pruned[5].name, "x");
    EXPECT_EQ(pruned[5].action, plan_action::prune);

    // Powered off: what changes while off is written, power last.
    auto off =
        plan_apply({files[2]}, json::array({listed("c", {"size=64", "power=0"}, "off")}), false);
    ASSERT_EQ(off.size(), 1u);
    EXPECT_EQ(off[0].action, plan_action::update);
    EXPECT_EQ(off[0].writes, (std::vector<std::string>{"blocksize=4096", "power=1"}));
}

TEST(DeviceConfig, SavedFileAppliesUnchanged)
{
    const json d = listed("m0", {"memory_backed=1", "size=64", "power=1"});
    const std::string text = render_device_config(d);
    auto f = parsed("/d/m0.conf", text);
    ASSERT_TRUE(f.config) << f.config.error().message;
    auto plan = plan_apply({f}, json::array({d}), false);
    ASSERT_EQ(plan.size(), 1u);
    EXPECT_EQ(plan[0].action, plan_action::unchanged);
}

TEST(DeviceConfig, MemoryBackedDataNote)
{
    EXPECT_EQ(restart_data_note(json{{"data_page_bytes", 4096}}),
              "empty after restart (memory-backed)");
    EXPECT_EQ(restart_data_note(json{{"path", "/x"}}), "");
}

}  // namespace
