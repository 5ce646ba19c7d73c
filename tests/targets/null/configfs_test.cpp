// null_blk's configfs workflow through the in-process API: power cycles
// that keep the data, attribute writes with the kernel's update rules
// (device::set_option), reads as configfs shows them (get_option), the
// clamps and ignores of power on, the fault-injection directories and the
// module parameters. The same rules through the CLI and the FUSE tree:
// tests/cli/nullb_tree.sh.
#include "test_util.hpp"

#include <cerrno>
#include <chrono>

#include <fmt/format.h>

using namespace softblk;
using namespace softblk::test;

namespace {

// The errno of a set_option that must fail (0 when it succeeded).
int set_errno(device& d, std::string_view key, std::string_view value)
{
    auto r = d.set_option(key, value);
    return r ? 0 : r.error().code.value();
}

std::string get(const device& d, std::string_view key)
{
    auto r = d.get_option(key);
    EXPECT_TRUE(r) << key << ": " << (r ? "" : r.error().message);
    return r ? *r : std::string();
}

// ---------------------------------------------------------------- power

TEST(configfs, power_cycle_keeps_the_data_and_applies_new_bad_blocks)
{
    // The sequence: write, power off, change badblocks, power on,
    // read back, hit the new bad blocks.
    auto d = make_null({"size=4", "memory_backed=1"});
    ASSERT_TRUE(d);
    auto data = pattern(65536, 7);
    ASSERT_EQ(d->execute(io_op::write, 0, 65536, data.data()), 65536);
    ASSERT_TRUE(d->set_option("power", "0\n"));
    EXPECT_FALSE(d->powered());
    EXPECT_EQ(get(*d, "power"), "0\n");
    EXPECT_GE(d->memory_bytes(), 65536u);  // the data stays while off
    ASSERT_TRUE(d->set_option("badblocks", "+16-23"));
    ASSERT_TRUE(d->set_option("size", "8"));  // attributes change while off
    ASSERT_TRUE(d->set_option("power", "1"));
    EXPECT_EQ(d->limits().capacity_bytes, 8ull << 20);
    std::vector<char> b(8192);
    ASSERT_EQ(d->execute(io_op::read, 0, 8192, b.data()), 8192);
    EXPECT_TRUE(std::equal(b.begin(), b.end(), data.begin()));
    EXPECT_EQ(d->execute(io_op::read, 8192, 4096, b.data()), -EIO);  // sectors 16-23
    ASSERT_EQ(d->execute(io_op::read, 12288, 8192, b.data()), 8192);
    EXPECT_TRUE(std::equal(b.begin(), b.end(), data.begin() + 12288));
    EXPECT_EQ(get(*d, "badblocks"), "16 8\n");
}

TEST(configfs, power_cycle_with_a_larger_block_size_moves_the_data)
{
    auto d = make_null({"size=2", "memory_backed=1", "bs=512"});
    ASSERT_TRUE(d);
    auto data = pattern(16384, 9);
    ASSERT_EQ(d->execute(io_op::write, 4096, 16384, data.data()), 16384);
    ASSERT_TRUE(d->set_power(false));
    ASSERT_TRUE(d->set_option("blocksize", "8192"));
    ASSERT_TRUE(d->set_power(true));
    EXPECT_EQ(d->limits().logical_block_size, 8192u);
    auto b = read_back(*d, 0, 24576);
    EXPECT_TRUE(all_zero(std::vector<char>(b.begin(), b.begin() + 4096)));
    EXPECT_TRUE(std::equal(data.begin(), data.end(), b.begin() + 4096));
}

TEST(configfs, writing_the_power_state_it_has_does_nothing)
{
    auto d = make_null({"size=1"});
    ASSERT_TRUE(d);
    EXPECT_TRUE(d->set_option("power", "1"));
    EXPECT_TRUE(d->powered());
    EXPECT_EQ(set_errno(*d, "power", "2"), EINVAL);  // kstrtobool: not a boolean
    EXPECT_EQ(set_errno(*d, "power", "maybe"), EINVAL);
    EXPECT_TRUE(d->powered());
}

TEST(configfs, a_failed_power_on_leaves_the_device_off_with_the_clamps_written)
{
    // null_validate_conf writes its clamps before the block layer refuses.
    auto d = make_null({"power=0", "size=1", "blocksize=3000", "irqmode=7"});
    ASSERT_TRUE(d);
    auto r = d->set_power(true);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code.value(), EINVAL);
    EXPECT_NE(r.error().message.find("blocksize=3000"), std::string::npos) << r.error().message;
    EXPECT_FALSE(d->powered());
    EXPECT_EQ(get(*d, "irqmode"), "2\n");
    ASSERT_TRUE(d->set_option("blocksize", "4096"));
    EXPECT_TRUE(d->set_power(true));
}

