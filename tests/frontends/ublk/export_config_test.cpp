// The ublk export's zero-copy options: auto_buf_reg parsed and checked
// against the others, and the ADD_DEV flags it leads to for what the
// kernel offers (export_config.hpp). No kernel needed.
#include "abi.hpp"
#include "export_config.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace softblk::ublk {
namespace {

result<export_config> parse(std::vector<std::string> args)
{
    const export_context ctx{.run_dir = "/nonexistent", .privileged = true};
    return parse_config(ctx, args);
}

constexpr uint64_t k_zc = k_f_support_zero_copy;
constexpr uint64_t k_auto = k_f_auto_buf_reg;
// A 7.x kernel's features (AUTO_BUF_REG, 6.16+) and a 6.15's (not).
constexpr uint64_t k_with_auto = k_f_user_copy | k_zc | k_auto | k_f_batch_io;
constexpr uint64_t k_without_auto = k_f_user_copy | k_zc;

TEST(ublk_export_config, auto_buf_reg_takes_auto_0_1)
{
    EXPECT_EQ(parse({})->auto_buf_reg, "auto");
    EXPECT_EQ(parse({"auto_buf_reg=0"})->auto_buf_reg, "0");
    EXPECT_EQ(parse({"auto_buf_reg=1"})->auto_buf_reg, "1");
    const auto bad = parse({"auto_buf_reg=yes"});
    ASSERT_FALSE(bad);
    EXPECT_NE(bad.error().message.find("auto_buf_reg=yes"), std::string::npos)
        << bad.error().message;
}

TEST(ublk_export_config, auto_buf_reg_1_needs_the_shared_ring)
{
    const auto r = parse({"auto_buf_reg=1", "shared_ring=0"});
    ASSERT_FALSE(r);
    EXPECT_NE(r.error().message.find("shared_ring=1"), std::string::npos) << r.error().message;
}

TEST(ublk_export_config, batched_zero_copy_refuses_register_entries)
{
    const auto r = parse({"batch_io=1", "zero_copy=1", "auto_buf_reg=0"});
    ASSERT_FALSE(r);
    EXPECT_NE(r.error().message.find("auto_buf_reg"), std::string::npos) << r.error().message;
}

TEST(ublk_export_config, zero_copy_goes_auto_where_the_kernel_has_it)
{
    const auto c = parse({});
    ASSERT_TRUE(c);
    // zero_copy=auto: asked for.
    auto f = place_zero_copy(*c, k_f_user_copy, k_zc, k_with_auto);
    ASSERT_TRUE(f);
    EXPECT_EQ(f->want, k_f_user_copy);
    EXPECT_EQ(f->ask, k_auto);
    // zero_copy=1: wanted.
    f = place_zero_copy(*c, k_f_user_copy | k_zc, 0, k_with_auto);
    ASSERT_TRUE(f);
    EXPECT_EQ(f->want, k_f_user_copy | k_auto);
    EXPECT_EQ(f->ask, 0u);
}

TEST(ublk_export_config, zero_copy_keeps_register_entries_where_the_kernel_lacks_auto)
{
    const auto c = parse({});
    ASSERT_TRUE(c);
    auto f = place_zero_copy(*c, k_f_user_copy, k_zc, k_without_auto);
    ASSERT_TRUE(f);
    EXPECT_EQ(f->ask, k_zc);
    // GET_FEATURES failed: nothing is known to be there.
    f = place_zero_copy(*c, k_f_user_copy, k_zc, std::nullopt);
    ASSERT_TRUE(f);
    EXPECT_EQ(f->ask, k_zc);
}

TEST(ublk_export_config, auto_buf_reg_0_and_shared_ring_0_keep_register_entries)
{
    for (const char* opt : {"auto_buf_reg=0", "shared_ring=0"}) {
        const auto c = parse({opt});
        ASSERT_TRUE(c) << opt;
        const auto f = place_zero_copy(*c, k_f_user_copy | k_zc, 0, k_with_auto);
        ASSERT_TRUE(f) << opt;
        EXPECT_EQ(f->want, k_f_user_copy | k_zc) << opt;
    }
}

TEST(ublk_export_config, auto_buf_reg_1_wants_it_even_where_zero_copy_is_only_asked)
{
    const auto c = parse({"auto_buf_reg=1"});
    ASSERT_TRUE(c);
    // The feature check then names what the kernel lacks.
    const auto f = place_zero_copy(*c, k_f_user_copy, k_zc, k_without_auto);
    ASSERT_TRUE(f);
    EXPECT_EQ(f->want, k_f_user_copy | k_auto);
    EXPECT_EQ(f->ask, 0u);
}

TEST(ublk_export_config, no_zero_copy_asks_for_nothing)
{
    const auto c = parse({"auto_buf_reg=1"});
    ASSERT_TRUE(c);
    const auto f = place_zero_copy(*c, k_f_user_copy, 0, k_with_auto);
    ASSERT_TRUE(f);
    EXPECT_EQ(f->want, k_f_user_copy);
    EXPECT_EQ(f->ask, 0u);
}

TEST(ublk_export_config, batched_zero_copy_goes_only_auto)
{
    auto c = parse({"batch_io=1"});
    ASSERT_TRUE(c);
    auto f = place_zero_copy(*c, k_f_user_copy | k_f_batch_io, k_zc, k_with_auto);
    ASSERT_TRUE(f);
    EXPECT_EQ(f->ask, k_auto);
    c = parse({"batch_io=1", "shared_ring=0"});
    ASSERT_TRUE(c);
    f = place_zero_copy(*c, k_f_user_copy | k_f_batch_io, k_zc, k_with_auto);
    ASSERT_TRUE(f);
    EXPECT_EQ(f->ask, 0u);
    const auto refused = place_zero_copy(*c, k_f_user_copy | k_f_batch_io | k_zc, 0, k_with_auto);
    ASSERT_FALSE(refused);
    EXPECT_NE(refused.error().message.find("shared_ring=1"), std::string::npos);
}

TEST(ublk_abi, auto_buf_reg_packs_index_and_flags_into_sqe_addr)
{
    // ublk_auto_buf_reg_to_sqe_addr: index in bits 0..15, flags in 16..23.
    EXPECT_EQ(auto_buf_reg_addr(0), 0u);
    EXPECT_EQ(auto_buf_reg_addr(127), 127u);
    EXPECT_EQ(auto_buf_reg_addr(0xffff), 0xffffu);
    EXPECT_EQ(auto_buf_reg_addr(5, k_auto_buf_reg_fallback), 0x10005u);
}

}  // namespace
}  // namespace softblk::ublk
