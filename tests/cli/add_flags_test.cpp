// `softblk add`'s friendly flags map onto the target's own options with the
// same meaning.
#include <gtest/gtest.h>

#include "add_flags.hpp"

using namespace softblk::cli;

TEST(add_flags, size_and_block_size_become_null_blk_options)
{
    add_flags flags;
    flags.size = "4G";
    flags.block_size = "4096";
    flags.memory_backed = true;
    flags.queues = "2";
    flags.depth = "32";
    auto options = apply_add_flags("null", {"irqmode=0"}, flags);
    ASSERT_TRUE(options) << options.error().message;
    const std::vector<std::string> expected = {"irqmode=0",       "size=4096",
                                               "blocksize=4096",  "memory_backed=1",
                                               "submit_queues=2", "hw_queue_depth=32"};
    EXPECT_EQ(*options, expected);
}

TEST(add_flags, size_must_be_whole_mebibytes_for_null)
{
    add_flags flags;
    flags.size = "1536K";
    auto options = apply_add_flags("null", {}, flags);
    ASSERT_FALSE(options);
    EXPECT_NE(options.error().message.find("--size"), std::string::npos);
    flags.size = "banana";
    EXPECT_FALSE(apply_add_flags("null", {}, flags));
}

// `--size 1.5G` said "unknown size suffix (use K, M, G or T)", and 1P did
// not parse though 1023T did.
TEST(add_flags, size_takes_fractions_and_peta)
{
    add_flags flags;
    flags.size = "1.5G";
    auto options = apply_add_flags("null", {}, flags);
    ASSERT_TRUE(options) << options.error().message;
    EXPECT_EQ(*options, std::vector<std::string>{"size=1536"});
    flags.size = "1P";
    options = apply_add_flags("null", {}, flags);
    ASSERT_TRUE(options) << options.error().message;
    EXPECT_EQ(*options, std::vector<std::string>{"size=1073741824"});
    flags.size = "1.1K";
    options = apply_add_flags("null", {}, flags);
    ASSERT_FALSE(options);
    EXPECT_NE(options.error().message.find("--size 1.1K: not a whole number of bytes"),
              std::string::npos)
        << options.error().message;
}

TEST(add_flags, a_flag_and_the_same_key_value_option_conflict)
{
    add_flags flags;
    flags.size = "64M";
    auto options = apply_add_flags("null", {"size=32"}, flags);
    ASSERT_FALSE(options);
    EXPECT_NE(options.error().message.find("size=32"), std::string::npos);

    add_flags bs;
    bs.block_size = "4096";
    // bs is the alias of blocksize: still the same option.
    auto aliased = apply_add_flags("null", {"bs=512"}, bs);
    ASSERT_FALSE(aliased);
    EXPECT_NE(aliased.error().message.find("bs=512"), std::string::npos);
}

TEST(add_flags, no_flags_leave_the_options_as_given)
{
    auto options = apply_add_flags("null", {"memory_backed=1", "bs=4096"}, add_flags{});
    ASSERT_TRUE(options);
    EXPECT_EQ(options->size(), 2u);
    // An unknown type is device::create's to report, unless flags need mapping.
    EXPECT_TRUE(apply_add_flags("no_such_type", {"a=1"}, add_flags{}));
    add_flags flags;
    flags.memory_backed = true;
    EXPECT_FALSE(apply_add_flags("no_such_type", {}, flags));
}
