// The daemon's device table in-process: add, list, remove, state files and
// recovery, with the null target and no export.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "device_host.hpp"

using namespace softblk::host;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

class device_host_test : public ::testing::Test {
protected:
    void SetUp() override
    {
        char tmpl[] = "/tmp/softblk-host-test.XXXXXX";
        ASSERT_NE(::mkdtemp(tmpl), nullptr);
        _dir = tmpl;
        _state = _dir + "/devices";
        fs::create_directories(_state);
    }
    void TearDown() override { fs::remove_all(_dir); }

    std::unique_ptr<device_host> make_host()
    {
        return std::make_unique<device_host>(
            softblk::export_context{.run_dir = _dir, .privileged = false}, _state);
    }
    static add_request null_request(std::string name, std::vector<std::string> options)
    {
        return add_request{.type = "null",
                           .name = std::move(name),
                           .options = std::move(options),
                           .export_type = "none",
                           .export_options = {},
                           .config = {}};
    }
    bool state_file(const std::string& name) const
    {
        return fs::exists(_state + "/" + name + ".json");
    }

    std::string _dir;
    std::string _state;
};

}  // namespace

TEST_F(device_host_test, adds_lists_and_removes_devices_with_their_state_files)
{
    auto host = make_host();
    auto a = host->add(null_request("a", {"size=64", "bs=4096", "memory_backed=1"}));
    ASSERT_TRUE(a) << a.error().message;
    EXPECT_EQ((*a)["capacity_bytes"], 64u << 20);
    EXPECT_EQ((*a)["logical_block_size"], 4096);
    EXPECT_EQ((*a)["export"]["type"], "none");
    auto b = host->add(null_request("", {"size=16"}));
    ASSERT_TRUE(b) << b.error().message;
    EXPECT_EQ((*b)["name"], "null0");
    EXPECT_TRUE(state_file("a"));
    EXPECT_TRUE(state_file("null0"));

    json list = host->list();
    ASSERT_EQ(list.size(), 2u);
    EXPECT_EQ(list[0]["name"], "a");  // creation order
    EXPECT_EQ(list[1]["name"], "null0");
    EXPECT_EQ(list[0]["state"], "running");
    EXPECT_EQ(list[0]["queue_depth"], 64);

    ASSERT_TRUE(host->remove("a"));
    EXPECT_FALSE(state_file("a"));
    EXPECT_EQ(host->list().size(), 1u);
    auto missing = host->remove("a");
    ASSERT_FALSE(missing);
    EXPECT_EQ(missing.error().code.value(), ENOENT);
}

TEST_F(device_host_test, a_failed_add_leaves_nothing_behind)
{
    auto host = make_host();
    auto bad = host->add(null_request("x", {"size=17592186044416"}));
    ASSERT_FALSE(bad);
    EXPECT_NE(bad.error().message.find("size"), std::string::npos);
    auto unknown = host->add(null_request("x", {"no_such_option=1"}));
    ASSERT_FALSE(unknown);
    EXPECT_NE(unknown.error().message.find("no_such_option"), std::string::npos);
    auto bad_name = host->add(null_request("../x", {}));
    ASSERT_FALSE(bad_name);
    EXPECT_EQ(bad_name.error().code.value(), EINVAL);
    auto req = null_request("x", {"size=8"});
    req.export_type = "no_such_export";
    auto bad_export = host->add(req);
    ASSERT_FALSE(bad_export);
    EXPECT_NE(bad_export.error().message.find("no_such_export"), std::string::npos);
    req.export_type = "none";
    req.export_options = {"loop=0"};
    EXPECT_FALSE(host->add(req));

    EXPECT_EQ(host->size(), 0u);
    EXPECT_TRUE(fs::is_empty(_state));

    ASSERT_TRUE(host->add(null_request("x", {"size=8"})));
    auto dup = host->add(null_request("x", {"size=8"}));
    ASSERT_FALSE(dup);
    EXPECT_EQ(dup.error().code.value(), EEXIST);
}

TEST_F(device_host_test, a_new_host_recovers_the_devices_from_their_state_files)
{
    {
        auto host = make_host();
        ASSERT_TRUE(host->add(
            null_request("first", {"size=64", "bs=4096", "memory_backed=1", "hw_queue_depth=16"})));
        // null_blk's gb= instead of size=: only what was given is replayed.
        ASSERT_TRUE(host->add(null_request("second", {"gb=1", "submit_queues=2"})));
        ASSERT_TRUE(host->add(null_request("third", {})));
        ASSERT_TRUE(host->remove("third"));
        host->stop_all();
    }
    auto host = make_host();
    json recovered = host->recover();
    EXPECT_EQ(recovered["recovered"], json({"first", "second"}));
    EXPECT_TRUE(recovered["failed"].empty());
    json list = host->list();
    ASSERT_EQ(list.size(), 2u);
    EXPECT_EQ(list[0]["name"], "first");
    EXPECT_EQ(list[0]["capacity_bytes"], 64u << 20);
    EXPECT_EQ(list[0]["logical_block_size"], 4096);
    EXPECT_EQ(list[0]["queue_depth"], 16);
    EXPECT_EQ(list[1]["name"], "second");
    EXPECT_EQ(list[1]["capacity_bytes"], 1ull << 30);
    EXPECT_EQ(list[1]["submit_queues"], 2);
    // New devices come after the recovered ones.
    ASSERT_TRUE(host->add(null_request("fourth", {"size=8"})));
    EXPECT_EQ(host->list()[2]["name"], "fourth");
}

