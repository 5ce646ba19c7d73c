// `softblk zone report|open|close|finish|reset`: zone report and
// management through the daemon, as blkzone(8).
#include <initializer_list>
#include <memory>
#include <optional>
#include <utility>

#include <fmt/format.h>

#include "subcommand.hpp"
#include "zone_control.hpp"

namespace softblk::cli {

namespace {

using nlohmann::json;

struct zone_command {
    std::string name;
    std::optional<uint64_t> sector;  // the positional SECTOR (one zone)
    std::optional<uint64_t> offset;  // --offset
    uint32_t count = 0;              // --count (0: to the end)
    bool all = false;
    bool json_output = false;
};

int run_zone(zone_action action, const zone_command& cmd)
{
    const char* verb = to_string(action);
    zone_request req{.action = action, .count = cmd.count, .all = cmd.all};
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
    json params = zone_params(req);
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
            fmt::print("{}\n", format_zone_line(zone));
        }
        if (res->value("more", false)) {
            fmt::print(stderr,
                       "softblk zone report: stopped after {} zones; report again with "
                       "--offset past the last one\n",
                       k_max_report_zones);
        }
    }
    return 0;
}

}  // namespace

void define_zone(CLI::App& app, subcommand_table& table)
{
    // One set of values: CLI11 parses one subcommand of `zone`.
    auto zone = std::make_shared<zone_command>();
    CLI::App* zone_cmd = app.add_subcommand(
        "zone",
        "zone report and management of a zoned device, as blkzone(8) (sectors of 512 "
        "bytes; through the daemon, exported or not: an export's queue thread runs them in "
        "order with its I/O)");
    zone_cmd->require_subcommand(1);
    for (auto [action, help] : std::initializer_list<std::pair<zone_action, const char*>>{
             {zone_action::report,
              "print the zones: start, len, cap, wptr (from the zone's start), condition, type"},
             {zone_action::open, "open zones explicitly"},
             {zone_action::close, "close open zones"},
             {zone_action::finish, "make zones full"},
             {zone_action::reset, "make zones empty (their data is forgotten)"}}) {
        CLI::App* sub = zone_cmd->add_subcommand(to_string(action), help);
        sub->add_option("name", zone->name, "device name")->required();
        if (action != zone_action::report) {
            sub->add_option("sector", zone->sector, "start sector of the zone");
        }
        sub->add_option("--offset,-o", zone->offset,
                        action == zone_action::report
                            ? "report from the zone holding this sector (default 0)"
                            : "start sector of the first zone (to the end, or --count zones)");
        sub->add_option("--count,-c", zone->count, "number of zones (default: to the end)");
        if (action == zone_action::reset) {
            sub->add_flag("--all", zone->all, "every sequential zone (one reset-all request)");
        }
        sub->add_flag("--json", zone->json_output, "print JSON");
        table.push_back({sub, [zone, action = action] { return run_zone(action, *zone); }});
    }
}

}  // namespace softblk::cli
