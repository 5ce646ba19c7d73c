// The FAT volume: geometry, FAT access with a free-cluster map, directory
// indexes, per-file extent caches, the data path, and the POSIX-like
// operations. See docs/fat.md for the design.
#include <softblk/fat/volume.hpp>

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>

#include <fmt/format.h>

#include "layout.hpp"
#include "names.hpp"
#include "sector_cache.hpp"

namespace softblk::fat {

using namespace detail;

namespace {

constexpr uint32_t k_direct_min_bytes = 4096;
constexpr size_t k_max_cached_dirs = 512;
constexpr uint8_t k_state_dirty = 0x01;

struct geometry {
    fat_type type = fat_type::fat16;
    uint32_t bps = 512;
    uint32_t spc = 1;
    uint32_t cluster_bytes = 512;
    uint32_t reserved = 1;
    uint32_t fat_count = 2;
    uint32_t fat_sectors = 0;
    uint32_t root_entries = 0;
    uint32_t root_sectors = 0;
    uint64_t total_sectors = 0;
    uint64_t fat_start = 0;
    uint64_t root_start = 0;
    uint64_t data_start = 0;
    uint32_t cluster_count = 0;  // data clusters, numbered 2 .. cluster_count+1
    uint32_t root_cluster = 0;   // FAT32
    uint32_t fsinfo_sector = 0;  // FAT32, 0: none
    bool mirror = true;
    uint32_t active_fat = 0;
    uint32_t eoc_min = 0;
    uint32_t bad = 0;
    uint32_t eoc = 0;
    uint32_t ratio = 1;          // device sectors per FAT sector
    uint32_t state_offset = 37;  // boot sector byte holding the dirty bit
};

struct extent_run {
    uint32_t logical;
    uint32_t disk;
    uint32_t count;
};

struct dir_record {
    std::string name;
    short_name sname{};
    uint32_t slot = 0;
    uint8_t lfn_slots = 0;
    bool dot = false;
};

struct dir_index {
    uint32_t key = 0;
    bool fixed = false;
    std::vector<uint32_t> clusters;
    uint32_t capacity = 0;
    uint32_t end_slot = 0;
    std::vector<uint8_t> used;
    std::map<uint32_t, dir_record> records;
    std::unordered_map<std::string, uint32_t> by_name;
    std::unordered_map<std::string, uint32_t> by_short;
    uint32_t free_hint = 0;
};

std::string short_key(const short_name& n)
{
    return std::string(reinterpret_cast<const char*>(n.data()), 11);
}

struct entry_info {
    uint32_t parent_key = 0;
    uint32_t slot = 0;
    bool is_root = false;
    bool is_dir = false;
    uint32_t first_cluster = 0;
    uint32_t size = 0;
    uint8_t attr = 0;
};

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

}  // namespace

struct node {
    uint32_t parent_key = 0;
    uint32_t slot = 0;
    bool is_root = false;
    bool is_dir = false;
    uint32_t first_cluster = 0;
    uint32_t size = 0;
    std::vector<extent_run> extents;
    uint32_t mapped = 0;
    bool chain_end = false;
    int open_count = 0;
    bool unlinked = false;
};

struct volume_state {
    block_device& dev;
    mount_options opts;
    geometry g;
    std::unique_ptr<sector_cache> meta;
    std::unique_ptr<sector_cache> data;
    std::vector<uint64_t> free_map;  // bit set: cluster free
    uint32_t free_count = 0;
    uint32_t next_free = 2;
    std::unordered_map<uint32_t, std::unique_ptr<dir_index>> dirs;
    std::unordered_map<uint64_t, std::shared_ptr<node>> open_nodes;
    mutable std::mutex mu;
    bool mounted = true;
    bool dead = false;
    bool read_only = false;
    bool was_dirty = false;
    bool fsinfo_valid = false;
    uint32_t volume_id = 0;
    std::string label;
    std::vector<std::string> problem_log;
    std::string last_corruption;
    cache_stats counters;
    std::vector<uint8_t> zeros = std::vector<uint8_t>(64 * 1024, 0);
    // Write-behind run: sequential direct writes gathered into one request.
    std::vector<uint8_t> pending;
    uint64_t pending_sector = 0;
    uint32_t pending_bytes = 0;

    volume_state(block_device& d, const mount_options& o) : dev(d), opts(o)
    {
        if (opts.write_behind_bytes == mount_options::k_write_behind_auto) {
            opts.write_behind_bytes = dev.write_gather_bytes();
        }
    }

    // ------------------------------------------------------------ errors
    int corrupt(std::string message)
    {
        last_corruption = message;
        if (problem_log.size() < 256) {
            problem_log.push_back(std::move(message));
        }
        return -EIO;
    }
    void note(std::string message)
    {
        if (problem_log.size() < 256) {
            problem_log.push_back(std::move(message));
        }
    }
    std::unexpected<error> fail(int rc, std::string_view what)
    {
        int code = -rc;
        std::string detail;
        if (code == EIO && !last_corruption.empty()) {
            detail = last_corruption;
        } else {
            switch (code) {
            case ENOSPC:
                detail = fmt::format("no space left ({} free clusters of {} bytes)", free_count,
                                     g.cluster_bytes);
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
                detail =
                    "invalid argument (a name may not contain \"*/:<>?\\| or control characters)";
                break;
            default:
                detail = std::strerror(code);
            }
        }
        return std::unexpected<error>(error{std::error_code(code, std::generic_category()),
                                            fmt::format("{}: {}", what, detail)});
    }
    int check_usable(bool write) const
    {
        if (dead || !mounted) {
            return -EIO;
        }
        if (write && read_only) {
            return -EROFS;
        }
        return 0;
    }

    // ------------------------------------------------------------ geometry
    uint64_t cluster_sector(uint32_t c) const { return g.data_start + uint64_t{c - 2} * g.spc; }
    bool valid_cluster(uint32_t c) const { return c >= 2 && c < g.cluster_count + 2; }
    uint32_t root_key() const { return g.type == fat_type::fat32 ? g.root_cluster : 0; }

    // ------------------------------------------------------------ FAT
    int fat_byte_ptr(uint32_t copy, uint64_t offset, uint8_t*& p, bool dirty)
    {
        uint64_t base = g.fat_start + uint64_t{copy} * g.fat_sectors;
        uint64_t sector = base + offset / g.bps;
        uint8_t* buf = nullptr;
        int rc = meta->get(sector, base + g.fat_sectors, sector_cache::fill::read, buf);
        if (rc < 0) {
            return rc;
        }
        if (dirty) {
            meta->mark_dirty(sector);
        }
        p = buf + offset % g.bps;
        return 0;
    }

    int fat_get(uint32_t c, uint32_t& v)
    {
        uint8_t* p = nullptr;
        int rc = 0;
        switch (g.type) {
        case fat_type::fat32:
            rc = fat_byte_ptr(g.active_fat, uint64_t{c} * 4, p, false);
            if (rc == 0) {
                v = le32(p) & 0x0FFFFFFF;
            }
            return rc;
        case fat_type::fat16:
            rc = fat_byte_ptr(g.active_fat, uint64_t{c} * 2, p, false);
            if (rc == 0) {
                v = le16(p);
            }
            return rc;
        case fat_type::fat12: {
            uint64_t off = c + c / 2;
            rc = fat_byte_ptr(g.active_fat, off, p, false);
            if (rc < 0) {
                return rc;
            }
            uint32_t lo = *p;
            rc = fat_byte_ptr(g.active_fat, off + 1, p, false);
            if (rc < 0) {
                return rc;
            }
            uint32_t w = lo | (uint32_t{*p} << 8);
            v = (c & 1) ? (w >> 4) : (w & 0xFFF);
            return 0;
        }
        }
        return -EINVAL;
    }

    int fat_set(uint32_t c, uint32_t v)
    {
        for (uint32_t copy = 0; copy < g.fat_count; ++copy) {
            if (!g.mirror && copy != g.active_fat) {
                continue;
            }
            uint8_t* p = nullptr;
            int rc = 0;
            switch (g.type) {
            case fat_type::fat32:
                rc = fat_byte_ptr(copy, uint64_t{c} * 4, p, true);
                if (rc == 0) {
                    put32(p, (le32(p) & 0xF0000000) | (v & 0x0FFFFFFF));
                }
                break;
            case fat_type::fat16:
                rc = fat_byte_ptr(copy, uint64_t{c} * 2, p, true);
                if (rc == 0) {
                    put16(p, static_cast<uint16_t>(v));
                }
                break;
            case fat_type::fat12: {
                uint64_t off = c + c / 2;
                rc = fat_byte_ptr(copy, off, p, true);
                if (rc < 0) {
                    return rc;
                }
                if (c & 1) {
                    *p = static_cast<uint8_t>((*p & 0x0F) | ((v << 4) & 0xF0));
                } else {
                    *p = static_cast<uint8_t>(v);
                }
                rc = fat_byte_ptr(copy, off + 1, p, true);
                if (rc < 0) {
                    return rc;
                }
                if (c & 1) {
                    *p = static_cast<uint8_t>(v >> 4);
                } else {
                    *p = static_cast<uint8_t>((*p & 0xF0) | ((v >> 8) & 0x0F));
                }
                break;
            }
            }
            if (rc < 0) {
                return rc;
            }
        }
        return 0;
    }

    // The cluster after `c` in its chain: next = 0 at the end of the chain.
    int chain_next(uint32_t c, uint32_t& next)
    {
        uint32_t v = 0;
        int rc = fat_get(c, v);
        if (rc < 0) {
            return rc;
        }
        if (v >= g.eoc_min) {
            next = 0;
            return 0;
        }
        if (v == 0) {
            return corrupt(fmt::format("cluster {} is free but part of a chain", c));
        }
        if (v == g.bad) {
            return corrupt(fmt::format("chain runs into bad cluster after cluster {}", c));
        }
        if (!valid_cluster(v)) {
            return corrupt(fmt::format("cluster {} points to cluster {}, outside 2..{}", c, v,
                                       g.cluster_count + 1));
        }
        next = v;
        return 0;
    }

    // ------------------------------------------------------------ free map
    bool is_free(uint32_t c) const { return (free_map[c >> 6] >> (c & 63)) & 1; }
    void set_free(uint32_t c, bool f)
    {
        if (f) {
            free_map[c >> 6] |= uint64_t{1} << (c & 63);
        } else {
            free_map[c >> 6] &= ~(uint64_t{1} << (c & 63));
        }
    }

    // First free cluster at or after `from` (wrapping), or 0.
    uint32_t find_free(uint32_t from)
    {
        uint32_t limit = g.cluster_count + 2;
        if (from < 2 || from >= limit) {
            from = 2;
        }
        for (int pass = 0; pass < 2; ++pass) {
            uint32_t start = pass == 0 ? from : 2;
            uint32_t end = pass == 0 ? limit : from;
            uint32_t c = start;
            while (c < end) {
                uint64_t word = free_map[c >> 6] >> (c & 63);
                if (word == 0) {
                    c = (c | 63) + 1;
                    continue;
                }
                c += static_cast<uint32_t>(__builtin_ctzll(word));
                if (c < end) {
                    return c;
                }
                break;
            }
        }
        return 0;
    }

