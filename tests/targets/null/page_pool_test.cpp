// The memory store's page pool (src/core/page_pool.hpp) on its own: the
// chunk sizes and what they charge, one mapping for many chunks, huge pages
// where the kernel has them and the same behaviour where it has none, the
// chunk kind its policy measured, and populations outside its mutex.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/page_pool.hpp"

using softblk::huge_page_mode;
using softblk::k_mib;
using softblk::memory_budget;
using softblk::core::chunk_kind;
using softblk::core::chunk_policy;
using softblk::core::page_pool;

namespace {

constexpr uint64_t k_page = page_pool::k_page_size;
constexpr uint64_t k_huge = page_pool::k_huge_chunk_bytes;

bool thp_on(std::string&)
{
    return true;
}

// A policy that takes the kernel's THP as given: the tests of chunk sizes
// and mappings take huge chunks (huge_page_mode::on) with it, whatever the
// machine's THP setting (where it is never, a huge chunk is 2 MiB of small
// pages).
chunk_policy& thp_policy()
{
    static chunk_policy policy(nullptr, thp_on);
    return policy;
}

// What /proc/self/smaps says of the mapping that holds `p`.
struct mapping {
    uintptr_t start = 0;
    uintptr_t end = 0;
    uint64_t rss_kib = 0;
    uint64_t huge_kib = 0;  // AnonHugePages
    std::string flags;      // VmFlags
};

mapping mapping_of(const void* p)
{
    const auto at = reinterpret_cast<uintptr_t>(p);
    std::ifstream smaps("/proc/self/smaps");
    std::string line;
    mapping m;
    bool in = false;
    while (std::getline(smaps, line)) {
        unsigned long start = 0;
        unsigned long end = 0;
        if (std::sscanf(line.c_str(), "%lx-%lx ", &start, &end) == 2 &&
            line.find(':') > line.find(' ')) {
            if (in) {
                break;
            }
            in = start <= at && at < end;
            if (in) {
                m.start = start;
                m.end = end;
            }
            continue;
        }
        if (!in) {
            continue;
        }
        unsigned long kib = 0;
        if (std::sscanf(line.c_str(), "Rss: %lu kB", &kib) == 1) {
            m.rss_kib = kib;
        } else if (std::sscanf(line.c_str(), "AnonHugePages: %lu kB", &kib) == 1) {
            m.huge_kib = kib;
        } else if (line.rfind("VmFlags:", 0) == 0) {
            m.flags = line.substr(8);
        }
    }
    return m;
}

bool has_flag(const mapping& m, const char* flag)
{
    return (" " + m.flags + " ").find(std::string(" ") + flag + " ") != std::string::npos;
}

// Whether the kernel gives this process a transparent huge page now: a
// probe mapping advised as the pool advises its chunks.
bool kernel_gives_huge_pages()
{
    void* area = mmap(nullptr, 2 * k_huge, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (area == MAP_FAILED) {
        return false;
    }
    char* aligned = static_cast<char*>(area) + (-reinterpret_cast<uintptr_t>(area) & (k_huge - 1));
    madvise(aligned, k_huge, MADV_HUGEPAGE);
    std::memset(aligned, 1, k_huge);
    const bool huge = mapping_of(aligned).huge_kib >= k_huge / 1024;
    munmap(area, 2 * k_huge);
    return huge;
}

// `count` pages from `pool`, each written whole (all must be had).
std::vector<char*> take(page_pool& pool, size_t count)
{
    std::vector<char*> pages;
    for (size_t i = 0; i < count; ++i) {
        int error = 0;
        auto* p = static_cast<char*>(pool.allocate(error));
        EXPECT_NE(p, nullptr) << "page " << i << ": " << error;
        if (p == nullptr) {
            break;
        }
        std::memset(p, static_cast<int>(i & 0xff), k_page);
        pages.push_back(p);
    }
    return pages;
}

TEST(page_pool, chunks_are_a_huge_page_each_and_make_one_mapping)
{
    memory_budget budget;
    page_pool pool(-1, budget, 256 * k_mib, huge_page_mode::on, thp_policy());
    EXPECT_EQ(budget.used(), 0u);  // nothing mapped before the first page
    const std::vector<char*> pages = take(pool, 64 * k_mib / k_page);
    ASSERT_EQ(pages.size(), 64 * k_mib / k_page);
    // Charged a chunk at a time, 2 MiB each: exactly what was taken here.
    EXPECT_EQ(pool.resident_pages(), pages.size());
    EXPECT_EQ(budget.used(), 64 * k_mib);
    EXPECT_EQ(std::set<char*>(pages.begin(), pages.end()).size(), pages.size());
    for (size_t i = 0; i < pages.size(); ++i) {
        ASSERT_EQ(reinterpret_cast<uintptr_t>(pages[i]) % k_page, 0u);
        ASSERT_EQ(pages[i][k_page - 1], static_cast<char>(i & 0xff)) << i;
    }
    // 32 chunks, one mapping: a mapping per chunk would reach
    // vm.max_map_count (65530) at 128 GiB of data.
    const auto [low, high] = std::minmax_element(pages.begin(), pages.end());
    const mapping m = mapping_of(*low);
    EXPECT_LE(m.start, reinterpret_cast<uintptr_t>(*low));
    EXPECT_GE(m.end, reinterpret_cast<uintptr_t>(*high) + k_page);
    // Not advised for huge pages once populated: khugepaged must not
    // collapse a chunk whose pages went back to the kernel.
    EXPECT_TRUE(has_flag(m, "nh")) << m.flags;
    EXPECT_FALSE(has_flag(m, "hg")) << m.flags;
}

TEST(page_pool, a_chunk_is_a_transparent_huge_page_where_the_kernel_has_one)
{
    if (!kernel_gives_huge_pages()) {
        GTEST_SKIP() << "the kernel gave a probe mapping no transparent huge page (THP off in "
                        "/sys/kernel/mm/transparent_hugepage/enabled, or memory fragmented)";
    }
    memory_budget budget;
    page_pool pool(-1, budget, 16 * k_mib, huge_page_mode::on);
    const std::vector<char*> pages = take(pool, 4 * k_huge / k_page);
    ASSERT_EQ(pages.size(), 4 * k_huge / k_page);
    const mapping m = mapping_of(pages.front());
    EXPECT_GE(m.huge_kib, k_huge / 1024) << "no chunk of 4 is a huge page";
    // A page given back to the kernel leaves a huge chunk: its memory goes
    // (the kernel splits the huge page's mapping), as from a small one.
    const uint64_t rss_before = m.rss_kib;
    for (char* p : pages) {
        pool.free(p);  // 1/8 of 16 MiB is kept, the rest goes back
    }
    pool.flush();
    EXPECT_EQ(pool.returned_pages(), pages.size() - pool.keep_pages());
    EXPECT_EQ(budget.used(), pool.keep_pages() * k_page);
    EXPECT_EQ(mapping_of(pages.front()).rss_kib, rss_before - pool.returned_pages() * 4);
}

TEST(page_pool, works_the_same_without_huge_pages)
{
    // PR_SET_THP_DISABLE: this process gets no transparent huge page, as on
    // a machine with THP set to never; the advice then does nothing.
    ASSERT_EQ(prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0), 0);
    {
        // The pool reads it: small chunks, with no measuring, even where
        // huge_pages=1 asks for huge pages.
        memory_budget budget;
        page_pool pool(-1, budget, 16 * k_mib, huge_page_mode::on);
        std::vector<char*> pages = take(pool, 3 * k_huge / k_page);
        ASSERT_EQ(pages.size(), 3 * k_huge / k_page);
        EXPECT_EQ(budget.used(), 3 * k_huge);
        EXPECT_EQ(pool.huge_chunks(), 0u);
        EXPECT_EQ(pool.small_chunks(), 6u);
        nlohmann::json chunks;
        pool.describe(chunks);
        EXPECT_EQ(chunks["kind"], "small");
        EXPECT_NE(chunks["why"].get<std::string>().find("PR_SET_THP_DISABLE"), std::string::npos)
            << chunks;
        const mapping m = mapping_of(pages.front());
        EXPECT_EQ(m.huge_kib, 0u);
        EXPECT_GE(m.end - m.start, 3 * k_huge);
        for (size_t i = 0; i < pages.size(); ++i) {
            ASSERT_EQ(pages[i][0], static_cast<char>(i & 0xff)) << i;
        }
        for (char* p : pages) {
            pool.free(p);
        }
        pool.flush();
        EXPECT_EQ(budget.used(), pool.keep_pages() * k_page);
        // Returned pages come back (charged again) before a new chunk.
        pages = take(pool, pages.size());
        EXPECT_EQ(budget.used(), 3 * k_huge);
        EXPECT_EQ(pool.resident_pages(), 3 * k_huge / k_page);
    }
    ASSERT_EQ(prctl(PR_SET_THP_DISABLE, 0, 0, 0, 0), 0);
}

TEST(page_pool, chunks_are_1_mib_near_a_limit_and_for_a_small_store)
{
    // A limit of 3 MiB at any level (the store's own, its parent's as the
    // daemon's budget, one above that): a 2 MiB chunk, then 1 MiB (2 more
    // would not fit), then ENOSPC. Taking 1 MiB where 2 MiB does not fit is
    // no refusal; only the allocation that fails is.
    for (const unsigned level : {0u, 1u, 2u}) {
        memory_budget top(level == 2 ? 3 * k_mib : 0);
        memory_budget parent(level == 1 ? 3 * k_mib : 0, &top);
        memory_budget budget(level == 0 ? 3 * k_mib : 0, &parent);
        page_pool pool(-1, budget, 64 * k_mib, huge_page_mode::on, thp_policy());
        EXPECT_EQ(take(pool, 3 * k_mib / k_page).size(), 3 * k_mib / k_page) << level;
        EXPECT_EQ(budget.used(), 3 * k_mib);
        auto refused = [&] { return budget.refused() + parent.refused() + top.refused(); };
        EXPECT_EQ(refused(), 0u) << level;
        int error = 0;
        EXPECT_EQ(pool.allocate(error), nullptr);
        EXPECT_EQ(error, -ENOSPC);
        EXPECT_EQ(refused(), 1u) << level;
        EXPECT_EQ(budget.used(), 3 * k_mib);
    }
    // A store smaller than a huge page takes 1 MiB, as before.
    memory_budget budget;
    page_pool pool(-1, budget, k_mib, huge_page_mode::on, thp_policy());
    EXPECT_EQ(take(pool, 1).size(), 1u);
    EXPECT_EQ(budget.used(), k_mib);
    EXPECT_EQ(pool.resident_pages(), k_mib / k_page);
}

TEST(page_pool, a_numa_node_applies_to_the_chunks)
{
    // home_node: the policy is set on the reserved address space and the
    // chunks made of it keep it (best effort: a kernel without NUMA
    // ignores it, and the pool works the same).
    memory_budget budget;
    page_pool pool(0, budget, 8 * k_mib, huge_page_mode::on, thp_policy());
    const std::vector<char*> pages = take(pool, 2 * k_huge / k_page);
    ASSERT_EQ(pages.size(), 2 * k_huge / k_page);
    std::ifstream numa_maps("/proc/self/numa_maps");
    if (!numa_maps) {
        GTEST_SKIP() << "no /proc/self/numa_maps: a kernel without NUMA";
    }
    const mapping m = mapping_of(pages.front());
    std::string line;
    bool found = false;
    while (std::getline(numa_maps, line)) {
        if (std::stoul(line.substr(0, line.find(' ')), nullptr, 16) == m.start) {
            found = true;
            EXPECT_NE(line.find("prefer:0"), std::string::npos) << line;
        }
    }
    EXPECT_TRUE(found);
}

TEST(page_pool, chunks_go_on_in_a_new_slab_when_one_is_used_up)
{
    // The address space reserved at a time is the capacity (up to 1 GiB):
    // 4 MiB here. Past it (pages freed and not yet reused do not count, so
    // a pool may hold more) chunks come from a new slab; a 1 MiB chunk
    // before a 2 MiB one leaves a gap, never an unaligned huge chunk.
    memory_budget parent(5 * k_mib);
    memory_budget budget(0, &parent);
    page_pool pool(-1, budget, 4 * k_mib, huge_page_mode::on, thp_policy());
    std::vector<char*> pages = take(pool, 5 * k_mib / k_page);  // 2 + 2 + 1 MiB
    ASSERT_EQ(pages.size(), 5 * k_mib / k_page);
    parent.set_limit(0);
    std::vector<char*> more = take(pool, 2 * k_mib / k_page);  // 2 MiB, aligned
    ASSERT_EQ(more.size(), 2 * k_mib / k_page);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(more.front()) % k_huge, 0u);
    EXPECT_EQ(budget.used(), 7 * k_mib);
    EXPECT_EQ(pool.resident_pages(), 7 * k_mib / k_page);
    pages.insert(pages.end(), more.begin(), more.end());
    EXPECT_EQ(std::set<char*>(pages.begin(), pages.end()).size(), pages.size());
    for (size_t i = 0; i < pages.size(); ++i) {
        ASSERT_EQ(pages[i][1], static_cast<char>(i & 0xff)) << i;
    }
    pool.release_all();
    EXPECT_EQ(budget.used(), 0u);
    EXPECT_EQ(take(pool, 1).size(), 1u);  // and maps again after
    EXPECT_EQ(budget.used(), k_huge);
}

