// A FAT volume's layout as its boot sector gives it (parsed in mount.cpp),
// and the log of damage seen while using it. Internal to softblk_fat.
#pragma once

#include <cerrno>
#include <cstdint>
#include <string>
#include <vector>

#include <softblk/fat/volume.hpp>

namespace softblk::fat::detail {

// Sector numbers are file-system sectors (`bps` bytes); the device LBA of
// sector s is s * ratio.
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

    uint64_t cluster_sector(uint32_t c) const { return data_start + uint64_t{c - 2} * spc; }
    bool valid_cluster(uint32_t c) const { return c >= 2 && c < cluster_count + 2; }
    // The key of the root directory's index: its first cluster on FAT32, 0
    // (the fixed root area) on FAT12/16. A `..` entry holds 0 for the root
    // on every type.
    uint32_t root_key() const { return type == fat_type::fat32 ? root_cluster : 0; }
};

// Damage seen so far (volume::problems()) and the cause of the current
// operation's failure, which volume_state::fail() puts in its message.
class damage_log {
public:
    // Records `message` as the reason the current operation fails and
    // returns `rc` (-EIO, or -ELOOP for a directory cycle), for
    // `return damage.corrupt(...)`.
    int corrupt(std::string message, int rc = -EIO)
    {
        _last = message;
        note(std::move(message));
        return rc;
    }
    // Records damage that the operation works around.
    void note(std::string message)
    {
        if (_entries.size() < k_max_entries) {
            _entries.push_back(std::move(message));
        }
    }
    const std::string& last() const { return _last; }
    void clear_last() { _last.clear(); }
    const std::vector<std::string>& entries() const { return _entries; }

private:
    // A badly damaged image repeats itself; the first messages say enough.
    static constexpr size_t k_max_entries = 256;
    std::vector<std::string> _entries;
    std::string _last;
};

}  // namespace softblk::fat::detail
