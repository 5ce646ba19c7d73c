// Consumer API: what front ends (ublk, FUSE, NBD, vhost-user-blk) and
// programs (tests, benchmarks, the FAT library) call. They never see which
// target serves the device.
//
// Model: a device has N queues (submit_queues, then poll_queues). Each
// queue has hw_queue_depth tags; a tag is a preallocated io_request. A
// queue is driven by one thread at a time: that thread takes requests
// (get_request), submits them and runs the queue (process / wait), which is
// where completions are delivered according to the completion mode:
//   irqmode=0 inline    the callback runs inside submit() when the target
//                       completes at once;
//   irqmode=1 deferred  the callback runs at the queue's next process/wait
//                       (null_blk's softirq mode);
//   irqmode=2 timer     the callback runs completion_nsec after the target
//                       completed (null_blk's hrtimer mode);
//   poll queues         completions wait for an explicit process/wait call,
//                       never inline.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include <softblk/options.hpp>
#include <softblk/types.hpp>

namespace softblk {

class queue_ring_sharing;      // ring_sharing.hpp: an extension ublk asks for
struct external_data_support;  // external_data.hpp: one more

class target;

struct bio;
class io_queue;

// Called once when a whole bio is done, on the thread that drives its
// queue, possibly inside io_queue::submit(bio&) (a bio the core refuses at
// once, or a target that completes inline). `status` is 0 or a negative
// errno: the error of the first failing piece in offset order.
using bio_completion_fn = void (*)(bio& b, int status);

// A request of any size (the kernel's bio): the core splits it into
// io_requests on the device's limits (max_transfer_bytes, max_discard_bytes,
// max_write_zeroes_bytes, zone boundaries), emulates write_zeroes by writing
// zeros where the target has no write_zeroes, waits for free tags without
// blocking the caller, and completes it once. Front ends hand their
// protocol's requests to the core as bios and never split or emulate.
// Owned by the consumer, who must keep it alive until its completion.
struct bio {
    // ---- filled by the consumer (as io_request; `length` may be any size)
    io_op op = io_op::read;
    uint32_t flags = 0;
    uint64_t offset = 0;
    uint64_t length = 0;
    void* buffer = nullptr;
    uint32_t report_capacity = 0;  // report_zones, report_extents
    bio_completion_fn on_complete = nullptr;
    void* user_data = nullptr;

    // ---- results
    // Data operations: bytes done from `offset` on, in order: `length` on
    // success; on error, the bytes before the first one that failed.
    // Report operations: entries filled.
    uint64_t transferred = 0;
    // zone_append: byte offset where the data landed.
    uint64_t result_offset = 0;

    // ---- owned by the core from submit to completion
    bio* next = nullptr;  // the queue's list of bios waiting for a tag
    struct split_state {
        io_op op = io_op::read;  // what the pieces do (write for emulated zeroes)
        bool emulated_zeroes = false;
        bool submitting = false;    // inside submit: completions only count
        bool waiting = false;       // on the queue's wait list
        bool started = false;       // its first piece went out
        uint32_t piece_max = 0;     // largest piece (0: one piece)
        uint64_t next_offset = 0;   // where the next piece starts
        uint64_t left = 0;          // bytes not submitted yet
        unsigned pending = 0;       // pieces in the target
        int status = 0;             // first error in offset order
        uint64_t failed_at = 0;     // offset of that error (UINT64_MAX: none)
        io_queue* queue = nullptr;  // the queue it was submitted to
    } split;
};

// A bio for the common case (no report buffer, no completion callback).
inline bio make_bio(io_op op, uint64_t offset, uint64_t length, void* buffer, uint32_t flags = 0)
{
    bio b;
    b.op = op;
    b.flags = flags;
    b.offset = offset;
    b.length = length;
    b.buffer = buffer;
    return b;
}

enum class completion_mode : uint8_t {
    inline_completion = 0,  // irqmode=0
    deferred = 1,           // irqmode=1 (null_blk: softirq)
    timer = 2,              // irqmode=2 (null_blk: timer, completion_nsec)
};

// The queue settings the core applies to every target type. The option
// names, units and defaults are null_blk's (see core_options()).
struct queue_config {
    unsigned submit_queues = 1;
    unsigned poll_queues = 1;
    unsigned queue_depth = 64;  // hw_queue_depth
    completion_mode mode = completion_mode::deferred;
    uint64_t completion_nsec = 10'000;
    bool shared_tags = false;        // one tag set for all devices with shared_tags=1
    bool shared_tag_bitmap = false;  // one tag bitmap for all queues of this device
    bool blocking = false;           // the target may sleep in submit (BLK_MQ_F_BLOCKING)
    uint64_t io_timeout_ms = 5'000;  // the request timeout (null_blk's tag set: 5 s)
};

