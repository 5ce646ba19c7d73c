// Many threads creating, writing and deleting in the same directories:
// nothing is lost, and fsck.fat finds the image clean.
#include "fat_test_util.hpp"

#include <thread>

using namespace fat_test;

namespace {

TEST(FatThreads, ConcurrentCreatorsNeverLoseAFile)
{
    FAT_REQUIRE_TOOL("fsck.fat");
    auto dev = formatted(48u << 20, fat_type::fat32, 512);
    auto v = volume::mount(*dev);
    ASSERT_TRUE(v.has_value());
    volume& vol = **v;
    ASSERT_TRUE(vol.mkdir("/shared").has_value());
    ASSERT_TRUE(vol.mkdir("/shared/deeper").has_value());
    constexpr int k_threads = 6;
    constexpr int k_files = 150;
    std::vector<std::map<std::string, std::string>> expected(k_threads);
    std::vector<std::thread> threads;
    std::atomic<int> failures{0};
    for (int t = 0; t < k_threads; ++t) {
        threads.emplace_back([&, t] {
            std::mt19937_64 rng(t);
            for (int i = 0; i < k_files; ++i) {
                std::string dir = (i % 2) ? "/shared" : "/shared/deeper";
                std::string path =
                    dir + "/thread " + std::to_string(t) + " file " + std::to_string(i) + ".bin";
                std::string data = random_bytes(rng, rng() % 20000);
                auto f = vol.open(path, k_open_write | k_open_create | k_open_exclusive);
                if (!f ||
                    f->pwrite(data.data(), data.size(), 0) != static_cast<int64_t>(data.size())) {
                    ++failures;
                    continue;
                }
                f->close();
                expected[t][path] = data;
                if (i % 3 == 2) {  // delete an earlier one
                    auto victim = expected[t].begin();
                    std::advance(victim, static_cast<long>(rng() % expected[t].size()));
                    if (!vol.unlink(victim->first)) {
                        ++failures;
                    }
                    expected[t].erase(victim);
                }
            }
        });
    }
    for (auto& th : threads) {
        th.join();
    }
    EXPECT_EQ(failures.load(), 0);
    ASSERT_TRUE(vol.unmount().has_value());
    v->reset();
    auto again = volume::mount(*dev);
    ASSERT_TRUE(again.has_value());
    size_t total = 0;
    for (auto& per : expected) {
        for (auto& [path, data] : per) {
            EXPECT_EQ(read_all(**again, path), data) << path;
            ++total;
        }
    }
    auto a = (*again)->readdir("/shared");
    auto b = (*again)->readdir("/shared/deeper");
    ASSERT_TRUE(a && b);
    EXPECT_EQ(a->size() - 1 + b->size(), total);  // "deeper" is listed in /shared
    ASSERT_TRUE((*again)->unmount().has_value());
    temp_dir tmp;
    save_image(*dev, tmp / "threads.img");
    EXPECT_TRUE(fsck_clean(tmp / "threads.img"));
}

}  // namespace
