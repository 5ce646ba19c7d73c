// The device's queue choices on the kernel disk of its export (see
// include/softblk/kernel_disk.hpp). null_blk's no_sched makes its tag set
// BLK_MQ_F_NO_SCHED (Linux 6.12 drivers/block/null_blk/main.c,
// null_init_tag_set): the disk has no scheduler at all. softblk does not
// make the kernel's ublk or loop disk, so the nearest it can do is what
// the benchmarks did by hand: "none" in /sys/block/DISK/queue/scheduler.
#include <softblk/kernel_disk.hpp>

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <fmt/core.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <softblk/support/fd_guard.hpp>

namespace softblk {

namespace {

std::string scheduler_path(std::string_view sys_block, std::string_view disk)
{
    return fmt::format("{}/{}/queue/scheduler", sys_block, disk);
}

class disk_choices_export final : public device_export {
public:
    disk_choices_export(std::unique_ptr<device_export> inner, std::string sys_block,
                        std::string disk, std::string previous, std::string error)
        : _inner(std::move(inner)),
          _sys_block(std::move(sys_block)),
          _disk(std::move(disk)),
          _previous(std::move(previous)),
          _error(std::move(error))
    {
    }

    nlohmann::json describe() const override
    {
        nlohmann::json out = _inner->describe();
        if (auto now = disk_scheduler(_sys_block, _disk)) {
            out["scheduler"] = *now;
        }
        if (!_error.empty()) {
            out["scheduler_error"] = _error;
            const std::string w =
                fmt::format("no_sched=1 not applied: {}; the disk keeps its scheduler", _error);
            if (out.contains("warning") && out["warning"].is_string()) {
                out["warning"] = out["warning"].get<std::string>() + "; " + w;
            } else {
                out["warning"] = w;
            }
        }
        return out;
    }

    result<void> stop() override
    {
        auto r = _inner->stop();
        if (r && !_previous.empty()) {
            // Only a disk still there and still as this export left it: a
            // ublk disk is gone by now, a loop device back in the pool.
            if (auto now = disk_scheduler(_sys_block, _disk); now && *now == "none") {
                (void)set_disk_scheduler(_sys_block, _disk, _previous);
            }
            _previous.clear();
        }
        return r;
    }

    std::string in_use() const override { return _inner->in_use(); }
    std::vector<std::string> restart_options() const override { return _inner->restart_options(); }
    std::string kernel_disk() const override { return _inner->kernel_disk(); }

private:
    std::unique_ptr<device_export> _inner;
    std::string _sys_block;
    std::string _disk;
    std::string _previous;  // the scheduler before "none"; empty: nothing to put back
    std::string _error;     // why "none" could not be written
};

}  // namespace

result<std::string> disk_scheduler(std::string_view sys_block, std::string_view disk)
{
    const std::string path = scheduler_path(sys_block, disk);
    fd_guard fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
    if (fd.fd < 0) {
        const int e = errno;
        return make_error(e, fmt::format("{}: {}", path, std::strerror(e)));
    }
    char buf[256];
    const ssize_t n = ::read(fd.fd, buf, sizeof(buf) - 1);
    if (n < 0) {
        const int e = errno;
        return make_error(e, fmt::format("{}: {}", path, std::strerror(e)));
    }
    const std::string_view text(buf, static_cast<size_t>(n));
    const size_t open = text.find('[');
    const size_t close = text.find(']', open == std::string_view::npos ? 0 : open);
    if (open == std::string_view::npos || close == std::string_view::npos) {
        // A queue without elevator support lists just "none".
        const size_t end = text.find_first_of(" \n");
        if (text.substr(0, end) == "none") {
            return std::string("none");
        }
        return make_error(EINVAL, fmt::format("{}: no active scheduler in '{}'", path, text));
    }
    return std::string(text.substr(open + 1, close - open - 1));
}

result<void> set_disk_scheduler(std::string_view sys_block, std::string_view disk,
                                std::string_view scheduler)
{
    const std::string path = scheduler_path(sys_block, disk);
    // O_TRUNC as a shell's redirection opens it (sysfs ignores it).
    fd_guard fd{::open(path.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC)};
    if (fd.fd < 0) {
        const int e = errno;
        return make_error(e, fmt::format("{}: {}", path, std::strerror(e)));
    }
    if (::write(fd.fd, scheduler.data(), scheduler.size()) < 0) {
        const int e = errno;
        return make_error(e,
                          fmt::format("writing '{}' to {}: {}", scheduler, path, std::strerror(e)));
    }
    return {};
}

std::unique_ptr<device_export> apply_disk_choices(device& dev, std::unique_ptr<device_export> exp,
                                                  std::string sys_block)
{
    const std::string disk = exp->kernel_disk();
    if (disk.empty()) {
        return exp;
    }
    std::string previous;
    std::string error;
    if (dev.options().flag("no_sched")) {
        auto before = disk_scheduler(sys_block, disk);
        if (auto r = set_disk_scheduler(sys_block, disk, "none"); !r) {
            error = r.error().message;
        } else if (before && *before != "none") {
            previous = *before;
        }
    }
    return std::make_unique<disk_choices_export>(std::move(exp), std::move(sys_block), disk,
                                                 std::move(previous), std::move(error));
}

}  // namespace softblk
