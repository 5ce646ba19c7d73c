// file_engine: the allocation map from SEEK_DATA/SEEK_HOLE
// (include/softblk/file_engine.hpp). The ring is in file_ring*.cpp.
#include <softblk/file_engine.hpp>

#include <cerrno>
#include <unistd.h>

namespace softblk {

int file_engine::map_extents(int fd, uint64_t offset, uint64_t length, uint32_t block,
                             std::vector<extent>& out)
{
    const uint64_t end = offset + length;
    const uint64_t mask = block == 0 ? 0 : uint64_t{block} - 1;
    auto append = [&](uint64_t start, uint64_t stop, bool data) {
        if (stop <= start) {
            return;
        }
        if (!out.empty() && out.back().allocated == data &&
            out.back().offset + out.back().length == start) {
            out.back().length += stop - start;
            return;
        }
        out.push_back(
            extent{.offset = start, .length = stop - start, .allocated = data, .zero = !data});
    };
    // A hole counts only in whole blocks: the rounded-off edges are data.
    auto append_hole = [&](uint64_t start, uint64_t stop) {
        const uint64_t a = std::min(stop, (start + mask) & ~mask);
        const uint64_t b = std::max(a, stop & ~mask);
        append(start, a, true);
        append(a, b, false);
        append(b, stop, true);
    };
    uint64_t pos = offset;
    while (pos < end) {
        const off_t data = ::lseek(fd, static_cast<off_t>(pos), SEEK_DATA);
        if (data < 0) {
            const int err = errno;
            if (err == ENXIO) {
                // No data from here to the end of the file.
                append_hole(pos, end);
                return 0;
            }
            if (err == EINVAL || err == EOPNOTSUPP) {
                // No SEEK_DATA here (a block device): everything is data.
                append(pos, end, true);
                return 0;
            }
            return -err;
        }
        const uint64_t d = std::min<uint64_t>(static_cast<uint64_t>(data), end);
        append_hole(pos, d);
        if (d >= end) {
            break;
        }
        const off_t hole = ::lseek(fd, data, SEEK_HOLE);
        if (hole < 0) {
            return -errno;
        }
        const uint64_t h = std::min<uint64_t>(static_cast<uint64_t>(hole), end);
        append(d, h, true);
        pos = h;
    }
    return 0;
}

}  // namespace softblk
