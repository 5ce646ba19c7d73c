// Registries of target types and export types. Filled by static
// initialisers in the target and front-end folders, read by the core and the
// daemon.
#include <softblk/frontend.hpp>
#include <softblk/target.hpp>

#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

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
    }
    return "unknown";
}

}  // namespace softblk
