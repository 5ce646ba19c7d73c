#include "abi.hpp"

#include <cstring>
#include <fmt/core.h>

namespace softblk::ublk {

namespace {

// Control commands the kernel encodes with _IOR (the others are _IOWR).
bool read_only_ctrl(uint8_t nr)
{
    switch (nr) {
    case k_cmd_get_queue_affinity:
    case k_cmd_get_dev_info:
    case k_cmd_get_params:
    case k_cmd_get_dev_info2:
    case k_cmd_get_features:
    case k_cmd_del_dev_async:
        return true;
    default:
        return false;
    }
}

constexpr const char* k_feature_names[] = {
    "SUPPORT_ZERO_COPY",
    "URING_CMD_COMP_IN_TASK",
    "NEED_GET_DATA",
    "USER_RECOVERY",
    "USER_RECOVERY_REISSUE",
    "UNPRIVILEGED_DEV",
    "CMD_IOCTL_ENCODE",
    "USER_COPY",
    "ZONED",
    "USER_RECOVERY_FAIL_IO",
    "UPDATE_SIZE",
    "AUTO_BUF_REG",
    "QUIESCE",
    "PER_IO_DAEMON",
    "BUF_REG_OFF_DAEMON",
    "BATCH_IO",
    "INTEGRITY",
    "SAFE_STOP_DEV",
    "NO_AUTO_PART_SCAN",
    "SHMEM_ZC",
};

}  // namespace

uint32_t ctrl_op(uint8_t nr, bool ioctl_encode)
{
    return ioctl_encode ? encode_ctrl(nr, read_only_ctrl(nr)) : nr;
}

uint32_t io_op_code(uint8_t nr, bool ioctl_encode)
{
    return ioctl_encode ? encode_io(nr) : nr;
}

uint64_t cmd_buf_offset(unsigned q_id, size_t page_size)
{
    const size_t max_len = cmd_buf_length(k_max_queue_depth, page_size);
    return k_cmd_buf_offset + uint64_t{q_id} * max_len;
}

size_t cmd_buf_length(unsigned depth, size_t page_size)
{
    const size_t bytes = size_t{depth} * sizeof(io_desc);
    return (bytes + page_size - 1) / page_size * page_size;
}

std::string feature_name(unsigned bit)
{
    if (bit < std::size(k_feature_names)) {
        return k_feature_names[bit];
    }
    return fmt::format("bit {}", bit);
}

std::vector<std::string> feature_names(uint64_t features)
{
    std::vector<std::string> out;
    for (unsigned bit = 0; bit < 64; ++bit) {
        if ((features & (uint64_t{1} << bit)) != 0) {
            out.push_back(feature_name(bit));
        }
    }
    return out;
}

std::string state_name(uint16_t state)
{
    switch (state) {
    case k_state_dead:
        return "DEAD";
    case k_state_live:
        return "LIVE";
    case k_state_quiesced:
        return "QUIESCED";
    case k_state_fail_io:
        return "FAIL_IO";
    default:
        return fmt::format("state {}", state);
    }
}

::blk_zone to_blk_zone(const zone_descriptor& zone)
{
    ::blk_zone z{};
    z.start = zone.start >> 9;
    z.len = zone.length >> 9;
    z.wp = zone.write_pointer == UINT64_MAX ? UINT64_MAX : zone.write_pointer >> 9;
    z.type = static_cast<uint8_t>(zone.type);
    z.cond = static_cast<uint8_t>(zone.condition);
    z.capacity = zone.capacity >> 9;
    return z;
}

void zones_to_blk_zones(void* buffer, uint32_t count)
{
    static_assert(sizeof(zone_descriptor) <= sizeof(::blk_zone));
    auto* bytes = static_cast<char*>(buffer);
    for (uint32_t i = count; i > 0; --i) {
        zone_descriptor d;
        std::memcpy(&d, bytes + size_t{i - 1} * sizeof(zone_descriptor), sizeof(d));
        const ::blk_zone z = to_blk_zone(d);
        std::memcpy(bytes + size_t{i - 1} * sizeof(::blk_zone), &z, sizeof(z));
    }
}

}  // namespace softblk::ublk
