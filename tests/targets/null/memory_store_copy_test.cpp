// How the memory store copies writes into its pages (core/stream_copy.hpp,
// core/copy_mode_chooser.hpp): first streaming stores for a store of at least
// twice the last-level cache and cached ones below, then whichever the
// trials timed cheaper; the same data either way.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include <softblk/memory_store.hpp>

#include "core/copy_mode_chooser.hpp"
#include "core/stream_copy.hpp"

using softblk::k_mib;
using softblk::memory_store;

namespace {

std::unique_ptr<memory_store> make_copy_store(uint64_t capacity, uint32_t block_size,
                                              uint64_t cache_bytes)
{
    return memory_store::create({.capacity_bytes = capacity,
                                 .block_size = block_size,
                                 .huge_pages = softblk::huge_page_mode::off,
                                 .cache_bytes = cache_bytes});
}

std::string copy_kind_of(const memory_store& s)
{
    nlohmann::json j;
    softblk::describe_memory_store(s, j);
    EXPECT_FALSE(j["writes"]["why"].get<std::string>().empty());
    return j["writes"]["copy"].get<std::string>();
}

}  // namespace

TEST(memory_store_copy, a_store_twice_the_cache_first_streams_and_a_smaller_one_does_not)
{
    const std::string large = softblk::core::k_can_stream ? "streaming" : "cached";
    EXPECT_EQ(copy_kind_of(*make_copy_store(8 * k_mib, 4096, 4 * k_mib)), large);
    EXPECT_EQ(copy_kind_of(*make_copy_store(8 * k_mib, 4096, 4 * k_mib + 4096)), "cached");
    EXPECT_EQ(copy_kind_of(*make_copy_store(8 * k_mib, 4096, 16 * k_mib)), "cached");
    // The choice itself: an unknown cache never streams.
    EXPECT_FALSE(softblk::core::choose_copy(uint64_t{1} << 40, 0).streaming);
    EXPECT_EQ(softblk::core::choose_copy(2 * k_mib, k_mib).streaming, softblk::core::k_can_stream);
}

namespace {

using softblk::core::copy_mode_chooser;

// Runs `samples` samples through `c`, the copies of a page timed at
// `ns_per_kib[streaming]`; returns the modes the samples were planned in
// ('s' streaming, 'c' cached; upper case when timed).
std::string run_samples(copy_mode_chooser& c, uint64_t samples, const double (&ns_per_kib)[2])
{
    std::string modes;
    for (uint64_t i = 0; i < samples; ++i) {
        const copy_mode_chooser::sample_plan plan = c.next_sample();
        char mode = plan.streaming ? 's' : 'c';
        if (plan.timed) {
            c.timed(plan.streaming, static_cast<uint64_t>(ns_per_kib[plan.streaming] * 4), 4096);
            mode = static_cast<char>(mode - 'a' + 'A');
        }
        modes += mode;
    }
    return modes;
}

// The same mode `n` times.
std::string times(uint64_t n, char mode)
{
    return std::string(n, mode);
}

}  // namespace

