// Receive coalescing of the NBD server (server_config::coalesce_us): the
// loop's side of it. The policy (coalesce.hpp) decides whether, and for
// how long, a pipelining connection's next receive is held back; this
// puts the connection on the loop's deferred list. See "Receive
// coalescing" in docs/nbd.md and loop.hpp.
#include "loop.hpp"

#include <softblk/support/clock.hpp>

namespace softblk::nbd {

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
    const uint64_t hold = c.coalesce.next_hold(got, now);
    if (hold == 0) {
        return false;
    }
    c.recv_deferred = true;
    c.recv_at_ns = now + hold;
    _deferred.push_back(&c);
    return true;
}

}  // namespace softblk::nbd