    int scan_fat()
    {
        free_map.assign((uint64_t{g.cluster_count} + 2 + 63) / 64, 0);
        free_count = 0;
        uint64_t fat_bytes_needed =
            (g.type == fat_type::fat12)   ? (uint64_t{g.cluster_count} + 2) * 3 / 2 + 1
            : (g.type == fat_type::fat16) ? (uint64_t{g.cluster_count} + 2) * 2
                                          : (uint64_t{g.cluster_count} + 2) * 4;
        uint64_t sectors =
            std::min<uint64_t>((fat_bytes_needed + g.bps - 1) / g.bps, g.fat_sectors);
        uint64_t base = g.fat_start + uint64_t{g.active_fat} * g.fat_sectors;
        uint32_t chunk_sectors = std::max<uint32_t>(1, (256 * 1024) / g.bps);
        std::vector<uint8_t> buf;
        if (g.type == fat_type::fat12) {
            buf.resize(sectors * g.bps + 2, 0);
            int rc = dev.read(base * g.ratio, static_cast<uint32_t>(sectors * g.ratio), buf.data());
            if (rc < 0) {
                return rc;
            }
            for (uint32_t c = 2; c < g.cluster_count + 2; ++c) {
                uint64_t off = c + c / 2;
                uint32_t w = buf[off] | (uint32_t{buf[off + 1]} << 8);
                uint32_t v = (c & 1) ? (w >> 4) : (w & 0xFFF);
                if (v == 0) {
                    set_free(c, true);
                    ++free_count;
                }
            }
            return 0;
        }
        uint32_t width = g.type == fat_type::fat16 ? 2 : 4;
        buf.resize(uint64_t{chunk_sectors} * g.bps);
        for (uint64_t s = 0; s < sectors; s += chunk_sectors) {
            uint64_t n = std::min<uint64_t>(chunk_sectors, sectors - s);
            int rc = dev.read((base + s) * g.ratio, static_cast<uint32_t>(n * g.ratio), buf.data());
            if (rc < 0) {
                return rc;
            }
            uint64_t first = s * g.bps / width;
            uint64_t count = n * g.bps / width;
            for (uint64_t i = 0; i < count; ++i) {
                uint64_t c = first + i;
                if (c < 2) {
                    continue;
                }
                if (c >= uint64_t{g.cluster_count} + 2) {
                    break;
                }
                uint32_t v = width == 2 ? le16(&buf[i * 2]) : (le32(&buf[i * 4]) & 0x0FFFFFFF);
                if (v == 0) {
                    set_free(static_cast<uint32_t>(c), true);
                    ++free_count;
                }
            }
        }
        return 0;
    }

    void forget_cluster_caches(uint32_t c)
    {
        meta->invalidate(cluster_sector(c), g.spc);
        data->invalidate(cluster_sector(c), g.spc);
    }

    // Takes `n` free clusters, near `hint`, links them into one chain
    // ending in EOC. The caller checked free_count >= n.
    int allocate(uint32_t n, uint32_t hint, std::vector<uint32_t>& out)
    {
        out.clear();
        if (n > free_count) {
            return -ENOSPC;
        }
        uint32_t from = valid_cluster(hint) ? hint : next_free;
        for (uint32_t i = 0; i < n; ++i) {
            uint32_t c = find_free(from);
            if (c == 0) {
                for (uint32_t x : out) {
                    set_free(x, true);
                }
                free_count += static_cast<uint32_t>(out.size());
                return -ENOSPC;
            }
            set_free(c, false);
            out.push_back(c);
            from = c + 1;
        }
        free_count -= n;
        next_free = from;
        for (uint32_t i = 0; i < n; ++i) {
            int rc = fat_set(out[i], i + 1 < n ? out[i + 1] : g.eoc);
            if (rc < 0) {
                return rc;
            }
        }
        return 0;
    }

    int free_chain(uint32_t first)
    {
        int frc = flush_pending();  // never write a freed cluster after its next owner
        if (frc < 0) {
            return frc;
        }
        uint32_t c = first;
        uint32_t steps = 0;
        while (c != 0) {
            if (!valid_cluster(c)) {
                return corrupt(fmt::format("chain points to cluster {}, outside 2..{}", c,
                                           g.cluster_count + 1));
            }
            if (++steps > g.cluster_count) {
                return corrupt(fmt::format("loop in the chain starting at cluster {}", first));
            }
            uint32_t v = 0;
            int rc = fat_get(c, v);
            if (rc < 0) {
                return rc;
            }
            if (v == 0) {
                break;  // already free: a damaged chain; stop here
            }
            rc = fat_set(c, 0);
            if (rc < 0) {
                return rc;
            }
            if (!is_free(c)) {
                set_free(c, true);
                ++free_count;
            }
            forget_cluster_caches(c);
            if (v >= g.eoc_min || v == g.bad || !valid_cluster(v)) {
                break;
            }
            c = v;
        }
        return 0;
    }

    // ------------------------------------------------------------ extents
    // Maps logical cluster `index` of `n` to its disk cluster; `run` is how
    // many clusters from there on are contiguous on disk.
    int map_cluster(node& n, uint32_t index, uint32_t& disk, uint32_t& run)
    {
        int rc = extend_map(n, index + 1);
        if (rc < 0) {
            return rc;
        }
        if (index >= n.mapped) {
            return corrupt(
                fmt::format("chain of cluster {} ends after {} clusters, the size needs more",
                            n.first_cluster, n.mapped));
        }
        auto it = std::upper_bound(n.extents.begin(), n.extents.end(), index,
                                   [](uint32_t i, const extent_run& e) { return i < e.logical; });
        --it;
        disk = it->disk + (index - it->logical);
        run = it->count - (index - it->logical);
        return 0;
    }

    // Walks the chain until `want` clusters are mapped or it ends.
    int extend_map(node& n, uint32_t want)
    {
        if (n.mapped >= want || n.chain_end) {
            return 0;
        }
        if (n.mapped == 0) {
            if (n.first_cluster == 0) {
                n.chain_end = true;
                return 0;
            }
            if (!valid_cluster(n.first_cluster)) {
                return corrupt(fmt::format("first cluster {} is outside 2..{}", n.first_cluster,
                                           g.cluster_count + 1));
            }
            n.extents.push_back({0, n.first_cluster, 1});
            n.mapped = 1;
        }
        while (n.mapped < want) {
            auto& last = n.extents.back();
            uint32_t c = last.disk + last.count - 1;
            uint32_t next = 0;
            int rc = chain_next(c, next);
            if (rc < 0) {
                return rc;
            }
            if (next == 0) {
                n.chain_end = true;
                break;
            }
            if (n.mapped >= g.cluster_count) {
                return corrupt(
                    fmt::format("loop in the chain starting at cluster {}", n.first_cluster));
            }
            if (next == c + 1) {
                ++last.count;
            } else {
                n.extents.push_back({n.mapped, next, 1});
            }
            ++n.mapped;
        }
        return 0;
    }

    void append_extent(node& n, uint32_t disk)
    {
        if (!n.extents.empty()) {
            auto& last = n.extents.back();
            if (last.disk + last.count == disk) {
                ++last.count;
                ++n.mapped;
                return;
            }
        }
        n.extents.push_back({n.mapped, disk, 1});
        ++n.mapped;
    }

    // Makes the chain at least `want` clusters long. -ENOSPC before any change.
    int ensure_clusters(node& n, uint32_t want)
    {
        int rc = extend_map(n, UINT32_MAX);
        if (rc < 0) {
            return rc;
        }
        if (n.mapped >= want) {
            return 0;
        }
        uint32_t need = want - n.mapped;
        if (need > free_count) {
            return -ENOSPC;
        }
        uint32_t last = n.extents.empty() ? 0 : n.extents.back().disk + n.extents.back().count - 1;
        std::vector<uint32_t> fresh;
        rc = allocate(need, last != 0 ? last + 1 : next_free, fresh);
        if (rc < 0) {
            return rc;
        }
        if (last == 0) {
            n.first_cluster = fresh[0];
        } else {
            rc = fat_set(last, fresh[0]);
            if (rc < 0) {
                return rc;
            }
        }
        for (uint32_t c : fresh) {
            append_extent(n, c);
        }
        n.chain_end = true;
        return 0;
    }

    // Cuts the chain to `keep` clusters, freeing the rest.
    int shrink_clusters(node& n, uint32_t keep)
    {
        if (keep == 0) {
            int rc = n.first_cluster != 0 ? free_chain(n.first_cluster) : 0;
            n.first_cluster = 0;
            n.extents.clear();
            n.mapped = 0;
            n.chain_end = true;
            return rc;
        }
        uint32_t disk = 0;
        uint32_t run = 0;
        int rc = map_cluster(n, keep - 1, disk, run);
        if (rc < 0) {
            return rc;
        }
        uint32_t next = 0;
        rc = chain_next(disk, next);
        if (rc < 0) {
            return rc;
        }
        rc = fat_set(disk, g.eoc);
        if (rc < 0) {
            return rc;
        }
        if (next != 0) {
            rc = free_chain(next);
        }
        while (!n.extents.empty() && n.extents.back().logical >= keep) {
            n.extents.pop_back();
        }
        if (!n.extents.empty()) {
            auto& last = n.extents.back();
            last.count = std::min(last.count, keep - last.logical);
        }
        n.mapped = keep;
        n.chain_end = true;
        return rc;
    }

    // ------------------------------------------------------------ directories
    int entry_at(dir_index& d, uint32_t slot, uint8_t*& p, bool for_write)
    {
        uint64_t byte = uint64_t{slot} * k_dirent_size;
        uint64_t sector = 0;
        uint64_t run_end = 0;
        if (d.fixed) {
            sector = g.root_start + byte / g.bps;
            run_end = g.root_start + g.root_sectors;
        } else {
            uint64_t ci = byte / g.cluster_bytes;
            if (ci >= d.clusters.size()) {
                return corrupt(
                    fmt::format("directory slot {} beyond the directory's clusters", slot));
            }
            uint64_t cs = cluster_sector(d.clusters[ci]);
            sector = cs + (byte % g.cluster_bytes) / g.bps;
            run_end = cs + g.spc;
        }
        uint8_t* buf = nullptr;
        int rc = meta->get(sector, run_end, sector_cache::fill::read, buf);
        if (rc < 0) {
            return rc;
        }
        if (for_write) {
            meta->mark_dirty(sector);
        }
        p = buf + byte % g.bps;
        return 0;
    }

