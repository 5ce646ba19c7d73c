// The ublk ABI as encoded on the wire: ioctl-encoded command numbers,
// descriptor array offsets, USER_COPY offsets, feature and state names.
// Expected values are the kernel's (include/uapi/linux/ublk_cmd.h), spelled
// out as numbers so that a wrong macro cannot agree with itself.
#include "abi.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace softblk::ublk {
namespace {

TEST(ublk_abi, control_commands_are_ioctl_encoded_like_the_kernel)
{
    // _IOWR('u', nr, struct ublksrv_ctrl_cmd): dir 3, size 32, type 'u'.
    EXPECT_EQ(ctrl_op(k_cmd_add_dev, true), 0xc0207504u);
    EXPECT_EQ(ctrl_op(k_cmd_del_dev, true), 0xc0207505u);
    EXPECT_EQ(ctrl_op(k_cmd_start_dev, true), 0xc0207506u);
    EXPECT_EQ(ctrl_op(k_cmd_stop_dev, true), 0xc0207507u);
    EXPECT_EQ(ctrl_op(k_cmd_set_params, true), 0xc0207508u);
    EXPECT_EQ(ctrl_op(k_cmd_start_user_recovery, true), 0xc0207510u);
    EXPECT_EQ(ctrl_op(k_cmd_end_user_recovery, true), 0xc0207511u);
    // UBLK_U_CMD_UPDATE_SIZE (Linux 6.16): _IOWR('u', 0x15, ...).
    EXPECT_EQ(ctrl_op(k_cmd_update_size, true), 0xc0207515u);
    // _IOR for the GET_* commands: dir 2.
    EXPECT_EQ(ctrl_op(k_cmd_get_dev_info, true), 0x80207502u);
    EXPECT_EQ(ctrl_op(k_cmd_get_params, true), 0x80207509u);
    EXPECT_EQ(ctrl_op(k_cmd_get_dev_info2, true), 0x80207512u);
    EXPECT_EQ(ctrl_op(k_cmd_get_features, true), 0x80207513u);
}

TEST(ublk_abi, legacy_opcodes_are_the_bare_numbers)
{
    EXPECT_EQ(ctrl_op(k_cmd_add_dev, false), 0x04u);
    EXPECT_EQ(ctrl_op(k_cmd_get_dev_info2, false), 0x12u);
    EXPECT_EQ(io_op_code(k_io_fetch_req, false), 0x20u);
    EXPECT_EQ(UBLK_CMD_ADD_DEV, k_cmd_add_dev);
    EXPECT_EQ(UBLK_IO_COMMIT_AND_FETCH_REQ, k_io_commit_and_fetch_req);
}

TEST(ublk_abi, io_commands_are_ioctl_encoded_like_the_kernel)
{
    // _IOWR('u', nr, struct ublksrv_io_cmd): size 16.
    EXPECT_EQ(io_op_code(k_io_fetch_req, true), 0xc0107520u);
    EXPECT_EQ(io_op_code(k_io_commit_and_fetch_req, true), 0xc0107521u);
    EXPECT_EQ(io_op_code(k_io_need_get_data, true), 0xc0107522u);
}

TEST(ublk_abi, descriptor_arrays_are_spaced_by_the_largest_queue)
{
    // 4096 descriptors of 24 bytes = 98304 bytes = 24 pages per queue.
    EXPECT_EQ(cmd_buf_offset(0, 4096), 0u);
    EXPECT_EQ(cmd_buf_offset(1, 4096), 98304u);
    EXPECT_EQ(cmd_buf_offset(3, 4096), 3u * 98304u);
    EXPECT_EQ(cmd_buf_length(128, 4096), 4096u);  // 3072 bytes, one page
    EXPECT_EQ(cmd_buf_length(256, 4096), 8192u);  // 6144 bytes
    EXPECT_EQ(cmd_buf_length(4096, 4096), 98304u);
}

TEST(ublk_abi, user_copy_offsets_pack_queue_tag_and_offset)
{
    EXPECT_EQ(user_copy_offset(0, 0), 0x80000000ull);
    EXPECT_EQ(user_copy_offset(0, 1), 0x80000000ull + (1ull << 25));
    EXPECT_EQ(user_copy_offset(1, 0), 0x80000000ull + (1ull << 41));
    EXPECT_EQ(user_copy_offset(2, 3, 512), 0x80000000ull + (2ull << 41) + (3ull << 25) + 512);
}

TEST(ublk_abi, feature_bits_have_the_kernel_names)
{
    EXPECT_EQ(k_f_user_recovery, uint64_t{UBLK_F_USER_RECOVERY});
    EXPECT_EQ(k_f_user_recovery_reissue, uint64_t{UBLK_F_USER_RECOVERY_REISSUE});
    EXPECT_EQ(feature_name(3), "USER_RECOVERY");
    EXPECT_EQ(feature_name(5), "UNPRIVILEGED_DEV");
    EXPECT_EQ(feature_name(7), "USER_COPY");
    EXPECT_EQ(feature_name(9), "USER_RECOVERY_FAIL_IO");
    // What a 6.12 kernel reports: bits 1-8 (zero copy is never reported).
    const auto names = feature_names(0x1feull);
    ASSERT_EQ(names.size(), 8u);
    EXPECT_EQ(names.front(), "URING_CMD_COMP_IN_TASK");
    EXPECT_EQ(names.back(), "ZONED");
}

TEST(ublk_abi, unknown_feature_bits_are_named_by_number)
{
    const auto names = feature_names((1ull << 3) | (1ull << 40) | (1ull << 63));
    ASSERT_EQ(names.size(), 3u);
    EXPECT_EQ(names[0], "USER_RECOVERY");
    EXPECT_EQ(names[1], "bit 40");
    EXPECT_EQ(names[2], "bit 63");
}

TEST(ublk_abi, device_states_have_names)
{
    EXPECT_EQ(state_name(UBLK_S_DEV_DEAD), "DEAD");
    EXPECT_EQ(state_name(UBLK_S_DEV_LIVE), "LIVE");
    EXPECT_EQ(state_name(UBLK_S_DEV_QUIESCED), "QUIESCED");
    EXPECT_EQ(state_name(3), "FAIL_IO");
    EXPECT_EQ(state_name(9), "state 9");
}

TEST(ublk_abi, io_op_and_flag_values_match_the_system_header)
{
    EXPECT_EQ(k_op_read, UBLK_IO_OP_READ);
    EXPECT_EQ(k_op_write, UBLK_IO_OP_WRITE);
    EXPECT_EQ(k_op_flush, UBLK_IO_OP_FLUSH);
    EXPECT_EQ(k_op_discard, UBLK_IO_OP_DISCARD);
    EXPECT_EQ(k_op_write_zeroes, UBLK_IO_OP_WRITE_ZEROES);
    EXPECT_EQ(k_io_f_fua, uint32_t{UBLK_IO_F_FUA});
    EXPECT_EQ(k_io_f_nounmap, uint32_t{UBLK_IO_F_NOUNMAP});
    EXPECT_EQ(k_attr_volatile_cache, uint32_t{UBLK_ATTR_VOLATILE_CACHE});
    EXPECT_EQ(k_attr_fua, uint32_t{UBLK_ATTR_FUA});
}

TEST(ublk_abi, report_zones_entries_are_blk_zone_in_sectors)
{
    zone_descriptor d;
    d.start = 8 << 20;
    d.length = 4 << 20;
    d.capacity = 3 << 20;
    d.write_pointer = (8 << 20) + 4096;
    d.type = zone_type::sequential_write_required;
    d.condition = zone_condition::implicit_open;
    const ::blk_zone z = to_blk_zone(d);
    EXPECT_EQ(z.start, 16384u);
    EXPECT_EQ(z.len, 8192u);
    EXPECT_EQ(z.capacity, 6144u);
    EXPECT_EQ(z.wp, 16392u);
    EXPECT_EQ(z.type, 2);          // BLK_ZONE_TYPE_SEQWRITE_REQ
    EXPECT_EQ(z.cond, 2);          // BLK_ZONE_COND_IMP_OPEN
    d.write_pointer = UINT64_MAX;  // none: stays all ones
    EXPECT_EQ(to_blk_zone(d).wp, UINT64_MAX);

    // In place, from descriptors to 64-byte entries.
    std::vector<char> buffer(5 * sizeof(::blk_zone));
    for (uint32_t i = 0; i < 5; ++i) {
        zone_descriptor e = d;
        e.start = uint64_t{i} << 22;
        e.write_pointer = e.start + 512 * i;
        std::memcpy(buffer.data() + i * sizeof(zone_descriptor), &e, sizeof(e));
    }
    zones_to_blk_zones(buffer.data(), 5);
    for (uint32_t i = 0; i < 5; ++i) {
        ::blk_zone out;
        std::memcpy(&out, buffer.data() + i * sizeof(::blk_zone), sizeof(out));
        EXPECT_EQ(out.start, uint64_t{i} << 13) << i;
        EXPECT_EQ(out.wp, (uint64_t{i} << 13) + i) << i;
        EXPECT_EQ(out.len, 8192u) << i;
    }
}

}  // namespace
}  // namespace softblk::ublk
