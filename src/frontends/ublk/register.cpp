// Registers export type "ublk" with the daemon (static initialiser; the
// library is an OBJECT library so this object is always linked in).
#include "ublk_export.hpp"

#include <softblk/ublk/ublk.hpp>

#include <unistd.h>

#include <fmt/format.h>

namespace {

// The queues' counters (ublk_export::describe) for `softblk metrics`.
std::vector<softblk::export_metric> ublk_metrics(const nlohmann::json& d)
{
    std::vector<softblk::export_metric> out = {
        {"requests_total", "requests the export served", true, {}, d.value("requests", 0.0)},
        {"errors_total",
         "requests the export completed with an error",
         true,
         {},
         d.value("errors", 0.0)},
        {"queues", "the kernel device's hardware queues", false, {}, d.value("queues", 0.0)},
        {"queue_depth",
         "the depth of each of the kernel device's queues",
         false,
         {},
         d.value("depth", 0.0)},
    };
    // Per queue: which CPUs submit where (the block layer picks the queue
    // by the submitting CPU).
    if (const auto it = d.find("queue_requests"); it != d.end() && it->is_array()) {
        for (size_t q = 0; q < it->size(); ++q) {
            out.push_back({"queue_requests_total",
                           "requests the export served, by queue",
                           true,
                           {{"queue", std::to_string(q)}},
                           (*it)[q].get<double>()});
        }
    }
    if (d.contains("linked_commits")) {
        out.push_back({"linked_commits_total",
                       "requests completed through a commit linked after their write",
                       true,
                       {},
                       d.value("linked_commits", 0.0)});
    }
    return out;
}

const bool g_registered = softblk::register_export_type(softblk::export_type{
    .name = "ublk",
    .description =
        "a kernel block device /dev/ublkbN served over ublk_drv (io_uring); devices with "
        "recovery= outlive a killed daemon and are re-attached by `softblk recover`",
    .start = softblk::ublk::start_export,
    .cleanup_stale = softblk::ublk::cleanup_stale,
    .saved_exports = softblk::ublk::saved_exports,
    .host_features = softblk::ublk::host_features,
    .available = softblk::ublk::available,
    .options = softblk::ublk::export_options(),
    // UBLK_F_ZONED (with USER_COPY): zone geometry, report, management and
    // the append sector go to the kernel.
    .zoned = true,
    // ublk_validate_params refuses logical_bs_shift > PAGE_SHIFT (every
    // kernel so far, 6.15's larger blocks included).
    .max_block_size =
        [](std::span<const std::string>) {
            return std::pair<uint32_t, std::string>(
                static_cast<uint32_t>(::sysconf(_SC_PAGESIZE)),
                "ublk_drv takes logical blocks up to the page size");
        },
    // The default export where the kernel has ublk_drv: a real block
    // device with the least overhead, and zones.
    .default_rank = 1,
    // The kernel's view of the device and the daemon that serves it.
    .summary =
        [](const nlohmann::json& d) {
            if (!d.contains("block")) {
                return std::string();
            }
            return fmt::format("{} {} pid {} queues {} depth {}",
                               d.value("block", std::string("?")),
                               d.value("state", std::string("?")), d.value("daemon_pid", -1),
                               d.value("queues", 0u), d.value("depth", 0u));
        },
    .reach = [](const nlohmann::json& d) -> softblk::result<softblk::export_reach> {
        softblk::export_reach r;
        r.paths = {d.value("block", std::string())};
        r.hint = "ublk nodes belong to root unless the export is unprivileged";
        return r;
    },
    .metrics = ublk_metrics,
});

}  // namespace
