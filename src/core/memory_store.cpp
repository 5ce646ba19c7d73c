// The memory store (include/softblk/memory_store.hpp) and the process's
// data-memory budget.
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
// pages never share a lock.
//
// Accounting: the store charges its budget for what it holds resident, where
// it allocates: a 1 MiB chunk when it is mapped (the pool populates it
// whole), a released page when it is reused, a page-table node when it is
// created; pages returned to the kernel are released. So memory_bytes() is
// the budget's use, and a charge happens once per chunk, node or reused page
// (relaxed atomics, no lock of its own; the pool's mutex is taken anyway).
#include <softblk/memory_store.hpp>

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <new>
#include <sched.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <softblk/support/cpu_relax.hpp>

namespace softblk {

memory_budget& process_memory_budget()
{
    static memory_budget budget;
    return budget;
}

namespace core {

namespace {

constexpr unsigned k_mpol_preferred = 1;  // <linux/mempolicy.h> MPOL_PREFERRED

class page_store final : public memory_store {
public:
    page_store(const config& cfg, memory_budget& parent);
    ~page_store() override;

    void read(uint64_t offset, void* out, uint64_t length) const override;
    int write(uint64_t offset, const void* data, uint64_t length) override;
    void discard(uint64_t offset, uint64_t length) override;
    int write_zeroes(uint64_t offset, uint64_t length, bool keep_allocated) override;
    void map_extents(uint64_t offset, uint64_t length, std::vector<extent>& out) const override;
    void clear() override;
    uint64_t memory_bytes() const override { return _budget.used(); }
    uint64_t data_page_bytes() const override
    {
        return _live_pages.load(std::memory_order_relaxed) * uint64_t{k_page_size};
    }
    uint64_t contended() const override { return _contended.load(std::memory_order_relaxed); }
    const memory_budget& budget() const override { return _budget; }
    void set_limit(uint64_t limit_bytes) override { _budget.set_limit(limit_bytes); }
    uint64_t capacity_bytes() const override { return _capacity; }
    uint32_t block_size() const override { return _block_size; }

private:
    static constexpr unsigned k_stripes = 256;
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
    // pages are released to the kernel in batches and reused. Every page
    // counted in resident_pages() is charged to the budget.
    class page_pool {
    public:
        page_pool(int numa_node, memory_budget& budget) : _numa_node(numa_node), _budget(budget) {}
        ~page_pool();
        // A page, or nullptr with `error` set to -ENOSPC (the budget
        // refused) or -ENOMEM (the system did).
        void* allocate(int& error);
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
        memory_budget& _budget;
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
    // nullptr if absent (and !create), or when a node cannot be had (then
    // `error` is -ENOSPC or -ENOMEM).
    std::atomic<uintptr_t>* leaf(uint64_t index, bool create, int* error = nullptr) const;
    void lock(uint64_t page_index) const;
    void unlock(uint64_t page_index) const;
    void free_subtree(node* n, unsigned level);
    // Block bits of [first_block, first_block+count) of a page.
    uintptr_t block_mask(uint32_t in_page_offset, uint32_t length) const;
    // What the store holds whatever is written: the lock stripes and itself.
    static constexpr uint64_t fixed_bytes()
    {
        return k_stripes * sizeof(stripe) + sizeof(page_store);
    }

