// Inflight I/O tracking for split virtqueues (vhost-user's
// VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD, docs/interop/vhost-user.rst,
// "Inflight I/O tracking"): the back end records in memory the front end
// keeps which chains it took and which it returned, so that a restarted
// back end resubmits exactly the requests that were in flight when the
// previous one died.
//
// The region is one queue region per virtqueue, each
// inflight_queue_bytes(queue_size) long:
//   header  u64 features, u16 version (1; 0 = never used), u16 desc_num,
//           u16 last_batch_head, u16 used_idx
//   desc[desc_num]  u8 inflight, u8 padding[5], u16 next, u64 counter
// The front end may write it too: every index read from it is checked.
//
// Pure: standard library only.
#pragma once

#include <cstdint>
#include <vector>

namespace softblk::virtio {

struct inflight_desc {
    uint8_t inflight;
    uint8_t padding[5];
    uint16_t next;
    uint64_t counter;
};
static_assert(sizeof(inflight_desc) == 16);

struct inflight_queue_header {
    uint64_t features;
    uint16_t version;
    uint16_t desc_num;
    uint16_t last_batch_head;
    uint16_t used_idx;
};
static_assert(sizeof(inflight_queue_header) == 16);

// Bytes of one queue's region (64-byte aligned so queues do not share a
// cache line).
constexpr uint64_t inflight_queue_bytes(uint32_t queue_size)
{
    return (sizeof(inflight_queue_header) + uint64_t{16} * queue_size + 63) & ~uint64_t{63};
}

// One queue's region, used by the thread that owns the queue.
class inflight_tracker {
public:
    // Attaches to a region of inflight_queue_bytes(queue_size) bytes.
    // A region never used (version 0) or made for another queue size is
    // initialised empty and attach returns false; otherwise it returns
    // true and recover() tells what was in flight.
    bool attach(void* region, uint32_t queue_size);
    bool attached() const { return _header != nullptr; }
    void detach() { _header = nullptr; }

    // After a back end restart: completes the last batch the previous
    // back end returned (when `used_idx_in_ring`, the used ring's index,
    // is ahead of what the region recorded) and fills `heads` with the
    // chains still in flight, oldest first. Returns their number; the
    // ring's last available index is `used_idx_in_ring` plus that.
    unsigned recover(uint16_t used_idx_in_ring, std::vector<uint16_t>& heads);

    // The device took chain `head` from the available ring.
    void taken(uint16_t head);
    // The device put `head` in the used ring (not yet published).
    void returned(uint16_t head);
    // The used ring's index became `used_idx`: the returned chains are
    // no longer in flight.
    void published(uint16_t used_idx);

private:
    inflight_queue_header* _header = nullptr;
    inflight_desc* _desc = nullptr;
    uint32_t _num = 0;
    uint64_t _counter = 1;
    uint16_t _batch = 0;  // chains returned since the last publish
};

}  // namespace softblk::virtio
