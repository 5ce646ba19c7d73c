// The softblk daemon: hosts the devices (device_host), serves the control
// socket (control_server) and answers the protocol's methods:
//
//   add       {type, name?, options: ["k=v"...], export?, export_options?,
//              config? (the device file it comes from: softblk apply)}
//   del       {name} or {all: true}
//   set       {name, options: ["k=v"...], force?} -> configfs writes (power too)
//   get       {name, keys?: [...]}  -> {values: {key: text}, power, export}
//   zone      {name, action, sector?, count?, all?} -> zone_control.hpp
//   list      {}            -> [device::describe() + state + memory + export]
//   features  {type?}       -> targets with options, export types
//   status    {}            -> pid, uid, run_dir, devices, recovering, uptime, state,
//                              memory, metrics (where they are published)
//   shutdown  {force?}      -> stops the daemon; state files stay
//
// The control thread never waits for a device: add, the sets that power a
// device on or off or re-make its queues, del and shutdown start work on
// threads of their own (device_host: begin_add, begin_set, begin_remove;
// recovery at start too) and answer when it ends (del and shutdown: or
// when --stop-timeout passes); every other request is answered meanwhile.
// Shutdown and termination signals never pull a device from under a
// mounted file system (docs/reliability.md).
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "control_server.hpp"
#include "device_host.hpp"
#include "memory_limit.hpp"
#include "metrics_publisher.hpp"
#include "protocol.hpp"
#include "run_dir.hpp"

namespace softblk::cli {

// The host library (src/host): the device table, run directory, memory
// budget and zone requests the command line and the daemon use.
using namespace softblk::host;

// Exit status of a daemon that found another one holding the lock.
constexpr int k_exit_already_running = 3;

struct daemon_options {
    // Also log to stderr (foreground use); the log file is always written.
    bool log_to_stderr = true;
    // See server_limits::request_timeout.
    std::chrono::milliseconds client_timeout{10'000};
    // The daemon's budget of data memory (memory_limit.hpp).
    memory_limit_choice memory;
    // How long del and shutdown wait for an export to stop before they give
    // up on it (it goes on stopping in the background; at exit the daemon
    // leaves it behind).
    std::chrono::milliseconds stop_timeout{30'000};
    // null_blk's module parameters for null devices ("gb=1", "bs=4096",
    // "poll_queues=2"; set_option_defaults) and nr_devices, the number of
    // devices nullb0.. to make at start (null_blk's default is 1, the
    // daemon's 0: a daemon started on demand makes none).
    std::vector<std::string> module_parameters;
    unsigned nr_devices = 0;
    // Where the daemon publishes its metrics (metrics_publisher.hpp): none
    // unless given.
    metrics_options metrics;
};

// Answers the protocol's methods and runs the daemon's shutdown, on the
// control thread.
class control_service {
public:
    control_service(device_host& host, run_paths paths, control_server& server,
                    const daemon_options& options);

    // A request's reply, or std::nullopt when it comes later (del waits for
    // teardowns through `token`).
    std::optional<result<nlohmann::json>> handle(const request& req, const reply_token& token);

    // A termination signal (`name`): stops as `shutdown` does but refuses
    // nothing: devices whose export is in use keep serving until released.
    void on_signal(const std::string& name);

    // Collects ended teardowns, answers the dels waiting for them or past
    // their time, and moves a shutdown on (stopping devices as they are
    // released, ending the server when none is left or the rest is stuck).
    // Every pass of the control loop.
    void tick();

private:
    // An add or set whose reply waits for its job.
    struct pending_job {
        reply_token token;
        std::string name;  // the device; one job runs on it at a time
    };
    // A del whose reply waits for teardowns.
    struct pending_del {
        reply_token token;
        bool all = false;
        std::vector<std::string> waiting;
        nlohmann::json deleted = nlohmann::json::array();
        std::vector<std::string> failures;
        int code = 0;
        std::chrono::steady_clock::time_point deadline;
    };

    std::optional<result<nlohmann::json>> add(const nlohmann::json& params,
                                              const reply_token& token);
    std::optional<result<nlohmann::json>> set(const nlohmann::json& params,
                                              const reply_token& token);
    std::optional<result<nlohmann::json>> del(const nlohmann::json& params,
                                              const reply_token& token);
    result<nlohmann::json> shutdown(const nlohmann::json& params);
    nlohmann::json status() const;
    // Starts stopping the daemon: stops every device (`force`: also those
    // in use); the server ends once no device is left.
    void begin_stop(std::string reason, bool force);
    // Starts the teardown of every running device that may stop now.
    void stop_released_devices();
    // The service manager's STATUS= line (systemctl status): the devices
    // served, sent when it changes.
    void report_status();
    // The reply of a del whose teardowns ended or whose time is up.
    result<nlohmann::json> outcome(const pending_del& del) const;

    device_host& _host;
    run_paths _paths;
    control_server& _server;
    std::chrono::milliseconds _stop_timeout;
    memory_limit_choice _memory;
    metrics_options _metrics;
    std::chrono::steady_clock::time_point _started;
    std::vector<pending_job> _jobs;
    std::vector<pending_del> _dels;
    // Shutdown in progress (empty: serving).
    std::string _stop_reason;
    bool _stop_force = false;
    std::chrono::steady_clock::time_point _stop_since;
    std::chrono::steady_clock::time_point _next_release_check;
    std::string _busy_logged;
    std::string _status_sent;
};

// Runs the daemon in this process until `shutdown`, SIGTERM, SIGINT or
// SIGHUP (and, for those, until no device is in use): takes the lock,
// writes the pid file, cleans up stale exports, recovers the devices,
// serves the socket; on the way out removes the socket and pid file (state
// files stay). Returns the exit status: 0, 1 on error,
// k_exit_already_running. A daemon that gave up on a stuck teardown ends
// the process with _exit (its thread still holds the device). Main thread,
// before any other thread exists.
int run_daemon(const run_paths& paths, const daemon_options& options);

}  // namespace softblk::cli
