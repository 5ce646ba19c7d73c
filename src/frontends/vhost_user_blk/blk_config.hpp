// What the vhost-user-blk back end tells a front end about a device: the
// virtio features it offers and the virtio-blk config space, both derived
// from the device's block_limits and the export's settings.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include <softblk/types.hpp>
#include <softblk/virtio/blk.hpp>

namespace softblk::vhost_user_blk {

// The export's settings (its --export-opt values, resolved).
struct export_settings {
    std::string socket_path;
    unsigned num_queues = 1;
    bool read_only = false;
    std::string poll_us = "auto";  // the poll-us option: auto or a window in µs
    // GET_ID's answer: the device name, at most VIRTIO_BLK_ID_BYTES bytes.
    std::string serial;
};

// Segments per request the back end announces (seg_max).
constexpr uint32_t k_seg_max = 254;
// Write zeroes needs no target support (the core emulates it); without a
// target limit a request may cover this many 512-byte sectors.
constexpr uint32_t k_emulated_write_zeroes_sectors = 1u << 22;  // 2 GiB

// Virtio feature bits offered for a device with limits `l`:
// VERSION_1, EVENT_IDX, INDIRECT_DESC, vhost-user's PROTOCOL_FEATURES,
// BLK_SIZE, TOPOLOGY, SEG_MAX, MQ, WRITE_ZEROES (the core emulates it),
// DISCARD when the device discards, FLUSH and CONFIG_WCE when it has a
// volatile write cache, RO when read-only (device or export), ZONED when
// zoned.
uint64_t offered_features(const block_limits& l, const export_settings& s);

// The config space for those features; `wce` is the write-cache mode the
// driver last set (1: write back).
virtio::blk_config make_config(const block_limits& l, const export_settings& s, bool wce);

}  // namespace softblk::vhost_user_blk