    uint64_t _capacity;
    uint64_t _page_count;
    uint32_t _block_size;
    unsigned _block_shift;
    unsigned _levels;
    mutable memory_budget _budget;
    node* _root;
    mutable std::unique_ptr<stripe[]> _stripes;
    mutable page_pool _pool;
    mutable std::atomic<uint64_t> _nodes{1};
    std::atomic<uint64_t> _live_pages{0};
    mutable std::atomic<uint64_t> _contended{0};
};

}  // namespace

// ---------------------------------------------------------------- page pool

page_store::page_pool::~page_pool()
{
    release_all();
}

void* page_store::page_pool::allocate(int& error)
{
    std::lock_guard guard(_lock);
    if (!_free.empty()) {
        // Released pages fault back in (zeroed) on first touch: resident
        // again, so charged again.
        if (!_budget.try_charge(k_page_size)) {
            error = -ENOSPC;
            return nullptr;
        }
        void* p = _free.back();
        _free.pop_back();
        _resident.fetch_add(1, std::memory_order_relaxed);
        return p;
    }
    if (_pending_count > 0) {
        // Not released yet: hand it straight back out, still resident.
        return _pending[--_pending_count];
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
    void* p = _bump;
    _bump += k_page_size;
    return p;
}

void page_store::page_pool::free(void* page)
{
    std::lock_guard guard(_lock);
    _pending[_pending_count++] = page;
    if (_pending_count == k_batch) {
        flush_locked();
    }
}

void page_store::page_pool::flush()
{
    std::lock_guard guard(_lock);
    flush_locked();
}

void page_store::page_pool::flush_locked()
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
    _free.insert(_free.end(), _pending, _pending + _pending_count);
    _resident.fetch_sub(_pending_count, std::memory_order_relaxed);
    _budget.release(_pending_count * uint64_t{k_page_size});
    _pending_count = 0;
}

void page_store::page_pool::release_all()
{
    std::lock_guard guard(_lock);
    for (void* c : _chunks) {
        munmap(c, k_chunk_bytes);
    }
    _chunks.clear();
    _free.clear();
    _pending_count = 0;
    _bump = _bump_end = nullptr;
    _budget.release(_resident.exchange(0, std::memory_order_relaxed) * uint64_t{k_page_size});
}

// ---------------------------------------------------------------- store

page_store::page_store(const config& cfg, memory_budget& parent)
    : _capacity(cfg.capacity_bytes),
      _page_count((cfg.capacity_bytes + k_page_size - 1) / k_page_size),
      _block_size(cfg.block_size),
      _block_shift(static_cast<unsigned>(__builtin_ctz(cfg.block_size))),
      _budget(cfg.limit_bytes, &parent),
      _stripes(new stripe[k_stripes]),
      _pool(cfg.numa_node, _budget)
{
    assert(_block_size >= 512 && _block_size <= k_page_size &&
           (_block_size & (_block_size - 1)) == 0);
    unsigned bits = 0;
    while (bits < 64 && (uint64_t{1} << bits) < _page_count) {
        ++bits;
    }
    _levels = std::max(1u, (bits + k_fanout_bits - 1) / k_fanout_bits);
    _root = new node();
    _budget.charge(fixed_bytes() + sizeof(node));
}

page_store::~page_store()
{
    free_subtree(_root, 0);
    _pool.release_all();
    _budget.release(fixed_bytes() + _nodes.load(std::memory_order_relaxed) * sizeof(node));
}

void page_store::free_subtree(node* n, unsigned level)
{
    if (level + 1 < _levels) {
        for (auto& s : n->slot) {
            if (uintptr_t v = s.load(std::memory_order_relaxed)) {
                free_subtree(reinterpret_cast<node*>(v), level + 1);
            }
        }
    }
    delete n;
}

std::atomic<uintptr_t>* page_store::leaf(uint64_t index, bool create, int* error) const
{
    node* n = _root;
    for (unsigned level = 0; level + 1 < _levels; ++level) {
        const unsigned shift = k_fanout_bits * (_levels - 1 - level);
        std::atomic<uintptr_t>& s = n->slot[(index >> shift) & (k_fanout - 1)];
        uintptr_t v = s.load(std::memory_order_acquire);
        if (v == 0) {
            if (!create) {
                return nullptr;
            }
            if (!_budget.try_charge(sizeof(node))) {
                *error = -ENOSPC;
                return nullptr;
            }
            node* fresh = new (std::nothrow) node();
            if (fresh == nullptr) {
                _budget.release(sizeof(node));
                *error = -ENOMEM;
                return nullptr;
            }
            uintptr_t expected = 0;
            if (s.compare_exchange_strong(expected, reinterpret_cast<uintptr_t>(fresh),
                                          std::memory_order_acq_rel, std::memory_order_acquire)) {
                _nodes.fetch_add(1, std::memory_order_relaxed);
                v = reinterpret_cast<uintptr_t>(fresh);
            } else {
                delete fresh;  // another queue installed it first
                _budget.release(sizeof(node));
                v = expected;
            }
        }
        n = reinterpret_cast<node*>(v);
    }
    return &n->slot[index & (k_fanout - 1)];
}

void page_store::lock(uint64_t page_index) const
{
    std::atomic<uint32_t>& l = _stripes[page_index % k_stripes].locked;
    if (l.exchange(1, std::memory_order_acquire) == 0) {
        return;
    }
    _contended.fetch_add(1, std::memory_order_relaxed);
    unsigned spins = 0;
    for (;;) {
        while (l.load(std::memory_order_relaxed) != 0) {
            if (++spins < 256) {
                cpu_relax();
            } else {
                sched_yield();  // the holder may have been preempted
            }
        }
        if (l.exchange(1, std::memory_order_acquire) == 0) {
            return;
        }
    }
}

void page_store::unlock(uint64_t page_index) const
{
    _stripes[page_index % k_stripes].locked.store(0, std::memory_order_release);
}

uintptr_t page_store::block_mask(uint32_t in_page_offset, uint32_t length) const
{
    const unsigned first = in_page_offset >> _block_shift;
    const unsigned count = length >> _block_shift;
    return ((uintptr_t{1} << count) - 1) << first;
}

void page_store::read(uint64_t offset, void* out, uint64_t length) const
{
    auto* dst = static_cast<char*>(out);
    while (length > 0) {
        const uint64_t index = offset / k_page_size;
        const uint32_t in_page = static_cast<uint32_t>(offset % k_page_size);
        const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(length, k_page_size - in_page));
        std::atomic<uintptr_t>* e = leaf(index, false);
        if (e == nullptr) {
            std::memset(dst, 0, n);
        } else {
            lock(index);
            const uintptr_t v = e->load(std::memory_order_relaxed);
            const uintptr_t want = block_mask(in_page, n);
            const char* page = reinterpret_cast<const char*>(v & ~k_bits_mask);
            if ((v & want) == want) {
                std::memcpy(dst, page + in_page, n);
            } else if ((v & want) == 0) {
                std::memset(dst, 0, n);
            } else {
                for (uint32_t b = 0; b < n; b += _block_size) {
                    if ((v >> ((in_page + b) >> _block_shift)) & 1) {
                        std::memcpy(dst + b, page + in_page + b, _block_size);
                    } else {
                        std::memset(dst + b, 0, _block_size);
                    }
                }
            }
            unlock(index);
        }
        dst += n;
        offset += n;
        length -= n;
    }
}

int page_store::write(uint64_t offset, const void* data, uint64_t length)
{
    const auto* src = static_cast<const char*>(data);
    while (length > 0) {
        const uint64_t index = offset / k_page_size;
        const uint32_t in_page = static_cast<uint32_t>(offset % k_page_size);
        const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(length, k_page_size - in_page));
        int error = 0;
        std::atomic<uintptr_t>* e = leaf(index, true, &error);
        if (e == nullptr) {
            return error;
        }
        lock(index);
        uintptr_t v = e->load(std::memory_order_relaxed);
        if (v == 0) {
            void* page = _pool.allocate(error);
            if (page == nullptr) {
                unlock(index);
                return error;
            }
            v = reinterpret_cast<uintptr_t>(page);
            _live_pages.fetch_add(1, std::memory_order_relaxed);
        }
        std::memcpy(reinterpret_cast<char*>(v & ~k_bits_mask) + in_page, src, n);
        e->store(v | block_mask(in_page, n), std::memory_order_release);
        unlock(index);
        src += n;
        offset += n;
        length -= n;
    }
    return 0;
}

void page_store::discard(uint64_t offset, uint64_t length)
{
    bool freed = false;
    while (length > 0) {
        const uint64_t index = offset / k_page_size;
        const uint32_t in_page = static_cast<uint32_t>(offset % k_page_size);
        const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(length, k_page_size - in_page));
        if (std::atomic<uintptr_t>* e = leaf(index, false)) {
            lock(index);
            uintptr_t v = e->load(std::memory_order_relaxed);
            if (v != 0) {
                v &= ~block_mask(in_page, n);
                if ((v & k_bits_mask) == 0) {
                    _pool.free(reinterpret_cast<void*>(v));
                    _live_pages.fetch_sub(1, std::memory_order_relaxed);
                    v = 0;
                    freed = true;
                }
                e->store(v, std::memory_order_release);
            }
            unlock(index);
        }
        offset += n;
        length -= n;
    }
    if (freed) {
        _pool.flush();
    }
}

