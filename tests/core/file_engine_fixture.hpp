// What the file engine's tests share: a temporary directory, aligned
// buffers, a sink that records completions, and one ring over one file
// driven as a queue owner drives it (tests/core/file_engine_test.cpp,
// file_ring_owner_test.cpp).
#pragma once

#include <softblk/file_engine.hpp>

#include <gtest/gtest.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <memory>
#include <poll.h>
#include <string>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

namespace softblk::file_engine_test {

inline constexpr uint32_t k_block = 4096;

// A directory of its own under /tmp, removed with what it holds.
class temp_dir {
public:
    temp_dir()
    {
        char name[] = "/tmp/softblk-file-engine-XXXXXX";
        _path = ::mkdtemp(name);
    }
    ~temp_dir()
    {
        for (const std::string& m : _mounts) {
            ::umount2(m.c_str(), MNT_DETACH);
        }
        std::string cmd = "rm -rf '" + _path + "'";
        [[maybe_unused]] int rc = std::system(cmd.c_str());
    }
    const std::string& path() const { return _path; }
    std::string file(const std::string& name) const { return _path + "/" + name; }
    // Mounts `type` with `data` on a new subdirectory; "" if the mount fails.
    std::string mount(const std::string& name, const char* type, const char* data)
    {
        const std::string dir = file(name);
        ::mkdir(dir.c_str(), 0755);
        if (::mount(type, dir.c_str(), type, 0, data) != 0) {
            return {};
        }
        _mounts.push_back(dir);
        return dir;
    }

private:
    std::string _path;
    std::vector<std::string> _mounts;
};

struct aligned_buffer {
    explicit aligned_buffer(size_t n) : size(n)
    {
        // aligned_alloc wants a size that is a multiple of the alignment
        // (ASan refuses the unaligned 8256 bytes of a test below).
        const size_t rounded = (n + 4095) / 4096 * 4096;
        data = static_cast<char*>(std::aligned_alloc(4096, rounded));
        std::memset(data, 0, rounded);
    }
    ~aligned_buffer() { std::free(data); }
    char* data;
    size_t size;
};

inline void fill(char* p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; ++i) {
        p[i] = static_cast<char>((i * 131 + seed * 17 + (i >> 12)) & 0xff);
    }
}

// Records completions; the requests are the test's own.
class recording_sink final : public completion_sink {
public:
    void complete(io_request& r, int result) override
    {
        r.status = result;
        r.state = 1;
        ++completed;
    }
    unsigned completed = 0;
};

inline std::unique_ptr<backing_file> open_file(const std::string& path, backing_file_options o)
{
    auto f = backing_file::open(path, o);
    EXPECT_TRUE(f.has_value()) << (f ? "" : f.error().message);
    return f ? std::move(*f) : nullptr;
}

inline std::string open_error(const std::string& path, backing_file_options o, int* code = nullptr)
{
    auto f = backing_file::open(path, o);
    EXPECT_FALSE(f.has_value()) << path << " opened but should be refused";
    if (f) {
        return {};
    }
    if (code != nullptr) {
        *code = f.error().code.value();
    }
    return f.error().message;
}

inline void make_file(const std::string& path, uint64_t size)
{
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(size)), 0);
    ::close(fd);
}

// One ring over one file, and a way to run one request to completion,
// sleeping on the ring's eventfd as a queue owner does.
struct ring_fixture {
    explicit ring_fixture(backing_file& f, unsigned depth = 8)
    {
        backing_file* files[] = {&f};
        auto r = file_ring::create(files, depth, sink, stats);
        EXPECT_TRUE(r.has_value()) << (r ? "" : r.error().message);
        ring = std::move(*r);
    }

    // Waits until `r` completed; returns its result (INT_MIN on timeout).
    int wait(io_request& r)
    {
        for (int i = 0; i < 5000 && r.state == 0; ++i) {
            ring->poll();
            if (r.state != 0 || ring->next_wakeup_ns() == 0) {
                continue;
            }
            pollfd p{ring->event_fd(), POLLIN, 0};
            ::poll(&p, 1, 10);
        }
        return r.state != 0 ? r.status : INT_MIN;
    }

    static io_request request(io_op op, uint64_t offset, uint32_t length, void* buffer)
    {
        io_request r;
        r.op = op;
        r.offset = offset;
        r.length = length;
        r.buffer = buffer;
        return r;
    }

    int read(uint64_t offset, void* buffer, uint32_t length)
    {
        io_request r = request(io_op::read, offset, length, buffer);
        ring->read(r, 0, offset);
        return wait(r);
    }
    int write(uint64_t offset, const void* buffer, uint32_t length, bool fua = false)
    {
        io_request r = request(io_op::write, offset, length, const_cast<void*>(buffer));
        ring->write(r, 0, offset, fua);
        return wait(r);
    }
    int flush()
    {
        io_request r = request(io_op::flush, 0, 0, nullptr);
        ring->flush(r, 0);
        return wait(r);
    }
    int write_zeroes(uint64_t offset, uint32_t length, bool unmap)
    {
        io_request r = request(io_op::write_zeroes, offset, length, nullptr);
        ring->write_zeroes(r, 0, offset, length, unmap);
        return wait(r);
    }
    int discard(uint64_t offset, uint32_t length)
    {
        io_request r = request(io_op::discard, offset, length, nullptr);
        ring->discard(r, 0, offset, length);
        return wait(r);
    }

    recording_sink sink;
    file_engine_stats stats;
    std::unique_ptr<file_ring> ring;
};

}  // namespace softblk::file_engine_test