// A trial tries the other mode, then the one in use, each warmed up before
// it is timed; the cheaper wins (the sample after the trial decides), and
// the next trial comes after k_first_exploit samples when the choice
// changed.
TEST(copy_mode_chooser, a_trial_times_both_modes_and_keeps_the_cheaper)
{
    if (!softblk::core::k_can_stream) {
        GTEST_SKIP() << "this build has no streaming stores (x86-64 only)";
    }
    constexpr uint64_t w = copy_mode_chooser::k_warm_samples;
    constexpr uint64_t t = copy_mode_chooser::k_timed_samples;
    copy_mode_chooser c({.streaming = false, .why = "a guess"});
    EXPECT_FALSE(c.streaming());
    const double streaming_cheaper[2] = {100, 50};
    EXPECT_EQ(run_samples(c, 2 * (w + t), streaming_cheaper),
              times(w, 's') + times(t, 'S') + times(w, 'c') + times(t, 'C'));
    EXPECT_EQ(run_samples(c, copy_mode_chooser::k_first_exploit, streaming_cheaper),
              times(copy_mode_chooser::k_first_exploit, 's'));
    nlohmann::json j;
    c.describe(j);
    EXPECT_EQ(j["copy"], "streaming");
    EXPECT_EQ(j["trials"], 1);
    EXPECT_FALSE(j["in_trial"].get<bool>());
    EXPECT_NEAR(j["ns_per_kib"]["cached"].get<double>(), 100, 1);
    EXPECT_NEAR(j["ns_per_kib"]["streaming"].get<double>(), 50, 1);
    EXPECT_NE(j["why"].get<std::string>().find("streaming chosen"), std::string::npos) << j;

    // The next trial tries cached first; where it became cheaper, it wins.
    const double cached_cheaper[2] = {40, 50};
    EXPECT_EQ(run_samples(c, 2 * (w + t), cached_cheaper),
              times(w, 'c') + times(t, 'C') + times(w, 's') + times(t, 'S'));
    EXPECT_EQ(run_samples(c, 1, cached_cheaper), "c");
    c.describe(j);
    EXPECT_EQ(j["trials"], 2);
}

// The mode in use stays unless the other is cheaper by the margin, and
// each trial that keeps it doubles the spell before the next, up to
// k_max_exploit.
TEST(copy_mode_chooser, a_kept_mode_waits_twice_as_long_for_the_next_trial)
{
    if (!softblk::core::k_can_stream) {
        GTEST_SKIP() << "this build has no streaming stores (x86-64 only)";
    }
    constexpr uint64_t trial =
        2 * (copy_mode_chooser::k_warm_samples + copy_mode_chooser::k_timed_samples);
    copy_mode_chooser c({.streaming = true, .why = "a guess"});
    const double nearly_level[2] = {98, 100};  // cached 2% cheaper
    uint64_t spell = copy_mode_chooser::k_first_exploit;
    for (int i = 0; i < 8; ++i) {
        ASSERT_EQ(run_samples(c, trial, nearly_level).back(), 'S') << "trial " << i;
        spell = std::min(spell * 2, copy_mode_chooser::k_max_exploit);
        EXPECT_EQ(run_samples(c, spell, nearly_level), times(spell, 's')) << "after trial " << i;
    }
    nlohmann::json j;
    c.describe(j);
    EXPECT_EQ(j["copy"], "streaming");
    EXPECT_EQ(j["trials"], 8);
    EXPECT_NE(j["why"].get<std::string>().find("streaming kept"), std::string::npos) << j;
    EXPECT_EQ(spell, copy_mode_chooser::k_max_exploit);
}

// Outside trials the store counts one sample in k_exploit_stride as that
// many (fewer writes to the count its writers share): the next trial still
// comes after the same number of samples.
TEST(copy_mode_chooser, weighted_samples_bring_the_next_trial_on_time)
{
    if (!softblk::core::k_can_stream) {
        GTEST_SKIP() << "this build has no streaming stores (x86-64 only)";
    }
    constexpr uint64_t trial =
        2 * (copy_mode_chooser::k_warm_samples + copy_mode_chooser::k_timed_samples);
    constexpr uint64_t stride = copy_mode_chooser::k_exploit_stride;
    copy_mode_chooser c({.streaming = false, .why = "a guess"});
    const double level[2] = {100, 100};
    run_samples(c, trial, level);
    // The trial kept the mode: the spell is twice k_first_exploit.
    for (uint64_t i = 0; i < copy_mode_chooser::k_first_exploit * 2 / stride; ++i) {
        const copy_mode_chooser::sample_plan plan = c.next_sample(stride);
        ASSERT_FALSE(plan.timed) << "sample " << i * stride;
        ASSERT_FALSE(plan.streaming) << "sample " << i * stride;
    }
    // The trial starts with the next sample: the other mode, warming up.
    EXPECT_TRUE(c.next_sample(stride).streaming);
}

