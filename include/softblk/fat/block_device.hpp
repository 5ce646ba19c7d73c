// The FAT library's own small block interface, and its adapters: a memory
// device (tests, fuzzing, benchmarks), an image file (pread/pwrite/
// fdatasync) and, in softblk_adapter.hpp, a softblk device.
//
// Every call returns 0 or a negative errno (hot path). Calls may come from
// any thread; the FAT volume serialises its own calls, and the adapters here
// are safe for concurrent use as long as the ranges do not overlap.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <softblk/types.hpp>

namespace softblk::fat {

// What went to the device: one request per call, whatever its size. The
// benchmark divides these by the bytes moved (requests per MiB).
struct request_counters {
    uint64_t reads = 0;
    uint64_t writes = 0;
    uint64_t flushes = 0;
    uint64_t sectors_read = 0;
    uint64_t sectors_written = 0;
};

class block_device {
public:
    virtual ~block_device() = default;

    // Reads/writes `count` sectors at `lba` (units of sector_size()).
    // Returns 0 or -errno (-EINVAL beyond the end). Counts one request.
    int read(uint64_t lba, uint32_t count, void* buffer);
    int write(uint64_t lba, uint32_t count, const void* buffer);
    // Makes completed writes durable. A device without a volatile cache
    // returns 0 (no flush is success). Counts one request.
    int flush();

    virtual uint32_t sector_size() const = 0;
    virtual uint64_t sector_count() const = 0;
    virtual bool read_only() const { return false; }

    // Bytes up to which a volume gathers sequential writes into one request
    // (by copying them into a write-behind buffer) when the mount does not
    // say; 0: every write goes to the device as it comes, from the caller's
    // buffer. Devices where a request costs more than copying its data (a
    // system call, a round trip to another process) ask for gathering;
    // in-process memory does not, since the gathering copy would be the
    // larger cost.
    virtual uint32_t write_gather_bytes() const { return 1u << 20; }

    // A snapshot of the counters (relaxed; any thread).
    request_counters counters() const;
    void reset_counters();

protected:
    virtual int do_read(uint64_t lba, uint32_t count, void* buffer) = 0;
    virtual int do_write(uint64_t lba, uint32_t count, const void* buffer) = 0;
    virtual int do_flush() = 0;

private:
    std::atomic<uint64_t> _reads{0};
    std::atomic<uint64_t> _writes{0};
    std::atomic<uint64_t> _flushes{0};
    std::atomic<uint64_t> _sectors_read{0};
    std::atomic<uint64_t> _sectors_written{0};
};

// RAM-backed device. `bytes()` exposes the image (e.g. to save it for
// fsck.fat). Owns its memory.
class memory_block_device final : public block_device {
public:
    memory_block_device(uint64_t size_bytes, uint32_t sector_size = 512);
    // Wraps a copy of an existing image (size rounded down to sectors).
    memory_block_device(std::vector<uint8_t> image, uint32_t sector_size = 512);

    uint32_t sector_size() const override { return _sector_size; }
    uint64_t sector_count() const override { return _data.size() / _sector_size; }

    uint32_t write_gather_bytes() const override { return 0; }

    std::vector<uint8_t>& bytes() { return _data; }
    const std::vector<uint8_t>& bytes() const { return _data; }

    // Test hook: writes fail with `error` (negative errno) after `writes`
    // more successful write requests; -1 disables.
    void fail_writes_after(int64_t writes, int error = -5);

protected:
    int do_read(uint64_t lba, uint32_t count, void* buffer) override;
    int do_write(uint64_t lba, uint32_t count, const void* buffer) override;
    int do_flush() override { return 0; }

private:
    std::vector<uint8_t> _data;
    uint32_t _sector_size;
    std::atomic<int64_t> _writes_left{-1};
    int _write_error = -5;
};

// An image file or a block special file, opened O_RDWR (or O_RDONLY).
class file_block_device final : public block_device {
public:
    // Opens `path`. With `direct`, also opens it with O_DIRECT and sends
    // every request whose buffer, offset and length are aligned to the
    // device's logical block size (4096 for a regular file) through that
    // descriptor, bypassing the page cache; others (and all requests when
    // the file refuses O_DIRECT) use the buffered descriptor, which the
    // kernel keeps coherent with direct I/O. Errors name the path and the
    // reason.
    static result<std::unique_ptr<file_block_device>> open(const std::string& path,
                                                           bool read_only = false,
                                                           uint32_t sector_size = 512,
                                                           bool direct = false);
    // Creates (or truncates to) `size_bytes` a sparse image file.
    static result<std::unique_ptr<file_block_device>> create(const std::string& path,
                                                             uint64_t size_bytes,
                                                             uint32_t sector_size = 512);
    ~file_block_device() override;

    uint32_t sector_size() const override { return _sector_size; }
    uint64_t sector_count() const override { return _sectors; }
    bool read_only() const override { return _read_only; }
    // Whether an O_DIRECT descriptor is in use, and its alignment.
    bool direct() const { return _direct_fd >= 0; }
    uint32_t direct_alignment() const { return _direct_align; }

protected:
    int do_read(uint64_t lba, uint32_t count, void* buffer) override;
    int do_write(uint64_t lba, uint32_t count, const void* buffer) override;
    int do_flush() override;

private:
    file_block_device(int fd, uint64_t sectors, uint32_t sector_size, bool read_only);
    int fd_for(uint64_t offset, uint64_t length, const void* buffer) const;
    int _fd;
    int _direct_fd = -1;
    uint32_t _direct_align = 0;
    uint64_t _sectors;
    uint32_t _sector_size;
    bool _read_only;
};

}  // namespace softblk::fat
