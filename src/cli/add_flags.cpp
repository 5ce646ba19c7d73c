#include "add_flags.hpp"

#include <cerrno>
#include <initializer_list>

#include <fmt/format.h>

#include <softblk/device.hpp>
#include <softblk/options.hpp>
#include <softblk/target.hpp>

namespace softblk::cli {

namespace {

// Bytes per unit of an option whose value is a size; 0 if not a size unit.
uint64_t unit_bytes(std::string_view unit)
{
    if (unit == "bytes" || unit == "B") {
        return 1;
    }
    if (unit == "512-byte sectors" || unit == "sectors") {
        return 512;
    }
    if (unit == "KiB") {
        return 1ull << 10;
    }
    if (unit == "MiB") {
        return 1ull << 20;
    }
    if (unit == "GiB") {
        return 1ull << 30;
    }
    return 0;
}

const option_def* find_def(const std::vector<option_def>& defs,
                           std::initializer_list<std::string_view> names)
{
    for (std::string_view name : names) {
        for (const option_def& def : defs) {
            if (def.name == name) {
                return &def;
            }
        }
    }
    return nullptr;
}

// The canonical name of key `key` (its alias resolved); empty if unknown.
std::string_view canonical(const std::vector<option_def>& defs, std::string_view key)
{
    for (const option_def& def : defs) {
        if (def.name == key || (!def.alias.empty() && def.alias == key)) {
            return def.name;
        }
    }
    return {};
}

}  // namespace

result<std::vector<std::string>> apply_add_flags(std::string_view type,
                                                 std::vector<std::string> options,
                                                 const add_flags& flags)
{
    if (find_target_type(type) == nullptr) {
        // device::create reports the unknown type; flags cannot be mapped.
        if (flags.size || flags.block_size || flags.memory_backed || flags.queues || flags.depth) {
            return make_error(
                ENOENT, fmt::format("unknown target type '{}' (see `softblk features`)", type));
        }
        return options;
    }
    const std::vector<option_def> defs = options_for(type);
    std::vector<std::string> added;

    auto add = [&](std::string_view flag, const option_def* def,
                   std::string value) -> result<void> {
        if (def == nullptr) {
            return make_error(EINVAL,
                              fmt::format("{}: target type '{}' has no such option", flag, type));
        }
        for (const std::string& arg : options) {
            const size_t eq = arg.find('=');
            const std::string_view key = std::string_view(arg).substr(0, eq);
            if (canonical(defs, key) == def->name) {
                return make_error(
                    EINVAL, fmt::format("{} {} and {}: the same option given twice; give one", flag,
                                        value, arg));
            }
        }
        added.push_back(fmt::format("{}={}", def->name, value));
        return {};
    };

    if (flags.size) {
        const option_def* def = find_def(defs, {"size", "capacity_mb", "capacity"});
        auto bytes = parse_size(*flags.size);
        if (!bytes) {
            return make_error(EINVAL,
                              fmt::format("--size {}: {}", *flags.size, bytes.error().message));
        }
        std::string value;
        if (def != nullptr) {
            const uint64_t unit = unit_bytes(def->unit);
            if (unit == 0) {
                return make_error(
                    EINVAL, fmt::format("--size: option {} of type '{}' is in '{}', which --size "
                                        "cannot convert to; give {}=VALUE",
                                        def->name, type, def->unit, def->name));
            }
            if (*bytes % unit != 0 || *bytes == 0) {
                return make_error(
                    EINVAL,
                    fmt::format("--size {}: must be a non-zero multiple of 1 {} ({}= is in {})",
                                *flags.size, def->unit, def->name, def->unit));
            }
            value = std::to_string(*bytes / unit);
        }
        if (auto r = add("--size", def, value); !r) {
            return std::unexpected(r.error());
        }
    }
    if (flags.block_size) {
        const option_def* def = find_def(defs, {"blocksize", "block_size"});
        auto bytes = parse_size(*flags.block_size);
        if (!bytes) {
            return make_error(EINVAL,
                              fmt::format("--bs {}: {}", *flags.block_size, bytes.error().message));
        }
        if (auto r = add("--bs", def, std::to_string(*bytes)); !r) {
            return std::unexpected(r.error());
        }
    }
    if (flags.memory_backed) {
        if (auto r = add("--memory-backed", find_def(defs, {"memory_backed"}), "1"); !r) {
            return std::unexpected(r.error());
        }
    }
    if (flags.queues) {
        if (auto r = add("--queues", find_def(defs, {"submit_queues"}), *flags.queues); !r) {
            return std::unexpected(r.error());
        }
    }
    if (flags.depth) {
        if (auto r = add("--depth", find_def(defs, {"hw_queue_depth"}), *flags.depth); !r) {
            return std::unexpected(r.error());
        }
    }
    options.insert(options.end(), added.begin(), added.end());
    return options;
}

}  // namespace softblk::cli
