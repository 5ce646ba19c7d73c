#include "device_host.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <fstream>
#include <sstream>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <softblk/memory_store.hpp>
#include <softblk/target.hpp>

#include "protocol.hpp"
#include "run_dir.hpp"

namespace softblk::cli {

namespace {

constexpr int k_state_version = 1;
constexpr size_t k_max_state_bytes = 1u << 20;
// The export types tried, in order, when `add` names none.
constexpr std::string_view k_default_exports[] = {"ublk", "fuse"};

bool export_available(const export_type& type)
{
    return !type.available || type.available();
}

std::string_view option_key(std::string_view arg)
{
    const size_t eq = arg.find('=');
    return eq == std::string_view::npos ? arg : arg.substr(0, eq);
}

// The options the user gave, in their canonical form (aliases resolved,
// the last of repeated keys, table order), which re-create the device.
// Defaults are left out: a default that means "choose for me" (index=-1)
// must be chosen again, and null_blk's size and gb must not both be given.
std::vector<std::string> given_options(const option_set& options)
{
    std::vector<std::string> out;
    for (const std::string& arg : options.to_args()) {
        if (options.given(option_key(arg))) {
            out.push_back(arg);
        }
    }
    return out;
}

const char* kind_name(option_kind kind)
{
    switch (kind) {
    case option_kind::integer:
        return "integer";
    case option_kind::signed_integer:
        return "signed_integer";
    case option_kind::boolean:
        return "boolean";
    case option_kind::text:
        return "text";
    }
    return "unknown";
}

nlohmann::json option_json(const option_def& def)
{
    nlohmann::json o;
    o["name"] = def.name;
    o["kind"] = kind_name(def.kind);
    o["default"] = def.default_value;
    o["unit"] = def.unit;
    o["help"] = def.help;
    if (def.kind == option_kind::integer) {
        const uint64_t width = def.bits >= 64 ? UINT64_MAX : (uint64_t{1} << def.bits) - 1;
        o["min"] = def.min;
        o["max"] = std::min(def.max, width);
        o["bits"] = def.bits;
        o["out_of_range"] = def.range == option_range::clamp ? "clamp" : "reject";
    } else if (def.kind == option_kind::signed_integer) {
        o["min"] = def.smin;
        o["max"] = def.smax;
        o["out_of_range"] = def.range == option_range::clamp ? "clamp" : "reject";
    }
    // When it may change (option_update): configfs' rules.
    switch (def.update) {
    case option_update::powered_off:
        o["changes"] = "powered off";
        break;
    case option_update::live:
        o["changes"] = "any time";
        break;
    case option_update::reconfigure:
        o["changes"] = "queues re-made";
        break;
    case option_update::powered_on:
        o["changes"] = "powered on";
        break;
    case option_update::creation:
        o["changes"] = "at creation";
        break;
    }
    if (def.write_only) {
        o["write_only"] = true;
    }
    if (!def.alias.empty()) {
        o["alias"] = def.alias;
    }
    if (def.repeatable) {
        o["repeatable"] = true;
    }
    return o;
}

// Reads a whole (small) file; error when it is missing or too large.
result<std::string> read_small_file(const std::string& path)
{
    auto opened = open_run_file(path, O_RDONLY);
    if (!opened) {
        return std::unexpected(opened.error());
    }
    const int fd = *opened;
    std::string text;
    char buf[65536];
    for (;;) {
        const ssize_t n = ::read(fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0) {
            const int e = errno;
            ::close(fd);
            return make_error(e, fmt::format("cannot read {}: {}", path, std::strerror(e)));
        }
        if (n == 0) {
            break;
        }
        text.append(buf, static_cast<size_t>(n));
        if (text.size() > k_max_state_bytes) {
            ::close(fd);
            return make_error(EFBIG,
                              fmt::format("{} is larger than {} bytes", path, k_max_state_bytes));
        }
    }
    ::close(fd);
    return text;
}

}  // namespace

// Tells the control thread that a teardown ended. Shared with the teardown
// threads, so that one the daemon gave up on can still signal safely.
struct device_host::wake_event {
    int fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    ~wake_event()
    {
        if (fd >= 0) {
            ::close(fd);
        }
    }
    void notify() const
    {
        const uint64_t one = 1;
        (void)!::write(fd, &one, sizeof one);
    }
};

// One device being removed: its export and device, moved here from the
// table, are stopped and destroyed on `thread`. The thread writes `outcome`
// (and, when the export refused, leaves `exp` and `dev` alive) before it
// sets `finished`; the control thread reads them only after that.
struct device_host::teardown {
    std::unique_ptr<device_export> exp;
    std::unique_ptr<device> dev;
    bool keep_state = false;
    bool force = false;
    std::chrono::steady_clock::time_point started;
    std::thread thread;
    std::atomic<bool> finished{false};
    result<void> outcome;

