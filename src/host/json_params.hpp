// Reading the fields of a JSON object with errors a person can act on: the
// control protocol's request parameters (src/cli/protocol.hpp) and the
// host's state files alike; and the rules for device names, which name
// files under the run directory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include <softblk/types.hpp>

namespace softblk::host {

// Most strings in one array parameter (options), and their longest length.
constexpr size_t k_max_array_items = 1024;
constexpr size_t k_max_string_bytes = 4096;

// Typed access to request parameters. Each returns an error naming the
// parameter when it has the wrong type or is too long; a missing optional
// parameter yields the fallback.
result<std::string> param_string(const nlohmann::json& params, std::string_view key, bool required,
                                 std::string fallback = {});
result<bool> param_bool(const nlohmann::json& params, std::string_view key, bool fallback);
// A non-negative integer of at most `max`.
result<uint64_t> param_u64(const nlohmann::json& params, std::string_view key, uint64_t fallback,
                           uint64_t max = UINT64_MAX);
result<std::vector<std::string>> param_strings(const nlohmann::json& params, std::string_view key);

// Device names: 1 to 64 characters from [A-Za-z0-9_.-], not starting with a
// dot (they name files and directories under the run directory). What a
// state file may name (devices of older versions included).
bool valid_device_name(std::string_view name);

// A name for a new device: valid_device_name, and neither starting with '-'
// (the command line would take it for an option) nor "features" (the file
// at the top of null_blk's configfs tree, which `softblk nullb mount`
// serves; the kernel refuses that mkdir too, with EEXIST). The error says
// what is wrong with the name.
result<void> check_new_device_name(std::string_view name);

}  // namespace softblk::host
