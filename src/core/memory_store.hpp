// A sparse, block-granular store of a device's data in RAM, shared by the
// null target (memory_backed=1) and the zoned target.
//
// Layout (null_blk's, with a page table instead of a radix tree of
// pointers): data lives in 4 KiB pages, found through a page table keyed by
// page index whose nodes (64 entries, 512 bytes) are created on first write. A
// leaf entry is the page's address with a bitmap of the blocks it holds in
// its low bits, so unwritten blocks of a page read as zeros and discard works
// at block granularity; a page whose last block is discarded goes back to the
// page pool, whose RAM is returned to the kernel (MADV_DONTNEED). A device of
// any size with nothing written costs one root node, the lock stripes and
// nothing else.
//
// Concurrency: any number of queue threads may call read/write/discard at
// once. Page-table nodes are installed lock-free (compare-and-swap) and never
// freed while the store lives; a page's contents and its leaf entry are
// guarded by one of k_stripes spin locks chosen by page index, so adjacent
// pages never share a lock. contended() counts lock acquisitions that had to
// wait (for the benchmark's contention figure).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include <softblk/types.hpp>

namespace softblk::core {

class memory_store {
public:
    static constexpr uint32_t k_page_size = 4096;
    static constexpr unsigned k_stripes = 256;

    // A store of `capacity_bytes` (rounded up to whole pages) with blocks of
    // `block_size` bytes (512 .. 4096, a power of two). `numa_node` >= 0
    // binds the data pages to that NUMA node (MPOL_PREFERRED); -1: the
    // kernel's default policy. Control thread.
    memory_store(uint64_t capacity_bytes, uint32_t block_size, int numa_node = -1);
    ~memory_store();
    memory_store(const memory_store&) = delete;
    memory_store& operator=(const memory_store&) = delete;

    // ---- hot path: any queue thread. Offsets and lengths are multiples of
    // the block size and inside the capacity (the caller checked).

    // Copies `length` bytes at `offset` into `out`; blocks never written (or
    // discarded) read as zeros.
    void read(uint64_t offset, void* out, uint64_t length) const;

    // Stores `length` bytes from `data` at `offset`. Returns 0, or -ENOMEM
    // when a page cannot be allocated (what was stored before the failure
    // stays stored).
    int write(uint64_t offset, const void* data, uint64_t length);

    // Forgets the blocks of [offset, offset+length): they read as zeros and
    // pages left empty are freed.
    void discard(uint64_t offset, uint64_t length);

    // Makes [offset, offset+length) read as zeros. keep_allocated=false
    // frees the blocks (discard); true stores zeros (the blocks stay
    // allocated, NBD's NO_HOLE). Returns 0 or -ENOMEM.
    int write_zeroes(uint64_t offset, uint64_t length, bool keep_allocated);

    // ---- control path

    // The allocation map of [offset, offset+length), clipped to the capacity,
    // at block granularity: allocated blocks as data, the rest as holes that
    // read as zeros. Appended to `out` in order with no gaps. Any thread.
    void map_extents(uint64_t offset, uint64_t length, std::vector<extent>& out) const;

    // Frees every page (the device's data is gone). No I/O may run.
    void clear();

    // RAM held: resident data pages (in use or pooled), page-table nodes and
    // the fixed part (lock stripes, root). Any thread.
    uint64_t memory_bytes() const;
    // Bytes of pages that hold at least one block of data. Any thread.
    uint64_t data_page_bytes() const
    {
        return _live_pages.load(std::memory_order_relaxed) * uint64_t{k_page_size};
    }
    uint64_t contended() const { return _contended.load(std::memory_order_relaxed); }

    uint64_t capacity_bytes() const { return _capacity; }
    uint32_t block_size() const { return _block_size; }

private:
    static constexpr unsigned k_fanout_bits = 6;  // 64 entries, 512-byte nodes
    static constexpr unsigned k_fanout = 1u << k_fanout_bits;
    static constexpr uintptr_t k_bits_mask = k_page_size - 1;

    struct node {
        std::atomic<uintptr_t> slot[k_fanout];
    };

    struct alignas(64) stripe {
        std::atomic<uint32_t> locked{0};
    };

    // Pages come from 1 MiB chunks mapped (and populated) at once; freed
    // pages are released to the kernel in batches and reused.
    class page_pool {
    public:
        explicit page_pool(int numa_node) : _numa_node(numa_node) {}
        ~page_pool();
        void* allocate();
        // Queues `page` for release; flush() returns queued pages' RAM.
        void free(void* page);
        void flush();
        void release_all();
        uint64_t resident_pages() const { return _resident.load(std::memory_order_relaxed); }

    private:
        static constexpr size_t k_chunk_bytes = size_t{1} << 20;
        static constexpr size_t k_batch = 64;
        void flush_locked();

        int _numa_node;
        mutable std::mutex _lock;
        std::vector<void*> _chunks;
        std::vector<void*> _free;      // released, ready to reuse
        void* _pending[k_batch] = {};  // freed, not yet released
        size_t _pending_count = 0;
        char* _bump = nullptr;  // unused rest of the newest chunk
        char* _bump_end = nullptr;
        std::atomic<uint64_t> _resident{0};
    };

    // The leaf entry of page `index`, creating missing nodes if `create`;
    // nullptr if absent (and !create) or when a node cannot be allocated.
    std::atomic<uintptr_t>* leaf(uint64_t index, bool create) const;
    void lock(uint64_t page_index) const;
    void unlock(uint64_t page_index) const;
    void free_subtree(node* n, unsigned level);
    // Block bits of [first_block, first_block+count) of a page.
    uintptr_t block_mask(uint32_t in_page_offset, uint32_t length) const;

    uint64_t _capacity;
    uint64_t _page_count;
    uint32_t _block_size;
    unsigned _block_shift;
    unsigned _levels;
    node* _root;
    mutable std::unique_ptr<stripe[]> _stripes;
    mutable page_pool _pool;
    mutable std::atomic<uint64_t> _nodes{1};
    std::atomic<uint64_t> _live_pages{0};
    mutable std::atomic<uint64_t> _contended{0};
};

}  // namespace softblk::core
