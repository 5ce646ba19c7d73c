// The FAT library on a softblk device (null target, memory_backed=1)
// through the consumer API adapter.
#include "fat_test_util.hpp"

#include <softblk/fat/softblk_adapter.hpp>

using namespace fat_test;

namespace {

TEST(FatOnSoftblkDevice, FormatWriteRemountRead)
{
    std::vector<std::string> opts = {"memory_backed=1", "size=64", "bs=512"};
    auto dev = softblk_block_device::create("fat-test", "null", opts);
    ASSERT_TRUE(dev.has_value()) << dev.error().message;
    ASSERT_TRUE(format(**dev).has_value());
    std::mt19937_64 rng(11);
    std::string data = random_bytes(rng, 3u << 20);
    {
        auto v = volume::mount(**dev);
        ASSERT_TRUE(v.has_value()) << v.error().message;
        ASSERT_TRUE((*v)->mkdir("/d").has_value());
        write_all(**v, "/d/A Long Name.bin", data);
        auto f = (*v)->open("/d/A Long Name.bin", k_open_read | k_open_write);
        ASSERT_TRUE(f.has_value());
        EXPECT_EQ(f->fsync(), 0);
        ASSERT_TRUE((*v)->unmount().has_value());
    }
    EXPECT_GE((*dev)->counters().flushes, 1u);
    auto v = volume::mount(**dev);
    ASSERT_TRUE(v.has_value());
    EXPECT_FALSE((*v)->statfs()->was_dirty);
    EXPECT_EQ(read_all(**v, "/d/a long name.bin"), data);
}

// Whether sequential writes are gathered is measured, not looked up by
// target type: a request of an in-memory null device costs less than
// copying a 16 KiB write, one that completes 50 us late costs more.
TEST(FatOnSoftblkDevice, GathersWritesOnlyWhereARequestCostsMoreThanACopy)
{
    std::vector<std::string> memory = {"memory_backed=1", "size=16"};
    auto fast = softblk_block_device::create("fat-fast", "null", memory);
    ASSERT_TRUE(fast.has_value()) << fast.error().message;
    EXPECT_EQ((*fast)->write_gather_bytes(), 0u);

    std::vector<std::string> delayed = {"memory_backed=1", "size=16", "irqmode=2",
                                        "completion_nsec=50000"};
    auto slow = softblk_block_device::create("fat-slow", "null", delayed);
    ASSERT_TRUE(slow.has_value()) << slow.error().message;
    EXPECT_EQ((*slow)->write_gather_bytes(), 1u << 20);
    // The answer is kept: a second mount does not measure again.
    auto submitted = [&] {
        uint64_t n = 0;
        for (unsigned q = 0; q < (*slow)->device().queue_count(); ++q) {
            n += (*slow)->device().queue(q).stats().submitted;
        }
        return n;
    };
    uint64_t before = submitted();
    EXPECT_GT(before, 0u);
    EXPECT_EQ((*slow)->write_gather_bytes(), 1u << 20);
    EXPECT_EQ(submitted(), before);
}

}  // namespace
