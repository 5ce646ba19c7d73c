#include "json_params.hpp"

#include <cerrno>

#include <fmt/format.h>

namespace softblk::host {

namespace {

std::string dump(const nlohmann::json& value)
{
    return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

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

}  // namespace softblk::host
