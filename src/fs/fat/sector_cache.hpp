// A write-back sector cache over a fat::block_device. Two instances per
// volume: one for FAT and directory sectors, one for file data, so a large
// file transfer never pushes the metadata out.
//
// - A miss reads a run of following sectors in one request; sectors of the
//   run that are already cached keep their (possibly dirty, newer) copy.
// - Write-back sorts the dirty sectors and writes each run of neighbours
//   with one request.
// - `pin_dirty` (metadata): dirty sectors are never evicted; the owner
//   writes them back between operations, so what is on the device is always
//   the state after a complete operation. Without it (data), evicting a
//   dirty sector writes back every dirty sector first.
//
// Sector numbers are file-system sectors (`sector_bytes`); the device LBA
// is sector * device_ratio. Not thread-safe: the volume lock covers it.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <set>
#include <unordered_map>
#include <vector>

#include <softblk/fat/block_device.hpp>

namespace softblk::fat::detail {

class sector_cache {
public:
    sector_cache(block_device& device, uint32_t sector_bytes, uint32_t device_ratio,
                 uint32_t capacity, uint32_t read_ahead, bool pin_dirty);

    enum class fill : uint8_t { read, zero };

    // Points `out` at the cached copy of `sector` (valid until the next call
    // that may evict). On a miss with fill::read, reads up to the read-ahead
    // run, never at or past `run_end`. fill::zero installs zeros without
    // reading (the caller overwrites the sector). Returns 0 or -errno.
    int get(uint64_t sector, uint64_t run_end, fill how, uint8_t*& out);
    void mark_dirty(uint64_t sector);

    // Writes back every dirty sector, sorted and coalesced. 0 or -errno.
    int write_back();
    // Copies the dirty cached sectors of [first, first+count) over `buffer`
    // (after a direct read that bypassed the cache).
    void overlay_dirty(uint64_t first, uint64_t count, uint8_t* buffer) const;
    // Forgets [first, first+count), dirty or not (freed clusters, or a
    // direct write that replaces them).
    void invalidate(uint64_t first, uint64_t count);
    // Forgets everything without writing (crash simulation).
    void discard_all();

    size_t dirty_count() const { return _dirty.size(); }
    size_t size() const { return _index.size(); }
    uint64_t hits() const { return _hits; }
    uint64_t misses() const { return _misses; }
    uint64_t runs_written() const { return _runs_written; }

private:
    struct slot {
        uint64_t sector = 0;
        bool dirty = false;
        std::unique_ptr<uint8_t[]> data;
    };
    using slot_list = std::list<slot>;

    slot_list::iterator install(uint64_t sector);
    int make_room();
    void erase(slot_list::iterator it);

    block_device& _device;
    uint32_t _sector_bytes;
    uint32_t _ratio;
    uint32_t _capacity;
    uint32_t _read_ahead;
    bool _pin_dirty;
    slot_list _lru;     // front = most recent; in pin mode only clean slots
    slot_list _pinned;  // dirty slots in pin mode
    slot_list _spare;   // evicted slots whose buffers are reused
    std::unordered_map<uint64_t, slot_list::iterator> _index;
    std::set<uint64_t> _dirty;
    std::vector<uint8_t> _staging;
    // Bounds of the sectors installed since the cache was last empty: a
    // range outside them needs no lookups (invalidate of a direct write).
    uint64_t _low = UINT64_MAX;
    uint64_t _high = 0;
    uint64_t _hits = 0;
    uint64_t _misses = 0;
    uint64_t _runs_written = 0;
};

}  // namespace softblk::fat::detail
