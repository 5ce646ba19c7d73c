// Opening the IMAGE argument of `softblk fat`. See cli_target.hpp.
#include "cli_target.hpp"

#include <cerrno>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <softblk/frontend.hpp>

#if defined(SOFTBLK_FAT_HAVE_DEVICE)
#include <softblk/fat/softblk_adapter.hpp>
#endif
#if defined(SOFTBLK_FAT_HAVE_NBD)
#include <softblk/fat/nbd_adapter.hpp>
#endif

namespace softblk::fat::detail {

namespace {

using device_result = result<std::unique_ptr<block_device>>;

// Opens the export as its front end says (export_type::reach): the first
// of its paths that opens (O_DIRECT where aligned), its NBD URI through
// libnbd, or the softblk target that drives it. `type` names the export in
// errors, with the front end's hint and `recreate` (how to re-create the
// device with an export that any user can reach).
device_result open_reach(const std::string& spec, const export_reach& how, const std::string& type,
                         bool read_only, uint32_t block_size, const std::string& recreate)
{
    if (!how.paths.empty()) {
        error last{};
        for (const std::string& path : how.paths) {
            if (path.empty()) {
                continue;
            }
            auto dev = file_block_device::open(path, read_only, block_size, true);
            if (dev) {
                return std::unique_ptr<block_device>(std::move(*dev));
            }
            last = dev.error();
        }
        if (last.message.empty()) {
            return make_error(ENOENT,
                              fmt::format("{}: the {} export names no path to open", spec, type));
        }
        return make_error(
            last.code.value(),
            fmt::format("{}: its {} export cannot be opened here: {}{}; or re-create it with an "
                        "export any user can reach: {}",
                        spec, type, last.message, how.hint.empty() ? "" : " (" + how.hint + ")",
                        recreate));
    }
    if (!how.nbd_uri.empty()) {
#if defined(SOFTBLK_FAT_HAVE_NBD)
        auto dev = nbd_block_device::connect(how.nbd_uri, read_only, block_size);
        if (!dev) {
            return make_error(dev.error().code.value(),
                              fmt::format("{}: {}", spec, dev.error().message));
        }
        return std::unique_ptr<block_device>(std::move(*dev));
#else
        return make_error(ENOTSUP,
                          fmt::format("{}: the device is exported as an NBD URI ({} export), "
                                      "and this build has no libnbd (install libnbd-dev and "
                                      "rebuild)",
                                      spec, type));
#endif
    }
    if (!how.target_type.empty()) {
#if defined(SOFTBLK_FAT_HAVE_DEVICE)
        auto dev = softblk_block_device::create("fat0", how.target_type, how.target_options);
        if (!dev) {
            return make_error(
                dev.error().code.value(),
                fmt::format("{}: through its {} export: {}", spec, type, dev.error().message));
        }
        return std::unique_ptr<block_device>(std::move(*dev));
#else
        return make_error(ENOTSUP,
                          fmt::format("{}: the device is exported over {}, and this build has no "
                                      "softblk devices to drive it with",
                                      spec, type));
#endif
    }
    return make_error(ENOTSUP,
                      fmt::format("{}: the {} export says no way to reach it", spec, type));
}

// A device hosted by the softblk daemon: asks the daemon where it is
// exported and opens that export from this process as its front end says
// (open_reach).
device_result open_daemon_device(const std::string& name, bool read_only, daemon_directory* daemon)
{
    const std::string spec = "softblk:" + name;
    if (daemon == nullptr) {
        return make_error(ENOTSUP,
                          fmt::format("{}: this program does not reach the softblk daemon; "
                                      "run `softblk fat ...`, or give the device's export "
                                      "(its FUSE file or block node) as the image",
                                      spec));
    }
    auto list = daemon->devices();
    if (!list) {
        return make_error(list.error().code.value(),
                          fmt::format("{}: {}", spec, list.error().message));
    }
    const daemon_device* found = nullptr;
    std::string names;
    for (const auto& d : *list) {
        if (d.name == name) {
            found = &d;
        }
        names += names.empty() ? d.name : ", " + d.name;
    }
    if (found == nullptr) {
        return make_error(
            ENOENT,
            fmt::format("{}: the daemon at {} has no device \"{}\" (its devices: {}); create it "
                        "with `softblk add null memory_backed=1 size=1024 --name {} --export "
                        "nbd`, or write softblk:TYPE:OPTIONS for a device that lives only in "
                        "this process",
                        spec, daemon->location(), name, names.empty() ? "none" : names, name));
    }
    const daemon_device& d = *found;
    if (d.state != "running") {
        return make_error(
            EIO,
            fmt::format("{}: the device is {} in the daemon: {} (see `softblk list`)", spec,
                        d.state.empty() ? "?" : d.state, d.error.empty() ? "no reason" : d.error));
    }
    std::string recreate =
        fmt::format("softblk del {0} && softblk add {1}", name, d.type.empty() ? "TYPE" : d.type);
    for (const auto& o : d.options) {
        recreate += " " + o;
    }
    recreate += fmt::format(" --name {} --export nbd", name);

    const std::string& type = d.export_type;
    // How this process reaches the export is the front end's to say
    // (export_type::reach): paths to open, an NBD URI or a softblk target
    // that drives it.
    const export_type* front_end = find_export_type(type);
    if (front_end != nullptr && front_end->reach) {
        nlohmann::json description = nlohmann::json::object();
        for (const auto& [key, value] : d.export_location) {
            description[key] = value;
        }
        auto how = front_end->reach(description);
        if (!how) {
            return make_error(how.error().code.value(),
                              fmt::format("{}: {}", spec, how.error().message));
        }
        return open_reach(spec, *how, type, read_only, d.logical_block_size, recreate);
    }
    if (type == "none" || type.empty()) {
        return make_error(ENODEV,
                          fmt::format("{}: the device has no export, so only the daemon can "
                                      "reach it; re-create it with one (this loses its "
                                      "data): {}",
                                      spec, recreate));
    }
    std::vector<std::string_view> reachable;
    for (const export_type* e : export_types()) {
        if (e->reach) {
            reachable.push_back(e->name);
        }
    }
    return make_error(ENOTSUP,
                      fmt::format("{}: its export ({}) cannot be opened by softblk fat; use "
                                  "one of these exports: {}: {}",
                                  spec, type, fmt::join(reachable, ", "), recreate));
}

}  // namespace

device_result open_target(const std::string& spec, bool read_only, uint64_t create_size,
                          daemon_directory* daemon)
{
    if (spec.rfind("softblk:", 0) == 0) {
        if (create_size != 0) {
            return make_error(EINVAL, fmt::format("{}: --size applies to image files; a softblk "
                                                  "device has its own size",
                                                  spec));
        }
        std::string rest = spec.substr(8);
        size_t colon = rest.find(':');
        if (colon == std::string::npos) {
            return open_daemon_device(rest, read_only, daemon);
        }
#if defined(SOFTBLK_FAT_HAVE_DEVICE)
        std::string type = rest.substr(0, colon);
        std::vector<std::string> options;
        std::string list = rest.substr(colon + 1);
        size_t i = 0;
        while (i <= list.size()) {
            size_t j = list.find(',', i);
            if (j == std::string::npos) {
                j = list.size();
            }
            if (j > i) {
                options.push_back(list.substr(i, j - i));
            }
            i = j + 1;
        }
        auto dev = softblk_block_device::create("fat0", type, options);
        if (!dev) {
            return std::unexpected(dev.error());
        }
        return std::unique_ptr<block_device>(std::move(*dev));
#else
        return make_error(ENOTSUP, "softblk devices are not available in this build");
#endif
    }
    if (create_size != 0) {
        auto dev = file_block_device::create(spec, create_size);
        if (!dev) {
            return std::unexpected(dev.error());
        }
        return std::unique_ptr<block_device>(std::move(*dev));
    }
    auto dev = file_block_device::open(spec, read_only);
    if (!dev) {
        return std::unexpected(dev.error());
    }
    return std::unique_ptr<block_device>(std::move(*dev));
}

}  // namespace softblk::fat::detail
