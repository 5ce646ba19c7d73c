// A FUSE mount's own read-ahead and writeback limits (fuse_bdi.hpp).
#include "fuse_bdi.hpp"

#include <cerrno>
#include <cstring>
#include <fstream>

#include <fmt/format.h>

#include <softblk/support/mountinfo.hpp>
#include <sys/sysmacros.h>

namespace softblk::fat::detail {

namespace {

result<std::string> read_knob(const std::string& path)
{
    std::ifstream in(path);
    std::string value;
    if (!(in >> value)) {
        return make_error(errno != 0 ? errno : EIO, fmt::format("cannot read {}", path));
    }
    return value;
}

result<void> write_knob(const std::string& path, const std::string& value)
{
    std::ofstream out(path);
    out << value << '\n';
    out.flush();
    if (!out) {
        int code = errno != 0 ? errno : EIO;
        return make_error(
            code, fmt::format("cannot write {} to {}: {}", value, path, std::strerror(code)));
    }
    return {};
}

}  // namespace

result<std::string> fuse_mount_device(const std::string& mount_point)
{
    const auto top = top_mount_at(mount_point);
    if (!top || top->source != k_mount_source) {
        return make_error(ENOENT, fmt::format("no {} mount on {} in /proc/self/mountinfo",
                                              k_mount_source, mount_point));
    }
    return fmt::format("{}:{}", major(top->device), minor(top->device));
}

result<bdi_change> set_read_ahead(const std::string& mount_point, unsigned kib,
                                  const std::string& sysfs_bdi)
{
    auto dev = fuse_mount_device(mount_point);
    if (!dev) {
        return std::unexpected(dev.error());
    }
    bdi_change change;
    change.directory = sysfs_bdi + "/" + *dev;
    const std::string knob = change.directory + "/read_ahead_kb";
    auto old = read_knob(knob);
    if (!old) {
        return std::unexpected(old.error());
    }
    if (auto r = write_knob(knob, std::to_string(kib)); !r) {
        return std::unexpected(r.error());
    }
    change.summary = fmt::format("read_ahead_kb {} -> {}", *old, kib);
    return change;
}

result<bdi_change> lift_writeback_limits(const std::string& mount_point,
                                         const std::string& sysfs_bdi)
{
    auto dev = fuse_mount_device(mount_point);
    if (!dev) {
        return std::unexpected(dev.error());
    }
    bdi_change change;
    change.directory = sysfs_bdi + "/" + *dev;
    const std::string strict = change.directory + "/strict_limit";
    const std::string ratio = change.directory + "/max_ratio";
    auto old_strict = read_knob(strict);
    auto old_ratio = read_knob(ratio);
    if (!old_strict || !old_ratio) {
        return make_error(ENOENT, fmt::format("{} has no strict_limit or max_ratio (a kernel "
                                              "older than 6.2?)",
                                              change.directory));
    }
    // max_ratio first: with strict_limit already 0 and max_ratio still 1,
    // the mount's share of a busy system's dirty limit would stay 1%.
    if (auto r = write_knob(ratio, "100"); !r) {
        return std::unexpected(r.error());
    }
    if (auto r = write_knob(strict, "0"); !r) {
        (void)write_knob(ratio, *old_ratio);  // all or nothing
        return std::unexpected(r.error());
    }
    change.summary =
        fmt::format("strict_limit {} -> 0, max_ratio {} -> 100", *old_strict, *old_ratio);
    return change;
}

}  // namespace softblk::fat::detail