// A sample timed in the mode its phase no longer tries (planned just before
// the phase ended, from another thread) is not counted: a trial whose
// timed copies all came too late keeps the mode in use.
TEST(copy_mode_chooser, a_trial_without_timings_keeps_the_mode)
{
    if (!softblk::core::k_can_stream) {
        GTEST_SKIP() << "this build has no streaming stores (x86-64 only)";
    }
    copy_mode_chooser c({.streaming = false, .why = "a guess"});
    for (uint64_t i = 0;
         i < 2 * (copy_mode_chooser::k_warm_samples + copy_mode_chooser::k_timed_samples); ++i) {
        const copy_mode_chooser::sample_plan plan = c.next_sample();
        if (plan.timed) {
            c.timed(!plan.streaming, 1, 4096);  // the wrong mode for the phase
        }
    }
    c.next_sample();  // decides
    EXPECT_FALSE(c.streaming());
    nlohmann::json j;
    c.describe(j);
    EXPECT_NE(j["why"].get<std::string>().find("timed no copy"), std::string::npos) << j;
    EXPECT_FALSE(j.contains("ns_per_kib"));
}

TEST(memory_store_copy, stream_copy_copies_any_alignment)
{
    alignas(64) char src[4096 + 64];
    alignas(64) char dst[4096 + 64];
    for (size_t i = 0; i < sizeof(src); ++i) {
        src[i] = static_cast<char>(i * 7 + 1);
    }
    // Streamed (dst and length multiples of 64, src not), then the
    // fallbacks (dst or length not).
    const struct {
        size_t dst_at, src_at, n;
    } cases[] = {{0, 3, 4096}, {64, 17, 512}, {8, 0, 512}, {0, 5, 100}};
    for (const auto& c : cases) {
        std::memset(dst, 0, sizeof(dst));
        softblk::core::stream_copy(dst + c.dst_at, src + c.src_at, c.n);
        softblk::core::stream_fence();
        EXPECT_EQ(std::memcmp(dst + c.dst_at, src + c.src_at, c.n), 0) << c.dst_at << " " << c.n;
        for (size_t i = 0; i < sizeof(dst); ++i) {
            if (i < c.dst_at || i >= c.dst_at + c.n) {
                ASSERT_EQ(dst[i], 0) << "byte " << i << " outside the copy";
            }
        }
    }
}

// Writes of 512-byte blocks from unaligned buffers, partial pages,
// discards and zeroes on a streaming store against a plain copy of what it
// should hold.
TEST(memory_store_copy, streaming_writes_read_back_as_written)
{
    constexpr uint64_t k_capacity = 4 * k_mib;
    auto store = make_copy_store(k_capacity, 512, k_capacity / 4);
    memory_store& s = *store;
    std::vector<char> model(k_capacity, 0);
    std::vector<char> buf(64 * 1024 + 64);
    std::mt19937_64 rng(7);
    for (int i = 0; i < 2000; ++i) {
        const uint64_t blocks = 1 + rng() % 128;
        const uint64_t offset = (rng() % (k_capacity / 512 - blocks + 1)) * 512;
        const uint64_t length = blocks * 512;
        const unsigned kind = static_cast<unsigned>(rng() % 8);
        if (kind < 5) {
            char* src = buf.data() + rng() % 64;  // any alignment
            for (uint64_t b = 0; b < length; ++b) {
                src[b] = static_cast<char>(rng());
            }
            ASSERT_EQ(s.write(offset, src, length), 0);
            std::memcpy(model.data() + offset, src, length);
        } else if (kind == 5) {
            s.discard(offset, length);
            std::memset(model.data() + offset, 0, length);
        } else if (kind == 6) {
            ASSERT_EQ(s.write_zeroes(offset, length, true), 0);
            std::memset(model.data() + offset, 0, length);
        } else {
            std::vector<char> got(length);
            s.read(offset, got.data(), length);
            ASSERT_EQ(std::memcmp(got.data(), model.data() + offset, length), 0)
                << "at " << offset << ", " << length << " bytes";
        }
    }
    std::vector<char> all(k_capacity);
    s.read(0, all.data(), k_capacity);
    EXPECT_EQ(all, model);
}