    void index_record(dir_index& d, dir_record rec)
    {
        uint32_t slot = rec.slot;
        if (!rec.dot) {
            std::string folded = fold(rec.name);
            if (!d.by_name.emplace(folded, slot).second) {
                note(fmt::format("duplicate name \"{}\" in directory at cluster {}", rec.name,
                                 d.key));
            }
            d.by_short.emplace(short_key(rec.sname), slot);
        }
        d.records.emplace(slot, std::move(rec));
    }

    int load_dir(uint32_t key, dir_index*& out)
    {
        auto found = dirs.find(key);
        if (found != dirs.end()) {
            out = found->second.get();
            return 0;
        }
        auto d = std::make_unique<dir_index>();
        d->key = key;
        if (key == 0 && g.type != fat_type::fat32) {
            d->fixed = true;
            d->capacity = g.root_entries;
        } else {
            if (!valid_cluster(key)) {
                return corrupt(
                    fmt::format("directory cluster {} is outside 2..{}", key, g.cluster_count + 1));
            }
            uint32_t max_clusters =
                std::max<uint32_t>(1, k_max_dir_entries * k_dirent_size / g.cluster_bytes);
            uint32_t c = key;
            while (c != 0) {
                if (d->clusters.size() >= max_clusters) {
                    return corrupt(fmt::format(
                        "directory at cluster {} is longer than 65536 entries (a loop?)", key));
                }
                d->clusters.push_back(c);
                uint32_t next = 0;
                int rc = chain_next(c, next);
                if (rc < 0) {
                    return rc;
                }
                c = next;
            }
            d->capacity =
                static_cast<uint32_t>(d->clusters.size() * (g.cluster_bytes / k_dirent_size));
        }
        d->used.assign(d->capacity, 0);
        d->end_slot = d->capacity;
        // LFN sequence state
        std::u16string lfn(20 * 13, u'\0');
        int expect = -1;  // next ordinal expected; 0: complete; -1: none
        int total = 0;
        uint8_t sum = 0;
        uint32_t start = 0;
        for (uint32_t slot = 0; slot < d->capacity; ++slot) {
            uint8_t* e = nullptr;
            int rc = entry_at(*d, slot, e, false);
            if (rc < 0) {
                return rc;
            }
            if (e[0] == 0x00) {
                d->end_slot = slot;
                break;
            }
            if (e[0] == k_deleted) {
                expect = -1;
                continue;
            }
            d->used[slot] = 1;
            uint8_t attr = e[dirent::attr];
            if ((attr & k_attr_mask) == k_attr_lfn) {
                uint8_t ord = e[0];
                int k = ord & 0x1F;
                if (ord & k_lfn_last) {
                    if (k == 0 || k > 20) {
                        expect = -1;
                        note(
                            fmt::format("directory {}: long-name entry with ordinal {}", key, ord));
                        continue;
                    }
                    total = k;
                    sum = e[13];
                    start = slot;
                    std::fill(lfn.begin(), lfn.end(), u'\0');
                } else if (expect <= 0 || k != expect || e[13] != sum) {
                    if (expect != -1 || true) {
                        note(fmt::format("directory {}: long-name entry out of sequence at slot {}",
                                         key, slot));
                    }
                    expect = -1;
                    continue;
                }
                static constexpr int offsets[13] = {1, 3, 5, 7, 9, 14, 16, 18, 20, 22, 24, 28, 30};
                for (int u = 0; u < 13; ++u) {
                    lfn[(k - 1) * 13 + u] = static_cast<char16_t>(le16(e + offsets[u]));
                }
                expect = k - 1;
                continue;
            }
            if (attr & k_attr_volume_id) {
                expect = -1;
                continue;
            }
            dir_record rec;
            std::memcpy(rec.sname.data(), e, 11);
            rec.slot = slot;
            static const uint8_t dot1[11] = {'.', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' '};
            static const uint8_t dot2[11] = {'.', '.', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' '};
            if (std::memcmp(e, dot1, 11) == 0 || std::memcmp(e, dot2, 11) == 0) {
                rec.dot = true;
                rec.name = e[1] == '.' ? ".." : ".";
                index_record(*d, std::move(rec));
                expect = -1;
                continue;
            }
            bool have_long = false;
            if (expect == 0) {
                if (lfn_checksum(e) == sum) {
                    size_t len = 0;
                    while (len < static_cast<size_t>(total) * 13 && lfn[len] != 0) {
                        ++len;
                    }
                    std::string name = utf16_to_utf8(std::u16string_view(lfn.data(), len));
                    if (valid_long_name(name)) {
                        rec.name = std::move(name);
                        rec.lfn_slots = static_cast<uint8_t>(total);
                        have_long = true;
                    } else {
                        note(fmt::format(
                            "directory {}: unusable long name at slot {}; using the short name",
                            key, slot));
                    }
                } else {
                    note(
                        fmt::format("directory {}: long name checksum mismatch at slot {}; using "
                                    "the short name",
                                    key, slot));
                }
                (void)start;
            }
            expect = -1;
            if (!have_long) {
                if (!valid_stored_short(e)) {
                    uint8_t fixed[11];
                    std::memcpy(fixed, e, 11);
                    for (auto& c : fixed) {
                        if (c < 0x20 || c == 0x7F || std::strchr("*?<>|\"\\/:", c) != nullptr) {
                            c = '_';
                        }
                    }
                    rec.name = short_to_display(fixed, e[dirent::nt_res]);
                    note(fmt::format("directory {}: invalid short name at slot {} shown as \"{}\"",
                                     key, slot, rec.name));
                } else {
                    rec.name = short_to_display(e, e[dirent::nt_res]);
                }
                if (rec.name.empty() || rec.name == "." || rec.name == "..") {
                    rec.name = fmt::format("_slot{}", slot);
                }
            }
            index_record(*d, std::move(rec));
        }
        // Mark LFN slots of orphaned sequences as used so we don't reuse
        // part of them while they still sit before a live entry: already
        // marked above; free slots are exactly deleted or past-the-end ones.
        d->free_hint = 0;
        while (d->free_hint < d->capacity && d->used[d->free_hint]) {
            ++d->free_hint;
        }
        out = d.get();
        dirs.emplace(key, std::move(d));
        return 0;
    }

    // Finds `n` consecutive free slots; extends the directory if needed.
    int find_slots(dir_index& d, uint32_t n, uint32_t& slot)
    {
        uint32_t run = 0;
        for (uint32_t s = d.free_hint; s < d.capacity; ++s) {
            run = d.used[s] ? 0 : run + 1;
            if (run == n) {
                slot = s + 1 - n;
                return 0;
            }
        }
        // Extend by a cluster.
        if (d.fixed) {
            return -ENOSPC;
        }
        uint32_t per_cluster = g.cluster_bytes / k_dirent_size;
        if (d.capacity + per_cluster > k_max_dir_entries) {
            return -ENOSPC;
        }
        if (free_count == 0) {
            return -ENOSPC;
        }
        std::vector<uint32_t> fresh;
        int rc = allocate(1, d.clusters.back() + 1, fresh);
        if (rc < 0) {
            return rc;
        }
        rc = zero_dir_cluster(fresh[0]);
        if (rc < 0) {
            return rc;
        }
        rc = fat_set(d.clusters.back(), fresh[0]);
        if (rc < 0) {
            return rc;
        }
        d.clusters.push_back(fresh[0]);
        uint32_t old_capacity = d.capacity;
        d.capacity += per_cluster;
        d.used.resize(d.capacity, 0);
        if (d.end_slot == old_capacity) {
            d.end_slot = old_capacity;
        }
        return find_slots(d, n, slot);
    }

    int zero_dir_cluster(uint32_t c)
    {
        data->invalidate(cluster_sector(c), g.spc);
        for (uint32_t i = 0; i < g.spc; ++i) {
            uint8_t* buf = nullptr;
            uint64_t s = cluster_sector(c) + i;
            meta->invalidate(s, 1);
            int rc = meta->get(s, s + 1, sector_cache::fill::zero, buf);
            if (rc < 0) {
                return rc;
            }
            meta->mark_dirty(s);
        }
        return 0;
    }

    // Writes a new entry named `name` with the fields of `tmpl` (bytes
    // 11..31 of a short entry). Returns the short entry's slot.
    int add_entry(dir_index& d, std::string_view name, const uint8_t* tmpl, uint32_t& out_slot)
    {
        short_plan plan = plan_short_name(name);
        std::u16string units;
        uint32_t lfn_n = 0;
        short_name sname = plan.name;
        uint8_t nt = plan.nt_flags;
        if (plan.needs_lfn) {
            if (!utf8_to_utf16(name, units)) {
                return -EINVAL;
            }
            if (units.size() > k_max_lfn_units) {
                return -ENAMETOOLONG;
            }
            lfn_n = static_cast<uint32_t>((units.size() + 12) / 13);
            uint16_t hash = name_hash(name);
            bool found = false;
            for (uint32_t n = 1; n < 1000000 && !found; ++n) {
                sname = numbered_short_name(plan, n, hash);
                found = d.by_short.count(short_key(sname)) == 0;
            }
            if (!found) {
                return -ENOSPC;
            }
            nt = 0;
        } else if (d.by_short.count(short_key(sname)) != 0) {
            return -EEXIST;
        }
        uint32_t slot = 0;
        int rc = find_slots(d, lfn_n + 1, slot);
        if (rc < 0) {
            return rc;
        }
        uint8_t sum = lfn_checksum(sname.data());
        for (uint32_t i = 0; i < lfn_n; ++i) {
            uint8_t* e = nullptr;
            rc = entry_at(d, slot + i, e, true);
            if (rc < 0) {
                return rc;
            }
            uint32_t k = lfn_n - i;  // ordinal
            std::memset(e, 0, k_dirent_size);
            e[0] = static_cast<uint8_t>(k | (i == 0 ? k_lfn_last : 0));
            e[dirent::attr] = k_attr_lfn;
            e[13] = sum;
            static constexpr int offsets[13] = {1, 3, 5, 7, 9, 14, 16, 18, 20, 22, 24, 28, 30};
            for (uint32_t u = 0; u < 13; ++u) {
                size_t pos = (k - 1) * 13 + u;
                uint16_t v =
                    pos < units.size() ? units[pos] : (pos == units.size() ? 0x0000 : 0xFFFF);
                put16(e + offsets[u], v);
            }
        }
        uint8_t* e = nullptr;
        rc = entry_at(d, slot + lfn_n, e, true);
        if (rc < 0) {
            return rc;
        }
        std::memcpy(e + 11, tmpl + 11, k_dirent_size - 11);
        std::memcpy(e, sname.data(), 11);
        e[dirent::nt_res] = nt;
        uint32_t end = slot + lfn_n + 1;
        for (uint32_t s = slot; s < end; ++s) {
            d.used[s] = 1;
        }
        if (end > d.end_slot || slot >= d.end_slot) {
            // We wrote at or past the end marker: keep an end marker after us.
            if (end < d.capacity) {
                uint8_t* z = nullptr;
                rc = entry_at(d, end, z, true);
                if (rc < 0) {
                    return rc;
                }
                if (!d.used[end]) {
                    std::memset(z, 0, k_dirent_size);
                }
            }
            d.end_slot = std::max(d.end_slot, end);
        }
        while (d.free_hint < d.capacity && d.used[d.free_hint]) {
            ++d.free_hint;
        }
        dir_record rec;
        rec.name = std::string(name);
        rec.sname = sname;
        rec.slot = slot + lfn_n;
        rec.lfn_slots = static_cast<uint8_t>(lfn_n);
        index_record(d, std::move(rec));
        out_slot = slot + lfn_n;
        return 0;
    }

