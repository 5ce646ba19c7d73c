#include "blk_config.hpp"

#include <algorithm>
#include <bit>
#include <cstring>

#include <linux/virtio_config.h>
#include <softblk/virtio/split_ring.hpp>

#include <softblk/virtio/vhost_user.hpp>

namespace softblk::vhost_user_blk {

namespace {

using virtio::vhost_user::feature_bit;

uint32_t sectors(uint64_t bytes)
{
    return static_cast<uint32_t>(std::min<uint64_t>(bytes / 512, UINT32_MAX));
}

bool read_only(const block_limits& l, const export_settings& s)
{
    return l.read_only || s.read_only;
}

}  // namespace

uint64_t offered_features(const block_limits& l, const export_settings& s)
{
    uint64_t f = feature_bit(VIRTIO_F_VERSION_1) | feature_bit(VIRTIO_RING_F_EVENT_IDX) |
                 feature_bit(VIRTIO_RING_F_INDIRECT_DESC) |
                 feature_bit(virtio::vhost_user::k_f_protocol_features) |
                 feature_bit(VIRTIO_BLK_F_BLK_SIZE) | feature_bit(VIRTIO_BLK_F_TOPOLOGY) |
                 feature_bit(VIRTIO_BLK_F_SEG_MAX) | feature_bit(VIRTIO_BLK_F_MQ);
    if (read_only(l, s)) {
        f |= feature_bit(VIRTIO_BLK_F_RO);
    } else {
        f |= feature_bit(VIRTIO_BLK_F_WRITE_ZEROES);
        if (l.max_discard_bytes != 0) {
            f |= feature_bit(VIRTIO_BLK_F_DISCARD);
        }
    }
    if (l.volatile_write_cache) {
        f |= feature_bit(VIRTIO_BLK_F_FLUSH) | feature_bit(VIRTIO_BLK_F_CONFIG_WCE);
    }
    if (l.zoned) {
        f |= feature_bit(VIRTIO_BLK_F_ZONED);
    }
    return f;
}

virtio::blk_config make_config(const block_limits& l, const export_settings& s, bool wce)
{
    virtio::blk_config c;
    std::memset(&c, 0, sizeof c);
    virtio_blk_config& b = c.base;
    const uint32_t lbs = l.logical_block_size;
    const uint32_t lbs_sectors = std::max<uint32_t>(lbs / 512, 1);
    b.capacity = current_capacity(l) / 512;  // resizes run beside the export
    b.seg_max = k_seg_max;
    b.blk_size = lbs;
    b.physical_block_exp = static_cast<uint8_t>(std::countr_zero(
        std::max<uint32_t>(l.physical_block_size / std::max<uint32_t>(lbs, 1), 1)));
    b.alignment_offset = 0;
    b.min_io_size = static_cast<uint16_t>(std::max<uint32_t>(l.physical_block_size / lbs, 1));
    b.opt_io_size = 0;
    b.wce = wce ? 1 : 0;
    b.num_queues = static_cast<uint16_t>(s.num_queues);
    if (l.max_discard_bytes != 0) {
        b.max_discard_sectors = sectors(l.max_discard_bytes) & ~(lbs_sectors - 1);
        b.max_discard_seg = 1;
        b.discard_sector_alignment = lbs_sectors;
    }
    b.max_write_zeroes_sectors = l.max_write_zeroes_bytes != 0
                                     ? sectors(l.max_write_zeroes_bytes) & ~(lbs_sectors - 1)
                                     : k_emulated_write_zeroes_sectors;
    b.max_write_zeroes_seg = 1;
    // Only a target's own write zeroes may deallocate; the core's
    // emulation writes zero buffers.
    b.write_zeroes_may_unmap = l.max_write_zeroes_bytes != 0 && l.max_discard_bytes != 0 ? 1 : 0;
    if (l.zoned) {
        auto& z = virtio::zoned_of(c);
        z.zone_sectors = sectors(l.zone_size_bytes);
        z.max_open_zones = l.max_open_zones;
        z.max_active_zones = l.max_active_zones;
        z.max_append_sectors = sectors(l.max_zone_append_bytes);
        z.write_granularity = std::max(l.physical_block_size, lbs);
        z.model = VIRTIO_BLK_Z_HM;
    }
    return c;
}

}  // namespace softblk::vhost_user_blk
