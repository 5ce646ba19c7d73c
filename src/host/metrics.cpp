// The daemon's counters as Prometheus metric families (metrics.hpp).
#include "metrics.hpp"

#include <map>
#include <sstream>
#include <string_view>
#include <utility>

#include <prometheus/text_serializer.h>

#include <softblk/frontend.hpp>

namespace softblk::host {

namespace {

using nlohmann::json;
using labels = std::vector<std::pair<std::string, std::string>>;

// The families in the order of their first sample, each name once (one
// HELP and TYPE per family, as the format requires).
class family_builder {
public:
    void add(const std::string& name, const std::string& help, bool counter, const labels& l,
             double value)
    {
        auto [it, fresh] = _index.try_emplace(name, _families.size());
        if (fresh) {
            prometheus::MetricFamily family;
            family.name = name;
            family.help = help;
            family.type = counter ? prometheus::MetricType::Counter : prometheus::MetricType::Gauge;
            _families.push_back(std::move(family));
        }
        prometheus::MetricFamily& family = _families[it->second];
        prometheus::ClientMetric metric;
        for (const auto& [label, text] : l) {
            metric.label.push_back({label, text});
        }
        // A family keeps the type of its first sample: a front end that gave
        // a counter's name to a gauge gets the family's type.
        if (family.type == prometheus::MetricType::Counter) {
            metric.counter.value = value;
        } else {
            metric.gauge.value = value;
        }
        family.metric.push_back(std::move(metric));
    }
    std::vector<prometheus::MetricFamily> take() { return std::move(_families); }

private:
    std::vector<prometheus::MetricFamily> _families;
    std::map<std::string, size_t, std::less<>> _index;
};

// A number of `object` (0 when missing or not a number).
double number(const json& object, std::string_view key)
{
    if (!object.is_object()) {
        return 0;
    }
    const auto it = object.find(key);
    return it != object.end() && it->is_number() ? it->get<double>() : 0;
}

std::string text(const json& object, std::string_view key)
{
    if (!object.is_object()) {
        return {};
    }
    const auto it = object.find(key);
    return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}

labels with(labels l, std::string name, std::string value)
{
    l.emplace_back(std::move(name), std::move(value));
    return l;
}

void add_device(family_builder& out, const json& d)
{
    const labels dev = {{"device", text(d, "name")}, {"target", text(d, "type")}};
    const bool running = text(d, "state") == "running";
    out.add("softblk_device_up", "1 while the device serves I/O (state running), else 0", false,
            dev, running ? 1 : 0);
    if (!running) {
        // Powered off, starting, failed ...: `list` reads nothing from the
        // device then.
        return;
    }
    out.add("softblk_device_size_bytes", "capacity of the device", false, dev,
            number(d, "capacity_bytes"));
    out.add("softblk_device_logical_block_size_bytes", "logical block size of the device", false,
            dev, number(d, "logical_block_size"));
    out.add("softblk_device_submit_queues", "submit queues of the device", false, dev,
            number(d, "submit_queues"));
    out.add("softblk_device_queue_depth", "depth of each of the device's queues", false, dev,
            number(d, "queue_depth"));

    const json stats = d.value("stats", json::object());
    for (const auto& [op, key] :
         {std::pair{"read", "bytes_read"}, std::pair{"write", "bytes_written"}}) {
        out.add("softblk_device_io_bytes_total", "bytes the device read or wrote, by op", true,
                with(dev, "op", op), number(stats, key));
    }
    out.add("softblk_device_requests_submitted_total", "requests submitted to the device's queues",
            true, dev, number(stats, "submitted"));
    out.add("softblk_device_requests_completed_total", "requests the device completed", true, dev,
            number(stats, "completed"));
    out.add("softblk_device_errors_total", "requests the device completed with an error", true, dev,
            number(stats, "errors"));
    out.add("softblk_device_timeouts_total", "requests that timed out (io_timeout)", true, dev,
            number(stats, "timeouts"));

    const json memory = d.value("memory", json::object());
    out.add("softblk_device_memory_used_bytes", "memory the device's data and tables take", false,
            dev, number(memory, "used_bytes"));
    out.add("softblk_device_memory_limit_bytes", "the device's memory_limit (0: none)", false, dev,
            number(memory, "limit_bytes"));

    // Zoned devices: the zone engine's conditions and refusals (the
    // core's zone_engine::describe, whichever target holds it).
    const json target = d.value("target", json::object());
    if (const json zones = target.is_object() ? target.value("zones", json()) : json();
        zones.is_object()) {
        out.add("softblk_device_open_zones", "zones open now, implicitly or explicitly", false, dev,
                number(zones, "implicit_open") + number(zones, "explicit_open"));
        for (const char* condition : {"empty", "implicit_open", "explicit_open", "closed", "full",
                                      "read_only", "offline"}) {
            out.add("softblk_device_zones", "zones by condition", false,
                    with(dev, "condition", condition), number(zones, condition));
        }
        out.add("softblk_device_zone_open_refused_total",
                "zone opens refused because max_open zones were open", true, dev,
                number(zones, "open_refused"));
        out.add("softblk_device_zone_active_refused_total",
                "zone activations refused because max_active zones were active", true, dev,
                number(zones, "active_refused"));
        out.add("softblk_device_zone_implicit_closes_total",
                "implicitly open zones closed to open another", true, dev,
                number(zones, "implicit_closes"));
    }

    const json exp = d.value("export", json::object());
    const std::string type = text(exp, "type");
    if (type.empty() || type == "none") {
        return;
    }
    const labels ex = {{"device", text(d, "name")}, {"export", type}};
    out.add("softblk_export_up", "1 for each device's export", false, ex, 1);
    const export_type* front_end = find_export_type(type);
    if (front_end == nullptr || !front_end->metrics) {
        return;
    }
    for (const export_metric& m : front_end->metrics(exp)) {
        labels l = ex;
        l.insert(l.end(), m.labels.begin(), m.labels.end());
        out.add("softblk_export_" + m.name, m.help, m.counter, l, m.value);
    }
}

void add_daemon(family_builder& out, const json& status)
{
    out.add("softblk_daemon_devices", "devices the daemon hosts", false, {},
            number(status, "devices"));
    out.add("softblk_daemon_uptime_seconds", "time since the daemon started", false, {},
            number(status, "uptime_ms") / 1000.0);
    const json memory = status.value("memory", json::object());
    out.add("softblk_daemon_memory_used_bytes", "memory all devices' data take", false, {},
            number(memory, "used_bytes"));
    out.add("softblk_daemon_memory_limit_bytes",
            "the daemon's budget for device data (--memory-limit; 0: none)", false, {},
            number(memory, "limit_bytes"));
    out.add("softblk_daemon_memory_refusals_total",
            "allocations of device data refused by the daemon's budget", true, {},
            number(memory, "refused"));
}

}  // namespace

std::vector<prometheus::MetricFamily> metric_families(const json& devices, const json& status)
{
    family_builder out;
    if (status.is_object()) {
        add_daemon(out, status);
    }
    if (devices.is_array()) {
        for (const json& d : devices) {
            add_device(out, d);
        }
    }
    return out.take();
}

std::string metrics_text(const std::vector<prometheus::MetricFamily>& families)
{
    std::ostringstream out;
    prometheus::TextSerializer().Serialize(out, families);
    return out.str();
}

}  // namespace softblk::host
