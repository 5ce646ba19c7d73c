// Registers export type "fuse" with the daemon (static initialiser; the
// library is an OBJECT library so this object is always linked in).
#include "fuse_export.hpp"

#include <cstdio>
#include <sys/utsname.h>
#include <unistd.h>

namespace {

// The loop driver takes the block layer's limit: 64 KiB since Linux 6.15
// (BLK_MAX_BLOCK_SIZE), the page size before.
std::pair<uint32_t, std::string> loop_block_limit(std::span<const std::string> options)
{
    for (const std::string& o : options) {
        if (o.starts_with("loop=")) {
            if (auto on = softblk::parse_kernel_bool(std::string_view(o).substr(5)); on && !*on) {
                return {0, {}};  // the file alone has no block size
            }
        }
    }
    utsname u{};
    unsigned major = 0;
    unsigned minor = 0;
    if (::uname(&u) == 0 && std::sscanf(u.release, "%u.%u", &major, &minor) == 2 &&
        (major > 6 || (major == 6 && minor >= 15))) {
        return {65536, "the loop device takes blocks up to 64 KiB"};
    }
    return {static_cast<uint32_t>(::sysconf(_SC_PAGESIZE)),
            "the loop device takes blocks up to the page size before Linux 6.15; loop=0 exports "
            "the file alone"};
}

// The workers' counters (fuse_export::describe) for `softblk metrics`.
std::vector<softblk::export_metric> fuse_metrics(const nlohmann::json& d)
{
    auto count = [&](const char* key) { return d.value(key, 0.0); };
    std::vector<softblk::export_metric> out = {
        {"requests_total",
         "requests the export served",
         true,
         {},
         count("requests_after_poll") + count("requests_after_sleep")},
        {"requests_woken_total",
         "requests the export served, by what its worker did before: polled or slept",
         true,
         {{"wait", "poll"}},
         count("requests_after_poll")},
        {"requests_woken_total",
         "requests the export served, by what its worker did before: polled or slept",
         true,
         {{"wait", "sleep"}},
         count("requests_after_sleep")},
        {"requests_direct_total",
         "reads and writes served without libfuse's request object",
         true,
         {},
         count("requests_direct")},
        {"poll_seconds_total",
         "time the export's workers spent polling for requests",
         true,
         {},
         count("poll_ms") / 1000.0},
        {"workers", "workers serving the export now", false, {}, count("threads")},
    };
    if (d.contains("ring_requests")) {
        out.push_back({"ring_requests_total",
                       "requests served over FUSE's io_uring",
                       true,
                       {},
                       count("ring_requests")});
    }
    return out;
}

const bool g_registered = softblk::register_export_type(softblk::export_type{
    .name = "fuse",
    .description =
        "one regular file per device in a FUSE mount under the run directory; as root also a "
        "loop device with direct I/O over it",
    .start = softblk::fuse::start_export,
    .cleanup_stale = softblk::fuse::cleanup_stale,
    .available = softblk::fuse::available,
    .options = softblk::fuse::export_options(),
    .zoned = false,
    .max_block_size = loop_block_limit,
    // The default where ublk is not: needs only /dev/fuse (and, as root,
    // the loop driver), but has no zoned model.
    .default_rank = 2,
    .summary = {},
    // The file the daemon serves: one hop less than its loop device, which
    // sits on the same file.
    .reach = [](const nlohmann::json& d) -> softblk::result<softblk::export_reach> {
        softblk::export_reach r;
        for (const char* key : {"file", "loop"}) {
            if (d.contains(key) && d[key].is_string()) {
                r.paths.push_back(d[key].get<std::string>());
            }
        }
        r.hint =
            "the FUSE mount admits only the daemon's user; run as that user, or export "
            "the device over NBD";
        return r;
    },
    .metrics = fuse_metrics,
});

}  // namespace
