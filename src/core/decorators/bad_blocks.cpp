// Bad blocks, null_blk's badblocks / badblocks_once / badblocks_partial_io
// (null_handle_badblocks). A request (read, write, discard, write zeroes,
// zone append) that touches a bad sector fails with -EIO:
//   badblocks_once        the bad record met is cleared, so the next try
//                         succeeds;
//   badblocks_partial_io  the blocks before the first bad one are
//                         transferred first (an internal request to the
//                         inner target), then the request fails with -EIO
//                         and io_request::transferred says how many bytes
//                         were done.
// A zoned target checks its own writes and zone appends (take_media_errors):
// null_blk applies bad blocks there after the zone checks, at the sector a
// zone append really writes, and advances the write pointer over a partial
// write; the decorator then handles the other operations only.
#include "common.hpp"

#include <softblk/external_data.hpp>

#include <cerrno>
#include <nlohmann/json.hpp>

namespace softblk::core {

namespace {

// Merged ranges describe() lists (the rest is counted in "ranges").
constexpr size_t k_described_ranges = 64;

struct partial_extra {
    io_request* original = nullptr;
    // The original's external data (its first bytes are the prefix's), a
    // kernel buffer without the front end's completion: the shortened write
    // does not end the request (it fails with -EIO).
    external_data data;
};

bool checked_op(io_op op)
{
    switch (op) {
    case io_op::read:
    case io_op::write:
    case io_op::discard:
    case io_op::write_zeroes:
    case io_op::zone_append:
        return true;
    default:
        return false;
    }
}

class bad_blocks_target;

class bad_blocks_queue final : public queue_decorator, public completion_sink {
public:
    bad_blocks_queue(bad_blocks_target& t, completion_sink& sink, unsigned pool_size,
                     uint16_t index)
        : _target(t), _sink(sink), _pool(pool_size, index)
    {
    }

    void submit(io_request& r) override;
    void start_partial(io_request& r, uint32_t bytes);

    unsigned poll() override
    {
        unsigned n = 0;
        if (!_waiting.empty()) {
            request_fifo again = _waiting;
            _waiting = request_fifo{};
            while (io_request* r = again.pop()) {
                start_partial(*r, static_cast<uint32_t>(r->target_scratch[0]));
            }
        }
        if (_inner->busy()) {
            n += _inner->poll();
        }
        return n;
    }
    bool busy() const override { return !_waiting.empty() || _inner->busy(); }
    // A request it lets through completes as the target ends it; a
    // shortened one carries no completion of the front end (start_partial).
    bool keeps_ring_write_results() const override { return true; }
    uint64_t next_wakeup_ns() const override
    {
        // Waiting for a pool entry: one frees when the inner target
        // completes, which its own wake-up covers; look again soon anyway.
        return _waiting.empty() ? _inner->next_wakeup_ns()
                                : std::min(_inner->next_wakeup_ns(), monotonic_ns() + 50'000);
    }

    bool timed_out(io_request& r) override
    {
        if (_waiting.remove(r)) {
            return true;
        }
        return time_out_through(_pool, *_inner, r, [&](auto& e) {
            e.extra.original = nullptr;
            _pool.give_back(e);
        });
    }

    // From the inner queue.
    void complete(io_request& r, int result) override
    {
        auto* e = route_completion(_pool, _sink, r, result);
        if (e == nullptr) {
            return;
        }
        io_request* original = e->extra.original;
        e->extra.original = nullptr;
        _pool.give_back(*e);
        if (original == nullptr) {
            return;  // timed out meanwhile
        }
        // The blocks before the bad one are done; the request still fails.
        original->transferred = result >= 0 ? r.length : 0;
        complete_original(_sink, *original, r, -EIO);
    }

private:
    bad_blocks_target& _target;
    completion_sink& _sink;
    request_pool<partial_extra> _pool;
    request_fifo _waiting;  // partial I/O waiting for a pool entry
};

class bad_blocks_target final : public target_decorator, public media_errors {
public:
    bad_blocks_target(std::unique_ptr<target> inner, std::shared_ptr<bad_block_table> table,
                      bool once, bool partial_io, unsigned pool_size)
        : target_decorator(std::move(inner)),
          _table(std::move(table)),
          _once(once),
          _partial_io(partial_io),
          _pool_size(pool_size)
    {
        _target_checks_writes = _inner->take_media_errors(this);
    }

