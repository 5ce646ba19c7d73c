#include <gtest/gtest.h>

#include <cerrno>
#include <cstdint>

#include <softblk/device.hpp>
#include <softblk/options.hpp>

using namespace softblk;

namespace {

constexpr option_def k_defs[] = {
    {.name = "size",
     .kind = option_kind::integer,
     .default_value = "250",
     .unit = "MiB",
     .help = "capacity",
     .min = 1,
     .max = 1000},
    {.name = "blocksize",
     .kind = option_kind::integer,
     .default_value = "512",
     .unit = "bytes",
     .help = "block size",
     .min = 512,
     .max = 4096,
     .range = option_range::clamp,
     .alias = "bs"},
    {.name = "memory_backed", .kind = option_kind::boolean, .default_value = "0", .help = "store"},
    {.name = "home_node",
     .kind = option_kind::signed_integer,
     .default_value = "-1",
     .help = "node",
     .smin = -1,
     .smax = 1023},
    {.name = "badblocks",
     .kind = option_kind::text,
     .default_value = "",
     .help = "ranges",
     .repeatable = true},
};

std::vector<std::string> args(std::initializer_list<const char*> list)
{
    return {list.begin(), list.end()};
}

}  // namespace

TEST(options, defaults_apply_when_not_given)
{
    auto set = option_set::parse(k_defs, {});
    ASSERT_TRUE(set) << set.error().message;
    EXPECT_EQ(set->u64("size"), 250u);
    EXPECT_FALSE(set->given("size"));
    EXPECT_EQ(set->i64("home_node"), -1);
    EXPECT_FALSE(set->flag("memory_backed"));
}

TEST(options, values_aliases_and_hex)
{
    auto a = args({"size=0x10", "bs=4096", "memory_backed=y", "home_node=3"});
    auto set = option_set::parse(k_defs, a);
    ASSERT_TRUE(set) << set.error().message;
    EXPECT_EQ(set->u64("size"), 16u);
    EXPECT_TRUE(set->given("size"));
    EXPECT_EQ(set->u64("blocksize"), 4096u);
    EXPECT_TRUE(set->flag("memory_backed"));
    EXPECT_EQ(set->i64("home_node"), 3);
}

TEST(options, out_of_range_names_attribute_and_range)
{
    auto a = args({"size=0"});
    auto set = option_set::parse(k_defs, a);
    ASSERT_FALSE(set);
    EXPECT_EQ(set.error().code, std::errc::invalid_argument);
    EXPECT_NE(set.error().message.find("size"), std::string::npos);
    EXPECT_NE(set.error().message.find("1 to 1000"), std::string::npos);
    EXPECT_NE(set.error().message.find("MiB"), std::string::npos);
}

TEST(options, clamp_only_where_declared)
{
    auto a = args({"blocksize=65536"});
    auto set = option_set::parse(k_defs, a);
    ASSERT_TRUE(set);
    EXPECT_EQ(set->u64("blocksize"), 4096u);
}

TEST(options, errors_for_unknown_malformed_and_bad_bool)
{
    for (const char* bad : {"nosuch=1", "size", "=3", "size=12x", "size=", "memory_backed=2",
                            "home_node=-2", "size=99999999999999999999999"}) {
        auto a = args({bad});
        auto set = option_set::parse(k_defs, a);
        EXPECT_FALSE(set) << bad;
        if (!set) {
            EXPECT_FALSE(set.error().message.empty());
        }
    }
}

TEST(options, repeatable_text_keeps_order_and_round_trips)
{
    auto a = args({"badblocks=+0-7", "badblocks=-3-3", "size=8"});
    auto set = option_set::parse(k_defs, a);
    ASSERT_TRUE(set);
    ASSERT_EQ(set->texts("badblocks").size(), 2u);
    EXPECT_EQ(set->texts("badblocks")[1], "-3-3");
    auto again = option_set::parse(k_defs, set->to_args());
    ASSERT_TRUE(again) << again.error().message;
    EXPECT_EQ(again->u64("size"), 8u);
    EXPECT_EQ(again->texts("badblocks"), set->texts("badblocks"));
}

TEST(options, parse_size_suffixes)
{
    EXPECT_EQ(parse_size("4G").value(), 4ull << 30);
    EXPECT_EQ(parse_size("512MiB").value(), 512ull << 20);
    EXPECT_EQ(parse_size("100").value(), 100u);
    EXPECT_EQ(parse_size("1T").value(), 1ull << 40);
    EXPECT_FALSE(parse_size("4Q"));
    EXPECT_FALSE(parse_size("G"));
    EXPECT_FALSE(parse_size("99999999999T"));
}

