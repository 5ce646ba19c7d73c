// Private to the write-back cache (write_cache.cpp): the cache proper,
// shared by the device's queues under one mutex: its pages (4 KiB, a bit
// per block), the lists that order them (dirty by age, clean, free), the
// reads proxied through it, the hash table, and what it charges to the
// memory budget. The queues that drive it, the write-back requests and the
// decorator itself are in write_cache.cpp.
#pragma once

#include "common.hpp"

#include <softblk/memory_store.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

namespace softblk::core::write_cache {

constexpr uint32_t k_page = 4096;
constexpr unsigned k_batch = 16;         // null_blk's FREE_BATCH
constexpr unsigned k_slot_chunk = 1024;  // cache pages allocated at a time

enum page_state : uint8_t { k_free = 0, k_dirty, k_writeback, k_clean };

struct cache_page {
    uint64_t index = 0;
    std::unique_ptr<char[]> data;
    uint64_t dirty_seq = 0;    // when it became dirty: its place in `unflushed`
    uint64_t redirty_seq = 0;  // first write during its write-back
    cache_page* prev = nullptr;
    cache_page* next = nullptr;
    uint32_t slot = 0;
    uint8_t valid = 0;  // blocks held
    uint8_t state = k_free;
    uint8_t parts = 0;  // write-back requests in flight
    bool redirtied = false;
    bool failed = false;
};

struct page_list {
    cache_page* head = nullptr;
    cache_page* tail = nullptr;
    uint64_t size = 0;

    void push_back(cache_page* p)
    {
        p->next = nullptr;
        p->prev = tail;
        (tail != nullptr ? tail->next : head) = p;
        tail = p;
        ++size;
    }
    void remove(cache_page* p)
    {
        (p->prev != nullptr ? p->prev->next : head) = p->next;
        (p->next != nullptr ? p->next->prev : tail) = p->prev;
        p->prev = p->next = nullptr;
        --size;
    }
    cache_page* pop_front()
    {
        cache_page* p = head;
        if (p != nullptr) {
            remove(p);
        }
        return p;
    }
    // Keeps the list ordered by dirty_seq (insertions are nearly always at
    // the tail).
    void insert_by_seq(cache_page* p)
    {
        cache_page* after = tail;
        while (after != nullptr && after->dirty_seq > p->dirty_seq) {
            after = after->prev;
        }
        p->prev = after;
        p->next = after != nullptr ? after->next : head;
        (p->next != nullptr ? p->next->prev : tail) = p;
        (after != nullptr ? after->next : head) = p;
        ++size;
    }
};

// A read proxied through the cache: the pages it covers are not freed
// until it completes.
struct read_record {
    uint64_t first = 0;
    uint64_t last = 0;
    read_record* prev = nullptr;
    read_record* next = nullptr;
};

enum class internal_kind : uint8_t { none, writeback, read };

struct internal_extra {
    internal_kind kind = internal_kind::none;
    io_request* original = nullptr;
    cache_page* page = nullptr;
    uint64_t power_generation = 0;
    read_record record;
    std::unique_ptr<char[]> buffer;  // write-back data (4 KiB)
};

// Why reserve() could not make room.
enum class reserve_result : uint8_t { ok, full, no_memory };

// The cache proper, shared by the queues. Every member is guarded by lock.
class cache_state {
public:
    cache_state(uint64_t page_limit, uint32_t block_bytes)
        : max_pages(page_limit),
          block_shift(static_cast<unsigned>(__builtin_ctz(block_bytes))),
          block_size(block_bytes)
    {
        table.assign(1024, 0);
        budget.charge(table.size() * sizeof(uint32_t));
    }
    ~cache_state()
    {
        drop_all();
        budget.release(table.size() * sizeof(uint32_t));
    }

    std::mutex lock;

    memory_budget& budget = process_memory_budget();
    const uint64_t max_pages;
    const unsigned block_shift;
    const uint32_t block_size;

    std::vector<std::unique_ptr<cache_page[]>> chunks;
    uint64_t allocated_slots = 0;
    uint64_t used = 0;
    uint64_t data_buffers = 0;
    std::vector<uint32_t> table;  // open addressing: slot + 1, 0 empty
    page_list free_list;
    page_list unflushed;  // dirty and write-back pages, by dirty_seq
    page_list clean;      // written back, kept for an in-flight read
    read_record* reads = nullptr;
    uint64_t seq = 0;
    uint64_t power_generation = 0;
    uint64_t writeback_errors = 0;
    int last_writeback_error = 0;

    // Counters for describe().
    uint64_t written_back_pages = 0;
    uint64_t read_hits = 0;
    uint64_t bypassed = 0;

    cache_page& slot(uint32_t s) { return chunks[s / k_slot_chunk][s % k_slot_chunk]; }

    uint8_t mask(uint32_t in_page, uint32_t length) const
    {
        const unsigned first = in_page >> block_shift;
        const unsigned count = length >> block_shift;
        return static_cast<uint8_t>(((1u << count) - 1) << first);
    }

    static uint64_t hash(uint64_t index) { return index * 0x9E3779B97F4A7C15ull; }

    cache_page* find(uint64_t index)
    {
        const uint64_t m = table.size() - 1;
        for (uint64_t i = hash(index) & m;; i = (i + 1) & m) {
            const uint32_t v = table[i];
            if (v == 0) {
                return nullptr;
            }
            cache_page& p = slot(v - 1);
            if (p.index == index) {
                return &p;
            }
        }
    }

