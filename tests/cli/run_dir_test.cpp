// The run directory is trusted only when it is the caller's own
// (docs/reliability.md, "Run directory"): a directory another user owns or
// may write, or one below such a directory, is refused with its owner and
// mode named; files the daemon opens there are never followed through a
// symbolic link.
#include "daemon_fixture.hpp"

using namespace softblk::test;

namespace {

constexpr uid_t k_nobody = 65534;

std::string read_text(const std::string& path)
{
    std::ifstream in(path);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

class run_dir_test : public daemon_test {
protected:
    // Runs `args` and expects a refusal that names `words`; no daemon
    // may have started.
    void expect_refused(std::vector<std::string> args, std::vector<std::string> words)
    {
        run_result r = softblk(args);
        EXPECT_EQ(r.status, 1) << r.out << r.err;
        for (const std::string& w : words) {
            EXPECT_NE(r.err.find(w), std::string::npos) << "'" << w << "' not in: " << r.err;
        }
        EXPECT_EQ(daemon_pid(), 0);
        EXPECT_FALSE(fs::exists(socket_path()));
    }
};

TEST_F(run_dir_test, a_run_dir_owned_by_another_user_is_refused)
{
    if (::geteuid() != 0) {
        GTEST_SKIP() << "needs root to give the directory to another uid";
    }
    ASSERT_EQ(::chmod(_dir.c_str(), 0755), 0);
    ASSERT_EQ(::chown(_dir.c_str(), k_nobody, k_nobody), 0);
    expect_refused({"list"}, {_dir, "owned by uid 65534", "uid 0"});
    expect_refused({"daemon", "--foreground", "--quiet"}, {_dir, "owned by uid 65534"});
    // Nothing was written into it.
    EXPECT_TRUE(fs::is_empty(_dir));
}

TEST_F(run_dir_test, a_run_dir_below_another_users_directory_is_refused)
{
    if (::geteuid() != 0) {
        GTEST_SKIP() << "needs root to give the directory to another uid";
    }
    ASSERT_EQ(::chmod(_dir.c_str(), 0755), 0);
    ASSERT_EQ(::chown(_dir.c_str(), k_nobody, k_nobody), 0);
    const std::string inner = _dir + "/run";
    ASSERT_EQ(::mkdir(inner.c_str(), 0700), 0);
    ::setenv("SOFTBLK_RUN_DIR", inner.c_str(), 1);
    run_result r = softblk({"list"});
    // A daemon that should not have started is stopped by TearDown.
    if (std::ifstream pid_file(inner + "/daemon.pid"); pid_file) {
        pid_t pid = 0;
        pid_file >> pid;
        if (pid > 0) {
            _daemons.insert(pid);
        }
    }
    EXPECT_EQ(r.status, 1);
    EXPECT_NE(r.err.find(_dir + " (above the run directory"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("owned by uid 65534"), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(inner + "/control.sock"));
}

TEST_F(run_dir_test, a_world_or_group_writable_run_dir_is_refused)
{
    ASSERT_EQ(::chmod(_dir.c_str(), 0777), 0);
    expect_refused({"list"}, {_dir, "mode 0777", "writable by other users"});
    ASSERT_EQ(::chmod(_dir.c_str(), 0770), 0);
    expect_refused({"add", "null", "size=8", "--export", "none"}, {_dir, "mode 0770"});
    EXPECT_TRUE(fs::is_empty(_dir));
    // Made private again, it is used.
    ASSERT_EQ(::chmod(_dir.c_str(), 0700), 0);
    EXPECT_EQ(softblk({"list"}).status, 0);
}

TEST_F(run_dir_test, a_writable_devices_directory_is_refused)
{
    const std::string devices = _dir + "/devices";
    ASSERT_EQ(::mkdir(devices.c_str(), 0700), 0);
    ASSERT_EQ(::chmod(devices.c_str(), 0777), 0);
    expect_refused({"daemon", "--foreground", "--quiet"}, {devices, "mode 0777"});
    ASSERT_EQ(::rmdir(devices.c_str()), 0);
    ASSERT_EQ(::symlink("/tmp", devices.c_str()), 0);
    expect_refused({"daemon", "--foreground", "--quiet"}, {devices, "symbolic link"});
}

TEST_F(run_dir_test, a_planted_log_symlink_is_not_followed)
{
    char tmpl[] = "/tmp/softblk-victim.XXXXXX";
    const int fd = ::mkstemp(tmpl);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::write(fd, "untouched\n", 10), 10);
    ::close(fd);
    const std::string victim = tmpl;
    ASSERT_EQ(::symlink(victim.c_str(), (_dir + "/daemon.log").c_str()), 0);

    expect_refused({"list"}, {_dir + "/daemon.log", "symbolic link"});
    expect_refused({"daemon", "--foreground", "--quiet"}, {_dir + "/daemon.log", "symbolic link"});
    EXPECT_EQ(read_text(victim), "untouched\n");

    // Once the link is gone the daemon starts and logs to its own file.
    ASSERT_EQ(::unlink((_dir + "/daemon.log").c_str()), 0);
    ASSERT_EQ(softblk({"list"}).status, 0);
    EXPECT_EQ(read_text(victim), "untouched\n");
    struct stat st {};
    ASSERT_EQ(::lstat((_dir + "/daemon.log").c_str(), &st), 0);
    EXPECT_TRUE(S_ISREG(st.st_mode));
    EXPECT_EQ(st.st_mode & 0077, 0u) << std::oct << st.st_mode;
    ::unlink(victim.c_str());
}

TEST_F(run_dir_test, planted_temporary_files_are_replaced_not_followed)
{
    char tmpl[] = "/tmp/softblk-victim.XXXXXX";
    const int fd = ::mkstemp(tmpl);
    ASSERT_GE(fd, 0);
    ::close(fd);
    const std::string victim = tmpl;
    ASSERT_EQ(::mkdir((_dir + "/devices").c_str(), 0700), 0);
    ASSERT_EQ(::symlink(victim.c_str(), (_dir + "/devices/d.json.tmp").c_str()), 0);
    ASSERT_EQ(::symlink(victim.c_str(), (_dir + "/daemon.pid.tmp").c_str()), 0);
    run_result r = softblk({"add", "null", "size=8", "--export", "none", "--name", "d"});
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(read_text(victim), "");
    struct stat st {};
    ASSERT_EQ(::lstat((_dir + "/devices/d.json").c_str(), &st), 0);
    EXPECT_TRUE(S_ISREG(st.st_mode));
    ASSERT_EQ(::lstat((_dir + "/daemon.pid").c_str(), &st), 0);
    EXPECT_TRUE(S_ISREG(st.st_mode));
    ::unlink(victim.c_str());
}

}  // namespace
