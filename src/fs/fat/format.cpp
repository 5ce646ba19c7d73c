// mkfs: cluster size and FAT type chosen as mkfs.fat (dosfstools 4.2) does.
#include <softblk/fat/volume.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>

#include <fmt/format.h>

#include "layout.hpp"

namespace softblk::fat {

using namespace detail;

namespace {

constexpr uint32_t k_max_clusters12 = 4084;  // 4085 and 4086 are ambiguous between readers
constexpr uint32_t k_min_clusters16 = 4087;
constexpr uint32_t k_max_clusters16 = 65524;
constexpr uint32_t k_min_clusters32 = 65525;
constexpr uint32_t k_max_clusters32 = 0x0FFFFFF5;

struct layout {
    uint32_t reserved = 0;
    uint32_t fat_sectors = 0;
    uint32_t root_sectors = 0;
    uint64_t data_start = 0;
    uint64_t clusters = 0;
    bool fits = false;
};

layout compute(fat_type type, uint64_t total, uint32_t bps, uint32_t spc, uint32_t fats,
               uint32_t root_entries, bool align)
{
    layout l;
    l.root_sectors = type == fat_type::fat32 ? 0 : (root_entries * 32 + bps - 1) / bps;
    uint32_t base_reserved = type == fat_type::fat32 ? 32 : 1;
    uint32_t bits = static_cast<uint32_t>(type);
    uint64_t fat_sectors = 1;
    for (int iter = 0; iter < 64; ++iter) {
        l.reserved = base_reserved;
        uint64_t start = l.reserved + fats * fat_sectors + l.root_sectors;
        if (align && start % spc != 0) {
            l.reserved += static_cast<uint32_t>(spc - start % spc);
            start = l.reserved + fats * fat_sectors + l.root_sectors;
        }
        if (start >= total) {
            return l;
        }
        uint64_t clusters = (total - start) / spc;
        uint64_t need = ((clusters + 2) * bits / 8 + (bits == 12 ? 1 : 0) + bps - 1) / bps;
        if (need <= fat_sectors) {
            l.fat_sectors = static_cast<uint32_t>(fat_sectors);
            l.data_start = start;
            l.clusters = clusters;
            l.fits = clusters > 0;
            return l;
        }
        fat_sectors = need;
    }
    return l;
}

uint32_t fat32_default_cluster(uint64_t bytes)
{
    if (bytes <= 260 * k_mib) {
        return 512;
    }
    if (bytes <= 8192 * k_mib) {
        return 4096;
    }
    if (bytes <= 16384 * k_mib) {
        return 8192;
    }
    if (bytes <= 32768 * k_mib) {
        return 16384;
    }
    return 32768;
}

std::string size_text(uint64_t bytes)
{
    if (bytes >= k_mib) {
        return fmt::format("{} MiB", bytes / k_mib);
    }
    return fmt::format("{} KiB", bytes / 1024);
}

}  // namespace

result<void> format(block_device& device, const format_options& options)
{
    uint32_t dss = device.sector_size();
    uint32_t bps = options.sector_size != 0 ? options.sector_size : std::max<uint32_t>(512, dss);
    if (bps != 512 && bps != 1024 && bps != 2048 && bps != 4096) {
        return make_error(EINVAL,
                          fmt::format("sector size {}: must be 512, 1024, 2048 or 4096", bps));
    }
    if (bps % dss != 0) {
        return make_error(
            EINVAL,
            fmt::format("sector size {}: must be a multiple of the device's {}-byte sectors", bps,
                        dss));
    }
    uint32_t ratio = bps / dss;
    uint64_t device_bytes = device.sector_count() * dss;
    uint64_t bytes =
        options.size_bytes != 0 ? std::min(options.size_bytes, device_bytes) : device_bytes;
    uint64_t total = std::min<uint64_t>(bytes / bps, 0xFFFFFFFFull);
    if (total < 16) {
        return make_error(
            EINVAL, fmt::format("{} bytes is too small for a FAT file system (at least {} bytes)",
                                bytes, 16 * bps));
    }
    if (options.fat_count < 1 || options.fat_count > 4) {
        return make_error(EINVAL, fmt::format("fat_count {}: must be 1..4", options.fat_count));
    }
    if (options.cluster_size != 0 &&
        ((options.cluster_size & (options.cluster_size - 1)) != 0 || options.cluster_size < bps ||
         options.cluster_size / bps > 128)) {
        return make_error(EINVAL,
                          fmt::format("cluster size {}: must be a power of two from {} to {}",
                                      options.cluster_size, bps, 128 * bps));
    }
    uint32_t root_entries = options.root_entries != 0 ? options.root_entries : 512;
    root_entries = (root_entries * 32 + bps - 1) / bps * bps / 32;
    bool align = bytes > 4 * k_mib;
    uint32_t fats = options.fat_count;

    fat_type type = options.type.value_or(bytes >= 512 * k_mib ? fat_type::fat32 : fat_type::fat12);
    bool auto_type = !options.type.has_value() && type != fat_type::fat32;
    uint32_t cluster = options.cluster_size;
    layout l;
    if (type == fat_type::fat32) {
        if (cluster == 0) {
            cluster = std::max(bps, fat32_default_cluster(bytes));
        }
        for (;;) {
            l = compute(fat_type::fat32, total, bps, cluster / bps, fats, 0, true);
            if (l.fits && l.clusters < k_min_clusters32 && options.cluster_size == 0 &&
                cluster > bps) {
                cluster /= 2;
                continue;
            }
            if (l.fits && l.clusters > k_max_clusters32 && options.cluster_size == 0 &&
                cluster < 128 * bps) {
                cluster *= 2;
                continue;
            }
            break;
        }
        if (!l.fits || l.clusters < k_min_clusters32) {
            uint64_t need = uint64_t{k_min_clusters32} * cluster + 32ull * bps +
                            uint64_t{fats} * ((uint64_t{k_min_clusters32} + 2) * 4 + bps) + k_mib -
                            1;
            need = need / k_mib * k_mib;
            return make_error(
                EINVAL,
                fmt::format("FAT32 needs at least {} clusters; {} with {}-byte clusters holds "
                            "{}; use FAT16, or a volume of at least {}",
                            k_min_clusters32, size_text(bytes), cluster, l.clusters,
                            size_text(need)));
        }
        if (l.clusters > k_max_clusters32) {
            return make_error(
                EINVAL,
                fmt::format("{} clusters is more than FAT32 allows; use a larger cluster size",
                            l.clusters));
        }
    } else {
        if (cluster == 0) {
            cluster = std::max<uint32_t>(bps, 2048);
        }
        for (;;) {
            if (type == fat_type::fat12 || auto_type) {
                l = compute(fat_type::fat12, total, bps, cluster / bps, fats, root_entries, align);
                if (l.fits && l.clusters <= k_max_clusters12) {
                    type = fat_type::fat12;
                    break;
                }
                if (!auto_type) {
                    if (options.cluster_size != 0 || cluster >= 128 * bps) {
                        return make_error(
                            EINVAL,
                            fmt::format("FAT12 holds at most {} clusters; {} with {}-byte "
                                        "clusters has {}; use a larger cluster size or FAT16",
                                        k_max_clusters12, size_text(bytes), cluster, l.clusters));
                    }
                    cluster *= 2;
                    continue;
                }
            }
            l = compute(fat_type::fat16, total, bps, cluster / bps, fats, root_entries, align);
            if (l.fits && l.clusters >= k_min_clusters16 && l.clusters <= k_max_clusters16) {
                type = fat_type::fat16;
                break;
            }
            bool can_grow = options.cluster_size == 0 && cluster < 128 * bps && cluster < 65536;
            if (l.fits && l.clusters > k_max_clusters16 && can_grow) {
                cluster *= 2;
                continue;
            }
            if (l.fits && l.clusters < k_min_clusters16) {
                if (auto_type && can_grow) {
                    cluster *= 2;  // lands in FAT12 range, never on 4085/4086
                    continue;
                }
                if (!auto_type && options.cluster_size == 0 && cluster > bps) {
                    cluster /= 2;
                    continue;
                }
            }
            return make_error(
                EINVAL, fmt::format("FAT16 needs {}..{} clusters; {} with {}-byte clusters has {}; "
                                    "use {}",
                                    k_min_clusters16, k_max_clusters16, size_text(bytes), cluster,
                                    l.clusters,
                                    l.clusters < k_min_clusters16 ? "FAT12 or a bigger volume"
                                                                  : "FAT32 or larger clusters"));
        }
    }
    uint32_t spc = cluster / bps;

    // ---- write it
    uint32_t volume_id = options.volume_id;
    if (volume_id == 0) {
        timespec ts{};
        clock_gettime(CLOCK_REALTIME, &ts);
        volume_id = static_cast<uint32_t>(ts.tv_sec) ^ static_cast<uint32_t>(ts.tv_nsec);
    }
    std::string label = options.label.empty() ? "NO NAME" : options.label;
    if (label.size() > 11) {
        return make_error(EINVAL, fmt::format("label \"{}\": at most 11 characters", label));
    }
    for (auto& c : label) {
        c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
        if (static_cast<unsigned char>(c) < 0x20 || std::strchr("*?<>|\"\\/:.", c) != nullptr) {
            return make_error(EINVAL, fmt::format("label \"{}\": character '{}' is not allowed",
                                                  options.label, c));
        }
    }
    char label11[12];
    std::snprintf(label11, sizeof label11, "%-11s", label.c_str());

    std::vector<uint8_t> boot(bps, 0);
    uint8_t* b = boot.data();
    b[0] = 0xEB;
    b[1] = type == fat_type::fat32 ? 0x58 : 0x3C;
    b[2] = 0x90;
    std::memcpy(b + 3, "SOFTBLK ", 8);
    put16(b + 11, static_cast<uint16_t>(bps));
    b[13] = static_cast<uint8_t>(spc);
    put16(b + 14, static_cast<uint16_t>(l.reserved));
    b[16] = static_cast<uint8_t>(fats);
    put16(b + 17, static_cast<uint16_t>(type == fat_type::fat32 ? 0 : root_entries));
    bool small = total < 65536 && type != fat_type::fat32;
    put16(b + 19, static_cast<uint16_t>(small ? total : 0));
    b[21] = 0xF8;
    put16(b + 22, static_cast<uint16_t>(type == fat_type::fat32 ? 0 : l.fat_sectors));
    put16(b + 24, 32);
    put16(b + 26, 64);
    put32(b + 28, 0);
    put32(b + 32, static_cast<uint32_t>(small ? 0 : total));
    int ext = 36;
    if (type == fat_type::fat32) {
        put32(b + 36, l.fat_sectors);
        put16(b + 40, 0);
        put16(b + 42, 0);
        put32(b + 44, 2);
        put16(b + 48, 1);
        put16(b + 50, 6);
        ext = 64;
    }
    b[ext] = 0x80;
    b[ext + 1] = 0;
    b[ext + 2] = 0x29;
    put32(b + ext + 3, volume_id);
    std::memcpy(b + ext + 7, label11, 11);
    std::memcpy(b + ext + 18,
                type == fat_type::fat12   ? "FAT12   "
                : type == fat_type::fat16 ? "FAT16   "
                                          : "FAT32   ",
                8);
    // Boot code: print nothing, wait forever (this is not a boot disk).
    b[ext + 26] = 0xF4;
    b[ext + 27] = 0xEB;
    b[ext + 28] = 0xFD;
    b[510] = 0x55;
    b[511] = 0xAA;

    auto write = [&](uint64_t sector, uint64_t count, const uint8_t* data) -> int {
        return device.write(sector * ratio, static_cast<uint32_t>(count * ratio), data);
    };
    std::vector<uint8_t> zeros(std::max<uint32_t>(bps, 1024 * 1024), 0);
    auto zero = [&](uint64_t sector, uint64_t count) -> int {
        uint64_t per = zeros.size() / bps;
        while (count > 0) {
            uint64_t n = std::min(count, per);
            int rc = write(sector, n, zeros.data());
            if (rc < 0) {
                return rc;
            }
            sector += n;
            count -= n;
        }
        return 0;
    };
    auto io_error = [&](int rc) {
        return make_error(-rc, fmt::format("mkfs: writing: {}", std::strerror(-rc)));
    };

    int rc = zero(0, l.data_start + (type == fat_type::fat32 ? spc : 0));
    if (rc < 0) {
        return io_error(rc);
    }
    rc = write(0, 1, b);
    if (rc < 0) {
        return io_error(rc);
    }
    if (type == fat_type::fat32) {
        std::vector<uint8_t> fsi(bps, 0);
        put32(fsi.data(), 0x41615252);
        put32(fsi.data() + 484, 0x61417272);
        put32(fsi.data() + 488, static_cast<uint32_t>(l.clusters - 1));
        put32(fsi.data() + 492, 3);
        put32(fsi.data() + 508, 0xAA550000);
        std::vector<uint8_t> third(bps, 0);
        third[510] = 0x55;
        third[511] = 0xAA;
        if ((rc = write(1, 1, fsi.data())) < 0 || (rc = write(2, 1, third.data())) < 0 ||
            (rc = write(6, 1, b)) < 0 || (rc = write(7, 1, fsi.data())) < 0 ||
            (rc = write(8, 1, third.data())) < 0) {
            return io_error(rc);
        }
    }
    std::vector<uint8_t> fat_head(bps, 0);
    switch (type) {
    case fat_type::fat12:
        fat_head[0] = 0xF8;
        fat_head[1] = 0xFF;
        fat_head[2] = 0xFF;
        break;
    case fat_type::fat16:
        put16(fat_head.data(), 0xFFF8);
        put16(fat_head.data() + 2, 0xFFFF);
        break;
    case fat_type::fat32:
        put32(fat_head.data(), 0x0FFFFFF8);
        put32(fat_head.data() + 4, 0x0FFFFFFF);
        put32(fat_head.data() + 8, 0x0FFFFFFF);  // root directory
        break;
    }
    for (uint32_t i = 0; i < fats; ++i) {
        rc = write(l.reserved + uint64_t{i} * l.fat_sectors, 1, fat_head.data());
        if (rc < 0) {
            return io_error(rc);
        }
    }
    if (label != "NO NAME") {
        std::vector<uint8_t> root(bps, 0);
        std::memcpy(root.data(), label11, 11);
        root[11] = k_attr_volume_id;
        fat_time t = to_fat_time(std::time(nullptr));
        put16(root.data() + dirent::wrt_time, t.time);
        put16(root.data() + dirent::wrt_date, t.date);
        uint64_t root_sector =
            type == fat_type::fat32 ? l.data_start : l.reserved + uint64_t{fats} * l.fat_sectors;
        rc = write(root_sector, 1, root.data());
        if (rc < 0) {
            return io_error(rc);
        }
    }
    rc = device.flush();
    if (rc < 0) {
        return io_error(rc);
    }
    return {};
}

}  // namespace softblk::fat
