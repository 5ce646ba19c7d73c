#include "client.hpp"

#include <cerrno>
#include <climits>
#include <cstring>
#include <fcntl.h>
#include <sstream>
#include <poll.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

#include <fmt/format.h>

#include "protocol.hpp"

#include <softblk/support/trusted_dir.hpp>

namespace softblk::cli {

namespace {

using clock = std::chrono::steady_clock;

// The last lines of the daemon's log, to explain a failed start (never
// through a link planted as the log).
std::string log_tail(const std::string& path, size_t lines)
{
    auto fd = open_no_follow(path, O_RDONLY);
    if (!fd) {
        return "\n  " + fd.error().message;
    }
    std::string text;
    char buf[65536];
    for (ssize_t n; (n = ::read(*fd, buf, sizeof buf)) > 0;) {
        text.append(buf, static_cast<size_t>(n));
        if (text.size() > (1u << 20)) {
            text.erase(0, text.size() - (1u << 20));
        }
    }
    ::close(*fd);
    std::vector<std::string> all;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
        all.push_back(line);
    }
    std::string out;
    for (size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i) {
        out += "\n  " + all[i];
    }
    return out;
}

std::string self_exe()
{
    char buf[PATH_MAX];
    const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n <= 0) {
        return "softblk";
    }
    return std::string(buf, static_cast<size_t>(n));
}

}  // namespace

int connect_socket(const std::string& socket_path)
{
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (socket_path.size() >= sizeof addr.sun_path) {
        return -ENAMETOOLONG;
    }
    std::memcpy(addr.sun_path, socket_path.c_str(), socket_path.size() + 1);
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return -errno;
    }
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
        const int e = errno;
        ::close(fd);
        return -e;
    }
    return fd;
}

