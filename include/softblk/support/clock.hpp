// The monotonic clocks everyone shares: CLOCK_MONOTONIC in nanoseconds
// (deadlines, next_event_ns(), poll windows) and its coarse variant
// (per-request timestamps at a few ns each). Any thread.
#pragma once

#include <cstdint>
#include <ctime>

namespace softblk {

inline uint64_t monotonic_ns()
{
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<uint64_t>(ts.tv_sec) * uint64_t{1'000'000'000} +
           static_cast<uint64_t>(ts.tv_nsec);
}

// Lags monotonic_ns() by up to one scheduler tick (1-10 ms).
inline uint64_t coarse_monotonic_ns()
{
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return static_cast<uint64_t>(ts.tv_sec) * uint64_t{1'000'000'000} +
           static_cast<uint64_t>(ts.tv_nsec);
}

}  // namespace softblk
