// The file allocation table: FAT entries, chain steps, the free-cluster
// map and allocation. See fat_table.hpp.
#include "fat_table.hpp"

#include <algorithm>
#include <cerrno>

#include <fmt/format.h>

#include "layout.hpp"

namespace softblk::fat::detail {

fat_table::fat_table(const geometry& g, sector_cache& meta, block_device& dev, damage_log& damage)
    : _g(g), _meta(meta), _dev(dev), _damage(damage)
{
}

int fat_table::entry_byte(uint32_t copy, uint64_t offset, uint8_t*& p, bool dirty)
{
    uint64_t base = _g.fat_start + uint64_t{copy} * _g.fat_sectors;
    uint64_t sector = base + offset / _g.bps;
    uint8_t* buf = nullptr;
    int rc = _meta.get(sector, base + _g.fat_sectors, sector_cache::fill::read, buf);
    if (rc < 0) {
        return rc;
    }
    if (dirty) {
        _meta.mark_dirty(sector);
    }
    p = buf + offset % _g.bps;
    return 0;
}

int fat_table::get(uint32_t c, uint32_t& v)
{
    uint8_t* p = nullptr;
    int rc = 0;
    switch (_g.type) {
    case fat_type::fat32:
        rc = entry_byte(_g.active_fat, uint64_t{c} * 4, p, false);
        if (rc == 0) {
            v = le32(p) & 0x0FFFFFFF;
        }
        return rc;
    case fat_type::fat16:
        rc = entry_byte(_g.active_fat, uint64_t{c} * 2, p, false);
        if (rc == 0) {
            v = le16(p);
        }
        return rc;
    case fat_type::fat12: {
        uint64_t off = c + c / 2;
        rc = entry_byte(_g.active_fat, off, p, false);
        if (rc < 0) {
            return rc;
        }
        uint32_t lo = *p;
        rc = entry_byte(_g.active_fat, off + 1, p, false);
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

int fat_table::set(uint32_t c, uint32_t v)
{
    for (uint32_t copy = 0; copy < _g.fat_count; ++copy) {
        if (!_g.mirror && copy != _g.active_fat) {
            continue;
        }
        uint8_t* p = nullptr;
        int rc = 0;
        switch (_g.type) {
        case fat_type::fat32:
            rc = entry_byte(copy, uint64_t{c} * 4, p, true);
            if (rc == 0) {
                put32(p, (le32(p) & 0xF0000000) | (v & 0x0FFFFFFF));
            }
            break;
        case fat_type::fat16:
            rc = entry_byte(copy, uint64_t{c} * 2, p, true);
            if (rc == 0) {
                put16(p, static_cast<uint16_t>(v));
            }
            break;
        case fat_type::fat12: {
            uint64_t off = c + c / 2;
            rc = entry_byte(copy, off, p, true);
            if (rc < 0) {
                return rc;
            }
            if (c & 1) {
                *p = static_cast<uint8_t>((*p & 0x0F) | ((v << 4) & 0xF0));
            } else {
                *p = static_cast<uint8_t>(v);
            }
            rc = entry_byte(copy, off + 1, p, true);
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

int fat_table::next(uint32_t c, uint32_t& next)
{
    uint32_t v = 0;
    int rc = get(c, v);
    if (rc < 0) {
        return rc;
    }
    if (v >= _g.eoc_min) {
        next = 0;
        return 0;
    }
    if (v == 0) {
        return _damage.corrupt(fmt::format("cluster {} is free but part of a chain", c));
    }
    if (v == _g.bad) {
        return _damage.corrupt(fmt::format("chain runs into bad cluster after cluster {}", c));
    }
    if (!_g.valid_cluster(v)) {
        return _damage.corrupt(fmt::format("cluster {} points to cluster {}, outside 2..{}", c, v,
                                           _g.cluster_count + 1));
    }
    next = v;
    return 0;
}

void fat_table::set_free(uint32_t c, bool free)
{
    if (free) {
        _free_map[c >> 6] |= uint64_t{1} << (c & 63);
    } else {
        _free_map[c >> 6] &= ~(uint64_t{1} << (c & 63));
    }
}

uint32_t fat_table::find_free(uint32_t from) const
{
    uint32_t limit = _g.cluster_count + 2;
    if (from < 2 || from >= limit) {
        from = 2;
    }
    for (int pass = 0; pass < 2; ++pass) {
        uint32_t start = pass == 0 ? from : 2;
        uint32_t end = pass == 0 ? limit : from;
        uint32_t c = start;
        while (c < end) {
            uint64_t word = _free_map[c >> 6] >> (c & 63);
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

int fat_table::scan()
{
    _free_map.assign((uint64_t{_g.cluster_count} + 2 + 63) / 64, 0);
    _free_count = 0;
    uint64_t fat_bytes_needed =
        (_g.type == fat_type::fat12)   ? (uint64_t{_g.cluster_count} + 2) * 3 / 2 + 1
        : (_g.type == fat_type::fat16) ? (uint64_t{_g.cluster_count} + 2) * 2
                                       : (uint64_t{_g.cluster_count} + 2) * 4;
    uint64_t sectors = std::min<uint64_t>((fat_bytes_needed + _g.bps - 1) / _g.bps, _g.fat_sectors);
    uint64_t base = _g.fat_start + uint64_t{_g.active_fat} * _g.fat_sectors;
    uint32_t chunk_sectors = std::max<uint32_t>(1, (256 * 1024) / _g.bps);
    std::vector<uint8_t> buf;
    if (_g.type == fat_type::fat12) {
        buf.resize(sectors * _g.bps + 2, 0);
        int rc = _dev.read(base * _g.ratio, static_cast<uint32_t>(sectors * _g.ratio), buf.data());
        if (rc < 0) {
            return rc;
        }
        for (uint32_t c = 2; c < _g.cluster_count + 2; ++c) {
            uint64_t off = c + c / 2;
            uint32_t w = buf[off] | (uint32_t{buf[off + 1]} << 8);
            uint32_t v = (c & 1) ? (w >> 4) : (w & 0xFFF);
            if (v == 0) {
                set_free(c, true);
                ++_free_count;
            }
        }
        return 0;
    }
    uint32_t width = _g.type == fat_type::fat16 ? 2 : 4;
    buf.resize(uint64_t{chunk_sectors} * _g.bps);
    for (uint64_t s = 0; s < sectors; s += chunk_sectors) {
        uint64_t n = std::min<uint64_t>(chunk_sectors, sectors - s);
        int rc = _dev.read((base + s) * _g.ratio, static_cast<uint32_t>(n * _g.ratio), buf.data());
        if (rc < 0) {
            return rc;
        }
        uint64_t first = s * _g.bps / width;
        uint64_t count = n * _g.bps / width;
        for (uint64_t i = 0; i < count; ++i) {
            uint64_t c = first + i;
            if (c < 2) {
                continue;
            }
            if (c >= uint64_t{_g.cluster_count} + 2) {
                break;
            }
            uint32_t v = width == 2 ? le16(&buf[i * 2]) : (le32(&buf[i * 4]) & 0x0FFFFFFF);
            if (v == 0) {
                set_free(static_cast<uint32_t>(c), true);
                ++_free_count;
            }
        }
    }
    return 0;
}

int fat_table::allocate(uint32_t n, uint32_t hint, std::vector<uint32_t>& out)
{
    out.clear();
    if (n > _free_count) {
        return -ENOSPC;
    }
    uint32_t from = _g.valid_cluster(hint) ? hint : _next_free;
    for (uint32_t i = 0; i < n; ++i) {
        uint32_t c = find_free(from);
        if (c == 0) {
            for (uint32_t x : out) {
                set_free(x, true);
            }
            _free_count += static_cast<uint32_t>(out.size());
            return -ENOSPC;
        }
        set_free(c, false);
        out.push_back(c);
        from = c + 1;
    }
    _free_count -= n;
    _next_free = from;
    for (uint32_t i = 0; i < n; ++i) {
        int rc = set(out[i], i + 1 < n ? out[i + 1] : _g.eoc);
        if (rc < 0) {
            return rc;
        }
    }
    return 0;
}

void fat_table::release(uint32_t c)
{
    if (!is_free(c)) {
        set_free(c, true);
        ++_free_count;
    }
}

}  // namespace softblk::fat::detail
