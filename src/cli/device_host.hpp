// The daemon's table of devices: creates, exports, lists and destroys
// them, keeps one state file per device under $RUN_DIR/devices and
// re-creates the devices from those files when a daemon starts again
// (recovery). Knows no target or front end by name: both come from their
// registries.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include <softblk/device.hpp>
#include <softblk/frontend.hpp>

namespace softblk::cli {

// What `softblk add` asks for.
struct add_request {
    std::string type;                  // target type, e.g. "null"
    std::string name;                  // empty: TYPE + the lowest free number
    std::vector<std::string> options;  // "key=value", null_blk style
    std::string export_type;           // empty: the default; "none": no export
    std::vector<std::string> export_options;
};

// The export chosen when `add` names none: the first registered and
// available of ublk, fuse; "none" when neither is.
std::string default_export_type();

// Every target type with every option (unit, default, range, help) and
// every export type, for `softblk features`. An unknown `type` is an error
// naming the known ones; empty means all types. Any thread.
result<nlohmann::json> features_json(std::string_view type);

class device_host {
public:
    // `ctx.run_dir` is the run directory; state files go to `state_dir`.
    device_host(export_context ctx, std::string state_dir);
    // Stops every export and destroys every device; state files stay.
    ~device_host();

    device_host(const device_host&) = delete;
    device_host& operator=(const device_host&) = delete;

    // Creates, exports and records a device. On any error nothing is left
    // behind. Returns {name, type, capacity_bytes, logical_block_size,
    // export: {type, ...the export's describe()}}. Control thread.
    result<nlohmann::json> add(const add_request& request);

    // Stops the export, destroys the device, removes its state file. A
    // device whose export refuses to stop (e.g. its loop device is
    // mounted) stays as it was and the error says why. Control thread.
    result<nlohmann::json> remove(std::string_view name);
    // Removes every device; the error lists the ones that stayed.
    result<nlohmann::json> remove_all();

    // Every device with device::describe(), its export and its state
    // ("running", or "failed" with the reason when recovery failed), in
    // creation order. Control thread.
    nlohmann::json list() const;

    // Runs each export type's cleanup_stale, then re-creates and re-exports
    // every device found in the state directory, in creation order. A
    // device that cannot be re-created is listed as failed (its state file
    // stays until `del`). Returns {recovered: [...], failed: [...]}.
    // Control thread, once, before the control socket opens.
    nlohmann::json recover();

    // Stops every export and destroys every device; state files stay, so
    // the next daemon recovers them. Control thread.
    void stop_all();

    size_t size() const { return _devices.size(); }

private:
    struct hosted_device {
        std::string name;
        std::string type;
        std::vector<std::string> options;  // what re-creates the device
        std::string export_type;           // "none" or a registered type
        std::vector<std::string> export_options;
        uint64_t sequence = 0;  // creation order, kept across recovery
        std::unique_ptr<device> dev;
        std::unique_ptr<device_export> exp;
        std::string failure;  // recovery failed: why (dev is null)
    };

    result<void> create(hosted_device& entry);
    result<void> write_state(const hosted_device& entry) const;
    std::string state_path(std::string_view name) const;
    std::string next_name(std::string_view type) const;
    nlohmann::json entry_json(const hosted_device& entry) const;

    export_context _ctx;
    std::string _state_dir;
    std::map<std::string, hosted_device, std::less<>> _devices;
    uint64_t _next_sequence = 1;
};

}  // namespace softblk::cli
