#include <softblk/fat/softblk_adapter.hpp>

#include <algorithm>
#include <cerrno>

namespace softblk::fat {

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
    return _device->info().target_type == "null" ? 0 : block_device::write_gather_bytes();
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