// 1023T parsed and 1P did not; P and E are units too, as far as 64 bits go.
TEST(options, parse_size_takes_peta_and_exa_and_says_when_too_large)
{
    EXPECT_EQ(parse_size("1P").value(), 1ull << 50);
    EXPECT_EQ(parse_size("2PiB").value(), 2ull << 50);
    EXPECT_EQ(parse_size("15E").value(), 15ull << 60);
    EXPECT_EQ(parse_size("16383P").value(), 16383ull << 50);
    EXPECT_EQ(parse_size("18446744073709551615").value(), UINT64_MAX);
    for (const char* big : {"16E", "16384P", "18446744073709551616", "99999999999T"}) {
        auto r = parse_size(big);
        ASSERT_FALSE(r) << big;
        EXPECT_EQ(r.error().code.value(), ERANGE) << big;
        EXPECT_NE(r.error().message.find("too large: a size is at most 16E - 1 byte"),
                  std::string::npos)
            << r.error().message;
    }
    auto unknown = parse_size("4Q");
    ASSERT_FALSE(unknown);
    EXPECT_NE(unknown.error().message.find("unknown size suffix 'Q'"), std::string::npos)
        << unknown.error().message;
    EXPECT_NE(unknown.error().message.find("K, M, G, T, P or E"), std::string::npos);
}

// --size 1.5G said "unknown size suffix"; a fraction that gives whole bytes
// is a size, one that does not says so.
TEST(options, parse_size_takes_fractions_that_give_whole_bytes)
{
    EXPECT_EQ(parse_size("1.5G").value(), 3ull << 29);
    EXPECT_EQ(parse_size("0.5K").value(), 512u);
    EXPECT_EQ(parse_size("2.25MiB").value(), 9ull << 18);
    EXPECT_EQ(parse_size("1.50G").value(), 3ull << 29);
    EXPECT_EQ(parse_size("0.001953125K").value(), 2u);
    EXPECT_EQ(parse_size("15.5E").value(), 31ull << 59);
    EXPECT_EQ(parse_size("3.0").value(), 3u);
    for (const char* ragged : {"1.1K", "0.3M", "1.5", "1.5B", "0.0001K"}) {
        auto r = parse_size(ragged);
        ASSERT_FALSE(r) << ragged;
        EXPECT_EQ(r.error().code.value(), EINVAL) << ragged;
        EXPECT_NE(r.error().message.find("not a whole number of bytes"), std::string::npos)
            << ragged << ": " << r.error().message;
    }
    EXPECT_FALSE(parse_size("16.5E"));
    EXPECT_EQ(parse_size("15.99999999999999999E").error().code.value(), EINVAL);
    for (const char* bad : {"1.", ".5G", "1.5.5G", "-1", "1,5G", ""}) {
        EXPECT_FALSE(parse_size(bad)) << bad;
    }
}

TEST(options, core_table_has_null_blk_names_and_defaults)
{
    auto set = option_set::parse(core_options(), {});
    ASSERT_TRUE(set);
    EXPECT_EQ(set->u64("submit_queues"), 1u);
    EXPECT_EQ(set->u64("poll_queues"), 1u);
    EXPECT_EQ(set->u64("hw_queue_depth"), 64u);
    EXPECT_EQ(set->u64("irqmode"), 1u);
    EXPECT_EQ(set->u64("completion_nsec"), 10000u);
    EXPECT_EQ(set->u64("io_timeout"), 5000u);  // null_blk's tag set: 5 s
    // irqmode above 2 is clamped (null_validate_conf's min_t), not refused.
    auto big = args({"irqmode=3"});
    auto clamped = option_set::parse(core_options(), big);
    ASSERT_TRUE(clamped);
    EXPECT_EQ(clamped->u64("irqmode"), 2u);
    EXPECT_EQ(clamped->value_text("irqmode"), "2");
}

