// libsoftblk for C++ programs outside this repository: a header-only RAII
// layer over the C ABI of softblk.h (docs/capi.md). It adds no symbol to
// the library and no ABI of its own: everything it calls is a softblk_*
// function, so a program built with it runs with any libsoftblk.so.0.
//
// Control calls return std::expected (C++23) with the errno and the
// library's message; the request path returns the C functions' int
// results (0 or -errno) and allocates nothing.
//
// (Inside this repository the in-process C++ API, include/softblk/*.hpp,
// stays beside it: the front ends, targets and tests need what a C ABI
// does not carry, such as the provider interface and bios with callbacks.)
#pragma once

#include <softblk.h>

#include <cstddef>
#include <cstdint>
#include <expected>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace softblk::lib {

// A failed control call: the positive errno and the library's message.
struct error {
    int code = 0;
    std::string message;
};

template <class T>
using result = std::expected<T, error>;

// The error of the C call that returned `rc` (< 0) on this thread.
inline std::unexpected<error> last_error(int rc)
{
    return std::unexpected(error{-rc, softblk_get_error_msg()});
}

namespace detail {

inline result<void> check(int rc)
{
    if (rc < 0) {
        return last_error(rc);
    }
    return {};
}

// Calls `get(buf, size)` (a C function that fills a string as snprintf
// does) with a buffer large enough for the whole value.
template <class Get>
result<std::string> get_string(Get&& get)
{
    std::string out(64, '\0');
    for (;;) {
        const int n = get(out.data(), out.size() + 1);
        if (n < 0) {
            return last_error(n);
        }
        if (static_cast<size_t>(n) <= out.size()) {
            out.resize(static_cast<size_t>(n));
            return out;
        }
        out.resize(static_cast<size_t>(n));
    }
}

}  // namespace detail

// A queue of a device (not owned: the device's until it is powered off,
// destroyed or its queues are re-made). Used by one thread at a time.
class queue {
public:
    explicit queue(softblk_queue* q) : _q(q) {}

    int read(uint64_t offset, std::span<std::byte> buf, void* user_data = nullptr,
             uint32_t flags = 0) noexcept
    {
        return softblk_queue_read(_q, offset, buf.data(), buf.size(), user_data, flags);
    }
    int write(uint64_t offset, std::span<const std::byte> buf, void* user_data = nullptr,
              uint32_t flags = 0) noexcept
    {
        return softblk_queue_write(_q, offset, buf.data(), buf.size(), user_data, flags);
    }
    int flush(void* user_data = nullptr, uint32_t flags = 0) noexcept
    {
        return softblk_queue_flush(_q, user_data, flags);
    }
    int discard(uint64_t offset, uint64_t length, void* user_data = nullptr,
                uint32_t flags = 0) noexcept
    {
        return softblk_queue_discard(_q, offset, length, user_data, flags);
    }
    int write_zeroes(uint64_t offset, uint64_t length, void* user_data = nullptr,
                     uint32_t flags = 0) noexcept
    {
        return softblk_queue_write_zeroes(_q, offset, length, user_data, flags);
    }
    int zone_open(uint64_t zone, void* user_data = nullptr, uint32_t flags = 0) noexcept
    {
        return softblk_queue_zone_open(_q, zone, user_data, flags);
    }
    int zone_close(uint64_t zone, void* user_data = nullptr, uint32_t flags = 0) noexcept
    {
        return softblk_queue_zone_close(_q, zone, user_data, flags);
    }
    int zone_finish(uint64_t zone, void* user_data = nullptr, uint32_t flags = 0) noexcept
    {
        return softblk_queue_zone_finish(_q, zone, user_data, flags);
    }
    int zone_reset(uint64_t zone, void* user_data = nullptr, uint32_t flags = 0) noexcept
    {
        return softblk_queue_zone_reset(_q, zone, user_data, flags);
    }
    int zone_reset_all(void* user_data = nullptr, uint32_t flags = 0) noexcept
    {
        return softblk_queue_zone_reset_all(_q, user_data, flags);
    }
    int zone_append(uint64_t zone, std::span<const std::byte> buf, void* user_data = nullptr,
                    uint32_t flags = 0) noexcept
    {
        return softblk_queue_zone_append(_q, zone, buf.data(), buf.size(), user_data, flags);
    }
    int report_zones(uint64_t offset, std::span<softblk_zone> zones, void* user_data = nullptr,
                     uint32_t flags = 0) noexcept
    {
        return softblk_queue_report_zones(_q, offset, zones.data(),
                                          static_cast<uint32_t>(zones.size()), user_data, flags);
    }

    // softblk_queue_do_io into `out`: the number of completions or -errno.
    int do_io(std::span<softblk_completion> out, unsigned min_completions,
              int64_t timeout_ns = -1) noexcept
    {
        return softblk_queue_do_io(_q, out.data(), min_completions,
                                   static_cast<unsigned>(out.size()), timeout_ns);
    }

