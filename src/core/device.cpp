// Devices: the core's option table, module-parameter defaults, creation and
// power cycles (null_blk's configfs rules, Linux 6.12
// drivers/block/null_blk/main.c; docs/null.md has the table). Attribute
// changes while a device lives are device_attributes.cpp.
#include "device_impl.hpp"

#include "decorators.hpp"

#include <cerrno>
#include <cstring>
#include <fmt/core.h>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <unistd.h>

namespace softblk {

namespace {

// The block layer's most tags per queue (BLK_MQ_MAX_DEPTH): more is
// reduced to this when the tag set is made (the attribute keeps its value).
constexpr uint64_t k_max_depth = 10240;
// completion_nsec is an unsigned long; deadlines must not overflow.
constexpr uint64_t k_max_completion_nsec = uint64_t{1} << 62;

// The queue settings that every target type shares. Names, units and
// defaults are null_blk's configfs attributes (Linux 6.12); the rules that
// apply at power on are in device_impl::apply_core_rules.
constexpr option_def k_core_options[] = {
    {.name = "submit_queues",
     .kind = option_kind::integer,
     .default_value = "1",
     .unit = "",
     .help = "submission queues, each driven by its own thread; at power on 0 becomes 1 and more "
             "than the CPUs the CPU count (null_blk); changes while powered on re-create the "
             "queues",
     .bits = 32,
     .update = option_update::reconfigure},
    {.name = "poll_queues",
     .kind = option_kind::integer,
     .default_value = "1",
     .unit = "",
     .help = "poll queues (after the submission queues): completions only when polled; at most "
             "the module's poll_queues (1 unless the daemon's module parameters say more)",
     .bits = 32,
     .update = option_update::reconfigure},
    {.name = "hw_queue_depth",
     .kind = option_kind::integer,
     .default_value = "64",
     .unit = "",
     .help = "tags per queue (requests in flight per queue); 0 fails at power on, more than 10240 "
             "gives 10240 (the block layer's limit)",
     .min = 1,
     .bits = 32},
    {.name = "irqmode",
     .kind = option_kind::integer,
     .default_value = "1",
     .unit = "",
     .help = "completion mode: 0 inline, 1 deferred to the queue's loop (softirq), 2 timer; "
             "larger values become 2 at power on",
     .min = 0,
     .max = 2,
     .range = option_range::clamp,
     .bits = 32},
    {.name = "completion_nsec",
     .kind = option_kind::integer,
     .default_value = "10000",
     .unit = "ns",
     .help = "irqmode=2: time from the target's completion to the callback"},
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
     .default_value = "5000",
     .unit = "ms",
     .help = "request timeout (null_blk's tag set: 5 s; the block queue's io_timeout), changes "
             "at any time",
     .min = 1,
     .bits = 32,
     .update = option_update::live},
    {.name = "no_sched",
     .kind = option_kind::boolean,
     .default_value = "0",
     .unit = "",
     .help = "no I/O scheduler on the kernel disk an export yields (ublk, FUSE with loop): "
             "\"none\" is written to its queue/scheduler at every export start (null_blk's "
             "no_sched); 0 leaves the kernel's default. softblk itself never reorders"},
    {.name = "power",
     .kind = option_kind::boolean,
     .default_value = "0",
     .unit = "",
     .help = "1 powers the device on (creates the target and queues), 0 off (data and bad "
             "blocks stay); `softblk add` powers on unless power=0 is given",
     .update = option_update::live},
};

// Options that module parameters cannot preset (state, not configuration).
constexpr std::string_view k_not_module_parameters[] = {"power", "index", "badblocks"};

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

struct type_defaults {
    std::mutex lock;
    std::map<std::string, std::vector<std::string>, std::less<>> args;
};

type_defaults& defaults_registry()
{
    static type_defaults d;
    return d;
}

}  // namespace

std::span<const option_def> core_options()
{
    return k_core_options;
}