    int remove_entry(dir_index& d, uint32_t slot)
    {
        auto it = d.records.find(slot);
        if (it == d.records.end()) {
            return -ENOENT;
        }
        const dir_record& rec = it->second;
        for (uint32_t s = slot - rec.lfn_slots; s <= slot; ++s) {
            uint8_t* e = nullptr;
            int rc = entry_at(d, s, e, true);
            if (rc < 0) {
                return rc;
            }
            e[0] = k_deleted;
            d.used[s] = 0;
        }
        d.free_hint = std::min(d.free_hint, slot - rec.lfn_slots);
        auto n = d.by_name.find(fold(rec.name));
        if (n != d.by_name.end() && n->second == slot) {
            d.by_name.erase(n);
        }
        auto s = d.by_short.find(short_key(rec.sname));
        if (s != d.by_short.end() && s->second == slot) {
            d.by_short.erase(s);
        }
        d.records.erase(it);
        return 0;
    }

    int lookup(dir_index& d, std::string_view name, uint32_t& slot)
    {
        auto it = d.by_name.find(fold(name));
        if (it != d.by_name.end()) {
            slot = it->second;
            return 0;
        }
        short_name sn;
        if (parse_short(name, sn)) {
            auto s = d.by_short.find(short_key(sn));
            if (s != d.by_short.end()) {
                slot = s->second;
                return 0;
            }
        }
        return -ENOENT;
    }

    int read_info(dir_index& d, uint32_t slot, entry_info& info)
    {
        uint8_t* e = nullptr;
        int rc = entry_at(d, slot, e, false);
        if (rc < 0) {
            return rc;
        }
        info.parent_key = d.key;
        info.slot = slot;
        info.attr = e[dirent::attr];
        info.is_dir = (info.attr & k_attr_directory) != 0;
        uint32_t hi = g.type == fat_type::fat32 ? le16(e + dirent::cluster_hi) : 0;
        info.first_cluster = (hi << 16) | le16(e + dirent::cluster_lo);
        info.size = le32(e + dirent::size);
        if (info.is_dir && info.first_cluster == 0) {
            return corrupt(fmt::format("directory entry at slot {} of directory {} has no cluster",
                                       slot, d.key));
        }
        if (info.first_cluster != 0 && !valid_cluster(info.first_cluster)) {
            return corrupt(
                fmt::format("entry at slot {} of directory {} starts at cluster {}, outside 2..{}",
                            slot, d.key, info.first_cluster, g.cluster_count + 1));
        }
        return 0;
    }

    int resolve_parts(const std::vector<std::string>& parts, size_t count, entry_info& out)
    {
        out = entry_info{};
        out.is_root = true;
        out.is_dir = true;
        out.first_cluster = root_key();
        out.attr = k_attr_directory;
        for (size_t i = 0; i < count; ++i) {
            if (!out.is_dir) {
                return -ENOTDIR;
            }
            dir_index* d = nullptr;
            int rc = load_dir(out.first_cluster, d);
            if (rc < 0) {
                return rc;
            }
            uint32_t slot = 0;
            rc = lookup(*d, parts[i], slot);
            if (rc < 0) {
                return rc;
            }
            rc = read_info(*d, slot, out);
            if (rc < 0) {
                return rc;
            }
            out.is_root = false;
        }
        return 0;
    }

    uint32_t dir_key_of(const entry_info& info) const
    {
        return info.is_root ? root_key() : info.first_cluster;
    }

    // ------------------------------------------------------------ nodes
    static uint64_t node_key(uint32_t parent, uint32_t slot)
    {
        return (uint64_t{parent} << 32) | slot;
    }

    std::shared_ptr<node> node_for(const entry_info& info)
    {
        if (!info.is_root) {
            auto it = open_nodes.find(node_key(info.parent_key, info.slot));
            if (it != open_nodes.end()) {
                return it->second;
            }
        }
        auto n = std::make_shared<node>();
        n->parent_key = info.parent_key;
        n->slot = info.slot;
        n->is_root = info.is_root;
        n->is_dir = info.is_dir;
        n->first_cluster = info.is_root ? root_key() : info.first_cluster;
        n->size = info.is_dir ? 0 : info.size;
        return n;
    }

    // The local-time conversion of the current second, kept: every write
    // stamps its entry, and localtime_r costs more than a small write.
    std::time_t stamp_second = -1;
    fat_time stamp_value{};

    void stamp(uint8_t* e, bool modified, bool created)
    {
        std::time_t now = std::time(nullptr);
        if (now != stamp_second) {
            stamp_value = to_fat_time(now);
            stamp_second = now;
        }
        const fat_time& t = stamp_value;
        if (created) {
            e[dirent::crt_tenth] = t.tenth;
            put16(e + dirent::crt_time, t.time);
            put16(e + dirent::crt_date, t.date);
        }
        if (modified) {
            put16(e + dirent::wrt_time, t.time);
            put16(e + dirent::wrt_date, t.date);
        }
        put16(e + dirent::acc_date, t.date);
    }

    // Writes the node's cluster and size (and, if `modified`, mtime) to its entry.
    int write_entry(node& n, bool modified)
    {
        if (n.is_root || n.unlinked) {
            return 0;
        }
        dir_index* d = nullptr;
        int rc = load_dir(n.parent_key, d);
        if (rc < 0) {
            return rc;
        }
        uint8_t* e = nullptr;
        rc = entry_at(*d, n.slot, e, true);
        if (rc < 0) {
            return rc;
        }
        if (g.type == fat_type::fat32) {
            put16(e + dirent::cluster_hi, static_cast<uint16_t>(n.first_cluster >> 16));
        }
        put16(e + dirent::cluster_lo, static_cast<uint16_t>(n.first_cluster));
        put32(e + dirent::size, n.is_dir ? 0 : n.size);
        if (modified) {
            stamp(e, true, false);
            if (!n.is_dir) {
                e[dirent::attr] |= k_attr_archive;
            }
        }
        return 0;
    }

    // ------------------------------------------------------------ data path
    int flush_pending()
    {
        if (pending_bytes == 0) {
            return 0;
        }
        uint32_t bytes = pending_bytes;
        pending_bytes = 0;
        ++counters.direct_writes;
        return dev.write(pending_sector * g.ratio, bytes / g.bps * g.ratio, pending.data());
    }

    int cached_read(uint64_t sector, uint64_t run_end, uint32_t in, uint32_t len, uint8_t* out)
    {
        uint8_t* buf = nullptr;
        int rc = data->get(sector, run_end, sector_cache::fill::read, buf);
        if (rc < 0) {
            return rc;
        }
        std::memcpy(out, buf + in, len);
        return 0;
    }

    // Reads `len` bytes at fs byte position `pos` (contiguous on disk,
    // within sectors < run_end).
    int transfer_read(uint64_t pos, uint64_t len, uint8_t* out, uint64_t run_end)
    {
        while (len > 0) {
            uint64_t sector = pos / g.bps;
            uint32_t in = static_cast<uint32_t>(pos % g.bps);
            if (in == 0 && len >= k_direct_min_bytes && len >= g.bps) {
                uint64_t count = std::min<uint64_t>(len / g.bps, (64u << 20) / g.bps);
                int rc = dev.read(sector * g.ratio, static_cast<uint32_t>(count * g.ratio), out);
                if (rc < 0) {
                    return rc;
                }
                data->overlay_dirty(sector, count, out);
                ++counters.direct_reads;
                pos += count * g.bps;
                out += count * g.bps;
                len -= count * g.bps;
                continue;
            }
            uint32_t chunk = static_cast<uint32_t>(std::min<uint64_t>(len, g.bps - in));
            int rc = cached_read(sector, run_end, in, chunk, out);
            if (rc < 0) {
                return rc;
            }
            pos += chunk;
            out += chunk;
            len -= chunk;
        }
        return 0;
    }

    // Writes `len` bytes (zeros if src is null) at fs byte position `pos`.
    // `init_from`: fs byte position from which the old content is garbage
    // (sectors starting there are not read before a partial write).
    int transfer_write(uint64_t pos, uint64_t len, const uint8_t* src, uint64_t init_from)
    {
        while (len > 0) {
            uint64_t sector = pos / g.bps;
            uint32_t in = static_cast<uint32_t>(pos % g.bps);
            if (in == 0 && len >= g.bps && (len >= k_direct_min_bytes || src == nullptr)) {
                uint64_t count = std::min<uint64_t>(len / g.bps, (64u << 20) / g.bps);
                if (src == nullptr) {
                    count = std::min<uint64_t>(count, zeros.size() / g.bps);
                }
                data->invalidate(sector, count);
                uint64_t bytes = count * g.bps;
                const uint8_t* from = src != nullptr ? src : zeros.data();
                int rc = 0;
                if (bytes < opts.write_behind_bytes) {
                    if (pending_bytes != 0 &&
                        (sector * g.bps != pending_sector * g.bps + pending_bytes ||
                         pending_bytes + bytes > opts.write_behind_bytes)) {
                        rc = flush_pending();
                        if (rc < 0) {
                            return rc;
                        }
                    }
                    if (pending_bytes == 0) {
                        pending_sector = sector;
                        pending.resize(opts.write_behind_bytes);
                    }
                    std::memcpy(pending.data() + pending_bytes, from, bytes);
                    pending_bytes += static_cast<uint32_t>(bytes);
                } else {
                    rc = flush_pending();
                    if (rc == 0) {
                        rc = dev.write(sector * g.ratio, static_cast<uint32_t>(count * g.ratio),
                                       from);
                        ++counters.direct_writes;
                    }
                    if (rc < 0) {
                        return rc;
                    }
                }
                pos += count * g.bps;
                if (src != nullptr) {
                    src += count * g.bps;
                }
                len -= count * g.bps;
                continue;
            }
            if (pending_bytes != 0) {
                int rc = flush_pending();  // keep the order of writes to one sector
                if (rc < 0) {
                    return rc;
                }
            }
            uint32_t chunk = static_cast<uint32_t>(std::min<uint64_t>(len, g.bps - in));
            bool whole = chunk == g.bps;
            auto how = (whole || sector * g.bps >= init_from) ? sector_cache::fill::zero
                                                              : sector_cache::fill::read;
            uint8_t* buf = nullptr;
            int rc = data->get(sector, sector + 1, how, buf);
            if (rc < 0) {
                return rc;
            }
            if (src != nullptr) {
                std::memcpy(buf + in, src, chunk);
                src += chunk;
            } else {
                std::memset(buf + in, 0, chunk);
            }
            data->mark_dirty(sector);
            pos += chunk;
            len -= chunk;
        }
        return 0;
    }

