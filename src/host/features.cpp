// `softblk features`: every target type with its options and every export
// type (device_host.hpp), and the export `add` chooses when it names none
// (the front ends' default_rank, frontend.hpp).
#include <algorithm>
#include <cerrno>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <softblk/target.hpp>

#include "device_work.hpp"

namespace softblk::host {

namespace {

const char* kind_name(option_kind kind)
{
    switch (kind) {
    case option_kind::integer:
        return "integer";
    case option_kind::signed_integer:
        return "signed_integer";
    case option_kind::boolean:
        return "boolean";
    case option_kind::text:
        return "text";
    }
    return "unknown";
}

nlohmann::json option_json(const option_def& def)
{
    nlohmann::json o;
    o["name"] = def.name;
    o["kind"] = kind_name(def.kind);
    o["default"] = def.default_value;
    o["unit"] = def.unit;
    o["help"] = def.help;
    if (def.kind == option_kind::integer) {
        const uint64_t width = def.bits >= 64 ? UINT64_MAX : (uint64_t{1} << def.bits) - 1;
        o["min"] = def.min;
        o["max"] = std::min(def.max, width);
        o["bits"] = def.bits;
        o["out_of_range"] = def.range == option_range::clamp ? "clamp" : "reject";
    } else if (def.kind == option_kind::signed_integer) {
        o["min"] = def.smin;
        o["max"] = def.smax;
        o["out_of_range"] = def.range == option_range::clamp ? "clamp" : "reject";
    }
    // When it may change (option_update): configfs' rules.
    switch (def.update) {
    case option_update::powered_off:
        o["changes"] = "powered off";
        break;
    case option_update::live:
        o["changes"] = "any time";
        break;
    case option_update::reconfigure:
        o["changes"] = "queues re-made";
        break;
    case option_update::powered_on:
        o["changes"] = "powered on";
        break;
    case option_update::creation:
        o["changes"] = "at creation";
        break;
    }
    if (def.write_only) {
        o["write_only"] = true;
    }
    if (!def.alias.empty()) {
        o["alias"] = def.alias;
    }
    if (def.repeatable) {
        o["repeatable"] = true;
    }
    return o;
}

}  // namespace

std::string default_export_type(bool zoned)
{
    const export_type* type = default_export_for(zoned);
    return type != nullptr ? std::string(type->name) : std::string("none");
}

result<nlohmann::json> features_json(std::string_view type)
{
    std::vector<const target_type*> types;
    if (type.empty()) {
        types = target_types();
    } else if (const target_type* t = find_target_type(type)) {
        types.push_back(t);
    } else {
        std::vector<std::string> known;
        for (const target_type* known_type : target_types()) {
            known.emplace_back(known_type->name);
        }
        return make_error(ENOENT,
                          fmt::format("unknown target type '{}'; known types: {}", type,
                                      known.empty() ? std::string("(none built in)")
                                                    : fmt::format("{}", fmt::join(known, ", "))));
    }
    nlohmann::json out;
    out["targets"] = nlohmann::json::array();
    for (const target_type* t : types) {
        nlohmann::json tj;
        tj["name"] = t->name;
        tj["description"] = t->description;
        tj["options"] = nlohmann::json::array();
        for (const option_def& def : options_for(t->name)) {
            tj["options"].push_back(option_json(def));
        }
        out["targets"].push_back(std::move(tj));
    }
    out["exports"] = nlohmann::json::array();
    for (const export_type* e : export_types()) {
        nlohmann::json options = nlohmann::json::array();
        for (const option_def& def : e->options) {
            // Export options are given when the export starts, not
            // written as device attributes: no update rule to show.
            nlohmann::json o = option_json(def);
            o.erase("changes");
            options.push_back(std::move(o));
        }
        out["exports"].push_back({{"name", e->name},
                                  {"description", e->description},
                                  {"available", export_available(*e)},
                                  {"zoned", e->zoned},
                                  {"options", std::move(options)}});
    }
    out["exports"].push_back({{"name", "none"},
                              {"description", "no export: the device lives in the daemon only"},
                              {"available", true},
                              {"zoned", true},
                              {"options", nlohmann::json::array()}});
    out["default_export"] = default_export_type(false);
    out["zoned_export"] = default_export_type(true);
    return out;
}

}  // namespace softblk::host
