// The zone engine (include/softblk/zone_engine.hpp): zone state, every
// transition, the open/active limits and report, in the two kernel models.
//
// The null_blk half follows drivers/block/null_blk/zoned.c step by step,
// counters included (so that its quirks carry over: finishing a closed zone
// that the open limit refuses, as zone_readonly does, leaves the closed count
// as null_blk leaves it). The zloop half follows drivers/block/zloop.c,
// keeping its counters in one transition function instead.
//
// Where the kernel changes another zone without that zone's lock (the
// implicit close, under the counters' lock only), a write in progress on
// that zone could leave it empty with data or the counters off by one in
// null_blk; end_write settles both (see there).
#include <softblk/zone_engine.hpp>

#include <bit>
#include <cerrno>
#include <new>
#include <string>
#include <fmt/core.h>
#include <nlohmann/json.hpp>

namespace softblk {

namespace {

constexpr uint32_t k_none = UINT32_MAX;

bool is_open(zone_condition c)
{
    return c == zone_condition::implicit_open || c == zone_condition::explicit_open;
}

}  // namespace

const char* to_string(zone_flavor flavor)
{
    return flavor == zone_flavor::null_blk ? "null_blk" : "zloop";
}

struct zone_engine::zone {
    std::mutex lock;
    // The write pointer as reported (absolute bytes, k_no_write_pointer).
    // Written under the zone's lock; read without it by the implicit close.
    std::atomic<uint64_t> wp{0};
    std::atomic<zone_condition> cond{zone_condition::empty};
    // zloop: a write failed; re-read from the backend before the next use.
    std::atomic<bool> failed{false};
    // zloop: the LRU list of open zones (under the counters' lock).
    uint32_t lru_prev = k_none;
    uint32_t lru_next = k_none;
    bool in_lru = false;
};

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
    if (c.flavor == zone_flavor::null_blk) {
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
    } else {
        if (c.max_open_zones > nr_seq || c.max_active_zones > nr_seq) {
            return make_error(EINVAL,
                              fmt::format("max_open_zones={} max_active_zones={}: at most the {} "
                                          "sequential zones",
                                          c.max_open_zones, c.max_active_zones, nr_seq));
        }
        if (c.max_active_zones != 0 && c.max_open_zones > c.max_active_zones) {
            return make_error(EINVAL,
                              fmt::format("max_open_zones={}: at most max_active_zones={} (an "
                                          "open zone is active)",
                                          c.max_open_zones, c.max_active_zones));
        }
    }

    std::unique_ptr<zone_engine> e(new zone_engine(c, backend));
    e->_zone_shift = static_cast<unsigned>(std::countr_zero(c.zone_size_bytes));
    e->_nr_zones = nr_zones;
    e->_last_zone_length = c.capacity_bytes - (uint64_t{nr_zones - 1} << e->_zone_shift);
    e->_need_res_mgmt = c.max_open_zones != 0 || c.max_active_zones != 0;
    e->_imp_close_zone_no = c.conventional_zones;
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
    const bool zloop = c.flavor == zone_flavor::zloop;
    for (uint32_t i = 0; i < nr_zones; ++i) {
        zone& z = e->_zones[i];
        const uint64_t start = e->zone_start(i);
        if (i < c.conventional_zones) {
            z.cond.store(zone_condition::not_write_pointer, std::memory_order_relaxed);
            z.wp.store(zloop ? k_no_write_pointer : start + e->zone_length(i),
                       std::memory_order_relaxed);
        } else if (c.start_full) {
            z.cond.store(zone_condition::full, std::memory_order_relaxed);
            z.wp.store(zloop ? k_no_write_pointer : start + e->zone_capacity(i),
                       std::memory_order_relaxed);
        } else {
            z.wp.store(start, std::memory_order_relaxed);
        }
    }
    return e;
}

uint64_t zone_engine::zone_length(uint32_t zone) const
{
    return zone + 1 == _nr_zones ? _last_zone_length : _cfg.zone_size_bytes;
}

