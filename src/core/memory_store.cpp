// The memory store (include/softblk/memory_store.hpp); the data-memory
// budgets it charges are in memory_budget.cpp.
//
// Layout (null_blk's, with a page table instead of a radix tree of
// pointers): data lives in 4 KiB pages, found through a page table keyed by
// page index whose nodes (64 entries, 512 bytes) are created on first write. A
// leaf entry is the page's address with a bitmap of the blocks it holds in
// its low bits, so unwritten blocks of a page read as zeros and discard works
// at block granularity; a page whose last block is discarded goes back to the
// page pool, which keeps it resident for the next write (a zone reset and the
// zone's rewrite cost no system call and no page fault) up to a bound, and
// returns RAM beyond the bound to the kernel (MADV_DONTNEED). A device of any
// size with nothing written costs one root node, the lock stripes and nothing
// else.
//
// Concurrency: any number of queue threads may call read/write/discard at
// once. Page-table nodes are installed lock-free (compare-and-swap) and never
// freed while the store lives; a page's contents and its leaf entry are
// guarded by one of k_stripes spin locks chosen by page index, so adjacent
// pages never share a lock; write_from and read_to hold the locks of a run
// of pages while they copy between them and a window, taking them in
// ascending stripe order. The page pool has one mutex, taken once per page
// allocated or freed (under the page's stripe lock); its free list, linked
// through the free pages' first word, is only touched under it, and a page
// is on it only after its leaf entry was cleared, so no reader sees it.
// When the pool has no page ready, the writer lets go of its stripe locks
// and the pool populates a chunk holding no lock (page_pool.hpp), which may
// take milliseconds; the writer then takes its locks again and looks at
// the entries anew (another writer may have given the page one meanwhile).
//
// Accounting: the store charges its budget for what it holds resident, where
// it allocates: a chunk when it is mapped (page_pool.hpp: the pool
// populates it whole), a page returned to the kernel when it is reused, a
// page-table node when it is created; pages returned to the kernel are
// released. A free page kept resident stays charged, so reusing it charges
// nothing. So memory_bytes() is the budget's use, and a charge happens once
// per chunk, node or page taken back from the kernel (relaxed atomics, no
// lock of its own; the pool's mutex is taken anyway).
#include <softblk/memory_store.hpp>

#include "page_pool.hpp"
#include "copy_mode_chooser.hpp"

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <cstring>
#include <new>
#include <utility>
#include <sched.h>
#include <sys/uio.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <softblk/support/cpu_relax.hpp>

namespace softblk {

namespace core {

namespace {

class page_store final : public memory_store {
public:
    page_store(const config& cfg, memory_budget& parent);
    ~page_store() override;

    void read(uint64_t offset, void* out, uint64_t length) const override;
    int write(uint64_t offset, const void* data, uint64_t length) override;
    int write_from(uint64_t offset, const data_window& window, uint64_t length) override;
    int read_to(uint64_t offset, const data_window& window, uint64_t length) const override;
    void discard(uint64_t offset, uint64_t length) override;
    int write_zeroes(uint64_t offset, uint64_t length, bool keep_allocated) override;
    void map_extents(uint64_t offset, uint64_t length, std::vector<extent>& out) const override;
    void clear() override;
    uint64_t memory_bytes() const override { return _budget.used(); }
    uint64_t data_page_bytes() const override
    {
        return _live_pages.load(std::memory_order_relaxed) * uint64_t{k_page_size};
    }
    uint64_t free_page_bytes() const override { return _pool.free_pages() * uint64_t{k_page_size}; }
    uint64_t free_page_limit_bytes() const override
    {
        return _pool.keep_pages() * uint64_t{k_page_size};
    }
    uint64_t returned_bytes() const override
    {
        return _pool.returned_pages() * uint64_t{k_page_size};
    }
    uint64_t contended() const override { return _contended.load(std::memory_order_relaxed); }
    const memory_budget& budget() const override { return _budget; }
    memory_budget& budget() override { return _budget; }
    void set_limit(uint64_t limit_bytes) override
    {
        _budget.set_limit(limit_bytes);
        _pool.trim();
    }
    void set_huge_pages(huge_page_mode mode) override { _pool.set_mode(mode); }
    void describe_chunks(nlohmann::json& out) const override { _pool.describe(out); }
    void describe_writes(nlohmann::json& out) const override { _copy.describe(out); }
    uint64_t capacity_bytes() const override { return _capacity; }
    uint32_t block_size() const override { return _block_size; }

private:
    static constexpr unsigned k_stripes = 256;
    // Pages write_from and read_to copy with one preadv or pwritev, their
    // locks all held: fewer than k_stripes, so a run's stripes all differ.
    static constexpr unsigned k_run_pages = 64;
    static constexpr unsigned k_fanout_bits = 6;  // 64 entries, 512-byte nodes
    static constexpr unsigned k_fanout = 1u << k_fanout_bits;
    static constexpr uintptr_t k_bits_mask = k_page_size - 1;

