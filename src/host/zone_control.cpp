#include "zone_control.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include <softblk/zone_engine.hpp>

#include "json_params.hpp"

namespace softblk::host {

namespace {

constexpr uint64_t k_sector = 512;

struct action_name {
    zone_action action;
    const char* name;
    io_op op;
};
constexpr action_name k_actions[] = {
    {zone_action::report, "report", io_op::report_zones},
    {zone_action::open, "open", io_op::zone_open},
    {zone_action::close, "close", io_op::zone_close},
    {zone_action::finish, "finish", io_op::zone_finish},
    {zone_action::reset, "reset", io_op::zone_reset},
};

const action_name& lookup(zone_action action)
{
    return *std::find_if(std::begin(k_actions), std::end(k_actions),
                         [&](const action_name& a) { return a.action == action; });
}

// blkzone's abbreviations of the conditions (BLK_ZONE_COND_* values index
// them; x5..xC are reserved) and names of the types.
constexpr const char* k_condition_codes[16] = {"nw", "em", "oi", "oe", "cl", "x5", "x6", "x7",
                                               "x8", "x9", "xA", "xB", "xC", "ro", "fu", "of"};
constexpr const char* k_type_names[4] = {"RESERVED", "CONVENTIONAL", "SEQ_WRITE_REQUIRED",
                                         "SEQ_WRITE_PREFERRED"};

nlohmann::json zone_json(const zone_descriptor& z)
{
    nlohmann::json wptr = nullptr;
    if (z.write_pointer != k_no_write_pointer) {
        wptr = z.write_pointer / k_sector;
    }
    return nlohmann::json{{"start", z.start / k_sector},
                          {"len", z.length / k_sector},
                          {"cap", z.capacity / k_sector},
                          {"wptr", wptr},
                          {"type", static_cast<unsigned>(z.type)},
                          {"type_name", to_string(z.type)},
                          {"cond", static_cast<unsigned>(z.condition)},
                          {"cond_name", to_string(z.condition)}};
}

// One zone management request as a control submission
// (device::execute_control): through the export's queue thread when one
// drives the queue, else here. Returns 0 or -errno.
int zone_management(device& dev, io_op op, uint64_t start)
{
    bio b = make_bio(op, start, 0, nullptr);
    return dev.execute_control(b);
}

// Why the zone engine may have refused `action` on zone `z`, for the
// errno values whose cause is a limit of the device or the zone's type
// (the rest speak for themselves with the zone's condition beside them).
std::string cause(int err, zone_action action, const zone_descriptor& z, const block_limits& l)
{
    if (z.type == zone_type::conventional) {
        return "; conventional zones take no zone management";
    }
    switch (err) {
    case k_zone_open_resource_error:
        return fmt::format(
            "; the open zone limit (max_open_zones={}) is reached: close or "
            "finish an open zone first",
            l.max_open_zones);
    case k_zone_active_resource_error:
        return fmt::format(
            "; the active zone limit (max_active_zones={}) is reached: finish or "
            "reset an open or closed zone first",
            l.max_active_zones);
    case EIO:
        // zloop's answer to an explicit open past its limit.
        if (action == zone_action::open && l.max_open_zones != 0 &&
            (z.condition == zone_condition::empty || z.condition == zone_condition::closed)) {
            return fmt::format(
                "; the open zone limit (max_open_zones={}) is reached (a zloop "
                "device answers EIO): close or finish an open zone first",
                l.max_open_zones);
        }
        return {};
    default:
        return {};
    }
}

// The error of `action` on the zone at byte `start`, with the zone's type
// or condition as a report shows it now.
error zone_error(device& dev, zone_action action, uint64_t start, int err, size_t done)
{
    std::string state = "condition unknown";
    std::string why;
    if (auto z = dev.report_zones(start, 1, true); z && !z->empty()) {
        const zone_descriptor& d = z->front();
        state = d.type == zone_type::conventional ? "conventional" : to_string(d.condition);
        why = cause(err, action, d, dev.limits());
    }
    const uint64_t zone_size = dev.limits().zone_size_bytes;
    std::string message =
        fmt::format("{}: zone {} of the zone at sector {} (zone {}, {}): {} ({}){}", dev.name(),
                    to_string(action), start / k_sector, start / zone_size, state,
                    std::strerror(err), strerrorname_np(err), why);
    if (done > 0) {
        message += fmt::format(" ({} zone{} before it done)", done, done == 1 ? "" : "s");
    }
    return error{std::error_code(err, std::generic_category()), std::move(message)};
}

}  // namespace

const char* to_string(zone_action action)
{
    return lookup(action).name;
}

std::optional<zone_action> parse_zone_action(std::string_view name)
{
    for (const action_name& a : k_actions) {
        if (name == a.name) {
            return a.action;
        }
    }
    return std::nullopt;
}

nlohmann::json zone_params(const zone_request& req)
{
    nlohmann::json p{{"action", to_string(req.action)}};
    if (req.all) {
        p["all"] = true;
    } else {
        p["sector"] = req.sector;
        p["count"] = req.count;
    }
    return p;
}

result<zone_request> parse_zone_params(const nlohmann::json& params)
{
    zone_request req;
    auto action = param_string(params, "action", true);
    if (!action) {
        return std::unexpected(action.error());
    }
    auto parsed = parse_zone_action(*action);
    if (!parsed) {
        return make_error(EINVAL, fmt::format("unknown zone action '{}' (known: report, open, "
                                              "close, finish, reset)",
                                              action->substr(0, 64)));
    }
    req.action = *parsed;
    auto sector = param_u64(params, "sector", 0);
    auto count = param_u64(params, "count", 0, UINT32_MAX);
    auto all = param_bool(params, "all", false);
    for (const auto* err : {sector ? nullptr : &sector.error(), count ? nullptr : &count.error(),
                            all ? nullptr : &all.error()}) {
        if (err != nullptr) {
            return std::unexpected(*err);
        }
    }
    req.sector = *sector;
    req.count = static_cast<uint32_t>(*count);
    req.all = *all;
    if (req.all && req.action != zone_action::reset) {
        return make_error(EINVAL, fmt::format("\"all\" is for reset only (reset all zones), not {}",
                                              to_string(req.action)));
    }
    if (req.all && (req.sector != 0 || req.count != 0)) {
        return make_error(EINVAL, "\"all\" resets every zone: give no sector or count with it");
    }
    return req;
}

result<nlohmann::json> run_zone_request(device& dev, const zone_request& req)
{
    const block_limits& l = dev.limits();
    if (!dev.powered()) {
        return make_error(ENODEV, fmt::format("{} is powered off (softblk set {} power=1)",
                                              dev.name(), dev.name()));
    }
    if (!l.zoned) {
        return make_error(EOPNOTSUPP,
                          fmt::format("{} is not a zoned device (a null device with zoned=1, or "
                                      "a zloop device, is)",
                                      dev.name()));
    }
    const uint64_t zones = zone_count(l);
    const uint64_t capacity_sectors = l.capacity_bytes / k_sector;
    const uint64_t zone_sectors = l.zone_size_bytes / k_sector;
    nlohmann::json out{{"name", dev.name()}, {"action", to_string(req.action)}};
    if (req.all) {
        if (const int rc = zone_management(dev, io_op::zone_reset_all, 0); rc < 0) {
            return make_error(-rc, fmt::format("{}: reset of all zones: {} ({})", dev.name(),
                                               std::strerror(-rc), strerrorname_np(-rc)));
        }
        out["all"] = true;
        return out;
    }
    if (req.sector >= capacity_sectors) {
        return make_error(
            EINVAL, fmt::format("{}: sector {} is beyond the device's end ({} "
                                "sectors, {} zones of {} sectors)",
                                dev.name(), req.sector, capacity_sectors, zones, zone_sectors));
    }
    const uint64_t first = req.sector / zone_sectors;
    if (req.action != zone_action::report && req.sector % zone_sectors != 0) {
        return make_error(EINVAL,
                          fmt::format("{}: sector {} is not the start of a zone (zones are "
                                      "{} sectors; the zone holding it starts at sector "
                                      "{})",
                                      dev.name(), req.sector, zone_sectors, first * zone_sectors));
    }
    // As blkzone: a count past the end stops at the last zone.
    const uint64_t left = zones - first;
    uint64_t n = req.count == 0 ? left : std::min<uint64_t>(req.count, left);
    if (req.action == zone_action::report) {
        const bool more = n > k_max_report_zones;
        n = std::min<uint64_t>(n, k_max_report_zones);
        auto report = dev.report_zones(req.sector * k_sector, static_cast<uint32_t>(n), true);
        if (!report) {
            return std::unexpected(report.error());
        }
        nlohmann::json list = nlohmann::json::array();
        for (const zone_descriptor& z : *report) {
            list.push_back(zone_json(z));
        }
        out["zone_sectors"] = zone_sectors;
        out["nr_zones"] = zones;
        out["zones"] = std::move(list);
        out["more"] = more;
        return out;
    }
    // The kernel's blkdev_zone_mgmt: a reset of the whole device is one
    // reset-all (which leaves conventional zones alone).
    if (req.action == zone_action::reset && first == 0 && n == zones) {
        return run_zone_request(dev, zone_request{.action = zone_action::reset, .all = true});
    }
    const io_op op = lookup(req.action).op;
    nlohmann::json done = nlohmann::json::array();
    for (uint64_t zone = first; zone < first + n; ++zone) {
        const uint64_t start = zone * l.zone_size_bytes;
        if (const int rc = zone_management(dev, op, start); rc < 0) {
            return std::unexpected(zone_error(dev, req.action, start, -rc, done.size()));
        }
        done.push_back(start / k_sector);
    }
    out["zones"] = std::move(done);
    return out;
}

std::string format_zone_line(const nlohmann::json& zone)
{
    const uint64_t start = zone.value("start", uint64_t{0});
    const unsigned type = zone.value("type", 0u);
    const unsigned cond = zone.value("cond", 0u);
    // blkzone prints the write pointer relative to the zone's start, 0 for
    // conventional zones, and "all ones" minus the start where the device
    // reports none.
    const nlohmann::json& wptr = zone.at("wptr");
    uint64_t relative = 0;
    if (type != static_cast<unsigned>(zone_type::conventional)) {
        relative = (wptr.is_null() ? UINT64_MAX : wptr.get<uint64_t>()) - start;
    }
    return fmt::format(
        "  start: 0x{:09x}, len 0x{:06x}, cap 0x{:06x}, wptr 0x{:06x} reset:0 "
        "non-seq:0, zcond:{:2}({}) [type: {}({})]",
        start, zone.value("len", uint64_t{0}), zone.value("cap", uint64_t{0}), relative, cond,
        k_condition_codes[cond & 15], type, type < 4 ? k_type_names[type] : "UNKNOWN");
}

}  // namespace softblk::host
