// Helpers of the virtio tests: a softblk device exported over
// vhost-user-blk in this process (the back end), a temporary socket
// directory, the export's counters, and the shared fake zoned target with
// data ("vzoned_fake") for the zoned virtio-blk path.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <softblk/device.hpp>
#include <softblk/frontend.hpp>
#include <softblk/target.hpp>

#include "../support/fake_zoned_target.hpp"

namespace softblk::test {

// A private directory for sockets, removed at the end.
struct temp_dir {
    temp_dir()
    {
        char tmpl[] = "/tmp/softblk-virtio-test.XXXXXX";
        path = ::mkdtemp(tmpl);
    }
    ~temp_dir() { std::filesystem::remove_all(path); }
    std::string path;
};

// A device of `type` served by an in-process vhost-user-blk export.
struct backend {
    backend(const std::string& type, std::vector<std::string> options,
            std::vector<std::string> export_options = {}, std::string name = "vback")
    {
        auto d = device::create(name, type, options);
        EXPECT_TRUE(d.has_value()) << (d ? "" : d.error().message);
        if (!d) {
            return;
        }
        dev = std::move(*d);
        socket = dir.path + "/" + name + ".sock";
        export_options.push_back("socket=" + socket);
        const export_type* t = find_export_type("vhost-user-blk");
        EXPECT_NE(t, nullptr);
        auto e = start_export(*t, *dev, export_context{dir.path, false}, export_options);
        EXPECT_TRUE(e.has_value()) << (e ? "" : e.error().message);
        if (e) {
            exp = std::move(*e);
        }
    }
    ~backend()
    {
        if (exp) {
            (void)exp->stop();
        }
    }
    // One of the export's counters ("flush", "bad_requests" ...).
    uint64_t stat(const char* name) const { return exp->describe()["stats"][name].get<uint64_t>(); }

    temp_dir dir;
    std::unique_ptr<device> dev;
    std::unique_ptr<device_export> exp;
    std::string socket;
};

// A virtio device (softblk's driver) on `socket`.
inline std::unique_ptr<device> make_virtio(const std::string& socket,
                                           std::vector<std::string> options = {},
                                           std::string name = "vfront")
{
    options.push_back("path=" + socket);
    auto d = device::create(name, "virtio", options);
    EXPECT_TRUE(d.has_value()) << (d ? "" : d.error().message);
    return d ? std::move(*d) : nullptr;
}

// ---------------------------------------------------------------- zones
// "vzoned_fake": 16 zones of 1 MiB (768 KiB writable), the first 2
// conventional, with their data (tests/support/fake_zoned_target.hpp).
inline constexpr fake_zoned_geometry k_vzoned{.zones = 16,
                                              .zone_bytes = 1 << 20,
                                              .capacity_bytes = 768 << 10,
                                              .conventional = 2,
                                              .max_open = 4,
                                              .max_active = 6,
                                              .max_append_bytes = 64 << 10,
                                              .max_transfer_bytes = 256 << 10};
inline const bool k_vzoned_registered = register_fake_zoned(
    "vzoned_fake", "fake zoned target with data, for the virtio tests", k_vzoned);

}  // namespace softblk::test
