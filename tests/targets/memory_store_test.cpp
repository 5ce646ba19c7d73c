// The memory store on its own: sparseness, block granularity, memory
// accounting, the allocation map and concurrent use.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "core/memory_store.hpp"

using softblk::extent;
using softblk::core::memory_store;

namespace {

constexpr uint64_t k_tib = uint64_t{1} << 40;

TEST(memory_store, an_empty_terabyte_costs_almost_nothing)
{
    memory_store s(k_tib, 4096);
    EXPECT_LT(s.memory_bytes(), 64u << 10);
    std::vector<char> b(4096, 'x');
    s.read(k_tib - 4096, b.data(), 4096);
    EXPECT_TRUE(std::all_of(b.begin(), b.end(), [](char c) { return c == 0; }));
    EXPECT_LT(s.memory_bytes(), 64u << 10);  // reading allocates nothing
}

TEST(memory_store, memory_follows_the_data_written)
{
    memory_store s(k_tib, 4096);
    std::vector<char> mib(1 << 20, 'm');
    for (int i = 0; i < 8; ++i) {
        ASSERT_EQ(s.write(uint64_t(i) << 30, mib.data(), mib.size()), 0);  // 8 MiB, 1 GiB apart
    }
    EXPECT_EQ(s.data_page_bytes(), 8u << 20);
    EXPECT_GE(s.memory_bytes(), 8u << 20);
    EXPECT_LT(s.memory_bytes(), (8u << 20) + (1u << 20));
    s.discard(0, uint64_t{8} << 30);
    EXPECT_EQ(s.data_page_bytes(), 0u);
    EXPECT_LT(s.memory_bytes(), 1u << 20);
}

TEST(memory_store, blocks_of_a_page_are_independent)
{
    memory_store s(1 << 20, 512);
    std::vector<char> a(512, 'a');
    ASSERT_EQ(s.write(1024, a.data(), 512), 0);
    std::vector<char> page(4096, 'x');
    s.read(0, page.data(), 4096);
    for (int b = 0; b < 8; ++b) {
        const char want = b == 2 ? 'a' : 0;
        EXPECT_TRUE(std::all_of(page.begin() + b * 512, page.begin() + (b + 1) * 512, [&](char c) {
            return c == want;
        })) << b;
    }
    ASSERT_EQ(s.write(0, page.data(), 4096), 0);  // zeros and 'a': the whole page now
    s.discard(1024, 512);
    EXPECT_EQ(s.data_page_bytes(), 4096u);
    s.discard(0, 1024);
    s.discard(1536, 4096 - 1536);
    EXPECT_EQ(s.data_page_bytes(), 0u);
}

TEST(memory_store, write_zeroes_keeps_or_frees)
{
    memory_store s(1 << 20, 4096);
    std::vector<char> a(8192, 'a');
    ASSERT_EQ(s.write(0, a.data(), 8192), 0);
    ASSERT_EQ(s.write_zeroes(0, 4096, true), 0);
    ASSERT_EQ(s.write_zeroes(4096, 4096, false), 0);
    EXPECT_EQ(s.data_page_bytes(), 4096u);
    std::vector<char> b(8192, 'x');
    s.read(0, b.data(), 8192);
    EXPECT_TRUE(std::all_of(b.begin(), b.end(), [](char c) { return c == 0; }));
}

TEST(memory_store, map_extents_skips_holes_fast_and_merges)
{
    memory_store s(k_tib, 512);
    std::vector<char> a(4096, 'a');
    ASSERT_EQ(s.write(k_tib / 2, a.data(), 4096), 0);
    ASSERT_EQ(s.write(k_tib / 2 + 4096, a.data(), 512), 0);
    std::vector<extent> out;
    s.map_extents(0, k_tib, out);  // a terabyte: must not walk every page
    ASSERT_EQ(out.size(), 3u);
    EXPECT_EQ(out[0].offset, 0u);
    EXPECT_EQ(out[0].length, k_tib / 2);
    EXPECT_FALSE(out[0].allocated);
    EXPECT_TRUE(out[0].zero);
    EXPECT_EQ(out[1].offset, k_tib / 2);
    EXPECT_EQ(out[1].length, 4608u);
    EXPECT_TRUE(out[1].allocated);
    EXPECT_FALSE(out[1].zero);
    EXPECT_EQ(out[2].offset + out[2].length, k_tib);
    out.clear();
    s.map_extents(k_tib / 2 + 512, 1024, out);
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].length, 1024u);
    out.clear();
    s.map_extents(k_tib + 10, 10, out);
    EXPECT_TRUE(out.empty());
}

TEST(memory_store, small_store_has_one_level)
{
    memory_store s(4096, 4096);
    std::vector<char> a(4096, 'q');
    ASSERT_EQ(s.write(0, a.data(), 4096), 0);
    std::vector<char> b(4096);
    s.read(0, b.data(), 4096);
    EXPECT_EQ(a, b);
    s.clear();
    s.read(0, b.data(), 4096);
    EXPECT_TRUE(std::all_of(b.begin(), b.end(), [](char c) { return c == 0; }));
}

TEST(memory_store, concurrent_writers_readers_and_discards)
{
    memory_store s(64 << 20, 4096);
    std::atomic<bool> bad{false};
    // Two threads own alternate pages (sharing leaf nodes and stripes'
    // neighbours); a third discards and rewrites a region of its own.
    auto owner = [&](unsigned id) {
        std::vector<char> w(4096);
        std::vector<char> r(4096);
        for (unsigned round = 0; round < 30 && !bad; ++round) {
            for (unsigned p = id; p < 2048; p += 2) {
                std::memset(w.data(), static_cast<int>((p + round) & 0xff), 4096);
                if (s.write(uint64_t{p} * 4096, w.data(), 4096) != 0) {
                    bad = true;
                }
                s.read(uint64_t{p} * 4096, r.data(), 4096);
                if (r != w) {
                    bad = true;
                }
            }
        }
    };
    auto churn = [&] {
        std::vector<char> w(65536, 'c');
        for (int i = 0; i < 300 && !bad; ++i) {
            const uint64_t off = (uint64_t{32} << 20) + uint64_t(i % 16) * 65536;
            if (s.write(off, w.data(), w.size()) != 0) {
                bad = true;
            }
            s.discard(off, w.size());
        }
    };
    std::thread a(owner, 0), b(owner, 1), c(churn);
    a.join();
    b.join();
    c.join();
    EXPECT_FALSE(bad);
    EXPECT_EQ(s.data_page_bytes(), 2048u * 4096);
}

}  // namespace
