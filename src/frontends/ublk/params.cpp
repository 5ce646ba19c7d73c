#include "params.hpp"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <fmt/core.h>

namespace softblk::ublk {

namespace {

constexpr uint32_t k_default_io_buf = 512 * 1024;

uint8_t shift_of(uint32_t value)
{
    return static_cast<uint8_t>(std::countr_zero(value));
}

// What ublk_drv accepts of a zoned device (Linux 6.12 to 7.3,
// ublk_dev_param_zoned_validate and ublk_get_nr_zones).
result<void> check_zoned(const block_limits& limits)
{
    const uint64_t zone = limits.zone_size_bytes;
    if (zone < limits.logical_block_size || !std::has_single_bit(zone) ||
        (zone >> 9) > UINT32_MAX) {
        return make_error(EINVAL,
                          fmt::format("zone size {} bytes: ublk takes a power of two from one "
                                      "block to 2 TiB (chunk_sectors)",
                                      zone));
    }
    if (limits.capacity_bytes % zone != 0) {
        return make_error(
            EINVAL,
            fmt::format("capacity {} bytes with {}-byte zones: ublk counts whole zones only "
                        "(dev_sectors >> log2(chunk_sectors)), so a smaller last zone "
                        "cannot be exported; make the size a multiple of the zone size",
                        limits.capacity_bytes, zone));
    }
    if (limits.max_zone_append_bytes < limits.logical_block_size) {
        return make_error(EINVAL,
                          "zone append off (zone_append_max_sectors=0): ublk refuses a zoned "
                          "device without zone append (max_zone_append_sectors must not be 0)");
    }
    const uint64_t zones = limits.capacity_bytes / zone;
    if (limits.max_open_zones > zones || limits.max_active_zones > zones) {
        return make_error(EINVAL,
                          fmt::format("max open {} / active {} zones: ublk allows at most "
                                      "the {} zones",
                                      limits.max_open_zones, limits.max_active_zones, zones));
    }
    return {};
}

}  // namespace

uint32_t io_buf_bytes_for(const block_limits& limits, size_t page_size)
{
    uint64_t bytes = limits.max_transfer_bytes != 0 ? limits.max_transfer_bytes : k_default_io_buf;
    bytes = (bytes + page_size - 1) / page_size * page_size;
    return static_cast<uint32_t>(std::min<uint64_t>(bytes, k_max_io_buf_bytes));
}

result<params> make_params(const block_limits& limits, uint32_t max_io_buf_bytes, size_t page_size)
{
    const uint32_t lbs = limits.logical_block_size;
    const uint32_t pbs = std::max(limits.physical_block_size, lbs);
    if (!std::has_single_bit(lbs) || lbs < 512 || lbs > page_size) {
        return make_error(EINVAL,
                          fmt::format("logical block size {}: ublk takes a power of two from 512 "
                                      "to the page size ({})",
                                      lbs, page_size));
    }
    if (!std::has_single_bit(pbs)) {
        return make_error(EINVAL,
                          fmt::format("physical block size {}: must be a power of two", pbs));
    }
    if (limits.capacity_bytes == 0 || limits.capacity_bytes % lbs != 0) {
        return make_error(EINVAL,
                          fmt::format("capacity {} bytes: must be a non-zero multiple of the "
                                      "logical block size {}",
                                      limits.capacity_bytes, lbs));
    }
    if (limits.zoned) {
        if (auto r = check_zoned(limits); !r) {
            return std::unexpected(r.error());
        }
    }
    if (max_io_buf_bytes < lbs) {
        return make_error(EINVAL, fmt::format("max_io_buf_bytes {}: smaller than one block ({})",
                                              max_io_buf_bytes, lbs));
    }

    params p;
    std::memset(&p, 0, sizeof(p));
    p.len = sizeof(p);
    p.types = k_param_basic;

    param_basic& b = p.basic;
    b.logical_bs_shift = shift_of(lbs);
    b.physical_bs_shift = shift_of(pbs);
    b.io_min_shift = shift_of(pbs);
    b.io_opt_shift = shift_of(pbs);
    uint64_t max_bytes =
        limits.max_transfer_bytes != 0 ? limits.max_transfer_bytes : max_io_buf_bytes;
    max_bytes = std::min<uint64_t>(max_bytes, max_io_buf_bytes);
    max_bytes -= max_bytes % lbs;
    b.max_sectors = static_cast<uint32_t>(max_bytes >> 9);
    b.dev_sectors = limits.capacity_bytes >> 9;
    b.virt_boundary_mask = limits.virt_boundary_bytes != 0 ? limits.virt_boundary_bytes - 1 : 0;
    if (limits.read_only) {
        b.attrs |= k_attr_read_only;
    }
    if (limits.rotational) {
        b.attrs |= k_attr_rotational;
    }
    if (limits.volatile_write_cache) {
        b.attrs |= k_attr_volatile_cache;
        // The kernel only looks at FUA on a device with a write cache:
        // without one every write is durable anyway.
        if (limits.fua) {
            b.attrs |= k_attr_fua;
        }
    }

    if (limits.zoned) {
        // The zone size goes in chunk_sectors; zone append is bounded by
        // the largest request (the block layer would clamp it anyway).
        b.chunk_sectors = static_cast<uint32_t>(limits.zone_size_bytes >> 9);
        p.types |= k_param_zoned;
        param_zoned& z = p.zoned;
        z.max_open_zones = limits.max_open_zones;
        z.max_active_zones = limits.max_active_zones;
        uint64_t append = std::min<uint64_t>(limits.max_zone_append_bytes, max_bytes);
        append -= append % lbs;
        z.max_zone_append_sectors = static_cast<uint32_t>(append >> 9);
    }

    if (limits.max_discard_bytes != 0 || limits.max_write_zeroes_bytes != 0) {
        p.types |= k_param_discard;
        param_discard& d = p.discard;
        d.discard_granularity = pbs;
        d.discard_alignment = 0;
        d.max_discard_sectors = limits.max_discard_bytes >> 9;
        d.max_write_zeroes_sectors = limits.max_write_zeroes_bytes >> 9;
        // ublk passes one range per discard request.
        d.max_discard_segments = 1;
    }
    return p;
}

}  // namespace softblk::ublk
