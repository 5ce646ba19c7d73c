// The ublk control device (/dev/ublk-control): an io_uring with 128-byte
// SQEs whose URING_CMDs carry a ctrl_cmd. One command at a time; the
// control thread, or any thread holding the object's lock (describe()).
#pragma once

#include "abi.hpp"

#include <liburing.h>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <softblk/types.hpp>

namespace softblk::ublk {

constexpr const char* k_control_path = "/dev/ublk-control";

// True if /dev/ublk-control exists, loading ublk_drv (modprobe) once when
// it does not and we may load modules.
bool control_available();

// /dev/ublkcN and /dev/ublkbN.
std::string char_path(uint32_t dev_id);
std::string block_path(uint32_t dev_id);

class control {
public:
    // Opens /dev/ublk-control and its ring and asks the kernel for its
    // features (GET_FEATURES; kernels before 6.5 lack it, then the features
    // are unknown until ADD_DEV hands back the flags it granted, and
    // commands use the legacy encoding).
    static result<std::unique_ptr<control>> open();
    ~control();
    control(const control&) = delete;
    control& operator=(const control&) = delete;

    // What GET_FEATURES said; nullopt on kernels without it.
    std::optional<uint64_t> features() const { return _features; }
    bool ioctl_encode() const { return _ioctl_encode; }

    // ADD_DEV: `in` holds nr_hw_queues, queue_depth, max_io_buf_bytes,
    // dev_id (UINT32_MAX: any), flags. Returns what the kernel made of it
    // (dev_id, the granted flags, nr_hw_queues capped at the CPU count).
    // Gives up after `timeout_ms` (some kernels hang in ADD_DEV).
    result<dev_info> add_dev(const dev_info& in, int timeout_ms);
    result<void> set_params(uint32_t dev_id, const params& p);
    // START_DEV returns once every queue fetched all its tags and the disk
    // was added (the kernel reads the partition table meanwhile, so the
    // queues must be running).
    result<void> start_dev(uint32_t dev_id, int32_t daemon_pid);
    result<void> stop_dev(uint32_t dev_id);
    // DEL_DEV waits until /dev/ublkcN is closed by everyone.
    result<void> del_dev(uint32_t dev_id);
    result<dev_info> get_dev_info(uint32_t dev_id);
    result<void> start_user_recovery(uint32_t dev_id);
    result<void> end_user_recovery(uint32_t dev_id, int32_t daemon_pid);
    // UPDATE_SIZE (kernels with UBLK_F_UPDATE_SIZE): the started device's
    // disk gets `sectors` 512-byte sectors (the kernel's set_capacity and
    // a change uevent; I/O beyond the new end is refused by the block
    // layer). ENODEV before START_DEV and after STOP_DEV. Gives up after
    // `timeout_ms`.
    result<void> update_size(uint32_t dev_id, uint64_t sectors, int timeout_ms);
    // GET_QUEUE_AFFINITY: the CPUs whose requests the kernel sends to queue
    // `q_id` (its blk-mq map), valid from ADD_DEV on.
    result<std::vector<unsigned>> queue_cpus(uint32_t dev_id, uint16_t q_id);

    // Devices created unprivileged need /dev/ublkcN's path with every
    // command after ADD_DEV; remember which ones are.
    void set_unprivileged(bool on) { _unprivileged = on; }

    std::mutex& lock() { return _lock; }

private:
    control() = default;
    // Sends one command; returns the CQE's result (>= 0) or -errno;
    // -ETIMEDOUT after timeout_ms (< 0: wait forever).
    int run(uint8_t nr, ctrl_cmd cmd, int timeout_ms);
    // Builds addr/len/dev_path_len: the char device path (for unprivileged
    // devices and GET_DEV_INFO2), then `payload`.
    int run_with_payload(uint8_t nr, uint32_t dev_id, void* payload, uint16_t len, bool with_path,
                         uint64_t data0 = 0, int timeout_ms = -1);
    result<void> reopen_ring();

    int _fd = -1;
    io_uring _ring{};
    bool _ring_ok = false;
    bool _ioctl_encode = false;
    bool _unprivileged = false;
    std::optional<uint64_t> _features;
    std::mutex _lock;
};

}  // namespace softblk::ublk
