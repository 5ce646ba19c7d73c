#include <softblk/fat/block_device.hpp>

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

namespace softblk::fat {

int block_device::read(uint64_t lba, uint32_t count, void* buffer)
{
    _reads.fetch_add(1, std::memory_order_relaxed);
    _sectors_read.fetch_add(count, std::memory_order_relaxed);
    if (count == 0 || lba > sector_count() || count > sector_count() - lba) {
        return -EINVAL;
    }
    return do_read(lba, count, buffer);
}

int block_device::write(uint64_t lba, uint32_t count, const void* buffer)
{
    _writes.fetch_add(1, std::memory_order_relaxed);
    _sectors_written.fetch_add(count, std::memory_order_relaxed);
    if (read_only()) {
        return -EROFS;
    }
    if (count == 0 || lba > sector_count() || count > sector_count() - lba) {
        return -EINVAL;
    }
    return do_write(lba, count, buffer);
}

int block_device::flush()
{
    _flushes.fetch_add(1, std::memory_order_relaxed);
    return do_flush();
}

request_counters block_device::counters() const
{
    request_counters c;
    c.reads = _reads.load(std::memory_order_relaxed);
    c.writes = _writes.load(std::memory_order_relaxed);
    c.flushes = _flushes.load(std::memory_order_relaxed);
    c.sectors_read = _sectors_read.load(std::memory_order_relaxed);
    c.sectors_written = _sectors_written.load(std::memory_order_relaxed);
    return c;
}

void block_device::reset_counters()
{
    _reads = 0;
    _writes = 0;
    _flushes = 0;
    _sectors_read = 0;
    _sectors_written = 0;
}

// ---------------------------------------------------------------- memory

memory_block_device::memory_block_device(uint64_t size_bytes, uint32_t sector_size)
    : _data(size_bytes / sector_size * sector_size, 0), _sector_size(sector_size)
{
}

memory_block_device::memory_block_device(std::vector<uint8_t> image, uint32_t sector_size)
    : _data(std::move(image)), _sector_size(sector_size)
{
    _data.resize(_data.size() / sector_size * sector_size);
}

void memory_block_device::fail_writes_after(int64_t writes, int error)
{
    _write_error = error;
    _writes_left = writes;
}

int memory_block_device::do_read(uint64_t lba, uint32_t count, void* buffer)
{
    std::memcpy(buffer, _data.data() + lba * _sector_size, uint64_t{count} * _sector_size);
    return 0;
}

int memory_block_device::do_write(uint64_t lba, uint32_t count, const void* buffer)
{
    int64_t left = _writes_left.load(std::memory_order_relaxed);
    if (left >= 0) {
        if (left == 0) {
            return _write_error;
        }
        _writes_left.fetch_sub(1, std::memory_order_relaxed);
    }
    std::memcpy(_data.data() + lba * _sector_size, buffer, uint64_t{count} * _sector_size);
    return 0;
}

// ---------------------------------------------------------------- file

file_block_device::file_block_device(int fd, uint64_t sectors, uint32_t sector_size, bool read_only)
    : _fd(fd), _sectors(sectors), _sector_size(sector_size), _read_only(read_only)
{
}

file_block_device::~file_block_device()
{
    if (_fd >= 0) {
        ::close(_fd);
    }
    if (_direct_fd >= 0) {
        ::close(_direct_fd);
    }
}

int file_block_device::fd_for(uint64_t offset, uint64_t length, const void* buffer) const
{
    if (_direct_fd < 0) {
        return _fd;
    }
    uint64_t mask = _direct_align - 1;
    if ((offset & mask) != 0 || (length & mask) != 0 ||
        (reinterpret_cast<uintptr_t>(buffer) & mask) != 0) {
        return _fd;
    }
    return _direct_fd;
}

result<std::unique_ptr<file_block_device>> file_block_device::open(const std::string& path,
                                                                   bool read_only,
                                                                   uint32_t sector_size,
                                                                   bool direct)
{
    int fd = ::open(path.c_str(), (read_only ? O_RDONLY : O_RDWR) | O_CLOEXEC);
    if (fd < 0 && !read_only && (errno == EROFS || errno == EACCES)) {
        return make_error(
            errno, fmt::format("{}: {} (try a read-only mount)", path, std::strerror(errno)));
    }
    if (fd < 0) {
        return make_error(errno, fmt::format("{}: {}", path, std::strerror(errno)));
    }
    struct stat st {};
    if (fstat(fd, &st) != 0) {
        int e = errno;
        ::close(fd);
        return make_error(e, fmt::format("{}: stat: {}", path, std::strerror(e)));
    }
    uint64_t bytes = 0;
    if (S_ISBLK(st.st_mode)) {
        if (ioctl(fd, BLKGETSIZE64, &bytes) != 0) {
            int e = errno;
            ::close(fd);
            return make_error(e, fmt::format("{}: BLKGETSIZE64: {}", path, std::strerror(e)));
        }
    } else if (S_ISREG(st.st_mode)) {
        bytes = static_cast<uint64_t>(st.st_size);
    } else {
        ::close(fd);
        return make_error(EINVAL, fmt::format("{}: not a regular file or block device", path));
    }
    if (bytes < sector_size) {
        ::close(fd);
        return make_error(EINVAL, fmt::format("{}: {} bytes is smaller than one {}-byte sector",
                                              path, bytes, sector_size));
    }
    std::unique_ptr<file_block_device> dev(
        new file_block_device(fd, bytes / sector_size, sector_size, read_only));
    if (direct) {
        uint32_t align = 4096;
        int logical = 0;
        if (S_ISBLK(st.st_mode) && ioctl(fd, BLKSSZGET, &logical) == 0 && logical > 0) {
            align = static_cast<uint32_t>(logical);
        }
        // A file that refuses O_DIRECT (tmpfs, some FUSE file systems) is
        // used through the page cache alone.
        int dfd = ::open(path.c_str(), (read_only ? O_RDONLY : O_RDWR) | O_CLOEXEC | O_DIRECT);
        if (dfd >= 0) {
            dev->_direct_fd = dfd;
            dev->_direct_align = align;
        }
    }
    return dev;
}

result<std::unique_ptr<file_block_device>> file_block_device::create(const std::string& path,
                                                                     uint64_t size_bytes,
                                                                     uint32_t sector_size)
{
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        return make_error(errno, fmt::format("{}: {}", path, std::strerror(errno)));
    }
    if (ftruncate(fd, static_cast<off_t>(size_bytes)) != 0) {
        int e = errno;
        ::close(fd);
        return make_error(
            e, fmt::format("{}: resize to {} bytes: {}", path, size_bytes, std::strerror(e)));
    }
    return std::unique_ptr<file_block_device>(
        new file_block_device(fd, size_bytes / sector_size, sector_size, false));
}

