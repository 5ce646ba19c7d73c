// Bandwidth throttle, null_blk's mbps: a byte bucket shared by every queue
// of the device, worth one tick (20 ms, null_blk's TICKS_PER_SEC = 50) of
// the rate, refilled each tick.
//
// Every request counts its length, as null_blk's blk_rq_bytes(): reads,
// writes, zone appends, discards and write zeroes (flush and zone
// management move nothing). One difference from null_blk, documented in
// docs/null.md: a request is admitted while the bucket is positive and may
// take it below zero (the debt is repaid by the next ticks); null_blk
// refuses a request larger than the bucket, so with a small mbps and large
// requests its queue never moves again.
// A request that must wait stays in its queue (FIFO, so order is kept) and
// poll() admits it when the bucket refills; next_wakeup_ns() says when.
#include "common.hpp"

#include <softblk/external_data.hpp>

#include <nlohmann/json.hpp>

namespace softblk::core {

namespace {

constexpr uint64_t k_tick_ns = 20'000'000;  // null_blk's TIMER_INTERVAL

class bandwidth_bucket {
public:
    explicit bandwidth_bucket(uint64_t mbps)
        : _per_tick(static_cast<int64_t>((uint64_t{1} << 20) / 50 * mbps)),
          _tokens(_per_tick),
          _tick_start(monotonic_ns())
    {
    }

    // True if `bytes` may go now (and takes them). Any thread.
    bool take(uint64_t bytes, uint64_t now)
    {
        refill(now);
        int64_t t = _tokens.load(std::memory_order_relaxed);
        while (t > 0) {
            if (_tokens.compare_exchange_weak(t, t - static_cast<int64_t>(bytes),
                                              std::memory_order_relaxed)) {
                _admitted.fetch_add(bytes, std::memory_order_relaxed);
                return true;
            }
        }
        return false;
    }

    uint64_t next_refill_ns() const
    {
        return _tick_start.load(std::memory_order_relaxed) + k_tick_ns;
    }
    uint64_t admitted_bytes() const { return _admitted.load(std::memory_order_relaxed); }
    int64_t per_tick() const { return _per_tick; }

private:
    void refill(uint64_t now)
    {
        uint64_t start = _tick_start.load(std::memory_order_relaxed);
        if (now < start + k_tick_ns) {
            return;
        }
        const uint64_t ticks = (now - start) / k_tick_ns;
        if (!_tick_start.compare_exchange_strong(start, start + ticks * k_tick_ns,
                                                 std::memory_order_relaxed)) {
            return;  // another queue refilled
        }
        // Add what the elapsed ticks bring, capped at one tick's worth (the
        // bucket does not save up while idle).
        const int64_t add = static_cast<int64_t>(std::min<uint64_t>(ticks, 1u << 20)) * _per_tick;
        int64_t t = _tokens.load(std::memory_order_relaxed);
        for (;;) {
            const int64_t next = std::min(t + add, _per_tick);
            if (_tokens.compare_exchange_weak(t, next, std::memory_order_relaxed)) {
                break;
            }
        }
    }

    const int64_t _per_tick;
    alignas(64) std::atomic<int64_t> _tokens;
    std::atomic<uint64_t> _tick_start;
    std::atomic<uint64_t> _admitted{0};
};

// blk_rq_bytes(): what the request covers.
inline uint64_t data_bytes(const io_request& r)
{
    switch (r.op) {
    case io_op::read:
    case io_op::write:
    case io_op::zone_append:
    case io_op::discard:
    case io_op::write_zeroes:
        return r.length;
    default:
        return 0;
    }
}

class throttle_queue final : public queue_decorator {
public:
    throttle_queue(bandwidth_bucket& bucket, std::unique_ptr<target_queue> inner)
        : queue_decorator(std::move(inner)), _bucket(bucket)
    {
    }

    void submit(io_request& r) override
    {
        const uint64_t bytes = data_bytes(r);
        if (bytes == 0) {
            _inner->submit(r);
            return;
        }
        if (!_waiting.empty() || !_bucket.take(bytes, monotonic_ns())) {
            _waiting.push(r);
            return;
        }
        _inner->submit(r);
    }

    unsigned poll() override
    {
        if (!_waiting.empty()) {
            const uint64_t now = monotonic_ns();
            while (!_waiting.empty() && _bucket.take(data_bytes(*_waiting.front()), now)) {
                _inner->submit(*_waiting.pop());
            }
        }
        return _inner->busy() ? _inner->poll() : 0;
    }

    bool busy() const override { return !_waiting.empty() || _inner->busy(); }
    // Held requests wait before the target writes; results are its own.
    bool keeps_ring_write_results() const override { return true; }
    uint64_t next_wakeup_ns() const override
    {
        const uint64_t inner = _inner->next_wakeup_ns();
        return _waiting.empty() ? inner : std::min(inner, _bucket.next_refill_ns());
    }
    bool timed_out(io_request& r) override { return _waiting.remove(r) || _inner->timed_out(r); }

private:
    bandwidth_bucket& _bucket;
    request_fifo _waiting;
};

class throttle_target final : public target_decorator {
public:
    throttle_target(std::unique_ptr<target> inner, uint64_t mbps)
        : target_decorator(std::move(inner)), _mbps(mbps), _bucket(mbps)
    {
    }

    // Passes the consumer's requests on as they are: their data wherever it is.
    external_data_support takes_external_data() const override
    {
        return _inner->takes_external_data();
    }

    result<std::unique_ptr<target_queue>> open_queue(unsigned index, completion_sink& sink) override
    {
        auto inner = _inner->open_queue(index, sink);
        if (!inner) {
            return std::unexpected(inner.error());
        }
        return std::make_unique<throttle_queue>(_bucket, std::move(*inner));
    }

    void describe(nlohmann::json& out) const override
    {
        _inner->describe(out);
        out["throttle"] = {{"mbps", _mbps},
                           {"bytes_per_tick", _bucket.per_tick()},
                           {"admitted_bytes", _bucket.admitted_bytes()}};
    }

private:
    uint64_t _mbps;
    bandwidth_bucket _bucket;
};

}  // namespace

std::unique_ptr<target> make_throttle(std::unique_ptr<target> inner, uint64_t mbps)
{
    return std::make_unique<throttle_target>(std::move(inner), mbps);
}

}  // namespace softblk::core