uint64_t zone_engine::zone_capacity(uint32_t zone) const
{
    if (conventional(zone)) {
        return zone_length(zone);
    }
    return std::min(zone_length(zone), _cfg.zone_capacity_bytes);
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
        z.wp.store(_cfg.flavor == zone_flavor::zloop ? k_no_write_pointer : start + cap,
                   std::memory_order_relaxed);
    } else {
        z.cond.store(zone_condition::closed, std::memory_order_relaxed);
        z.wp.store(start + stored, std::memory_order_relaxed);
        if (_need_res_mgmt) {
            ++_nr_closed;
        }
    }
    return {};
}

// ---------------------------------------------------------------- null_blk

int zone_engine::null_check_active() const
{
    if (_cfg.max_active_zones == 0 ||
        _nr_exp_open + _nr_imp_open + _nr_closed < _cfg.max_active_zones) {
        return 0;
    }
    return -k_zone_active_resource_error;
}

int zone_engine::null_check_open()
{
    if (_cfg.max_open_zones == 0 || _nr_exp_open + _nr_imp_open < _cfg.max_open_zones) {
        return 0;
    }
    if (_nr_imp_open != 0 && null_check_active() == 0) {
        null_close_implicit_open();
        return 0;
    }
    return -k_zone_open_resource_error;
}

// null_check_zone_resources: can a zone in `cond` become open?
int zone_engine::null_check_resources(zone_condition cond)
{
    int rc = 0;
    if (cond == zone_condition::empty) {
        rc = null_check_active();
        if (rc != 0) {
            _active_refused.fetch_add(1, std::memory_order_relaxed);
            return rc;
        }
    }
    rc = null_check_open();
    if (rc != 0) {
        _open_refused.fetch_add(1, std::memory_order_relaxed);
    }
    return rc;
}

// null_close_imp_open_zone: the next implicitly open zone, round robin from
// the one after the last closed. Counters' lock held.
void zone_engine::null_close_implicit_open()
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

