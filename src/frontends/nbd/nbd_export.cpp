#include "nbd_export.hpp"

#include <cerrno>
#include <charconv>
#include <cstring>
#include <map>
#include <mutex>
#include <sys/stat.h>
#include <thread>
#include <vector>
#include <unistd.h>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <softblk/options.hpp>
#include <softblk/support/colocation.hpp>
#include <softblk/support/level_chooser.hpp>

#include "server.hpp"

namespace softblk::nbd {

namespace {

// socket=: an absolute path, or none.
result<void> check_socket_option(std::string_view text)
{
    return text == "none" ? result<void>{} : check_absolute_path(text);
}

constexpr option_def k_options[] = {
    {.name = "socket",
     .kind = option_kind::text,
     .default_value = "",
     .unit = "absolute path",
     .help = "unix socket to listen on (default: RUN_DIR/nbd.sock, shared by every device exported "
             "there); "
             "none: TCP only",
     .check = check_socket_option},
    k_socket_mode_option,
    k_socket_group_option,
    {.name = "tcp",
     .kind = option_kind::text,
     .default_value = "",
     .unit = "",
     .help = "also listen on TCP: PORT (on 127.0.0.1) or HOST:PORT ([::1]:PORT); port 0 picks a "
             "free one"},
    {.name = "insecure",
     .kind = option_kind::boolean,
     .default_value = "0",
     .unit = "",
     .help = "allow tcp= without tls=require: anyone who reaches the port reads and writes the "
             "device; `softblk list` shows the export as insecure"},
    {.name = "tls",
     .kind = option_kind::text,
     .default_value = "off",
     .unit = "",
     .help = "off: no TLS; on: clients may upgrade with STARTTLS; require: clients must (GnuTLS)"},
    {.name = "tls-certs",
     .kind = option_kind::text,
     .default_value = "",
     .unit = "absolute path",
     .help = "directory with server-cert.pem and server-key.pem (X.509)",
     .check = check_absolute_path},
    {.name = "tls-psk",
     .kind = option_kind::text,
     .default_value = "",
     .unit = "absolute path",
     .help = "pre-shared keys file, lines identity:hexkey (psktool's format)",
     .check = check_absolute_path},
    {.name = "tls-verify-peer",
     .kind = option_kind::boolean,
     .default_value = "0",
     .unit = "",
     .help = "TLS clients must present a certificate signed by TLS-CERTS/ca-cert.pem and not "
             "revoked in "
             "TLS-CERTS/ca-crl.pem (when present), or be disconnected; PSK clients are not asked "
             "(the key "
             "authenticates them)"},
    {.name = "readonly",
     .kind = option_kind::boolean,
     .default_value = "0",
     .unit = "",
     .help = "export read-only: writes, trims and write zeroes fail with EPERM"},
    {.name = "max-connections",
     .kind = option_kind::integer,
     .default_value = "256",
     .unit = "",
     .help = "connections the server accepts at once (all exports of the socket); more are closed "
             "at once",
     .min = 1,
     .max = 65536},
    {.name = "threads",
     .kind = option_kind::integer,
     .default_value = "0",
     .unit = "",
     .help =
         "io_uring loop threads of the server; 0: one per device submit queue, at most one per CPU",
     .min = 0,
     .max = 256},
    {.name = "handshake-timeout",
     .kind = option_kind::integer,
     .default_value = "10",
     .unit = "s",
     .help =
         "a client still in the handshake this long after connecting is disconnected (frees its "
         "connection slot); 0: never",
     .min = 0,
     .max = 86400},
    {.name = "idle-timeout",
     .kind = option_kind::integer,
     .default_value = "300",
     .unit = "s",
     .help = "a connection that neither sends nor reads a byte for this long is closed (idle "
             "clients, clients that do not read their replies); 0: never (kernel nbd clients "
             "that sit idle)",
     .min = 0,
     .max = 604800},
    {.name = "buffer-per-connection",
     .kind = option_kind::integer,
     .default_value = "64",
     .unit = "MiB",
     .help = "a connection stops reading requests while its buffers (write payloads, read data "
             "not yet sent) hold this much",
     .min = 1,
     .max = 4096},
    {.name = "buffer-total",
     .kind = option_kind::integer,
     .default_value = "512",
     .unit = "MiB",
     .help = "every connection of the server stops reading requests while their buffers "
             "together would pass this",
     .min = 32,
     .max = 1048576},
    {.name = "poll-us",
     .kind = option_kind::text,
     .default_value = "auto",
     .unit = "us",
     .help = "before a loop thread sleeps it polls for the next request for up to this long: "
             "lower latency, more CPU. auto: the window (0 to 512 us) that serves the loop the "
             "most requests per CPU time (see poll-goal) on this machine, measured over 10 ms "
             "epochs and again now and then (`softblk list --json` shows why); 0: never poll",
     .check = check_poll_window},
    {.name = "poll-goal",
     .kind = option_kind::text,
     .default_value = "cpu",
     .unit = "",
     .help = "what poll-us=auto and colocate=auto maximise: cpu, requests per second divided "
             "by the loop's CPU time per request (a longer window must buy as much rate as it "
             "costs CPU); rate, requests per second alone (spends CPU for any gain)",
     .check = [](std::string_view v) -> result<void> {
         if (v == "cpu" || v == "rate") {
             return {};
         }
         return make_error(EINVAL, "cpu or rate");
     }},
    {.name = "colocate",
     .kind = option_kind::text,
     .default_value = "auto",
     .unit = "",
     .help = "where a loop thread runs: 1, on its client's CPU (pinned there, under SCHED_IDLE "
             "while it replies, so that the woken client stays; saves a wake-up across CPUs per "
             "request where the client waits for each reply, and cache lines crossing CPUs "
             "where it pipelines); 0, anywhere; auto: whichever serves more requests per CPU "
             "time (see poll-goal), measured over 200 ms epochs and again now and then "
             "(`softblk list --json` shows why)",
     .check = check_colocation},
    {.name = "coalesce-us",
     .kind = option_kind::integer,
     .default_value = "50",
     .unit = "us",
     .help =
         "a connection that pipelines requests may have its next receive held back this long so "
         "that "
         "one wake-up takes several requests; each connection measures its request rate with and "
         "without and keeps the better (docs/nbd.md); 0: never",
     .min = 0,
     .max = 1000},
    {.name = "description",
     .kind = option_kind::text,
     .default_value = "",
     .unit = "",
     .help = "what NBD_INFO_DESCRIPTION and NBD_OPT_LIST tell clients"},
};

struct registry {
    std::mutex mutex;
    std::map<std::string, std::shared_ptr<server>> servers;  // by socket path or tcp address
};

registry& servers()
{
    static registry r;
    return r;
}

result<tls_mode> parse_tls(const std::string& v)
{
    if (v == "off") {
        return tls_mode::off;
    }
    if (v == "on") {
        return tls_mode::on;
    }
    if (v == "require") {
        return tls_mode::require;
    }
    return make_error(EINVAL, fmt::format("tls={}: must be off, on or require", v));
}

const char* to_string(tls_mode m)
{
    switch (m) {
    case tls_mode::off:
        return "off";
    case tls_mode::on:
        return "on";
    case tls_mode::require:
        return "require";
    }
    return "?";
}

result<void> parse_tcp(const std::string& v, std::string& host, uint16_t& port)
{
    std::string port_text = v;
    host = "127.0.0.1";
    if (!v.empty() && v.front() == '[') {
        const size_t close = v.find(']');
        if (close == std::string::npos || close + 1 >= v.size() || v[close + 1] != ':') {
            return make_error(EINVAL, fmt::format("tcp={}: expected [IPV6]:PORT", v));
        }
        host = v.substr(1, close - 1);
        port_text = v.substr(close + 2);
    } else if (const size_t colon = v.rfind(':'); colon != std::string::npos) {
        host = v.substr(0, colon);
        port_text = v.substr(colon + 1);
    }
    unsigned value = 0;
    const auto [end, ec] =
        std::from_chars(port_text.data(), port_text.data() + port_text.size(), value);
    if (ec != std::errc() || end != port_text.data() + port_text.size() || value > 65535 ||
        host.empty()) {
        return make_error(EINVAL,
                          fmt::format("tcp={}: expected PORT or HOST:PORT with PORT 0..65535", v));
    }
    port = static_cast<uint16_t>(value);
    return {};
}

std::string uri_host(const std::string& host)
{
    if (host.find(':') != std::string::npos) {
        return "[" + host + "]";
    }
    if (host == "0.0.0.0") {
        return "127.0.0.1";
    }
    if (host == "::") {
        return "[::1]";
    }
    return host;
}

class nbd_device_export final : public device_export {
public:
    nbd_device_export(std::shared_ptr<server> srv, std::string key, std::string name,
                      bool read_only)
        : _srv(std::move(srv)), _key(std::move(key)), _name(std::move(name)), _read_only(read_only)
    {
    }
    ~nbd_device_export() override { (void)stop(); }

