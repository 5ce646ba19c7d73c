// Provider API: the zone engine, the one implementation of the kernel's
// zoned block device model that every zoned target stands on (the null
// target with zoned=1, the zone-per-file `zloop` target and its RAM
// variant). It keeps each zone's type, condition and write pointer, applies
// every transition of write, zone append, open, close, finish, reset and
// reset all, enforces the open and active zone limits (closing an implicitly
// open zone to make room as its model does), answers report_zones, and
// returns the errors the kernel's drivers return. A target only moves the
// data, between begin_write and end_write (or begin_read and end_read).
//
// Two models (zone_flavor), each exactly as its kernel driver behaves, each
// a type of its own behind this interface (src/core/zone_models.hpp;
// create() picks one):
//   null_blk  drivers/block/null_blk/zoned.c (Linux 6.12, with the partial
//             writes of Linux 6.14+ for bad blocks): separate open and
//             active limits with ZBC/ZNS resource management; the implicitly
//             open zone closed to make room is the next one round robin from
//             the last closed; resource errors are -ETOOMANYREFS (open) and
//             -EOVERFLOW (active), the errno values of
//             BLK_STS_ZONE_OPEN_RESOURCE / BLK_STS_ZONE_ACTIVE_RESOURCE; a
//             full zone's write pointer is its start + capacity (start +
//             length once finished); a smaller last zone is allowed.
//   zloop     drivers/block/zloop.c (Linux 6.15+): an open limit only
//             (max_open_zones), implicitly open zones closed in LRU order
//             (every write moves its zone to the back), an explicit open
//             past the limit or an implicit one with nothing to close fails
//             with -EIO; finish needs no resources; a regular write is
//             checked against the write pointer but not the capacity (as
//             zloop); full and conventional zones report the write pointer
//             UINT64_MAX; a zone whose write failed is re-read from its
//             backing store (zone_backend::stored_bytes) before its next
//             use. softblk adds an active limit to it (max_active_zones,
//             which zloop lacks), with null_blk's -EOVERFLOW.
//
// Concurrency: each zone has its own lock, so queues work on different zones
// in parallel; the open/active counters (and zloop's LRU list) have one more
// lock, taken only when a limit is set (null_blk's zone_res_lock). Lock
// order: zone, then counters. Nothing here allocates after create().
#pragma once

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include <softblk/memory_store.hpp>
#include <softblk/types.hpp>

