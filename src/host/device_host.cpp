#include "device_host.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <softblk/support/trusted_dir.hpp>
#include <softblk/memory_store.hpp>

#include "device_config.hpp"
#include "device_work.hpp"
#include "json_params.hpp"
#include "run_dir.hpp"

namespace softblk::host {

namespace {

constexpr int k_state_version = 1;
constexpr size_t k_max_state_bytes = 1u << 20;

int64_t ms_since(std::chrono::steady_clock::time_point since)
{
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                 since)
        .count();
}

}  // namespace

void device_host::teardown::run(const std::string& name, const std::string& export_type,
                                const wake_event& wake)
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
        if (undo_create) {
            dev->undo_create();
        }
        dev.reset();
    }
    finished.store(true, std::memory_order_release);
    wake.notify();
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

void device_host::remove_state(const std::string& name) const
{
    const std::string path = state_path(name);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
        spdlog::warn("del {}: cannot remove {}: {}", name, path, std::strerror(errno));
    }
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

result<void> device_host::write_state(const hosted_device& entry) const
{
    nlohmann::json state;
    state["version"] = k_state_version;
    state["name"] = entry.name;
    state["type"] = entry.type;
    state["options"] = entry.options;
    state["export"] = {{"type", entry.export_type}, {"options", entry.export_options}};
    state["sequence"] = entry.sequence;
    if (!entry.config.empty()) {
        state["config"] = entry.config;
    }
    if (entry.dev) {
        // Every effective value, for a person reading the file; recovery
        // uses "options".
        state["effective_options"] = entry.dev->options().to_args();
    }
    return write_file_atomically(
        state_path(entry.name),
        state.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n", 0600, true);
}

result<void> device_host::not_running(const hosted_device& entry)
{
    if (entry.stopping || entry.remove_after) {
        return make_error(EBUSY, fmt::format("{} is being removed", entry.name));
    }
    if (entry.busy) {
        return make_error(
            EBUSY, fmt::format("{} is {} (since {} ms); try again once `softblk "
                               "list` shows it running",
                               entry.name, entry.busy->label, ms_since(entry.busy->started)));
    }
    if (!entry.dev) {
        return make_error(EINVAL, fmt::format("{} failed to recover ({}); `softblk del {}` "
                                              "removes it",
                                              entry.name, entry.failure, entry.name));
    }
    return {};
}

result<nlohmann::json> device_host::get(std::string_view name,
                                        const std::vector<std::string>& keys) const
{
    auto it = _devices.find(name);
    if (it == _devices.end()) {
        return make_error(ENOENT, fmt::format("no device named '{}'", name));
    }
    const hosted_device& entry = it->second;
    if (auto unusable = not_running(entry); !unusable) {
        return std::unexpected(unusable.error());
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
    if (auto unusable = not_running(entry); !unusable) {
        return std::unexpected(unusable.error());
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
    if (entry.stopping || entry.remove_after) {
        const std::chrono::steady_clock::time_point since =
            entry.stopping ? entry.stopping->started : entry.remove_after->since;
        return make_error(EBUSY, fmt::format("{} is being removed already (since {} s)", entry.name,
                                             ms_since(since) / 1000));
    }
    if (entry.busy) {
        // The job owns the device: it goes when the job ends (a recovery
        // still waiting its turn does not begin).
        entry.remove_after = hosted_device::removal_request{
            .keep_state = keep_state, .force = force, .since = std::chrono::steady_clock::now()};
        entry.busy->cancelled.store(true, std::memory_order_release);
        return {};
    }
    if (!entry.dev) {
        // A failed recovery: nothing runs.
        if (!keep_state) {
            remove_state(entry.name);
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
    start_teardown(entry, keep_state, force);
    return {};
}

void device_host::start_teardown(hosted_device& entry, bool keep_state, bool force,
                                 bool undo_create)
{
    auto teardown_job = std::make_shared<teardown>();
    teardown_job->exp = std::move(entry.exp);
    teardown_job->dev = std::move(entry.dev);
    teardown_job->keep_state = keep_state;
    teardown_job->force = force;
    teardown_job->undo_create = undo_create;
    teardown_job->started = std::chrono::steady_clock::now();
    entry.stopping = teardown_job;
    // The thread holds the job and the wake event: both outlive a host
    // that gave up on it (abandon_stopping).
    teardown_job->thread =
        std::thread([teardown_job, wake = _wake, name = entry.name, type = entry.export_type] {
            teardown_job->run(name, type, *wake);
        });
}

device_host::reaped device_host::reap()
{
    reaped out;
    // Jobs first: one that ended may start a teardown.
    for (auto it = _devices.begin(); it != _devices.end();) {
        hosted_device& entry = it->second;
        if (!entry.busy || !entry.busy->finished.load(std::memory_order_acquire)) {
            ++it;
            continue;
        }
        std::shared_ptr<job> j = std::move(entry.busy);
        if (j->thread.joinable()) {
            j->thread.join();
        }
        if (finish_job(entry, *j, out)) {
            ++it;
        } else {
            it = _devices.erase(it);
        }
    }
    if (_recovery.joinable() &&
        std::all_of(_recovery_jobs.begin(), _recovery_jobs.end(), [&](const auto& j) {
            auto it = _devices.find(j->work.name);
            return it == _devices.end() || it->second.busy != j;
        })) {
        _recovery.join();
        _recovery_jobs.clear();
    }
    for (auto it = _devices.begin(); it != _devices.end();) {
        hosted_device& entry = it->second;
        if (!entry.stopping || !entry.stopping->finished.load(std::memory_order_acquire)) {
            ++it;
            continue;
        }
        std::shared_ptr<teardown> teardown_job = std::move(entry.stopping);
        teardown_job->thread.join();
        if (!teardown_job->outcome) {
            // The export refused to stop: the device runs on as it was.
            entry.exp = std::move(teardown_job->exp);
            entry.dev = std::move(teardown_job->dev);
            spdlog::warn("del {}: export {} did not stop: {}", entry.name, entry.export_type,
                         teardown_job->outcome.error().message);
            error err = teardown_job->outcome.error();
            err.message = fmt::format("{}: the {} export did not stop, the device stays: {}",
                                      entry.name, entry.export_type, err.message);
            out.removals.push_back({entry.name, std::unexpected(std::move(err))});
            ++it;
            continue;
        }
        if (!teardown_job->keep_state) {
            remove_state(entry.name);
            spdlog::info("deleted {}", entry.name);
        } else {
            spdlog::info("stopped {}; its state stays for the next daemon", entry.name);
        }
        out.removals.push_back({entry.name, {}});
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
        if (entry.exp && !entry.stopping && !entry.busy) {
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
        if ((entry.stopping && entry.stopping->started < before) ||
            (entry.remove_after && entry.remove_after->since < before)) {
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
        if (!entry.stopping && !entry.busy) {
            ++it;
            continue;
        }
        const bool deleting = entry.stopping
                                  ? !entry.stopping->keep_state
                                  : entry.remove_after && !entry.remove_after->keep_state;
        // An add that never ended has no state file of its own yet.
        const bool added = entry.busy && entry.busy->what == job::kind::add;
        if (deleting && !added) {
            ::unlink(state_path(entry.name).c_str());
        }
        if (entry.stopping) {
            entry.stopping->thread.detach();
        } else {
            entry.busy->cancelled.store(true, std::memory_order_release);
            if (entry.busy->thread.joinable()) {
                entry.busy->thread.detach();
            }
        }
        out.push_back(entry.name);
        it = _devices.erase(it);
    }
    if (_recovery.joinable()) {
        // Its jobs not begun are cancelled above; it ends after the one it
        // runs, holding its jobs.
        _recovery.detach();
    }
    _recovery_jobs.clear();
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
    return it != _devices.end() &&
           (it->second.stopping != nullptr || it->second.remove_after.has_value());
}

std::string device_host::busy(std::string_view name) const
{
    auto it = _devices.find(name);
    return it != _devices.end() && it->second.busy ? it->second.busy->label : std::string();
}

std::vector<std::string> device_host::recovering() const
{
    std::vector<std::string> out;
    for (const std::shared_ptr<job>& j : _recovery_jobs) {
        auto it = _devices.find(j->work.name);
        if (it != _devices.end() && it->second.busy == j) {
            out.push_back(j->work.name);
        }
    }
    return out;
}

size_t device_host::running() const
{
    return static_cast<size_t>(std::count_if(_devices.begin(), _devices.end(), [](const auto& e) {
        return e.second.dev != nullptr && !e.second.stopping && !e.second.busy;
    }));
}

void device_host::wait_for(const std::function<bool(reaped&)>& done)
{
    for (;;) {
        reaped r = reap();
        if (done(r)) {
            return;
        }
        pollfd p{_wake->fd, POLLIN, 0};
        (void)::poll(&p, 1, 10);
        clear_wake();
    }
}

result<nlohmann::json> device_host::remove(std::string_view name)
{
    const std::string key(name);
    if (auto started = begin_remove(key, false, false); !started) {
        return std::unexpected(started.error());
    }
    if (!_devices.contains(key)) {
        return nlohmann::json{{"name", key}};  // a failed entry, gone at once
    }
    result<void> outcome;
    wait_for([&](reaped& r) {
        for (removal& done : r.removals) {
            if (done.name == key) {
                outcome = std::move(done.outcome);
                return true;
            }
        }
        return false;
    });
    if (!outcome) {
        return std::unexpected(outcome.error());
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
    wait_for([&](reaped& done) {
        for (removal& r : done.removals) {
            auto it = std::find(waiting.begin(), waiting.end(), r.name);
            if (it == waiting.end()) {
                continue;
            }
            waiting.erase(it);
            if (r.outcome) {
                deleted.push_back(r.name);
            } else {
                failures.push_back(r.outcome.error().message);
                code = r.outcome.error().code.value();
            }
        }
        return waiting.empty();
    });
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
        d["stopping_ms"] = ms_since(entry.stopping->started);
    } else if (entry.busy) {
        // A job has the device (or is making it): nothing is read from it.
        d["name"] = entry.name;
        d["type"] = entry.type;
        d["state"] = entry.busy->label;
        d["busy_ms"] = ms_since(entry.busy->started);
        if (entry.remove_after) {
            d["removing"] = true;
        }
    } else if (entry.dev) {
        entry.dev->describe(d);
        d["state"] = entry.dev->powered() ? "running" : "off";
        // Memory against the budgets: what the device holds (its data and
        // its tables, memory_store.hpp), its own limit and the daemon's,
        // which every device shares.
        const nlohmann::json& target = d["target"];
        d["memory"] = {
            {"used_bytes", entry.dev->memory_bytes()},
            {"limit_bytes",
             target.is_object() ? target.value("memory_limit_bytes", uint64_t{0}) : uint64_t{0}},
            {"daemon_used_bytes", daemon.used()},
            {"daemon_limit_bytes", daemon.limit()},
        };
        // The kind of chunk its store takes and why (huge_pages).
        if (target.is_object() && target.contains("chunks")) {
            d["memory"]["chunks"] = target["chunks"];
        }
    } else {
        d["name"] = entry.name;
        d["type"] = entry.type;
        d["state"] = "failed";
        d["error"] = entry.failure;
    }
    d["options"] = entry.options;
    if (!entry.config.empty()) {
        d["config"] = entry.config;
        if (std::string note = restart_data_note(d.value("target", nlohmann::json()));
            !note.empty()) {
            d["data"] = std::move(note);
        }
    }
    nlohmann::json exp = entry.exp && !entry.stopping && !entry.busy ? entry.exp->describe()
                                                                     : nlohmann::json::object();
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

result<void> device_host::read_state_file(const std::string& file, hosted_device& entry) const
{
    entry.name = file.substr(0, file.size() - 5);
    entry.export_type = "none";
    entry.sequence = UINT64_MAX;
    auto text = read_small_file(_state_dir + "/" + file, k_max_state_bytes);
    if (!text) {
        return std::unexpected(text.error());
    }
    nlohmann::json state = nlohmann::json::parse(*text, nullptr, false);
    if (state.is_discarded() || !state.is_object()) {
        return make_error(EINVAL, fmt::format("{}: not a JSON object", file));
    }
    auto name = param_string(state, "name", true);
    auto type = param_string(state, "type", true);
    auto options = param_strings(state, "options");
    const nlohmann::json exp = state.value("export", nlohmann::json::object());
    auto export_type = exp.is_object()
                           ? param_string(exp, "type", false, "none")
                           : result<std::string>(make_error(EINVAL, "\"export\" is not an object"));
    auto export_options =
        exp.is_object() ? param_strings(exp, "options") : result<std::vector<std::string>>();
    auto config = param_string(state, "config", false);
    if (auto seq = state.find("sequence"); seq != state.end() && seq->is_number_unsigned()) {
        entry.sequence = seq->get<uint64_t>();
    }
    for (const auto* err :
         {name ? nullptr : &name.error(), type ? nullptr : &type.error(),
          options ? nullptr : &options.error(), export_type ? nullptr : &export_type.error(),
          export_options ? nullptr : &export_options.error(), config ? nullptr : &config.error()}) {
        if (err != nullptr) {
            return make_error(err->code.value(), fmt::format("{}: {}", file, err->message));
        }
    }
    if (*name != entry.name || !valid_device_name(*name)) {
        return make_error(EINVAL, fmt::format("{}: names device '{}'", file, *name));
    }
    entry.type = *type;
    entry.options = *options;
    entry.export_type = *export_type;
    entry.export_options = *export_options;
    entry.config = *config;
    return {};
}

result<saved_device> device_host::read_saved(std::string_view name) const
{
    if (!valid_device_name(name)) {
        return make_error(EINVAL, fmt::format("'{}' is not a device name", name));
    }
    hosted_device entry;
    if (auto read = read_state_file(fmt::format("{}.json", name), entry); !read) {
        if (read.error().code.value() == ENOENT) {
            return make_error(ENOENT, fmt::format("{}: no saved settings ({} is missing)", name,
                                                  state_path(name)));
        }
        return std::unexpected(read.error());
    }
    return saved_device{.name = std::move(entry.name),
                        .type = std::move(entry.type),
                        .options = std::move(entry.options),
                        .export_type = std::move(entry.export_type),
                        .export_options = std::move(entry.export_options)};
}

std::vector<device_host::hosted_device> device_host::read_state_files()
{
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
        if (auto read = read_state_file(file, entry); !read) {
            entry.failure = std::move(read.error().message);
        }
        entries.push_back(std::move(entry));
    }
    std::sort(entries.begin(), entries.end(), [](const hosted_device& a, const hosted_device& b) {
        return a.sequence != b.sequence ? a.sequence < b.sequence : a.name < b.name;
    });
    return entries;
}

void device_host::stop_all()
{
    // Jobs end first (a removal asked for meanwhile waits for them), then
    // the teardowns; nothing is left behind, however long it takes.
    for (const std::string& name : names()) {
        if (!stopping(name)) {
            (void)begin_remove(name, true, true);
        }
    }
    wait_for([&](reaped&) {
        for (const std::string& name : names()) {
            if (!stopping(name)) {
                (void)begin_remove(name, true, true);  // an export that refused, or a job's
            }
        }
        return _devices.empty() && !_recovery.joinable();
    });
}

}  // namespace softblk::host