    // Its own requests (partial I/O) carry a copy of the consumer's
    // external data; the others go on as they are.
    external_data_support takes_external_data() const override
    {
        return _inner->takes_external_data();
    }

    // The target's own check of a write (media_errors).
    int64_t check_write(uint64_t offset, uint32_t length) override
    {
        return check_range(offset, length);
    }

    result<std::unique_ptr<target_queue>> open_queue(unsigned index, completion_sink& sink) override
    {
        auto q = std::make_unique<bad_blocks_queue>(*this, sink, _partial_io ? _pool_size : 0,
                                                    static_cast<uint16_t>(index));
        // With partial I/O the inner queue completes to us, so that we can
        // fail the shortened request; otherwise straight to the core.
        auto inner =
            _inner->open_queue(index, _partial_io ? static_cast<completion_sink&>(*q) : sink);
        if (!inner) {
            return std::unexpected(inner.error());
        }
        q->set_inner(std::move(*inner));
        return q;
    }

    void describe(nlohmann::json& out) const override
    {
        _inner->describe(out);
        // The first ranges only: a list grown by many writes must not make
        // `softblk list` large; "ranges" says how many there are.
        out["badblocks"] = {{"list", _table->list(k_described_ranges)},
                            {"ranges", _table->ranges()},
                            {"once", _once},
                            {"partial_io", _partial_io},
                            {"writes_checked_by_target", _target_checks_writes},
                            {"failed", _failed.load(std::memory_order_relaxed)}};
    }

    // The number of bytes to transfer before failing, or -1 if `r` touches
    // no bad block.
    int64_t check(const io_request& r)
    {
        if (!checked_op(r.op) ||
            (_target_checks_writes && (r.op == io_op::write || r.op == io_op::zone_append))) {
            return -1;
        }
        return check_range(r.offset, r.length);
    }

private:
    int64_t check_range(uint64_t offset, uint32_t length)
    {
        if (_table->empty()) {
            return -1;
        }
        const uint64_t sector = offset >> 9;
        uint64_t first_bad = 0;
        uint64_t bad_count = 0;
        if (!_table->check(sector, length >> 9, first_bad, bad_count)) {
            return -1;
        }
        _failed.fetch_add(1, std::memory_order_relaxed);
        if (_once) {
            _table->clear(first_bad, bad_count);
        }
        if (!_partial_io) {
            return 0;
        }
        const uint64_t block_sectors = limits().logical_block_size >> 9;
        first_bad -= first_bad % block_sectors;
        return sector < first_bad ? static_cast<int64_t>((first_bad - sector) << 9) : 0;
    }

    std::shared_ptr<bad_block_table> _table;
    bool _once;
    bool _partial_io;
    bool _target_checks_writes = false;
    unsigned _pool_size;
    std::atomic<uint64_t> _failed{0};
};

void bad_blocks_queue::submit(io_request& r)
{
    const int64_t partial = _target.check(r);
    if (partial < 0) {
        _inner->submit(r);
        return;
    }
    if (partial == 0) {
        r.transferred = 0;
        _sink.complete(r, -EIO);
        return;
    }
    start_partial(r, static_cast<uint32_t>(partial));
}

void bad_blocks_queue::start_partial(io_request& r, uint32_t bytes)
{
    auto* e = _pool.take();
    if (e == nullptr) {
        // Cannot happen with one entry per tag; keep the request (and the
        // length decided, in its scratch space while we hold it).
        r.target_scratch[0] = bytes;
        _waiting.push(r);
        return;
    }
    io_request& p = e->request;
    p.op = r.op;
    p.flags = r.flags;
    p.offset = r.offset;
    p.length = bytes;
    p.buffer = r.buffer;
    p.external = nullptr;
    if (r.external != nullptr) {
        e->extra.data = *r.external;
        e->extra.data.kernel.prep_completion = nullptr;
        p.external = &e->extra.data;
    }
    p.transferred = 0;
    p.result_offset = 0;
    e->extra.original = &r;
    _inner->submit(p);
}

}  // namespace

std::unique_ptr<target> make_bad_blocks(std::unique_ptr<target> inner,
                                        std::shared_ptr<bad_block_table> table, bool once,
                                        bool partial_io, const queue_config& queues)
{
    return std::make_unique<bad_blocks_target>(std::move(inner), std::move(table), once, partial_io,
                                               queues.queue_depth);
}

}  // namespace softblk::core
