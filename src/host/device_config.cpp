#include "device_config.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <map>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <softblk/device.hpp>
#include <softblk/frontend.hpp>
#include <softblk/options.hpp>
#include <softblk/target.hpp>

#include "json_params.hpp"
#include "run_dir.hpp"

namespace softblk::host {

namespace {

// A device file is a few lines; anything larger is not one.
constexpr size_t k_max_config_bytes = 64 * 1024;

std::string_view config_trim(std::string_view text)
{
    const size_t first = text.find_first_not_of(" \t\r");
    if (first == std::string_view::npos) {
        return {};
    }
    const size_t last = text.find_last_not_of(" \t\r");
    return text.substr(first, last - first + 1);
}

std::string_view config_key(std::string_view arg)
{
    return arg.substr(0, arg.find('='));
}

std::string config_target_types()
{
    std::vector<std::string> names;
    for (const target_type* t : target_types()) {
        names.emplace_back(t->name);
    }
    return fmt::format("{}", fmt::join(names, ", "));
}

std::string config_export_types()
{
    std::vector<std::string> names;
    for (const export_type* e : export_types()) {
        names.emplace_back(e->name);
    }
    names.emplace_back("none");
    return fmt::format("{}", fmt::join(names, ", "));
}

// A key=value of the file, where it was.
struct config_line {
    unsigned line = 0;
    std::string key;
    std::string value;
};

error config_error(const std::string& path, unsigned line, int code, std::string_view what)
{
    return error{std::error_code(code, std::generic_category()),
                 fmt::format("{}:{}: {}", path, line, what)};
}

// Checks each option alone against `defs` (the parser and range of
// `softblk add`, whose error names the key) and that no key but a
// repeatable one is given twice. `what`: "target type 'null'" or "export
// 'fuse'" for the unknown-key error.
result<void> check_config_options(const std::string& path, std::span<const option_def> defs,
                                  const std::vector<config_line>& given, std::string_view what,
                                  std::string_view listing, std::string_view prefix)
{
    std::map<std::string_view, unsigned> seen;
    for (const config_line& opt : given) {
        const option_def* def = option_set::find_def(defs, opt.key);
        if (def == nullptr) {
            return std::unexpected(
                config_error(path, opt.line, ENOENT,
                             fmt::format("unknown option '{}{}' for {} ({} lists them)", prefix,
                                         opt.key, what, listing)));
        }
        if (auto [it, fresh] = seen.emplace(def->name, opt.line); !fresh && !def->repeatable) {
            return std::unexpected(
                config_error(path, opt.line, EINVAL,
                             fmt::format("option '{}{}' given again (first on line {}); "
                                         "give it once",
                                         prefix, opt.key, it->second)));
        }
        const std::string arg = fmt::format("{}={}", opt.key, opt.value);
        if (auto parsed = option_set::parse(defs, std::span(&arg, 1)); !parsed) {
            return std::unexpected(config_error(
                path, opt.line, parsed.error().code.value(),
                fmt::format("{}{}", prefix == k_export_opt_prefix ? "export option: " : "",
                            parsed.error().message)));
        }
    }
    return {};
}

// Values of every option of `defs` as a read shows them, `args` given
// over the defaults; an error when `args` do not parse.
result<std::map<std::string, std::string>> option_values(std::span<const option_def> defs,
                                                         const std::vector<std::string>& args)
{
    auto parsed = option_set::parse_values(defs, args);
    if (!parsed) {
        return std::unexpected(parsed.error());
    }
    std::map<std::string, std::string> out;
    for (const option_def& def : defs) {
        if (!def.write_only) {
            out.emplace(std::string(def.name), parsed->value_text(def.name));
        }
    }
    return out;
}

std::string shown_value(const std::string& value)
{
    std::string out = value.empty() ? std::string("(empty)") : value;
    std::replace(out.begin(), out.end(), '\n', ',');
    return out;
}

// Compares a file with the device `list` shows under its name.
plan_step compare_device(const device_config& file, const nlohmann::json& listed)
{
    plan_step step;
    step.name = file.name;
    step.config = file;
    const std::string recreate = fmt::format(
        "recreate with `softblk del {}` then `softblk apply` (its data goes unless the "
        "options name where it is kept)",
        file.name);
    const std::string state = listed.value("state", std::string("?"));
    if (state == "failed") {
        step.action = plan_action::error;
        step.details.push_back(fmt::format("failed to come back ({}); {}",
                                           listed.value("error", std::string("?")), recreate));
        return step;
    }
    if (state != "running" && state != "off") {
        step.action = plan_action::error;
        step.details.push_back(
            fmt::format("{} now; run apply again once `softblk list` shows it running", state));
        return step;
    }
    const std::string type = listed.value("type", std::string());
    std::vector<std::string> differs;
    if (type != file.type) {
        step.action = plan_action::differs;
        step.details.push_back(
            fmt::format("type: running {}, file {}: {}", type, file.type, recreate));
        return step;
    }
    const nlohmann::json exp = listed.value("export", nlohmann::json::object());
    const std::string running_export = exp.value("type", std::string("none"));
    if (!file.export_type.empty() && file.export_type != running_export) {
        differs.push_back(
            fmt::format("export: running {}, file {}", running_export, file.export_type));
    } else if (!file.export_type.empty() && running_export != "none") {
        const export_type* front_end = find_export_type(running_export);
        std::vector<std::string> running_opts;
        if (auto o = param_strings(exp, "options"); o) {
            running_opts = std::move(*o);
        }
        if (front_end != nullptr) {
            auto want = option_values(front_end->options, file.export_options);
            auto have = option_values(front_end->options, running_opts);
            if (want && have) {
                for (const auto& [key, value] : *want) {
                    if (have->at(key) != value) {
                        differs.push_back(fmt::format("export option {}: running {}, file {}", key,
                                                      shown_value(have->at(key)),
                                                      shown_value(value)));
                    }
                }
            }
        }
    }

    const std::vector<option_def> defs = options_for(file.type);
    // add powers a device on unless the options say power=0.
    std::vector<std::string> wanted_args = file.options;
    if (std::none_of(wanted_args.begin(), wanted_args.end(),
                     [](const std::string& a) { return config_key(a) == "power"; })) {
        wanted_args.insert(wanted_args.begin(), "power=1");
    }
    std::vector<std::string> running_args;
    if (auto o = param_strings(listed, "options"); o) {
        running_args = std::move(*o);
    }
    auto want = option_values(defs, wanted_args);
    auto have = option_values(defs, running_args);
    if (!want || !have) {
        step.action = plan_action::error;
        step.details.push_back(fmt::format("cannot compare the options: {}",
                                           (!want ? want.error() : have.error()).message));
        return step;
    }
    // Only what the file says is compared: a value the device derived
    // itself (zloop's queue depth, a clamp written back) is no difference.
    std::set<std::string_view> given;
    for (const std::string& arg : wanted_args) {
        if (const option_def* def = option_set::find_def(defs, config_key(arg))) {
            given.insert(def->name);
        }
    }
    const bool powered = state == "running";
    const bool want_power = want->at("power") == "1";
    const bool power_changes = powered != want_power;
    // While the writes run the device is off when it is now and stays so,
    // or when power=0 comes first.
    const bool off_for_writes = !want_power;
    std::vector<std::string> writes;
    for (const option_def& def : defs) {
        if (def.write_only || def.name == "power" || !given.contains(def.name)) {
            continue;
        }
        const std::string& a = have->at(std::string(def.name));
        const std::string& b = want->at(std::string(def.name));
        if (a == b) {
            continue;
        }
        const bool settable =
            !def.repeatable &&
            (def.update == option_update::live || def.update == option_update::reconfigure ||
             (def.update == option_update::powered_off && (off_for_writes || !powered)));
        if (settable) {
            writes.push_back(fmt::format("{}={}", def.name, b));
            step.details.push_back(
                fmt::format("set {}: {} -> {}", def.name, shown_value(a), shown_value(b)));
            continue;
        }
        std::string why = "cannot change live";
        if (def.update == option_update::powered_off) {
            why = fmt::format(
                "changes only while powered off: `softblk set {} power=0 {}={} "
                "power=1` stops the export meanwhile",
                file.name, def.name, b);
        } else if (def.update == option_update::creation) {
            why = "set only when the device is made";
        } else if (def.repeatable) {
            why = "a list of writes, not compared live";
        }
        differs.push_back(fmt::format("{}: running {}, file {} ({})", def.name, shown_value(a),
                                      shown_value(b), why));
    }
    if (power_changes) {
        // Off first, so that what changes only while off can; on last.
        if (want_power) {
            writes.push_back("power=1");
        } else {
            writes.insert(writes.begin(), "power=0");
        }
        step.details.push_back(
            fmt::format("set power: {} -> {}", powered ? 1 : 0, want_power ? 1 : 0));
    }
    step.writes = std::move(writes);
    if (!differs.empty()) {
        step.action = plan_action::differs;
        differs.back() += "; " + recreate;
        step.details.insert(step.details.end(), differs.begin(), differs.end());
    } else {
        step.action = step.writes.empty() ? plan_action::unchanged : plan_action::update;
    }
    return step;
}

}  // namespace

std::string resolve_config_dir(std::string_view given)
{
    if (!given.empty()) {
        return std::string(given);
    }
    if (const char* env = std::getenv("SOFTBLK_CONFIG_DIR"); env != nullptr && env[0] != '\0') {
        return env;
    }
    return std::string(k_default_config_dir);
}

result<device_config> parse_device_config(const std::string& path, std::string_view text)
{
    device_config out;
    out.path = path;
    std::string_view file = path;
    if (const size_t slash = file.rfind('/'); slash != std::string_view::npos) {
        file.remove_prefix(slash + 1);
    }
    if (file.ends_with(k_config_suffix)) {
        file.remove_suffix(k_config_suffix.size());
    }
    out.name = std::string(file);
    if (auto checked = check_new_device_name(out.name); !checked) {
        return make_error(EINVAL, fmt::format("{}: the file's name gives the device's: {}", path,
                                              checked.error().message));
    }

    std::vector<config_line> options;
    std::vector<config_line> export_options;
    unsigned type_line = 0;
    unsigned export_line = 0;
    unsigned line_no = 0;
    size_t pos = 0;
    while (pos < text.size()) {
        size_t end = text.find('\n', pos);
        if (end == std::string_view::npos) {
            end = text.size();
        }
        const std::string_view line = config_trim(text.substr(pos, end - pos));
        pos = end + 1;
        ++line_no;
        if (line.empty() || line.front() == '#') {
            continue;
        }
        const size_t eq = line.find('=');
        if (eq == std::string_view::npos) {
            return std::unexpected(
                config_error(path, line_no, EINVAL,
                             fmt::format("'{}' is not key=value (comments start with #)", line)));
        }
        const std::string key(config_trim(line.substr(0, eq)));
        const std::string value(config_trim(line.substr(eq + 1)));
        auto once = [&](unsigned& seen_line) -> result<void> {
            if (seen_line != 0) {
                return std::unexpected(
                    config_error(path, line_no, EINVAL,
                                 fmt::format("'{}' given again (first on line {}); give it once",
                                             key, seen_line)));
            }
            seen_line = line_no;
            return {};
        };
        if (key == "type") {
            if (auto r = once(type_line); !r) {
                return std::unexpected(r.error());
            }
            if (find_target_type(value) == nullptr) {
                return std::unexpected(
                    config_error(path, line_no, ENOENT,
                                 fmt::format("unknown target type '{}'; known types: {}", value,
                                             config_target_types())));
            }
            out.type = value;
        } else if (key == "export") {
            if (auto r = once(export_line); !r) {
                return std::unexpected(r.error());
            }
            if (value != "none" && find_export_type(value) == nullptr) {
                return std::unexpected(
                    config_error(path, line_no, ENOENT,
                                 fmt::format("unknown export type '{}'; known types: {}", value,
                                             config_export_types())));
            }
            out.export_type = value;
        } else if (key.starts_with(k_export_opt_prefix)) {
            export_options.push_back({line_no, key.substr(k_export_opt_prefix.size()), value});
        } else if (key == "name") {
            return std::unexpected(config_error(
                path, line_no, EINVAL,
                fmt::format("'name' is not an option: the file's name gives the device's "
                            "(rename the file to {}{})",
                            value, k_config_suffix)));
        } else {
            options.push_back({line_no, key, value});
        }
    }
    if (out.type.empty()) {
        return make_error(EINVAL, fmt::format("{}:{}: no type= line (the target type, one of: {})",
                                              path, line_no, config_target_types()));
    }
    const std::vector<option_def> defs = options_for(out.type);
    if (auto r =
            check_config_options(path, defs, options, fmt::format("target type '{}'", out.type),
                                 fmt::format("`softblk features {}`", out.type), "");
        !r) {
        return std::unexpected(r.error());
    }
    if (!export_options.empty()) {
        if (out.export_type.empty() || out.export_type == "none") {
            return std::unexpected(config_error(
                path, export_options.front().line, EINVAL,
                fmt::format("export option '{}{}' without an export: add an export= line",
                            k_export_opt_prefix, export_options.front().key)));
        }
        const export_type* front_end = find_export_type(out.export_type);
        if (auto r = check_config_options(path, front_end->options, export_options,
                                          fmt::format("export '{}'", out.export_type),
                                          "`softblk features`", k_export_opt_prefix);
            !r) {
            return std::unexpected(r.error());
        }
    }
    for (const config_line& opt : options) {
        out.options.push_back(fmt::format("{}={}", opt.key, opt.value));
    }
    for (const config_line& opt : export_options) {
        out.export_options.push_back(fmt::format("{}={}", opt.key, opt.value));
    }
    return out;
}

result<std::vector<config_file>> read_config_dir(const std::string& dir)
{
    std::vector<config_file> files;
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) {
        if (errno == ENOENT) {
            return files;
        }
        const int e = errno;
        return make_error(e, fmt::format("cannot read the configuration directory {}: {}", dir,
                                         std::strerror(e)));
    }
    while (const dirent* ent = ::readdir(d)) {
        const std::string_view file = ent->d_name;
        if (file.size() > k_config_suffix.size() && file.ends_with(k_config_suffix) &&
            file.front() != '.') {
            const std::string name(file.substr(0, file.size() - k_config_suffix.size()));
            files.push_back({name, fmt::format("{}/{}", dir, file), make_error(EIO, "not read")});
        }
    }
    ::closedir(d);
    std::sort(files.begin(), files.end(),
              [](const config_file& a, const config_file& b) { return a.name < b.name; });
    for (config_file& f : files) {
        // Files below /etc are the administrator's: links are followed.
        auto text = read_small_file(f.path, k_max_config_bytes, true);
        f.config = text ? parse_device_config(f.path, *text)
                        : result<device_config>(std::unexpected(text.error()));
    }
    return files;
}

