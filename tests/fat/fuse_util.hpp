// Running `softblk-fat mount` in the foreground from a test: started in a
// child process, waited for until the mount shows up, and always taken
// down (lazily if need be), even when an assertion fails.
#pragma once

#include <chrono>
#include <csignal>
#include <fcntl.h>
#include <string>
#include <sys/stat.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include "fat_test_util.hpp"

namespace fat_test {

inline bool is_mounted(const std::string& dir)
{
    std::ifstream in("/proc/self/mountinfo");
    std::string line;
    while (std::getline(in, line)) {
        if (line.find(" " + dir + " ") != std::string::npos) {
            return true;
        }
    }
    return false;
}

class fuse_mount {
public:
    // Mounts `image` on `dir` with `extra` arguments (e.g. "--ro"); the
    // server's stderr goes to `log` when given.
    fuse_mount(const std::string& image, const std::string& dir,
               const std::vector<std::string>& extra = {}, const std::string& log = {})
        : _dir(dir)
    {
        _pid = fork();
        if (_pid == 0) {
            if (!log.empty()) {
                int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
                if (fd >= 0) {
                    dup2(fd, 2);
                    ::close(fd);
                }
            }
            std::string bin = SOFTBLK_FAT_BIN;
            std::vector<std::string> args = {bin, "mount", image, dir, "-f"};
            args.insert(args.end(), extra.begin(), extra.end());
            std::vector<char*> argv;
            for (auto& a : args) {
                argv.push_back(a.data());
            }
            argv.push_back(nullptr);
            execv(bin.c_str(), argv.data());
            _exit(127);
        }
        for (int i = 0; i < 100 && !is_mounted(dir); ++i) {
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
            int st = 0;
            if (waitpid(_pid, &st, WNOHANG) == _pid) {
                _pid = -1;
                break;
            }
        }
    }
    fuse_mount(const fuse_mount&) = delete;
    fuse_mount& operator=(const fuse_mount&) = delete;

    bool ok() const { return _pid > 0 && is_mounted(_dir); }
    pid_t pid() const { return _pid; }
    // Unmounts and waits for the server; returns its exit status.
    int unmount()
    {
        if (_pid <= 0) {
            return -1;
        }
        run("fusermount3 -u " + quote(_dir));
        int st = 0;
        for (int i = 0; i < 100; ++i) {
            if (waitpid(_pid, &st, WNOHANG) == _pid) {
                _pid = -1;
                return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        kill(_pid, SIGKILL);
        waitpid(_pid, &st, 0);
        _pid = -1;
        return -1;
    }
    ~fuse_mount()
    {
        if (_pid > 0) {
            run("fusermount3 -u -z " + quote(_dir));
            unmount();
        }
    }

private:
    std::string _dir;
    pid_t _pid = -1;
};

// A fresh 32 MiB FAT image for a mount test.
inline std::string make_image(const temp_dir& tmp)
{
    std::string img = tmp / "fuse.img";
    auto dev = file_block_device::create(img, 32u << 20);
    EXPECT_TRUE(dev.has_value());
    if (dev) {
        EXPECT_TRUE(format(**dev).has_value());
    }
    return img;
}

inline bool exists(const std::string& path)
{
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0;
}

inline bool create_file(const std::string& path)
{
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd < 0) {
        return false;
    }
    ::close(fd);
    return true;
}

// Skips a test where FUSE or the tools a mount test needs are missing.
#define FAT_REQUIRE_FUSE()                                      \
    do {                                                        \
        if (access("/dev/fuse", R_OK | W_OK) != 0) {            \
            GTEST_SKIP() << "SKIP: /dev/fuse is not available"; \
        }                                                       \
        FAT_REQUIRE_TOOL("fusermount3");                        \
        FAT_REQUIRE_TOOL("fsck.fat");                           \
    } while (0)

}  // namespace fat_test
