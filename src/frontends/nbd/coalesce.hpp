// The receive-coalescing policy of one NBD connection (docs/nbd.md,
// "Receive coalescing"): pure, fed with how many requests each receive
// brought and the clock, it says how long the next receive is held back.
// event_loop::coalesce_receive (coalesce.cpp) applies it; the unit tests
// drive it with made-up rates.
#pragma once

#include <cstdint>

namespace softblk::nbd {

class coalesce_policy {
public:
    enum class phase : uint8_t {
        off,            // not pipelining: never hold
        measure_plain,  // an epoch without holding, for the reference rate
        measure_held,   // an epoch holding for window_ns()
        exploit,        // holding (or not) as the last measurement said
    };

    // Epochs over which a rate is measured, and how many the choice is
    // kept before measuring again.
    static constexpr uint64_t k_epoch_ns = 2'000'000;
    static constexpr uint8_t k_exploit_epochs = 16;
    // An exploit epoch with fewer requests than this ends coalescing: the
    // client has (nearly) stopped.
    static constexpr uint64_t k_idle_requests = 4;
    // The smallest window tried: below it the timed wait that holds the
    // receive costs about what it saves.
    static constexpr uint64_t k_min_window_ns = 5'000;

    // `max_window_ns`: coalesce-us in ns; 0 never holds.
    explicit coalesce_policy(uint64_t max_window_ns = 0)
        : _max(max_window_ns), _window(max_window_ns)
    {
    }

    // After a receive (or an unblocked input) parsed `got` requests at
    // `now` (ns): how long to hold the next receive back, 0 for not at all.
    uint64_t next_hold(uint64_t got, uint64_t now);

    phase state() const { return _phase; }
    uint64_t window_ns() const { return _window; }
    bool holding() const
    {
        return _phase == phase::measure_held || (_phase == phase::exploit && _wins);
    }

private:
    void end_epoch(uint64_t now);

    uint64_t _max;
    uint64_t _window;   // the window measured or used
    uint64_t _won = 0;  // the last window that won, 0: none yet
    uint64_t _epoch_start = 0;
    uint64_t _epoch_requests = 0;
    uint64_t _rate_plain = 0;  // requests per second without holding back
    phase _phase = phase::off;
    bool _wins = false;
    uint8_t _exploit_left = 0;
};

}  // namespace softblk::nbd
