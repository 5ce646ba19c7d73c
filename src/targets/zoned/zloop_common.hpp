// What the two zloop targets share: `zloop` (one file per zone, on the file
// engine) and `zloop-ram` (the zones in a memory store). Both take zloop's
// zone options with the same names, defaults and checks, stand on the zone
// engine's zloop flavour with the same configuration, and run every request
// through the same queue logic (zloop_rw's order: the write pointer checked
// and advanced before the data moves, zone append given its sector in
// submission order, a failed write making the zone re-read from its store);
// only where the bytes go differs (zloop_queue's data hooks).
#pragma once

#include <cstdint>
#include <span>

#include <softblk/options.hpp>
#include <softblk/target.hpp>
#include <softblk/zone_engine.hpp>

#include "zloop_layout.hpp"

namespace softblk::targets::zloop {

// zloop's max_hw_sectors (and its zone append limit): 1 MiB.
constexpr uint32_t k_max_transfer = 1u << 20;

// The option tables: zloop's (the zone options plus id, base_dir,
// buffered_io, discard_write_cache) and zloop-ram's (the zone options plus
// memory_limit).
std::span<const option_def> file_options();
std::span<const option_def> ram_options();

// The zone options both targets take, checked as zloop checks them.
struct zone_settings {
    geometry geo;  // buffered_io left false: the file target's own
    bool zone_append = true;
    bool ordered_zone_append = false;
    uint32_t max_open_zones = 0;
    uint32_t max_active_zones = 0;
    unsigned queue_depth = 0;
};

// Reads and checks the zone options; errors name the option and the valid
// range. Control thread.
result<zone_settings> parse_zone_settings(const option_set& o);

// The zone engine's configuration for `s` with blocks of `block_size`.
zone_engine_config engine_config(const zone_settings& s, uint32_t block_size);

// The device's limits for the zones of `zones`: blocks of `block_size`,
// 1 MiB requests, zone append up to 1 MiB (or none), no discard or write
// zeroes, no FUA; `volatile_cache` says whether FLUSH matters.
block_limits device_limits(const zone_engine& zones, uint32_t block_size, bool zone_append,
                           bool volatile_cache);

// submit_queues and hw_queue_depth from nr_queues and queue_depth (the
// target types' hooks).
unsigned submit_queues(const option_set& o);
unsigned queue_depth(const option_set& o);

// The per-queue half of both targets: zloop_rw and zloop's zone operations
// on the zone engine; the subclass moves the data. Queue thread.
class zloop_queue : public target_queue {
public:
    explicit zloop_queue(zone_engine& zones) : _zones(zones) {}
    void submit(io_request& r) final;

protected:
    // Moves the data of read `r` (the zone's bytes from `zone_offset`; past
    // the write pointer the store gives zeros) or write / zone append `r`
    // (whose write pointer the engine has advanced already) and completes
    // it, now or from poll().
    virtual void read_data(io_request& r, uint32_t zone, uint64_t zone_offset) = 0;
    virtual void write_data(io_request& r, uint32_t zone, uint64_t zone_offset) = 0;
    // Completes `r` with `result` (0, bytes or -errno) without moving data.
    virtual void complete_now(io_request& r, int result) = 0;
    // FLUSH: 0 or -errno.
    virtual int flush() = 0;
    // A sequential zone's write pointer moved (before its data is stored).
    virtual void zone_written(uint32_t zone) {}

    // A write or zone append that did not land in a sequential zone: the
    // engine re-reads the zone from the store before its next use (zloop's
    // ZLOOP_ZONE_SEQ_ERROR). Call on completion with the result.
    void note_result(const io_request& r, int result);

    zone_engine& _zones;

private:
    void write(io_request& r);
};

}  // namespace softblk::targets::zloop
