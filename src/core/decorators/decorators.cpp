// The decorators' option table, their assembly around a target, and the
// parsers they share (fault specs, bad-block ranges).
#include "core/decorators.hpp"

#include "common.hpp"

#include <algorithm>
#include <cerrno>
#include <cctype>
#include <charconv>
#include <fmt/core.h>
#include <random>

namespace softblk::core {

namespace {

// null_blk clamps mbps to 40 GiB/s (null_validate_conf) and cache_size to
// ULONG_MAX / 1 MiB; these are the only clamps here.
constexpr uint64_t k_max_mbps = 1024 * 40;
constexpr uint64_t k_max_cache_mib = UINT64_MAX / 1024 / 1024;

// One configfs directory of fault_attr fields per kind, as null_blk makes
// them with CONFIG_BLK_DEV_NULL_BLK_FAULT_INJECTION (lib/fault-inject.c):
// every field is live. Defaults are FAULT_ATTR_INITIALIZER's.
#define SOFTBLK_FAULT_FIELDS(DIR, WHAT)                                                     \
    {.name = DIR "/probability",                                                            \
     .kind = option_kind::integer,                                                          \
     .default_value = "0",                                                                  \
     .unit = "%",                                                                           \
     .help = WHAT ": percent of eligible requests that fail (0 never, 100 or more always)", \
     .update = option_update::live},                                                        \
        {.name = DIR "/interval",                                                           \
         .kind = option_kind::integer,                                                      \
         .default_value = "1",                                                              \
         .unit = "",                                                                        \
         .help = WHAT ": fail at most every interval-th eligible request",                  \
         .update = option_update::live},                                                    \
        {.name = DIR "/times",                                                              \
         .kind = option_kind::signed_integer,                                               \
         .default_value = "1",                                                              \
         .unit = "",                                                                        \
         .help = WHAT ": failures left (reads count down); -1: no limit",                   \
         .bits = 32,                                                                        \
         .update = option_update::live},                                                    \
        {.name = DIR "/space",                                                              \
         .kind = option_kind::signed_integer,                                               \
         .default_value = "0",                                                              \
         .unit = "",                                                                        \
         .help = WHAT ": while above 1, a request passes and takes 1 from it",              \
         .bits = 32,                                                                        \
         .update = option_update::live},                                                    \
        {.name = DIR "/verbose",                                                            \
         .kind = option_kind::integer,                                                      \
         .default_value = "2",                                                              \
         .unit = "",                                                                        \
         .help = WHAT                                                                       \
         ": the kernel logs each failure; softblk keeps the value and logs none "           \
         "(it counts failures in `list`)",                                                  \
         .update = option_update::live},                                                    \
        {.name = DIR "/verbose_ratelimit_interval_ms",                                      \
         .kind = option_kind::integer,                                                      \
         .default_value = "0",                                                              \
         .unit = "",                                                                        \
         .help = WHAT ": rate limit of the kernel's failure log; kept, no effect (no log)", \
         .bits = 32,                                                                        \
         .update = option_update::live},                                                    \
        {.name = DIR "/verbose_ratelimit_burst",                                            \
         .kind = option_kind::integer,                                                      \
         .default_value = "10",                                                             \
         .unit = "",                                                                        \
         .help = WHAT ": burst of the kernel's failure log; kept, no effect (no log)",      \
         .bits = 32,                                                                        \
         .update = option_update::live},                                                    \
    {                                                                                       \
        .name = DIR "/task-filter", .kind = option_kind::boolean, .default_value = "0",     \
        .unit = "",                                                                         \
        .help = WHAT                                                                        \
            ": fail only tasks marked make-it-fail; softblk's queue threads never are, "    \
            "so 1 stops the failures",                                                      \
        .update = option_update::live                                                       \
    }

constexpr const char* k_fault_dirs[3] = {"timeout_inject", "requeue_inject",
                                         "init_hctx_fault_inject"};
constexpr const char* k_fault_params[3] = {"timeout", "requeue", "init_hctx"};

constexpr option_def k_decorator_options[] = {
    {.name = "mbps",
     .kind = option_kind::integer,
     .default_value = "0",
     .unit = "MiB/s",
     .help = "bandwidth limit of the device's transfers (discard included), shared by its "
             "queues; 0: none (clamped to 40960 at power on, as null_blk does)",
     .min = 0,
     .max = k_max_mbps,
     .range = option_range::clamp,
     .bits = 32},
    {.name = "cache_size",
     .kind = option_kind::integer,
     .default_value = "0",
     .unit = "MiB",
     .help =
         "volatile write-back cache in front of the target; written back when full or on FLUSH, "
         "lost on power-off; 0: none",
     .min = 0,
     .max = k_max_cache_mib,
     .range = option_range::clamp},
    {.name = "fua",
     .kind = option_kind::boolean,
     .default_value = "1",
     .unit = "",
     .help = "with cache_size: advertise FUA (FUA writes bypass the cache); 0: no FUA support"},
    {.name = "badblocks",
     .kind = option_kind::text,
     .default_value = "",
     .unit = "512-byte sectors",
     .help = "+start-end marks sectors bad, -start-end clears them (inclusive); may repeat; "
             "changes at any time",
     .repeatable = true,
     .update = option_update::live},
    {.name = "badblocks_once",
     .kind = option_kind::boolean,
     .default_value = "0",
     .unit = "",
     .help = "a bad block fails once, then is cleared (newer kernels; not in 6.12)"},
    {.name = "badblocks_partial_io",
     .kind = option_kind::boolean,
     .default_value = "0",
     .unit = "",
     .help = "transfer up to the first bad block, then fail with -EIO (bytes done in "
             "transferred; newer kernels, not in 6.12)"},
    {.name = "timeout",
     .kind = option_kind::text,
     .default_value = "",
     .unit = "",
     .help = "module parameter interval,probability,space,times: sets timeout_inject/*; chosen "
             "requests are never completed (the core's io_timeout ends them with -ETIMEDOUT)",
     .alias = "timeout_inject",
     .update = option_update::creation},
    {.name = "requeue",
     .kind = option_kind::text,
     .default_value = "",
     .unit = "",
     .help = "module parameter interval,probability,space,times: sets requeue_inject/*; chosen "
             "requests are requeued and run again",
     .alias = "requeue_inject",
     .update = option_update::creation},
    {.name = "init_hctx",
     .kind = option_kind::text,
     .default_value = "",
     .unit = "",
     .help = "module parameter interval,probability,space,times: sets init_hctx_fault_inject/*; "
             "opening a chosen queue fails with -EFAULT",
     .alias = "init_hctx_fault_inject",
     .update = option_update::creation},
    SOFTBLK_FAULT_FIELDS("timeout_inject", "timeout injection"),
    SOFTBLK_FAULT_FIELDS("requeue_inject", "requeue injection"),
    SOFTBLK_FAULT_FIELDS("init_hctx_fault_inject", "queue-init fault injection"),
};

#undef SOFTBLK_FAULT_FIELDS

std::string_view trim(std::string_view s)
{
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front())) != 0) {
        s.remove_prefix(1);
    }
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back())) != 0) {
        s.remove_suffix(1);
    }
    return s;
}