struct device_info {
    std::string name;
    std::string target_type;
    block_limits limits;
    queue_config queues;
};

// Per-queue counters, read by any thread (relaxed).
struct queue_stats {
    uint64_t submitted = 0;
    uint64_t completed = 0;
    uint64_t errors = 0;
    uint64_t bytes_read = 0;
    uint64_t bytes_written = 0;
    uint64_t timeouts = 0;
};

class io_queue {
public:
    virtual ~io_queue() = default;

    virtual unsigned index() const = 0;
    virtual bool is_poll_queue() const = 0;
    // The device's limits (as device::limits()). Any thread.
    virtual const block_limits& limits() const = 0;
    virtual unsigned depth() const = 0;

    // Takes a free tag. Returns nullptr when every tag is in flight (the
    // caller runs the queue and retries). The request's public fields are
    // reset to their defaults.
    virtual io_request* get_request() = 0;

    // Returns a request taken with get_request that was not submitted.
    virtual void put_request(io_request& request) = 0;

    // Submits a request taken from this queue. Requests the core rejects
    // (misaligned, beyond the capacity, unsupported op, device powered off)
    // complete with a negative errno through the normal completion path.
    virtual void submit(io_request& request) = 0;

    // Submits a bio of any size: the core splits it into this queue's
    // requests as the device's limits demand, taking tags as they free up
    // (it never waits inside this call), and calls its on_complete once,
    // from here (refused at once, or inline completion) or from a later
    // process()/wait(). in_flight() counts each bio waiting for a tag once,
    // besides its pieces in the target.
    // Owner thread.
    virtual void submit(bio& b) = 0;

    // Submits `b` and runs this queue until `b` completes (other requests'
    // callbacks run meanwhile): one synchronous request for an owner that
    // drives the queue. Returns b's status (0 or -errno); `b.transferred`
    // and `b.result_offset` are filled, `b.on_complete` is not called.
    // Owner thread.
    int run(bio& b);

    // The allocation map of [offset, offset+length), clipped to the
    // capacity, in order and without gaps: report_extents requests for the
    // whole blocks through run(), cut back to the range. A target without a
    // map (-EOPNOTSUPP) is all data. Owner thread.
    result<std::vector<extent>> map(uint64_t offset, uint64_t length);

    // Delivers every completion that is due, without sleeping. Returns the
    // number of callbacks run.
    virtual unsigned process() = 0;

    // Runs the queue until at least `min_completions` callbacks ran or
    // `timeout_ns` passed (negative: no limit), sleeping when nothing is
    // due. Returns the number of callbacks run.
    virtual unsigned wait(unsigned min_completions, int64_t timeout_ns = -1) = 0;

    // Requests submitted and not yet completed, plus bios waiting for a tag.
    virtual unsigned in_flight() const = 0;

    // For owners that sleep in an event loop of their own (ublk, NBD)
    // rather than in wait(): the CLOCK_MONOTONIC time (ns) at which
    // process() next has work that no new submission brings: 0 when
    // completions are due now, UINT64_MAX when nothing is in flight or
    // only event_fd() can say when. Owner thread.
    virtual uint64_t next_event_ns() const = 0;

    // A descriptor that becomes readable when the target has completions
    // for process() (e.g. an io_uring's eventfd), or -1. Owners add it to
    // what they sleep on while next_event_ns() is in the future.
    virtual int event_fd() const = 0;

    // For owners that wait in an io_uring of their own (ublk's queue
    // thread): the queue's ring-sharing extension (ring_sharing.hpp), or
    // nullptr when its target has no ring I/O to run in the owner's (every
    // target but the file and zloop ones). Owner thread.
    virtual queue_ring_sharing* ring_sharing() { return nullptr; }

    virtual queue_stats stats() const = 0;

    // ---- control submissions: a second submitter on a driven queue
    //
    // A queue is driven by one thread, but a program's control thread (the
    // daemon's `softblk zone` on an exported device) may need to put a
    // request on it too, ordered with the owner's I/O as the core orders
    // the bios of one queue. An owner that drives the queue from a loop of
    // its own (a front end's queue thread) attaches with a function that
    // wakes that loop; post() then hands bios to it through the queue's
    // inbox (a lock-free handoff_list), and the owner's next process() or
    // wait() submits them as submit(bio&) would, behind what it submitted
    // before. Without an owner, post() runs the bio on the calling thread
    // under the lock device::execute takes.

    // Makes the calling thread the queue's owner for post(). `wake` runs on
    // post()'s thread when the inbox becomes non-empty, and must make the
    // owner call process() soon without blocking (write the eventfd its
    // loop sleeps on). While posted bios wait, in_flight() counts them and
    // next_event_ns() is 0, so an owner that runs the queue while
    // in_flight() is not 0 takes them. Waits for a post() that is running
    // a bio on its caller's thread. Owner thread.
    virtual void attach_owner(std::function<void()> wake) = 0;

