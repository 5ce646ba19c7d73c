// `softblk apply` and `softblk save`: the devices declared in files
// (/etc/softblk/devices.d/NAME.conf, docs/config.md). The files, their
// checks and the plan are the host library's (device_config.hpp); these
// commands ask the daemon (started on demand) for its list and send it the
// add, set and del requests of the plan.
#include <cerrno>
#include <memory>
#include <string>
#include <sys/stat.h>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <softblk/support/trusted_dir.hpp>

#include "device_config.hpp"
#include "subcommand.hpp"

namespace softblk::cli {

namespace {

using nlohmann::json;

struct apply_command {
    std::string config_dir;
    bool dry_run = false;
    bool prune = false;
    bool json_output = false;
};

// Carries out one step of the plan; returns false when it failed (the
// step then says why, as an error).
bool carry_out(control_client& client, plan_step& step)
{
    result<json> res = json::object();
    switch (step.action) {
    case plan_action::create: {
        json params = {{"type", step.config.type},
                       {"name", step.name},
                       {"options", step.config.options},
                       {"config", step.config.path}};
        if (!step.config.export_type.empty()) {
            params["export"] = step.config.export_type;
        }
        if (!step.config.export_options.empty()) {
            params["export_options"] = step.config.export_options;
        }
        res = client.call("add", params);
        break;
    }
    case plan_action::update:
    case plan_action::differs:
        // What can change live changes, even when something else differs.
        if (step.writes.empty()) {
            return step.action != plan_action::differs;
        }
        res = client.call("set", {{"name", step.name}, {"options", step.writes}, {"force", false}});
        break;
    case plan_action::prune:
        res = client.call("del", {{"name", step.name}});
        break;
    case plan_action::unchanged:
        return true;
    case plan_action::error:
        return false;
    }
    if (!res) {
        step.details.push_back(res.error().message);
        step.action = plan_action::error;
        return false;
    }
    return step.action != plan_action::differs;
}

int run_apply(const apply_command& cmd)
{
    const std::string dir = resolve_config_dir(cmd.config_dir);
    auto files = read_config_dir(dir);
    if (!files) {
        return fail(files.error());
    }
    auto client = connect(true);
    if (!client) {
        return fail(client.error());
    }
    auto listed = client->call("list", json::object());
    if (!listed) {
        return fail(listed.error());
    }
    std::vector<plan_step> plan = plan_apply(*files, *listed, cmd.prune);
    int status = 0;
    json out = json::array();
    for (plan_step& step : plan) {
        bool ok = false;
        if (cmd.dry_run) {
            ok = step.action != plan_action::error && step.action != plan_action::differs;
        } else {
            ok = carry_out(*client, step);
        }
        if (!ok) {
            status = k_exit_failure;
        }
        if (cmd.json_output) {
            out.push_back({{"name", step.name},
                           {"action", plan_action_name(step.action)},
                           {"details", step.details},
                           {"ok", ok}});
            continue;
        }
        std::string line = fmt::format("{:<9} {}", plan_action_name(step.action), step.name);
        if (!step.details.empty()) {
            line += fmt::format(" {}", fmt::join(step.details, "; "));
        }
        fmt::print("{}{}\n", line, cmd.dry_run ? " (dry run)" : "");
    }
    if (cmd.json_output) {
        fmt::print("{}\n",
                   dump(json{{"config_dir", dir}, {"dry_run", cmd.dry_run}, {"plan", out}}));
    } else if (plan.empty()) {
        fmt::print("no device files in {} and no devices to prune\n", dir);
    }
    return status;
}

struct save_command {
    std::vector<std::string> names;
    bool all = false;
    std::string config_dir;
    bool force = false;
};

// Saves one listed device to `dir`; prints what it did. False on error.
bool save_one(const json& d, const std::string& dir, bool force)
{
    const std::string name = d.value("name", std::string());
    const std::string state = d.value("state", std::string());
    if (state != "running" && state != "off") {
        fmt::print(stderr,
                   "softblk: save {}: it is {}; save it once `softblk list` shows it "
                   "running\n",
                   name, state);
        return false;
    }
    const std::string path = fmt::format("{}/{}{}", dir, name, k_config_suffix);
    const std::string text = render_device_config(d);
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0) {
        // An existing file that apply would leave this device with as it
        // is says the same (comments and spelling aside): kept.
        auto existing = read_config_dir(dir);
        bool same = false;
        if (existing) {
            for (const config_file& f : *existing) {
                if (f.name == name && f.config) {
                    auto steps = plan_apply({f}, json::array({d}), false);
                    same = steps.size() == 1 && steps[0].action == plan_action::unchanged;
                }
            }
        }
        if (same) {
            fmt::print("unchanged {} {}\n", name, path);
            return true;
        }
        if (!force) {
            fmt::print(stderr,
                       "softblk: save {}: {} exists and says something else; --force "
                       "overwrites it\n",
                       name, path);
            return false;
        }
    }
    if (auto made = make_directories(dir, 0755); !made) {
        fail(made.error());
        return false;
    }
    if (auto written = write_file_atomically(path, text, 0644, true); !written) {
        fail(written.error());
        return false;
    }
    fmt::print("saved     {} {}\n", name, path);
    if (std::string note = restart_data_note(d.value("target", json())); !note.empty()) {
        fmt::print("  note: its data is in memory: {}\n", note);
    }
    return true;
}

int run_save(const save_command& cmd)
{
    if (cmd.all == !cmd.names.empty()) {
        fmt::print(stderr, "softblk save: give device names or --all\n");
        return k_exit_usage;
    }
    const std::string dir = resolve_config_dir(cmd.config_dir);
    auto client = connect(true);
    if (!client) {
        return fail(client.error());
    }
    auto listed = client->call("list", json::object());
    if (!listed) {
        return fail(listed.error());
    }
    int status = 0;
    if (cmd.all) {
        for (const json& d : *listed) {
            if (!save_one(d, dir, cmd.force)) {
                status = k_exit_failure;
            }
        }
        return status;
    }
    for (const std::string& name : cmd.names) {
        const json* found = nullptr;
        for (const json& d : *listed) {
            if (d.value("name", std::string()) == name) {
                found = &d;
            }
        }
        if (found == nullptr) {
            fmt::print(stderr, "softblk: save {}: no such device (`softblk list`)\n", name);
            status = k_exit_failure;
        } else if (!save_one(*found, dir, cmd.force)) {
            status = k_exit_failure;
        }
    }
    return status;
}

constexpr const char* k_config_dir_help =
    "directory of the device files NAME.conf (default: $SOFTBLK_CONFIG_DIR, else "
    "/etc/softblk/devices.d)";

}  // namespace

