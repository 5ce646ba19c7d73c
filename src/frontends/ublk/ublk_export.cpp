#include "ublk_export.hpp"

#include "control.hpp"
#include "params.hpp"
#include "queue_runner.hpp"
#include "resize.hpp"
#include "state.hpp"

#include <softblk/options.hpp>
#include <softblk/ublk/ublk.hpp>

#include <algorithm>
#include <cerrno>
#include <optional>
#include <string_view>
#include <chrono>
#include <csignal>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <fmt/core.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <thread>
#include <unistd.h>

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
     .help =
         "UBLK_F_SUPPORT_ZERO_COPY (Linux 6.15+): writes leave their data in the kernel and the "
         "file ring writes it from there, without a copy through the daemon. auto: where the "
         "device's target takes such writes (file, zloop), USER_COPY is in effect and the "
         "kernel has it; 1: also turns USER_COPY on, and is an error where it cannot be; 0: "
         "never"},
    {.name = "zero_copy_min",
     .kind = option_kind::signed_integer,
     .default_value = "-1",
     .unit = "bytes",
     .help = "smallest write sent with zero copy, smaller ones being copied in with pread; -1: "
             "each queue measures both ways per write size and takes the faster",
     .smin = -1,
     .smax = 1 << 30},
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

// Where a queue's thread runs (queue_affinity): wherever the scheduler puts
// it, on the CPUs the kernel maps to the queue, on the first of them, or
// measured: the device's threads free or all on one CPU, whichever serves
// faster.
enum class queue_pinning : uint8_t { none, queue_cpus, one_cpu, measured };
// queue_affinity=auto measures devices of at most this many queues.
constexpr unsigned k_max_measured_queues = 2;

// Why a device's poll_queues do not reach /dev/ublkbN: ublk_drv (Linux
// 6.12, drivers/block/ublk_drv.c) gives its disk a single queue map,
// ublk_add_tag_set leaving tag_set.nr_maps at 1 (HCTX_TYPE_DEFAULT only),
// ublk_mq_ops has no .poll, and ADD_DEV's struct ublksrv_ctrl_dev_info
// (include/uapi/linux/ublk_cmd.h) counts only nr_hw_queues. So the disk
// has no poll queues (queue/io_poll 0, no BLK_FEAT_POLL), and polled I/O
// on it (RWF_HIPRI, IORING_SETUP_IOPOLL) fails with EOPNOTSUPP on 6.12
// (submit_bio_noacct). More default queues served by the device's poll
// queues would take ordinary I/O by CPU, which poll queues never see.
constexpr std::string_view k_no_poll_queues =
    "ublk has no poll queues (Linux's ublk_drv makes one queue map and no .poll); "
    "/dev/ublkbN gets the submit_queues only";

// The device asked for poll queues (given, or more than the default one
// through the daemon's module parameters): the export says it lacks them.
bool poll_queues_asked(const device& dev)
{
    const unsigned poll = dev.info().queues.poll_queues;
    return poll > 1 || (poll > 0 && dev.options().given("poll_queues"));
}

struct export_config {
    int64_t id = -1;
    std::string recovery = "none";
    uint64_t recovery_flags = 0;
    bool user_copy = false;
    bool user_copy_given = false;
    std::string zero_copy = "auto";
    int64_t zero_copy_min = -1;
    bool shared_ring = true;
    bool batch_io = false;
    queue_pinning queue_affinity = queue_pinning::measured;
    idle_spin_mode idle_spin = idle_spin_mode::measured;
    uint64_t idle_spin_max_ns = 1'000'000;
    bool unprivileged = false;
    int add_timeout_ms = 10'000;
    std::vector<std::string> args;  // as given, persisted for recovery
};

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
    c.shared_ring = o->flag("shared_ring");
    c.batch_io = o->flag("batch_io");
    if (c.batch_io) {
        // Batched commands carry no buffer of ours: data moves by USER_COPY
        // or stays in the kernel.
        if (c.user_copy_given && !c.user_copy) {
            return make_error(EINVAL, "batch_io=1: needs user_copy=1");
        }
        c.user_copy = true;
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
    c.args.assign(args.begin(), args.end());
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

bool pid_alive(int32_t pid)
{
    return pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM);
}

