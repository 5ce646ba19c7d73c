#include "page_pool.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace softblk::core {

namespace {

constexpr unsigned k_mpol_preferred = 1;  // <linux/mempolicy.h> MPOL_PREFERRED

}  // namespace

// The most free memory a store keeps resident for reuse. A zoned device
// discards a whole zone at each reset and rewrites it next, and a file
// system discards freed extents it will fill again: keeping those pages
// mapped saves a madvise, its TLB shootdown (costly in a VM: most of the
// zoned benchmark's time before) and a page fault per page rewritten.
// Bounded so that a device that discards most of its data still gives
// memory back (null_blk's memory_backed: discard frees memory):
//  - 1/8 of the capacity: a full device that discards everything returns
//    at least 7/8 of its data memory, and the kept memory never exceeds
//    what a device of that size was expected to hold;
//  - 1/8 of the smallest memory limit over the store (its memory_limit,
//    the daemon's budget): free pages count against the budget, so one
//    device's spare pages must not take a large share of what the others
//    may allocate;
//  - 256 MiB: the default zone size of null_blk and of zloop, the largest
//    discard that zoned use repeats with default geometry; beyond it a
//    sparse terabyte device would keep gigabytes nobody writes again.
// The limits are read at each free, so a lowered limit applies at once
// (the store's own limit through trim() too).
constexpr uint64_t k_keep_ceiling = uint64_t{256} << 20;

page_pool::page_pool(int numa_node, memory_budget& budget, uint64_t capacity_bytes,
                     huge_page_mode mode, chunk_policy& policy)
    : _numa_node(numa_node),
      _budget(budget),
      _capacity(capacity_bytes),
      // The capacity in huge pages, within [one huge page, 1 GiB]: a small
      // store reserves no more than it can use, a large one a slab at a time.
      _slab_bytes(std::clamp<uint64_t>(
          (capacity_bytes + k_huge_chunk_bytes - 1) & ~uint64_t{k_huge_chunk_bytes - 1},
          k_huge_chunk_bytes, k_max_slab_bytes)),
      _policy(policy),
      _mode(mode)
{
    _thp = _policy.thp_usable(_thp_why);
}

page_pool::~page_pool()
{
    release_all();
}

uint64_t page_pool::keep_pages() const
{
    uint64_t keep = std::min(_capacity / 8, k_keep_ceiling);
    if (const uint64_t limit = _budget.smallest_limit(); limit != 0) {
        keep = std::min(keep, limit / 8);
    }
    return keep / k_page_size;
}

void* page_pool::take_locked(int& error)
{
    if (_kept != nullptr) {
        // Resident and charged already: nothing to do but unlink it.
        void* p = _kept;
        _kept = *static_cast<void**>(p);
        _kept_count.fetch_sub(1, std::memory_order_relaxed);
        return p;
    }
    if (_pending_count > 0) {
        // Not returned yet: hand it straight back out, still resident.
        return _pending[--_pending_count];
    }
    if (_bump != _bump_end) {
        // The rest of the newest chunk before returned pages: it is
        // resident and charged already.
        void* p = _bump;
        _bump += k_page_size;
        return p;
    }
    if (!_returned_free.empty()) {
        // Returned pages fault back in (zeroed) on first touch: resident
        // again, so charged again.
        if (!_budget.try_charge(k_page_size)) {
            error = -ENOSPC;
            return nullptr;
        }
        void* p = _returned_free.back();
        _returned_free.pop_back();
        _resident.fetch_add(1, std::memory_order_relaxed);
        return p;
    }
    error = k_must_populate;
    return nullptr;
}

void* page_pool::try_allocate(int& error)
{
    std::lock_guard guard(_lock);
    return take_locked(error);
}

chunk_kind page_pool::pick_locked(bool& measured)
{
    measured = false;
    if (_capacity < k_huge_chunk_bytes || !_thp || _mode == huge_page_mode::off) {
        return chunk_kind::small;
    }
    if (_mode == huge_page_mode::on) {
        return chunk_kind::huge;
    }
    measured = true;
    return _policy.next();
}

void* page_pool::allocate(int& error)
{
    std::unique_lock guard(_lock);
    for (;;) {
        error = 0;
        if (void* p = take_locked(error)) {
            return p;
        }
        if (error != k_must_populate) {
            return nullptr;
        }
        if (_populating) {
            // Another thread populates a chunk: its pages come sooner than a
            // chunk of our own would, and the budget is charged once.
            _populated.wait(guard);
            continue;
        }
        // The bump is empty (take_locked found nothing): the new chunk's
        // first page is this thread's, as long as nobody freed one meanwhile.
        if (!populate_locked(guard, error)) {
            return nullptr;
        }
    }
}

