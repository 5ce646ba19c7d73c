#include "device_host.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <fstream>
#include <sstream>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <softblk/target.hpp>

#include "protocol.hpp"

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
        o["min"] = def.min;
        o["max"] = def.max;
        o["out_of_range"] = def.range == option_range::clamp ? "clamp" : "reject";
    } else if (def.kind == option_kind::signed_integer) {
        o["min"] = def.smin;
        o["max"] = def.smax;
        o["out_of_range"] = def.range == option_range::clamp ? "clamp" : "reject";
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
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        return make_error(errno, fmt::format("cannot open {}: {}", path, std::strerror(errno)));
    }
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

result<void> write_file_atomically(const std::string& path, const std::string& text)
{
    const std::string tmp = path + ".tmp";
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        return make_error(errno, fmt::format("cannot create {}: {}", tmp, std::strerror(errno)));
    }
    size_t done = 0;
    while (done < text.size()) {
        const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0) {
            const int e = errno;
            ::close(fd);
            ::unlink(tmp.c_str());
            return make_error(e, fmt::format("cannot write {}: {}", tmp, std::strerror(e)));
        }
        done += static_cast<size_t>(n);
    }
    if (::fsync(fd) != 0 || ::close(fd) != 0) {
        const int e = errno;
        ::unlink(tmp.c_str());
        return make_error(e, fmt::format("cannot write {}: {}", tmp, std::strerror(e)));
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
        const int e = errno;
        ::unlink(tmp.c_str());
        return make_error(e,
                          fmt::format("cannot rename {} to {}: {}", tmp, path, std::strerror(e)));
    }
    return {};
}

std::string join(const std::vector<std::string>& items, std::string_view sep)
{
    std::string out;
    for (const std::string& s : items) {
        if (!out.empty()) {
            out += sep;
        }
        out += s;
    }
    return out;
}

}  // namespace

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
                                      known.empty() ? "(none built in)" : join(known, ", ")));
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
            options.push_back(option_json(def));
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
    : _ctx(std::move(ctx)), _state_dir(std::move(state_dir))
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
    auto dev = device::create(entry.name, entry.type, entry.options);
    if (!dev) {
        return std::unexpected(dev.error());
    }
    std::unique_ptr<device_export> exp;
    if (entry.export_type != "none") {
        const export_type* type = find_export_type(entry.export_type);
        if (type == nullptr) {
            std::vector<std::string> known;
            for (const export_type* e : export_types()) {
                known.emplace_back(e->name);
            }
            known.emplace_back("none");
            return make_error(ENOENT, fmt::format("unknown export type '{}'; known types: {}",
                                                  entry.export_type, join(known, ", ")));
        }
        if (!export_available(*type)) {
            return make_error(ENODEV,
                              fmt::format("export type '{}' is not available on this machine ({})",
                                          entry.export_type, type->description));
        }
        auto started = start_export(*type, **dev, _ctx, entry.export_options);
        if (!started) {
            error err = started.error();
            err.message = fmt::format("export {}: {}", entry.export_type, err.message);
            return std::unexpected(std::move(err));
        }
        exp = std::move(*started);
    }
    entry.options = given_options((*dev)->options());
    entry.dev = std::move(*dev);
    entry.exp = std::move(exp);
    entry.failure.clear();
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
    return write_file_atomically(
        state_path(entry.name),
        state.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

result<nlohmann::json> device_host::add(const add_request& request)
{
    hosted_device entry;
    entry.type = request.type;
    if (entry.type.empty()) {
        return make_error(EINVAL, "no target type given (e.g. \"null\")");
    }
    entry.name = request.name.empty() ? next_name(entry.type) : request.name;
    if (!valid_device_name(entry.name)) {
        return make_error(EINVAL,
                          fmt::format("device name '{}' is not valid: 1 to 64 characters from "
                                      "A-Z a-z 0-9 _ - . not starting with a dot",
                                      entry.name));
    }
    if (_devices.contains(entry.name)) {
        return make_error(EEXIST, fmt::format("a device named '{}' exists already", entry.name));
    }
    entry.options = request.options;
    entry.export_type = request.export_type.empty() ? default_export_type() : request.export_type;
    entry.export_options = request.export_options;
    if (entry.export_type == "none" && !entry.export_options.empty()) {
        return make_error(EINVAL, fmt::format("export options ({}) given without an export",
                                              join(entry.export_options, " ")));
    }
    entry.sequence = _next_sequence;
    if (auto created = create(entry); !created) {
        spdlog::warn("add {} {} [{}] export {}: {}", entry.name, entry.type,
                     join(request.options, " "), entry.export_type, created.error().message);
        return std::unexpected(created.error());
    }
    if (auto written = write_state(entry); !written) {
        if (entry.exp) {
            (void)entry.exp->stop();
        }
        return std::unexpected(written.error());
    }
    ++_next_sequence;
    spdlog::info("added {} {} [{}] export {} [{}]", entry.name, entry.type,
                 join(entry.options, " "), entry.export_type, join(entry.export_options, " "));
    const std::string name = entry.name;
    auto [it, inserted] = _devices.emplace(name, std::move(entry));
    nlohmann::json out;
    out["name"] = name;
    out["type"] = it->second.type;
    out["capacity_bytes"] = it->second.dev->limits().capacity_bytes;
    out["logical_block_size"] = it->second.dev->limits().logical_block_size;
    out["options"] = it->second.options;
    nlohmann::json exp = it->second.exp ? it->second.exp->describe() : nlohmann::json::object();
    exp["type"] = it->second.export_type;
    out["export"] = std::move(exp);
    return out;
}

result<nlohmann::json> device_host::remove(std::string_view name)
{
    auto it = _devices.find(name);
    if (it == _devices.end()) {
        return make_error(ENOENT, fmt::format("no device named '{}'", name));
    }
    hosted_device& entry = it->second;
    if (entry.exp) {
        if (auto stopped = entry.exp->stop(); !stopped) {
            spdlog::warn("del {}: export {} did not stop: {}", entry.name, entry.export_type,
                         stopped.error().message);
            error err = stopped.error();
            err.message = fmt::format("{}: the {} export did not stop, the device stays: {}",
                                      entry.name, entry.export_type, err.message);
            return std::unexpected(std::move(err));
        }
        entry.exp.reset();
    }
    entry.dev.reset();
    const std::string path = state_path(entry.name);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
        spdlog::warn("del {}: cannot remove {}: {}", entry.name, path, std::strerror(errno));
    }
    spdlog::info("deleted {}", entry.name);
    nlohmann::json out = {{"name", entry.name}};
    _devices.erase(it);
    return out;
}

