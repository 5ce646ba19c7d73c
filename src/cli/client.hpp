// The client side of the control socket, used by the `softblk` command:
// connects (starting a daemon on demand), sends one request, waits for its
// reply.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>
#include <sys/types.h>

#include <nlohmann/json.hpp>

#include <softblk/types.hpp>

#include "run_dir.hpp"

namespace softblk::cli {

// The host library (src/host): the device table, run directory, memory
// budget and zone requests the command line and the daemon use.
using namespace softblk::host;

class control_client {
public:
    // Connects to the daemon of `paths`. When none answers and `autostart`
    // is set, starts one (start_daemon) first. Main thread.
    static result<control_client> connect(const run_paths& paths, bool autostart);

    control_client(control_client&& other) noexcept;
    control_client& operator=(control_client&&) = delete;
    ~control_client();

    // Sends {"method", "params"} and waits up to `timeout` for the reply.
    // Returns its "result", or its "error" as an error (code = -code).
    result<nlohmann::json> call(std::string_view method, const nlohmann::json& params,
                                std::chrono::milliseconds timeout = std::chrono::minutes(2));

private:
    control_client(int fd, run_paths paths) : _fd(fd), _paths(std::move(paths)) {}

    int _fd = -1;
    run_paths _paths;
    int64_t _next_id = 1;
    std::string _buffer;
};

// Connects to `socket_path` once; -errno on failure.
int connect_socket(const std::string& socket_path);

// Starts a daemon for `paths` in the background (this executable, `daemon
// --foreground --quiet`, in a new session, output to the log) and waits up
// to `timeout` until its socket accepts connections and the devices of its
// state files are back (recovered or failed; one still recovering then is
// noted on stderr). Returns the pid of the process it started (which may
// have found another daemon starting and left). Main thread.
// `extra_args` are passed on to `softblk daemon` (e.g. --client-timeout).
result<pid_t> start_daemon(const run_paths& paths, std::chrono::milliseconds timeout,
                           const std::vector<std::string>& extra_args = {});

// Waits until the daemon of `paths` has exited (its lock is free).
// Returns false on timeout.
bool wait_for_daemon_exit(const run_paths& paths, std::chrono::milliseconds timeout);

}  // namespace softblk::cli
