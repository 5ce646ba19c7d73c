// The daemon's control socket: a single-threaded poll loop that accepts
// clients on a unix socket, reads one JSON request per line, hands each to
// a handler on the loop's thread (the daemon's control thread) and writes
// the reply. No client can stop or stall the loop: sockets are
// non-blocking, requests and reply backlogs are bounded, clients that are
// slow to send or to read are cut off after a timeout, and peers whose uid
// is neither root nor the daemon's are refused (SO_PEERCRED). A handler
// that has to wait for something (a device's teardown) defers its reply
// instead of waiting: the loop serves the other clients meanwhile.
#pragma once

#include <softblk/support/unix_socket.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <softblk/types.hpp>

#include "protocol.hpp"

namespace softblk::cli {

struct server_limits {
    size_t max_request_bytes = k_max_request_bytes;
    size_t max_clients = 64;
    // A request whose first byte arrived must be complete (newline) within
    // this time, and a pending reply must make progress within it.
    std::chrono::milliseconds request_timeout{10'000};
    // A connection with nothing pending is closed after this time.
    std::chrono::milliseconds idle_timeout{300'000};
    // Replies queued for a client that does not read; past it, it is cut off.
    size_t max_reply_backlog = 64u << 20;
    // One reply's longest line; a longer result becomes an EMSGSIZE error.
    size_t max_reply_bytes = k_max_reply_bytes;
};

// Names a request whose reply comes later (control_server::reply).
struct reply_token {
    uint64_t client = 0;
    nlohmann::json id;
    std::string method;  // for the messages of a reply that cannot be sent
};

// Handles one request on the loop's thread; returns the reply's result or
// an error, or std::nullopt after keeping `token` to reply later (the
// client's next requests wait until then). May call request_stop.
using request_handler =
    std::function<std::optional<result<nlohmann::json>>(const request&, const reply_token& token)>;

// What else the loop waits for: descriptors (a signalfd, an eventfd) whose
// readiness it reports, and a tick after every pass (at least every 200 ms).
struct loop_hooks {
    std::vector<int> fds;
    std::function<void(int fd)> on_ready;  // `fd` (one of fds) is readable
    std::function<void()> on_tick;
};

class control_server {
public:
    // Binds `socket_path` (removing a stale socket file first: the caller
    // holds the daemon lock), mode 0600, and listens. Control thread.
    static result<std::unique_ptr<control_server>> listen(std::string socket_path,
                                                          server_limits limits);
    ~control_server();

    control_server(const control_server&) = delete;
    control_server& operator=(const control_server&) = delete;

    // Serves clients until request_stop is called (then flushes pending
    // replies for up to a second). Returns the reason it stopped. Control
    // thread.
    std::string run(const request_handler& handler, const loop_hooks& hooks);

    // Gives a deferred request its reply; dropped when its client is gone.
    // The client's next requests are handled at the loop's next pass.
    // Control thread.
    void reply(const reply_token& token, const result<nlohmann::json>& result);

    // Ends run() after the current request's reply is written.
    void request_stop(std::string reason) { _stop_reason = std::move(reason); }

    // Removes the socket file and closes the listening socket (idempotent).
    void close();

private:
    struct client;
    control_server(std::string socket_path, unix_listener listener, server_limits limits);

    void accept_clients();
    void read_client(client& c, const request_handler& handler);
    void process_lines(client& c, const request_handler& handler);
    void write_client(client& c);
    void check_timeouts(client& c, std::chrono::steady_clock::time_point now);

    std::string _socket_path;
    unix_listener _listener;  // the socket file's identity, for close()
    int _listen_fd = -1;
    server_limits _limits;
    std::vector<std::unique_ptr<client>> _clients;
    uint64_t _next_client = 1;
    std::string _stop_reason;
};

}  // namespace softblk::cli
