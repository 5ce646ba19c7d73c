// Registers export type "ublk" with the daemon (static initialiser; the
// library is an OBJECT library so this object is always linked in).
#include "ublk_export.hpp"

#include <softblk/ublk/ublk.hpp>

#include <unistd.h>

#include <fmt/format.h>

namespace {

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
});

}  // namespace