// "timeout_inject/probability" -> kind 0, field probability; false if
// `name` is not a fault field.
bool fault_field_of(std::string_view name, unsigned& kind, fault_attr::field& f)
{
    const size_t slash = name.find('/');
    if (slash == std::string_view::npos) {
        return false;
    }
    for (unsigned k = 0; k < 3; ++k) {
        if (name.substr(0, slash) != k_fault_dirs[k]) {
            continue;
        }
        for (unsigned i = 0; i < fault_attr::k_field_count; ++i) {
            if (name.substr(slash + 1) == fault_attr::name(static_cast<fault_attr::field>(i))) {
                kind = k;
                f = static_cast<fault_attr::field>(i);
                return true;
            }
        }
    }
    return false;
}

}  // namespace

std::span<const option_def> decorator_options()
{
    return k_decorator_options;
}

// ---------------------------------------------------------------- faults

const char* fault_attr::name(field f)
{
    static constexpr const char* names[k_field_count] = {"probability",
                                                         "interval",
                                                         "times",
                                                         "space",
                                                         "verbose",
                                                         "verbose_ratelimit_interval_ms",
                                                         "verbose_ratelimit_burst",
                                                         "task-filter"};
    return names[f];
}

fault_attr::fault_attr() : _random(std::random_device{}() | 1)
{
    // FAULT_ATTR_INITIALIZER (include/linux/fault-inject.h).
    const int64_t defaults[k_field_count] = {0, 1, 1, 0, 2, 0, 10, 0};
    for (unsigned i = 0; i < k_field_count; ++i) {
        _fields[i].store(defaults[i], std::memory_order_relaxed);
    }
}

