// POSIX-like semantics of the library on a memory device, and the on-disk
// details a reader relies on (dirty bit, FAT copies in step, "." and "..").
#include "fat_test_util.hpp"

#include <cerrno>
#include <cstring>
#include <set>

#include "layout.hpp"

using namespace fat_test;
using namespace softblk::fat::detail;

namespace {

class FatVolume : public ::testing::TestWithParam<fat_type> {
protected:
    void SetUp() override
    {
        uint64_t size = GetParam() == fat_type::fat12   ? 4u << 20
                        : GetParam() == fat_type::fat16 ? 16u << 20
                                                        : 40u << 20;
        dev = formatted(size, GetParam(), GetParam() == fat_type::fat32 ? 512 : 2048);
        remount();
    }
    void remount()
    {
        if (vol) {
            ASSERT_TRUE(vol->unmount().has_value());
            vol.reset();
        }
        auto v = volume::mount(*dev);
        ASSERT_TRUE(v.has_value()) << v.error().message;
        vol = std::move(*v);
    }
    int code(const softblk::result<void>& r) { return r ? 0 : r.error().code.value(); }

    std::unique_ptr<memory_block_device> dev;
    std::unique_ptr<volume> vol;
};

TEST_P(FatVolume, CreateWriteReadAtAnyOffset)
{
    auto f = vol->create("/a.bin");
    ASSERT_TRUE(f.has_value());
    std::string data = "0123456789";
    ASSERT_EQ(f->pwrite(data.data(), data.size(), 0), 10);
    // Growth past the end reads back as zeros.
    ASSERT_EQ(f->pwrite("XY", 2, 100000), 2);
    EXPECT_EQ(f->size(), 100002u);
    std::string all = read_all(*vol, "/a.bin");
    ASSERT_EQ(all.size(), 100002u);
    EXPECT_EQ(all.substr(0, 10), data);
    EXPECT_EQ(all.substr(10, 99990), std::string(99990, '\0'));
    EXPECT_EQ(all.substr(100000), "XY");
    // Overwrite in the middle, unaligned, across clusters.
    std::string mid(5000, 'm');
    ASSERT_EQ(f->pwrite(mid.data(), mid.size(), 1234), 5000);
    f->close();
    remount();
    all = read_all(*vol, "/A.BIN");  // case-insensitive lookup
    EXPECT_EQ(all.substr(1234, 5000), mid);
    EXPECT_EQ(all.substr(0, 10), data);
    EXPECT_EQ(all[6234], '\0');
}

TEST_P(FatVolume, TruncateBothWays)
{
    write_all(*vol, "/t", std::string(10000, 'a'));
    ASSERT_TRUE(vol->truncate("/t", 3000).has_value());
    ASSERT_TRUE(vol->truncate("/t", 9000).has_value());
    std::string all = read_all(*vol, "/t");
    ASSERT_EQ(all.size(), 9000u);
    EXPECT_EQ(all.substr(0, 3000), std::string(3000, 'a'));
    EXPECT_EQ(all.substr(3000), std::string(6000, '\0'));
    ASSERT_TRUE(vol->truncate("/t", 0).has_value());
    EXPECT_EQ(vol->stat("/t")->first_cluster, 0u);
    EXPECT_EQ(vol->stat("/t")->size, 0u);
}

TEST_P(FatVolume, DirectoriesAndRename)
{
    ASSERT_TRUE(vol->mkdir("/d1").has_value());
    ASSERT_TRUE(vol->mkdir("/d1/sub").has_value());
    ASSERT_TRUE(vol->mkdir("/d2").has_value());
    EXPECT_EQ(code(vol->mkdir("/d1")), EEXIST);
    write_all(*vol, "/d1/sub/file.txt", "hello");
    EXPECT_EQ(code(vol->rmdir("/d1")), ENOTEMPTY);
    // Move a directory across directories: its ".." must follow.
    ASSERT_TRUE(vol->rename("/d1/sub", "/d2/moved").has_value());
    EXPECT_EQ(read_all(*vol, "/d2/moved/file.txt"), "hello");
    EXPECT_EQ(code(vol->rename("/d2", "/d2/moved/x")), EINVAL);
    // A file replaces a file; a directory replaces an empty directory.
    write_all(*vol, "/x", "new");
    write_all(*vol, "/y", "old");
    ASSERT_TRUE(vol->rename("/x", "/y").has_value());
    EXPECT_EQ(read_all(*vol, "/y"), "new");
    EXPECT_FALSE(vol->stat("/x").has_value());
    EXPECT_EQ(code(vol->rename("/y", "/d1")), EISDIR);
    ASSERT_TRUE(vol->rename("/d1", "/d3").has_value());
    // Case-only rename in place.
    ASSERT_TRUE(vol->rename("/y", "/Y").has_value());
    auto list = vol->readdir("/");
    ASSERT_TRUE(list.has_value());
    bool found = false;
    for (auto& e : *list) {
        found |= e.name == "Y";
    }
    EXPECT_TRUE(found);
    remount();
    EXPECT_EQ(read_all(*vol, "/d2/moved/file.txt"), "hello");
    ASSERT_TRUE(vol->unlink("/d2/moved/file.txt").has_value());
    ASSERT_TRUE(vol->rmdir("/d2/moved").has_value());
    EXPECT_EQ(code(vol->unlink("/d2")), EISDIR);
    EXPECT_EQ(code(vol->rmdir("/Y")), ENOTDIR);
    EXPECT_EQ(code(vol->unlink("/nope")), ENOENT);
}

TEST_P(FatVolume, DotEntriesAsTheSpecWants)
{
    ASSERT_TRUE(vol->mkdir("/top").has_value());
    ASSERT_TRUE(vol->mkdir("/top/inner").has_value());
    auto top = vol->stat("/top");
    auto inner = vol->stat("/top/inner");
    ASSERT_TRUE(top && inner);
    ASSERT_TRUE(vol->unmount().has_value());
    vol.reset();
    auto& img = dev->bytes();
    uint32_t bps = le16(&img[11]);
    uint32_t spc = img[13];
    uint32_t reserved = le16(&img[14]);
    uint32_t fats = img[16];
    uint32_t root_entries = le16(&img[17]);
    uint32_t fat_size = le16(&img[22]) != 0 ? le16(&img[22]) : le32(&img[36]);
    uint64_t data = reserved + uint64_t{fats} * fat_size + (root_entries * 32 + bps - 1) / bps;
    auto entry = [&](uint32_t cluster, int i) {
        return &img[(data + uint64_t{cluster - 2} * spc) * bps + i * 32];
    };
    auto cluster_of = [&](const uint8_t* e) {
        return (GetParam() == fat_type::fat32 ? uint32_t{le16(e + 20)} << 16 : 0) | le16(e + 26);
    };
    const uint8_t* dot = entry(top->first_cluster, 0);
    const uint8_t* dotdot = entry(top->first_cluster, 1);
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(dot), 11), ".          ");
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(dotdot), 11), "..         ");
    EXPECT_EQ(cluster_of(dot), top->first_cluster);
    EXPECT_EQ(cluster_of(dotdot), 0u);  // parent is the root: 0, also on FAT32
    EXPECT_EQ(dot[11] & 0x10, 0x10);
    EXPECT_EQ(cluster_of(entry(inner->first_cluster, 1)), top->first_cluster);
    remount();
}

