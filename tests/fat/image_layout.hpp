// Reading a FAT image's layout from its boot sector, for tests that damage
// images byte by byte. Needs src/fs/fat on the include path (layout.hpp).
#pragma once

#include <cstdint>
#include <vector>

#include "layout.hpp"

namespace fat_test {

struct image_layout {
    uint32_t bps, spc, reserved, fats, fat_size, root_entries;
    uint64_t data;  // first sector of the data area (cluster 2)

    uint64_t cluster_offset(uint32_t cluster) const
    {
        return (data + uint64_t{cluster - 2} * spc) * bps;
    }
};

inline image_layout layout_of(const std::vector<uint8_t>& img)
{
    using softblk::fat::detail::le16;
    using softblk::fat::detail::le32;
    image_layout l{};
    l.bps = le16(&img[11]);
    l.spc = img[13];
    l.reserved = le16(&img[14]);
    l.fats = img[16];
    l.root_entries = le16(&img[17]);
    l.fat_size = le16(&img[22]) != 0 ? le16(&img[22]) : le32(&img[36]);
    l.data = l.reserved + uint64_t{l.fats} * l.fat_size + (l.root_entries * 32 + l.bps - 1) / l.bps;
    return l;
}

}  // namespace fat_test
