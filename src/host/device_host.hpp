// The daemon's table of devices: creates, exports, lists and destroys
// them, keeps one state file per device under $RUN_DIR/devices and
// re-creates the devices from those files when a daemon starts again
// (recovery). Knows no target or front end by name: both come from their
// registries.
//
// The control thread never waits for a device (docs/reliability.md,
// "Control plane"). What may wait runs on a thread of its own, which the
// control thread starts and collects (reap) when the thread says it is done
// through wake_fd():
//   - removal: the export stopped and the device destroyed on a teardown
//     thread (begin_remove); `list` shows "stopping";
//   - creation: the device made (a back end connected) and its export
//     started on a job thread (begin_add), recovery's on one recovery
//     thread in creation order (begin_recover); `list` shows "adding" or
//     "recovering", the name is taken meanwhile;
//   - a set that powers the device on or off or re-makes its queues
//     (begin_set): the device and its export move to a job thread for it;
//     `list` shows "starting" (power on) or "changing".
// A front end that cannot stop or a back end that does not answer then
// delays only its own device.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include <softblk/device.hpp>
#include <softblk/frontend.hpp>

#include "zone_control.hpp"

namespace softblk::host {

// What `softblk add` asks for.
struct add_request {
    std::string type;                  // target type, e.g. "null"
    std::string name;                  // empty: TYPE + the lowest free number
    std::vector<std::string> options;  // "key=value", null_blk style
    // Empty: chosen once the device is made (choose_default_export,
    // frontend.hpp); "none": no export.
    std::string export_type;
    std::vector<std::string> export_options;
    // The device file it comes from (`softblk apply`), or empty: kept in
    // its state file and shown by `list` (with what a restart does to its
    // data, device_config.hpp's restart_data_note).
    std::string config;
};

// What a device's state file saves: what re-creates the device and its
// export (recovery). The host library alone saves a device's settings; an
// export saves only its own kernel facts (ublk: RUN_DIR/ublk/NAME.json).
struct saved_device {
    std::string name;
    std::string type;                  // target type
    std::vector<std::string> options;  // the options the user gave
    std::string export_type;           // "none" or a registered type
    std::vector<std::string> export_options;
};

// The export `add` chooses for a device without zones (zoned=false) or
// with zones when it names none (choose_default_export, frontend.hpp,
// ignoring block size); "none" when no front end can. Any thread.
std::string default_export_type(bool zoned);

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

    // Starts adding a device: the checks that need no device (type and
    // name given and valid, name free, export options without an export)
    // fail at once; then the name is taken (listed as "adding") and a job
    // thread creates the device (its back end connected), starts its export
    // and hands the outcome to reap(), which records the device (its state
    // file) and gives add's reply: {name, type, power, capacity_bytes,
    // logical_block_size, options, notes?, export: {type, ...the export's
    // describe()}}. With power=0 among the options the device is made
    // powered off and exported when powered on (`set`). On any error
    // nothing is left behind. Returns the device's name (chosen when the
    // request names none). Control thread.
    result<std::string> begin_add(const add_request& request);
    // begin_add and its outcome, waited for without a bound (in-process
    // users and tests: what else reap() collects meanwhile is dropped).
    result<nlohmann::json> add(const add_request& request);

    // Configfs writes to device `name`, in order ("key=value"): the
    // device's rules (device::set_option: EBUSY, EINVAL ... with the
    // kernel's errno); power=1 powers the device on and starts its export
    // (reaching the same kernel device as before where the front end can),
    // power=0 stops the export (refused while it is in use unless `force`)
    // and powers off; an attribute whose change re-creates the queues
    // (submit_queues, poll_queues while powered on) restarts the export
    // around it. Stops at the first error; what was applied before stays
    // and is recorded. The reply: {name, power, options, notes, export}.
    // Writes that power the device on or off or re-make its queues run on
    // a job thread: then this returns std::nullopt and reap() hands over
    // the reply; others are applied here and their reply returned.
    // Control thread.
    std::optional<result<nlohmann::json>> begin_set(std::string_view name,
                                                    const std::vector<std::string>& options,
                                                    bool force);
    // begin_set and its outcome, waited for without a bound (as add()).
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
    // removed at once. A device with a job running (being added, recovered,
    // powered on ...) is removed when the job ends: an add then fails
    // (ECANCELED, or ESHUTDOWN with keep_state) and leaves no state file; a
    // recovery not begun yet is skipped. stopping() is true from here on.
    // Errors: no such device, already being removed. Control thread.
    result<void> begin_remove(std::string_view name, bool keep_state, bool force);

