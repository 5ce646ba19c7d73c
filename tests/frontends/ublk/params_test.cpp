// block_limits -> SET_PARAMS mapping.
#include "params.hpp"

#include <gtest/gtest.h>

namespace softblk::ublk {
namespace {

block_limits null_4k()
{
    block_limits l;
    l.capacity_bytes = uint64_t{1} << 30;
    l.logical_block_size = 4096;
    l.physical_block_size = 4096;
    l.max_transfer_bytes = 248 * 512;  // null_blk's default, rounded to 4 KiB blocks
    return l;
}

TEST(ublk_params, basic_geometry)
{
    const block_limits l = null_4k();
    auto p = make_params(l, io_buf_bytes_for(l, 4096), 4096);
    ASSERT_TRUE(p) << p.error().message;
    EXPECT_EQ(p->types, k_param_basic);
    EXPECT_EQ(p->len, sizeof(params));
    EXPECT_EQ(p->basic.logical_bs_shift, 12);
    EXPECT_EQ(p->basic.physical_bs_shift, 12);
    EXPECT_EQ(p->basic.dev_sectors, (uint64_t{1} << 30) / 512);
    EXPECT_EQ(p->basic.max_sectors, 248u);
    EXPECT_EQ(p->basic.attrs, 0u);
    EXPECT_EQ(p->basic.virt_boundary_mask, 0u);
}

TEST(ublk_params, attributes)
{
    block_limits l = null_4k();
    l.rotational = true;
    l.read_only = true;
    l.volatile_write_cache = true;
    l.fua = true;
    l.virt_boundary_bytes = 4096;
    auto p = make_params(l, 1 << 20, 4096);
    ASSERT_TRUE(p);
    EXPECT_EQ(p->basic.attrs,
              k_attr_rotational | k_attr_read_only | k_attr_volatile_cache | k_attr_fua);
    EXPECT_EQ(p->basic.virt_boundary_mask, 4095u);
}

TEST(ublk_params, fua_only_with_a_write_cache)
{
    block_limits l = null_4k();
    l.fua = true;
    auto p = make_params(l, 1 << 20, 4096);
    ASSERT_TRUE(p);
    EXPECT_EQ(p->basic.attrs & k_attr_fua, 0u);
}

TEST(ublk_params, discard_and_write_zeroes)
{
    block_limits l = null_4k();
    l.max_discard_bytes = 1u << 30;
    l.max_write_zeroes_bytes = 1u << 20;
    auto p = make_params(l, 1 << 20, 4096);
    ASSERT_TRUE(p);
    EXPECT_EQ(p->types, k_param_basic | k_param_discard);
    EXPECT_EQ(p->discard.max_discard_sectors, (1u << 30) / 512);
    EXPECT_EQ(p->discard.max_write_zeroes_sectors, (1u << 20) / 512);
    EXPECT_EQ(p->discard.discard_granularity, 4096u);
    EXPECT_EQ(p->discard.max_discard_segments, 1);
}

TEST(ublk_params, max_sectors_never_exceeds_the_buffer)
{
    block_limits l = null_4k();
    l.max_transfer_bytes = 4u << 20;
    auto p = make_params(l, 1u << 20, 4096);
    ASSERT_TRUE(p);
    EXPECT_EQ(p->basic.max_sectors, (1u << 20) / 512);
    l.max_transfer_bytes = 0;  // no limit from the target: the buffer is the limit
    p = make_params(l, 512 * 1024, 4096);
    ASSERT_TRUE(p);
    EXPECT_EQ(p->basic.max_sectors, 1024u);
}

TEST(ublk_params, io_buffer_size)
{
    block_limits l = null_4k();
    EXPECT_EQ(io_buf_bytes_for(l, 4096), 126976u);
    l.max_transfer_bytes = 100;
    EXPECT_EQ(io_buf_bytes_for(l, 4096), 4096u);
    l.max_transfer_bytes = 0;
    EXPECT_EQ(io_buf_bytes_for(l, 4096), 512u * 1024);
    l.max_transfer_bytes = UINT32_MAX;
    EXPECT_EQ(io_buf_bytes_for(l, 4096), 32u << 20);
}

TEST(ublk_params, refuses_what_the_kernel_would)
{
    block_limits l = null_4k();
    l.logical_block_size = 8192;
    l.physical_block_size = 8192;
    auto p = make_params(l, 1 << 20, 4096);
    ASSERT_FALSE(p);
    EXPECT_NE(p.error().message.find("8192"), std::string::npos);

    l = null_4k();
    l.capacity_bytes = 4096 + 512;
    EXPECT_FALSE(make_params(l, 1 << 20, 4096));
}

block_limits zoned_4k()
{
    block_limits l = null_4k();
    l.capacity_bytes = 64ull << 20;
    l.zoned = true;
    l.zone_size_bytes = 4 << 20;
    l.zone_capacity_bytes = 3 << 20;
    l.conventional_zones = 1;
    l.max_open_zones = 3;
    l.max_active_zones = 5;
    l.max_zone_append_bytes = 1 << 20;
    return l;
}

TEST(ublk_params, zoned_devices_pass_their_geometry)
{
    block_limits l = zoned_4k();
    auto p = make_params(l, 512 << 10, 4096);
    ASSERT_TRUE(p) << p.error().message;
    EXPECT_EQ(p->types & k_param_zoned, k_param_zoned);
    EXPECT_EQ(p->basic.chunk_sectors, (4u << 20) >> 9);
    EXPECT_EQ(p->zoned.max_open_zones, 3u);
    EXPECT_EQ(p->zoned.max_active_zones, 5u);
    // Zone append is bounded by the largest request (max_sectors: 124 KiB
    // here, the transfer limit), and by the device's own limit below it.
    EXPECT_EQ(p->zoned.max_zone_append_sectors, p->basic.max_sectors);
    EXPECT_EQ(p->basic.max_sectors, 248u);
    l.max_zone_append_bytes = 64 << 10;
    p = make_params(l, 512 << 10, 4096);
    ASSERT_TRUE(p) << p.error().message;
    EXPECT_EQ(p->zoned.max_zone_append_sectors, 128u);
    EXPECT_EQ(p->types & k_param_discard, 0u);
}

TEST(ublk_params, refuses_zoned_devices_the_kernel_would)
{
    block_limits l = zoned_4k();
    l.capacity_bytes += 1 << 20;  // a smaller last zone
    auto p = make_params(l, 512 << 10, 4096);
    ASSERT_FALSE(p);
    EXPECT_NE(p.error().message.find("smaller last zone"), std::string::npos);
    l = zoned_4k();
    l.max_zone_append_bytes = 0;
    p = make_params(l, 512 << 10, 4096);
    ASSERT_FALSE(p);
    EXPECT_NE(p.error().message.find("zone append"), std::string::npos);
    l = zoned_4k();
    l.max_active_zones = 17;
    EXPECT_FALSE(make_params(l, 512 << 10, 4096));
    l = zoned_4k();
    l.zone_size_bytes = 3 << 20;
    EXPECT_FALSE(make_params(l, 512 << 10, 4096));
}

TEST(ublk_params, physical_block_below_logical_is_raised)
{
    block_limits l = null_4k();
    l.logical_block_size = 4096;
    l.physical_block_size = 512;
    auto p = make_params(l, 1 << 20, 4096);
    ASSERT_TRUE(p);
    EXPECT_EQ(p->basic.physical_bs_shift, 12);
}

}  // namespace
}  // namespace softblk::ublk
