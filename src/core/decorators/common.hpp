// Pieces shared by the decorators (internal to src/core/decorators).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <softblk/support/clock.hpp>

#include <softblk/device.hpp>
#include <softblk/ring_sharing.hpp>
#include <softblk/support/intrusive_fifo.hpp>
#include <softblk/target.hpp>

namespace softblk::core {

// A FIFO of requests through io_request::next (which is free for whoever
// holds the request).
using request_fifo = intrusive_fifo<io_request>;

// A decorator's per-queue half over the inner target's queue, passing on
// what goes through it unchanged: the inner queue's wake-up descriptor and
// its ring-sharing extension (a ring the queue's owner lends: the inner
// target's I/O may run there; what a decorator holds back it submits there
// later, from poll()). Whether results stay the target's
// (ends_with_ring_write) each decorator says for itself, through
// keeps_ring_write_results(): a decorator that keeps them hands out the
// inner queue's extension itself (no call of its own per completion), one
// that does not a wrapper that says false.
class queue_decorator : public target_queue {
public:
    explicit queue_decorator(std::unique_ptr<target_queue> inner = nullptr)
        : _inner(std::move(inner))
    {
    }
    // For decorators whose queue must exist before the inner one (its
    // completion sink).
    void set_inner(std::unique_ptr<target_queue> inner) { _inner = std::move(inner); }

    int wait_fd() const override { return _inner->wait_fd(); }
    target_ring_sharing* ring_sharing() override
    {
        target_ring_sharing* inner = _inner->ring_sharing();
        if (inner == nullptr || keeps_ring_write_results()) {
            return inner;
        }
        _no_links.inner = inner;
        return &_no_links;
    }

protected:
    // True when every result of the inner target reaches the consumer at
    // once and unchanged (the decorator acts only before the target).
    virtual bool keeps_ring_write_results() const { return false; }

    std::unique_ptr<target_queue> _inner;

private:
    // The inner extension, but never a linked completion.
    struct without_links final : target_ring_sharing {
        bool share_ring(io_uring* ring) override { return inner->share_ring(ring); }
        void ring_completion(uint64_t user_data, int result) override
        {
            inner->ring_completion(user_data, result);
        }
        bool ends_with_ring_write() const override { return false; }
        target_ring_sharing* inner = nullptr;
    };
    without_links _no_links;
};

// Requests a decorator sends to its inner target on its own behalf (cache
// write-back, partial I/O, read proxies). Preallocated per queue; the
// decorator's queue is the inner queue's completion_sink and tells its own
// requests from the consumer's with owns(). Internal requests carry tags
// from k_internal_tag_base up, so they never equal a consumer tag. One
// queue's thread only.
template <class Extra>
class request_pool {
public:
    static constexpr uint32_t k_internal_tag_base = 1u << 24;

    struct entry {
        io_request request;
        Extra extra;
    };

    request_pool(unsigned count, uint16_t queue_index) : _entries(new entry[count]), _count(count)
    {
        _free.reserve(count);
        for (unsigned i = count; i > 0; --i) {
            _entries[i - 1].request.tag = k_internal_tag_base + (i - 1);
            _entries[i - 1].request.queue_index = queue_index;
            _free.push_back(i - 1);
        }
    }

    bool owns(const io_request& r) const
    {
        auto* p = reinterpret_cast<const char*>(&r);
        auto* base = reinterpret_cast<const char*>(_entries.get());
        return p >= base && p < base + sizeof(entry) * _count;
    }
    entry& of(io_request& r) { return *reinterpret_cast<entry*>(&r); }

    entry* take()
    {
        if (_free.empty()) {
            return nullptr;
        }
        entry* e = &_entries[_free.back()];
        _free.pop_back();
        return e;
    }
    void give_back(entry& e) { _free.push_back(static_cast<unsigned>(&e - _entries.get())); }
    unsigned available() const { return static_cast<unsigned>(_free.size()); }
    unsigned in_use() const { return _count - available(); }
    unsigned count() const { return _count; }
    entry& at(unsigned i) { return _entries[i]; }

private:
    std::unique_ptr<entry[]> _entries;
    unsigned _count;
    std::vector<unsigned> _free;
};

// ---------------------------------------------------------------- routing

// How a decorator with requests of its own (a request_pool whose Extra
// has `io_request* original`: the consumer request an entry works for, or
// nullptr) routes what the inner queue completes to it, its
// completion_sink. The decorators without a pool (fault injection,
// throttle) give the inner queue the consumer's sink instead: nothing of
// theirs to route.

// From the inner queue: a consumer request the decorator passed through
// goes on to `sink` as the target ended it (nullptr returned); one of the
// decorator's own requests is returned as its pool entry, for the
// decorator to finish.
template <class Extra>
typename request_pool<Extra>::entry* route_completion(request_pool<Extra>& pool,
                                                      completion_sink& sink, io_request& r,
                                                      int result)
{
    if (!pool.owns(r)) {
        sink.complete(r, result);
        return nullptr;
    }
    return &pool.of(r);
}

// Ends `original` with `result` once `proxy`, the decorator's request for
// it, is done: with where the proxy wrote (a zone append's sector).
inline void complete_original(completion_sink& sink, io_request& original, const io_request& proxy,
                              int result)
{
    original.result_offset = proxy.result_offset;
    sink.complete(original, result);
}

// The core timed out consumer request `r`. When a pool entry works for
// it, the inner target must let that entry's request go (else false), and
// release(entry) frees the entry; otherwise the inner target is asked
// about `r` itself.
template <class Extra, class Release>
bool time_out_through(request_pool<Extra>& pool, target_queue& inner, io_request& r,
                      Release&& release)
{
    for (unsigned i = 0; i < pool.count(); ++i) {
        auto& e = pool.at(i);
        if (e.extra.original == &r) {
            if (!inner.timed_out(e.request)) {
                return false;
            }
            release(e);
            return true;
        }
    }
    return inner.timed_out(r);
}

// ---------------------------------------------------------------- faults

// The kernel's fault_attr (lib/fault-inject.c) with the fields of its
// configfs directory (timeout_inject/, requeue_inject/,
// init_hctx_fault_inject/), defaults FAULT_ATTR_INITIALIZER's. Shared by the
// queues of a device and changed live by the control thread: relaxed
// atomics only.
class fault_attr {
public:
    enum field : unsigned {
        probability,  // percent; 0 never; 100 and above always
        interval,     // fail at most every interval-th eligible call
        times,        // failures left; -1: no limit (atomic_t)
        space,        // calls (of size 1) that pass first (atomic_t)
        verbose,      // the kernel's log of each failure; softblk logs none
        verbose_ratelimit_interval_ms,
        verbose_ratelimit_burst,
        task_filter,  // only tasks with make-it-fail: softblk has none
        k_field_count,
    };
    // The attribute name of each field ("task-filter" with its dash).
    static const char* name(field f);