// A reader that takes a page after a streaming writer let it go sees the
// whole of one write, never part of it (the page's lock covers the
// streamed copy). The fence before the unlock rests on x86's ordering
// rules (streaming stores may pass later stores): without it this test
// still passed 10 times out of 10 on the test machine, whose
// write-combining buffers drain faster than a reader gets the lock.
TEST(memory_store_copy, a_reader_never_sees_part_of_a_streamed_page)
{
    constexpr uint64_t k_capacity = 4 * k_mib;
    constexpr uint64_t k_pages = 16;
    auto store = make_copy_store(k_capacity, 4096, k_capacity / 4);
    memory_store& s = *store;
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> torn{0};
    std::thread reader([&] {
        std::vector<char> page(4096);
        while (!stop.load(std::memory_order_relaxed)) {
            for (uint64_t p = 0; p < k_pages; ++p) {
                s.read(p * 4096, page.data(), 4096);
                for (size_t i = 1; i < page.size(); ++i) {
                    if (page[i] != page[0]) {
                        torn.fetch_add(1, std::memory_order_relaxed);
                        break;
                    }
                }
            }
        }
    });
    std::vector<char> src(4096);
    for (int round = 0; round < 20000; ++round) {
        std::memset(src.data(), round & 0x7f, src.size());
        ASSERT_EQ(s.write((round % k_pages) * 4096, src.data(), src.size()), 0);
    }
    stop.store(true);
    reader.join();
    EXPECT_EQ(torn.load(), 0u);
}

// Two writers on pages of their own take the store through its trials (the
// samples of both drive them) while a third thread reads describe: every
// page then holds its writer's last write, whichever mode copied it.
TEST(memory_store_copy, writers_on_several_threads_share_the_trials)
{
    constexpr uint64_t k_pages = 1024;
    auto store = make_copy_store(k_pages * 4096, 4096, k_mib);
    memory_store& s = *store;
    std::vector<uint8_t> last(k_pages, 0);  // each page's last byte value
    auto writer = [&](uint64_t parity) {
        std::mt19937_64 rng(parity + 1);
        std::vector<char> page(4096);
        for (int i = 0; i < 40'000; ++i) {
            const uint64_t p = (rng() % (k_pages / 2)) * 2 + parity;
            const auto value = static_cast<uint8_t>(1 + rng() % 255);
            std::memset(page.data(), value, page.size());
            ASSERT_EQ(s.write(p * 4096, page.data(), page.size()), 0);
            last[p] = value;
        }
    };
    std::atomic<bool> stop{false};
    std::thread observer([&] {
        while (!stop.load()) {
            nlohmann::json j;
            softblk::describe_memory_store(s, j);
            ASSERT_TRUE(j["writes"].contains("trials"));
        }
    });
    std::thread even(writer, 0);
    std::thread odd(writer, 1);
    even.join();
    odd.join();
    stop.store(true);
    observer.join();
    nlohmann::json j;
    softblk::describe_memory_store(s, j);
    if (softblk::core::k_can_stream) {
        EXPECT_GE(j["writes"]["trials"].get<unsigned>(), 1u) << j["writes"];
    }
    std::vector<char> page(4096);
    for (uint64_t p = 0; p < k_pages; ++p) {
        s.read(p * 4096, page.data(), page.size());
        ASSERT_EQ(std::vector<char>(page.size(), static_cast<char>(last[p])), page) << "page " << p;
    }
}
