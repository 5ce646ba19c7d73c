// The receive-coalescing policy (coalesce.hpp): which window, if any, a
// pipelining connection holds its receives back for.
//
// Holding a receive back saves wake-ups and system calls, and lets one
// sendmsg carry several replies, but a client that waits for its replies
// may then idle. How long helps depends on the client and the machine: on
// a quiet 2-CPU VM with fio at queue depth 32, 10-20 us raised the request
// rate by a fifth and 50 us lowered it. So the connection measures: an
// epoch without holding gives the reference rate, then an epoch holding
// for the window; a window that keeps at least 98% of the rate is kept for
// k_exploit_epochs, one that does not is halved and measured again, down
// to k_min_window_ns. After a win the next measurement tries twice the
// window (at most coalesce-us), so that the window follows the client
// both ways.
#include "coalesce.hpp"

#include <algorithm>

namespace softblk::nbd {

uint64_t coalesce_policy::next_hold(uint64_t got, uint64_t now)
{
    if (_max == 0) {
        return 0;
    }
    if (_phase == phase::off) {
        if (got < 2) {
            return 0;  // one request at a time: nothing to gather
        }
        _phase = phase::measure_plain;
        _epoch_start = now;
        _epoch_requests = 0;
        return 0;
    }
    _epoch_requests += got;
    if (now - _epoch_start >= k_epoch_ns) {
        end_epoch(now);
    }
    if (_phase == phase::measure_held || (_phase == phase::exploit && _wins)) {
        return _window;
    }
    return 0;
}

void coalesce_policy::end_epoch(uint64_t now)
{
    const uint64_t rate = _epoch_requests * 1'000'000'000u / (now - _epoch_start);
    switch (_phase) {
    case phase::measure_plain:
        _rate_plain = rate;
        _phase = phase::measure_held;
        break;
    case phase::measure_held:
        // Holding back saves CPU; keep it unless it costs more than 2% of
        // the requests.
        if (rate * 100 >= _rate_plain * 98) {
            _wins = true;
            _won = _window;
            _phase = phase::exploit;
            _exploit_left = k_exploit_epochs;
        } else if (_window / 2 >= k_min_window_ns) {
            _window /= 2;  // measure a shorter window next epoch
        } else {
            // No window helps this client now: do not hold, and next time
            // start from the last window that won, or from the longest.
            _wins = false;
            _window = _won != 0 ? _won : _max;
            _phase = phase::exploit;
            _exploit_left = k_exploit_epochs;
        }
        break;
    case phase::exploit:
        if (--_exploit_left == 0) {
            // Measure again (a longer window after a win), or stop if the
            // client no longer pipelines.
            if (_epoch_requests < k_idle_requests) {
                _phase = phase::off;
                _wins = false;
            } else {
                _phase = phase::measure_plain;
                if (_wins) {
                    _window = std::min(_max, _window * 2);
                }
            }
        }
        break;
    case phase::off:
        break;
    }
    _epoch_start = now;
    _epoch_requests = 0;
}

}  // namespace softblk::nbd
