// Export type "vhost-user-blk": `softblk add ... --export vhost-user-blk`
// serves the device to one vhost-user front end at a time (QEMU's
// vhost-user-blk-pci, cloud-hypervisor, crosvm, softblk's own virtio
// driver) on a unix socket; `describe()` names the socket.
#pragma once

#include <memory>
#include <span>
#include <string>

#include <softblk/frontend.hpp>

namespace softblk::vhost_user_blk {

// The export options (socket, mode, group, num-queues, readonly, poll-us).
std::span<const option_def> export_options();

// export_type::start. Control thread.
result<std::unique_ptr<device_export>> start_export(device& dev, const export_context& ctx,
                                                    std::span<const std::string> options);

// export_type::cleanup_stale: removes sockets under RUN_DIR/vhost-user-blk
// that nobody listens on. Control thread.
void cleanup_stale(const export_context& ctx);

}  // namespace softblk::vhost_user_blk