TEST_P(FatVolume, DirtyBitWhileMountedAndFatCopiesInStep)
{
    auto& img = dev->bytes();
    int state = GetParam() == fat_type::fat32 ? 65 : 37;
    EXPECT_EQ(img[state] & 1, 1) << "dirty bit must be set while mounted";
    for (int i = 0; i < 20; ++i) {
        write_all(*vol, "/f" + std::to_string(i), std::string(3000 * i, 'q'));
    }
    ASSERT_TRUE(vol->unlink("/f3").has_value());
    ASSERT_TRUE(vol->unmount().has_value());
    vol.reset();
    EXPECT_EQ(img[state] & 1, 0) << "dirty bit must be clear after a clean unmount";
    uint32_t bps = le16(&img[11]);
    uint32_t reserved = le16(&img[14]);
    uint32_t fat_size = le16(&img[22]) != 0 ? le16(&img[22]) : le32(&img[36]);
    EXPECT_EQ(0, std::memcmp(&img[uint64_t{reserved} * bps],
                             &img[uint64_t{reserved + fat_size} * bps], uint64_t{fat_size} * bps));
    auto v = volume::mount(*dev, {.read_only = true});
    ASSERT_TRUE(v.has_value());
    EXPECT_FALSE((*v)->statfs()->was_dirty);
    EXPECT_EQ(img[state] & 1, 0) << "a read-only mount leaves the bit alone";
    v->reset();
    remount();
}

