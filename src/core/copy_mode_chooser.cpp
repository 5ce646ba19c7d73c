// The memory store's copy, chosen by timing it (copy_mode_chooser.hpp).
#include "copy_mode_chooser.hpp"

#include <algorithm>

#include <fmt/format.h>

#include <softblk/support/clock.hpp>

namespace softblk::core {

namespace {

const char* mode_name(bool streaming)
{
    return streaming ? "streaming" : "cached";
}

// The monotonic clock in ns once every store before it is globally
// visible: mfence drains them (a cached store's line read for ownership, a
// streaming store's write-combining buffer), lfence keeps the clock's read
// after it (Intel's SDM on ordering RDTSC).
uint64_t drained_clock_ns()
{
#if defined(__x86_64__)
    _mm_mfence();
    _mm_lfence();
#endif
    return monotonic_ns();
}

}  // namespace

copy_mode_chooser::copy_mode_chooser(copy_choice first) : _streaming(first.streaming)
{
    _why = fmt::format("until measured, from the capacity: {}", first.why);
    if (!k_can_stream) {
        _why = first.why;
        _phase_end.store(UINT64_MAX, std::memory_order_relaxed);
    }
}

copy_mode_chooser::sample_plan copy_mode_chooser::next_sample(uint64_t weight)
{
    const uint64_t s = _samples.fetch_add(weight, std::memory_order_relaxed) + weight - 1;
    if (s >= _phase_end.load(std::memory_order_acquire)) [[unlikely]] {
        const std::lock_guard lock(_mutex);
        advance(s);
    }
    const phase p = _phase.load(std::memory_order_relaxed);
    return {streaming(), p == phase::timed_other || p == phase::timed_kept};
}

void copy_mode_chooser::advance(uint64_t s)
{
    while (s >= _phase_end.load(std::memory_order_relaxed)) {
        uint64_t length = 0;
        switch (_phase.load(std::memory_order_relaxed)) {
        case phase::exploit:
            _kept = streaming();
            std::fill(std::begin(_ns), std::end(_ns), 0);
            std::fill(std::begin(_bytes), std::end(_bytes), 0);
            _streaming.store(!_kept, std::memory_order_relaxed);
            _phase.store(phase::warm_other, std::memory_order_relaxed);
            length = k_warm_samples;
            break;
        case phase::warm_other:
            _phase.store(phase::timed_other, std::memory_order_relaxed);
            length = k_timed_samples;
            break;
        case phase::timed_other:
            _streaming.store(_kept, std::memory_order_relaxed);
            _phase.store(phase::warm_kept, std::memory_order_relaxed);
            length = k_warm_samples;
            break;
        case phase::warm_kept:
            _phase.store(phase::timed_kept, std::memory_order_relaxed);
            length = k_timed_samples;
            break;
        case phase::timed_kept:
            decide();
            _phase.store(phase::exploit, std::memory_order_relaxed);
            length = _exploit;
            break;
        }
        _phase_end.store(_phase_end.load(std::memory_order_relaxed) + length,
                         std::memory_order_release);
    }
}

void copy_mode_chooser::timed(bool streaming, uint64_t ns, uint64_t bytes)
{
    const std::lock_guard lock(_mutex);
    const phase p = _phase.load(std::memory_order_relaxed);
    // A sample planned just before its phase ended is dropped.
    if ((p == phase::timed_other && streaming != _kept) ||
        (p == phase::timed_kept && streaming == _kept)) {
        _ns[streaming] += ns;
        _bytes[streaming] += bytes;
    }
}

void copy_mode_chooser::decide()
{
    ++_trials;
    if (_bytes[0] == 0 || _bytes[1] == 0) {
        _streaming.store(_kept, std::memory_order_relaxed);
        _exploit = k_first_exploit;
        _why = fmt::format("{} kept: trial {} timed no copy in one of the modes", mode_name(_kept),
                           _trials);
        return;
    }
    for (const int m : {0, 1}) {
        _ns_per_kib[m] = static_cast<double>(_ns[m]) * 1024.0 / static_cast<double>(_bytes[m]);
    }
    const bool other = !_kept;
    const bool winner = _ns_per_kib[other] < _ns_per_kib[_kept] * (1 - k_margin) ? other : _kept;
    _exploit = winner == _kept ? std::min(_exploit * 2, k_max_exploit) : k_first_exploit;
    _streaming.store(winner, std::memory_order_relaxed);
    _why = fmt::format(
        "timed (trial {}, {} copies in each mode into pages whose index is a multiple of {}): "
        "{:.0f} ns per KiB cached against {:.0f} streaming; {} {} (the other must be {:.0f}% "
        "cheaper); the next trial after {} more such copies",
        _trials, k_timed_samples, k_sample_every, _ns_per_kib[0], _ns_per_kib[1], mode_name(winner),
        winner == _kept ? "kept" : "chosen", k_margin * 100, _exploit);
}

void copy_mode_chooser::copy_sample(uint64_t index, char* dst, const char* src, size_t n)
{
    uint64_t weight = 1;
    if (_phase.load(std::memory_order_relaxed) == phase::exploit) {
        if (index % (k_sample_every * k_exploit_stride) != 0) {
            copy_in(streaming(), dst, src, n);
            return;
        }
        weight = k_exploit_stride;
    }
    const sample_plan plan = next_sample(weight);
    if (!plan.timed) {
        copy_in(plan.streaming, dst, src, n);
        return;
    }
    const uint64_t start = drained_clock_ns();
    copy_in(plan.streaming, dst, src, n);
    timed(plan.streaming, drained_clock_ns() - start, n);
}

void copy_mode_chooser::describe(nlohmann::json& out) const
{
    const std::lock_guard lock(_mutex);
    out["copy"] = mode_name(streaming());
    out["why"] = _why;
    out["trials"] = _trials;
    out["in_trial"] = _phase.load(std::memory_order_relaxed) != phase::exploit;
    if (_ns_per_kib[0] > 0) {
        out["ns_per_kib"] = {{"cached", _ns_per_kib[0]}, {"streaming", _ns_per_kib[1]}};
    }
}

}  // namespace softblk::core
