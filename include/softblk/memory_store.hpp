// Provider API: data memory. Targets and decorators that keep data in RAM
// (the null target with memory_backed=1, the zoned target, the write-back
// cache) include this header; front ends never do (they see
// device::memory_bytes() only).
//
// memory_budget: a limit on data memory. The process has one
// (process_memory_budget(), which the daemon sets from its --memory-limit
// or the machine's memory); a memory store has one of its own below it
// (the device's memory_limit). Past either limit, allocations fail and the
// target completes the write with -ENOSPC; the process and its other
// devices go on.
//
// memory_store: a sparse, block-granular store of a device's data in RAM,
// written and read by several queue threads at once (docs/null.md).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include <softblk/external_data.hpp>
#include <softblk/options.hpp>
#include <softblk/types.hpp>

namespace softblk {

// A limit on data memory, charged and released by any thread without a
// lock: a charge is a compare-and-swap loop on one relaxed atomic per level,
// so the use never exceeds the limit, even for an instant. A budget charges
// its parent too; the parent must outlive it.
class memory_budget {
public:
    // `limit_bytes` 0: no limit of its own (the parent's still applies).
    explicit memory_budget(uint64_t limit_bytes = 0, memory_budget* parent = nullptr)
        : _limit(limit_bytes), _parent(parent)
    {
    }
    memory_budget(const memory_budget&) = delete;
    memory_budget& operator=(const memory_budget&) = delete;

    // Charges `bytes` here and in every parent. Returns false, charging
    // nothing, when that would take this budget or a parent past its limit
    // (the refusal is counted where it happened). Any thread; hot path.
    bool try_charge(uint64_t bytes)
    {
        uint64_t used = _used.load(std::memory_order_relaxed);
        const uint64_t limit = _limit.load(std::memory_order_relaxed);
        do {
            if (limit != 0 && (used + bytes > limit || used + bytes < used)) {
                _refused.fetch_add(1, std::memory_order_relaxed);
                return false;
            }
        } while (!_used.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
        if (_parent != nullptr && !_parent->try_charge(bytes)) {
            _used.fetch_sub(bytes, std::memory_order_relaxed);
            return false;
        }
        return true;
    }

    // Charges `bytes` here and in every parent without checking a limit:
    // for memory the caller cannot do without (a store's fixed part, which
    // is allocated when the device is created). Any thread.
    void charge(uint64_t bytes)
    {
        _used.fetch_add(bytes, std::memory_order_relaxed);
        if (_parent != nullptr) {
            _parent->charge(bytes);
        }
    }

    // Gives back `bytes` charged before (here and in every parent). Any
    // thread; hot path.
    void release(uint64_t bytes)
    {
        _used.fetch_sub(bytes, std::memory_order_relaxed);
        if (_parent != nullptr) {
            _parent->release(bytes);
        }
    }

    // Bytes charged now (relaxed: a snapshot). Any thread.
    uint64_t used() const { return _used.load(std::memory_order_relaxed); }
    // The limit in bytes; 0: none of its own. Any thread.
    uint64_t limit() const { return _limit.load(std::memory_order_relaxed); }
    // The smallest limit of this budget and its parents, as they are now;
    // 0: none anywhere. Any thread.
    uint64_t smallest_limit() const
    {
        uint64_t smallest = 0;
        for (const memory_budget* b = this; b != nullptr; b = b->_parent) {
            const uint64_t l = b->limit();
            if (l != 0 && (smallest == 0 || l < smallest)) {
                smallest = l;
            }
        }
        return smallest;
    }
    // Charges refused because of this budget's own limit. Any thread.
    uint64_t refused() const { return _refused.load(std::memory_order_relaxed); }
    // Sets the limit (0: none). Memory charged already stays charged, even
    // past a lower limit; later charges see the new one. Any thread.
    void set_limit(uint64_t limit_bytes) { _limit.store(limit_bytes, std::memory_order_relaxed); }
    // The budget above this one, or nullptr. Any thread.
    const memory_budget* parent() const { return _parent; }

private:
    std::atomic<uint64_t> _used{0};
    std::atomic<uint64_t> _limit;
    std::atomic<uint64_t> _refused{0};
    memory_budget* _parent;
};

// The process-wide budget of data memory, parent of every store's budget
// and charged by the write-back cache and by what targets hold besides
// their data (memory_charge). No limit unless the program sets one (the
// daemon does: docs/reliability.md). Any thread.
memory_budget& process_memory_budget();

// Memory a target holds besides its data and in proportion to its
// geometry (zone descriptors, per-zone tables), charged to a budget for as
// long as the charge lives. Taken before the memory is allocated, so that
// a device whose tables do not fit is refused with an error that says so,
// instead of taking the memory or failing with std::bad_alloc. Move-only;
// the budget must outlive the charge.
class memory_charge {
public:
    memory_charge() = default;
    // Charges `bytes` to `budget` and its parents. Error ENOMEM: "not
    // enough memory for `what` (size): " and which limit refused it (a
    // device's memory_limit, or the process's budget: the daemon's
    // --memory-limit) with what it has left. Any thread.
    static result<memory_charge> take(memory_budget& budget, uint64_t bytes, std::string_view what);
    ~memory_charge() { release(); }
    memory_charge(memory_charge&& other) noexcept
        : _budget(std::exchange(other._budget, nullptr)), _bytes(std::exchange(other._bytes, 0))
    {
    }
    memory_charge& operator=(memory_charge&& other) noexcept
    {
        if (this != &other) {
            release();
            _budget = std::exchange(other._budget, nullptr);
            _bytes = std::exchange(other._bytes, 0);
        }
        return *this;
    }
    memory_charge(const memory_charge&) = delete;
    memory_charge& operator=(const memory_charge&) = delete;

