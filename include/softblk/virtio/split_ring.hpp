// Split virtqueues (virtio 1.2, 2.7), both sides of one implementation:
//
//   device_ring   what a device (the vhost-user-blk back end) does: takes
//                 available descriptor chains, walks them into buffers it
//                 may read and write (walk_chain), returns them in the used
//                 ring and decides whether the driver wants a notification;
//   driver_ring   what a driver (softblk's virtio-blk driver) does: lays
//                 the ring out in memory it shares, makes chains available,
//                 decides whether to kick, collects used entries.
//
// Both support VIRTIO_RING_F_EVENT_IDX (notification suppression by index)
// and the flags-based scheme without it; the device side follows indirect
// descriptor tables (VIRTIO_RING_F_INDIRECT_DESC). The structures and
// constants are the kernel's (<linux/virtio_ring.h>). virtio 1.x rings are
// little-endian; so is every machine softblk builds for (static_assert).
//
// Everything the other side wrote is read once into a local copy and
// checked before use: head and next indices against the queue size, chain
// lengths against a bound (loops), every address range against the shared
// memory (guest_memory). Threading: one ring belongs to one thread.
//
// Pure: standard library and kernel headers only (fuzzed with clang).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>

// The legacy part of the header (vring_init) is not C++.
#ifndef VIRTIO_RING_NO_LEGACY
#define VIRTIO_RING_NO_LEGACY 1
#endif
#include <linux/virtio_ring.h>

#include <softblk/virtio/memory.hpp>

namespace softblk::virtio {

static_assert(std::endian::native == std::endian::little,
              "virtio 1.x rings are little-endian; softblk reads them natively");

// Largest queue size either side accepts (virtio's limit for split rings
// is 32768; QEMU's and libvhost-user's is 1024, which bounds the per-queue
// state a hostile front end can make the back end allocate).
constexpr uint32_t k_max_queue_size = 1024;

// One piece of a request's buffers, mapped in this process.
struct segment {
    uint8_t* ptr = nullptr;
    uint32_t len = 0;
};

// What walk_chain found: the device-readable segments first, then the
// device-writable ones.
struct chain {
    std::span<segment> storage;  // the caller's
    unsigned count = 0;          // segments filled
    unsigned readable = 0;       // the first `readable` are device-readable
    uint64_t readable_bytes = 0;
    uint64_t writable_bytes = 0;
    unsigned descriptors = 0;  // descriptors followed (direct and indirect)

    std::span<segment> readable_segments() const { return storage.first(readable); }
    std::span<segment> writable_segments() const
    {
        return storage.subspan(readable, count - readable);
    }
};

enum class chain_error : uint8_t {
    none,
    head_out_of_range,        // head >= queue size
    next_out_of_range,        // a `next` >= the table's size
    too_long,                 // more descriptors than the table holds: a loop
    indirect_not_negotiated,  // VRING_DESC_F_INDIRECT without the feature
    indirect_bad_size,        // table length 0, not a multiple of 16, or too long
    indirect_nested,          // an indirect descriptor inside an indirect table
    indirect_with_next,       // an indirect descriptor that is not the chain's last
    indirect_unmapped,        // the table is not inside the shared memory
    address_unmapped,         // a buffer is not inside the shared memory
    readable_after_writable,  // a device-readable buffer after a writable one
    too_many_segments,        // more segments than the caller's storage
};

// A short phrase for log lines ("descriptor chain loops").
const char* to_string(chain_error e);

// Walks the chain that starts at `head` in `table` (`num` descriptors,
// already mapped and checked by the caller) into `out.storage`.
// `indirect_allowed`: VIRTIO_RING_F_INDIRECT_DESC was negotiated. Buffers
// that span adjacent memory regions become several segments. Zero-length
// descriptors are skipped. Returns chain_error::none or what was wrong; on
// error `out` holds what was walked before. Any thread; reads the table
// and indirect tables once per descriptor.
chain_error walk_chain(const guest_memory& mem, const vring_desc* table, uint32_t num,
                       uint16_t head, bool indirect_allowed, chain& out);

// Bytes of a split ring's three parts for `num` entries, with the event
// index fields (which cost 2 bytes each and are harmless without the
// feature).
constexpr uint64_t desc_table_bytes(uint32_t num)
{
    return uint64_t{16} * num;
}
constexpr uint64_t avail_ring_bytes(uint32_t num)
{
    return 6 + uint64_t{2} * num;
}
constexpr uint64_t used_ring_bytes(uint32_t num)
{
    return 6 + uint64_t{8} * num;
}

// The device's half of one split virtqueue.
class device_ring {
public:
    // Maps the ring's three parts (front-end virtual addresses, as
    // VHOST_USER_SET_VRING_ADDR gives them) through `mem` and checks their
    // alignment. `num` must be a power of two from 1 to k_max_queue_size.
    // Returns nullptr, or why the ring cannot be used. Owner thread (or
    // before the owner starts).
    const char* attach(const guest_memory& mem, uint64_t desc_uaddr, uint64_t avail_uaddr,
                       uint64_t used_uaddr, uint32_t num, bool event_idx, bool indirect);

