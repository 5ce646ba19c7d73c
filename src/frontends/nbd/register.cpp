// Registers export type "nbd" with the daemon (static initialiser; the
// library is an OBJECT library so this object is always linked in).
#include "nbd_export.hpp"

namespace {

const bool g_registered = softblk::register_export_type(softblk::export_type{
    .name = "nbd",
    .description =
        "NBD server (fixed newstyle, structured replies, base:allocation, TLS) on a unix socket "
        "under the run directory and optionally TCP; export name = device name",
    .start = softblk::nbd::start_export,
    .cleanup_stale = softblk::nbd::cleanup_stale,
    .available = {},
    .options = softblk::nbd::export_options(),
    .zoned = false,
    .max_block_size = {},
    .default_rank = 0,
    .summary = {},
    .reach = [](const nlohmann::json& d) -> softblk::result<softblk::export_reach> {
        softblk::export_reach r;
        r.nbd_uri = d.value("uri", std::string());
        return r;
    },
});

}  // namespace
