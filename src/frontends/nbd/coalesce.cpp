// Receive coalescing of the NBD server (server_config::coalesce_us): the
// policy that decides whether a pipelining connection's next receive is
// held back. See "Receive coalescing" in docs/nbd.md and loop.hpp.
#include "loop.hpp"

#include <softblk/support/clock.hpp>

namespace softblk::nbd {


namespace {

// Receive coalescing: a connection measures its request rate over epochs
// this long, and keeps its choice for this many epochs.
constexpr uint64_t k_coalesce_epoch_ns = 2'000'000;
constexpr uint8_t k_coalesce_exploit_epochs = 16;
// An epoch with fewer requests than this ends coalescing: the client has
// (nearly) stopped.
constexpr uint64_t k_coalesce_idle_requests = 4;

}  // namespace

bool event_loop::coalesce_receive(connection& c)
{
    if (_coalesce_ns == 0 || c.ph != phase::transmission || c.recv_posted || c.recv_deferred ||
        c.read_eof || c.closing) {
        return false;
    }
    if (c.payload_left > 0) {
        return false;  // the rest of a write payload is on its way: take it
    }
    // Requests parsed since the last call (pump_input also runs when
    // input unblocks, without a receive).
    const uint64_t got = c.parsed - c.parsed_before;
    c.parsed_before = c.parsed;
    const uint64_t now = monotonic_ns();
    if (c.coalesce == coalesce_phase::off) {
        if (got < 2) {
            return false;  // one request at a time: nothing to gather
        }
        c.coalesce = coalesce_phase::measure_plain;
        c.epoch_start_ns = now;
        c.epoch_requests = 0;
        return false;
    }
    c.epoch_requests += got;
    if (now - c.epoch_start_ns >= k_coalesce_epoch_ns) {
        const uint64_t rate = c.epoch_requests * 1'000'000'000u / (now - c.epoch_start_ns);
        switch (c.coalesce) {
        case coalesce_phase::measure_plain:
            c.rate_plain = rate;
            c.coalesce = coalesce_phase::measure_held;
            break;
        case coalesce_phase::measure_held:
            // Holding back saves wake-ups (CPU); keep it unless it costs
            // more than 2% of the requests.
            c.coalesce_wins = rate * 100 >= c.rate_plain * 98;
            c.coalesce = coalesce_phase::exploit;
            c.exploit_left = k_coalesce_exploit_epochs;
            break;
        case coalesce_phase::exploit:
        case coalesce_phase::off:
            if (--c.exploit_left == 0) {
                // Measure again, or stop if the client no longer pipelines.
                c.coalesce = c.epoch_requests < k_coalesce_idle_requests
                                 ? coalesce_phase::off
                                 : coalesce_phase::measure_plain;
            }
            break;
        }
        c.epoch_start_ns = now;
        c.epoch_requests = 0;
    }
    const bool hold = c.coalesce == coalesce_phase::measure_held ||
                      (c.coalesce == coalesce_phase::exploit && c.coalesce_wins);
    if (!hold) {
        return false;
    }
    c.recv_deferred = true;
    c.recv_at_ns = now + _coalesce_ns;
    _deferred.push_back(&c);
    return true;
}

}  // namespace softblk::nbd
