// device_host's jobs (device_host.hpp): adding a device, recovering the
// devices at start and the writes of `set` that power a device on or off or
// re-make its queues. What may wait for a device (a back end that does not
// answer, an export slow to start or stop) runs here, on a thread of the
// job's own, never on the control thread.
#include <algorithm>
#include <cerrno>
#include <new>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <softblk/target.hpp>

#include "device_work.hpp"
#include "json_params.hpp"

namespace softblk::host {

namespace {

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

// An export type that `add` may name: registered and available here, or
// "none".
result<void> check_export_type(std::string_view name)
{
    if (name == "none") {
        return {};
    }
    const export_type* type = find_export_type(name);
    if (type == nullptr) {
        std::vector<std::string> known;
        for (const export_type* e : export_types()) {
            known.emplace_back(e->name);
        }
        known.emplace_back("none");
        return make_error(ENOENT, fmt::format("unknown export type '{}'; known types: {}", name,
                                              fmt::join(known, ", ")));
    }
    if (!export_available(*type)) {
        return make_error(
            ENODEV, fmt::format("export type '{}' is not available on this machine ({})", name,
                                type->description));
    }
    return {};
}

}  // namespace

// ---------------------------------------------------------------- job thread

const char* device_host::job::method_name() const
{
    switch (what) {
    case kind::add:
        return "add";
    case kind::recover:
        return "recover";
    case kind::set:
        return "set";
    }
    return "?";
}

void device_host::job::run(const wake_event& wake)
{
    const char* method = method_name();
    if (cancelled.load(std::memory_order_acquire)) {
        outcome = make_error(ECANCELED,
                             fmt::format("{}: removed before its {} began", work.name, method));
    } else {
        try {
            outcome = what == kind::set ? apply_writes(ctx, work, writes, force, notes)
                                        : create(ctx, work);
        } catch (const std::bad_alloc& e) {
            outcome = make_error(ENOMEM, fmt::format("not enough memory ({})", e.what()));
        } catch (const std::exception& e) {
            outcome = make_error(EIO, fmt::format("internal error: {}", e.what()));
        }
        if (!outcome && outcome.error().code.value() == ENOMEM) {
            // The message names a table ("16777216 zone descriptors"); say
            // which device and command ran out.
            error err = outcome.error();
            const bool named = err.message.starts_with(work.name + ":");
            err.message = named ? fmt::format("{} {}", method, err.message)
                                : fmt::format("{} {}: {}", method, work.name, err.message);
            outcome = std::unexpected(std::move(err));
        }
    }
    finished.store(true, std::memory_order_release);
    wake.notify();
}

result<void> device_host::create(const export_context& ctx, hosted_device& entry)
{
    if (!entry.export_type.empty()) {
        if (auto checked = check_export_type(entry.export_type); !checked) {
            return checked;
        }
    }
    auto dev = device::create(entry.name, entry.type, entry.options);
    if (!dev) {
        return std::unexpected(dev.error());
    }
    if (entry.export_type.empty()) {
        // `add` named no export: the first default front end that can
        // carry this device (a zoned one needs a zoned model).
        auto chosen = choose_default_export(**dev);
        if (!chosen) {
            (*dev)->undo_create();
            return std::unexpected(chosen.error());
        }
        entry.export_type = (*chosen)->name;
    }
    entry.dev = std::move(*dev);
    if (entry.dev->powered()) {
        if (auto started = start_entry_export(ctx, entry); !started) {
            entry.dev->undo_create();  // an image or zone files it made go
            entry.dev.reset();
            return started;
        }
    }
    entry.options = given_options(entry.dev->options());
    entry.failure.clear();
    return {};
}

result<void> device_host::start_entry_export(const export_context& ctx, hosted_device& entry)
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
    auto started = start_export(*type, *entry.dev, ctx, options);
    if (!started && options.size() != entry.export_options.size()) {
        // The kernel device it had is taken: a new one.
        spdlog::info("{}: export {} cannot have [{}] again ({}); starting a new one", entry.name,
                     entry.export_type, fmt::join(entry.restart_options, " "),
                     started.error().message);
        started = start_export(*type, *entry.dev, ctx, entry.export_options);
    }
    if (!started) {
        error err = started.error();
        err.message = fmt::format("export {}: {}", entry.export_type, err.message);
        return std::unexpected(std::move(err));
    }
    entry.exp = std::move(*started);
    if (!entry.exp->kernel_disk().empty()) {
        // start_export's no_sched=1 on the kernel disk failed: the device
        // is served all the same, `list` shows the warning.
        const nlohmann::json d = entry.exp->describe();
        if (d.contains("scheduler_error")) {
            spdlog::warn("{}: no_sched=1 not applied to {}: {}", entry.name,
                         entry.exp->kernel_disk(), d["scheduler_error"].get<std::string>());
        }
    }
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

result<void> device_host::set_one(const export_context& ctx, hosted_device& entry,
                                  std::string_view key, std::string_view value, bool force)
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
            if (auto r = start_entry_export(ctx, entry); !r) {
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
    if (auto r = start_entry_export(ctx, entry); !r) {
        spdlog::error("{}: export {} did not come back after {}={}: {}", entry.name,
                      entry.export_type, key, value, r.error().message);
        return changed ? r : changed;
    }
    return changed;
}

result<void> device_host::apply_writes(const export_context& ctx, hosted_device& entry,
                                       const std::vector<std::string>& options, bool force,
                                       std::vector<std::string>& notes)
{
    for (const std::string& arg : options) {
        const size_t eq = arg.find('=');
        if (eq == std::string::npos || eq == 0) {
            return make_error(EINVAL, fmt::format("{}: expected key=value", arg));
        }
        const std::string_view key = std::string_view(arg).substr(0, eq);
        const std::string_view value = std::string_view(arg).substr(eq + 1);
        auto outcome = set_one(ctx, entry, key, value, force);
        for (const std::string& note : entry.dev->notes()) {
            spdlog::info("{}: {}", entry.name, note);
            notes.push_back(note);
        }
        if (!outcome) {
            return outcome;
        }
        spdlog::info("{}: {}", entry.name, arg);
    }
    return {};
}

// ---------------------------------------------------------------- control thread

std::shared_ptr<device_host::job> device_host::job::make(kind what, std::string label,
                                                         hosted_device& entry,
                                                         const export_context& ctx)
{
    auto j = std::make_shared<job>();
    j->what = what;
    j->label = std::move(label);
    j->ctx = ctx;
    j->started = std::chrono::steady_clock::now();
    j->work.name = entry.name;
    j->work.type = entry.type;
    j->work.options = entry.options;
    j->work.export_type = entry.export_type;
    j->work.export_options = entry.export_options;
    j->work.sequence = entry.sequence;
    j->work.restart_options = entry.restart_options;
    // A set works on the running device: it is the job's until it ends.
    j->work.dev = std::move(entry.dev);
    j->work.exp = std::move(entry.exp);
    entry.busy = j;
    return j;
}

void device_host::job::start(std::shared_ptr<job> self, std::shared_ptr<wake_event> wake)
{
    job& j = *self;
    // The thread holds the job and the wake event: both outlive a host that
    // gave up on it (abandon_stopping).
    j.thread = std::thread([self = std::move(self), wake = std::move(wake)] { self->run(*wake); });
}

result<device_host::hosted_device> device_host::prepare_add(const add_request& request) const
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
    if (auto it = _devices.find(entry.name); it != _devices.end()) {
        const hosted_device& other = it->second;
        if (other.stopping || other.remove_after) {
            return make_error(EEXIST, fmt::format("a device named '{}' is being removed; wait "
                                                  "until it leaves `softblk list`",
                                                  entry.name));
        }
        return make_error(EEXIST, fmt::format("a device named '{}' exists already{}", entry.name,
                                              other.busy ? fmt::format(" ({})", other.busy->label)
                                                         : std::string()));
    }
    entry.options = request.options;
    entry.export_type = request.export_type;
    entry.export_options = request.export_options;
    entry.config = request.config;
    if (entry.export_type == "none" && !entry.export_options.empty()) {
        return make_error(EINVAL, fmt::format("export options ({}) given without an export",
                                              fmt::join(entry.export_options, " ")));
    }
    if (entry.export_type.empty()) {
        return entry;  // chosen by create(), for the device made
    }
    if (auto checked = check_export_type(entry.export_type); !checked) {
        return std::unexpected(checked.error());
    }
    return entry;
}