    // The teardown thread's body.
    void run(const std::string& name, const std::string& export_type, const wake_event& wake)
    {
        if (exp) {
            outcome = exp->stop();
            if (!outcome && force) {
                // The export's destructor stops it whatever holds it.
                spdlog::warn("{}: export {} stopped by force: {}", name, export_type,
                             outcome.error().message);
                outcome = {};
            }
        }
        if (outcome) {
            exp.reset();
            dev.reset();
        }
        finished.store(true, std::memory_order_release);
        wake.notify();
    }
};

std::string default_export_type()
{
    for (std::string_view name : k_default_exports) {
        const export_type* type = find_export_type(name);
        if (type != nullptr && export_available(*type)) {
            return std::string(name);
        }
    }
    return "none";
}

result<nlohmann::json> features_json(std::string_view type)
{
    std::vector<const target_type*> types;
    if (type.empty()) {
        types = target_types();
    } else if (const target_type* t = find_target_type(type)) {
        types.push_back(t);
    } else {
        std::vector<std::string> known;
        for (const target_type* t : target_types()) {
            known.emplace_back(t->name);
        }
        return make_error(ENOENT,
                          fmt::format("unknown target type '{}'; known types: {}", type,
                                      known.empty() ? std::string("(none built in)")
                                                    : fmt::format("{}", fmt::join(known, ", "))));
    }
    nlohmann::json out;
    out["targets"] = nlohmann::json::array();
    for (const target_type* t : types) {
        nlohmann::json tj;
        tj["name"] = t->name;
        tj["description"] = t->description;
        tj["options"] = nlohmann::json::array();
        for (const option_def& def : options_for(t->name)) {
            tj["options"].push_back(option_json(def));
        }
        out["targets"].push_back(std::move(tj));
    }
    out["exports"] = nlohmann::json::array();
    for (const export_type* e : export_types()) {
        nlohmann::json options = nlohmann::json::array();
        for (const option_def& def : e->options) {
            // Export options are given when the export starts, not
            // written as device attributes: no update rule to show.
            nlohmann::json o = option_json(def);
            o.erase("changes");
            options.push_back(std::move(o));
        }
        out["exports"].push_back({{"name", e->name},
                                  {"description", e->description},
                                  {"available", export_available(*e)},
                                  {"options", std::move(options)}});
    }
    out["exports"].push_back({{"name", "none"},
                              {"description", "no export: the device lives in the daemon only"},
                              {"available", true},
                              {"options", nlohmann::json::array()}});
    out["default_export"] = default_export_type();
    return out;
}

device_host::device_host(export_context ctx, std::string state_dir)
    : _ctx(std::move(ctx)), _wake(std::make_shared<wake_event>()), _state_dir(std::move(state_dir))
{
}

device_host::~device_host()
{
    stop_all();
}

std::string device_host::state_path(std::string_view name) const
{
    return fmt::format("{}/{}.json", _state_dir, name);
}

std::string device_host::next_name(std::string_view type) const
{
    for (unsigned i = 0;; ++i) {
        std::string name = fmt::format("{}{}", type, i);
        if (!_devices.contains(name)) {
            return name;
        }
    }
}

result<void> device_host::create(hosted_device& entry)
{
    if (entry.export_type != "none") {
        const export_type* type = find_export_type(entry.export_type);
        if (type == nullptr) {
            std::vector<std::string> known;
            for (const export_type* e : export_types()) {
                known.emplace_back(e->name);
            }
            known.emplace_back("none");
            return make_error(ENOENT, fmt::format("unknown export type '{}'; known types: {}",
                                                  entry.export_type, fmt::join(known, ", ")));
        }
        if (!export_available(*type)) {
            return make_error(ENODEV,
                              fmt::format("export type '{}' is not available on this machine ({})",
                                          entry.export_type, type->description));
        }
    }
    auto dev = device::create(entry.name, entry.type, entry.options);
    if (!dev) {
        return std::unexpected(dev.error());
    }
    entry.dev = std::move(*dev);
    if (entry.dev->powered()) {
        if (auto started = start_entry_export(entry); !started) {
            entry.dev->undo_create();  // an image or zone files it made go
            entry.dev.reset();
            return started;
        }
    }
    entry.options = given_options(entry.dev->options());
    entry.failure.clear();
    return {};
}

result<void> device_host::start_entry_export(hosted_device& entry)
{
    if (entry.export_type == "none") {
        return {};
    }
    const export_type* type = find_export_type(entry.export_type);
    if (type == nullptr) {
        return make_error(ENOENT, fmt::format("unknown export type '{}'", entry.export_type));
    }
    std::vector<std::string> options = entry.export_options;
    for (const std::string& r : entry.restart_options) {
        const std::string_view key = option_key(r);
        if (std::none_of(options.begin(), options.end(),
                         [&](const std::string& o) { return option_key(o) == key; })) {
            options.push_back(r);
        }
    }
    auto started = start_export(*type, *entry.dev, _ctx, options);
    if (!started && options.size() != entry.export_options.size()) {
        // The kernel device it had is taken: a new one.
        spdlog::info("{}: export {} cannot have [{}] again ({}); starting a new one", entry.name,
                     entry.export_type, fmt::join(entry.restart_options, " "),
                     started.error().message);
        started = start_export(*type, *entry.dev, _ctx, entry.export_options);
    }
    if (!started) {
        error err = started.error();
        err.message = fmt::format("export {}: {}", entry.export_type, err.message);
        return std::unexpected(std::move(err));
    }
    entry.exp = std::move(*started);
    return {};
}

result<void> device_host::stop_entry_export(hosted_device& entry, bool force)
{
    if (!entry.exp) {
        return {};
    }
    if (!force) {
        if (std::string why = entry.exp->in_use(); !why.empty()) {
            return make_error(EBUSY, fmt::format("{}: the {} export is in use ({}); unmount it "
                                                 "first, or force",
                                                 entry.name, entry.export_type, why));
        }
    }
    entry.restart_options = entry.exp->restart_options();
    if (auto stopped = entry.exp->stop(); !stopped) {
        if (!force) {
            return stopped;
        }
        spdlog::warn("{}: export {} stopped by force: {}", entry.name, entry.export_type,
                     stopped.error().message);
    }
    entry.exp.reset();
    return {};
}

result<void> device_host::write_state(const hosted_device& entry) const
{
    nlohmann::json state;
    state["version"] = k_state_version;
    state["name"] = entry.name;
    state["type"] = entry.type;
    state["options"] = entry.options;
    state["export"] = {{"type", entry.export_type}, {"options", entry.export_options}};
    state["sequence"] = entry.sequence;
    if (entry.dev) {
        // Every effective value, for a person reading the file; recovery
        // uses "options".
        state["effective_options"] = entry.dev->options().to_args();
    }
    return write_run_file(
        state_path(entry.name),
        state.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n", 0600, true);
}

result<nlohmann::json> device_host::add(const add_request& request)
{
    hosted_device entry;
    entry.type = request.type;
    if (entry.type.empty()) {
        return make_error(EINVAL, "no target type given (e.g. \"null\")");
    }
    entry.name = request.name.empty() ? next_name(entry.type) : request.name;
    if (auto checked = check_new_device_name(entry.name); !checked) {
        return std::unexpected(checked.error());
    }
    if (_devices.contains(entry.name)) {
        return make_error(EEXIST, fmt::format("a device named '{}' exists already", entry.name));
    }
    entry.options = request.options;
    entry.export_type = request.export_type.empty() ? default_export_type() : request.export_type;
    entry.export_options = request.export_options;
    if (entry.export_type == "none" && !entry.export_options.empty()) {
        return make_error(EINVAL, fmt::format("export options ({}) given without an export",
                                              fmt::join(entry.export_options, " ")));
    }
    entry.sequence = _next_sequence;
    if (auto created = create(entry); !created) {
        spdlog::warn("add {} {} [{}] export {}: {}", entry.name, entry.type,
                     fmt::join(request.options, " "), entry.export_type, created.error().message);
        return std::unexpected(created.error());
    }
    if (auto written = write_state(entry); !written) {
        if (entry.exp) {
            (void)entry.exp->stop();
        }
        entry.exp.reset();
        entry.dev->undo_create();
        return std::unexpected(written.error());
    }
    ++_next_sequence;
    spdlog::info("added {} {} [{}] export {} [{}]{}", entry.name, entry.type,
                 fmt::join(entry.options, " "), entry.export_type,
                 fmt::join(entry.export_options, " "), entry.dev->powered() ? "" : " powered off");
    for (const std::string& note : entry.dev->notes()) {
        spdlog::info("{}: {}", entry.name, note);
    }
    const std::string name = entry.name;
    auto [it, inserted] = _devices.emplace(name, std::move(entry));
    return summary(it->second);
}

nlohmann::json device_host::summary(const hosted_device& entry) const
{
    nlohmann::json out;
    out["name"] = entry.name;
    out["type"] = entry.type;
    out["power"] = entry.dev->powered() ? 1 : 0;
    out["capacity_bytes"] = current_capacity(entry.dev->limits());
    out["logical_block_size"] = entry.dev->limits().logical_block_size;
    out["options"] = entry.options;
    if (!entry.dev->notes().empty()) {
        out["notes"] = entry.dev->notes();
    }
    nlohmann::json exp = entry.exp ? entry.exp->describe() : nlohmann::json::object();
    exp["type"] = entry.export_type;
    if (!entry.dev->powered() && entry.export_type != "none") {
        exp["state"] = "powered off";
    }
    out["export"] = std::move(exp);
    return out;
}

result<void> device_host::set_one(hosted_device& entry, std::string_view key,
                                  std::string_view value, bool force)
{
    device& dev = *entry.dev;
    const option_def* def = option_set::find_def(dev.options().defs(), key);
    if (def != nullptr && def->name == "power") {
        auto on = parse_kernel_bool(value);
        if (!on) {
            return make_error(
                EINVAL, fmt::format("power={}: power takes 0 or 1 (also y/n, on/off)", value));
        }
        if (*on == dev.powered()) {
            return {};  // configfs: writing the state it has does nothing
        }
        if (*on) {
            if (auto r = dev.set_power(true); !r) {
                return r;
            }
            if (auto r = start_entry_export(entry); !r) {
                (void)dev.set_power(false);
                return r;
            }
            return {};
        }
        if (auto r = stop_entry_export(entry, force); !r) {
            return r;
        }
        return dev.set_power(false);
    }
    if (!dev.releases_queues(key)) {
        return dev.set_option(key, value);
    }
    // The queues are made anew: the export lets go of them and comes back.
    if (auto r = stop_entry_export(entry, force); !r) {
        return r;
    }
    auto changed = dev.set_option(key, value);
    if (auto r = start_entry_export(entry); !r) {
        spdlog::error("{}: export {} did not come back after {}={}: {}", entry.name,
                      entry.export_type, key, value, r.error().message);
        return changed ? r : changed;
    }
    return changed;
}

result<nlohmann::json> device_host::set(std::string_view name,
                                        const std::vector<std::string>& options, bool force)
{
    auto it = _devices.find(name);
    if (it == _devices.end()) {
        return make_error(ENOENT, fmt::format("no device named '{}'", name));
    }
    hosted_device& entry = it->second;
    if (entry.stopping) {
        return make_error(EBUSY, fmt::format("{} is being removed", entry.name));
    }
    if (!entry.dev) {
        return make_error(EINVAL, fmt::format("{} failed to recover ({}); `softblk del {}` "
                                              "removes it",
                                              entry.name, entry.failure, entry.name));
    }
    std::vector<std::string> notes;
    result<void> outcome;
    for (const std::string& arg : options) {
        const size_t eq = arg.find('=');
        if (eq == std::string::npos || eq == 0) {
            outcome = make_error(EINVAL, fmt::format("{}: expected key=value", arg));
            break;
        }
        const std::string_view key = std::string_view(arg).substr(0, eq);
        const std::string_view value = std::string_view(arg).substr(eq + 1);
        outcome = set_one(entry, key, value, force);
        for (const std::string& note : entry.dev->notes()) {
            spdlog::info("{}: {}", entry.name, note);
            notes.push_back(note);
        }
        if (!outcome) {
            break;
        }
        spdlog::info("{}: {}", entry.name, arg);
    }
    // What was applied is recorded, even when a later write failed.
    entry.options = given_options(entry.dev->options());
    if (auto written = write_state(entry); !written && outcome) {
        outcome = written;
    }
    if (!outcome) {
        return std::unexpected(outcome.error());
    }
    nlohmann::json out = summary(entry);
    out["notes"] = notes;
    return out;
}

result<nlohmann::json> device_host::get(std::string_view name,
                                        const std::vector<std::string>& keys) const
{
    auto it = _devices.find(name);
    if (it == _devices.end()) {
        return make_error(ENOENT, fmt::format("no device named '{}'", name));
    }
    const hosted_device& entry = it->second;
    if (entry.stopping || !entry.dev) {
        return make_error(entry.stopping ? EBUSY : EINVAL,
                          fmt::format("{} is {}", entry.name,
                                      entry.stopping ? "being removed" : "a failed recovery"));
    }
    std::vector<std::string> wanted = keys;
    if (wanted.empty()) {
        for (const option_def& def : entry.dev->options().defs()) {
            if (def.update != option_update::creation && !def.write_only) {
                wanted.emplace_back(def.name);
            }
        }
    }
    nlohmann::json values = nlohmann::json::object();
    for (const std::string& key : wanted) {
        auto text = entry.dev->get_option(key);
        if (!text) {
            return std::unexpected(text.error());
        }
        values[key] = *text;
    }
    nlohmann::json exp = entry.exp ? entry.exp->describe() : nlohmann::json::object();
    exp["type"] = entry.export_type;
    return nlohmann::json{{"name", entry.name},
                          {"type", entry.type},
                          {"power", entry.dev->powered() ? 1 : 0},
                          {"values", values},
                          {"export", exp}};
}

result<nlohmann::json> device_host::zone(std::string_view name, const zone_request& request)
{
    auto it = _devices.find(name);
    if (it == _devices.end()) {
        return make_error(ENOENT, fmt::format("no device named '{}'", name));
    }
    hosted_device& entry = it->second;
    if (entry.stopping || !entry.dev) {
        return make_error(entry.stopping ? EBUSY : EINVAL,
                          fmt::format("{} is {}", entry.name,
                                      entry.stopping ? "being removed" : "a failed recovery"));
    }
    return run_zone_request(*entry.dev, request);
}

result<void> device_host::begin_remove(std::string_view name, bool keep_state, bool force)
{
    auto it = _devices.find(name);
    if (it == _devices.end()) {
        return make_error(ENOENT, fmt::format("no device named '{}'", name));
    }
    hosted_device& entry = it->second;
    if (entry.stopping) {
        return make_error(
            EBUSY, fmt::format("{} is being removed already (since {} s)", entry.name,
                               std::chrono::duration_cast<std::chrono::seconds>(
                                   std::chrono::steady_clock::now() - entry.stopping->started)
                                   .count()));
    }
    if (!entry.dev) {
        // A failed recovery: nothing runs.
        if (!keep_state) {
            const std::string path = state_path(entry.name);
            if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
                spdlog::warn("del {}: cannot remove {}: {}", entry.name, path,
                             std::strerror(errno));
            }
        }
        _devices.erase(it);
        return {};
    }
    if (entry.exp && !force) {
        if (std::string why = entry.exp->in_use(); !why.empty()) {
            return make_error(EBUSY, fmt::format("{}: the {} export is in use ({}); the device "
                                                 "stays",
                                                 entry.name, entry.export_type, why));
        }
    }
    auto job = std::make_shared<teardown>();
    job->exp = std::move(entry.exp);
    job->dev = std::move(entry.dev);
    job->keep_state = keep_state;
    job->force = force;
    job->started = std::chrono::steady_clock::now();
    entry.stopping = job;
    // The thread holds the job and the wake event: both outlive a host
    // that gave up on it (abandon_stopping).
    job->thread = std::thread([job, wake = _wake, name = entry.name, type = entry.export_type] {
        job->run(name, type, *wake);
    });
    return {};
}

std::vector<device_host::removal> device_host::reap()
{
    std::vector<removal> out;
    for (auto it = _devices.begin(); it != _devices.end();) {
        hosted_device& entry = it->second;
        if (!entry.stopping || !entry.stopping->finished.load(std::memory_order_acquire)) {
            ++it;
            continue;
        }
        std::shared_ptr<teardown> job = std::move(entry.stopping);
        job->thread.join();
        if (!job->outcome) {
            // The export refused to stop: the device runs on as it was.
            entry.exp = std::move(job->exp);
            entry.dev = std::move(job->dev);
            spdlog::warn("del {}: export {} did not stop: {}", entry.name, entry.export_type,
                         job->outcome.error().message);
            error err = job->outcome.error();
            err.message = fmt::format("{}: the {} export did not stop, the device stays: {}",
                                      entry.name, entry.export_type, err.message);
            out.push_back({entry.name, std::unexpected(std::move(err))});
            ++it;
            continue;
        }
        if (!job->keep_state) {
            const std::string path = state_path(entry.name);
            if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
                spdlog::warn("del {}: cannot remove {}: {}", entry.name, path,
                             std::strerror(errno));
            }
            spdlog::info("deleted {}", entry.name);
        } else {
            spdlog::info("stopped {}; its state stays for the next daemon", entry.name);
        }
        out.push_back({entry.name, {}});
        it = _devices.erase(it);
    }
    return out;
}

