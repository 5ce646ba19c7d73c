#include "memory_limit.hpp"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include <softblk/options.hpp>

namespace softblk::host {

namespace {

std::string read_text(const std::string& path)
{
    std::ifstream in(path);
    std::ostringstream out;
    out << in.rdbuf();
    return out.str();
}

std::vector<std::string_view> split(std::string_view text, char sep)
{
    std::vector<std::string_view> out;
    size_t start = 0;
    for (;;) {
        const size_t end = text.find(sep, start);
        out.push_back(text.substr(start, end == std::string_view::npos ? end : end - start));
        if (end == std::string_view::npos) {
            return out;
        }
        start = end + 1;
    }
}

std::string_view trim(std::string_view s)
{
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\n')) {
        s.remove_prefix(1);
    }
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\n')) {
        s.remove_suffix(1);
    }
    return s;
}

std::optional<uint64_t> to_u64(std::string_view s)
{
    uint64_t v = 0;
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (s.empty() || ec != std::errc() || end != s.data() + s.size()) {
        return std::nullopt;
    }
    return v;
}

// The directory of `cgroup_path` below a mount of its hierarchy whose root
// is `root` (mountinfo's 4th field), or "" when the mount does not show it.
std::string cgroup_dir(std::string_view mount_point, std::string_view root,
                       std::string_view cgroup_path)
{
    if (root == "/") {
        root = "";
    }
    if (cgroup_path.substr(0, root.size()) != root ||
        (cgroup_path.size() > root.size() && cgroup_path[root.size()] != '/')) {
        return {};
    }
    std::string dir(mount_point);
    dir += cgroup_path.substr(root.size());
    while (dir.size() > 1 && dir.back() == '/') {
        dir.pop_back();
    }
    return dir;
}

// `dir` and its parents down to `top`, with `file` appended.
void add_chain(std::vector<std::string>& out, std::string dir, std::string_view top,
               std::string_view file)
{
    for (;;) {
        out.push_back(dir + "/" + std::string(file));
        if (dir.size() <= top.size()) {
            return;
        }
        dir.erase(dir.rfind('/'));
    }
}

}  // namespace

std::optional<uint64_t> parse_meminfo_total(std::string_view meminfo)
{
    for (std::string_view line : split(meminfo, '\n')) {
        if (line.substr(0, 9) != "MemTotal:") {
            continue;
        }
        std::string_view rest = trim(line.substr(9));
        const size_t space = rest.find(' ');
        auto kib = to_u64(rest.substr(0, space));
        if (!kib) {
            return std::nullopt;
        }
        return *kib * 1024;
    }
    return std::nullopt;
}

std::optional<uint64_t> parse_cgroup_limit(std::string_view text)
{
    return to_u64(trim(text));
}

std::vector<std::string> cgroup_limit_files(std::string_view self_cgroup,
                                            std::string_view mountinfo)
{
    std::string v2_path;
    std::string v1_path;
    bool have_v2 = false;
    bool have_v1 = false;
    for (std::string_view line : split(self_cgroup, '\n')) {
        const auto fields = split(line, ':');
        if (fields.size() < 3) {
            continue;
        }
        // The path may itself hold ':'.
        const std::string_view path =
            line.substr(fields[0].size() + fields[1].size() + 2, std::string_view::npos);
        if (fields[0] == "0" && fields[1].empty()) {
            v2_path = path;
            have_v2 = true;
        }
        for (std::string_view controller : split(fields[1], ',')) {
            if (controller == "memory") {
                v1_path = path;
                have_v1 = true;
            }
        }
    }
    std::vector<std::string> out;
    for (std::string_view line : split(mountinfo, '\n')) {
        const size_t dash = line.find(" - ");
        if (dash == std::string_view::npos) {
            continue;
        }
        const auto fields = split(line.substr(0, dash), ' ');
        const auto tail = split(line.substr(dash + 3), ' ');
        if (fields.size() < 5 || tail.size() < 3) {
            continue;
        }
        const std::string_view root = fields[3];
        const std::string_view mount_point = fields[4];
        if (tail[0] == "cgroup2" && have_v2) {
            if (std::string dir = cgroup_dir(mount_point, root, v2_path); !dir.empty()) {
                add_chain(out, dir, mount_point, "memory.max");
            }
        } else if (tail[0] == "cgroup" && have_v1) {
            const auto options = split(tail[2], ',');
            if (std::find(options.begin(), options.end(), "memory") != options.end()) {
                if (std::string dir = cgroup_dir(mount_point, root, v1_path); !dir.empty()) {
                    add_chain(out, dir, mount_point, "memory.limit_in_bytes");
                }
            }
        }
    }
    return out;
}

result<machine_memory> read_machine_memory()
{
    const auto total = parse_meminfo_total(read_text("/proc/meminfo"));
    if (!total) {
        return make_error(ENOENT,
                          "/proc/meminfo has no MemTotal line: cannot derive the daemon's "
                          "memory budget; give --memory-limit");
    }
    machine_memory m{*total, fmt::format("MemTotal ({})", human_bytes(*total))};
    for (const std::string& file :
         cgroup_limit_files(read_text("/proc/self/cgroup"), read_text("/proc/self/mountinfo"))) {
        const auto limit = parse_cgroup_limit(read_text(file));
        if (limit && *limit < m.bytes) {
            m.bytes = *limit;
            m.source = fmt::format("{} ({})", file, human_bytes(*limit));
        }
    }
    return m;
}

result<memory_limit_choice> choose_memory_limit(std::string_view flag,
                                                const machine_memory& machine)
{
    auto share = [&](uint64_t percent) {
        return memory_limit_choice{
            machine.bytes / 100 * percent + machine.bytes % 100 * percent / 100,
            fmt::format("{}% of {}", percent, machine.source)};
    };
    if (flag.empty()) {
        return share(k_default_memory_percent);
    }
    if (flag == "none") {
        return memory_limit_choice{0, "no limit (--memory-limit none)"};
    }
    auto bad = [&](std::string_view why) {
        return make_error(EINVAL, fmt::format("--memory-limit {}: {}; give a size (64M, 4G), a "
                                              "share of the machine's memory (25%) or none",
                                              flag, why));
    };
    if (flag == "0") {
        // A budget of nothing would refuse every device its first byte; the
        // limit's own "0 means none" belongs to the API, not to the flag.
        return bad("0 would refuse the devices every byte; use none for no limit");
    }
    if (flag.back() == '%') {
        auto percent = to_u64(flag.substr(0, flag.size() - 1));
        if (!percent || *percent < 1 || *percent > 100) {
            return bad("a share must be 1% to 100%");
        }
        return share(*percent);
    }
    auto size = parse_size(flag);
    if (!size) {
        return bad(size.error().message);
    }
    if (*size < k_mib) {
        return bad("at least 1 MiB (or none for no limit)");
    }
    return memory_limit_choice{*size, fmt::format("--memory-limit {}", flag)};
}

}  // namespace softblk::host
