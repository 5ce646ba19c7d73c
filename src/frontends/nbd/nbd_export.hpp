// Export type "nbd": `softblk add ... --export nbd [key=value ...]`.
// Devices that name the same socket share one server (export name = device
// name); the first export starts it, the last stop() ends it.
#pragma once

#include <memory>
#include <span>
#include <string>

#include <softblk/frontend.hpp>

namespace softblk::nbd {

// The export type's options (socket, tcp, tls, tls-certs, tls-psk,
// tls-verify-peer, readonly, max-connections, threads, handshake-timeout,
// poll-us, description).
std::span<const option_def> export_options();

// export_type::start. Control thread.
result<std::unique_ptr<device_export>> start_export(device& dev, const export_context& ctx,
                                                    std::span<const std::string> options);

// export_type::cleanup_stale: removes $run_dir/nbd.sock when no server
// listens on it. Control thread.
void cleanup_stale(const export_context& ctx);

}  // namespace softblk::nbd
