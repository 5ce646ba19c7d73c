// libsoftblk's control path: devices (create, power, options,
// properties), their queue handles, and exports started by front-end name
// through the export-type registry. Every function catches what the C++
// API throws and returns -errno with the thread's message set.
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <utility>

#include <nlohmann/json.hpp>

#include <softblk/target.hpp>

#include "capi.hpp"

namespace softblk::capi {

std::vector<std::string> split_options(const char* options)
{
    std::vector<std::string> out;
    if (options == nullptr) {
        return out;
    }
    const char* p = options;
    while (*p != '\0') {
        while (*p != '\0' && std::isspace(static_cast<unsigned char>(*p))) {
            ++p;
        }
        const char* start = p;
        while (*p != '\0' && !std::isspace(static_cast<unsigned char>(*p))) {
            ++p;
        }
        if (p != start) {
            out.emplace_back(start, p);
        }
    }
    return out;
}

unsigned requests_in_flight(const struct softblk_device& dev)
{
    unsigned n = 0;
    for (const auto& q : dev.queues) {
        n += q->submitted + q->done;
    }
    return n;
}

void drain_queues(struct softblk_device& dev)
{
    for (const auto& q : dev.queues) {
        while (q->submitted > 0) {
            q->queue->wait(q->submitted, -1);
        }
    }
}

void sync_queues(struct softblk_device& dev, bool remade)
{
    const unsigned count = dev.device->powered() ? dev.device->queue_count() : 0;
    bool same = !remade && dev.queues.size() == count;
    for (unsigned i = 0; same && i < count; ++i) {
        same = dev.queues[i]->queue == &dev.device->queue(i);
    }
    if (same) {
        return;
    }
    dev.queues.clear();
    for (unsigned i = 0; i < count; ++i) {
        auto q = std::make_unique<softblk_queue>();
        q->queue = &dev.device->queue(i);
        q->dev = &dev;
        // As many as the queue has tags: a bio larger than the device's
        // limits takes several, and waits in the core for them.
        q->slot_count = std::max(1u, q->queue->depth());
        q->slots = std::make_unique<request_slot[]>(q->slot_count);
        for (unsigned s = q->slot_count; s-- > 0;) {
            q->slots[s].queue = q.get();
            q->slots[s].next = q->free_list;
            q->free_list = &q->slots[s];
        }
        dev.queues.push_back(std::move(q));
    }
}

namespace {

std::string type_names(bool exports)
{
    std::string out;
    if (exports) {
        for (const export_type* t : export_types()) {
            out += out.empty() ? "" : " ";
            out += t->name;
        }
    } else {
        for (const target_type* t : target_types()) {
            out += out.empty() ? "" : " ";
            out += t->name;
        }
    }
    return out;
}

int no_device(const char* function)
{
    return fail(EINVAL, "%s: no device (NULL)", function);
}

int create(const char* name, const char* type, std::vector<std::string> options,
           struct softblk_device** devp)
{
    if (devp == nullptr) {
        return fail(EINVAL, "softblk_create: devp is NULL");
    }
    *devp = nullptr;
    if (name == nullptr || type == nullptr) {
        return fail(EINVAL, "softblk_create: the device's name and target type are required");
    }
    auto made = device::create(name, type, options);
    if (!made) {
        return fail(made.error());
    }
    auto dev = std::make_unique<struct softblk_device>();
    dev->device = std::move(*made);
    sync_queues(*dev);
    *devp = dev.release();
    return 0;
}

int set_power(struct softblk_device* dev, bool on, const char* function)
{
    if (dev == nullptr) {
        return no_device(function);
    }
    if (!dev->exports.empty()) {
        return fail(EBUSY, "%s: %s: an export runs on the device; stop it first", function,
                    dev->device->name().c_str());
    }
    if (const unsigned n = requests_in_flight(*dev); n > 0 && on != dev->device->powered()) {
        return fail(EBUSY, "%s: %s: %u requests not reaped; reap them with softblk_queue_do_io",
                    function, dev->device->name().c_str(), n);
    }
    const bool was_on = dev->device->powered();
    auto r = dev->device->set_power(on);
    sync_queues(*dev, dev->device->powered() != was_on);
    return r ? 0 : fail(r.error());
}

// The properties of softblk_get_uint64 and softblk_get_bool.
struct u64_property {
    const char* name;
    uint64_t (*get)(const device& d);
};

const u64_property k_u64_properties[] = {
    {"capacity", [](const device& d) { return current_capacity(d.limits()); }},
    {"logical_block_size",
     [](const device& d) -> uint64_t { return d.limits().logical_block_size; }},
    {"physical_block_size",
     [](const device& d) -> uint64_t { return d.limits().physical_block_size; }},
    {"max_transfer", [](const device& d) -> uint64_t { return d.limits().max_transfer_bytes; }},
    {"max_discard", [](const device& d) -> uint64_t { return d.limits().max_discard_bytes; }},
    {"max_write_zeroes",
     [](const device& d) -> uint64_t { return d.limits().max_write_zeroes_bytes; }},
    {"max_zone_append",
     [](const device& d) -> uint64_t { return d.limits().max_zone_append_bytes; }},
    {"zone_size", [](const device& d) { return d.limits().zone_size_bytes; }},
    {"zone_capacity", [](const device& d) { return d.limits().zone_capacity_bytes; }},
    {"nr_zones", [](const device& d) { return zone_count(d.limits()); }},
    {"conventional_zones",
     [](const device& d) -> uint64_t { return d.limits().conventional_zones; }},
    {"max_open_zones", [](const device& d) -> uint64_t { return d.limits().max_open_zones; }},
    {"max_active_zones", [](const device& d) -> uint64_t { return d.limits().max_active_zones; }},
    {"num_queues", [](const device& d) -> uint64_t { return d.powered() ? d.queue_count() : 0; }},
    {"num_submit_queues",
     [](const device& d) -> uint64_t { return d.info().queues.submit_queues; }},
    {"num_poll_queues", [](const device& d) -> uint64_t { return d.info().queues.poll_queues; }},
    {"queue_depth", [](const device& d) -> uint64_t { return d.info().queues.queue_depth; }},
    {"memory_bytes", [](const device& d) { return d.memory_bytes(); }},
};

struct bool_property {
    const char* name;
    bool (*get)(const device& d);
};

const bool_property k_bool_properties[] = {
    {"zoned", [](const device& d) { return d.limits().zoned; }},
    {"read_only", [](const device& d) { return d.limits().read_only; }},
    {"volatile_write_cache", [](const device& d) { return d.limits().volatile_write_cache; }},
    {"fua", [](const device& d) { return d.limits().fua; }},
    {"rotational", [](const device& d) { return d.limits().rotational; }},
    {"powered", [](const device& d) { return d.powered(); }},
};

template <class Table>
std::string property_names(const Table& table)
{
    std::string out;
    for (const auto& p : table) {
        out += out.empty() ? "" : " ";
        out += p.name;
    }
    return out;
}

template <class Table>
const auto* find_property(const Table& table, const char* name)
{
    for (const auto& p : table) {
        if (std::strcmp(p.name, name) == 0) {
            return &p;
        }
    }
    return static_cast<decltype(&table[0])>(nullptr);
}

int start_export(struct softblk_device* dev, const char* type, const char* options,
                 const char* run_dir, struct softblk_export** expp)
{
    if (expp == nullptr) {
        return fail(EINVAL, "softblk_export_start: expp is NULL");
    }
    *expp = nullptr;
    if (dev == nullptr) {
        return no_device("softblk_export_start");
    }
    if (type == nullptr) {
        return fail(EINVAL, "softblk_export_start: no export type (known: %s)",
                    type_names(true).c_str());
    }
    const export_type* et = find_export_type(type);
    if (et == nullptr) {
        return fail(ENOENT, "%s: unknown export type (known: %s)", type, type_names(true).c_str());
    }
    if (run_dir == nullptr || run_dir[0] != '/') {
        return fail(EINVAL,
                    "%s: run_dir must be an absolute path to a directory of the program's own, "
                    "for the export's mount points and sockets",
                    type);
    }
    if (const unsigned n = requests_in_flight(*dev); n > 0) {
        return fail(EBUSY,
                    "%s: %u requests on the device's queues are not reaped; an export drives "
                    "the queues itself, so reap them with softblk_queue_do_io first",
                    type, n);
    }
    const export_context ctx{.run_dir = run_dir, .privileged = ::geteuid() == 0};
    const auto args = split_options(options);
    auto started = softblk::start_export(*et, *dev->device, ctx, args);
    if (!started) {
        return fail(started.error());
    }
    auto exp = std::make_unique<softblk_export>();
    exp->dev = dev;
    exp->running = std::move(*started);
    *expp = exp.get();
    dev->exports.push_back(std::move(exp));
    return 0;
}

int stop_export(struct softblk_export** expp)
{
    if (expp == nullptr || *expp == nullptr) {
        return fail(EINVAL, "softblk_export_stop: no export (NULL)");
    }
    softblk_export* exp = *expp;
    if (auto r = exp->running->stop(); !r) {
        return fail(r.error());
    }
    auto& list = exp->dev->exports;
    std::erase_if(list, [exp](const auto& e) { return e.get() == exp; });
    *expp = nullptr;
    return 0;
}

}  // namespace
}  // namespace softblk::capi

