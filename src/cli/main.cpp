// `softblk`: creates, lists and removes softblk devices through the daemon
// that hosts them (started on demand), and runs that daemon. The CLI edge:
// the only place where exceptions (CLI11's) are caught.
#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <unistd.h>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <softblk/device.hpp>

#include "add_flags.hpp"
#include "bench_command.hpp"
#include "client.hpp"
#include "daemon.hpp"
#include "device_host.hpp"
#include "memory_limit.hpp"
#include "nullb_fs.hpp"
#include "run_dir.hpp"
#include "version.hpp"
#include "zone_control.hpp"

#ifdef SOFTBLK_HAVE_UBLK
#include <softblk/ublk/ublk.hpp>
#endif
#include <softblk/fat/cli.hpp>

namespace {

using nlohmann::json;
using softblk::cli::control_client;
using softblk::cli::human_bytes;
using softblk::cli::run_paths;

constexpr int k_exit_failure = 1;
constexpr int k_exit_usage = 2;

int fail(const softblk::error& err)
{
    fmt::print(stderr, "softblk: {}\n", err.message);
    return k_exit_failure;
}

// The string fields of an export's description ("file", "loop", "uri" ...).
std::vector<std::pair<std::string, std::string>> export_paths(const json& exp)
{
    std::vector<std::pair<std::string, std::string>> out;
    if (!exp.is_object()) {
        return out;
    }
    for (const auto& [key, value] : exp.items()) {
        if (key != "type" && value.is_string()) {
            out.emplace_back(key, value.get<std::string>());
        }
    }
    return out;
}

std::string export_summary(const json& exp)
{
    std::string type = exp.is_object() ? exp.value("type", std::string("none")) : "none";
    std::string summary = type;
    if (type == "ublk" && exp.contains("block")) {
        // The kernel's view of the ublk device and the daemon that serves it.
        summary = fmt::format("ublk {} {} pid {} queues {} depth {}",
                              exp.value("block", std::string("?")),
                              exp.value("state", std::string("?")), exp.value("daemon_pid", -1),
                              exp.value("queues", 0u), exp.value("depth", 0u));
    } else {
        for (const char* key : {"loop", "device", "uri", "file", "socket"}) {
            if (exp.contains(key) && exp[key].is_string()) {
                summary = fmt::format("{} {}", type, exp[key].get<std::string>());
                break;
            }
        }
    }
    // What the export wants a person to know (an NBD listener without TLS,
    // a ublk disk that kept its size).
    if (exp.contains("warning") && exp["warning"].is_string()) {
        summary += fmt::format(" ({})", exp["warning"].get<std::string>());
    }
    return summary;
}

std::string dump(const json& value)
{
    return value.dump(2, ' ', false, json::error_handler_t::replace);
}

// fail(), and with --json also the error as the daemon gave it on stdout,
// {"error": {"errno": N, "name": "EBUSY", "message": ...}}, so that a script
// sees the errno a configfs write of the same attribute would give.
// With --json the error goes once, as JSON on stdout where the result
// would have gone (a script reads one stream); without, as text on stderr.
int fail_json(const softblk::error& err, bool json_output)
{
    if (json_output) {
        const int code = err.code.value();
        const char* name = strerrorname_np(code);
        fmt::print("{}\n", dump(json{{"error",
                                      {{"errno", code},
                                       {"name", name != nullptr ? name : ""},
                                       {"message", err.message}}}}));
        return k_exit_failure;
    }
    return fail(err);
}

softblk::result<control_client> connect(bool autostart)
{
    auto paths = softblk::cli::resolve_run_paths();
    if (!paths) {
        return std::unexpected(paths.error());
    }
    return control_client::connect(*paths, autostart);
}

// ------------------------------------------------------------------ fat

// How `softblk fat ... softblk:NAME` finds NAME: this daemon's `list`,
// translated into what the FAT tools need (they know nothing of the
// protocol). Connects at the first question; never starts a daemon.
class fat_daemon_directory final : public softblk::fat::daemon_directory {
public:
    std::string location() const override
    {
        auto paths = softblk::cli::resolve_run_paths();
        return paths ? paths->dir : std::string("(no run directory)");
    }

