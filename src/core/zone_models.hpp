// Private to the core: the zone descriptor and the two zone models behind
// zone_engine (include/softblk/zone_engine.hpp). zone_engine.cpp holds what
// both share (geometry, restore, the hot path's common steps, report,
// describe); each model is one type in its own file, following its kernel
// driver step by step:
//   null_blk_zones  zone_null_blk.cpp, drivers/block/null_blk/zoned.c
//   zloop_zones     zone_zloop.cpp, drivers/block/zloop.c
#pragma once

#include <softblk/zone_engine.hpp>

#include <atomic>
#include <cstdint>
#include <mutex>

namespace softblk {

inline constexpr uint32_t k_no_zone = UINT32_MAX;

inline bool is_open(zone_condition c)
{
    return c == zone_condition::implicit_open || c == zone_condition::explicit_open;
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
    uint32_t lru_prev = k_no_zone;
    uint32_t lru_next = k_no_zone;
    bool in_lru = false;
};

// null_blk's model: separate open and active limits, the implicitly open
// zone closed round robin, read-only and offline zones.
class null_blk_zones final : public zone_engine {
public:
    null_blk_zones(const zone_engine_config& config, zone_backend* backend);
    // null_init_zoned_dev's normalisation of the limits (never refuses).
    static result<void> settle_limits(zone_engine_config& config, uint32_t sequential_zones);

private:
    uint64_t full_write_pointer(uint64_t end) const override { return end; }
    int begin_zone_write(zone& z, uint32_t index, const io_request& r, zone_hold& h,
                         uint64_t zone_end) override;
    void end_zone_write(zone& z, const zone_hold& h, bool full) override;
    int begin_zone_read(zone& z, uint32_t index, const io_request& r, zone_hold& h) override;
    int manage_zone(io_op op, uint32_t index) override;
    int reset_one_of_all(uint32_t index) override;
    result<void> change_condition(uint64_t offset, zone_condition condition,
                                  const char* attr) override;

    int check_active() const;
    int check_open();
    int check_resources(zone_condition cond);
    void close_implicit_open();
    int open(uint32_t index);
    int close(uint32_t index);
    int finish(uint32_t index);
    int reset(uint32_t index);

    // Under _res_lock (when _need_res_mgmt).
    uint32_t _nr_imp_open = 0;
    uint32_t _nr_exp_open = 0;
    uint32_t _imp_close_zone_no = 0;  // where the round robin goes on
};

// zloop's model: an open limit closing implicitly open zones in LRU order
// (softblk adds an active limit), zones re-read from the backend after a
// failed write.
class zloop_zones final : public zone_engine {
public:
    zloop_zones(const zone_engine_config& config, zone_backend* backend)
        : zone_engine(config, backend)
    {
    }
    // Refuses limits above the sequential zones or open above active.
    static result<void> settle_limits(zone_engine_config& config, uint32_t sequential_zones);

private:
    uint64_t full_write_pointer(uint64_t) const override { return k_no_write_pointer; }
    int begin_zone_write(zone& z, uint32_t index, const io_request& r, zone_hold& h,
                         uint64_t zone_end) override;
    void end_zone_write(zone& z, const zone_hold& h, bool full) override;
    int begin_zone_read(zone& z, uint32_t index, const io_request& r, zone_hold& h) override;
    int manage_zone(io_op op, uint32_t index) override;
    int reset_one_of_all(uint32_t index) override;
    void before_report(uint32_t index) override;
    result<void> change_condition(uint64_t offset, zone_condition condition,
                                  const char* attr) override;

    bool can_open() const;
    bool close_implicit_open();
    bool open(uint32_t index, bool explicit_open, int& error);
    void lru_remove(uint32_t index);
    void lru_push(uint32_t index);
    void lru_rotate(uint32_t index);
    void mark_full(uint32_t index);
    void mark_empty(uint32_t index);
    int refresh(uint32_t index);
    int refresh_if_failed(uint32_t index);
    int reset(uint32_t index);
    int finish(uint32_t index);
    int close(uint32_t index);

    // Under _res_lock (when _need_res_mgmt).
    uint32_t _nr_open = 0;           // open zones (implicit + explicit)
    uint32_t _lru_head = k_no_zone;  // least recently used open zone
    uint32_t _lru_tail = k_no_zone;
};

}  // namespace softblk
