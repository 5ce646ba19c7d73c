// The FUSE single-file export: a device appears as one regular file,
// $RUN_DIR/fuse/NAME/NAME, in a FUSE mount of its own; as root the file is
// also attached to a loop device with direct I/O, so the kernel sees a real
// block device. See docs/fuse.md.
#pragma once

#include <memory>
#include <span>
#include <string>

#include <softblk/frontend.hpp>
#include <softblk/options.hpp>

namespace softblk::fuse {

// The export's own options ("loop=0", "threads=4").
std::span<const option_def> export_options();

// Mounts the file for `dev` under ctx.run_dir/fuse/NAME, starts the worker
// threads and, with loop=1, attaches the loop device. Control thread.
result<std::unique_ptr<device_export>> start_export(device& dev, const export_context& ctx,
                                                    std::span<const std::string> options);

// Removes stale mounts, loop devices and directories under
// ctx.run_dir/fuse left by a daemon that died. Control thread.
void cleanup_stale(const export_context& ctx);

// True when /dev/fuse can be opened.
bool available();

}  // namespace softblk::fuse
