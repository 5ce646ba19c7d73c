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
// USER_RECOVERY whose daemon died are kept for `softblk recover`.
void cleanup_stale(const export_context& ctx);

// /dev/ublk-control exists (ublk_drv loaded, loading it if needed).
bool available();

}  // namespace softblk::ublk
