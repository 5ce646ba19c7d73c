// `softblk features`: every target type with its options, every export
// type, the default export, and what each front end reports of this
// machine (export_type::host_features).
#include <algorithm>
#include <array>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <softblk/frontend.hpp>

#include "device_host.hpp"
#include "subcommand.hpp"

namespace softblk::cli {

namespace {

using nlohmann::json;

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
    auto features = features_json(type);
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
    // The default is chosen per device: the first available front end
    // (by its default_rank) that can carry it.
    const std::string fallback = (*features)["default_export"].get<std::string>();
    const std::string zoned = (*features)["zoned_export"].get<std::string>();
    fmt::print("export types (default: {}{}):\n", fallback,
               zoned == fallback ? ""
               : zoned == "none"
                   ? std::string("; none carries a zoned device here: give it --export none")
                   : fmt::format("; for a zoned device: {}", zoned));
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
    // What each front end reports of this machine (ublk: every feature bit
    // the running kernel's driver has, unknown ones as "bit N").
    for (const softblk::export_type* e : softblk::export_types()) {
        if (!e->host_features) {
            continue;
        }
        if (auto f = e->host_features()) {
            fmt::print("\n{} {}\n", e->name,
                       f->is_object() && f->contains("text") && (*f)["text"].is_string()
                           ? (*f)["text"].get<std::string>()
                           : f->dump());
        } else {
            fmt::print("\n{} features: unavailable ({})\n", e->name, f.error().message);
        }
    }
    return 0;
}

}  // namespace

void define_features(CLI::App& app, subcommand_table& table)
{
    struct features_command {
        std::string type;
        bool json_output = false;
    };
    auto features = std::make_shared<features_command>();
    CLI::App* cmd =
        app.add_subcommand("features", "every option of every target type, and the export types");
    cmd->add_option("type", features->type, "only this target type");
    cmd->add_flag("--json", features->json_output, "print JSON");
    table.push_back(
        {cmd, [features] { return run_features(features->type, features->json_output); }});
}

}  // namespace softblk::cli
