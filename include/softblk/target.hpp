// Provider API: what a target (null, file, zoned ...) implements, and what
// a decorator (throttle, bad blocks, fault injection, write-back cache)
// wraps. Front ends never include this header; they use device.hpp.
//
// Threading: a target is created once per device. For each device queue the
// core opens one target_queue; all calls on a target_queue come from that
// queue's thread, so per-queue state needs no lock. Data shared by queues
// (the memory store, a cache, a bandwidth bucket) is the target's to protect.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include <softblk/options.hpp>
#include <softblk/types.hpp>

namespace softblk {

class target_ring_sharing;     // ring_sharing.hpp
struct external_data_support;  // external_data.hpp

// Where a target_queue reports finished requests. Implemented by the core's
// queue (which applies the completion mode: inline, deferred, timer) and by
// decorators that need to see their inner target's completions.
class completion_sink {
public:
    // Called on the queue's thread, inline from submit() or later from
    // poll(). `result`: bytes done or a negative errno.
    virtual void complete(io_request& request, int result) = 0;

protected:
    ~completion_sink() = default;
};

// Per-queue half of a target.
class target_queue {
public:
    virtual ~target_queue() = default;

    // Starts `request`, which the core has validated (op supported,
    // offset/length aligned and inside the capacity, length within the
    // limits). The target completes it exactly once through the sink given
    // to open_queue, before returning or later from poll().
    virtual void submit(io_request& request) = 0;

    // Completes work that finished since the last call (io_uring CQEs,
    // throttled requests whose budget arrived, requeued requests). Returns
    // how many requests it completed.
    virtual unsigned poll() { return 0; }

    // True while the target holds requests it has not completed yet and
    // that poll() will complete later (so the queue must keep polling).
    virtual bool busy() const { return false; }

    // A file descriptor that becomes readable when poll() has work (e.g. an
    // io_uring's eventfd), or -1 when the target only needs a timer.
    virtual int wait_fd() const { return -1; }

    // Monotonic time (ns, CLOCK_MONOTONIC) at which poll() should run next
    // even without an event, or UINT64_MAX.
    virtual uint64_t next_wakeup_ns() const { return UINT64_MAX; }

    // The queue's ring-sharing extension (ring_sharing.hpp): a target
    // whose I/O goes through an io_uring of its own (file_ring) may run it
    // in the one its queue's owner sleeps in; nullptr (the default) when
    // it has none. The same answer for the queue's life. Queue thread.
    virtual target_ring_sharing* ring_sharing() { return nullptr; }

    // The core gave up on `request` after the device's I/O timeout (the
    // block layer's timeout handler). Return true if the target released it;
    // the core then completes it with -ETIMEDOUT. Return false if it is
    // still in flight and will be completed normally.
    virtual bool timed_out(io_request& request) { return true; }
};

// Media errors that a decorator injects (bad blocks) and that a target
// applies to its writes itself, because only it knows where a write lands
// and in which order the checks come: a zoned target checks a zone
// append's real position, after the zone-state checks and the implicit
// open, as null_blk does (drivers/block/null_blk/zoned.c, null_zone_write).
class media_errors {
public:
    // For a write of `length` bytes at `offset`: -1 when no bad block is
    // met, else the bytes to transfer before the write fails with -EIO (0:
    // none; badblocks_partial_io: the whole blocks before the first bad
    // one). Counts the failure and, with badblocks_once, clears the bad
    // record met. Any queue thread.
    virtual int64_t check_write(uint64_t offset, uint32_t length) = 0;

protected:
    ~media_errors() = default;
};

// The target as a whole.
class target {
public:
    virtual ~target() = default;

    // Geometry and feature flags. Must not change after creation (a new
    // capacity goes through watch_capacity's callback).
    virtual const block_limits& limits() const = 0;

    // Which external data (external_data.hpp: ublk's zero copy and user
    // copy) its requests may carry instead of a buffer. The default takes
    // none; a target that takes some includes external_data.hpp and says
    // so. Must not change after creation. Control thread.
    virtual external_data_support takes_external_data() const;

