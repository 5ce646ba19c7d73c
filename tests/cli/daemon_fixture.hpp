// The fixture of the tests that run the `softblk` executable and its
// daemon: each test has its own run directory (SOFTBLK_RUN_DIR, never the
// real /run/softblk), becomes the subreaper of the daemons it starts, and
// kills them by pid in TearDown even when it fails.
#pragma once

#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <poll.h>
#include <set>
#include <string>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include <nlohmann/json.hpp>

#include "raw_client.hpp"

namespace softblk::test {

using nlohmann::json;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

struct run_result {
    int status = -1;  // exit status, or -1 if killed / timed out
    std::string out;
    std::string err;
};

class daemon_test : public ::testing::Test {
protected:
    void SetUp() override
    {
        // Daemons whose parent (a `softblk` client) exits become our
        // children, so that we can reap them and know they are gone.
        ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
        char tmpl[] = "/tmp/softblk-cli.XXXXXX";
        ASSERT_NE(::mkdtemp(tmpl), nullptr);
        _dir = tmpl;
        ::setenv("SOFTBLK_RUN_DIR", _dir.c_str(), 1);
    }

    void TearDown() override
    {
        remember_daemon();
        for (pid_t pid : _daemons) {
            stop_process(pid);
        }
        reap();
        ::unsetenv("SOFTBLK_RUN_DIR");
        std::error_code ec;
        fs::remove_all(_dir, ec);
    }

    std::string socket_path() const { return _dir + "/control.sock"; }

    // Runs the softblk executable with `args`; kills it after `timeout`.
    run_result softblk(std::vector<std::string> args, std::chrono::seconds timeout = 60s)
    {
        int out_pipe[2];
        int err_pipe[2];
        run_result result;
        if (::pipe2(out_pipe, O_CLOEXEC) != 0 || ::pipe2(err_pipe, O_CLOEXEC) != 0) {
            ADD_FAILURE() << "pipe: " << std::strerror(errno);
            return result;
        }
        std::vector<char*> argv;
        std::string bin = SOFTBLK_BIN;
        argv.push_back(bin.data());
        for (auto& a : args) {
            argv.push_back(a.data());
        }
        argv.push_back(nullptr);
        const pid_t pid = ::fork();
        if (pid == 0) {
            ::dup2(out_pipe[1], STDOUT_FILENO);
            ::dup2(err_pipe[1], STDERR_FILENO);
            ::execv(bin.c_str(), argv.data());
            _exit(127);
        }
        ::close(out_pipe[1]);
        ::close(err_pipe[1]);
        const auto deadline = std::chrono::steady_clock::now() + timeout;
        bool out_open = true;
        bool err_open = true;
        while ((out_open || err_open) && std::chrono::steady_clock::now() < deadline) {
            pollfd p[2] = {{out_open ? out_pipe[0] : -1, POLLIN, 0},
                           {err_open ? err_pipe[0] : -1, POLLIN, 0}};
            if (::poll(p, 2, 200) <= 0) {
                continue;
            }
            char buf[4096];
            for (int i = 0; i < 2; ++i) {
                if (p[i].revents == 0) {
                    continue;
                }
                const ssize_t n = ::read(p[i].fd, buf, sizeof buf);
                if (n <= 0) {
                    (i == 0 ? out_open : err_open) = false;
                } else {
                    (i == 0 ? result.out : result.err).append(buf, static_cast<size_t>(n));
                }
            }
        }
        ::close(out_pipe[0]);
        ::close(err_pipe[0]);
        if (out_open || err_open) {
            ::kill(pid, SIGKILL);
            ADD_FAILURE() << "softblk did not finish within " << timeout.count()
                          << " s (or left its output open)";
        }
        int status = 0;
        ::waitpid(pid, &status, 0);
        result.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        remember_daemon();
        return result;
    }

    // softblk with --json output, parsed; fails the test on error.
    json softblk_json(std::vector<std::string> args)
    {
        args.push_back("--json");
        run_result r = softblk(args);
        EXPECT_EQ(r.status, 0) << r.err;
        json parsed = json::parse(r.out, nullptr, false);
        EXPECT_FALSE(parsed.is_discarded()) << "not JSON: " << r.out;
        return parsed;
    }

    pid_t daemon_pid() const
    {
        std::ifstream in(_dir + "/daemon.pid");
        pid_t pid = 0;
        in >> pid;
        return pid;
    }
    void remember_daemon()
    {
        if (const pid_t pid = daemon_pid(); pid > 0) {
            _daemons.insert(pid);
        }
    }

    static bool gone(pid_t pid)
    {
        int status = 0;
        const pid_t r = ::waitpid(pid, &status, WNOHANG);
        if (r == pid) {
            return true;
        }
        if (::kill(pid, 0) != 0 && errno == ESRCH) {
            return true;
        }
        // A zombie of someone else's: gone as far as we care.
        std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
        std::string line;
        std::getline(stat, line);
        const size_t paren = line.rfind(')');
        return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'Z';
    }
    static bool wait_gone(pid_t pid, std::chrono::milliseconds timeout)
    {
        const auto deadline = std::chrono::steady_clock::now() + timeout;
        while (!gone(pid)) {
            if (std::chrono::steady_clock::now() >= deadline) {
                return false;
            }
            std::this_thread::sleep_for(20ms);
        }
        return true;
    }
    static void stop_process(pid_t pid)
    {
        if (gone(pid)) {
            return;
        }
        ::kill(pid, SIGTERM);
        if (!wait_gone(pid, 10s)) {
            ::kill(pid, SIGKILL);
            wait_gone(pid, 5s);
        }
    }
    static void reap()
    {
        while (::waitpid(-1, nullptr, WNOHANG) > 0) {
        }
    }

    // Processes (other than this one) whose environment names our run dir.
    std::vector<pid_t> processes_of_this_run_dir() const
    {
        std::vector<pid_t> found;
        const std::string needle = "SOFTBLK_RUN_DIR=" + _dir;
        for (const auto& entry : fs::directory_iterator("/proc")) {
            const std::string name = entry.path().filename();
            if (name.find_first_not_of("0123456789") != std::string::npos) {
                continue;
            }
            const pid_t pid = std::stoi(name);
            if (pid == ::getpid() || gone(pid)) {
                continue;
            }
            std::ifstream env(entry.path() / "environ", std::ios::binary);
            std::string var;
            while (std::getline(env, var, '\0')) {
                if (var == needle) {
                    found.push_back(pid);
                    break;
                }
            }
        }
        return found;
    }

    json list() { return softblk_json({"list"}); }
    static std::set<std::string> names(const json& list)
    {
        std::set<std::string> out;
        for (const json& d : list) {
            out.insert(d["name"].get<std::string>());
        }
        return out;
    }

    std::string _dir;
    std::set<pid_t> _daemons;
};

}  // namespace softblk::test