    uint64_t bytes() const { return _bytes; }

private:
    void release()
    {
        if (_budget != nullptr) {
            _budget->release(_bytes);
            _budget = nullptr;
            _bytes = 0;
        }
    }

    memory_budget* _budget = nullptr;
    uint64_t _bytes = 0;
};

// The error of an allocation for `what` of `bytes` that the system refused
// (new (std::nothrow) gave nullptr): ENOMEM, "not enough memory for ...".
error out_of_memory(std::string_view what, uint64_t bytes);

// "1.5 GiB" and the like, for messages. Any thread.
std::string human_bytes(uint64_t bytes);

// The per-device option `memory_limit` (MiB, 0: only the process budget),
// for the option table of every target that keeps data in a memory_store,
// so that they all spell and document it the same way. A target that has it
// reports the limit in describe() as "memory_limit_bytes".
inline constexpr option_def k_memory_limit_option = {
    .name = "memory_limit",
    .kind = option_kind::integer,
    .default_value = "0",
    .unit = "MiB",
    .help =
        "most RAM the device's data may take (with memory_backed=1); writes that need more fail "
        "with ENOSPC, discard gives memory back; 0: only the daemon's budget limits it; changes "
        "at any time",
    .min = 0,
    .max = (uint64_t{1} << 44) - 1,
    .update = option_update::live,
};

// Whether a store's data is in transparent huge pages (the option
// huge_pages; docs/null.md, "Huge pages"). Huge pages make random writes
// over a large store faster; populating them can cost far more than small
// pages (in a VM whose host takes free memory back), so by default the
// store measures which costs less here.
enum class huge_page_mode : uint8_t {
    automatic,  // measured: huge pages while populating them costs at most 1.5x small ones
    off,        // small pages
    on,         // huge pages wherever the kernel gives them
};

// "auto", "0" or "1" (what huge_pages takes); EINVAL otherwise.
result<huge_page_mode> parse_huge_page_mode(std::string_view text);
result<void> check_huge_page_mode(std::string_view text);

// The per-device option `huge_pages` of every target that keeps data in a
// memory_store (as k_memory_limit_option). describe() shows what the store
// chose and why under "chunks" (describe_memory_store).
inline constexpr option_def k_huge_pages_option = {
    .name = "huge_pages",
    .kind = option_kind::text,
    .default_value = "auto",
    .unit = "auto|0|1",
    .help =
        "data in 2 MiB transparent huge pages (faster random I/O, slower first writes where "
        "the host takes free memory back): auto measures what populating them costs here "
        "against small pages and uses them while at most 1.5x; 0 never; 1 always (where "
        "the kernel has THP); applies to chunks populated after; changes at any time",
    .update = option_update::live,
    .check = check_huge_page_mode,
};

class memory_store {
public:
    static constexpr uint32_t k_page_size = 4096;

