// virtio-blk (virtio 1.2, 5.2) for both sides: the kernel's UAPI
// definitions (<linux/virtio_blk.h>), the zoned-device parts that the
// machine's headers (Linux 6.1) predate (added in Linux 6.3, same values),
// the config space with its zoned characteristics, and the mappings
// between virtio-blk statuses and zone values and softblk's errno results
// and zone model, so that the back end and the driver translate alike.
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstdint>

#include <linux/virtio_blk.h>

#include <softblk/types.hpp>

#ifndef VIRTIO_BLK_F_ZONED
#define VIRTIO_BLK_F_ZONED 17
#define VIRTIO_BLK_T_ZONE_APPEND 15
#define VIRTIO_BLK_T_ZONE_REPORT 16
#define VIRTIO_BLK_T_ZONE_OPEN 18
#define VIRTIO_BLK_T_ZONE_CLOSE 20
#define VIRTIO_BLK_T_ZONE_FINISH 22
#define VIRTIO_BLK_T_ZONE_RESET 24
#define VIRTIO_BLK_T_ZONE_RESET_ALL 26
#define VIRTIO_BLK_Z_NONE 0
#define VIRTIO_BLK_Z_HM 1
#define VIRTIO_BLK_Z_HA 2
#define VIRTIO_BLK_ZT_CONV 1
#define VIRTIO_BLK_ZT_SWR 2
#define VIRTIO_BLK_ZT_SWP 3
#define VIRTIO_BLK_ZS_NOT_WP 0
#define VIRTIO_BLK_ZS_EMPTY 1
#define VIRTIO_BLK_ZS_IOPEN 2
#define VIRTIO_BLK_ZS_EOPEN 3
#define VIRTIO_BLK_ZS_CLOSED 4
#define VIRTIO_BLK_ZS_RDONLY 13
#define VIRTIO_BLK_ZS_FULL 14
#define VIRTIO_BLK_ZS_OFFLINE 15
#define VIRTIO_BLK_S_ZONE_INVALID_CMD 3
#define VIRTIO_BLK_S_ZONE_UNALIGNED_WP 4
#define VIRTIO_BLK_S_ZONE_OPEN_RESOURCE 5
#define VIRTIO_BLK_S_ZONE_ACTIVE_RESOURCE 6
#define SOFTBLK_VIRTIO_BLK_OWN_ZONED_STRUCTS 1
#endif