int file_block_device::do_read(uint64_t lba, uint32_t count, void* buffer)
{
    uint64_t length = uint64_t{count} * _sector_size;
    uint64_t done = 0;
    auto* p = static_cast<uint8_t*>(buffer);
    int fd = fd_for(lba * _sector_size, length, buffer);
    while (done < length) {
        ssize_t n =
            ::pread(fd, p + done, length - done, static_cast<off_t>(lba * _sector_size + done));
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            return -errno;
        }
        if (n == 0) {
            std::memset(p + done, 0, length - done);  // beyond EOF of a short image
            break;
        }
        done += static_cast<uint64_t>(n);
        fd = _fd;  // the rest of a short transfer may be unaligned
    }
    return 0;
}

int file_block_device::do_write(uint64_t lba, uint32_t count, const void* buffer)
{
    uint64_t length = uint64_t{count} * _sector_size;
    uint64_t done = 0;
    const auto* p = static_cast<const uint8_t*>(buffer);
    int fd = fd_for(lba * _sector_size, length, buffer);
    while (done < length) {
        ssize_t n =
            ::pwrite(fd, p + done, length - done, static_cast<off_t>(lba * _sector_size + done));
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            return -errno;
        }
        done += static_cast<uint64_t>(n);
        fd = _fd;  // the rest of a short transfer may be unaligned
    }
    return 0;
}

int file_block_device::do_flush()
{
    if (_read_only) {
        return 0;
    }
    if (fdatasync(_fd) != 0) {
        return errno == EINVAL ? 0 : -errno;  // EINVAL: the file does not support syncing
    }
    return 0;
}

}  // namespace softblk::fat
