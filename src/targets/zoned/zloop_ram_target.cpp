// The `zloop-ram` target: the zloop target with its zones in RAM, for small
// fast zoned devices. The same options (but the zone files': id, base_dir,
// buffered_io, discard_write_cache; plus memory_limit), the same zone model
// (the zone engine's zloop flavour: LRU implicit close, EIO for an open past
// max_open_zones, no write pointer for full zones ...) and the same queue
// logic (zloop_common.hpp); the data goes to a memory store
// (include/softblk/memory_store.hpp) at the zone's byte offsets, synchronously
// on the queue's thread. Nothing outlives the device: no restart recovery,
// and power=0 drops the data. docs/zoned.md has the options and the rules.
#include "zloop_common.hpp"

#include <softblk/memory_store.hpp>
#include <softblk/target.hpp>
#include <softblk/zone_engine.hpp>

#include <atomic>
#include <cerrno>
#include <fmt/core.h>
#include <memory>
#include <new>
#include <nlohmann/json.hpp>
#include <string>

namespace softblk::targets {

namespace {

// The block size of the device: zloop's on the file systems it usually sits
// on (ext4, XFS, tmpfs: 4 KiB), and the memory store's page.
constexpr uint32_t k_block_size = 4096;

class zloop_ram_target;

// Per-queue half: the shared zone logic; the data is copied to or from the
// store inside submit() and the request completed there.
class zloop_ram_queue final : public zloop::zloop_queue {
public:
    zloop_ram_queue(zloop_ram_target& t, completion_sink& sink);

private:
    void read_data(io_request& r, uint32_t zone, uint64_t zone_offset) override;
    void write_data(io_request& r, uint32_t zone, uint64_t zone_offset) override;
    void complete_now(io_request& r, int result) override { _sink.complete(r, result); }
    // No cache: the data is where reads find it once a write completes.
    int flush() override { return 0; }

    zloop_ram_target& _t;
    completion_sink& _sink;
};

class zloop_ram_target final : public target, public zone_backend {
public:
    zloop_ram_target(const zloop::zone_settings& s, std::unique_ptr<memory_store> store)
        : _settings(s), _store(std::move(store))
    {
    }

    // The zone descriptors and the per-zone sizes are charged to the
    // store's budget before they are allocated, so that the device's
    // memory_limit and the daemon's budget bound them with the data (a
    // million zones take 72 MiB) and `list` counts them.
    result<void> init()
    {
        zone_engine_config config = zloop::engine_config(_settings, k_block_size);
        config.budget = &_store->budget();
        auto engine = zone_engine::create(config, this);
        if (!engine) {
            return std::unexpected(engine.error());
        }
        _zones = std::move(*engine);
        const uint32_t n = _settings.geo.nr_zones;
        const uint64_t bytes = uint64_t{n} * sizeof(std::atomic<uint64_t>);
        const std::string what = fmt::format("{} zone sizes", n);
        auto charge = memory_charge::take(_store->budget(), bytes, what);
        if (!charge) {
            return std::unexpected(charge.error());
        }
        _stored_charge = std::move(*charge);
        _stored.reset(new (std::nothrow) std::atomic<uint64_t>[n]);
        if (!_stored) {
            return std::unexpected(out_of_memory(what, bytes));
        }
        for (uint32_t i = 0; i < n; ++i) {
            _stored[i].store(0, std::memory_order_relaxed);
        }
        _limits = zloop::device_limits(*_zones, k_block_size, _settings.zone_append, false);
        return {};
    }

    const block_limits& limits() const override { return _limits; }
    // Data is copied straight to and from the store's pages.
    external_data_support takes_external_data() const override { return {.data_windows = true}; }
    zone_engine& zones() { return *_zones; }
    memory_store& store() { return *_store; }

    result<std::unique_ptr<target_queue>> open_queue(unsigned, completion_sink& sink) override
    {
        return std::make_unique<zloop_ram_queue>(*this, sink);
    }

