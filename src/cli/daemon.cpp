#include "daemon.hpp"

#include <cerrno>
#include <csignal>
#include <cstring>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include "control_server.hpp"

namespace softblk::cli {

namespace {

std::string read_pid_file(const std::string& path)
{
    char buf[32] = {};
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return "?";
    }
    const ssize_t n = ::read(fd, buf, sizeof buf - 1);
    ::close(fd);
    std::string pid(buf, n > 0 ? static_cast<size_t>(n) : 0);
    while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) {
        pid.pop_back();
    }
    return pid.empty() ? "?" : pid;
}

result<void> write_pid_file(const std::string& path)
{
    const std::string text = fmt::format("{}\n", ::getpid());
    const std::string tmp = path + ".tmp";
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0 || ::write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
        const int e = errno;
        if (fd >= 0) {
            ::close(fd);
        }
        return make_error(e, fmt::format("cannot write {}: {}", tmp, std::strerror(e)));
    }
    ::close(fd);
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
        return make_error(errno, fmt::format("cannot rename {}: {}", tmp, std::strerror(errno)));
    }
    return {};
}

void setup_logging(const run_paths& paths, bool to_stderr)
{
    std::vector<spdlog::sink_ptr> sinks;
    try {
        sinks.push_back(std::make_shared<spdlog::sinks::basic_file_sink_mt>(paths.log, false));
    } catch (const spdlog::spdlog_ex& e) {
        // Without a log file the daemon still runs; say so where we can.
        fmt::print(stderr, "softblk daemon: cannot open {}: {}\n", paths.log, e.what());
    }
    if (to_stderr) {
        sinks.push_back(std::make_shared<spdlog::sinks::stderr_sink_mt>());
    }
    auto logger = std::make_shared<spdlog::logger>("softblk", sinks.begin(), sinks.end());
    logger->set_pattern("%Y-%m-%d %H:%M:%S.%e [%l] %v");
    logger->flush_on(spdlog::level::info);
    spdlog::set_default_logger(logger);
}

}  // namespace

control_service::control_service(device_host& host, run_paths paths,
                                 std::function<void(std::string)> stop)
    : _host(host),
      _paths(std::move(paths)),
      _stop(std::move(stop)),
      _started(std::chrono::steady_clock::now())
{
}

result<nlohmann::json> control_service::add(const nlohmann::json& params)
{
    add_request req;
    auto type = param_string(params, "type", true);
    auto name = param_string(params, "name", false);
    auto options = param_strings(params, "options");
    auto exp = param_string(params, "export", false);
    auto export_options = param_strings(params, "export_options");
    for (const auto* err : {type ? nullptr : &type.error(), name ? nullptr : &name.error(),
                            options ? nullptr : &options.error(), exp ? nullptr : &exp.error(),
                            export_options ? nullptr : &export_options.error()}) {
        if (err != nullptr) {
            return std::unexpected(*err);
        }
    }
    req.type = *type;
    req.name = *name;
    req.options = std::move(*options);
    req.export_type = *exp;
    req.export_options = std::move(*export_options);
    return _host.add(req);
}

result<nlohmann::json> control_service::del(const nlohmann::json& params)
{
    auto all = param_bool(params, "all", false);
    if (!all) {
        return std::unexpected(all.error());
    }
    auto name = param_string(params, "name", false);
    if (!name) {
        return std::unexpected(name.error());
    }
    if (*all) {
        if (!name->empty()) {
            return make_error(EINVAL, "give a device name or \"all\", not both");
        }
        return _host.remove_all();
    }
    if (name->empty()) {
        return make_error(EINVAL, "missing parameter \"name\" (or \"all\": true)");
    }
    return _host.remove(*name);
}

