// A FUSE mount's own writeback limits (fuse_bdi.hpp).
#include "fuse_bdi.hpp"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

namespace softblk::fat::detail {

namespace {

// mountinfo writes space, tab, newline and backslash as \ooo. (The FUSE
// export's copy of this, src/frontends/fuse/mounts.cpp, is a front end's
// and not built with every configuration.)
std::string unescape(const std::string& text)
{
    std::string out;
    for (size_t i = 0; i < text.size(); ++i) {
        if (text[i] == '\\' && i + 3 < text.size() &&
            text.substr(i + 1, 3).find_first_not_of("01234567") == std::string::npos) {
            out.push_back(static_cast<char>(std::stoi(text.substr(i + 1, 3), nullptr, 8)));
            i += 3;
        } else {
            out.push_back(text[i]);
        }
    }
    return out;
}

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
    std::ifstream in("/proc/self/mountinfo");
    std::string line;
    std::string found;
    while (std::getline(in, line)) {
        // id parent major:minor root mount_point options [optional...] - fstype source ...
        std::istringstream fields(line);
        std::string id, parent, dev, root, where, options, word, fstype;
        if (!(fields >> id >> parent >> dev >> root >> where >> options)) {
            continue;
        }
        while (fields >> word && word != "-") {
        }
        if (!(fields >> fstype) || fstype.rfind("fuse", 0) != 0) {
            continue;
        }
        if (unescape(where) == mount_point) {
            found = dev;  // the last one is on top
        }
    }
    if (found.empty()) {
        return make_error(ENOENT,
                          fmt::format("no FUSE mount on {} in /proc/self/mountinfo", mount_point));
    }
    return found;
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