unsigned possible_cpus()
{
    // "0-3" or "0,2-5": the kernel's nr_cpu_ids is the highest + 1.
    std::ifstream in("/sys/devices/system/cpu/possible");
    std::string text;
    unsigned highest = 0;
    bool any = false;
    if (std::getline(in, text)) {
        size_t pos = 0;
        while (pos < text.size()) {
            size_t end = text.find(',', pos);
            if (end == std::string::npos) {
                end = text.size();
            }
            const std::string part = text.substr(pos, end - pos);
            const size_t dash = part.find('-');
            const std::string last = dash == std::string::npos ? part : part.substr(dash + 1);
            if (auto n = parse_kernel_unsigned(last, 1u << 20)) {
                highest = std::max(highest, static_cast<unsigned>(*n));
                any = true;
            }
            pos = end + 1;
        }
    }
    if (any) {
        return highest + 1;
    }
    const long n = ::sysconf(_SC_NPROCESSORS_CONF);
    return n > 0 ? static_cast<unsigned>(n) : 1;
}

result<void> set_option_defaults(std::string_view type, std::span<const std::string> args)
{
    if (find_target_type(type) == nullptr) {
        return make_error(ENOENT, fmt::format("{}: unknown target type", type));
    }
    const auto defs = options_for(type);
    for (const std::string& arg : args) {
        const std::string_view key = std::string_view(arg).substr(0, arg.find('='));
        const option_def* def = option_set::find_def(defs, key);
        for (std::string_view no : k_not_module_parameters) {
            if (def != nullptr && def->name == no) {
                return make_error(EPERM, fmt::format("{}: not a module parameter (a device's "
                                                     "state, set per device)",
                                                     key));
            }
        }
    }
    if (auto parsed = option_set::parse_values(defs, args); !parsed) {
        return std::unexpected(parsed.error());
    }
    auto& d = defaults_registry();
    std::lock_guard guard(d.lock);
    d.args[std::string(type)].assign(args.begin(), args.end());
    return {};
}

