// The metric families made from `list` and `status` answers (src/host/
// metrics.hpp): one HELP and TYPE per family, counters and gauges, label
// values escaped as the text format wants, nothing read from a device that
// does not run.
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "metrics.hpp"

namespace {

using nlohmann::json;

json running(const std::string& name, uint64_t written)
{
    return {{"name", name},
            {"type", "null"},
            {"state", "running"},
            {"capacity_bytes", 1 << 20},
            {"queue_depth", 64},
            {"stats",
             {{"bytes_read", 4096},
              {"bytes_written", written},
              {"completed", 3},
              {"submitted", 3},
              {"errors", 0},
              {"timeouts", 0}}},
            {"export", {{"type", "none"}}}};
}

size_t count(const std::string& text, const std::string& what)
{
    size_t n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) {
        ++n;
    }
    return n;
}

TEST(metrics, one_family_per_name_with_both_devices)
{
    const json devices = json::array({running("a", 8192), running("b", 12288)});
    const std::string text = softblk::host::metrics_text(
        softblk::host::metric_families(devices, json{{"devices", 2}, {"uptime_ms", 1500}}));
    EXPECT_EQ(count(text, "# TYPE softblk_device_io_bytes_total counter\n"), 1u) << text;
    EXPECT_EQ(count(text, "# HELP softblk_device_io_bytes_total "), 1u) << text;
    EXPECT_NE(text.find("softblk_device_io_bytes_total{device=\"a\",target=\"null\",op=\"write\"} "
                        "8192\n"),
              std::string::npos)
        << text;
    EXPECT_NE(text.find("softblk_device_io_bytes_total{device=\"b\",target=\"null\",op=\"write\"} "
                        "12288\n"),
              std::string::npos)
        << text;
    EXPECT_NE(text.find("# TYPE softblk_device_size_bytes gauge\n"), std::string::npos) << text;
    EXPECT_NE(text.find("# TYPE softblk_device_queue_depth gauge\n"), std::string::npos) << text;
    EXPECT_NE(text.find("softblk_daemon_uptime_seconds 1.5\n"), std::string::npos) << text;
    // No export: no export family.
    EXPECT_EQ(text.find("softblk_export_up"), std::string::npos) << text;
}

TEST(metrics, label_values_are_escaped)
{
    const json devices = json::array({running("q\"b\\s\nn", 0)});
    const std::string text =
        softblk::host::metrics_text(softblk::host::metric_families(devices, json()));
    EXPECT_NE(text.find("softblk_device_up{device=\"q\\\"b\\\\s\\nn\",target=\"null\"} 1\n"),
              std::string::npos)
        << text;
}

TEST(metrics, a_device_that_does_not_run_is_only_down)
{
    const json devices = json::array({{{"name", "off0"}, {"type", "file"}, {"state", "off"}}});
    const std::string text =
        softblk::host::metrics_text(softblk::host::metric_families(devices, json()));
    EXPECT_NE(text.find("softblk_device_up{device=\"off0\",target=\"file\"} 0\n"),
              std::string::npos)
        << text;
    EXPECT_EQ(text.find("softblk_device_io_bytes_total"), std::string::npos) << text;
}

TEST(metrics, zones_by_condition_and_open_zones)
{
    json d = running("z", 0);
    d["target"]["zones"] = {{"empty", 5},  {"implicit_open", 2}, {"explicit_open", 1},
                            {"closed", 0}, {"full", 0},          {"open_refused", 7}};
    const std::string text =
        softblk::host::metrics_text(softblk::host::metric_families(json::array({d}), json()));
    EXPECT_NE(text.find("softblk_device_open_zones{device=\"z\",target=\"null\"} 3\n"),
              std::string::npos)
        << text;
    EXPECT_NE(
        text.find("softblk_device_zones{device=\"z\",target=\"null\",condition=\"empty\"} 5\n"),
        std::string::npos)
        << text;
    EXPECT_NE(text.find("# TYPE softblk_device_zone_open_refused_total counter\n"),
              std::string::npos)
        << text;
}

}  // namespace