result<nlohmann::json> control_service::handle(const request& req)
{
    const std::string& m = req.method;
    if (m == "add") {
        return add(req.params);
    }
    if (m == "del") {
        return del(req.params);
    }
    if (m == "list") {
        return _host.list();
    }
    if (m == "features") {
        auto type = param_string(req.params, "type", false);
        if (!type) {
            return std::unexpected(type.error());
        }
        return features_json(*type);
    }
    if (m == "status") {
        const auto up = std::chrono::steady_clock::now() - _started;
        return nlohmann::json{
            {"pid", ::getpid()},
            {"uid", ::geteuid()},
            {"run_dir", _paths.dir},
            {"log", _paths.log},
            {"devices", _host.size()},
            {"uptime_ms", std::chrono::duration_cast<std::chrono::milliseconds>(up).count()},
        };
    }
    if (m == "shutdown") {
        _stop("shutdown requested by a client");
        return nlohmann::json{{"pid", ::getpid()}, {"devices_kept", _host.size()}};
    }
    return make_error(EOPNOTSUPP,
                      fmt::format("unknown method '{}' (known: add, del, list, features, status, "
                                  "shutdown)",
                                  m.size() > 64 ? m.substr(0, 64) + "..." : m));
}

int run_daemon(const run_paths& paths, const daemon_options& options)
{
    const bool privileged = ::geteuid() == 0;
    if (auto made = make_directories(paths.dir, 0755); !made) {
        fmt::print(stderr, "softblk daemon: {}\n", made.error().message);
        return 1;
    }
    if (auto made = make_directories(paths.devices, 0700); !made) {
        fmt::print(stderr, "softblk daemon: {}\n", made.error().message);
        return 1;
    }
    // One daemon per run directory: the lock is held until the process ends.
    const int lock_fd = ::open(paths.lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (lock_fd < 0) {
        fmt::print(stderr, "softblk daemon: cannot open {}: {}\n", paths.lock,
                   std::strerror(errno));
        return 1;
    }
    if (::flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
        if (errno == EWOULDBLOCK) {
            fmt::print(stderr, "softblk daemon: another daemon (pid {}) serves {}\n",
                       read_pid_file(paths.pid), paths.dir);
            ::close(lock_fd);
            return k_exit_already_running;
        }
        fmt::print(stderr, "softblk daemon: cannot lock {}: {}\n", paths.lock,
                   std::strerror(errno));
        ::close(lock_fd);
        return 1;
    }

    setup_logging(paths, options.log_to_stderr);
    // Termination signals arrive through a signalfd; they are blocked
    // before any thread starts so that every thread inherits the mask.
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGHUP);
    ::pthread_sigmask(SIG_BLOCK, &mask, nullptr);
    const int signal_fd = ::signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    ::signal(SIGPIPE, SIG_IGN);

    if (auto written = write_pid_file(paths.pid); !written) {
        spdlog::error("{}", written.error().message);
        return 1;
    }
    spdlog::info("daemon {} starting in {} ({})", ::getpid(), paths.dir,
                 privileged ? "root" : "unprivileged");

    int status = 0;
    {
        device_host host(export_context{.run_dir = paths.dir, .privileged = privileged},
                         paths.devices);
        const nlohmann::json recovered = host.recover();
        if (!recovered["recovered"].empty() || !recovered["failed"].empty()) {
            spdlog::info("recovery: {} device(s) re-created, {} failed",
                         recovered["recovered"].size(), recovered["failed"].size());
        }
        server_limits limits;
        limits.request_timeout = options.client_timeout;
        auto server = control_server::listen(paths.socket, limits);
        if (!server) {
            spdlog::error("{}", server.error().message);
            status = 1;
        } else {
            spdlog::info("listening on {}", paths.socket);
            control_server& srv = **server;
            control_service service(host, paths,
                                    [&srv](std::string reason) { srv.request_stop(reason); });
            const std::string reason =
                srv.run([&service](const request& req) { return service.handle(req); }, signal_fd);
            spdlog::info("stopping: {}", reason);
            srv.close();
        }
        const size_t kept = host.size();
        host.stop_all();
        if (kept > 0) {
            spdlog::info("{} device(s) stopped; their state stays in {} for the next daemon", kept,
                         paths.devices);
        }
    }
    ::unlink(paths.pid.c_str());
    spdlog::info("daemon {} stopped", ::getpid());
    spdlog::shutdown();
    if (signal_fd >= 0) {
        ::close(signal_fd);
    }
    ::close(lock_fd);
    return status;
}

}  // namespace softblk::cli
