// The two ways softblk-bench-fat drives a FAT volume: the library's API
// (library_backend) and POSIX calls into a mount point (posix_backend),
// behind the operations a workload needs (backend).
#pragma once

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <memory>
#include <optional>
#include <string>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>
#include <vector>

#include <fmt/format.h>

#include <softblk/fat/block_device.hpp>
#include <softblk/fat/volume.hpp>

#include "timing.hpp"

namespace softblk::fat::bench {

// The operations a workload needs; one implementation on the library API,
// one on POSIX calls into a mount point.
class backend {
public:
    virtual ~backend() = default;
    virtual int open_file(const std::string& path, bool create) = 0;  // returns a slot
    // Creates (or truncates) `path` for writing only, as cp, dd and tar
    // open what they write; returns a slot.
    virtual int create_write_only(const std::string& path) = 0;
    virtual int64_t pwrite(int slot, const void* buf, size_t n, uint64_t off) = 0;
    virtual int64_t pread(int slot, void* buf, size_t n, uint64_t off) = 0;
    virtual int fsync(int slot) = 0;
    virtual void close(int slot) = 0;
    virtual bool create_empty(const std::string& path) = 0;
    virtual bool unlink(const std::string& path) = 0;
    virtual bool mkdir(const std::string& path) = 0;
    virtual void remount() {}
    // Drops what the kernel's page cache holds of the file (mount points).
    virtual void drop_cache(int slot) {}
    virtual block_device* device() { return nullptr; }
    // Microseconds per statfs() on a mount point; nothing for the library.
    virtual std::optional<double> round_trip_us(int) { return std::nullopt; }
    // The serving thread's schedstat, where a thread of this process serves.
    virtual std::optional<sched_times> server_times() { return std::nullopt; }
};

class library_backend final : public backend {
public:
    // `counted`: the device whose counters and queues the figures read
    // (default `dev`; the device under a one_sector_device).
    explicit library_backend(block_device& dev, mount_options options = {},
                             block_device* counted = nullptr)
        : _dev(dev), _options(options), _counted(counted != nullptr ? counted : &dev)
    {
        mount();
    }
    void mount()
    {
        auto v = volume::mount(_dev, _options);
        if (!v) {
            fmt::print(stderr, "mount: {}\n", v.error().message);
            std::exit(1);
        }
        _vol = std::move(*v);
    }
    int open_file(const std::string& path, bool create) override
    {
        auto f = _vol->open(
            path, k_open_read | k_open_write | (create ? k_open_create | k_open_truncate : 0));
        if (!f) {
            fmt::print(stderr, "{}\n", f.error().message);
            std::exit(1);
        }
        _files.push_back(std::move(*f));
        return static_cast<int>(_files.size() - 1);
    }
    int create_write_only(const std::string& path) override
    {
        auto f = _vol->open(path, k_open_write | k_open_create | k_open_truncate);
        if (!f) {
            fmt::print(stderr, "{}\n", f.error().message);
            std::exit(1);
        }
        _files.push_back(std::move(*f));
        return static_cast<int>(_files.size() - 1);
    }
    int64_t pwrite(int s, const void* b, size_t n, uint64_t o) override
    {
        return _files[s].pwrite(b, n, o);
    }
    int64_t pread(int s, void* b, size_t n, uint64_t o) override
    {
        return _files[s].pread(b, n, o);
    }
    int fsync(int s) override { return _files[s].fsync(); }
    void close(int s) override { _files[s].close(); }
    bool create_empty(const std::string& path) override
    {
        auto f = _vol->open(path, k_open_write | k_open_create | k_open_exclusive);
        return f.has_value();
    }
    bool unlink(const std::string& path) override { return _vol->unlink(path).has_value(); }
    bool mkdir(const std::string& path) override { return _vol->mkdir(path).has_value(); }
    void remount() override
    {
        unmount();
        mount();
    }
    void unmount()
    {
        _files.clear();
        (void)_vol->unmount();
        _vol.reset();
    }
    block_device* device() override { return _counted; }
    std::string describe()
    {
        auto st = _vol->statfs();
        return st ? fmt::format("FAT{} with {}-byte clusters", static_cast<int>(st->type),
                                st->cluster_size)
                  : "?";
    }

private:
    block_device& _dev;
    mount_options _options;
    block_device* _counted;
    std::unique_ptr<volume> _vol;
    std::vector<file> _files;
};

class posix_backend final : public backend {
public:
    posix_backend(std::string root, block_device* dev, pid_t server_tid)
        : _root(std::move(root)), _dev(dev), _server_tid(server_tid)
    {
    }
    int open_file(const std::string& path, bool create) override
    {
        return open_slot(path, O_RDWR | (create ? O_CREAT | O_TRUNC : 0));
    }
    int create_write_only(const std::string& path) override
    {
        return open_slot(path, O_WRONLY | O_CREAT | O_TRUNC);
    }
    int open_slot(const std::string& path, int flags)
    {
        int fd = ::open((_root + path).c_str(), flags, 0644);
        if (fd < 0) {
            fmt::print(stderr, "{}: {}\n", path, std::strerror(errno));
            std::exit(1);
        }
        _fds.push_back(fd);
        return static_cast<int>(_fds.size() - 1);
    }
    int64_t pwrite(int s, const void* b, size_t n, uint64_t o) override
    {
        return ::pwrite(_fds[s], b, n, static_cast<off_t>(o));
    }
    int64_t pread(int s, void* b, size_t n, uint64_t o) override
    {
        return ::pread(_fds[s], b, n, static_cast<off_t>(o));
    }
    int fsync(int s) override { return ::fsync(_fds[s]); }
    void close(int s) override { ::close(_fds[s]); }
    void drop_cache(int s) override { ::posix_fadvise(_fds[s], 0, 0, POSIX_FADV_DONTNEED); }
    bool create_empty(const std::string& path) override
    {
        int fd = ::open((_root + path).c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
        if (fd < 0) {
            return false;
        }
        ::close(fd);
        return true;
    }
    bool unlink(const std::string& path) override { return ::unlink((_root + path).c_str()) == 0; }
    bool mkdir(const std::string& path) override
    {
        return ::mkdir((_root + path).c_str(), 0755) == 0;
    }
    block_device* device() override { return _dev; }
    std::optional<double> round_trip_us(int n) override
    {
        struct statfs st {};
        auto t = clock_type::now();
        for (int i = 0; i < n; ++i) {
            ::statfs(_root.c_str(), &st);
        }
        return seconds_since(t) * 1e6 / n;
    }
    std::optional<sched_times> server_times() override
    {
        return _server_tid > 0 ? thread_sched_times(_server_tid) : std::nullopt;
    }

private:
    std::string _root;
    block_device* _dev;
    pid_t _server_tid;
    std::vector<int> _fds;
};

}  // namespace softblk::fat::bench
