// volume_state: construction and the errors every operation reports.
#include "volume_state.hpp"

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace softblk::fat {

namespace detail {

std::vector<std::string> split_path(std::string_view path)
{
    std::vector<std::string> parts;
    size_t i = 0;
    while (i <= path.size()) {
        size_t j = path.find('/', i);
        if (j == std::string_view::npos) {
            j = path.size();
        }
        std::string_view part = path.substr(i, j - i);
        if (part.empty() || part == ".") {
        } else if (part == "..") {
            if (!parts.empty()) {
                parts.pop_back();
            }
        } else {
            parts.emplace_back(part);
        }
        i = j + 1;
    }
    return parts;
}

std::string join_parts(const std::vector<std::string>& parts, size_t count)
{
    std::string out;
    for (size_t i = 0; i < count && i < parts.size(); ++i) {
        if (i > 0) {
            out += '/';
        }
        out += parts[i];
    }
    return out;
}

}  // namespace detail

volume_state::volume_state(block_device& d, const mount_options& o) : dev(d), opts(o)
{
}

std::unexpected<error> volume_state::fail(int rc, std::string_view what)
{
    int code = -rc;
    std::string detail;
    if ((code == EIO || code == ELOOP) && !damage.last().empty()) {
        detail = damage.last();
    } else {
        switch (code) {
        case ENOSPC:
            detail = fmt::format("no space left ({} free clusters of {} bytes)",
                                 fat ? fat->free_count() : 0, g.cluster_bytes);
            break;
        case EFBIG:
            detail = "FAT files are limited to 4 GiB - 1 bytes";
            break;
        case EROFS:
            detail = "the volume is mounted read-only";
            break;
        case ENAMETOOLONG:
            detail = "names are limited to 255 UTF-16 units";
            break;
        case EINVAL:
            detail = "invalid argument (a name may not contain \"*/:<>?\\| or control characters)";
            break;
        default:
            detail = std::strerror(code);
        }
    }
    return std::unexpected<error>(
        error{std::error_code(code, std::generic_category()), fmt::format("{}: {}", what, detail)});
}

int volume_state::check_usable(bool write) const
{
    if (dead || !mounted) {
        return -EIO;
    }
    if (write && read_only) {
        return -EROFS;
    }
    return 0;
}

}  // namespace softblk::fat
