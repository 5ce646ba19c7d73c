// The zone engine (include/softblk/zone_engine.hpp): what both zone models
// share: the geometry and its checks, the zone descriptors, restoring
// zones, the common steps of the hot path, report and describe. The models
// themselves (every transition and the open/active limits, as each kernel
// driver has them) are src/core/zone_null_blk.cpp and zone_zloop.cpp.
#include <softblk/zone_engine.hpp>

#include <bit>
#include <cerrno>
#include <new>
#include <string>
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "zone_models.hpp"

namespace softblk {

const char* to_string(zone_flavor flavor)
{
    return flavor == zone_flavor::null_blk ? "null_blk" : "zloop";
}

zone_engine::zone_engine(const zone_engine_config& config, zone_backend* backend)
    : _cfg(config), _backend(backend)
{
}

zone_engine::~zone_engine() = default;

result<std::unique_ptr<zone_engine>> zone_engine::create(const zone_engine_config& config,
                                                         zone_backend* backend)
{
    zone_engine_config c = config;
    const uint32_t bs = c.block_size;
    if (bs < 512 || !std::has_single_bit(bs)) {
        return make_error(EINVAL, fmt::format("block size {}: a power of two from 512", bs));
    }
    if (c.zone_size_bytes == 0 || !std::has_single_bit(c.zone_size_bytes) ||
        c.zone_size_bytes < bs) {
        return make_error(EINVAL,
                          fmt::format("zone size {} bytes: must be a power of two of at least one "
                                      "block ({} bytes)",
                                      c.zone_size_bytes, bs));
    }
    if (c.capacity_bytes < c.zone_size_bytes || c.capacity_bytes % bs != 0) {
        return make_error(EINVAL,
                          fmt::format("capacity {} bytes: must be whole blocks of {} bytes and at "
                                      "least one zone ({} bytes)",
                                      c.capacity_bytes, bs, c.zone_size_bytes));
    }
    if (c.zone_capacity_bytes == 0) {
        c.zone_capacity_bytes = c.zone_size_bytes;
    }
    if (c.zone_capacity_bytes > c.zone_size_bytes || c.zone_capacity_bytes % bs != 0) {
        return make_error(EINVAL,
                          fmt::format("zone capacity {} bytes: must be whole blocks of {} bytes "
                                      "and at most the zone size ({} bytes)",
                                      c.zone_capacity_bytes, bs, c.zone_size_bytes));
    }
    const uint64_t zones = (c.capacity_bytes + c.zone_size_bytes - 1) / c.zone_size_bytes;
    if (zones > UINT32_MAX - 1) {
        return make_error(EINVAL, fmt::format("{} zones: at most {}", zones, UINT32_MAX - 1));
    }
    const auto nr_zones = static_cast<uint32_t>(zones);
    if (c.conventional_zones >= nr_zones) {
        return make_error(EINVAL,
                          fmt::format("{} conventional zones: at most {} (the device has {} zones "
                                      "and needs one sequential zone)",
                                      c.conventional_zones, nr_zones - 1, nr_zones));
    }
    const uint32_t nr_seq = nr_zones - c.conventional_zones;
    // The one place the flavour is looked at: the model is a type.
    const bool null_blk = c.flavor == zone_flavor::null_blk;
    if (auto settled = null_blk ? null_blk_zones::settle_limits(c, nr_seq)
                                : zloop_zones::settle_limits(c, nr_seq);
        !settled) {
        return std::unexpected(std::move(settled.error()));
    }

    std::unique_ptr<zone_engine> e;
    if (null_blk) {
        e.reset(new null_blk_zones(c, backend));
    } else {
        e.reset(new zloop_zones(c, backend));
    }
    e->_zone_shift = static_cast<unsigned>(std::countr_zero(c.zone_size_bytes));
    e->_nr_zones = nr_zones;
    e->_last_zone_length = c.capacity_bytes - (uint64_t{nr_zones - 1} << e->_zone_shift);
    e->_need_res_mgmt = c.max_open_zones != 0 || c.max_active_zones != 0;
    // Charged before they exist: a geometry whose descriptors the budget
    // cannot hold (null_blk allows 2^32 - 2 zones, 256 GiB of them) is
    // refused, not allocated (or thrown as std::bad_alloc).
    const uint64_t bytes = uint64_t{nr_zones} * sizeof(zone);
    const std::string what = fmt::format("{} zone descriptors", nr_zones);
    auto charge =
        memory_charge::take(c.budget != nullptr ? *c.budget : process_memory_budget(), bytes, what);
    if (!charge) {
        error err = charge.error();
        err.message += "; fewer, larger zones need less";
        return std::unexpected(std::move(err));
    }
    e->_charge = std::move(*charge);
    e->_zones.reset(new (std::nothrow) zone[nr_zones]);
    if (!e->_zones) {
        return std::unexpected(out_of_memory(what, bytes));
    }
    for (uint32_t i = 0; i < nr_zones; ++i) {
        zone& z = e->_zones[i];
        const uint64_t start = e->zone_start(i);
        if (i < c.conventional_zones) {
            z.cond.store(zone_condition::not_write_pointer, std::memory_order_relaxed);
            z.wp.store(e->full_write_pointer(start + e->zone_length(i)), std::memory_order_relaxed);
        } else if (c.start_full) {
            z.cond.store(zone_condition::full, std::memory_order_relaxed);
            z.wp.store(e->full_write_pointer(start + e->zone_capacity(i)),
                       std::memory_order_relaxed);
        } else {
            z.wp.store(start, std::memory_order_relaxed);
        }
    }
    return e;
}

uint64_t zone_engine::zone_length(uint32_t index) const
{
    return index + 1 == _nr_zones ? _last_zone_length : _cfg.zone_size_bytes;
}

uint64_t zone_engine::zone_capacity(uint32_t index) const
{
    if (conventional(index)) {
        return zone_length(index);
    }
    return std::min(zone_length(index), _cfg.zone_capacity_bytes);
}

void zone_engine::apply_limits(block_limits& l) const
{
    l.zoned = true;
    l.zone_size_bytes = _cfg.zone_size_bytes;
    l.zone_capacity_bytes = _cfg.zone_capacity_bytes;
    l.conventional_zones = _cfg.conventional_zones;
    l.max_open_zones = _cfg.max_open_zones;
    l.max_active_zones = _cfg.max_active_zones;
}

void zone_engine::lock_zone(zone& z) const
{
    if (!z.lock.try_lock()) {
        _contended.fetch_add(1, std::memory_order_relaxed);
        z.lock.lock();
    }
}

// The counters' lock when a limit is set (nothing otherwise: without
// limits no zone changes another, so the zone's own lock is enough). A
// zone's condition is read again under it before any decision that moves
// counters, because an implicit close changes other zones under this lock
// only.
std::unique_lock<std::mutex> zone_engine::resources() const
{
    if (!_need_res_mgmt) {
        return {};
    }
    std::unique_lock guard(_res_lock, std::try_to_lock);
    if (!guard.owns_lock()) {
        _contended.fetch_add(1, std::memory_order_relaxed);
        guard.lock();
    }
    return guard;
}

result<void> zone_engine::restore_zone(uint32_t index, uint64_t stored)
{
    if (index >= _nr_zones || conventional(index)) {
        return make_error(EINVAL, fmt::format("zone {}: not a sequential zone", index));
    }
    const uint64_t cap = zone_capacity(index);
    if (stored > cap) {
        return make_error(EINVAL, fmt::format("zone {} holds {} bytes, more than its capacity "
                                              "({} bytes)",
                                              index, stored, cap));
    }
    if (stored % _cfg.block_size != 0) {
        return make_error(EINVAL,
                          fmt::format("zone {} holds {} bytes, not whole blocks of {} bytes", index,
                                      stored, _cfg.block_size));
    }
    zone& z = _zones[index];
    std::lock_guard zone_guard(z.lock);
    std::lock_guard res_guard(_res_lock);
    const zone_condition before = z.cond.load(std::memory_order_relaxed);
    if (is_open(before) || before == zone_condition::read_only ||
        before == zone_condition::offline) {
        return make_error(EBUSY, fmt::format("zone {}: restored after I/O began", index));
    }
    if (before == zone_condition::closed && _need_res_mgmt) {
        --_nr_closed;
    }
    const uint64_t start = zone_start(index);
    if (stored == 0) {
        z.cond.store(zone_condition::empty, std::memory_order_relaxed);
        z.wp.store(start, std::memory_order_relaxed);
    } else if (stored == cap) {
        z.cond.store(zone_condition::full, std::memory_order_relaxed);
        z.wp.store(full_write_pointer(start + cap), std::memory_order_relaxed);
    } else {
        z.cond.store(zone_condition::closed, std::memory_order_relaxed);
        z.wp.store(start + stored, std::memory_order_relaxed);
        if (_need_res_mgmt) {
            ++_nr_closed;
        }
    }
    return {};
}

// Read by the zloop model only (null_blk never re-reads a zone).
void zone_engine::write_failed(uint32_t index)
{
    if (index < _nr_zones && !conventional(index)) {
        _zones[index].failed.store(true, std::memory_order_relaxed);
    }
}

// ---------------------------------------------------------------- hot path

int zone_engine::begin_write(const io_request& r, zone_hold& h)
{
    const uint32_t index = zone_index(r.offset);
    if (index >= _nr_zones) {
        return -EIO;
    }
    h.zone = index;
    h.offset = r.offset;
    h.locked = false;
    h.sequential = !conventional(index);
    if (!h.sequential) {
        // Conventional zones take writes anywhere and no zone append.
        return r.op == io_op::zone_append ? -EIO : 0;
    }
    zone& z = _zones[index];
    const uint64_t start = zone_start(index);
    const uint64_t zone_end = start + zone_capacity(index);
    lock_zone(z);
    const int rc = begin_zone_write(z, index, r, h, zone_end);
    if (rc != 0) {
        z.lock.unlock();
        return rc;
    }
    h.locked = true;
    return 0;
}

void zone_engine::end_write(zone_hold& h, uint64_t bytes_written)
{
    if (!h.locked) {
        return;
    }
    zone& z = _zones[h.zone];
    h.locked = false;
    if (bytes_written == 0) {
        z.lock.unlock();
        return;
    }
    const uint64_t start = zone_start(h.zone);
    const uint64_t wp = h.offset + bytes_written;
    const bool full = wp == start + zone_capacity(h.zone);
    z.wp.store(wp, std::memory_order_relaxed);
    end_zone_write(z, h, full);
}

int zone_engine::begin_read(const io_request& r, zone_hold& h)
{
    const uint32_t index = zone_index(r.offset);
    if (index >= _nr_zones) {
        return -EIO;
    }
    h.zone = index;
    h.offset = r.offset;
    h.locked = false;
    h.sequential = !conventional(index);
    return begin_zone_read(_zones[index], index, r, h);
}

void zone_engine::end_read(zone_hold& h)
{
    if (h.locked) {
        h.locked = false;
        _zones[h.zone].lock.unlock();
    }
}

int zone_engine::manage(const io_request& r)
{
    if (r.op == io_op::zone_reset_all) {
        // Every sequential zone in turn, each under its own lock.
        for (uint32_t i = _cfg.conventional_zones; i < _nr_zones; ++i) {
            zone& z = _zones[i];
            lock_zone(z);
            const int rc = reset_one_of_all(i);
            z.lock.unlock();
            if (rc != 0) {
                return rc;
            }
        }
        return 0;
    }
    const uint32_t index = zone_index(r.offset);
    if (index >= _nr_zones) {
        return -EIO;
    }
    zone& z = _zones[index];
    lock_zone(z);
    const int rc = manage_zone(r.op, index);
    z.lock.unlock();
    return rc;
}

// ---------------------------------------------------------------- report

void zone_engine::fill(uint32_t index, zone_descriptor& d) const
{
    const zone& z = _zones[index];
    d.start = zone_start(index);
    d.length = zone_length(index);
    d.capacity = zone_capacity(index);
    d.write_pointer = z.wp.load(std::memory_order_relaxed);
    d.condition = z.cond.load(std::memory_order_relaxed);
    d.type = conventional(index) ? zone_type::conventional : zone_type::sequential_write_required;
}

uint32_t zone_engine::report(uint32_t first, zone_descriptor* out, uint32_t count)
{
    uint32_t n = 0;
    for (uint32_t i = first; i < _nr_zones && n < count; ++i, ++n) {
        zone& z = _zones[i];
        lock_zone(z);
        before_report(i);
        fill(i, out[n]);
        z.lock.unlock();
    }
    return n;
}

int zone_engine::report(const io_request& r)
{
    const uint32_t first = zone_index(r.offset);
    if (first >= _nr_zones) {
        return 0;
    }
    return static_cast<int>(
        report(first, static_cast<zone_descriptor*>(r.buffer), r.report_capacity));
}

// ---------------------------------------------------------------- control

result<void> zone_engine::set_condition(uint64_t offset, zone_condition condition)
{
    if (condition != zone_condition::read_only && condition != zone_condition::offline) {
        return make_error(EINVAL, fmt::format("condition {}: only read_only or offline can be set",
                                              to_string(condition)));
    }
    const char* attr = condition == zone_condition::read_only ? "zone_readonly" : "zone_offline";
    return change_condition(offset, condition, attr);
}

zone_engine_stats zone_engine::stats() const
{
    return zone_engine_stats{
        .implicit_closes = _implicit_closes.load(std::memory_order_relaxed),
        .open_refused = _open_refused.load(std::memory_order_relaxed),
        .active_refused = _active_refused.load(std::memory_order_relaxed),
        .lock_contended = _contended.load(std::memory_order_relaxed),
        .refreshed = _refreshed.load(std::memory_order_relaxed),
    };
}

void zone_engine::describe(nlohmann::json& out) const
{
    uint32_t counts[16] = {};
    for (uint32_t i = 0; i < _nr_zones; ++i) {
        ++counts[static_cast<uint8_t>(_zones[i].cond.load(std::memory_order_relaxed)) & 0xf];
    }
    const zone_engine_stats s = stats();
    out["zones"] = {
        {"model", to_string(_cfg.flavor)},
        {"count", _nr_zones},
        {"conventional", _cfg.conventional_zones},
        {"zone_size_bytes", _cfg.zone_size_bytes},
        {"zone_capacity_bytes", _cfg.zone_capacity_bytes},
        {"max_open", _cfg.max_open_zones},
        {"max_active", _cfg.max_active_zones},
        {"empty", counts[static_cast<uint8_t>(zone_condition::empty)]},
        {"implicit_open", counts[static_cast<uint8_t>(zone_condition::implicit_open)]},
        {"explicit_open", counts[static_cast<uint8_t>(zone_condition::explicit_open)]},
        {"closed", counts[static_cast<uint8_t>(zone_condition::closed)]},
        {"full", counts[static_cast<uint8_t>(zone_condition::full)]},
        {"read_only", counts[static_cast<uint8_t>(zone_condition::read_only)]},
        {"offline", counts[static_cast<uint8_t>(zone_condition::offline)]},
        {"implicit_closes", s.implicit_closes},
        {"open_refused", s.open_refused},
        {"active_refused", s.active_refused},
        {"lock_contended", s.lock_contended},
        {"refreshed", s.refreshed},
        {"memory_bytes", memory_bytes()},
    };
}

}  // namespace softblk