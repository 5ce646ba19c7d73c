// The null_blk zone model (src/core/zone_models.hpp): drivers/block/
// null_blk/zoned.c step by step, counters included (so that its quirks
// carry over: finishing a closed zone that the open limit refuses, as
// zone_readonly does, leaves the closed count as null_blk leaves it).
//
// Where the kernel changes another zone without that zone's lock (the
// implicit close, under the counters' lock only), a write in progress on
// that zone could leave it empty with data or the counters off by one;
// end_zone_write settles both (see there).
#include "zone_models.hpp"

#include <cerrno>
#include <fmt/core.h>

namespace softblk {

null_blk_zones::null_blk_zones(const zone_engine_config& config, zone_backend* backend)
    : zone_engine(config, backend), _imp_close_zone_no(config.conventional_zones)
{
}

result<void> null_blk_zones::settle_limits(zone_engine_config& c, uint32_t nr_seq)
{
    // null_init_zoned_dev: a limit at or above the number of sequential
    // zones means none; max_open is at most max_active.
    if (c.max_active_zones >= nr_seq) {
        c.max_active_zones = 0;
    }
    if (c.max_active_zones != 0 && c.max_open_zones > c.max_active_zones) {
        c.max_open_zones = c.max_active_zones;
    } else if (c.max_open_zones >= nr_seq) {
        c.max_open_zones = 0;
    }
    return {};
}

// ---------------------------------------------------------------- transitions

int null_blk_zones::check_active() const
{
    if (_cfg.max_active_zones == 0 ||
        _nr_exp_open + _nr_imp_open + _nr_closed < _cfg.max_active_zones) {
        return 0;
    }
    return -k_zone_active_resource_error;
}

int null_blk_zones::check_open()
{
    if (_cfg.max_open_zones == 0 || _nr_exp_open + _nr_imp_open < _cfg.max_open_zones) {
        return 0;
    }
    if (_nr_imp_open != 0 && check_active() == 0) {
        close_implicit_open();
        return 0;
    }
    return -k_zone_open_resource_error;
}

// null_check_zone_resources: can a zone in `cond` become open?
int null_blk_zones::check_resources(zone_condition cond)
{
    int rc = 0;
    if (cond == zone_condition::empty) {
        rc = check_active();
        if (rc != 0) {
            _active_refused.fetch_add(1, std::memory_order_relaxed);
            return rc;
        }
    }
    rc = check_open();
    if (rc != 0) {
        _open_refused.fetch_add(1, std::memory_order_relaxed);
    }
    return rc;
}

// null_close_imp_open_zone: the next implicitly open zone, round robin from
// the one after the last closed. Counters' lock held.
void null_blk_zones::close_implicit_open()
{
    const uint32_t first_seq = _cfg.conventional_zones;
    uint32_t zno = _imp_close_zone_no;
    if (zno >= _nr_zones) {
        zno = first_seq;
    }
    for (uint32_t i = first_seq; i < _nr_zones; ++i) {
        zone& z = _zones[zno];
        const uint32_t this_zone = zno;
        ++zno;
        if (zno >= _nr_zones) {
            zno = first_seq;
        }
        if (z.cond.load(std::memory_order_relaxed) == zone_condition::implicit_open) {
            --_nr_imp_open;
            if (z.wp.load(std::memory_order_relaxed) == zone_start(this_zone)) {
                z.cond.store(zone_condition::empty, std::memory_order_relaxed);
            } else {
                z.cond.store(zone_condition::closed, std::memory_order_relaxed);
                ++_nr_closed;
            }
            _imp_close_zone_no = zno;
            _implicit_closes.fetch_add(1, std::memory_order_relaxed);
            return;
        }
    }
}

int null_blk_zones::open(uint32_t index)
{
    zone& z = _zones[index];
    if (conventional(index)) {
        return -EIO;
    }
    auto guard = resources();
    const zone_condition cond = z.cond.load(std::memory_order_relaxed);
    switch (cond) {
    case zone_condition::explicit_open:
        return 0;  // opening an explicitly open zone is not an error
    case zone_condition::empty:
    case zone_condition::implicit_open:
    case zone_condition::closed:
        break;
    default:
        return -EIO;
    }
    if (_need_res_mgmt) {
        switch (cond) {
        case zone_condition::empty:
        case zone_condition::closed:
            if (const int rc = check_resources(cond); rc != 0) {
                return rc;
            }
            if (cond == zone_condition::closed) {
                --_nr_closed;
            }
            break;
        default:
            --_nr_imp_open;
            break;
        }
        ++_nr_exp_open;
    }
    z.cond.store(zone_condition::explicit_open, std::memory_order_relaxed);
    return 0;
}

int null_blk_zones::close(uint32_t index)
{
    zone& z = _zones[index];
    if (conventional(index)) {
        return -EIO;
    }
    auto guard = resources();
    const zone_condition cond = z.cond.load(std::memory_order_relaxed);
    if (cond == zone_condition::closed) {
        return 0;  // closing a closed zone is not an error
    }
    if (!is_open(cond)) {
        return -EIO;
    }
    const uint64_t start = zone_start(index);
    const uint64_t wp = z.wp.load(std::memory_order_relaxed);
    if (_need_res_mgmt) {
        if (cond == zone_condition::implicit_open) {
            --_nr_imp_open;
        } else {
            --_nr_exp_open;
        }
        if (wp > start) {
            ++_nr_closed;
        }
    }
    z.cond.store(wp == start ? zone_condition::empty : zone_condition::closed,
                 std::memory_order_relaxed);
    return 0;
}

int null_blk_zones::finish(uint32_t index)
{
    zone& z = _zones[index];
    if (conventional(index)) {
        return -EIO;
    }
    auto guard = resources();
    if (_need_res_mgmt) {
        const zone_condition cond = z.cond.load(std::memory_order_relaxed);
        switch (cond) {
        case zone_condition::full:
            return 0;  // finishing a full zone is not an error
        case zone_condition::empty:
        case zone_condition::closed:
            if (const int rc = check_resources(cond); rc != 0) {
                return rc;
            }
            if (cond == zone_condition::closed) {
                --_nr_closed;
            }
            break;
        case zone_condition::implicit_open:
            --_nr_imp_open;
            break;
        case zone_condition::explicit_open:
            --_nr_exp_open;
            break;
        default:
            return -EIO;
        }
    }
    z.cond.store(zone_condition::full, std::memory_order_relaxed);
    z.wp.store(zone_start(index) + zone_length(index), std::memory_order_relaxed);
    return 0;
}

int null_blk_zones::reset(uint32_t index)
{
    zone& z = _zones[index];
    if (conventional(index)) {
        return -EIO;
    }
    auto guard = resources();
    if (_need_res_mgmt) {
        switch (z.cond.load(std::memory_order_relaxed)) {
        case zone_condition::implicit_open:
            --_nr_imp_open;
            break;
        case zone_condition::explicit_open:
            --_nr_exp_open;
            break;
        case zone_condition::closed:
            --_nr_closed;
            break;
        case zone_condition::empty:
        case zone_condition::full:
            break;
        default:
            return -EIO;
        }
    }
    z.cond.store(zone_condition::empty, std::memory_order_relaxed);
    z.wp.store(zone_start(index), std::memory_order_relaxed);
    guard = {};
    return _backend != nullptr ? _backend->reset_zone(index) : 0;
}

int null_blk_zones::reset_one_of_all(uint32_t index)
{
    // null_blk skips empty, read-only and offline zones and ignores
    // refusals.
    const zone_condition cond = _zones[index].cond.load(std::memory_order_relaxed);
    if (cond != zone_condition::empty && cond != zone_condition::read_only &&
        cond != zone_condition::offline) {
        (void)reset(index);
    }
    return 0;
}

int null_blk_zones::manage_zone(io_op op, uint32_t index)
{
    const zone_condition cond = _zones[index].cond.load(std::memory_order_relaxed);
    if (cond == zone_condition::read_only || cond == zone_condition::offline) {
        return -EIO;
    }
    switch (op) {
    case io_op::zone_reset:
        return reset(index);
    case io_op::zone_open:
        return open(index);
    case io_op::zone_close:
        return close(index);
    case io_op::zone_finish:
        return finish(index);
    default:
        return -EOPNOTSUPP;
    }
}

// ---------------------------------------------------------------- hot path

int null_blk_zones::begin_zone_write(zone& z, uint32_t, const io_request& r, zone_hold& h,
                                     uint64_t zone_end)
{
    int rc = 0;
    const uint64_t wp = z.wp.load(std::memory_order_relaxed);
    if (r.op == io_op::zone_append) {
        if (wp == k_no_write_pointer) {
            rc = -EIO;
        } else {
            h.offset = wp;
        }
    }
    // Full, read-only and offline zones fail here too: their write
    // pointer is never where a write starts.
    if (rc == 0 && (h.offset != wp || wp + r.length > zone_end)) {
        rc = -EIO;
    }
    if (rc == 0) {
        auto guard = resources();
        const zone_condition cond = z.cond.load(std::memory_order_relaxed);
        if (cond == zone_condition::closed || cond == zone_condition::empty) {
            if (_need_res_mgmt) {
                rc = check_resources(cond);
                if (rc == 0) {
                    if (cond == zone_condition::closed) {
                        --_nr_closed;
                    }
                    ++_nr_imp_open;
                }
            }
            if (rc == 0) {
                z.cond.store(zone_condition::implicit_open, std::memory_order_relaxed);
            }
        }
    }
    return rc;
}

void null_blk_zones::end_zone_write(zone& z, const zone_hold&, bool full)
{
    auto guard = resources();
    if (_need_res_mgmt) {
        // An implicit close of another writer may have closed this zone
        // since begin_write (null_blk does so without the zone's lock): an
        // empty zone that now has data is closed, and a closed one that
        // filled leaves the closed count.
        const zone_condition cond = z.cond.load(std::memory_order_relaxed);
        if (full) {
            if (cond == zone_condition::explicit_open) {
                --_nr_exp_open;
            } else if (cond == zone_condition::implicit_open) {
                --_nr_imp_open;
            } else if (cond == zone_condition::closed) {
                --_nr_closed;
            }
        } else if (cond == zone_condition::empty) {
            ++_nr_closed;
            z.cond.store(zone_condition::closed, std::memory_order_relaxed);
        }
    }
    if (full) {
        z.cond.store(zone_condition::full, std::memory_order_relaxed);
    }
    z.lock.unlock();
}

int null_blk_zones::begin_zone_read(zone& z, uint32_t, const io_request& r, zone_hold& h)
{
    if (z.cond.load(std::memory_order_relaxed) == zone_condition::offline) {
        return -EIO;
    }
    if (_cfg.lock_reads) {
        lock_zone(z);
        h.locked = true;
    }
    // null_zone_valid_read_len: data below the write pointer only.
    const uint64_t wp = z.wp.load(std::memory_order_relaxed);
    if (!h.sequential || r.offset + r.length <= wp) {
        return static_cast<int>(r.length);
    }
    if (r.offset > wp) {
        return 0;
    }
    return static_cast<int>(wp - r.offset);
}

// ---------------------------------------------------------------- control

result<void> null_blk_zones::change_condition(uint64_t offset, zone_condition condition,
                                              const char* attr)
{
    const uint64_t index64 = offset >> _zone_shift;
    if (index64 >= _nr_zones) {
        return make_error(
            EINVAL, fmt::format("{}={}: beyond the device's {} zones (sector {} is "
                                "the last)",
                                attr, offset >> 9, _nr_zones, (_cfg.capacity_bytes >> 9) - 1));
    }
    const auto index = static_cast<uint32_t>(index64);
    if (conventional(index)) {
        return make_error(
            EINVAL,
            fmt::format("{}={}: zone {} is conventional; only sequential zones "
                        "(from sector {}) change condition",
                        attr, offset >> 9, index, zone_start(_cfg.conventional_zones) >> 9));
    }
    zone& z = _zones[index];
    lock_zone(z);
    if (z.cond.load(std::memory_order_relaxed) == condition) {
        // Asked again: back to a normal empty zone.
        z.cond.store(zone_condition::empty, std::memory_order_relaxed);
        z.wp.store(zone_start(index), std::memory_order_relaxed);
        if (_backend != nullptr) {
            (void)_backend->reset_zone(index);
        }
    } else {
        const zone_condition cond = z.cond.load(std::memory_order_relaxed);
        if (cond != zone_condition::read_only && cond != zone_condition::offline) {
            (void)finish(index);  // frees its resources (null_blk ignores a refusal)
        }
        z.cond.store(condition, std::memory_order_relaxed);
        z.wp.store(k_no_write_pointer, std::memory_order_relaxed);
    }
    z.lock.unlock();
    return {};
}

}  // namespace softblk