std::vector<std::string> option_defaults(std::string_view type)
{
    auto& d = defaults_registry();
    std::lock_guard guard(d.lock);
    auto it = d.args.find(type);
    return it == d.args.end() ? std::vector<std::string>{} : it->second;
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

result<std::vector<zone_descriptor>> device::report_zones(uint64_t offset, uint32_t max_zones,
                                                          bool control)
{
    std::vector<zone_descriptor> zones(max_zones);
    bio b;
    b.op = io_op::report_zones;
    b.offset = offset;
    b.buffer = zones.data();
    b.report_capacity = max_zones;
    if (const int rc = control ? execute_control(b) : execute(b); rc < 0) {
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
    const auto defs = options_for(type);
    const auto defaults = option_defaults(type);
    auto options = option_set::parse_values(defs, args, defaults);
    if (!options) {
        return std::unexpected(options.error());
    }
    auto state = core::make_decorator_state(*options);
    if (!state) {
        return std::unexpected(state.error());
    }
    const bool power = !options->given("power") || options->flag("power");
    auto dev = std::make_unique<core::device_impl>(std::move(name), *tt, std::move(*options),
                                                   std::move(*state));
    if (power) {
        if (auto r = dev->set_power(true); !r) {
            return std::unexpected(r.error());
        }
    }
    return dev;
}

namespace core {

// null_blk's g_poll_queues: the module parameter, 1 by default.
uint64_t poll_queue_limit(std::string_view type)
{
    const auto defs = options_for(type);
    const auto defaults = option_defaults(type);
    auto parsed = option_set::parse_values(defs, {}, defaults);
    return parsed ? parsed->u64("poll_queues") : 1;
}

queue_config queue_config_from(const option_set& o)
{
    queue_config q;
    q.submit_queues = static_cast<unsigned>(o.u64("submit_queues"));
    q.poll_queues = static_cast<unsigned>(o.u64("poll_queues"));
    q.queue_depth = static_cast<unsigned>(std::min(o.u64("hw_queue_depth"), k_max_depth));
    q.mode = static_cast<completion_mode>(std::min<uint64_t>(o.u64("irqmode"), 2));
    q.completion_nsec = std::min(o.u64("completion_nsec"), k_max_completion_nsec);
    q.shared_tags = o.flag("shared_tags");
    q.shared_tag_bitmap = o.flag("shared_tag_bitmap");
    q.blocking = o.flag("blocking");
    q.io_timeout_ms = o.u64("io_timeout");
    return q;
}

device_impl::device_impl(std::string name, const target_type& type, option_set options,
                         std::shared_ptr<decorator_state> state)
    : _type(type), _options(std::move(options)), _decorator_state(std::move(state))
{
    _info.name = std::move(name);
    _info.target_type = std::string(type.name);
}

device_impl::~device_impl()
{
    // Queues (and the target's halves) go before the target.
    _queues.clear();
    _target.reset();
}

void device_impl::apply_core_rules(option_set& o)
{
    // null_validate_conf: per-node queues, then submit_queues within the
    // CPUs and at least 1; poll_queues within the module's.
    const uint64_t submit = o.u64("submit_queues");
    const unsigned per_node = _type.submit_queues ? _type.submit_queues(o) : 0;
    if (per_node != 0) {
        if (submit != per_node) {
            o.set_u64("submit_queues", per_node);
        }
    } else if (const unsigned cpus = possible_cpus(); submit > cpus) {
        _notes.push_back(
            fmt::format("submit_queues={} clamped to {} (the CPUs of this machine)", submit, cpus));
        o.set_u64("submit_queues", cpus);
    } else if (submit == 0) {
        o.set_u64("submit_queues", 1);
    }
    const uint64_t poll_limit = poll_queue_limit(_info.target_type);
    if (o.u64("poll_queues") > poll_limit) {
        _notes.push_back(fmt::format(
            "poll_queues={} clamped to {} (the module's poll_queues; set it with `softblk daemon "
            "poll_queues=N`)",
            o.u64("poll_queues"), poll_limit));
        o.set_u64("poll_queues", poll_limit);
    }
    if (o.u64("hw_queue_depth") > k_max_depth) {
        // blk_mq_alloc_tag_set: "reduced tag depth"; the attribute stays.
        _notes.push_back(
            fmt::format("hw_queue_depth={}: the queues have {} tags (the block "
                        "layer's BLK_MQ_MAX_DEPTH); the attribute keeps its value",
                        o.u64("hw_queue_depth"), k_max_depth));
    }
}

result<void> device_impl::power_on()
{
    _notes.clear();
    if (_type.refuse_before_clamps) {
        if (auto r = _type.refuse_before_clamps(_options); !r) {
            return r;
        }
    }
    option_set cfg = _options;
    apply_core_rules(cfg);
    // The effective values are written back whatever happens next, as
    // null_blk's validation writes them before the block layer can refuse.
    struct write_back {
        option_set& from;
        option_set& to;
        ~write_back() { to = from; }
    } guard{cfg, _options};
    if (auto r = cfg.check_ranges(&_notes); !r) {
        return r;
    }
    std::unique_ptr<target> made;
    if (_type.power_on) {
        auto t = _type.power_on(cfg, _kept, _notes);
        if (!t) {
            return std::unexpected(t.error());
        }
        made = std::move(*t);
    } else {
        auto t = _type.create(cfg);
        if (!t) {
            return std::unexpected(t.error());
        }
        made = std::move(*t);
    }
    queue_config q = queue_config_from(cfg);
    if (_type.queue_depth) {
        // A target's own name for the depth (zloop's queue_depth).
        if (const unsigned n = _type.queue_depth(cfg); n != 0) {
            q.queue_depth = static_cast<unsigned>(std::min<uint64_t>(n, k_max_depth));
        }
    }
    auto chain = apply_decorators(std::move(made), cfg, q, *_decorator_state);
    if (!chain) {
        return std::unexpected(chain.error());
    }
    _target = std::move(*chain);
    _info.limits = _target->limits();
    _external = _target->takes_external_data();
    if (!_info.limits.zoned) {
        // A zoned device's zones are its geometry: it keeps its size.
        _target->watch_capacity([this](uint64_t bytes) { capacity_changed(bytes); });
    }
    _info.queues = q;

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
            _queues.clear();
            _target->remove_created();
            _target.reset();
            return make_error(r.error().code.value(),
                              fmt::format("queue {}: {}", i, r.error().message));
        }
        _queues.push_back(std::move(queue));
    }
    cfg.set_flag("power", true);
    _powered.store(true, std::memory_order_relaxed);
    return {};
}

void device_impl::undo_create()
{
    _powered.store(false, std::memory_order_relaxed);
    _queues.clear();
    if (_target) {
        _target->remove_created();  // (no queue open, as it asks)
    }
    _target.reset();
    _options.set_flag("power", false);
}

void device_impl::power_off()
{
    _powered.store(false, std::memory_order_relaxed);
    if (_target) {
        _target->set_power(false);  // the cache drops what it holds
    }
    _queues.clear();
    _target.reset();
    _options.set_flag("power", false);
}

int device_impl::execute(bio& b)
{
    if (!powered() || _queues.empty()) {
        return -ENODEV;
    }
    queue_impl& q = caller_queue();
    std::lock_guard guard(q.sync_lock());
    return q.run(b);
}

int device_impl::execute_control(bio& b)
{
    if (!powered() || _queues.empty()) {
        return -ENODEV;
    }
    return _queues.front()->call(b);
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
    if (!powered() || _queues.empty()) {
        return make_error(ENODEV, fmt::format("{}: powered off", _info.name));
    }
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
    if (on == powered()) {
        return {};  // configfs: writing the state it has does nothing
    }
    if (!on) {
        for (const auto& q : _queues) {
            if (q->in_flight() != 0) {
                return make_error(EBUSY, fmt::format("{}: power=0: I/O in flight on queue {}",
                                                     _info.name, q->index()));
            }
        }
        power_off();
        return {};
    }
    if (auto r = power_on(); !r) {
        error e = r.error();
        e.message = fmt::format("{}: power=1: {}", _info.name, e.message);
        return std::unexpected(std::move(e));
    }
    return {};
}

uint64_t device_impl::memory_bytes() const
{
    if (_target) {
        return _target->memory_bytes();
    }
    return _kept ? _kept->memory_bytes() : 0;
}

uint64_t device_impl::add_capacity_listener(capacity_listener listener)
{
    std::lock_guard lock(_capacity_mutex);
    const uint64_t handle = _next_listener++;
    _capacity_listeners.emplace_back(handle, std::move(listener));
    return handle;
}

void device_impl::remove_capacity_listener(uint64_t handle)
{
    std::lock_guard lock(_capacity_mutex);
    std::erase_if(_capacity_listeners, [&](const auto& l) { return l.first == handle; });
}

void device_impl::capacity_changed(uint64_t bytes)
{
    std::lock_guard lock(_capacity_mutex);
    const uint64_t capacity =
        bytes / _info.limits.logical_block_size * _info.limits.logical_block_size;
    if (capacity == 0 || capacity == current_capacity(_info.limits)) {
        // Less than a block is no device; a change within the last block
        // leaves the capacity as it was.
        return;
    }
    set_capacity(_info.limits, capacity);
    _resizes.fetch_add(1, std::memory_order_relaxed);
    for (auto& [handle, listener] : _capacity_listeners) {
        listener(capacity);
    }
}

void device_impl::describe(nlohmann::json& out) const
{
    const block_limits& l = _info.limits;
    out["name"] = _info.name;
    out["type"] = _info.target_type;
    out["power"] = powered() ? 1 : 0;
    out["capacity_bytes"] = current_capacity(l);
    if (const uint64_t n = _resizes.load(std::memory_order_relaxed); n != 0) {
        out["resizes"] = n;
    }
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
    out["io_timeout_ms"] = _info.queues.io_timeout_ms;
    out["memory_bytes"] = memory_bytes();
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
    if (_target) {
        _target->describe(t);
    }
    out["target"] = std::move(t);
    out["options"] = _options.to_args();
    if (!_notes.empty()) {
        out["notes"] = _notes;
    }
}

}  // namespace core
}  // namespace softblk
