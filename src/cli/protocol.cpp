#include "protocol.hpp"

#include <cerrno>
#include <new>

#include <fmt/format.h>

namespace softblk::cli {

namespace {

std::string dump(const nlohmann::json& value)
{
    return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

bool valid_id(const nlohmann::json& id)
{
    return id.is_null() || id.is_number() || id.is_string();
}

}  // namespace

int nesting_depth(std::string_view text, int limit)
{
    int depth = 0;
    int deepest = 0;
    bool in_string = false;
    bool escaped = false;
    for (char c : text) {
        if (in_string) {
            if (escaped) {
                escaped = false;
            } else if (c == '\\') {
                escaped = true;
            } else if (c == '"') {
                in_string = false;
            }
            continue;
        }
        if (c == '"') {
            in_string = true;
        } else if (c == '[' || c == '{') {
            ++depth;
            if (depth > deepest) {
                deepest = depth;
                if (deepest > limit) {
                    return limit + 1;
                }
            }
        } else if ((c == ']' || c == '}') && depth > 0) {
            --depth;
        }
    }
    return deepest;
}

result<request> parse_request(std::string_view line, nlohmann::json& id)
{
    id = nullptr;
    if (line.size() > k_max_request_bytes) {
        return make_error(E2BIG,
                          fmt::format("request of {} bytes is larger than the limit of {} bytes",
                                      line.size(), k_max_request_bytes));
    }
    if (nesting_depth(line, k_max_request_depth) > k_max_request_depth) {
        return make_error(EINVAL,
                          fmt::format("request nested deeper than {} levels", k_max_request_depth));
    }
    nlohmann::json doc = nlohmann::json::parse(line, nullptr, false);
    if (doc.is_discarded()) {
        return make_error(EINVAL, "request is not valid JSON (one JSON object per line expected)");
    }
    if (!doc.is_object()) {
        return make_error(EINVAL,
                          fmt::format("request must be a JSON object, not {}", doc.type_name()));
    }
    if (auto it = doc.find("id"); it != doc.end()) {
        if (!valid_id(*it)) {
            return make_error(
                EINVAL,
                fmt::format("\"id\" must be a number, a string or null, not {}", it->type_name()));
        }
        if (it->is_string() && it->get_ref<const std::string&>().size() > k_max_string_bytes) {
            return make_error(EINVAL,
                              fmt::format("\"id\" is longer than {} bytes", k_max_string_bytes));
        }
        id = *it;
    }
    request req;
    req.id = id;
    auto method = doc.find("method");
    if (method == doc.end() || !method->is_string()) {
        return make_error(EINVAL, "request has no \"method\" string");
    }
    req.method = method->get<std::string>();
    if (auto params = doc.find("params"); params != doc.end() && !params->is_null()) {
        if (!params->is_object()) {
            return make_error(
                EINVAL, fmt::format("\"params\" must be an object, not {}", params->type_name()));
        }
        req.params = std::move(*params);
    }
    return req;
}

std::string format_result(const nlohmann::json& id, const nlohmann::json& result)
{
    // Written in pieces rather than through a reply object, which would
    // copy the whole result once more (the keys in the order a dumped
    // object has them).
    std::string line = R"({"id":)";
    line += dump(valid_id(id) ? id : nlohmann::json(nullptr));
    line += R"(,"result":)";
    line += dump(result);
    line += "}\n";
    return line;
}

std::string format_reply(const nlohmann::json& id, const result<nlohmann::json>& res,
                         std::string_view method, size_t max_bytes)
{
    if (!res) {
        return format_error(id, res.error());
    }
    std::string line;
    try {
        line = format_result(id, *res);
    } catch (const std::bad_alloc&) {
        return format_error(id, error{std::error_code(ENOMEM, std::generic_category()),
                                      fmt::format("the reply to {} did not fit in the daemon's "
                                                  "memory; ask for less",
                                                  method)});
    }
    if (line.size() > max_bytes) {
        return format_error(
            id, error{std::error_code(EMSGSIZE, std::generic_category()),
                      fmt::format("the reply to {} would be {} bytes, more than the protocol's "
                                  "limit of {} bytes; ask for less (one device, fewer zones: "
                                  "--count)",
                                  method, line.size(), max_bytes)});
    }
    return line;
}

std::string format_error(const nlohmann::json& id, const error& err)
{
    nlohmann::json reply = nlohmann::json::object();
    reply["id"] = valid_id(id) ? id : nlohmann::json(nullptr);
    const int code = err.code.value() != 0 ? err.code.value() : EIO;
    reply["error"] = {{"code", -code}, {"message", err.message}};
    return dump(reply) + "\n";
}

std::string format_request(int64_t id, std::string_view method, const nlohmann::json& params)
{
    nlohmann::json req = nlohmann::json::object();
    req["id"] = id;
    req["method"] = std::string(method);
    req["params"] = params.is_null() ? nlohmann::json::object() : params;
    return dump(req) + "\n";
}

}  // namespace softblk::cli
