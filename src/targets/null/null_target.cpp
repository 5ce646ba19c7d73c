// The null target: null_blk in userspace. Without memory it completes every
// request at once and moves no data (the benchmark baseline); with
// memory_backed=1 it keeps the data in a sparse memory_store.
//
// This file is the template for a new target (docs/null.md): an option
// table, a target (geometry + queues), a target_queue (the hot path) and a
// static registration object. The folder builds an OBJECT library so the
// registration object is always linked in.
//
// The queue options (submit_queues, irqmode ...) belong to the core and the
// cross-cutting ones (mbps, cache_size, badblocks, timeout ...) to the
// decorators (src/core/decorators); this table holds what only null has.
//
// zoned=1 makes it null_blk's zoned device: the zone engine
// (include/softblk/zone_engine.hpp, null_blk flavour) keeps the zones, this
// target moves the data and applies bad blocks to writes itself, after the
// zone checks, as null_blk does.
//
// This file: the option table, power on (options to a device: clamps,
// zones, the kept data) and the registration; the device and its hot path
// are null_device.hpp.
#include "null_device.hpp"

#include <softblk/memory_store.hpp>
#include <softblk/target.hpp>
#include <softblk/zone_engine.hpp>

#include <cerrno>
#include <cstring>
#include <sys/uio.h>
#include <dirent.h>
#include <fmt/core.h>
#include <mutex>
#include <nlohmann/json.hpp>
#include <algorithm>
#include <array>
#include <set>

