// Write-back cache emulation, null_blk's cache_size (innermost decorator):
//   - writes land in cache pages (4 KiB, a bit per block) and complete at
//     once; when the cache holds cache_size bytes, a batch of the oldest
//     dirty pages (16, null_blk's FREE_BATCH) is written back to the inner
//     target before the write proceeds;
//   - FUA writes (when fua=1) go straight to the inner target and drop
//     those blocks from the cache; discard and write zeroes do the same;
//   - FLUSH writes back every page dirtied before it, then flushes the
//     inner target (a file target's fsync);
//   - power-off (set_power(false)) loses what was not written back.
//
// Write-back works with any inner target: the cache sends its own write
// requests (from a per-queue pool, with their own buffers) to the inner
// queue, whose completion_sink is the cache queue; it tells its requests
// from the consumer's with request_pool::owns(). A page keeps serving reads
// while it is written back, and is freed only when its write-back completed
// and no read that may need it is in flight (such reads are proxied so the
// cache can copy its newer blocks over what the inner target returned).
//
// The cache state is shared by the device's queues under one mutex (null_blk
// holds one device-wide spin lock for the same work).
//
// Its memory is data memory: page buffers, slot arrays and the hash table
// are charged to the process's budget (memory_store.hpp) as they grow, and
// released on power-off and destruction. Its own bound is cache_size; the
// device's memory_limit bounds the store below it, not the cache. When the
// budget refuses the cache more memory, writes go through to the inner
// target (write-through), which then answers for itself (-ENOSPC when the
// budget refuses it too).
//
// The cache proper (pages, lists, hash table, budget) is
// write_cache_state.hpp; here are the queues that drive it and the
// decorator.
#include "common.hpp"
#include "write_cache_state.hpp"

#include <softblk/memory_store.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

namespace softblk::core {

namespace {

using namespace write_cache;

class cache_target;

class cache_queue final : public queue_decorator, public completion_sink {
public:
    cache_queue(target& cache, cache_state& st, completion_sink& sink, unsigned pool_size,
                uint16_t index)
        : _cache(cache), _st(st), _sink(sink), _pool(pool_size, index)
    {
        for (unsigned i = 0; i < _pool.count(); ++i) {
            _pool.at(i).extra.buffer.reset(new char[k_page]);
        }
    }

    void submit(io_request& r) override
    {
        if (!dispatch(r, true)) {
            _blocked.push(r);
        }
    }

    unsigned poll() override
    {
        unsigned n = _inner->busy() ? _inner->poll() : 0;
        if (!_blocked.empty()) {
            request_fifo again = _blocked;
            _blocked = request_fifo{};
            while (io_request* r = again.pop()) {
                if (!dispatch(*r, false)) {
                    _blocked.push(*r);
                }
            }
        }
        return n;
    }

