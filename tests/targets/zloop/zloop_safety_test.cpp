// The zloop target's directories and zone files against other users and
// leftovers (docs/reliability.md, "File and zone-file safety"): base_dir and
// BASE_DIR/ID must be the daemon's user's or root's and writable by no one
// else; a zone file replaced by a symbolic link is refused and its target
// left alone; zone files are made 0600; a failed creation removes exactly
// the zone files it made; a deleted zone file is named as such; id=-1 skips
// a directory another device holds (flock), and one ID under two base
// directories is two devices.
#include "test_util.hpp"

#include <cerrno>
#include <cstdlib>
#include <fcntl.h>
#include <fmt/core.h>
#include <fstream>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <softblk/device.hpp>

using namespace softblk;
using namespace softblk::test;

namespace {

constexpr uid_t k_nobody = 65534;

class zloop_safety_test : public ::testing::Test {
protected:
    void SetUp() override
    {
        char name[] = "/tmp/softblk-zloop-safety-XXXXXX";
        _top = ::mkdtemp(name);
        _base = _top + "/base";
        ASSERT_EQ(::mkdir(_base.c_str(), 0755), 0);
        ASSERT_EQ(::mkdir((_base + "/0").c_str(), 0755), 0);
    }
    void TearDown() override
    {
        const std::string cmd = "rm -rf '" + _top + "'";
        [[maybe_unused]] int rc = std::system(cmd.c_str());
    }

    // 8 zones of 1 MiB, the first two conventional, in BASE/ID.
    std::vector<std::string> options(std::vector<std::string> more = {}) const
    {
        std::vector<std::string> o{"base_dir=" + _base, "id=0",         "capacity_mb=8",
                                   "zone_size_mb=1",    "conv_zones=2", "irqmode=0"};
        o.insert(o.end(), more.begin(), more.end());
        return o;
    }
    result<std::unique_ptr<device>> create(std::vector<std::string> more = {},
                                           std::string name = "zlsafe") const
    {
        return device::create(std::move(name), "zloop", options(std::move(more)));
    }
    std::string refused(std::vector<std::string> more, int* code = nullptr) const
    {
        return create_error(options(std::move(more)), code, "zloop");
    }
    std::string file(const std::string& name, int id = 0) const
    {
        return _base + "/" + std::to_string(id) + "/" + name;
    }
    static bool exists(const std::string& p)
    {
        struct stat st {};
        return ::lstat(p.c_str(), &st) == 0;
    }
    static std::string read_text(const std::string& p)
    {
        std::ifstream in(p);
        return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    }
    // A file outside base_dir that a planted link points at.
    std::string make_victim() const
    {
        const std::string victim = _top + "/victim";
        std::ofstream(victim) << "data that is not a zone's";
        return victim;
    }
    unsigned zone_files_in(int id) const
    {
        unsigned n = 0;
        for (uint32_t z = 0; z < 8; ++z) {
            n += exists(file(fmt::format("{}-{:06}", z < 2 ? "cnv" : "seq", z), id)) ? 1 : 0;
        }
        return n;
    }