    // Ends attach_owner: true when nothing is in flight (in_flight() is 0:
    // no posted bio waits or runs); false, still attached, otherwise (the
    // owner runs the queue and asks again), so that no posted bio is left
    // without a thread to complete it. Owner thread.
    virtual bool detach_owner() = 0;

    // Hands `b` to the queue's owner, which submits it in order with its own
    // bios and runs b.on_complete on its thread; with no owner attached,
    // runs `b` here (on_complete is called before post returns). `b` is
    // owned by the caller until its completion. Any thread but the owner's.
    virtual void post(bio& b) = 0;

    // post(b) and wait for its completion: one synchronous control request.
    // Returns b's status (0 or -errno), `b.transferred` and
    // `b.result_offset` filled; `b.on_complete` is not called. Any thread
    // but the owner's.
    int call(bio& b);
};

class device {
public:
    virtual ~device() = default;

    // Creates a device of target type `type` (e.g. "null") from null_blk
    // style key=value options ("memory_backed=1", "size=4096", "bs=4096"):
    // configfs' mkdir, the writes, and `echo 1 > power` unless the options
    // say power=0 (then the device is made powered off, with no queues, and
    // set_power(true) powers it on later). Values are parsed as configfs
    // parses them; the power-on rules (ranges, clamps, what null_blk
    // ignores) apply at power on. Errors name the offending attribute and
    // its valid range, with the errno the kernel's write would give.
    // Control thread; the caller owns the device.
    static result<std::unique_ptr<device>> create(std::string name, std::string_view type,
                                                  std::span<const std::string> options);

    // The geometry and queue settings of the device as last powered on
    // (before the first power on: name and type only).
    virtual const device_info& info() const = 0;
    const block_limits& limits() const { return info().limits; }
    // Which external data (external_data.hpp: ublk's zero copy and user
    // copy) its requests may carry instead of a buffer, as last powered on
    // (none before): what its target and decorators take. Control thread.
    virtual external_data_support takes_external_data() const = 0;
    const std::string& name() const { return info().name; }

    // Queues 0 .. submit_queues-1 are submit queues, then the poll queues.
    // None while powered off: power-off destroys them (references to them
    // end there) and power-on makes new ones.
    virtual unsigned queue_count() const = 0;
    virtual io_queue& queue(unsigned index) = 0;

    // Thread-safe synchronous I/O for callers that own no queue (FUSE
    // workers, tools, the FAT library): picks a submit queue for the calling
    // thread, locks it, submits `b` as a bio (split by the core) and waits.
    // Returns `b`'s status (0 or -errno; -ENODEV while powered off);
    // `b.transferred` and `b.result_offset` are filled, `b.on_complete` is
    // not called. Do not mix with asynchronous use of the same queues from
    // other threads, nor with set_power or set_option from another thread.
    virtual int execute(bio& b) = 0;

    // A control submission: runs `b` on submit queue 0 through
    // io_queue::call, so that while an export's thread drives the queue
    // (it attached as its owner) the request goes through that thread's
    // loop, in order with the export's I/O and without blocking it, and
    // otherwise runs on this thread as execute() does. Returns `b`'s status
    // (0 or -errno; -ENODEV while powered off). Not from a queue's owner,
    // nor with set_power or set_option from another thread. Control thread.
    virtual int execute_control(bio& b) = 0;

    // The same for the common case. Returns bytes done for read, write and
    // zone_append (`length`), entries filled for report operations, 0 for
    // the others, or -errno.
    int execute(io_op op, uint64_t offset, uint32_t length, void* buffer, uint32_t flags = 0);

    // The allocation map of [offset, offset+length), clipped to the
    // capacity, in order and without gaps (SEEK_DATA/SEEK_HOLE, NBD
    // base:allocation). Travels through a submit queue as report_extents
    // requests, like execute(). Any thread (ENODEV while powered off).
    virtual result<std::vector<extent>> map(uint64_t offset, uint64_t length) = 0;

    // Zones from the one that holds `offset` on, at most `max_zones`
    // (report_zones through execute(), or through execute_control() when
    // `control`). -EOPNOTSUPP if not zoned.
    result<std::vector<zone_descriptor>> report_zones(uint64_t offset, uint32_t max_zones,
                                                      bool control = false);

    // null_blk's zone_readonly / zone_offline (a live attribute): the
    // sequential zone holding byte `offset` becomes read-only or offline
    // (finished first); asking again for the condition it has makes it
    // empty. Errors (-EINVAL: a conventional zone, beyond the device;
    // -EOPNOTSUPP: no such zones in this model) name the cause. Any thread,
    // safe against I/O.
    virtual result<void> set_zone_condition(uint64_t offset, zone_condition condition) = 0;

