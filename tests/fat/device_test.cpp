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

}  // namespace