int page_pool::refill(uint64_t pages)
{
    std::unique_lock guard(_lock);
    for (;;) {
        if (ready_locked() >= pages) {
            return 0;
        }
        if (!_populating) {
            break;
        }
        _populated.wait(guard);
    }
    // What is left of the newest chunk goes on the free list (resident and
    // charged already), so that the new chunk can take the bump's place.
    while (_bump != _bump_end) {
        *reinterpret_cast<void**>(_bump) = _kept;
        _kept = _bump;
        _kept_count.fetch_add(1, std::memory_order_relaxed);
        _bump += k_page_size;
    }
    int error = 0;
    return populate_locked(guard, error) ? 0 : error;
}

uint64_t page_pool::ready_locked() const
{
    return _kept_count.load(std::memory_order_relaxed) + _pending_count +
           static_cast<uint64_t>(_bump_end - _bump) / k_page_size + _returned_free.size();
}

bool page_pool::populate_locked(std::unique_lock<std::mutex>& guard, int& error)
{
    // The whole chunk becomes resident (populate), so it is charged whole,
    // before it is populated. 1 MiB where the budgets have no room for 2
    // MiB, so that a store fills its limit as closely as with small chunks
    // (a refused 2 MiB is retried as 1 MiB).
    bool measured = false;
    chunk_kind kind = pick_locked(measured);
    size_t bytes = kind == chunk_kind::huge ? k_huge_chunk_bytes : k_small_chunk_bytes;
    if (bytes == k_huge_chunk_bytes && !room_for(bytes)) {
        bytes = k_small_chunk_bytes;
    }
    bool charged = _budget.try_charge(bytes);
    if (!charged && bytes == k_huge_chunk_bytes) {
        bytes = k_small_chunk_bytes;
        charged = _budget.try_charge(bytes);
    }
    if (!charged) {
        error = -ENOSPC;
        return false;
    }
    kind = bytes == k_huge_chunk_bytes ? chunk_kind::huge : chunk_kind::small;
    char* at = carve_locked(bytes);
    if (at == nullptr) {
        _budget.release(bytes);
        error = -ENOMEM;
        return false;
    }
    // Populated without the mutex: frees, trims and the writers whose
    // pages are resident go on meanwhile; those that need a new chunk wait
    // in allocate() or refill(). The chunk is this thread's alone until it
    // is published below.
    _populating = true;
    guard.unlock();
    // Timed whatever chooses the kind (two clock reads per chunk); only
    // the chunks the policy chose tell it what they cost.
    const uint64_t start = _policy.now();
    const bool populated = populate(at, bytes, kind == chunk_kind::huge);
    const uint64_t took = _policy.now() - start;
    if (populated && measured) {
        _policy.record(kind, bytes, took);
    }
    guard.lock();
    _populating = false;
    _populated.notify_all();
    if (!populated) {
        // The address space stays reserved and unused (PROT_NONE).
        _budget.release(bytes);
        error = -ENOMEM;
        return false;
    }
    (kind == chunk_kind::huge ? _huge_chunks : _small_chunks)
        .fetch_add(1, std::memory_order_relaxed);
    _resident.fetch_add(bytes / k_page_size, std::memory_order_relaxed);
    // Nobody else refills the bump while _populating, and the caller
    // emptied it before: it takes the whole chunk.
    _bump = at;
    _bump_end = at + bytes;
    return true;
}

void page_pool::set_mode(huge_page_mode mode)
{
    std::string why;
    const bool thp = _policy.thp_usable(why);
    std::lock_guard guard(_lock);
    _mode = mode;
    _thp = thp;
    _thp_why = std::move(why);
}

void page_pool::free(void* page)
{
    std::lock_guard guard(_lock);
    if (_kept_count.load(std::memory_order_relaxed) < keep_pages()) {
        *static_cast<void**>(page) = _kept;
        _kept = page;
        _kept_count.fetch_add(1, std::memory_order_relaxed);
        return;
    }
    queue_locked(page);
}

void page_pool::flush()
{
    std::lock_guard guard(_lock);
    flush_locked();
}