TEST_P(FatVolume, LimitsEfbigAndEnospcLeaveNothingHalfWritten)
{
    auto f = vol->create("/big");
    ASSERT_TRUE(f.has_value());
    EXPECT_EQ(f->pwrite("x", 1, 0xFFFFFFFFull), -EFBIG);
    EXPECT_EQ(f->pwrite("x", 1, 0xFFFFFFFEull) == -EFBIG,
              false);  // -ENOSPC here (too small a volume)
    EXPECT_EQ(f->truncate(0x100000000ull), -EFBIG);
    EXPECT_EQ(f->size(), 0u);
    auto before = vol->statfs();
    // Ask for more than is free: nothing may change.
    std::string huge(static_cast<size_t>(before->free_clusters + 1) * before->cluster_size, 'z');
    EXPECT_EQ(f->pwrite(huge.data(), huge.size(), 0), -ENOSPC);
    EXPECT_EQ(f->size(), 0u);
    EXPECT_EQ(vol->statfs()->free_clusters, before->free_clusters);
    // Fill exactly, then a create that needs a directory cluster fails cleanly.
    std::string fits(static_cast<size_t>(before->free_clusters) * before->cluster_size, 'z');
    EXPECT_EQ(f->pwrite(fits.data(), fits.size(), 0), static_cast<int64_t>(fits.size()));
    EXPECT_EQ(vol->statfs()->free_clusters, 0u);
    EXPECT_EQ(vol->mkdir("/nospace").error().code.value(), ENOSPC);
    EXPECT_FALSE(vol->stat("/nospace").has_value());
    f->close();
    remount();
    EXPECT_EQ(read_all(*vol, "/big"), fits);
}

TEST_P(FatVolume, OpenUnlinkedFileKeepsItsDataUntilClose)
{
    write_all(*vol, "/keep", "still here");
    auto free_before = vol->statfs()->free_clusters;
    auto f = vol->open("/keep", k_open_read);
    ASSERT_TRUE(f.has_value());
    ASSERT_TRUE(vol->unlink("/keep").has_value());
    EXPECT_FALSE(vol->stat("/keep").has_value());
    char buf[16] = {};
    EXPECT_EQ(f->pread(buf, sizeof buf, 0), 10);
    EXPECT_EQ(std::string(buf, 10), "still here");
    EXPECT_EQ(vol->statfs()->free_clusters, free_before);
    f->close();
    EXPECT_EQ(vol->statfs()->free_clusters, free_before + 1);
}

TEST_P(FatVolume, ManyFilesInOneDirectoryAndShortNameTails)
{
    // The FAT12/16 root holds 512 slots; a subdirectory grows as needed.
    ASSERT_TRUE(vol->mkdir("/many").has_value());
    for (int i = 0; i < 300; ++i) {
        auto f = vol->create("/many/../many/Long File Name " + std::to_string(i) + ".txt");
        ASSERT_TRUE(f.has_value()) << i << ": " << f.error().message;
    }
    auto list = vol->readdir("/many");
    ASSERT_TRUE(list.has_value());
    EXPECT_EQ(list->size(), 300u);
    std::set<std::string> shorts;
    for (auto& e : *list) {
        EXPECT_TRUE(shorts.insert(e.short_name).second) << e.short_name;
    }
    EXPECT_TRUE(shorts.count("LONGFI~1.TXT"));
    remount();
    EXPECT_EQ(vol->readdir("/many")->size(), 300u);
    EXPECT_TRUE(vol->stat("/many/longfi~1.txt").has_value());  // reachable by its short name
}

TEST_P(FatVolume, TimestampsAreSet)
{
    std::time_t now = std::time(nullptr);
    write_all(*vol, "/ts", "x");
    auto st = vol->stat("/ts");
    ASSERT_TRUE(st.has_value());
    EXPECT_LE(std::abs(st->modified - now), 3);
    EXPECT_LE(std::abs(st->created - now), 3);
    EXPECT_TRUE(st->attributes & k_attr_archive);
    ASSERT_TRUE(vol->set_times("/ts", 1000000000, 1000000000).has_value());
    EXPECT_EQ(vol->stat("/ts")->modified, 1000000000);
}

INSTANTIATE_TEST_SUITE_P(Types, FatVolume,
                         ::testing::Values(fat_type::fat12, fat_type::fat16, fat_type::fat32),
                         [](const auto& case_info) {
                             return "FAT" + std::to_string(static_cast<int>(case_info.param));
                         });

