// The daemon's table of devices: creates, exports, lists and destroys
// them, keeps one state file per device under $RUN_DIR/devices and
// re-creates the devices from those files when a daemon starts again
// (recovery). Knows no target or front end by name: both come from their
// registries.
//
// Removal never blocks the control thread: a device's export is stopped and
// the device destroyed on a teardown thread of its own, which the control
// thread starts (begin_remove) and collects (reap) when the thread says it
// is done through wake_fd(). A front end that cannot stop (a request the
// device never completes) then delays only that device, which `list`
// shows as "stopping" (docs/reliability.md, "Control plane").
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include <softblk/device.hpp>
#include <softblk/frontend.hpp>

#include "zone_control.hpp"

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

    // Creates, exports and records a device; with power=0 among the options
    // the device is made powered off and exported when powered on (`set`).
    // On any error nothing is left behind. Returns {name, type, power,
    // capacity_bytes, logical_block_size, options, notes?, export: {type,
    // ...the export's describe()}}. Control thread.
    result<nlohmann::json> add(const add_request& request);

    // Configfs writes to device `name`, in order ("key=value"): the
    // device's rules (device::set_option: EBUSY, EINVAL ... with the
    // kernel's errno); power=1 powers the device on and starts its export
    // (reaching the same kernel device as before where the front end can),
    // power=0 stops the export (refused while it is in use unless `force`)
    // and powers off; an attribute whose change re-creates the queues
    // (submit_queues, poll_queues while powered on) restarts the export
    // around it. Stops at the first error; what was applied before stays
    // and is recorded. Returns {name, power, options, notes, export}.
    // Control thread.
    result<nlohmann::json> set(std::string_view name, const std::vector<std::string>& options,
                               bool force);

    // Configfs reads of device `name`: {name, type, power, values: {key:
    // text}, export}
    // for `keys` (every readable attribute when empty). Control thread.
    result<nlohmann::json> get(std::string_view name, const std::vector<std::string>& keys) const;

    // `softblk zone` on device `name` (zone_control.hpp's run_zone_request
    // through device::execute_control, from the control thread: on an
    // exported device the export's queue thread runs each request in order
    // with its I/O, as it would the kernel's or a guest's zone request).
    // Errors also: no such device, being removed, a failed recovery.
    // Control thread.
    result<nlohmann::json> zone(std::string_view name, const zone_request& request);

    // Starts removing device `name`: its export stops and the device is
    // destroyed on a teardown thread. `keep_state`: its state file stays
    // for the next daemon (shutdown) rather than going (del). `force`: an
    // export that refuses to stop (its loop device is mounted) is stopped
    // anyway; without it such a device stays and the error, returned at
    // once, says what holds it. A failed recovery entry (no device) is
    // removed at once. Errors: no such device, already being removed.
    // Control thread.
    result<void> begin_remove(std::string_view name, bool keep_state, bool force);

    struct removal {
        std::string name;
        result<void> outcome;  // error: the export refused; the device runs on
    };
    // Collects the teardowns whose thread ended: a stopped device leaves the
    // table (and its state file, unless kept); one whose export refused to
    // stop is back as it was. Control thread.
    std::vector<removal> reap();

    // Readable when a teardown thread ended (reap() then has work); the
    // caller reads it empty with clear_wake(). Owned by the host.
    int wake_fd() const;
    void clear_wake();

    // Running devices whose export is in use (see device_export::in_use):
    // name and what holds it. Control thread.
    std::vector<std::pair<std::string, std::string>> in_use() const;

    // Names of the devices being removed (teardown running) whose teardown
    // started before `before`. Control thread.
    std::vector<std::string> stopping_since(std::chrono::steady_clock::time_point before) const;

    // Gives up on the teardowns still running (their threads go on
    // detached, owning their export and device) and drops them from the
    // table; those that were deletions lose their state file now. Returns
    // their names. For a daemon that exits anyway. Control thread.
    std::vector<std::string> abandon_stopping();

    // Removes a device and waits for its teardown, however long it takes
    // (in-process users and tests; the daemon uses begin_remove). The
    // error of a device that stays says why. Control thread.
    result<nlohmann::json> remove(std::string_view name);
    // Removes every device; the error lists the ones that stayed.
    result<nlohmann::json> remove_all();

    // Every device with device::describe(), its memory against the budgets,
    // its export and its state ("running", "stopping", or "failed" with the
    // reason when recovery failed), in creation order. Control thread.
    nlohmann::json list() const;

    // Runs each export type's cleanup_stale, then re-creates and re-exports
    // every device found in the state directory, in creation order. A
    // device that cannot be re-created is listed as failed (its state file
    // stays until `del`). Returns {recovered: [...], failed: [...]}.
    // Control thread, once, before the control socket opens.
    nlohmann::json recover();

    // Stops every export (forced) and destroys every device, waiting for
    // them without a bound; state files stay, so the next daemon recovers
    // them. Control thread.
    void stop_all();

    size_t size() const { return _devices.size(); }
    // Devices that are neither failed nor being removed.
    size_t running() const;
    bool contains(std::string_view name) const { return _devices.contains(name); }
    // Every device's name (running, failed or being removed).
    std::vector<std::string> names() const;
    // True while device `name` is being removed.
    bool stopping(std::string_view name) const;

private:
    struct teardown;
    struct wake_event;

    struct hosted_device {
        std::string name;
        std::string type;
        std::vector<std::string> options;  // what re-creates the device
        std::string export_type;           // "none" or a registered type
        std::vector<std::string> export_options;
        uint64_t sequence = 0;  // creation order, kept across recovery
        std::unique_ptr<device> dev;
        std::unique_ptr<device_export> exp;
        std::string failure;                 // recovery failed: why (dev is null)
        std::shared_ptr<teardown> stopping;  // being removed
        // Export options that reach the same kernel device again after a
        // power cycle (device_export::restart_options); this daemon only.
        std::vector<std::string> restart_options;
    };

    result<void> create(hosted_device& entry);
    // Starts the entry's export on its powered-on device (nothing for
    // "none"). Control thread.
    result<void> start_entry_export(hosted_device& entry);
    // Stops the entry's export (refused while in use unless `force`).
    result<void> stop_entry_export(hosted_device& entry, bool force);
    // One configfs write (set's body).
    result<void> set_one(hosted_device& entry, std::string_view key, std::string_view value,
                         bool force);
    // The reply of add and set.
    nlohmann::json summary(const hosted_device& entry) const;
    result<void> write_state(const hosted_device& entry) const;
    std::string state_path(std::string_view name) const;
    std::string next_name(std::string_view type) const;
    nlohmann::json entry_json(const hosted_device& entry) const;
    // Waits for the teardowns of `names` (no bound) and reaps them.
    std::vector<removal> wait_removed(const std::vector<std::string>& names);

    export_context _ctx;
    std::shared_ptr<wake_event> _wake;
    std::string _state_dir;
    std::map<std::string, hosted_device, std::less<>> _devices;
    uint64_t _next_sequence = 1;
};

}  // namespace softblk::cli