// Opens /dev/ublkcN, waiting for devtmpfs/udev to create it (and, for an
// unprivileged device, to give it to us) and for a previous owner to close it.
result<int> open_char_device(uint32_t dev_id, int timeout_ms)
{
    const std::string path = char_path(dev_id);
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
        const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
        if (fd >= 0) {
            return fd;
        }
        const int e = errno;
        if ((e != ENOENT && e != EACCES && e != EBUSY) ||
            std::chrono::steady_clock::now() >= until) {
            return make_error(
                e, fmt::format("{}: {}{}", path, std::strerror(e),
                               e == EACCES ? " (an unprivileged device needs a udev rule "
                                             "that gives /dev/ublkcN to its owner)"
                                           : ""));
        }
        ::usleep(10'000);
    }
}

// Waits until this process may read and write /dev/ublkcN (devtmpfs makes it
// root's 0600; udev hands an unprivileged device's node to its owner).
result<void> wait_char_device_access(uint32_t dev_id, int timeout_ms)
{
    const std::string path = char_path(dev_id);
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
        if (::access(path.c_str(), R_OK | W_OK) == 0) {
            return {};
        }
        const int e = errno;
        if ((e != ENOENT && e != EACCES) || std::chrono::steady_clock::now() >= until) {
            return make_error(
                e, fmt::format("{}: {} after {} ms{}", path, std::strerror(e), timeout_ms,
                               e == EACCES ? " (an unprivileged ublk device needs a udev rule "
                                             "that gives /dev/ublkcN and /dev/ublkbN to their "
                                             "owner, as ublksrv's ublk_dev.rules does)"
                                           : ""));
        }
        ::usleep(10'000);
    }
}

std::string kernel_requirement(uint64_t flag)
{
    switch (flag) {
    case k_f_batch_io:
        return " (Linux 7.3 has it, 6.12 not)";
    case k_f_update_size:
    case k_f_auto_buf_reg:
        return " (Linux 6.16+)";
    case k_f_support_zero_copy:
        return " (Linux 6.15+)";
    case k_f_user_recovery_fail_io:
        return " (Linux 6.13+)";
    case k_f_user_copy:
    case k_f_unprivileged_dev:
        return " (Linux 6.5+)";
    case k_f_zoned:
        return " (Linux 6.6+ built with CONFIG_BLK_DEV_ZONED)";
    case k_f_user_recovery:
    case k_f_user_recovery_reissue:
        return " (Linux 6.0+)";
    default:
        return "";
    }
}

class ublk_export final : public device_export {
public:
    ublk_export(device& dev, const export_context& ctx, export_config cfg,
                std::unique_ptr<control> ctl)
        : _dev(dev),
          _ctx(ctx),
          _cfg(std::move(cfg)),
          _ctl(std::move(ctl)),
          _state_path(state_path(ctx.run_dir, dev.name()))
    {
    }

    ~ublk_export() override { (void)stop(); }

    result<void> start_new();
    result<void> start_recovery(const export_state& st, const dev_info& info);

    nlohmann::json describe() const override;
    result<void> stop() override;
    std::vector<std::string> restart_options() const override
    {
        // The same /dev/ublkbN after a power cycle, unless the user chose.
        if (_cfg.id >= 0 || !_added) {
            return {};
        }
        return {fmt::format("id={}", _info.dev_id)};
    }
    std::string kernel_disk() const override
    {
        return _added && !_stopped ? fmt::format("ublkb{}", _info.dev_id) : std::string();
    }

private:
    result<void> start_queues(unsigned nr_queues, unsigned depth, uint32_t buf_bytes,
                              uint64_t flags);
    void stop_queues(int timeout_ms);
    // Once the disk is live: /dev/ublkbN follows the device's capacity from
    // now on (resize.hpp). `kernel_bytes`: the disk's size, nullopt when
    // unknown (a recovered device). Control thread, without the control lock.
    void follow_capacity(std::optional<uint64_t> kernel_bytes);
    // Undoes a start that failed after ADD_DEV.
    void abandon();
    result<void> persist();

    device& _dev;
    export_context _ctx;
    export_config _cfg;
    std::unique_ptr<control> _ctl;
    std::string _state_path;
    dev_info _info{};
    // Given to the kernel in _info.ublksrv_flags and saved in the state
    // file: proves later that device _info.dev_id is still this one.
    uint64_t _cookie = 0;
    bool _added = false;
    bool _stopped = false;
    bool _recovered = false;
    int _char_fd = -1;
    std::vector<std::unique_ptr<queue_runner>> _queues;
    // queue_affinity=auto on a device of 1 or 2 queues: what its queue
    // threads share (null otherwise).
    std::shared_ptr<device_pinning> _pinning;
    std::unique_ptr<capacity_follower> _follower;
};