TEST(FatFormat, ClusterSizesLikeMkfsFatAndNever4085)
{
    struct expectation {
        uint64_t mib;
        fat_type type;
        uint32_t cluster;
    };
    // Measured with mkfs.fat 4.2 (dosfstools) on images of these sizes.
    for (auto e :
         {expectation{1, fat_type::fat12, 2048}, expectation{8, fat_type::fat12, 2048},
          expectation{16, fat_type::fat16, 2048}, expectation{128, fat_type::fat16, 2048},
          expectation{256, fat_type::fat16, 4096}, expectation{511, fat_type::fat16, 8192}}) {
        memory_block_device dev(e.mib << 20);
        ASSERT_TRUE(format(dev).has_value());
        auto v = volume::mount(dev, {.read_only = true});
        ASSERT_TRUE(v.has_value());
        auto s = (*v)->statfs();
        EXPECT_EQ(s->type, e.type) << e.mib << " MiB";
        EXPECT_EQ(s->cluster_size, e.cluster) << e.mib << " MiB";
    }
    // Every size from 7.9 to 8.2 MiB in sector steps: never 4085 or 4086 clusters.
    for (uint64_t sectors = 16200; sectors < 16900; sectors += 1) {
        memory_block_device dev(sectors * 512);
        ASSERT_TRUE(format(dev).has_value());
        auto v = volume::mount(dev, {.read_only = true});
        ASSERT_TRUE(v.has_value());
        auto n = (*v)->statfs()->total_clusters;
        EXPECT_TRUE(n != 4085 && n != 4086) << sectors << " sectors gave " << n << " clusters";
    }
    memory_block_device small(16u << 20);
    auto r = format(small, {.type = fat_type::fat32});
    ASSERT_FALSE(r.has_value());
    EXPECT_NE(r.error().message.find("FAT32 needs at least 65525 clusters"), std::string::npos);
}

TEST(FatFormat, Fat32HasFsinfoAndBackupBootSector)
{
    memory_block_device dev(64u << 20);
    ASSERT_TRUE(format(dev, {.type = fat_type::fat32}).has_value());
    auto& img = dev.bytes();
    EXPECT_EQ(le16(&img[48]), 1);
    EXPECT_EQ(le16(&img[50]), 6);
    EXPECT_EQ(0, std::memcmp(&img[0], &img[6 * 512], 512));
    EXPECT_EQ(le32(&img[512]), 0x41615252u);
    EXPECT_EQ(le32(&img[512 + 484]), 0x61417272u);
    {
        auto v = volume::mount(dev);
        ASSERT_TRUE(v.has_value());
        write_all(**v, "/x", std::string(100000, 'x'));
        auto free = (*v)->statfs()->free_clusters;
        ASSERT_TRUE((*v)->unmount().has_value());
        EXPECT_EQ(le32(&img[512 + 488]), free) << "FSInfo free count follows the FAT";
    }
}

}  // namespace

namespace {

TEST(FatMirror, Fat32WithMirroringOffWritesOnlyTheActiveFat)
{
    memory_block_device dev(40u << 20);
    ASSERT_TRUE(format(dev, {.type = fat_type::fat32, .cluster_size = 512}).has_value());
    auto& img = dev.bytes();
    put16(&img[40], 0x80 | 1);  // mirroring off, FAT 1 active
    uint32_t reserved = le16(&img[14]);
    uint32_t fat_size = le32(&img[36]);
    std::vector<uint8_t> fat0(img.begin() + reserved * 512,
                              img.begin() + (reserved + fat_size) * 512);
    {
        auto v = volume::mount(dev);
        ASSERT_TRUE(v.has_value());
        write_all(**v, "/file", std::string(100000, 'm'));
        ASSERT_TRUE((*v)->unmount().has_value());
    }
    EXPECT_TRUE(std::equal(fat0.begin(), fat0.end(), img.begin() + reserved * 512))
        << "FAT 0 must not change";
    EXPECT_NE(le32(&img[(reserved + fat_size) * 512 + 3 * 4]), 0u) << "FAT 1 holds the new chain";
    auto v = volume::mount(dev, {.read_only = true});
    ASSERT_TRUE(v.has_value());
    EXPECT_EQ(read_all(**v, "/file"), std::string(100000, 'm'));
}

}  // namespace