    softblk::result<std::vector<softblk::fat::daemon_device>> devices() override
    {
        auto paths = softblk::cli::resolve_run_paths();
        if (!paths) {
            return std::unexpected(paths.error());
        }
        auto client = control_client::connect(*paths, false);
        if (!client) {
            return softblk::make_error(
                client.error().code.value(),
                fmt::format("no softblk daemon answers at {} ({}); `softblk list` starts one (it "
                            "brings back the devices it kept) and shows the devices, `softblk "
                            "add` creates one",
                            paths->socket, client.error().message));
        }
        auto list = client->call("list", json::object());
        if (!list) {
            return std::unexpected(list.error());
        }
        std::vector<softblk::fat::daemon_device> out;
        for (const auto& d : *list) {
            softblk::fat::daemon_device dev;
            dev.name = d.value("name", std::string());
            dev.type = d.value("type", std::string());
            for (const auto& o : d.value("options", json::array())) {
                if (o.is_string()) {
                    dev.options.push_back(o.get<std::string>());
                }
            }
            dev.state = d.value("state", std::string());
            dev.error = d.value("error", std::string());
            dev.logical_block_size = d.value("logical_block_size", 512u);
            const json exp = d.value("export", json::object());
            dev.export_type = exp.is_object() ? exp.value("type", std::string("none")) : "none";
            for (auto& [key, value] : export_paths(exp)) {
                dev.export_location[key] = value;
            }
            out.push_back(std::move(dev));
        }
        return out;
    }
};

// ------------------------------------------------------------------ add

struct add_command {
    std::string type;
    std::vector<std::string> options;
    std::string name;
    std::string export_type;
    std::vector<std::string> export_options;
    softblk::cli::add_flags flags;
    bool json_output = false;
};

int run_add(const add_command& cmd)
{
    auto options = softblk::cli::apply_add_flags(cmd.type, cmd.options, cmd.flags);
    if (!options) {
        return fail(options.error());
    }
    auto client = connect(true);
    if (!client) {
        return fail(client.error());
    }
    json params = {{"type", cmd.type}, {"options", *options}};
    if (!cmd.name.empty()) {
        params["name"] = cmd.name;
    }
    if (!cmd.export_type.empty()) {
        params["export"] = cmd.export_type;
    }
    if (!cmd.export_options.empty()) {
        params["export_options"] = cmd.export_options;
    }
    auto res = client->call("add", params);
    if (!res) {
        return fail(res.error());
    }
    if (cmd.json_output) {
        fmt::print("{}\n", dump(*res));
        return 0;
    }
    fmt::print("{}\n", res->value("name", std::string()));
    const json exp = res->value("export", json::object());
    fmt::print("  export type: {}\n", exp.value("type", std::string("none")));
    for (const auto& [key, value] : export_paths(exp)) {
        fmt::print("  {}: {}\n", key, value);
    }
    for (const json& note : res->value("notes", json::array())) {
        fmt::print("  note: {}\n", note.get<std::string>());
    }
    return 0;
}

// ------------------------------------------------------------------ set, get

int run_set(const std::string& name, const std::vector<std::string>& options, bool force,
            bool json_output)
{
    if (options.empty()) {
        fmt::print(stderr, "softblk set: give key=value ... (e.g. power=0 badblocks=+0-7)\n");
        return k_exit_usage;
    }
    auto client = connect(true);
    if (!client) {
        return fail(client.error());
    }
    auto res = client->call("set", {{"name", name}, {"options", options}, {"force", force}});
    if (!res) {
        return fail_json(res.error(), json_output);
    }
    if (json_output) {
        fmt::print("{}\n", dump(*res));
        return 0;
    }
    const json exp = res->value("export", json::object());
    fmt::print("{} power={} export {}\n", name, res->value("power", 0), export_summary(exp));
    for (const json& note : res->value("notes", json::array())) {
        fmt::print("  note: {}\n", note.get<std::string>());
    }
    return 0;
}

int run_get(const std::string& name, const std::vector<std::string>& keys, bool json_output)
{
    auto client = connect(true);
    if (!client) {
        return fail(client.error());
    }
    auto res = client->call("get", {{"name", name}, {"keys", keys}});
    if (!res) {
        return fail_json(res.error(), json_output);
    }
    if (json_output) {
        fmt::print("{}\n", dump(*res));
        return 0;
    }
    const json values = res->value("values", json::object());
    if (keys.size() == 1) {
        // As `cat` of the configfs file.
        fmt::print("{}", values.value(keys[0], std::string()));
        return 0;
    }
    // In the order asked (the reply's object is sorted); all keys: sorted.
    std::vector<std::string> order = keys;
    if (order.empty()) {
        for (const auto& [key, value] : values.items()) {
            order.push_back(key);
        }
    }
    for (const std::string& key : order) {
        if (!values.contains(key)) {
            continue;
        }
        std::string text = values[key].get<std::string>();
        if (!text.empty() && text.back() == '\n') {
            text.pop_back();
        }
        // Several lines (badblocks): one per line, indented.
        for (size_t pos = 0; (pos = text.find('\n', pos)) != std::string::npos; pos += 3) {
            text.replace(pos, 1, "\n  ");
        }
        fmt::print("{}={}\n", key, text);
    }
    return 0;
}

// ------------------------------------------------------------------ zone

struct zone_command {
    std::string name;
    std::optional<uint64_t> sector;  // the positional SECTOR (one zone)
    std::optional<uint64_t> offset;  // --offset
    uint32_t count = 0;              // --count (0: to the end)
    bool all = false;
    bool json_output = false;
};

int run_zone(softblk::cli::zone_action action, const zone_command& cmd)
{
    using softblk::cli::zone_action;
    const char* verb = softblk::cli::to_string(action);
    softblk::cli::zone_request req{.action = action, .count = cmd.count, .all = cmd.all};
    if (cmd.sector && cmd.offset) {
        fmt::print(stderr, "softblk zone {}: give SECTOR or --offset, not both\n", verb);
        return k_exit_usage;
    }
    if (cmd.sector) {
        // One zone, unless --count says more.
        req.sector = *cmd.sector;
        req.count = cmd.count == 0 ? 1 : cmd.count;
    } else if (cmd.offset) {
        req.sector = *cmd.offset;
    } else if (action != zone_action::report && !cmd.all) {
        fmt::print(stderr,
                   "softblk zone {}: give a zone's start SECTOR, --offset SECTOR [--count N]{}\n",
                   verb, action == zone_action::reset ? " or --all" : "");
        return k_exit_usage;
    }
    if (cmd.all && (cmd.sector || cmd.offset || cmd.count != 0)) {
        fmt::print(stderr,
                   "softblk zone reset: --all resets every zone; give no SECTOR, --offset "
                   "or --count with it\n");
        return k_exit_usage;
    }
    auto client = connect(true);
    if (!client) {
        return fail(client.error());
    }
    json params = softblk::cli::zone_params(req);
    params["name"] = cmd.name;
    auto res = client->call("zone", params);
    if (!res) {
        return fail(res.error());
    }
    if (cmd.json_output) {
        fmt::print("{}\n", dump(*res));
        return 0;
    }
    if (action == zone_action::report) {
        for (const json& zone : res->value("zones", json::array())) {
            fmt::print("{}\n", softblk::cli::format_zone_line(zone));
        }
        if (res->value("more", false)) {
            fmt::print(stderr,
                       "softblk zone report: stopped after {} zones; report again with "
                       "--offset past the last one\n",
                       softblk::cli::k_max_report_zones);
        }
    }
    return 0;
}

// ------------------------------------------------------------------ del, list

int run_del(const std::vector<std::string>& names, bool all)
{
    if (all == !names.empty()) {
        fmt::print(stderr, "softblk del: give device names or --all\n");
        return k_exit_usage;
    }
    auto client = connect(true);
    if (!client) {
        return fail(client.error());
    }
    if (all) {
        auto res = client->call("del", {{"all", true}});
        if (!res) {
            return fail(res.error());
        }
        for (const auto& name : res->value("deleted", json::array())) {
            fmt::print("deleted {}\n", name.get<std::string>());
        }
        return 0;
    }
    int status = 0;
    for (const std::string& name : names) {
        auto res = client->call("del", {{"name", name}});
        if (!res) {
            status = fail(res.error());
            continue;
        }
        fmt::print("deleted {}\n", name);
    }
    return status;
}

int run_list(bool json_output)
{
    auto client = connect(true);
    if (!client) {
        return fail(client.error());
    }
    auto res = client->call("list", json::object());
    if (!res) {
        return fail(res.error());
    }
    if (json_output) {
        fmt::print("{}\n", dump(*res));
        return 0;
    }
    if (res->empty()) {
        fmt::print("no devices\n");
        return 0;
    }
    // MEMORY: what the device holds (data and tables), against its memory_limit
    // when it has one.
    fmt::print("{:<16} {:<6} {:>10} {:>5} {:>6} {:>5} {:>21}  {:<8} {}\n", "NAME", "TYPE", "SIZE",
               "BS", "QUEUES", "DEPTH", "MEMORY", "STATE", "EXPORT");
    json daemon_memory;
    for (const json& d : *res) {
        const std::string state = d.value("state", std::string("?"));
        if (state == "off") {
            const json exp = d.value("export", json::object());
            fmt::print("{:<16} {:<6} {:>10} {:>5} {:>6} {:>5} {:>21}  {:<8} {}\n",
                       d.value("name", std::string()), d.value("type", std::string()), "-", "-",
                       "-", "-", human_bytes(d.value("memory_bytes", uint64_t{0})), state,
                       exp.value("type", std::string("none")));
            continue;
        }
        if (state != "running") {
            fmt::print("{:<16} {:<6} {:>10} {:>5} {:>6} {:>5} {:>21}  {:<8} {}\n",
                       d.value("name", std::string()), d.value("type", std::string()), "-", "-",
                       "-", "-", "-", state, d.value("error", std::string()));
            continue;
        }
        const json memory = d.value("memory", json::object());
        const uint64_t used = memory.value("used_bytes", uint64_t{0});
        const uint64_t limit = memory.value("limit_bytes", uint64_t{0});
        daemon_memory = memory;
        fmt::print("{:<16} {:<6} {:>10} {:>5} {:>6} {:>5} {:>21}  {:<8} {}\n",
                   d.value("name", std::string()), d.value("type", std::string()),
                   human_bytes(d.value("capacity_bytes", uint64_t{0})),
                   d.value("logical_block_size", 0u),
                   fmt::format("{}+{}", d.value("submit_queues", 0u), d.value("poll_queues", 0u)),
                   d.value("queue_depth", 0u),
                   limit == 0 ? human_bytes(used)
                              : fmt::format("{}/{}", human_bytes(used), human_bytes(limit)),
                   state, export_summary(d.value("export", json::object())));
        // What a target wants its user to see (the file target's O_DIRECT
        // fall-back): one indented line under the row.
        const json target = d.value("target", json::object());
        if (target.is_object() && target.contains("notice") && target["notice"].is_string()) {
            fmt::print("  {}\n", target["notice"].get<std::string>());
        }
    }
    if (daemon_memory.is_object()) {
        const uint64_t limit = daemon_memory.value("daemon_limit_bytes", uint64_t{0});
        fmt::print("device memory: {} of {}\n",
                   human_bytes(daemon_memory.value("daemon_used_bytes", uint64_t{0})),
                   limit == 0 ? std::string("no limit") : human_bytes(limit));
    }
    return 0;
}

// ------------------------------------------------------------------ features

// The OPTION / DEFAULT / UNIT / RANGE / MEANING table of option_json()s,
// each column as wide as its longest cell (names such as
// timeout_inject/verbose_ratelimit_interval_ms would shift a fixed one).
void print_option_table(const json& options)
{
    std::vector<std::array<std::string, 6>> rows = {
        {"OPTION", "DEFAULT", "UNIT", "RANGE", "CHANGES", "MEANING"}};
    for (const json& o : options) {
        std::string range;
        if (o.contains("min")) {
            range = fmt::format("{}..{}", o["min"].dump(), o["max"].dump());
            if (o.value("out_of_range", std::string()) == "clamp") {
                range += " (clamped)";
            }
        } else {
            range = o["kind"].get<std::string>();
        }
        std::string name = o["name"].get<std::string>();
        if (o.contains("alias")) {
            name += fmt::format(" ({})", o["alias"].get<std::string>());
        }
        if (o.value("repeatable", false)) {
            range += ", repeatable";
        }
        rows.push_back({name, o["default"].get<std::string>(), o["unit"].get<std::string>(), range,
                        o.value("changes", std::string("-")), o["help"].get<std::string>()});
    }
    std::array<size_t, 5> width{};
    for (const auto& row : rows) {
        for (size_t i = 0; i < width.size(); ++i) {
            width[i] = std::max(width[i], row[i].size());
        }
    }
    for (const auto& row : rows) {
        fmt::print("  {:<{}} {:>{}} {:<{}} {:<{}} {:<{}} {}\n", row[0], width[0], row[1], width[1],
                   row[2], width[2], row[3], width[3], row[4], width[4], row[5]);
    }
}

int run_features(const std::string& type, bool json_output)
{
    auto features = softblk::cli::features_json(type);
    if (!features) {
        return fail(features.error());
    }
#ifdef SOFTBLK_NOT_BUILT
    // Optional target types this build left out, and why.
    if (type.empty()) {
        (*features)["not_built"] = json::array({SOFTBLK_NOT_BUILT});
    }
#endif
    if (json_output) {
        fmt::print("{}\n", dump(*features));
        return 0;
    }
    for (const json& t : (*features)["targets"]) {
        fmt::print("target type {}: {}\n", t["name"].get<std::string>(),
                   t["description"].get<std::string>());
        print_option_table(t["options"]);
        fmt::print("\n");
    }
    for (const json& n : features->value("not_built", json::array())) {
        fmt::print("target type {} (not built)\n\n", n.get<std::string>());
    }
    const std::string fallback = (*features)["default_export"].get<std::string>();
    const std::string zoned = (*features)["zoned_export"].get<std::string>();
    fmt::print("export types (default: {}{}):\n", fallback,
               zoned == fallback ? "" : fmt::format("; a zoned device needs --export {}", zoned));
    size_t name_width = 0;
    for (const json& e : (*features)["exports"]) {
        name_width = std::max(name_width, e["name"].get<std::string>().size());
    }
    for (const json& e : (*features)["exports"]) {
        fmt::print("  {:<{}} {:<13} {}{}\n", e["name"].get<std::string>(), name_width,
                   e["available"].get<bool>() ? "available" : "not available",
                   e["description"].get<std::string>(),
                   e.value("zoned", false) ? " (zoned devices too)" : "");
        if (!e.value("options", json::array()).empty()) {
            print_option_table(e["options"]);
        }
    }
#ifdef SOFTBLK_HAVE_UBLK
    // Every feature bit the running kernel's ublk driver reports, unknown
    // ones as "bit N".
    if (auto k = softblk::ublk::query_kernel_features()) {
        if (k->bits) {
            fmt::print("\nublk kernel features (0x{:x}):", *k->bits);
            for (const std::string& n : k->names) {
                fmt::print(" {}", n);
            }
            fmt::print("\n");
        } else {
            fmt::print(
                "\nublk kernel features: not reported (kernel before 6.5, no GET_FEATURES)\n");
        }
    } else {
        fmt::print("\nublk kernel features: unavailable ({})\n", k.error().message);
    }
#endif
    return 0;
}

// ------------------------------------------------------------------ daemon

struct daemon_command {
    std::vector<std::string> module_parameters;  // null_blk's, nr_devices included
    bool foreground = false;
    bool quiet = false;
    int client_timeout_ms = 10'000;
    std::string memory_limit;  // "" the default
    int stop_timeout_ms = 30'000;
};

int run_daemon_command(const daemon_command& cmd)
{
    auto paths = softblk::cli::resolve_run_paths();
    if (!paths) {
        return fail(paths.error());
    }
    // Checked here too, so that a bad value is reported to the user and
    // not only in the background daemon's log.
    auto machine = softblk::cli::read_machine_memory();
    if (!machine) {
        return fail(machine.error());
    }
    auto memory = softblk::cli::choose_memory_limit(cmd.memory_limit, *machine);
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
    if (cmd.foreground) {
        softblk::cli::daemon_options options;
        options.module_parameters = module_parameters;
        options.nr_devices = nr_devices;
        options.log_to_stderr = !cmd.quiet;
        options.client_timeout = std::chrono::milliseconds(cmd.client_timeout_ms);
        options.memory = *memory;
        options.stop_timeout = std::chrono::milliseconds(cmd.stop_timeout_ms);
        return softblk::cli::run_daemon(*paths, options);
    }
    if (const int fd = softblk::cli::connect_socket(paths->socket); fd >= 0) {
        ::close(fd);
        fmt::print(stderr, "softblk: a daemon already serves {}\n", paths->dir);
        return k_exit_failure;
    }
    std::vector<std::string> args = {"--client-timeout", std::to_string(cmd.client_timeout_ms),
                                     "--stop-timeout", std::to_string(cmd.stop_timeout_ms)};
    if (!cmd.memory_limit.empty()) {
        args.insert(args.end(), {"--memory-limit", cmd.memory_limit});
    }
    args.insert(args.end(), cmd.module_parameters.begin(), cmd.module_parameters.end());
    auto started = softblk::cli::start_daemon(*paths, std::chrono::seconds(60), args);
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
    auto paths = softblk::cli::resolve_run_paths();
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
    if (!softblk::cli::wait_for_daemon_exit(*paths, wait)) {
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

int main(int argc, char** argv)
{
    if (argc >= 2 && std::strcmp(argv[1], "fat") == 0) {
        fat_daemon_directory daemon;
        return softblk::fat::cli_main(argc - 1, argv + 1, &daemon);
    }
    if (argc >= 2 && std::strcmp(argv[1], "bench") == 0) {
        return softblk::cli::run_bench(argc - 1, argv + 1);
    }

    CLI::App app{
        "softblk: userspace block devices (null_blk-compatible options), hosted by a daemon that "
        "the "
        "first command starts"};
    app.require_subcommand(1);
    app.set_version_flag("--version", std::string("softblk ") + softblk::version_string());
    app.footer(
        "Run directory: /run/softblk (root), $XDG_RUNTIME_DIR/softblk, or $SOFTBLK_RUN_DIR.\n"
        "`softblk fat ...` works on FAT file systems on softblk devices and images.\n"
        "`softblk bench PLAN` runs a benchmark plan (`softblk bench --list`).");

    add_command add;
    CLI::App* add_cmd =
        app.add_subcommand("add",
                           "create a device and export it (with power=0: made powered off, "
                           "exported when `softblk set NAME power=1`)");
    add_cmd->add_option("type", add.type, "target type (see `softblk features`)")->required();
    add_cmd->add_option("options", add.options, "null_blk-style options: key=value ...");
    add_cmd->add_option("--name", add.name, "device name (default: TYPE + the lowest free number)");
    add_cmd->add_option("--export", add.export_type,
                        "export type: ublk, fuse, nbd, vhost-user-blk or none (default: the first "
                        "available of ublk, fuse)");
    add_cmd->add_option("--export-opt", add.export_options, "export option key=value (repeatable)")
        ->allow_extra_args(false);
    add_cmd->add_option("--size", add.flags.size,
                        "device size with a K/M/G/T suffix (e.g. 4G): the type's size option");
    add_cmd->add_option("--bs", add.flags.block_size, "block size in bytes: blocksize=");
    add_cmd->add_flag("--memory-backed", add.flags.memory_backed,
                      "keep the data in RAM: memory_backed=1");
    add_cmd->add_option("--queues", add.flags.queues, "submission queues: submit_queues=");
    add_cmd->add_option("--depth", add.flags.depth, "tags per queue: hw_queue_depth=");
    add_cmd->add_flag("--json", add.json_output, "print the result as JSON");

    std::string set_name;
    std::vector<std::string> set_options;
    bool set_force = false;
    bool set_json = false;
    CLI::App* set_cmd = app.add_subcommand(
        "set", "write device attributes as configfs does (power=0/1, badblocks=+S-E, ...)");
    set_cmd->add_option("name", set_name, "device name")->required();
    set_cmd->add_option("options", set_options, "key=value ..., applied in order")->required();
    set_cmd->add_flag("--force", set_force,
                      "power=0 (or a queue change) even while the export is in use: a mounted "
                      "file system then gets I/O errors");
    set_cmd->add_flag("--json", set_json, "print JSON");

    std::string get_name;
    std::vector<std::string> get_keys;
    bool get_json = false;
    CLI::App* get_cmd = app.add_subcommand(
        "get", "read device attributes as configfs shows them (all readable ones by default)");
    get_cmd->add_option("name", get_name, "device name")->required();
    get_cmd->add_option("keys", get_keys, "attribute names (one: its value as `cat` shows it)");
    get_cmd->add_flag("--json", get_json, "print JSON");

    zone_command zone;
    CLI::App* zone_cmd = app.add_subcommand(
        "zone",
        "zone report and management of a zoned device, as blkzone(8) (sectors of 512 "
        "bytes; through the daemon, exported or not: an export's queue thread runs them in "
        "order with its I/O)");
    zone_cmd->require_subcommand(1);
    std::vector<std::pair<CLI::App*, softblk::cli::zone_action>> zone_cmds;
    for (auto [action, help] :
         std::initializer_list<std::pair<softblk::cli::zone_action, const char*>>{
             {softblk::cli::zone_action::report,
              "print the zones: start, len, cap, wptr (from the zone's start), condition, type"},
             {softblk::cli::zone_action::open, "open zones explicitly"},
             {softblk::cli::zone_action::close, "close open zones"},
             {softblk::cli::zone_action::finish, "make zones full"},
             {softblk::cli::zone_action::reset, "make zones empty (their data is forgotten)"}}) {
        CLI::App* sub = zone_cmd->add_subcommand(softblk::cli::to_string(action), help);
        sub->add_option("name", zone.name, "device name")->required();
        if (action != softblk::cli::zone_action::report) {
            sub->add_option("sector", zone.sector, "start sector of the zone");
        }
        sub->add_option("--offset,-o", zone.offset,
                        action == softblk::cli::zone_action::report
                            ? "report from the zone holding this sector (default 0)"
                            : "start sector of the first zone (to the end, or --count zones)");
        sub->add_option("--count,-c", zone.count, "number of zones (default: to the end)");
        if (action == softblk::cli::zone_action::reset) {
            sub->add_flag("--all", zone.all, "every sequential zone (one reset-all request)");
        }
        sub->add_flag("--json", zone.json_output, "print JSON");
        zone_cmds.emplace_back(sub, action);
    }

    softblk::cli::nullb_fs_options nullb;
    std::string nullb_umount_dir;
    CLI::App* nullb_cmd = app.add_subcommand(
        "nullb", "a directory shaped like null_blk's /sys/kernel/config/nullb (FUSE)");
    nullb_cmd->require_subcommand(1);
    CLI::App* nullb_mount_cmd = nullb_cmd->add_subcommand(
        "mount", "serve the tree at DIR: mkdir DIR/NAME, echo 1 > DIR/NAME/power, rmdir ...");
    nullb_mount_cmd->add_option("dir", nullb.mount_point, "an existing directory")->required();
    nullb_mount_cmd->add_flag("--foreground", nullb.foreground,
                              "serve in this process until unmounted");
    nullb_mount_cmd->add_option("--export", nullb.export_type,
                                "export type of the devices made by mkdir (default: as `add`)");
    nullb_mount_cmd
        ->add_option("--export-opt", nullb.export_options,
                     "their export options key=value (repeatable)")
        ->allow_extra_args(false);
    CLI::App* nullb_umount_cmd = nullb_cmd->add_subcommand("umount", "unmount the tree at DIR");
    nullb_umount_cmd->add_option("dir", nullb_umount_dir, "its mount point")->required();

    std::vector<std::string> del_names;
    bool del_all = false;
    CLI::App* del_cmd = app.add_subcommand("del", "stop a device's export and destroy the device");
    del_cmd->add_option("names", del_names, "device names");
    del_cmd->add_flag("--all", del_all, "every device");

    bool list_json = false;
    CLI::App* list_cmd =
        app.add_subcommand("list", "list the devices with their exports and counters");
    list_cmd->add_flag("--json", list_json,
                       "print JSON (device::describe() of each device and its export)");

    std::string features_type;
    bool features_json = false;
    CLI::App* features_cmd =
        app.add_subcommand("features", "every option of every target type, and the export types");
    features_cmd->add_option("type", features_type, "only this target type");
    features_cmd->add_flag("--json", features_json, "print JSON");

    daemon_command daemon;
    CLI::App* daemon_cmd =
        app.add_subcommand("daemon", "start the daemon (normally started by the first command)");
    daemon_cmd->add_option("module_parameters", daemon.module_parameters,
                           "null_blk's module parameters for null devices (gb=1 bs=4096 "
                           "poll_queues=2 ...) and nr_devices=N: that many devices nullb0.. "
                           "with them at start");
    daemon_cmd->add_flag("--foreground", daemon.foreground,
                         "run in this process until shutdown, SIGTERM or SIGINT");
    daemon_cmd->add_flag("--quiet", daemon.quiet, "log to the log file only, not to stderr");
    daemon_cmd
        ->add_option("--client-timeout", daemon.client_timeout_ms,
                     "milliseconds a client may take to send a request or read a reply")
        ->check(CLI::Range(100, 3'600'000));
    daemon_cmd->add_option(
        "--memory-limit", daemon.memory_limit,
        "most memory the devices' data may take, all devices together: a size (64M, 4G), a share "
        "of the machine's memory (25%) or none; default 50% of MemTotal or of the cgroup's "
        "memory limit, whichever is smaller. Writes past it fail with ENOSPC");
    daemon_cmd
        ->add_option("--stop-timeout", daemon.stop_timeout_ms,
                     "milliseconds del and shutdown wait for an export to stop before giving up "
                     "on it (it goes on stopping in the background)")
        ->check(CLI::Range(100, 3'600'000));

    bool status_json = false;
    CLI::App* status_cmd =
        app.add_subcommand("status", "show whether a daemon runs, its pid and devices");
    status_cmd->add_flag("--json", status_json, "print JSON");

    CLI::App* recover_cmd = app.add_subcommand(
        "recover",
        "start a daemon if none runs (it re-creates and re-exports every device from its state "
        "file, "
        "re-attaching ublk devices that outlived their daemon) and list the devices");

    bool shutdown_force = false;
    CLI::App* shutdown_cmd = app.add_subcommand(
        "shutdown",
        "stop the daemon and every export; device state stays for the next daemon. Refused while "
        "an export is in use (a file system mounted on its loop device)");
    shutdown_cmd->add_flag("--force", shutdown_force,
                           "stop even exports in use: their mounted file systems get I/O errors");

    try {
        app.parse(argc, argv);
    } catch (const CLI::CallForHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForAllHelp& e) {
        return app.exit(e);
    } catch (const CLI::ParseError& e) {
        return app.exit(e) == 0 ? 0 : k_exit_usage;  // 0: --version
    }

    if (add_cmd->parsed()) {
        return run_add(add);
    }
    if (set_cmd->parsed()) {
        return run_set(set_name, set_options, set_force, set_json);
    }
    if (get_cmd->parsed()) {
        return run_get(get_name, get_keys, get_json);
    }
    for (const auto& [sub, action] : zone_cmds) {
        if (sub->parsed()) {
            return run_zone(action, zone);
        }
    }
    if (nullb_mount_cmd->parsed()) {
        auto paths = softblk::cli::resolve_run_paths();
        if (!paths) {
            return fail(paths.error());
        }
        return softblk::cli::run_nullb_fs(*paths, nullb);
    }
    if (nullb_umount_cmd->parsed()) {
        return softblk::cli::unmount_nullb_fs(nullb_umount_dir);
    }
    if (del_cmd->parsed()) {
        return run_del(del_names, del_all);
    }
    if (list_cmd->parsed()) {
        return run_list(list_json);
    }
    if (features_cmd->parsed()) {
        return run_features(features_type, features_json);
    }
    if (daemon_cmd->parsed()) {
        return run_daemon_command(daemon);
    }
    if (recover_cmd->parsed()) {
        // Recovery is what every daemon does when it starts; this command
        // only makes sure one has started.
        return run_list(false);
    }
    if (status_cmd->parsed()) {
        return run_status(status_json);
    }
    if (shutdown_cmd->parsed()) {
        return run_shutdown(shutdown_force);
    }
    return k_exit_usage;
}
