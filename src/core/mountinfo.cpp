// /proc/self/mountinfo (include/softblk/support/mountinfo.hpp).
#include <softblk/support/mountinfo.hpp>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <sys/sysmacros.h>

namespace softblk {

namespace {

// mountinfo escapes space, tab, newline and backslash as \ooo.
std::string unescape(const std::string& text)
{
    std::string out;
    out.reserve(text.size());
    for (size_t i = 0; i < text.size(); ++i) {
        if (text[i] == '\\' && i + 3 < text.size()) {
            const std::string octal = text.substr(i + 1, 3);
            if (octal.find_first_not_of("01234567") == std::string::npos) {
                out.push_back(static_cast<char>(std::stoi(octal, nullptr, 8)));
                i += 3;
                continue;
            }
        }
        out.push_back(text[i]);
    }
    return out;
}

}  // namespace

std::vector<mount_entry> read_mounts()
{
    std::vector<mount_entry> out;
    std::ifstream in("/proc/self/mountinfo");
    std::string line;
    while (std::getline(in, line)) {
        // id parent major:minor root mount_point options [optional...] - fstype source super_options
        std::istringstream fields(line);
        std::string id, parent, dev, root, mount_point, options, word;
        if (!(fields >> id >> parent >> dev >> root >> mount_point >> options)) {
            continue;
        }
        while (fields >> word && word != "-") {
        }
        mount_entry entry;
        if (!(fields >> entry.fstype >> entry.source)) {
            continue;
        }
        entry.mount_point = unescape(mount_point);
        entry.source = unescape(entry.source);
        unsigned major_number = 0;
        unsigned minor_number = 0;
        if (std::sscanf(dev.c_str(), "%u:%u", &major_number, &minor_number) == 2) {
            entry.device = makedev(major_number, minor_number);
        }
        out.push_back(std::move(entry));
    }
    return out;
}

std::optional<mount_entry> top_mount_at(const std::string& mount_point)
{
    std::optional<mount_entry> top;
    for (mount_entry& entry : read_mounts()) {
        if (entry.mount_point == mount_point) {
            top = std::move(entry);
        }
    }
    return top;
}

}  // namespace softblk
