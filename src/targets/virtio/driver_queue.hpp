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
//
// A request the core times out while the back end holds it is given up
// (timed_out()): its slot stays lent to that back end, which may still
// write into it, so the queue puts nothing more on that connection's ring
// and asks for a new connection (backend_link). Until the new connection's
// memory is ready, new requests wait in their slots; then the queue moves
// to the new memory and resubmits what it holds. The old memory is never
// used again.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

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
    int kick_fd = -1;  // this connection's
    int call_fd = -1;  // the queue's, the same for every connection (wait_fd())
};

// The memory one connection to the back end shares: every queue's ring,
// tag areas and data buffers in one sealed memfd, and each queue's kick
// eventfd. Each connection gets memory of its own: the back end of an old
// connection keeps its mapping for as long as it likes and may still write
// into it, so nothing of it is given to a request again. Freed (unmapped,
// descriptors closed) when the last queue has moved on.
struct connection_memory {
    connection_memory() = default;
    connection_memory(const connection_memory&) = delete;
    connection_memory& operator=(const connection_memory&) = delete;
    ~connection_memory();

    uint32_t generation = 0;  // 1 for the first connection, +1 for each new one
    int memfd = -1;
    void* base = nullptr;
    size_t bytes = 0;
    std::vector<queue_layout> queues;
};

// The connection to the back end as a device's queues see it. The target's
// connection thread changes it; queue threads read it with one atomic
// load per request and take the mutex only to pick up a new connection's
// memory.
class backend_link {
public:
    // `reset_fd`: the eventfd request_reset() writes (the connection
    // thread's). Not owned.
    explicit backend_link(int reset_fd) : _reset_fd(reset_fd) {}

    // The back end is gone for good (it closed the connection, or a new one
    // could not be made): requests fail with -EIO.
    bool dead() const { return _dead.load(std::memory_order_acquire); }
    // The connection queues should put requests on; a queue whose memory
    // is older holds new requests until ready() reaches it.
    uint32_t wanted() const { return _wanted.load(std::memory_order_acquire); }
    // The newest connection whose memory is set up.
    uint32_t ready() const { return _ready.load(std::memory_order_acquire); }
    // That connection's memory. Any thread.
    std::shared_ptr<connection_memory> memory() const;

    // Queue thread: a request that connection `generation` holds was given
    // up; asks the connection thread for a new connection (once per
    // connection: later calls find it asked).
    void request_reset(uint32_t generation);

    // Connection thread: the memory of a new connection (its generation is
    // wanted(), or 1 at first) is set up; queues move to it.
    void publish(std::shared_ptr<connection_memory> memory);
    // Connection thread: the back end is gone for good.
    void fail() { _dead.store(true, std::memory_order_release); }

private:
    int _reset_fd;
    std::atomic<bool> _dead{false};
    std::atomic<uint32_t> _wanted{1};
    std::atomic<uint32_t> _ready{0};
    mutable std::mutex _mutex;
    std::shared_ptr<connection_memory> _memory;
};

class driver_queue {
public:
    // Queue `index` of the device on `link`'s connection (whose memory is
    // published).
    driver_queue(unsigned index, backend_link& link);

    void set_sink(completion_sink* sink) { _sink = sink; }

    // target_queue's calls, on the queue's thread.
    void submit(io_request& r);
    unsigned poll();
    bool busy() const { return _in_flight != 0 || _ring.has_unpublished(); }
    int wait_fd() const { return _layout.polling ? -1 : _layout.call_fd; }
    uint64_t next_wakeup_ns() const;
    // The core gave `r` up (io_timeout): releases it (true). If the back
    // end holds it, its slot stays with that connection, which is replaced.
    bool timed_out(io_request& r);

    // Control path, before the core opens the queue (device creation):
    // runs `r` (tag 0) and waits for it up to `timeout_ns`. Returns the
    // completion's result, or -ETIMEDOUT.
    int run_sync(io_request& r, uint64_t timeout_ns);

    const queue_layout& layout() const { return _layout; }
    const virtio::driver_ring& ring() const { return _ring; }
    // Counters, read by any thread.
    uint64_t bogus_completions() const { return _bogus.load(std::memory_order_relaxed); }
    uint64_t given_up() const { return _given_up.load(std::memory_order_relaxed); }
    uint64_t resubmitted() const { return _resubmitted.load(std::memory_order_relaxed); }

private:
    void attach(std::shared_ptr<connection_memory> memory);
    void move_on();
    void place(io_request& r, bool flush_after_write);
    void prepare(io_request& r, bool flush_after_write);
    void complete(uint32_t id);
    int finish_report(io_request& r, const tag_area& t);
    void fail_all(int result);
    void deliver(io_request& r, int result);
    uint64_t addr(const void* p) const { return reinterpret_cast<uint64_t>(p); }

    unsigned _index;
    backend_link& _link;
    std::shared_ptr<connection_memory> _memory;  // the connection the ring is on
    uint32_t _generation = 0;
    queue_layout _layout;
    virtio::driver_ring _ring;
    completion_sink* _sink = nullptr;
    std::unique_ptr<io_request*[]> _pending;  // by tag
    std::unique_ptr<uint8_t[]> _fua_pending;  // by tag: the write is done, its FLUSH is out
    std::unique_ptr<uint8_t[]> _on_ring;      // by tag: the request is in _ring
    unsigned _in_flight = 0;
    std::atomic<uint64_t> _bogus{0}, _given_up{0}, _resubmitted{0};
};

}  // namespace softblk::virtio_driver
