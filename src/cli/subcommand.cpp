// What the subcommands of `softblk` share (subcommand.hpp).
#include "subcommand.hpp"

#include <cstdio>
#include <cstring>

#include <fmt/format.h>

#include <softblk/frontend.hpp>

#include "run_dir.hpp"

namespace softblk::cli {

using nlohmann::json;

int fail(const error& err)
{
    fmt::print(stderr, "softblk: {}\n", err.message);
    return k_exit_failure;
}

int fail_json(const error& err, bool json_output)
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

std::string dump(const json& value)
{
    return value.dump(2, ' ', false, json::error_handler_t::replace);
}

result<control_client> connect(bool autostart)
{
    auto paths = resolve_run_paths();
    if (!paths) {
        return std::unexpected(paths.error());
    }
    return control_client::connect(*paths, autostart);
}

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
    // The front end's own line (ublk: the kernel's view of the device and
    // the daemon that serves it), else where the export is.
    const export_type* front_end = find_export_type(type);
    const std::string own =
        front_end != nullptr && front_end->summary ? front_end->summary(exp) : std::string();
    if (!own.empty()) {
        summary = fmt::format("{} {}", type, own);
    } else if (std::string where = export_location(exp); !where.empty()) {
        summary = fmt::format("{} {}", type, where);
    }
    // What the export wants a person to know (an NBD listener without TLS,
    // a ublk disk that kept its size).
    if (exp.contains("warning") && exp["warning"].is_string()) {
        summary += fmt::format(" ({})", exp["warning"].get<std::string>());
    }
    return summary;
}

}  // namespace softblk::cli
