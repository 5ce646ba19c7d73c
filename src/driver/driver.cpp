// softblk-driver: creates devices in-process and serves them through one
// export type, for tests and benchmarks that must not depend on the daemon.
// Its devices live in the host library's device table (src/host,
// softblk::host::device_host: the daemon's, state files under
// RUN_DIR/devices); the export type's hooks (cleanup_stale, saved_exports,
// host_features) do the rest: it names no front end in its code, so every
// export type linked in (fuse, nbd, ublk, ...) is served the same way.
//
//   softblk-driver --export TYPE [--run-dir DIR] [-o KEY=VALUE]...
//                  [--ready-file FILE] [--commands] [--recover NAME]...
//                  [NAME TARGET [KEY=VALUE]... [, NAME TARGET [KEY=VALUE]...]...]
//
// At start it removes what dead processes left in the run directory
// (cleanup_stale), creates and exports the devices of the command line
// (each with the -o export options), re-creates and takes over the saved
// exports named by --recover (ublk devices kept for recovery), prints one
// JSON line per export (its description with "name"), then "ready", and
// writes the same lines to the ready file. It serves until SIGINT or
// SIGTERM, or with --commands until "quit" or the end of stdin, then stops
// every export and exits 0 (1 when one did not stop; 1 with a message on
// stderr when the start failed; 2 for usage errors).
//
// With --commands it reads one command per line on stdin and answers one
// line on stdout, "ok[ JSON]" or "error MESSAGE":
//   add NAME TARGET [KEY=VALUE]... [-- EXPORT_KEY=VALUE...]
//                     create and export a device (export options: the -o
//                     ones, then these; of a single-valued option the later
//                     wins); answers its JSON
//   del NAME          stop the export and destroy the device
//   recover NAME      as --recover
//   list              {"exports": {NAME: description}, "saved": [...]}
//                     ("saved": the type's saved_exports, where it has them)
//   devices           [device ...]: every device as the daemon's `list`
//                     (`softblk list --json`) gives it: one code path, the
//                     host library's device table (src/host)
//   features          the type's host_features (ublk: the kernel's bits)
//   cleanup           the type's cleanup_stale
//   crash             _exit(9) at once, leaving everything behind
//   quit              stop every export and exit
#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <pthread.h>
#include <poll.h>
#include <span>
#include <sstream>
#include <string>
#include <sys/signalfd.h>
#include <type_traits>
#include <unistd.h>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <softblk/device.hpp>
#include <softblk/frontend.hpp>
#include <softblk/support/trusted_dir.hpp>

#include "device_host.hpp"
#include "run_dir.hpp"
#include "version.hpp"