    bool busy() const override { return !_blocked.empty() || _pool.in_use() > 0 || _inner->busy(); }
    uint64_t next_wakeup_ns() const override
    {
        // Blocked requests may wait for another queue's write-back: look
        // again soon.
        const uint64_t inner = _inner->next_wakeup_ns();
        return _blocked.empty() ? inner : std::min(inner, monotonic_ns() + 20'000);
    }

    bool timed_out(io_request& r) override
    {
        if (_blocked.remove(r)) {
            return true;
        }
        // Only read proxies have an original (write-backs' is nullptr).
        return time_out_through(_pool, *_inner, r, [&](entry& e) { finish_read(e); });
    }

    // From the inner queue: our own requests, or consumer requests we
    // passed through.
    void complete(io_request& r, int result) override
    {
        entry* e = route_completion(_pool, _sink, r, result);
        if (e == nullptr) {
            return;
        }
        if (e->extra.kind == internal_kind::writeback) {
            writeback_done(*e, result);
            return;
        }
        io_request* original = e->extra.original;
        if (original != nullptr && result >= 0) {
            std::lock_guard guard(_st.lock);
            overlay(*original);
        }
        finish_read(*e);
        if (original != nullptr) {
            complete_original(_sink, *original, r, result);
        }
    }

private:
    using entry = request_pool<internal_extra>::entry;

    // Starts or finishes `r`; false if it must wait (blocked list).
    bool dispatch(io_request& r, bool first)
    {
        switch (r.op) {
        case io_op::read:
            return do_read(r);
        case io_op::write: {
            const uint64_t pages = (r.offset + r.length - 1) / k_page - r.offset / k_page + 1;
            if ((r.flags & k_io_fua) != 0 || pages > _st.max_pages) {
                return bypass(r);
            }
            return do_write(r);
        }
        case io_op::flush:
            return do_flush(r, first);
        case io_op::discard:
        case io_op::write_zeroes:
            return bypass(r);
        case io_op::report_extents:
            // Cached blocks are data even where the target below has a hole.
            _sink.complete(r, answer_report_extents(_cache, r));
            return true;
        default:
            _inner->submit(r);
            return true;
        }
    }

    bool do_write(io_request& r)
    {
        const uint64_t first = r.offset / k_page;
        const uint64_t last = (r.offset + r.length - 1) / k_page;
        for (int attempt = 0; attempt < 2; ++attempt) {
            request_fifo batch;
            {
                std::lock_guard guard(_st.lock);
                uint64_t need = 0;
                for (uint64_t i = first; i <= last; ++i) {
                    need += _st.find(i) == nullptr ? 1 : 0;
                }
                const reserve_result room = _st.reserve(need);
                if (room == reserve_result::ok) {
                    copy_in(r, first, last);
                    goto done;
                }
                if (room == reserve_result::no_memory) {
                    goto write_through;
                }
                collect_writeback(batch, k_batch, UINT64_MAX);
            }
            submit_batch(batch);
        }
        return false;
    write_through:
        return bypass(r);
    done:
        // Complete outside the lock (the callback may submit).
        _sink.complete(r, static_cast<int>(r.length));
        return true;
    }

    // Under the lock, with room reserved (pages with their buffers).
    void copy_in(io_request& r, uint64_t first, uint64_t last)
    {
        const char* src = static_cast<const char*>(r.buffer);
        uint64_t pos = r.offset;
        const uint64_t end = r.offset + r.length;
        for (uint64_t i = first; i <= last; ++i) {
            cache_page* p = _st.find(i);
            if (p == nullptr) {
                p = _st.free_list.pop_front();
                p->index = i;
                p->valid = 0;
                p->state = k_dirty;
                p->dirty_seq = ++_st.seq;
                p->redirtied = false;
                p->failed = false;
                _st.table_insert(p);
                _st.unflushed.push_back(p);
            } else if (p->state == k_clean) {
                _st.clean.remove(p);
                p->state = k_dirty;
                p->dirty_seq = ++_st.seq;
                _st.unflushed.push_back(p);
            } else if (p->state == k_writeback && !p->redirtied) {
                p->redirtied = true;
                p->redirty_seq = ++_st.seq;
            }
            const uint32_t in_page = static_cast<uint32_t>(pos % k_page);
            const uint32_t n =
                static_cast<uint32_t>(std::min<uint64_t>(end - pos, k_page - in_page));
            std::memcpy(p->data.get() + in_page, src, n);
            p->valid |= _st.mask(in_page, n);
            src += n;
            pos += n;
        }
    }

    // Under the lock: takes up to `max_pages` dirty pages dirtied at or
    // before `seq_limit` (oldest first) and prepares their write-back.
    void collect_writeback(request_fifo& batch, unsigned max_pages, uint64_t seq_limit)
    {
        const unsigned blocks = k_page >> _st.block_shift;
        unsigned taken = 0;
        for (cache_page* p = _st.unflushed.head; p != nullptr && taken < max_pages; p = p->next) {
            if (p->dirty_seq > seq_limit) {
                break;
            }
            if (p->state != k_dirty) {
                continue;
            }
            // One write per run of contiguous blocks.
            unsigned runs = 0;
            for (unsigned b = 0; b < blocks; ++b) {
                if (((p->valid >> b) & 1) && (b == 0 || !((p->valid >> (b - 1)) & 1))) {
                    ++runs;
                }
            }
            if (_pool.available() < runs) {
                break;
            }
            p->state = k_writeback;
            p->parts = static_cast<uint8_t>(runs);
            p->redirtied = false;
            p->failed = false;
            for (unsigned b = 0; b < blocks;) {
                if (!((p->valid >> b) & 1)) {
                    ++b;
                    continue;
                }
                unsigned e = b;
                while (e < blocks && ((p->valid >> e) & 1)) {
                    ++e;
                }
                entry* en = _pool.take();
                const uint32_t off = b << _st.block_shift;
                const uint32_t len = (e - b) << _st.block_shift;
                std::memcpy(en->extra.buffer.get(), p->data.get() + off, len);
                en->extra.kind = internal_kind::writeback;
                en->extra.page = p;
                en->extra.original = nullptr;
                en->extra.power_generation = _st.power_generation;
                io_request& w = en->request;
                w.op = io_op::write;
                w.flags = 0;
                w.offset = p->index * k_page + off;
                w.length = len;
                w.buffer = en->extra.buffer.get();
                w.transferred = 0;
                batch.push(w);
                b = e;
            }
            ++taken;
        }
    }

    void submit_batch(request_fifo& batch)
    {
        while (io_request* w = batch.pop()) {
            _inner->submit(*w);
        }
    }

    void writeback_done(entry& e, int result)
    {
        {
            std::lock_guard guard(_st.lock);
            cache_page* p = e.extra.page;
            if (e.extra.power_generation == _st.power_generation) {
                if (result < 0) {
                    p->failed = true;
                    ++_st.writeback_errors;
                    _st.last_writeback_error = result;
                }
                if (--p->parts == 0) {
                    if (p->failed || p->redirtied) {
                        // Dirty again; a redirtied page takes the place of
                        // its first new write.
                        _st.unflushed.remove(p);
                        if (!p->failed) {
                            p->dirty_seq = p->redirty_seq;
                        }
                        p->state = k_dirty;
                        p->redirtied = false;
                        p->failed = false;
                        _st.unflushed.insert_by_seq(p);
                    } else {
                        _st.unflushed.remove(p);
                        ++_st.written_back_pages;
                        if (_st.covered_by_read(p->index)) {
                            p->state = k_clean;
                            _st.clean.push_back(p);
                        } else {
                            _st.free_page(p);
                        }
                    }
                }
            }
        }
        e.extra.kind = internal_kind::none;
        e.extra.page = nullptr;
        _pool.give_back(e);
    }

    bool do_flush(io_request& r, bool first)
    {
        if (first) {
            std::lock_guard guard(_st.lock);
            r.target_scratch[0] = _st.seq;
            r.target_scratch[1] = _st.writeback_errors;
        }
        for (int attempt = 0; attempt < 2; ++attempt) {
            request_fifo batch;
            {
                std::lock_guard guard(_st.lock);
                if (_st.writeback_errors != r.target_scratch[1]) {
                    const int err = _st.last_writeback_error;
                    _sink.complete(r, err < 0 ? err : -EIO);
                    return true;
                }
                const cache_page* head = _st.unflushed.head;
                if (head == nullptr || head->dirty_seq > r.target_scratch[0]) {
                    goto forward;
                }
                collect_writeback(batch, UINT32_MAX, r.target_scratch[0]);
            }
            submit_batch(batch);
        }
        return false;
    forward:
        // Everything written before the flush is in the inner target: flush
        // it too (a file target's fsync).
        _inner->submit(r);
        return true;
    }

    // FUA writes, discard, write zeroes and writes larger than the cache go
    // to the inner target; the cache forgets those blocks first. A page
    // under write-back holds them up (its older data must not land after).
    bool bypass(io_request& r)
    {
        const uint64_t first = r.offset / k_page;
        const uint64_t last = (r.offset + r.length - 1) / k_page;
        {
            std::lock_guard guard(_st.lock);
            if (_st.used > 0) {
                bool busy = false;
                _st.for_each_in_range(
                    first, last, [&](cache_page* p) { busy = busy || p->state == k_writeback; });
                if (busy) {
                    return false;
                }
                const uint64_t end = r.offset + r.length;
                _st.for_each_in_range(first, last, [&](cache_page* p) {
                    const uint64_t from = std::max(r.offset, p->index * k_page);
                    const uint64_t to = std::min(end, (p->index + 1) * k_page);
                    p->valid &= static_cast<uint8_t>(~_st.mask(static_cast<uint32_t>(from % k_page),
                                                               static_cast<uint32_t>(to - from)));
                    if (p->valid == 0) {
                        (p->state == k_clean ? _st.clean : _st.unflushed).remove(p);
                        _st.free_page(p);
                    }
                });
            }
            ++_st.bypassed;
        }
        _inner->submit(r);
        return true;
    }

    bool do_read(io_request& r)
    {
        const uint64_t first = r.offset / k_page;
        const uint64_t last = (r.offset + r.length - 1) / k_page;
        entry* e = nullptr;
        {
            std::lock_guard guard(_st.lock);
            bool any = false;
            bool all = true;
            if (_st.used > 0) {
                uint64_t pos = r.offset;
                const uint64_t end = r.offset + r.length;
                for (uint64_t i = first; i <= last; ++i) {
                    const uint32_t in_page = static_cast<uint32_t>(pos % k_page);
                    const uint32_t n =
                        static_cast<uint32_t>(std::min<uint64_t>(end - pos, k_page - in_page));
                    const uint8_t m = _st.mask(in_page, n);
                    const cache_page* p = _st.find(i);
                    any = any || p != nullptr;
                    all = all && p != nullptr && (p->valid & m) == m;
                    pos += n;
                }
            }
            if (any && all) {
                overlay(r);
                ++_st.read_hits;
                goto hit;
            }
            if (any) {
                e = _pool.take();
                if (e == nullptr) {
                    return false;
                }
                e->extra.kind = internal_kind::read;
                e->extra.original = &r;
                e->extra.record.first = first;
                e->extra.record.last = last;
                e->extra.record.prev = nullptr;
                e->extra.record.next = _st.reads;
                if (_st.reads != nullptr) {
                    _st.reads->prev = &e->extra.record;
                }
                _st.reads = &e->extra.record;
                e->extra.power_generation = _st.power_generation;
            }
        }
        if (e == nullptr) {
            // Nothing of it is cached: the inner target has the latest data.
            _inner->submit(r);
            return true;
        }
        {
            io_request& p = e->request;
            p.op = io_op::read;
            p.flags = r.flags;
            p.offset = r.offset;
            p.length = r.length;
            p.buffer = r.buffer;
            p.transferred = 0;
            _inner->submit(p);
        }
        return true;
    hit:
        _sink.complete(r, static_cast<int>(r.length));
        return true;
    }

    // Under the lock: copies the cached blocks of `r`'s range into its buffer.
    void overlay(io_request& r)
    {
        char* dst = static_cast<char*>(r.buffer);
        uint64_t pos = r.offset;
        const uint64_t end = r.offset + r.length;
        while (pos < end) {
            const uint32_t in_page = static_cast<uint32_t>(pos % k_page);
            const uint32_t n =
                static_cast<uint32_t>(std::min<uint64_t>(end - pos, k_page - in_page));
            if (const cache_page* p = _st.find(pos / k_page)) {
                for (uint32_t b = in_page; b < in_page + n; b += _st.block_size) {
                    if ((p->valid >> (b >> _st.block_shift)) & 1) {
                        std::memcpy(dst + (pos - r.offset) + (b - in_page), p->data.get() + b,
                                    _st.block_size);
                    }
                }
            }
            pos += n;
        }
    }

    void finish_read(entry& e)
    {
        {
            std::lock_guard guard(_st.lock);
            if (e.extra.power_generation == _st.power_generation) {
                read_record& rec = e.extra.record;
                (rec.prev != nullptr ? rec.prev->next : _st.reads) = rec.next;
                if (rec.next != nullptr) {
                    rec.next->prev = rec.prev;
                }
            }
        }
        e.extra.kind = internal_kind::none;
        e.extra.original = nullptr;
        _pool.give_back(e);
    }

    target& _cache;
    cache_state& _st;
    completion_sink& _sink;
    request_pool<internal_extra> _pool;
    request_fifo _blocked;
};

class cache_target final : public target_decorator {
public:
    cache_target(std::unique_ptr<target> inner, uint64_t cache_bytes, bool fua,
                 const queue_config& queues)
        : target_decorator(std::move(inner)),
          _cache_bytes(cache_bytes),
          _limits(_inner->limits()),
          _state(std::max<uint64_t>(1, std::min(cache_bytes / k_page,
                                                (_limits.capacity_bytes + k_page - 1) / k_page)),
                 _limits.logical_block_size),
          _pool_size(queues.queue_depth + 4 * k_batch)
    {
        _limits.volatile_write_cache = true;
        _limits.fua = fua;
        // The cache copies what is written: it needs the bytes in memory,
        // so it takes no external data (target_decorator's default).
    }

