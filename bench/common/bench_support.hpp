// What the in-process benchmark programs share: the monotonic clock, a
// cheap random number generator and a count of heap allocations (every
// measured loop prints how many it made: the hot path must show 0).
#pragma once

#include <cstdint>
#include <ctime>

namespace softblk::bench {

// CLOCK_MONOTONIC in nanoseconds. Any thread.
inline uint64_t now_ns()
{
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// Marsaglia's xorshift64: offsets and zones for the workloads, not for
// anything that needs good randomness. `s` must not be 0.
struct xorshift {
    uint64_t s;
    uint64_t next()
    {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        return s;
    }
};

// Heap allocations (operator new, every thread) since the program started:
// bench_support.cpp replaces the global operator new and delete, so a
// program that links it counts every allocation. Any thread.
uint64_t allocations();

}  // namespace softblk::bench