namespace {

using nlohmann::json;
using softblk::result;

constexpr int k_exit_failure = 1;
constexpr int k_exit_usage = 2;

std::string dump(const json& j)
{
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

// The devices this process serves, each with its export: the host
// library's device table (softblk::host::device_host, the daemon's), with
// its state files under RUN_DIR/devices, so that the driver's `devices`
// answer and the daemon's `list` come from one code path. Control thread
// (the main thread) only.
class device_table {
public:
    device_table(const softblk::export_type& type, softblk::export_context ctx,
                 std::vector<std::string> export_options)
        : _type(type),
          _ctx(ctx),
          _export_options(std::move(export_options)),
          _host(std::move(ctx), state_dir(_ctx))
    {
    }

    // Where the host keeps one state file per device.
    static std::string state_dir(const softblk::export_context& ctx)
    {
        return ctx.run_dir + "/devices";
    }

    const softblk::export_context& context() const { return _ctx; }
    const std::vector<std::string>& export_options() const { return _export_options; }

    // Creates device NAME and starts the export on it with exactly
    // `export_options`. Returns the export's description with "name".
    result<json> add(const std::string& name, const std::string& target,
                     std::span<const std::string> device_options,
                     std::span<const std::string> export_options)
    {
        if (_host.contains(name)) {
            return softblk::make_error(EEXIST,
                                       fmt::format("{}: a device of that name exists", name));
        }
        softblk::host::add_request request{
            .type = target,
            .name = name,
            .options = {device_options.begin(), device_options.end()},
            .export_type = std::string(_type.name),
            .export_options = {export_options.begin(), export_options.end()},
            .config = {}};
        auto added = _host.add(request);
        if (!added) {
            return std::unexpected(added.error());
        }
        return description(name, (*added)["export"]);
    }

    // Re-creates the device of the saved export NAME from the settings the
    // host library saved for it (RUN_DIR/devices/NAME.json) and starts the
    // export with them, which takes over what the dead process left (the
    // export's own state says whether it can).
    result<json> recover(const std::string& name)
    {
        if (!_type.saved_exports) {
            return softblk::make_error(
                EOPNOTSUPP, fmt::format("{}: export type {} keeps no state across processes; "
                                        "nothing to recover",
                                        name, _type.name));
        }
        auto saved = _type.saved_exports(_ctx);
        if (!saved) {
            return std::unexpected(saved.error());
        }
        for (const softblk::saved_export& s : *saved) {
            if (s.device != name) {
                continue;
            }
            if (!s.recoverable) {
                return softblk::make_error(
                    EAGAIN, fmt::format("{}: the saved {} export cannot be taken over ({}): "
                                        "nothing to recover",
                                        name, _type.name, dump(s.state)));
            }
            auto settings = _host.read_saved(name);
            if (!settings) {
                return softblk::make_error(
                    settings.error().code.value(),
                    fmt::format("{}: the {} export can be taken over, but the device's "
                                "settings cannot be read: {}",
                                name, _type.name, settings.error().message));
            }
            if (settings->export_type != _type.name) {
                return softblk::make_error(
                    EINVAL, fmt::format("{}: its saved settings name export type {}, not {}", name,
                                        settings->export_type, _type.name));
            }
            return add(name, settings->type, settings->options, settings->export_options);
        }
        return softblk::make_error(
            ENOENT, fmt::format("{}: no saved {} export under {}", name, _type.name, _ctx.run_dir));
    }

    // Stops the export and destroys the device. When the export refuses to
    // stop (in use), both stay and the error says why.
    result<void> del(const std::string& name)
    {
        if (!_host.contains(name)) {
            return softblk::make_error(ENOENT, fmt::format("{}: no such device", name));
        }
        auto removed = _host.remove(name);
        if (!removed) {
            return std::unexpected(removed.error());
        }
        return {};
    }

    // Every device as the daemon's `list` gives it (device_host::list).
    json devices() const { return _host.list(); }

    result<json> list() const
    {
        json out = {{"exports", json::object()}};
        for (const json& d : _host.list()) {
            const std::string name = d.value("name", "");
            out["exports"][name] = description(name, d.value("export", json::object()));
        }
        if (_type.saved_exports) {
            auto saved = _type.saved_exports(_ctx);
            if (!saved) {
                return std::unexpected(saved.error());
            }
            out["saved"] = json::array();
            for (const softblk::saved_export& s : *saved) {
                json entry = s.state;
                entry["device"] = s.device;
                // The device's settings are the host library's.
                if (auto settings = _host.read_saved(s.device)) {
                    entry["target_type"] = settings->type;
                }
                entry["recoverable"] = s.recoverable;
                out["saved"].push_back(std::move(entry));
            }
        }
        return out;
    }

    result<json> features() const
    {
        if (!_type.host_features) {
            return softblk::make_error(
                EOPNOTSUPP,
                fmt::format("export type {} reports no features of this machine", _type.name));
        }
        return _type.host_features();
    }

    void cleanup() const
    {
        if (_type.cleanup_stale) {
            _type.cleanup_stale(_ctx);
        }
    }

    // Stops every export and destroys the devices (their state files go).
    // Returns false when one did not stop (said on stderr); the host stops
    // those by force when it goes.
    bool stop_all()
    {
        auto removed = _host.remove_all();
        if (!removed) {
            fmt::print(stderr, "softblk-driver: {}\n", removed.error().message);
            return false;
        }
        return true;
    }

private:
    // The export's part of the host's JSON (its describe() with "type")
    // and the device's name: what the driver prints for an export.
    static json description(const std::string& name, json exp)
    {
        exp["name"] = name;
        return exp;
    }

    const softblk::export_type& _type;
    softblk::export_context _ctx;
    std::vector<std::string> _export_options;  // -o: every export's defaults
    softblk::host::device_host _host;
};

std::string ok(const json& j)
{
    return "ok " + dump(j);
}

std::string error_line(const softblk::error& e)
{
    std::string line = "error " + e.message;
    std::replace(line.begin(), line.end(), '\n', ' ');  // one line per answer
    return line;
}

template <class T>
std::string answer(const result<T>& r)
{
    if (!r) {
        return error_line(r.error());
    }
    if constexpr (std::is_void_v<T>) {
        return "ok";
    } else {
        return ok(*r);
    }
}

// Runs one command line of the --commands protocol and returns the answer
// line; sets `quit` for "quit".
std::string run_command(device_table& table, const std::string& line, bool& quit)
{
    std::istringstream in(line);
    std::vector<std::string> words;
    for (std::string w; in >> w;) {
        words.push_back(std::move(w));
    }
    if (words.empty()) {
        return "error empty command";  // only blanks other than space, tab and CR
    }
    const std::string& command = words[0];
    auto needs = [&](size_t n, const char* usage) -> std::string {
        return words.size() < n ? fmt::format("error usage: {}", usage) : std::string();
    };
    if (command == "add") {
        if (auto u = needs(3, "add NAME TARGET [KEY=VALUE]... [-- EXPORT_KEY=VALUE...]");
            !u.empty()) {
            return u;
        }
        std::vector<std::string> device_options;
        std::vector<std::string> export_options = table.export_options();
        bool after_dashes = false;
        for (size_t i = 3; i < words.size(); ++i) {
            if (words[i] == "--" && !after_dashes) {
                after_dashes = true;
            } else {
                (after_dashes ? export_options : device_options).push_back(words[i]);
            }
        }
        return answer(table.add(words[1], words[2], device_options, export_options));
    }
    if (command == "del") {
        if (auto u = needs(2, "del NAME"); !u.empty()) {
            return u;
        }
        return answer(table.del(words[1]));
    }
    if (command == "recover") {
        if (auto u = needs(2, "recover NAME"); !u.empty()) {
            return u;
        }
        return answer(table.recover(words[1]));
    }
    if (command == "list") {
        return answer(table.list());
    }
    if (command == "devices") {
        return ok(table.devices());
    }
    if (command == "features") {
        return answer(table.features());
    }
    if (command == "cleanup") {
        table.cleanup();
        return "ok";
    }
    if (command == "crash") {
        std::_Exit(9);
    }
    if (command == "quit") {
        quit = true;
        return "ok";
    }
    return fmt::format(
        "error {}: unknown command (add, del, recover, list, devices, features, cleanup, crash, "
        "quit)",
        command);
}

void print_line(const std::string& line)
{
    fmt::print("{}\n", line);
    std::fflush(stdout);  // the caller waits for it
}

// Serves until SIGINT/SIGTERM (signal_fd readable) or, with `commands`,
// until "quit" or the end of stdin, running the commands read meanwhile.
void serve(device_table& table, int signal_fd, bool commands)
{
    std::string pending;
    bool quit = false;
    while (!quit) {
        pollfd fds[2] = {{.fd = signal_fd, .events = POLLIN, .revents = 0},
                         {.fd = STDIN_FILENO, .events = POLLIN, .revents = 0}};
        if (::poll(fds, commands ? 2 : 1, -1) < 0) {
            if (errno == EINTR) {
                continue;
            }
            fmt::print(stderr, "softblk-driver: poll: {}\n", std::strerror(errno));
            return;
        }
        if (fds[0].revents != 0) {
            return;  // SIGINT or SIGTERM
        }
        if (!commands || fds[1].revents == 0) {
            continue;
        }
        char buf[4096];
        const ssize_t n = ::read(STDIN_FILENO, buf, sizeof buf);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        const bool eof = n <= 0;
        if (!eof) {
            pending.append(buf, static_cast<size_t>(n));
        } else if (!pending.empty()) {
            pending += '\n';  // a last line without its newline
        }
        size_t start = 0;
        for (size_t nl; !quit && (nl = pending.find('\n', start)) != std::string::npos;
             start = nl + 1) {
            const std::string line = pending.substr(start, nl - start);
            if (line.find_first_not_of(" \t\r") != std::string::npos) {
                print_line(run_command(table, line, quit));
            }
        }
        pending.erase(0, start);
        quit = quit || eof;
    }
}

// Writes `text` to `path` atomically (a temporary file renamed over it), so
// that a reader polling for the file never sees half of it.
bool write_ready_file(const std::string& path, const std::string& text)
{
    return softblk::write_file_atomically(path, text, 0644, false).has_value();
}

struct arguments {
    std::string export_type;
    std::string run_dir;
    std::vector<std::string> export_options;
    std::string ready_file;
    bool commands = false;
    std::vector<std::string> recover;
    std::vector<std::string> devices;  // NAME TARGET [KEY=VALUE]... [, ...]
};

// Splits the positional arguments at "," into NAME TARGET [KEY=VALUE]...
result<std::vector<std::vector<std::string>>> split_devices(const std::vector<std::string>& args)
{
    std::vector<std::vector<std::string>> out;
    if (args.empty()) {
        return out;
    }
    out.emplace_back();
    for (const std::string& a : args) {
        if (a == ",") {
            out.emplace_back();
        } else {
            out.back().push_back(a);
        }
    }
    for (const auto& d : out) {
        if (d.size() < 2) {
            return softblk::make_error(
                EINVAL, fmt::format("'{}': a device is NAME TARGET [KEY=VALUE]...; devices are "
                                    "separated by ','",
                                    fmt::join(d, " ")));
        }
    }
    return out;
}

std::string linked_export_types()
{
    std::vector<std::string_view> names;
    for (const softblk::export_type* t : softblk::export_types()) {
        names.push_back(t->name);
    }
    return names.empty() ? std::string("none") : fmt::format("{}", fmt::join(names, ", "));
}

int run(const arguments& args)
{
    const softblk::export_type* type = softblk::find_export_type(args.export_type);
    if (type == nullptr) {
        fmt::print(stderr, "softblk-driver: --export {}: no such export type in this build ({})\n",
                   args.export_type, linked_export_types());
        return k_exit_usage;
    }
    std::string run_dir = args.run_dir;
    if (run_dir.empty()) {
        const char* env = std::getenv("SOFTBLK_RUN_DIR");
        run_dir = env != nullptr ? env : "";
    }
    if (run_dir.empty()) {
        fmt::print(stderr,
                   "softblk-driver: no run directory: give --run-dir DIR or set SOFTBLK_RUN_DIR "
                   "(the exports put their mounts, sockets and state below it)\n");
        return k_exit_usage;
    }
    auto devices = split_devices(args.devices);
    if (!devices) {
        fmt::print(stderr, "softblk-driver: {}\n", devices.error().message);
        return k_exit_usage;
    }
    if (devices->empty() && args.recover.empty() && !args.commands) {
        fmt::print(stderr,
                   "softblk-driver: nothing to serve: give devices (NAME TARGET "
                   "[KEY=VALUE]...), --recover NAME or --commands\n");
        return k_exit_usage;
    }

    // SIGINT and SIGTERM end the service through a signalfd; blocked before
    // any export starts a thread, so that every thread inherits the mask.
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
    const int signal_fd = ::signalfd(-1, &stop_signals, SFD_CLOEXEC);
    if (signal_fd < 0) {
        fmt::print(stderr, "softblk-driver: signalfd: {}\n", std::strerror(errno));
        return k_exit_failure;
    }
    std::signal(SIGPIPE, SIG_IGN);  // a client or reader that goes away is not fatal

    // spdlog's default logger writes to stdout, which carries the answers:
    // the host library's warnings go to stderr.
    spdlog::set_default_logger(spdlog::stderr_logger_mt("softblk-driver"));
    const softblk::export_context ctx{.run_dir = std::filesystem::absolute(run_dir),
                                      .privileged = ::geteuid() == 0};
    if (auto made = softblk::host::make_directories(device_table::state_dir(ctx), 0700); !made) {
        fmt::print(stderr, "softblk-driver: {}\n", made.error().message);
        return k_exit_failure;
    }
    device_table table(*type, ctx, args.export_options);
    table.cleanup();
    std::string ready;
    auto started = [&](const std::string& name, const result<json>& r) {
        if (!r) {
            fmt::print(stderr, "softblk-driver: {}: {}\n", name, r.error().message);
            return false;
        }
        ready += dump(*r) + "\n";
        print_line(dump(*r));
        return true;
    };
    for (const auto& d : *devices) {
        const std::vector<std::string> options(d.begin() + 2, d.end());
        if (!started(d[0], table.add(d[0], d[1], options, table.export_options()))) {
            table.stop_all();
            return k_exit_failure;
        }
    }
    for (const std::string& name : args.recover) {
        if (!started(name, table.recover(name))) {
            table.stop_all();
            return k_exit_failure;
        }
    }
    ready += "ready\n";
    print_line("ready");
    if (!args.ready_file.empty() && !write_ready_file(args.ready_file, ready)) {
        fmt::print(stderr, "softblk-driver: --ready-file {}: {}\n", args.ready_file,
                   std::strerror(errno));
        table.stop_all();
        return k_exit_failure;
    }

    serve(table, signal_fd, args.commands);
    return table.stop_all() ? 0 : k_exit_failure;
}

}  // namespace

int main(int argc, char** argv)
{
    arguments args;
    CLI::App app{
        "softblk-driver: creates devices in-process and serves them through one export "
        "type, for tests and benchmarks (see the header of src/driver/driver.cpp)"};
    app.set_version_flag("--version", std::string("softblk-driver ") + softblk::version_string());
    app.add_option("--export", args.export_type, "export type: fuse, nbd, ublk ...")->required();
    app.add_option("--run-dir", args.run_dir,
                   "where the exports put their mounts, sockets and state (default: "
                   "$SOFTBLK_RUN_DIR)");
    app.add_option("-o,--export-opt", args.export_options,
                   "export option KEY=VALUE for every export (repeatable)")
        ->allow_extra_args(false);
    app.add_option("--ready-file", args.ready_file,
                   "written (atomically) with the exports' JSON lines and 'ready' once they run");
    app.add_flag("--commands", args.commands,
                 "read commands on stdin (add, del, recover, list, features, cleanup, crash, "
                 "quit) until quit or its end");
    app.add_option("--recover", args.recover,
                   "re-create and take over the saved export NAME (repeatable)")
        ->allow_extra_args(false);
    app.add_option("devices", args.devices,
                   "NAME TARGET [KEY=VALUE]... [, NAME TARGET [KEY=VALUE]...]...");
    try {
        app.parse(argc, argv);
    } catch (const CLI::CallForHelp& e) {
        return app.exit(e);
    } catch (const CLI::ParseError& e) {
        return app.exit(e) == 0 ? 0 : k_exit_usage;  // 0: --version
    }
    return run(args);
}
