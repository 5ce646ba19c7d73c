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

result<std::string> param_string(const nlohmann::json& params, std::string_view key, bool required,
                                 std::string fallback)
{
    auto it = params.find(key);
    if (it == params.end() || it->is_null()) {
        if (required) {
            return make_error(EINVAL, fmt::format("missing parameter \"{}\"", key));
        }
        return fallback;
    }
    if (!it->is_string()) {
        return make_error(
            EINVAL, fmt::format("parameter \"{}\" must be a string, not {}", key, it->type_name()));
    }
    const auto& s = it->get_ref<const std::string&>();
    if (s.size() > k_max_string_bytes) {
        return make_error(EINVAL, fmt::format("parameter \"{}\" is longer than {} bytes", key,
                                              k_max_string_bytes));
    }
    return s;
}

result<bool> param_bool(const nlohmann::json& params, std::string_view key, bool fallback)
{
    auto it = params.find(key);
    if (it == params.end() || it->is_null()) {
        return fallback;
    }
    if (!it->is_boolean()) {
        return make_error(EINVAL, fmt::format("parameter \"{}\" must be true or false, not {}", key,
                                              it->type_name()));
    }
    return it->get<bool>();
}

result<uint64_t> param_u64(const nlohmann::json& params, std::string_view key, uint64_t fallback,
                           uint64_t max)
{
    auto it = params.find(key);
    if (it == params.end() || it->is_null()) {
        return fallback;
    }
    if (!it->is_number_unsigned() || it->get<uint64_t>() > max) {
        return make_error(
            EINVAL, fmt::format("parameter \"{}\" must be an integer from 0 to {}, not {}", key,
                                max, dump(*it)));
    }
    return it->get<uint64_t>();
}

result<std::vector<std::string>> param_strings(const nlohmann::json& params, std::string_view key)
{
    std::vector<std::string> out;
    auto it = params.find(key);
    if (it == params.end() || it->is_null()) {
        return out;
    }
    if (!it->is_array()) {
        return make_error(
            EINVAL,
            fmt::format("parameter \"{}\" must be an array of \"key=value\" strings, not {}", key,
                        it->type_name()));
    }
    if (it->size() > k_max_array_items) {
        return make_error(
            EINVAL, fmt::format("parameter \"{}\" has {} items, more than the limit of {}", key,
                                it->size(), k_max_array_items));
    }
    for (const auto& item : *it) {
        if (!item.is_string()) {
            return make_error(EINVAL,
                              fmt::format("parameter \"{}\" must hold strings only, found {}", key,
                                          item.type_name()));
        }
        const auto& s = item.get_ref<const std::string&>();
        if (s.size() > k_max_string_bytes) {
            return make_error(EINVAL,
                              fmt::format("parameter \"{}\": an item is longer than {} bytes", key,
                                          k_max_string_bytes));
        }
        out.push_back(s);
    }
    return out;
}

bool valid_device_name(std::string_view name)
{
    if (name.empty() || name.size() > 64 || name[0] == '.') {
        return false;
    }
    return name.find_first_not_of(
               "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.") ==
           std::string_view::npos;
}

result<void> check_new_device_name(std::string_view name)
{
    if (!valid_device_name(name)) {
        return make_error(EINVAL,
                          fmt::format("device name '{}' is not valid: 1 to 64 characters from "
                                      "A-Z a-z 0-9 _ - . not starting with a dot or a dash",
                                      name));
    }
    if (name[0] == '-') {
        return make_error(EINVAL, fmt::format("device name '{}' starts with '-': the command line "
                                              "would take it for an option; choose a name that "
                                              "starts with a letter, a digit or '_'",
                                              name));
    }
    if (name == "features") {
        return make_error(EEXIST,
                          "device name 'features' is taken by the file of that name at "
                          "the top of null_blk's configfs tree (softblk nullb mount; the "
                          "kernel refuses that mkdir too): choose another name");
    }
    return {};
}

}  // namespace softblk::cli