    // Where the target reports that its capacity changed under it (an rbd
    // image resized in the cluster): `resized(bytes)`, which the core
    // rounds down to the logical block size and makes the device's
    // capacity. Given once by the core at power on, before any queue opens;
    // the target may call it on a thread of its own (never from a queue's
    // submit or poll) until it is destroyed, and its destructor waits for a
    // call in progress. The default keeps the capacity fixed.
    virtual void watch_capacity(std::function<void(uint64_t bytes)> resized) {}

    // Opens queue `index` (0 .. queue_count-1) whose completions go to
    // `sink`. Called on the control thread before any I/O on that queue.
    virtual result<std::unique_ptr<target_queue>> open_queue(unsigned index,
                                                             completion_sink& sink) = 0;

    // Allocation map of [offset, offset+length), clipped to the capacity,
    // appended to `out` in order with no gaps. Any thread; must be safe
    // against concurrent I/O. The default says everything is data.
    // Reached through report_extents requests: a target queue answers one
    // with answer_report_extents(its target, request).
    virtual int map_extents(uint64_t offset, uint64_t length, std::vector<extent>& out);

    // power=0 / power=1 (null_blk's `power` attribute). Powering off drops
    // what a volatile cache held and was not flushed. Control thread, with
    // no I/O in flight. (The core destroys the target when its device is
    // powered off and makes a new one at power on; this tells the target
    // first.)
    virtual void set_power(bool on) {}

    // Applies a change of one of its own `live` or `powered_on` options
    // (option_update) while the device is powered on: `options` holds every
    // value with the new one. Returns an error with the errno a configfs
    // write would give (the device then keeps the old value). The default
    // knows no option (EOPNOTSUPP: a table that declares an option live
    // must have a target that applies it). Control thread; I/O may be in
    // flight.
    virtual result<void> apply_option(const option_def& def, const option_set& options);

    // Bytes of memory the target holds for data (the memory store, the
    // cache); for benchmarks and `softblk list`.
    virtual uint64_t memory_bytes() const { return 0; }

    // State for `softblk list --json`: counters, cache fill, bad blocks...
    virtual void describe(nlohmann::json& out) const {}

    // Making the device failed after this target was made (an export was
    // refused, a decorator or a queue could not be set up): removes what
    // making it created on disk (an image create=1 made, zone files), each
    // only if it is still the file created (device and inode, never
    // through a link); what existed before stays. Called at most once,
    // before the target is destroyed, with no queue open. Control thread.
    virtual void remove_created() {}

    // A decorator that injects media errors offers them: a target that
    // checks its writes itself (the zoned ones) keeps `errors` (which
    // outlives it), calls it from its queues and returns true; the
    // decorator then leaves writes and zone appends to it. The default
    // declines: the decorator checks before the target. Control thread,
    // before any queue is opened.
    virtual bool take_media_errors(media_errors* errors) { return false; }

    // null_blk's zone_readonly / zone_offline attributes: the sequential
    // zone holding `offset` (bytes) becomes read-only or offline; asking
    // again for the condition it has makes it empty again. Any thread, safe
    // against I/O. Errors name the attribute and the cause. The default:
    // -EOPNOTSUPP (no zoned model with such zones).
    virtual result<void> set_zone_condition(uint64_t offset, zone_condition condition);
};

// The answer to a report_extents request from `t.map_extents`: fills the
// request's buffer (at most report_capacity extents). Returns the number of
// extents filled or -errno. The queue's thread.
int answer_report_extents(target& t, io_request& request);

// Wraps a target to add one concern (throttle, bad blocks, fault injection,
// write-back cache) without the wrapped target knowing. Forwards everything
// it does not change, but takes_external_data(): a decorator takes none
// unless it says so, because one that sends requests of its own for the
// consumer's (a cache, partial I/O) must copy io_request::external into
// them; one that passes the consumer's requests on, or copies the
// extension, forwards its inner target's answer.
class target_decorator : public target {
public:
    explicit target_decorator(std::unique_ptr<target> inner) : _inner(std::move(inner)) {}