    struct removal {
        std::string name;
        result<void> outcome;  // error: the export refused; the device runs on
    };
    // A job that ended: its reply (add and set; recover: the summary or
    // why the device failed to come back).
    struct completion {
        std::string name;
        std::string method;  // "add", "set" or "recover"
        result<nlohmann::json> outcome;
    };
    struct reaped {
        std::vector<removal> removals;
        std::vector<completion> completions;
    };
    // Collects the threads that ended. Teardowns: a stopped device leaves
    // the table (and its state file, unless kept); one whose export refused
    // to stop is back as it was. Jobs: a device made or changed takes its
    // place in the table and its state is written (a failed add leaves
    // nothing, a failed recovery a failed entry); one whose removal was
    // asked for meanwhile starts its teardown. Control thread.
    reaped reap();

    // Readable when a teardown thread ended (reap() then has work); the
    // caller reads it empty with clear_wake(). Owned by the host.
    int wake_fd() const;
    void clear_wake();

    // Running devices whose export is in use (see device_export::in_use):
    // name and what holds it. Control thread.
    std::vector<std::pair<std::string, std::string>> in_use() const;

    // Names of the devices being removed (teardown running, or removal
    // asked for while a job runs) since before `before`. Control thread.
    std::vector<std::string> stopping_since(std::chrono::steady_clock::time_point before) const;

    // Gives up on the teardowns and jobs still running (their threads go on
    // detached, owning their export and device; jobs not begun are
    // skipped) and drops them from the table; deletions lose their state
    // file now. Returns their names. For a daemon that exits anyway.
    // Control thread.
    std::vector<std::string> abandon_stopping();

    // Removes a device and waits for its teardown, however long it takes
    // (in-process users and tests; the daemon uses begin_remove). The
    // error of a device that stays says why. Control thread.
    result<nlohmann::json> remove(std::string_view name);
    // Removes every device; the error lists the ones that stayed.
    result<nlohmann::json> remove_all();

    // Every device with device::describe(), its memory against the budgets,
    // its export and its state ("running", "off", "stopping", "failed" with
    // the reason when recovery failed, or while a job runs "adding",
    // "recovering", "starting", "changing" with busy_ms and nothing read
    // from the device), in creation order; one made from a device file
    // has "config" (the file) and, when its data lives in memory, "data"
    // (restart_data_note). Control thread.
    nlohmann::json list() const;

    // Runs each export type's cleanup_stale and reads the state directory;
    // every device found is listed as "recovering" at once, and one
    // recovery thread re-creates and re-exports them in creation order, then
    // adds `then_add` (null_blk's nr_devices; names taken are skipped).
    // reap() hands each outcome over: a device that cannot be re-created is
    // listed as failed (its state file stays until `del`). Control thread,
    // once.
    // Returns the devices that failed at once (a state file that cannot be
    // read): [{name, error}].
    nlohmann::json begin_recover(const std::vector<add_request>& then_add = {});
    // begin_recover, waited for: {recovered: [...], failed: [...]}.
    nlohmann::json recover();
    // The settings saved for device `name` by this or an earlier process
    // on the same state directory, for one that takes over a single
    // device another left (softblk-driver --recover): ENOENT when there is
    // no state file, EINVAL naming what is wrong with it. Any thread.
    result<saved_device> read_saved(std::string_view name) const;

    // Stops every export (forced) and destroys every device, waiting for
    // them (and for the jobs running) without a bound; state files stay, so
    // the next daemon recovers them. Control thread.
    void stop_all();

    size_t size() const { return _devices.size(); }
    // Devices that run: neither failed, nor being removed, nor in a job.
    size_t running() const;
    bool contains(std::string_view name) const { return _devices.contains(name); }
    // Every device's name (running, failed, being removed or in a job).
    std::vector<std::string> names() const;
    // True while device `name` is being removed (or will be when its job
    // ends).
    bool stopping(std::string_view name) const;
    // What the job running on device `name` does ("adding", "recovering",
    // "starting", "changing"); empty when none runs.
    std::string busy(std::string_view name) const;
    // The devices the recovery thread (begin_recover) has yet to bring
    // back (null_blk's nr_devices with them). Control thread.
    std::vector<std::string> recovering() const;

private:
    struct teardown;
    struct wake_event;
    struct job;