// ---------------------------------------------------------------- the kind

bool thp_off(std::string& why)
{
    why = "THP off for this test";
    return false;
}

TEST(page_pool, no_huge_pages_means_small_chunks_and_no_measuring)
{
    chunk_policy policy(nullptr, thp_off);
    memory_budget budget;
    page_pool pool(-1, budget, 64 * k_mib, huge_page_mode::automatic, policy);
    EXPECT_EQ(take(pool, 8 * k_mib / k_page).size(), 8 * k_mib / k_page);
    EXPECT_EQ(pool.small_chunks(), 8u);
    EXPECT_EQ(pool.huge_chunks(), 0u);
    const chunk_policy::figures f = policy.snapshot();
    EXPECT_EQ(f.huge_samples + f.small_samples, 0u) << "it measured";
    nlohmann::json chunks;
    pool.describe(chunks);
    EXPECT_EQ(chunks["kind"], "small");
    EXPECT_EQ(chunks["why"], "small: THP off for this test");
    EXPECT_TRUE(chunks["huge_populate_us_per_mib"].is_null());
}

// A clock that moves 1 ms per reading: every chunk takes 1 ms to
// populate, so a huge one costs half as much per MiB as a small one.
std::atomic<uint64_t> g_ticks{0};
uint64_t one_ms_per_reading()
{
    return g_ticks.fetch_add(1'000'000) + 1'000'000;
}