void page_pool::trim()
{
    std::lock_guard guard(_lock);
    const uint64_t keep = keep_pages();
    while (_kept_count.load(std::memory_order_relaxed) > keep) {
        void* p = _kept;
        _kept = *static_cast<void**>(p);
        _kept_count.fetch_sub(1, std::memory_order_relaxed);
        queue_locked(p);
    }
    flush_locked();
}

void page_pool::queue_locked(void* page)
{
    _pending[_pending_count++] = page;
    if (_pending_count == k_batch) {
        flush_locked();
    }
}

void page_pool::flush_locked()
{
    if (_pending_count == 0) {
        return;
    }
    std::sort(_pending, _pending + _pending_count);
    size_t i = 0;
    while (i < _pending_count) {
        size_t j = i + 1;
        while (j < _pending_count && static_cast<char*>(_pending[j]) ==
                                         static_cast<char*>(_pending[j - 1]) + k_page_size) {
            ++j;
        }
        madvise(_pending[i], (j - i) * k_page_size, MADV_DONTNEED);
        i = j;
    }
    _returned_free.insert(_returned_free.end(), _pending, _pending + _pending_count);
    _resident.fetch_sub(_pending_count, std::memory_order_relaxed);
    _returned.fetch_add(_pending_count, std::memory_order_relaxed);
    _budget.release(_pending_count * uint64_t{k_page_size});
    _pending_count = 0;
}

void page_pool::release_all()
{
    std::lock_guard guard(_lock);
    for (const slab& s : _slabs) {
        munmap(s.base, s.bytes);
    }
    _slabs.clear();
    _carve = _carve_end = nullptr;
    _kept = nullptr;
    _kept_count.store(0, std::memory_order_relaxed);
    _returned_free.clear();
    _pending_count = 0;
    _bump = _bump_end = nullptr;
    _spare = nullptr;
    _huge_chunks.store(0, std::memory_order_relaxed);
    _small_chunks.store(0, std::memory_order_relaxed);
    _budget.release(_resident.exchange(0, std::memory_order_relaxed) * uint64_t{k_page_size});
}

bool page_pool::room_for(uint64_t bytes) const
{
    for (const memory_budget* b = &_budget; b != nullptr; b = b->parent()) {
        if (b->limit() != 0 && b->used() + bytes > b->limit()) {
            return false;
        }
    }
    return true;
}

char* page_pool::carve_locked(size_t bytes)
{
    if (bytes == k_small_chunk_bytes && _spare != nullptr) {
        return std::exchange(_spare, nullptr);
    }
    char* at = _carve + (-reinterpret_cast<uintptr_t>(_carve) & (bytes - 1));
    if (_carve == nullptr || at + bytes > _carve_end) {
        if (!reserve_slab()) {
            return nullptr;
        }
        at = _carve;
    }
    if (at != _carve && _spare == nullptr) {
        // A small chunk before this huge one: at most one such gap, since
        // the next small chunk fills it.
        _spare = _carve;
    }
    _carve = at + bytes;
    return at;
}

bool page_pool::populate(char* at, size_t bytes, bool huge)
{
    // Commits the memory (PROT_NONE reserved none); the chunk joins the
    // mapping of the chunks before it, which has the same protection and
    // flags, so a store of any size is one or two mappings per slab (a
    // mapping per chunk would run into vm.max_map_count on large stores).
    if (mprotect(at, bytes, PROT_READ | PROT_WRITE) != 0) {
        return false;
    }
    // A huge chunk is advised for a transparent huge page only while it is
    // populated, and then no longer: its data then takes one TLB entry
    // instead of 512 (random 4 KiB writes over a 1 GiB store spent about a
    // sixth of their time on page walks), while khugepaged never collapses
    // a chunk whose pages went back to the kernel into a huge page again,
    // which would make memory resident that the store no longer charges.
    // Without transparent huge pages (the pool then takes small chunks
    // unless huge_pages=1 asks otherwise: the advice fails or does
    // nothing) a huge chunk is 512 small pages.
    if (huge) {
        madvise(at, bytes, MADV_HUGEPAGE);
    }
    // Populate the whole chunk in one go: one system call per chunk
    // instead of a page fault per page on the write path. A kernel without
    // MADV_POPULATE_WRITE (before 5.14) gets a write to each page instead
    // (the first one makes a huge chunk's huge page), so that the chunk is
    // as resident as it is charged and its time compares with the others'.
    if (madvise(at, bytes, MADV_POPULATE_WRITE) != 0) {
        for (size_t off = 0; off < bytes; off += k_page_size) {
            *static_cast<volatile char*>(at + off) = 0;
        }
    }
    if (huge) {
        madvise(at, bytes, MADV_NOHUGEPAGE);
    }
    return true;
}

