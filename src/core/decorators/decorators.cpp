// The decorators' option table, their assembly around a target, and the
// parsers they share (fault specs, bad-block ranges).
#include "core/decorators.hpp"

#include "common.hpp"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <fmt/core.h>
#include <random>

namespace softblk::core {

namespace {

// null_blk clamps mbps to 40 GiB/s (null_validate_conf) and cache_size to
// ULONG_MAX / 1 MiB; these are the only clamps here.
constexpr uint64_t k_max_mbps = 1024 * 40;
constexpr uint64_t k_max_cache_mib = UINT64_MAX / 1024 / 1024;

constexpr option_def k_decorator_options[] = {
    {.name = "mbps",
     .kind = option_kind::integer,
     .default_value = "0",
     .unit = "MiB/s",
     .help = "bandwidth limit of the device's data transfers, shared by its queues; 0: none "
             "(clamped to 40960 as null_blk does)",
     .min = 0,
     .max = k_max_mbps,
     .range = option_range::clamp},
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
     .help = "+start-end marks sectors bad, -start-end clears them (inclusive); may repeat",
     .repeatable = true},
    {.name = "badblocks_once",
     .kind = option_kind::boolean,
     .default_value = "0",
     .unit = "",
     .help = "a bad block fails once, then is cleared"},
    {.name = "badblocks_partial_io",
     .kind = option_kind::boolean,
     .default_value = "0",
     .unit = "",
     .help = "transfer up to the first bad block, then fail with -EIO (bytes done in transferred)"},
    {.name = "timeout",
     .kind = option_kind::text,
     .default_value = "",
     .unit = "",
     .help =
         "fault injection interval,probability,space,times: chosen requests are never completed "
         "(the core's io_timeout ends them with -ETIMEDOUT)",
     .alias = "timeout_inject"},
    {.name = "requeue",
     .kind = option_kind::text,
     .default_value = "",
     .unit = "",
     .help =
         "fault injection interval,probability,space,times: chosen requests are requeued and run "
         "again",
     .alias = "requeue_inject"},
    {.name = "init_hctx",
     .kind = option_kind::text,
     .default_value = "",
     .unit = "",
     .help = "fault injection interval,probability,space,times: opening a chosen queue fails with "
             "-EFAULT",
     .alias = "init_hctx_fault_inject"},
};

result<uint64_t> parse_u64(std::string_view text)
{
    int base = 10;
    if (text.size() > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X')) {
        base = 16;
        text.remove_prefix(2);
    }
    uint64_t v = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v, base);
    if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
        return make_error(EINVAL, "not a number");
    }
    return v;
}

std::string_view trim(std::string_view s)
{
    while (!s.empty() && (s.front() == ' ' || s.front() == '\n' || s.front() == '\t')) {
        s.remove_prefix(1);
    }
    while (!s.empty() && (s.back() == ' ' || s.back() == '\n' || s.back() == '\t')) {
        s.remove_suffix(1);
    }
    return s;
}

}  // namespace

std::span<const option_def> decorator_options()
{
    return k_decorator_options;
}

// ---------------------------------------------------------------- fault specs

result<fault_spec> parse_fault_spec(std::string_view attribute, std::string_view text)
{
    auto bad = [&](std::string_view why) {
        return make_error(EINVAL,
                          fmt::format("{}={}: {}; {} takes interval,probability,space,times "
                                      "(probability 0 to 100 percent, times -1 for no limit), "
                                      "e.g. {}=1,100,0,-1",
                                      attribute, text, why, attribute, attribute));
    };
    std::string_view fields[4];
    std::string_view rest = trim(text);
    for (int i = 0; i < 4; ++i) {
        const size_t comma = rest.find(',');
        if ((comma == std::string_view::npos) != (i == 3)) {
            return bad("expected four comma-separated numbers");
        }
        fields[i] = trim(rest.substr(0, comma));
        rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    }
    fault_spec spec;
    auto interval = parse_u64(fields[0]);
    auto probability = parse_u64(fields[1]);
    auto space = parse_u64(fields[2]);
    if (!interval || !probability || !space) {
        return bad("not a number");
    }
    if (*probability > 100) {
        return bad("probability is a percentage");
    }
    if (*space > static_cast<uint64_t>(INT64_MAX)) {
        return bad("space out of range");
    }
    int64_t times = 0;
    auto [end, ec] =
        std::from_chars(fields[3].data(), fields[3].data() + fields[3].size(), times, 10);
    if (fields[3].empty() || ec != std::errc() || end != fields[3].data() + fields[3].size() ||
        times < -1) {
        return bad("times must be -1 (no limit) or a count");
    }
    spec.interval = *interval;
    spec.probability = *probability;
    spec.space = *space;
    spec.times = times;
    return spec;
}

fault_attr::fault_attr(const fault_spec& spec)
    : _spec(spec),
      _times(spec.times),
      _space(static_cast<int64_t>(spec.space)),
      _random(std::random_device{}() | 1)
{
}