int zone_engine::null_open(uint32_t index)
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
            if (const int rc = null_check_resources(cond); rc != 0) {
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

int zone_engine::null_close(uint32_t index)
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

int zone_engine::null_finish(uint32_t index)
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
            if (const int rc = null_check_resources(cond); rc != 0) {
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

int zone_engine::null_reset(uint32_t index)
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

int zone_engine::null_manage(io_op op, uint32_t index)
{
    if (op == io_op::zone_reset_all) {
        for (uint32_t i = _cfg.conventional_zones; i < _nr_zones; ++i) {
            zone& z = _zones[i];
            lock_zone(z);
            const zone_condition cond = z.cond.load(std::memory_order_relaxed);
            if (cond != zone_condition::empty && cond != zone_condition::read_only &&
                cond != zone_condition::offline) {
                (void)null_reset(i);
            }
            z.lock.unlock();
        }
        return 0;
    }
    zone& z = _zones[index];
    lock_zone(z);
    int rc = -EIO;
    const zone_condition cond = z.cond.load(std::memory_order_relaxed);
    if (cond != zone_condition::read_only && cond != zone_condition::offline) {
        switch (op) {
        case io_op::zone_reset:
            rc = null_reset(index);
            break;
        case io_op::zone_open:
            rc = null_open(index);
            break;
        case io_op::zone_close:
            rc = null_close(index);
            break;
        case io_op::zone_finish:
            rc = null_finish(index);
            break;
        default:
            rc = -EOPNOTSUPP;
            break;
        }
    }
    z.lock.unlock();
    return rc;
}

// ---------------------------------------------------------------- zloop

bool zone_engine::zloop_can_open() const
{
    return _cfg.max_open_zones == 0 || _nr_open < _cfg.max_open_zones;
}

void zone_engine::zloop_lru_remove(uint32_t index)
{
    zone& z = _zones[index];
    if (!z.in_lru) {
        return;
    }
    if (z.lru_prev != k_none) {
        _zones[z.lru_prev].lru_next = z.lru_next;
    } else {
        _lru_head = z.lru_next;
    }
    if (z.lru_next != k_none) {
        _zones[z.lru_next].lru_prev = z.lru_prev;
    } else {
        _lru_tail = z.lru_prev;
    }
    z.lru_prev = z.lru_next = k_none;
    z.in_lru = false;
}

void zone_engine::zloop_lru_push(uint32_t index)
{
    zone& z = _zones[index];
    z.lru_prev = _lru_tail;
    z.lru_next = k_none;
    if (_lru_tail != k_none) {
        _zones[_lru_tail].lru_next = index;
    } else {
        _lru_head = index;
    }
    _lru_tail = index;
    z.in_lru = true;
}

void zone_engine::zloop_lru_rotate(uint32_t index)
{
    if (_cfg.max_open_zones != 0 && _lru_tail != index) {
        zloop_lru_remove(index);
        zloop_lru_push(index);
    }
}

// zloop_close_imp_open_zone: room for one more open zone, closing the least
// recently used implicitly open zone if the limit is reached. Counters' lock
// held.
bool zone_engine::zloop_close_implicit_open()
{
    if (zloop_can_open()) {
        return true;
    }
    for (uint32_t i = _lru_head; i != k_none; i = _zones[i].lru_next) {
        zone& z = _zones[i];
        if (z.cond.load(std::memory_order_relaxed) == zone_condition::implicit_open) {
            // zloop closes it whatever its write pointer.
            z.cond.store(zone_condition::closed, std::memory_order_relaxed);
            zloop_lru_remove(i);
            --_nr_open;
            ++_nr_closed;
            _implicit_closes.fetch_add(1, std::memory_order_relaxed);
            return true;
        }
    }
    return false;
}

// zloop_do_open_zone. Zone locked; takes the counters' lock.
bool zone_engine::zloop_open(uint32_t index, bool explicit_open, int& error)
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
            zloop_lru_rotate(index);
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
    if (explicit_open ? !zloop_can_open() : !zloop_close_implicit_open()) {
        _open_refused.fetch_add(1, std::memory_order_relaxed);
        return false;
    }
    if (cond == zone_condition::closed) {
        --_nr_closed;
    }
    z.cond.store(explicit_open ? zone_condition::explicit_open : zone_condition::implicit_open,
                 std::memory_order_relaxed);
    ++_nr_open;
    zloop_lru_push(index);
    return true;
}

// Leaves an open or closed zone's place in the counters. Zone locked.
void zone_engine::zloop_mark_full(uint32_t index)
{
    zone& z = _zones[index];
    auto guard = resources();
    if (_need_res_mgmt) {
        const zone_condition cond = z.cond.load(std::memory_order_relaxed);
        if (is_open(cond)) {
            zloop_lru_remove(index);
            --_nr_open;
        } else if (cond == zone_condition::closed) {
            --_nr_closed;
        }
    }
    z.cond.store(zone_condition::full, std::memory_order_relaxed);
    z.wp.store(k_no_write_pointer, std::memory_order_relaxed);
}

void zone_engine::zloop_mark_empty(uint32_t index)
{
    zone& z = _zones[index];
    auto guard = resources();
    if (_need_res_mgmt) {
        const zone_condition cond = z.cond.load(std::memory_order_relaxed);
        if (is_open(cond)) {
            zloop_lru_remove(index);
            --_nr_open;
        } else if (cond == zone_condition::closed) {
            --_nr_closed;
        }
    }
    z.cond.store(zone_condition::empty, std::memory_order_relaxed);
    z.wp.store(zone_start(index), std::memory_order_relaxed);
}

// zloop_update_seq_zone: the zone as its store says. Zone locked.
int zone_engine::refresh(uint32_t index)
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
        zloop_mark_empty(index);
    } else if (bytes == zone_capacity(index)) {
        zloop_mark_full(index);
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

int zone_engine::refresh_if_failed(uint32_t index)
{
    zone& z = _zones[index];
    if (z.failed.load(std::memory_order_relaxed) &&
        z.failed.exchange(false, std::memory_order_relaxed)) {
        return refresh(index);
    }
    return 0;
}

void zone_engine::write_failed(uint32_t index)
{
    if (index < _nr_zones && !conventional(index)) {
        _zones[index].failed.store(true, std::memory_order_relaxed);
    }
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

int zone_engine::zloop_close(uint32_t index)
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
        zloop_lru_remove(index);
        --_nr_open;
        if (!empty) {
            ++_nr_closed;
        }
    }
    z.cond.store(empty ? zone_condition::empty : zone_condition::closed, std::memory_order_relaxed);
    return 0;
}