using softblk::capi::copy_out;
using softblk::capi::fail;
using softblk::capi::guarded;

extern "C" {

int softblk_create(const char* name, const char* type, const char* options,
                   struct softblk_device** devp)
{
    return guarded("softblk_create", [&] {
        return softblk::capi::create(name, type, softblk::capi::split_options(options), devp);
    });
}

int softblk_create_argv(const char* name, const char* type, const char* const* options,
                        size_t count, struct softblk_device** devp)
{
    return guarded("softblk_create_argv", [&] {
        if (options == nullptr && count > 0) {
            return fail(EINVAL, "softblk_create_argv: %zu options but no array", count);
        }
        std::vector<std::string> args;
        for (size_t i = 0; i < count; ++i) {
            if (options[i] == nullptr) {
                return fail(EINVAL, "softblk_create_argv: option %zu is NULL", i);
            }
            args.emplace_back(options[i]);
        }
        return softblk::capi::create(name, type, std::move(args), devp);
    });
}

void softblk_destroy(struct softblk_device** devp)
{
    guarded("softblk_destroy", [&] {
        if (devp == nullptr || *devp == nullptr) {
            return 0;
        }
        std::unique_ptr<struct softblk_device> dev(*devp);
        *devp = nullptr;
        // Exports first (each stops whatever holds it in its destructor),
        // then what the program left in flight, then the device.
        dev->exports.clear();
        softblk::capi::drain_queues(*dev);
        dev->queues.clear();
        dev->device.reset();
        return 0;
    });
}

int softblk_start(struct softblk_device* dev)
{
    return guarded("softblk_start",
                   [&] { return softblk::capi::set_power(dev, true, "softblk_start"); });
}

int softblk_stop(struct softblk_device* dev)
{
    return guarded("softblk_stop",
                   [&] { return softblk::capi::set_power(dev, false, "softblk_stop"); });
}

int softblk_set_option(struct softblk_device* dev, const char* key, const char* value)
{
    return guarded("softblk_set_option", [&] {
        if (dev == nullptr) {
            return softblk::capi::no_device("softblk_set_option");
        }
        if (key == nullptr || value == nullptr) {
            return fail(EINVAL, "softblk_set_option: key and value are required");
        }
        const bool releases = dev->device->releases_queues(key);
        if (releases) {
            if (!dev->exports.empty()) {
                return fail(EBUSY, "%s=%s: re-makes the queues an export drives; stop it first",
                            key, value);
            }
            if (const unsigned n = softblk::capi::requests_in_flight(*dev); n > 0) {
                return fail(EBUSY,
                            "%s=%s: re-makes the queues, and %u requests on them are not "
                            "reaped; reap them with softblk_queue_do_io first",
                            key, value, n);
            }
        }
        auto r = dev->device->set_option(key, value);
        softblk::capi::sync_queues(*dev, releases && r.has_value());
        return r ? 0 : fail(r.error());
    });
}

int softblk_get_option(struct softblk_device* dev, const char* key, char* buf, size_t size)
{
    return guarded("softblk_get_option", [&] {
        if (dev == nullptr) {
            return softblk::capi::no_device("softblk_get_option");
        }
        if (key == nullptr) {
            return fail(EINVAL, "softblk_get_option: no key");
        }
        auto r = dev->device->get_option(key);
        if (!r) {
            return fail(r.error());
        }
        std::string_view text = *r;
        if (!text.empty() && text.back() == '\n') {
            text.remove_suffix(1);
        }
        return copy_out(text, buf, size);
    });
}

int softblk_get_uint64(struct softblk_device* dev, const char* property, uint64_t* value)
{
    return guarded("softblk_get_uint64", [&] {
        if (dev == nullptr || property == nullptr || value == nullptr) {
            return fail(EINVAL, "softblk_get_uint64: device, property and value are required");
        }
        const auto* p = softblk::capi::find_property(softblk::capi::k_u64_properties, property);
        if (p == nullptr) {
            return fail(ENOENT, "%s: no such uint64 property (known: %s)", property,
                        softblk::capi::property_names(softblk::capi::k_u64_properties).c_str());
        }
        *value = p->get(*dev->device);
        return 0;
    });
}

int softblk_get_bool(struct softblk_device* dev, const char* property, bool* value)
{
    return guarded("softblk_get_bool", [&] {
        if (dev == nullptr || property == nullptr || value == nullptr) {
            return fail(EINVAL, "softblk_get_bool: device, property and value are required");
        }
        const auto* p = softblk::capi::find_property(softblk::capi::k_bool_properties, property);
        if (p == nullptr) {
            return fail(ENOENT, "%s: no such bool property (known: %s)", property,
                        softblk::capi::property_names(softblk::capi::k_bool_properties).c_str());
        }
        *value = p->get(*dev->device);
        return 0;
    });
}

int softblk_get_str(struct softblk_device* dev, const char* property, char* buf, size_t size)
{
    return guarded("softblk_get_str", [&] {
        if (dev == nullptr || property == nullptr) {
            return fail(EINVAL, "softblk_get_str: device and property are required");
        }
        if (std::strcmp(property, "name") == 0) {
            return copy_out(dev->device->name(), buf, size);
        }
        if (std::strcmp(property, "type") == 0) {
            return copy_out(dev->device->info().target_type, buf, size);
        }
        return fail(ENOENT, "%s: no such string property (known: name type)", property);
    });
}

int softblk_get_target_types(char* buf, size_t size)
{
    return guarded("softblk_get_target_types",
                   [&] { return copy_out(softblk::capi::type_names(false), buf, size); });
}

int softblk_get_export_types(char* buf, size_t size)
{
    return guarded("softblk_get_export_types",
                   [&] { return copy_out(softblk::capi::type_names(true), buf, size); });
}

int softblk_get_queue(struct softblk_device* dev, unsigned index, struct softblk_queue** qp)
{
    return guarded("softblk_get_queue", [&] {
        if (qp == nullptr) {
            return fail(EINVAL, "softblk_get_queue: qp is NULL");
        }
        *qp = nullptr;
        if (dev == nullptr) {
            return softblk::capi::no_device("softblk_get_queue");
        }
        if (!dev->exports.empty()) {
            return fail(EBUSY, "%s: an export drives the queues; stop it to use them",
                        dev->device->name().c_str());
        }
        if (!dev->device->powered()) {
            return fail(ENODEV, "%s: powered off (power=0): no queues until softblk_start",
                        dev->device->name().c_str());
        }
        if (index >= dev->queues.size()) {
            return fail(EINVAL, "%s: queue %u: the device has %zu queues (0 to %zu)",
                        dev->device->name().c_str(), index, dev->queues.size(),
                        dev->queues.size() - 1);
        }
        *qp = dev->queues[index].get();
        return 0;
    });
}

int softblk_export_start(struct softblk_device* dev, const char* type, const char* options,
                         const char* run_dir, struct softblk_export** expp)
{
    return guarded("softblk_export_start",
                   [&] { return softblk::capi::start_export(dev, type, options, run_dir, expp); });
}

int softblk_export_describe(struct softblk_export* exp, char* buf, size_t size)
{
    return guarded("softblk_export_describe", [&] {
        if (exp == nullptr) {
            return fail(EINVAL, "softblk_export_describe: no export (NULL)");
        }
        return copy_out(exp->running->describe().dump(), buf, size);
    });
}

int softblk_export_stop(struct softblk_export** expp)
{
    return guarded("softblk_export_stop", [&] { return softblk::capi::stop_export(expp); });
}

}  // extern "C"
