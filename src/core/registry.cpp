// Registries of target types and export types. Filled by static
// initialisers in the target and front-end folders, read by the core and the
// daemon.
#include <softblk/external_data.hpp>
#include <softblk/frontend.hpp>
#include <softblk/kernel_disk.hpp>
#include <softblk/target.hpp>

#include <algorithm>
#include <cerrno>
#include <mutex>
#include <string>
#include <vector>

#include <fmt/core.h>

namespace softblk {

namespace {

template <class T>
struct registry {
    std::mutex lock;
    std::vector<T> items;  // stable: reserved, never erased
    registry() { items.reserve(64); }

    bool add(const T& item)
    {
        std::lock_guard guard(lock);
        for (const T& it : items) {
            if (it.name == item.name) {
                return false;
            }
        }
        if (items.size() == items.capacity()) {
            return false;
        }
        items.push_back(item);
        return true;
    }
    const T* find(std::string_view name)
    {
        std::lock_guard guard(lock);
        for (const T& it : items) {
            if (it.name == name) {
                return &it;
            }
        }
        return nullptr;
    }
    std::vector<const T*> all()
    {
        std::lock_guard guard(lock);
        std::vector<const T*> out;
        for (const T& it : items) {
            out.push_back(&it);
        }
        std::sort(out.begin(), out.end(), [](const T* a, const T* b) { return a->name < b->name; });
        return out;
    }
};

registry<target_type>& targets()
{
    static registry<target_type> r;
    return r;
}

registry<export_type>& exports()
{
    static registry<export_type> r;
    return r;
}

}  // namespace

bool register_target_type(const target_type& type)
{
    return targets().add(type);
}
const target_type* find_target_type(std::string_view name)
{
    return targets().find(name);
}
std::vector<const target_type*> target_types()
{
    return targets().all();
}

bool register_export_type(const export_type& type)
{
    return exports().add(type);
}
const export_type* find_export_type(std::string_view name)
{
    return exports().find(name);
}
std::vector<const export_type*> export_types()
{
    return exports().all();
}

std::string export_location(const nlohmann::json& description)
{
    if (!description.is_object()) {
        return {};
    }
    for (const char* key : {"block", "loop", "device", "file", "uri", "socket"}) {
        if (auto it = description.find(key); it != description.end() && it->is_string()) {
            return it->get<std::string>();
        }
    }
    return {};
}

bool export_available(const export_type& type)
{
    return !type.available || type.available();
}

result<void> export_carries(const export_type& type, const device& dev,
                            std::span<const std::string> options)
{
    if (dev.limits().zoned && !type.zoned) {
        std::string able;
        for (const export_type* t : export_types()) {
            if (t->zoned) {
                able += able.empty() ? "" : ", ";
                able += t->name;
            }
        }
        return make_error(
            EOPNOTSUPP,
            fmt::format("{}: a zoned device cannot be exported through {}, which has no zoned "
                        "model; {}",
                        dev.name(), type.name,
                        able.empty() ? std::string("no front end built here carries zoned devices "
                                                   "yet; use --export none for in-process use")
                                     : fmt::format("zoned devices are exported by: {} (or "
                                                   "--export none for in-process use)",
                                                   able)));
    }
    if (type.max_block_size) {
        const auto [limit, why] = type.max_block_size(options);
        if (limit != 0 && dev.limits().logical_block_size > limit) {
            return make_error(
                EINVAL, fmt::format("{}: blocksize={}: the {} export carries blocks of at most "
                                    "{} bytes ({}); use blocksize={} or less, or another "
                                    "export",
                                    dev.name(), dev.limits().logical_block_size, type.name, limit,
                                    why, limit));
        }
    }
    return {};
}

namespace {

// The types with a default rank, lowest rank first.
std::vector<const export_type*> default_candidates()
{
    std::vector<const export_type*> out;
    for (const export_type* t : export_types()) {
        if (t->default_rank != 0) {
            out.push_back(t);
        }
    }
    std::stable_sort(out.begin(), out.end(), [](const export_type* a, const export_type* b) {
        return a->default_rank < b->default_rank;
    });
    return out;
}

}  // namespace

result<const export_type*> choose_default_export(const device& dev)
{
    std::string why;
    for (const export_type* t : default_candidates()) {
        std::string reason;
        if (!export_available(*t)) {
            reason = "not available on this machine";
        } else if (auto carries = export_carries(*t, dev, {}); !carries) {
            if (dev.limits().zoned && !t->zoned) {
                reason = "no zoned model";
            } else {
                reason = carries.error().message;
            }
        } else {
            return t;
        }
        why += fmt::format("{}{}: {}", why.empty() ? "" : "; ", t->name, reason);
    }
    return make_error(
        ENODEV,
        fmt::format("{}: no default export can carry this {}device ({}); name one with "
                    "--export (`softblk features` lists them), or --export none",
                    dev.name(), dev.limits().zoned ? "zoned " : "",
                    why.empty() ? std::string("no front end built here is a default") : why));
}

const export_type* default_export_for(bool zoned)
{
    for (const export_type* t : default_candidates()) {
        if (export_available(*t) && (t->zoned || !zoned)) {
            return t;
        }
    }
    return nullptr;
}

result<std::unique_ptr<device_export>> start_export(const export_type& type, device& dev,
                                                    const export_context& ctx,
                                                    std::span<const std::string> options)
{
    if (auto carries = export_carries(type, dev, options); !carries) {
        return std::unexpected(carries.error());
    }
    auto started = type.start(dev, ctx, options);
    if (!started) {
        return started;
    }
    return apply_disk_choices(dev, std::move(*started));
}

external_data_support target::takes_external_data() const
{
    return {};
}

result<void> target::apply_option(const option_def& def, const option_set&)
{
    return make_error(EOPNOTSUPP,
                      fmt::format("{}: this target cannot change it while powered on", def.name));
}

result<void> target::set_zone_condition(uint64_t offset, zone_condition condition)
{
    return make_error(EOPNOTSUPP,
                      fmt::format("{}: this device has no zones that can be made {} (null_blk's "
                                  "zone_readonly/zone_offline need a zoned null device)",
                                  offset >> 9, to_string(condition)));
}

int target::map_extents(uint64_t offset, uint64_t length, std::vector<extent>& out)
{
    const uint64_t capacity = limits().capacity_bytes;
    if (offset >= capacity) {
        return 0;
    }
    length = std::min(length, capacity - offset);
    if (length > 0) {
        out.push_back(extent{offset, length, true, false});
    }
    return 0;
}

const char* to_string(io_op op)
{
    switch (op) {
    case io_op::read:
        return "read";
    case io_op::write:
        return "write";
    case io_op::flush:
        return "flush";
    case io_op::discard:
        return "discard";
    case io_op::write_zeroes:
        return "write_zeroes";
    case io_op::zone_open:
        return "zone_open";
    case io_op::zone_close:
        return "zone_close";
    case io_op::zone_finish:
        return "zone_finish";
    case io_op::zone_reset:
        return "zone_reset";
    case io_op::zone_reset_all:
        return "zone_reset_all";
    case io_op::zone_append:
        return "zone_append";
    case io_op::report_zones:
        return "report_zones";
    case io_op::report_extents:
        return "report_extents";
    }
    return "unknown";
}

const char* to_string(zone_type type)
{
    switch (type) {
    case zone_type::conventional:
        return "conventional";
    case zone_type::sequential_write_required:
        return "seq-write-required";
    case zone_type::sequential_write_preferred:
        return "seq-write-preferred";
    }
    return "unknown";
}

const char* to_string(zone_condition condition)
{
    switch (condition) {
    case zone_condition::not_write_pointer:
        return "not-write-pointer";
    case zone_condition::empty:
        return "empty";
    case zone_condition::implicit_open:
        return "implicit-open";
    case zone_condition::explicit_open:
        return "explicit-open";
    case zone_condition::closed:
        return "closed";
    case zone_condition::read_only:
        return "read-only";
    case zone_condition::full:
        return "full";
    case zone_condition::offline:
        return "offline";
    }
    return "unknown";
}

int answer_report_extents(target& t, io_request& r)
{
    // The target builds its map in a vector; keep one per thread so that
    // steady state allocates nothing.
    thread_local std::vector<extent> map;
    map.clear();
    if (const int rc = t.map_extents(r.offset, r.length, map); rc < 0) {
        return rc;
    }
    auto* out = static_cast<extent*>(r.buffer);
    uint32_t n = 0;
    for (const extent& e : map) {
        if (n == r.report_capacity) {
            break;
        }
        out[n++] = e;
    }
    if (n == 0) {
        return -EIO;  // a map with nothing for a range inside the capacity
    }
    return static_cast<int>(n);
}

}  // namespace softblk