namespace softblk {

enum class zone_flavor : uint8_t {
    null_blk,
    zloop,
};

const char* to_string(zone_flavor flavor);

// The errno values of the kernel's zone resource statuses (what
// blk_status_to_errno gives for them, and errno_to_blk_status maps back).
// (The kernel's table in block/blk-core.c; any other errno becomes
// BLK_STS_IOERR, i.e. EIO, on its way back through ublk.)
constexpr int k_zone_open_resource_error = ETOOMANYREFS;  // BLK_STS_ZONE_OPEN_RESOURCE
constexpr int k_zone_active_resource_error = EOVERFLOW;   // BLK_STS_ZONE_ACTIVE_RESOURCE

// A write pointer that points nowhere: null_blk's read-only and offline
// zones (NULL_ZONE_INVALID_WP), zloop's full and conventional zones.
constexpr uint64_t k_no_write_pointer = UINT64_MAX;

struct zone_engine_config {
    zone_flavor flavor = zone_flavor::null_blk;
    // Device capacity in bytes. The last zone is smaller when this is not a
    // multiple of the zone size.
    uint64_t capacity_bytes = 0;
    // A power of two, a multiple of block_size.
    uint64_t zone_size_bytes = 0;
    // Writable bytes of each sequential zone (0: the zone size; the last
    // zone may have less); a multiple of block_size.
    uint64_t zone_capacity_bytes = 0;
    // The first zones are conventional (at least one zone stays sequential).
    uint32_t conventional_zones = 0;
    // 0: no limit. null_blk flavour: normalised as null_blk does
    // (effective() says what applies).
    uint32_t max_open_zones = 0;
    uint32_t max_active_zones = 0;
    uint32_t block_size = 512;
    // Sequential zones start full (null_blk's zone_full).
    bool start_full = false;
    // The target copies data while the zone is locked (null_blk's zone
    // mutex over a memory-backed transfer): begin_read then returns with the
    // zone locked too, so that a read never sees half a write. Targets that
    // only queue the transfer (io_uring) leave it false.
    bool lock_reads = true;
    // Charged for the zone descriptors (memory_bytes(), about 64 bytes a
    // zone) while the engine lives: the device's memory store's budget
    // where it has one (its memory_limit then bounds them too), nullptr for
    // the process's budget. Must outlive the engine.
    memory_budget* budget = nullptr;
};

// What the engine asks of the target at the moments its driver touches the
// data. Called on the thread of the operation, with the zone locked.
class zone_backend {
public:
    // Reset: the zone's data is forgotten (null_blk: discard; zloop:
    // truncate the file to 0). null_blk calls it after the zone is empty,
    // zloop before (a failure then leaves the zone as it was and marks it
    // for re-reading). Returns 0 or -errno.
    virtual int reset_zone(uint32_t zone) = 0;
    // Finish: zloop extends the zone's file to the capacity. 0 or -errno.
    virtual int finish_zone(uint32_t zone) { return 0; }
    // The bytes the zone holds as stored (zloop: the file's size), read back
    // after a write failed. -errno when it cannot be read.
    virtual int64_t stored_bytes(uint32_t zone) { return -5; }

protected:
    ~zone_backend() = default;
};

// A zone held between begin_* and end_*: which one, where the data goes and
// whether the zone's lock is held.
struct zone_hold {
    uint32_t zone = 0;
    // Byte offset of the transfer (zone append: the write pointer, which is
    // also what the request's result_offset gets).
    uint64_t offset = 0;
    bool locked = false;
    bool sequential = false;
};

// Counters for describe() and the tests (relaxed).
struct zone_engine_stats {
    uint64_t implicit_closes = 0;  // implicitly open zones closed to make room
    uint64_t open_refused = 0;     // open resource errors
    uint64_t active_refused = 0;   // active resource errors
    uint64_t lock_contended = 0;   // a zone or counter lock found taken
    uint64_t refreshed = 0;        // zones re-read from the backend after a failed write
};

class zone_engine {
public:
    // Builds the zones from `config` (validated: a power-of-two zone size,
    // capacity and sizes multiples of the block size, at least one
    // sequential zone). Errors name the field and the valid range; ENOMEM
    // when the budget (config.budget) or the system refuses the memory of
    // the zone descriptors, saying how much and which limit.
    // `backend` (optional) must outlive the engine. Control thread.
    static result<std::unique_ptr<zone_engine>> create(const zone_engine_config& config,
                                                       zone_backend* backend = nullptr);
    virtual ~zone_engine();
    zone_engine(const zone_engine&) = delete;
    zone_engine& operator=(const zone_engine&) = delete;

    // The configuration in force (the null_blk flavour's normalised limits).
    const zone_engine_config& effective() const { return _cfg; }
    // Sets the zone fields of `limits` (zoned, zone size and capacity,
    // conventional zones, open/active limits); max_zone_append_bytes is the
    // target's. Any thread.
    void apply_limits(block_limits& limits) const;

    uint32_t zone_count() const { return _nr_zones; }
    // The memory of the zone descriptors, charged to config.budget. Any
    // thread.
    uint64_t memory_bytes() const { return _charge.bytes(); }
    uint32_t zone_index(uint64_t offset) const
    {
        return static_cast<uint32_t>(offset >> _zone_shift);
    }
    uint64_t zone_start(uint32_t index) const { return uint64_t{index} << _zone_shift; }
    // The zone's size (the last one may be smaller) and writable bytes.
    uint64_t zone_length(uint32_t zone) const;
    uint64_t zone_capacity(uint32_t zone) const;
    bool conventional(uint32_t index) const { return index < _cfg.conventional_zones; }

    // Sets sequential zone `zone` from the bytes its store holds, before any
    // I/O (a zone-per-file target's start): 0 empty, the capacity full,
    // anything between closed (open zones come back closed). Errors: more
    // than the capacity, not whole blocks. Control thread.
    result<void> restore_zone(uint32_t zone, uint64_t stored_bytes);

    // ---- hot path (the request's queue thread); results are 0/bytes or -errno

    // Write or zone_append `r` (which the core has checked: aligned, inside
    // the device, one zone): the write-pointer and capacity checks and the
    // implicit open. On success returns 0 with `h` filled and the zone locked
    // (sequential zones); the target then moves the data to h.offset and
    // calls end_write. On error nothing is held.
    int begin_write(const io_request& r, zone_hold& h);
    // Advances the write pointer by `bytes_written` (< r.length when part of
    // the write failed: null_blk's partial bad-block writes), makes the zone
    // full at its capacity, and releases the zone.
    void end_write(zone_hold& h, uint64_t bytes_written);
    // A write whose data was queued after end_write did not land (zloop:
    // the file write failed): the zone is re-read from the backend before
    // its next use. Any thread.
    void write_failed(uint32_t zone);

