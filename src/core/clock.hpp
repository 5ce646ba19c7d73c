// The clocks of the core, for the core and the front ends: CLOCK_MONOTONIC
// in nanoseconds (deadlines, next_event_ns(), poll windows) and its coarse
// variant (per-request timestamps, a few ns each).
#pragma once

#include <cstdint>

namespace softblk::core {

uint64_t monotonic_ns();
uint64_t coarse_monotonic_ns();

}  // namespace softblk::core