result<void> ublk_export::start_queues(unsigned nr_queues, unsigned depth, uint32_t buf_bytes,
                                       uint64_t flags)
{
    if (nr_queues > _dev.info().queues.submit_queues) {
        return make_error(
            EINVAL,
            fmt::format("ublk device {} has {} queues, the softblk device {} only {} "
                        "submit queues",
                        _info.dev_id, nr_queues, _dev.name(), _dev.info().queues.submit_queues));
    }
    auto fd = open_char_device(_info.dev_id, 5000);
    if (!fd) {
        return std::unexpected(fd.error());
    }
    _char_fd = *fd;
    // The pinned way puts every queue's thread on one CPU: with 2 queues
    // a try runs the device at half its threads' CPUs at worst, with more
    // it would starve them, so their threads stay free.
    _pinning = _cfg.queue_affinity == queue_pinning::measured && nr_queues <= k_max_measured_queues
                   ? std::make_shared<device_pinning>()
                   : nullptr;
    for (unsigned q = 0; q < nr_queues; ++q) {
        io_queue& dq = _dev.queue(q);
        if (dq.depth() < depth) {
            return make_error(EINVAL, fmt::format("device queue {} has {} tags, ublk needs {}", q,
                                                  dq.depth(), depth));
        }
        queue_config qc{.q_id = q,
                        .depth = depth,
                        .buf_bytes = buf_bytes,
                        .user_copy = (flags & k_f_user_copy) != 0,
                        .zero_copy = (flags & (k_f_support_zero_copy | k_f_auto_buf_reg)) != 0 &&
                                     _dev.limits().kernel_buffers,
                        .zero_copy_min_bytes = _cfg.zero_copy_min,
                        .target_takes_window = _dev.limits().takes_data_window,
                        .shared_ring = _cfg.shared_ring,
                        .batch = (flags & k_f_batch_io) != 0,
                        .auto_buf_reg = (flags & k_f_auto_buf_reg) != 0,
                        .zoned = (flags & k_f_zoned) != 0,
                        .ioctl_encode = (flags & k_f_cmd_ioctl_encode) != 0 || _ctl->ioctl_encode(),
                        .char_fd = _char_fd,
                        .cpus = {},
                        .one_cpu = _cfg.queue_affinity == queue_pinning::one_cpu,
                        .pinning = _pinning,
                        .idle_spin = _cfg.idle_spin,
                        .idle_spin_max_ns = _cfg.idle_spin_max_ns};
        if (_cfg.queue_affinity == queue_pinning::queue_cpus ||
            _cfg.queue_affinity == queue_pinning::one_cpu) {
            std::lock_guard guard(_ctl->lock());
            if (auto cpus = _ctl->queue_cpus(_info.dev_id, static_cast<uint16_t>(q))) {
                qc.cpus = std::move(*cpus);
            } else {
                spdlog::warn("{}: queue {} left where the scheduler puts it: {}", _dev.name(), q,
                             cpus.error().message);
            }
        }
        auto runner = std::make_unique<queue_runner>(dq, qc);
        if (auto r = runner->start(); !r) {
            return std::unexpected(r.error());
        }
        _queues.push_back(std::move(runner));
    }
    return {};
}

void ublk_export::stop_queues(int timeout_ms)
{
    for (auto& q : _queues) {
        if (!q->wait_exit(timeout_ms)) {
            q->request_exit();
        }
    }
    for (auto& q : _queues) {
        q->join();
    }
    _queues.clear();
    if (_char_fd >= 0) {
        ::close(_char_fd);
        _char_fd = -1;
    }
}

void ublk_export::follow_capacity(std::optional<uint64_t> kernel_bytes)
{
    utsname un{};
    (void)::uname(&un);
    const auto features = _ctl->features();
    capacity_follower::config cfg{
        .device_name = _dev.name(),
        .block_path = block_path(_info.dev_id),
        .can_update = features && (*features & k_f_update_size) != 0,
        .kernel_release = un.release,
        .kernel_bytes = kernel_bytes,
    };
    // The listener runs on the thread that reported the change (the
    // target's own, or the control thread for a written option), never on
    // a queue thread: UPDATE_SIZE goes through the control ring like every
    // control command, under its lock, and does not wait for I/O.
    _follower = std::make_unique<capacity_follower>(_dev, std::move(cfg), [this](uint64_t sectors) {
        std::lock_guard guard(_ctl->lock());
        return _ctl->update_size(_info.dev_id, sectors, 5000);
    });
}