namespace softblk::targets {

namespace {

using namespace null_dev;

// size is in MiB and the capacity in bytes must fit 64 bits.
constexpr uint64_t k_max_size_mib = (uint64_t{1} << 44) - 1;
// max_transfer_bytes is 32 bits: the most sectors a request may carry.
constexpr uint64_t k_max_transfer_sectors = UINT32_MAX / 512;
// The block layer's default when a driver gives none (BLK_SAFE_MAX_SECTORS).
constexpr uint32_t k_safe_max_sectors = 255;
// Logical block sizes the block layer accepts since Linux 6.15
// (BLK_MAX_BLOCK_SIZE); 6.12 stops at the page size.
constexpr uint64_t k_max_block_size = 65536;
// NUMA_NO_NODE as the unsigned configfs attribute shows it.
constexpr uint64_t k_no_node = 0xffffffff;

// Names, units and defaults are null_blk's configfs attributes (Linux 6.12,
// drivers/block/null_blk/main.c), parsed as configfs parses them; what
// applies at power on is in power_on_null. docs/null.md has the table.
constexpr option_def k_null_options[] = {
    {.name = "size",
     .kind = option_kind::integer,
     .default_value = "256000",
     .unit = "MiB",
     .help = "device size (null_blk's default: gb=250, i.e. 256000 MiB); 0 makes an empty disk",
     .min = 0,
     .max = k_max_size_mib},
    {.name = "gb",
     .kind = option_kind::integer,
     .default_value = "250",
     .unit = "GiB",
     .help = "module parameter: the size when size is not given (size = gb * 1024 MiB)",
     .min = 0,
     .max = k_max_size_mib / 1024,
     .bits = 32,
     .update = option_update::creation},
    {.name = "blocksize",
     .kind = option_kind::integer,
     .default_value = "512",
     .unit = "bytes",
     .help = "logical and physical block size: a power of two from 512 to 65536 (Linux 6.15+; "
             "6.12 and the ublk export stop at 4096)",
     .alias = "bs",
     .bits = 32},
    {.name = "max_sectors",
     .kind = option_kind::integer,
     .default_value = "0",
     .unit = "512-byte sectors",
     .help =
         "largest request; 0: the block layer's default of 255 sectors; else at least 8 and one "
         "block; rounded down to whole blocks",
     .bits = 32},
    {.name = "memory_backed",
     .kind = option_kind::boolean,
     .default_value = "0",
     .unit = "",
     .help = "keep written data in RAM (sparse: RAM grows with the data written; kept across "
             "power cycles)"},
    k_memory_limit_option,
    k_huge_pages_option,
    {.name = "discard",
     .kind = option_kind::boolean,
     .default_value = "0",
     .unit = "",
     .help = "support discard, which frees the blocks' memory (ignored, and reset to 0, without "
             "memory_backed=1)"},
    {.name = "rotational",
     .kind = option_kind::boolean,
     .default_value = "0",
     .unit = "",
     .help = "report the device as rotational (newer kernels; not in 6.12)"},
    {.name = "virt_boundary",
     .kind = option_kind::boolean,
     .default_value = "0",
     .unit = "",
     .help = "require request buffers not to cross 4 KiB boundaries inside (virt_boundary_mask)"},
    {.name = "home_node",
     .kind = option_kind::integer,
     .default_value = "4294967295",
     .unit = "NUMA node",
     .help = "NUMA node of the data pages (mbind MPOL_PREFERRED); 4294967295 (NUMA_NO_NODE): no "
             "preference; a node this machine lacks is ignored at power on",
     .bits = 32},
    {.name = "use_per_node_hctx",
     .kind = option_kind::boolean,
     .default_value = "0",
     .unit = "",
     .help = "one submission queue per NUMA node: submit_queues becomes the number of online nodes "
             "(as null_blk)"},
    {.name = "queue_mode",
     .kind = option_kind::integer,
     .default_value = "2",
     .unit = "",
     .help = "2 multi-queue; 0 (bio) becomes 2 at power on; 1 (legacy request queue) fails "
             "there, as in null_blk",
     .bits = 32},
    {.name = "index",
     .kind = option_kind::integer,
     .default_value = "0",
     .unit = "",
     .help = "device index: the lowest free one is assigned at power on (a value written is "
             "ignored, as in null_blk)",
     .bits = 32},
    // The zoned model (null_blk's zoned.c); units are null_blk's.
    {.name = "zoned",
     .kind = option_kind::boolean,
     .default_value = "0",
     .unit = "",
     .help = "a host-managed zoned device (null_blk's zoned model)"},
    {.name = "zone_size",
     .kind = option_kind::integer,
     .default_value = "256",
     .unit = "MiB",
     .help = "zone size, a power of two at most the device size (checked at power on with "
             "zoned=1)"},
    {.name = "zone_capacity",
     .kind = option_kind::integer,
     .default_value = "0",
     .unit = "MiB",
     .help = "writable MiB of each sequential zone, at most zone_size; 0 becomes zone_size at "
             "power on"},
    {.name = "zone_nr_conv",
     .kind = option_kind::integer,
     .default_value = "0",
     .unit = "zones",
     .help = "conventional zones at the start (clamped to zones - 1, as null_blk does)",
     .bits = 32},
    {.name = "zone_max_open",
     .kind = option_kind::integer,
     .default_value = "0",
     .unit = "zones",
     .help = "most open zones; 0 or >= the sequential zones: no limit; at most zone_max_active",
     .bits = 32},
    {.name = "zone_max_active",
     .kind = option_kind::integer,
     .default_value = "0",
     .unit = "zones",
     .help = "most active (open or closed) zones; 0 or >= the sequential zones: no limit",
     .bits = 32},
    {.name = "zone_append_max_sectors",
     .kind = option_kind::integer,
     .default_value = "2147483647",
     .unit = "512-byte sectors",
     .help = "largest zone append, rounded down to whole blocks and to the zone capacity; 0: "
             "no zone append (the kernel emulates it)",
     .bits = 32},
    // Write-only, only while powered on (zone_cond_store): a sector whose
    // sequential zone becomes read-only / offline (again: empty).
    {.name = "zone_readonly",
     .kind = option_kind::text,
     .unit = "sector",
     .help = "write a sector: its sequential zone becomes read-only (written again: empty); "
             "zoned=1, powered on",
     .update = option_update::powered_on,
     .write_only = true},
    {.name = "zone_offline",
     .kind = option_kind::text,
     .unit = "sector",
     .help = "write a sector: its sequential zone goes offline (written again: empty); zoned=1, "
             "powered on",
     .update = option_update::powered_on,
     .write_only = true},
    {.name = "zone_full",
     .kind = option_kind::boolean,
     .default_value = "0",
     .unit = "",
     .help = "sequential zones start full"},
};

unsigned online_numa_nodes()
{
    unsigned count = 0;
    if (DIR* d = opendir("/sys/devices/system/node")) {
        while (dirent* e = readdir(d)) {
            if (std::strncmp(e->d_name, "node", 4) == 0 && e->d_name[4] >= '0' &&
                e->d_name[4] <= '9') {
                ++count;
            }
        }
        closedir(d);
    }
    return count == 0 ? 1 : count;
}
// null_init_zoned_dev (Linux 6.12): the checks, clamps and limits of a
// zoned null device. Each clamp adds a line to `notes`, as null_blk logs
// one (docs/null.md promises a note for every clamped value).
result<void> make_zoned(null_target& t, option_set& o, uint64_t size_mib, uint64_t bs,
                        std::vector<std::string>& notes)
{
    const uint64_t zone_mib = o.u64("zone_size");
    if (zone_mib == 0 || (zone_mib & (zone_mib - 1)) != 0) {
        return make_error(
            EINVAL, fmt::format("zone_size={}: zone_size must be a power of two (MiB)", zone_mib));
    }
    if (zone_mib > size_mib) {
        return make_error(EINVAL, fmt::format("zone_size={}: larger than the device (size={} MiB)",
                                              zone_mib, size_mib));
    }
    // The clamps below are written back, as null_init_zoned_dev writes the
    // device's fields (a read after power on shows them).
    if (o.u64("zone_capacity") == 0) {
        o.set_u64("zone_capacity", zone_mib);
    }
    const uint64_t cap_mib = o.u64("zone_capacity");
    if (cap_mib > zone_mib) {
        return make_error(EINVAL, fmt::format("zone_capacity={}: larger than zone_size={} (MiB)",
                                              cap_mib, zone_mib));
    }
    if (cap_mib != zone_mib && size_mib % zone_mib != 0) {
        return make_error(EINVAL,
                          fmt::format("zone_capacity={} with size={}: a smaller last zone is not "
                                      "allowed with a zone capacity below zone_size={} (as in "
                                      "null_blk: no real device looks like that)",
                                      cap_mib, size_mib, zone_mib));
    }
    const uint64_t nr_zones = (size_mib + zone_mib - 1) / zone_mib;
    if (o.u64("zone_nr_conv") >= nr_zones) {
        notes.push_back(
            fmt::format("zone_nr_conv={} clamped to {} (the device has {} zones, one "
                        "of them at least sequential, as null_blk)",
                        o.u64("zone_nr_conv"), nr_zones - 1, nr_zones));
        o.set_u64("zone_nr_conv", nr_zones - 1);
    }
    const uint64_t nr_conv = o.u64("zone_nr_conv");
    // zone_append_max_sectors: whole blocks, at most the zone capacity.
    const uint64_t block_sectors = bs / 512;
    uint64_t append_sectors = o.u64("zone_append_max_sectors");
    append_sectors -= append_sectors % block_sectors;
    append_sectors = std::min(append_sectors, cap_mib * k_mib / 512);
    // The default (UINT_MAX-like) is always cut down: a note only for a
    // value the user gave.
    if (o.given("zone_append_max_sectors") && append_sectors != o.u64("zone_append_max_sectors")) {
        notes.push_back(
            fmt::format("zone_append_max_sectors={} clamped to {} (whole blocks of {} "
                        "bytes, at most the zone capacity)",
                        o.u64("zone_append_max_sectors"), append_sectors, bs));
    }
    o.set_u64("zone_append_max_sectors", append_sectors);
    // The open and active limits: at most the sequential zones (else none),
    // open at most active.
    const uint64_t sequential = nr_zones - nr_conv;
    if (o.u64("zone_max_active") >= sequential) {
        if (o.u64("zone_max_active") != 0) {
            notes.push_back(
                fmt::format("zone_max_active={} clamped to 0 (no limit): at or above "
                            "the {} sequential zones, as null_blk",
                            o.u64("zone_max_active"), sequential));
        }
        o.set_u64("zone_max_active", 0);
    }
    const uint64_t max_active = o.u64("zone_max_active");
    if (max_active != 0 && o.u64("zone_max_open") > max_active) {
        notes.push_back(
            fmt::format("zone_max_open={} clamped to {} (at most zone_max_active, as "
                        "null_blk)",
                        o.u64("zone_max_open"), max_active));
        o.set_u64("zone_max_open", max_active);
    } else if (o.u64("zone_max_open") >= sequential) {
        if (o.u64("zone_max_open") != 0) {
            notes.push_back(
                fmt::format("zone_max_open={} clamped to 0 (no limit): at or above "
                            "the {} sequential zones, as null_blk",
                            o.u64("zone_max_open"), sequential));
        }
        o.set_u64("zone_max_open", 0);
    }
    zone_engine_config c;
    c.flavor = zone_flavor::null_blk;
    c.capacity_bytes = size_mib * k_mib;
    c.zone_size_bytes = zone_mib * k_mib;
    c.zone_capacity_bytes = cap_mib * k_mib;
    c.conventional_zones = static_cast<uint32_t>(nr_conv);
    c.max_open_zones = static_cast<uint32_t>(o.u64("zone_max_open"));
    c.max_active_zones = static_cast<uint32_t>(o.u64("zone_max_active"));
    c.block_size = static_cast<uint32_t>(bs);
    c.start_full = o.flag("zone_full");
    c.lock_reads = true;
    // The block layer bounds it by the largest request too
    // (blk_validate_zoned_limits: max_hw_sectors).
    const uint64_t append_bytes =
        std::min<uint64_t>(append_sectors * 512, t.limits().max_transfer_bytes);
    return t.make_zoned(c, static_cast<uint32_t>(append_bytes));
}

// Copies every allocated block of `from` into `to` (a store of another
// block granularity, size or NUMA node), whole blocks of `to` at a time
// (holes inside one read as zeros and are stored as such). Control thread.
result<void> move_data(const memory_store& from, memory_store& to)
{
    std::vector<extent> map;
    from.map_extents(0, from.capacity_bytes(), map);
    const uint64_t g = to.block_size();
    std::vector<char> buffer(1 << 20);
    for (const extent& e : map) {
        if (!e.allocated) {
            continue;
        }
        uint64_t pos = e.offset / g * g;
        const uint64_t end = std::min((e.offset + e.length + g - 1) / g * g, to.capacity_bytes());
        while (pos < end) {
            const uint64_t n = std::min<uint64_t>(buffer.size(), end - pos);
            const uint64_t readable =
                pos < from.capacity_bytes() ? std::min(n, from.capacity_bytes() - pos) : 0;
            std::fill(buffer.begin(), buffer.begin() + static_cast<ptrdiff_t>(n), 0);
            if (readable > 0) {
                from.read(pos, buffer.data(), readable);
            }
            if (const int rc = to.write(pos, buffer.data(), n); rc < 0) {
                return make_error(-rc, fmt::format("not enough memory to move the device's data "
                                                   "to its new geometry ({})",
                                                   std::strerror(-rc)));
            }
            pos += n;
        }
    }
    return {};
}

// The store for `capacity` bytes at `granularity` on `node`, reusing the
// one kept from the previous power on (or moving its data to a new one
// when the block size grows past it, the device outgrows it or the node
// changes). A store larger than the device keeps the data past its end, as
// null_blk does when `size` shrinks. Control thread.
result<void> prepare_store(null_data& data, uint64_t capacity, uint32_t granularity, int node,
                           uint64_t limit_bytes, huge_page_mode huge_pages)
{
    memory_store* old = data.store.get();
    if (old != nullptr && old->block_size() == granularity && old->capacity_bytes() >= capacity &&
        data.numa_node == node) {
        old->set_limit(limit_bytes);
        old->set_huge_pages(huge_pages);
        return {};
    }
    auto fresh = memory_store::create(
        {.capacity_bytes = old != nullptr ? std::max(capacity, old->capacity_bytes()) : capacity,
         .block_size = granularity,
         .numa_node = node,
         .limit_bytes = limit_bytes,
         .huge_pages = huge_pages});
    if (old != nullptr) {
        if (auto r = move_data(*old, *fresh); !r) {
            return r;
        }
    }
    data.store = std::move(fresh);
    data.numa_node = node;
    return {};
}

// null_validate_conf's first check, made before any value is clamped.
result<void> refuse_legacy_queue_mode(const option_set& o)
{
    if (o.u64("queue_mode") == 1) {
        return make_error(EINVAL,
                          "queue_mode=1: the legacy request path is no longer available (as in "
                          "null_blk); use queue_mode=2");
    }
    return {};
}

// null_blk's power on: null_validate_conf, null_config_discard and the
// block layer's checks of null_add_dev, on the device's attributes.
result<std::unique_ptr<target>> power_on_null(option_set& o, std::shared_ptr<target_data>& kept,
                                              std::vector<std::string>& notes)
{
    // The module parameter gb is the default of size.
    if (!o.given("size") && o.given("gb")) {
        o.set_u64("size", o.u64("gb") * 1024);
    }
    const uint64_t size_mib = o.u64("size");

    // (queue_mode=1 was refused before any clamp: refuse_legacy_queue_mode.)
    if (o.u64("queue_mode") == 0) {
        notes.emplace_back(
            "queue_mode=0: the bio-based path is no longer available, using "
            "blk-mq instead (queue_mode=2)");
        o.set_u64("queue_mode", 2);
    } else if (o.u64("queue_mode") > 2) {
        notes.push_back(
            fmt::format("queue_mode={} is no mode; multi-queue as always (null_blk "
                        "ignores it too)",
                        o.u64("queue_mode")));
    }

    const bool memory_backed = o.flag("memory_backed");
    if (memory_backed) {
        o.set_flag("blocking", true);  // null_blk: memory allocation may sleep
    } else if (o.u64("cache_size") != 0) {
        notes.push_back(
            fmt::format("cache_size={} ignored: the cache needs memory_backed=1 (set "
                        "to 0, as null_blk does)",
                        o.u64("cache_size")));
        o.set_u64("cache_size", 0);
    }
    // null_config_discard.
    bool discard = o.flag("discard");
    if (discard && (!memory_backed || o.flag("zoned"))) {
        notes.emplace_back(memory_backed ? "discard=1 ignored in zoned mode (set to 0, as null_blk "
                                           "does)"
                                         : "discard=1 ignored without memory backing (set to 0, "
                                           "as null_blk does)");
        o.set_flag("discard", false);
        discard = false;
    }

    // The block layer (blk_validate_limits): 0 means 512 (the attribute
    // keeps 0).
    const uint64_t bs = o.u64("blocksize") == 0 ? 512 : o.u64("blocksize");
    if (bs < 512 || bs > k_max_block_size || (bs & (bs - 1)) != 0) {
        return make_error(EINVAL,
                          fmt::format("blocksize={}: the block size must be a power of two from "
                                      "512 to {} bytes (Linux 6.15+; 6.12 allows up to 4096)",
                                      bs, k_max_block_size));
    }
    uint64_t max_sectors = o.u64("max_sectors");
    if (max_sectors == 0) {
        max_sectors = k_safe_max_sectors;
    } else if (max_sectors < 8) {
        return make_error(EINVAL,
                          fmt::format("max_sectors={}: max_sectors must be 0 (the default, 255) "
                                      "or at least 8 sectors (one 4 KiB page)",
                                      max_sectors));
    }
    if (max_sectors < bs / 512) {
        return make_error(EINVAL, fmt::format("max_sectors={}: smaller than one block of {} bytes",
                                              max_sectors, bs));
    }
    // Rounded down to whole blocks, as the block layer does; longer than 4
    // GiB cannot be carried (max_transfer_bytes is 32 bits).
    max_sectors = std::min(max_sectors, k_max_transfer_sectors);
    max_sectors -= max_sectors % (bs / 512);

    const uint64_t memory_limit_mib = o.u64("memory_limit");
    if (memory_limit_mib != 0 && !memory_backed) {
        return make_error(
            EINVAL, fmt::format("memory_limit={}: memory_limit needs memory_backed=1 (without "
                                "it the device keeps no data and uses no memory)",
                                memory_limit_mib));
    }

    int home_node = -1;
    if (const uint64_t node = o.u64("home_node"); node != k_no_node) {
        const unsigned nodes = online_numa_nodes();
        if (node >= nodes) {
            notes.push_back(fmt::format("home_node={} ignored: this machine has {} NUMA node{}",
                                        node, nodes, nodes == 1 ? "" : "s"));
        } else {
            home_node = static_cast<int>(node);
        }
    }

    auto data = std::dynamic_pointer_cast<null_data>(kept);
    if (!data) {
        data = std::make_shared<null_data>();
        kept = data;
    }
    if (memory_backed) {
        const uint32_t granularity = static_cast<uint32_t>(std::min<uint64_t>(bs, 4096));
        if (auto r = prepare_store(*data, size_mib * k_mib, granularity, home_node,
                                   memory_limit_mib * k_mib,
                                   *parse_huge_page_mode(o.text("huge_pages")));
            !r) {
            return std::unexpected(r.error());
        }
    } else if (o.given("huge_pages")) {
        notes.push_back(
            fmt::format("huge_pages={} ignored: without memory_backed=1 the device "
                        "keeps no data",
                        o.text("huge_pages")));
    }

    const int index = indexes().take();
    if (o.given("index") && o.u64("index") != static_cast<uint64_t>(index)) {
        notes.push_back(
            fmt::format("index={} ignored: the device has index {}, the lowest free "
                        "one (as null_blk assigns it)",
                        o.u64("index"), index));
    }
    o.set_u64("index", static_cast<uint64_t>(index), false);

    block_limits lim;
    lim.capacity_bytes = size_mib * k_mib;
    lim.logical_block_size = static_cast<uint32_t>(bs);
    lim.physical_block_size = static_cast<uint32_t>(bs);
    lim.max_transfer_bytes = static_cast<uint32_t>(max_sectors * 512);
    // null_blk: max_hw_discard_sectors = UINT_MAX >> 9.
    lim.max_discard_bytes = discard ? (UINT32_MAX >> 9) << 9 : 0;
    lim.max_discard_bytes -= lim.max_discard_bytes % static_cast<uint32_t>(bs);
    lim.max_write_zeroes_bytes = 0;
    lim.virt_boundary_bytes = o.flag("virt_boundary") ? 4096 : 0;
    lim.rotational = o.flag("rotational");
    // volatile_write_cache and fua are the cache decorator's (cache_size).
    lim.volatile_write_cache = false;
    lim.fua = false;
    auto t = std::make_unique<null_target>(lim, memory_backed ? data : nullptr, discard, home_node,
                                           index, o.flag("no_sched"), o.flag("use_per_node_hctx"));
    if (o.flag("zoned")) {
        if (auto r = make_zoned(*t, o, size_mib, bs, notes); !r) {
            return std::unexpected(r.error());
        }
    } else {
        for (const char* name : {"zone_size", "zone_capacity", "zone_nr_conv", "zone_max_open",
                                 "zone_max_active", "zone_append_max_sectors", "zone_full"}) {
            if (o.given(name)) {
                notes.push_back(
                    fmt::format("{}={} ignored: the device is not zoned (zoned=0), as "
                                "null_blk ignores it",
                                name, o.value_text(name)));
            }
        }
    }
    return t;
}

// For callers of target_type::create: a power on with nothing kept.
result<std::unique_ptr<target>> create_null(const option_set& options)
{
    if (auto r = refuse_legacy_queue_mode(options); !r) {
        return std::unexpected(r.error());
    }
    option_set o = options;
    std::shared_ptr<target_data> kept;
    std::vector<std::string> notes;
    return power_on_null(o, kept, notes);
}

[[maybe_unused]] const bool k_registered = register_target_type(target_type{
    .name = "null",
    .description =
        "null_blk in userspace: completes at once, or keeps data in RAM (memory_backed=1)",
    .options = k_null_options,
    .create = create_null,
    // null_blk (null_validate_conf): use_per_node_hctx forces submit_queues
    // to the number of online NUMA nodes, whatever was given.
    .submit_queues =
        [](const option_set& o) { return o.flag("use_per_node_hctx") ? online_numa_nodes() : 0u; },
    .refuse_before_clamps = refuse_legacy_queue_mode,
    .power_on = power_on_null,
});

}  // namespace

}  // namespace softblk::targets
