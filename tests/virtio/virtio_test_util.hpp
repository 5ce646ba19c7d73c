// Helpers of the virtio tests: a softblk device exported over
// vhost-user-blk in this process (the back end), a temporary socket
// directory, the export's counters, and a small fake zoned target with
// data ("vzoned_fake") for the zoned virtio-blk path.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <softblk/device.hpp>
#include <softblk/frontend.hpp>
#include <softblk/target.hpp>

namespace softblk::test {

// A private directory for sockets, removed at the end.
struct temp_dir {
    temp_dir()
    {
        char tmpl[] = "/tmp/softblk-virtio-test.XXXXXX";
        path = ::mkdtemp(tmpl);
    }
    ~temp_dir() { std::filesystem::remove_all(path); }
    std::string path;
};

// A device of `type` served by an in-process vhost-user-blk export.
struct backend {
    backend(const std::string& type, std::vector<std::string> options,
            std::vector<std::string> export_options = {}, std::string name = "vback")
    {
        auto d = device::create(name, type, options);
        EXPECT_TRUE(d.has_value()) << (d ? "" : d.error().message);
        if (!d) {
            return;
        }
        dev = std::move(*d);
        socket = dir.path + "/" + name + ".sock";
        export_options.push_back("socket=" + socket);
        const export_type* t = find_export_type("vhost-user-blk");
        EXPECT_NE(t, nullptr);
        auto e = start_export(*t, *dev, export_context{dir.path, false}, export_options);
        EXPECT_TRUE(e.has_value()) << (e ? "" : e.error().message);
        if (e) {
            exp = std::move(*e);
        }
    }
    ~backend()
    {
        if (exp) {
            (void)exp->stop();
        }
    }
    // One of the export's counters ("flush", "bad_requests" ...).
    uint64_t stat(const char* name) const { return exp->describe()["stats"][name].get<uint64_t>(); }

    temp_dir dir;
    std::unique_ptr<device> dev;
    std::unique_ptr<device_export> exp;
    std::string socket;
};

// A virtio device (softblk's driver) on `socket`.
inline std::unique_ptr<device> make_virtio(const std::string& socket,
                                           std::vector<std::string> options = {},
                                           std::string name = "vfront")
{
    options.push_back("path=" + socket);
    auto d = device::create(name, "virtio", options);
    EXPECT_TRUE(d.has_value()) << (d ? "" : d.error().message);
    return d ? std::move(*d) : nullptr;
}

// ---------------------------------------------------------------- zones
// 16 zones of 1 MiB (768 KiB writable), the first 2 conventional, with
// their data; writes must land on the write pointer. Thread-safe: the
// virtio back end drives it from one thread per ring.
class vzoned_fake_target final : public target {
public:
    static constexpr uint64_t k_zone = 1 << 20;
    static constexpr uint64_t k_cap = 768 << 10;
    static constexpr unsigned k_zones = 16;

    vzoned_fake_target() : _data(k_zones * k_zone)
    {
        _limits.capacity_bytes = k_zones * k_zone;
        _limits.logical_block_size = 4096;
        _limits.physical_block_size = 4096;
        _limits.max_transfer_bytes = 256 << 10;
        _limits.zoned = true;
        _limits.zone_size_bytes = k_zone;
        _limits.zone_capacity_bytes = k_cap;
        _limits.conventional_zones = 2;
        _limits.max_open_zones = 4;
        _limits.max_active_zones = 6;
        _limits.max_zone_append_bytes = 64 << 10;
        for (unsigned i = 0; i < k_zones; ++i) {
            zone_descriptor z;
            z.start = i * k_zone;
            z.length = k_zone;
            if (i < 2) {
                z.type = zone_type::conventional;
                z.condition = zone_condition::not_write_pointer;
                z.capacity = k_zone;
                z.write_pointer = z.start + k_zone;
            } else {
                z.capacity = k_cap;
                z.write_pointer = z.start;
            }
            _zones.push_back(z);
        }
    }
    const block_limits& limits() const override { return _limits; }
    result<std::unique_ptr<target_queue>> open_queue(unsigned, completion_sink& sink) override
    {
        return std::make_unique<queue>(*this, sink);
    }

private:
    class queue final : public target_queue {
    public:
        queue(vzoned_fake_target& t, completion_sink& s) : _t(t), _sink(s) {}
        void submit(io_request& r) override { _sink.complete(r, _t.run(r)); }

    private:
        vzoned_fake_target& _t;
        completion_sink& _sink;
    };

    int run(io_request& r)
    {
        std::lock_guard lock(_lock);
        zone_descriptor& z = _zones[r.offset / k_zone];
        switch (r.op) {
        case io_op::read:
            std::memcpy(r.buffer, _data.data() + r.offset, r.length);
            return static_cast<int>(r.length);
        case io_op::write:
        case io_op::zone_append: {
            uint64_t at = r.offset;
            if (z.type != zone_type::conventional) {
                if (r.op == io_op::zone_append) {
                    at = z.write_pointer;
                }
                if (at != z.write_pointer || at + r.length > z.start + z.capacity) {
                    return -EIO;
                }
                z.write_pointer += r.length;
                z.condition = z.write_pointer == z.start + z.capacity
                                  ? zone_condition::full
                                  : zone_condition::implicit_open;
            } else if (r.op == io_op::zone_append) {
                return -EINVAL;
            }
            std::memcpy(_data.data() + at, r.buffer, r.length);
            r.result_offset = at;
            return static_cast<int>(r.length);
        }
        case io_op::zone_open:
            if (z.type == zone_type::conventional) {
                return -EINVAL;
            }
            z.condition = zone_condition::explicit_open;
            return 0;
        case io_op::zone_close:
            z.condition =
                z.write_pointer == z.start ? zone_condition::empty : zone_condition::closed;
            return 0;
        case io_op::zone_finish:
            z.write_pointer = z.start + z.capacity;
            z.condition = zone_condition::full;
            return 0;
        case io_op::zone_reset:
            z.write_pointer = z.start;
            z.condition = zone_condition::empty;
            return 0;
        case io_op::zone_reset_all:
            for (auto& each : _zones) {
                if (each.type != zone_type::conventional) {
                    each.write_pointer = each.start;
                    each.condition = zone_condition::empty;
                }
            }
            return 0;
        case io_op::report_zones: {
            auto* out = static_cast<zone_descriptor*>(r.buffer);
            uint32_t n = 0;
            for (uint64_t i = r.offset / k_zone; i < _zones.size() && n < r.report_capacity; ++i) {
                out[n++] = _zones[i];
            }
            return static_cast<int>(n);
        }
        case io_op::flush:
            return 0;
        default:
            return -EOPNOTSUPP;
        }
    }

    std::mutex _lock;
    block_limits _limits;
    std::vector<zone_descriptor> _zones;
    std::vector<uint8_t> _data;
};

inline const bool k_vzoned_registered = register_target_type(target_type{
    .name = "vzoned_fake",
    .description = "fake zoned target with data, for the virtio tests",
    .options = {},
    .create = [](const option_set&) -> result<std::unique_ptr<target>> {
        return std::make_unique<vzoned_fake_target>();
    },
    .submit_queues = {},
});

}  // namespace softblk::test