// The host library alone saves a device's settings: a process taking over
// one device another left (softblk-driver --recover) reads them from the
// host's state file, as given (not every effective value), with the
// export's type and options.
TEST_F(device_host_test, saved_settings_are_read_back_for_one_device)
{
    {
        auto host = make_host();
        ASSERT_TRUE(host->add(null_request("kept", {"gb=1", "bs=4096", "memory_backed=1"})));
        host->stop_all();  // state files stay, as after a crash
    }
    auto host = make_host();
    auto saved = host->read_saved("kept");
    ASSERT_TRUE(saved) << saved.error().message;
    EXPECT_EQ(saved->name, "kept");
    EXPECT_EQ(saved->type, "null");
    // What was given, canonical (the alias bs= as blocksize=), as the
    // host's own recovery replays it.
    for (const char* given : {"gb=1", "blocksize=4096", "memory_backed=1"}) {
        EXPECT_NE(std::find(saved->options.begin(), saved->options.end(), given),
                  saved->options.end())
            << given;
    }
    EXPECT_EQ(std::find(saved->options.begin(), saved->options.end(), "bs=4096"),
              saved->options.end());
    EXPECT_EQ(saved->export_type, "none");
    EXPECT_TRUE(saved->export_options.empty());
    EXPECT_EQ(host->size(), 0u);  // read, not recovered

    auto missing = host->read_saved("absent");
    ASSERT_FALSE(missing);
    EXPECT_EQ(missing.error().code.value(), ENOENT);
    EXPECT_NE(missing.error().message.find("absent.json"), std::string::npos)
        << missing.error().message;
    std::ofstream(_state + "/liar.json") << R"({"name": "other", "type": "null", "options": []})";
    auto liar = host->read_saved("liar");
    ASSERT_FALSE(liar);
    EXPECT_NE(liar.error().message.find("names device 'other'"), std::string::npos)
        << liar.error().message;
    EXPECT_FALSE(host->read_saved("../kept"));
}

