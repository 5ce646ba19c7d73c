// A hint to the CPU inside a spin-wait loop: lets a sibling hyperthread run
// and saves power (x86 `pause`, aarch64 `yield`); nothing elsewhere. And
// the one bound below which a thread spins instead of sleeping.
#pragma once

#include <cstdint>

namespace softblk {

// Waits shorter than this (20 us) are spun, watching for work, instead of
// slept: below a sleep's wake-up latency. The core's queue wait(), the ublk
// queue threads and the FUSE ring threads share it.
inline constexpr uint64_t k_spin_wait_ns = 20'000;

inline void cpu_relax()
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__) || defined(__arm__)
    asm volatile("yield" ::: "memory");
#endif
}

}  // namespace softblk
