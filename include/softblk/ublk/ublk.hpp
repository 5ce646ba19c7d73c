// The ublk front end (export type "ublk"): what the CLI and tools may ask
// of it beyond the export_type interface. See docs/ublk.md.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <softblk/frontend.hpp>
#include <softblk/options.hpp>
#include <softblk/types.hpp>

namespace softblk::ublk {

// The export's own options (id=, recovery=, user_copy=, unprivileged=,
// add_timeout=), for `softblk features` and documentation.
std::span<const option_def> export_options();

// What the running kernel's ublk driver offers.
struct kernel_features {
    // GET_FEATURES' answer; nullopt on kernels before 6.5, which lack it.
    std::optional<uint64_t> bits;
    // Every set bit by its kernel name (USER_RECOVERY, USER_COPY ...);
    // bits this build does not know appear as "bit N".
    std::vector<std::string> names;
    // Commands go ioctl-encoded (UBLK_F_CMD_IOCTL_ENCODE).
    bool ioctl_encode = false;
};

// Opens /dev/ublk-control (loading ublk_drv if needed) and asks. Control
// thread; errors say why ublk is unavailable.
result<kernel_features> query_kernel_features();

}  // namespace softblk::ublk
