// The core's device: its attributes, what survives a power cycle (the
// target's data, the decorators' state) and, while powered on, the target
// wrapped in its decorators and the queues. Internal to src/core.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include <softblk/device.hpp>
#include <softblk/external_data.hpp>
#include <softblk/target.hpp>

#include "decorators.hpp"
#include "queue.hpp"

namespace softblk::core {

// null_blk's g_poll_queues for devices of `type`: the poll_queues module
// parameter (set_option_defaults), 1 by default.
uint64_t poll_queue_limit(std::string_view type);

class device_impl final : public device {
public:
    // A powered-off device with attributes `options` (parsed, not checked
    // against the power-on rules yet) and the decorators' state made from
    // them. Control thread.
    device_impl(std::string name, const target_type& type, option_set options,
                std::shared_ptr<decorator_state> state);
    ~device_impl() override;

    const device_info& info() const override { return _info; }
    external_data_support takes_external_data() const override { return _external; }
    unsigned queue_count() const override { return static_cast<unsigned>(_queues.size()); }
    io_queue& queue(unsigned index) override { return *_queues.at(index); }
    using device::execute;
    int execute(bio& b) override;
    int execute_control(bio& b) override;
    result<std::vector<extent>> map(uint64_t offset, uint64_t length) override;
    result<void> set_power(bool on) override;
    result<void> set_zone_condition(uint64_t offset, zone_condition condition) override;
    bool powered() const override { return _powered.load(std::memory_order_relaxed); }
    void undo_create() override;
    result<void> set_option(std::string_view key, std::string_view value) override;
    bool releases_queues(std::string_view key) const override;
    result<std::string> get_option(std::string_view key) const override;
    const std::vector<std::string>& notes() const override { return _notes; }
    const option_set& options() const override { return _options; }
    void describe(nlohmann::json& out) const override;
    uint64_t memory_bytes() const override;
    uint64_t add_capacity_listener(capacity_listener listener) override;
    void remove_capacity_listener(uint64_t handle) override;

private:
    // The target's watch_capacity callback: the new capacity, then the
    // listeners. The target's thread.
    void capacity_changed(uint64_t bytes);

    result<void> power_on();
    void power_off();
    // The core's power-on rules (null_validate_conf's queue part) on `o`.
    void apply_core_rules(option_set& o);
    // A live change of submit_queues/poll_queues while powered on
    // (nullb_update_nr_hw_queues): checks, then re-creates the queues.
    result<void> resize_queues(option_set& next);
    // The submit queue that synchronous calls of this thread use.
    queue_impl& caller_queue();

    const target_type& _type;
    device_info _info;
    external_data_support _external;  // as last powered on, as _info.limits
    option_set _options;              // the attributes, as reads show them
    std::shared_ptr<decorator_state> _decorator_state;
    std::shared_ptr<target_data> _kept;  // the target's data across power cycles
    std::unique_ptr<target> _target;     // while powered on
    std::vector<std::unique_ptr<queue_impl>> _queues;
    std::atomic<bool> _powered{false};
    std::vector<std::string> _notes;
    // Guards the listeners and serialises capacity changes; held while a
    // listener runs, so that removing one waits for it.
    std::mutex _capacity_mutex;
    std::vector<std::pair<uint64_t, capacity_listener>> _capacity_listeners;
    uint64_t _next_listener = 1;
    std::atomic<uint64_t> _resizes{0};  // capacity changes, for describe()
};

// Reads the core's queue options into a queue_config (with the block
// layer's limits: at most BLK_MQ_MAX_DEPTH tags).
queue_config queue_config_from(const option_set& options);

}  // namespace softblk::core
