// Opening the IMAGE argument of `softblk fat`. See cli_target.hpp.
#include "cli_target.hpp"

#include <cerrno>

#include <fmt/format.h>

#if defined(SOFTBLK_FAT_HAVE_DEVICE)
#include <softblk/fat/softblk_adapter.hpp>
#endif
#if defined(SOFTBLK_FAT_HAVE_NBD)
#include <softblk/fat/nbd_adapter.hpp>
#endif

namespace softblk::fat::detail {

namespace {

using device_result = result<std::unique_ptr<block_device>>;

// A device hosted by the softblk daemon: asks the daemon where it is
// exported and opens that export from this process: a ublk block node or a
// FUSE-exported file (O_DIRECT where aligned), an NBD export through
// libnbd, or a vhost-user-blk export through softblk's virtio-blk driver.
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

    auto open_path = [&](const std::string& key) -> device_result {
        auto it = d.export_location.find(key);
        if (it == d.export_location.end() || it->second.empty()) {
            return make_error(ENOENT, fmt::format("the {} export names no {}", d.export_type, key));
        }
        auto dev = file_block_device::open(it->second, read_only, d.logical_block_size, true);
        if (!dev) {
            return std::unexpected(dev.error());
        }
        return std::unique_ptr<block_device>(std::move(*dev));
    };
    const std::string& type = d.export_type;
    if (type == "ublk") {
        auto dev = open_path("block");
        if (!dev) {
            return make_error(
                dev.error().code.value(),
                fmt::format("{}: its ublk block device cannot be opened here: {} (ublk "
                            "nodes belong to root unless the export is unprivileged)",
                            spec, dev.error().message));
        }
        return dev;
    }
    if (type == "fuse") {
        // The file the daemon serves through FUSE: one hop less than its
        // loop device, which sits on the same file.
        auto dev = open_path("file");
        if (!dev && d.export_location.contains("loop")) {
            dev = open_path("loop");
        }
        if (!dev) {
            return make_error(
                dev.error().code.value(),
                fmt::format("{}: its FUSE-exported file cannot be opened here: {} (the "
                            "FUSE mount admits only the daemon's user; run as that "
                            "user, or export the device over NBD: {})",
                            spec, dev.error().message, recreate));
        }
        return dev;
    }
    if (type == "nbd") {
#if defined(SOFTBLK_FAT_HAVE_NBD)
        auto it = d.export_location.find("uri");
        auto dev = nbd_block_device::connect(it != d.export_location.end() ? it->second : "",
                                             read_only, d.logical_block_size);
        if (!dev) {
            return make_error(dev.error().code.value(),
                              fmt::format("{}: {}", spec, dev.error().message));
        }
        return std::unique_ptr<block_device>(std::move(*dev));
#else
        return make_error(ENOTSUP,
                          fmt::format("{}: the device is exported over NBD, and this build "
                                      "has no libnbd (install libnbd-dev and rebuild)",
                                      spec));
#endif
    }
    if (type == "vhost-user-blk") {
#if defined(SOFTBLK_FAT_HAVE_DEVICE)
        // softblk's own virtio-blk driver on the export's socket. The export
        // serves one front end at a time: while a VM is attached, this waits
        // for the driver's connect_timeout and fails naming the socket.
        auto it = d.export_location.find("socket");
        std::vector<std::string> options = {
            "path=" + (it != d.export_location.end() ? it->second : std::string()),
            "poll_queues=0"};
        auto dev = softblk_block_device::create("fat0", "virtio", options);
        if (!dev) {
            return make_error(dev.error().code.value(),
                              fmt::format("{}: through its vhost-user-blk export: {}", spec,
                                          dev.error().message));
        }
        return std::unique_ptr<block_device>(std::move(*dev));
#else
        return make_error(ENOTSUP,
                          fmt::format("{}: the device is exported over vhost-user-blk, and this "
                                      "build has no softblk devices to drive it with",
                                      spec));
#endif
    }
    if (type == "none" || type.empty()) {
        return make_error(ENODEV,
                          fmt::format("{}: the device has no export, so only the daemon can "
                                      "reach it; re-create it with one (this loses its "
                                      "data): {}",
                                      spec, recreate));
    }
    return make_error(ENOTSUP,
                      fmt::format("{}: its export ({}) cannot be opened by softblk fat; use "
                                  "an nbd, fuse, ublk or vhost-user-blk export: {}",
                                  spec, type, recreate));
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
