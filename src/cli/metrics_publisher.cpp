// The daemon's metrics publishers (metrics_publisher.hpp).
#include "metrics_publisher.hpp"

#include <arpa/inet.h>
#include <cerrno>
#include <cstring>
#include <future>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/format.h>
#include <prometheus/collectable.h>
#include <prometheus/exposer.h>
#include <spdlog/spdlog.h>

#include <softblk/support/trusted_dir.hpp>

#include "client.hpp"
#include "metrics.hpp"

namespace softblk::cli {

class metrics_collectable : public prometheus::Collectable {
public:
    explicit metrics_collectable(metrics_publisher::collector collect)
        : _collect(std::move(collect))
    {
    }
    // On the exposer's threads, one scrape each.
    std::vector<prometheus::MetricFamily> Collect() const override
    {
        // On a thread of our own: civetweb's workers run on small stacks
        // (its pthread_attr_setstacksize), which the JSON of the answers
        // overflowed under AddressSanitizer.
        auto families = std::async(std::launch::async, _collect).get();
        if (!families) {
            // An empty answer rather than a partial one: Prometheus marks
            // the scrape's series stale instead of believing half of them.
            spdlog::warn("metrics scrape: {}", families.error().message);
            return {};
        }
        return std::move(*families);
    }

private:
    metrics_publisher::collector _collect;
};

namespace {

// An address the listener takes: IPV4:PORT or [IPV6]:PORT, numeric (no
// name to resolve: the daemon binds exactly what it was given).
struct listen_address {
    sockaddr_storage addr{};
    socklen_t length = 0;
};

result<listen_address> parse_listen(const std::string& text)
{
    auto bad = [&](std::string_view why) {
        return make_error(EINVAL, fmt::format("--metrics-listen {}: {}; give IPV4:PORT or "
                                              "[IPV6]:PORT, e.g. 127.0.0.1:9560 (port 0: any "
                                              "free one)",
                                              text, why));
    };
    const size_t colon = text.rfind(':');
    if (colon == std::string::npos || colon == 0) {
        return bad("no address and port");
    }
    std::string host = text.substr(0, colon);
    const std::string port_text = text.substr(colon + 1);
    unsigned port = 0;
    if (port_text.empty() || port_text.size() > 5 ||
        port_text.find_first_not_of("0123456789") != std::string::npos ||
        (port = static_cast<unsigned>(std::stoul(port_text))) > 65535) {
        return bad("the port is not a number from 0 to 65535");
    }
    listen_address out;
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
        host = host.substr(1, host.size() - 2);
        auto* in6 = reinterpret_cast<sockaddr_in6*>(&out.addr);
        if (::inet_pton(AF_INET6, host.c_str(), &in6->sin6_addr) != 1) {
            return bad("not an IPv6 address between the brackets");
        }
        in6->sin6_family = AF_INET6;
        in6->sin6_port = htons(static_cast<uint16_t>(port));
        out.length = sizeof(sockaddr_in6);
        return out;
    }
    auto* in4 = reinterpret_cast<sockaddr_in*>(&out.addr);
    if (::inet_pton(AF_INET, host.c_str(), &in4->sin_addr) != 1) {
        return bad("not an IPv4 address (an IPv6 one goes in brackets)");
    }
    in4->sin_family = AF_INET;
    in4->sin_port = htons(static_cast<uint16_t>(port));
    out.length = sizeof(sockaddr_in);
    return out;
}

// Binds a socket to `address` as the listener will (SO_REUSEADDR, as
// civetweb does), and closes it: civetweb's own failure says only that it
// could not start, this says why.
result<void> try_bind(const std::string& text, const listen_address& address)
{
    const int fd = ::socket(address.addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return make_error(
            errno, fmt::format("--metrics-listen {}: socket: {}", text, std::strerror(errno)));
    }
    const int one = 1;
    (void)::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    const int rc = ::bind(fd, reinterpret_cast<const sockaddr*>(&address.addr), address.length);
    const int e = errno;
    ::close(fd);
    if (rc == 0) {
        return {};
    }
    std::string hint;
    if (e == EADDRINUSE) {
        hint = "the port is in use: give another one (0: any free one)";
    } else if (e == EADDRNOTAVAIL) {
        hint = "the address is not one of this machine's";
    } else if (e == EACCES) {
        hint = "ports below 1024 need root or CAP_NET_BIND_SERVICE";
    }
    return make_error(e, fmt::format("--metrics-listen {}: cannot listen: {}{}{}", text,
                                     std::strerror(e), hint.empty() ? "" : "; ", hint));
}

result<void> check_textfile(const metrics_options& options)
{
    const std::string& path = options.textfile;
    if (!path.ends_with(".prom") || path.ends_with("/.prom")) {
        // node_exporter's textfile collector reads *.prom files only.
        return make_error(EINVAL, fmt::format("--metrics-textfile {}: the name must end in .prom "
                                              "(node_exporter's textfile collector reads only "
                                              "those), e.g. /var/lib/prometheus/node-exporter/"
                                              "softblk.prom",
                                              path));
    }
    const size_t slash = path.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
    if (::access(dir.c_str(), W_OK | X_OK) != 0) {
        const int e = errno;
        return make_error(e, fmt::format("--metrics-textfile {}: cannot write in {}: {}", path, dir,
                                         std::strerror(e)));
    }
    return {};
}

}  // namespace