    struct config {
        uint64_t capacity_bytes = 0;  // rounded up to whole pages
        uint32_t block_size = 4096;   // 512 .. 4096, a power of two
        // >= 0 binds the data pages to that NUMA node (MPOL_PREFERRED); -1:
        // the kernel's default policy.
        int numa_node = -1;
        // The store's own limit in bytes (memory_limit); 0: none.
        uint64_t limit_bytes = 0;
        // The budget above the store's; nullptr: process_memory_budget().
        memory_budget* parent = nullptr;
        huge_page_mode huge_pages = huge_page_mode::automatic;
        // The last-level cache the store compares its capacity with to
        // choose how it copies writes until it measured (describe_writes);
        // 0: the machine's.
        uint64_t cache_bytes = 0;
    };

    // A store for `cfg`; it charges its fixed part (lock stripes, root node)
    // to its budget at once, unconditionally. Control thread; the caller
    // owns the store.
    static std::unique_ptr<memory_store> create(const config& cfg);

    virtual ~memory_store() = default;

    // ---- hot path: any queue thread. Offsets and lengths are multiples of
    // the block size and inside the capacity (the caller checked).

    // Copies `length` bytes at `offset` into `out`; blocks never written (or
    // discarded) read as zeros.
    virtual void read(uint64_t offset, void* out, uint64_t length) const = 0;

    // Stores `length` bytes from `data` at `offset`. Returns 0; -ENOSPC when
    // the store's budget or one above it refuses the memory a new page or
    // node needs; -ENOMEM when the system refuses it. What was stored
    // before the failure stays stored.
    virtual int write(uint64_t offset, const void* data, uint64_t length) = 0;

    // Stores `length` bytes read from `window` (its bytes from the first
    // on) at `offset`, with one preadv per 256 KiB straight into the pages,
    // their locks held meanwhile. Returns what write() returns, or -errno
    // of the read (-EIO for a short one); on a read error the blocks of
    // that 256 KiB that held data may hold part of the new data (as a
    // failed write leaves a disk).
    virtual int write_from(uint64_t offset, const data_window& window, uint64_t length) = 0;

    // Copies `length` bytes at `offset` into `window` (from its first byte
    // on), zeros where read() has them, with one pwritev per 256 KiB
    // straight from the pages, their locks held meanwhile. Returns 0, or
    // -errno of the write (-EIO for a short one).
    virtual int read_to(uint64_t offset, const data_window& window, uint64_t length) const = 0;

    // The first `length` bytes of write or zone append `r`'s data, from
    // its buffer or its window, stored at `offset` (a zone append's is not
    // r.offset). Returns what write() and write_from() return.
    int write_request(uint64_t offset, const io_request& r, uint64_t length)
    {
        const data_window* window = window_of(r);
        return window != nullptr ? write_from(offset, *window, length)
                                 : write(offset, r.buffer, length);
    }

    // `length` bytes at `offset` into the first of read `r`'s buffer or
    // window. Returns 0, or what read_to() returns.
    int read_request(uint64_t offset, const io_request& r, uint64_t length) const
    {
        if (const data_window* window = window_of(r); window != nullptr) {
            return read_to(offset, *window, length);
        }
        read(offset, r.buffer, length);
        return 0;
    }

    // Forgets the blocks of [offset, offset+length): they read as zeros.
    // Pages left empty are kept resident for reuse by later writes (no
    // system call either way) up to free_page_limit_bytes(); those beyond
    // it go back to the kernel before discard returns, and their memory to
    // the budget.
    virtual void discard(uint64_t offset, uint64_t length) = 0;

