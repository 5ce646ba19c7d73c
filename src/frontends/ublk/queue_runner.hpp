// One ublk queue: one thread with its own io_uring (SINGLE_ISSUER and
// DEFER_TASKRUN where the kernel has them) that fetches requests from
// /dev/ublkcN (FETCH_REQ), runs them on one device queue (io_queue:
// get_request / submit / process) and commits the result with
// COMMIT_AND_FETCH_REQ from the request's completion callback, which runs
// on the same thread.
//
// Data moves through per-tag buffers: in copy mode the kernel copies into
// and out of them; with USER_COPY the thread pread()s/pwrite()s them from
// /dev/ublkcN itself. Nothing is allocated, logged or thrown per I/O.
//
// With batch_io=1 (UBLK_F_BATCH_IO) the same thread speaks the kernel's
// batched commands instead (queue_runner_batch.cpp): tag lists in, result
// lists out, a zero-copy write's commit linked after it.
#pragma once

#include "abi.hpp"
#include "copy_chooser.hpp"
#include "device_pinning.hpp"
#include "way_chooser.hpp"

#include <softblk/support/level_chooser.hpp>

#include <atomic>
#include <cstdint>
#include <future>
#include <liburing.h>
#include <memory>
#include <optional>
#include <sched.h>
#include <span>
#include <thread>
#include <vector>

#include <softblk/device.hpp>
#include <softblk/external_data.hpp>
#include <softblk/ring_sharing.hpp>

