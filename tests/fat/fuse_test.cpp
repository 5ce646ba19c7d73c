// `softblk fat mount`: the FUSE mount serves POSIX I/O, and the image is
// clean (fsck.fat) and readable by mtools after fusermount3 -u. The mount
// is always taken down, even when an assertion fails.
#include "fat_test_util.hpp"
#include "fuse_util.hpp"

#include <chrono>
#include <csignal>
#include <fcntl.h>
#include <sys/stat.h>
#include <thread>

using namespace fat_test;

namespace {

TEST(FatFuse, MountServesPosixIoAndLeavesACleanImage)
{
    if (access("/dev/fuse", R_OK | W_OK) != 0) {
        GTEST_SKIP() << "SKIP: /dev/fuse is not available";
    }
    FAT_REQUIRE_TOOL("fusermount3");
    FAT_REQUIRE_TOOL("fsck.fat");
    FAT_REQUIRE_TOOL("mtype");
    temp_dir tmp;
    std::string img = tmp / "fuse.img";
    {
        auto dev = file_block_device::create(img, 32u << 20);
        ASSERT_TRUE(dev.has_value());
        ASSERT_TRUE(format(**dev).has_value());
    }
    std::string mnt = tmp / "mnt";
    fs::create_directories(mnt);
    std::mt19937_64 rng(3);
    std::string big = random_bytes(rng, 3u << 20);
    {
        fuse_mount m(img, mnt);
        ASSERT_TRUE(m.ok()) << "the FUSE mount did not come up";
        write_file(mnt + "/Big File.bin", big);
        fs::create_directories(mnt + "/dir/sub");
        write_file(mnt + "/dir/sub/note.txt", "note\n");
        fs::rename(mnt + "/dir/sub/note.txt", mnt + "/dir/renamed.txt");
        write_file(mnt + "/gone", "x");
        fs::remove(mnt + "/gone");
        {
            int fd = open((mnt + "/sparse").c_str(), O_CREAT | O_RDWR, 0644);
            ASSERT_GE(fd, 0);
            ASSERT_EQ(pwrite(fd, "end", 3, 100000), 3);
            ASSERT_EQ(fsync(fd), 0);
            ASSERT_EQ(ftruncate(fd, 50000), 0);
            close(fd);
        }
        auto got = load_file(mnt + "/Big File.bin");
        EXPECT_TRUE(std::string(got.begin(), got.end()) == big);
        EXPECT_EQ(fs::file_size(mnt + "/sparse"), 50000u);
        std::set<std::string> names;
        for (auto& e : fs::directory_iterator(mnt)) {
            names.insert(e.path().filename().string());
        }
        EXPECT_EQ(names, (std::set<std::string>{"Big File.bin", "dir", "sparse"}));
        EXPECT_EQ(m.unmount(), 0);
    }
    EXPECT_TRUE(fsck_clean(img));
    auto t = run("mtype -i " + img + " ::/dir/renamed.txt");
    EXPECT_EQ(t.output, "note\n");
    std::string out = tmp / "big.out";
    ASSERT_EQ(run("mcopy -n -i " + img + " '::/Big File.bin' " + out).status, 0);
    auto got = load_file(out);
    EXPECT_TRUE(std::string(got.begin(), got.end()) == big);
}

}  // namespace
