// The daemon's metrics for Prometheus (docs/metrics.md), published two
// ways, each only when asked for: a textfile for node_exporter's textfile
// collector (`softblk daemon --metrics-textfile PATH.prom`), rewritten
// atomically every --metrics-interval seconds, and an HTTP listener
// (`--metrics-listen ADDR:PORT`, GET /metrics) served by prometheus-cpp's
// exposer (civetweb). Both take their metrics from a collector that the
// daemon gives: a client of its own control socket, so that they see what
// `softblk list` sees and never touch the device table from their threads.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <prometheus/metric_family.h>

#include <softblk/types.hpp>

#include "run_dir.hpp"

namespace prometheus {
class Exposer;
}

namespace softblk::cli {

struct metrics_options {
    std::string textfile;  // "": no textfile; else a path ending in .prom
    std::chrono::seconds interval{15};
    std::string listen;  // "": no listener; else IPV4:PORT or [IPV6]:PORT (port 0: any free one)
};

// Checks the options as far as can be done before the daemon starts: the
// listener's address and port, the textfile's name and directory. The
// error says what is wrong and what to give instead. Any thread.
result<void> check_metrics_options(const metrics_options& options);

// The metrics of the daemon of `paths`, asked through its control socket
// (`status` and `list`, what `softblk status` and `list --json` print) and
// made families by host::metric_families. Any thread; waits at most
// `timeout` for each answer.
result<std::vector<prometheus::MetricFamily>> collect_metrics(
    const host::run_paths& paths, std::chrono::milliseconds timeout = std::chrono::seconds(10));

// Hands the exposer's scrapes to the collector (metrics_publisher.cpp).
class metrics_collectable;

class metrics_publisher {
public:
    using collector = std::function<result<std::vector<prometheus::MetricFamily>>()>;

    // Checks the options, binds the listener and writes the textfile once
    // (empty: no device is known yet), so that a port in use or a path that
    // cannot be written fails the daemon's start. Collects nothing yet.
    static result<std::unique_ptr<metrics_publisher>> start(const metrics_options& options,
                                                            collector collect);
    // Stops the listener (waiting for the scrapes in progress) and the
    // textfile's thread, and removes the textfile: the metrics of a daemon
    // that is gone would look alive.
    ~metrics_publisher();
    metrics_publisher(const metrics_publisher&) = delete;
    metrics_publisher& operator=(const metrics_publisher&) = delete;

    // Starts rewriting the textfile now and every interval (once the
    // collector can answer).
    void begin();

    // Where the listener listens ("127.0.0.1:39053", the port chosen when 0
    // was given); "" without one.
    const std::string& listening() const { return _listening; }
    const metrics_options& options() const { return _options; }

private:
    metrics_publisher(metrics_options options, collector collect);
    void textfile_loop();
    // Collects and writes the textfile; logs an error once until it passes.
    void write_textfile();

    metrics_options _options;
    collector _collect;
    std::string _listening;
    std::shared_ptr<metrics_collectable> _collectable;
    std::unique_ptr<prometheus::Exposer> _exposer;
    std::thread _thread;
    std::mutex _mutex;
    std::condition_variable _wake;
    bool _stop = false;
    std::string _last_error;
};

}  // namespace softblk::cli