namespace softblk::ublk {

enum class idle_spin_mode : uint8_t { never, measured, always };

struct queue_config {
    unsigned q_id = 0;
    unsigned depth = 0;
    uint32_t buf_bytes = 0;  // per tag
    bool user_copy = false;
    // UBLK_F_SUPPORT_ZERO_COPY granted and the device takes kernel buffers:
    // writes leave their data in the kernel (external_data.hpp)
    // instead of being copied in with pread: those of at least
    // zero_copy_min_bytes, or (-1) every write dispatched while others are
    // in flight in the device queue, and a write alone there where the
    // queue measures zero copy faster for its size (copy_chooser).
    bool zero_copy = false;
    int64_t zero_copy_min_bytes = -1;
    // With user_copy: the device takes a data_window (device::
    // takes_external_data()), so copied reads and writes go to the target with
    // the request's window instead of through the tag's buffer.
    bool target_takes_window = false;
    // Lend the thread's ring to the device queue (its ring-sharing
    // extension, io_queue::ring_sharing(), where it has one):
    // the target's file I/O then goes through it.
    bool shared_ring = true;
    // UBLK_F_BATCH_IO (with USER_COPY): tags arrive in lists from one
    // multishot FETCH_IO_CMDS, results go back in COMMIT_IO_CMDS lists;
    // with AUTO_BUF_REG the kernel puts each request's pages in the ring's
    // table at the tag's index (zero copy without register entries), and a
    // zero-copy write carries its commit linked after it where the device
    // queue allows (queue_ring_sharing::links_completions). zoned: commits carry the
    // zone append sector.
    bool batch = false;
    // UBLK_F_AUTO_BUF_REG, batched or not: the kernel puts each request's
    // pages in the ring's fixed-buffer table at the tag's index (named in
    // every FETCH and COMMIT) and takes them out at its commit; zero-copy
    // writes then take no register entries, and only with the ring lent to
    // the device queue (its file I/O writes them from that table).
    bool auto_buf_reg = false;
    bool zoned = false;
    bool ioctl_encode = true;
    int char_fd = -1;  // /dev/ublkcN, owned by the export
    // The CPUs whose requests the kernel sends to this queue (its blk-mq
    // map); empty: run wherever the scheduler puts the thread. one_cpu:
    // only the first of them the daemon may use.
    std::vector<unsigned> cpus;
    bool one_cpu = false;
    // queue_affinity=auto on a device of 1 or 2 queues, shared by them:
    // where the daemon may use two CPUs or more (cpus_to_measure), every
    // queue's thread goes between all of them and the first, as the device
    // measures data served faster (device_pinning). cpus and one_cpu are
    // then unused.
    std::shared_ptr<device_pinning> pinning;
    // Whether the thread, finding nothing to do and none of its own file
    // I/O in flight, spins watching for the next request before it sleeps:
    // never, always (for idle_spin_max_ns), or for the window up to
    // idle_spin_max_ns that the queue measures to serve the most requests
    // per second (level_chooser: waking a sleeping thread costs more on
    // some machines, a vCPU under software emulation, than on others).
    idle_spin_mode idle_spin = idle_spin_mode::measured;
    uint64_t idle_spin_max_ns = 1'000'000;
};

// The CPUs a queue's thread pins itself to: those of `queue_cpus` (the
// kernel's map for the queue) in `allowed` (the daemon's own set); none
// where that leaves nothing, or leaves all of `allowed`: then there is
// nothing to choose. `one_cpu`: the first of them alone, all of `allowed`
// or not (a single queue's thread then keeps one CPU, and the scheduler
// moves the programs that submit to the others).
std::vector<unsigned> cpus_to_pin(std::span<const unsigned> queue_cpus, const cpu_set_t& allowed,
                                  bool one_cpu = false);

// queue_affinity=auto: the CPU a device's queue threads are measured on
// against running free: the first of `allowed` where that holds two or
// more; none otherwise.
std::vector<unsigned> cpus_to_measure(const cpu_set_t& allowed);

struct queue_counters {
    uint64_t requests = 0;
    uint64_t errors = 0;  // requests committed with a negative result
    uint64_t aborted_tags = 0;
    // Batched: writes the kernel completed through the commit linked after them.
    uint64_t linked_commits = 0;
    // Zero copy: the register entries its writes took (none where the
    // kernel puts their pages in the ring, AUTO_BUF_REG).
    uint64_t buffer_registers = 0;
    // Measured zero copy (copy_chooser): the smallest write size it is
    // ahead at, 0 while it is nowhere ahead (or not measured).
    uint32_t zero_copy_from = 0;
    // The thread spins before it sleeps (idle_spin): its current choice,
    // and of the times it waited for a request, how often it spun.
    bool idle_spinning = false;
    uint64_t idle_spin_us = 0;  // the window now
    uint64_t idle_waits = 0;
    uint64_t idle_spins = 0;
    // queue_affinity=auto: how often the thread went from one way to the
    // other (pinned_cpus() says which way it goes now; what the device
    // measured is device_pinning's).
    uint64_t pin_switches = 0;
};

class queue_runner {
public:
    queue_runner(io_queue& dq, const queue_config& cfg);
    ~queue_runner();
    queue_runner(const queue_runner&) = delete;
    queue_runner& operator=(const queue_runner&) = delete;

    // Starts the thread and returns once it has mapped the descriptor
    // array, set up its ring and submitted FETCH_REQ for every tag (or
    // failed doing so). Control thread.
    result<void> start();

    // The thread ends by itself once the kernel aborted every tag (after
    // STOP_DEV) and the device queue is idle. This asks it to end as soon as
    // the device queue is idle, without waiting for the kernel (its ring is
    // closed, which cancels what the kernel still holds). Any thread.
    void request_exit();
    // Waits up to `timeout_ms` (< 0: forever) for the thread to end by
    // itself; true if it did.
    bool wait_exit(int timeout_ms);
    void join();

