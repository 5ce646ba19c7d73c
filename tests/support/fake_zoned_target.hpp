// A small zoned target with its data, for tests that carry the zone API
// through the core and the front ends (the block layer's zone tests, the
// virtio-blk zoned path): zones of one size, the first ones conventional,
// the rest sequential-write-required with a write pointer; writes must
// land on it, appends land there and say where. Thread-safe (one lock):
// front ends drive it from one thread per queue. Test code only.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string_view>
#include <vector>

#include <softblk/target.hpp>

namespace softblk::test {

struct fake_zoned_geometry {
    unsigned zones = 8;
    uint64_t zone_bytes = 64 << 10;
    uint64_t capacity_bytes = 48 << 10;  // writable part of a sequential zone
    unsigned conventional = 1;           // the first zones
    uint32_t max_open = 4;
    uint32_t max_active = 6;
    uint32_t max_append_bytes = 16 << 10;
    uint32_t max_transfer_bytes = 128 << 10;
};

class fake_zoned_target final : public target {
public:
    explicit fake_zoned_target(const fake_zoned_geometry& g) : _g(g), _data(g.zones * g.zone_bytes)
    {
        _limits.capacity_bytes = g.zones * g.zone_bytes;
        _limits.logical_block_size = 4096;
        _limits.physical_block_size = 4096;
        _limits.max_transfer_bytes = g.max_transfer_bytes;
        _limits.zoned = true;
        _limits.zone_size_bytes = g.zone_bytes;
        _limits.zone_capacity_bytes = g.capacity_bytes;
        _limits.conventional_zones = g.conventional;
        _limits.max_open_zones = g.max_open;
        _limits.max_active_zones = g.max_active;
        _limits.max_zone_append_bytes = g.max_append_bytes;
        for (unsigned i = 0; i < g.zones; ++i) {
            zone_descriptor z;
            z.start = i * g.zone_bytes;
            z.length = g.zone_bytes;
            if (i < g.conventional) {
                z.type = zone_type::conventional;
                z.condition = zone_condition::not_write_pointer;
                z.capacity = g.zone_bytes;
                z.write_pointer = z.start + g.zone_bytes;
            } else {
                z.capacity = g.capacity_bytes;
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
        queue(fake_zoned_target& t, completion_sink& s) : _t(t), _sink(s) {}
        void submit(io_request& r) override { _sink.complete(r, _t.run(r)); }

    private:
        fake_zoned_target& _t;
        completion_sink& _sink;
    };

    int run(io_request& r)
    {
        std::lock_guard lock(_lock);
        const uint64_t index = r.offset / _g.zone_bytes;
        if (index >= _zones.size()) {
            return r.op == io_op::report_zones ? 0 : -EIO;
        }
        zone_descriptor& z = _zones[index];
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
            for (uint64_t i = index; i < _zones.size() && n < r.report_capacity; ++i) {
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

    const fake_zoned_geometry _g;
    std::mutex _lock;
    block_limits _limits;
    std::vector<zone_descriptor> _zones;
    std::vector<uint8_t> _data;
};

// Registers target type `name` whose devices are fake_zoned_target(g).
// Returns whether the registration succeeded (false: the name is taken).
// `name` and `description` must outlive the registry (string literals).
inline bool register_fake_zoned(std::string_view name, std::string_view description,
                                fake_zoned_geometry g)
{
    return register_target_type(target_type{
        .name = name,
        .description = description,
        .options = {},
        .create = [g](const option_set&) -> result<std::unique_ptr<target>> {
            return std::make_unique<fake_zoned_target>(g);
        },
        .submit_queues = {},
    });
}

}  // namespace softblk::test