    struct hosted_device {
        std::string name;
        std::string type;
        std::vector<std::string> options;  // what re-creates the device
        std::string export_type;           // "none" or a registered type
        std::vector<std::string> export_options;
        std::string config;     // add_request::config
        uint64_t sequence = 0;  // creation order, kept across recovery
        std::unique_ptr<device> dev;
        std::unique_ptr<device_export> exp;
        std::string failure;                 // recovery failed: why (dev is null)
        std::shared_ptr<teardown> stopping;  // being removed
        // A job runs on the device (being added, recovered, powered on ...):
        // the job owns the device and export meanwhile (dev and exp are
        // null here).
        std::shared_ptr<job> busy;
        // Removal asked for while the job runs: begin_remove's arguments,
        // applied when it ends.
        struct removal_request {
            bool keep_state = false;
            bool force = false;
            std::chrono::steady_clock::time_point since;
        };
        std::optional<removal_request> remove_after;
        // Export options that reach the same kernel device again after a
        // power cycle (device_export::restart_options); this daemon only.
        std::vector<std::string> restart_options;
    };

    // ---- what runs on a job thread (device_jobs.cpp): the entry is the
    // job's own copy, `ctx` too; nothing of the host is touched.

    // Makes the entry's device and starts its export.
    static result<void> create(const export_context& ctx, hosted_device& entry);
    // Starts the entry's export on its powered-on device (nothing for
    // "none").
    static result<void> start_entry_export(const export_context& ctx, hosted_device& entry);
    // Stops the entry's export (refused while in use unless `force`).
    static result<void> stop_entry_export(hosted_device& entry, bool force);
    // One configfs write (set's body).
    static result<void> set_one(const export_context& ctx, hosted_device& entry,
                                std::string_view key, std::string_view value, bool force);
    // set's writes in order, stopping at the first error; the notes the
    // device gave go to `notes`.
    static result<void> apply_writes(const export_context& ctx, hosted_device& entry,
                                     const std::vector<std::string>& options, bool force,
                                     std::vector<std::string>& notes);

    // ---- control thread

    // EBUSY (being removed, a job runs on it) or EINVAL (a failed
    // recovery) naming the device, when get, set and zone cannot use it.
    static result<void> not_running(const hosted_device& entry);
    // add's checks and the entry it makes (name chosen, not in the table).
    result<hosted_device> prepare_add(const add_request& request) const;
    // A job that ended: its outcome into the entry and `out`. Returns
    // false when the entry leaves the table.
    bool finish_job(hosted_device& entry, job& j, reaped& out);
    // Starts the teardown thread of a device that runs; `undo_create`: an
    // add that did not complete (device::undo_create after the export).
    void start_teardown(hosted_device& entry, bool keep_state, bool force,
                        bool undo_create = false);
    // The reply of add and set.
    nlohmann::json summary(const hosted_device& entry) const;
    result<void> write_state(const hosted_device& entry) const;
    void remove_state(const std::string& name) const;
    std::string state_path(std::string_view name) const;
    std::string next_name(std::string_view type) const;
    nlohmann::json entry_json(const hosted_device& entry) const;
    // The state files, parsed, in creation order (those that cannot be
    // read carry their failure).
    std::vector<hosted_device> read_state_files();
    // One state file (NAME.json in the state directory) into `entry`: its
    // name from the file name, the rest from the file; the error says
    // what is wrong.
    result<void> read_state_file(const std::string& file, hosted_device& entry) const;
    // Reaps until `done` says so, sleeping on wake_fd() between (no bound).
    void wait_for(const std::function<bool(reaped&)>& done);

    export_context _ctx;
    std::shared_ptr<wake_event> _wake;
    std::string _state_dir;
    std::map<std::string, hosted_device, std::less<>> _devices;
    uint64_t _next_sequence = 1;
    // The recovery thread (begin_recover) and the jobs it runs, in order.
    std::thread _recovery;
    std::vector<std::shared_ptr<job>> _recovery_jobs;
};

}  // namespace softblk::host