result<nlohmann::json> device_host::remove_all()
{
    std::vector<std::string> names;
    for (const auto& [name, entry] : _devices) {
        names.push_back(name);
    }
    nlohmann::json deleted = nlohmann::json::array();
    std::vector<std::string> failures;
    int code = 0;
    for (const std::string& name : names) {
        auto removed = remove(name);
        if (removed) {
            deleted.push_back(name);
        } else {
            failures.push_back(removed.error().message);
            code = removed.error().code.value();
        }
    }
    if (!failures.empty()) {
        return make_error(
            code != 0 ? code : EBUSY,
            fmt::format("{} device(s) stayed: {}", failures.size(), join(failures, "; ")));
    }
    return nlohmann::json{{"deleted", std::move(deleted)}};
}

nlohmann::json device_host::entry_json(const hosted_device& entry) const
{
    nlohmann::json d = nlohmann::json::object();
    if (entry.dev) {
        entry.dev->describe(d);
        d["state"] = "running";
    } else {
        d["name"] = entry.name;
        d["type"] = entry.type;
        d["state"] = "failed";
        d["error"] = entry.failure;
    }
    d["options"] = entry.options;
    nlohmann::json exp = entry.exp ? entry.exp->describe() : nlohmann::json::object();
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
                         join(entry.options, " "), entry.export_type);
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
    for (auto& [name, entry] : _devices) {
        if (entry.exp) {
            if (auto stopped = entry.exp->stop(); !stopped) {
                spdlog::warn("{}: export {} did not stop cleanly: {}", name, entry.export_type,
                             stopped.error().message);
            }
            entry.exp.reset();
        }
        entry.dev.reset();
    }
    _devices.clear();
}

}  // namespace softblk::cli