    queue_counters counters() const;
    // The idle spin's choice and why (level_chooser::describe).
    nlohmann::json idle_spin_choice() const { return _spin->describe(); }
    unsigned q_id() const { return _cfg.q_id; }
    // The CPUs the thread is pinned to now (empty: not pinned).
    std::vector<unsigned> pinned_cpus() const;

private:
    // Our entries' user_data carry bit 63: with the ring shared, the others
    // are the device queue's (user addresses, below 2^63). Below it, a
    // kind in bits 32..39 and a value (a tag for per-tag commands).
    static constexpr uint64_t k_own_data = uint64_t{1} << 63;
    static constexpr uint64_t k_wake_data = k_own_data | (uint64_t{1} << 32);
    static constexpr uint64_t k_event_data = k_own_data | ((uint64_t{1} << 32) + 1);
    enum batch_kind : uint64_t {
        k_batch_fetch = 2,
        k_batch_prep = 3,
        k_batch_commit = 4,  // value: the commit list
        k_batch_linked = 5,  // value: the tag
    };
    static constexpr uint64_t batch_data(batch_kind kind, uint32_t value)
    {
        return k_own_data | (uint64_t{kind} << 32) | value;
    }

    struct tag_slot {
        queue_runner* runner = nullptr;
        char* buffer = nullptr;
        uint16_t tag = 0;
        uint8_t kernel_op = 0;
        bool aborted = false;
        uint32_t length = 0;
        // Zero copy: this tag's request's data in the kernel (a
        // kernel_buffer).
        external_data data_in_kernel;
        // USER_COPY: where this tag's request's data is (a data_window).
        external_data data_in_window;
        // The request's data goes through `window`, not `buffer`.
        bool windowed = false;
        // A write the chooser times: when it was taken, and which way.
        bool timed = false;
        bool in_kernel = false;
        // A commit is linked after the request's write (batched), and the
        // kernel sent the tag's next request before on_complete saw the
        // write's completion.
        bool linked = false;
        bool refetched = false;
        uint64_t start_ns = 0;
    };

    void run(std::promise<result<void>>& ready);
    result<void> setup();
    void teardown();
    void prep_fetch(tag_slot& slot);
    void prep_commit(tag_slot& slot, int result, uint64_t addr);
    // AUTO_BUF_REG (not batched): the tag's slot in sqe.addr of its FETCH
    // and COMMIT_AND_FETCH.
    void set_auto_buf_reg(io_uring_sqe& sqe, const tag_slot& slot) const;
    // Submits what is prepared and sleeps in the ring until a CQE arrives
    // or the device queue's next event is due (requests in flight).
    int wait_with_device();
    // Nothing to do now: no CQE, no task work the ring holds for us, no
    // device event due. Reads the device queue's eventfd (next_event_ns).
    bool idle() const;
    // Spins until there is work or `until` (monotonic ns); true: work.
    bool spin_until(uint64_t until);
    // Waits for work as idle_spin says, and times the wait for the choice.
    int wait_idle();
    void prep_wake_poll();
    void handle_cqe(const io_uring_cqe& cqe);
    void start_request(tag_slot& slot);
    bool dispatch(tag_slot& slot);
    void retry_backlog();
    static void on_complete(io_request& request, int result);
    // Zero copy: the entries a file ring sends to register and unregister
    // a tag's request pages (kernel_buffer).
    static void prep_register_buffer(io_uring_sqe& sqe, const kernel_buffer& kb);
    static void prep_unregister_buffer(io_uring_sqe& sqe, const kernel_buffer& kb);
    // USER_COPY: pwrite()s `bytes` of the slot's buffer into the kernel's
    // request; returns `result`, or -errno when the copy failed.
    int copy_to_kernel(const tag_slot& slot, size_t bytes, int result) const;
    // UBLK_F_BATCH_IO (queue_runner_batch.cpp).
    result<void> setup_batch();
    void teardown_batch();
    void prep_batch_cmd(io_uring_sqe& sqe, uint8_t nr, const void* elems, unsigned count,
                        uint64_t data) const;
    void prep_batch_fetch();
    void add_batch_commit(uint16_t tag, int result, uint64_t zone_lba);
    // The commits gathered since the last wait go out in one entry.
    void flush_batch_commits();
    void handle_batch_cqe(const io_uring_cqe& cqe);
    static void prep_linked_commit(io_uring_sqe& sqe, const kernel_buffer& kb);
    void pin_thread();
    void pin_io_workers();
    // queue_affinity=auto: once per turn of the loop, ends the device's
    // epoch where it is due and goes the way the device goes.
    void follow_device_pinning();
    io_uring_sqe* next_sqe();
    void set_target(io_uring_sqe* sqe) const;