TEST(page_pool, auto_takes_huge_chunks_where_they_cost_less)
{
    chunk_policy policy(one_ms_per_reading, thp_on);
    memory_budget budget;
    page_pool pool(-1, budget, 64 * k_mib, huge_page_mode::automatic, policy);
    nlohmann::json chunks;
    pool.describe(chunks);
    EXPECT_EQ(chunks["kind"], "measuring");
    // Measuring (huge, small, huge, small, huge, small: 9 MiB), then huge.
    EXPECT_EQ(take(pool, 21 * k_mib / k_page).size(), 21 * k_mib / k_page);
    EXPECT_EQ(pool.small_chunks(), 3u);
    EXPECT_EQ(pool.huge_chunks(), 9u);
    EXPECT_EQ(budget.used(), 21 * k_mib);
    pool.describe(chunks);
    EXPECT_EQ(chunks["kind"], "huge") << chunks;
    EXPECT_EQ(chunks["huge_pages"], "auto");
    EXPECT_EQ(chunks["huge_populate_us_per_mib"], 500.0);
    EXPECT_EQ(chunks["small_populate_us_per_mib"], 1000.0);
    EXPECT_EQ(chunks["why"],
              "huge: populating costs 0.50 ms per MiB in huge pages against 1.00 ms in small ones "
              "(medians of the last 3 chunks of each); huge pages while at most 1.5 times");
}