    const block_limits& limits() const override { return _inner->limits(); }
    void watch_capacity(std::function<void(uint64_t bytes)> resized) override
    {
        _inner->watch_capacity(std::move(resized));
    }
    result<std::unique_ptr<target_queue>> open_queue(unsigned index, completion_sink& sink) override
    {
        return _inner->open_queue(index, sink);
    }
    int map_extents(uint64_t offset, uint64_t length, std::vector<extent>& out) override
    {
        return _inner->map_extents(offset, length, out);
    }
    void set_power(bool on) override { _inner->set_power(on); }
    result<void> apply_option(const option_def& def, const option_set& options) override
    {
        return _inner->apply_option(def, options);
    }
    uint64_t memory_bytes() const override { return _inner->memory_bytes(); }
    void describe(nlohmann::json& out) const override { _inner->describe(out); }
    void remove_created() override { _inner->remove_created(); }
    bool take_media_errors(media_errors* errors) override
    {
        return _inner->take_media_errors(errors);
    }
    result<void> set_zone_condition(uint64_t offset, zone_condition condition) override
    {
        return _inner->set_zone_condition(offset, condition);
    }

    target& inner() { return *_inner; }
    const target& inner() const { return *_inner; }

protected:
    std::unique_ptr<target> _inner;
};

// What a target keeps while its device is powered off, and hands to the
// target made at the next power on: null_blk keeps a device's data in the
// configfs item (nullb_device), not in the disk (nullb), so `power=0`,
// attribute changes and `power=1` bring the same data back. Owned by the
// device (shared with the target while powered on).
class target_data {
public:
    virtual ~target_data() = default;
    // Bytes of RAM it holds (shown while the device is powered off).
    virtual uint64_t memory_bytes() const { return 0; }
};

// ---------------------------------------------------------------- registry

// How a target type is made from options. The queue options of the core
// (submit_queues, hw_queue_depth, irqmode ...) and the decorators' options
// (mbps, badblocks, cache_size ...) are parsed by the core; `options` holds
// everything, so a target reads only its own keys.
struct target_type {
    std::string_view name;  // "null", "file", "zoned", "zloop"
    std::string_view description;
    // The target's own option table (merged with the core's tables by
    // device creation; a key must be unique across tables).
    std::span<const option_def> options;
    std::function<result<std::unique_ptr<target>>(const option_set& options)> create;
    // Optional: a submission queue count that the type's own options imply,
    // as its kernel counterpart derives it (null_blk's use_per_node_hctx=1
    // sets submit_queues to the number of NUMA nodes). 0 keeps
    // submit_queues. Called before create.
    std::function<unsigned(const option_set& options)> submit_queues = {};
    // Optional: what the kernel counterpart refuses at power on before it
    // clamps anything (null_blk's queue_mode=1). Called first, before the
    // core's rules and the tables' ranges, so that a refusal leaves every
    // value as it was written. Control thread.
    std::function<result<void>(const option_set& options)> refuse_before_clamps = {};
    // Optional, used instead of `create` when given: null_blk's power on.
    // Applies what the kernel counterpart clamps and ignores at power on
    // (null_validate_conf), writing the effective values back into
    // `options` (a later read shows them) and adding a line to `notes` for
    // each value ignored; then makes the target, reusing `kept` (what the
    // device kept from the previous power on, nullptr the first time) and
    // leaving in it what must outlive the power-off (the data). The core
    // has applied its own rules and the tables' ranges before (after
    // refuse_before_clamps). Control
    // thread.
    std::function<result<std::unique_ptr<target>>(
        option_set& options, std::shared_ptr<target_data>& kept, std::vector<std::string>& notes)>
        power_on = {};

    // Optional: the same for the queue depth (zloop's queue_depth sets
    // hw_queue_depth). 0 keeps hw_queue_depth. Called before create.
    std::function<unsigned(const option_set& options)> queue_depth = {};
};

// Registers a target type; called from a static initialiser in the target's
// folder (see src/targets/null). Any thread; returns false if the name is
// taken.
bool register_target_type(const target_type& type);

// Looks a target type up by name; nullptr if unknown.
const target_type* find_target_type(std::string_view name);

// Every registered type, sorted by name.
std::vector<const target_type*> target_types();

}  // namespace softblk