std::string render_device_config(const nlohmann::json& listed)
{
    const std::string name = listed.value("name", std::string());
    std::string out = fmt::format(
        "# softblk device {} (`softblk save`; `softblk apply` makes it; man "
        "softblk-devices.d)\n",
        name);
    out += fmt::format("type={}\n", listed.value("type", std::string()));
    const nlohmann::json exp = listed.value("export", nlohmann::json::object());
    out += fmt::format("export={}\n", exp.value("type", std::string("none")));
    if (auto opts = param_strings(exp, "options"); opts) {
        for (const std::string& opt : *opts) {
            out += fmt::format("{}{}\n", k_export_opt_prefix, opt);
        }
    }
    if (auto opts = param_strings(listed, "options"); opts) {
        for (const std::string& opt : *opts) {
            out += opt + "\n";
        }
    }
    return out;
}

std::string_view plan_action_name(plan_action action)
{
    switch (action) {
    case plan_action::create:
        return "create";
    case plan_action::update:
        return "update";
    case plan_action::unchanged:
        return "unchanged";
    case plan_action::differs:
        return "differs";
    case plan_action::prune:
        return "prune";
    case plan_action::error:
        return "error";
    }
    return "?";
}

std::vector<plan_step> plan_apply(const std::vector<config_file>& files,
                                  const nlohmann::json& listed, bool prune)
{
    std::map<std::string, const nlohmann::json*, std::less<>> running;
    if (listed.is_array()) {
        for (const nlohmann::json& d : listed) {
            if (d.is_object() && d.contains("name") && d["name"].is_string()) {
                running.emplace(d["name"].get<std::string>(), &d);
            }
        }
    }
    std::vector<plan_step> steps;
    std::set<std::string, std::less<>> declared;
    for (const config_file& f : files) {
        declared.insert(f.name);
        if (!f.config) {
            plan_step step;
            step.name = f.name;
            step.action = plan_action::error;
            step.details.push_back(f.config.error().message);
            steps.push_back(std::move(step));
            continue;
        }
        auto it = running.find(f.name);
        if (it == running.end()) {
            plan_step step;
            step.name = f.name;
            step.action = plan_action::create;
            step.config = *f.config;
            std::string detail = fmt::format(
                "type={} export={}", f.config->type,
                f.config->export_type.empty() ? std::string("(default)") : f.config->export_type);
            for (const std::string& opt : f.config->options) {
                detail += " " + opt;
            }
            step.details.push_back(std::move(detail));
            steps.push_back(std::move(step));
            continue;
        }
        steps.push_back(compare_device(*f.config, *it->second));
    }
    if (prune) {
        for (const auto& [name, d] : running) {
            if (!declared.contains(name)) {
                plan_step step;
                step.name = name;
                step.action = plan_action::prune;
                step.details.push_back(
                    fmt::format("no {}{}: deleted with its data", name, k_config_suffix));
                steps.push_back(std::move(step));
            }
        }
    }
    return steps;
}

std::string restart_data_note(const nlohmann::json& target_description)
{
    // A memory store describes its pages (describe_memory_store).
    if (target_description.is_object() && target_description.contains("data_page_bytes")) {
        return "empty after restart (memory-backed)";
    }
    return {};
}

}  // namespace softblk::host