    const block_limits& limits() const override { return _limits; }

    result<std::unique_ptr<target_queue>> open_queue(unsigned index, completion_sink& sink) override
    {
        auto q = std::make_unique<cache_queue>(*this, _state, sink, _pool_size,
                                               static_cast<uint16_t>(index));
        auto inner = _inner->open_queue(index, *q);
        if (!inner) {
            return std::unexpected(inner.error());
        }
        q->set_inner(std::move(*inner));
        return q;
    }

    int map_extents(uint64_t offset, uint64_t length, std::vector<extent>& out) override
    {
        std::vector<extent> mine;
        if (int rc = _inner->map_extents(offset, length, mine); rc < 0) {
            return rc;
        }
        std::vector<std::pair<uint64_t, uint64_t>> cached;
        {
            std::lock_guard guard(_state.lock);
            if (_state.used > 0 && length > 0) {
                const uint64_t end = offset + length;
                _state.for_each_in_range(offset / k_page, (end - 1) / k_page, [&](cache_page* p) {
                    for (uint32_t b = 0; b < k_page; b += _state.block_size) {
                        if ((p->valid >> (b >> _state.block_shift)) & 1) {
                            const uint64_t from = std::max(offset, p->index * k_page + b);
                            const uint64_t to =
                                std::min(end, p->index * k_page + b + _state.block_size);
                            if (from < to) {
                                cached.emplace_back(from, to);
                            }
                        }
                    }
                });
            }
        }
        std::sort(cached.begin(), cached.end());
        std::vector<std::pair<uint64_t, uint64_t>> merged;
        for (const auto& c : cached) {
            if (!merged.empty() && merged.back().second >= c.first) {
                merged.back().second = std::max(merged.back().second, c.second);
            } else {
                merged.push_back(c);
            }
        }
        overlay_allocated(mine, merged);
        out.insert(out.end(), mine.begin(), mine.end());
        return 0;
    }

