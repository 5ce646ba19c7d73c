// One virtqueue of softblk's virtio-blk driver: turns io_requests into
// virtio-blk requests in memory shared with the back end, and used entries
// back into completions. Each tag owns a fixed slot: three direct
// descriptors (3 * tag ...) or one ring descriptor with a three-entry
// indirect table, a header area and a data buffer of max_transfer_bytes,
// so a request needs no allocation and no descriptor bookkeeping.
//
// Submission is batched: submit() only fills the ring; poll() publishes
// what was added (one kick for the batch, when the back end asked for it)
// and collects completions. Completions are found by polling the used ring
// or, between polls, by sleeping on the call eventfd (wait_fd()). One
// thread drives a queue (the core's rule for queues).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include <softblk/target.hpp>
#include <softblk/virtio/blk.hpp>
#include <softblk/virtio/split_ring.hpp>

namespace softblk::virtio_driver {

// Per-tag header area in the shared memory.
struct tag_area {
    virtio_blk_outhdr header;               // device-readable
    uint8_t in[16];                         // zone append: sector, then status at [15]
    virtio_blk_discard_write_zeroes range;  // device-readable
    uint8_t unused[16];
    vring_desc indirect[3];  // the tag's indirect table
    uint8_t unused2[16];
};
static_assert(sizeof(tag_area) == 128);

struct queue_layout {
    unsigned index = 0;
    uint8_t* ring = nullptr;   // driver_ring::bytes(num)
    tag_area* tags = nullptr;  // depth entries
    uint8_t* data = nullptr;   // depth * data_bytes
    uint32_t num = 0;
    uint32_t depth = 0;
    uint32_t data_bytes = 0;
    bool event_idx = false;
    bool indirect = false;
    bool polling = false;         // never sleep on the call eventfd
    bool volatile_cache = false;  // FUA writes are followed by a FLUSH
    uint64_t zone_bytes = 0;      // zoned: the zone size (reports carry no length)
    uint64_t capacity_bytes = 0;
    int kick_fd = -1;
    int call_fd = -1;
};

class driver_queue {
public:
    // `dead` turns true when the back end's connection is gone: requests
    // in flight then fail with -EIO (nobody will complete them).
    driver_queue(const queue_layout& layout, const std::atomic<bool>& dead);

    void set_sink(completion_sink* sink) { _sink = sink; }

    // target_queue's calls, on the queue's thread.
    void submit(io_request& r);
    unsigned poll();
    bool busy() const { return _in_flight != 0 || _ring.has_unpublished(); }
    int wait_fd() const { return _layout.polling ? -1 : _layout.call_fd; }
    uint64_t next_wakeup_ns() const;

    // Control path, before the core opens the queue (device creation):
    // runs `r` (tag 0) and waits for it up to `timeout_ns`. Returns the
    // completion's result, or -ETIMEDOUT.
    int run_sync(io_request& r, uint64_t timeout_ns);

    const queue_layout& layout() const { return _layout; }
    const virtio::driver_ring& ring() const { return _ring; }
    uint64_t bogus_completions() const { return _bogus; }

private:
    void prepare(io_request& r, bool flush_after_write);
    void complete(uint32_t id);
    int finish_report(io_request& r, const tag_area& t);
    void fail_all(int result);
    void deliver(io_request& r, int result);
    uint64_t addr(const void* p) const { return reinterpret_cast<uint64_t>(p); }

    queue_layout _layout;
    const std::atomic<bool>& _dead;
    virtio::driver_ring _ring;
    completion_sink* _sink = nullptr;
    std::unique_ptr<io_request*[]> _pending;  // by tag
    std::unique_ptr<uint8_t[]> _fua_pending;  // by tag: the write is done, its FLUSH is out
    unsigned _in_flight = 0;
    uint64_t _bogus = 0;
    // run_sync's completion.
    io_request* _sync_done = nullptr;
    int _sync_result = 0;
};

}  // namespace softblk::virtio_driver
