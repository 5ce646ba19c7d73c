#include "ublk_export.hpp"

#include "control.hpp"
#include "params.hpp"
#include "queue_runner.hpp"
#include "resize.hpp"
#include "export_config.hpp"
#include "state.hpp"

#include <softblk/external_data.hpp>
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
                                     _dev.takes_external_data().kernel_buffers,
                        .zero_copy_min_bytes = _cfg.zero_copy_min,
                        .target_takes_window = _dev.takes_external_data().data_windows,
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
    // Kernel facts only: the device's settings are the host library's.
    st.device = _dev.name();
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
    // Whether its target writes from the kernel's pages (external_data.hpp).
    const bool kernel_buffers = _dev.takes_external_data().kernel_buffers;
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
        if (!kernel_buffers) {
            return make_error(EINVAL, fmt::format("zero_copy=1: device {} needs the bytes of its "
                                                  "writes in memory (only the file and zloop "
                                                  "targets write from the kernel)",
                                                  _dev.name()));
        }
        want |= k_f_support_zero_copy;
    }
    uint64_t ask = 0;  // asked for, taken only if ADD_DEV grants it
    if (_cfg.zero_copy == "auto" && (want & k_f_user_copy) != 0 && kernel_buffers &&
        !_cfg.unprivileged) {
        ask |= k_f_support_zero_copy;
    }
    if (_cfg.batch_io) {
        want |= k_f_batch_io;
    }
    const auto features = _ctl->features();
    if (auto placed = place_zero_copy(_cfg, want, ask, features); placed) {
        want = placed->want;
        ask = placed->ask;
    } else {
        return std::unexpected(placed.error());
    }
    if (features) {
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
                       _dev.takes_external_data().kernel_buffers;
    if (out["zero_copy"] == true) {
        // How a zero-copy write's pages reach the queue's ring: put there
        // by the kernel (AUTO_BUF_REG), or with register entries.
        out["zero_copy_way"] =
            (_info.flags & k_f_auto_buf_reg) != 0 ? "auto_buf_reg" : "register_entries";
    }
    out["batch_io"] = (_info.flags & k_f_batch_io) != 0;
    out["unprivileged"] = (_info.flags & k_f_unprivileged_dev) != 0;
    out["recovered"] = _recovered;
    out["state_file"] = _state_path;
    uint64_t requests = 0;
    uint64_t errors = 0;
    uint64_t linked_commits = 0;
    uint64_t buffer_registers = 0;
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
        buffer_registers += c.buffer_registers;
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
    if (out["zero_copy"] == true) {
        // The register entries zero-copy writes took (none with AUTO_BUF_REG).
        out["buffer_registers"] = buffer_registers;
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

}  // namespace

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

}  // namespace softblk::ublk