    void set_power(bool on) override
    {
        if (!on) {
            // The volatile cache loses what was not written back.
            std::lock_guard guard(_state.lock);
            _state.drop_all();
        }
        _inner->set_power(on);
    }

    uint64_t memory_bytes() const override
    {
        std::lock_guard guard(_state.lock);
        return _inner->memory_bytes() + _state.memory_bytes();
    }

    void describe(nlohmann::json& out) const override
    {
        _inner->describe(out);
        std::lock_guard guard(_state.lock);
        out["cache"] = {{"size_bytes", _cache_bytes},
                        {"pages", _state.used},
                        {"max_pages", _state.max_pages},
                        {"unflushed_pages", _state.unflushed.size},
                        {"written_back_pages", _state.written_back_pages},
                        {"read_hits", _state.read_hits},
                        {"bypassed", _state.bypassed},
                        {"writeback_errors", _state.writeback_errors},
                        {"fua", _limits.fua}};
    }

private:
    uint64_t _cache_bytes;
    block_limits _limits;
    mutable cache_state _state;
    unsigned _pool_size;
};

}  // namespace

std::unique_ptr<target> make_write_cache(std::unique_ptr<target> inner, uint64_t cache_bytes,
                                         bool fua, const queue_config& queues)
{
    return std::make_unique<cache_target>(std::move(inner), cache_bytes, fua, queues);
}

}  // namespace softblk::core