    int64_t read_node(node& n, uint8_t* out, size_t len, uint64_t off)
    {
        if (n.is_dir) {
            return -EISDIR;
        }
        if (off >= n.size) {
            return 0;
        }
        int frc = flush_pending();
        if (frc < 0) {
            return frc;
        }
        uint64_t total = std::min<uint64_t>(len, n.size - off);
        uint64_t done = 0;
        while (done < total) {
            uint64_t p = off + done;
            uint32_t idx = static_cast<uint32_t>(p / g.cluster_bytes);
            uint32_t in = static_cast<uint32_t>(p % g.cluster_bytes);
            uint32_t disk = 0;
            uint32_t run = 0;
            // Map enough of the chain for this transfer in one walk.
            int rc = extend_map(
                n, static_cast<uint32_t>((off + total + g.cluster_bytes - 1) / g.cluster_bytes));
            if (rc < 0) {
                return rc;
            }
            rc = map_cluster(n, idx, disk, run);
            if (rc < 0) {
                return rc;
            }
            uint64_t avail = uint64_t{run} * g.cluster_bytes - in;
            uint64_t chunk = std::min<uint64_t>(total - done, avail);
            uint64_t start = cluster_sector(disk);
            rc =
                transfer_read(start * g.bps + in, chunk, out + done, start + uint64_t{run} * g.spc);
            if (rc < 0) {
                return rc;
            }
            done += chunk;
        }
        return static_cast<int64_t>(done);
    }

    // Writes [off, off+len) of the node's chain (already long enough).
    int write_range(node& n, const uint8_t* src, uint64_t len, uint64_t off, uint64_t old_size)
    {
        uint64_t done = 0;
        while (done < len) {
            uint64_t p = off + done;
            uint32_t idx = static_cast<uint32_t>(p / g.cluster_bytes);
            uint32_t in = static_cast<uint32_t>(p % g.cluster_bytes);
            uint32_t disk = 0;
            uint32_t run = 0;
            int rc = map_cluster(n, idx, disk, run);
            if (rc < 0) {
                return rc;
            }
            uint64_t avail = uint64_t{run} * g.cluster_bytes - in;
            uint64_t chunk = std::min<uint64_t>(len - done, avail);
            uint64_t start_byte = cluster_sector(disk) * g.bps;
            // File offset `old_size` sits at this disk byte (if within the run).
            uint64_t run_file_start = p - in;
            uint64_t init_from =
                old_size <= run_file_start ? start_byte : start_byte + (old_size - run_file_start);
            rc = transfer_write(start_byte + in, chunk, src != nullptr ? src + done : nullptr,
                                init_from);
            if (rc < 0) {
                return rc;
            }
            done += chunk;
        }
        return 0;
    }

    int64_t write_node(node& n, const uint8_t* src, size_t len, uint64_t off)
    {
        if (n.is_dir) {
            return -EISDIR;
        }
        if (len == 0) {
            return 0;
        }
        if (off > k_max_file_size || len > k_max_file_size - off) {
            return -EFBIG;
        }
        uint64_t end = off + len;
        uint64_t old = n.size;
        uint64_t new_size = std::max(end, old);
        uint32_t want = static_cast<uint32_t>((new_size + g.cluster_bytes - 1) / g.cluster_bytes);
        int rc = ensure_clusters(n, want);
        if (rc < 0) {
            return rc;
        }
        if (off > old) {
            rc = write_range(n, nullptr, off - old, old, old);
            if (rc < 0) {
                return rc;
            }
        }
        rc = write_range(n, src, len, off, old);
        if (rc < 0) {
            return rc;
        }
        n.size = static_cast<uint32_t>(new_size);
        rc = write_entry(n, true);
        if (rc < 0) {
            return rc;
        }
        return static_cast<int64_t>(len);
    }

    int truncate_node(node& n, uint64_t size)
    {
        if (n.is_dir) {
            return -EISDIR;
        }
        if (size > k_max_file_size) {
            return -EFBIG;
        }
        uint32_t want = static_cast<uint32_t>((size + g.cluster_bytes - 1) / g.cluster_bytes);
        int rc = 0;
        if (size > n.size) {
            rc = ensure_clusters(n, want);
            if (rc < 0) {
                return rc;
            }
            rc = write_range(n, nullptr, size - n.size, n.size, n.size);
            if (rc < 0) {
                return rc;
            }
        } else {
            rc = extend_map(n, UINT32_MAX);
            if (rc < 0) {
                return rc;
            }
            if (n.mapped > want) {
                rc = shrink_clusters(n, want);
                if (rc < 0) {
                    return rc;
                }
            }
        }
        n.size = static_cast<uint32_t>(size);
        return write_entry(n, true);
    }

    // ------------------------------------------------------------ sync
    int update_fsinfo()
    {
        if (g.type != fat_type::fat32 || !fsinfo_valid) {
            return 0;
        }
        uint8_t* buf = nullptr;
        int rc = meta->get(g.fsinfo_sector, g.fsinfo_sector + 1, sector_cache::fill::read, buf);
        if (rc < 0) {
            return rc;
        }
        if (le32(buf + 488) != free_count || le32(buf + 492) != next_free) {
            put32(buf + 488, free_count);
            put32(buf + 492, next_free);
            meta->mark_dirty(g.fsinfo_sector);
        }
        return 0;
    }

    int write_back_all()
    {
        int rc = flush_pending();
        if (rc < 0) {
            return rc;
        }
        rc = data->write_back();
        if (rc < 0) {
            return rc;
        }
        rc = update_fsinfo();
        if (rc < 0) {
            return rc;
        }
        return meta->write_back();
    }

    int sync_all()
    {
        int rc = write_back_all();
        if (rc < 0) {
            return rc;
        }
        return dev.flush();
    }

    // End of a modifying operation: write back if enough is dirty.
    void op_end()
    {
        if (meta->dirty_count() > opts.meta_dirty_limit) {
            (void)write_back_all();
        }
    }

    int set_dirty_state(bool dirty)
    {
        uint8_t* boot = nullptr;
        int rc = meta->get(0, 1, sector_cache::fill::read, boot);
        if (rc < 0) {
            return rc;
        }
        uint8_t& state = boot[g.state_offset];
        state = static_cast<uint8_t>(dirty ? (state | k_state_dirty) : (state & ~k_state_dirty));
        meta->mark_dirty(0);
        if (g.type != fat_type::fat12) {
            uint32_t v = 0;
            rc = fat_get(1, v);
            if (rc < 0) {
                return rc;
            }
            uint32_t clean_bit = g.type == fat_type::fat16 ? 0x8000 : 0x08000000;
            rc = fat_set(1, dirty ? (v & ~clean_bit) : (v | clean_bit));
            if (rc < 0) {
                return rc;
            }
        }
        return 0;
    }