int device_host::wake_fd() const
{
    return _wake->fd;
}

void device_host::clear_wake()
{
    uint64_t count = 0;
    (void)!::read(_wake->fd, &count, sizeof count);
}

std::vector<std::pair<std::string, std::string>> device_host::in_use() const
{
    std::vector<std::pair<std::string, std::string>> out;
    for (const auto& [name, entry] : _devices) {
        if (entry.exp && !entry.stopping) {
            if (std::string why = entry.exp->in_use(); !why.empty()) {
                out.emplace_back(name, std::move(why));
            }
        }
    }
    return out;
}

std::vector<std::string> device_host::stopping_since(
    std::chrono::steady_clock::time_point before) const
{
    std::vector<std::string> out;
    for (const auto& [name, entry] : _devices) {
        if (entry.stopping && entry.stopping->started < before) {
            out.push_back(name);
        }
    }
    return out;
}

std::vector<std::string> device_host::abandon_stopping()
{
    std::vector<std::string> out;
    for (auto it = _devices.begin(); it != _devices.end();) {
        hosted_device& entry = it->second;
        if (!entry.stopping) {
            ++it;
            continue;
        }
        if (!entry.stopping->keep_state) {
            ::unlink(state_path(entry.name).c_str());
        }
        entry.stopping->thread.detach();
        out.push_back(entry.name);
        it = _devices.erase(it);
    }
    return out;
}

