// fat::block_device over an NBD export, through libnbd: how `softblk fat`
// reaches a device that the softblk daemon exports over NBD (or any NBD
// server). One connection; libnbd serialises calls on it, so the adapter is
// safe from any thread. Requests larger than the server's maximum block
// size (at most 32 MiB) are split.
#pragma once

#include <memory>
#include <string>

#include <softblk/fat/block_device.hpp>

struct nbd_handle;

namespace softblk::fat {

class nbd_block_device final : public block_device {
public:
    // Connects to `uri` (nbd+unix:///NAME?socket=PATH, nbd://HOST:PORT/NAME).
    // `sector_size` is the FAT library's device sector (the export's
    // logical block size). Errors name the URI and libnbd's reason.
    static result<std::unique_ptr<nbd_block_device>> connect(const std::string& uri, bool read_only,
                                                             uint32_t sector_size);
    ~nbd_block_device() override;

    uint32_t sector_size() const override { return _sector_size; }
    uint64_t sector_count() const override { return _sectors; }
    bool read_only() const override { return _read_only; }

protected:
    int do_read(uint64_t lba, uint32_t count, void* buffer) override;
    int do_write(uint64_t lba, uint32_t count, const void* buffer) override;
    int do_flush() override;

private:
    nbd_block_device(nbd_handle* h, uint64_t sectors, uint32_t sector_size, bool read_only,
                     uint64_t max_request, bool can_flush);
    template <typename Byte, typename Io>
    int in_pieces(uint64_t lba, uint32_t count, Byte* p, Io io);

    nbd_handle* _h;
    uint64_t _sectors;
    uint32_t _sector_size;
    bool _read_only;
    uint64_t _max_request;
    bool _can_flush;
};

}  // namespace softblk::fat
