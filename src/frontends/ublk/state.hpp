// The ublk export's persisted per-device state: the kernel facts that a
// restarted daemon (or `softblk-driver --recover`) needs to re-attach a
// device that outlived its daemon (UBLK_F_USER_RECOVERY) without
// SET_PARAMS: the kernel's device id and negotiated flags, the queue
// geometry, the serving pid and the cookie that proves the device is ours.
// The device's settings (target type, options, export options) are the
// host library's (src/host, RUN_DIR/devices/NAME.json), not saved here.
//
// One JSON file per device: RUN_DIR/ublk/NAME.json, written atomically
// (temporary file + rename) when the device starts and removed when it is
// deleted.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include <softblk/types.hpp>

namespace softblk::ublk {

struct export_state {
    std::string device;   // softblk device name
    uint32_t dev_id = 0;  // /dev/ublkbN, /dev/ublkcN
    uint64_t flags = 0;   // UBLK_F_* the kernel granted
    unsigned nr_queues = 0;
    unsigned depth = 0;
    uint32_t max_io_buf_bytes = 0;
    int32_t daemon_pid = 0;  // the daemon that serves it
    // A random number given to the kernel at ADD_DEV in the device's
    // ublksrv_flags (kept by the kernel for the server, never read by it)
    // and saved here: the proof that the kernel's device dev_id is still
    // the one this state file describes. 0 in state files of older builds.
    uint64_t cookie = 0;
};

// 2: kernel facts only. Version 1 files (which also held the device's
// target type and options, now the host library's) are still read: their
// kernel facts are the same, the rest is ignored.
constexpr int k_state_version = 2;
constexpr int k_oldest_state_version = 1;

struct dev_info;

// True when the kernel's device `info` (GET_DEV_INFO of state.dev_id) is
// the one `state` describes: its cookie, or, for a state file without one,
// the daemon pid and queue geometry it was saved with. A device id is
// reused as soon as the device is deleted, by any ublk server: nothing may
// stop, delete or re-attach a device that is not ours.
bool is_ours(const export_state& state, const dev_info& info);
// True when process `pid` exists (ours or another user's): the daemon
// that a state file or the kernel names still runs.
bool pid_alive(int32_t pid);
// A random nonzero cookie for a new device.
uint64_t new_cookie();

nlohmann::json to_json(const export_state& state);
// Errors name the missing or malformed field.
result<export_state> state_from_json(const nlohmann::json& j);

// RUN_DIR/ublk/NAME.json
std::string state_path(const std::string& run_dir, const std::string& device);

// Writes atomically, creating RUN_DIR/ublk. Control thread.
result<void> write_state(const std::string& path, const export_state& state);
// ENOENT when there is no state file.
result<export_state> read_state(const std::string& path);

}  // namespace softblk::ublk