TEST(configfs, queue_mode_1_is_refused_before_any_clamp)
{
    // null_validate_conf checks queue_mode first: nothing is clamped yet.
    auto d = make_null({"power=0", "size=1", "queue_mode=1", "irqmode=7", "submit_queues=4096"});
    ASSERT_TRUE(d);
    auto r = d->set_power(true);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code.value(), EINVAL);
    EXPECT_NE(r.error().message.find("queue_mode=1"), std::string::npos) << r.error().message;
    EXPECT_FALSE(d->powered());
    EXPECT_EQ(get(*d, "irqmode"), "7\n");
    EXPECT_EQ(get(*d, "submit_queues"), "4096\n");
    EXPECT_EQ(get(*d, "queue_mode"), "1\n");
    ASSERT_TRUE(d->set_option("queue_mode", "2"));
    EXPECT_TRUE(d->set_power(true));
    EXPECT_EQ(get(*d, "irqmode"), "2\n");
}

// ---------------------------------------------------------------- update rules

TEST(configfs, attributes_without_an_apply_function_are_ebusy_while_powered_on)
{
    auto d = make_null({"size=1"});
    ASSERT_TRUE(d);
    for (const char* key : {"size", "blocksize", "memory_backed", "hw_queue_depth", "irqmode",
                            "completion_nsec", "mbps", "cache_size", "discard", "home_node",
                            "queue_mode", "max_sectors", "blocking", "shared_tags", "index"}) {
        EXPECT_EQ(set_errno(*d, key, "1"), EBUSY) << key;
    }
    // The value is parsed first: a malformed one is EINVAL in any state.
    EXPECT_EQ(set_errno(*d, "size", "x"), EINVAL);
    EXPECT_EQ(set_errno(*d, "size", "4294967296"), EBUSY);        // size is an unsigned long
    EXPECT_EQ(set_errno(*d, "blocksize", "4294967296"), ERANGE);  // blocksize is unsigned int
    EXPECT_EQ(set_errno(*d, "nonexistent", "1"), ENOENT);
    // Module parameters are not attributes.
    EXPECT_EQ(set_errno(*d, "gb", "1"), EPERM);
    EXPECT_EQ(set_errno(*d, "timeout", "1,100,0,-1"), EPERM);
    ASSERT_TRUE(d->set_power(false));
    for (const char* key : {"size", "blocksize", "hw_queue_depth", "mbps"}) {
        EXPECT_EQ(set_errno(*d, key, "1024"), 0) << key;
    }
}

TEST(configfs, badblocks_change_while_powered_on)
{
    auto d = make_null({"size=1"});
    ASSERT_TRUE(d);
    char buf[512];
    EXPECT_EQ(d->execute(io_op::read, 8 * 512, 512, buf), 512);
    ASSERT_TRUE(d->set_option("badblocks", "+8-15\n"));
    EXPECT_EQ(d->execute(io_op::read, 8 * 512, 512, buf), -EIO);
    ASSERT_TRUE(d->set_option("badblocks", " -8-11 "));  // blanks stripped (strstrip)
    EXPECT_EQ(d->execute(io_op::read, 8 * 512, 512, buf), 512);
    EXPECT_EQ(get(*d, "badblocks"), "12 4\n");
    ASSERT_TRUE(d->set_option("badblocks", "+0x10-0x10"));  // kstrtoull base 0
    EXPECT_EQ(get(*d, "badblocks"), "12 5\n");              // adjacent ranges merge
    EXPECT_EQ(set_errno(*d, "badblocks", "8-15"), EINVAL);
    EXPECT_EQ(set_errno(*d, "badblocks", "+15-8"), EINVAL);
    // A range longer than one record shows as several (BB_MAX_LEN 512).
    ASSERT_TRUE(d->set_option("badblocks", "+1000-2023"));
    EXPECT_EQ(get(*d, "badblocks"), "12 5\n1000 512\n1512 512\n");
}

