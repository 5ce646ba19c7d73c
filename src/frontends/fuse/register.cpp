// Registers export type "fuse" with the daemon (static initialiser; the
// library is an OBJECT library so this object is always linked in).
#include "fuse_export.hpp"

namespace {

const bool g_registered = softblk::register_export_type(softblk::export_type{
    .name = "fuse",
    .description =
        "one regular file per device in a FUSE mount under the run directory; as root also a "
        "loop device with direct I/O over it",
    .start = softblk::fuse::start_export,
    .cleanup_stale = softblk::fuse::cleanup_stale,
    .available = softblk::fuse::available,
    .options = softblk::fuse::export_options(),
});

}  // namespace
