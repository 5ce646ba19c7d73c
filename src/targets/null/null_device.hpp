// Private to the null target: the device itself (null_target.cpp builds it
// from the options at power on). null_target is the geometry, the zones
// (zoned=1, the zone engine's null_blk model) and the hot path: execute()
// moves the data to and from the memory store (memory_backed=1) or moves
// none; null_queue completes every request inside submit().
#pragma once

#include <softblk/memory_store.hpp>
#include <softblk/target.hpp>
#include <softblk/zone_engine.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fmt/core.h>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sys/uio.h>

namespace softblk::targets::null_dev {

// Process-wide index allocator (null_blk's nullb_indexes ida).
class index_allocator {
public:
    // The lowest free index.
    int take()
    {
        std::lock_guard guard(_lock);
        int i = 0;
        while (_used.contains(i)) {
            ++i;
        }
        _used.insert(i);
        return i;
    }
    void give_back(int index)
    {
        std::lock_guard guard(_lock);
        _used.erase(index);
    }

private:
    std::mutex _lock;
    std::set<int> _used;
};

inline index_allocator& indexes()
{
    static index_allocator a;
    return a;
}

// What outlives a power-off: the data, as null_blk keeps it in the configfs
// item (nullb_device::data) until the directory goes.
struct null_data final : target_data {
    std::unique_ptr<memory_store> store;
    int numa_node = -1;
    uint64_t memory_bytes() const override { return store ? store->memory_bytes() : 0; }
};

class null_target;

// Per-queue half: everything completes inside submit().
class null_queue final : public target_queue {
public:
    null_queue(null_target& t, completion_sink& sink) : _target(t), _sink(sink) {}
    void submit(io_request& r) override;

private:
    null_target& _target;
    completion_sink& _sink;
};

class null_target final : public target, public zone_backend {
public:
    // `data` holds the store when memory_backed=1 (null otherwise).
    null_target(const block_limits& limits, std::shared_ptr<null_data> data, bool discard,
                int home_node, int index, bool no_sched, bool use_per_node_hctx)
        : _limits(limits),
          _data(std::move(data)),
          _store(_data ? _data->store.get() : nullptr),
          _discard(discard),
          _home_node(home_node),
          _index(index),
          _no_sched(no_sched),
          _use_per_node_hctx(use_per_node_hctx)
    {
    }
    ~null_target() override { indexes().give_back(_index); }

    // zoned=1: the zones (built after the store, which reset discards).
    // Their descriptors are charged to the store's budget when the device
    // keeps data (its memory_limit bounds all it holds), else to the
    // process's.
    result<void> make_zoned(zone_engine_config config, uint32_t max_zone_append_bytes)
    {
        config.budget = _store != nullptr ? &_store->budget() : nullptr;
        auto engine = zone_engine::create(config, this);
        if (!engine) {
            return std::unexpected(engine.error());
        }
        _zones = std::move(*engine);
        _zones->apply_limits(_limits);
        _limits.max_zone_append_bytes = max_zone_append_bytes;
        return {};
    }
    zone_engine* zones() { return _zones.get(); }

    // zone_backend: a reset (and a read-only or offline zone made empty
    // again) discards the zone's data, as null_handle_discard does.
    int reset_zone(uint32_t zone) override
    {
        if (_store) {
            _store->discard(_zones->zone_start(zone), _zones->zone_length(zone));
        }
        return 0;
    }

    result<void> set_zone_condition(uint64_t offset, zone_condition condition) override
    {
        if (!_zones) {
            return target::set_zone_condition(offset, condition);
        }
        return _zones->set_condition(offset, condition);
    }

    bool take_media_errors(media_errors* errors) override
    {
        if (!_zones) {
            return false;
        }
        _media_errors = errors;
        return true;
    }

    const block_limits& limits() const override { return _limits; }
    // A request's data goes straight between a front end's data_window and
    // the store's pages (or nowhere, memory_backed=0).
    external_data_support takes_external_data() const override { return {.data_windows = true}; }

    result<std::unique_ptr<target_queue>> open_queue(unsigned, completion_sink& sink) override
    {
        return std::make_unique<null_queue>(*this, sink);
    }

    int map_extents(uint64_t offset, uint64_t length, std::vector<extent>& out) override
    {
        if (_store == nullptr) {
            // Without memory nothing is stored and reads return no defined
            // data: report everything as data, as a disk would.
            return target::map_extents(offset, length, out);
        }
        // The store may be larger than the device (data kept past a
        // shrink): only the device's part.
        const uint64_t cap = _limits.capacity_bytes;
        if (offset < cap) {
            _store->map_extents(offset, std::min(length, cap - offset), out);
        }
        return 0;
    }