result<void> fault_attr::setup(std::string_view attribute, std::string_view text)
{
    auto bad = [&](std::string_view why) {
        return make_error(EINVAL,
                          fmt::format("{}={}: {}; {} takes interval,probability,space,times "
                                      "(decimal; probability in percent, times -1 for no limit), "
                                      "e.g. {}=1,100,0,-1",
                                      attribute, text, why, attribute, attribute));
    };
    // sscanf("%lu,%lu,%d,%d"): four decimal fields; what follows is not read.
    int64_t values[4] = {};
    std::string_view rest = text;
    for (int i = 0; i < 4; ++i) {
        while (!rest.empty() && std::isspace(static_cast<unsigned char>(rest.front())) != 0) {
            rest.remove_prefix(1);
        }
        const bool is_signed = i >= 2;
        const char* first = rest.data();
        const char* last = rest.data() + rest.size();
        std::from_chars_result r{};
        if (is_signed) {
            int32_t v = 0;
            r = std::from_chars(first, last, v, 10);
            values[i] = v;
        } else {
            if (first != last && *first == '-') {
                return bad("interval and probability are unsigned");
            }
            uint64_t v = 0;
            r = std::from_chars(first, last, v, 10);
            values[i] = static_cast<int64_t>(std::min<uint64_t>(v, INT64_MAX));
        }
        if (r.ec != std::errc() || r.ptr == first) {
            return bad("expected four comma-separated numbers");
        }
        rest = std::string_view(r.ptr, static_cast<size_t>(last - r.ptr));
        if (i < 3) {
            if (rest.empty() || rest.front() != ',') {
                return bad("expected four comma-separated numbers");
            }
            rest.remove_prefix(1);
        }
    }
    set(interval, values[0]);
    set(probability, values[1]);
    set(space, values[2]);
    set(times, values[3]);
    return {};
}

bool fault_attr::should_fail()
{
    // The order of lib/fault-inject.c's should_fail_ex() (6.12).
    const int64_t p = get(probability);
    if (p == 0) {
        return false;
    }
    if (get(task_filter) != 0) {
        return false;  // no softblk thread is marked make-it-fail
    }
    if (_fields[times].load(std::memory_order_relaxed) == 0) {
        return false;
    }
    if (_fields[space].load(std::memory_order_relaxed) > 1) {
        _fields[space].fetch_sub(1, std::memory_order_relaxed);
        return false;
    }
    const uint64_t every = static_cast<uint64_t>(get(interval));
    if (every > 1) {
        const uint64_t c = _count.fetch_add(1, std::memory_order_relaxed) + 1;
        if (c % every != 0) {
            return false;
        }
    }
    if (static_cast<uint64_t>(p) < 100) {
        // xorshift64: cheap, and good enough to pick requests.
        uint64_t x = _random.load(std::memory_order_relaxed);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        _random.store(x, std::memory_order_relaxed);
        if (static_cast<uint64_t>(p) <= x % 100) {
            return false;
        }
    }
    // atomic_dec_not_zero unless -1.
    int64_t t = _fields[times].load(std::memory_order_relaxed);
    while (t != -1) {
        if (t == 0) {
            return false;  // another queue took the last one
        }
        if (_fields[times].compare_exchange_weak(t, t - 1, std::memory_order_relaxed)) {
            break;
        }
    }
    _failures.fetch_add(1, std::memory_order_relaxed);
    return true;
}

// ---------------------------------------------------------------- bad blocks

result<void> bad_block_table::apply(std::string_view spec)
{
    // nullb_device_badblocks_store: strstrip, '+' or '-', then start and
    // end split at the first '-' after the sign, each kstrtoull base 0.
    const std::string_view s = trim(spec);
    auto bad = [&](std::string_view why) -> result<void> {
        return make_error(EINVAL,
                          fmt::format("badblocks={}: {}; badblocks takes +start-end to mark "
                                      "512-byte sectors start..end bad or -start-end to clear "
                                      "them, e.g. badblocks=+8-15",
                                      trim(spec), why));
    };
    if (s.empty() || (s[0] != '+' && s[0] != '-')) {
        return bad("must start with + or -");
    }
    const size_t dash = s.find('-', 1);
    if (dash == std::string_view::npos) {
        return bad("expected start-end");
    }
    auto start = parse_kernel_unsigned(s.substr(1, dash - 1));
    auto end = parse_kernel_unsigned(s.substr(dash + 1));
    if (!start || !end) {
        // kstrtoull's own errno: EINVAL malformed, ERANGE above 64 bits.
        const int code = (!start ? start.error() : end.error()).code.value();
        return make_error(
            code,
            fmt::format("badblocks={}: {}; badblocks takes +start-end with "
                        "sector numbers of at most 64 bits, e.g. "
                        "badblocks=+8-15",
                        trim(spec), code == ERANGE ? "a number above 64 bits" : "not a number"));
    }
    if (*start > *end) {
        return bad("start is after end");
    }
    if (*end == UINT64_MAX) {
        return bad("end out of range");
    }
    if (s[0] == '+') {
        set(*start, *end - *start + 1);
    } else {
        clear(*start, *end - *start + 1);
    }
    return {};
}

