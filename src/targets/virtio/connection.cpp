#include "connection.hpp"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <fmt/core.h>

#include <linux/virtio_config.h>

namespace softblk::virtio_driver {

namespace {

namespace vu = virtio::vhost_user;
using vu::feature_bit;

constexpr uint64_t k_wanted_features =
    feature_bit(VIRTIO_F_VERSION_1) | feature_bit(VIRTIO_RING_F_EVENT_IDX) |
    feature_bit(vu::k_f_protocol_features) | feature_bit(VIRTIO_BLK_F_SIZE_MAX) |
    feature_bit(VIRTIO_BLK_F_SEG_MAX) | feature_bit(VIRTIO_BLK_F_BLK_SIZE) |
    feature_bit(VIRTIO_BLK_F_TOPOLOGY) | feature_bit(VIRTIO_BLK_F_MQ) |
    feature_bit(VIRTIO_BLK_F_RO) | feature_bit(VIRTIO_BLK_F_FLUSH) |
    feature_bit(VIRTIO_BLK_F_CONFIG_WCE) | feature_bit(VIRTIO_BLK_F_DISCARD) |
    feature_bit(VIRTIO_BLK_F_WRITE_ZEROES) | feature_bit(VIRTIO_BLK_F_ZONED);
constexpr uint64_t k_wanted_protocol =
    feature_bit(vu::k_pf_mq) | feature_bit(vu::k_pf_reply_ack) | feature_bit(vu::k_pf_config);

// Config bytes read: through write_zeroes_may_unmap and its padding, or
// through the zoned characteristics.
constexpr uint32_t k_config_bytes = offsetof(virtio_blk_config, unused1) + 3;

uint64_t align_up(uint64_t n, uint64_t a)
{
    return (n + a - 1) / a * a;
}

uint32_t round_bytes(uint64_t sectors, uint32_t lbs)
{
    const uint64_t bytes = std::min<uint64_t>(sectors * 512, UINT32_MAX);
    return static_cast<uint32_t>(bytes - bytes % lbs);
}

// Features and protocol features, the queue count, SET_OWNER. Fills
// shape.features (what SET_FEATURES will say) and shape.backend_queues.
result<void> negotiate(vhost_user_client& client, const connection_settings& s, device_shape& shape)
{
    auto offered = client.get_u64(vu::k_get_features);
    if (!offered) {
        return std::unexpected(offered.error());
    }
    if ((*offered & feature_bit(VIRTIO_F_VERSION_1)) == 0) {
        return make_error(EPROTO, fmt::format("path={}: the back end does not offer "
                                              "VIRTIO_F_VERSION_1 (legacy devices are not "
                                              "supported)",
                                              s.path));
    }
    if ((*offered & feature_bit(vu::k_f_protocol_features)) == 0) {
        return make_error(EPROTO,
                          fmt::format("path={}: the back end has no vhost-user protocol features "
                                      "(needed for its config space)",
                                      s.path));
    }
    auto offered_protocol = client.get_u64(vu::k_get_protocol_features);
    if (!offered_protocol) {
        return std::unexpected(offered_protocol.error());
    }
    const uint64_t protocol = *offered_protocol & k_wanted_protocol;
    if ((protocol & feature_bit(vu::k_pf_config)) == 0) {
        return make_error(EPROTO, fmt::format("path={}: the back end does not offer "
                                              "VHOST_USER_PROTOCOL_F_CONFIG (its geometry)",
                                              s.path));
    }
    if (auto r = client.set_u64(vu::k_set_protocol_features, protocol); !r) {
        return r;
    }
    client.set_reply_ack((protocol & feature_bit(vu::k_pf_reply_ack)) != 0);
    shape.backend_queues = 1;
    if ((protocol & feature_bit(vu::k_pf_mq)) != 0) {
        auto n = client.get_u64(vu::k_get_queue_num);
        if (!n) {
            return std::unexpected(n.error());
        }
        shape.backend_queues = static_cast<unsigned>(std::min<uint64_t>(*n, 1024));
    }
    if (s.queue_count > shape.backend_queues) {
        return make_error(
            EINVAL, fmt::format("path={}: the back end offers {} virtqueue{}, and this device "
                                "needs submit_queues + poll_queues = {}: give fewer (e.g. "
                                "poll_queues=0), or export with more queues",
                                s.path, shape.backend_queues, shape.backend_queues == 1 ? "" : "s",
                                s.queue_count));
    }
    if (auto r = client.set_owner(); !r) {
        return r;
    }
    shape.features = *offered & k_wanted_features;
    if (s.indirect) {
        if ((*offered & feature_bit(VIRTIO_RING_F_INDIRECT_DESC)) == 0) {
            return make_error(EINVAL, fmt::format("indirect=1: the back end at {} does not offer "
                                                  "VIRTIO_RING_F_INDIRECT_DESC",
                                                  s.path));
        }
        shape.features |= feature_bit(VIRTIO_RING_F_INDIRECT_DESC);
    }
    return {};
}

// The geometry from the config space into shape.limits and
// shape.data_bytes (may clear the ZONED feature of a host-aware device).
result<void> read_config(const virtio::blk_config& cfg, const connection_settings& s,
                         device_shape& shape)
{
    const virtio_blk_config& c = cfg.base;
    const auto has = [&](unsigned f) { return (shape.features & feature_bit(f)) != 0; };
    block_limits& l = shape.limits;
    const uint32_t lbs = has(VIRTIO_BLK_F_BLK_SIZE) ? c.blk_size : 512;
    if (lbs < 512 || lbs > 65536 || (lbs & (lbs - 1)) != 0) {
        return make_error(EPROTO, fmt::format("path={}: the back end's block size {} is not a "
                                              "power of two from 512 to 65536",
                                              s.path, lbs));
    }
    l.logical_block_size = lbs;
    l.physical_block_size =
        has(VIRTIO_BLK_F_TOPOLOGY) && c.physical_block_exp < 8 ? lbs << c.physical_block_exp : lbs;
    l.capacity_bytes = c.capacity * 512;
    l.capacity_bytes -= l.capacity_bytes % lbs;
    uint64_t transfer = s.max_transfer_bytes;
    if (has(VIRTIO_BLK_F_SIZE_MAX) && c.size_max != 0) {
        transfer = std::min<uint64_t>(transfer, c.size_max);  // one data segment per request
    }
    transfer -= transfer % std::max<uint32_t>(lbs, 4096);
    if (transfer < lbs) {
        return make_error(EINVAL, fmt::format("max_transfer={}: smaller than a block ({} bytes) "
                                              "or the back end's size_max ({})",
                                              s.max_transfer_bytes / 1024, lbs, c.size_max));
    }
    shape.data_bytes = static_cast<uint32_t>(transfer);
    l.max_transfer_bytes = shape.data_bytes;
    l.read_only = has(VIRTIO_BLK_F_RO);
    l.volatile_write_cache =
        has(VIRTIO_BLK_F_FLUSH) && (!has(VIRTIO_BLK_F_CONFIG_WCE) || c.wce != 0);
    l.fua = false;
    if (has(VIRTIO_BLK_F_DISCARD)) {
        l.max_discard_bytes =
            round_bytes(c.max_discard_sectors != 0 ? c.max_discard_sectors : UINT32_MAX, lbs);
    }
    if (has(VIRTIO_BLK_F_WRITE_ZEROES)) {
        l.max_write_zeroes_bytes = round_bytes(
            c.max_write_zeroes_sectors != 0 ? c.max_write_zeroes_sectors : UINT32_MAX, lbs);
    }
    if (has(VIRTIO_BLK_F_ZONED)) {
        const auto& z = virtio::zoned_of(cfg);
        if (z.model != VIRTIO_BLK_Z_HM || z.zone_sectors == 0) {
            // Host-aware devices take random writes: used as a normal disk,
            // as Linux does.
            shape.features &= ~feature_bit(VIRTIO_BLK_F_ZONED);
        } else {
            l.zoned = true;
            l.zone_size_bytes = uint64_t{z.zone_sectors} * 512;
            l.max_open_zones = z.max_open_zones;
            l.max_active_zones = z.max_active_zones;
            l.max_zone_append_bytes =
                std::min<uint32_t>(round_bytes(z.max_append_sectors, lbs), shape.data_bytes);
        }
    }
    return {};
}

// What differs between the device a later connection found and the first
// one's, or "" when it is the same.
std::string difference(const device_shape& was, const device_shape& now)
{
    const block_limits& a = was.limits;
    const block_limits& b = now.limits;
    if (a.capacity_bytes != b.capacity_bytes) {
        return fmt::format("capacity {} bytes, was {}", b.capacity_bytes, a.capacity_bytes);
    }
    if (was.features != now.features) {
        return fmt::format("features {:#x}, were {:#x}", now.features, was.features);
    }
    if (a.logical_block_size != b.logical_block_size ||
        a.physical_block_size != b.physical_block_size || was.data_bytes != now.data_bytes ||
        a.read_only != b.read_only || a.volatile_write_cache != b.volatile_write_cache ||
        a.max_discard_bytes != b.max_discard_bytes ||
        a.max_write_zeroes_bytes != b.max_write_zeroes_bytes || a.zoned != b.zoned ||
        a.zone_size_bytes != b.zone_size_bytes || a.max_open_zones != b.max_open_zones ||
        a.max_active_zones != b.max_active_zones ||
        a.max_zone_append_bytes != b.max_zone_append_bytes) {
        return "another geometry (block sizes, limits or zones)";
    }
    return "";
}

// New memory for every queue: rings, tag areas and data buffers, in a
// sealed memfd, with a kick eventfd per queue.
result<std::shared_ptr<connection_memory>> make_memory(const connection_settings& s,
                                                       const device_shape& shape,
                                                       uint32_t generation,
                                                       const std::vector<int>& call_fds)
{
    auto m = std::make_shared<connection_memory>();
    m->generation = generation;
    const uint64_t page = 4096;
    const uint64_t ring_bytes = align_up(virtio::driver_ring::bytes(shape.ring_num), page);
    const uint64_t tag_bytes = align_up(uint64_t{s.depth} * sizeof(tag_area), page);
    const uint64_t data_bytes = uint64_t{s.depth} * shape.data_bytes;
    const uint64_t per_queue = data_bytes + ring_bytes + tag_bytes;
    m->bytes = per_queue * s.queue_count;
    m->memfd = ::memfd_create("softblk-virtio", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (m->memfd < 0 || ::ftruncate(m->memfd, static_cast<off_t>(m->bytes)) != 0) {
        const int e = errno;
        return make_error(
            e, fmt::format("shared memory of {} bytes (memfd): {}", m->bytes, std::strerror(e)));
    }
    // The back end maps it: it must not change size under its feet.
    ::fcntl(m->memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
    m->base = ::mmap(nullptr, m->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, m->memfd, 0);
    if (m->base == MAP_FAILED) {
        m->base = nullptr;
        const int e = errno;
        return make_error(
            e, fmt::format("mapping {} bytes of shared memory: {}", m->bytes, std::strerror(e)));
    }
    auto* base = static_cast<uint8_t*>(m->base);
    for (unsigned q = 0; q < s.queue_count; ++q) {
        uint8_t* at = base + q * per_queue;
        queue_layout l;
        l.index = q;
        l.data = at;
        l.ring = at + data_bytes;
        l.tags = reinterpret_cast<tag_area*>(at + data_bytes + ring_bytes);
        l.num = shape.ring_num;
        l.depth = s.depth;
        l.data_bytes = shape.data_bytes;
        l.event_idx = (shape.features & feature_bit(VIRTIO_RING_F_EVENT_IDX)) != 0;
        l.indirect = (shape.features & feature_bit(VIRTIO_RING_F_INDIRECT_DESC)) != 0;
        l.polling = q >= s.submit_queues || s.poll;
        l.volatile_cache = shape.limits.volatile_write_cache;
        l.zone_bytes = shape.limits.zone_size_bytes;
        l.capacity_bytes = shape.limits.capacity_bytes;
        l.call_fd = call_fds[q];
        l.kick_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        m->queues.push_back(l);  // closes the kick eventfd with the memory
        if (l.kick_fd < 0) {
            return make_error(EMFILE, "no eventfd for a virtqueue (out of descriptors?)");
        }
    }
    return m;
}

// Every ring: size, base 0, addresses, kick, call, enable.
result<void> start_rings(vhost_user_client& client, const connection_memory& m)
{
    for (const queue_layout& l : m.queues) {
        // Where the driver ring lays its parts out (driver_ring::init).
        virtio::driver_ring ring;
        ring.init(l.ring, l.num, l.event_idx);
        vhost_vring_addr addr{};
        addr.index = l.index;
        addr.desc_user_addr = reinterpret_cast<uint64_t>(ring.desc_addr());
        addr.avail_user_addr = reinterpret_cast<uint64_t>(ring.avail_addr());
        addr.used_user_addr = reinterpret_cast<uint64_t>(ring.used_addr());
        auto r = client.set_state(vu::k_set_vring_num, l.index, l.num);
        if (r) {
            r = client.set_state(vu::k_set_vring_base, l.index, 0);
        }
        if (r) {
            r = client.set_vring_addr(addr);
        }
        if (r) {
            r = client.set_vring_fd(vu::k_set_vring_kick, l.index, l.kick_fd);
        }
        if (r) {
            r = client.set_vring_fd(vu::k_set_vring_call, l.index, l.call_fd);
        }
        if (r) {
            r = client.set_state(vu::k_set_vring_enable, l.index, 1);
        }
        if (!r) {
            return r;
        }
    }
    return {};
}

}  // namespace

result<connection> open_connection(const connection_settings& s, device_shape& shape, bool first,
                                   uint32_t generation, const std::vector<int>& call_fds,
                                   int cancel_fd)
{
    auto client = vhost_user_client::connect(s.path, s.connect_timeout_ms, cancel_fd);
    if (!client) {
        return std::unexpected(client.error());
    }
    connection c{std::move(*client), nullptr};
    device_shape found;
    if (auto r = negotiate(c.client, s, found); !r) {
        return std::unexpected(r.error());
    }
    const uint32_t config_bytes = (found.features & feature_bit(VIRTIO_BLK_F_ZONED)) != 0
                                      ? uint32_t{virtio::k_blk_config_bytes}
                                      : k_config_bytes;
    auto raw = c.client.get_config(config_bytes);
    if (!raw) {
        return std::unexpected(raw.error());
    }
    virtio::blk_config cfg;
    std::memset(&cfg, 0, sizeof cfg);
    std::memcpy(&cfg, raw->data(), std::min<size_t>(raw->size(), sizeof cfg));
    if (auto r = read_config(cfg, s, found); !r) {
        return std::unexpected(r.error());
    }
    if (first) {
        found.ring_num = std::bit_ceil(s.indirect ? s.depth : 3 * s.depth);
        if (found.ring_num > virtio::k_max_queue_size) {
            return make_error(EINVAL,
                              fmt::format("hw_queue_depth={}: needs a ring of {} descriptors, "
                                          "more than {}; give hw_queue_depth={} at most, or "
                                          "indirect=1 (then up to {})",
                                          s.depth, found.ring_num, virtio::k_max_queue_size,
                                          virtio::k_max_queue_size / 3, virtio::k_max_queue_size));
        }
        shape = found;
    } else if (const std::string d = difference(shape, found); !d.empty()) {
        return make_error(EPROTO, fmt::format("path={}: the back end now serves another device "
                                              "({}); this device cannot go on with it",
                                              s.path, d));
    }
    if (auto r = c.client.set_u64(vu::k_set_features, shape.features); !r) {
        return std::unexpected(r.error());
    }
    auto memory = make_memory(s, shape, generation, call_fds);
    if (!memory) {
        return std::unexpected(memory.error());
    }
    c.memory = std::move(*memory);
    // Guest addresses are this process's addresses: descriptors carry
    // pointers as they are.
    const uint64_t where = reinterpret_cast<uint64_t>(c.memory->base);
    if (auto r = c.client.set_mem_table({vu::region_desc{where, c.memory->bytes, where, 0}},
                                        {c.memory->memfd});
        !r) {
        return std::unexpected(r.error());
    }
    if (auto r = start_rings(c.client, *c.memory); !r) {
        return std::unexpected(r.error());
    }
    return c;
}

}  // namespace softblk::virtio_driver
