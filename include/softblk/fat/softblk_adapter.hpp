// fat::block_device over a softblk device, through the in-process consumer
// API (device::execute, which splits requests on the device's limits).
// Whether writes are gathered is measured, not looked up by target type
// (write_gather_bytes). FLUSH goes to the device only when it has
// a volatile write cache; -EOPNOTSUPP from a flush counts as success.
#pragma once

#include <memory>
#include <mutex>
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
    // Measured once, at the first call (a volume's mount): the fastest of
    // a few one-block reads at LBA 0 against copying 16 KiB in memory. A
    // device whose request costs less than that copy (an in-process memory
    // store, a null device) gets 0: every aligned write goes straight from
    // the caller's buffer. Dearer requests (I/O, a completion delay, a
    // throttle) get 1 MiB runs, as does a device whose read fails. Any
    // thread; the first caller measures, others wait for it.
    uint32_t write_gather_bytes() const override;
    softblk::device& device() { return *_device; }

protected:
    int do_read(uint64_t lba, uint32_t count, void* buffer) override;
    int do_write(uint64_t lba, uint32_t count, const void* buffer) override;
    int do_flush() override;

private:
    int transfer(io_op op, uint64_t lba, uint32_t count, void* buffer);
    // The fastest of a few one-block reads at LBA 0, in ns; 0 if a read fails.
    uint64_t request_cost_ns() const;
    std::unique_ptr<softblk::device> _owned;
    softblk::device* _device;
    mutable std::once_flag _gather_once;
    mutable uint32_t _gather_bytes = 0;
};

}  // namespace softblk::fat
