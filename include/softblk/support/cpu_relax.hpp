// A hint to the CPU inside a spin-wait loop: lets a sibling hyperthread run
// and saves power (x86 `pause`, aarch64 `yield`); nothing elsewhere.
#pragma once

namespace softblk {

inline void cpu_relax()
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__) || defined(__arm__)
    asm volatile("yield" ::: "memory");
#endif
}

}  // namespace softblk
