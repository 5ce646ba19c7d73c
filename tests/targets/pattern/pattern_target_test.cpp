// The pattern target through the in-process API (device::create): its
// geometry, the pattern at any offset and length, the read-only refusals,
// and its options' errors.
#include <softblk/device.hpp>
#include <softblk/target.hpp>

#include <endian.h>

#include <cerrno>
#include <cstring>
#include <gtest/gtest.h>
#include <string>
#include <vector>

using namespace softblk;

namespace {

result<std::unique_ptr<device>> make(std::vector<std::string> args)
{
    return device::create("p0", "pattern", args);
}

// The words of `buffer` (read at device offset `offset`) are their own
// offsets, big-endian; returns the first wrong byte offset or -1.
int64_t first_wrong(const std::vector<unsigned char>& buffer, uint64_t offset)
{
    for (size_t i = 0; i + 8 <= buffer.size(); i += 8) {
        uint64_t word = 0;
        std::memcpy(&word, buffer.data() + i, sizeof(word));
        if (be64toh(word) != offset + i) {
            return static_cast<int64_t>(offset + i);
        }
    }
    return -1;
}

TEST(pattern_target, is_registered_with_its_options)
{
    const target_type* t = find_target_type("pattern");
    ASSERT_NE(t, nullptr);
    std::vector<std::string> names;
    for (const option_def& d : t->options) {
        names.emplace_back(d.name);
    }
    EXPECT_EQ(names, (std::vector<std::string>{"size", "blocksize"}));
}

TEST(pattern_target, geometry_from_the_options)
{
    auto d = make({});
    ASSERT_TRUE(d) << d.error().message;
    EXPECT_EQ((*d)->limits().capacity_bytes, uint64_t{1} << 30);  // size=1G
    EXPECT_EQ((*d)->limits().logical_block_size, 512u);
    EXPECT_TRUE((*d)->limits().read_only);
    EXPECT_EQ((*d)->memory_bytes(), 0u);

    for (const char* bs : {"blocksize=4096", "bs=4096"}) {
        auto b = make({"size=1.5M", bs});
        ASSERT_TRUE(b) << bs << ": " << b.error().message;
        EXPECT_EQ((*b)->limits().capacity_bytes, uint64_t{3} << 19);
        EXPECT_EQ((*b)->limits().logical_block_size, 4096u);
        EXPECT_EQ((*b)->limits().physical_block_size, 4096u);
        EXPECT_EQ((*b)->get_option("size").value(), "1.5M\n");
    }
}

TEST(pattern_target, every_read_holds_its_offsets)
{
    auto d = make({"size=64M"});
    ASSERT_TRUE(d) << d.error().message;
    const uint64_t capacity = uint64_t{64} << 20;
    // Short, long (split by the core: more than max_transfer_bytes) and
    // misaligned buffers, at the start, inside and at the end.
    struct probe {
        uint64_t offset;
        uint32_t length;
        size_t skew;
    };
    for (const probe p : {probe{0, 512, 0}, probe{512, 4096, 3}, probe{12345 * 512, 3 << 20, 1},
                          probe{capacity - 512, 512, 5}, probe{capacity - (1 << 20), 1 << 20, 0}}) {
        std::vector<unsigned char> raw(p.length + p.skew, 0xa5);
        ASSERT_EQ((*d)->execute(io_op::read, p.offset, p.length, raw.data() + p.skew),
                  static_cast<int>(p.length))
            << p.offset;
        std::vector<unsigned char> got(raw.begin() + static_cast<ptrdiff_t>(p.skew), raw.end());
        EXPECT_EQ(first_wrong(got, p.offset), -1) << "read of " << p.length << " at " << p.offset;
    }
    std::vector<unsigned char> b(512);
    EXPECT_EQ((*d)->execute(io_op::read, capacity, 512, b.data()), -EIO);  // past the end
    EXPECT_EQ((*d)->execute(io_op::flush, 0, 0, nullptr), 0);
}

TEST(pattern_target, refuses_what_would_change_it)
{
    auto d = make({"size=1M"});
    ASSERT_TRUE(d) << d.error().message;
    std::vector<unsigned char> b(4096, 0);
    // The core's answer for a read-only device (the block layer's
    // bio_check_ro): EPERM, whatever the target offers.
    EXPECT_EQ((*d)->execute(io_op::write, 0, 4096, b.data()), -EPERM);
    EXPECT_EQ((*d)->execute(io_op::discard, 0, 4096, nullptr), -EPERM);
    EXPECT_EQ((*d)->execute(io_op::write_zeroes, 0, 4096, nullptr), -EPERM);
    ASSERT_EQ((*d)->execute(io_op::read, 0, 4096, b.data()), 4096);
    EXPECT_EQ(first_wrong(b, 0), -1);  // still the pattern
}

TEST(pattern_target, option_errors_say_what_to_give)
{
    struct bad {
        std::vector<std::string> args;
        const char* says;
    };
    for (const bad& c :
         {bad{{"size=1000"}, "multiple of blocksize"}, bad{{"size=0"}, "at least blocksize=512"},
          bad{{"size=1M", "blocksize=3072"}, "512, 1024, 2048 or 4096"},
          bad{{"blocksize=8192"}, "blocksize"}, bad{{"size=12Q"}, "size"}}) {
        auto d = make(c.args);
        ASSERT_FALSE(d) << c.args[0];
        EXPECT_NE(d.error().message.find(c.says), std::string::npos) << d.error().message;
    }
}

}  // namespace
