#include "zloop_common.hpp"

#include <algorithm>
#include <array>
#include <cerrno>

#include <fmt/core.h>

#include <softblk/memory_store.hpp>

namespace softblk::targets::zloop {

namespace {

// zloop's option names, units and defaults (ZLOOP_DEF_*), plus
// max_active_zones, which zloop lacks: those of the zones, which both
// targets take, and those of the zone files.
constexpr option_def k_zone_options[] = {
    {.name = "capacity_mb",
     .kind = option_kind::integer,
     .default_value = "16384",
     .unit = "MiB",
     .help = "device capacity, rounded down to whole zones",
     .min = 1,
     .max = UINT32_MAX},
    {.name = "zone_size_mb",
     .kind = option_kind::integer,
     .default_value = "256",
     .unit = "MiB",
     .help = "zone size, a power of two up to 16384",
     .min = 1,
     .max = 16384},
    {.name = "zone_capacity_mb",
     .kind = option_kind::integer,
     .default_value = "0",
     .unit = "MiB",
     .help = "writable MiB of each sequential zone, at most zone_size_mb; 0: the zone size",
     .min = 0,
     .max = 16384},
    {.name = "conv_zones",
     .kind = option_kind::integer,
     .default_value = "8",
     .unit = "zones",
     .help = "conventional zones at the start (fewer than the zones)",
     .min = 0,
     .max = UINT32_MAX},
    {.name = "nr_queues",
     .kind = option_kind::integer,
     .default_value = "1",
     .unit = "",
     .help = "queues (sets submit_queues), each with its own thread and io_uring",
     .min = 1,
     .max = 256},
    {.name = "queue_depth",
     .kind = option_kind::integer,
     .default_value = "128",
     .unit = "",
     .help = "requests in flight per queue (sets hw_queue_depth)",
     .min = 1,
     .max = 4096},
    {.name = "zone_append",
     .kind = option_kind::boolean,
     .default_value = "1",
     .unit = "",
     .help = "native zone append (1 MiB at most); 0: none (the ublk export refuses a zoned "
             "device without it)"},
    {.name = "ordered_zone_append",
     .kind = option_kind::boolean,
     .default_value = "0",
     .unit = "",
     .help = "zone appends get their sector in submission order; softblk always does so (the "
             "sector is chosen when the queue thread takes the request), 1 only says so"},
    {.name = "max_open_zones",
     .kind = option_kind::integer,
     .default_value = "0",
     .unit = "zones",
     .help = "most open zones, implicitly open ones closed in LRU order; 0: no limit",
     .min = 0,
     .max = UINT32_MAX},
    {.name = "max_active_zones",
     .kind = option_kind::integer,
     .default_value = "0",
     .unit = "zones",
     .help = "most active (open or closed) zones, null_blk's errors (zloop has no such limit); 0: "
             "no limit",
     .min = 0,
     .max = UINT32_MAX},
};

constexpr option_def k_file_only_options[] = {
    {.name = "id",
     .kind = option_kind::signed_integer,
     .default_value = "-1",
     .unit = "",
     .help = "device number: the zone files are in BASE_DIR/ID; -1: the lowest ID whose "
             "directory exists and that no other zloop device holds (flock, any daemon)",
     .smin = -1,
     .smax = INT32_MAX},
    {.name = "base_dir",
     .kind = option_kind::text,
     .default_value = "/var/local/zloop",
     .unit = "absolute path",
     .help = "directory of the devices' directories (BASE_DIR/ID must exist); both owned by "
             "the daemon's user or root and writable by no one else",
     .check = check_absolute_path},
    {.name = "buffered_io",
     .kind = option_kind::boolean,
     .default_value = "0",
     .unit = "",
     .help = "use the page cache instead of O_DIRECT"},
    {.name = "discard_write_cache",
     .kind = option_kind::boolean,
     .default_value = "0",
     .unit = "",
     .help = "on removal cut each sequential zone file back to its size at the last flush (a "
             "power loss)"},
    {.name = "prealloc",
     .kind = option_kind::text,
     .default_value = "auto",
     .unit = "auto|0|1",
     .help = "allocate a sequential zone file's rest (beyond its size) before the zone's first "
             "write; auto: where that lets appends go without blocking (XFS, direct I/O), "
             "tried at open"},
};

// The shared memory_limit, without the null target's "with memory_backed=1":
// zloop-ram always keeps its data in memory.
constexpr option_def k_ram_memory_limit = [] {
    option_def def = k_memory_limit_option;
    def.help =
        "most RAM the zones' data may take; writes that need more fail with ENOSPC, a zone reset "
        "gives memory back; 0: only the daemon's budget limits it; changes at any time";
    return def;
}();

constexpr option_def k_ram_only_options[] = {k_ram_memory_limit, k_huge_pages_option};

template <size_t A, size_t B>
constexpr std::array<option_def, A + B> join(const option_def (&a)[A], const option_def (&b)[B])
{
    std::array<option_def, A + B> out{};
    std::copy(std::begin(a), std::end(a), out.begin());
    std::copy(std::begin(b), std::end(b), out.begin() + A);
    return out;
}

constexpr auto k_file_options = join(k_zone_options, k_file_only_options);
constexpr auto k_ram_options = join(k_zone_options, k_ram_only_options);

}  // namespace

std::span<const option_def> file_options()
{
    return k_file_options;
}

std::span<const option_def> ram_options()
{
    return k_ram_options;
}

result<zone_settings> parse_zone_settings(const option_set& o)
{
    zone_settings s;
    const uint64_t zone_mb = o.u64("zone_size_mb");
    if ((zone_mb & (zone_mb - 1)) != 0) {
        return make_error(EINVAL,
                          fmt::format("zone_size_mb={}: a power of two from 1 to 16384", zone_mb));
    }
    const uint64_t cap_mb = o.u64("zone_capacity_mb");
    if (cap_mb > zone_mb) {
        return make_error(
            EINVAL, fmt::format("zone_capacity_mb={}: at most zone_size_mb={}", cap_mb, zone_mb));
    }
    s.geo.zone_size = zone_mb << 20;
    s.geo.zone_capacity = cap_mb != 0 ? cap_mb << 20 : s.geo.zone_size;
    const uint64_t nr_zones = o.u64("capacity_mb") / zone_mb;
    if (nr_zones == 0 || nr_zones > UINT32_MAX) {
        return make_error(EINVAL, fmt::format("capacity_mb={}: room for 1 to {} zones of "
                                              "zone_size_mb={}",
                                              o.u64("capacity_mb"), UINT32_MAX, zone_mb));
    }
    s.geo.nr_zones = static_cast<uint32_t>(nr_zones);
    if (o.u64("conv_zones") >= nr_zones) {
        return make_error(EINVAL, fmt::format("conv_zones={}: fewer than the {} zones",
                                              o.u64("conv_zones"), nr_zones));
    }
    s.geo.conv_zones = static_cast<uint32_t>(o.u64("conv_zones"));
    s.zone_append = o.flag("zone_append");
    s.ordered_zone_append = o.flag("ordered_zone_append");
    if (s.ordered_zone_append && !s.zone_append) {
        return make_error(EINVAL, "ordered_zone_append=1: needs zone_append=1");
    }
    const uint64_t seq = nr_zones - s.geo.conv_zones;
    if (o.u64("max_open_zones") > seq || o.u64("max_active_zones") > seq) {
        return make_error(EINVAL,
                          fmt::format("max_open_zones={} max_active_zones={}: at most "
                                      "the {} sequential zones",
                                      o.u64("max_open_zones"), o.u64("max_active_zones"), seq));
    }
    s.max_open_zones = static_cast<uint32_t>(o.u64("max_open_zones"));
    s.max_active_zones = static_cast<uint32_t>(o.u64("max_active_zones"));
    s.queue_depth = static_cast<unsigned>(o.u64("queue_depth"));
    return s;
}

zone_engine_config engine_config(const zone_settings& s, uint32_t block_size)
{
    zone_engine_config zc;
    zc.flavor = zone_flavor::zloop;
    zc.capacity_bytes = uint64_t{s.geo.nr_zones} * s.geo.zone_size;
    zc.zone_size_bytes = s.geo.zone_size;
    zc.zone_capacity_bytes = s.geo.zone_capacity;
    zc.conventional_zones = s.geo.conv_zones;
    zc.max_open_zones = s.max_open_zones;
    zc.max_active_zones = s.max_active_zones;
    zc.block_size = block_size;
    // The data moves after the zone is let go (as zloop's worker moves it
    // after zloop_rw), for both stores.
    zc.lock_reads = false;
    return zc;
}

block_limits device_limits(const zone_engine& zones, uint32_t block_size, bool zone_append,
                           bool volatile_cache)
{
    block_limits l;
    l.capacity_bytes = zones.effective().capacity_bytes;
    l.logical_block_size = block_size;
    l.physical_block_size = block_size;
    l.max_transfer_bytes = k_max_transfer;
    l.volatile_write_cache = volatile_cache;
    l.fua = false;
    l.rotational = false;
    zones.apply_limits(l);
    l.max_zone_append_bytes = zone_append ? k_max_transfer : 0;
    return l;
}

unsigned submit_queues(const option_set& o)
{
    return static_cast<unsigned>(o.u64("nr_queues"));
}

unsigned queue_depth(const option_set& o)
{
    return static_cast<unsigned>(o.u64("queue_depth"));
}

void zloop_queue::note_result(const io_request& r, int result)
{
    if (result < 0 && (r.op == io_op::write || r.op == io_op::zone_append)) {
        const uint32_t zone = _zones.zone_index(r.offset);
        if (!_zones.conventional(zone)) {
            _zones.write_failed(zone);
        }
    }
}

// zloop_rw for writes: a sequential zone's write pointer is checked and
// advanced (the zone implicitly opened) before the data moves; a zone
// append gets its sector here, in submission order.
void zloop_queue::write(io_request& r)
{
    const uint32_t zone = _zones.zone_index(r.offset);
    if (_zones.conventional(zone)) {
        write_data(r, zone, r.offset - _zones.zone_start(zone));
        return;
    }
    zone_hold h;
    if (const int rc = _zones.begin_write(r, h); rc != 0) {
        complete_now(r, rc);
        return;
    }
    if (r.op == io_op::zone_append) {
        r.result_offset = h.offset;
    }
    _zones.end_write(h, r.length);
    zone_written(zone);
    write_data(r, zone, h.offset - _zones.zone_start(zone));
}

void zloop_queue::submit(io_request& r)
{
    switch (r.op) {
    case io_op::read: {
        zone_hold h;
        const int rc = _zones.begin_read(r, h);
        _zones.end_read(h);
        if (rc < 0) {
            complete_now(r, rc);
            return;
        }
        read_data(r, h.zone, r.offset - _zones.zone_start(h.zone));
        return;
    }
    case io_op::write:
    case io_op::zone_append:
        write(r);
        return;
    case io_op::flush:
        complete_now(r, flush());
        return;
    case io_op::zone_open:
    case io_op::zone_close:
    case io_op::zone_finish:
    case io_op::zone_reset:
    case io_op::zone_reset_all:
        complete_now(r, _zones.manage(r));
        return;
    case io_op::report_zones:
        complete_now(r, _zones.report(r));
        return;
    default:
        // discard and write zeroes: zloop has neither (the core refuses
        // them; here for a caller that skips its validation).
        complete_now(r, -EOPNOTSUPP);
        return;
    }
}

}  // namespace softblk::targets::zloop
