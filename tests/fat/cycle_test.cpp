// Directory cycles in hostile images: a subdirectory entry that points at
// its parent, at the root (its cluster on FAT32, cluster 0 on FAT12/16), or
// a longer loop /A/B/C -> /A. Path resolution refuses them (ELOOP, naming
// the path), walks (fat::walk, ls -R, cp -r, rm -r) report them and go on
// with the rest, and the FUSE mount answers ELOOP with a log line. Every
// command must end within seconds: before this, ls -R ran for 20-30 s,
// grew to gigabytes and died, and cp -r made a thousand nested host
// directories.
#include "fat_test_util.hpp"
#include "fuse_util.hpp"

#include <cerrno>
#include <sys/stat.h>

#include <fmt/format.h>

#include <softblk/fat/walk.hpp>

#include "image_layout.hpp"
#include "layout.hpp"

using namespace fat_test;
using namespace softblk::fat::detail;

namespace {

enum class cycle_kind { parent, root, longer };

struct cycle_case {
    int bits;
    cycle_kind kind;
};

std::string case_name(const ::testing::TestParamInfo<cycle_case>& info)
{
    const char* kind = info.param.kind == cycle_kind::parent ? "ToParent"
                       : info.param.kind == cycle_kind::root ? "ToRoot"
                                                             : "ThreeLevels";
    return fmt::format("FAT{}{}", info.param.bits, kind);
}

// Points the short entry `name` (11 bytes, no long name) of the directory
// starting at `dir_cluster` at `target`.
void point_entry(std::vector<uint8_t>& img, uint32_t dir_cluster, const char* name, uint32_t target)
{
    auto l = layout_of(img);
    uint64_t base = l.cluster_offset(dir_cluster);
    for (uint32_t off = 0; off < l.spc * l.bps; off += 32) {
        uint8_t* e = &img[base + off];
        if (std::memcmp(e, name, 11) == 0) {
            put16(e + dirent::cluster_hi, static_cast<uint16_t>(target >> 16));
            put16(e + dirent::cluster_lo, static_cast<uint16_t>(target));
            return;
        }
    }
    FAIL() << "no entry " << name << " in cluster " << dir_cluster;
}

class FatCycle : public ::testing::TestWithParam<cycle_case> {
protected:
    void SetUp() override
    {
        auto type = static_cast<fat_type>(GetParam().bits);
        _dev = formatted(GetParam().bits == 32 ? 40u << 20 : 8u << 20, type);
        uint32_t a = 0;
        uint32_t b = 0;
        uint32_t root = 0;
        {
            auto v = volume::mount(*_dev);
            ASSERT_TRUE(v.has_value()) << v.error().message;
            for (const char* d : {"/A", "/A/B", "/A/B/C", "/D"}) {
                ASSERT_TRUE((*v)->mkdir(d).has_value()) << d;
            }
            write_all(**v, "/TOP.TXT", "top");
            write_all(**v, "/A/F.TXT", "in a");
            write_all(**v, "/A/B/G.TXT", "in b");
            write_all(**v, "/D/X.TXT", "outside the cycle");
            a = (*v)->stat("/A")->first_cluster;
            b = (*v)->stat("/A/B")->first_cluster;
            root = (*v)->stat("/")->first_cluster;  // 0 on FAT12/16
            ASSERT_TRUE((*v)->unmount().has_value());
        }
        auto& img = _dev->bytes();
        switch (GetParam().kind) {
        case cycle_kind::parent:
            point_entry(img, a, "B          ", a);  // /A/B is /A
            _cycle = "/A/B";
            break;
        case cycle_kind::root:
            point_entry(img, a, "B          ", root);  // /A/B is /
            _cycle = "/A/B";
            break;
        case cycle_kind::longer:
            point_entry(img, b, "C          ", a);  // /A/B/C is /A
            _cycle = "/A/B/C";
            break;
        }
        save_image(*_dev, _tmp / "cycle.img");
    }

    std::string image() const { return _tmp / "cycle.img"; }

    // Runs the tool with a time limit: a cycle that is followed shows up as
    // status 124 (timeout), a crash as -1.
    command_result tool(const std::string& args) const
    {
        std::string bin = SOFTBLK_FAT_BIN;
        return run("timeout 60 " + bin + " " + args);
    }