// lib/kstrtox.c as configfs attributes use it.
TEST(options, kernel_unsigned_parsing)
{
    EXPECT_EQ(parse_kernel_unsigned("42").value(), 42u);
    EXPECT_EQ(parse_kernel_unsigned("42\n").value(), 42u);
    EXPECT_EQ(parse_kernel_unsigned("+42").value(), 42u);
    EXPECT_EQ(parse_kernel_unsigned("0x1F").value(), 31u);
    EXPECT_EQ(parse_kernel_unsigned("0X1f").value(), 31u);
    EXPECT_EQ(parse_kernel_unsigned("017").value(), 15u);
    EXPECT_EQ(parse_kernel_unsigned("0").value(), 0u);
    EXPECT_EQ(parse_kernel_unsigned(std::string_view("7\0junk", 6)).value(), 7u);  // a C string
    EXPECT_EQ(parse_kernel_unsigned("18446744073709551615").value(), UINT64_MAX);
    for (const char* bad : {"", "\n", "-1", " 1", "1 ", "1\n\n", "08", "0x", "0xg", "1a", "+"}) {
        auto r = parse_kernel_unsigned(bad);
        ASSERT_FALSE(r) << bad;
        EXPECT_EQ(r.error().code.value(), EINVAL) << bad;
    }
    auto wide = parse_kernel_unsigned("18446744073709551616");
    ASSERT_FALSE(wide);
    EXPECT_EQ(wide.error().code.value(), ERANGE);
    auto past = parse_kernel_unsigned("4294967296", UINT32_MAX);  // kstrtouint
    ASSERT_FALSE(past);
    EXPECT_EQ(past.error().code.value(), ERANGE);
    EXPECT_EQ(parse_kernel_unsigned("4294967295", UINT32_MAX).value(), UINT32_MAX);
}

TEST(options, kernel_signed_and_bool_parsing)
{
    EXPECT_EQ(parse_kernel_signed("-1").value(), -1);
    EXPECT_EQ(parse_kernel_signed("-0x10\n").value(), -16);
    EXPECT_EQ(parse_kernel_signed("-2147483648", INT32_MIN, INT32_MAX).value(), INT32_MIN);
    auto r = parse_kernel_signed("2147483648", INT32_MIN, INT32_MAX);  // kstrtoint
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code.value(), ERANGE);
    EXPECT_FALSE(parse_kernel_signed("--1"));
    for (const char* t : {"1", "y", "Y", "yes", "t", "true", "on", "ON", "oN\n"}) {
        EXPECT_TRUE(parse_kernel_bool(t).value()) << t;
    }
    for (const char* f : {"0", "n", "N", "no", "f", "false", "off", "OFF"}) {
        EXPECT_FALSE(parse_kernel_bool(f).value()) << f;
    }
    for (const char* bad : {"", "2", "o", "x", "maybe", " 1"}) {
        EXPECT_FALSE(parse_kernel_bool(bad)) << bad;
    }
}

// A configfs write only parses; ranges apply at power on (check_ranges).
TEST(options, parsing_and_range_checks_are_two_steps)
{
    auto set = option_set::parse_values(k_defs, args({"size=5000", "blocksize=65536"}));
    ASSERT_TRUE(set) << set.error().message;
    EXPECT_EQ(set->u64("size"), 5000u);  // out of range, stored
    auto checked = *set;
    auto r = checked.check_ranges();
    ASSERT_FALSE(r);
    EXPECT_NE(r.error().message.find("size=5000"), std::string::npos);
    ASSERT_TRUE(set->assign("size", "0x20\n"));
    std::vector<std::string> notes;
    ASSERT_TRUE(set->check_ranges(&notes));
    EXPECT_EQ(set->u64("size"), 32u);
    EXPECT_EQ(set->u64("blocksize"), 4096u);  // clamped and written back
    ASSERT_EQ(notes.size(), 1u);
    EXPECT_NE(notes[0].find("blocksize=65536 clamped to 4096"), std::string::npos) << notes[0];
    EXPECT_EQ(set->value_text("blocksize"), "4096");
    auto unknown = set->assign("nosuch", "1");
    ASSERT_FALSE(unknown);
    EXPECT_EQ(unknown.error().code.value(), ENOENT);
}

// Paths that the daemon opens (images, sockets, directories) are absolute:
// its working directory is not the caller's. Every option table marks them
// with check_absolute_path, so a relative one is refused when written.
TEST(options, path_options_must_be_absolute)
{
    EXPECT_TRUE(check_absolute_path("").has_value());
    EXPECT_TRUE(check_absolute_path("/srv/img").has_value());
    constexpr option_def defs[] = {{.name = "path",
                                    .kind = option_kind::text,
                                    .unit = "absolute path",
                                    .check = check_absolute_path}};
    auto refused = option_set::parse(defs, std::vector<std::string>{"path=img.raw"});
    ASSERT_FALSE(refused.has_value());
    EXPECT_NE(refused.error().message.find("path=img.raw: give an absolute path"),
              std::string::npos)
        << refused.error().message;
    EXPECT_TRUE(option_set::parse(defs, std::vector<std::string>{"path=/srv/img.raw"}).has_value());
}
