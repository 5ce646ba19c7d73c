// The receive-coalescing policy (coalesce.hpp): which window, if any, a
// pipelining connection holds its receives back for.
#include "coalesce.hpp"

namespace softblk::nbd {

namespace {

// The windows measured: 0, then 5 us doubling up to the longest allowed
// (below 5 us the timed wait that holds a receive costs about what it
// saves).
level_chooser::config windows(uint64_t max_ns)
{
    level_chooser::config c;
    c.unit = "us";
    c.cost = level_chooser::cheaper::higher;
    c.margin = 0.02;
    c.levels = {0};
    for (uint64_t us = 5; us * 1'000 <= max_ns; us *= 2) {
        c.levels.push_back(us);
    }
    if (c.levels.back() * 1'000 < max_ns) {
        c.levels.push_back(max_ns / 1'000);
    }
    return c;
}

}  // namespace

coalesce_policy::coalesce_policy(uint64_t max_window_ns)
{
    if (max_window_ns >= 1'000) {
        _chooser.emplace(windows(max_window_ns));
    }
}

uint64_t coalesce_policy::next_hold(uint64_t got, uint64_t now)
{
    if (!_chooser) {
        return 0;
    }
    if (!_pipelining) {
        if (got < 2) {
            return 0;  // one request at a time: nothing to gather
        }
        _pipelining = true;
        _chooser->start(now);
    }
    _chooser->served(now, got);
    if (_chooser->idle()) {
        // Nearly idle (fewer than an epoch's requests in 100 ms): not
        // pipelining any more; a receive with several requests starts
        // measuring again.
        _pipelining = false;
        return 0;
    }
    return _chooser->level() * 1'000;
}

nlohmann::json coalesce_policy::describe() const
{
    return _chooser ? _chooser->describe() : nlohmann::json();
}

}  // namespace softblk::nbd
