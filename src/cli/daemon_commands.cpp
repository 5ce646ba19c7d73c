// `softblk daemon`, `status`, `recover` and `shutdown`: starting, asking
// and stopping the daemon that hosts the devices.
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <unistd.h>
#include <vector>

#include <fmt/format.h>

#include <softblk/options.hpp>

#include "daemon.hpp"
#include "memory_limit.hpp"
#include "run_dir.hpp"
#include "subcommand.hpp"

namespace softblk::cli {

namespace {

using nlohmann::json;

struct daemon_command {
    std::vector<std::string> module_parameters;  // null_blk's, nr_devices included
    bool foreground = false;
    bool quiet = false;
    int client_timeout_ms = 10'000;
    std::string memory_limit;  // "" the default
    int stop_timeout_ms = 30'000;
    metrics_options metrics;
    int metrics_interval_s = 15;
};

int run_daemon_command(const daemon_command& cmd)
{
    auto paths = resolve_run_paths();
    if (!paths) {
        return fail(paths.error());
    }
    // Checked here too, so that a bad value is reported to the user and
    // not only in the background daemon's log.
    auto machine = read_machine_memory();
    if (!machine) {
        return fail(machine.error());
    }
    auto memory = choose_memory_limit(cmd.memory_limit, *machine);
    if (!memory) {
        return fail(memory.error());
    }
    // null_blk's module parameters, checked here so that a bad one is
    // reported to the user, not only in the background daemon's log.
    std::vector<std::string> module_parameters;
    unsigned nr_devices = 0;
    for (const std::string& p : cmd.module_parameters) {
        if (p.starts_with("nr_devices=")) {
            auto n = softblk::parse_kernel_unsigned(std::string_view(p).substr(11), 1024);
            if (!n) {
                fmt::print(stderr, "softblk daemon: {}: nr_devices takes 0 to 1024 devices\n", p);
                return k_exit_usage;
            }
            nr_devices = static_cast<unsigned>(*n);
        } else {
            module_parameters.push_back(p);
        }
    }
    if (auto checked = softblk::set_option_defaults("null", module_parameters); !checked) {
        return fail(checked.error());
    }
    // The metrics' listener and textfile, checked here too (address, port
    // in use, directory) so that the user sees what is wrong; the daemon
    // checks again as it binds.
    metrics_options metrics = cmd.metrics;
    metrics.interval = std::chrono::seconds(cmd.metrics_interval_s);
    if (!metrics.textfile.empty()) {
        // The daemon started in the background runs elsewhere.
        std::error_code ec;
        const std::filesystem::path absolute = std::filesystem::absolute(metrics.textfile, ec);
        if (ec) {
            return fail(make_error(ec.value(), fmt::format("--metrics-textfile {}: {}",
                                                           metrics.textfile, ec.message()))
                            .error());
        }
        metrics.textfile = absolute.string();
    }
    if (auto checked = check_metrics_options(metrics); !checked) {
        return fail(checked.error());
    }
    if (cmd.foreground) {
        daemon_options options;
        options.module_parameters = module_parameters;
        options.nr_devices = nr_devices;
        options.log_to_stderr = !cmd.quiet;
        options.client_timeout = std::chrono::milliseconds(cmd.client_timeout_ms);
        options.memory = *memory;
        options.stop_timeout = std::chrono::milliseconds(cmd.stop_timeout_ms);
        options.metrics = metrics;
        return run_daemon(*paths, options);
    }
    if (const int fd = connect_socket(paths->socket); fd >= 0) {
        ::close(fd);
        fmt::print(stderr, "softblk: a daemon already serves {}\n", paths->dir);
        return k_exit_failure;
    }
    std::vector<std::string> args = {"--client-timeout", std::to_string(cmd.client_timeout_ms),
                                     "--stop-timeout", std::to_string(cmd.stop_timeout_ms)};
    if (!cmd.memory_limit.empty()) {
        args.insert(args.end(), {"--memory-limit", cmd.memory_limit});
    }
    if (!metrics.textfile.empty()) {
        args.insert(args.end(), {"--metrics-textfile", metrics.textfile, "--metrics-interval",
                                 std::to_string(cmd.metrics_interval_s)});
    }
    if (!metrics.listen.empty()) {
        args.insert(args.end(), {"--metrics-listen", metrics.listen});
    }
    args.insert(args.end(), cmd.module_parameters.begin(), cmd.module_parameters.end());
    auto started = start_daemon(*paths, std::chrono::seconds(60), args);
    if (!started) {
        return fail(started.error());
    }
    auto client = control_client::connect(*paths, false);
    if (client) {
        if (auto status = client->call("status", json::object()); status) {
            fmt::print("daemon {} serves {} (log: {})\n", status->value("pid", 0), paths->dir,
                       paths->log);
            return 0;
        }
    }
    fmt::print("daemon started for {} (log: {})\n", paths->dir, paths->log);
    return 0;
}

int run_status(bool json_output)
{
    auto client = connect(false);
    if (!client) {
        return fail(client.error());
    }
    auto res = client->call("status", json::object());
    if (!res) {
        return fail(res.error());
    }
    if (json_output) {
        fmt::print("{}\n", dump(*res));
    } else {
        fmt::print("daemon {} (uid {}) serves {} with {} device(s), up {:.1f} s; log: {}\n",
                   res->value("pid", 0), res->value("uid", 0), res->value("run_dir", std::string()),
                   res->value("devices", 0), res->value("uptime_ms", 0) / 1000.0,
                   res->value("log", std::string()));
        const json memory = res->value("memory", json::object());
        const uint64_t limit = memory.value("limit_bytes", uint64_t{0});
        fmt::print("device memory: {} of {} ({})\n",
                   human_bytes(memory.value("used_bytes", uint64_t{0})),
                   limit == 0 ? std::string("no limit") : human_bytes(limit),
                   memory.value("limit_source", std::string()));
        if (res->value("state", std::string()) == "stopping") {
            fmt::print("stopping: {}\n", res->value("stopping_reason", std::string()));
        }
    }
    return 0;
}

int run_shutdown(bool force)
{
    auto paths = resolve_run_paths();
    if (!paths) {
        return fail(paths.error());
    }
    auto client = control_client::connect(*paths, false);
    if (!client) {
        if (client.error().code.value() == ENOENT || client.error().code.value() == ECONNREFUSED) {
            fmt::print("no daemon is running for {}\n", paths->dir);
            return 0;
        }
        return fail(client.error());
    }
    auto res = client->call("shutdown", force ? json{{"force", true}} : json::object());
    if (!res) {
        return fail(res.error());
    }
    // The daemon gives up on exports that do not stop within its stop
    // timeout; wait that long and a margin.
    const auto wait =
        std::chrono::milliseconds(res->value("stop_timeout_ms", 30'000)) + std::chrono::seconds(30);
    if (!wait_for_daemon_exit(*paths, wait)) {
        fmt::print(stderr, "softblk: daemon {} did not exit within {} s\n", res->value("pid", 0),
                   std::chrono::duration_cast<std::chrono::seconds>(wait).count());
        return k_exit_failure;
    }
    const unsigned kept = res->value("devices_kept", 0u);
    fmt::print("daemon {} stopped", res->value("pid", 0));
    if (kept > 0) {
        fmt::print(
            "; {} device(s) kept in {}: the next command brings them back (`softblk del --all` "
            "removes "
            "them)",
            kept, paths->devices);
    }
    fmt::print("\n");
    return 0;
}

}  // namespace

void define_daemon(CLI::App& app, subcommand_table& table)
{
    auto daemon = std::make_shared<daemon_command>();
    CLI::App* cmd =
        app.add_subcommand("daemon", "start the daemon (normally started by the first command)");
    cmd->add_option("module_parameters", daemon->module_parameters,
                    "null_blk's module parameters for null devices (gb=1 bs=4096 "
                    "poll_queues=2 ...) and nr_devices=N: that many devices nullb0.. "
                    "with them at start");
    cmd->add_flag("--foreground", daemon->foreground,
                  "run in this process until shutdown, SIGTERM or SIGINT");
    cmd->add_flag("--quiet", daemon->quiet, "log to the log file only, not to stderr");
    cmd->add_option("--client-timeout", daemon->client_timeout_ms,
                    "milliseconds a client may take to send a request or read a reply")
        ->check(CLI::Range(100, 3'600'000));
    cmd->add_option(
        "--memory-limit", daemon->memory_limit,
        "most memory the devices' data may take, all devices together: a size (64M, 4G), a share "
        "of the machine's memory (25%) or none; default 50% of MemTotal or of the cgroup's "
        "memory limit, whichever is smaller. Writes past it fail with ENOSPC");
    cmd->add_option("--stop-timeout", daemon->stop_timeout_ms,
                    "milliseconds del and shutdown wait for an export to stop before giving up "
                    "on it (it goes on stopping in the background)")
        ->check(CLI::Range(100, 3'600'000));
    CLI::Option* textfile = cmd->add_option(
        "--metrics-textfile", daemon->metrics.textfile,
        "write the metrics (`softblk metrics`) to this .prom file for node_exporter's "
        "textfile collector, replaced atomically every --metrics-interval; removed "
        "when the daemon stops");
    cmd->add_option("--metrics-interval", daemon->metrics_interval_s,
                    "seconds between two writes of --metrics-textfile (default 15)")
        ->check(CLI::Range(1, 86'400))
        ->needs(textfile);
    cmd->add_option("--metrics-listen", daemon->metrics.listen,
                    "serve the metrics over HTTP (GET /metrics) on IPV4:PORT or [IPV6]:PORT, "
                    "e.g. 127.0.0.1:9560 (port 0: any free one, `status --json` shows it); off "
                    "unless given");
    table.push_back({cmd, [daemon] { return run_daemon_command(*daemon); }});
}

void define_status(CLI::App& app, subcommand_table& table)
{
    auto json_output = std::make_shared<bool>(false);
    CLI::App* cmd = app.add_subcommand("status", "show whether a daemon runs, its pid and devices");
    cmd->add_flag("--json", *json_output, "print JSON");
    table.push_back({cmd, [json_output] { return run_status(*json_output); }});
}

void define_recover(CLI::App& app, subcommand_table& table)
{
    CLI::App* cmd = app.add_subcommand(
        "recover",
        "start a daemon if none runs (it re-creates and re-exports every device from its state "
        "file, re-attaching the kernel devices that outlived their daemon, such as ublk's with "
        "recovery=) and list the devices");
    // Recovery is what every daemon does when it starts; this command only
    // makes sure one has started.
    table.push_back({cmd, [] { return run_list(false); }});
}

void define_shutdown(CLI::App& app, subcommand_table& table)
{
    auto force = std::make_shared<bool>(false);
    CLI::App* cmd = app.add_subcommand(
        "shutdown",
        "stop the daemon and every export; device state stays for the next daemon. Refused while "
        "an export is in use (a file system mounted on its loop device)");
    cmd->add_flag("--force", *force,
                  "stop even exports in use: their mounted file systems get I/O errors");
    table.push_back({cmd, [force] { return run_shutdown(*force); }});
}

}  // namespace softblk::cli