int page_store::write_zeroes(uint64_t offset, uint64_t length, bool keep_allocated)
{
    if (!keep_allocated) {
        discard(offset, length);
        return 0;
    }
    static const char zeros[k_page_size] = {};
    while (length > 0) {
        const uint32_t in_page = static_cast<uint32_t>(offset % k_page_size);
        const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(length, k_page_size - in_page));
        if (int rc = write(offset, zeros, n); rc < 0) {
            return rc;
        }
        offset += n;
        length -= n;
    }
    return 0;
}

void page_store::map_extents(uint64_t offset, uint64_t length, std::vector<extent>& out) const
{
    if (offset >= _capacity) {
        return;
    }
    const uint64_t end = offset + std::min(length, _capacity - offset);
    auto emit = [&](uint64_t from, uint64_t to, bool allocated) {
        if (from >= to) {
            return;
        }
        if (!out.empty() && out.back().allocated == allocated &&
            out.back().offset + out.back().length == from) {
            out.back().length += to - from;
            return;
        }
        out.push_back(extent{from, to - from, allocated, !allocated});
    };
    uint64_t pos = offset;
    while (pos < end) {
        const uint64_t index = pos / k_page_size;
        // Skip a whole missing subtree at once.
        node* n = _root;
        uint64_t skip_to = 0;
        for (unsigned level = 0; level + 1 < _levels; ++level) {
            const unsigned shift = k_fanout_bits * (_levels - 1 - level);
            uintptr_t v =
                n->slot[(index >> shift) & (k_fanout - 1)].load(std::memory_order_acquire);
            if (v == 0) {
                skip_to = ((index >> shift) + 1) << shift;
                n = nullptr;
                break;
            }
            n = reinterpret_cast<node*>(v);
        }
        if (n == nullptr) {
            const uint64_t next = std::min(end, skip_to * k_page_size);
            emit(pos, next, false);
            pos = next;
            continue;
        }
        const uintptr_t v = n->slot[index & (k_fanout - 1)].load(std::memory_order_acquire);
        const uint64_t page_end = std::min(end, (index + 1) * k_page_size);
        while (pos < page_end) {
            const unsigned bit = static_cast<unsigned>((pos % k_page_size) >> _block_shift);
            const bool allocated = ((v >> bit) & 1) != 0;
            const uint64_t block_end =
                std::min(page_end, (pos & ~uint64_t{_block_size - 1}) + _block_size);
            emit(pos, block_end, allocated);
            pos = block_end;
        }
    }
}

void page_store::clear()
{
    for (auto& s : _root->slot) {
        if (uintptr_t v = s.exchange(0, std::memory_order_relaxed)) {
            if (_levels > 1) {
                free_subtree(reinterpret_cast<node*>(v), 1);
            }
        }
    }
    _budget.release((_nodes.exchange(1, std::memory_order_relaxed) - 1) * sizeof(node));
    _live_pages.store(0, std::memory_order_relaxed);
    _pool.release_all();
}

}  // namespace core

std::unique_ptr<memory_store> memory_store::create(const config& cfg)
{
    return std::make_unique<core::page_store>(
        cfg, cfg.parent != nullptr ? *cfg.parent : process_memory_budget());
}

}  // namespace softblk