    // Makes [offset, offset+length) read as zeros. keep_allocated=false
    // frees the blocks (discard); true stores zeros (the blocks stay
    // allocated, NBD's NO_HOLE). Returns 0, -ENOSPC or -ENOMEM as write().
    virtual int write_zeroes(uint64_t offset, uint64_t length, bool keep_allocated) = 0;

    // ---- control path

    // The allocation map of [offset, offset+length), clipped to the capacity,
    // at block granularity: allocated blocks as data, the rest as holes that
    // read as zeros. Appended to `out` in order with no gaps. Any thread.
    virtual void map_extents(uint64_t offset, uint64_t length, std::vector<extent>& out) const = 0;

    // Frees every page (the device's data is gone). No I/O may run.
    virtual void clear() = 0;

    // RAM held, which is exactly what the store's budget has charged:
    // resident data pages (in use, or freed and not yet returned to the
    // kernel), page-table nodes and the fixed part, and what the target
    // charged to budget() besides. Any thread.
    virtual uint64_t memory_bytes() const = 0;
    // Bytes of pages that hold at least one block of data. Any thread.
    virtual uint64_t data_page_bytes() const = 0;
    // Bytes of pages freed by discards and kept resident (and charged) for
    // reuse: at most free_page_limit_bytes() once a discard has returned.
    // Any thread.
    virtual uint64_t free_page_bytes() const = 0;
    // The most free_page_bytes() may be now: 1/8 of the capacity, 1/8 of
    // the smallest memory limit over the store (its own, the process's),
    // 256 MiB at most (memory_store.cpp says why). Any thread.
    virtual uint64_t free_page_limit_bytes() const = 0;
    // Bytes of pages given back to the kernel since the store was created
    // (MADV_DONTNEED beyond the free-page limit; clear() and destruction
    // not counted). Any thread.
    virtual uint64_t returned_bytes() const = 0;
    // Lock acquisitions that had to wait (the benchmark's contention figure).
    virtual uint64_t contended() const = 0;
    // The store's own budget (limit = config::limit_bytes). Any thread.
    // A target charges what else its device holds (memory_charge) here, so
    // that the device's memory_limit bounds all of it and memory_bytes()
    // counts it.
    virtual const memory_budget& budget() const = 0;
    virtual memory_budget& budget() = 0;
    // Changes the store's own limit (memory_limit written while the device
    // runs); data held stays, free pages beyond the new free-page limit go
    // back to the kernel. Any thread.
    virtual void set_limit(uint64_t limit_bytes) = 0;

    // Changes huge_pages for the chunks populated from now on (the
    // kernel's THP setting is read again). Any thread.
    virtual void set_huge_pages(huge_page_mode mode) = 0;
    // The "chunks" object of describe: the kind of chunk the store takes
    // now ("huge", "small" or "measuring"), why, what populating each kind
    // costs here per MiB (the process's medians, microseconds) and how many
    // chunks of each kind the store holds. Any thread.
    virtual void describe_chunks(nlohmann::json& out) const = 0;
    // The "writes" object of describe: how the store copies written data
    // into its pages ("copy": "streaming" or "cached") and why, the trials
    // so far and what the last one timed per KiB in each mode: streaming
    // stores skip reading the lines a write overwrites, cached ones keep
    // them for the next write; a store of at least twice the last-level
    // cache starts streaming, then timed trials choose (docs/null.md,
    // "Speed of the memory store"). Any thread.
    virtual void describe_writes(nlohmann::json& out) const = 0;

    virtual uint64_t capacity_bytes() const = 0;
    virtual uint32_t block_size() const = 0;
};

// The store's figures for the describe() of a target that keeps its data in
// `store`, under the names every such target uses: data_page_bytes,
// store_memory_bytes, store_free_page_bytes, store_free_page_limit_bytes,
// store_returned_bytes, store_lock_contended, memory_limit_bytes (the
// store's own limit: the convention of k_memory_limit_option),
// memory_refused, chunks (memory_store::describe_chunks) and writes
// (memory_store::describe_writes). Any thread.
void describe_memory_store(const memory_store& store, nlohmann::json& out);

}  // namespace softblk