result<std::string> device_host::begin_add(const add_request& request)
{
    auto entry = prepare_add(request);
    if (!entry) {
        return std::unexpected(entry.error());
    }
    entry->sequence = _next_sequence++;
    const std::string name = entry->name;
    auto j = job::make(job::kind::add, "adding", *entry, _ctx);
    _devices.emplace(name, std::move(*entry));
    job::start(std::move(j), _wake);
    return name;
}

result<nlohmann::json> device_host::add(const add_request& request)
{
    auto name = begin_add(request);
    if (!name) {
        return std::unexpected(name.error());
    }
    result<nlohmann::json> out = make_error(EIO, "add did not end");
    wait_for([&](reaped& r) {
        for (completion& c : r.completions) {
            if (c.name == *name) {
                out = std::move(c.outcome);
                return true;
            }
        }
        return false;
    });
    return out;
}

std::optional<result<nlohmann::json>> device_host::begin_set(
    std::string_view name, const std::vector<std::string>& options, bool force)
{
    auto it = _devices.find(name);
    if (it == _devices.end()) {
        return make_error(ENOENT, fmt::format("no device named '{}'", name));
    }
    hosted_device& entry = it->second;
    if (auto unusable = not_running(entry); !unusable) {
        return std::unexpected(unusable.error());
    }
    // Writes that may wait for the device or its export go to a job.
    bool slow = false;
    bool powers_on = false;
    for (const std::string& arg : options) {
        const std::string_view key = option_key(arg);
        const option_def* def = option_set::find_def(entry.dev->options().defs(), key);
        if (def != nullptr && def->name == "power") {
            slow = true;
            const auto on = parse_kernel_bool(arg.size() > key.size() ? arg.substr(key.size() + 1)
                                                                      : std::string());
            powers_on = powers_on || (on && *on && !entry.dev->powered());
        } else if (entry.dev->releases_queues(key)) {
            slow = true;
        }
    }
    if (slow) {
        auto j = job::make(job::kind::set, powers_on ? "starting" : "changing", entry, _ctx);
        j->writes = options;
        j->force = force;
        job::start(std::move(j), _wake);
        return std::nullopt;
    }
    std::vector<std::string> notes;
    result<void> outcome = apply_writes(_ctx, entry, options, force, notes);
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

result<nlohmann::json> device_host::set(std::string_view name,
                                        const std::vector<std::string>& options, bool force)
{
    auto now = begin_set(name, options, force);
    if (now) {
        return std::move(*now);
    }
    result<nlohmann::json> out = make_error(EIO, "set did not end");
    wait_for([&](reaped& r) {
        for (completion& c : r.completions) {
            if (c.name == name) {
                out = std::move(c.outcome);
                return true;
            }
        }
        return false;
    });
    return out;
}

nlohmann::json device_host::begin_recover(const std::vector<add_request>& then_add)
{
    for (const export_type* type : export_types()) {
        if (type->cleanup_stale) {
            type->cleanup_stale(_ctx);
        }
    }
    nlohmann::json failed = nlohmann::json::array();
    for (hosted_device& entry : read_state_files()) {
        if (entry.sequence == UINT64_MAX) {
            entry.sequence = _next_sequence;
        }
        _next_sequence = std::max(_next_sequence, entry.sequence + 1);
        if (!entry.failure.empty()) {
            spdlog::error(
                "cannot recover {}: {} (the state file stays; `softblk del {}` removes it)",
                entry.name, entry.failure, entry.name);
            failed.push_back({{"name", entry.name}, {"error", entry.failure}});
        } else {
            _recovery_jobs.push_back(job::make(job::kind::recover, "recovering", entry, _ctx));
        }
        const std::string name = entry.name;
        _devices.emplace(name, std::move(entry));
    }
    for (const add_request& request : then_add) {
        if (_devices.contains(request.name)) {
            continue;  // recovered
        }
        auto entry = prepare_add(request);
        if (!entry) {
            spdlog::error("add {}: {}", request.name, entry.error().message);
            continue;
        }
        entry->sequence = _next_sequence++;
        _recovery_jobs.push_back(job::make(job::kind::add, "adding", *entry, _ctx));
        const std::string name = entry->name;
        _devices.emplace(name, std::move(*entry));
    }
    if (!_recovery_jobs.empty()) {
        // One thread, in creation order, as the devices were made: a back
        // end that does not answer holds up the devices after it (for its
        // connect timeout), not the control thread.
        _recovery = std::thread([jobs = _recovery_jobs, wake = _wake] {
            for (const std::shared_ptr<job>& j : jobs) {
                j->run(*wake);
            }
        });
    }
    return failed;
}

nlohmann::json device_host::recover()
{
    nlohmann::json failed = begin_recover();
    std::vector<std::pair<uint64_t, std::string>> recovered;
    wait_for([&](reaped& r) {
        for (completion& c : r.completions) {
            if (c.method != "recover") {
                continue;
            }
            if (c.outcome) {
                auto it = _devices.find(c.name);
                recovered.emplace_back(it != _devices.end() ? it->second.sequence : 0, c.name);
            } else {
                failed.push_back({{"name", c.name}, {"error", c.outcome.error().message}});
            }
        }
        return !_recovery.joinable();
    });
    std::sort(recovered.begin(), recovered.end());
    nlohmann::json names = nlohmann::json::array();
    for (const auto& [sequence, name] : recovered) {
        names.push_back(name);
    }
    return {{"recovered", std::move(names)}, {"failed", std::move(failed)}};
}

bool device_host::finish_job(hosted_device& entry, job& j, reaped& out)
{
    const std::string name = entry.name;
    const auto pending_removal = entry.remove_after;
    entry.remove_after.reset();
    if (j.what == job::kind::set) {
        entry.dev = std::move(j.work.dev);
        entry.exp = std::move(j.work.exp);
        entry.restart_options = std::move(j.work.restart_options);
        // What was applied is recorded, even when a later write failed.
        entry.options = given_options(entry.dev->options());
        result<void> outcome = std::move(j.outcome);
        if (auto written = write_state(entry); !written && outcome) {
            outcome = written;
        }
        if (outcome) {
            nlohmann::json reply = summary(entry);
            reply["notes"] = j.notes;
            out.completions.push_back({name, "set", std::move(reply)});
        } else {
            out.completions.push_back({name, "set", std::unexpected(outcome.error())});
        }
        if (pending_removal) {
            start_teardown(entry, pending_removal->keep_state, pending_removal->force);
        }
        return true;
    }
    const bool recovering = j.what == job::kind::recover;
    const std::string method = j.method_name();
    if (!j.outcome) {
        const error& err = j.outcome.error();
        if (recovering) {
            spdlog::error(
                "cannot recover {}: {} (the state file stays; `softblk del {}` removes it)", name,
                err.message, name);
            entry.failure = err.message;
        } else {
            spdlog::warn("add {} {} [{}] export {}: {}", name, entry.type,
                         fmt::join(entry.options, " "), entry.export_type, err.message);
        }
        out.completions.push_back({name, method, std::unexpected(err)});
        if (pending_removal) {
            if (!pending_removal->keep_state) {
                remove_state(name);
            }
            out.removals.push_back({name, {}});
            return false;
        }
        return recovering;  // a failed recovery is listed until `del`
    }
    entry.dev = std::move(j.work.dev);
    entry.exp = std::move(j.work.exp);
    entry.options = std::move(j.work.options);
    entry.export_type = std::move(j.work.export_type);  // chosen when `add` named none
    entry.failure.clear();
    if (pending_removal) {
        // Deleted (or the daemon stopping) while it was being made: an add
        // fails, leaving no state file; a recovered device keeps its file
        // unless deleted.
        if (!recovering) {
            out.completions.push_back(
                {name, method,
                 pending_removal->keep_state
                     ? make_error(ESHUTDOWN, fmt::format("{}: the daemon stopped while it was "
                                                         "being added; it was not kept",
                                                         name))
                     : make_error(ECANCELED, fmt::format("{}: deleted (softblk del) while it "
                                                         "was being added",
                                                         name))});
        }
        // (An add has no state file to keep, and what it created goes.)
        start_teardown(entry, recovering && pending_removal->keep_state, pending_removal->force,
                       !recovering);
        return true;
    }
    if (!recovering) {
        if (auto written = write_state(entry); !written) {
            out.completions.push_back({name, method, std::unexpected(written.error())});
            start_teardown(entry, false, true, true);
            return true;
        }
    }
    spdlog::info("{} {} {} [{}] export {} [{}]{}", recovering ? "recovered" : "added", name,
                 entry.type, fmt::join(entry.options, " "), entry.export_type,
                 fmt::join(entry.export_options, " "), entry.dev->powered() ? "" : " powered off");
    for (const std::string& note : entry.dev->notes()) {
        spdlog::info("{}: {}", name, note);
    }
    out.completions.push_back({name, method, summary(entry)});
    return true;
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

}  // namespace softblk::host