bool page_pool::reserve_slab()
{
    // Address space only: PROT_NONE and MAP_NORESERVE take no memory and
    // no commit charge until populate() makes a chunk of it writable.
    // Aligned to the huge-page size, so that every 2 MiB chunk is one.
    const size_t align = k_huge_chunk_bytes;
    void* area = mmap(nullptr, _slab_bytes + align, PROT_NONE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (area == MAP_FAILED) {
        return false;
    }
    char* raw = static_cast<char*>(area);
    char* base = raw + (-reinterpret_cast<uintptr_t>(raw) & (align - 1));
    if (base > raw) {
        munmap(raw, static_cast<size_t>(base - raw));
    }
    if (char* end = base + _slab_bytes; end < raw + _slab_bytes + align) {
        munmap(end, static_cast<size_t>(raw + _slab_bytes + align - end));
    }
    // Not a huge page but while populate() fills a huge chunk (see there).
    madvise(base, _slab_bytes, MADV_NOHUGEPAGE);
    if (_numa_node >= 0) {
        unsigned long mask[16] = {};
        if (_numa_node < static_cast<int>(sizeof(mask) * 8)) {
            mask[_numa_node / 64] = 1ul << (_numa_node % 64);
            // Best effort: a kernel without NUMA support fails with ENOSYS.
            // Set on the whole slab: the chunks made of it keep the policy.
            syscall(SYS_mbind, base, _slab_bytes, k_mpol_preferred, mask, sizeof(mask) * 8, 0);
        }
    }
    _slabs.push_back({base, _slab_bytes});
    _carve = base;
    _carve_end = base + _slab_bytes;
    return true;
}

void page_pool::describe(nlohmann::json& out) const
{
    huge_page_mode mode;
    bool thp = false;
    std::string thp_why;
    {
        std::lock_guard guard(_lock);
        mode = _mode;
        thp = _thp;
        thp_why = _thp_why;
    }
    const chunk_policy::figures f = _policy.snapshot();
    auto us = [](uint64_t ns) -> nlohmann::json {
        if (ns == 0) {
            return nullptr;  // not measured yet
        }
        return std::round(static_cast<double>(ns) / 100.0) / 10.0;  // in us, to 0.1 us
    };
    std::string kind;
    std::string why;
    if (_capacity < k_huge_chunk_bytes) {
        kind = "small";
        why = "small: the store is smaller than a huge page (2 MiB)";
    } else if (!thp) {
        kind = "small";
        why = "small: " + thp_why;
    } else if (mode == huge_page_mode::off) {
        kind = "small";
        why = "small: huge_pages=0";
    } else if (mode == huge_page_mode::on) {
        kind = "huge";
        why = "huge: huge_pages=1";
    } else if (!f.decided) {
        kind = "measuring";
        why = fmt::format(
            "measuring: the first chunks alternate huge and small and each is timed ({} of {} "
            "huge and {} of {} small so far)",
            std::min<uint64_t>(f.huge_samples, chunk_policy::k_window), chunk_policy::k_window,
            std::min<uint64_t>(f.small_samples, chunk_policy::k_window), chunk_policy::k_window);
    } else {
        kind = chunk_kind_name(*f.decided);
        why = fmt::format(
            "{}: populating costs {:.2f} ms per MiB in huge pages against {:.2f} ms in small ones "
            "(medians of the last {} chunks of each); huge pages while at most 1.5 times",
            kind, static_cast<double>(f.huge_ns_per_mib) / 1e6,
            static_cast<double>(f.small_ns_per_mib) / 1e6, chunk_policy::k_window);
    }
    out = {
        {"kind", kind},
        {"why", why},
        {"huge_pages", mode == huge_page_mode::automatic ? "auto"
                       : mode == huge_page_mode::on      ? "1"
                                                         : "0"},
        {"huge_populate_us_per_mib", us(f.huge_ns_per_mib)},
        {"small_populate_us_per_mib", us(f.small_ns_per_mib)},
        {"huge_chunks", huge_chunks()},
        {"small_chunks", small_chunks()},
    };
}

}  // namespace softblk::core
