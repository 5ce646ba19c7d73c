#include "daemon.hpp"

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <softblk/support/trusted_dir.hpp>
#include <softblk/memory_store.hpp>

#include "service_manager.hpp"

namespace softblk::cli {

namespace {

using clock = std::chrono::steady_clock;

std::string read_pid_file(const std::string& path)
{
    char buf[32] = {};
    auto fd = open_no_follow(path, O_RDONLY);
    if (!fd) {
        return "?";
    }
    const ssize_t n = ::read(*fd, buf, sizeof buf - 1);
    ::close(*fd);
    std::string pid(buf, n > 0 ? static_cast<size_t>(n) : 0);
    while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) {
        pid.pop_back();
    }
    return pid.empty() ? "?" : pid;
}

// spdlog's file sinks open by name and follow links; this one writes to a
// descriptor opened with open_no_follow (O_NOFOLLOW), which it owns.
class fd_sink final : public spdlog::sinks::base_sink<std::mutex> {
public:
    explicit fd_sink(int fd) : _fd(fd) {}
    ~fd_sink() override { ::close(_fd); }

protected:
    void sink_it_(const spdlog::details::log_msg& msg) override
    {
        spdlog::memory_buf_t text;
        formatter_->format(msg, text);
        size_t done = 0;
        while (done < text.size()) {
            const ssize_t n = ::write(_fd, text.data() + done, text.size() - done);
            if (n < 0 && errno == EINTR) {
                continue;
            }
            if (n <= 0) {
                return;  // a full disk loses log lines, not the daemon
            }
            done += static_cast<size_t>(n);
        }
    }
    void flush_() override {}

private:
    int _fd;
};

result<void> setup_logging(const run_paths& paths, bool to_stderr)
{
    auto fd = open_no_follow(paths.log, O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (!fd) {
        return std::unexpected(fd.error());
    }
    std::vector<spdlog::sink_ptr> sinks{std::make_shared<fd_sink>(*fd)};
    sinks.front()->set_pattern("%Y-%m-%d %H:%M:%S.%e [%l] %v");
    if (to_stderr && stderr_is_journal()) {
        // Under systemd: levels as the journal's priorities, its own time.
        sinks.push_back(make_journal_stream_sink());
    } else if (to_stderr) {
        sinks.push_back(std::make_shared<spdlog::sinks::stderr_sink_mt>());
        sinks.back()->set_pattern("%Y-%m-%d %H:%M:%S.%e [%l] %v");
    }
    auto logger = std::make_shared<spdlog::logger>("softblk", sinks.begin(), sinks.end());
    logger->flush_on(spdlog::level::info);
    spdlog::set_default_logger(logger);
    return {};
}

// "m0 (/dev/loop3 is mounted on /mnt (ext4)), m1 (...)".
std::string busy_list(const std::vector<std::pair<std::string, std::string>>& busy)
{
    std::vector<std::string> parts;
    for (const auto& [name, why] : busy) {
        parts.push_back(fmt::format("{} ({})", name, why));
    }
    return fmt::format("{}", fmt::join(parts, ", "));
}

}  // namespace

control_service::control_service(device_host& host, run_paths paths, control_server& server,
                                 const daemon_options& options)
    : _host(host),
      _paths(std::move(paths)),
      _server(server),
      _stop_timeout(options.stop_timeout),
      _memory(options.memory),
      _metrics(options.metrics),
      _started(clock::now())
{
}

std::optional<result<nlohmann::json>> control_service::add(const nlohmann::json& params,
                                                           const reply_token& token)
{
    if (!_stop_reason.empty()) {
        return make_error(ESHUTDOWN,
                          fmt::format("the daemon is stopping ({}); add devices once it has "
                                      "stopped (the next command starts a new daemon)",
                                      _stop_reason));
    }
    add_request req;
    auto type = param_string(params, "type", true);
    auto name = param_string(params, "name", false);
    auto options = param_strings(params, "options");
    auto exp = param_string(params, "export", false);
    auto export_options = param_strings(params, "export_options");
    auto config = param_string(params, "config", false);
    for (const auto* err :
         {type ? nullptr : &type.error(), name ? nullptr : &name.error(),
          options ? nullptr : &options.error(), exp ? nullptr : &exp.error(),
          export_options ? nullptr : &export_options.error(), config ? nullptr : &config.error()}) {
        if (err != nullptr) {
            return std::unexpected(*err);
        }
    }
    req.type = *type;
    req.name = *name;
    req.options = std::move(*options);
    req.export_type = *exp;
    req.export_options = std::move(*export_options);
    req.config = std::move(*config);
    // The device is made (its back end connected, its export started) on
    // a job thread; the reply comes when it is done (tick).
    auto added = _host.begin_add(req);
    if (!added) {
        return std::unexpected(added.error());
    }
    _jobs.push_back({token, *added});
    return std::nullopt;
}

std::optional<result<nlohmann::json>> control_service::set(const nlohmann::json& params,
                                                           const reply_token& token)
{
    auto name = param_string(params, "name", true);
    auto options = param_strings(params, "options");
    auto force = param_bool(params, "force", false);
    for (const auto* err : {name ? nullptr : &name.error(), options ? nullptr : &options.error(),
                            force ? nullptr : &force.error()}) {
        if (err != nullptr) {
            return std::unexpected(*err);
        }
    }
    if (!_stop_reason.empty()) {
        return make_error(ESHUTDOWN, fmt::format("the daemon is stopping ({})", _stop_reason));
    }
    auto done = _host.begin_set(*name, *options, *force);
    if (done) {
        return done;
    }
    _jobs.push_back({token, *name});
    return std::nullopt;
}

std::optional<result<nlohmann::json>> control_service::del(const nlohmann::json& params,
                                                           const reply_token& token)
{
    auto all = param_bool(params, "all", false);
    if (!all) {
        return std::unexpected(all.error());
    }
    auto name = param_string(params, "name", false);
    if (!name) {
        return std::unexpected(name.error());
    }
    if (*all && !name->empty()) {
        return make_error(EINVAL, "give a device name or \"all\", not both");
    }
    if (!*all && name->empty()) {
        return make_error(EINVAL, "missing parameter \"name\" (or \"all\": true)");
    }
    pending_del d;
    d.token = token;
    d.all = *all;
    d.deadline = clock::now() + _stop_timeout;
    const std::vector<std::string> names = *all ? _host.names() : std::vector<std::string>{*name};
    for (const std::string& n : names) {
        // A device already being removed: wait for that teardown.
        if (!_host.stopping(n)) {
            if (auto started = _host.begin_remove(n, false, false); !started) {
                d.failures.push_back(started.error().message);
                d.code = started.error().code.value();
                continue;
            }
        }
        if (_host.stopping(n)) {
            d.waiting.push_back(n);
        } else {
            d.deleted.push_back(n);  // a failed entry: gone at once
        }
    }
    if (d.waiting.empty()) {
        return outcome(d);
    }
    _dels.push_back(std::move(d));
    return std::nullopt;
}

result<nlohmann::json> control_service::outcome(const pending_del& d) const
{
    std::vector<std::string> messages = d.failures;
    int code = d.code;
    std::vector<std::string> stuck;
    std::vector<std::string> busy;
    for (const std::string& name : d.waiting) {
        (_host.busy(name).empty() ? stuck : busy).push_back(name);
    }
    if (!stuck.empty()) {
        messages.push_back(fmt::format(
            "{}: the export did not stop within {} s (a request the device does not complete?); "
            "the device keeps stopping in the background and leaves `softblk list` when it is "
            "done, its state file with it",
            fmt::join(stuck, ", "), _stop_timeout.count() / 1000.0));
        code = ETIMEDOUT;
    }
    for (const std::string& name : busy) {
        messages.push_back(fmt::format(
            "{}: still {} after {} s (a back end that does not answer?); it is removed when "
            "that ends, and leaves `softblk list` then",
            name, _host.busy(name), _stop_timeout.count() / 1000.0));
        code = ETIMEDOUT;
    }
    if (messages.empty()) {
        return d.all ? nlohmann::json{{"deleted", d.deleted}}
                     : nlohmann::json{{"name", d.deleted.at(0)}};
    }
    const std::string text =
        d.all ? fmt::format("{} device(s) stayed: {}", d.failures.size() + d.waiting.size(),
                            fmt::join(messages, "; "))
              : fmt::format("{}", fmt::join(messages, "; "));
    return make_error(code != 0 ? code : EBUSY, text);
}

result<nlohmann::json> control_service::shutdown(const nlohmann::json& params)
{
    auto force = param_bool(params, "force", false);
    if (!force) {
        return std::unexpected(force.error());
    }
    const auto busy = _host.in_use();
    if (!*force && !busy.empty()) {
        return make_error(
            EBUSY,
            fmt::format("cannot shut down: {} device{} in use: {}. Unmount {} and run `softblk "
                        "shutdown` again{}; `softblk shutdown --force` stops anyway (a mounted "
                        "file system then gets I/O errors; its loop device detaches itself when "
                        "it is unmounted)",
                        busy.size(), busy.size() == 1 ? " is" : "s are", busy_list(busy),
                        busy.size() == 1 ? "it" : "them",
                        _stop_reason.empty()
                            ? ""
                            : fmt::format(" (the daemon is stopping already, {}, and stops "
                                          "once they are released)",
                                          _stop_reason)));
    }
    // Devices being deleted lose their state file; the others keep it.
    const size_t kept = _host.size() - _host.stopping_since(clock::time_point::max()).size();
    begin_stop(*force ? "shutdown --force requested by a client" : "shutdown requested by a client",
               *force);
    return nlohmann::json{
        {"pid", ::getpid()}, {"devices_kept", kept}, {"stop_timeout_ms", _stop_timeout.count()}};
}

nlohmann::json control_service::status() const
{
    const auto up = clock::now() - _started;
    const memory_budget& budget = process_memory_budget();
    nlohmann::json out{
        {"pid", ::getpid()},
        {"uid", ::geteuid()},
        {"run_dir", _paths.dir},
        {"log", _paths.log},
        {"devices", _host.size()},
        // Devices of the state files not back yet (the command that started
        // the daemon waits for them: client.cpp).
        {"recovering", _host.recovering()},
        {"uptime_ms", std::chrono::duration_cast<std::chrono::milliseconds>(up).count()},
        {"state", _stop_reason.empty() ? "running" : "stopping"},
        {"memory",
         {{"used_bytes", budget.used()},
          {"limit_bytes", budget.limit()},
          {"limit_source", _memory.source},
          {"refused", budget.refused()}}},
    };
    if (!_metrics.listen.empty()) {
        out["metrics"]["listen"] = _metrics.listen;
    }
    if (!_metrics.textfile.empty()) {
        out["metrics"]["textfile"] = _metrics.textfile;
        out["metrics"]["interval_s"] = _metrics.interval.count();
    }
    if (!_stop_reason.empty()) {
        out["stopping_reason"] = _stop_reason;
    }
    return out;
}

std::optional<result<nlohmann::json>> control_service::handle(const request& req,
                                                              const reply_token& token)
{
    const std::string& m = req.method;
    if (m == "add") {
        return add(req.params, token);
    }
    if (m == "del") {
        return del(req.params, token);
    }
    if (m == "list") {
        return _host.list();
    }
    if (m == "set") {
        return set(req.params, token);
    }
    if (m == "get") {
        auto name = param_string(req.params, "name", true);
        auto keys = param_strings(req.params, "keys");
        for (const auto* err : {name ? nullptr : &name.error(), keys ? nullptr : &keys.error()}) {
            if (err != nullptr) {
                return std::unexpected(*err);
            }
        }
        return _host.get(*name, *keys);
    }
    if (m == "zone") {
        auto name = param_string(req.params, "name", true);
        if (!name) {
            return std::unexpected(name.error());
        }
        auto zone_req = parse_zone_params(req.params);
        if (!zone_req) {
            return std::unexpected(zone_req.error());
        }
        return _host.zone(*name, *zone_req);
    }
    if (m == "features") {
        auto type = param_string(req.params, "type", false);
        if (!type) {
            return std::unexpected(type.error());
        }
        return features_json(*type);
    }
    if (m == "status") {
        return status();
    }
    if (m == "shutdown") {
        return shutdown(req.params);
    }
    return make_error(EOPNOTSUPP,
                      fmt::format("unknown method '{}' (known: add, del, set, get, zone, list, "
                                  "features, status, shutdown)",
                                  m.size() > 64 ? m.substr(0, 64) + "..." : m));
}

void control_service::begin_stop(std::string reason, bool force)
{
    if (_stop_reason.empty()) {
        _stop_since = clock::now();
        spdlog::info("stopping: {}", reason);
        notify_service_manager(fmt::format("STOPPING=1\nSTATUS=stopping: {}", reason));
    } else {
        spdlog::info("{} (already stopping: {})", reason, _stop_reason);
    }
    _stop_reason = std::move(reason);
    _stop_force = _stop_force || force;
    _next_release_check = {};
    stop_released_devices();
}

void control_service::stop_released_devices()
{
    const auto now = clock::now();
    if (now < _next_release_check) {
        return;
    }
    // Looking costs an open() per loop device: once a second is enough.
    _next_release_check = now + std::chrono::seconds(1);
    const auto busy = _stop_force ? decltype(_host.in_use()){} : _host.in_use();
    for (const std::string& name : _host.names()) {
        if (_host.stopping(name) ||
            std::any_of(busy.begin(), busy.end(), [&](const auto& b) { return b.first == name; })) {
            continue;
        }
        if (auto started = _host.begin_remove(name, true, _stop_force); !started) {
            spdlog::warn("stopping {}: {}", name, started.error().message);
        }
    }
    if (const std::string text = busy_list(busy); !busy.empty() && text != _busy_logged) {
        spdlog::warn(
            "{}: {} stay{} in use; the daemon stops once released (unmount; or `softblk "
            "shutdown --force`)",
            _stop_reason, text, busy.size() == 1 ? "s" : "");
        notify_service_manager(fmt::format("STATUS=stopping once released (unmount): {}", text));
        _busy_logged = text;
    }
}

void control_service::on_signal(const std::string& name)
{
    begin_stop(name, false);
}

void control_service::report_status()
{
    const size_t recovering = _host.recovering().size();
    std::string text = fmt::format("STATUS=serving {} device(s)", _host.size());
    if (recovering > 0) {
        text += fmt::format(", {} recovering", recovering);
    }
    if (text != _status_sent) {
        notify_service_manager(text);
        _status_sent = std::move(text);
    }
}

void control_service::tick()
{
    device_host::reaped done = _host.reap();
    for (device_host::completion& c : done.completions) {
        // An add or set a client waits for (a recovery, and the adds of
        // nr_devices, have none).
        auto it = std::find_if(_jobs.begin(), _jobs.end(), [&](const pending_job& p) {
            return p.name == c.name && p.token.method == c.method;
        });
        if (it != _jobs.end()) {
            _server.reply(it->token, c.outcome);
            _jobs.erase(it);
        }
    }
    for (device_host::removal& r : done.removals) {
        for (pending_del& d : _dels) {
            auto it = std::find(d.waiting.begin(), d.waiting.end(), r.name);
            if (it == d.waiting.end()) {
                continue;
            }
            d.waiting.erase(it);
            if (r.outcome) {
                d.deleted.push_back(r.name);
            } else {
                d.failures.push_back(r.outcome.error().message);
                d.code = r.outcome.error().code.value();
            }
        }
    }
    const auto now = clock::now();
    std::erase_if(_dels, [&](pending_del& d) {
        if (d.waiting.empty() || now >= d.deadline) {
            _server.reply(d.token, outcome(d));
            return true;
        }
        return false;
    });
    if (_stop_reason.empty()) {
        report_status();
        return;
    }
    stop_released_devices();
    if (_host.size() == 0) {
        _server.request_stop(_stop_reason);
        return;
    }
    // Teardowns that outlast the stop timeout (counted from the shutdown
    // at the earliest) are given up on: the daemon exits without them.
    if (now - _stop_since >= _stop_timeout && _host.running() == 0 &&
        _host.stopping_since(now - _stop_timeout).size() == _host.size()) {
        const auto stuck = _host.stopping_since(now - _stop_timeout);
        spdlog::error(
            "{}: giving up on {} (their exports did not stop, or their jobs did not "
            "end, within {} s)",
            _stop_reason, fmt::join(stuck, ", "), _stop_timeout.count() / 1000.0);
        for (const pending_del& d : _dels) {
            _server.reply(d.token, outcome(d));
        }
        _dels.clear();
        for (const pending_job& j : _jobs) {
            _server.reply(j.token,
                          make_error(ESHUTDOWN, fmt::format("{}: the daemon stopped ({}) before "
                                                            "it was done",
                                                            j.name, _stop_reason)));
        }
        _jobs.clear();
        _server.request_stop(_stop_reason);
    }
}

int run_daemon(const run_paths& paths, const daemon_options& options)
{
    const bool privileged = ::geteuid() == 0;
    if (auto prepared = prepare_run_dir(paths); !prepared) {
        fmt::print(stderr, "softblk daemon: {}\n", prepared.error().message);
        return 1;
    }
    // One daemon per run directory: the lock is held until the process ends.
    auto lock = open_no_follow(paths.lock, O_RDWR | O_CREAT, 0600);
    if (!lock) {
        fmt::print(stderr, "softblk daemon: {}\n", lock.error().message);
        return 1;
    }
    const int lock_fd = *lock;
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

    if (auto logging = setup_logging(paths, options.log_to_stderr); !logging) {
        fmt::print(stderr, "softblk daemon: {}\n", logging.error().message);
        ::close(lock_fd);
        return 1;
    }
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

    // The metrics' listener and textfile (none unless asked for): a port in
    // use or a path that cannot be written fails the start here, before the
    // pid file and the devices.
    daemon_options served = options;
    std::unique_ptr<metrics_publisher> metrics;
    if (!options.metrics.textfile.empty() || !options.metrics.listen.empty()) {
        auto started =
            metrics_publisher::start(options.metrics, [paths] { return collect_metrics(paths); });
        if (!started) {
            spdlog::error("{}", started.error().message);
            spdlog::shutdown();
            ::close(lock_fd);
            return 1;
        }
        metrics = std::move(*started);
        served.metrics.listen = metrics->listening();
        if (!served.metrics.listen.empty()) {
            spdlog::info("metrics on http://{}/metrics", served.metrics.listen);
        }
    }

    if (auto written =
            write_file_atomically(paths.pid, fmt::format("{}\n", ::getpid()), 0644, false);
        !written) {
        spdlog::error("{}", written.error().message);
        return 1;
    }
    spdlog::info("daemon {} starting in {} ({})", ::getpid(), paths.dir,
                 privileged ? "root" : "unprivileged");
    process_memory_budget().set_limit(options.memory.bytes);
    spdlog::info("memory budget for device data: {} ({})",
                 options.memory.bytes == 0 ? "no limit" : human_bytes(options.memory.bytes),
                 options.memory.source);

    int status = 0;
    {
        device_host host(export_context{.run_dir = paths.dir, .privileged = privileged},
                         paths.devices);
        if (!options.module_parameters.empty()) {
            // Checked by the command before the daemon started.
            (void)set_option_defaults("null", options.module_parameters);
            spdlog::info("module parameters for null devices: {}",
                         fmt::join(options.module_parameters, " "));
        }
        // null_blk's nr_devices: that many devices with the module's
        // defaults, named as the module names them (a name recovery brings
        // back counts), made after the recovered ones.
        std::vector<add_request> nr_devices;
        for (unsigned i = 0; i < options.nr_devices; ++i) {
            add_request req;
            req.type = "null";
            req.name = fmt::format("nullb{}", i);
            nr_devices.push_back(std::move(req));
        }
        // On the recovery thread: the socket opens at once, and `list`
        // shows the devices "recovering" until they are back.
        (void)host.begin_recover(nr_devices);
        server_limits limits;
        limits.request_timeout = options.client_timeout;
        auto server = control_server::listen(paths.socket, limits);
        if (!server) {
            spdlog::error("{}", server.error().message);
            status = 1;
        } else {
            spdlog::info("listening on {}", paths.socket);
            // The socket accepts from here on: a unit's ExecStartPost
            // (`softblk apply`) may connect. Devices still recovering are
            // listed as such meanwhile.
            notify_service_manager("READY=1");
            control_server& srv = **server;
            control_service service(host, paths, srv, served);
            if (metrics) {
                // The textfile's first metrics, now that the socket answers.
                metrics->begin();
                if (!options.metrics.textfile.empty()) {
                    spdlog::info("metrics to {} every {} s", options.metrics.textfile,
                                 options.metrics.interval.count());
                }
            }
            loop_hooks hooks;
            hooks.fds = {signal_fd, host.wake_fd()};
            hooks.on_ready = [&](int fd) {
                if (fd == host.wake_fd()) {
                    host.clear_wake();
                    return;
                }
                signalfd_siginfo info{};
                while (::read(signal_fd, &info, sizeof info) == sizeof info) {
                    service.on_signal(
                        sigabbrev_np(static_cast<int>(info.ssi_signo)) != nullptr
                            ? fmt::format("SIG{}", sigabbrev_np(static_cast<int>(info.ssi_signo)))
                            : "a signal");
                }
            };
            hooks.on_tick = [&] { service.tick(); };
            const std::string reason =
                srv.run([&service](const request& req,
                                   const reply_token& token) { return service.handle(req, token); },
                        hooks);
            spdlog::info("stopped serving: {}", reason);
            srv.close();
            // After the socket: a scrape waiting for an answer gets an
            // error instead of holding the listener's shutdown.
            metrics.reset();
        }
        const std::vector<std::string> stuck = host.abandon_stopping();
        const size_t kept = host.size();
        host.stop_all();
        if (kept > 0) {
            spdlog::info("{} device(s) stopped; their state stays in {} for the next daemon", kept,
                         paths.devices);
        }
        if (!stuck.empty()) {
            // Their teardown threads still hold the devices: returning
            // would destroy what they use. End the process here.
            spdlog::error("daemon {} exits with {} export(s) not stopped: {}", ::getpid(),
                          stuck.size(), fmt::join(stuck, ", "));
            ::unlink(paths.pid.c_str());
            spdlog::shutdown();
            ::_exit(status);
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
