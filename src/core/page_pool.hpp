// The memory store's page pool (memory_store.cpp): where its 4 KiB data
// pages come from and go back to, and what it charges to the store's budget
// for them. Internal to the core.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include <softblk/memory_store.hpp>

namespace softblk::core {

// Pages come from chunks mapped (and populated) at once: 2 MiB, a
// transparent huge page where the kernel has one, or 1 MiB where the
// store is smaller or its budgets have less room (map_chunk says why).
// Chunks are carved in order from slabs of address space reserved ahead
// (up to 1 GiB each), so that they make one mapping, not one each. A freed
// page is kept resident on a free list threaded through the pages
// themselves (no allocation, no system call) while the list holds fewer
// than keep_pages(); beyond that it is queued and returned to the
// kernel in batches (MADV_DONTNEED), and faults back in when reused.
// Every page counted in resident_pages() is charged to the budget.
class page_pool {
public:
    static constexpr uint32_t k_page_size = memory_store::k_page_size;

    // Chunk sizes: one huge page; the smaller one near a limit or for a
    // store smaller than a huge page.
    static constexpr size_t k_huge_chunk_bytes = size_t{2} << 20;
    static constexpr size_t k_small_chunk_bytes = size_t{1} << 20;
    // The most address space reserved at a time.
    static constexpr size_t k_max_slab_bytes = size_t{1} << 30;

    // A pool for a store of `capacity_bytes` that charges `budget` (and so
    // its parents). Maps nothing yet.
    page_pool(int numa_node, memory_budget& budget, uint64_t capacity_bytes);
    ~page_pool();
    page_pool(const page_pool&) = delete;
    page_pool& operator=(const page_pool&) = delete;
    // A page (its contents undefined), or nullptr with `error` set to
    // -ENOSPC (the budget refused) or -ENOMEM (the system did). Reuses
    // a kept free page first, which charges nothing.
    void* allocate(int& error);
    // Takes `page` back: kept for reuse within keep_pages(), else
    // queued; flush() returns queued pages' RAM.
    void free(void* page);
    void flush();
    // Returns kept free pages beyond keep_pages() (a lowered limit).
    void trim();
    void release_all();
    // How many free pages may be kept resident now (see the .cpp's
    // k_keep_ceiling for why this bound).
    uint64_t keep_pages() const;
    uint64_t resident_pages() const { return _resident.load(std::memory_order_relaxed); }
    uint64_t free_pages() const { return _kept_count.load(std::memory_order_relaxed); }
    uint64_t returned_pages() const { return _returned.load(std::memory_order_relaxed); }

private:
    // Pages returned per flush at most: 1 MiB, so that a store far
    // beyond its bound pays one madvise (and TLB shootdown) per run of
    // adjacent pages in a MiB, not per 64 pages.
    static constexpr size_t k_batch = 256;
    void queue_locked(void* page);
    void flush_locked();
    // Whether `bytes` more fit under the budget's limit and every parent's.
    bool room_for(uint64_t bytes) const;
    // A chunk of `bytes` (one of the chunk sizes), writable and populated,
    // or nullptr when the system refuses. Under _lock.
    char* map_chunk(size_t bytes);
    // A new slab of address space for map_chunk; false when the system
    // refuses it. Under _lock.
    bool reserve_slab();

    struct slab {
        char* base;
        size_t bytes;
    };

    int _numa_node;
    memory_budget& _budget;
    uint64_t _capacity;
    size_t _chunk_bytes;  // the size wanted (room_for may make it smaller)
    size_t _slab_bytes;
    mutable std::mutex _lock;
    std::vector<slab> _slabs;
    char* _carve = nullptr;  // the newest slab's address space not made a chunk yet
    char* _carve_end = nullptr;
    void* _kept = nullptr;  // free list of resident pages, linked through their first word
    std::atomic<uint64_t> _kept_count{0};
    std::vector<void*> _returned_free;  // returned to the kernel, ready to reuse
    void* _pending[k_batch] = {};       // freed beyond the bound, not yet returned
    size_t _pending_count = 0;
    char* _bump = nullptr;  // unused rest of the newest chunk
    char* _bump_end = nullptr;
    std::atomic<uint64_t> _resident{0};
    std::atomic<uint64_t> _returned{0};
};

}  // namespace softblk::core