// A power cycle runs as a job (begin_set answers later), quick writes at
// once; both are recorded in the state file.
TEST_F(device_host_test, power_writes_run_as_a_job_and_are_recorded)
{
    auto host = make_host();
    ASSERT_TRUE(host->add(null_request("p", {"size=8"})));
    EXPECT_FALSE(host->begin_set("p", {"power=0"}, false).has_value());
    EXPECT_EQ(host->busy("p"), "changing");
    EXPECT_EQ(host->list()[0]["state"], "changing");
    EXPECT_EQ(host->get("p", {"power"}).error().code.value(), EBUSY);
    EXPECT_EQ(host->set("p", {"power=1"}, false).error().code.value(), EBUSY);
    for (int i = 0; i < 1000 && !host->busy("p").empty(); ++i) {
        (void)host->reap();
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_EQ(host->list()[0]["state"], "off");
    auto quick = host->begin_set("p", {"io_timeout=7000"}, false);
    ASSERT_TRUE(quick.has_value());
    ASSERT_TRUE(*quick) << quick->error().message;
    auto on = host->set("p", {"power=1"}, false);
    ASSERT_TRUE(on) << on.error().message;
    EXPECT_EQ((*on)["power"], 1);
    std::ifstream state(_state + "/p.json");
    const std::string saved = json::parse(state)["options"].dump();
    EXPECT_NE(saved.find("io_timeout=7000"), std::string::npos) << saved;
    EXPECT_NE(saved.find("power=1"), std::string::npos) << saved;
}

TEST_F(device_host_test, broken_state_files_are_listed_as_failed_until_deleted)
{
    std::ofstream(_state + "/garbage.json") << "{ not json";
    std::ofstream(_state + "/liar.json") << R"({"name": "other", "type": "null", "options": []})";
    std::ofstream(_state + "/badopt.json")
        << R"({"name": "badopt", "type": "null", "options": ["size=17592186044416"]})";
    std::ofstream(_state + "/good.json")
        << R"({"name": "good", "type": "null", "options": ["size=8"], "export": {"type": "none"}})";
    std::ofstream(_state + "/half.json.tmp") << "{";
    auto host = make_host();
    json recovered = host->recover();
    EXPECT_EQ(recovered["recovered"], json({"good"}));
    EXPECT_EQ(recovered["failed"].size(), 3u);
    EXPECT_FALSE(fs::exists(_state + "/half.json.tmp"));
    for (const json& d : host->list()) {
        if (d["name"] == "good") {
            EXPECT_EQ(d["state"], "running");
        } else {
            EXPECT_EQ(d["state"], "failed") << d.dump();
            EXPECT_FALSE(d["error"].get<std::string>().empty());
        }
        if (d["name"] == "badopt") {
            EXPECT_NE(d["error"].get<std::string>().find("size"), std::string::npos);
        }
    }
    ASSERT_TRUE(host->remove("garbage"));
    EXPECT_FALSE(state_file("garbage"));
    EXPECT_FALSE(host->add(null_request("badopt", {})));  // the failed entry still holds the name
    ASSERT_TRUE(host->remove_all());
    EXPECT_TRUE(fs::is_empty(_state));
}

namespace {

// Two front ends of this test only (the test program links none): "flat"
// carries no zones and comes first, "zoned" carries them and comes second.
std::atomic<bool> g_fakes_available{true};

class fake_export final : public softblk::device_export {
public:
    json describe() const override { return json{{"socket", "/nowhere"}}; }
    softblk::result<void> stop() override { return {}; }
};

void register_fake_front_ends()
{
    static const bool registered = [] {
        auto start = [](softblk::device&, const softblk::export_context&,
                        std::span<const std::string>)
            -> softblk::result<std::unique_ptr<softblk::device_export>> {
            return std::make_unique<fake_export>();
        };
        auto available = [] { return g_fakes_available.load(); };
        softblk::register_export_type(softblk::export_type{.name = "test-flat",
                                                           .description = "test",
                                                           .start = start,
                                                           .cleanup_stale = {},
                                                           .available = available,
                                                           .options = {},
                                                           .zoned = false,
                                                           .default_rank = 1});
        softblk::register_export_type(softblk::export_type{.name = "test-zoned",
                                                           .description = "test",
                                                           .start = start,
                                                           .cleanup_stale = {},
                                                           .available = available,
                                                           .options = {},
                                                           .zoned = true,
                                                           .default_rank = 2});
        return true;
    }();
    (void)registered;
}

}  // namespace

// `add` without --export: the front ends' default_rank and what each can
// carry choose, per device; a zoned device gets the first that carries
// zones, and with none the error says why (issue 44).
TEST_F(device_host_test, the_default_export_is_chosen_per_device_from_what_can_carry_it)
{
    register_fake_front_ends();
    g_fakes_available = true;
    auto host = make_host();
    auto flat_req = null_request("flat", {"size=16"});
    flat_req.export_type.clear();
    auto flat = host->add(flat_req);
    ASSERT_TRUE(flat) << flat.error().message;
    EXPECT_EQ((*flat)["export"]["type"], "test-flat");
    auto zoned_req = null_request("z", {"size=256", "zoned=1", "zone_size=64"});
    zoned_req.export_type.clear();
    auto zoned = host->add(zoned_req);
    ASSERT_TRUE(zoned) << zoned.error().message;
    EXPECT_EQ((*zoned)["export"]["type"], "test-zoned");
    EXPECT_EQ(default_export_type(false), "test-flat");
    EXPECT_EQ(default_export_type(true), "test-zoned");

    // What was chosen is recorded: a new host brings the device back on it.
    host.reset();
    host = make_host();
    host->recover();
    json list = host->list();
    ASSERT_EQ(list.size(), 2u);
    EXPECT_EQ(list[1]["name"], "z");
    EXPECT_EQ(list[1]["export"]["type"], "test-zoned");
    ASSERT_TRUE(host->remove_all());

    // No default front end can carry it: add fails naming why, leaving nothing.
    g_fakes_available = false;
    zoned_req.name = "z2";
    auto refused = host->add(zoned_req);
    g_fakes_available = true;
    ASSERT_FALSE(refused);
    EXPECT_EQ(refused.error().code.value(), ENODEV);
    EXPECT_NE(refused.error().message.find("no default export can carry this zoned device"),
              std::string::npos)
        << refused.error().message;
    EXPECT_NE(refused.error().message.find("test-zoned: not available"), std::string::npos)
        << refused.error().message;
    EXPECT_EQ(host->size(), 0u);
    EXPECT_TRUE(fs::is_empty(_state));
}

TEST(features, lists_every_option_of_a_type_and_the_export_types)
{
    auto f = features_json("null");
    ASSERT_TRUE(f) << f.error().message;
    ASSERT_EQ((*f)["targets"].size(), 1u);
    bool memory_backed = false;
    bool depth = false;
    for (const json& o : (*f)["targets"][0]["options"]) {
        if (o["name"] == "memory_backed") {
            memory_backed = true;
            EXPECT_EQ(o["default"], "0");
            EXPECT_EQ(o["kind"], "boolean");
        }
        if (o["name"] == "hw_queue_depth") {
            depth = true;
            EXPECT_EQ(o["default"], "64");
            EXPECT_TRUE(o.contains("min"));
        }
    }
    EXPECT_TRUE(memory_backed);
    EXPECT_TRUE(depth);
    bool none = false;
    for (const json& e : (*f)["exports"]) {
        none = none || e["name"] == "none";
    }
    EXPECT_TRUE(none);
    auto unknown = features_json("no_such_type");
    ASSERT_FALSE(unknown);
    EXPECT_NE(unknown.error().message.find("null"), std::string::npos);  // names the known types
}