    nlohmann::json describe() const override
    {
        nlohmann::json j;
        const server_config& cfg = _srv->config();
        const bool tls_only = cfg.tls == tls_mode::require;
        if (!cfg.socket_path.empty()) {
            j["uri"] = fmt::format("{}:///{}?socket={}", tls_only ? "nbds+unix" : "nbd+unix", _name,
                                   cfg.socket_path);
            j["socket"] = cfg.socket_path;
        }
        if (!cfg.tcp_host.empty()) {
            const std::string tcp = fmt::format("{}://{}:{}/{}", tls_only ? "nbds" : "nbd",
                                                uri_host(cfg.tcp_host), _srv->tcp_port(), _name);
            j[cfg.socket_path.empty() ? "uri" : "tcp_uri"] = tcp;
            j["tcp_port"] = _srv->tcp_port();
        }
        j["export"] = _name;
        j["tls"] = to_string(cfg.tls);
        if (cfg.tls != tls_mode::off) {
            j["tls_verify_peer"] = cfg.tls_verify_peer;
        }
        j["read_only"] = _read_only;
        if (!cfg.tcp_host.empty() && cfg.tls != tls_mode::require) {
            // insecure=1: say so wherever the export is shown.
            j["insecure"] = true;
            j["warning"] = fmt::format(
                "insecure: TCP {}:{} without TLS (insecure=1), anyone who "
                "reaches it reads and writes the device",
                cfg.tcp_host, _srv->tcp_port());
        }
        j["idle_timeout_s"] = cfg.idle_timeout_ms / 1000;
        // The server's loops' poll windows and what chose them.
        j["poll"] = _srv->poll_choices();
        // Where they run (next to the client or anywhere) and why.
        j["colocate"] = _srv->colocate_choices();
        return j;
    }