void bad_block_table::set(uint64_t start, uint64_t count)
{
    std::lock_guard guard(_lock);
    uint64_t end = start + count;
    // Merge with every range that overlaps or touches [start, end).
    auto it = _ranges.upper_bound(start);
    if (it != _ranges.begin() && std::prev(it)->second >= start) {
        --it;
    }
    while (it != _ranges.end() && it->first <= end) {
        start = std::min(start, it->first);
        end = std::max(end, it->second);
        it = _ranges.erase(it);
    }
    _ranges.emplace(start, end);
    _ranges_count.store(_ranges.size(), std::memory_order_release);
}

void bad_block_table::clear(uint64_t start, uint64_t count)
{
    std::lock_guard guard(_lock);
    const uint64_t end = start + count;
    auto it = _ranges.upper_bound(start);
    if (it != _ranges.begin() && std::prev(it)->second > start) {
        --it;
    }
    while (it != _ranges.end() && it->first < end) {
        const uint64_t a = it->first;
        const uint64_t b = it->second;
        it = _ranges.erase(it);
        if (a < start) {
            _ranges.emplace(a, start);
        }
        if (b > end) {
            it = _ranges.emplace(end, b).first;
            ++it;
        }
    }
    _ranges_count.store(_ranges.size(), std::memory_order_release);
}

bool bad_block_table::check(uint64_t sector, uint64_t count, uint64_t& first_bad,
                            uint64_t& bad_count) const
{
    std::lock_guard guard(_lock);
    const uint64_t end = sector + count;
    auto it = _ranges.upper_bound(sector);
    if (it != _ranges.begin() && std::prev(it)->second > sector) {
        --it;
    }
    if (it == _ranges.end() || it->first >= end) {
        return false;
    }
    // The record (of at most k_max_record sectors, counted from the range's
    // start) that holds the first bad sector of the request.
    const uint64_t bad = std::max(sector, it->first);
    const uint64_t record = it->first + (bad - it->first) / k_max_record * k_max_record;
    first_bad = record;
    bad_count = std::min(k_max_record, it->second - record);
    return true;
}

std::vector<std::string> bad_block_table::list(size_t max_ranges) const
{
    std::lock_guard guard(_lock);
    std::vector<std::string> out;
    for (const auto& [a, b] : _ranges) {
        if (out.size() == max_ranges) {
            break;
        }
        out.push_back(fmt::format("{}-{}", a, b - 1));
    }
    return out;
}

size_t bad_block_table::ranges() const
{
    return _ranges_count.load(std::memory_order_acquire);
}

std::vector<std::string> bad_block_table::canonical() const
{
    std::vector<std::string> out = list();
    for (std::string& r : out) {
        r.insert(r.begin(), '+');
    }
    return out;
}

std::string bad_block_table::show() const
{
    std::lock_guard guard(_lock);
    std::string out;
    // One page of whole lines, as badblocks_show fills the page configfs
    // gives it; a merged range may stand for billions of records, so the
    // walk stops with the page, never materialising more.
    for (const auto& [a, b] : _ranges) {
        for (uint64_t s = a; s < b; s += k_max_record) {
            const std::string line = fmt::format("{} {}\n", s, std::min(k_max_record, b - s));
            if (out.size() + line.size() > k_show_bytes) {
                return out;
            }
            out += line;
        }
    }
    return out;
}

// ---------------------------------------------------------------- extents

void overlay_allocated(std::vector<extent>& extents,
                       const std::vector<std::pair<uint64_t, uint64_t>>& ranges)
{
    if (ranges.empty() || extents.empty()) {
        return;
    }
    std::vector<extent> out;
    out.reserve(extents.size() + 2 * ranges.size());
    auto emit = [&](uint64_t from, uint64_t to, bool allocated, bool zero) {
        if (from >= to) {
            return;
        }
        if (!out.empty() && out.back().allocated == allocated && out.back().zero == zero &&
            out.back().offset + out.back().length == from) {
            out.back().length += to - from;
            return;
        }
        out.push_back(extent{from, to - from, allocated, zero});
    };
    size_t r = 0;
    for (const extent& e : extents) {
        uint64_t pos = e.offset;
        const uint64_t end = e.offset + e.length;
        while (pos < end) {
            while (r < ranges.size() && ranges[r].second <= pos) {
                ++r;
            }
            if (r == ranges.size() || ranges[r].first >= end) {
                emit(pos, end, e.allocated, e.zero);
                pos = end;
            } else if (ranges[r].first > pos) {
                emit(pos, ranges[r].first, e.allocated, e.zero);
                pos = ranges[r].first;
            } else {
                const uint64_t to = std::min(end, ranges[r].second);
                emit(pos, to, true, false);
                pos = to;
            }
        }
    }
    extents = std::move(out);
}