// A range of 2^33 sectors is 16.7 million records: the read shows one page
// of them, as the kernel's badblocks_show fills one page, and costs no
// more than that page (it used to build all of them, 866 MB in the daemon
// for one `softblk get`). describe() lists the first merged ranges only.
TEST(configfs, badblocks_read_is_one_page_however_long_the_list)
{
    auto d = make_null({"size=1"});
    ASSERT_TRUE(d);
    ASSERT_TRUE(d->set_option("badblocks", "+0-8589934591"));
    const auto start = std::chrono::steady_clock::now();
    const std::string page = get(*d, "badblocks");
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(500));
    ASSERT_LE(page.size(), 4096u);
    EXPECT_GT(page.size(), 4096u - 32);  // as full as whole lines make it
    ASSERT_EQ(page.back(), '\n');        // whole lines only
    EXPECT_EQ(page.substr(0, 16), "0 512\n512 512\n10");
    for (uint64_t s = 0; s < 200; ++s) {
        ASSERT_TRUE(d->set_option("badblocks",
                                  fmt::format("+{}-{}", 8589934600 + 2 * s, 8589934600 + 2 * s)));
    }
    nlohmann::json j;
    d->describe(j);
    EXPECT_EQ(j["target"]["badblocks"]["ranges"], 201);
    EXPECT_EQ(j["target"]["badblocks"]["list"].size(), 64u);
    EXPECT_EQ(j["target"]["badblocks"]["list"][0], "0-8589934591");
}

TEST(configfs, submit_and_poll_queues_change_while_powered_on_within_the_kernels_limits)
{
    const unsigned cpus = possible_cpus();
    auto d = make_null({"size=1", "memory_backed=1"});
    ASSERT_TRUE(d);
    auto data = pattern(4096, 5);
    ASSERT_EQ(d->execute(io_op::write, 0, 4096, data.data()), 4096);
    ASSERT_EQ(d->queue_count(), 2u);  // 1 submit + 1 poll
    // nullb_update_nr_hw_queues: 0, more than the CPUs or more poll queues
    // than the module's are EINVAL while powered on; the old counts stay.
    EXPECT_EQ(set_errno(*d, "submit_queues", "0"), EINVAL);
    EXPECT_EQ(set_errno(*d, "submit_queues", std::to_string(cpus + 1)), EINVAL);
    EXPECT_EQ(set_errno(*d, "poll_queues", "2"), EINVAL);
    EXPECT_EQ(get(*d, "submit_queues"), "1\n");
    ASSERT_TRUE(d->set_option("poll_queues", "0"));
    EXPECT_EQ(d->queue_count(), 1u);
    if (cpus >= 2) {
        ASSERT_TRUE(d->set_option("submit_queues", "2"));
        EXPECT_EQ(d->queue_count(), 2u);
        EXPECT_EQ(get(*d, "submit_queues"), "2\n");
    }
    EXPECT_EQ(read_back(*d, 0, 4096), data);  // the data survives the re-made queues
    // While powered off any value is taken; power on clamps it.
    ASSERT_TRUE(d->set_power(false));
    ASSERT_TRUE(d->set_option("submit_queues", std::to_string(cpus + 100)));
    ASSERT_TRUE(d->set_option("poll_queues", "50"));
    ASSERT_TRUE(d->set_power(true));
    EXPECT_EQ(get(*d, "submit_queues"), std::to_string(cpus) + "\n");
    EXPECT_EQ(get(*d, "poll_queues"), "1\n");
    EXPECT_EQ(d->info().queues.submit_queues, cpus);
    ASSERT_TRUE(d->set_power(false));
    ASSERT_TRUE(d->set_option("submit_queues", "0"));
    ASSERT_TRUE(d->set_power(true));
    EXPECT_EQ(get(*d, "submit_queues"), "1\n");
}

TEST(configfs, io_timeout_changes_at_any_time)
{
    auto d = make_null({"size=1"});
    ASSERT_TRUE(d);
    EXPECT_EQ(d->info().queues.io_timeout_ms, 5000u);  // null_blk's tag set: 5 s
    ASSERT_TRUE(d->set_option("io_timeout", "250"));
    EXPECT_EQ(d->info().queues.io_timeout_ms, 250u);
    EXPECT_EQ(get(*d, "io_timeout"), "250\n");
    EXPECT_EQ(set_errno(*d, "io_timeout", "0"), EINVAL);
}

// ---------------------------------------------------------------- clamps

struct clamp_case {
    std::vector<std::string> options;
    const char* key;
    std::string after_power_on;  // the read after power on
    bool note;                   // a log line says so
};