    // What a zone file's size is to zloop: the end of the furthest write
    // that landed in the sequential zone (a failed write below it leaves
    // a hole that reads as zeros, as in a sparse file). Queue thread.
    void stored_to(uint32_t zone, uint64_t end)
    {
        uint64_t now = _stored[zone].load(std::memory_order_relaxed);
        while (now < end &&
               !_stored[zone].compare_exchange_weak(now, end, std::memory_order_relaxed)) {
        }
    }

    // zone_backend: reset forgets the zone's data (the file truncated to
    // 0), finish makes it the capacity long (the file extended). Queue
    // thread, zone locked.
    int reset_zone(uint32_t zone) override
    {
        _store->discard(_zones->zone_start(zone), _zones->zone_length(zone));
        _stored[zone].store(0, std::memory_order_relaxed);
        return 0;
    }
    int finish_zone(uint32_t zone) override
    {
        _stored[zone].store(_zones->zone_capacity(zone), std::memory_order_relaxed);
        return 0;
    }
    int64_t stored_bytes(uint32_t zone) override
    {
        return static_cast<int64_t>(_stored[zone].load(std::memory_order_relaxed));
    }

    result<void> apply_option(const option_def& def, const option_set& options) override
    {
        if (def.name == "huge_pages") {
            _store->set_huge_pages(*parse_huge_page_mode(options.text("huge_pages")));
            return {};
        }
        if (def.name == "memory_limit") {
            _store->set_limit(options.u64("memory_limit") << 20);
            return {};
        }
        return target::apply_option(def, options);
    }

    uint64_t memory_bytes() const override { return _store->memory_bytes(); }

    void describe(nlohmann::json& out) const override
    {
        out["ordered_zone_append"] = _settings.ordered_zone_append;
        describe_memory_store(*_store, out);
        _zones->describe(out);
    }

private:
    zloop::zone_settings _settings;
    std::unique_ptr<memory_store> _store;
    memory_charge _stored_charge;  // for _stored, released after it
    std::unique_ptr<std::atomic<uint64_t>[]> _stored;
    std::unique_ptr<zone_engine> _zones;
    block_limits _limits;
};

zloop_ram_queue::zloop_ram_queue(zloop_ram_target& t, completion_sink& sink)
    : zloop_queue(t.zones()), _t(t), _sink(sink)
{
}

// Past the write pointer the store holds nothing (a reset discards): zeros,
// as past the end of a zone file.
void zloop_ram_queue::read_data(io_request& r, uint32_t, uint64_t)
{
    const int rc = _t.store().read_request(r.offset, r, r.length);
    _sink.complete(r, rc < 0 ? rc : static_cast<int>(r.length));
}

void zloop_ram_queue::write_data(io_request& r, uint32_t zone, uint64_t zone_offset)
{
    const uint64_t offset = _zones.zone_start(zone) + zone_offset;
    const int rc = _t.store().write_request(offset, r, r.length);
    if (rc < 0) {
        note_result(r, rc);
        _sink.complete(r, rc);
        return;
    }
    if (!_zones.conventional(zone)) {
        _t.stored_to(zone, zone_offset + r.length);
    }
    _sink.complete(r, static_cast<int>(r.length));
}

result<std::unique_ptr<target>> create_zloop_ram(const option_set& o)
{
    auto settings = zloop::parse_zone_settings(o);
    if (!settings) {
        return std::unexpected(settings.error());
    }
    auto store = memory_store::create(
        {.capacity_bytes = uint64_t{settings->geo.nr_zones} * settings->geo.zone_size,
         .block_size = k_block_size,
         .limit_bytes = o.u64("memory_limit") << 20,
         .huge_pages = *parse_huge_page_mode(o.text("huge_pages"))});
    auto t = std::make_unique<zloop_ram_target>(*settings, std::move(store));
    if (auto r = t->init(); !r) {
        return std::unexpected(r.error());
    }
    return t;
}

[[maybe_unused]] const bool k_zloop_ram_registered = register_target_type(target_type{
    .name = "zloop-ram",
    .description = "the zloop target with its zones in RAM: zloop's options and zone model, no "
                   "files; the data goes with the device (and with power=0)",
    .options = zloop::ram_options(),
    .create = create_zloop_ram,
    .submit_queues = zloop::submit_queues,
    .queue_depth = zloop::queue_depth,
});

}  // namespace

}  // namespace softblk::targets