int zone_engine::zloop_reset(uint32_t index)
{
    return settle_zloop_zone(
        _zones[index], zone_condition::empty,
        [&] { return _backend != nullptr ? _backend->reset_zone(index) : 0; },
        [&] { zloop_mark_empty(index); });
}

int zone_engine::zloop_finish(uint32_t index)
{
    return settle_zloop_zone(
        _zones[index], zone_condition::full,
        [&] { return _backend != nullptr ? _backend->finish_zone(index) : 0; },
        [&] { zloop_mark_full(index); });
}

int zone_engine::zloop_manage(io_op op, uint32_t index)
{
    if (op == io_op::zone_reset_all) {
        for (uint32_t i = _cfg.conventional_zones; i < _nr_zones; ++i) {
            zone& z = _zones[i];
            lock_zone(z);
            const int rc = zloop_reset(i);
            z.lock.unlock();
            if (rc != 0) {
                return rc;
            }
        }
        return 0;
    }
    if (conventional(index)) {
        return -EIO;
    }
    zone& z = _zones[index];
    lock_zone(z);
    int rc = 0;
    switch (op) {
    case io_op::zone_open:
        rc = refresh_if_failed(index);
        if (rc == 0) {
            int error = 0;
            rc = zloop_open(index, true, error) ? 0 : error;
        }
        break;
    case io_op::zone_close:
        rc = refresh_if_failed(index);
        if (rc == 0) {
            rc = zloop_close(index);
        }
        break;
    case io_op::zone_reset:
        rc = zloop_reset(index);
        break;
    case io_op::zone_finish:
        rc = zloop_finish(index);
        break;
    default:
        rc = -EOPNOTSUPP;
        break;
    }
    z.lock.unlock();
    return rc;
}

// ---------------------------------------------------------------- hot path

int zone_engine::begin_write(const io_request& r, zone_hold& h)
{
    const uint32_t index = zone_index(r.offset);
    if (index >= _nr_zones) {
        return -EIO;
    }
    const bool append = r.op == io_op::zone_append;
    h.zone = index;
    h.offset = r.offset;
    h.locked = false;
    h.sequential = !conventional(index);
    if (!h.sequential) {
        // Conventional zones take writes anywhere and no zone append.
        return append ? -EIO : 0;
    }
    zone& z = _zones[index];
    const uint64_t start = zone_start(index);
    const uint64_t zone_end = start + zone_capacity(index);
    lock_zone(z);
    int rc = 0;
    const uint64_t wp = z.wp.load(std::memory_order_relaxed);
    if (_cfg.flavor == zone_flavor::null_blk) {
        if (append) {
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
                    rc = null_check_resources(cond);
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
    } else {
        rc = refresh_if_failed(index);
        const uint64_t now_wp = z.wp.load(std::memory_order_relaxed);
        if (rc == 0 && append) {
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
            rc = zloop_open(index, false, error) ? 0 : error;
        }
    }
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
    if (_cfg.flavor == zone_flavor::zloop) {
        if (full) {
            zloop_mark_full(h.zone);
        }
        z.lock.unlock();
        return;
    }
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
    zone& z = _zones[index];
    if (_cfg.flavor == zone_flavor::zloop) {
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

void zone_engine::end_read(zone_hold& h)
{
    if (h.locked) {
        h.locked = false;
        _zones[h.zone].lock.unlock();
    }
}

int zone_engine::manage(const io_request& r)
{
    const uint32_t index = r.op == io_op::zone_reset_all ? 0 : zone_index(r.offset);
    if (index >= _nr_zones) {
        return -EIO;
    }
    return _cfg.flavor == zone_flavor::null_blk ? null_manage(r.op, index)
                                                : zloop_manage(r.op, index);
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
        if (_cfg.flavor == zone_flavor::zloop && !conventional(i)) {
            (void)refresh_if_failed(i);
        }
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
    if (_cfg.flavor != zone_flavor::null_blk) {
        return make_error(EOPNOTSUPP,
                          fmt::format("{}: read-only and offline zones are null_blk's; the zloop "
                                      "model has none",
                                      attr));
    }
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
            (void)null_finish(index);  // frees its resources (null_blk ignores a refusal)
        }
        z.cond.store(condition, std::memory_order_relaxed);
        z.wp.store(k_no_write_pointer, std::memory_order_relaxed);
    }
    z.lock.unlock();
    return {};
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