// A policy that found huge pages 50 ms per MiB (a host faulting them in)
// and small ones 0.25 ms.
void measure_slow_huge_pages(chunk_policy& policy)
{
    for (int i = 0; i < 3; ++i) {
        policy.record(chunk_kind::huge, k_huge, 100'000'000);
        policy.record(chunk_kind::small, k_mib, 250'000);
    }
}

TEST(page_pool, auto_takes_small_chunks_where_huge_ones_are_slow)
{
    chunk_policy policy(nullptr, thp_on);
    measure_slow_huge_pages(policy);
    ASSERT_EQ(policy.snapshot().decided, chunk_kind::small);
    memory_budget budget;
    page_pool pool(-1, budget, 64 * k_mib, huge_page_mode::automatic, policy);
    int error = 0;
    ASSERT_NE(pool.allocate(error), nullptr);
    EXPECT_EQ(budget.used(), k_mib);  // a chunk is charged whole
    const std::vector<char*> pages = take(pool, 8 * k_mib / k_page - 1);
    ASSERT_EQ(pages.size(), 8 * k_mib / k_page - 1);
    EXPECT_EQ(pool.small_chunks(), 8u);
    EXPECT_EQ(pool.huge_chunks(), 0u);
    EXPECT_EQ(mapping_of(pages.front()).huge_kib, 0u);
    // Each of them told the policy what it cost (this machine's clock).
    EXPECT_EQ(policy.snapshot().small_samples, 11u);
    nlohmann::json chunks;
    pool.describe(chunks);
    EXPECT_EQ(chunks["kind"], "small") << chunks;
    EXPECT_EQ(chunks["huge_populate_us_per_mib"], 50000.0);
    EXPECT_NE(chunks["why"].get<std::string>().find("50.00 ms per MiB in huge pages"),
              std::string::npos)
        << chunks;
}

TEST(page_pool, huge_pages_0_and_1_override_what_was_measured)
{
    chunk_policy policy(nullptr, thp_on);
    measure_slow_huge_pages(policy);
    memory_budget budget;
    page_pool pool(-1, budget, 64 * k_mib, huge_page_mode::on, policy);
    EXPECT_EQ(take(pool, 4 * k_mib / k_page).size(), 4 * k_mib / k_page);
    EXPECT_EQ(pool.huge_chunks(), 2u);
    EXPECT_EQ(pool.small_chunks(), 0u);
    nlohmann::json chunks;
    pool.describe(chunks);
    EXPECT_EQ(chunks["kind"], "huge");
    EXPECT_EQ(chunks["why"], "huge: huge_pages=1");
    pool.set_mode(huge_page_mode::off);
    EXPECT_EQ(take(pool, 2 * k_mib / k_page).size(), 2 * k_mib / k_page);
    EXPECT_EQ(pool.huge_chunks(), 2u);
    EXPECT_EQ(pool.small_chunks(), 2u);
    pool.describe(chunks);
    EXPECT_EQ(chunks["kind"], "small");
    EXPECT_EQ(chunks["huge_pages"], "0");
    // Chosen, not measured: the policy's figures are as they were.
    EXPECT_EQ(policy.snapshot().huge_samples, 3u);
    EXPECT_EQ(policy.snapshot().small_samples, 3u);
}

// A clock whose first reading after `g_pool_slow` is set sleeps: the chunk
// populated then takes 300 ms, as a host's faults can make it.
std::atomic<bool> g_pool_slow{false};
std::atomic<bool> g_pool_in_population{false};
uint64_t pool_slow_once()
{
    if (g_pool_slow.exchange(false)) {
        g_pool_in_population = true;
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
    return static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
}

TEST(page_pool, a_slow_population_holds_no_lock_and_is_shared)
{
    chunk_policy policy(pool_slow_once, thp_on);
    memory_budget budget;
    page_pool pool(-1, budget, 16 * k_mib, huge_page_mode::off, policy);
    std::vector<char*> pages = take(pool, k_mib / k_page);  // no page ready now
    ASSERT_EQ(pages.size(), k_mib / k_page);
    g_pool_in_population = false;
    g_pool_slow = true;
    char* populated = nullptr;
    std::thread populating([&] {
        int error = 0;
        populated = static_cast<char*>(pool.allocate(error));
    });
    while (!g_pool_in_population) {
        std::this_thread::yield();
    }
    // Meanwhile the pool serves what does not need the new chunk at once.
    const auto start = std::chrono::steady_clock::now();
    pool.free(pages.back());
    int error = 0;
    EXPECT_EQ(pool.try_allocate(error), pages.back());
    EXPECT_EQ(pool.try_allocate(error), nullptr);
    EXPECT_EQ(error, page_pool::k_must_populate);
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(150))
        << "the pool's mutex was held while a chunk was populated";
    // A writer that needs a page waits for that chunk instead of
    // populating (and charging) one of its own.
    char* waited = static_cast<char*>(pool.allocate(error));
    populating.join();
    ASSERT_NE(populated, nullptr);
    ASSERT_NE(waited, nullptr);
    EXPECT_GE(waited, populated);
    EXPECT_LT(waited, populated + k_mib);
    EXPECT_EQ(pool.small_chunks(), 2u);
    EXPECT_EQ(budget.used(), 2 * k_mib);
}

TEST(page_pool, refill_makes_as_many_pages_ready_as_asked)
{
    // A write_from run needs all its new pages under its locks at once: 3
    // left in the chunk and 64 wanted populate a chunk (the 3 go on the
    // free list first), after which all 64 come without populating; as
    // many as are ready already populate nothing.
    chunk_policy policy(nullptr, thp_off);
    memory_budget budget;
    page_pool pool(-1, budget, 64 * k_mib, huge_page_mode::off, policy);
    const std::vector<char*> used = take(pool, k_mib / k_page - 3);
    ASSERT_EQ(pool.small_chunks(), 1u);
    EXPECT_EQ(pool.refill(3), 0);
    EXPECT_EQ(pool.small_chunks(), 1u) << "3 pages were ready";
    EXPECT_EQ(pool.refill(64), 0);
    EXPECT_EQ(pool.small_chunks(), 2u);
    std::set<void*> got;
    for (int i = 0; i < 64; ++i) {
        int error = 0;
        void* p = pool.try_allocate(error);
        ASSERT_NE(p, nullptr) << i << ": error " << error;
        got.insert(p);
    }
    EXPECT_EQ(got.size(), 64u);
    EXPECT_EQ(pool.small_chunks(), 2u);
    EXPECT_EQ(pool.resident_pages(), 2 * k_mib / k_page);
    EXPECT_EQ(budget.used(), 2 * k_mib);
    for (void* p : used) {
        EXPECT_EQ(got.count(p), 0u) << "a page in use was given again";
    }
}

}  // namespace
