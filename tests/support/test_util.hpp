// Helpers for the target tests: create a null device, run one request on a
// queue and see when and how it completed.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <ctime>
#include <sys/mman.h>
#include <unistd.h>
#include <memory>
#include <string>
#include <vector>

#include <softblk/device.hpp>
#include <softblk/external_data.hpp>

#include <nlohmann/json.hpp>

namespace softblk::test {

inline uint64_t now_ns()
{
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// A device that must be created; fails the test otherwise.
inline std::unique_ptr<device> make_null(std::vector<std::string> options,
                                         std::string name = "nulltest")
{
    auto d = device::create(std::move(name), "null", options);
    EXPECT_TRUE(d.has_value()) << (d ? "" : d.error().message);
    return d ? std::move(*d) : nullptr;
}

// The error message of a creation (of a `type` device) that must fail.
inline std::string create_error(std::vector<std::string> options, int* code = nullptr,
                                std::string_view type = "null")
{
    auto d = device::create("nulltest", type, options);
    EXPECT_FALSE(d.has_value()) << "created with options that should be refused";
    if (d) {
        return {};
    }
    if (code != nullptr) {
        *code = d.error().code.value();
    }
    return d.error().message;
}

struct completion {
    int result = INT_MIN;
    uint32_t transferred = 0;
    uint64_t result_offset = 0;  // zone_append: where the data landed
    uint64_t at_ns = 0;
    bool done = false;
};

inline void record_completion(io_request& r, int result)
{
    auto* c = static_cast<completion*>(r.user_data);
    c->result = result;
    c->transferred = r.transferred;
    c->result_offset = r.result_offset;
    c->at_ns = now_ns();
    c->done = true;
}

// What one request of run_one and run_one_windowed carries.
struct one_request {
    io_op op = io_op::read;
    uint64_t offset = 0;
    uint32_t length = 0;
    void* buffer = nullptr;
    const data_window* window = nullptr;
    uint32_t flags = 0;
};

// Submits `what` on `q` and waits for it (at most `timeout_ns`). Returns
// the completion; `submit_returned_done` says whether the callback ran
// inside submit().
inline completion run_request(io_queue& q, const one_request& what,
                              int64_t timeout_ns = 5'000'000'000,
                              bool* submit_returned_done = nullptr,
                              uint64_t* submitted_at = nullptr)
{
    completion c;
    io_request* r = q.get_request();
    EXPECT_NE(r, nullptr);
    if (r == nullptr) {
        return c;
    }
    r->op = what.op;
    r->offset = what.offset;
    r->length = what.length;
    r->buffer = what.buffer;
    // The window as ublk's queue runner hands it over (external_data.hpp).
    const external_data in_window{.where = external_data::place::window,
                                  .window = what.window != nullptr ? *what.window : data_window{}};
    r->external = what.window != nullptr ? &in_window : nullptr;
    r->flags = what.flags;
    r->on_complete = record_completion;
    r->user_data = &c;
    if (submitted_at != nullptr) {
        *submitted_at = now_ns();
    }
    q.submit(*r);
    if (submit_returned_done != nullptr) {
        *submit_returned_done = c.done;
    }
    const uint64_t give_up = now_ns() + static_cast<uint64_t>(timeout_ns);
    while (!c.done && now_ns() < give_up) {
        q.wait(1, static_cast<int64_t>(give_up - now_ns()));
    }
    return c;
}

// One request with its data in `buffer`, submitted and waited for (run_request).
inline completion run_one(io_queue& q, io_op op, uint64_t offset, uint32_t length, void* buffer,
                          uint32_t flags = 0, int64_t timeout_ns = 5'000'000'000,
                          bool* submit_returned_done = nullptr, uint64_t* submitted_at = nullptr)
{
    return run_request(
        q, {.op = op, .offset = offset, .length = length, .buffer = buffer, .flags = flags},
        timeout_ns, submit_returned_done, submitted_at);
}

// One read, write or zone append whose data is in `window`
// (external_data.hpp), submitted and waited for; `buffer` too only to see
// it refused.
inline completion run_one_windowed(io_queue& q, io_op op, uint64_t offset, uint32_t length,
                                   const data_window& window, void* buffer = nullptr)
{
    return run_request(
        q, {.op = op, .offset = offset, .length = length, .buffer = buffer, .window = &window});
}

// A memory file holding `data` at `at`: a data_window the way ublk's
// user-copy window is one (preadv and pwritev at an offset of an fd).
struct window_file {
    int fd = -1;
    explicit window_file(const std::vector<char>& data, off_t at = 0)
        : fd(::memfd_create("softblk-window", MFD_CLOEXEC))
    {
        EXPECT_GE(fd, 0);
        EXPECT_EQ(::pwrite(fd, data.data(), data.size(), at), static_cast<ssize_t>(data.size()));
    }
    ~window_file() { ::close(fd); }
    window_file(const window_file&) = delete;
    window_file& operator=(const window_file&) = delete;
    // `length` bytes at `at`.
    std::vector<char> bytes(off_t at, size_t length) const
    {
        std::vector<char> b(length);
        EXPECT_EQ(::pread(fd, b.data(), length, at), static_cast<ssize_t>(length));
        return b;
    }
};

inline std::vector<char> pattern(size_t n, unsigned seed)
{
    std::vector<char> v(n);
    for (size_t i = 0; i < n; ++i) {
        v[i] = static_cast<char>((i * 131 + seed * 7 + (i >> 9)) & 0xff);
    }
    return v;
}

inline bool all_zero(const std::vector<char>& v)
{
    return std::all_of(v.begin(), v.end(), [](char c) { return c == 0; });
}

// `length` bytes read at `offset` through device::execute (which must
// succeed).
inline std::vector<char> read_back(device& d, uint64_t offset, uint32_t length)
{
    std::vector<char> b(length, 'x');
    EXPECT_EQ(d.execute(io_op::read, offset, length, b.data()), static_cast<int>(length));
    return b;
}

inline nlohmann::json describe(const device& d)
{
    nlohmann::json j;
    d.describe(j);
    return j;
}

}  // namespace softblk::test