namespace softblk::virtio {

#if defined(SOFTBLK_VIRTIO_BLK_OWN_ZONED_STRUCTS)
struct virtio_blk_zoned_characteristics {
    uint32_t zone_sectors;
    uint32_t max_open_zones;
    uint32_t max_active_zones;
    uint32_t max_append_sectors;
    uint32_t write_granularity;
    uint8_t model;
    uint8_t unused2[3];
} __attribute__((packed));

struct virtio_blk_zone_descriptor {
    uint64_t z_cap;
    uint64_t z_start;
    uint64_t z_wp;
    uint8_t z_type;
    uint8_t z_state;
    uint8_t reserved[38];
};

struct virtio_blk_zone_report {
    uint64_t nr_zones;
    uint8_t reserved[56];
};

// The whole config space: the kernel's (up to the secure-erase fields)
// followed by the zoned characteristics.
struct blk_config {
    virtio_blk_config base;
    virtio_blk_zoned_characteristics zoned;
} __attribute__((packed));
static_assert(sizeof(virtio_blk_config) == 72, "Linux 6.1's virtio_blk_config");

inline virtio_blk_zoned_characteristics& zoned_of(blk_config& c)
{
    return c.zoned;
}
inline const virtio_blk_zoned_characteristics& zoned_of(const blk_config& c)
{
    return c.zoned;
}
#else
using ::virtio_blk_zone_descriptor;
using ::virtio_blk_zone_report;
using ::virtio_blk_zoned_characteristics;
struct blk_config {
    virtio_blk_config base;
} __attribute__((packed));

inline virtio_blk_zoned_characteristics& zoned_of(blk_config& c)
{
    return c.base.zoned;
}
inline const virtio_blk_zoned_characteristics& zoned_of(const blk_config& c)
{
    return c.base.zoned;
}
#endif

static_assert(sizeof(virtio_blk_zone_descriptor) == 64);
static_assert(sizeof(virtio_blk_zone_report) == 64);
static_assert(sizeof(virtio_blk_outhdr) == 16);
static_assert(sizeof(virtio_blk_discard_write_zeroes) == 16);

// Bytes of the config space a device offers (through the zoned fields).
constexpr uint32_t k_blk_config_bytes = sizeof(blk_config);

// Bytes of a write-zeroes/discard range and of the out header.
constexpr uint32_t k_blk_outhdr_bytes = sizeof(virtio_blk_outhdr);
constexpr uint32_t k_blk_range_bytes = sizeof(virtio_blk_discard_write_zeroes);

// The status a device returns for a softblk result (0 or -errno): zone
// resource errors as the kernel maps them (BLK_STS_ZONE_OPEN_RESOURCE is
// -ETOOMANYREFS, BLK_STS_ZONE_ACTIVE_RESOURCE -EOVERFLOW), unsupported
// operations as UNSUPP, an invalid zone operation as ZONE_INVALID_CMD,
// everything else as IOERR.
inline uint8_t status_from_errno(int result, bool zone_op)
{
    if (result >= 0) {
        return VIRTIO_BLK_S_OK;
    }
    switch (-result) {
    case EOPNOTSUPP:
        return VIRTIO_BLK_S_UNSUPP;
    case ETOOMANYREFS:
        return VIRTIO_BLK_S_ZONE_OPEN_RESOURCE;
    case EOVERFLOW:
        return VIRTIO_BLK_S_ZONE_ACTIVE_RESOURCE;
    case EINVAL:
        return zone_op ? VIRTIO_BLK_S_ZONE_INVALID_CMD : VIRTIO_BLK_S_IOERR;
    default:
        return VIRTIO_BLK_S_IOERR;
    }
}

// The softblk result for a device's status (the driver's side).
inline int errno_from_status(uint8_t status)
{
    switch (status) {
    case VIRTIO_BLK_S_OK:
        return 0;
    case VIRTIO_BLK_S_UNSUPP:
        return -EOPNOTSUPP;
    case VIRTIO_BLK_S_ZONE_INVALID_CMD:
        return -EINVAL;
    case VIRTIO_BLK_S_ZONE_OPEN_RESOURCE:
        return -ETOOMANYREFS;
    case VIRTIO_BLK_S_ZONE_ACTIVE_RESOURCE:
        return -EOVERFLOW;
    default:  // IOERR, ZONE_UNALIGNED_WP, anything unknown
        return -EIO;
    }
}

// Zone types and conditions: softblk's values are the kernel's block
// layer values; virtio's differ for types only by name and for states are
// the same numbers. Unknown values from the other side become
// sequential-write-required / offline.
inline uint8_t virtio_zone_type(zone_type t)
{
    switch (t) {
    case zone_type::conventional:
        return VIRTIO_BLK_ZT_CONV;
    case zone_type::sequential_write_preferred:
        return VIRTIO_BLK_ZT_SWP;
    default:
        return VIRTIO_BLK_ZT_SWR;
    }
}

inline zone_type zone_type_from_virtio(uint8_t t)
{
    switch (t) {
    case VIRTIO_BLK_ZT_CONV:
        return zone_type::conventional;
    case VIRTIO_BLK_ZT_SWP:
        return zone_type::sequential_write_preferred;
    default:
        return zone_type::sequential_write_required;
    }
}

inline uint8_t virtio_zone_state(zone_condition c)
{
    return static_cast<uint8_t>(c);
}

inline zone_condition zone_condition_from_virtio(uint8_t s)
{
    switch (s) {
    case VIRTIO_BLK_ZS_NOT_WP:
    case VIRTIO_BLK_ZS_EMPTY:
    case VIRTIO_BLK_ZS_IOPEN:
    case VIRTIO_BLK_ZS_EOPEN:
    case VIRTIO_BLK_ZS_CLOSED:
    case VIRTIO_BLK_ZS_RDONLY:
    case VIRTIO_BLK_ZS_FULL:
        return static_cast<zone_condition>(s);
    default:
        return zone_condition::offline;
    }
}

static_assert(static_cast<uint8_t>(zone_condition::implicit_open) == VIRTIO_BLK_ZS_IOPEN);
static_assert(static_cast<uint8_t>(zone_condition::full) == VIRTIO_BLK_ZS_FULL);
static_assert(static_cast<uint8_t>(zone_condition::offline) == VIRTIO_BLK_ZS_OFFLINE);

}  // namespace softblk::virtio