    result<void> apply_option(const option_def& def, const option_set& options) override
    {
        if (def.name == "memory_limit") {
            if (_store != nullptr) {
                _store->set_limit(options.u64("memory_limit") * k_mib);
            } else if (options.u64("memory_limit") != 0) {
                return make_error(EINVAL, fmt::format("memory_limit={}: memory_limit needs "
                                                      "memory_backed=1",
                                                      options.u64("memory_limit")));
            }
            return {};
        }
        if (def.name == "huge_pages") {
            // Without memory_backed=1 there is no store: the value waits
            // for a power on with memory (power_on_null notes it).
            if (_store != nullptr) {
                _store->set_huge_pages(*parse_huge_page_mode(options.text("huge_pages")));
            }
            return {};
        }
        if (def.name == "zone_readonly" || def.name == "zone_offline") {
            return set_zone_condition_attribute(def.name, options.text(def.name));
        }
        return target::apply_option(def, options);
    }

    // The store's budget has the zone descriptors in it when there is one.
    uint64_t memory_bytes() const override
    {
        if (_store != nullptr) {
            return _store->memory_bytes();
        }
        return _zones ? _zones->memory_bytes() : 0;
    }

    // zone_cond_store: EINVAL unless zoned, then the sector parsed with
    // kstrtoull (EINVAL, ERANGE), EINVAL beyond the zones or for a
    // conventional zone (the zone engine's checks).
    result<void> set_zone_condition_attribute(std::string_view name, std::string_view text)
    {
        if (!_zones) {
            return make_error(EINVAL, fmt::format("{}: the device is not zoned (zoned=0)", name));
        }
        auto sector = parse_kernel_unsigned(text);
        if (!sector) {
            // kstrtoull's errno, with what the attribute takes.
            return make_error(
                sector.error().code.value(),
                fmt::format("{}={}: {}; give a sector number (0 or more, decimal or "
                            "0x hex) in a sequential zone, 0 to {}",
                            name, text,
                            sector.error().code.value() == ERANGE ? "too large" : "not a sector",
                            _limits.capacity_bytes / 512 - 1));
        }
        if (*sector >= _limits.capacity_bytes / 512) {
            return make_error(EINVAL, fmt::format("{}={}: beyond the device's last sector {}", name,
                                                  *sector, _limits.capacity_bytes / 512 - 1));
        }
        return _zones->set_condition(*sector * 512, name == "zone_readonly"
                                                        ? zone_condition::read_only
                                                        : zone_condition::offline);
    }

    void describe(nlohmann::json& out) const override
    {
        out["index"] = _index;
        out["memory_backed"] = _store != nullptr;
        out["discard"] = _discard;
        out["home_node"] = _home_node;
        out["no_sched"] = _no_sched;
        out["use_per_node_hctx"] = _use_per_node_hctx;
        if (_store) {
            describe_memory_store(*_store, out);
        }
        if (_zones) {
            _zones->describe(out);
        }
    }

    // The hot path: bytes done or -errno.
    int execute(io_request& r)
    {
        if (_zones) {
            return execute_zoned(r);
        }
        switch (r.op) {
        case io_op::read:
            if (_store) {
                if (const int rc = _store->read_request(r.offset, r, r.length); rc < 0) {
                    return rc;
                }
            }
            // memory_backed=0: null_blk leaves the buffer as it is.
            return static_cast<int>(r.length);
        case io_op::write:
            if (_store) {
                if (const int stored = _store->write_request(r.offset, r, r.length); stored < 0) {
                    return store_error(stored);
                }
            }
            return static_cast<int>(r.length);
        case io_op::flush:
            return 0;  // nothing volatile below (the cache is a decorator)
        case io_op::discard:
            if (!_store || !_discard) {
                return -EOPNOTSUPP;
            }
            _store->discard(r.offset, r.length);
            return 0;
        case io_op::write_zeroes:
            // Not offered (null_blk has no WRITE_ZEROES); here for a caller
            // that skips the core's validation.
            if (!_store) {
                return -EOPNOTSUPP;
            }
            return _store->write_zeroes(r.offset, r.length, (r.flags & k_io_no_unmap) != 0) < 0
                       ? -ENOSPC
                       : 0;
        case io_op::report_extents:
            return answer_report_extents(*this, r);
        default:
            return -EOPNOTSUPP;  // zone operations need zoned=1
        }
    }

private:
    // A failed store write's result: null_blk fails a write whose page
    // cannot be allocated with BLK_STS_NOSPC, and so do we past the memory
    // budget; a window's read error stays what it is.
    static int store_error(int stored) { return stored == -ENOMEM ? -ENOSPC : stored; }

