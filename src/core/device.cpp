#include "device_impl.hpp"

#include "decorators.hpp"

#include <cerrno>
#include <cstring>
#include <fmt/core.h>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

namespace softblk {

namespace {

// The queue settings that every target type shares. Names, units and
// defaults are null_blk's configfs attributes (Linux 6.12).
constexpr option_def k_core_options[] = {
    {.name = "submit_queues",
     .kind = option_kind::integer,
     .default_value = "1",
     .unit = "",
     .help = "number of submission queues; each is driven by its own thread",
     .min = 1,
     .max = 256},
    {.name = "poll_queues",
     .kind = option_kind::integer,
     .default_value = "1",
     .unit = "",
     .help = "number of poll queues (after the submission queues): completions only when polled",
     .min = 0,
     .max = 256},
    {.name = "hw_queue_depth",
     .kind = option_kind::integer,
     .default_value = "64",
     .unit = "",
     .help = "tags per queue (requests in flight per queue)",
     .min = 1,
     .max = 4096},
    {.name = "irqmode",
     .kind = option_kind::integer,
     .default_value = "1",
     .unit = "",
     .help = "completion mode: 0 inline, 1 deferred to the queue's loop (softirq), 2 timer",
     .min = 0,
     .max = 2},
    {.name = "completion_nsec",
     .kind = option_kind::integer,
     .default_value = "10000",
     .unit = "ns",
     .help = "irqmode=2: time from the target's completion to the callback",
     .min = 0,
     .max = 60'000'000'000ull},
    {.name = "shared_tags",
     .kind = option_kind::boolean,
     .default_value = "0",
     .unit = "",
     .help = "share one tag set among all devices with shared_tags=1 (per queue index)"},
    {.name = "shared_tag_bitmap",
     .kind = option_kind::boolean,
     .default_value = "0",
     .unit = "",
     .help = "one tag bitmap of hw_queue_depth tags for all queues of the device"},
    {.name = "blocking",
     .kind = option_kind::boolean,
     .default_value = "0",
     .unit = "",
     .help = "the target may sleep while submitting (BLK_MQ_F_BLOCKING); see docs/null.md"},
    {.name = "io_timeout",
     .kind = option_kind::integer,
     .default_value = "30000",
     .unit = "ms",
     .help = "request timeout of the core (the block layer's queue/io_timeout)",
     .min = 1,
     .max = 3'600'000},
};

// shared_tags=1: one tag pool per queue index, shared by every device that
// asks for it, alive while one of them is.
std::shared_ptr<core::shared_tag_pool> global_shared_tags(unsigned queue_index, unsigned depth)
{
    static std::mutex lock;
    static std::map<unsigned, std::weak_ptr<core::shared_tag_pool>> pools;
    std::lock_guard guard(lock);
    auto& slot = pools[queue_index];
    if (auto pool = slot.lock()) {
        return pool;
    }
    auto pool = std::make_shared<core::shared_tag_pool>(depth);
    slot = pool;
    return pool;
}

}  // namespace

std::span<const option_def> core_options()
{
    return k_core_options;
}

int device::execute(io_op op, uint64_t offset, uint32_t length, void* buffer, uint32_t flags)
{
    bio b = make_bio(op, offset, length, buffer, flags);
    const int rc = execute(b);
    if (rc < 0) {
        return rc;
    }
    switch (op) {
    case io_op::read:
    case io_op::write:
    case io_op::zone_append:
    case io_op::report_zones:
    case io_op::report_extents:
        return static_cast<int>(b.transferred);
    default:
        return 0;
    }
}

result<std::vector<zone_descriptor>> device::report_zones(uint64_t offset, uint32_t max_zones)
{
    std::vector<zone_descriptor> zones(max_zones);
    bio b;
    b.op = io_op::report_zones;
    b.offset = offset;
    b.buffer = zones.data();
    b.report_capacity = max_zones;
    if (const int rc = execute(b); rc < 0) {
        return make_error(-rc, fmt::format("{}: report zones at offset {}: {}", name(), offset,
                                           std::strerror(-rc)));
    }
    zones.resize(std::min<uint64_t>(b.transferred, max_zones));
    return zones;
}

std::vector<option_def> options_for(std::string_view type)
{
    std::vector<option_def> all(std::begin(k_core_options), std::end(k_core_options));
    auto deco = core::decorator_options();
    all.insert(all.end(), deco.begin(), deco.end());
    if (const target_type* t = find_target_type(type)) {
        all.insert(all.end(), t->options.begin(), t->options.end());
    }
    return all;
}

result<std::unique_ptr<device>> device::create(std::string name, std::string_view type,
                                               std::span<const std::string> args)
{
    if (name.empty() || name.size() > 64 ||
        name.find_first_not_of(
            "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.") !=
            std::string::npos ||
        name[0] == '.') {
        return make_error(EINVAL, fmt::format("{}: a device name is 1 to 64 characters of letters, "
                                              "digits, '_', '-' and '.', not starting with '.'",
                                              name));
    }
    const target_type* tt = find_target_type(type);
    if (tt == nullptr) {
        std::string known;
        for (const target_type* t : target_types()) {
            known += known.empty() ? "" : ", ";
            known += t->name;
        }
        return make_error(ENOENT, fmt::format("{}: unknown target type (known: {})", type, known));
    }
    auto defs = options_for(type);
    auto options = option_set::parse(defs, args);
    if (!options) {
        return std::unexpected(options.error());
    }
    queue_config queues = core::queue_config_from(*options);
    if (tt->submit_queues) {
        if (const unsigned n = tt->submit_queues(*options); n != 0) {
            queues.submit_queues = n;
        }
    }
    if (tt->queue_depth) {
        if (const unsigned n = tt->queue_depth(*options); n != 0) {
            queues.queue_depth = n;
        }
    }
    auto t = tt->create(*options);
    if (!t) {
        return std::unexpected(t.error());
    }
    auto decorated = core::apply_decorators(std::move(*t), *options, queues);
    if (!decorated) {
        return std::unexpected(decorated.error());
    }
    auto dev = std::make_unique<core::device_impl>(
        std::move(name), std::string(type), std::move(*options), queues, std::move(*decorated));
    if (auto r = dev->start(); !r) {
        return std::unexpected(r.error());
    }
    return dev;
}

namespace core {

queue_config queue_config_from(const option_set& o)
{
    queue_config q;
    q.submit_queues = static_cast<unsigned>(o.u64("submit_queues"));
    q.poll_queues = static_cast<unsigned>(o.u64("poll_queues"));
    q.queue_depth = static_cast<unsigned>(o.u64("hw_queue_depth"));
    q.mode = static_cast<completion_mode>(o.u64("irqmode"));
    q.completion_nsec = o.u64("completion_nsec");
    q.shared_tags = o.flag("shared_tags");
    q.shared_tag_bitmap = o.flag("shared_tag_bitmap");
    q.blocking = o.flag("blocking");
    q.io_timeout_ms = o.u64("io_timeout");
    return q;
}

device_impl::device_impl(std::string name, std::string type, option_set options,
                         queue_config queues, std::unique_ptr<target> t)
    : _options(std::move(options)), _target(std::move(t))
{
    _info.name = std::move(name);
    _info.target_type = std::move(type);
    _info.limits = _target->limits();
    _info.queues = queues;
}

device_impl::~device_impl()
{
    // Queues (and the target's halves) go before the target.
    _queues.clear();
}

result<void> device_impl::start()
{
    const queue_config& q = _info.queues;
    std::shared_ptr<shared_tag_pool> device_pool;
    if (q.shared_tag_bitmap && !q.shared_tags) {
        device_pool = std::make_shared<shared_tag_pool>(q.queue_depth);
    }
    const unsigned total = q.submit_queues + q.poll_queues;
    for (unsigned i = 0; i < total; ++i) {
        std::shared_ptr<shared_tag_pool> pool = device_pool;
        if (q.shared_tags) {
            pool = global_shared_tags(q.shared_tag_bitmap ? 0 : i, q.queue_depth);
        }
        auto queue =
            std::make_unique<queue_impl>(*this, i, i >= q.submit_queues, q.queue_depth, pool);
        if (auto r = queue->open(*_target); !r) {
            return make_error(r.error().code.value(),
                              fmt::format("queue {}: {}", i, r.error().message));
        }
        _queues.push_back(std::move(queue));
    }
    return {};
}

int device_impl::execute(bio& b)
{
    queue_impl& q = caller_queue();
    std::lock_guard guard(q.sync_lock());
    return q.run(b);
}

queue_impl& device_impl::caller_queue()
{
    // One submission queue per calling thread, handed out round robin the
    // first time a thread calls (thread ids are aligned addresses and hash
    // badly onto a few queues).
    static std::atomic<unsigned> next_slot{0};
    thread_local const unsigned slot = next_slot.fetch_add(1, std::memory_order_relaxed);
    return *_queues[slot % _info.queues.submit_queues];
}

result<std::vector<extent>> device_impl::map(uint64_t offset, uint64_t length)
{
    queue_impl& q = caller_queue();
    std::lock_guard guard(q.sync_lock());
    auto map = q.map(offset, length);
    if (!map) {
        map.error().message = _info.name + ": " + map.error().message;
    }
    return map;
}

result<void> device_impl::set_power(bool on)
{
    for (const auto& q : _queues) {
        if (q->in_flight() != 0) {
            return make_error(EBUSY, fmt::format("{}: power={}: I/O in flight on queue {}",
                                                 _info.name, on ? 1 : 0, q->index()));
        }
    }
    if (on == powered()) {
        return {};
    }
    _target->set_power(on);
    _powered.store(on, std::memory_order_relaxed);
    return {};
}

result<void> device_impl::set_zone_condition(uint64_t offset, zone_condition condition)
{
    if (!_info.limits.zoned) {
        return make_error(EOPNOTSUPP, fmt::format("{}: not a zoned device", _info.name));
    }
    auto r = _target->set_zone_condition(offset, condition);
    if (!r) {
        return make_error(r.error().code.value(),
                          fmt::format("{}: {}", _info.name, r.error().message));
    }
    return {};
}

void device_impl::describe(nlohmann::json& out) const
{
    const block_limits& l = _info.limits;
    out["name"] = _info.name;
    out["type"] = _info.target_type;
    out["capacity_bytes"] = l.capacity_bytes;
    out["logical_block_size"] = l.logical_block_size;
    out["physical_block_size"] = l.physical_block_size;
    out["max_transfer_bytes"] = l.max_transfer_bytes;
    out["max_discard_bytes"] = l.max_discard_bytes;
    out["max_write_zeroes_bytes"] = l.max_write_zeroes_bytes;
    out["rotational"] = l.rotational;
    out["volatile_write_cache"] = l.volatile_write_cache;
    out["fua"] = l.fua;
    out["read_only"] = l.read_only;
    out["zoned"] = l.zoned;
    out["submit_queues"] = _info.queues.submit_queues;
    out["poll_queues"] = _info.queues.poll_queues;
    out["queue_depth"] = _info.queues.queue_depth;
    out["irqmode"] = static_cast<int>(_info.queues.mode);
    out["power"] = powered() ? 1 : 0;
    out["memory_bytes"] = _target->memory_bytes();
    queue_stats total;
    for (const auto& q : _queues) {
        const queue_stats s = q->stats();
        total.submitted += s.submitted;
        total.completed += s.completed;
        total.errors += s.errors;
        total.bytes_read += s.bytes_read;
        total.bytes_written += s.bytes_written;
        total.timeouts += s.timeouts;
    }
    out["stats"] = {{"submitted", total.submitted},
                    {"completed", total.completed},
                    {"errors", total.errors},
                    {"bytes_read", total.bytes_read},
                    {"bytes_written", total.bytes_written},
                    {"timeouts", total.timeouts}};
    nlohmann::json t = nlohmann::json::object();
    _target->describe(t);
    out["target"] = std::move(t);
    out["options"] = _options.to_args();
}

}  // namespace core
}  // namespace softblk
