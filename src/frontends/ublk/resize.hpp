// How a ublk export follows its device's capacity (device::
// add_capacity_listener: an rbd image resized in the cluster, a file
// device's `size` written). Where the kernel has UBLK_F_UPDATE_SIZE (Linux
// 6.16+) the listener sends UPDATE_SIZE and /dev/ublkbN takes the new size
// (the block layer then refuses I/O beyond it); elsewhere the kernel's disk
// keeps the size SET_PARAMS gave it, the daemon's log says so once, and
// requests beyond the device's new end fail with EIO in the core.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>
#include <softblk/device.hpp>

namespace softblk::ublk {

class capacity_follower {
public:
    // Sends UPDATE_SIZE with the new size in 512-byte sectors and returns
    // its outcome: the export's control object (under its lock), a fake in
    // the tests.
    using update_size_fn = std::function<result<void>(uint64_t sectors)>;

    struct config {
        std::string device_name;  // the softblk device, for the log
        std::string block_path;   // /dev/ublkbN, for the log
        // The kernel advertises UBLK_F_UPDATE_SIZE (GET_FEATURES).
        bool can_update = false;
        // `uname -r`, for the message of a kernel without it.
        std::string kernel_release;
        // The size of the kernel's disk: what SET_PARAMS gave it; nullopt
        // after a recovery (the kernel kept the size the dead daemon left).
        std::optional<uint64_t> kernel_bytes;
    };

    // Registers the listener on `dev` and brings the kernel's disk to the
    // device's capacity now (a change since SET_PARAMS, or a recovered
    // device whose size is unknown). `dev` must outlive this object.
    // Control thread, holding no lock that `update_size` takes.
    capacity_follower(device& dev, config cfg, update_size_fn update_size);
    // Removes the listener (a call in progress is waited for). Any thread
    // but the listener's, holding no lock that `update_size` takes.
    ~capacity_follower();
    capacity_follower(const capacity_follower&) = delete;
    capacity_follower& operator=(const capacity_follower&) = delete;

    // For the export's describe(): "kernel_capacity_bytes" (the size the
    // kernel's disk has, null when unknown), "resize" ("UPDATE_SIZE", or
    // "none" where the kernel lacks it), "resizes" (UPDATE_SIZE commands
    // that succeeded), "resize_error" (the last failure) and, while the
    // disk's size is not the device's, "warning" saying so and why. Any
    // thread.
    void describe(nlohmann::json& out) const;

private:
    // The listener (the thread that reported the change: the target's own
    // or the control thread, never a queue thread): sends the device's
    // capacity as it is now, so that racing calls end with the newest.
    void follow();

    device& _dev;
    const config _cfg;
    const update_size_fn _update_size;
    // One UPDATE_SIZE at a time (the constructor's and the listener's).
    std::mutex _follow_mutex;
    // Guards what describe() reads; never held across update_size (which
    // takes the control lock that the export's describe() holds).
    mutable std::mutex _state_mutex;
    std::optional<uint64_t> _kernel_bytes;
    uint64_t _updates = 0;
    std::string _last_error;
    bool _warned = false;
    uint64_t _listener = 0;
};

}  // namespace softblk::ublk