    // ------------------------------------------------------------ mount
    result<void> mount_volume()
    {
        uint32_t dss = dev.sector_size();
        std::vector<uint8_t> boot(std::max<uint32_t>(dss, 512));
        if (dev.sector_count() == 0) {
            return make_error(EINVAL, "the device is empty");
        }
        int rc = dev.read(0, 1, boot.data());
        if (rc < 0) {
            return make_error(-rc, fmt::format("reading the boot sector: {}", std::strerror(-rc)));
        }
        const uint8_t* b = boot.data();
        if (b[510] != 0x55 || b[511] != 0xAA) {
            return make_error(EINVAL,
                              "not a FAT file system: no boot signature 55 AA at offset 510");
        }
        g.bps = le16(b + 11);
        if (g.bps != 512 && g.bps != 1024 && g.bps != 2048 && g.bps != 4096) {
            return make_error(
                EINVAL,
                fmt::format("boot sector: {} bytes per sector; must be 512, 1024, 2048 or 4096",
                            g.bps));
        }
        if (g.bps < dss || g.bps % dss != 0) {
            return make_error(
                EINVAL,
                fmt::format("the file system uses {}-byte sectors but the device has {}-byte "
                            "sectors; use a device with {}-byte sectors",
                            g.bps, dss, g.bps));
        }
        g.ratio = g.bps / dss;
        g.spc = b[13];
        if (g.spc == 0 || (g.spc & (g.spc - 1)) != 0) {
            return make_error(
                EINVAL,
                fmt::format("boot sector: {} sectors per cluster; must be a power of two", g.spc));
        }
        g.cluster_bytes = g.spc * g.bps;
        g.reserved = le16(b + 14);
        if (g.reserved == 0) {
            return make_error(EINVAL,
                              "boot sector: 0 reserved sectors; the boot sector itself needs one");
        }
        g.fat_count = b[16];
        if (g.fat_count == 0 || g.fat_count > 16) {
            return make_error(EINVAL,
                              fmt::format("boot sector: {} FATs; must be 1..16", g.fat_count));
        }
        g.root_entries = le16(b + 17);
        uint32_t total16 = le16(b + 19);
        uint32_t fat16_size = le16(b + 22);
        uint32_t total32 = le32(b + 32);
        g.total_sectors = total16 != 0 ? total16 : total32;
        bool fat32 = fat16_size == 0;
        g.fat_sectors = fat32 ? le32(b + 36) : fat16_size;
        if (g.fat_sectors == 0) {
            return make_error(EINVAL, "boot sector: the FAT size is 0");
        }
        uint64_t dev_sectors = dev.sector_count() / g.ratio;
        if (g.total_sectors == 0) {
            return make_error(EINVAL, "boot sector: total sector count is 0");
        }
        if (g.total_sectors > dev_sectors) {
            return make_error(
                EINVAL,
                fmt::format("boot sector says {} sectors but the device holds {}; the image is "
                            "truncated or belongs to a bigger device",
                            g.total_sectors, dev_sectors));
        }
        if (fat32 && g.root_entries != 0) {
            return make_error(EINVAL, "boot sector: FAT32 with a fixed root directory");
        }
        if (!fat32 && g.root_entries == 0) {
            return make_error(EINVAL, "boot sector: FAT12/16 without root directory entries");
        }
        g.root_sectors = (g.root_entries * k_dirent_size + g.bps - 1) / g.bps;
        g.fat_start = g.reserved;
        g.root_start = g.fat_start + uint64_t{g.fat_count} * g.fat_sectors;
        g.data_start = g.root_start + g.root_sectors;
        if (g.data_start >= g.total_sectors) {
            return make_error(
                EINVAL,
                fmt::format("boot sector: the data area would start at sector {}, past the end "
                            "({} sectors)",
                            g.data_start, g.total_sectors));
        }
        uint64_t count = (g.total_sectors - g.data_start) / g.spc;
        if (fat32) {
            g.type = fat_type::fat32;
        } else if (count < 4085) {
            g.type = fat_type::fat12;
        } else if (count < 65525) {
            g.type = fat_type::fat16;
        } else {
            return make_error(
                EINVAL,
                fmt::format("boot sector: {} clusters is too many for FAT12/16 and the FAT32 "
                            "fields are missing",
                            count));
        }
        uint64_t fat_entries = g.type == fat_type::fat12   ? uint64_t{g.fat_sectors} * g.bps * 2 / 3
                               : g.type == fat_type::fat16 ? uint64_t{g.fat_sectors} * g.bps / 2
                                                           : uint64_t{g.fat_sectors} * g.bps / 4;
        if (fat_entries < 3) {
            return make_error(EINVAL, "boot sector: the FAT is too small for any cluster");
        }
        if (count + 2 > fat_entries) {
            note(fmt::format("the FAT holds {} entries but the data area has {} clusters; using {}",
                             fat_entries, count, fat_entries - 2));
            count = fat_entries - 2;
        }
        if (g.type == fat_type::fat32 && count > 0x0FFFFFF5) {
            count = 0x0FFFFFF5;
        }
        if (count == 0) {
            return make_error(EINVAL, "boot sector: no data clusters");
        }
        g.cluster_count = static_cast<uint32_t>(count);
        switch (g.type) {
        case fat_type::fat12:
            g.eoc_min = 0xFF8;
            g.bad = 0xFF7;
            g.eoc = 0xFFF;
            break;
        case fat_type::fat16:
            g.eoc_min = 0xFFF8;
            g.bad = 0xFFF7;
            g.eoc = 0xFFFF;
            break;
        case fat_type::fat32:
            g.eoc_min = 0x0FFFFFF8;
            g.bad = 0x0FFFFFF7;
            g.eoc = 0x0FFFFFFF;
            break;
        }
        if (g.type == fat_type::fat32) {
            uint16_t ext = le16(b + 40);
            g.mirror = (ext & 0x80) == 0;
            g.active_fat = g.mirror ? 0 : (ext & 0x0F);
            if (g.active_fat >= g.fat_count) {
                return make_error(EINVAL, fmt::format("boot sector: active FAT {} but only {} FATs",
                                                      g.active_fat, g.fat_count));
            }
            if (le16(b + 42) != 0) {
                return make_error(
                    EINVAL, fmt::format("boot sector: FAT32 version {:#x} is not 0", le16(b + 42)));
            }
            g.root_cluster = le32(b + 44);
            if (!valid_cluster(g.root_cluster)) {
                return make_error(
                    EINVAL, fmt::format("boot sector: root directory cluster {} outside 2..{}",
                                        g.root_cluster, g.cluster_count + 1));
            }
            g.fsinfo_sector = le16(b + 48);
            if (g.fsinfo_sector == 0 || g.fsinfo_sector >= g.reserved) {
                g.fsinfo_sector = 0;
            }
            g.state_offset = 65;
            volume_id = le32(b + 67);
            if (b[66] == 0x29) {
                label = std::string(reinterpret_cast<const char*>(b + 71), 11);
            }
        } else {
            g.state_offset = 37;
            volume_id = le32(b + 39);
            if (b[38] == 0x29) {
                label = std::string(reinterpret_cast<const char*>(b + 43), 11);
            }
        }
        while (!label.empty() && label.back() == ' ') {
            label.pop_back();
        }
        was_dirty = (b[g.state_offset] & k_state_dirty) != 0;
        read_only = opts.read_only || dev.read_only();

        meta = std::make_unique<sector_cache>(dev, g.bps, g.ratio, opts.meta_cache_sectors,
                                              opts.read_ahead_sectors, true);
        data = std::make_unique<sector_cache>(dev, g.bps, g.ratio, opts.data_cache_sectors,
                                              opts.read_ahead_sectors, false);
        rc = scan_fat();
        if (rc < 0) {
            return make_error(-rc, fmt::format("reading the FAT: {}", std::strerror(-rc)));
        }
        if (g.type == fat_type::fat32 && g.fsinfo_sector != 0) {
            uint8_t* fsi = nullptr;
            rc = meta->get(g.fsinfo_sector, g.fsinfo_sector + 1, sector_cache::fill::read, fsi);
            if (rc < 0) {
                return make_error(-rc, fmt::format("reading FSInfo: {}", std::strerror(-rc)));
            }
            fsinfo_valid = le32(fsi) == 0x41615252 && le32(fsi + 484) == 0x61417272 &&
                           le32(fsi + 508) == 0xAA550000;
            if (fsinfo_valid) {
                uint32_t hint = le32(fsi + 492);
                if (valid_cluster(hint)) {
                    next_free = hint;
                }
            } else {
                note("FSInfo sector has bad signatures; it is left alone");
            }
        }
        if (!read_only) {
            rc = set_dirty_state(true);
            if (rc == 0) {
                rc = sync_all();
            }
            if (rc < 0) {
                return make_error(-rc,
                                  fmt::format("setting the dirty bit: {}", std::strerror(-rc)));
            }
        }
        return {};
    }

    result<void> unmount_volume()
    {
        if (!mounted) {
            return {};
        }
        if (dead) {
            mounted = false;
            return {};
        }
        if (!read_only) {
            int rc = write_back_all();
            if (rc == 0) {
                rc = set_dirty_state(false);
            }
            if (rc == 0) {
                rc = sync_all();
            }
            if (rc < 0) {
                return fail(rc, "unmount");
            }
        }
        mounted = false;
        return {};
    }

    void fill_stat(const uint8_t* e, file_stat& st)
    {
        st.attributes = e[dirent::attr];
        st.is_directory = (st.attributes & k_attr_directory) != 0;
        uint32_t hi = g.type == fat_type::fat32 ? le16(e + dirent::cluster_hi) : 0;
        st.first_cluster = (hi << 16) | le16(e + dirent::cluster_lo);
        st.size = st.is_directory ? 0 : le32(e + dirent::size);
        st.allocated = (st.size + g.cluster_bytes - 1) / g.cluster_bytes * g.cluster_bytes;
        st.modified = from_fat_time(le16(e + dirent::wrt_date), le16(e + dirent::wrt_time));
        st.created = from_fat_time(le16(e + dirent::crt_date), le16(e + dirent::crt_time),
                                   e[dirent::crt_tenth]);
        st.accessed = from_fat_time(le16(e + dirent::acc_date), 0);
    }

    int stat_of(const entry_info& info, file_stat& st)
    {
        if (info.is_root) {
            st = file_stat{};
            st.is_directory = true;
            st.attributes = k_attr_directory;
            st.first_cluster = root_key();
            return 0;
        }
        dir_index* d = nullptr;
        int rc = load_dir(info.parent_key, d);
        if (rc < 0) {
            return rc;
        }
        uint8_t* e = nullptr;
        rc = entry_at(*d, info.slot, e, false);
        if (rc < 0) {
            return rc;
        }
        fill_stat(e, st);
        return 0;
    }

    void close_node(const std::shared_ptr<node>& n)
    {
        if (--n->open_count > 0) {
            return;
        }
        if (n->unlinked) {
            if (n->first_cluster != 0 && !dead && mounted) {
                (void)free_chain(n->first_cluster);
            }
        } else if (!n->is_root) {
            auto it = open_nodes.find(node_key(n->parent_key, n->slot));
            if (it != open_nodes.end() && it->second == n) {
                open_nodes.erase(it);
            }
        }
    }

    // Removes a directory entry; frees the file's clusters unless it is
    // open (then at its last close).
    int remove_file(dir_index& d, const entry_info& info)
    {
        auto it = open_nodes.find(node_key(d.key, info.slot));
        std::shared_ptr<node> open;
        if (it != open_nodes.end()) {
            open = it->second;
            open_nodes.erase(it);
        }
        int rc = remove_entry(d, info.slot);
        if (rc < 0) {
            return rc;
        }
        if (open) {
            open->unlinked = true;
            return 0;
        }
        if (info.first_cluster != 0) {
            return free_chain(info.first_cluster);
        }
        return 0;
    }

    int dir_is_empty(uint32_t key, bool& empty)
    {
        dir_index* d = nullptr;
        int rc = load_dir(key, d);
        if (rc < 0) {
            return rc;
        }
        empty = true;
        for (auto& [slot, rec] : d->records) {
            if (!rec.dot) {
                empty = false;
                break;
            }
        }
        return 0;
    }