std::vector<std::string> device_host::names() const
{
    std::vector<std::string> out;
    for (const auto& [name, entry] : _devices) {
        out.push_back(name);
    }
    return out;
}

bool device_host::stopping(std::string_view name) const
{
    auto it = _devices.find(name);
    return it != _devices.end() && it->second.stopping != nullptr;
}

size_t device_host::running() const
{
    return static_cast<size_t>(std::count_if(_devices.begin(), _devices.end(), [](const auto& e) {
        return e.second.dev != nullptr && !e.second.stopping;
    }));
}

std::vector<device_host::removal> device_host::wait_removed(const std::vector<std::string>& names)
{
    std::vector<removal> out;
    for (const std::string& name : names) {
        auto it = _devices.find(name);
        if (it != _devices.end() && it->second.stopping) {
            while (!it->second.stopping->finished.load(std::memory_order_acquire)) {
                std::this_thread::sleep_for(std::chrono::milliseconds(1));
            }
        }
    }
    clear_wake();
    for (removal& r : reap()) {
        if (std::find(names.begin(), names.end(), r.name) != names.end()) {
            out.push_back(std::move(r));
        }
    }
    return out;
}

result<nlohmann::json> device_host::remove(std::string_view name)
{
    const std::string key(name);
    if (auto started = begin_remove(key, false, false); !started) {
        return std::unexpected(started.error());
    }
    for (removal& r : wait_removed({key})) {
        if (!r.outcome) {
            return std::unexpected(r.outcome.error());
        }
    }
    return nlohmann::json{{"name", key}};
}