    // A change of the capacity the target reported (an rbd image resized
    // in the cluster): limits().capacity_bytes already holds `bytes` (read
    // it with current_capacity()) when the listener runs. Requests beyond
    // the new end fail with -EIO from then on, as the block layer's. The
    // listener runs on the thread that reported the change (the target's
    // own, never a queue thread), one call at a time; it tells the front
    // end's users what its protocol allows and must not wait for the
    // device's I/O. Returns a handle for remove_capacity_listener. Any
    // thread.
    using capacity_listener = std::function<void(uint64_t bytes)>;
    virtual uint64_t add_capacity_listener(capacity_listener listener) = 0;
    // Ends a listener; once this returns it runs no more (a call in
    // progress is waited for). Any thread but the listener's own.
    virtual void remove_capacity_listener(uint64_t handle) = 0;

    // null_blk's `power`. On: applies the power-on rules to the options
    // (clamped and ignored values are written back; notes() says what was
    // ignored), makes the target (with the data kept from before), its
    // decorators and the queues; on an error the device stays off. Off:
    // destroys the queues and the target; the data of a memory-backed
    // device, the bad blocks and the fault-injection state stay, the
    // volatile cache's unflushed data does not. Writing the state it has is
    // a no-op. EBUSY when I/O is in flight. Control thread; nobody may be
    // driving the queues (front ends are stopped first).
    virtual result<void> set_power(bool on) = 0;
    virtual bool powered() const = 0;

    // The caller's add failed after create() returned (its export was
    // refused, its state could not be written): powers the device off and
    // removes what making its target created on disk (an image create=1
    // made, zone files), each only if it is still the file created; what
    // existed before stays (target::remove_created). The caller then
    // destroys the device. Control thread; nobody may be driving the
    // queues.
    virtual void undo_create() = 0;

    // One configfs write of attribute `key` (a name or an alias, or
    // "power"): the value is parsed first (EINVAL, ERANGE), then the
    // attribute's update rule applies (option_update): EBUSY for one that
    // changes only while powered off, EPERM for a creation-only one, EINVAL
    // for a powered-on-only one while off; a live one is applied at once; a
    // `reconfigure` one while powered on re-creates the queues (EINVAL where
    // null_blk refuses the count), for which nobody may be driving them
    // (see releases_queues). On an error nothing changes. Control thread.
    virtual result<void> set_option(std::string_view key, std::string_view value) = 0;

    // True when writing `key` now would destroy the queues (power, and
    // `reconfigure` attributes while powered on): a caller that drives them
    // (an export) must stop first and start again after. Control thread.
    virtual bool releases_queues(std::string_view key) const = 0;

    // What a configfs read of attribute `key` returns, newline included
    // ("1\n"; badblocks as "start length" lines; nothing for an empty list).
    // Errors: ENOENT unknown, EACCES write-only. Control thread.
    virtual result<std::string> get_option(std::string_view key) const = 0;

    // Lines saying what the last power-on or set_option clamped or ignored
    // (null_blk's log lines: "discard=1 ignored: ..."). Control thread.
    virtual const std::vector<std::string>& notes() const = 0;

    // Every option with its value as a read shows it (what re-creates the
    // device). Control thread.
    virtual const option_set& options() const = 0;

    // Counters and target state for `softblk list --json`. Control thread
    // (the counters themselves are read without locks).
    virtual void describe(nlohmann::json& out) const = 0;

    // Bytes of RAM held for data (kept while powered off).
    virtual uint64_t memory_bytes() const = 0;
};

// The option table of the core (queue settings and the decorators:
// throttle, bad blocks, fault injection, cache), merged with each target's.
std::span<const option_def> core_options();

// Every option a target type accepts (core + target), for `softblk
// features` and documentation.
std::vector<option_def> options_for(std::string_view type);

// null_blk's module parameters for target type `type` ("gb=1", "bs=4096",
// "poll_queues=4"): defaults that every device of the type made afterwards
// starts from (device::create parses them before its own options and
// counts them as given, so they are persisted with the device), and the
// limit of poll_queues (null_blk clamps a device's poll_queues to the
// module's). Replaces earlier defaults. Errors as option_set::parse_values,
// and EPERM for an option that is not a module parameter of null_blk's
// (power, index, badblocks, the fault-injection fields). Control thread,
// before devices are made.
result<void> set_option_defaults(std::string_view type, std::span<const std::string> args);
std::vector<std::string> option_defaults(std::string_view type);

// The number of CPUs the kernel could run (nr_cpu_ids: the count in
// /sys/devices/system/cpu/possible), to which null_blk clamps submit_queues.
unsigned possible_cpus();

}  // namespace softblk
