#include "memory_store.hpp"

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <cstring>
#include <new>
#include <sched.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <softblk/support/cpu_relax.hpp>

namespace softblk::core {

namespace {

constexpr unsigned k_mpol_preferred = 1;  // <linux/mempolicy.h> MPOL_PREFERRED

}  // namespace

// ---------------------------------------------------------------- page pool

memory_store::page_pool::~page_pool()
{
    release_all();
}

void* memory_store::page_pool::allocate()
{
    std::lock_guard guard(_lock);
    if (!_free.empty()) {
        void* p = _free.back();
        _free.pop_back();
        // Released pages fault back in (zeroed) on first touch.
        _resident.fetch_add(1, std::memory_order_relaxed);
        return p;
    }
    if (_pending_count > 0) {
        // Not released yet: hand it straight back out, still resident.
        return _pending[--_pending_count];
    }
    if (_bump == _bump_end) {
        void* chunk = mmap(nullptr, k_chunk_bytes, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (chunk == MAP_FAILED) {
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

void memory_store::page_pool::free(void* page)
{
    std::lock_guard guard(_lock);
    _pending[_pending_count++] = page;
    if (_pending_count == k_batch) {
        flush_locked();
    }
}

void memory_store::page_pool::flush()
{
    std::lock_guard guard(_lock);
    flush_locked();
}

void memory_store::page_pool::flush_locked()
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
    _pending_count = 0;
}

void memory_store::page_pool::release_all()
{
    std::lock_guard guard(_lock);
    for (void* c : _chunks) {
        munmap(c, k_chunk_bytes);
    }
    _chunks.clear();
    _free.clear();
    _pending_count = 0;
    _bump = _bump_end = nullptr;
    _resident.store(0, std::memory_order_relaxed);
}

// ---------------------------------------------------------------- store

memory_store::memory_store(uint64_t capacity_bytes, uint32_t block_size, int numa_node)
    : _capacity(capacity_bytes),
      _page_count((capacity_bytes + k_page_size - 1) / k_page_size),
      _block_size(block_size),
      _block_shift(static_cast<unsigned>(__builtin_ctz(block_size))),
      _stripes(new stripe[k_stripes]),
      _pool(numa_node)
{
    assert(block_size >= 512 && block_size <= k_page_size && (block_size & (block_size - 1)) == 0);
    unsigned bits = 0;
    while (bits < 64 && (uint64_t{1} << bits) < _page_count) {
        ++bits;
    }
    _levels = std::max(1u, (bits + k_fanout_bits - 1) / k_fanout_bits);
    _root = new node();
}

memory_store::~memory_store()
{
    free_subtree(_root, 0);
    _pool.release_all();
}

void memory_store::free_subtree(node* n, unsigned level)
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

std::atomic<uintptr_t>* memory_store::leaf(uint64_t index, bool create) const
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
            node* fresh = new (std::nothrow) node();
            if (fresh == nullptr) {
                return nullptr;
            }
            uintptr_t expected = 0;
            if (s.compare_exchange_strong(expected, reinterpret_cast<uintptr_t>(fresh),
                                          std::memory_order_acq_rel, std::memory_order_acquire)) {
                _nodes.fetch_add(1, std::memory_order_relaxed);
                v = reinterpret_cast<uintptr_t>(fresh);
            } else {
                delete fresh;  // another queue installed it first
                v = expected;
            }
        }
        n = reinterpret_cast<node*>(v);
    }
    return &n->slot[index & (k_fanout - 1)];
}

void memory_store::lock(uint64_t page_index) const
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

void memory_store::unlock(uint64_t page_index) const
{
    _stripes[page_index % k_stripes].locked.store(0, std::memory_order_release);
}

uintptr_t memory_store::block_mask(uint32_t in_page_offset, uint32_t length) const
{
    const unsigned first = in_page_offset >> _block_shift;
    const unsigned count = length >> _block_shift;
    return ((uintptr_t{1} << count) - 1) << first;
}

void memory_store::read(uint64_t offset, void* out, uint64_t length) const
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

int memory_store::write(uint64_t offset, const void* data, uint64_t length)
{
    const auto* src = static_cast<const char*>(data);
    while (length > 0) {
        const uint64_t index = offset / k_page_size;
        const uint32_t in_page = static_cast<uint32_t>(offset % k_page_size);
        const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(length, k_page_size - in_page));
        std::atomic<uintptr_t>* e = leaf(index, true);
        if (e == nullptr) {
            return -ENOMEM;
        }
        lock(index);
        uintptr_t v = e->load(std::memory_order_relaxed);
        if (v == 0) {
            void* page = _pool.allocate();
            if (page == nullptr) {
                unlock(index);
                return -ENOMEM;
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

void memory_store::discard(uint64_t offset, uint64_t length)
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

int memory_store::write_zeroes(uint64_t offset, uint64_t length, bool keep_allocated)
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

void memory_store::map_extents(uint64_t offset, uint64_t length, std::vector<extent>& out) const
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

void memory_store::clear()
{
    for (auto& s : _root->slot) {
        if (uintptr_t v = s.exchange(0, std::memory_order_relaxed)) {
            if (_levels > 1) {
                free_subtree(reinterpret_cast<node*>(v), 1);
            }
        }
    }
    _nodes.store(1, std::memory_order_relaxed);
    _live_pages.store(0, std::memory_order_relaxed);
    _pool.release_all();
}

uint64_t memory_store::memory_bytes() const
{
    return _pool.resident_pages() * uint64_t{k_page_size} +
           _nodes.load(std::memory_order_relaxed) * sizeof(node) + k_stripes * sizeof(stripe) +
           sizeof(*this);
}

}  // namespace softblk::core
