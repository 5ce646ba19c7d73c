// Device parameters for SET_PARAMS, derived from what the target says the
// device looks like (block_limits). Pure functions, tested without a kernel.
#pragma once

#include "abi.hpp"

#include <softblk/types.hpp>

namespace softblk::ublk {

// The per-tag buffer size to ask ADD_DEV for (dev_info.max_io_buf_bytes):
// the device's largest request rounded up to whole pages, 512 KiB when the
// target sets no limit, never more than the 32 MiB the ABI can address.
uint32_t io_buf_bytes_for(const block_limits& limits, size_t page_size);

// SET_PARAMS payload: logical/physical block size, capacity, max_sectors,
// virt boundary, read-only, rotational, volatile write cache and FUA,
// discard and write-zeroes limits, and for zoned devices the zone size
// (chunk_sectors) and the zoned parameters (open/active limits, largest
// zone append). `max_io_buf_bytes` is what ADD_DEV granted; max_sectors
// never exceeds it. Errors name the value the kernel would refuse (block
// size above the page size, a smaller last zone, no zone append).
result<params> make_params(const block_limits& limits, uint32_t max_io_buf_bytes, size_t page_size);

}  // namespace softblk::ublk