void ublk_export::abandon()
{
    std::lock_guard guard(_ctl->lock());
    if (_added) {
        // STOP_DEV aborts the fetch commands, so the queue threads end.
        (void)_ctl->stop_dev(_info.dev_id);
    }
    stop_queues(2000);
    if (_added) {
        (void)_ctl->del_dev(_info.dev_id);
        _added = false;
    }
    ::unlink(_state_path.c_str());
    _stopped = true;
}

result<void> ublk_export::persist()
{
    export_state st;
    st.device = _dev.name();
    st.target_type = _dev.info().target_type;
    // What the user gave (every effective value would over-determine some
    // targets, e.g. null's size and gb), as the key=value list re-creates it.
    for (const std::string& arg : _dev.options().to_args()) {
        const std::string key = arg.substr(0, arg.find('='));
        if (_dev.options().given(key)) {
            st.device_options.push_back(arg);
        }
    }
    st.export_options = _cfg.args;
    st.dev_id = _info.dev_id;
    st.flags = _info.flags;
    st.nr_queues = _info.nr_hw_queues;
    st.depth = _info.queue_depth;
    st.max_io_buf_bytes = _info.max_io_buf_bytes;
    st.daemon_pid = ::getpid();
    st.cookie = _cookie;
    return write_state(_state_path, st);
}

