// The core's io_queue: tags, validation, completion modes and timeouts.
// Internal to src/core; front ends see io_queue from device.hpp.
#pragma once

#include <atomic>
#include <cerrno>
#include <memory>
#include <mutex>
#include <vector>

#include <softblk/device.hpp>
#include <softblk/external_data.hpp>
#include <softblk/ring_sharing.hpp>
#include <softblk/support/clock.hpp>
#include <softblk/support/handoff_list.hpp>
#include <softblk/support/intrusive_fifo.hpp>
#include <softblk/target.hpp>

namespace softblk::core {

// A tag bitmap that several queues (shared_tag_bitmap) or several devices
// (shared_tags) draw from. Lock-free; any thread.
class shared_tag_pool {
public:
    explicit shared_tag_pool(unsigned depth);
    // A free tag, or -1 when all are taken.
    int get();
    void put(unsigned tag);
    unsigned depth() const { return _depth; }

private:
    unsigned _depth;
    std::unique_ptr<std::atomic<uint64_t>[]> _words;
    unsigned _word_count;
    std::atomic<unsigned> _hint{0};
};

class device_impl;

// The block layer's range check of a request: -EINVAL when `offset` or
// `length` is not a multiple of the logical block size, -EIO when the range
// goes past the capacity, else 0.
inline int check_block_range(const block_limits& lim, uint64_t offset, uint64_t length)
{
    const uint64_t mask = lim.logical_block_size - 1;  // a power of two
    if (((offset | length) & mask) != 0) {
        return -EINVAL;
    }
    const uint64_t capacity = current_capacity(lim);
    if (offset > capacity || length > capacity - offset) {
        return -EIO;  // beyond the end of the device, as the block layer says
    }
    return 0;
}

// Where a request of a queue is (io_request::state).
enum request_state : uint8_t {
    k_free = 0,
    k_owned = 1,        // taken by the consumer, not submitted
    k_in_target = 2,    // submitted, the target holds it
    k_pending = 3,      // completed by the target, waiting for delivery
    k_in_callback = 4,  // its completion callback is running
};

class queue_impl final : public io_queue, public completion_sink, public queue_ring_sharing {
public:
    queue_impl(device_impl& dev, unsigned index, bool poll_queue, unsigned depth,
               std::shared_ptr<shared_tag_pool> shared_tags);
    ~queue_impl() override;

    // Opens the target's half of the queue. Control thread.
    result<void> open(target& t);

    unsigned index() const override { return _index; }
    bool is_poll_queue() const override { return _poll_queue; }
    const block_limits& limits() const override;
    unsigned depth() const override { return _depth; }
    io_request* get_request() override;
    void put_request(io_request& request) override;
    void submit(io_request& request) override;
    void submit(bio& b) override;
    unsigned process() override;
    unsigned wait(unsigned min_completions, int64_t timeout_ns) override;
    unsigned in_flight() const override
    {
        return _in_flight + _bios_waiting.size() + _posted_count.load(std::memory_order_relaxed);
    }
    uint64_t next_event_ns() const override;
    int event_fd() const override;
    queue_ring_sharing* ring_sharing() override { return _tq_ring != nullptr ? this : nullptr; }
    bool share_ring(io_uring* ring) override;
    bool links_completions() const override;
    void ring_completion(uint64_t user_data, int result) override
    {
        _tq_ring->ring_completion(user_data, result);
    }
    queue_stats stats() const override;
    void attach_owner(std::function<void()> wake) override;
    bool detach_owner() override;
    void post(bio& b) override;

    // completion_sink: called by the target on this queue's thread.
    void complete(io_request& request, int result) override;

    // Serialises device::execute callers that share this queue.
    std::mutex& sync_lock() { return _sync_lock; }

    // io_timeout changed while the queue runs. Any thread.
    void set_timeout_ns(uint64_t ns) { _timeout_ns.store(ns, std::memory_order_relaxed); }

private:
    using fifo = intrusive_fifo<io_request>;

    int validate(const io_request& r) const;
    void deliver(io_request& r, int result);
    void deliver_now(io_request& r, int result);
    void release_tag(io_request& r);
    void free_tag(io_request& r);
    unsigned check_timeouts(uint64_t coarse_now);

    // ---- bios (bio.cpp): splitting, emulation, waiting for tags
    int plan(bio& b) const;
    void fill_piece(bio& b, io_request& r);
    // Submits `b`'s next pieces, the first one into `reuse` if given (a tag
    // the caller holds), then as long as tags are free.
    void submit_pieces(bio& b, io_request* reuse);
    void finish(bio& b);
    // Hands a tag the caller holds to the oldest waiting bio that still
    // has pieces to send; false if there is none.
    bool give_tag_to_waiting(io_request& r);
    // Gives free tags to bios that wait for one (shared tag pools free them
    // on other queues).
    void serve_waiting();
    static void piece_done(io_request& r, int result);
    // Submits the bios post() handed over. Owner thread.
    void take_posted();

    device_impl& _dev;
    completion_mode _mode;
    uint64_t _completion_nsec;
    std::atomic<uint64_t> _timeout_ns;  // live (io_timeout); relaxed
    uint64_t timeout_ns() const { return _timeout_ns.load(std::memory_order_relaxed); }
    unsigned _index;
    bool _poll_queue;
    unsigned _depth;
    std::unique_ptr<target_queue> _tq;
    // _tq's ring-sharing extension (nullptr: none), asked once at open().
    target_ring_sharing* _tq_ring = nullptr;
    // What external data the target (with its decorators) takes, asked
    // once at open().
    external_data_support _external;
    std::unique_ptr<io_request[]> _requests;
    std::vector<uint32_t> _free_tags;  // local tag stack (no shared pool)
    std::shared_ptr<shared_tag_pool> _shared_tags;

    fifo _deferred;                     // irqmode=1 and poll queues
    fifo _timer;                        // irqmode=2, ordered by deadline (constant delay)
    fifo _inline_backlog;               // inline completions raised while a callback runs
    intrusive_fifo<bio> _bios_waiting;  // bios that want a tag, in submission order
    bool _delivering = false;
    // The owner's io_uring runs the target's I/O (share_ring, the
    // ring-sharing extension): its
    // completions wake the owner, not event_fd().
    bool _ring_shared = false;
    unsigned _delivered = 0;  // callbacks run, for process/wait accounting
    unsigned _in_flight = 0;
    unsigned _in_target = 0;
    uint64_t _next_timeout_scan = 0;

    std::mutex _sync_lock;

    // Control submissions (post): the owner's wake-up, set while a thread
    // is attached, and the inbox it drains. _owner_mutex orders post()
    // against attach/detach (and is held while post runs a bio itself);
    // _posted_count counts bios posted and not yet taken (in_flight()).
    std::mutex _owner_mutex;
    std::function<void()> _owner_wake;
    handoff_list<bio> _posted;
    std::atomic<unsigned> _posted_count{0};

    // Counters: written by the queue thread, read by others.
    std::atomic<uint64_t> _submitted{0}, _completed{0}, _errors{0}, _bytes_read{0},
        _bytes_written{0}, _timeouts{0};
};

}  // namespace softblk::core