result<std::vector<prometheus::MetricFamily>> collect_metrics(const host::run_paths& paths,
                                                              std::chrono::milliseconds timeout)
{
    auto client = control_client::connect(paths, false);
    if (!client) {
        return std::unexpected(client.error());
    }
    auto status = client->call("status", nlohmann::json::object(), timeout);
    if (!status) {
        return std::unexpected(status.error());
    }
    auto devices = client->call("list", nlohmann::json::object(), timeout);
    if (!devices) {
        return std::unexpected(devices.error());
    }
    return host::metric_families(*devices, *status);
}

result<void> check_metrics_options(const metrics_options& options)
{
    if (options.interval.count() < 1 || options.interval.count() > 86'400) {
        return make_error(EINVAL, fmt::format("--metrics-interval {}: give 1 to 86400 seconds",
                                              options.interval.count()));
    }
    if (!options.listen.empty()) {
        auto address = parse_listen(options.listen);
        if (!address) {
            return std::unexpected(address.error());
        }
        if (auto bound = try_bind(options.listen, *address); !bound) {
            return bound;
        }
    }
    if (!options.textfile.empty()) {
        if (auto checked = check_textfile(options); !checked) {
            return checked;
        }
    }
    return {};
}

metrics_publisher::metrics_publisher(metrics_options options, collector collect)
    : _options(std::move(options)),
      _collect(std::move(collect)),
      _collectable(std::make_shared<metrics_collectable>(_collect))
{
}

result<std::unique_ptr<metrics_publisher>> metrics_publisher::start(const metrics_options& options,
                                                                    collector collect)
{
    if (auto checked = check_metrics_options(options); !checked) {
        return std::unexpected(checked.error());
    }
    std::unique_ptr<metrics_publisher> pub(new metrics_publisher(options, std::move(collect)));
    if (!options.textfile.empty()) {
        // The first write proves the file can be written (a read-only file
        // system, a directory in its place) while the start can still fail.
        if (auto written = write_file_atomically(options.textfile, "", 0644, false); !written) {
            return make_error(written.error().code.value(),
                              fmt::format("--metrics-textfile: {}", written.error().message));
        }
    }
    if (!options.listen.empty()) {
        try {
            pub->_exposer = std::make_unique<prometheus::Exposer>(options.listen, 2);
        } catch (const std::exception& e) {
            // Checked a moment ago (check_metrics_options): someone took the
            // port since.
            return make_error(EADDRINUSE, fmt::format("--metrics-listen {}: cannot listen ({})",
                                                      options.listen, e.what()));
        }
        pub->_exposer->RegisterCollectable(pub->_collectable);
        const std::vector<int> ports = pub->_exposer->GetListeningPorts();
        const size_t colon = options.listen.rfind(':');
        pub->_listening = fmt::format("{}:{}", options.listen.substr(0, colon),
                                      ports.empty() ? 0 : ports.front());
    }
    return pub;
}

metrics_publisher::~metrics_publisher()
{
    {
        std::lock_guard guard(_mutex);
        _stop = true;
    }
    _wake.notify_all();
    if (_thread.joinable()) {
        _thread.join();
    }
    _exposer.reset();
    if (!_options.textfile.empty()) {
        ::unlink(_options.textfile.c_str());
    }
}

void metrics_publisher::begin()
{
    if (!_options.textfile.empty() && !_thread.joinable()) {
        _thread = std::thread([this] { textfile_loop(); });
    }
}

void metrics_publisher::textfile_loop()
{
    std::unique_lock lock(_mutex);
    while (!_stop) {
        lock.unlock();
        write_textfile();
        lock.lock();
        _wake.wait_for(lock, _options.interval, [this] { return _stop; });
    }
}

void metrics_publisher::write_textfile()
{
    auto families = _collect();
    result<void> written;
    if (!families) {
        written = std::unexpected(families.error());
    } else {
        // Renamed over the old file: the collector reads the old text or
        // the new one, never part of one.
        written =
            write_file_atomically(_options.textfile, host::metrics_text(*families), 0644, false);
    }
    if (!written) {
        if (written.error().message != _last_error) {
            spdlog::error("metrics textfile {}: {}", _options.textfile, written.error().message);
            _last_error = written.error().message;
        }
        return;
    }
    if (!_last_error.empty()) {
        spdlog::info("metrics textfile {} written again", _options.textfile);
        _last_error.clear();
    }
}

}  // namespace softblk::cli
