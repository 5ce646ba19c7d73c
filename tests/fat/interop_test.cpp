// Interop both ways: images made by mkfs.fat and filled by mcopy are read
// correctly; images written by softblk pass fsck.fat -n and read back byte
// for byte with mdir/mtype/mcopy. Also the `softblk fat` tools on files.
#include "fat_test_util.hpp"

using namespace fat_test;

namespace {

struct host_tree {
    std::map<std::string, std::string> files;  // relative path -> content
    std::set<std::string> dirs;
};

host_tree make_tree(const std::string& root, uint64_t seed)
{
    std::mt19937_64 rng(seed);
    host_tree t;
    const std::vector<std::string> names = {
        "readme.txt",
        "Hello World.txt",
        "MiXeD.TxT",
        "a",
        "UPPER.TXT",
        "long name with spaces and more than thirteen chars.data",
        "\xC3\xA4rger \xE2\x82\xAC.txt",
        "x.y.z",
        "empty",
        ".hidden"};
    t.dirs = {"sub", "sub/Deeper Dir", "sub/Deeper Dir/leaf"};
    for (auto& d : t.dirs) {
        fs::create_directories(root + "/" + d);
    }
    std::vector<std::string> dirs = {"", "sub", "sub/Deeper Dir", "sub/Deeper Dir/leaf"};
    for (auto& d : dirs) {
        for (size_t i = 0; i < names.size(); ++i) {
            std::string rel = d.empty() ? names[i] : d + "/" + names[i];
            size_t size =
                names[i] == "empty" ? 0 : static_cast<size_t>(rng() % (i == 5 ? 200000 : 9000));
            std::string data = random_bytes(rng, size);
            write_file(root + "/" + rel, data);
            t.files[rel] = data;
        }
    }
    return t;
}

class FatInterop : public ::testing::TestWithParam<int> {};

TEST_P(FatInterop, ReadsImagesMadeByMkfsFatAndMcopy)
{
    FAT_REQUIRE_TOOL("mkfs.fat");
    FAT_REQUIRE_TOOL("mcopy");
    temp_dir tmp;
    std::string img = tmp / "m.img";
    int bits = GetParam();
    uint64_t mib = bits == 12 ? 4 : bits == 16 ? 32 : 64;
    ASSERT_EQ(run("truncate -s " + std::to_string(mib) + "M " + img).status, 0);
    auto mk = run("mkfs.fat -F " + std::to_string(bits) + " " + img);
    ASSERT_EQ(mk.status, 0) << mk.output;
    std::string src = tmp / "src";
    fs::create_directories(src);
    auto tree = make_tree(src, 42 + bits);
    auto cp = run("cd " + src + " && mcopy -s -i " + img + " ./* ./.hidden ::/");
    ASSERT_EQ(cp.status, 0) << cp.output;
    auto dev = file_block_device::open(img, true);
    ASSERT_TRUE(dev.has_value()) << dev.error().message;
    auto v = volume::mount(**dev, {.read_only = true});
    ASSERT_TRUE(v.has_value()) << v.error().message;
    EXPECT_EQ(static_cast<int>((*v)->statfs()->type), bits);
    for (auto& [rel, data] : tree.files) {
        EXPECT_EQ(read_all(**v, "/" + rel), data) << rel;
    }
    for (auto& d : tree.dirs) {
        auto st = (*v)->stat("/" + d);
        ASSERT_TRUE(st.has_value()) << d;
        EXPECT_TRUE(st->is_directory);
    }
    auto root = (*v)->readdir("/");
    ASSERT_TRUE(root.has_value());
    std::set<std::string> names;
    for (auto& e : *root) {
        names.insert(e.name);
    }
    EXPECT_TRUE(names.count("Hello World.txt"));
    EXPECT_TRUE(names.count("readme.txt"));
    EXPECT_TRUE((*v)->problems().empty()) << (*v)->problems().front();
}

TEST_P(FatInterop, ImagesWrittenBySoftblkPassFsckAndMtools)
{
    FAT_REQUIRE_TOOL("fsck.fat");
    FAT_REQUIRE_TOOL("mtype");
    temp_dir tmp;
    int bits = GetParam();
    uint64_t mib = bits == 12 ? 4 : bits == 16 ? 32 : 64;
    auto dev = formatted(mib << 20, static_cast<fat_type>(bits));
    std::string src = tmp / "src";
    fs::create_directories(src);
    auto tree = make_tree(src, 7 + bits);
    {
        auto v = volume::mount(*dev);
        ASSERT_TRUE(v.has_value());
        for (auto& d : tree.dirs) {
            ASSERT_TRUE((*v)->mkdir("/" + d).has_value()) << d;
        }
        for (auto& [rel, data] : tree.files) {
            write_all(**v, "/" + rel, data);
        }
        // Some churn: deletes leave E5 entries, renames move across dirs.
        ASSERT_TRUE((*v)->unlink("/x.y.z").has_value());
        tree.files.erase("x.y.z");
        ASSERT_TRUE((*v)->rename("/sub/a", "/sub/Deeper Dir/moved a").has_value());
        tree.files["sub/Deeper Dir/moved a"] = tree.files["sub/a"];
        tree.files.erase("sub/a");
        ASSERT_TRUE((*v)->unmount().has_value());
    }
    std::string img = tmp / "s.img";
    save_image(*dev, img);
    EXPECT_TRUE(fsck_clean(img));
    auto dir = run("mdir -/ -i " + img + " ::/");
    EXPECT_EQ(dir.status, 0) << dir.output;
    std::string out = tmp / "out";
    auto cp = run("mcopy -s -n -i " + img + " ::/ " + out);
    ASSERT_EQ(cp.status, 0) << cp.output;
    for (auto& [rel, data] : tree.files) {
        auto got = load_file(out + "/" + rel);
        EXPECT_EQ(std::string(got.begin(), got.end()), data) << rel;
    }
    auto t = run("mtype -i " + img + " '::/sub/Deeper Dir/readme.txt'");
    EXPECT_EQ(t.output, tree.files["sub/Deeper Dir/readme.txt"]);
}

INSTANTIATE_TEST_SUITE_P(Types, FatInterop, ::testing::Values(12, 16, 32),
                         [](const auto& case_info) {
                             return "FAT" + std::to_string(case_info.param);
                         });

TEST(FatTools, CopyBothWaysRecursivelyAndManage)
{
    FAT_REQUIRE_TOOL("fsck.fat");
    temp_dir tmp;
    std::string bin = SOFTBLK_FAT_BIN;
    std::string img = tmp / "t.img";
    std::string src = tmp / "src";
    fs::create_directories(src);
    auto tree = make_tree(src, 99);
    auto r = run(bin + " mkfs " + img + " --size 24M --label TOOLS");
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("FAT16"), std::string::npos);
    r = run(bin + " cp -r " + img + " " + src + " ::/");
    ASSERT_EQ(r.status, 0) << r.output;
    r = run(bin + " mkdir -p " + img + " /a/b/c");
    ASSERT_EQ(r.status, 0) << r.output;
    r = run(bin + " mv " + img + " '/src/Hello World.txt' /a/b");
    ASSERT_EQ(r.status, 0) << r.output;
    r = run(bin + " cat " + img + " '/a/b/Hello World.txt'");
    EXPECT_EQ(r.output, tree.files["Hello World.txt"]);
    r = run(bin + " ls -l " + img + " /src");
    EXPECT_NE(r.output.find("readme.txt"), std::string::npos) << r.output;
    r = run(bin + " stat " + img + " /src/readme.txt");
    EXPECT_NE(r.output.find("regular file"), std::string::npos) << r.output;
    r = run(bin + " df " + img);
    EXPECT_NE(r.output.find("Label: TOOLS"), std::string::npos) << r.output;
    std::string out = tmp / "out";
    r = run(bin + " cp -r " + img + " ::/src " + out);
    ASSERT_EQ(r.status, 0) << r.output;
    for (auto& [rel, data] : tree.files) {
        if (rel == "Hello World.txt") {
            continue;
        }
        auto got = load_file(out + "/" + rel);
        EXPECT_EQ(std::string(got.begin(), got.end()), data) << rel;
    }
    r = run(bin + " rm -r " + img + " /src/sub");
    ASSERT_EQ(r.status, 0) << r.output;
    r = run(bin + " rm " + img + " /a");
    EXPECT_EQ(r.status, 1);
    EXPECT_NE(r.output.find("is a directory"), std::string::npos) << r.output;
    EXPECT_TRUE(fsck_clean(img));
    r = run(bin + " cat " + img + " /does/not/exist");
    EXPECT_EQ(r.status, 1);
    EXPECT_NE(r.output.find("/does/not/exist"), std::string::npos) << r.output;
}

}  // namespace
