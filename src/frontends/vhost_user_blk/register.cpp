// Registers export type "vhost-user-blk" with the daemon (static
// initialiser; the library is an OBJECT library so this object is always
// linked in).
#include "vhost_user_blk_export.hpp"

namespace {

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
});

}  // namespace
