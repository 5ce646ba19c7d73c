// One virtqueue of the vhost-user-blk back end: a thread that owns one
// device queue, sleeps on the ring's kick eventfd (and the device queue's
// event_fd() while requests are out), takes available chains, turns each
// virtio-blk request into one bio for the core, and returns the chain in
// the used ring when the bio completes, signalling the call eventfd when
// the driver asked for it (event index). With poll-us it looks at the
// ring that long before it sleeps.
//
// A malformed chain or request fails that request (with a log line; at
// most k_log_budget lines per ring); a driver that breaks the ring itself
// (a head out of range or twice in flight, an available index running
// ahead) stops the ring and tells the session through `error_fd`, which
// drops the connection. Nothing here touches memory outside the regions
// the front end shared (virtio::guest_memory).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <softblk/device.hpp>
#include <softblk/support/buffer_pool.hpp>
#include <softblk/virtio/inflight.hpp>
#include <softblk/virtio/split_ring.hpp>

#include "blk_config.hpp"

#include <softblk/support/level_chooser.hpp>

#include <optional>

namespace softblk::vhost_user_blk {

// Counters of one ring, kept by the export across connections. Written by
// the ring's thread, read by anyone (relaxed).
struct ring_counters {
    std::atomic<uint64_t> requests{0};
    std::atomic<uint64_t> reads{0};
    std::atomic<uint64_t> writes{0};
    std::atomic<uint64_t> flushes{0};
    std::atomic<uint64_t> discards{0};
    std::atomic<uint64_t> write_zeroes{0};
    std::atomic<uint64_t> get_id{0};
    std::atomic<uint64_t> zone_management{0};  // open, close, finish, reset, reset all
    std::atomic<uint64_t> zone_appends{0};
    std::atomic<uint64_t> report_zones{0};
    std::atomic<uint64_t> unsupported{0};
    std::atomic<uint64_t> errors{0};        // completed with a status other than OK
    std::atomic<uint64_t> bad_requests{0};  // malformed chains and headers
    std::atomic<uint64_t> resubmitted{0};   // from the inflight region after a restart
    std::atomic<uint64_t> bounced{0};       // data not contiguous in our mapping: copied
    std::atomic<uint64_t> wakeups{0};
    std::atomic<uint64_t> notifications{0};
    // The ring's busy-poll window (poll-us: measured, or given), kept across
    // connections like the counters.
    std::optional<shared_level_chooser> poll;
};

struct worker_config {
    unsigned index = 0;
    io_queue* queue = nullptr;
    const block_limits* limits = nullptr;
    const export_settings* settings = nullptr;
    // The session's memory table; changed only while this worker is paused.
    const virtio::guest_memory* memory = nullptr;
    uint64_t desc_addr = 0, avail_addr = 0, used_addr = 0;  // front-end addresses
    uint32_t num = 0;
    uint16_t base = 0;
    bool event_idx = false;
    bool indirect = false;
    bool enabled = false;
    int kick_fd = -1;  // -1: the front end gave none, poll the ring
    int call_fd = -1;  // -1: the front end polls
    // This ring's inflight region (inflight_queue_bytes(num)) or nullptr.
    void* inflight = nullptr;
    // The driver's write-cache mode (SET_CONFIG), shared by the rings.
    const std::atomic<bool>* write_back = nullptr;
    ring_counters* counters = nullptr;
    // An eventfd of the session, written when the driver broke the ring.
    int error_fd = -1;
};

class queue_worker {
public:
    // Descriptors in cfg stay the session's; the worker only uses them.
    explicit queue_worker(const worker_config& cfg);
    ~queue_worker();
    queue_worker(const queue_worker&) = delete;
    queue_worker& operator=(const queue_worker&) = delete;

    // Maps the ring and starts the thread (which first resubmits what the
    // inflight region says was in flight). Returns nullptr or why the ring
    // cannot start. Control thread.
    const char* start();

    // SET_VRING_ENABLE. Any thread.
    void set_enabled(bool on);

    // Parks the thread between requests and returns once it is parked;
    // with `drain`, only after every request it took has completed (so
    // that no pointer into the memory table is in use). Control thread.
    void pause(bool drain);
    // While parked: a new call eventfd (the caller closes the old one), a
    // new kick eventfd, and re-mapping the ring after the memory table
    // changed (nullptr, or why the ring is now unusable: it stays
    // stopped). Control thread.
    void set_call_fd(int fd) { _cfg.call_fd = fd; }
    void set_kick_fd(int fd) { _cfg.kick_fd = fd; }
    const char* reattach();
    void resume();

    // GET_VRING_BASE: takes no more chains, completes the ones it took,
    // ends the thread. Returns the ring's next available index. Control
    // thread.
    uint16_t stop();

private:
    struct request_slot {
        bio b;
        queue_worker* owner = nullptr;
        uint16_t head = 0;
        bool busy = false;
        bool zone_op = false;
        uint8_t kind = 0;           // what completion must do (see queue_worker.cpp)
        uint8_t* status = nullptr;  // the chain's last writable byte
        uint32_t used_len = 0;
        uint8_t* bounce = nullptr;
        unsigned bounce_class = 0;
        // The chain's device-writable segments, for data copied back at
        // completion (bounced reads, zone reports, append sectors).
        std::vector<virtio::segment> in;
    };

    void run();
    void resubmit_inflight();
    unsigned take_requests();  // the requests taken off the available ring
    void start_request(uint16_t head);
    void submit(request_slot& s, io_op op, uint64_t offset, uint64_t length, void* buffer,
                uint32_t flags);
    void finish(request_slot& s, uint8_t status);
    void complete(request_slot& s, int status);
    static void on_bio_done(bio& b, int status);
    bool publish();
    void sleep();
    void bad_request(uint16_t head, const char* why);
    void break_ring(const char* why);
    void log(const char* what, uint64_t value);
    bool idle() const;
    void park();

    worker_config _cfg;
    io_queue& _queue;
    virtio::device_ring _ring;
    virtio::inflight_tracker _inflight;
    std::unique_ptr<request_slot[]> _slots;
    std::vector<virtio::segment> _scratch;
    buffer_pool _bounce{64ull << 20};
    int _wake_fd = -1;
    bool _broken = false;
    unsigned _log_budget = 20;

    std::atomic<bool> _enabled{false};
    std::atomic<int> _command{0};
    std::mutex _park_lock;
    std::condition_variable _park_cv;
    bool _parked = false;
    bool _release = false;
    std::thread _thread;
};

}  // namespace softblk::vhost_user_blk