    std::string _top;
    std::string _base;
};

TEST_F(zloop_safety_test, base_dir_or_its_id_directory_of_another_user_is_refused)
{
    if (::geteuid() != 0) {
        GTEST_SKIP() << "needs root to give the directories to another uid";
    }
    ASSERT_EQ(::chown(_base.c_str(), k_nobody, k_nobody), 0);
    int code = 0;
    std::string e = refused({}, &code);
    EXPECT_EQ(code, EPERM);
    EXPECT_NE(e.find(_base + " is owned by uid 65534"), std::string::npos) << e;
    EXPECT_EQ(zone_files_in(0), 0u);  // nothing was created

    ASSERT_EQ(::chown(_base.c_str(), 0, 0), 0);
    ASSERT_EQ(::chown((_base + "/0").c_str(), k_nobody, k_nobody), 0);
    e = refused({}, &code);
    EXPECT_EQ(code, EPERM);
    EXPECT_NE(e.find(_base + "/0 is owned by uid 65534"), std::string::npos) << e;
    // id=-1 does not pass over it to another directory: it says why.
    e = refused({"id=-1"});
    EXPECT_NE(e.find(_base + "/0 is owned by uid 65534"), std::string::npos) << e;
    EXPECT_EQ(zone_files_in(0), 0u);

    // A directory above base_dir that another user owns.
    ASSERT_EQ(::chown((_base + "/0").c_str(), 0, 0), 0);
    ASSERT_EQ(::chown(_top.c_str(), k_nobody, k_nobody), 0);
    e = refused({});
    EXPECT_NE(e.find(_top + " (above base_dir " + _base + ") is owned by uid 65534"),
              std::string::npos)
        << e;
    ASSERT_EQ(::chown(_top.c_str(), 0, 0), 0);
    EXPECT_TRUE(create());
}

TEST_F(zloop_safety_test, a_base_dir_others_may_write_is_refused)
{
    ASSERT_EQ(::chmod(_base.c_str(), 0777), 0);
    std::string e = refused({});
    EXPECT_NE(e.find(_base + " has mode 0777"), std::string::npos) << e;
    ASSERT_EQ(::chmod(_base.c_str(), 0755), 0);
    ASSERT_EQ(::chmod((_base + "/0").c_str(), 0770), 0);
    e = refused({});
    EXPECT_NE(e.find(_base + "/0 has mode 0770"), std::string::npos) << e;
    EXPECT_EQ(zone_files_in(0), 0u);
    // BASE_DIR/ID as a link is not followed.
    ASSERT_EQ(::chmod((_base + "/0").c_str(), 0755), 0);
    ASSERT_EQ(::symlink((_base + "/0").c_str(), (_base + "/1").c_str()), 0);
    e = refused({"id=1"});
    EXPECT_NE(e.find(_base + "/1 is a symbolic link"), std::string::npos) << e;
    EXPECT_EQ(zone_files_in(0), 0u);
}

TEST_F(zloop_safety_test, a_zone_file_replaced_by_a_link_is_refused_and_its_target_untouched)
{
    {
        auto d = create();
        ASSERT_TRUE(d) << d.error().message;
    }
    const std::string victim = make_victim();
    const std::string before = read_text(victim);
    for (const char* name : {"seq-000003", "cnv-000001"}) {
        ASSERT_EQ(::rename(file(name).c_str(), (file(name) + ".saved").c_str()), 0);
        ASSERT_EQ(::symlink(victim.c_str(), file(name).c_str()), 0);
        int code = 0;
        const std::string e = refused({}, &code);
        EXPECT_EQ(code, ELOOP) << e;
        EXPECT_NE(e.find(file(name) + ": a symbolic link"), std::string::npos) << e;
        EXPECT_EQ(read_text(victim), before) << name;
        ASSERT_EQ(::unlink(file(name).c_str()), 0);
        ASSERT_EQ(::rename((file(name) + ".saved").c_str(), file(name).c_str()), 0);
    }
    // A FIFO where a zone file should be is refused too, never opened.
    ASSERT_EQ(::unlink(file("seq-000004").c_str()), 0);
    ASSERT_EQ(::mkfifo(file("seq-000004").c_str(), 0600), 0);
    const std::string e = refused({});
    EXPECT_NE(e.find(file("seq-000004") + ": not a regular file"), std::string::npos) << e;
}

TEST_F(zloop_safety_test, zone_files_are_made_readable_by_their_owner_only)
{
    ::umask(022);
    auto d = create();
    ASSERT_TRUE(d) << d.error().message;
    for (const char* name : {"cnv-000000", "cnv-000001", "seq-000002", "seq-000007"}) {
        struct stat st {};
        ASSERT_EQ(::stat(file(name).c_str(), &st), 0) << name;
        EXPECT_EQ(st.st_mode & 0777, 0600u) << name;
    }
}

TEST_F(zloop_safety_test, a_failed_creation_removes_the_zone_files_it_made_and_only_those)
{
    // A file that was there before the device (a leftover of zone 5) stays.
    std::ofstream(file("seq-000005")) << "";
    // The write-back cache is refused on a zoned device after the target
    // made its files.
    int code = 0;
    const std::string e = refused({"cache_size=4"}, &code);
    EXPECT_NE(e.find("cache_size"), std::string::npos) << e;
    EXPECT_EQ(zone_files_in(0), 1u);
    EXPECT_TRUE(exists(file("seq-000005")));

    // The caller's add failed after the device was made (its export was
    // refused): undo_create removes what the device made.
    auto d = create();
    ASSERT_TRUE(d) << d.error().message;
    EXPECT_EQ(zone_files_in(0), 8u);
    (*d)->undo_create();
    d->reset();
    EXPECT_EQ(zone_files_in(0), 1u);
    EXPECT_TRUE(exists(file("seq-000005")));

    // A zone file someone replaced meanwhile is not the one made: it stays.
    d = create();
    ASSERT_TRUE(d) << d.error().message;
    ASSERT_EQ(::unlink(file("seq-000006").c_str()), 0);
    std::ofstream(file("seq-000006")) << "not softblk's";
    (*d)->undo_create();
    d->reset();
    EXPECT_EQ(read_text(file("seq-000006")), "not softblk's");
    EXPECT_EQ(zone_files_in(0), 2u);

    // A restored device created nothing: nothing goes.
    ASSERT_EQ(::unlink(file("seq-000006").c_str()), 0);
    {
        auto made = create();
        ASSERT_TRUE(made) << made.error().message;
    }
    d = create();
    ASSERT_TRUE(d) << d.error().message;
    (*d)->undo_create();
    d->reset();
    EXPECT_EQ(zone_files_in(0), 8u);
}

TEST_F(zloop_safety_test, a_deleted_zone_file_is_named_as_deleted)
{
    {
        auto d = create();
        ASSERT_TRUE(d) << d.error().message;
    }
    ASSERT_EQ(::unlink(file("seq-000003").c_str()), 0);
    int code = 0;
    std::string e = refused({}, &code);
    EXPECT_EQ(code, ENOENT);
    EXPECT_NE(e.find(file("seq-000003") + ": missing, though the zone files up to zone 7 exist: "
                                          "it was deleted or renamed"),
              std::string::npos)
        << e;
    EXPECT_EQ(e.find("fewer"), std::string::npos) << e;
    // A directory of fewer zones says so.
    std::ofstream(file("seq-000003")) << "";
    e = refused({"capacity_mb=16"}, &code);
    EXPECT_NE(e.find(file("seq-000008") + ": missing; the directory holds a zloop device of 8 "
                                          "zones, fewer than the 16"),
              std::string::npos)
        << e;
}

TEST_F(zloop_safety_test, id_minus_one_skips_a_directory_another_device_holds)
{
    ASSERT_EQ(::mkdir((_base + "/1").c_str(), 0755), 0);
    // Another daemon's device on BASE/0: it holds the directory's flock.
    const int held = ::open((_base + "/0").c_str(), O_RDONLY | O_DIRECTORY);
    ASSERT_GE(held, 0);
    ASSERT_EQ(::flock(held, LOCK_EX | LOCK_NB), 0);
    auto d = create({"id=-1"});
    ASSERT_TRUE(d) << d.error().message;
    EXPECT_EQ(describe(**d)["target"]["id"], 1);
    EXPECT_EQ(zone_files_in(0), 0u);
    // Asked for by number, it is refused with its directory named.
    int code = 0;
    std::string e = refused({"id=0"}, &code);
    EXPECT_EQ(code, EEXIST);
    EXPECT_NE(e.find("id=0: " + _base + "/0 is in use by another zloop device"), std::string::npos)
        << e;
    // Every directory taken: the message says so and which to make.
    e = refused({"id=-1"}, &code);
    EXPECT_EQ(code, ENOENT);
    EXPECT_NE(e.find("2 in use by other zloop devices); create one: mkdir " + _base + "/2"),
              std::string::npos)
        << e;
    ::close(held);
    // Let go, BASE/0 is free again.
    auto again = create({"id=-1"}, "zlsafe2");
    ASSERT_TRUE(again) << again.error().message;
    EXPECT_EQ(describe(**again)["target"]["id"], 0);
}

TEST_F(zloop_safety_test, one_id_under_two_base_directories_is_two_devices)
{
    const std::string other = _top + "/other";
    ASSERT_EQ(::mkdir(other.c_str(), 0755), 0);
    ASSERT_EQ(::mkdir((other + "/0").c_str(), 0755), 0);
    auto a = create();
    ASSERT_TRUE(a) << a.error().message;
    auto b = create({"base_dir=" + other}, "zlsafe2");
    ASSERT_TRUE(b) << b.error().message;
    EXPECT_EQ(describe(**b)["target"]["dir"], other + "/0");
}

}  // namespace