    io_queue& _dq;
    queue_config _cfg;
    std::thread _thread;
    io_uring _ring{};
    bool _ring_ok = false;
    bool _fixed_file = false;
    // The device queue's ring-sharing extension (ring_sharing.hpp), where
    // it has one and shared_ring=1; nullptr otherwise.
    queue_ring_sharing* _shared = nullptr;
    bool _ring_shared = false;  // the device queue runs its file I/O in _ring
    const io_desc* _descs = nullptr;
    size_t _descs_len = 0;
    char* _buffers = nullptr;
    size_t _buffers_len = 0;
    std::unique_ptr<tag_slot[]> _slots;
    // Tags the kernel handed us while every device request was taken.
    std::unique_ptr<uint16_t[]> _backlog;
    unsigned _backlog_head = 0;
    unsigned _backlog_count = 0;
    unsigned _aborted = 0;
    int _wake_fd = -1;
    uint64_t _wake_buf = 0;
    bool _event_poll_armed = false;  // a poll on the device queue's event_fd() is in the ring
    std::atomic<bool> _exit_requested{false};
    std::atomic<bool> _exited{false};
    std::atomic<uint64_t> _requests{0}, _errors{0}, _aborted_count{0};
    copy_chooser _chooser;
    uint32_t _timed_writes = 0;
    std::atomic<uint32_t> _zero_copy_from{0};
    // How long the thread spins before it sleeps (idle_spin): the window
    // measured to serve the most requests per second, or the one given.
    std::optional<shared_level_chooser> _spin;
    uint64_t _requests_counted = 0;  // of _requests, given to _spin
    std::atomic<bool> _idle_spinning{false};
    std::atomic<uint64_t> _idle_waits{0}, _idle_spins{0};
    // The CPUs the thread was pinned to at start (empty: not pinned), or
    // with queue_affinity=auto the one it keeps to when pinned; both set
    // before start() returns.
    std::vector<unsigned> _pinned_cpus;
    cpu_set_t _free_cpus{};  // queue_affinity=auto: the daemon's own set
    bool _measuring_pin = false;
    bool _pin_stuck = false;  // a switch failed: no more (this thread alone)
    std::atomic<bool> _pinned_now{false};
    std::atomic<uint64_t> _pin_switches{0};

    // UBLK_F_BATCH_IO state.
    // The provided-buffer ring FETCH_IO_CMDS writes tag lists into, and
    // its buffers.
    io_uring_buf_ring* _fetch_ring = nullptr;
    size_t _fetch_ring_len = 0;
    std::unique_ptr<uint16_t[]> _fetch_bufs;
    uint8_t _elem_bytes = 0;
    uint16_t _batch_flags = 0;
    // Commit lists: each in the kernel's hands from its entry to its
    // completion; `_commit_open` gathers (-1: none yet).
    struct commit_list {
        std::unique_ptr<char[]> elems;
        unsigned in_kernel = 0;  // elements sent and not answered yet (0: free)
    };
    std::vector<commit_list> _commit_lists;
    int _commit_open = -1;
    unsigned _commit_count = 0;
    // One element per tag for the commits linked after writes.
    std::unique_ptr<char[]> _linked_elems;
    bool _links = false;  // the device queue lets writes carry their commit
    std::atomic<uint64_t> _linked_commits{0};
    // Made by whichever thread runs the file I/O (the queue's own where it
    // lends its ring).
    std::atomic<uint64_t> _buffer_registers{0};
};

}  // namespace softblk::ublk
