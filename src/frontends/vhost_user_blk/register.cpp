// Registers export type "vhost-user-blk" with the daemon (static
// initialiser; the library is an OBJECT library so this object is always
// linked in).
#include "vhost_user_blk_export.hpp"

namespace {

// The rings' counters (the export's describe, "stats") for `softblk
// metrics`.
std::vector<softblk::export_metric> vhost_user_blk_metrics(const nlohmann::json& d)
{
    const nlohmann::json stats = d.value("stats", nlohmann::json::object());
    auto count = [&](const char* key) { return stats.value(key, 0.0); };
    std::vector<softblk::export_metric> out = {
        {"requests_total", "requests the export served", true, {}, count("requests")},
        {"errors_total", "requests the export completed with an error", true, {}, count("errors")},
        {"bad_requests_total",
         "requests the front end sent malformed",
         true,
         {},
         count("bad_requests")},
        {"resubmitted_total",
         "requests resubmitted after the front end reconnected",
         true,
         {},
         count("resubmitted")},
        {"connected",
         "1 while a front end is connected",
         false,
         {},
         d.value("connected", false) ? 1.0 : 0.0},
        {"connections_total", "front ends that connected", true, {}, d.value("connections", 0.0)},
    };
    for (const char* op : {"read", "write", "flush", "discard", "write_zeroes", "get_id",
                           "zone_management", "zone_append", "report_zones", "unsupported"}) {
        out.push_back(
            {"ops_total", "requests the export served, by op", true, {{"op", op}}, count(op)});
    }
    return out;
}

const bool g_registered = softblk::register_export_type(softblk::export_type{
    .name = "vhost-user-blk",
    .description =
        "vhost-user-blk back end for virtual machines (QEMU vhost-user-blk-pci, cloud-hypervisor, "
        "crosvm) and softblk's virtio driver, on a unix socket; one front end at a time, which "
        "may reconnect after a back-end restart and get its requests resubmitted",
    .start = softblk::vhost_user_blk::start_export,
    .cleanup_stale = softblk::vhost_user_blk::cleanup_stale,
    .available = {},
    .options = softblk::vhost_user_blk::export_options(),
    .zoned = true,
    .max_block_size = {},
    // The default for a zoned device where ublk is not (a VM or softblk's
    // virtio driver reaches it; fuse has no zoned model).
    .default_rank = 3,
    .summary = {},
    // softblk's own virtio-blk driver on the socket. The export serves one
    // front end at a time: while a VM is attached, the driver waits for its
    // connect_timeout and fails naming the socket.
    .reach = [](const nlohmann::json& d) -> softblk::result<softblk::export_reach> {
        softblk::export_reach r;
        r.target_type = "virtio";
        r.target_options = {"path=" + d.value("socket", std::string()), "poll_queues=0"};
        return r;
    },
    .metrics = vhost_user_blk_metrics,
});

}  // namespace
