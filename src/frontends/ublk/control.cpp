#include "control.hpp"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <fmt/core.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

namespace softblk::ublk {

namespace {

std::string errno_text(int e)
{
    return std::strerror(e < 0 ? -e : e);
}

// Runs `modprobe ublk_drv` (no shell). Returns its exit status.
int run_modprobe()
{
    const pid_t pid = ::fork();
    if (pid < 0) {
        return -1;
    }
    if (pid == 0) {
        const int null_fd = ::open("/dev/null", O_RDWR);
        if (null_fd >= 0) {
            ::dup2(null_fd, 1);
            ::dup2(null_fd, 2);
        }
        ::execlp("modprobe", "modprobe", "-q", "ublk_drv", static_cast<char*>(nullptr));
        ::_exit(127);
    }
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

bool control_available()
{
    if (::access(k_control_path, F_OK) == 0) {
        return ::access(k_control_path, R_OK | W_OK) == 0;
    }
    static std::once_flag tried;
    std::call_once(tried, [] {
        if (::geteuid() == 0) {
            run_modprobe();
        }
    });
    // devtmpfs creates the node as the module registers its misc device.
    for (int i = 0; i < 20 && ::access(k_control_path, F_OK) != 0; ++i) {
        ::usleep(10'000);
    }
    // A user may use ublk only where udev made the control node theirs to
    // open (ublksrv's rule: mode 0666); otherwise the next export serves.
    return ::access(k_control_path, R_OK | W_OK) == 0;
}

std::string char_path(uint32_t dev_id)
{
    return fmt::format("/dev/ublkc{}", dev_id);
}
std::string block_path(uint32_t dev_id)
{
    return fmt::format("/dev/ublkb{}", dev_id);
}

result<std::unique_ptr<control>> control::open()
{
    if (!control_available()) {
        return make_error(
            ENODEV, fmt::format("{}: not there (the kernel has no ublk_drv, or it could not be "
                                "loaded: modprobe ublk_drv as root)",
                                k_control_path));
    }
    std::unique_ptr<control> c(new control());
    c->_fd = ::open(k_control_path, O_RDWR | O_CLOEXEC);
    if (c->_fd < 0) {
        const int e = errno;
        return make_error(e,
                          fmt::format("{}: {} (root, or a udev rule that opens it to your user, is "
                                      "needed)",
                                      k_control_path, errno_text(e)));
    }
    if (auto r = c->reopen_ring(); !r) {
        return std::unexpected(r.error());
    }
    // GET_FEATURES exists only ioctl-encoded; an older kernel answers
    // -EOPNOTSUPP (or -EINVAL) and takes only legacy opcodes.
    uint64_t features = 0;
    ctrl_cmd cmd{};
    cmd.dev_id = UINT32_MAX;
    cmd.queue_id = UINT16_MAX;
    cmd.addr = reinterpret_cast<uint64_t>(&features);
    cmd.len = k_features_len;
    c->_ioctl_encode = true;
    const int r = c->run(k_cmd_get_features, cmd, 5000);
    if (r == 0) {
        c->_features = features;
        c->_ioctl_encode = (features & k_f_cmd_ioctl_encode) != 0;
    } else {
        c->_ioctl_encode = false;
    }
    return c;
}

control::~control()
{
    if (_ring_ok) {
        io_uring_queue_exit(&_ring);
    }
    if (_fd >= 0) {
        ::close(_fd);
    }
}

result<void> control::reopen_ring()
{
    if (_ring_ok) {
        io_uring_queue_exit(&_ring);
        _ring_ok = false;
    }
    io_uring_params p{};
    p.flags = IORING_SETUP_SQE128;
    const int r = io_uring_queue_init_params(4, &_ring, &p);
    if (r < 0) {
        return make_error(
            -r, fmt::format("io_uring with 128-byte SQEs for {}: {} (ublk needs Linux 6.0+ "
                            "with io_uring enabled: sysctl kernel.io_uring_disabled=0)",
                            k_control_path, errno_text(r)));
    }
    _ring_ok = true;
    return {};
}

int control::run(uint8_t nr, ctrl_cmd cmd, int timeout_ms)
{
    if (!_ring_ok) {
        if (auto r = reopen_ring(); !r) {
            return -r.error().code.value();
        }
    }
    io_uring_sqe* sqe = io_uring_get_sqe(&_ring);
    if (sqe == nullptr) {
        return -EBUSY;
    }
    std::memset(sqe, 0, 2 * sizeof(io_uring_sqe));
    sqe->opcode = IORING_OP_URING_CMD;
    sqe->fd = _fd;
    sqe->cmd_op = ctrl_op(nr, _ioctl_encode);
    std::memcpy(sqe->cmd, &cmd, sizeof(cmd));
    io_uring_sqe_set_data64(sqe, nr);
    int r = io_uring_submit(&_ring);
    if (r < 0) {
        return r;
    }
    io_uring_cqe* cqe = nullptr;
    for (;;) {
        if (timeout_ms < 0) {
            r = io_uring_wait_cqe(&_ring, &cqe);
        } else {
            __kernel_timespec ts{.tv_sec = timeout_ms / 1000,
                                 .tv_nsec = (timeout_ms % 1000) * 1'000'000LL};
            r = io_uring_wait_cqe_timeout(&_ring, &cqe, &ts);
        }
        if (r == -EINTR) {
            continue;
        }
        break;
    }
    if (r == -ETIME) {
        // The command is stuck in the kernel; this ring cannot be trusted
        // to answer the next one in order. Let the kernel reap it.
        io_uring_queue_exit(&_ring);
        _ring_ok = false;
        return -ETIMEDOUT;
    }
    if (r < 0) {
        return r;
    }
    const int res = cqe->res;
    io_uring_cqe_seen(&_ring, cqe);
    return res;
}

int control::run_with_payload(uint8_t nr, uint32_t dev_id, void* payload, uint16_t len,
                              bool with_path, uint64_t data0, int timeout_ms)
{
    ctrl_cmd cmd{};
    cmd.dev_id = dev_id;
    cmd.queue_id = UINT16_MAX;
    cmd.data[0] = data0;
    std::vector<char> buffer;
    if (with_path) {
        const std::string path = char_path(dev_id);
        const size_t path_len = path.size() + 1;  // with the NUL, as the kernel wants
        buffer.resize(path_len + len);
        std::memcpy(buffer.data(), path.c_str(), path_len);
        if (len != 0) {
            std::memcpy(buffer.data() + path_len, payload, len);
        }
        cmd.addr = reinterpret_cast<uint64_t>(buffer.data());
        cmd.len = static_cast<uint16_t>(buffer.size());
        cmd.dev_path_len = static_cast<uint16_t>(path_len);
    } else {
        cmd.addr = reinterpret_cast<uint64_t>(payload);
        cmd.len = len;
    }
    const int r = run(nr, cmd, timeout_ms);
    if (with_path && r >= 0 && len != 0) {
        std::memcpy(payload, buffer.data() + cmd.dev_path_len, len);
    }
    return r;
}

result<dev_info> control::add_dev(const dev_info& in, int timeout_ms)
{
    dev_info info = in;
    ctrl_cmd cmd{};
    cmd.dev_id = in.dev_id;
    cmd.queue_id = UINT16_MAX;
    cmd.addr = reinterpret_cast<uint64_t>(&info);
    cmd.len = sizeof(info);
    const int r = run(k_cmd_add_dev, cmd, timeout_ms);
    if (r == -ETIMEDOUT) {
        return make_error(ETIMEDOUT,
                          fmt::format("ublk ADD_DEV did not answer within {} ms (a known hang of "
                                      "some kernels); raise add_timeout or update the kernel",
                                      timeout_ms));
    }
    if (r == -EEXIST) {
        return make_error(EEXIST,
                          fmt::format("ublk ADD_DEV: device id {} is taken (/dev/ublkc{} exists)",
                                      in.dev_id, in.dev_id));
    }
    if (r == -EPERM) {
        return make_error(EPERM,
                          "ublk ADD_DEV: permission denied (run as root, or the kernel must allow "
                          "unprivileged ublk devices: UBLK_F_UNPRIVILEGED_DEV, Linux 6.5+)");
    }
    if (r < 0) {
        return make_error(
            -r, fmt::format("ublk ADD_DEV (queues {}, depth {}, flags {:#x}): {}", in.nr_hw_queues,
                            in.queue_depth, in.flags, errno_text(r)));
    }
    if (!_features) {
        // Kernels without GET_FEATURES: what ADD_DEV granted is all we know.
        _ioctl_encode = (info.flags & k_f_cmd_ioctl_encode) != 0;
    }
    return info;
}

result<void> control::set_params(uint32_t dev_id, const params& p)
{
    params copy = p;
    const int r = run_with_payload(k_cmd_set_params, dev_id, &copy, sizeof(copy), _unprivileged);
    if (r < 0) {
        return make_error(-r,
                          fmt::format("ublk SET_PARAMS on device {} (block size {}, {} sectors, "
                                      "max_sectors {}): {}",
                                      dev_id, 1u << p.basic.logical_bs_shift, p.basic.dev_sectors,
                                      p.basic.max_sectors, errno_text(r)));
    }
    return {};
}

result<void> control::start_dev(uint32_t dev_id, int32_t daemon_pid)
{
    const int r = run_with_payload(k_cmd_start_dev, dev_id, nullptr, 0, _unprivileged,
                                   static_cast<uint64_t>(daemon_pid));
    if (r < 0) {
        return make_error(-r,
                          fmt::format("ublk START_DEV on device {}: {}", dev_id, errno_text(r)));
    }
    return {};
}

result<void> control::stop_dev(uint32_t dev_id)
{
    const int r = run_with_payload(k_cmd_stop_dev, dev_id, nullptr, 0, _unprivileged);
    if (r < 0) {
        return make_error(-r, fmt::format("ublk STOP_DEV on device {}: {}", dev_id, errno_text(r)));
    }
    return {};
}

result<void> control::del_dev(uint32_t dev_id)
{
    const int r = run_with_payload(k_cmd_del_dev, dev_id, nullptr, 0, _unprivileged);
    if (r < 0) {
        return make_error(-r, fmt::format("ublk DEL_DEV on device {}: {}", dev_id, errno_text(r)));
    }
    return {};
}

result<dev_info> control::get_dev_info(uint32_t dev_id)
{
    dev_info info{};
    // GET_DEV_INFO2 carries the char device path (so the kernel can check
    // an unprivileged caller); kernels before 6.5 only have GET_DEV_INFO.
    int r = run_with_payload(k_cmd_get_dev_info2, dev_id, &info, sizeof(info), true);
    if (r == -EOPNOTSUPP || (r == -EINVAL && !_features)) {
        r = run_with_payload(k_cmd_get_dev_info, dev_id, &info, sizeof(info), false);
    }
    if (r < 0) {
        return make_error(-r,
                          fmt::format("ublk GET_DEV_INFO on device {}: {}", dev_id, errno_text(r)));
    }
    return info;
}

result<void> control::start_user_recovery(uint32_t dev_id)
{
    const int r = run_with_payload(k_cmd_start_user_recovery, dev_id, nullptr, 0, _unprivileged);
    if (r < 0) {
        return make_error(
            -r, fmt::format("ublk START_USER_RECOVERY on device {}: {}", dev_id, errno_text(r)));
    }
    return {};
}

result<void> control::end_user_recovery(uint32_t dev_id, int32_t daemon_pid)
{
    const int r = run_with_payload(k_cmd_end_user_recovery, dev_id, nullptr, 0, _unprivileged,
                                   static_cast<uint64_t>(daemon_pid));
    if (r < 0) {
        return make_error(
            -r, fmt::format("ublk END_USER_RECOVERY on device {}: {}", dev_id, errno_text(r)));
    }
    return {};
}

result<void> control::update_size(uint32_t dev_id, uint64_t sectors, int timeout_ms)
{
    const int r =
        run_with_payload(k_cmd_update_size, dev_id, nullptr, 0, _unprivileged, sectors, timeout_ms);
    if (r < 0) {
        return make_error(-r, fmt::format("ublk UPDATE_SIZE on device {} ({} sectors): {}", dev_id,
                                          sectors, errno_text(r)));
    }
    return {};
}

result<std::vector<unsigned>> control::queue_cpus(uint32_t dev_id, uint16_t q_id)
{
    // The kernel fills a cpumask of our length (a multiple of 8 bytes
    // covering every possible CPU): cpu_set_t's 1024 bits.
    cpu_set_t set;
    CPU_ZERO(&set);
    const int r =
        run_with_payload(k_cmd_get_queue_affinity, dev_id, &set, sizeof(set), _unprivileged, q_id);
    if (r < 0) {
        return make_error(-r, fmt::format("ublk GET_QUEUE_AFFINITY on device {} queue {}: {}",
                                          dev_id, q_id, errno_text(r)));
    }
    std::vector<unsigned> cpus;
    for (unsigned cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
        if (CPU_ISSET(cpu, &set)) {
            cpus.push_back(cpu);
        }
    }
    return cpus;
}

}  // namespace softblk::ublk