    // Read `r`: -EIO for an offline zone; otherwise the bytes of the request
    // below the write pointer (null_blk fills the rest with 0xff; the whole
    // length for conventional zones and for the zloop flavour). With
    // lock_reads the zone stays locked until end_read.
    int begin_read(const io_request& r, zone_hold& h);
    void end_read(zone_hold& h);

    // zone_open, zone_close, zone_finish, zone_reset, zone_reset_all.
    int manage(const io_request& r);

    // report_zones into r.buffer (r.report_capacity entries) from the zone
    // holding r.offset. Returns the number filled.
    int report(const io_request& r);
    // The same for `count` zones from `first` into `out`. Returns the
    // number filled. Any thread.
    uint32_t report(uint32_t first, zone_descriptor* out, uint32_t count);

    // ---- control path

    // null_blk's zone_readonly / zone_offline attributes (zone_cond_store):
    // the sequential zone holding `offset` becomes read-only or offline
    // (finished first to free its resources); asking again for the
    // condition it has makes it empty again (its data discarded). Errors
    // (-EINVAL): not a read-only/offline condition, offset beyond the
    // device, a conventional zone. Any thread; safe against I/O.
    result<void> set_condition(uint64_t offset, zone_condition condition);

    zone_engine_stats stats() const;
    // Open/closed counts (scanned) and the stats, for describe(). Any thread.
    void describe(nlohmann::json& out) const;

protected:
    // The zone descriptor and the two models are private to the core
    // (src/core/zone_models.hpp): a target sees only this interface.
    struct zone;
    explicit zone_engine(const zone_engine_config& config, zone_backend* backend);

    void lock_zone(zone& z) const;
    std::unique_lock<std::mutex> resources() const;
    void fill(uint32_t index, zone_descriptor& d) const;

    // What the two models do differently, each as its kernel driver does.
    // The write pointer a full (or conventional) zone reports, its end
    // being `end` (null_blk: the end; zloop: none).
    virtual uint64_t full_write_pointer(uint64_t end) const = 0;
    // begin_write of sequential zone `index` (`z`, locked): the model's
    // write-pointer, capacity and resource checks and the implicit open.
    // 0 (h.offset set for a zone append) or -errno.
    virtual int begin_zone_write(zone& z, uint32_t index, const io_request& r, zone_hold& h,
                                 uint64_t zone_end) = 0;
    // end_write after the write pointer moved: the condition and counters
    // (`full`: it reached the capacity). Unlocks `z`.
    virtual void end_zone_write(zone& z, const zone_hold& h, bool full) = 0;
    // begin_read after `h` was filled: the model's checks, the lock
    // (lock_reads) and the readable length.
    virtual int begin_zone_read(zone& z, uint32_t index, const io_request& r, zone_hold& h) = 0;
    // manage() of zone `index` (locked, within the device): open, close,
    // finish or reset; 0 or -errno.
    virtual int manage_zone(io_op op, uint32_t index) = 0;
    // Reset all's step for sequential zone `index` (locked): non-zero
    // stops the reset all with that result.
    virtual int reset_one_of_all(uint32_t index) = 0;
    // report(): zone `index` (locked) is about to be described.
    virtual void before_report(uint32_t index) { (void)index; }
    // set_condition of a valid read_only/offline `condition`; `attr` names
    // the attribute for messages.
    virtual result<void> change_condition(uint64_t offset, zone_condition condition,
                                          const char* attr) = 0;

    zone_engine_config _cfg;
    zone_backend* _backend;
    unsigned _zone_shift = 0;
    uint32_t _nr_zones = 0;
    uint64_t _last_zone_length = 0;
    bool _need_res_mgmt = false;
    memory_charge _charge;  // for _zones; released after them
    std::unique_ptr<zone[]> _zones;

    // Under _res_lock (when _need_res_mgmt); each model keeps its other
    // counters next to it.
    mutable std::mutex _res_lock;
    uint32_t _nr_closed = 0;

    mutable std::atomic<uint64_t> _implicit_closes{0};
    mutable std::atomic<uint64_t> _open_refused{0};
    mutable std::atomic<uint64_t> _active_refused{0};
    mutable std::atomic<uint64_t> _contended{0};
    mutable std::atomic<uint64_t> _refreshed{0};
};

}  // namespace softblk