    fault_attr();
    // Sets a field (the value as parsed for its attribute).
    void set(field f, int64_t value) { _fields[f].store(value, std::memory_order_relaxed); }
    int64_t get(field f) const { return _fields[f].load(std::memory_order_relaxed); }
    // setup_fault_attr(): "interval,probability,space,times" (the module
    // parameter). Errors name `attribute`.
    result<void> setup(std::string_view attribute, std::string_view text);

    // should_fail(attr, 1): true when this call is to fail.
    bool should_fail();
    uint64_t failures() const { return _failures.load(std::memory_order_relaxed); }

private:
    std::atomic<int64_t> _fields[k_field_count];
    std::atomic<uint64_t> _count{0};
    std::atomic<uint64_t> _random;
    std::atomic<uint64_t> _failures{0};
};

// ---------------------------------------------------------------- bad blocks

// The kernel's badblocks list, in 512-byte sectors. Any thread.
class bad_block_table {
public:
    // Records of at most this many sectors, as the kernel keeps them
    // (BB_MAX_LEN); badblocks_once clears one record at a time.
    static constexpr uint64_t k_max_record = 512;

    // Applies "+start-end" (mark bad) or "-start-end" (clear), inclusive
    // sector numbers parsed as null_blk's store does (surrounding blanks
    // stripped, kstrtoull base 0). Errors name the attribute (EINVAL).
    result<void> apply(std::string_view spec);
    void set(uint64_t start, uint64_t count);
    void clear(uint64_t start, uint64_t count);

    // badblocks_check(): true if [sector, sector+count) holds a bad sector;
    // then `first_bad`/`bad_count` describe the first bad record met (its
    // start may lie before `sector`).
    bool check(uint64_t sector, uint64_t count, uint64_t& first_bad, uint64_t& bad_count) const;
    bool empty() const { return _ranges_count.load(std::memory_order_acquire) == 0; }
    // "start-end" per merged range, the first `max_ranges` of them (for
    // describe(), whose reply must stay small).
    std::vector<std::string> list(size_t max_ranges = SIZE_MAX) const;
    // The number of merged ranges.
    size_t ranges() const;
    // "+start-end" per merged range: what re-creates the list.
    std::vector<std::string> canonical() const;
    // The configfs read (badblocks_show): "start length\n" per record of
    // at most k_max_record sectors, as many whole lines as fit in one page
    // (k_show_bytes), as the kernel fills the page configfs hands it.
    // Costs one page of work however large the list.
    static constexpr size_t k_show_bytes = 4096;
    std::string show() const;

private:
    mutable std::mutex _lock;
    std::map<uint64_t, uint64_t> _ranges;  // start -> end (exclusive), disjoint, merged
    std::atomic<size_t> _ranges_count{0};
};

// ---------------------------------------------------------------- factories

std::unique_ptr<target> make_write_cache(std::unique_ptr<target> inner, uint64_t cache_bytes,
                                         bool fua, const queue_config& queues);
std::unique_ptr<target> make_bad_blocks(std::unique_ptr<target> inner,
                                        std::shared_ptr<bad_block_table> table, bool once,
                                        bool partial_io, const queue_config& queues);
std::unique_ptr<target> make_throttle(std::unique_ptr<target> inner, uint64_t mbps);
std::unique_ptr<target> make_fault_injection(std::unique_ptr<target> inner,
                                             std::shared_ptr<fault_attr> timeout,
                                             std::shared_ptr<fault_attr> requeue,
                                             std::shared_ptr<fault_attr> init_hctx);

// Merges `ranges` (sorted, disjoint [start, end) byte ranges that hold data)
// into `extents` (sorted, gap-free), marking them allocated.
void overlay_allocated(std::vector<extent>& extents,
                       const std::vector<std::pair<uint64_t, uint64_t>>& ranges);

}  // namespace softblk::core