result<void> ublk_export::start_new()
{
    const auto& q = _dev.info().queues;
    const block_limits& lim = _dev.limits();
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));

    uint64_t want = _cfg.recovery_flags;
    if (_cfg.user_copy) {
        want |= k_f_user_copy;
    }
    if (lim.zoned) {
        // ublk_drv serves zoned devices only with USER_COPY (ublk_ctrl_add_dev).
        if (_cfg.user_copy_given && !_cfg.user_copy) {
            return make_error(EINVAL,
                              "user_copy=0: a zoned device needs user_copy=1 (the "
                              "kernel takes UBLK_F_ZONED only with UBLK_F_USER_COPY)");
        }
        if (_cfg.unprivileged) {
            return make_error(EINVAL,
                              "unprivileged=1: a zoned device needs USER_COPY, which the kernel "
                              "refuses for unprivileged devices; run the daemon as root");
        }
        want |= k_f_zoned | k_f_user_copy;
    }
    if (_cfg.unprivileged) {
        want |= k_f_unprivileged_dev;
    }
    // Zero copy needs USER_COPY beside it (reads and zone reports are still
    // copied, and the kernel maps no per-tag buffers then) and a target
    // that writes only through a file ring.
    if (_cfg.zero_copy == "1") {
        if (!lim.kernel_buffers) {
            return make_error(EINVAL, fmt::format("zero_copy=1: device {} needs the bytes of its "
                                                  "writes in memory (only the file and zloop "
                                                  "targets write from the kernel)",
                                                  _dev.name()));
        }
        want |= k_f_support_zero_copy;
    }
    uint64_t ask = 0;  // asked for, taken only if ADD_DEV grants it
    if (_cfg.zero_copy == "auto" && (want & k_f_user_copy) != 0 && lim.kernel_buffers &&
        !_cfg.unprivileged) {
        ask |= k_f_support_zero_copy;
    }
    if (_cfg.batch_io) {
        want |= k_f_batch_io;
        // Batched, the kernel itself puts a write's pages in the queue's
        // ring, which the file ring borrows (shared_ring) to write them.
        const uint64_t zc = k_f_support_zero_copy;
        if ((want & zc) != 0 && !_cfg.shared_ring) {
            return make_error(EINVAL, "zero_copy=1 with batch_io=1: needs shared_ring=1");
        }
        if ((want & zc) != 0) {
            want = (want & ~zc) | k_f_auto_buf_reg;
        }
        if ((ask & zc) != 0) {
            ask = _cfg.shared_ring ? (ask & ~zc) | k_f_auto_buf_reg : ask & ~zc;
        }
    }
    if (auto features = _ctl->features()) {
        for (unsigned bit = 0; bit < 64; ++bit) {
            const uint64_t f = uint64_t{1} << bit;
            if ((want & f) != 0 && (*features & f) == 0) {
                return make_error(EOPNOTSUPP,
                                  fmt::format("this kernel's ublk driver lacks UBLK_F_{}{} "
                                              "(it offers: {})",
                                              feature_name(bit), kernel_requirement(f),
                                              fmt::join(feature_names(*features), ", ")));
            }
        }
        want |= *features & k_f_cmd_ioctl_encode;
        // Its buffer commands exist only ioctl-encoded.
        if ((*features & k_f_cmd_ioctl_encode) != 0) {
            ask &= *features;
        } else {
            ask = 0;
        }
    } else {
        ask = 0;
    }
    // ublk_drv takes at most UBLK_MAX_QUEUE_DEPTH tags a queue: a deeper
    // device gets that many, as blk_mq_alloc_tag_set reduces a tag set
    // deeper than BLK_MQ_MAX_DEPTH; the attribute keeps its value and the
    // export's description ("depth") shows the tags it has.
    const unsigned depth = std::min(q.queue_depth, k_max_queue_depth);
    // Check what SET_PARAMS would refuse before creating anything.
    const uint32_t buf_bytes = io_buf_bytes_for(lim, page);
    if (auto p = make_params(lim, buf_bytes, page); !p) {
        return std::unexpected(p.error());
    }

    dev_info in{};
    in.nr_hw_queues = static_cast<uint16_t>(q.submit_queues);
    in.queue_depth = static_cast<uint16_t>(depth);
    in.max_io_buf_bytes = buf_bytes;
    in.dev_id = _cfg.id < 0 ? UINT32_MAX : static_cast<uint32_t>(_cfg.id);
    in.ublksrv_pid = ::getpid();
    in.ublksrv_flags = _cookie = new_cookie();
    // (Kernels before 6.15 list SUPPORT_ZERO_COPY among their features
    // without serving it, and clear it at ADD_DEV: what comes back decides.)
    in.flags = want | ask;
    {
        std::lock_guard guard(_ctl->lock());
        auto out = _ctl->add_dev(in, _cfg.add_timeout_ms);
        if (!out) {
            return std::unexpected(out.error());
        }
        _info = *out;
        _added = true;
        _ctl->set_unprivileged((_info.flags & k_f_unprivileged_dev) != 0);
    }
    const uint64_t missing = want & ~_info.flags & ~k_f_cmd_ioctl_encode;
    if (missing != 0) {
        abandon();
        return make_error(EOPNOTSUPP, fmt::format("ublk ADD_DEV dropped {} (kernel too old?)",
                                                  fmt::join(feature_names(missing), ", ")));
    }
    auto p = make_params(lim, _info.max_io_buf_bytes, page);
    if (!p) {
        abandon();
        return std::unexpected(p.error());
    }
    if ((_info.flags & k_f_unprivileged_dev) != 0) {
        // Every later control command of an unprivileged device is checked
        // against the caller's access to /dev/ublkcN, which udev gives to the
        // owner some time after ADD_DEV: wait for it, as SET_PARAMS would
        // fail with EACCES before.
        if (auto r = wait_char_device_access(_info.dev_id, _cfg.add_timeout_ms); !r) {
            abandon();
            return r;
        }
    }
    result<void> params_set;
    {
        std::lock_guard guard(_ctl->lock());
        params_set = _ctl->set_params(_info.dev_id, *p);
    }
    if (!params_set) {
        abandon();  // takes the control lock itself
        return params_set;
    }
    if (auto r = start_queues(_info.nr_hw_queues, _info.queue_depth, _info.max_io_buf_bytes,
                              _info.flags);
        !r) {
        abandon();
        return r;
    }
    result<void> started;
    {
        std::lock_guard guard(_ctl->lock());
        started = _ctl->start_dev(_info.dev_id, ::getpid());
    }
    if (!started) {
        abandon();
        return started;
    }
    if (auto r = persist(); !r) {
        abandon();
        return r;
    }
    follow_capacity(p->basic.dev_sectors * 512);
    if (poll_queues_asked(_dev)) {
        spdlog::warn("{}: poll_queues={} not exported: {}", _dev.name(),
                     _dev.info().queues.poll_queues, k_no_poll_queues);
    }
    return {};
}