    // null_blk's pattern past a zone's write pointer (nullb_fill_pattern):
    // 0xff into read `r`'s data from byte `from` to its end, its buffer or
    // its window. Returns 0 or -errno.
    static int fill_pattern(const io_request& r, uint32_t from)
    {
        const data_window* window = window_of(r);
        if (window == nullptr) {
            std::memset(static_cast<char*>(r.buffer) + from, 0xff, r.length - from);
            return 0;
        }
        static const std::array<char, 4096> ones = [] {
            std::array<char, 4096> a{};
            a.fill('\xff');
            return a;
        }();
        constexpr size_t k_segments = 64;
        ::iovec iov[k_segments];
        while (from < r.length) {
            size_t count = 0;
            size_t bytes = 0;
            for (; count < k_segments && from + bytes < r.length; ++count) {
                const size_t n = std::min<size_t>(ones.size(), r.length - from - bytes);
                iov[count] = {.iov_base = const_cast<char*>(ones.data()), .iov_len = n};
                bytes += n;
            }
            const ssize_t put = ::pwritev(window->fd, iov, static_cast<int>(count),
                                          static_cast<off_t>(window->offset + from));
            if (put != static_cast<ssize_t>(bytes)) {
                return put < 0 ? -errno : -EIO;
            }
            from += static_cast<uint32_t>(bytes);
        }
        return 0;
    }

    // null_process_zoned_cmd.
    int execute_zoned(io_request& r)
    {
        zone_hold h;
        switch (r.op) {
        case io_op::read: {
            const int valid = _zones->begin_read(r, h);
            if (valid < 0) {
                return valid;
            }
            int rc = static_cast<int>(r.length);
            if (_store) {
                // Below the write pointer the data, beyond it 0xff
                // (nullb_fill_pattern).
                if (valid > 0) {
                    rc = _store->read_request(r.offset, r, static_cast<uint64_t>(valid));
                }
                if (rc >= 0 && static_cast<uint32_t>(valid) < r.length) {
                    rc = fill_pattern(r, static_cast<uint32_t>(valid));
                }
            }
            _zones->end_read(h);
            return rc < 0 ? rc : static_cast<int>(r.length);
        }
        case io_op::write:
        case io_op::zone_append: {
            if (const int rc = _zones->begin_write(r, h); rc != 0) {
                return rc;
            }
            r.result_offset = h.offset;
            // Bad blocks after the zone checks and the implicit open; a
            // partial write moves the write pointer over what it wrote.
            uint32_t bytes = r.length;
            int rc = static_cast<int>(r.length);
            if (_media_errors != nullptr) {
                const int64_t before_bad = _media_errors->check_write(h.offset, r.length);
                if (before_bad >= 0) {
                    bytes = static_cast<uint32_t>(before_bad);
                    rc = -EIO;
                }
            }
            if (_store && bytes > 0) {
                if (const int stored = _store->write_request(h.offset, r, bytes); stored < 0) {
                    _zones->end_write(h, 0);
                    return store_error(stored);
                }
            }
            _zones->end_write(h, bytes);
            if (rc < 0) {
                r.transferred = bytes;
            }
            return rc;
        }
        case io_op::flush:
            return 0;
        case io_op::zone_open:
        case io_op::zone_close:
        case io_op::zone_finish:
        case io_op::zone_reset:
        case io_op::zone_reset_all:
            return _zones->manage(r);
        case io_op::report_zones:
            return _zones->report(r);
        case io_op::report_extents:
            return answer_report_extents(*this, r);
        default:
            return -EOPNOTSUPP;  // discard and write zeroes: null_blk has none when zoned
        }
    }

    block_limits _limits;
    std::shared_ptr<null_data> _data;
    memory_store* _store;  // _data's, or null (memory_backed=0)
    bool _discard;
    int _home_node;
    int _index;
    bool _no_sched;
    bool _use_per_node_hctx;
    std::unique_ptr<zone_engine> _zones;
    media_errors* _media_errors = nullptr;
};

inline void null_queue::submit(io_request& r)
{
    _sink.complete(r, _target.execute(r));
}

}  // namespace softblk::targets::null_dev
