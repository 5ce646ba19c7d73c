// The NBD server: listeners (a unix socket and optionally TCP), io_uring
// event loop threads, and the exports (softblk devices, export name =
// device name) it serves. Several devices share one server; the server
// lives while it has exports.
//
// Threads: loop 0 accepts and runs the handshake of every connection; a
// connection that reaches transmission moves to the loop that owns a queue
// of its device (loop i drives queue i of each device, so a device serves
// from min(loops, submit_queues) loops). All device I/O of a queue runs on
// its loop thread: requests are submitted and completed there, replies go
// out in the order requests complete, batched in one sendmsg.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <sys/types.h>
#include <thread>
#include <vector>

#include <softblk/device.hpp>
#include <softblk/support/unix_socket.hpp>
#include <softblk/types.hpp>

#include "codec.hpp"

namespace softblk::nbd {

class tls_credentials;
class event_loop;

struct server_config {
    std::string socket_path;  // "" = no unix socket
    // The unix socket's permissions and group (-1: the daemon's). It is
    // created with these before it listens, whatever the umask.
    unsigned socket_mode = 0600;
    int64_t socket_group = -1;
    std::string tcp_host;   // "" = no TCP listener
    uint16_t tcp_port = 0;  // 0 = any free port (see server::tcp_port)
    // TCP without tls=require was asked for explicitly (insecure=1):
    // anyone who reaches the port may use the exports. start() refuses a
    // TCP listener without either.
    bool insecure = false;
    tls_mode tls = tls_mode::off;
    std::string tls_certs_dir;
    std::string tls_psk_file;
    // Require a client certificate signed by tls_certs_dir/ca-cert.pem
    // (X.509 sessions; a PSK session is authenticated by its key).
    bool tls_verify_peer = false;
    unsigned max_connections = 256;
    unsigned threads = 1;
    // A connection still in the handshake (or its TLS handshake) this long
    // after it was accepted is closed, so that a stalled client cannot hold
    // a connection slot. 0: never.
    uint32_t handshake_timeout_ms = 10'000;
    // A connection in transmission that neither received nor sent a byte
    // for this long is closed: idle clients and clients that do not read
    // their replies give their slot and buffers back. 0: never.
    uint32_t idle_timeout_ms = 300'000;
    // Buffers (write payloads being received or written, read data not yet
    // sent): a connection stops reading requests while its own hold
    // conn_buffer_bytes (it always takes one request when it holds none),
    // and every connection does while the server's together would pass
    // total_buffer_bytes. The socket then pushes back on the client.
    uint64_t conn_buffer_bytes = 64ull << 20;
    uint64_t total_buffer_bytes = 512ull << 20;
    // Export removal and stop() wait this long for connections to close and
    // loop threads to end (they are shut down first); then they fail.
    uint32_t stop_timeout_ms = 10'000;
    // Before a loop thread sleeps, it polls its completion ring for up to
    // this long (µs): auto, the window each loop measures to serve the most
    // requests per CPU time or per second (poll_per_cpu, level_chooser), or
    // a number; 0: never poll.
    std::string poll_us = "auto";
    // poll-goal: auto chooses by requests per CPU time (true) or by
    // requests per second alone (level_chooser::objective).
    bool poll_per_cpu = true;
    // Receive coalescing window (us) for connections that pipeline
    // requests: see "Receive coalescing" in docs/nbd.md. 0: off.
    uint32_t coalesce_us = 50;
    // Where a loop thread runs (support/colocation.hpp): "auto" measures
    // whether serving from its client's CPU pays (by poll_per_cpu's
    // objective), "0" never, "1" always.
    std::string colocate = "auto";
};

// An export as the server keeps it.
struct server_export : export_details {
    device* dev = nullptr;
    std::atomic<unsigned> connections{0};  // in transmission on this export
    std::atomic<bool> removed{false};
    // device::add_capacity_listener's handle: a resize changes the size new
    // connections are told.
    uint64_t capacity_listener = 0;
};

// Why a TCP listener needs tls=require or insecure=1 (the error's text).
extern const char* const k_tcp_policy;

class server final : public export_catalog, public std::enable_shared_from_this<server> {
public:
    ~server() override;

    // Binds the listeners and starts the loop threads. Control thread.
    static result<std::shared_ptr<server>> start(const server_config& config);

    // Serves `dev` under its name. Errors: the name is taken; the device is
    // zoned (NBD has no zone commands). Control thread.
    result<void> add_export(device& dev, bool read_only, std::string description);

    // Stops serving `name`: new handshakes no longer find it and its
    // connections are shut down (their in-flight device requests still
    // complete). Returns the export, to wait for with wait_closed. Control
    // thread.
    result<std::shared_ptr<server_export>> begin_remove_export(const std::string& name);

    // Waits until no connection of `exp` is left (the loops dropped the
    // device), at most config().stop_timeout_ms; an error naming how many
    // are left after that. May be called again. Control thread.
    result<void> wait_closed(const server_export& exp);

    size_t export_count() const;

    // Closes the listeners and every connection, joins the threads and
    // removes the unix socket if it is still the one start() created.
    // Waits at most config().stop_timeout_ms for the threads: an error
    // then, and the server (threads, loops, devices they hold) stays until
    // the process ends. Control thread; idempotent.
    result<void> stop();

    const server_config& config() const { return _config; }
    // The TCP port actually bound (when tcp_port was 0), or 0 without TCP.
    uint16_t tcp_port() const { return _bound_tcp_port; }

    // export_catalog, for handshakes (any loop thread).
    std::shared_ptr<const export_details> find(std::string_view name) const override;
    std::vector<std::shared_ptr<const export_details>> list() const override;

    // Used by the loops.
    std::atomic<unsigned>& connection_count() { return _connection_count; }
    // Bytes of buffers held by all connections (server_config::total_buffer_bytes).
    std::atomic<uint64_t>& buffered_total() { return _buffered_total; }
    const tls_credentials* tls() const { return _tls.get(); }
    event_loop& loop(unsigned i) { return *_loops[i]; }
    unsigned loop_count() const { return static_cast<unsigned>(_loops.size()); }
    // Each loop's poll window and why. Any thread.
    nlohmann::json poll_choices() const;
    // Each loop's placement and why (event_loop::colocate_choice).
    nlohmann::json colocate_choices() const;
    const std::vector<int>& listen_fds() const { return _listen_fds; }
    // A loop thread tells that a connection on `exp` was freed.
    void connection_closed(server_export& exp);

private:
    explicit server(const server_config& config);

    server_config _config;
    std::shared_ptr<tls_credentials> _tls;
    std::vector<int> _listen_fds;
    uint16_t _bound_tcp_port = 0;
    std::vector<std::unique_ptr<event_loop>> _loops;
    std::vector<std::thread> _threads;
    std::atomic<unsigned> _connection_count{0};
    std::atomic<uint64_t> _buffered_total{0};
    bool _stopped = false;
    // The unix socket start() bound (device and inode), so that stop()
    // removes it only while it is still that socket.
    unix_listener _socket;  // the unix socket start() bound (stop() removes only it)
    // Loop threads that ended (counted under _mutex, signalled by _closed).
    unsigned _threads_done = 0;

    mutable std::mutex _mutex;
    std::condition_variable _closed;
    std::map<std::string, std::shared_ptr<server_export>, std::less<>> _exports;
};

}  // namespace softblk::nbd
