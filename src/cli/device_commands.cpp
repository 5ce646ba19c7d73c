// `softblk add`, `set`, `get`, `del` and `list`: the device commands, each
// one request to the daemon (started on demand) and its reply printed.
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "add_flags.hpp"
#include "memory_limit.hpp"
#include "subcommand.hpp"

namespace softblk::cli {

namespace {

using nlohmann::json;

struct add_command {
    std::string type;
    std::vector<std::string> options;
    std::string name;
    std::string export_type;
    std::vector<std::string> export_options;
    add_flags flags;
    bool json_output = false;
};

int run_add(const add_command& cmd)
{
    auto options = apply_add_flags(cmd.type, cmd.options, cmd.flags);
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

}  // namespace

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
        // A device of a file in devices.d whose data a restart loses.
        if (d.contains("data") && d["data"].is_string()) {
            fmt::print("  data: {} ({})\n", d["data"].get<std::string>(),
                       d.value("config", std::string()));
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

void define_add(CLI::App& app, subcommand_table& table)
{
    auto add = std::make_shared<add_command>();
    CLI::App* cmd = app.add_subcommand("add",
                                       "create a device and export it (with power=0: made powered "
                                       "off, exported when `softblk set NAME power=1`)");
    cmd->add_option("type", add->type, "target type (see `softblk features`)")->required();
    cmd->add_option("options", add->options, "null_blk-style options: key=value ...");
    cmd->add_option("--name", add->name, "device name (default: TYPE + the lowest free number)");
    cmd->add_option("--export", add->export_type,
                    "export type (`softblk features` lists them) or none (default: the first "
                    "available that can carry the device, as `features` says)");
    cmd->add_option("--export-opt", add->export_options, "export option key=value (repeatable)")
        ->allow_extra_args(false);
    cmd->add_option("--size", add->flags.size,
                    "device size with a K/M/G/T suffix (e.g. 4G): the type's size option");
    cmd->add_option("--bs", add->flags.block_size, "block size in bytes: blocksize=");
    cmd->add_flag("--memory-backed", add->flags.memory_backed,
                  "keep the data in RAM: memory_backed=1");
    cmd->add_option("--queues", add->flags.queues, "submission queues: submit_queues=");
    cmd->add_option("--depth", add->flags.depth, "tags per queue: hw_queue_depth=");
    cmd->add_flag("--json", add->json_output, "print the result as JSON");
    table.push_back({cmd, [add] { return run_add(*add); }});
}

void define_set(CLI::App& app, subcommand_table& table)
{
    struct set_command {
        std::string name;
        std::vector<std::string> options;
        bool force = false;
        bool json_output = false;
    };
    auto set = std::make_shared<set_command>();
    CLI::App* cmd = app.add_subcommand(
        "set", "write device attributes as configfs does (power=0/1, badblocks=+S-E, ...)");
    cmd->add_option("name", set->name, "device name")->required();
    cmd->add_option("options", set->options, "key=value ..., applied in order")->required();
    cmd->add_flag("--force", set->force,
                  "power=0 (or a queue change) even while the export is in use: a mounted "
                  "file system then gets I/O errors");
    cmd->add_flag("--json", set->json_output, "print JSON");
    table.push_back(
        {cmd, [set] { return run_set(set->name, set->options, set->force, set->json_output); }});
}

void define_get(CLI::App& app, subcommand_table& table)
{
    struct get_command {
        std::string name;
        std::vector<std::string> keys;
        bool json_output = false;
    };
    auto get = std::make_shared<get_command>();
    CLI::App* cmd = app.add_subcommand(
        "get", "read device attributes as configfs shows them (all readable ones by default)");
    cmd->add_option("name", get->name, "device name")->required();
    cmd->add_option("keys", get->keys, "attribute names (one: its value as `cat` shows it)");
    cmd->add_flag("--json", get->json_output, "print JSON");
    table.push_back({cmd, [get] { return run_get(get->name, get->keys, get->json_output); }});
}

void define_del(CLI::App& app, subcommand_table& table)
{
    struct del_command {
        std::vector<std::string> names;
        bool all = false;
    };
    auto del = std::make_shared<del_command>();
    CLI::App* cmd = app.add_subcommand("del", "stop a device's export and destroy the device");
    cmd->add_option("names", del->names, "device names");
    cmd->add_flag("--all", del->all, "every device");
    table.push_back({cmd, [del] { return run_del(del->names, del->all); }});
}

void define_list(CLI::App& app, subcommand_table& table)
{
    auto json_output = std::make_shared<bool>(false);
    CLI::App* cmd = app.add_subcommand("list", "list the devices with their exports and counters");
    cmd->add_flag("--json", *json_output,
                  "print JSON (device::describe() of each device and its export)");
    table.push_back({cmd, [json_output] { return run_list(*json_output); }});
}

}  // namespace softblk::cli
