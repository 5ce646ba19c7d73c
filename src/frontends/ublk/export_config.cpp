// The ublk export's options: their table and how one export's are parsed
// (export_config.hpp).
#include "export_config.hpp"

#include <cerrno>

#include <fmt/core.h>

#include <softblk/options.hpp>

#include "abi.hpp"
#include "ublk_export.hpp"

namespace softblk::ublk {

namespace {

constexpr option_def k_export_options[] = {
    {.name = "id",
     .kind = option_kind::signed_integer,
     .default_value = "-1",
     .unit = "",
     .help = "ublk device id N (/dev/ublkbN); -1 takes the lowest free one",
     .smin = -1,
     .smax = 1'048'575},
    {.name = "recovery",
     .kind = option_kind::text,
     .default_value = "none",
     .unit = "",
     .help =
         "what a killed daemon leaves: none (the device goes away), recover (UBLK_F_USER_RECOVERY: "
         "in-flight I/O fails, new I/O waits for `softblk recover`), reissue "
         "(USER_RECOVERY_REISSUE: "
         "in-flight I/O is reissued), fail_io (USER_RECOVERY_FAIL_IO, Linux 6.13+: I/O fails until "
         "recovered)"},
    {.name = "user_copy",
     .kind = option_kind::boolean,
     .default_value = "0",
     .unit = "",
     .help = "UBLK_F_USER_COPY: the queue threads copy data with pread/pwrite on /dev/ublkcN "
             "instead of "
             "the kernel copying into per-tag buffers (Linux 6.5+; not for unprivileged devices)"},
    {.name = "zero_copy",
     .kind = option_kind::text,
     .default_value = "auto",
     .unit = "",
     .help = "UBLK_F_SUPPORT_ZERO_COPY (Linux 6.15+) or AUTO_BUF_REG (6.16+, auto_buf_reg): "
             "writes leave their data in the kernel and the file ring writes it from there, "
             "without a copy through the daemon. auto: where the device's target takes such writes "
             "(file, zloop), USER_COPY is in effect and the kernel has it; 1: also turns USER_COPY "
             "on, and is an error where it cannot be; 0: never"},
    {.name = "zero_copy_min",
     .kind = option_kind::signed_integer,
     .default_value = "-1",
     .unit = "bytes",
     .help = "smallest write sent with zero copy, smaller ones being copied in with pread; -1: "
             "each queue measures both ways per write size and takes the faster",
     .smin = -1,
     .smax = 1 << 30},
    {.name = "auto_buf_reg",
     .kind = option_kind::text,
     .default_value = "auto",
     .unit = "",
     .help = "how zero copy puts a write's pages in the queue's io_uring (with zero copy on). "
             "auto: the kernel does it as it hands the request over (UBLK_F_AUTO_BUF_REG, "
             "Linux 6.16+), where it can and shared_ring=1, and takes them out at the commit: "
             "no register and unregister entries per write; 1: that way or an error; 0: "
             "register and unregister entries (UBLK_F_SUPPORT_ZERO_COPY, Linux 6.15+)"},
    {.name = "shared_ring",
     .kind = option_kind::boolean,
     .default_value = "1",
     .unit = "",
     .help = "1: a queue's thread lends its io_uring to the device's file I/O (file and zloop "
             "targets), which then costs no system call or wake-up of its "
             "own; 0: the file I/O keeps a ring of its own"},
    {.name = "batch_io",
     .kind = option_kind::boolean,
     .default_value = "0",
     .unit = "",
     .help = "UBLK_F_BATCH_IO: requests reach a queue's thread as lists of tags and their "
             "results go back many at once; a zero-copy write (AUTO_BUF_REG: the kernel puts "
             "its pages in the ring) carries its commit linked after it, so the request ends "
             "where the write did, without the queue's thread. Needs user_copy (turned on) "
             "and recovery=none"},
    {.name = "queue_affinity",
     .kind = option_kind::text,
     .default_value = "auto",
     .unit = "",
     .help = "1: run each queue's thread, and the io-wq workers its file I/O goes to, on the "
             "CPUs whose requests the kernel sends to that queue (GET_QUEUE_AFFINITY), where "
             "those are fewer than the daemon may use; one: on the first of those CPUs alone, "
             "even where the queue serves them all (kublk's choice: the programs that submit "
             "then run on the other CPUs); auto: a device of 1 or 2 queues measures the data "
             "it serves both ways, its queues' threads wherever the scheduler puts them and all "
             "on the first CPU the daemon may use, and keeps to that CPU where it serves faster "
             "by a twentieth (more queues: as 0); 0: wherever the scheduler puts them"},
    {.name = "idle_spin",
     .kind = option_kind::text,
     .default_value = "auto",
     .unit = "",
     .help = "whether a queue's thread that waits for the next request, with none of its own "
             "I/O in flight, spins watching for it before it sleeps. auto: for the window (0 "
             "to 512 us, at most idle_spin_max) that serves the queue the most requests per "
             "second, measured over 10 ms epochs and again now and then (waking a sleeping "
             "thread is dear on some machines, cheap on others); 1: always, for idle_spin_max; "
             "0: never"},
    {.name = "idle_spin_max",
     .kind = option_kind::integer,
     .default_value = "1000",
     .unit = "us",
     .help = "longest spin of an idle queue thread before it sleeps",
     .min = 1,
     .max = 100'000},
    {.name = "unprivileged",
     .kind = option_kind::boolean,
     .default_value = "0",
     .unit = "",
     .help = "UBLK_F_UNPRIVILEGED_DEV (Linux 6.5+); default: 1 when the daemon is not root"},
    {.name = "add_timeout",
     .kind = option_kind::integer,
     .default_value = "10000",
     .unit = "ms",
     .help = "give up on ADD_DEV and START_DEV after this long (some kernels hang there)",
     .min = 100,
     .max = 600'000},
};

}  // namespace

// Why a device's poll_queues do not reach /dev/ublkbN: ublk_drv (Linux
// 6.12, drivers/block/ublk_drv.c) gives its disk a single queue map,
// ublk_add_tag_set leaving tag_set.nr_maps at 1 (HCTX_TYPE_DEFAULT only),
// ublk_mq_ops has no .poll, and ADD_DEV's struct ublksrv_ctrl_dev_info
// (include/uapi/linux/ublk_cmd.h) counts only nr_hw_queues. So the disk
// has no poll queues (queue/io_poll 0, no BLK_FEAT_POLL), and polled I/O
// on it (RWF_HIPRI, IORING_SETUP_IOPOLL) fails with EOPNOTSUPP on 6.12
// (submit_bio_noacct). More default queues served by the device's poll
// queues would take ordinary I/O by CPU, which poll queues never see.
const std::string_view k_no_poll_queues =
    "ublk has no poll queues (Linux's ublk_drv makes one queue map and no .poll); "
    "/dev/ublkbN gets the submit_queues only";

// The device asked for poll queues (given, or more than the default one
// through the daemon's module parameters): the export says it lacks them.
bool poll_queues_asked(const device& dev)
{
    const unsigned poll = dev.info().queues.poll_queues;
    return poll > 1 || (poll > 0 && dev.options().given("poll_queues"));
}

result<export_config> parse_config(const export_context& ctx, std::span<const std::string> args)
{
    auto o = option_set::parse(k_export_options, args);
    if (!o) {
        return std::unexpected(o.error());
    }
    export_config c;
    c.id = o->i64("id");
    c.recovery = o->text("recovery");
    if (c.recovery == "none") {
        c.recovery_flags = 0;
    } else if (c.recovery == "recover") {
        c.recovery_flags = k_f_user_recovery;
    } else if (c.recovery == "reissue") {
        c.recovery_flags = k_f_user_recovery | k_f_user_recovery_reissue;
    } else if (c.recovery == "fail_io") {
        c.recovery_flags = k_f_user_recovery | k_f_user_recovery_fail_io;
    } else {
        return make_error(
            EINVAL, fmt::format("recovery={}: one of none, recover, reissue, fail_io", c.recovery));
    }
    c.user_copy = o->flag("user_copy");
    c.user_copy_given = o->given("user_copy");
    c.zero_copy = o->text("zero_copy");
    if (c.zero_copy != "auto" && c.zero_copy != "0" && c.zero_copy != "1") {
        return make_error(EINVAL, fmt::format("zero_copy={}: one of auto, 0, 1", c.zero_copy));
    }
    c.zero_copy_min = o->i64("zero_copy_min");
    if (c.zero_copy == "1") {
        if (c.user_copy_given && !c.user_copy) {
            return make_error(EINVAL, "zero_copy=1: needs user_copy=1 (reads are still copied)");
        }
        c.user_copy = true;
    }
    c.auto_buf_reg = o->text("auto_buf_reg");
    if (c.auto_buf_reg != "auto" && c.auto_buf_reg != "0" && c.auto_buf_reg != "1") {
        return make_error(EINVAL,
                          fmt::format("auto_buf_reg={}: one of auto, 0, 1", c.auto_buf_reg));
    }
    c.shared_ring = o->flag("shared_ring");
    if (c.auto_buf_reg == "1" && !c.shared_ring) {
        // The file I/O writes the pages the kernel put in the queue's ring
        // only through that ring.
        return make_error(EINVAL, "auto_buf_reg=1: needs shared_ring=1");
    }
    c.batch_io = o->flag("batch_io");
    if (c.batch_io) {
        // Batched commands carry no buffer of ours: data moves by USER_COPY
        // or stays in the kernel.
        if (c.user_copy_given && !c.user_copy) {
            return make_error(EINVAL, "batch_io=1: needs user_copy=1");
        }
        c.user_copy = true;
        if (c.auto_buf_reg == "0" && c.zero_copy == "1") {
            return make_error(EINVAL,
                              "zero_copy=1 with batch_io=1: only with auto_buf_reg "
                              "(batched commands carry no register entries)");
        }
        if (c.recovery_flags != 0) {
            return make_error(EINVAL, fmt::format("batch_io=1: not with recovery={}; "
                                                  "recovery=none",
                                                  c.recovery));
        }
    }
    if (const std::string pin = o->text("queue_affinity"); pin == "one") {
        c.queue_affinity = queue_pinning::one_cpu;
    } else if (pin == "auto") {
        c.queue_affinity = queue_pinning::measured;
    } else if (auto on = parse_kernel_bool(pin)) {
        c.queue_affinity = *on ? queue_pinning::queue_cpus : queue_pinning::none;
    } else {
        return make_error(EINVAL, fmt::format("queue_affinity={}: one of 0, 1, one, auto", pin));
    }
    if (const std::string spin = o->text("idle_spin"); spin == "auto") {
        c.idle_spin = idle_spin_mode::measured;
    } else if (spin == "1") {
        c.idle_spin = idle_spin_mode::always;
    } else if (spin == "0") {
        c.idle_spin = idle_spin_mode::never;
    } else {
        return make_error(EINVAL, fmt::format("idle_spin={}: one of auto, 0, 1", spin));
    }
    c.idle_spin_max_ns = o->u64("idle_spin_max") * 1000;
    c.unprivileged = o->given("unprivileged") ? o->flag("unprivileged") : !ctx.privileged;
    c.add_timeout_ms = static_cast<int>(o->u64("add_timeout"));
    if (c.unprivileged && c.recovery_flags != 0) {
        return make_error(EINVAL,
                          fmt::format("recovery={}: the kernel allows recovery only for devices "
                                      "of a privileged daemon (unprivileged=1)",
                                      c.recovery));
    }
    if (c.unprivileged && c.zero_copy == "1") {
        return make_error(EINVAL,
                          "zero_copy=1: the kernel refuses zero copy for unprivileged devices");
    }
    if (c.unprivileged && c.user_copy) {
        return make_error(EINVAL,
                          "user_copy=1: the kernel refuses USER_COPY for unprivileged devices");
    }
    return c;
}

result<add_flags> place_zero_copy(const export_config& c, uint64_t want, uint64_t ask,
                                  std::optional<uint64_t> features)
{
    // Where the kernel puts a request's pages in the queue's ring itself
    // (AUTO_BUF_REG), a zero-copy write needs no register and unregister
    // entries around it; the file I/O then writes them through that ring
    // (shared_ring). Batched commands know no other way.
    const bool kernel_auto = features && (*features & k_f_auto_buf_reg) != 0;
    const bool use_auto = c.auto_buf_reg == "1" || (c.auto_buf_reg == "auto" && c.shared_ring &&
                                                    (kernel_auto || c.batch_io));
    const uint64_t zc = k_f_support_zero_copy;
    if (use_auto) {
        if ((want & zc) != 0 || ((ask & zc) != 0 && c.auto_buf_reg == "1")) {
            want = (want & ~zc) | k_f_auto_buf_reg;
        } else if ((ask & zc) != 0) {
            ask |= k_f_auto_buf_reg;
        }
        ask &= ~zc;
    } else if (c.batch_io) {
        if ((want & zc) != 0) {
            return make_error(EINVAL, "zero_copy=1 with batch_io=1: needs shared_ring=1");
        }
        ask &= ~zc;
    }
    return add_flags{.want = want, .ask = ask};
}

std::span<const option_def> export_options()
{
    return k_export_options;
}

}  // namespace softblk::ublk