bool fault_attr::should_fail()
{
    // The order of lib/fault-inject.c's should_fail_ex().
    if (_spec.probability == 0) {
        return false;
    }
    if (_times.load(std::memory_order_relaxed) == 0) {
        return false;
    }
    if (_space.load(std::memory_order_relaxed) > 1) {
        _space.fetch_sub(1, std::memory_order_relaxed);
        return false;
    }
    if (_spec.interval > 1) {
        const uint64_t c = _count.fetch_add(1, std::memory_order_relaxed) + 1;
        if (c % _spec.interval != 0) {
            return false;
        }
    }
    if (_spec.probability < 100) {
        // xorshift64: cheap, and good enough to pick requests.
        uint64_t x = _random.load(std::memory_order_relaxed);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        _random.store(x, std::memory_order_relaxed);
        if (_spec.probability <= x % 100) {
            return false;
        }
    }
    int64_t t = _times.load(std::memory_order_relaxed);
    while (t != -1) {
        if (t == 0) {
            return false;  // another queue took the last one
        }
        if (_times.compare_exchange_weak(t, t - 1, std::memory_order_relaxed)) {
            break;
        }
    }
    _failures.fetch_add(1, std::memory_order_relaxed);
    return true;
}

// ---------------------------------------------------------------- bad blocks

result<void> bad_block_table::apply(std::string_view spec)
{
    const std::string_view s = trim(spec);
    auto bad = [&](std::string_view why) -> result<void> {
        return make_error(EINVAL,
                          fmt::format("badblocks={}: {}; badblocks takes +start-end to mark "
                                      "512-byte sectors start..end bad or -start-end to clear "
                                      "them, e.g. badblocks=+8-15",
                                      spec, why));
    };
    if (s.size() < 2 || (s[0] != '+' && s[0] != '-')) {
        return bad("must start with + or -");
    }
    const size_t dash = s.find('-', 1);
    if (dash == std::string_view::npos) {
        return bad("expected start-end");
    }
    auto start = parse_u64(s.substr(1, dash - 1));
    auto end = parse_u64(s.substr(dash + 1));
    if (!start || !end) {
        return bad("not a number");
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

std::vector<std::string> bad_block_table::list() const
{
    std::lock_guard guard(_lock);
    std::vector<std::string> out;
    for (const auto& [a, b] : _ranges) {
        out.push_back(fmt::format("{}-{}", a, b - 1));
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

// ---------------------------------------------------------------- assembly

result<std::unique_ptr<target>> apply_decorators(std::unique_ptr<target> inner,
                                                 const option_set& options,
                                                 const queue_config& queues)
{
    // Validate everything before building anything.
    auto table = std::make_shared<bad_block_table>();
    for (const std::string& spec : options.texts("badblocks")) {
        if (auto r = table->apply(spec); !r) {
            return std::unexpected(r.error());
        }
    }
    std::unique_ptr<fault_attr> faults[3];
    const char* fault_names[3] = {"timeout", "requeue", "init_hctx"};
    for (int i = 0; i < 3; ++i) {
        const std::string& text = options.text(fault_names[i]);
        if (trim(text).empty()) {
            continue;
        }
        auto spec = parse_fault_spec(fault_names[i], text);
        if (!spec) {
            return std::unexpected(spec.error());
        }
        faults[i] = std::make_unique<fault_attr>(*spec);
    }

    // Innermost first: cache, bad blocks, throttle, fault injection.
    const uint64_t cache_mib = options.u64("cache_size");
    if (cache_mib > 0) {
        // A target that keeps its data only with memory_backed=1 (null)
        // has nothing to cache without it; null_blk then sets cache_size
        // to 0, softblk refuses rather than ignore the option.
        const auto defs = options.defs();
        const bool has_memory_backed =
            std::any_of(defs.begin(), defs.end(),
                        [](const option_def& d) { return d.name == "memory_backed"; });
        if (has_memory_backed && !options.flag("memory_backed")) {
            return make_error(
                EINVAL, fmt::format("cache_size={}: the null target's cache needs memory_backed=1 "
                                    "(null_blk sets cache_size to 0 without it)",
                                    cache_mib));
        }
        if (inner->limits().zoned) {
            return make_error(EINVAL,
                              fmt::format("cache_size={}: the write-back cache is not available on "
                                          "zoned devices (null_blk has none there either)",
                                          cache_mib));
        }
        inner = make_write_cache(std::move(inner), cache_mib * 1024 * 1024, options.flag("fua"),
                                 queues);
    }
    // The bad-block decorator stays even with an empty list when the user
    // asked for it, so that the list can be edited at run time later.
    if (!table->empty() || options.given("badblocks")) {
        inner = make_bad_blocks(std::move(inner), table, options.flag("badblocks_once"),
                                options.flag("badblocks_partial_io"), queues);
    }
    if (options.u64("mbps") > 0) {
        inner = make_throttle(std::move(inner), options.u64("mbps"));
    }
    if (faults[0] || faults[1] || faults[2]) {
        inner = make_fault_injection(std::move(inner), std::move(faults[0]), std::move(faults[1]),
                                     std::move(faults[2]));
    }
    return inner;
}

}  // namespace softblk::core
