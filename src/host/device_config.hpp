// Devices declared in files: one NAME.conf per device under a
// configuration directory (/etc/softblk/devices.d), read by `softblk apply`
// and written by `softblk save` (docs/config.md). A file holds the options
// of `softblk add`, one `key=value` a line, `#` comments:
//   type=file                  the target type (required)
//   export=fuse                the export type, or none (default: add's)
//   export-opt.poll_us=200     an export option (repeatable)
//   path=/srv/disk.img         any option of the target type or the core
// Keys are checked against the option tables the targets and exports
// register, so a file says what `add` would accept; every error names
// FILE:LINE and the key.
//
// The plan (plan_apply) compares the files with the daemon's `list` and
// says, per device, what `apply` does: create it, change the attributes
// that `softblk set` changes on a powered-on device (null_blk's live
// attributes), or report what differs and cannot change without
// re-creating the device. Nothing here talks to the daemon.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include <softblk/types.hpp>

namespace softblk::host {

// Where the files are unless --config-dir or $SOFTBLK_CONFIG_DIR says.
constexpr std::string_view k_default_config_dir = "/etc/softblk/devices.d";
// A device file's name: NAME + this.
constexpr std::string_view k_config_suffix = ".conf";
// The key prefix of export options (export-opt.KEY=VALUE, as add's
// --export-opt KEY=VALUE).
constexpr std::string_view k_export_opt_prefix = "export-opt.";

// `given` when not empty, else $SOFTBLK_CONFIG_DIR when set, else
// k_default_config_dir. Any thread.
std::string resolve_config_dir(std::string_view given);

struct device_config {
    std::string name;  // the file's name without ".conf"
    std::string path;  // the file
    std::string type;
    std::vector<std::string> options;  // key=value, in file order
    std::string export_type;           // empty: add's default; "none": no export
    std::vector<std::string> export_options;
};

// Parses the text of device file `path` (its name gives the device's).
// Errors (EINVAL, ENOENT for an unknown key) read "PATH:LINE: ..." and name
// the key: a line without '=', an unknown key (with the type's known ones
// pointed to), a value the option's parser refuses or that is out of its
// range, a key given twice (repeatable options excepted), no type line.
// Any thread.
result<device_config> parse_device_config(const std::string& path, std::string_view text);

// One file of a configuration directory: parsed, or why not.
struct config_file {
    std::string name;
    std::string path;
    result<device_config> config;
};

// Every NAME.conf of `dir` (other names are ignored; an invalid device
// name is an error of that file), sorted by name. A missing directory has
// no files; one that cannot be read is an error. Any thread.
result<std::vector<config_file>> read_config_dir(const std::string& dir);

// The file that re-creates a device of `list` (its type, the options the
// user gave, its export and export options), with a comment header.
std::string render_device_config(const nlohmann::json& listed);

enum class plan_action {
    create,     // no such device: `add` it
    update,     // live attributes differ: `set` them
    unchanged,  // the device matches its file
    differs,    // something that cannot change live differs; nothing done
    prune,      // running, no file (acted on with --prune only)
    error,      // the file is bad, or the device cannot be compared
};
std::string_view plan_action_name(plan_action action);

struct plan_step {
    std::string name;
    plan_action action = plan_action::unchanged;
    // What differs, what is done or why not: one line each.
    std::vector<std::string> details;
    device_config config;             // create: what to add
    std::vector<std::string> writes;  // update: set's key=value, in order
};

// What apply does to make `listed` (the daemon's `list`) match `files`:
// a step per file, in name order, then (prune) one per running device
// without a file. Devices without a file are left out unless `prune`.
// Any thread.
std::vector<plan_step> plan_apply(const std::vector<config_file>& files,
                                  const nlohmann::json& listed, bool prune);

// What `list` says of the data of a device made from a file whose target
// keeps it in memory (`describe`d target with a memory store), and empty
// otherwise: after a restart such a device is made again, empty.
std::string restart_data_note(const nlohmann::json& target_description);

}  // namespace softblk::host
