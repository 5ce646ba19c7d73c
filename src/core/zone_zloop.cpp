// The zloop zone model (src/core/zone_models.hpp): drivers/block/zloop.c,
// keeping its counters in one transition function (mark_full, mark_empty)
// instead of null_blk's per-operation bookkeeping.
#include "zone_models.hpp"

#include <cerrno>
#include <fmt/core.h>

namespace softblk {

result<void> zloop_zones::settle_limits(zone_engine_config& c, uint32_t nr_seq)
{
    if (c.max_open_zones > nr_seq || c.max_active_zones > nr_seq) {
        return make_error(EINVAL,
                          fmt::format("max_open_zones={} max_active_zones={}: at most the {} "
                                      "sequential zones",
                                      c.max_open_zones, c.max_active_zones, nr_seq));
    }
    if (c.max_active_zones != 0 && c.max_open_zones > c.max_active_zones) {
        return make_error(EINVAL, fmt::format("max_open_zones={}: at most max_active_zones={} (an "
                                              "open zone is active)",
                                              c.max_open_zones, c.max_active_zones));
    }
    return {};
}

// ---------------------------------------------------------------- transitions

bool zloop_zones::can_open() const
{
    return _cfg.max_open_zones == 0 || _nr_open < _cfg.max_open_zones;
}

void zloop_zones::lru_remove(uint32_t index)
{
    zone& z = _zones[index];
    if (!z.in_lru) {
        return;
    }
    if (z.lru_prev != k_no_zone) {
        _zones[z.lru_prev].lru_next = z.lru_next;
    } else {
        _lru_head = z.lru_next;
    }
    if (z.lru_next != k_no_zone) {
        _zones[z.lru_next].lru_prev = z.lru_prev;
    } else {
        _lru_tail = z.lru_prev;
    }
    z.lru_prev = z.lru_next = k_no_zone;
    z.in_lru = false;
}

void zloop_zones::lru_push(uint32_t index)
{
    zone& z = _zones[index];
    z.lru_prev = _lru_tail;
    z.lru_next = k_no_zone;
    if (_lru_tail != k_no_zone) {
        _zones[_lru_tail].lru_next = index;
    } else {
        _lru_head = index;
    }
    _lru_tail = index;
    z.in_lru = true;
}

void zloop_zones::lru_rotate(uint32_t index)
{
    if (_cfg.max_open_zones != 0 && _lru_tail != index) {
        lru_remove(index);
        lru_push(index);
    }
}

// zloop_close_imp_open_zone: room for one more open zone, closing the least
// recently used implicitly open zone if the limit is reached. Counters' lock
// held.
bool zloop_zones::close_implicit_open()
{
    if (can_open()) {
        return true;
    }
    for (uint32_t i = _lru_head; i != k_no_zone; i = _zones[i].lru_next) {
        zone& z = _zones[i];
        if (z.cond.load(std::memory_order_relaxed) == zone_condition::implicit_open) {
            // zloop closes it whatever its write pointer.
            z.cond.store(zone_condition::closed, std::memory_order_relaxed);
            lru_remove(i);
            --_nr_open;
            ++_nr_closed;
            _implicit_closes.fetch_add(1, std::memory_order_relaxed);
            return true;
        }
    }
    return false;
}

// zloop_do_open_zone. Zone locked; takes the counters' lock.
bool zloop_zones::open(uint32_t index, bool explicit_open, int& error)
{
    zone& z = _zones[index];
    error = -EIO;
    auto guard = resources();
    const zone_condition cond = z.cond.load(std::memory_order_relaxed);
    if (is_open(cond)) {
        if (explicit_open) {
            z.cond.store(zone_condition::explicit_open, std::memory_order_relaxed);
        }
        if (_need_res_mgmt) {
            lru_rotate(index);
        }
        return true;
    }
    if (cond != zone_condition::empty && cond != zone_condition::closed) {
        return false;
    }
    if (!_need_res_mgmt) {
        z.cond.store(explicit_open ? zone_condition::explicit_open : zone_condition::implicit_open,
                     std::memory_order_relaxed);
        return true;
    }
    // softblk's active limit: an empty zone that opens becomes active.
    if (cond == zone_condition::empty && _cfg.max_active_zones != 0 &&
        _nr_open + _nr_closed >= _cfg.max_active_zones) {
        _active_refused.fetch_add(1, std::memory_order_relaxed);
        error = -k_zone_active_resource_error;
        return false;
    }
    // An explicit open never closes another zone; an implicit one closes
    // the least recently used implicitly open zone.
    if (explicit_open ? !can_open() : !close_implicit_open()) {
        _open_refused.fetch_add(1, std::memory_order_relaxed);
        return false;
    }
    if (cond == zone_condition::closed) {
        --_nr_closed;
    }
    z.cond.store(explicit_open ? zone_condition::explicit_open : zone_condition::implicit_open,
                 std::memory_order_relaxed);
    ++_nr_open;
    lru_push(index);
    return true;
}

// Leaves an open or closed zone's place in the counters. Zone locked.
void zloop_zones::mark_full(uint32_t index)
{
    zone& z = _zones[index];
    auto guard = resources();
    if (_need_res_mgmt) {
        const zone_condition cond = z.cond.load(std::memory_order_relaxed);
        if (is_open(cond)) {
            lru_remove(index);
            --_nr_open;
        } else if (cond == zone_condition::closed) {
            --_nr_closed;
        }
    }
    z.cond.store(zone_condition::full, std::memory_order_relaxed);
    z.wp.store(k_no_write_pointer, std::memory_order_relaxed);
}

void zloop_zones::mark_empty(uint32_t index)
{
    zone& z = _zones[index];
    auto guard = resources();
    if (_need_res_mgmt) {
        const zone_condition cond = z.cond.load(std::memory_order_relaxed);
        if (is_open(cond)) {
            lru_remove(index);
            --_nr_open;
        } else if (cond == zone_condition::closed) {
            --_nr_closed;
        }
    }
    z.cond.store(zone_condition::empty, std::memory_order_relaxed);
    z.wp.store(zone_start(index), std::memory_order_relaxed);
}

// zloop_update_seq_zone: the zone as its store says. Zone locked.
int zloop_zones::refresh(uint32_t index)
{
    zone& z = _zones[index];
    const int64_t stored = _backend != nullptr ? _backend->stored_bytes(index) : -EIO;
    if (stored < 0) {
        z.failed.store(true, std::memory_order_relaxed);
        return static_cast<int>(stored);
    }
    _refreshed.fetch_add(1, std::memory_order_relaxed);
    const uint64_t bytes = static_cast<uint64_t>(stored);
    if (bytes > zone_capacity(index) || bytes % _cfg.block_size != 0) {
        return -EINVAL;
    }
    if (bytes == 0) {
        mark_empty(index);
    } else if (bytes == zone_capacity(index)) {
        mark_full(index);
    } else {
        auto guard = resources();
        const zone_condition cond = z.cond.load(std::memory_order_relaxed);
        if (!is_open(cond) && cond != zone_condition::closed) {
            if (_need_res_mgmt) {
                ++_nr_closed;
            }
            z.cond.store(zone_condition::closed, std::memory_order_relaxed);
        }
        z.wp.store(zone_start(index) + bytes, std::memory_order_relaxed);
    }
    return 0;
}

int zloop_zones::refresh_if_failed(uint32_t index)
{
    zone& z = _zones[index];
    if (z.failed.load(std::memory_order_relaxed) &&
        z.failed.exchange(false, std::memory_order_relaxed)) {
        return refresh(index);
    }
    return 0;
}

namespace {

// zloop's reset and finish: nothing to do for a zone already in `done`
// that has not failed; otherwise the backend settles the zone's storage
// (`backend_op`, 0 or an error), then `mark` sets its condition. A backend
// failure marks the zone failed (so the next attempt retries) and is EIO,
// as zloop returns it.
template <typename Zone, typename BackendOp, typename Mark>
int settle_zloop_zone(Zone& z, zone_condition done, BackendOp backend_op, Mark mark)
{
    if (!z.failed.load(std::memory_order_relaxed) &&
        z.cond.load(std::memory_order_relaxed) == done) {
        return 0;
    }
    if (backend_op() != 0) {
        z.failed.store(true, std::memory_order_relaxed);
        return -EIO;
    }
    mark();
    z.failed.store(false, std::memory_order_relaxed);
    return 0;
}

}  // namespace

int zloop_zones::close(uint32_t index)
{
    zone& z = _zones[index];
    auto guard = resources();
    const zone_condition cond = z.cond.load(std::memory_order_relaxed);
    if (cond == zone_condition::closed) {
        return 0;
    }
    if (!is_open(cond)) {
        return -EIO;
    }
    const bool empty = z.wp.load(std::memory_order_relaxed) == zone_start(index);
    if (_need_res_mgmt) {
        lru_remove(index);
        --_nr_open;
        if (!empty) {
            ++_nr_closed;
        }
    }
    z.cond.store(empty ? zone_condition::empty : zone_condition::closed, std::memory_order_relaxed);
    return 0;
}

int zloop_zones::reset(uint32_t index)
{
    return settle_zloop_zone(
        _zones[index], zone_condition::empty,
        [&] { return _backend != nullptr ? _backend->reset_zone(index) : 0; },
        [&] { mark_empty(index); });
}

int zloop_zones::finish(uint32_t index)
{
    return settle_zloop_zone(
        _zones[index], zone_condition::full,
        [&] { return _backend != nullptr ? _backend->finish_zone(index) : 0; },
        [&] { mark_full(index); });
}

// zloop stops a reset all at the first zone whose reset fails.
int zloop_zones::reset_one_of_all(uint32_t index)
{
    return reset(index);
}

int zloop_zones::manage_zone(io_op op, uint32_t index)
{
    if (conventional(index)) {
        return -EIO;
    }
    switch (op) {
    case io_op::zone_open: {
        if (const int rc = refresh_if_failed(index); rc != 0) {
            return rc;
        }
        int error = 0;
        return open(index, true, error) ? 0 : error;
    }
    case io_op::zone_close: {
        const int rc = refresh_if_failed(index);
        return rc != 0 ? rc : close(index);
    }
    case io_op::zone_reset:
        return reset(index);
    case io_op::zone_finish:
        return finish(index);
    default:
        return -EOPNOTSUPP;
    }
}

// ---------------------------------------------------------------- hot path

int zloop_zones::begin_zone_write(zone& z, uint32_t index, const io_request& r, zone_hold& h,
                                  uint64_t zone_end)
{
    int rc = refresh_if_failed(index);
    const uint64_t now_wp = z.wp.load(std::memory_order_relaxed);
    if (rc == 0 && r.op == io_op::zone_append) {
        if (z.cond.load(std::memory_order_relaxed) == zone_condition::full ||
            now_wp + r.length > zone_end) {
            rc = -EIO;
        } else {
            h.offset = now_wp;
        }
    } else if (rc == 0 && h.offset != now_wp) {
        rc = -EIO;  // zloop: "unaligned write"; the capacity is not checked
    }
    if (rc == 0) {
        int error = 0;
        rc = open(index, false, error) ? 0 : error;
    }
    return rc;
}

void zloop_zones::end_zone_write(zone& z, const zone_hold& h, bool full)
{
    if (full) {
        mark_full(h.zone);
    }
    z.lock.unlock();
}

int zloop_zones::begin_zone_read(zone& z, uint32_t index, const io_request& r, zone_hold& h)
{
    if (h.sequential && z.failed.load(std::memory_order_relaxed)) {
        lock_zone(z);
        const int rc = refresh_if_failed(index);
        z.lock.unlock();
        if (rc != 0) {
            return rc;
        }
    }
    if (_cfg.lock_reads && h.sequential) {
        lock_zone(z);
        h.locked = true;
    }
    return static_cast<int>(r.length);
}

void zloop_zones::before_report(uint32_t index)
{
    if (!conventional(index)) {
        (void)refresh_if_failed(index);
    }
}

result<void> zloop_zones::change_condition(uint64_t, zone_condition, const char* attr)
{
    return make_error(EOPNOTSUPP,
                      fmt::format("{}: read-only and offline zones are null_blk's; the zloop "
                                  "model has none",
                                  attr));
}

}  // namespace softblk