TEST(configfs, power_on_clamps_and_ignores_as_null_validate_conf)
{
    const std::string cpus = std::to_string(possible_cpus());
    const clamp_case cases[] = {
        {{"irqmode=3"}, "irqmode", "2\n", true},
        {{"irqmode=0xffffffff"}, "irqmode", "2\n", true},
        {{"queue_mode=0"}, "queue_mode", "2\n", true},
        {{"queue_mode=7"}, "queue_mode", "7\n", true},  // no check in null_blk
        {{"mbps=99999"}, "mbps", "40960\n", true},
        {{"mbps=40960"}, "mbps", "40960\n", false},
        {{"discard=1"}, "discard", "0\n", true},
        {{"cache_size=16"}, "cache_size", "0\n", true},
        {{"memory_backed=1"}, "blocking", "1\n", false},
        {{"submit_queues=0"}, "submit_queues", "1\n", false},
        {{"submit_queues=10000"}, "submit_queues", cpus + "\n", true},
        {{"poll_queues=9"}, "poll_queues", "1\n", true},
        {{"home_node=999"}, "home_node", "999\n", true},
        {{"hw_queue_depth=100000"}, "hw_queue_depth", "100000\n", true},
        {{"size=0"}, "size", "0\n", false},
        {{"blocksize=65536"}, "blocksize", "65536\n", false},
    };
    for (const clamp_case& c : cases) {
        std::vector<std::string> options = c.options;
        options.push_back("size=1");
        if (c.options[0] == "size=0") {
            options.pop_back();
        }
        auto d = make_null(options);
        ASSERT_TRUE(d) << c.options[0];
        EXPECT_EQ(get(*d, c.key), c.after_power_on) << c.options[0];
        EXPECT_EQ(!d->notes().empty(), c.note) << c.options[0];
    }
    // The clamped queue layout is the one the queues have.
    auto deep = make_null({"size=1", "hw_queue_depth=100000"});
    ASSERT_TRUE(deep);
    EXPECT_EQ(deep->info().queues.queue_depth, 10240u);
    auto fast = make_null({"size=1", "mbps=99999"});
    ASSERT_TRUE(fast);
    EXPECT_NE(describe(*fast)["options"].dump().find("mbps=40960"), std::string::npos);
}

TEST(configfs, power_on_refuses_where_null_blk_refuses)
{
    struct refused {
        std::vector<std::string> options;
        const char* names;
    };
    const refused cases[] = {
        {{"queue_mode=1"}, "queue_mode=1"},         {{"blocksize=256"}, "blocksize=256"},
        {{"blocksize=131072"}, "blocksize=131072"}, {{"blocksize=1536"}, "blocksize=1536"},
        {{"hw_queue_depth=0"}, "hw_queue_depth"},   {{"max_sectors=4"}, "max_sectors=4"},
    };
    for (const refused& c : cases) {
        std::vector<std::string> options = c.options;
        options.push_back("size=1");
        int code = 0;
        const std::string e = create_error(options, &code);
        EXPECT_EQ(code, EINVAL) << e;
        EXPECT_NE(e.find(c.names), std::string::npos) << e;
    }
}

// ---------------------------------------------------------------- parsing

TEST(configfs, numbers_and_booleans_parse_as_the_kernel_parses_them)
{
    auto d = make_null({"power=0", "size=1"});
    ASSERT_TRUE(d);
    const struct {
        const char* key;
        const char* value;
        int error;
        const char* read;
    } writes[] = {
        {"hw_queue_depth", "0x20", 0, "32\n"},
        {"hw_queue_depth", "010", 0, "8\n"},  // octal
        {"hw_queue_depth", "+7\n", 0, "7\n"},
        {"hw_queue_depth", "08", EINVAL, "7\n"},
        {"hw_queue_depth", "-1", EINVAL, "7\n"},
        {"hw_queue_depth", " 5", EINVAL, "7\n"},
        {"hw_queue_depth", "5\n\n", EINVAL, "7\n"},
        {"hw_queue_depth", "4294967296", ERANGE, "7\n"},
        {"hw_queue_depth", "4294967295", 0, "4294967295\n"},
        {"size", "18446744073709551615", 0, "18446744073709551615\n"},
        {"size", "18446744073709551616", ERANGE, "18446744073709551615\n"},
        {"memory_backed", "y", 0, "1\n"},
        {"memory_backed", "N", 0, "0\n"},
        {"memory_backed", "on", 0, "1\n"},
        {"memory_backed", "off", 0, "0\n"},
        {"memory_backed", "true", 0, "1\n"},
        {"memory_backed", "false", 0, "0\n"},
        {"memory_backed", "o", EINVAL, "0\n"},
        {"memory_backed", "2", EINVAL, "0\n"},
        {"memory_backed", "", EINVAL, "0\n"},
    };
    for (const auto& w : writes) {
        EXPECT_EQ(set_errno(*d, w.key, w.value), w.error) << w.key << "=" << w.value;
        EXPECT_EQ(get(*d, w.key), w.read) << w.key << "=" << w.value;
    }
}

