// The reference's "before" configuration for softblk-bench-fat --before:
// the Hermit unikernel's FAT before its cache fixes
// (../shared/references/hermit-virtio-blk-fat-pr.txt) moved exactly one
// sector per request through a 16-sector cache, without read-ahead.
#pragma once

#include <cstddef>
#include <cstdint>

#include <softblk/fat/block_device.hpp>
#include <softblk/fat/volume.hpp>

namespace softblk::fat {

// Passes every request on to `inner` as one request per sector (the inner
// device's counters then count the requests the device really saw).
class one_sector_device final : public block_device {
public:
    explicit one_sector_device(block_device& inner) : _inner(inner) {}
    uint32_t sector_size() const override { return _inner.sector_size(); }
    uint64_t sector_count() const override { return _inner.sector_count(); }
    uint32_t write_gather_bytes() const override { return 0; }

protected:
    int do_read(uint64_t lba, uint32_t count, void* buffer) override
    {
        auto* p = static_cast<char*>(buffer);
        for (uint32_t i = 0; i < count; ++i) {
            if (int r = _inner.read(lba + i, 1, p + size_t{i} * sector_size()); r < 0) {
                return r;
            }
        }
        return 0;
    }
    int do_write(uint64_t lba, uint32_t count, const void* buffer) override
    {
        const auto* p = static_cast<const char*>(buffer);
        for (uint32_t i = 0; i < count; ++i) {
            if (int r = _inner.write(lba + i, 1, p + size_t{i} * sector_size()); r < 0) {
                return r;
            }
        }
        return 0;
    }
    int do_flush() override { return _inner.flush(); }

private:
    block_device& _inner;
};

// The smallest caches the library keeps (it raises each to 32 sectors:
// 32 KiB in all with 512-byte sectors, against Hermit's 8 KiB), one sector
// per cache miss, every write straight to the device.
inline mount_options before_options()
{
    mount_options o;
    o.meta_cache_sectors = 16;
    o.data_cache_sectors = 16;
    o.read_ahead_sectors = 1;
    o.write_behind_bytes = 0;
    return o;
}

}  // namespace softblk::fat