    void table_insert(cache_page* p)
    {
        if ((used + 1) * 2 > table.size()) {
            // Bounded by cache_size: charged without a check.
            budget.charge(table.size() * sizeof(uint32_t));
            std::vector<uint32_t> old(table.size() * 2, 0);
            old.swap(table);
            for (uint32_t v : old) {
                if (v != 0) {
                    place(v);
                }
            }
        }
        place(p->slot + 1);
        ++used;
    }

    void place(uint32_t v)
    {
        const uint64_t m = table.size() - 1;
        uint64_t i = hash(slot(v - 1).index) & m;
        while (table[i] != 0) {
            i = (i + 1) & m;
        }
        table[i] = v;
    }

    void table_erase(cache_page* p)
    {
        const uint64_t m = table.size() - 1;
        uint64_t i = hash(p->index) & m;
        while (table[i] != p->slot + 1) {
            i = (i + 1) & m;
        }
        // Backward-shift deletion (linear probing).
        uint64_t j = i;
        for (;;) {
            table[i] = 0;
            for (;;) {
                j = (j + 1) & m;
                if (table[j] == 0) {
                    --used;
                    return;
                }
                const uint64_t home = hash(slot(table[j] - 1).index) & m;
                const bool movable = i <= j ? (home <= i || home > j) : (home <= i && home > j);
                if (movable) {
                    break;
                }
            }
            table[i] = table[j];
            i = j;
        }
    }

    bool covered_by_read(uint64_t index) const
    {
        for (const read_record* r = reads; r != nullptr; r = r->next) {
            if (index >= r->first && index <= r->last) {
                return true;
            }
        }
        return false;
    }

    void free_page(cache_page* p)
    {
        table_erase(p);
        p->state = k_free;
        p->valid = 0;
        free_list.push_back(p);
    }

    static constexpr uint64_t k_chunk_bytes = k_slot_chunk * sizeof(cache_page);

    // One more free slot: a new one while the cache is below its size and
    // the budget allows, else a clean page no in-flight read depends on.
    reserve_result grow_or_reclaim()
    {
        bool refused = false;
        if (allocated_slots < max_pages) {
            std::unique_ptr<cache_page[]> chunk;
            if (budget.try_charge(k_chunk_bytes)) {
                chunk.reset(new (std::nothrow) cache_page[k_slot_chunk]);
                if (!chunk) {
                    budget.release(k_chunk_bytes);
                }
            }
            if (chunk) {
                const uint64_t n = std::min<uint64_t>(k_slot_chunk, max_pages - allocated_slots);
                for (uint64_t i = 0; i < n; ++i) {
                    chunk[i].slot = static_cast<uint32_t>(allocated_slots + i);
                    free_list.push_back(&chunk[i]);
                }
                chunks.push_back(std::move(chunk));
                allocated_slots += n;
                return reserve_result::ok;
            }
            refused = true;
        }
        for (cache_page* c = clean.head; c != nullptr; c = c->next) {
            if (!covered_by_read(c->index)) {
                clean.remove(c);
                free_page(c);
                return reserve_result::ok;
            }
        }
        return refused ? reserve_result::no_memory : reserve_result::full;
    }

    // Room for `need` new pages at the head of the free list, each with its
    // data buffer: `full` when write-back must make room first, `no_memory`
    // when the budget (or the system) refuses the cache more memory.
    reserve_result reserve(uint64_t need)
    {
        while (free_list.size < need) {
            if (const reserve_result r = grow_or_reclaim(); r != reserve_result::ok) {
                return r;
            }
        }
        cache_page* p = free_list.head;
        for (uint64_t i = 0; i < need; ++i, p = p->next) {
            if (p->data) {
                continue;
            }
            if (!budget.try_charge(k_page)) {
                return reserve_result::no_memory;
            }
            p->data.reset(new (std::nothrow) char[k_page]);
            if (!p->data) {
                budget.release(k_page);
                return reserve_result::no_memory;
            }
            ++data_buffers;
        }
        return reserve_result::ok;
    }

    // Visits the cached pages of [first, last].
    template <class Fn>
    void for_each_in_range(uint64_t first, uint64_t last, Fn&& fn)
    {
        if (last - first < used * 2) {
            for (uint64_t i = first;; ++i) {
                if (cache_page* p = find(i)) {
                    fn(p);
                }
                if (i == last) {
                    break;
                }
            }
            return;
        }
        for (auto& chunk : chunks) {
            for (unsigned i = 0; i < k_slot_chunk; ++i) {
                cache_page& p = chunk[i];
                if (p.state != k_free && p.index >= first && p.index <= last &&
                    p.slot < allocated_slots) {
                    fn(&p);
                }
            }
        }
    }

    void drop_all()
    {
        budget.release(data_buffers * k_page + chunks.size() * k_chunk_bytes);
        chunks.clear();
        allocated_slots = 0;
        used = 0;
        data_buffers = 0;
        std::fill(table.begin(), table.end(), 0);
        free_list = page_list{};
        unflushed = page_list{};
        clean = page_list{};
        reads = nullptr;
        ++power_generation;
    }

    // What the cache has charged to the budget.
    uint64_t memory_bytes() const
    {
        return data_buffers * k_page + chunks.size() * k_chunk_bytes +
               table.size() * sizeof(uint32_t);
    }
};

}  // namespace softblk::core::write_cache
