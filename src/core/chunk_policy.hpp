// Which kind of chunk the memory store's page pool (page_pool.hpp) maps
// next: a 2 MiB transparent huge page or 1 MiB of small pages, decided by
// what populating each costs on the machine at hand. Internal to the core.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

namespace softblk::core {

enum class chunk_kind : uint8_t {
    small,  // 1 MiB of 4 KiB pages
    huge,   // 2 MiB, one transparent huge page
};

// A huge page makes steady 4 KiB random writes over a large store about
// 40% faster (one TLB entry per 2 MiB instead of 512), but its first write
// costs what the kernel (and, in a VM, the host) pays to give a zeroed 2 MiB
// page: 0.1-0.4 ms per MiB where free memory is at hand, 5-24 ms per MiB
// in a guest whose host took its free memory back (virtio-balloon free page
// reporting), where small pages from the guest's smaller free blocks cost
// 0.25-2 ms per MiB. No constant suits both, so the pool measures: it times
// the population of every chunk (wall time: what a writer waits for) and
// keeps the last k_window of each kind per MiB.
//
// The rule:
//  - Measuring: until each kind has k_window samples the chunks alternate,
//    huge first (3 huge and 3 small chunks: 9 MiB).
//  - Then huge while the median huge cost per MiB is at most 1.5 times the
//    small one, small beyond. Why 1.5: where huge pages cost that much more
//    to populate (0.4 ms per MiB against 0.25 here), filling 1 GiB takes
//    0.1 s longer, which the faster random writes win back within about two
//    passes of 4 KiB writes over it (some 80 ms saved per GiB written);
//    where populating costs 5 ms per MiB (20 times the small pages) a fill
//    takes seconds longer and nothing wins that back for a device that is
//    filled once by mkfs or fio and then read.
//  - Medians of three, so that a writer preempted for a time slice on a
//    busy machine (a few ms, as much as a chunk costs) does not decide.
//  - Re-checks: every chunk of the decided kind updates its own median, so
//    huge pages that become slow are left after two slow chunks. The other
//    kind is probed again once the population time spent on the decided
//    kind since the last probe reaches k_probe_share times what a chunk of
//    the other kind last cost: probing takes at most 1/k_probe_share of the
//    time spent populating, however the costs lie (a small probe every 64
//    MiB where huge pages cost 0.12 ms per MiB; a huge probe per GiB or so
//    where they cost 5 ms). A probe whose sample alone would turn the
//    decision is repeated at once, so that two agreeing samples (a median
//    of three) turn it without waiting for the next probe.
// Where the kernel gives this process no transparent huge pages (enabled:
// never, PR_SET_THP_DISABLE, a kernel without them) the pool takes small
// chunks and asks nothing (thp_usable).
//
// One per process (process()), shared by every store: the cost is the
// machine's, and a store made later needs no measuring of its own. Any
// thread (a mutex, taken twice per chunk).
class chunk_policy {
public:
    using clock_fn = uint64_t (*)();
    // Whether transparent huge pages can be had; `why` says why not.
    using thp_fn = bool (*)(std::string& why);

    static constexpr unsigned k_window = 3;
    static constexpr unsigned k_probe_share = 32;
    // Huge while huge * k_ratio_den <= small * k_ratio_num (1.5 times).
    static constexpr uint64_t k_ratio_num = 3;
    static constexpr uint64_t k_ratio_den = 2;

    // `clock`: nanoseconds, monotonic; `thp`: the THP check. The defaults
    // are CLOCK_MONOTONIC and thp_usable_here(); tests inject their own.
    explicit chunk_policy(clock_fn clock = nullptr, thp_fn thp = nullptr);
    chunk_policy(const chunk_policy&) = delete;
    chunk_policy& operator=(const chunk_policy&) = delete;

    // The process's policy, used by every store.
    static chunk_policy& process();

    uint64_t now() const { return _clock.load(std::memory_order_relaxed)(); }
    // Replaces the clock (nullptr: CLOCK_MONOTONIC): for tests that make a
    // population slow, as a host's faults make it.
    void set_clock(clock_fn clock);
    bool thp_usable(std::string& why) const { return _thp(why); }

    // The kind of the next chunk populated with huge_pages=auto.
    chunk_kind next();
    // A chunk of `kind` and `bytes` took `ns` to populate.
    void record(chunk_kind kind, uint64_t bytes, uint64_t ns);

    struct figures {
        std::optional<chunk_kind> decided;  // none while measuring
        uint64_t huge_ns_per_mib = 0;       // medians; 0: no sample yet
        uint64_t small_ns_per_mib = 0;
        uint64_t huge_samples = 0;  // chunks timed since the process began
        uint64_t small_samples = 0;
    };
    figures snapshot() const;

    // /sys/kernel/mm/transparent_hugepage/enabled not "never" and no
    // PR_SET_THP_DISABLE on this process.
    static bool thp_usable_here(std::string& why);

private:
    struct series {
        uint64_t last[k_window] = {};
        uint64_t count = 0;
        bool full() const { return count >= k_window; }
        uint64_t median() const;
        void add(uint64_t v) { last[count++ % k_window] = v; }
    };
    std::optional<chunk_kind> decided_locked() const;
    // Whether `ns_per_mib` of `kind`, instead of its median, turns the
    // decision.
    bool turns_locked(chunk_kind decided, chunk_kind kind, uint64_t ns_per_mib) const;
    series& of(chunk_kind k) { return k == chunk_kind::huge ? _huge : _small; }
    const series& of(chunk_kind k) const { return k == chunk_kind::huge ? _huge : _small; }

    std::atomic<clock_fn> _clock;
    thp_fn _thp;
    mutable std::mutex _lock;
    series _huge;
    series _small;
    // Population time of the decided kind since the other was last probed.
    uint64_t _spent_ns = 0;
    // A probe to repeat: next() returns this kind once more.
    std::optional<chunk_kind> _repeat;
    bool _awaiting_repeat = false;  // that repeat's sample is still to come
};

const char* chunk_kind_name(chunk_kind k);

}  // namespace softblk::core