void define_apply(CLI::App& app, subcommand_table& table)
{
    auto apply = std::make_shared<apply_command>();
    CLI::App* cmd = app.add_subcommand(
        "apply",
        "make the daemon's devices match the device files (softblk-devices.d(5)): create what is "
        "missing, set live attributes, report what differs");
    cmd->add_option("--config-dir", apply->config_dir, k_config_dir_help);
    cmd->add_flag("--dry-run", apply->dry_run, "print the plan, change nothing");
    cmd->add_flag("--prune", apply->prune,
                  "also delete the running devices that have no file (and their data)");
    cmd->add_flag("--json", apply->json_output, "print the plan and its outcome as JSON");
    table.push_back({cmd, [apply] { return run_apply(*apply); }});
}

void define_save(CLI::App& app, subcommand_table& table)
{
    auto save = std::make_shared<save_command>();
    CLI::App* cmd = app.add_subcommand(
        "save", "write running devices out as device files that `softblk apply` re-creates");
    cmd->add_option("names", save->names, "device names");
    cmd->add_flag("--all", save->all, "every device");
    cmd->add_option("--config-dir", save->config_dir, k_config_dir_help);
    cmd->add_flag("--force", save->force, "overwrite a file that says something else");
    table.push_back({cmd, [save] { return run_save(*save); }});
}

}  // namespace softblk::cli
