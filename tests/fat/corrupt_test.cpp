// Corrupt images give clear errors: never a crash, a hang or a huge
// allocation. Hand-made damage first, then random byte flips.
#include "fat_test_util.hpp"

#include <cerrno>
#include <functional>

#include "image_layout.hpp"
#include "layout.hpp"

using namespace fat_test;
using namespace softblk::fat::detail;

namespace {

// A FAT16 image with /file.bin (3 clusters), /dir/inner.txt.
std::unique_ptr<memory_block_device> sample()
{
    auto dev = formatted(16u << 20, fat_type::fat16, 2048);
    auto v = volume::mount(*dev);
    EXPECT_TRUE(v.has_value());
    write_all(**v, "/file.bin", std::string(5000, 'f'));
    EXPECT_TRUE((*v)->mkdir("/dir").has_value());
    write_all(**v, "/dir/inner.txt", "inner");
    EXPECT_TRUE((*v)->unmount().has_value());
    return dev;
}

void set_fat16(std::vector<uint8_t>& img, uint32_t cluster, uint16_t value)
{
    auto l = layout_of(img);
    for (uint32_t i = 0; i < l.fats; ++i) {
        put16(&img[(l.reserved + uint64_t{i} * l.fat_size) * l.bps + cluster * 2], value);
    }
}

// Root-directory short entry whose name starts with `prefix`.
uint8_t* root_entry(std::vector<uint8_t>& img, const char* prefix)
{
    auto l = layout_of(img);
    uint64_t root = (l.reserved + uint64_t{l.fats} * l.fat_size) * l.bps;
    for (uint32_t i = 0; i < l.root_entries; ++i) {
        uint8_t* e = &img[root + i * 32];
        if (e[11] != 0x0F && std::memcmp(e, prefix, std::strlen(prefix)) == 0) {
            return e;
        }
    }
    return nullptr;
}

TEST(FatCorrupt, LoopInAChainIsAnErrorNotAHang)
{
    auto dev = sample();
    auto& img = dev->bytes();
    uint8_t* e = root_entry(img, "FILE    BIN");
    ASSERT_NE(e, nullptr);
    uint32_t first = le16(e + 26);
    set_fat16(img, first + 2, static_cast<uint16_t>(first));  // last -> first
    auto v = volume::mount(*dev);
    ASSERT_TRUE(v.has_value());
    auto f = (*v)->open("/file.bin", k_open_read | k_open_write);
    ASSERT_TRUE(f.has_value());
    EXPECT_EQ(f->pwrite("x", 1, 10000), -EIO);  // growing walks to the end: the loop is found
    auto p = (*v)->problems();
    ASSERT_FALSE(p.empty());
    EXPECT_NE(p.back().find("loop"), std::string::npos) << p.back();
}

TEST(FatCorrupt, ClusterOutOfRangeAndImpossibleSize)
{
    auto dev = sample();
    auto& img = dev->bytes();
    uint8_t* e = root_entry(img, "FILE    BIN");
    ASSERT_NE(e, nullptr);
    put32(e + 28, 0x7FFFFFFF);  // far more than its 3 clusters
    auto v = volume::mount(*dev, {.read_only = true});
    ASSERT_TRUE(v.has_value());
    std::string buf(1 << 16, '\0');
    auto f = (*v)->open("/file.bin", k_open_read);
    ASSERT_TRUE(f.has_value());
    EXPECT_EQ(f->pread(buf.data(), buf.size(), 0), -EIO);
    auto p = (*v)->problems();
    ASSERT_FALSE(p.empty());
    EXPECT_NE(p.back().find("chain"), std::string::npos) << p.back();
    v->reset();
    put16(e + 26, 0xFFF0);  // first cluster beyond the volume
    v = volume::mount(*dev, {.read_only = true});
    ASSERT_TRUE(v.has_value());
    auto st = (*v)->stat("/file.bin");
    ASSERT_FALSE(st.has_value());
    EXPECT_EQ(st.error().code.value(), EIO);
    EXPECT_NE(st.error().message.find("outside"), std::string::npos) << st.error().message;
}

TEST(FatCorrupt, BrokenNamesFallBackToShortNames)
{
    auto dev = formatted(16u << 20, fat_type::fat16, 2048);
    {
        auto v = volume::mount(*dev);
        write_all(**v, "/A Long Name.txt", "x");
        write_all(**v, "/plain.txt", "y");
        ASSERT_TRUE((*v)->unmount().has_value());
    }
    auto& img = dev->bytes();
    auto l = layout_of(img);
    uint8_t* root = &img[(l.reserved + uint64_t{l.fats} * l.fat_size) * l.bps];
    ASSERT_EQ(root[11], 0x0F);
    root[13] ^= 0xFF;  // LFN checksum no longer matches
    uint8_t* plain = root_entry(img, "PLAIN   TXT");
    ASSERT_NE(plain, nullptr);
    plain[2] = '/';  // a slash inside a short name
    auto v = volume::mount(*dev, {.read_only = true});
    ASSERT_TRUE(v.has_value());
    auto list = (*v)->readdir("/");
    ASSERT_TRUE(list.has_value());
    std::set<std::string> names;
    for (auto& e : *list) {
        names.insert(e.name);
    }
    EXPECT_TRUE(names.count("ALONGN~1.TXT")) << *names.begin();
    EXPECT_TRUE(names.count("pl_in.txt"));
    EXPECT_GE((*v)->problems().size(), 2u);
}

TEST(FatCorrupt, BadBootSectorsGiveActionableMessages)
{
    auto dev = sample();
    auto& img = dev->bytes();
    auto original = img;
    struct damage {
        std::function<void(std::vector<uint8_t>&)> apply;
        std::string expect;
    };
    std::vector<damage> cases = {
        {[](auto& i) { i[510] = 0; }, "no boot signature"},
        {[](auto& i) { put16(&i[11], 384); }, "bytes per sector"},
        {[](auto& i) { i[13] = 3; }, "power of two"},
        {[](auto& i) {
             put16(&i[19], 0);
             put32(&i[32], 0x7FFFFFFF);
         },
         "truncated"},
        {[](auto& i) { i[16] = 0; }, "FATs"},
        {[](auto& i) {
             put16(&i[22], 0);
             put32(&i[36], 0);
         },
         "FAT size is 0"},
    };
    for (auto& c : cases) {
        img = original;
        c.apply(img);
        auto v = volume::mount(*dev);
        ASSERT_FALSE(v.has_value()) << c.expect;
        EXPECT_NE(v.error().message.find(c.expect), std::string::npos) << v.error().message;
    }
}

// Walks everything reachable, reading every file; must terminate.
void walk(volume& v, const std::string& dir, int depth)
{
    if (depth > 8) {
        return;
    }
    auto list = v.readdir(dir);
    if (!list) {
        return;
    }
    for (auto& e : *list) {
        std::string p = dir + (dir == "/" ? "" : "/") + e.name;
        if (e.stat.is_directory) {
            walk(v, p, depth + 1);
        } else {
            auto f = v.open(p, k_open_read);
            if (f) {
                std::string buf(1 << 16, '\0');
                for (uint64_t off = 0; off < (1u << 20); off += buf.size()) {
                    if (f->pread(buf.data(), buf.size(), off) <= 0) {
                        break;
                    }
                }
            }
        }
    }
}

TEST(FatCorrupt, RandomDamageNeverCrashes)
{
    for (fat_type t : {fat_type::fat12, fat_type::fat32}) {
        auto dev = formatted(t == fat_type::fat12 ? 1u << 20 : 34u << 20, t, 512);
        {
            auto v = volume::mount(*dev);
            ASSERT_TRUE(v.has_value());
            ASSERT_TRUE((*v)->mkdir("/d").has_value());
            for (int i = 0; i < 20; ++i) {
                write_all(**v, "/d/file number " + std::to_string(i), std::string(1500 * i, 'x'));
            }
            ASSERT_TRUE((*v)->unmount().has_value());
        }
        auto pristine = dev->bytes();
        auto l = layout_of(pristine);
        uint64_t meta_end = (l.data + 64 * l.spc) * l.bps;  // boot, FATs, root, first clusters
        std::mt19937_64 rng(5);
        for (int round = 0; round < 150; ++round) {
            dev->bytes() = pristine;
            int flips = 1 + static_cast<int>(rng() % 40);
            for (int i = 0; i < flips; ++i) {
                dev->bytes()[rng() % std::min<uint64_t>(meta_end, pristine.size())] =
                    static_cast<uint8_t>(rng());
            }
            auto v = volume::mount(*dev, {.read_only = (round % 2) == 0});
            if (!v) {
                continue;
            }
            walk(**v, "/", 0);
            // Writes on damaged images must fail cleanly too.
            (void)(*v)->mkdir("/newdir");
            if (auto f = (*v)->create("/d/new"); f) {
                (void)f->pwrite("abc", 3, 70000);
            }
            (void)(*v)->unlink("/d/file number 3");
        }
    }
}

}  // namespace