result<nlohmann::json> device_host::remove_all()
{
    const std::vector<std::string> started = names();
    std::vector<std::string> failures;
    int code = 0;
    std::vector<std::string> waiting;
    for (const std::string& name : started) {
        if (auto r = begin_remove(name, false, false); !r) {
            failures.push_back(r.error().message);
            code = r.error().code.value();
        } else if (_devices.contains(name)) {
            waiting.push_back(name);
        }
    }
    nlohmann::json deleted = nlohmann::json::array();
    for (const std::string& name : started) {
        if (!_devices.contains(name)) {
            deleted.push_back(name);  // a failed entry, gone at once
        }
    }
    for (removal& r : wait_removed(waiting)) {
        if (r.outcome) {
            deleted.push_back(r.name);
        } else {
            failures.push_back(r.outcome.error().message);
            code = r.outcome.error().code.value();
        }
    }
    if (!failures.empty()) {
        return make_error(
            code != 0 ? code : EBUSY,
            fmt::format("{} device(s) stayed: {}", failures.size(), fmt::join(failures, "; ")));
    }
    return nlohmann::json{{"deleted", std::move(deleted)}};
}

nlohmann::json device_host::entry_json(const hosted_device& entry) const
{
    nlohmann::json d = nlohmann::json::object();
    const memory_budget& daemon = process_memory_budget();
    if (entry.stopping) {
        // Its export and device belong to the teardown thread now.
        d["name"] = entry.name;
        d["type"] = entry.type;
        d["state"] = "stopping";
        d["stopping_ms"] = std::chrono::duration_cast<std::chrono::milliseconds>(
                               std::chrono::steady_clock::now() - entry.stopping->started)
                               .count();
    } else if (entry.dev) {
        entry.dev->describe(d);
        d["state"] = entry.dev->powered() ? "running" : "off";
        // Data memory against the budgets: the device's own limit (a target
        // with a memory store reports it, memory_store.hpp) and the
        // daemon's, which every device shares.
        const nlohmann::json& target = d["target"];
        d["memory"] = {
            {"used_bytes", entry.dev->memory_bytes()},
            {"limit_bytes",
             target.is_object() ? target.value("memory_limit_bytes", uint64_t{0}) : uint64_t{0}},
            {"daemon_used_bytes", daemon.used()},
            {"daemon_limit_bytes", daemon.limit()},
        };
    } else {
        d["name"] = entry.name;
        d["type"] = entry.type;
        d["state"] = "failed";
        d["error"] = entry.failure;
    }
    d["options"] = entry.options;
    nlohmann::json exp =
        entry.exp && !entry.stopping ? entry.exp->describe() : nlohmann::json::object();
    exp["type"] = entry.export_type;
    if (!entry.export_options.empty()) {
        exp["options"] = entry.export_options;
    }
    d["export"] = std::move(exp);
    return d;
}

