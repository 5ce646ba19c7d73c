#include "chunk_policy.hpp"

#include <algorithm>
#include <ctime>
#include <fstream>
#include <utility>
#include <sys/prctl.h>

namespace softblk::core {

namespace {

constexpr uint64_t k_mib_bytes = uint64_t{1} << 20;

uint64_t monotonic_ns()
{
    timespec t{};
    clock_gettime(CLOCK_MONOTONIC, &t);
    return static_cast<uint64_t>(t.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(t.tv_nsec);
}

chunk_kind other_kind(chunk_kind k)
{
    return k == chunk_kind::huge ? chunk_kind::small : chunk_kind::huge;
}

uint64_t chunk_mib(chunk_kind k)
{
    return k == chunk_kind::huge ? 2 : 1;
}

// Huge pages while they cost at most 1.5 times the small ones per MiB.
chunk_kind compare(uint64_t huge_ns_per_mib, uint64_t small_ns_per_mib)
{
    return huge_ns_per_mib * chunk_policy::k_ratio_den <=
                   small_ns_per_mib * chunk_policy::k_ratio_num
               ? chunk_kind::huge
               : chunk_kind::small;
}

}  // namespace

const char* chunk_kind_name(chunk_kind k)
{
    return k == chunk_kind::huge ? "huge" : "small";
}

chunk_policy::chunk_policy(clock_fn clock, thp_fn thp)
    : _clock(clock != nullptr ? clock : monotonic_ns), _thp(thp != nullptr ? thp : thp_usable_here)
{
}

void chunk_policy::set_clock(clock_fn clock)
{
    _clock.store(clock != nullptr ? clock : monotonic_ns, std::memory_order_relaxed);
}

chunk_policy& chunk_policy::process()
{
    static chunk_policy policy;
    return policy;
}

bool chunk_policy::thp_usable_here(std::string& why)
{
    // Read when a store is made (or its huge_pages is set), not per chunk:
    // an administrator who turns THP off gets small chunks in the stores
    // made after.
    std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
    std::string modes;
    if (!f || !std::getline(f, modes)) {
        why =
            "the kernel has no transparent huge pages (no "
            "/sys/kernel/mm/transparent_hugepage/enabled)";
        return false;
    }
    if (modes.find("[never]") != std::string::npos) {
        why = "transparent huge pages are off (/sys/kernel/mm/transparent_hugepage/enabled: never)";
        return false;
    }
    if (prctl(PR_GET_THP_DISABLE, 0, 0, 0, 0) == 1) {
        why = "transparent huge pages are off for this process (PR_SET_THP_DISABLE)";
        return false;
    }
    return true;
}

uint64_t chunk_policy::series::median() const
{
    const uint64_t n = std::min<uint64_t>(count, k_window);
    if (n == 0) {
        return 0;
    }
    uint64_t v[k_window];
    std::copy(last, last + n, v);
    std::sort(v, v + n);
    return v[(n - 1) / 2];
}

std::optional<chunk_kind> chunk_policy::decided_locked() const
{
    if (!_huge.full() || !_small.full()) {
        return std::nullopt;
    }
    return compare(_huge.median(), _small.median());
}

bool chunk_policy::turns_locked(chunk_kind decided, chunk_kind kind, uint64_t ns_per_mib) const
{
    const uint64_t huge = kind == chunk_kind::huge ? ns_per_mib : _huge.median();
    const uint64_t small = kind == chunk_kind::small ? ns_per_mib : _small.median();
    return compare(huge, small) != decided;
}

chunk_kind chunk_policy::next()
{
    std::lock_guard guard(_lock);
    const std::optional<chunk_kind> decided = decided_locked();
    if (!decided) {
        // Measuring: alternate, huge first.
        return _huge.count <= _small.count ? chunk_kind::huge : chunk_kind::small;
    }
    const chunk_kind other = other_kind(*decided);
    if (const std::optional<chunk_kind> repeat = std::exchange(_repeat, std::nullopt);
        repeat == other) {
        _awaiting_repeat = true;
        return other;
    }
    if (_spent_ns >= k_probe_share * of(other).median() * chunk_mib(other)) {
        _spent_ns = 0;  // a probe now: no second one while it is populated
        return other;
    }
    return *decided;
}

void chunk_policy::record(chunk_kind kind, uint64_t bytes, uint64_t ns)
{
    if (bytes == 0) {
        return;
    }
    const uint64_t ns_per_mib = ns * k_mib_bytes / bytes;
    std::lock_guard guard(_lock);
    if (const std::optional<chunk_kind> decided = decided_locked()) {
        if (kind == *decided) {
            _spent_ns += ns;
        } else {
            _spent_ns = 0;
            if (_awaiting_repeat) {
                _awaiting_repeat = false;
            } else if (turns_locked(*decided, kind, ns_per_mib)) {
                _repeat = kind;
            }
        }
    }
    of(kind).add(ns_per_mib);
}

chunk_policy::figures chunk_policy::snapshot() const
{
    std::lock_guard guard(_lock);
    return figures{
        .decided = decided_locked(),
        .huge_ns_per_mib = _huge.median(),
        .small_ns_per_mib = _small.median(),
        .huge_samples = _huge.count,
        .small_samples = _small.count,
    };
}

}  // namespace softblk::core