    int remove_dir(dir_index& parent, const entry_info& info)
    {
        int rc = remove_entry(parent, info.slot);
        if (rc < 0) {
            return rc;
        }
        dirs.erase(info.first_cluster);
        return free_chain(info.first_cluster);
    }
};

// ============================================================== volume

namespace {

struct op_guard {
    std::unique_lock<std::mutex> lock;
    volume_state& v;
    explicit op_guard(volume_state& vol) : lock(vol.mu), v(vol)
    {
        v.last_corruption.clear();
        if (v.dirs.size() > k_max_cached_dirs) {
            v.dirs.clear();  // only between operations: nobody holds an index
        }
    }
    ~op_guard()
    {
        if (!v.dead && v.mounted && !v.read_only) {
            v.op_end();
        }
    }
};

}  // namespace

volume::volume(std::shared_ptr<volume_state> state) : _impl(std::move(state))
{
}

volume::~volume()
{
    if (_impl) {
        std::lock_guard lock(_impl->mu);
        auto r = _impl->unmount_volume();
        if (!r) {
            _impl->note(r.error().message);
        }
    }
}

result<std::unique_ptr<volume>> volume::mount(block_device& device, const mount_options& options)
{
    auto state = std::make_shared<volume_state>(device, options);
    auto r = state->mount_volume();
    if (!r) {
        return std::unexpected(r.error());
    }
    return std::unique_ptr<volume>(new volume(std::move(state)));
}

result<void> volume::unmount()
{
    std::lock_guard lock(_impl->mu);
    return _impl->unmount_volume();
}

result<void> volume::sync()
{
    op_guard op(*_impl);
    int rc = _impl->check_usable(false);
    if (rc == 0 && !_impl->read_only) {
        rc = _impl->sync_all();
    }
    if (rc < 0) {
        return _impl->fail(rc, "sync");
    }
    return {};
}

void volume::crash_for_testing()
{
    std::lock_guard lock(_impl->mu);
    _impl->meta->discard_all();
    _impl->data->discard_all();
    _impl->pending_bytes = 0;
    _impl->dead = true;
}

std::vector<std::string> volume::problems() const
{
    std::lock_guard lock(_impl->mu);
    return _impl->problem_log;
}

cache_stats volume::stats() const
{
    std::lock_guard lock(_impl->mu);
    cache_stats s = _impl->counters;
    s.meta_hits = _impl->meta->hits();
    s.meta_misses = _impl->meta->misses();
    s.data_hits = _impl->data->hits();
    s.data_misses = _impl->data->misses();
    s.writeback_runs = _impl->meta->runs_written() + _impl->data->runs_written();
    return s;
}

block_device& volume::device()
{
    return _impl->dev;
}

result<volume_stat> volume::statfs()
{
    op_guard op(*_impl);
    auto& v = *_impl;
    volume_stat s;
    s.type = v.g.type;
    s.sector_size = v.g.bps;
    s.cluster_size = v.g.cluster_bytes;
    s.total_clusters = v.g.cluster_count;
    s.free_clusters = v.free_count;
    s.volume_id = v.volume_id;
    s.label = v.label;
    s.was_dirty = v.was_dirty;
    return s;
}

result<file> volume::open(std::string_view path, unsigned flags)
{
    op_guard op(*_impl);
    auto& v = *_impl;
    bool writing = (flags & (k_open_write | k_open_create | k_open_truncate | k_open_append)) != 0;
    int rc = v.check_usable(writing);
    if (rc < 0) {
        return v.fail(rc, path);
    }
    auto parts = split_path(path);
    entry_info info;
    std::shared_ptr<node> n;
    if (parts.empty()) {
        if (writing) {
            return v.fail(-EISDIR, path);
        }
        rc = v.resolve_parts(parts, 0, info);
        n = v.node_for(info);
    } else {
        entry_info parent;
        rc = v.resolve_parts(parts, parts.size() - 1, parent);
        if (rc < 0) {
            return v.fail(rc, path);
        }
        if (!parent.is_dir) {
            return v.fail(-ENOTDIR, path);
        }
        dir_index* d = nullptr;
        rc = v.load_dir(v.dir_key_of(parent), d);
        if (rc < 0) {
            return v.fail(rc, path);
        }
        std::string leaf(strip_trailing(parts.back()));
        uint32_t slot = 0;
        rc = v.lookup(*d, leaf, slot);
        if (rc == 0) {
            if ((flags & k_open_create) && (flags & k_open_exclusive)) {
                return v.fail(-EEXIST, path);
            }
            rc = v.read_info(*d, slot, info);
            if (rc < 0) {
                return v.fail(rc, path);
            }
            if (info.is_dir && writing) {
                return v.fail(-EISDIR, path);
            }
            n = v.node_for(info);
            if ((flags & k_open_truncate) && (flags & k_open_write) && n->size != 0) {
                rc = v.truncate_node(*n, 0);
                if (rc < 0) {
                    return v.fail(rc, path);
                }
            }
        } else if (rc == -ENOENT && (flags & k_open_create)) {
            if (!valid_long_name(leaf)) {
                return v.fail(leaf.size() > 255 ? -ENAMETOOLONG : -EINVAL, path);
            }
            uint8_t tmpl[32] = {};
            tmpl[dirent::attr] = k_attr_archive;
            v.stamp(tmpl, true, true);
            rc = v.add_entry(*d, leaf, tmpl, slot);
            if (rc < 0) {
                return v.fail(rc, path);
            }
            rc = v.read_info(*d, slot, info);
            if (rc < 0) {
                return v.fail(rc, path);
            }
            n = v.node_for(info);
        } else {
            return v.fail(rc, path);
        }
    }
    if (rc < 0) {
        return v.fail(rc, path);
    }
    if (!n->is_root) {
        v.open_nodes[volume_state::node_key(n->parent_key, n->slot)] = n;
    }
    ++n->open_count;
    file f;
    f._volume = _impl;
    f._node = std::move(n);
    f._flags = flags;
    return f;
}

result<void> volume::mkdir(std::string_view path)
{
    op_guard op(*_impl);
    auto& v = *_impl;
    int rc = v.check_usable(true);
    if (rc < 0) {
        return v.fail(rc, path);
    }
    auto parts = split_path(path);
    if (parts.empty()) {
        return v.fail(-EEXIST, path);
    }
    entry_info parent;
    rc = v.resolve_parts(parts, parts.size() - 1, parent);
    if (rc < 0) {
        return v.fail(rc, path);
    }
    if (!parent.is_dir) {
        return v.fail(-ENOTDIR, path);
    }
    dir_index* d = nullptr;
    uint32_t parent_key = v.dir_key_of(parent);
    rc = v.load_dir(parent_key, d);
    if (rc < 0) {
        return v.fail(rc, path);
    }
    std::string leaf(strip_trailing(parts.back()));
    uint32_t slot = 0;
    if (v.lookup(*d, leaf, slot) == 0) {
        return v.fail(-EEXIST, path);
    }
    if (!valid_long_name(leaf)) {
        return v.fail(-EINVAL, path);
    }
    if (v.free_count == 0) {
        return v.fail(-ENOSPC, path);
    }
    std::vector<uint32_t> fresh;
    rc = v.allocate(1, v.next_free, fresh);
    if (rc < 0) {
        return v.fail(rc, path);
    }
    uint32_t c = fresh[0];
    rc = v.zero_dir_cluster(c);
    uint8_t tmpl[32] = {};
    tmpl[dirent::attr] = k_attr_directory;
    v.stamp(tmpl, true, true);
    if (v.g.type == fat_type::fat32) {
        put16(tmpl + dirent::cluster_hi, static_cast<uint16_t>(c >> 16));
    }
    put16(tmpl + dirent::cluster_lo, static_cast<uint16_t>(c));
    if (rc == 0) {
        rc = v.add_entry(*d, leaf, tmpl, slot);
    }
    if (rc < 0) {
        (void)v.free_chain(c);
        return v.fail(rc, path);
    }
    // "." and "..": ".." holds 0 when the parent is the root (also on FAT32).
    uint8_t* buf = nullptr;
    uint64_t s = v.cluster_sector(c);
    rc = v.meta->get(s, s + 1, sector_cache::fill::read, buf);
    if (rc < 0) {
        return v.fail(rc, path);
    }
    v.meta->mark_dirty(s);
    std::memcpy(buf, tmpl, 32);
    std::memset(buf, ' ', 11);
    buf[0] = '.';
    std::memcpy(buf + 32, tmpl, 32);
    std::memset(buf + 32, ' ', 11);
    buf[32] = '.';
    buf[33] = '.';
    uint32_t up = parent.is_root ? 0 : parent_key;
    put16(buf + 32 + dirent::cluster_hi,
          v.g.type == fat_type::fat32 ? static_cast<uint16_t>(up >> 16) : 0);
    put16(buf + 32 + dirent::cluster_lo, static_cast<uint16_t>(up));
    return {};
}

result<void> volume::rmdir(std::string_view path)
{
    op_guard op(*_impl);
    auto& v = *_impl;
    int rc = v.check_usable(true);
    if (rc < 0) {
        return v.fail(rc, path);
    }
    auto parts = split_path(path);
    if (parts.empty()) {
        return v.fail(-EBUSY, path);
    }
    entry_info info;
    rc = v.resolve_parts(parts, parts.size(), info);
    if (rc < 0) {
        return v.fail(rc, path);
    }
    if (!info.is_dir) {
        return v.fail(-ENOTDIR, path);
    }
    bool empty = false;
    rc = v.dir_is_empty(info.first_cluster, empty);
    if (rc < 0) {
        return v.fail(rc, path);
    }
    if (!empty) {
        return v.fail(-ENOTEMPTY, path);
    }
    dir_index* parent = nullptr;
    rc = v.load_dir(info.parent_key, parent);
    if (rc == 0) {
        rc = v.remove_dir(*parent, info);
    }
    if (rc < 0) {
        return v.fail(rc, path);
    }
    return {};
}

result<void> volume::unlink(std::string_view path)
{
    op_guard op(*_impl);
    auto& v = *_impl;
    int rc = v.check_usable(true);
    if (rc < 0) {
        return v.fail(rc, path);
    }
    auto parts = split_path(path);
    if (parts.empty()) {
        return v.fail(-EISDIR, path);
    }
    entry_info info;
    rc = v.resolve_parts(parts, parts.size(), info);
    if (rc < 0) {
        return v.fail(rc, path);
    }
    if (info.is_dir) {
        return v.fail(-EISDIR, path);
    }
    dir_index* parent = nullptr;
    rc = v.load_dir(info.parent_key, parent);
    if (rc == 0) {
        rc = v.remove_file(*parent, info);
    }
    if (rc < 0) {
        return v.fail(rc, path);
    }
    return {};
}

result<void> volume::rename(std::string_view from, std::string_view to)
{
    op_guard op(*_impl);
    auto& v = *_impl;
    std::string what = fmt::format("rename {} -> {}", from, to);
    int rc = v.check_usable(true);
    if (rc < 0) {
        return v.fail(rc, what);
    }
    auto src = split_path(from);
    auto dst = split_path(to);
    if (src.empty() || dst.empty()) {
        return v.fail(-EBUSY, what);
    }
    entry_info info;
    rc = v.resolve_parts(src, src.size(), info);
    if (rc < 0) {
        return v.fail(rc, what);
    }
    if (info.is_dir && dst.size() > src.size()) {
        bool inside = true;
        for (size_t i = 0; i < src.size(); ++i) {
            inside = inside && fold(src[i]) == fold(dst[i]);
        }
        if (inside) {
            return v.fail(-EINVAL, what);  // into its own subtree
        }
    }
    entry_info to_parent;
    rc = v.resolve_parts(dst, dst.size() - 1, to_parent);
    if (rc < 0) {
        return v.fail(rc, what);
    }
    if (!to_parent.is_dir) {
        return v.fail(-ENOTDIR, what);
    }
    uint32_t to_key = v.dir_key_of(to_parent);
    dir_index* td = nullptr;
    rc = v.load_dir(to_key, td);
    if (rc < 0) {
        return v.fail(rc, what);
    }
    std::string leaf(strip_trailing(dst.back()));
    if (!valid_long_name(leaf)) {
        return v.fail(-EINVAL, what);
    }
    uint32_t existing = 0;
    bool same_entry = false;
    if (v.lookup(*td, leaf, existing) == 0) {
        if (td->key == info.parent_key && existing == info.slot) {
            same_entry = true;
            if (td->records.at(existing).name == leaf) {
                return {};
            }
        } else {
            entry_info target;
            rc = v.read_info(*td, existing, target);
            if (rc < 0) {
                return v.fail(rc, what);
            }
            if (info.is_dir) {
                if (!target.is_dir) {
                    return v.fail(-ENOTDIR, what);
                }
                bool empty = false;
                rc = v.dir_is_empty(target.first_cluster, empty);
                if (rc < 0) {
                    return v.fail(rc, what);
                }
                if (!empty) {
                    return v.fail(-ENOTEMPTY, what);
                }
                rc = v.load_dir(to_key, td);
                if (rc == 0) {
                    rc = v.remove_dir(*td, target);
                }
            } else {
                if (target.is_dir) {
                    return v.fail(-EISDIR, what);
                }
                rc = v.remove_file(*td, target);
            }
            if (rc < 0) {
                return v.fail(rc, what);
            }
        }
    }
    // Reload both (removing a directory may have dropped cached indexes).
    dir_index* sd = nullptr;
    rc = v.load_dir(info.parent_key, sd);
    if (rc == 0) {
        rc = v.load_dir(to_key, td);
    }
    if (rc < 0) {
        return v.fail(rc, what);
    }
    uint8_t tmpl[32];
    uint8_t* e = nullptr;
    rc = v.entry_at(*sd, info.slot, e, false);
    if (rc < 0) {
        return v.fail(rc, what);
    }
    std::memcpy(tmpl, e, 32);
    // A case-only rename must be able to reuse the entry's own short name.
    dir_record saved;
    if (same_entry) {
        saved = sd->records.at(info.slot);
        sd->by_name.erase(fold(saved.name));
        sd->by_short.erase(short_key(saved.sname));
    }
    uint32_t new_slot = 0;
    rc = v.add_entry(*td, leaf, tmpl, new_slot);
    if (rc < 0) {
        if (same_entry) {
            sd->by_name.emplace(fold(saved.name), info.slot);
            sd->by_short.emplace(short_key(saved.sname), info.slot);
        }
        return v.fail(rc, what);
    }
    rc = v.remove_entry(*sd, info.slot);
    if (rc < 0) {
        return v.fail(rc, what);
    }
    if (info.is_dir && info.parent_key != to_key) {
        dir_index* moved = nullptr;
        rc = v.load_dir(info.first_cluster, moved);
        if (rc < 0) {
            return v.fail(rc, what);
        }
        for (auto& [slot, rec] : moved->records) {
            if (rec.dot && rec.name == "..") {
                uint8_t* dd = nullptr;
                rc = v.entry_at(*moved, slot, dd, true);
                if (rc < 0) {
                    return v.fail(rc, what);
                }
                uint32_t up = to_parent.is_root ? 0 : to_key;
                if (v.g.type == fat_type::fat32) {
                    put16(dd + dirent::cluster_hi, static_cast<uint16_t>(up >> 16));
                }
                put16(dd + dirent::cluster_lo, static_cast<uint16_t>(up));
                break;
            }
        }
    }
    auto it = v.open_nodes.find(volume_state::node_key(info.parent_key, info.slot));
    if (it != v.open_nodes.end()) {
        auto n = it->second;
        v.open_nodes.erase(it);
        n->parent_key = to_key;
        n->slot = new_slot;
        v.open_nodes[volume_state::node_key(to_key, new_slot)] = n;
    }
    return {};
}

result<void> volume::truncate(std::string_view path, uint64_t size)
{
    op_guard op(*_impl);
    auto& v = *_impl;
    int rc = v.check_usable(true);
    if (rc < 0) {
        return v.fail(rc, path);
    }
    auto parts = split_path(path);
    entry_info info;
    rc = v.resolve_parts(parts, parts.size(), info);
    if (rc < 0) {
        return v.fail(rc, path);
    }
    if (info.is_dir) {
        return v.fail(-EISDIR, path);
    }
    auto n = v.node_for(info);
    rc = v.truncate_node(*n, size);
    if (rc < 0) {
        return v.fail(rc, path);
    }
    return {};
}

result<file_stat> volume::stat(std::string_view path)
{
    op_guard op(*_impl);
    auto& v = *_impl;
    int rc = v.check_usable(false);
    if (rc < 0) {
        return v.fail(rc, path);
    }
    auto parts = split_path(path);
    entry_info info;
    rc = v.resolve_parts(parts, parts.size(), info);
    file_stat st;
    if (rc == 0) {
        rc = v.stat_of(info, st);
    }
    if (rc < 0) {
        return v.fail(rc, path);
    }
    return st;
}

result<std::vector<dir_entry>> volume::readdir(std::string_view path)
{
    op_guard op(*_impl);
    auto& v = *_impl;
    int rc = v.check_usable(false);
    if (rc < 0) {
        return v.fail(rc, path);
    }
    auto parts = split_path(path);
    entry_info info;
    rc = v.resolve_parts(parts, parts.size(), info);
    if (rc < 0) {
        return v.fail(rc, path);
    }
    if (!info.is_dir) {
        return v.fail(-ENOTDIR, path);
    }
    dir_index* d = nullptr;
    rc = v.load_dir(v.dir_key_of(info), d);
    if (rc < 0) {
        return v.fail(rc, path);
    }
    std::vector<dir_entry> out;
    out.reserve(d->records.size());
    for (auto& [slot, rec] : d->records) {
        if (rec.dot) {
            continue;
        }
        uint8_t* e = nullptr;
        rc = v.entry_at(*d, slot, e, false);
        if (rc < 0) {
            return v.fail(rc, path);
        }
        dir_entry de;
        de.name = rec.name;
        de.short_name = short_to_string(rec.sname.data());
        v.fill_stat(e, de.stat);
        out.push_back(std::move(de));
    }
    return out;
}

result<void> volume::set_times(std::string_view path, std::time_t modified, std::time_t accessed)
{
    op_guard op(*_impl);
    auto& v = *_impl;
    int rc = v.check_usable(true);
    if (rc < 0) {
        return v.fail(rc, path);
    }
    auto parts = split_path(path);
    entry_info info;
    rc = v.resolve_parts(parts, parts.size(), info);
    if (rc < 0) {
        return v.fail(rc, path);
    }
    if (info.is_root) {
        return {};
    }
    dir_index* d = nullptr;
    rc = v.load_dir(info.parent_key, d);
    uint8_t* e = nullptr;
    if (rc == 0) {
        rc = v.entry_at(*d, info.slot, e, true);
    }
    if (rc < 0) {
        return v.fail(rc, path);
    }
    fat_time m = to_fat_time(modified);
    fat_time a = to_fat_time(accessed);
    put16(e + dirent::wrt_time, m.time);
    put16(e + dirent::wrt_date, m.date);
    put16(e + dirent::acc_date, a.date);
    return {};
}

result<void> volume::set_attributes(std::string_view path, uint8_t attributes)
{
    op_guard op(*_impl);
    auto& v = *_impl;
    int rc = v.check_usable(true);
    if (rc < 0) {
        return v.fail(rc, path);
    }
    auto parts = split_path(path);
    entry_info info;
    rc = v.resolve_parts(parts, parts.size(), info);
    if (rc < 0) {
        return v.fail(rc, path);
    }
    if (info.is_root) {
        return v.fail(-EINVAL, path);
    }
    dir_index* d = nullptr;
    rc = v.load_dir(info.parent_key, d);
    uint8_t* e = nullptr;
    if (rc == 0) {
        rc = v.entry_at(*d, info.slot, e, true);
    }
    if (rc < 0) {
        return v.fail(rc, path);
    }
    uint8_t keep = e[dirent::attr] & (k_attr_directory | k_attr_volume_id);
    e[dirent::attr] = static_cast<uint8_t>(
        keep | (attributes & (k_attr_read_only | k_attr_hidden | k_attr_system | k_attr_archive)));
    return {};
}

// ============================================================== file

file::file(file&& other) noexcept
    : _volume(other._volume),
      _node(std::move(other._node)),
      _flags(other._flags),
      _position(other._position)
{
    other._volume = nullptr;
}

file& file::operator=(file&& other) noexcept
{
    if (this != &other) {
        close();
        _volume = other._volume;
        _node = std::move(other._node);
        _flags = other._flags;
        _position = other._position;
        other._volume = nullptr;
    }
    return *this;
}

file::~file()
{
    close();
}

int64_t file::pread(void* buffer, size_t length, uint64_t offset)
{
    if (_volume == nullptr) {
        return -EBADF;
    }
    if (!(_flags & k_open_read) && (_flags & k_open_write)) {
        return -EBADF;
    }
    op_guard op(*_volume);
    auto& v = *_volume;
    int rc = v.check_usable(false);
    if (rc < 0) {
        return rc;
    }
    return v.read_node(*_node, static_cast<uint8_t*>(buffer), length, offset);
}

int64_t file::pwrite(const void* buffer, size_t length, uint64_t offset)
{
    if (_volume == nullptr || !(_flags & k_open_write)) {
        return -EBADF;
    }
    op_guard op(*_volume);
    auto& v = *_volume;
    int rc = v.check_usable(true);
    if (rc < 0) {
        return rc;
    }
    if (_flags & k_open_append) {
        offset = _node->size;
    }
    return v.write_node(*_node, static_cast<const uint8_t*>(buffer), length, offset);
}

int64_t file::read(void* buffer, size_t length)
{
    int64_t n = pread(buffer, length, _position);
    if (n > 0) {
        _position += static_cast<uint64_t>(n);
    }
    return n;
}

int64_t file::write(const void* buffer, size_t length)
{
    int64_t n = pwrite(buffer, length, _position);
    if (n > 0) {
        _position = (_flags & k_open_append) ? size() : _position + static_cast<uint64_t>(n);
    }
    return n;
}

int file::truncate(uint64_t size)
{
    if (_volume == nullptr || !(_flags & k_open_write)) {
        return -EBADF;
    }
    op_guard op(*_volume);
    auto& v = *_volume;
    int rc = v.check_usable(true);
    if (rc < 0) {
        return rc;
    }
    return v.truncate_node(*_node, size);
}

int file::fsync()
{
    if (_volume == nullptr) {
        return -EBADF;
    }
    op_guard op(*_volume);
    auto& v = *_volume;
    int rc = v.check_usable(false);
    if (rc < 0 || v.read_only) {
        return rc;
    }
    return v.sync_all();
}

uint64_t file::size() const
{
    if (_volume == nullptr) {
        return 0;
    }
    std::lock_guard lock(_volume->mu);
    return _node->size;
}

result<file_stat> file::stat() const
{
    if (_volume == nullptr) {
        return make_error(EBADF, "stat: the file is closed");
    }
    op_guard op(*_volume);
    auto& v = *_volume;
    file_stat st;
    if (_node->is_root || _node->unlinked) {
        st.is_directory = _node->is_dir;
        st.size = _node->size;
        st.first_cluster = _node->first_cluster;
        return st;
    }
    entry_info info;
    info.parent_key = _node->parent_key;
    info.slot = _node->slot;
    int rc = v.stat_of(info, st);
    if (rc < 0) {
        return v.fail(rc, "stat");
    }
    return st;
}

int file::close()
{
    if (_volume == nullptr) {
        return 0;
    }
    {
        op_guard op(*_volume);
        _volume->close_node(_node);
    }
    _node.reset();
    _volume = nullptr;
    return 0;
}

}  // namespace softblk::fat
