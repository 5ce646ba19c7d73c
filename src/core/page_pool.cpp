#include "page_pool.hpp"

#include <algorithm>
#include <cerrno>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

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

void* page_pool::allocate(int& error)
{
    std::lock_guard guard(_lock);
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
    if (_bump == _bump_end && !_returned_free.empty()) {
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
    if (_bump == _bump_end) {
        // The whole chunk becomes resident (populated below).
        if (!_budget.try_charge(k_chunk_bytes)) {
            error = -ENOSPC;
            return nullptr;
        }
        void* chunk = mmap(nullptr, k_chunk_bytes, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (chunk == MAP_FAILED) {
            _budget.release(k_chunk_bytes);
            error = -ENOMEM;
            return nullptr;
        }
        if (_numa_node >= 0) {
            unsigned long mask[16] = {};
            if (_numa_node < static_cast<int>(sizeof(mask) * 8)) {
                mask[_numa_node / 64] = 1ul << (_numa_node % 64);
                // Best effort: a kernel without NUMA support fails with ENOSYS.
                syscall(SYS_mbind, chunk, k_chunk_bytes, k_mpol_preferred, mask, sizeof(mask) * 8,
                        0);
            }
        }
        // Populate the whole chunk in one go: one page fault per chunk
        // instead of one per page on the write path.
        madvise(chunk, k_chunk_bytes, MADV_POPULATE_WRITE);
        _chunks.push_back(chunk);
        _bump = static_cast<char*>(chunk);
        _bump_end = _bump + k_chunk_bytes;
        _resident.fetch_add(k_chunk_bytes / k_page_size, std::memory_order_relaxed);
    }
    // The rest of the newest chunk before returned pages: it is resident
    // and charged already.
    void* p = _bump;
    _bump += k_page_size;
    return p;
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
    for (void* c : _chunks) {
        munmap(c, k_chunk_bytes);
    }
    _chunks.clear();
    _kept = nullptr;
    _kept_count.store(0, std::memory_order_relaxed);
    _returned_free.clear();
    _pending_count = 0;
    _bump = _bump_end = nullptr;
    _budget.release(_resident.exchange(0, std::memory_order_relaxed) * uint64_t{k_page_size});
}

}  // namespace softblk::core
