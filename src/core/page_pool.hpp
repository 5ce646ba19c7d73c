// The memory store's page pool (memory_store.cpp): where its 4 KiB data
// pages come from and go back to, and what it charges to the store's budget
// for them. Internal to the core.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include <softblk/memory_store.hpp>

#include "chunk_policy.hpp"

namespace softblk::core {

// Pages come from chunks mapped and populated at once: 2 MiB, one
// transparent huge page, or 1 MiB of small pages, the kind chosen per chunk
// by huge_pages (auto: chunk_policy measures which costs less here), 1 MiB
// too where the store is smaller than a huge page or its budgets have less
// room. A chunk is populated outside the pool's mutex, and its caller holds
// none of the store's locks (try_allocate, allocate): a population that
// takes milliseconds stalls only the writers that need a new page then.
// Chunks are carved in order from slabs of address space reserved ahead
// (up to 1 GiB each), so that they make one mapping, not one each. A freed
// page is kept resident on a free list threaded through the pages
// themselves (no allocation, no system call) while the list holds fewer
// than keep_pages(); beyond that it is queued and returned to the
// kernel in batches (MADV_DONTNEED), and faults back in when reused.
// Every page counted in resident_pages() is charged to the budget, and so
// is a chunk being populated.
class page_pool {
public:
    static constexpr uint32_t k_page_size = memory_store::k_page_size;

    // Chunk sizes: one huge page; the smaller one near a limit or for a
    // store smaller than a huge page.
    static constexpr size_t k_huge_chunk_bytes = size_t{2} << 20;
    static constexpr size_t k_small_chunk_bytes = size_t{1} << 20;
    // The most address space reserved at a time.
    static constexpr size_t k_max_slab_bytes = size_t{1} << 30;

    // try_allocate's error when no page is ready and a chunk must be
    // populated first: call allocate() without holding the store's locks.
    static constexpr int k_must_populate = 1;

    // A pool for a store of `capacity_bytes` that charges `budget` (and so
    // its parents), choosing chunk kinds by `mode` and `policy`. Maps
    // nothing yet.
    page_pool(int numa_node, memory_budget& budget, uint64_t capacity_bytes,
              huge_page_mode mode = huge_page_mode::automatic,
              chunk_policy& policy = chunk_policy::process());
    ~page_pool();
    page_pool(const page_pool&) = delete;
    page_pool& operator=(const page_pool&) = delete;
    // A page ready now (its contents undefined): a kept free page (which
    // charges nothing), the rest of the newest chunk or a page returned to
    // the kernel before. nullptr with `error` set to -ENOSPC (the budget
    // refused) or k_must_populate (none is ready). Any thread; may be
    // called under the store's locks: it never populates.
    void* try_allocate(int& error);
    // As try_allocate, but where no page is ready it populates a chunk
    // (outside the pool's mutex; another thread that needs a page then
    // waits for it) or waits for the population another thread began.
    // nullptr with `error` -ENOSPC or -ENOMEM (the system refused). Any
    // thread, holding none of the store's locks.
    void* allocate(int& error);
    // Makes at least `pages` pages (at most a small chunk's) ready for
    // try_allocate, populating a chunk as allocate() does where fewer are
    // (what is left of the newest chunk goes on the free list first): for
    // a writer that needs several pages under its locks at once. 0, or
    // -ENOSPC / -ENOMEM. Any thread, holding none of the store's locks.
    int refill(uint64_t pages);
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
    // huge_pages for the chunks populated from now on; reads the kernel's
    // THP setting again.
    void set_mode(huge_page_mode mode);
    // Chunks populated since the pool was made or emptied, by kind.
    uint64_t huge_chunks() const { return _huge_chunks.load(std::memory_order_relaxed); }
    uint64_t small_chunks() const { return _small_chunks.load(std::memory_order_relaxed); }
    // memory_store::describe_chunks.
    void describe(nlohmann::json& out) const;

private:
    // Pages returned per flush at most: 1 MiB, so that a store far
    // beyond its bound pays one madvise (and TLB shootdown) per run of
    // adjacent pages in a MiB, not per 64 pages.
    static constexpr size_t k_batch = 256;
    void queue_locked(void* page);
    void flush_locked();
    // A ready page (try_allocate's part), under _lock.
    void* take_locked(int& error);
    // The kind of the next chunk, and whether the policy chose it (and so
    // gets its time). Under _lock.
    chunk_kind pick_locked(bool& measured);
    // Pages try_allocate can give without populating. Under _lock.
    uint64_t ready_locked() const;
    // Charges, carves and populates a chunk (without _lock, which `guard`
    // holds on entry and on return) and makes it the bump, which must be
    // empty; false with `error` -ENOSPC or -ENOMEM.
    bool populate_locked(std::unique_lock<std::mutex>& guard, int& error);
    // Whether `bytes` more fit under the budget's limit and every parent's.
    bool room_for(uint64_t bytes) const;
    // Address space for a chunk of `bytes` (one of the chunk sizes),
    // aligned to its size, or nullptr when the system refuses a new slab.
    // Under _lock.
    char* carve_locked(size_t bytes);
    // Makes [at, at+bytes) writable and populated, in a huge page if
    // `huge`; false when the system refuses. No lock needed.
    static bool populate(char* at, size_t bytes, bool huge);
    // A new slab of address space for carve_locked; false when the system
    // refuses it. Under _lock.
    bool reserve_slab();

    struct slab {
        char* base;
        size_t bytes;
    };

    int _numa_node;
    memory_budget& _budget;
    uint64_t _capacity;
    size_t _slab_bytes;
    chunk_policy& _policy;
    mutable std::mutex _lock;
    std::condition_variable _populated;  // signalled when _populating ends
    bool _populating = false;            // a thread populates a chunk (outside _lock)
    huge_page_mode _mode;
    bool _thp = false;     // the kernel gives this process huge pages
    std::string _thp_why;  // why not
    std::vector<slab> _slabs;
    char* _carve = nullptr;  // the newest slab's address space not made a chunk yet
    char* _carve_end = nullptr;
    // 1 MiB of address space skipped to align a huge chunk: the next small
    // chunk's, so that alternating kinds leave no holes.
    char* _spare = nullptr;
    void* _kept = nullptr;  // free list of resident pages, linked through their first word
    std::atomic<uint64_t> _kept_count{0};
    std::vector<void*> _returned_free;  // returned to the kernel, ready to reuse
    void* _pending[k_batch] = {};       // freed beyond the bound, not yet returned
    size_t _pending_count = 0;
    char* _bump = nullptr;  // unused rest of the newest chunk
    char* _bump_end = nullptr;
    std::atomic<uint64_t> _resident{0};
    std::atomic<uint64_t> _returned{0};
    std::atomic<uint64_t> _huge_chunks{0};
    std::atomic<uint64_t> _small_chunks{0};
};

}  // namespace softblk::core