    temp_dir _tmp;
    std::unique_ptr<memory_block_device> _dev;
    std::string _cycle;  // the entry that leads back
};

struct recording_visitor : walk_visitor {
    std::vector<std::string> entered;
    std::vector<std::pair<std::string, int>> skips;
    softblk::result<void> enter(const std::string& path, const std::vector<dir_entry>&) override
    {
        entered.push_back(path);
        return {};
    }
    void skipped(const std::string& path, const softblk::error& why) override
    {
        skips.emplace_back(path, why.code.value());
    }
};

struct walk_record {
    walk_summary summary;
    std::vector<std::string> entered;
};

// Walks `start` and checks that exactly one directory was skipped: `path`,
// for `code`. Returns the counts and the directories entered.
walk_record walk_skipping_one(volume& v, const std::string& start, const std::string& path,
                              int code, const walk_limits& limits = {})
{
    recording_visitor visitor;
    auto r = walk(v, start, visitor, limits);
    EXPECT_TRUE(r.has_value()) << r.error().message;
    EXPECT_EQ(visitor.skips.size(), 1u);
    if (!visitor.skips.empty()) {
        EXPECT_EQ(visitor.skips[0].first, path);
        EXPECT_EQ(visitor.skips[0].second, code);
    }
    EXPECT_EQ(r ? r->skipped : 0, 1u);
    return {r.value_or(walk_summary{}), visitor.entered};
}

TEST_P(FatCycle, PathsThroughTheCycleGiveEloopNamingIt)
{
    auto v = volume::mount(*_dev, mount_options{.read_only = true});
    ASSERT_TRUE(v.has_value()) << v.error().message;
    auto st = (*v)->stat(_cycle);
    ASSERT_FALSE(st.has_value()) << _cycle << " resolved into the cycle";
    EXPECT_EQ(st.error().code.value(), ELOOP) << st.error().message;
    EXPECT_NE(st.error().message.find("directory cycle"), std::string::npos) << st.error().message;
    EXPECT_NE(st.error().message.find(_cycle), std::string::npos) << st.error().message;
    // Deeper paths through it too; the rest of the volume is untouched.
    auto deeper = (*v)->readdir(_cycle + "/B/B/B");
    ASSERT_FALSE(deeper.has_value());
    EXPECT_EQ(deeper.error().code.value(), ELOOP);
    EXPECT_EQ(read_all(**v, "/D/X.TXT"), "outside the cycle");
    auto parent = (*v)->readdir(_cycle.substr(0, _cycle.rfind('/')));
    ASSERT_TRUE(parent.has_value()) << parent.error().message;
}

TEST_P(FatCycle, WalkReportsTheCycleAndWalksTheRest)
{
    auto v = volume::mount(*_dev, mount_options{.read_only = true});
    ASSERT_TRUE(v.has_value());
    auto r = walk_skipping_one(**v, "/", _cycle, ELOOP);
    // /, /A, /D, and /A/B when the loop is below it.
    EXPECT_EQ(r.summary.directories, GetParam().kind == cycle_kind::longer ? 4u : 3u);
    EXPECT_NE(std::find(r.entered.begin(), r.entered.end(), "/D"), r.entered.end());
}

TEST_P(FatCycle, LsRecursiveEndsWithTheError)
{
    auto r = tool("ls -R " + quote(image()));
    EXPECT_EQ(r.status, 1) << r.output.substr(0, 2000);
    EXPECT_NE(r.output.find(_cycle + ": directory cycle"), std::string::npos)
        << r.output.substr(0, 2000);
    EXPECT_NE(r.output.find("/D:\nX.TXT"), std::string::npos) << r.output.substr(0, 2000);
    EXPECT_LT(r.output.size(), 4096u);
}

TEST_P(FatCycle, CopyOutEndsWithTheErrorAndCopiesTheRest)
{
    std::string out = _tmp / "out";
    auto r = tool("cp -r " + quote(image()) + " ::/ " + quote(out));
    EXPECT_EQ(r.status, 1) << r.output.substr(0, 2000);
    EXPECT_NE(r.output.find(_cycle + ": directory cycle"), std::string::npos)
        << r.output.substr(0, 2000);
    auto x = load_file(out + "/D/X.TXT");
    EXPECT_EQ(std::string(x.begin(), x.end()), "outside the cycle");
    auto f = load_file(out + "/A/F.TXT");
    EXPECT_EQ(std::string(f.begin(), f.end()), "in a");
    size_t dirs = 0;
    for (auto& e : fs::recursive_directory_iterator(out)) {
        dirs += e.is_directory() ? 1 : 0;
    }
    EXPECT_LE(dirs, 4u);  // A, A/B, D (and A/B/C's parent chain): no nesting
}

TEST_P(FatCycle, CopyWithinTheImageEndsWithTheError)
{
    std::string copy = _tmp / "copy.img";
    fs::copy_file(image(), copy);
    auto r = tool("cp -r " + quote(copy) + " ::/A ::/E");
    EXPECT_EQ(r.status, 1) << r.output.substr(0, 2000);
    EXPECT_NE(r.output.find(": directory cycle"), std::string::npos) << r.output.substr(0, 2000);
    r = tool("cat " + quote(copy) + " /E/F.TXT");
    EXPECT_EQ(r.output, "in a");
}

TEST_P(FatCycle, RemoveRecursiveEndsWithTheError)
{
    std::string copy = _tmp / "rm.img";
    fs::copy_file(image(), copy);
    auto r = tool("rm -r " + quote(copy) + " /A");
    EXPECT_EQ(r.status, 1) << r.output.substr(0, 2000);
    EXPECT_NE(r.output.find(_cycle + ": directory cycle"), std::string::npos)
        << r.output.substr(0, 2000);
    r = tool("cat " + quote(copy) + " /D/X.TXT");
    EXPECT_EQ(r.status, 0) << r.output;
    EXPECT_EQ(r.output, "outside the cycle");
}

TEST_P(FatCycle, FuseMountAnswersEloopAndLogsIt)
{
    if (access("/dev/fuse", R_OK | W_OK) != 0) {
        GTEST_SKIP() << "SKIP: /dev/fuse is not available";
    }
    FAT_REQUIRE_TOOL("fusermount3");
    std::string mnt = _tmp / "mnt";
    std::string log = _tmp / "mount.log";
    fs::create_directories(mnt);
    fuse_mount m(image(), mnt, {"--ro"}, log);
    ASSERT_TRUE(m.ok()) << "the mount did not come up";
    struct stat st {};
    errno = 0;
    EXPECT_NE(::stat((mnt + _cycle).c_str(), &st), 0);
    EXPECT_EQ(errno, ELOOP);
    auto r = run("timeout 60 ls -R " + quote(mnt));
    EXPECT_NE(r.status, 0) << r.output.substr(0, 2000);
    EXPECT_NE(r.status, 124) << "ls -R did not end";
    EXPECT_LT(r.output.size(), 8192u);
    EXPECT_NE(r.output.find("X.TXT"), std::string::npos) << r.output.substr(0, 2000);
    EXPECT_EQ(m.unmount(), 0);
    auto logged = load_file(log);
    std::string text(logged.begin(), logged.end());
    EXPECT_NE(text.find("directory cycle"), std::string::npos) << text;
}

// A directory reached a second time by another entry (cross-linked, not a
// cycle) is walked once; the limits stop a walk without ending it.
TEST(FatWalk, CrossLinksAreWalkedOnceAndLimitsSkip)
{
    auto dev = formatted(8u << 20, fat_type::fat16);
    uint32_t a = 0;
    {
        auto v = volume::mount(*dev);
        ASSERT_TRUE(v.has_value());
        for (const char* d : {"/A", "/A/DEEP", "/A/DEEP/DEEPER", "/D"}) {
            ASSERT_TRUE((*v)->mkdir(d).has_value()) << d;
        }
        a = (*v)->stat("/A")->first_cluster;
        ASSERT_TRUE((*v)->unmount().has_value());
    }
    // The root is the fixed area on FAT16: find /D's entry there.
    auto& img = dev->bytes();
    auto l = layout_of(img);
    uint64_t root_area = (l.reserved + uint64_t{l.fats} * l.fat_size) * l.bps;
    bool patched = false;
    for (uint32_t i = 0; i < l.root_entries && !patched; ++i) {
        uint8_t* e = &img[root_area + i * 32];
        if (std::memcmp(e, "D          ", 11) == 0) {
            put16(e + dirent::cluster_lo, static_cast<uint16_t>(a));  // /D is /A
            patched = true;
        }
    }
    ASSERT_TRUE(patched);
    auto v = volume::mount(*dev, mount_options{.read_only = true});
    ASSERT_TRUE(v.has_value());
    auto all = walk_skipping_one(**v, "/", "/D", EMLINK);
    EXPECT_EQ(all.summary.directories, 4u);  // /, /A, /A/DEEP, /A/DEEP/DEEPER
    walk_limits short_paths;
    short_paths.max_path_bytes = 8;  // "/A/DEEP" fits, "/A/DEEP/DEEPER" does not
    walk_skipping_one(**v, "/A", "/A/DEEP/DEEPER", ENAMETOOLONG, short_paths);
    walk_limits little_memory;
    little_memory.max_pending_bytes = 1;  // not even one subdirectory
    EXPECT_EQ(walk_skipping_one(**v, "/A", "/A", E2BIG, little_memory).summary.directories, 1u);
    // A path that is not there is an error, not an empty walk.
    recording_visitor visitor;
    EXPECT_FALSE(walk(**v, "/NOPE", visitor).has_value());
}

std::vector<cycle_case> all_cases()
{
    std::vector<cycle_case> out;
    for (int bits : {12, 16, 32}) {
        for (auto kind : {cycle_kind::parent, cycle_kind::root, cycle_kind::longer}) {
            out.push_back({bits, kind});
        }
    }
    return out;
}

INSTANTIATE_TEST_SUITE_P(Images, FatCycle, ::testing::ValuesIn(all_cases()), case_name);

}  // namespace
