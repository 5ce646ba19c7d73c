#include <softblk/fat/nbd_adapter.hpp>

#include <algorithm>
#include <cerrno>

#include <fmt/format.h>
#include <libnbd.h>

namespace softblk::fat {

namespace {

// libnbd refuses requests over 64 MiB; servers usually take 32 MiB.
constexpr uint64_t k_max_request = 32u << 20;

int last_errno()
{
    int e = nbd_get_errno();
    return e > 0 ? -e : -EIO;
}

}  // namespace

nbd_block_device::nbd_block_device(nbd_handle* h, uint64_t sectors, uint32_t sector_size,
                                   bool read_only, uint64_t max_request, bool can_flush)
    : _h(h),
      _sectors(sectors),
      _sector_size(sector_size),
      _read_only(read_only),
      _max_request(max_request),
      _can_flush(can_flush)
{
}

nbd_block_device::~nbd_block_device()
{
    if (_h != nullptr) {
        (void)nbd_shutdown(_h, 0);  // the volume flushed at unmount
        nbd_close(_h);
    }
}

result<std::unique_ptr<nbd_block_device>> nbd_block_device::connect(const std::string& uri,
                                                                    bool read_only,
                                                                    uint32_t sector_size)
{
    nbd_handle* h = nbd_create();
    if (h == nullptr) {
        return make_error(ENOMEM, fmt::format("{}: libnbd: {}", uri, nbd_get_error()));
    }
    auto fail = [&](std::string what) -> std::unexpected<error> {
        int e = nbd_get_errno();
        std::string msg = fmt::format("{}: {}: {}", uri, what,
                                      nbd_get_error() ? nbd_get_error() : "unknown error");
        nbd_close(h);
        return make_error(e > 0 ? e : EIO, std::move(msg));
    };
    if (nbd_connect_uri(h, uri.c_str()) == -1) {
        return fail("cannot connect");
    }
    int64_t bytes = nbd_get_size(h);
    if (bytes < 0) {
        return fail("export size");
    }
    int ro = nbd_is_read_only(h);
    if (ro == 1 && !read_only) {
        nbd_close(h);
        return make_error(
            EROFS, fmt::format("{}: the export is read-only (try a read-only command)", uri));
    }
    if (static_cast<uint64_t>(bytes) < sector_size) {
        nbd_close(h);
        return make_error(EINVAL, fmt::format("{}: {} bytes is smaller than one {}-byte sector",
                                              uri, bytes, sector_size));
    }
    uint64_t max = k_max_request;
    int64_t server_max = nbd_get_block_size(h, LIBNBD_SIZE_MAXIMUM);
    if (server_max > 0) {
        max = std::min<uint64_t>(max, static_cast<uint64_t>(server_max));
    }
    max = std::max<uint64_t>(max / sector_size * sector_size, sector_size);
    bool can_flush = nbd_can_flush(h) == 1;
    return std::unique_ptr<nbd_block_device>(
        new nbd_block_device(h, static_cast<uint64_t>(bytes) / sector_size, sector_size,
                             read_only || ro == 1, max, can_flush));
}

// Runs `io(pointer, bytes, offset)` over [lba, lba + count) in pieces of at
// most the server's maximum request size; stops at the first failure.
template <typename Byte, typename Io>
int nbd_block_device::in_pieces(uint64_t lba, uint32_t count, Byte* p, Io io)
{
    uint64_t offset = lba * _sector_size;
    uint64_t length = uint64_t{count} * _sector_size;
    while (length > 0) {
        const uint64_t n = std::min(length, _max_request);
        if (io(p, n, offset) == -1) {
            return last_errno();
        }
        p += n;
        offset += n;
        length -= n;
    }
    return 0;
}

int nbd_block_device::do_read(uint64_t lba, uint32_t count, void* buffer)
{
    return in_pieces(
        lba, count, static_cast<uint8_t*>(buffer),
        [this](uint8_t* p, uint64_t n, uint64_t off) { return nbd_pread(_h, p, n, off, 0); });
}

int nbd_block_device::do_write(uint64_t lba, uint32_t count, const void* buffer)
{
    return in_pieces(lba, count, static_cast<const uint8_t*>(buffer),
                     [this](const uint8_t* p, uint64_t n, uint64_t off) {
                         return nbd_pwrite(_h, p, n, off, 0);
                     });
}

int nbd_block_device::do_flush()
{
    if (!_can_flush || _read_only) {
        return 0;  // the server has no volatile cache to flush
    }
    return nbd_flush(_h, 0) == -1 ? last_errno() : 0;
}

}  // namespace softblk::fat
