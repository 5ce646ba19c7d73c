// `softblk zone report|open|close|finish|reset NAME ...`: the protocol's
// "zone" method on both sides. The daemon side runs the request on a device
// through the core's submission path as control submissions
// (device::report_zones and device::execute_control with the zone
// operations: the same checks, decorators and zone engine as any front
// end's requests; on an exported device they go through the export's queue
// thread, in order with its I/O); the client side turns the reply into what
// blkzone(8) prints.
//
//   zone {name, action: "report", sector?, count?}
//        -> {name, zone_sectors, nr_zones, zones: [{start, len, cap, wptr,
//            type, type_name, cond, cond_name}], more}
//   zone {name, action: "open"|"close"|"finish"|"reset", sector, count?}
//        -> {name, action, zones: [start ...]}
//   zone {name, action: "reset", all: true}  -> {name, action, all: true}
//
// Positions and sizes are in 512-byte sectors, as blkzone and the kernel's
// BLKREPORTZONE give them; `wptr` is absolute, null where the zone has no
// write pointer (the model's UINT64_MAX). `count` 0 (or absent) means every
// zone from `sector` to the end of the device.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include <softblk/device.hpp>
#include <softblk/types.hpp>

namespace softblk::host {

enum class zone_action : uint8_t { report, open, close, finish, reset };

// Most zones one report reply holds; the reply says `more` when it stops
// there (report again from the next zone).
constexpr uint32_t k_max_report_zones = 65'536;

struct zone_request {
    zone_action action = zone_action::report;
    uint64_t sector = 0;  // start of the first zone
    uint32_t count = 0;   // zones; 0: to the end of the device
    bool all = false;     // reset: every sequential zone (one reset-all request)
};

// "report", "open" ... and back; nullopt for an unknown name.
const char* to_string(zone_action action);
std::optional<zone_action> parse_zone_action(std::string_view name);

// The request's protocol parameters (without "name"), and back. Errors name
// the parameter (a wrong type, --all with an action other than reset or
// with a sector or count). Any thread.
nlohmann::json zone_params(const zone_request& req);
result<zone_request> parse_zone_params(const nlohmann::json& params);

// Runs `req` on `dev` (the daemon's control thread, through
// device::execute_control: on submit queue 0, by the export's thread that
// drives it or else on this thread; the call waits for each request).
// Errors: EOPNOTSUPP not a zoned
// device, ENODEV powered off, EINVAL a sector beyond the device or not at a
// zone start, and the zone engine's errno (ETOOMANYREFS, EOVERFLOW, EIO ...)
// with a message that names the zone, its condition and the limit in force.
// A range stops at the first zone that fails; the message says how many
// were done.
result<nlohmann::json> run_zone_request(device& dev, const zone_request& req);

// One zone of a report reply as blkzone report prints it:
//   "  start: 0x000080000, len 0x080000, cap 0x080000, wptr 0x000010 reset:0
//   non-seq:0, zcond: 2(oi) [type: 2(SEQ_WRITE_REQUIRED)]" (one line).
std::string format_zone_line(const nlohmann::json& zone);

}  // namespace softblk::host
