// The ublk export's options (`--export-opt`, docs/ublk.md) as parsed for
// one export: private to src/frontends/ublk.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <softblk/device.hpp>
#include <softblk/frontend.hpp>

#include "queue_runner.hpp"

namespace softblk::ublk {

// Where a queue's thread runs (queue_affinity): wherever the scheduler puts
// it, on the CPUs the kernel maps to the queue, on the first of them, or
// measured: the device's threads free or all on one CPU, whichever serves
// faster.
enum class queue_pinning : uint8_t { none, queue_cpus, one_cpu, measured };
// queue_affinity=auto measures devices of at most this many queues.
constexpr unsigned k_max_measured_queues = 2;

// Why a device's poll_queues do not reach /dev/ublkbN (export_config.cpp).
extern const std::string_view k_no_poll_queues;

// The device asked for poll queues (given, or more than the default one
// through the daemon's module parameters): the export says it lacks them.
bool poll_queues_asked(const device& dev);

struct export_config {
    int64_t id = -1;
    std::string recovery = "none";
    uint64_t recovery_flags = 0;
    bool user_copy = false;
    bool user_copy_given = false;
    std::string zero_copy = "auto";
    int64_t zero_copy_min = -1;
    std::string auto_buf_reg = "auto";  // auto, 0, 1
    bool shared_ring = true;
    bool batch_io = false;
    queue_pinning queue_affinity = queue_pinning::measured;
    idle_spin_mode idle_spin = idle_spin_mode::measured;
    uint64_t idle_spin_max_ns = 1'000'000;
    bool unprivileged = false;
    int add_timeout_ms = 10'000;
};

// ADD_DEV's flags: those the export needs (`want`: an error where the
// kernel lacks one) and those it takes if the kernel grants them (`ask`).
struct add_flags {
    uint64_t want = 0;
    uint64_t ask = 0;
};

// Zero copy (SUPPORT_ZERO_COPY in `want` or `ask`) the way auto_buf_reg
// says, given the kernel's `features` (none: GET_FEATURES failed): where
// AUTO_BUF_REG is chosen, it replaces SUPPORT_ZERO_COPY (wanted where zero
// copy was wanted or auto_buf_reg=1); batched, zero copy goes no other way.
result<add_flags> place_zero_copy(const export_config& c, uint64_t want, uint64_t ask,
                                  std::optional<uint64_t> features);

// The export options `args` checked against each other and the kernel's
// rules (recovery only for a privileged daemon ...); errors say which
// option and what to give instead. Control thread.
result<export_config> parse_config(const export_context& ctx, std::span<const std::string> args);

}  // namespace softblk::ublk
