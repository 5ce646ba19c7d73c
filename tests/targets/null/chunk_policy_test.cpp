// The page pool's choice between huge and small chunks
// (src/core/chunk_policy.hpp), driven with a cost model instead of the
// kernel: what populating a chunk of each kind costs per MiB.
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/chunk_policy.hpp"

using softblk::core::chunk_kind;
using softblk::core::chunk_policy;

namespace {

constexpr uint64_t k_mib_bytes = uint64_t{1} << 20;
constexpr uint64_t k_us = 1000;
constexpr uint64_t k_ms = 1000 * k_us;

bool thp_usable(std::string&)
{
    return true;
}

// Nanoseconds per MiB to populate each kind.
struct cost_model {
    uint64_t huge;
    uint64_t small;
};

uint64_t bytes_of(chunk_kind k)
{
    return k == chunk_kind::huge ? 2 * k_mib_bytes : k_mib_bytes;
}

struct drive_result {
    std::vector<chunk_kind> kinds;
    uint64_t total_ns = 0;
    // Chunks of the kind not decided when they were asked for, and their time.
    uint64_t probes = 0;
    uint64_t probe_ns = 0;
};

// `chunks` chunks as the pool takes them: next(), populate (the model's
// cost), record().
drive_result drive(chunk_policy& p, cost_model m, unsigned chunks)
{
    drive_result r;
    for (unsigned i = 0; i < chunks; ++i) {
        const std::optional<chunk_kind> decided = p.snapshot().decided;
        const chunk_kind k = p.next();
        const uint64_t ns = (k == chunk_kind::huge ? m.huge : m.small) * bytes_of(k) / k_mib_bytes;
        p.record(k, bytes_of(k), ns);
        r.kinds.push_back(k);
        r.total_ns += ns;
        if (decided && k != *decided) {
            ++r.probes;
            r.probe_ns += ns;
        }
    }
    return r;
}

// Where huge pages come straight from free memory, and where the host
// faults them back in (the test machine's figures, docs/null.md).
constexpr cost_model k_cheap_huge{.huge = 120 * k_us, .small = 250 * k_us};
constexpr cost_model k_slow_huge{.huge = 5 * k_ms, .small = 250 * k_us};

TEST(chunk_policy, measures_each_kind_three_times_first_alternating)
{
    chunk_policy p(nullptr, thp_usable);
    EXPECT_FALSE(p.snapshot().decided);
    const drive_result r = drive(p, k_slow_huge, 6);
    const std::vector<chunk_kind> expected = {chunk_kind::huge, chunk_kind::small,
                                              chunk_kind::huge, chunk_kind::small,
                                              chunk_kind::huge, chunk_kind::small};
    EXPECT_EQ(r.kinds, expected);
    const chunk_policy::figures f = p.snapshot();
    ASSERT_TRUE(f.decided);
    EXPECT_EQ(f.huge_ns_per_mib, 5 * k_ms);
    EXPECT_EQ(f.small_ns_per_mib, 250 * k_us);
    EXPECT_EQ(f.huge_samples, 3u);
    EXPECT_EQ(f.small_samples, 3u);
}

TEST(chunk_policy, picks_huge_where_huge_pages_are_cheap)
{
    chunk_policy p(nullptr, thp_usable);
    drive(p, k_cheap_huge, 6);
    ASSERT_EQ(p.snapshot().decided, chunk_kind::huge);
    const drive_result r = drive(p, k_cheap_huge, 2000);
    EXPECT_EQ(p.snapshot().decided, chunk_kind::huge);
    // Small chunks only as probes: a 1 MiB probe after 32 times its cost
    // spent on huge chunks (8 ms: 33 huge chunks), some 1.5% of the memory.
    EXPECT_GT(r.probes, 0u) << "never re-checked";
    EXPECT_LE(r.probe_ns, r.total_ns / chunk_policy::k_probe_share);
    uint64_t small = 0;
    for (chunk_kind k : r.kinds) {
        small += k == chunk_kind::small ? 1 : 0;
    }
    EXPECT_EQ(small, r.probes);
    EXPECT_LT(small * 1.0 / (2 * (2000 - small) + small), 0.02);
}

TEST(chunk_policy, picks_small_where_huge_pages_are_slow)
{
    chunk_policy p(nullptr, thp_usable);
    drive(p, k_slow_huge, 6);
    ASSERT_EQ(p.snapshot().decided, chunk_kind::small);
    // 3 GiB more: a huge probe once 32 times its cost (10 ms) went into
    // small chunks (320 ms: 1280 of them), which bounds what probing adds
    // to a fill at 1/32.
    const drive_result r = drive(p, k_slow_huge, 3000);
    EXPECT_EQ(p.snapshot().decided, chunk_kind::small);
    EXPECT_EQ(r.probes, 2u);
    EXPECT_LE(r.probe_ns, r.total_ns / chunk_policy::k_probe_share);
}

TEST(chunk_policy, huge_pages_while_at_most_one_and_a_half_times_the_small_cost)
{
    for (const auto& [huge, expected] :
         {std::pair{uint64_t{1400}, chunk_kind::huge}, std::pair{uint64_t{1500}, chunk_kind::huge},
          std::pair{uint64_t{1510}, chunk_kind::small},
          std::pair{uint64_t{3000}, chunk_kind::small},
          std::pair{uint64_t{100}, chunk_kind::huge}}) {
        chunk_policy p(nullptr, thp_usable);
        drive(p, {.huge = huge * k_us, .small = 1000 * k_us}, 6);
        EXPECT_EQ(p.snapshot().decided, expected) << huge << " us per MiB huge, 1000 small";
    }
}

TEST(chunk_policy, one_slow_chunk_does_not_decide)
{
    // A writer preempted while it populated (a time slice on a busy
    // machine): one sample in three, the median ignores it.
    chunk_policy p(nullptr, thp_usable);
    p.record(p.next(), 2 * k_mib_bytes, 40 * k_ms);  // huge, preempted
    drive(p, k_cheap_huge, 5);
    EXPECT_EQ(p.snapshot().decided, chunk_kind::huge);
    EXPECT_EQ(p.snapshot().huge_ns_per_mib, k_cheap_huge.huge);
    // And once decided: one slow huge chunk leaves the decision as it is.
    p.record(chunk_kind::huge, 2 * k_mib_bytes, 40 * k_ms);
    EXPECT_EQ(p.snapshot().decided, chunk_kind::huge);
}

TEST(chunk_policy, leaves_huge_pages_after_two_slow_chunks)
{
    chunk_policy p(nullptr, thp_usable);
    drive(p, k_cheap_huge, 100);
    ASSERT_EQ(p.snapshot().decided, chunk_kind::huge);
    // The host starts taking memory back: huge chunks turn slow, and the
    // chunks of the decided kind tell it.
    unsigned huge_after = 0;
    for (unsigned i = 0; i < 10 && p.snapshot().decided == chunk_kind::huge; ++i) {
        const drive_result r = drive(p, k_slow_huge, 1);
        huge_after += r.kinds[0] == chunk_kind::huge ? 1 : 0;
    }
    EXPECT_EQ(p.snapshot().decided, chunk_kind::small);
    EXPECT_EQ(huge_after, 2u);
}

TEST(chunk_policy, re_checks_and_returns_to_huge_pages_when_they_become_cheap)
{
    chunk_policy p(nullptr, thp_usable);
    drive(p, k_slow_huge, 6);
    ASSERT_EQ(p.snapshot().decided, chunk_kind::small);
    // Memory freed in the guest and not yet reported: huge pages are cheap
    // again. The next probe finds it, is repeated at once (its sample alone
    // would turn the decision), and two agreeing samples turn it.
    const drive_result r = drive(p, k_cheap_huge, 1400);
    EXPECT_EQ(p.snapshot().decided, chunk_kind::huge);
    size_t first_huge = 0;
    while (first_huge < r.kinds.size() && r.kinds[first_huge] == chunk_kind::small) {
        ++first_huge;
    }
    // Small chunks until 32 times a huge chunk's cost (10 ms) was spent on
    // them: 320 ms at 0.25 ms each.
    EXPECT_EQ(first_huge, 32 * 10 * k_ms / (250 * k_us));
    ASSERT_LT(first_huge + 2, r.kinds.size());
    EXPECT_EQ(r.kinds[first_huge + 1], chunk_kind::huge) << "the probe was not repeated";
    EXPECT_EQ(r.kinds[first_huge + 2], chunk_kind::huge) << "two cheap samples did not turn it";
}

TEST(chunk_policy, a_probe_that_agrees_is_not_repeated)
{
    chunk_policy p(nullptr, thp_usable);
    drive(p, k_slow_huge, 6);
    const drive_result r = drive(p, k_slow_huge, 1300);
    size_t probe = 0;
    while (probe < r.kinds.size() && r.kinds[probe] == chunk_kind::small) {
        ++probe;
    }
    ASSERT_LT(probe + 1, r.kinds.size());
    EXPECT_EQ(r.kinds[probe], chunk_kind::huge);
    EXPECT_EQ(r.kinds[probe + 1], chunk_kind::small);
    EXPECT_EQ(r.probes, 1u);
}

TEST(chunk_policy, the_thp_check_reads_this_machine)
{
    // The real check: whatever it says, it says why when it says no.
    std::string why;
    const bool usable = chunk_policy::thp_usable_here(why);
    EXPECT_EQ(usable, why.empty()) << why;
}

}  // namespace