namespace {

// The daemon recovers its devices on a thread of its own, answering
// requests meanwhile; the command that started it waits until they are back
// (`status` lists none "recovering"), up to `deadline`, so that it and the
// commands after it find them as a daemon that recovered before it opened
// its socket let them. A device that takes longer (a back end that does not
// answer) is left to `softblk list`.
void wait_for_recovery(const run_paths& paths, clock::time_point deadline)
{
    auto client = control_client::connect(paths, false);
    if (!client) {
        return;
    }
    for (;;) {
        auto status = client->call("status", nlohmann::json::object(), std::chrono::seconds(10));
        if (!status || !status->is_object()) {
            return;
        }
        const nlohmann::json recovering = status->value("recovering", nlohmann::json::array());
        if (!recovering.is_array() || recovering.empty()) {
            return;
        }
        if (clock::now() >= deadline) {
            fmt::print(stderr,
                       "softblk: the daemon is still recovering {} (softblk list shows when it "
                       "is back)\n",
                       recovering.dump());
            return;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
}

}  // namespace

result<pid_t> start_daemon(const run_paths& paths, std::chrono::milliseconds timeout,
                           const std::vector<std::string>& extra_args)
{
    if (auto prepared = prepare_run_dir(paths); !prepared) {
        return std::unexpected(prepared.error());
    }
    // The daemon's output goes to its log, opened here so that a link
    // planted as the log is reported, not followed.
    auto log = open_no_follow(paths.log, O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (!log) {
        return std::unexpected(log.error());
    }
    const int log_fd = *log;
    const std::string exe = self_exe();
    // Built before fork: the child only calls async-signal-safe functions.
    std::vector<const char*> argv = {exe.c_str(), "daemon", "--foreground", "--quiet"};
    for (const std::string& arg : extra_args) {
        argv.push_back(arg.c_str());
    }
    argv.push_back(nullptr);
    const pid_t pid = ::fork();
    if (pid < 0) {
        const int e = errno;
        ::close(log_fd);
        return make_error(e, fmt::format("fork: {}", std::strerror(e)));
    }
    if (pid == 0) {
        // The daemon: its own session, no terminal, output to the log, no
        // file descriptor of ours (a pipe held open would keep whoever reads
        // our output waiting).
        ::setsid();
        const int null_fd = ::open("/dev/null", O_RDWR);
        if (null_fd >= 0) {
            ::dup2(null_fd, STDIN_FILENO);
        }
        ::dup2(log_fd, STDOUT_FILENO);
        ::dup2(log_fd, STDERR_FILENO);
        ::close_range(3, ~0u, 0);
        if (::chdir("/") != 0) {
            _exit(1);
        }
        ::execv(exe.c_str(), const_cast<char* const*>(argv.data()));
        ::dprintf(STDERR_FILENO, "softblk: cannot run %s: %s\n", exe.c_str(), std::strerror(errno));
        _exit(127);
    }
    ::close(log_fd);
    const auto deadline = clock::now() + timeout;
    bool child_running = true;
    for (;;) {
        const int fd = connect_socket(paths.socket);
        if (fd >= 0) {
            ::close(fd);
            wait_for_recovery(paths, deadline);
            return pid;
        }
        if (child_running) {
            int status = 0;
            if (::waitpid(pid, &status, WNOHANG) == pid) {
                child_running = false;
                const bool other = WIFEXITED(status) && WEXITSTATUS(status) == 3;
                if (!other) {
                    return make_error(
                        EIO, fmt::format("the daemon exited at start ({} {}); from {}:{}",
                                         WIFEXITED(status) ? "status" : "signal",
                                         WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status),
                                         paths.log, log_tail(paths.log, 5)));
                }
                // Another daemon holds the lock and is starting: wait for it.
            }
        }
        if (clock::now() >= deadline) {
            return make_error(
                ETIMEDOUT,
                fmt::format("the daemon did not open {} within {} s; see {}:{}", paths.socket,
                            timeout.count() / 1000, paths.log, log_tail(paths.log, 5)));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
}

bool wait_for_daemon_exit(const run_paths& paths, std::chrono::milliseconds timeout)
{
    const auto deadline = clock::now() + timeout;
    for (;;) {
        const int fd = ::open(paths.lock.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0) {
            return true;
        }
        const bool free = ::flock(fd, LOCK_EX | LOCK_NB) == 0;
        ::close(fd);
        if (free) {
            return true;
        }
        if (clock::now() >= deadline) {
            return false;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
}

result<control_client> control_client::connect(const run_paths& paths, bool autostart)
{
    // A socket in a directory others control could be anyone's.
    if (struct stat st{}; ::lstat(paths.dir.c_str(), &st) == 0) {
        if (auto ok = check_run_dir(paths); !ok) {
            return std::unexpected(ok.error());
        }
    }
    int fd = connect_socket(paths.socket);
    if (fd == -ENOENT || fd == -ECONNREFUSED) {
        if (!autostart) {
            return make_error(
                -fd, fmt::format("no daemon is running for {} (its socket {} does not answer)",
                                 paths.dir, paths.socket));
        }
        auto started = start_daemon(paths, std::chrono::seconds(60));
        if (!started) {
            return std::unexpected(started.error());
        }
        fd = connect_socket(paths.socket);
    }
    if (fd < 0) {
        return make_error(
            -fd, fmt::format("cannot connect to {}: {}", paths.socket, std::strerror(-fd)));
    }
    return control_client(fd, paths);
}

control_client::control_client(control_client&& other) noexcept
    : _fd(std::exchange(other._fd, -1)),
      _paths(std::move(other._paths)),
      _next_id(other._next_id),
      _buffer(std::move(other._buffer))
{
}

control_client::~control_client()
{
    if (_fd >= 0) {
        ::close(_fd);
    }
}

result<nlohmann::json> control_client::call(std::string_view method, const nlohmann::json& params,
                                            std::chrono::milliseconds timeout)
{
    const int64_t id = _next_id++;
    const std::string line = format_request(id, method, params);
    size_t sent = 0;
    while (sent < line.size()) {
        const ssize_t n = ::send(_fd, line.data() + sent, line.size() - sent, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0) {
            return make_error(errno,
                              fmt::format("cannot send to the daemon: {}", std::strerror(errno)));
        }
        sent += static_cast<size_t>(n);
    }
    const auto deadline = clock::now() + timeout;
    for (;;) {
        const size_t newline = _buffer.find('\n');
        if (newline != std::string::npos) {
            const std::string reply_line = _buffer.substr(0, newline);
            _buffer.erase(0, newline + 1);
            nlohmann::json reply = nlohmann::json::parse(reply_line, nullptr, false);
            if (reply.is_discarded() || !reply.is_object()) {
                return make_error(EPROTO, "the daemon sent a reply that is not a JSON object");
            }
            if (auto it = reply.find("id");
                it != reply.end() && it->is_number_integer() && it->get<int64_t>() != id) {
                continue;  // not ours (cannot happen with one request at a time)
            }
            if (auto err = reply.find("error"); err != reply.end() && err->is_object()) {
                const int code = err->value("code", -EIO);
                return make_error(code < 0 ? -code : (code > 0 ? code : EIO),
                                  err->value("message", std::string("error without a message")));
            }
            if (auto res = reply.find("result"); res != reply.end()) {
                return std::move(*res);
            }
            return make_error(EPROTO, "the daemon's reply has neither \"result\" nor \"error\"");
        }
        const auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now());
        if (left.count() <= 0) {
            return make_error(ETIMEDOUT, fmt::format("no reply from the daemon to '{}' within {} s",
                                                     method, timeout.count() / 1000));
        }
        pollfd p{_fd, POLLIN, 0};
        const int ready = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), INT_MAX)));
        if (ready < 0 && errno != EINTR) {
            return make_error(errno, fmt::format("poll: {}", std::strerror(errno)));
        }
        if (ready <= 0) {
            continue;
        }
        char buf[65536];
        const ssize_t n = ::recv(_fd, buf, sizeof buf, 0);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            return make_error(ECONNRESET,
                              fmt::format("the daemon closed the connection during '{}' (did it "
                                          "stop or crash? see {})",
                                          method, _paths.log));
        }
        _buffer.append(buf, static_cast<size_t>(n));
    }
}

}  // namespace softblk::cli