// ---------------------------------------------------------------- faults

TEST(configfs, fault_injection_directories_have_one_live_file_per_field)
{
    auto d = make_null({"size=1"});
    ASSERT_TRUE(d);
    // FAULT_ATTR_INITIALIZER.
    EXPECT_EQ(get(*d, "requeue_inject/probability"), "0\n");
    EXPECT_EQ(get(*d, "requeue_inject/interval"), "1\n");
    EXPECT_EQ(get(*d, "requeue_inject/times"), "1\n");
    EXPECT_EQ(get(*d, "requeue_inject/space"), "0\n");
    EXPECT_EQ(get(*d, "requeue_inject/verbose"), "2\n");
    EXPECT_EQ(get(*d, "requeue_inject/task-filter"), "0\n");
    // Written while powered on, it acts at once; times counts down.
    ASSERT_TRUE(d->set_option("requeue_inject/times", "2"));
    ASSERT_TRUE(d->set_option("requeue_inject/probability", "100"));
    char buf[512];
    for (int i = 0; i < 4; ++i) {
        EXPECT_EQ(d->execute(io_op::read, 0, 512, buf), 512);  // requeued, then done
    }
    EXPECT_EQ(get(*d, "requeue_inject/times"), "0\n");
    EXPECT_EQ(describe(*d)["target"]["fault_injection"]["requeue"]["failures"], 2);
    // A probability above 100 is "always" (the kernel takes any value).
    EXPECT_EQ(set_errno(*d, "requeue_inject/probability", "1000"), 0);
    EXPECT_EQ(set_errno(*d, "requeue_inject/times", "-1"), 0);
    EXPECT_EQ(set_errno(*d, "requeue_inject/times", "4294967296"), ERANGE);
    EXPECT_EQ(set_errno(*d, "requeue_inject/probability", "x"), EINVAL);
    // The state survives a power cycle, as the configfs item keeps it.
    ASSERT_TRUE(d->set_power(false));
    ASSERT_TRUE(d->set_power(true));
    EXPECT_EQ(get(*d, "requeue_inject/probability"), "1000\n");
    EXPECT_EQ(get(*d, "requeue_inject/times"), "-1\n");
}

TEST(configfs, the_module_parameter_presets_the_fields)
{
    auto d = make_null({"size=1", "timeout=3,50,2,-1"});
    ASSERT_TRUE(d);
    EXPECT_EQ(get(*d, "timeout_inject/interval"), "3\n");
    EXPECT_EQ(get(*d, "timeout_inject/probability"), "50\n");
    EXPECT_EQ(get(*d, "timeout_inject/space"), "2\n");
    EXPECT_EQ(get(*d, "timeout_inject/times"), "-1\n");
    // A field given as well wins (configfs writes after the module loaded).
    auto e = make_null({"size=1", "timeout=3,50,2,-1", "timeout_inject/probability=7"});
    ASSERT_TRUE(e);
    EXPECT_EQ(get(*e, "timeout_inject/probability"), "7\n");
}

// ---------------------------------------------------------------- module parameters

TEST(configfs, module_parameters_are_the_defaults_of_new_devices)
{
    const std::vector<std::string> params = {"gb=1", "bs=4096", "poll_queues=3"};
    ASSERT_TRUE(set_option_defaults("null", params));
    auto d = make_null({});
    auto e = make_null({"poll_queues=3"});
    ASSERT_TRUE(set_option_defaults("null", {}));  // back to null_blk's own
    ASSERT_TRUE(d && e);
    EXPECT_EQ(d->limits().capacity_bytes, 1ull << 30);
    EXPECT_EQ(d->limits().logical_block_size, 4096u);
    EXPECT_EQ(d->info().queues.poll_queues, 3u);
    EXPECT_EQ(e->info().queues.poll_queues, 3u);  // the module's limit is 3 now
    auto f = make_null({"size=1", "poll_queues=3"});
    ASSERT_TRUE(f);
    EXPECT_EQ(f->info().queues.poll_queues, 1u);  // and 1 again after
    // State is not a module parameter.
    auto r = set_option_defaults("null", std::vector<std::string>{"power=0"});
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code.value(), EPERM);
    EXPECT_FALSE(set_option_defaults("null", std::vector<std::string>{"bs=x"}));
    EXPECT_TRUE(option_defaults("null").empty());
}

}  // namespace
