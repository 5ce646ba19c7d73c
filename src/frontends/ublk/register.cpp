// Registers export type "ublk" with the daemon (static initialiser; the
// library is an OBJECT library so this object is always linked in).
#include "ublk_export.hpp"

#include <softblk/ublk/ublk.hpp>

namespace {

const bool g_registered = softblk::register_export_type(softblk::export_type{
    .name = "ublk",
    .description =
        "a kernel block device /dev/ublkbN served over ublk_drv (io_uring); devices with "
        "recovery= outlive a killed daemon and are re-attached by `softblk recover`",
    .start = softblk::ublk::start_export,
    .cleanup_stale = softblk::ublk::cleanup_stale,
    .available = softblk::ublk::available,
    .options = softblk::ublk::export_options(),
    // UBLK_F_ZONED (with USER_COPY): zone geometry, report, management and
    // the append sector go to the kernel.
    .zoned = true,
});

}  // namespace
