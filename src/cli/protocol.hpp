// The control protocol between `softblk` and its daemon, in the manner of
// SPDK's JSON-RPC: one JSON object per line in each direction over the unix
// socket $RUN_DIR/control.sock.
//
//   request  {"id": 7, "method": "add", "params": {...}}
//   reply    {"id": 7, "result": {...}}
//   or       {"id": 7, "error": {"code": -22, "message": "size=0: ..."}}
//
// `id` is a number, a string or null (echoed as given); `params` is an
// object and may be left out. Error codes are negative errno values. A
// request that cannot be read at all (not JSON, too long, too deeply
// nested) gets an error reply with id null. docs/architecture.md lists the
// methods.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include <softblk/types.hpp>

#include "json_params.hpp"

namespace softblk::cli {

// The host library (src/host): the device table, run directory, memory
// budget and zone requests the command line and the daemon use.
using namespace softblk::host;

// Largest request line the daemon reads; a longer one gets -E2BIG and the
// connection is closed.
constexpr size_t k_max_request_bytes = 1u << 20;
// Deepest nesting of arrays and objects in a request.
constexpr int k_max_request_depth = 16;
// Largest reply line the daemon writes; a longer one is replaced by an
// EMSGSIZE error. What a reply carries is bounded where it is made (a zone
// report at k_max_report_zones, badblocks at one page ...); this is the
// last guard, well above them (a 65,536-zone report is about 9 MiB).
constexpr size_t k_max_reply_bytes = 16u << 20;
struct request {
    nlohmann::json id;  // null, a number or a string
    std::string method;
    nlohmann::json params = nlohmann::json::object();
};

// Parses one request line (without its newline). On error, `id` holds the
// request's id when it could be read (else null) for the error reply.
// Never throws. Any thread.
result<request> parse_request(std::string_view line, nlohmann::json& id);

// The deepest nesting of [ and { in `text`, outside strings; stops counting
// once `limit` is passed (returns limit + 1).
int nesting_depth(std::string_view text, int limit);

// One reply line, with its newline. Invalid UTF-8 in strings is replaced,
// never thrown on. Any thread.
std::string format_result(const nlohmann::json& id, const nlohmann::json& result);
std::string format_error(const nlohmann::json& id, const error& err);
// The reply line for `res` (method's, for messages): format_result or
// format_error, and an error instead of a result line longer than
// `max_bytes` (EMSGSIZE) or one that memory does not hold (ENOMEM).
std::string format_reply(const nlohmann::json& id, const result<nlohmann::json>& res,
                         std::string_view method, size_t max_bytes = k_max_reply_bytes);

// One request line, with its newline (client side).
std::string format_request(int64_t id, std::string_view method, const nlohmann::json& params);

}  // namespace softblk::cli
