#include "resize.hpp"

#include <fmt/core.h>
#include <spdlog/spdlog.h>

namespace softblk::ublk {

capacity_follower::capacity_follower(device& dev, config cfg, update_size_fn update_size)
    : _dev(dev),
      _cfg(std::move(cfg)),
      _update_size(std::move(update_size)),
      _kernel_bytes(_cfg.kernel_bytes)
{
    // Listening first, then the size as it is: a change in between is
    // sent by one of the two (follow() always sends the newest).
    _listener = _dev.add_capacity_listener([this](uint64_t) { follow(); });
    follow();
}

capacity_follower::~capacity_follower()
{
    _dev.remove_capacity_listener(_listener);
}

void capacity_follower::follow()
{
    std::lock_guard serial(_follow_mutex);
    const uint64_t bytes = current_capacity(_dev.limits());
    std::optional<uint64_t> kernel;
    {
        std::lock_guard state(_state_mutex);
        kernel = _kernel_bytes;
    }
    if (kernel == bytes) {
        return;
    }
    if (!_cfg.can_update) {
        if (!kernel) {
            return;  // a recovered device: nothing known to compare with
        }
        bool first = false;
        {
            std::lock_guard state(_state_mutex);
            first = !_warned;
            _warned = true;
        }
        if (first) {
            // Once: a target that resizes often would flood the log.
            spdlog::warn(
                "{}: the device's capacity is now {} bytes, but {} keeps {} bytes: this "
                "kernel ({}) lacks UBLK_F_UPDATE_SIZE (Linux 6.16+), so the disk cannot "
                "follow; I/O beyond the device's end fails with EIO. A new export "
                "(power=0, then power=1) shows the new size",
                _cfg.device_name, bytes, _cfg.block_path, *kernel, _cfg.kernel_release);
        }
        return;
    }
    auto sent = _update_size(bytes / 512);
    std::lock_guard state(_state_mutex);
    if (!sent) {
        _last_error = sent.error().message;
        spdlog::warn("{}: {} keeps {}: {}", _cfg.device_name, _cfg.block_path,
                     kernel ? fmt::format("{} bytes", *kernel) : std::string("its size"),
                     _last_error);
        return;
    }
    _kernel_bytes = bytes;
    ++_updates;
    _last_error.clear();
    spdlog::info("{}: {} resized to {} bytes (UPDATE_SIZE)", _cfg.device_name, _cfg.block_path,
                 bytes);
}

void capacity_follower::describe(nlohmann::json& out) const
{
    std::lock_guard state(_state_mutex);
    out["kernel_capacity_bytes"] =
        _kernel_bytes ? nlohmann::json(*_kernel_bytes) : nlohmann::json(nullptr);
    out["resize"] = _cfg.can_update ? "UPDATE_SIZE" : "none";
    out["resizes"] = _updates;
    if (!_last_error.empty()) {
        out["resize_error"] = _last_error;
    }
    // `softblk list` shows this after the export: the size it lists is the
    // device's, which the kernel's disk does not have.
    if (_kernel_bytes && *_kernel_bytes != current_capacity(_dev.limits())) {
        out["warning"] = fmt::format(
            "{} keeps {} bytes: {}", _cfg.block_path, *_kernel_bytes,
            _cfg.can_update ? "UPDATE_SIZE failed"
                            : fmt::format("kernel {} lacks UBLK_F_UPDATE_SIZE (Linux 6.16+)",
                                          _cfg.kernel_release));
    }
}

}  // namespace softblk::ublk
