// A device's attributes while it lives (device_impl, device_impl.hpp):
// setting and reading them as null_blk's configfs does (Linux 6.12
// drivers/block/null_blk/main.c: which apply live, which need power=0,
// which resize the queues), and zone conditions.
#include "device_impl.hpp"

#include "decorators.hpp"

#include <cerrno>
#include <fmt/core.h>
#include <nlohmann/json.hpp>

namespace softblk::core {

bool device_impl::releases_queues(std::string_view key) const
{
    const option_def* def = option_set::find_def(_options.defs(), key);
    return def != nullptr && def->update == option_update::reconfigure && powered();
}

result<void> device_impl::resize_queues(option_set& next)
{
    // nullb_update_nr_hw_queues.
    const uint64_t submit = next.u64("submit_queues");
    const uint64_t poll = next.u64("poll_queues");
    if (next.flag("shared_tags")) {
        return make_error(EINVAL, fmt::format("{}: the queue count of a device with shared_tags=1 "
                                              "cannot change while it is powered on (null_blk: "
                                              "EINVAL); write power=0 first",
                                              _info.name));
    }
    const unsigned cpus = possible_cpus();
    const uint64_t poll_limit = poll_queue_limit(_info.target_type);
    if (submit == 0 || submit > cpus || poll > poll_limit) {
        return make_error(
            EINVAL, fmt::format("{}: submit_queues={} poll_queues={}: while powered on "
                                "submit_queues must be 1 to {} (the CPUs) and poll_queues at most "
                                "{} (the module's), as null_blk requires",
                                _info.name, submit, poll, cpus, poll_limit));
    }
    for (const auto& q : _queues) {
        if (q->in_flight() != 0) {
            return make_error(EBUSY, fmt::format("{}: I/O in flight on queue {}; the queues can "
                                                 "change only when idle",
                                                 _info.name, q->index()));
        }
    }
    // The cache keeps its data across blk_mq_update_nr_hw_queues; here the
    // queues (and the decorators that own per-queue state) are made anew,
    // so the cache is written back first.
    bio flush;
    flush.op = io_op::flush;
    if (const int rc = execute(flush); rc < 0) {
        return make_error(-rc, fmt::format("{}: flushing before the queues change: {}", _info.name,
                                           std::strerror(-rc)));
    }
    const option_set before = _options;
    power_off();
    _options = next;
    if (auto r = power_on(); !r) {
        // As null_blk: the old counts stay.
        _options = before;
        (void)power_on();
        return r;
    }
    return {};
}

result<void> device_impl::set_zone_condition(uint64_t offset, zone_condition condition)
{
    if (!_info.limits.zoned) {
        return make_error(EOPNOTSUPP, fmt::format("{}: not a zoned device", _info.name));
    }
    if (!_target) {
        return make_error(ENODEV, fmt::format("{}: powered off", _info.name));
    }
    auto r = _target->set_zone_condition(offset, condition);
    if (!r) {
        return make_error(r.error().code.value(),
                          fmt::format("{}: {}", _info.name, r.error().message));
    }
    return {};
}

result<void> device_impl::set_option(std::string_view key, std::string_view value)
{
    const option_def* def = option_set::find_def(_options.defs(), key);
    if (def == nullptr) {
        return make_error(ENOENT,
                          fmt::format("{}: {}: no such attribute (`softblk features` lists them)",
                                      _info.name, key));
    }
    // The value is parsed first: a malformed one is EINVAL whatever the
    // state (NULLB_DEVICE_ATTR).
    option_set next = _options;
    if (auto parsed = next.assign(key, value); !parsed) {
        return std::unexpected(parsed.error());
    }
    if (def->name == "power") {
        return set_power(next.flag("power"));
    }
    _notes.clear();
    switch (def->update) {
    case option_update::creation:
        return make_error(EPERM, fmt::format("{}: {} is a module parameter: give it when the "
                                             "device is made (`softblk add`, `softblk daemon "
                                             "{}=...`)",
                                             _info.name, def->name, def->name));
    case option_update::powered_off:
        if (powered()) {
            return make_error(EBUSY,
                              fmt::format("{}: {} cannot change while the device is powered on "
                                          "(null_blk: EBUSY); write power=0 first",
                                          _info.name, def->name));
        }
        _options = std::move(next);
        return {};
    case option_update::powered_on:
        if (!powered()) {
            return make_error(EINVAL, fmt::format("{}: {} applies only while the device is "
                                                  "powered on",
                                                  _info.name, def->name));
        }
        if (auto r = _target->apply_option(*def, next); !r) {
            return r;
        }
        if (!def->write_only) {
            _options = std::move(next);  // a write-only value is an action, not a setting
        }
        return {};
    case option_update::reconfigure:
        if (!powered()) {
            _options = std::move(next);
            return {};
        }
        return resize_queues(next);
    case option_update::live:
        break;
    }
    auto handled = apply_decorator_option(*_decorator_state, *def, next);
    if (!handled) {
        return std::unexpected(handled.error());
    }
    if (!*handled && def->name == "io_timeout") {
        const uint64_t ms = next.u64("io_timeout");
        if (ms == 0) {
            return make_error(EINVAL, fmt::format("{}: io_timeout=0: the timeout must be at least "
                                                  "1 ms (the block layer refuses 0)",
                                                  _info.name));
        }
        for (const auto& q : _queues) {
            q->set_timeout_ns(ms * 1'000'000);
        }
        _info.queues.io_timeout_ms = ms;
    } else if (!*handled && powered()) {
        if (auto r = _target->apply_option(*def, next); !r) {
            return r;
        }
    }
    // Powered off, a target's live option waits for the next power on.
    _options = std::move(next);
    return {};
}

result<std::string> device_impl::get_option(std::string_view key) const
{
    const option_def* def = option_set::find_def(_options.defs(), key);
    if (def == nullptr) {
        return make_error(ENOENT,
                          fmt::format("{}: {}: no such attribute (`softblk features` lists them)",
                                      _info.name, key));
    }
    if (def->write_only) {
        return make_error(EACCES,
                          fmt::format("{}: {} can be written, not read", _info.name, def->name));
    }
    if (def->name == "power") {
        return std::string(powered() ? "1\n" : "0\n");
    }
    if (auto text = decorator_option_text(*_decorator_state, def->name)) {
        return *text;
    }
    return _options.value_text(def->name) + "\n";
}

}  // namespace softblk::core
