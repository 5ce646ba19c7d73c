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
#include <thread>
#include <vector>

#include <softblk/device.hpp>
#include <softblk/types.hpp>

#include "codec.hpp"

namespace softblk::nbd {

class tls_credentials;
class event_loop;

struct server_config {
    std::string socket_path;  // "" = no unix socket
    std::string tcp_host;     // "" = no TCP listener
    uint16_t tcp_port = 0;    // 0 = any free port (see server::tcp_port)
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
    // Before a loop thread sleeps, it polls its completion ring for up to
    // this long (adaptively, as QEMU's poll-max-ns). 0: never poll.
    uint32_t poll_us = 0;
    // Receive coalescing window (us) for connections that pipeline
    // requests: see "Receive coalescing" in docs/nbd.md. 0: off.
    uint32_t coalesce_us = 50;
};

// An export as the server keeps it.
struct server_export : export_details {
    device* dev = nullptr;
    std::atomic<unsigned> connections{0};  // in transmission on this export
    std::atomic<bool> removed{false};
};

class server final : public export_catalog {
public:
    ~server() override;

    // Binds the listeners and starts the loop threads. Control thread.
    static result<std::shared_ptr<server>> start(const server_config& config);

    // Serves `dev` under its name. Errors: the name is taken; the device is
    // zoned (NBD has no zone commands). Control thread.
    result<void> add_export(device& dev, bool read_only, std::string description);

    // Stops serving `name`: new handshakes no longer find it, its
    // connections are closed after their in-flight requests complete, and
    // the call returns when none is left. Control thread.
    result<void> remove_export(const std::string& name);

    size_t export_count() const;

    // Closes the listeners and every connection, joins the threads and
    // removes the unix socket. Control thread; idempotent.
    void stop();

    const server_config& config() const { return _config; }
    // The TCP port actually bound (when tcp_port was 0), or 0 without TCP.
    uint16_t tcp_port() const { return _bound_tcp_port; }

    // export_catalog, for handshakes (any loop thread).
    std::shared_ptr<const export_details> find(std::string_view name) const override;
    std::vector<std::shared_ptr<const export_details>> list() const override;

    // Used by the loops.
    std::atomic<unsigned>& connection_count() { return _connection_count; }
    const tls_credentials* tls() const { return _tls.get(); }
    event_loop& loop(unsigned i) { return *_loops[i]; }
    unsigned loop_count() const { return static_cast<unsigned>(_loops.size()); }
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
    bool _stopped = false;

    mutable std::mutex _mutex;
    std::condition_variable _closed;
    std::map<std::string, std::shared_ptr<server_export>, std::less<>> _exports;
};

}  // namespace softblk::nbd
