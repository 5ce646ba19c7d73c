// The core's device: a target (wrapped in its decorators), its queues and
// their settings. Internal to src/core.
#pragma once

#include <atomic>
#include <memory>
#include <vector>

#include <softblk/device.hpp>
#include <softblk/target.hpp>

#include "queue.hpp"

namespace softblk::core {

class device_impl final : public device {
public:
    device_impl(std::string name, std::string type, option_set options, queue_config queues,
                std::unique_ptr<target> t);
    ~device_impl() override;

    // Opens the queues (and the target's halves). Control thread.
    result<void> start();

    const device_info& info() const override { return _info; }
    unsigned queue_count() const override { return static_cast<unsigned>(_queues.size()); }
    io_queue& queue(unsigned index) override { return *_queues.at(index); }
    using device::execute;
    int execute(bio& b) override;
    result<std::vector<extent>> map(uint64_t offset, uint64_t length) override;
    result<void> set_power(bool on) override;
    result<void> set_zone_condition(uint64_t offset, zone_condition condition) override;
    bool powered() const override { return _powered.load(std::memory_order_relaxed); }
    const option_set& options() const override { return _options; }
    void describe(nlohmann::json& out) const override;
    uint64_t memory_bytes() const override { return _target->memory_bytes(); }

private:
    // The submit queue that synchronous calls of this thread use.
    queue_impl& caller_queue();

    device_info _info;
    option_set _options;
    std::unique_ptr<target> _target;
    std::vector<std::unique_ptr<queue_impl>> _queues;
    std::atomic<bool> _powered{true};
};

// Reads the core's queue options into a queue_config.
queue_config queue_config_from(const option_set& options);

}  // namespace softblk::core