    // Waits for the one request a submission just started (nothing else in
    // flight on the queue) and returns its completion; an error when the
    // request failed (its message) or could not be submitted (`rc`).
    result<softblk_completion> wait_one(int rc)
    {
        if (rc < 0) {
            return last_error(rc);
        }
        softblk_completion c{};
        if (const int n = softblk_queue_do_io(_q, &c, 1, 1, -1); n < 0) {
            return last_error(n);
        }
        if (c.ret < 0) {
            return std::unexpected(error{-c.ret, c.error_msg != nullptr ? c.error_msg : ""});
        }
        return c;
    }

    unsigned in_flight() const noexcept { return softblk_queue_in_flight(_q); }
    softblk_queue* get() const noexcept { return _q; }

private:
    softblk_queue* _q;
};

// A running export; stopped when this goes (if it can be; the device stops
// it at its end otherwise).
class running_export {
public:
    running_export() = default;
    explicit running_export(softblk_export* exp) : _exp(exp) {}
    running_export(running_export&& other) noexcept : _exp(std::exchange(other._exp, nullptr)) {}
    running_export& operator=(running_export&& other) noexcept
    {
        std::swap(_exp, other._exp);
        return *this;
    }
    ~running_export()
    {
        if (_exp != nullptr) {
            softblk_export_stop(&_exp);
        }
    }

    result<void> stop() { return detail::check(softblk_export_stop(&_exp)); }
    // The export's describe() as JSON text ("uri", "file", "loop" ...).
    result<std::string> describe() const
    {
        return detail::get_string(
            [this](char* buf, size_t size) { return softblk_export_describe(_exp, buf, size); });
    }

private:
    softblk_export* _exp = nullptr;
};

// A device (owned: destroyed with this object, after its running_exports).
class device {
public:
    // softblk_create: options "key=value key=value" as `softblk add`.
    static result<device> create(const std::string& name, const std::string& type,
                                 const std::string& options = {})
    {
        softblk_device* dev = nullptr;
        if (const int rc = softblk_create(name.c_str(), type.c_str(), options.c_str(), &dev);
            rc < 0) {
            return last_error(rc);
        }
        return device(dev);
    }

    // softblk_create_argv: one "key=value" per element.
    static result<device> create(const std::string& name, const std::string& type,
                                 std::span<const std::string> options)
    {
        std::vector<const char*> args;
        args.reserve(options.size());
        for (const std::string& o : options) {
            args.push_back(o.c_str());
        }
        softblk_device* dev = nullptr;
        if (const int rc =
                softblk_create_argv(name.c_str(), type.c_str(), args.data(), args.size(), &dev);
            rc < 0) {
            return last_error(rc);
        }
        return device(dev);
    }

    device(device&& other) noexcept : _dev(std::exchange(other._dev, nullptr)) {}
    device& operator=(device&& other) noexcept
    {
        std::swap(_dev, other._dev);
        return *this;
    }
    ~device() { softblk_destroy(&_dev); }

    result<void> start() { return detail::check(softblk_start(_dev)); }
    result<void> stop() { return detail::check(softblk_stop(_dev)); }
    result<void> set_option(const std::string& key, const std::string& value)
    {
        return detail::check(softblk_set_option(_dev, key.c_str(), value.c_str()));
    }
    result<std::string> option(const std::string& key) const
    {
        return detail::get_string([&](char* buf, size_t size) {
            return softblk_get_option(_dev, key.c_str(), buf, size);
        });
    }
    result<uint64_t> u64(const std::string& property) const
    {
        uint64_t v = 0;
        if (const int rc = softblk_get_uint64(_dev, property.c_str(), &v); rc < 0) {
            return last_error(rc);
        }
        return v;
    }
    result<bool> flag(const std::string& property) const
    {
        bool v = false;
        if (const int rc = softblk_get_bool(_dev, property.c_str(), &v); rc < 0) {
            return last_error(rc);
        }
        return v;
    }
    result<queue> get_queue(unsigned index)
    {
        softblk_queue* q = nullptr;
        if (const int rc = softblk_get_queue(_dev, index, &q); rc < 0) {
            return last_error(rc);
        }
        return queue(q);
    }
    result<running_export> start_export(const std::string& type, const std::string& options,
                                        const std::string& run_dir)
    {
        softblk_export* exp = nullptr;
        if (const int rc =
                softblk_export_start(_dev, type.c_str(), options.c_str(), run_dir.c_str(), &exp);
            rc < 0) {
            return last_error(rc);
        }
        return running_export(exp);
    }

    softblk_device* get() const noexcept { return _dev; }

private:
    explicit device(softblk_device* dev) : _dev(dev) {}
    softblk_device* _dev = nullptr;
};

}  // namespace softblk::lib
