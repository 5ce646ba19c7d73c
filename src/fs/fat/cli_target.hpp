// The IMAGE argument of `softblk fat`: an image file or block device node,
// `softblk:NAME` (a device of the softblk daemon, reached through its
// export), or `softblk:TYPE:KEY=VALUE,...` (a fresh softblk device of this
// process). Internal to the FAT tools.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <softblk/fat/block_device.hpp>
#include <softblk/fat/cli.hpp>

namespace softblk::fat::detail {

// Opens `spec`. `create_size` (image files only) creates or resizes the
// file first. `daemon` answers for `softblk:NAME` (nullptr: refused).
// Errors name the spec and what to do. Main thread; the caller owns the
// device.
result<std::unique_ptr<block_device>> open_target(const std::string& spec, bool read_only,
                                                  uint64_t create_size, daemon_directory* daemon);

}  // namespace softblk::fat::detail