// ---------------------------------------------------------------- state

result<std::shared_ptr<decorator_state>> make_decorator_state(const option_set& options)
{
    auto state = std::make_shared<decorator_state>();
    state->bad_blocks = std::make_shared<bad_block_table>();
    for (const std::string& spec : options.texts("badblocks")) {
        if (auto r = state->bad_blocks->apply(spec); !r) {
            return std::unexpected(r.error());
        }
    }
    for (unsigned k = 0; k < 3; ++k) {
        auto attr = std::make_shared<fault_attr>();
        // The module parameter first, then the fields given (configfs
        // writes after the module was loaded).
        const std::string& param = options.text(k_fault_params[k]);
        if (!trim(param).empty()) {
            if (auto r = attr->setup(k_fault_params[k], param); !r) {
                return std::unexpected(r.error());
            }
        }
        for (unsigned i = 0; i < fault_attr::k_field_count; ++i) {
            const auto f = static_cast<fault_attr::field>(i);
            const std::string key = fmt::format("{}/{}", k_fault_dirs[k], fault_attr::name(f));
            if (options.given(key)) {
                attr->set(f, options.i64(key));
            }
        }
        state->faults[k] = std::move(attr);
    }
    return state;
}

result<bool> apply_decorator_option(decorator_state& state, const option_def& def,
                                    option_set& options)
{
    if (def.name == "badblocks") {
        // The value just written is the last of the list.
        const auto& all = options.texts("badblocks");
        const std::string spec = all.empty() ? std::string() : all.back();
        if (auto r = state.bad_blocks->apply(spec); !r) {
            return std::unexpected(r.error());
        }
        options.set_texts("badblocks", state.bad_blocks->canonical());
        return true;
    }
    unsigned kind = 0;
    fault_attr::field f{};
    if (!fault_field_of(def.name, kind, f)) {
        return false;
    }
    state.faults[kind]->set(f, options.i64(def.name));
    return true;
}

std::optional<std::string> decorator_option_text(const decorator_state& state,
                                                 std::string_view name)
{
    if (name == "badblocks") {
        return state.bad_blocks->show();
    }
    unsigned kind = 0;
    fault_attr::field f{};
    if (fault_field_of(name, kind, f)) {
        // The state is what counts: the module parameter set it, failures
        // count times and space down. times and space are atomic_t
        // (signed), the others unsigned as the kernel shows them.
        const int64_t v = state.faults[kind]->get(f);
        if (f == fault_attr::times || f == fault_attr::space) {
            return fmt::format("{}\n", v);
        }
        return fmt::format("{}\n", static_cast<uint64_t>(v));
    }
    return std::nullopt;
}

// ---------------------------------------------------------------- assembly

result<std::unique_ptr<target>> apply_decorators(std::unique_ptr<target> inner,
                                                 const option_set& options,
                                                 const queue_config& queues,
                                                 const decorator_state& state)
{
    // Innermost first: cache, bad blocks, throttle, fault injection.
    const uint64_t cache_mib = options.u64("cache_size");
    if (cache_mib > 0) {
        if (inner->limits().zoned) {
            inner->remove_created();
            return make_error(EINVAL,
                              fmt::format("cache_size={}: the write-back cache is not available on "
                                          "zoned devices (null_blk has none there either)",
                                          cache_mib));
        }
        inner = make_write_cache(std::move(inner), cache_mib * 1024 * 1024, options.flag("fua"),
                                 queues);
    }
    // Bad blocks and fault injection are always there: their state changes
    // while the device runs (an empty list and probability 0 cost a check).
    inner = make_bad_blocks(std::move(inner), state.bad_blocks, options.flag("badblocks_once"),
                            options.flag("badblocks_partial_io"), queues);
    if (options.u64("mbps") > 0) {
        inner = make_throttle(std::move(inner), options.u64("mbps"));
    }
    inner =
        make_fault_injection(std::move(inner), state.faults[0], state.faults[1], state.faults[2]);
    return inner;
}

}  // namespace softblk::core