nlohmann::json device_host::list() const
{
    std::vector<const hosted_device*> order;
    for (const auto& [name, entry] : _devices) {
        order.push_back(&entry);
    }
    std::sort(order.begin(), order.end(), [](const hosted_device* a, const hosted_device* b) {
        return a->sequence < b->sequence;
    });
    nlohmann::json out = nlohmann::json::array();
    for (const hosted_device* entry : order) {
        out.push_back(entry_json(*entry));
    }
    return out;
}

nlohmann::json device_host::recover()
{
    for (const export_type* type : export_types()) {
        if (type->cleanup_stale) {
            type->cleanup_stale(_ctx);
        }
    }
    nlohmann::json recovered = nlohmann::json::array();
    nlohmann::json failed = nlohmann::json::array();

    std::vector<std::string> files;
    if (DIR* dir = ::opendir(_state_dir.c_str())) {
        while (const dirent* ent = ::readdir(dir)) {
            const std::string_view file = ent->d_name;
            if (file.size() > 5 && file.ends_with(".json")) {
                files.emplace_back(file);
            } else if (file.ends_with(".json.tmp")) {
                // An interrupted write: the previous NAME.json (if any) is intact.
                ::unlinkat(::dirfd(dir), ent->d_name, 0);
            }
        }
        ::closedir(dir);
    }

    std::vector<hosted_device> entries;
    for (const std::string& file : files) {
        hosted_device entry;
        entry.name = file.substr(0, file.size() - 5);
        entry.export_type = "none";
        entry.sequence = UINT64_MAX;
        auto fail = [&](std::string why) {
            entry.failure = std::move(why);
            entries.push_back(std::move(entry));
        };
        auto text = read_small_file(_state_dir + "/" + file);
        if (!text) {
            fail(text.error().message);
            continue;
        }
        nlohmann::json state = nlohmann::json::parse(*text, nullptr, false);
        if (state.is_discarded() || !state.is_object()) {
            fail(fmt::format("{}: not a JSON object", file));
            continue;
        }
        auto name = param_string(state, "name", true);
        auto type = param_string(state, "type", true);
        auto options = param_strings(state, "options");
        const nlohmann::json exp = state.value("export", nlohmann::json::object());
        auto export_type =
            exp.is_object()
                ? param_string(exp, "type", false, "none")
                : result<std::string>(make_error(EINVAL, "\"export\" is not an object"));
        auto export_options =
            exp.is_object() ? param_strings(exp, "options") : result<std::vector<std::string>>();
        if (auto seq = state.find("sequence"); seq != state.end() && seq->is_number_unsigned()) {
            entry.sequence = seq->get<uint64_t>();
        }
        if (!name || !type || !options || !export_type || !export_options) {
            for (const auto* err : {name ? nullptr : &name.error(), type ? nullptr : &type.error(),
                                    options ? nullptr : &options.error(),
                                    export_type ? nullptr : &export_type.error(),
                                    export_options ? nullptr : &export_options.error()}) {
                if (err != nullptr) {
                    fail(fmt::format("{}: {}", file, err->message));
                    break;
                }
            }
            continue;
        }
        if (*name != entry.name || !valid_device_name(*name)) {
            fail(fmt::format("{}: names device '{}'", file, *name));
            continue;
        }
        entry.type = *type;
        entry.options = *options;
        entry.export_type = *export_type;
        entry.export_options = *export_options;
        entries.push_back(std::move(entry));
    }
    std::sort(entries.begin(), entries.end(), [](const hosted_device& a, const hosted_device& b) {
        return a.sequence != b.sequence ? a.sequence < b.sequence : a.name < b.name;
    });

    for (hosted_device& entry : entries) {
        if (entry.failure.empty()) {
            if (auto created = create(entry); !created) {
                entry.failure = created.error().message;
            }
        }
        if (entry.sequence == UINT64_MAX) {
            entry.sequence = _next_sequence;
        }
        _next_sequence = std::max(_next_sequence, entry.sequence + 1);
        if (entry.failure.empty()) {
            spdlog::info("recovered {} {} [{}] export {}", entry.name, entry.type,
                         fmt::join(entry.options, " "), entry.export_type);
            recovered.push_back(entry.name);
        } else {
            spdlog::error(
                "cannot recover {}: {} (the state file stays; `softblk del {}` removes it)",
                entry.name, entry.failure, entry.name);
            failed.push_back({{"name", entry.name}, {"error", entry.failure}});
        }
        const std::string name = entry.name;
        _devices.emplace(name, std::move(entry));
    }
    return {{"recovered", std::move(recovered)}, {"failed", std::move(failed)}};
}

void device_host::stop_all()
{
    std::vector<std::string> waiting;
    for (const std::string& name : names()) {
        if (_devices.contains(name) && !_devices.find(name)->second.stopping) {
            (void)begin_remove(name, true, true);
        }
        if (_devices.contains(name)) {
            waiting.push_back(name);
        }
    }
    (void)wait_removed(waiting);
    _devices.clear();
}

}  // namespace softblk::cli