result<void> ublk_export::start_recovery(const export_state& st, const dev_info& found)
{
    _info = found;
    _cookie = st.cookie;
    _added = true;
    _ctl->set_unprivileged((_info.flags & k_f_unprivileged_dev) != 0);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
    // The dead daemon's queues are torn down by the kernel (quiesce work)
    // after its io_uring is released; START_USER_RECOVERY says EBUSY until then.
    for (;;) {
        std::lock_guard guard(_ctl->lock());
        auto info = _ctl->get_dev_info(_info.dev_id);
        if (!info || !is_ours(st, *info)) {
            _added = false;
            return info ? make_error(ESTALE, fmt::format("ublk device {} was replaced by another "
                                                         "server's while it waited for recovery",
                                                         _info.dev_id))
                        : std::unexpected(info.error());
        }
        _info = *info;
        auto r = _ctl->start_user_recovery(_info.dev_id);
        if (r) {
            break;
        }
        if (r.error().code.value() != EBUSY || std::chrono::steady_clock::now() >= deadline) {
            _added = false;  // not ours to delete: leave it for another try
            return make_error(
                r.error().code.value(),
                fmt::format("{} (device {} is {}, daemon pid {})", r.error().message, _info.dev_id,
                            state_name(_info.state), _info.ublksrv_pid));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (auto r = start_queues(_info.nr_hw_queues, _info.queue_depth, _info.max_io_buf_bytes,
                              _info.flags);
        !r) {
        // The device stays quiesced for a later attempt.
        stop_queues(0);
        _added = false;
        return r;
    }
    result<void> ended;
    {
        std::lock_guard guard(_ctl->lock());
        ended = _ctl->end_user_recovery(_info.dev_id, ::getpid());
    }
    if (!ended) {
        stop_queues(0);
        _added = false;
        return ended;
    }
    _recovered = true;
    if (auto r = persist(); !r) {
        return r;
    }
    follow_capacity(std::nullopt);
    return {};
}

nlohmann::json ublk_export::describe() const
{
    nlohmann::json out;
    out["dev_id"] = _info.dev_id;
    out["block"] = block_path(_info.dev_id);
    out["char"] = char_path(_info.dev_id);
    out["queues"] = _info.nr_hw_queues;
    out["depth"] = _info.queue_depth;
    out["max_io_buf_bytes"] = _info.max_io_buf_bytes;
    out["flags"] = feature_names(_info.flags);
    out["recovery"] = _cfg.recovery;
    out["user_copy"] = (_info.flags & k_f_user_copy) != 0;
    out["zero_copy"] = (_info.flags & (k_f_support_zero_copy | k_f_auto_buf_reg)) != 0 &&
                       _dev.limits().kernel_buffers;
    out["batch_io"] = (_info.flags & k_f_batch_io) != 0;
    out["unprivileged"] = (_info.flags & k_f_unprivileged_dev) != 0;
    out["recovered"] = _recovered;
    out["state_file"] = _state_path;
    uint64_t requests = 0;
    uint64_t errors = 0;
    uint64_t linked_commits = 0;
    auto zero_copy_from = nlohmann::json::array();
    // Per queue: the CPUs its thread runs on (empty: not pinned).
    auto queue_cpus = nlohmann::json::array();
    // Per queue: whether its thread spins before it sleeps (idle_spin), and
    // of its waits for a request, how many spun.
    auto idle_spinning = nlohmann::json::array();
    auto idle_spin_us = nlohmann::json::array();
    auto idle_spin = nlohmann::json::array();
    auto idle_waits = nlohmann::json::array();
    auto idle_spins = nlohmann::json::array();
    // Per queue, queue_affinity=auto: how often its thread went between
    // free and pinned (queue_cpus says which way it goes now).
    auto pin_switches = nlohmann::json::array();
    // Per queue: the requests it served. The block layer picks a queue by
    // the submitting CPU; a zone's writes queued behind one in flight are
    // submitted from the CPU where that one completed (docs/ublk.md).
    auto queue_requests = nlohmann::json::array();
    for (const auto& q : _queues) {
        const auto c = q->counters();
        requests += c.requests;
        queue_requests.push_back(c.requests);
        errors += c.errors;
        linked_commits += c.linked_commits;
        zero_copy_from.push_back(c.zero_copy_from);
        queue_cpus.push_back(q->pinned_cpus());
        idle_spinning.push_back(c.idle_spinning);
        idle_spin_us.push_back(c.idle_spin_us);
        idle_spin.push_back(q->idle_spin_choice());
        idle_waits.push_back(c.idle_waits);
        idle_spins.push_back(c.idle_spins);
        pin_switches.push_back(c.pin_switches);
    }
    out["queue_cpus"] = queue_cpus;
    out["idle_spinning"] = idle_spinning;
    out["idle_spin_us"] = idle_spin_us;
    out["idle_spin"] = idle_spin;
    out["idle_waits"] = idle_waits;
    out["idle_spins"] = idle_spins;
    if (_cfg.queue_affinity == queue_pinning::measured) {
        out["pin_switches"] = pin_switches;
        // The time per 4 KiB the device served each way ([free, pinned] ns;
        // 0 until measured).
        out["pin_ns_per_4k"] = nlohmann::json::array({_pinning ? _pinning->ns_per_block(false) : 0,
                                                      _pinning ? _pinning->ns_per_block(true) : 0});
    }
    out["requests"] = requests;
    out["queue_requests"] = queue_requests;
    out["errors"] = errors;
    if (out["batch_io"] == true) {
        // Requests the kernel completed through a commit linked after their write.
        out["linked_commits"] = linked_commits;
    }
    if (out["zero_copy"] == true && _cfg.zero_copy_min < 0) {
        // Per queue: the smallest write size measured faster with zero copy.
        out["zero_copy_from"] = zero_copy_from;
    }
    if (_follower) {
        _follower->describe(out);
    }
    // The device's poll queues (null_blk's HCTX_TYPE_POLL) against the
    // disk's: always 0 (k_no_poll_queues).
    out["poll_queues"] = _dev.info().queues.poll_queues;
    out["kernel_poll_queues"] = 0;
    if (poll_queues_asked(_dev)) {
        const std::string w = fmt::format("poll_queues={} not exported: {}",
                                          _dev.info().queues.poll_queues, k_no_poll_queues);
        out["warning"] = out.contains("warning") && out["warning"].is_string()
                             ? out["warning"].get<std::string>() + "; " + w
                             : w;
    }
    if (!_stopped) {
        std::lock_guard guard(_ctl->lock());
        if (auto info = _ctl->get_dev_info(_info.dev_id)) {
            out["state"] = state_name(info->state);
            out["daemon_pid"] = info->ublksrv_pid;
        } else {
            out["state"] = "GONE";
        }
    } else {
        out["state"] = "DELETED";
    }
    return out;
}

result<void> ublk_export::stop()
{
    if (_stopped) {
        return {};
    }
    _stopped = true;
    // No more UPDATE_SIZE (its listener takes the control lock, which a
    // listener call in progress would wait for while this waits for it).
    _follower.reset();
    result<void> first_error;
    std::lock_guard guard(_ctl->lock());
    if (_added) {
        // STOP_DEV deletes the disk (the queues serve what is in flight
        // meanwhile) and then aborts every fetch, which ends the threads.
        if (auto r = _ctl->stop_dev(_info.dev_id); !r && first_error) {
            first_error = std::unexpected(r.error());
        }
    }
    stop_queues(10'000);
    if (_added) {
        if (auto r = _ctl->del_dev(_info.dev_id); !r && first_error) {
            first_error = std::unexpected(r.error());
        }
        _added = false;
    }
    ::unlink(_state_path.c_str());
    return first_error;
}

// A device whose ublk state file survives under RUN_DIR/ublk, with the
// kernel's view of it now.
struct state_entry {
    export_state saved;
    std::string state;         // LIVE, QUIESCED, FAIL_IO, DEAD; GONE: the kernel has no such device
    int32_t daemon_pid = 0;    // the pid the kernel has
    bool recoverable = false;  // USER_RECOVERY device whose daemon is gone
};

// Every state file under ctx.run_dir/ublk, in name order. Control thread.
result<std::vector<state_entry>> list_state(const export_context& ctx)
{
    std::vector<state_entry> out;
    const std::string dir = ctx.run_dir + "/ublk";
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) {
        if (errno == ENOENT) {
            return out;
        }
        const int e = errno;
        return make_error(e, fmt::format("{}: {}", dir, std::strerror(e)));
    }
    std::vector<std::string> files;
    while (dirent* e = ::readdir(d)) {
        const std::string name = e->d_name;
        if (name.size() > 5 && name.ends_with(".json")) {
            files.push_back(dir + "/" + name);
        }
    }
    ::closedir(d);
    std::sort(files.begin(), files.end());
    auto ctl = control::open();
    for (const auto& file : files) {
        auto st = read_state(file);
        if (!st) {
            continue;
        }
        state_entry r{.saved = std::move(*st), .state = "GONE"};
        if (ctl) {
            // A device of that id that is not ours is, for us, gone.
            if (auto info = (*ctl)->get_dev_info(r.saved.dev_id); info && is_ours(r.saved, *info)) {
                r.state = state_name(info->state);
                r.daemon_pid = info->ublksrv_pid;
                r.recoverable = (info->flags & k_f_user_recovery) != 0 &&
                                info->state != k_state_dead && !pid_alive(info->ublksrv_pid);
            }
        }
        out.push_back(std::move(r));
    }
    return out;
}

}  // namespace

std::span<const option_def> export_options()
{
    return k_export_options;
}

bool available()
{
    return control_available();
}

result<std::unique_ptr<device_export>> start_export(device& dev, const export_context& ctx,
                                                    std::span<const std::string> options)
{
    auto cfg = parse_config(ctx, options);
    if (!cfg) {
        return std::unexpected(cfg.error());
    }
    auto ctl = control::open();
    if (!ctl) {
        return std::unexpected(ctl.error());
    }
    const std::string path = state_path(ctx.run_dir, dev.name());
    auto st = read_state(path);
    std::optional<dev_info> recover_from;
    if (st) {
        // A device of this name was exported before: re-attach if the kernel
        // kept it for recovery, clear it away if it is a leftover.
        auto info = (*ctl)->get_dev_info(st->dev_id);
        if (info && !is_ours(*st, *info)) {
            // The id was reused by another device (ours was deleted): not
            // ours to recover, stop or delete.
            spdlog::warn("{}: ublk device {} is no longer the one this device had; left alone",
                         dev.name(), st->dev_id);
            info = make_error(ESTALE, "another device");
        }
        if (info) {
            const bool recoverable_flags = (info->flags & k_f_user_recovery) != 0;
            const bool owner_alive =
                pid_alive(info->ublksrv_pid) && info->ublksrv_pid != ::getpid();
            if (info->state == k_state_live && owner_alive) {
                return make_error(EBUSY, fmt::format("{}: ublk device {} is live, served by pid {}",
                                                     dev.name(), st->dev_id, info->ublksrv_pid));
            }
            if (recoverable_flags && info->state != k_state_dead) {
                recover_from = *info;
            } else {
                // A leftover the kernel did not keep for recovery: remove it.
                (void)(*ctl)->stop_dev(st->dev_id);
                (void)(*ctl)->del_dev(st->dev_id);
            }
        }
        if (!recover_from) {
            ::unlink(path.c_str());
        }
    }
    auto exp = std::make_unique<ublk_export>(dev, ctx, std::move(*cfg), std::move(*ctl));
    if (recover_from) {
        if (auto r = exp->start_recovery(*st, *recover_from); !r) {
            return std::unexpected(r.error());
        }
        return exp;
    }
    if (auto r = exp->start_new(); !r) {
        return std::unexpected(r.error());
    }
    return exp;
}

void cleanup_stale(const export_context& ctx)
{
    auto list = list_state(ctx);
    if (!list) {
        return;
    }
    auto ctl = control::open();
    for (const auto& d : *list) {
        const std::string path = state_path(ctx.run_dir, d.saved.device);
        if (d.state == "GONE") {
            ::unlink(path.c_str());
            continue;
        }
        if (d.recoverable || pid_alive(d.daemon_pid)) {
            continue;
        }
        if (ctl) {
            (void)(*ctl)->stop_dev(d.saved.dev_id);
            (void)(*ctl)->del_dev(d.saved.dev_id);
        }
        ::unlink(path.c_str());
    }
}

result<std::vector<saved_export>> saved_exports(const export_context& ctx)
{
    auto list = list_state(ctx);
    if (!list) {
        return std::unexpected(list.error());
    }
    std::vector<saved_export> out;
    for (auto& d : *list) {
        out.push_back(saved_export{
            .device = std::move(d.saved.device),
            .target_type = std::move(d.saved.target_type),
            .device_options = std::move(d.saved.device_options),
            .export_options = std::move(d.saved.export_options),
            .recoverable = d.recoverable,
            .state = {{"dev_id", d.saved.dev_id}, {"state", d.state}, {"daemon_pid", d.daemon_pid}},
        });
    }
    return out;
}

result<kernel_features> query_kernel_features()
{
    auto ctl = control::open();
    if (!ctl) {
        return std::unexpected(ctl.error());
    }
    kernel_features f;
    f.bits = (*ctl)->features();
    if (f.bits) {
        f.names = feature_names(*f.bits);
    }
    f.ioctl_encode = (*ctl)->ioctl_encode();
    return f;
}

result<nlohmann::json> host_features()
{
    auto f = query_kernel_features();
    if (!f) {
        return std::unexpected(f.error());
    }
    // "text": the line `softblk features` prints.
    std::string text =
        f->bits ? fmt::format("kernel features (0x{:x}): {}", *f->bits, fmt::join(f->names, " "))
                : std::string(
                      "kernel features: not reported (kernel before 6.5, "
                      "no GET_FEATURES)");
    return nlohmann::json{{"bits", f->bits ? nlohmann::json(*f->bits) : nlohmann::json(nullptr)},
                          {"names", f->names},
                          {"ioctl_encode", f->ioctl_encode},
                          {"text", std::move(text)}};
}

}  // namespace softblk::ublk
