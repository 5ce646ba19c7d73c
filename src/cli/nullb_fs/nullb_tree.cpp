#include "nullb_tree.hpp"

#include <algorithm>

#include <nlohmann/json.hpp>

#include <softblk/frontend.hpp>

namespace softblk::cli {

namespace {

// memb_group_features_show of Linux 6.12 (drivers/block/null_blk/main.c).
constexpr std::string_view k_features_6_12[] = {
    "badblocks",
    "blocking",
    "blocksize",
    "cache_size",
    "fua",
    "completion_nsec",
    "discard",
    "home_node",
    "hw_queue_depth",
    "irqmode",
    "max_sectors",
    "mbps",
    "memory_backed",
    "no_sched",
    "poll_queues",
    "power",
    "queue_mode",
    "shared_tag_bitmap",
    "shared_tags",
    "size",
    "submit_queues",
    "use_per_node_hctx",
    "virt_boundary",
    "zoned",
    "zone_capacity",
    "zone_max_active",
    "zone_max_open",
    "zone_nr_conv",
    "zone_offline",
    "zone_readonly",
    "zone_size",
    "zone_append_max_sectors",
    "zone_full",
};

// index is a 6.12 attribute that its features list leaves out.
constexpr std::string_view k_not_in_features = "index";

std::string_view group_of(std::string_view name)
{
    const size_t slash = name.find('/');
    return slash == std::string_view::npos ? std::string_view() : name.substr(0, slash);
}

}  // namespace

nullb_tree::nullb_tree(std::span<const option_def> defs)
{
    for (const option_def& def : defs) {
        if (def.update != option_update::creation) {
            _defs.push_back(def);
        }
    }
}

std::vector<nullb_tree::entry> nullb_tree::device_entries() const
{
    std::vector<entry> out;
    for (const option_def& def : _defs) {
        const std::string_view group = group_of(def.name);
        if (group.empty()) {
            out.push_back({std::string(def.name), false, mode_t(def.write_only ? 0200 : 0644)});
        } else if (std::none_of(out.begin(), out.end(),
                                [&](const entry& e) { return e.directory && e.name == group; })) {
            out.push_back({std::string(group), true, 0755});
        }
    }
    out.push_back({std::string(k_device_file), false, 0444});
    return out;
}

std::vector<nullb_tree::entry> nullb_tree::group_entries(std::string_view group) const
{
    std::vector<entry> out;
    for (const option_def& def : _defs) {
        if (group_of(def.name) == group) {
            out.push_back({std::string(def.name.substr(group.size() + 1)), false,
                           mode_t(def.write_only ? 0200 : 0644)});
        }
    }
    return out;
}

bool nullb_tree::is_group(std::string_view name) const
{
    return !name.empty() && std::any_of(_defs.begin(), _defs.end(), [&](const option_def& d) {
        return group_of(d.name) == name;
    });
}

const option_def* nullb_tree::attribute(std::string_view path) const
{
    for (const option_def& def : _defs) {
        if (def.name == path) {
            return &def;
        }
    }
    return nullptr;
}

std::string nullb_tree::features() const
{
    std::vector<std::string_view> names;
    for (std::string_view name : k_features_6_12) {
        if (attribute(name) != nullptr) {
            names.push_back(name);
        }
    }
    for (const option_def& def : _defs) {
        if (group_of(def.name).empty() && def.name != k_not_in_features &&
            std::find(names.begin(), names.end(), def.name) == names.end()) {
            names.push_back(def.name);
        }
    }
    std::string out;
    for (std::string_view name : names) {
        out += out.empty() ? "" : ",";
        out += name;
    }
    return out + "\n";
}

std::string nullb_tree::device_text(int power, const nlohmann::json& exp)
{
    if (power == 0 || !exp.is_object()) {
        return {};
    }
    // The kernel block device first, then what the export offers instead.
    std::string where = export_location(exp);
    return where.empty() ? where : where + "\n";
}

}  // namespace softblk::cli
