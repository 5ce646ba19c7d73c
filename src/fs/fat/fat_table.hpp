// The file allocation table of a mounted volume: entries of every FAT copy
// (read through the metadata cache, written to every copy that mirroring
// asks for), one step along a chain with its damage checks, and the map of
// free clusters built at mount, from which clusters are allocated.
// Internal to softblk_fat; used under the volume lock.
#pragma once

#include <cstdint>
#include <vector>

#include <softblk/fat/block_device.hpp>

#include "geometry.hpp"
#include "sector_cache.hpp"

namespace softblk::fat::detail {

class fat_table {
public:
    // Borrows everything; all of it outlives the table (members of the
    // same volume_state).
    fat_table(const geometry& g, sector_cache& meta, block_device& dev, damage_log& damage);

    // Reads the active FAT once into the free map and count. 0 or -errno.
    int scan();

    // The entry of cluster `c` in the active FAT. 0 or -errno.
    int get(uint32_t c, uint32_t& value);
    // Sets the entry of `c` in every copy (only the active one when FAT32
    // mirroring is off). Does not touch the free map. 0 or -errno.
    int set(uint32_t c, uint32_t value);
    // The cluster after `c` in its chain; 0 at the end of the chain. A free
    // or bad cluster, or one outside the volume, is damage: -EIO with a
    // message naming the cluster.
    int next(uint32_t c, uint32_t& next);

    // Takes `n` free clusters at or after `hint` (or the next-free cursor
    // when `hint` is not a cluster), links them into one chain ending in
    // EOC and returns them in `out`. -ENOSPC with nothing taken.
    int allocate(uint32_t n, uint32_t hint, std::vector<uint32_t>& out);
    // Counts `c` free in the map (its entry is the caller's business).
    void release(uint32_t c);

    uint32_t free_count() const { return _free_count; }
    // Where the next allocation without a hint starts (FSInfo's hint).
    uint32_t next_free() const { return _next_free; }
    void set_next_free(uint32_t c) { _next_free = c; }

private:
    int entry_byte(uint32_t copy, uint64_t offset, uint8_t*& p, bool dirty);
    bool is_free(uint32_t c) const { return (_free_map[c >> 6] >> (c & 63)) & 1; }
    void set_free(uint32_t c, bool free);
    // First free cluster at or after `from` (wrapping), or 0.
    uint32_t find_free(uint32_t from) const;

    const geometry& _g;
    sector_cache& _meta;
    block_device& _dev;
    damage_log& _damage;
    std::vector<uint64_t> _free_map;  // bit set: cluster free
    uint32_t _free_count = 0;
    uint32_t _next_free = 2;
};

}  // namespace softblk::fat::detail
