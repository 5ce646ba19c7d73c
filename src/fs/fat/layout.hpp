// On-disk FAT structures: little-endian accessors, directory entry fields,
// timestamps. Internal to softblk_fat.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <ctime>

namespace softblk::fat::detail {

inline uint16_t le16(const uint8_t* p)
{
    return static_cast<uint16_t>(p[0] | (p[1] << 8));
}
inline uint32_t le32(const uint8_t* p)
{
    return uint32_t{p[0]} | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24);
}
inline void put16(uint8_t* p, uint16_t v)
{
    p[0] = static_cast<uint8_t>(v);
    p[1] = static_cast<uint8_t>(v >> 8);
}
inline void put32(uint8_t* p, uint32_t v)
{
    put16(p, static_cast<uint16_t>(v));
    put16(p + 2, static_cast<uint16_t>(v >> 16));
}

inline constexpr uint32_t k_dirent_size = 32;
inline constexpr uint8_t k_attr_lfn = 0x0F;
inline constexpr uint8_t k_attr_mask = 0x3F;
inline constexpr uint8_t k_deleted = 0xE5;
inline constexpr uint8_t k_lfn_last = 0x40;
inline constexpr uint8_t k_nt_lower_base = 0x08;
inline constexpr uint8_t k_nt_lower_ext = 0x10;
inline constexpr uint32_t k_max_dir_entries = 65536;  // 2 MiB of entries, the FAT limit
inline constexpr uint32_t k_max_lfn_units = 255;

// Byte offsets inside a 32-byte short directory entry.
namespace dirent {
inline constexpr int name = 0;
inline constexpr int attr = 11;
inline constexpr int nt_res = 12;
inline constexpr int crt_tenth = 13;
inline constexpr int crt_time = 14;
inline constexpr int crt_date = 16;
inline constexpr int acc_date = 18;
inline constexpr int cluster_hi = 20;
inline constexpr int wrt_time = 22;
inline constexpr int wrt_date = 24;
inline constexpr int cluster_lo = 26;
inline constexpr int size = 28;
}  // namespace dirent

inline uint8_t lfn_checksum(const uint8_t* name83)
{
    uint8_t sum = 0;
    for (int i = 0; i < 11; ++i) {
        sum = static_cast<uint8_t>(((sum & 1) << 7) + (sum >> 1) + name83[i]);
    }
    return sum;
}

// FAT stores local time, 2-second resolution, years 1980..2107.
struct fat_time {
    uint16_t date = 0;
    uint16_t time = 0;
    uint8_t tenth = 0;  // 10 ms units, 0..199
};

inline fat_time to_fat_time(std::time_t t)
{
    std::tm tm{};
    localtime_r(&t, &tm);
    if (tm.tm_year < 80) {
        return fat_time{static_cast<uint16_t>((0 << 9) | (1 << 5) | 1), 0, 0};
    }
    if (tm.tm_year > 207) {
        return fat_time{static_cast<uint16_t>((127 << 9) | (12 << 5) | 31),
                        static_cast<uint16_t>((23 << 11) | (59 << 5) | 29), 199};
    }
    fat_time f;
    f.date = static_cast<uint16_t>(((tm.tm_year - 80) << 9) | ((tm.tm_mon + 1) << 5) | tm.tm_mday);
    f.time = static_cast<uint16_t>((tm.tm_hour << 11) | (tm.tm_min << 5) | (tm.tm_sec / 2));
    f.tenth = static_cast<uint8_t>((tm.tm_sec % 2) * 100);
    return f;
}

// The time_t of a FAT local date and time (0 for an empty or impossible
// date), as mktime() with tm_isdst = -1 gives it (names.cpp).
std::time_t from_fat_time(uint16_t date, uint16_t time, uint8_t tenth = 0);

}  // namespace softblk::fat::detail
