// fat::block_device over a softblk device, through the in-process consumer
// API (device::execute, which splits requests on the device's limits).
// FLUSH goes to the device only when it has
// a volatile write cache; -EOPNOTSUPP from a flush counts as success.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>

#include <softblk/device.hpp>
#include <softblk/fat/block_device.hpp>

namespace softblk::fat {

class softblk_block_device final : public block_device {
public:
    // Borrows `device`, which must outlive this adapter.
    explicit softblk_block_device(softblk::device& device);
    // Creates a device of `type` from null_blk-style options
    // ("memory_backed=1", "size=1024") and owns it.
    static result<std::unique_ptr<softblk_block_device>> create(
        std::string name, std::string_view type, std::span<const std::string> options);

    uint32_t sector_size() const override;
    uint64_t sector_count() const override;
    bool read_only() const override;
    // 0 (no gathering) for the null target, whose requests are a function
    // call and at most a copy into memory; 1 MiB for targets that do I/O.
    uint32_t write_gather_bytes() const override;
    softblk::device& device() { return *_device; }

protected:
    int do_read(uint64_t lba, uint32_t count, void* buffer) override;
    int do_write(uint64_t lba, uint32_t count, const void* buffer) override;
    int do_flush() override;

private:
    int transfer(io_op op, uint64_t lba, uint32_t count, void* buffer);
    std::unique_ptr<softblk::device> _owned;
    softblk::device* _device;
};

}  // namespace softblk::fat
