// The softblk daemon: hosts the devices (device_host), serves the control
// socket (control_server) and answers the protocol's methods:
//
//   add       {type, name?, options: ["k=v"...], export?, export_options?}
//   del       {name} or {all: true}
//   list      {}            -> [device::describe() + state + export]
//   features  {type?}       -> targets with options, export types
//   status    {}            -> pid, uid, run_dir, devices, uptime
//   shutdown  {}            -> stops the daemon; state files stay
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "device_host.hpp"
#include "protocol.hpp"
#include "run_dir.hpp"

namespace softblk::cli {

// Exit status of a daemon that found another one holding the lock.
constexpr int k_exit_already_running = 3;

struct daemon_options {
    // Also log to stderr (foreground use); the log file is always written.
    bool log_to_stderr = true;
    // See server_limits::request_timeout.
    std::chrono::milliseconds client_timeout{10'000};
};

// Answers the protocol's methods on the control thread.
class control_service {
public:
    // `stop` is called (with the reason) when a client asks for shutdown.
    control_service(device_host& host, run_paths paths, std::function<void(std::string)> stop);

    result<nlohmann::json> handle(const request& req);

private:
    result<nlohmann::json> add(const nlohmann::json& params);
    result<nlohmann::json> del(const nlohmann::json& params);

    device_host& _host;
    run_paths _paths;
    std::function<void(std::string)> _stop;
    std::chrono::steady_clock::time_point _started;
};

// Runs the daemon in this process until `shutdown`, SIGTERM or SIGINT:
// takes the lock, writes the pid file, cleans up stale exports, recovers
// the devices, serves the socket; on the way out stops every export and
// removes the socket and pid file (state files stay). Returns the exit
// status: 0, 1 on error, k_exit_already_running. Main thread, before any
// other thread exists.
int run_daemon(const run_paths& paths, const daemon_options& options);

}  // namespace softblk::cli