    result<void> stop() override
    {
        if (!_srv) {
            return {};
        }
        registry& r = servers();
        std::lock_guard lock(r.mutex);
        if (!_removing) {
            auto removing = _srv->begin_remove_export(_name);
            if (!removing) {
                return std::unexpected(removing.error());
            }
            _removing = *removing;
        }
        // Bounded (stop_timeout_ms): on failure the export stays removing
        // and the device in use; a later stop() waits again.
        if (auto rc = _srv->wait_closed(*_removing); !rc) {
            return rc;
        }
        _removing.reset();
        result<void> rc;
        if (_srv->export_count() == 0) {
            rc = _srv->stop();
            r.servers.erase(_key);
        }
        _srv.reset();
        return rc;
    }

private:
    std::shared_ptr<server> _srv;
    std::shared_ptr<server_export> _removing;  // removed, connections closing
    std::string _key;
    std::string _name;
    bool _read_only;
};

}  // namespace

std::span<const option_def> export_options()
{
    return k_options;
}

result<std::unique_ptr<device_export>> start_export(device& dev, const export_context& ctx,
                                                    std::span<const std::string> options)
{
    auto parsed = option_set::parse(k_options, options);
    if (!parsed) {
        return std::unexpected(parsed.error());
    }
    const option_set& o = *parsed;
    server_config cfg;
    auto tls = parse_tls(o.text("tls"));
    if (!tls) {
        return std::unexpected(tls.error());
    }
    cfg.tls = *tls;
    cfg.tls_certs_dir = o.text("tls-certs");
    cfg.tls_psk_file = o.text("tls-psk");
    cfg.tls_verify_peer = o.flag("tls-verify-peer");
    if (cfg.tls == tls_mode::off && (!cfg.tls_certs_dir.empty() || !cfg.tls_psk_file.empty())) {
        return make_error(EINVAL,
                          "tls-certs/tls-psk given with tls=off: say tls=on or tls=require");
    }
    if (cfg.tls_verify_peer && cfg.tls == tls_mode::off) {
        return make_error(EINVAL,
                          "tls-verify-peer=1 given with tls=off: say tls=require (or tls=on) and "
                          "tls-certs=DIR with ca-cert.pem");
    }
    if (cfg.tls_verify_peer && cfg.tls_certs_dir.empty()) {
        return make_error(
            EINVAL,
            "tls-verify-peer=1 needs tls-certs=DIR with server-cert.pem, server-key.pem "
            "and ca-cert.pem (the CA that signs client certificates)");
    }
    const std::string socket = o.text("socket");
    if (socket == "none") {
        cfg.socket_path.clear();
    } else if (socket.empty()) {
        cfg.socket_path = ctx.run_dir + "/nbd.sock";
    } else {
        cfg.socket_path = socket;
    }
    if (!o.text("tcp").empty()) {
        if (auto rc = parse_tcp(o.text("tcp"), cfg.tcp_host, cfg.tcp_port); !rc) {
            return std::unexpected(rc.error());
        }
    }
    if (cfg.socket_path.empty() && cfg.tcp_host.empty()) {
        return make_error(EINVAL, "socket=none needs tcp=PORT");
    }
    cfg.insecure = o.flag("insecure");
    if (!cfg.tcp_host.empty() && cfg.tls != tls_mode::require && !cfg.insecure) {
        return make_error(
            EPERM,
            fmt::format("tcp={}{}: {}", o.text("tcp"),
                        cfg.tls == tls_mode::on ? " with tls=on (optional)" : "", k_tcp_policy));
    }
    if (cfg.insecure && cfg.tcp_host.empty()) {
        return make_error(EINVAL, "insecure=1 without tcp=: only a TCP listener can be insecure");
    }
    auto mode = parse_socket_mode(o.text("mode"));
    if (!mode) {
        return std::unexpected(mode.error());
    }
    cfg.socket_mode = *mode;
    auto group = parse_socket_group(o.text("group"));
    if (!group) {
        return std::unexpected(group.error());
    }
    cfg.socket_group = *group;
    if (cfg.socket_path.empty() && (o.given("mode") || o.given("group"))) {
        return make_error(EINVAL,
                          "mode=/group= apply to the unix socket, and socket=none has none");
    }
    cfg.idle_timeout_ms = static_cast<uint32_t>(o.u64("idle-timeout") * 1000);
    cfg.conn_buffer_bytes = o.u64("buffer-per-connection") << 20;
    cfg.total_buffer_bytes = o.u64("buffer-total") << 20;
    cfg.max_connections = static_cast<unsigned>(o.u64("max-connections"));
    cfg.threads = static_cast<unsigned>(o.u64("threads"));
    cfg.handshake_timeout_ms = static_cast<uint32_t>(o.u64("handshake-timeout") * 1000);
    cfg.poll_us = o.text("poll-us");
    cfg.poll_per_cpu = o.text("poll-goal") == "cpu";
    cfg.coalesce_us = static_cast<uint32_t>(o.u64("coalesce-us"));
    cfg.colocate = o.text("colocate");
    if (cfg.threads == 0) {
        cfg.threads = std::max(
            1u, std::min(dev.info().queues.submit_queues, std::thread::hardware_concurrency()));
    }
    const bool read_only = o.flag("readonly");

    const std::string key = !cfg.socket_path.empty()
                                ? cfg.socket_path
                                : fmt::format("tcp:{}:{}", cfg.tcp_host, cfg.tcp_port);
    registry& r = servers();
    std::lock_guard lock(r.mutex);
    std::shared_ptr<server> srv;
    if (auto it = r.servers.find(key); it != r.servers.end()) {
        srv = it->second;
        const server_config& run = srv->config();
        const bool same =
            run.tls == cfg.tls && run.tls_certs_dir == cfg.tls_certs_dir &&
            run.tls_psk_file == cfg.tls_psk_file && run.tls_verify_peer == cfg.tls_verify_peer &&
            (!o.given("tcp") || (run.tcp_host == cfg.tcp_host && run.tcp_port == cfg.tcp_port)) &&
            (!o.given("max-connections") || run.max_connections == cfg.max_connections) &&
            (!o.given("threads") || run.threads == cfg.threads) &&
            (!o.given("handshake-timeout") ||
             run.handshake_timeout_ms == cfg.handshake_timeout_ms) &&
            (!o.given("poll-us") || run.poll_us == cfg.poll_us) &&
            (!o.given("poll-goal") || run.poll_per_cpu == cfg.poll_per_cpu) &&
            (!o.given("coalesce-us") || run.coalesce_us == cfg.coalesce_us) &&
            (!o.given("colocate") || run.colocate == cfg.colocate) &&
            run.insecure == cfg.insecure &&
            (!o.given("mode") || run.socket_mode == cfg.socket_mode) &&
            (!o.given("group") || run.socket_group == cfg.socket_group) &&
            (!o.given("idle-timeout") || run.idle_timeout_ms == cfg.idle_timeout_ms) &&
            (!o.given("buffer-per-connection") || run.conn_buffer_bytes == cfg.conn_buffer_bytes) &&
            (!o.given("buffer-total") || run.total_buffer_bytes == cfg.total_buffer_bytes);
        if (!same) {
            return make_error(
                EBUSY,
                fmt::format(
                    "nbd: a server on {} already runs with tls={} tls-verify-peer={} tcp={} "
                    "max-connections={} threads={} handshake-timeout={} poll-us={} poll-goal={} "
                    "coalesce-us={} colocate={} "
                    "insecure={} mode={:04o} group={} idle-timeout={} buffer-per-connection={} "
                    "buffer-total={}; export there with the same settings, or choose another "
                    "socket=",
                    key, to_string(run.tls), run.tls_verify_peer ? 1 : 0,
                    run.tcp_host.empty() ? std::string("off")
                                         : fmt::format("{}:{}", run.tcp_host, srv->tcp_port()),
                    run.max_connections, run.threads, run.handshake_timeout_ms / 1000, run.poll_us,
                    run.poll_per_cpu ? "cpu" : "rate", run.coalesce_us, run.colocate,
                    run.insecure ? 1 : 0, run.socket_mode,
                    run.socket_group < 0 ? std::string("default")
                                         : std::to_string(run.socket_group),
                    run.idle_timeout_ms / 1000, run.conn_buffer_bytes >> 20,
                    run.total_buffer_bytes >> 20));
        }
    } else {
        if (!cfg.socket_path.empty()) {
            const size_t slash = cfg.socket_path.rfind('/');
            if (slash != std::string::npos && slash > 0) {
                ::mkdir(cfg.socket_path.substr(0, slash).c_str(), 0755);
            }
        }
        auto started = server::start(cfg);
        if (!started) {
            return std::unexpected(started.error());
        }
        srv = *started;
        r.servers.emplace(key, srv);
    }
    if (!cfg.tcp_host.empty() && cfg.tls != tls_mode::require) {
        fmt::print(stderr, "nbd: {}: serving TCP {}:{} without TLS (insecure=1)\n", dev.name(),
                   srv->config().tcp_host, srv->tcp_port());
    }
    if (auto rc = srv->add_export(dev, read_only, o.text("description")); !rc) {
        if (srv->export_count() == 0) {
            (void)srv->stop();
            r.servers.erase(key);
        }
        return std::unexpected(rc.error());
    }
    return std::make_unique<nbd_device_export>(srv, key, dev.name(),
                                               read_only || dev.limits().read_only);
}

void cleanup_stale(const export_context& ctx)
{
    const std::string path = ctx.run_dir + "/nbd.sock";
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) {
        return;
    }
    {
        std::lock_guard lock(servers().mutex);
        if (servers().servers.count(path) != 0) {
            return;  // ours, alive
        }
    }
    (void)claim_socket_path(path);  // removes it only when stale and ours
}

}  // namespace softblk::nbd
