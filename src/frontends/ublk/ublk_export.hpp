// The ublk export: a softblk device served to the kernel as /dev/ublkbN
// over ublk_drv. See docs/ublk.md.
#pragma once

#include <memory>
#include <span>
#include <string>

#include <softblk/frontend.hpp>

namespace softblk::ublk {

// ADD_DEV (or, when RUN_DIR/ublk/NAME.json names a device that outlived its
// daemon, START_USER_RECOVERY), SET_PARAMS, one queue thread per hardware
// queue, START_DEV (or END_USER_RECOVERY). Control thread.
result<std::unique_ptr<device_export>> start_export(device& dev, const export_context& ctx,
                                                    std::span<const std::string> options);

// Deletes kernel devices that a dead daemon left without recovery, and
// state files of devices the kernel no longer has. Devices with
// USER_RECOVERY whose daemon died are kept for recovery (a daemon that
// starts, `softblk-driver --recover NAME`).
void cleanup_stale(const export_context& ctx);

// Every state file under ctx.run_dir/ublk with the kernel's view of its
// device ({"dev_id", "state": LIVE, QUIESCED, FAIL_IO, DEAD or GONE when
// the kernel has no such device, "daemon_pid"}); recoverable when the
// device has USER_RECOVERY, is not DEAD and its daemon is gone. The export
// type's saved_exports. Control thread.
result<std::vector<saved_export>> saved_exports(const export_context& ctx);

// query_kernel_features() as {"bits": N or null before 6.5, "names": [...],
// "ioctl_encode": bool}: the export type's host_features. Control thread.
result<nlohmann::json> host_features();

// /dev/ublk-control exists (ublk_drv loaded, loading it if needed).
bool available();

}  // namespace softblk::ublk