    bool attached() const { return _desc != nullptr; }
    uint32_t num() const { return _num; }
    const vring_desc* table() const { return _desc; }
    bool indirect() const { return _indirect; }

    // Where the device starts taking chains (VHOST_USER_SET_VRING_BASE, or
    // recovery from the inflight region). Also resets the used shadow to
    // the used ring's index.
    void set_last_avail(uint16_t idx);
    uint16_t last_avail() const { return _last_avail; }
    // The used ring's index as the driver sees it.
    uint16_t used_idx_in_ring() const;

    // Takes the next available head. Returns 1 and sets `head`, 0 when
    // none is available, -1 when the driver's available index ran more
    // than `num` ahead (a broken or hostile driver: stop the ring).
    int pop(uint16_t& head);

    // Walks `head`'s chain (walk_chain with this ring's table).
    chain_error walk(const guest_memory& mem, uint16_t head, chain& out) const
    {
        return walk_chain(mem, _desc, _num, head, _indirect, out);
    }

    // Puts `head` in the used ring with `len` bytes written. Not visible to
    // the driver until publish_used().
    void push_used(uint16_t head, uint32_t len);
    // The used index as last published.
    uint16_t used_idx() const { return _used_published; }
    // Entries pushed and not published.
    uint16_t unpublished() const { return static_cast<uint16_t>(_used_shadow - _used_published); }

    // Publishes pushed entries. Returns true when the driver asked to be
    // notified of them (event index crossed, or no VRING_AVAIL_F_NO_INTERRUPT).
    bool publish_used();

    // Before sleeping: asks the driver to kick at its next chain (event
    // index = last_avail, or clears VRING_USED_F_NO_NOTIFY) and returns
    // true when a chain arrived meanwhile (do not sleep).
    bool enable_kicks();
    // While busy: kicks are not needed (a no-op with event index, where
    // the stale avail_event already suppresses them).
    void disable_kicks();

private:
    vring_desc* _desc = nullptr;
    vring_avail* _avail = nullptr;
    vring_used* _used = nullptr;
    uint32_t _num = 0;
    bool _event_idx = false;
    bool _indirect = false;
    uint16_t _last_avail = 0;
    uint16_t _avail_cache = 0;  // the driver's avail idx last read
    uint16_t _used_shadow = 0;
    uint16_t _used_published = 0;
};

// The driver's half of one split virtqueue, laid out in memory the driver
// shares: descriptor table, available ring (+ used_event) and used ring
// (+ avail_event), each part aligned as the spec requires.
class driver_ring {
public:
    // Bytes the ring of `num` entries needs (a multiple of 64).
    static uint64_t bytes(uint32_t num);

    // Lays out a ring of `num` (a power of two up to k_max_queue_size)
    // entries in `memory` (bytes(num), 64-byte aligned, zeroed here).
    void init(void* memory, uint32_t num, bool event_idx);

    uint32_t num() const { return _num; }
    vring_desc* table() { return _desc; }
    // Where the three parts are (for VHOST_USER_SET_VRING_ADDR).
    const void* desc_addr() const { return _desc; }
    const void* avail_addr() const { return _avail; }
    const void* used_addr() const { return _used; }

    // Makes the chain that starts at `head` available (not visible until
    // publish()).
    void add(uint16_t head);
    bool has_unpublished() const { return _avail_shadow != _avail_published; }
    // Publishes added chains. Returns true when the device asked to be
    // kicked (event index crossed, or no VRING_USED_F_NO_NOTIFY).
    bool publish();

    // The next used entry: returns true and sets `id`, `len`; false when
    // there is none.
    bool next_used(uint32_t& id, uint32_t& len);

    // Asks the device for a notification at its next used entry (event
    // index = last seen, or clears VRING_AVAIL_F_NO_INTERRUPT). Returns
    // true when entries arrived meanwhile (do not sleep).
    bool enable_interrupts();
    // Asks the device not to notify (polling): the event index is put half
    // the index space ahead, or VRING_AVAIL_F_NO_INTERRUPT is set.
    void disable_interrupts();

private:
    vring_desc* _desc = nullptr;
    vring_avail* _avail = nullptr;
    vring_used* _used = nullptr;
    uint32_t _num = 0;
    bool _event_idx = false;
    uint16_t _avail_shadow = 0;
    uint16_t _avail_published = 0;
    uint16_t _last_used = 0;
};

}  // namespace softblk::virtio
