// How the memory store (memory_store.cpp) copies written data into its
// pages: with ordinary (cached) stores, or with streaming (non-temporal)
// stores that go to memory without reading the destination's cache lines
// first. Internal to the core.
//
// Why: a 4 KiB write to a random page of a store several times larger than
// the last-level cache finds none of the page's 64 lines cached, so each
// cached store first reads its line from memory (read for ownership) and
// evicts a line that was worth keeping; a streaming store writes the line
// whole instead. On the test machine (2-vCPU KVM guest, 260 MiB L3) that
// made 4 KiB copies to random slots of 1 GiB 1.2-1.8 times as fast, fence
// included, and copies into 16 MiB (cache-resident) 0.6 times as fast: so
// a store of at least k_stream_factor times the cache starts streaming,
// and copy_mode_chooser.hpp then keeps whichever its trials time cheaper.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace softblk::core {

// A store starts streaming its writes from this many times the last-level
// cache on (choose_copy: the first guess, until copy_mode_chooser measured).
inline constexpr uint64_t k_stream_factor = 2;

// Whether this build can stream (x86-64: SSE2's movntdq is in the baseline).
inline constexpr bool k_can_stream =
#if defined(__x86_64__)
    true;
#else
    false;
#endif

// The last-level cache in bytes as the C library reports it (L3, else L2);
// 0 when it reports none. Control path.
uint64_t last_level_cache_bytes();

struct copy_choice {
    bool streaming = false;
    std::string why;  // for describe
};

// How a store of `capacity_bytes` copies writes until it measured, given a
// last-level cache of `cache_bytes` (0: unknown, then cached). Control
// path.
copy_choice choose_copy(uint64_t capacity_bytes, uint64_t cache_bytes);

// Copies `n` bytes from `src` (any alignment) to `dst` with streaming
// stores where `dst` and `n` are multiples of 64, as a store's blocks are
// (512 bytes at least, in 4 KiB aligned pages); with memcpy otherwise. The
// stores are weakly ordered: stream_fence() must follow before anything
// that publishes the data to another thread (the stripe lock's release).
// Hot path.
inline void stream_copy(char* dst, const char* src, size_t n)
{
#if defined(__x86_64__)
    if (((reinterpret_cast<uintptr_t>(dst) | n) & 63) != 0) [[unlikely]] {
        std::memcpy(dst, src, n);
        return;
    }
    for (size_t i = 0; i < n; i += 64) {
        const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
        const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
        const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
        const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
        _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
        _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
        _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
        _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
    }
#else
    std::memcpy(dst, src, n);
#endif
}

// Orders the streaming stores before it with every store after it. Hot
// path.
inline void stream_fence()
{
#if defined(__x86_64__)
    _mm_sfence();
#endif
}

}  // namespace softblk::core
