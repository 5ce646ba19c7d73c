#include <softblk/fat/softblk_adapter.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <vector>

namespace softblk::fat {

namespace {

// Gathering sequential writes into one request costs a copy of each write
// and saves a request per write; it pays when a request costs more than
// copying a write. The reference write is 16 KiB: the writes of the FUSE
// mount with direct_io and of the benchmark (the volume gathers aligned
// writes from 4 KiB up to the run size).
constexpr uint32_t k_reference_write_bytes = 16u << 10;
// Timed samples; the fastest counts (preemption only ever adds time).
constexpr int k_cost_samples = 8;
// A copy is priced over 512 KiB into the next 512 KiB, more than a core's
// L2 cache holds, as a run gathered into a 1 MiB buffer is: a copy inside
// L1/L2 runs several times faster than copying written data does.
constexpr size_t k_copy_sample_bytes = 512u << 10;

uint64_t now_ns()
{
    return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                     std::chrono::steady_clock::now().time_since_epoch())
                                     .count());
}

// What copying `bytes` costs on this machine, in ns: measured once per
// process (touching a fresh 1 MiB buffer costs more than the copies).
uint64_t copy_cost_ns(uint64_t bytes)
{
    static const uint64_t sample_ns = [] {
        std::vector<uint8_t> buffer(2 * k_copy_sample_bytes, 1);  // touched: no faults below
        uint64_t best = UINT64_MAX;
        for (int i = 0; i < k_cost_samples; ++i) {
            uint64_t t0 = now_ns();
            std::memcpy(buffer.data() + k_copy_sample_bytes, buffer.data(), k_copy_sample_bytes);
            asm volatile("" : : "r"(buffer.data()) : "memory");  // the copy is used
            best = std::min(best, now_ns() - t0);
        }
        return best;
    }();
    return sample_ns * bytes / k_copy_sample_bytes;
}

}  // namespace

softblk_block_device::softblk_block_device(softblk::device& device) : _device(&device)
{
}

result<std::unique_ptr<softblk_block_device>> softblk_block_device::create(
    std::string name, std::string_view type, std::span<const std::string> options)
{
    auto dev = softblk::device::create(std::move(name), type, options);
    if (!dev) {
        return std::unexpected(dev.error());
    }
    auto adapter = std::make_unique<softblk_block_device>(**dev);
    adapter->_owned = std::move(*dev);
    return adapter;
}

uint32_t softblk_block_device::sector_size() const
{
    return _device->limits().logical_block_size;
}

uint64_t softblk_block_device::sector_count() const
{
    return _device->limits().capacity_bytes / _device->limits().logical_block_size;
}

bool softblk_block_device::read_only() const
{
    return _device->limits().read_only;
}

uint32_t softblk_block_device::write_gather_bytes() const
{
    std::call_once(_gather_once, [this] {
        uint64_t request = request_cost_ns();
        // A device whose read fails cannot be measured: gather, the choice
        // whose cost (one copy) is bounded.
        bool cheap = request != 0 && request <= copy_cost_ns(k_reference_write_bytes);
        _gather_bytes = cheap ? 0 : block_device::write_gather_bytes();
    });
    return _gather_bytes;
}

uint64_t softblk_block_device::request_cost_ns() const
{
    std::vector<uint8_t> block(sector_size());
    uint64_t best = UINT64_MAX;
    for (int i = 0; i <= k_cost_samples; ++i) {
        uint64_t t0 = now_ns();
        int rc =
            _device->execute(io_op::read, 0, static_cast<uint32_t>(block.size()), block.data());
        uint64_t t = now_ns() - t0;
        if (rc < 0) {
            return 0;
        }
        if (i > 0) {  // the first one warms the path up
            best = std::min(best, t);
        }
    }
    return std::max<uint64_t>(best, 1);
}

int softblk_block_device::transfer(io_op op, uint64_t lba, uint32_t count, void* buffer)
{
    // The core splits on the device's limits.
    bio b = make_bio(op, lba * sector_size(), uint64_t{count} * sector_size(), buffer);
    return _device->execute(b);
}

int softblk_block_device::do_read(uint64_t lba, uint32_t count, void* buffer)
{
    return transfer(io_op::read, lba, count, buffer);
}

int softblk_block_device::do_write(uint64_t lba, uint32_t count, const void* buffer)
{
    return transfer(io_op::write, lba, count, const_cast<void*>(buffer));
}

int softblk_block_device::do_flush()
{
    if (!_device->limits().volatile_write_cache) {
        return 0;  // nothing volatile: a flush is a no-op, and success
    }
    int rc = _device->execute(io_op::flush, 0, 0, nullptr);
    return rc == -EOPNOTSUPP ? 0 : std::min(rc, 0);
}

}  // namespace softblk::fat