    struct node {
        std::atomic<uintptr_t> slot[k_fanout];
    };

    struct alignas(64) stripe {
        std::atomic<uint32_t> locked{0};
    };

    // The leaf entry of page `index`, creating missing nodes if `create`;
    // nullptr if absent (and !create), or when a node cannot be had (then
    // `error` is -ENOSPC or -ENOMEM).
    std::atomic<uintptr_t>* leaf(uint64_t index, bool create, int* error = nullptr) const
    {
        // Inline, as the stripe lock's fast path below: between two 4 KiB
        // copies every call, spill and saved register is one more store
        // queued behind the copy's, and the in-process write path at 1 GiB
        // was 4% faster without them. Creating nodes stays out of line.
        node* n = _root;
        for (unsigned level = 0; level + 1 < _levels; ++level) {
            const unsigned shift = k_fanout_bits * (_levels - 1 - level);
            const uintptr_t v =
                n->slot[(index >> shift) & (k_fanout - 1)].load(std::memory_order_acquire);
            if (v == 0) {
                return create ? create_leaf(index, *error) : nullptr;
            }
            n = reinterpret_cast<node*>(v);
        }
        return &n->slot[index & (k_fanout - 1)];
    }
    // leaf()'s slow path: creates the missing nodes, charging each.
    [[gnu::noinline]] std::atomic<uintptr_t>* create_leaf(uint64_t index, int& error) const;
    void lock(uint64_t page_index) const
    {
        std::atomic<uint32_t>& l = _stripes[page_index % k_stripes].locked;
        if (l.exchange(1, std::memory_order_acquire) != 0) [[unlikely]] {
            wait_for(l);
        }
    }
    // lock()'s slow path: counts the wait, spins, then yields until `l` is
    // free, and takes it.
    [[gnu::noinline]] void wait_for(std::atomic<uint32_t>& l) const;
    void unlock(uint64_t page_index) const
    {
        _stripes[page_index % k_stripes].locked.store(0, std::memory_order_release);
    }
    // The next run of write_from or read_to: up to k_run_pages pages from
    // `offset`, at most `length` bytes. Page `i` of it holds span(i).
    struct run {
        uint64_t first = 0;     // page index
        uint32_t in_first = 0;  // where the bytes start in the first page
        uint64_t bytes = 0;
        unsigned pages = 0;
        // Where the run's bytes start in page `i`, and how many there are.
        std::pair<uint32_t, uint32_t> span(unsigned i) const
        {
            const uint64_t before = i == 0 ? 0 : uint64_t{k_page_size} * i - in_first;
            const uint32_t in_page = i == 0 ? in_first : 0;
            return {in_page, static_cast<uint32_t>(
                                 std::min<uint64_t>(bytes - before, k_page_size - in_page))};
        }
    };
    static run next_run(uint64_t offset, uint64_t length);
    // Adds [at, at+n) to the segments of a preadv or pwritev, merged with the
    // last one where it goes on from it (a run's pages come from chunks in
    // order, so they are often adjacent).
    static void add_segment(::iovec* iov, int& count, const char* at, uint32_t n);
    // The locks of `pages` (<= k_run_pages) pages from `first` on, in
    // ascending stripe order: the one order in which anything holds more
    // than one, so two runs never wait on each other in a cycle.
    void lock_run(uint64_t first, unsigned pages) const;
    void unlock_run(uint64_t first, unsigned pages) const;
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
    copy_mode_chooser _copy;
    mutable std::atomic<uint64_t> _nodes{1};
    std::atomic<uint64_t> _live_pages{0};
    mutable std::atomic<uint64_t> _contended{0};
};

}  // namespace

// ---------------------------------------------------------------- store

page_store::page_store(const config& cfg, memory_budget& parent)
    : _capacity(cfg.capacity_bytes),
      _page_count((cfg.capacity_bytes + k_page_size - 1) / k_page_size),
      _block_size(cfg.block_size),
      _block_shift(static_cast<unsigned>(__builtin_ctz(cfg.block_size))),
      _budget(cfg.limit_bytes, &parent),
      _stripes(new stripe[k_stripes]),
      _pool(cfg.numa_node, _budget, _page_count * k_page_size, cfg.huge_pages),
      _copy(choose_copy(_page_count * k_page_size,
                        cfg.cache_bytes != 0 ? cfg.cache_bytes : last_level_cache_bytes()))
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

std::atomic<uintptr_t>* page_store::create_leaf(uint64_t index, int& error) const
{
    node* n = _root;
    for (unsigned level = 0; level + 1 < _levels; ++level) {
        const unsigned shift = k_fanout_bits * (_levels - 1 - level);
        std::atomic<uintptr_t>& s = n->slot[(index >> shift) & (k_fanout - 1)];
        uintptr_t v = s.load(std::memory_order_acquire);
        if (v == 0) {
            if (!_budget.try_charge(sizeof(node))) {
                error = -ENOSPC;
                return nullptr;
            }
            node* fresh = new (std::nothrow) node();
            if (fresh == nullptr) {
                _budget.release(sizeof(node));
                error = -ENOMEM;
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

void page_store::wait_for(std::atomic<uint32_t>& l) const
{
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

page_store::run page_store::next_run(uint64_t offset, uint64_t length)
{
    run r;
    r.first = offset / k_page_size;
    r.in_first = static_cast<uint32_t>(offset % k_page_size);
    r.bytes = std::min<uint64_t>(length, uint64_t{k_run_pages} * k_page_size - r.in_first);
    r.pages = static_cast<unsigned>((r.in_first + r.bytes - 1) / k_page_size + 1);
    return r;
}

void page_store::add_segment(::iovec* iov, int& count, const char* at, uint32_t n)
{
    if (count > 0 &&
        static_cast<const char*>(iov[count - 1].iov_base) + iov[count - 1].iov_len == at) {
        iov[count - 1].iov_len += n;
    } else {
        iov[count++] = {.iov_base = const_cast<char*>(at), .iov_len = n};
    }
}

void page_store::lock_run(uint64_t first, unsigned pages) const
{
    // Pages from `wrap` on have the lowest stripes (the index wraps to 0).
    const unsigned wrap = k_stripes - static_cast<unsigned>(first % k_stripes);
    for (unsigned i = wrap; i < pages; ++i) {
        lock(first + i);
    }
    for (unsigned i = 0; i < std::min(wrap, pages); ++i) {
        lock(first + i);
    }
}

void page_store::unlock_run(uint64_t first, unsigned pages) const
{
    for (unsigned i = 0; i < pages; ++i) {
        unlock(first + i);
    }
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
        std::atomic<uintptr_t>* e = leaf(index, false);
        if (e == nullptr) [[unlikely]] {
            int error = 0;
            if (e = create_leaf(index, error); e == nullptr) {
                return error;
            }
        }
        lock(index);
        uintptr_t v = e->load(std::memory_order_relaxed);
        if (v == 0) [[unlikely]] {
            int error = 0;
            void* page = _pool.try_allocate(error);
            if (page == nullptr && error == page_pool::k_must_populate) {
                // A chunk must be populated: not under the stripe lock, which
                // writers of other pages share.
                unlock(index);
                page = _pool.allocate(error);
                lock(index);
                v = e->load(std::memory_order_relaxed);
                if (v != 0 && page != nullptr) {
                    _pool.free(page);  // another writer gave it a page meanwhile
                }
            }
            if (v == 0) {
                if (page == nullptr) {
                    unlock(index);
                    return error;
                }
                v = reinterpret_cast<uintptr_t>(page);
                _live_pages.fetch_add(1, std::memory_order_relaxed);
            }
        }
        char* to = reinterpret_cast<char*>(v & ~k_bits_mask) + in_page;
        _copy.copy(index, to, src, n);
        // A page written in full before keeps its entry: no store, so the
        // leaf's cache line stays clean.
        if (const uintptr_t bits = v | block_mask(in_page, n); bits != v) {
            e->store(bits, std::memory_order_release);
        }
        unlock(index);
        src += n;
        offset += n;
        length -= n;
    }
    return 0;
}

int page_store::write_from(uint64_t offset, const data_window& window, uint64_t length)
{
    uint64_t from = 0;  // the window's bytes stored so far
    while (length > 0) {
        const run r = next_run(offset, length);
        std::atomic<uintptr_t>* entries[k_run_pages];
        int error = 0;
        for (unsigned i = 0; i < r.pages; ++i) {
            entries[i] = leaf(r.first + i, true, &error);
            if (entries[i] == nullptr) {
                return error;
            }
        }
        lock_run(r.first, r.pages);
        uintptr_t values[k_run_pages];
        bool fresh[k_run_pages];
        ::iovec iov[k_run_pages];
        int iov_count = 0;
        unsigned held = 0;  // pages with a page (allocated or found)
        for (; held < r.pages; ++held) {
            uintptr_t v = entries[held]->load(std::memory_order_relaxed);
            fresh[held] = v == 0;
            if (v == 0) {
                void* page = _pool.try_allocate(error);
                if (page == nullptr) {
                    break;
                }
                v = reinterpret_cast<uintptr_t>(page);
            }
            values[held] = v;
            const auto [in_page, n] = r.span(held);
            add_segment(iov, iov_count, reinterpret_cast<char*>(v & ~k_bits_mask) + in_page, n);
        }
        if (error == 0) {
            const ssize_t got =
                ::preadv(window.fd, iov, iov_count, static_cast<off_t>(window.offset + from));
            if (got != static_cast<ssize_t>(r.bytes)) {
                error = got < 0 ? -errno : -EIO;
            }
        }
        if (error == page_pool::k_must_populate) {
            // A chunk must be populated: the pages taken go back, the locks
            // are let go while the pool makes as many pages ready as the
            // run needs (fewer would leave it here again), and the run
            // starts again.
            uint64_t need = 0;
            for (unsigned i = 0; i < r.pages; ++i) {
                if (i < held ? fresh[i] : entries[i]->load(std::memory_order_relaxed) == 0) {
                    ++need;
                }
            }
            for (unsigned i = 0; i < held; ++i) {
                if (fresh[i]) {
                    _pool.free(reinterpret_cast<void*>(values[i]));
                }
            }
            unlock_run(r.first, r.pages);
            if (error = _pool.refill(need); error != 0) {
                return error;
            }
            continue;
        }
        bool freed = false;
        for (unsigned i = 0; i < held; ++i) {
            if (error == 0) {
                if (fresh[i]) {
                    _live_pages.fetch_add(1, std::memory_order_relaxed);
                }
                const auto [in_page, n] = r.span(i);
                entries[i]->store(values[i] | block_mask(in_page, n), std::memory_order_release);
            } else if (fresh[i]) {
                _pool.free(reinterpret_cast<void*>(values[i]));
                freed = true;
            }
        }
        unlock_run(r.first, r.pages);
        if (error != 0) {
            if (freed) {
                _pool.flush();
            }
            return error;
        }
        offset += r.bytes;
        from += r.bytes;
        length -= r.bytes;
    }
    return 0;
}

int page_store::read_to(uint64_t offset, const data_window& window, uint64_t length) const
{
    // What read() gives blocks that hold nothing.
    alignas(k_page_size) static const char zeros[k_page_size] = {};
    // A run's segments: a page in full, or each block of a partial one.
    constexpr unsigned k_most_segments = k_run_pages * (k_page_size / 512);
    uint64_t to = 0;  // the window's bytes filled so far
    while (length > 0) {
        const run r = next_run(offset, length);
        ::iovec iov[k_most_segments];
        int iov_count = 0;
        lock_run(r.first, r.pages);
        for (unsigned i = 0; i < r.pages; ++i) {
            const auto [in_page, n] = r.span(i);
            const std::atomic<uintptr_t>* e = leaf(r.first + i, false);
            const uintptr_t v = e != nullptr ? e->load(std::memory_order_relaxed) : 0;
            const uintptr_t want = block_mask(in_page, n);
            const char* page = reinterpret_cast<const char*>(v & ~k_bits_mask);
            if ((v & want) == want) {
                add_segment(iov, iov_count, page + in_page, n);
            } else if ((v & want) == 0) {
                add_segment(iov, iov_count, zeros + in_page, n);
            } else {
                for (uint32_t b = 0; b < n; b += _block_size) {
                    const bool held = ((v >> ((in_page + b) >> _block_shift)) & 1) != 0;
                    add_segment(iov, iov_count, (held ? page : zeros) + in_page + b, _block_size);
                }
            }
        }
        const ssize_t put =
            ::pwritev(window.fd, iov, iov_count, static_cast<off_t>(window.offset + to));
        const int error = put == static_cast<ssize_t>(r.bytes) ? 0 : put < 0 ? -errno : -EIO;
        unlock_run(r.first, r.pages);
        if (error != 0) {
            return error;
        }
        offset += r.bytes;
        to += r.bytes;
        length -= r.bytes;
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

void describe_memory_store(const memory_store& store, nlohmann::json& out)
{
    out["data_page_bytes"] = store.data_page_bytes();
    out["store_memory_bytes"] = store.memory_bytes();
    out["store_free_page_bytes"] = store.free_page_bytes();
    out["store_free_page_limit_bytes"] = store.free_page_limit_bytes();
    out["store_returned_bytes"] = store.returned_bytes();
    out["store_lock_contended"] = store.contended();
    out["memory_limit_bytes"] = store.budget().limit();
    out["memory_refused"] = store.budget().refused();
    store.describe_chunks(out["chunks"]);
    store.describe_writes(out["writes"]);
}

result<huge_page_mode> parse_huge_page_mode(std::string_view text)
{
    if (text == "auto") {
        return huge_page_mode::automatic;
    }
    if (text == "0") {
        return huge_page_mode::off;
    }
    if (text == "1") {
        return huge_page_mode::on;
    }
    return make_error(EINVAL,
                      "huge_pages takes auto (measured here: the default), 0 (small "
                      "pages) or 1 (huge pages)");
}

result<void> check_huge_page_mode(std::string_view text)
{
    if (auto mode = parse_huge_page_mode(text); !mode) {
        return std::unexpected(mode.error());
    }
    return {};
}

std::unique_ptr<memory_store> memory_store::create(const config& cfg)
{
    return std::make_unique<core::page_store>(
        cfg, cfg.parent != nullptr ? *cfg.parent : process_memory_budget());
}

}  // namespace softblk
