// Mount and sync: the boot sector is checked field by field into the
// geometry, the FAT scanned into the free map, FSInfo read; a read-write
// mount sets the dirty bits until unmount. Write-back of dirty metadata
// between operations, FSInfo updates, sync and unmount; and volume's
// volume-wide calls.
#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "volume_state.hpp"

namespace softblk::fat {

using namespace detail;

namespace {

// Bit 0 of the boot sector's state byte (offset 37, or 65 on FAT32): set
// while a read-write mount is active.
constexpr uint8_t k_state_dirty = 0x01;

}  // namespace

int volume_state::update_fsinfo()
{
    if (g.type != fat_type::fat32 || !fsinfo_valid) {
        return 0;
    }
    uint8_t* buf = nullptr;
    int rc = meta->get(g.fsinfo_sector, g.fsinfo_sector + 1, sector_cache::fill::read, buf);
    if (rc < 0) {
        return rc;
    }
    if (le32(buf + 488) != fat->free_count() || le32(buf + 492) != fat->next_free()) {
        put32(buf + 488, fat->free_count());
        put32(buf + 492, fat->next_free());
        meta->mark_dirty(g.fsinfo_sector);
    }
    return 0;
}

int volume_state::write_back_all()
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

int volume_state::sync_all()
{
    int rc = write_back_all();
    if (rc < 0) {
        return rc;
    }
    return dev.flush();
}

void volume_state::op_end()
{
    if (meta->dirty_count() > opts.meta_dirty_limit) {
        (void)write_back_all();
    }
}

int volume_state::set_dirty_state(bool dirty)
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
        rc = fat->get(1, v);
        if (rc < 0) {
            return rc;
        }
        uint32_t clean_bit = g.type == fat_type::fat16 ? 0x8000 : 0x08000000;
        rc = fat->set(1, dirty ? (v & ~clean_bit) : (v | clean_bit));
        if (rc < 0) {
            return rc;
        }
    }
    return 0;
}

result<void> volume_state::mount_volume()
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
        return make_error(EINVAL, "not a FAT file system: no boot signature 55 AA at offset 510");
    }
    g.bps = le16(b + 11);
    if (g.bps != 512 && g.bps != 1024 && g.bps != 2048 && g.bps != 4096) {
        return make_error(
            EINVAL, fmt::format("boot sector: {} bytes per sector; must be 512, 1024, 2048 or 4096",
                                g.bps));
    }
    if (g.bps < dss || g.bps % dss != 0) {
        return make_error(
            EINVAL, fmt::format("the file system uses {}-byte sectors but the device has {}-byte "
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
        return make_error(EINVAL, fmt::format("boot sector: {} FATs; must be 1..16", g.fat_count));
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
            EINVAL, fmt::format("boot sector says {} sectors but the device holds {}; the image is "
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
            EINVAL, fmt::format("boot sector: the data area would start at sector {}, past the end "
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
            EINVAL, fmt::format("boot sector: {} clusters is too many for FAT12/16 and the FAT32 "
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
        damage.note(
            fmt::format("the FAT holds {} entries but the data area has {} clusters; using {}",
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
        if (!g.valid_cluster(g.root_cluster)) {
            return make_error(EINVAL,
                              fmt::format("boot sector: root directory cluster {} outside 2..{}",
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
    fat = std::make_unique<fat_table>(g, *meta, dev, damage);
    rc = fat->scan();
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
            if (g.valid_cluster(hint)) {
                fat->set_next_free(hint);
            }
        } else {
            damage.note("FSInfo sector has bad signatures; it is left alone");
        }
    }
    if (!read_only) {
        rc = set_dirty_state(true);
        if (rc == 0) {
            rc = sync_all();
        }
        if (rc < 0) {
            return make_error(-rc, fmt::format("setting the dirty bit: {}", std::strerror(-rc)));
        }
    }
    return {};
}

result<void> volume_state::unmount_volume()
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

// ============================================================== volume

volume::volume(std::shared_ptr<volume_state> state) : _impl(std::move(state))
{
}

volume::~volume()
{
    if (_impl) {
        std::lock_guard lock(_impl->mu);
        auto r = _impl->unmount_volume();
        if (!r) {
            _impl->damage.note(r.error().message);
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
    return _impl->damage.entries();
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
    s.free_clusters = v.fat->free_count();
    s.volume_id = v.volume_id;
    s.label = v.label;
    s.was_dirty = v.was_dirty;
    return s;
}

}  // namespace softblk::fat
