// The daemon's counters as Prometheus metrics (docs/metrics.md): one place
// turns what `list` and `status` answer into metric families, for `softblk
// metrics` and for the daemon's publishers (the textfile for
// node_exporter, the HTTP listener), so that they all say the same.
//
// The families and their text come from prometheus-cpp (Debian's
// prometheus-cpp-dev), whose serializer writes the text exposition format
// 0.0.4 and escapes label values; the help texts are ours and hold no
// backslash or newline, which its serializer (1.0.1) would not escape.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <prometheus/metric_family.h>

namespace softblk::host {

// The metric families of the devices in `devices` (the `list` answer: an
// array of device descriptions) and of the daemon in `status` (the `status`
// answer; null: none), each family once with its samples in the order of
// the devices. Devices: labels device and target (the target type); their
// exports: labels device and export (the export type), with each front
// end's own counters (export_type::metrics). Any thread.
std::vector<prometheus::MetricFamily> metric_families(const nlohmann::json& devices,
                                                      const nlohmann::json& status);

// `families` in the text exposition format (version 0.0.4). Any thread.
std::string metrics_text(const std::vector<prometheus::MetricFamily>& families);

}  // namespace softblk::host
