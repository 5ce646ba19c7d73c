// The memory store (include/softblk/memory_store.hpp) and the process's
// data-memory budget.
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
//
// Accounting: the store charges its budget for what it holds resident, where
// it allocates: a 1 MiB chunk when it is mapped (the pool populates it
// whole), a page returned to the kernel when it is reused, a page-table node
// when it is created; pages returned to the kernel are released. A free page
// kept resident stays charged, so reusing it charges nothing. So
// memory_bytes() is the budget's use, and a charge happens once per chunk,
// node or page taken back from the kernel (relaxed atomics, no lock of its
// own; the pool's mutex is taken anyway).
#include <softblk/memory_store.hpp>

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <mutex>
#include <new>
#include <utility>
#include <sched.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <softblk/support/cpu_relax.hpp>

namespace softblk {

memory_budget& process_memory_budget()
{
    static memory_budget budget;
    return budget;
}

std::string human_bytes(uint64_t bytes)
{
    static constexpr const char* k_units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    double value = static_cast<double>(bytes);
    size_t unit = 0;
    while (value >= 1024.0 && unit + 1 < std::size(k_units)) {
        value /= 1024.0;
        ++unit;
    }
    if (unit == 0) {
        return fmt::format("{} B", bytes);
    }
    return fmt::format("{:.1f} {}", value, k_units[unit]);
}

error out_of_memory(std::string_view what, uint64_t bytes)
{
    return error{std::error_code(ENOMEM, std::generic_category()),
                 fmt::format("not enough memory for {} ({}): the system refused it", what,
                             human_bytes(bytes))};
}

result<memory_charge> memory_charge::take(memory_budget& budget, uint64_t bytes,
                                          std::string_view what)
{
    memory_charge charge;
    if (bytes == 0) {
        return charge;
    }
    if (budget.try_charge(bytes)) {
        charge._budget = &budget;
        charge._bytes = bytes;
        return charge;
    }
    // The level that refused: the first whose limit the charge would pass.
    std::string why = "a memory budget refused it";
    for (const memory_budget* b = &budget; b != nullptr; b = b->parent()) {
        const uint64_t limit = b->limit();
        const uint64_t used = b->used();
        if (limit == 0 || (used + bytes <= limit && used + bytes >= used)) {
            continue;
        }
        const uint64_t left = used < limit ? limit - used : 0;
        why = b == &process_memory_budget()
                  ? fmt::format(
                        "the daemon's memory budget has {} left of {} (softblk daemon "
                        "--memory-limit; softblk status shows it)",
                        human_bytes(left), human_bytes(limit))
                  : fmt::format("the device's memory_limit of {} has {} left", human_bytes(limit),
                                human_bytes(left));
        break;
    }
    return make_error(
        ENOMEM, fmt::format("not enough memory for {} ({}): {}", what, human_bytes(bytes), why));
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

    // Pages come from 1 MiB chunks mapped (and populated) at once. A freed
    // page is kept resident on a free list threaded through the pages
    // themselves (no allocation, no system call) while the list holds fewer
    // than keep_pages(); beyond that it is queued and returned to the
    // kernel in batches (MADV_DONTNEED), and faults back in when reused.
    // Every page counted in resident_pages() is charged to the budget.
    class page_pool {
    public:
        page_pool(int numa_node, memory_budget& budget, uint64_t capacity_bytes)
            : _numa_node(numa_node), _budget(budget), _capacity(capacity_bytes)
        {
        }
        ~page_pool();
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
        static constexpr size_t k_chunk_bytes = size_t{1} << 20;
        // Pages returned per flush at most: 1 MiB, so that a store far
        // beyond its bound pays one madvise (and TLB shootdown) per run of
        // adjacent pages in a MiB, not per 64 pages.
        static constexpr size_t k_batch = 256;
        void queue_locked(void* page);
        void flush_locked();

        int _numa_node;
        memory_budget& _budget;
        uint64_t _capacity;
        mutable std::mutex _lock;
        std::vector<void*> _chunks;
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

    // The leaf entry of page `index`, creating missing nodes if `create`;
    // nullptr if absent (and !create), or when a node cannot be had (then
    // `error` is -ENOSPC or -ENOMEM).
    std::atomic<uintptr_t>* leaf(uint64_t index, bool create, int* error = nullptr) const;
    void lock(uint64_t page_index) const;
    void unlock(uint64_t page_index) const;
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
    mutable std::atomic<uint64_t> _nodes{1};
    std::atomic<uint64_t> _live_pages{0};
    mutable std::atomic<uint64_t> _contended{0};
};

}  // namespace

// ---------------------------------------------------------------- page pool

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

page_store::page_pool::~page_pool()
{
    release_all();
}

uint64_t page_store::page_pool::keep_pages() const
{
    uint64_t keep = std::min(_capacity / 8, k_keep_ceiling);
    if (const uint64_t limit = _budget.smallest_limit(); limit != 0) {
        keep = std::min(keep, limit / 8);
    }
    return keep / k_page_size;
}

void* page_store::page_pool::allocate(int& error)
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

void page_store::page_pool::free(void* page)
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

void page_store::page_pool::flush()
{
    std::lock_guard guard(_lock);
    flush_locked();
}

void page_store::page_pool::trim()
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

void page_store::page_pool::queue_locked(void* page)
{
    _pending[_pending_count++] = page;
    if (_pending_count == k_batch) {
        flush_locked();
    }
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
    _returned_free.insert(_returned_free.end(), _pending, _pending + _pending_count);
    _resident.fetch_sub(_pending_count, std::memory_order_relaxed);
    _returned.fetch_add(_pending_count, std::memory_order_relaxed);
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
    _kept = nullptr;
    _kept_count.store(0, std::memory_order_relaxed);
    _returned_free.clear();
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
      _pool(cfg.numa_node, _budget, _page_count * k_page_size)
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
                void* page = _pool.allocate(error);
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
}

std::unique_ptr<memory_store> memory_store::create(const config& cfg)
{
    return std::make_unique<core::page_store>(
        cfg, cfg.parent != nullptr ? *cfg.parent : process_memory_budget());
}

}  // namespace softblk
