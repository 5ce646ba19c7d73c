// `softblk fat ...`: the FAT library's tools (softblk::fat::cli_main), with
// `softblk:NAME` found through this daemon's `list`.
#include <fmt/format.h>

#include <softblk/fat/cli.hpp>

#include "run_dir.hpp"
#include "subcommand.hpp"

namespace softblk::cli {

namespace {

using nlohmann::json;

// How `softblk fat ... softblk:NAME` finds NAME: this daemon's `list`,
// translated into what the FAT tools need (they know nothing of the
// protocol). Connects at the first question; never starts a daemon.
class fat_daemon_directory final : public softblk::fat::daemon_directory {
public:
    std::string location() const override
    {
        auto paths = resolve_run_paths();
        return paths ? paths->dir : std::string("(no run directory)");
    }

    softblk::result<std::vector<softblk::fat::daemon_device>> devices() override
    {
        auto paths = resolve_run_paths();
        if (!paths) {
            return std::unexpected(paths.error());
        }
        auto client = control_client::connect(*paths, false);
        if (!client) {
            return softblk::make_error(
                client.error().code.value(),
                fmt::format("no softblk daemon answers at {} ({}); `softblk list` starts one (it "
                            "brings back the devices it kept) and shows the devices, `softblk "
                            "add` creates one",
                            paths->socket, client.error().message));
        }
        auto list = client->call("list", json::object());
        if (!list) {
            return std::unexpected(list.error());
        }
        std::vector<softblk::fat::daemon_device> out;
        for (const auto& d : *list) {
            softblk::fat::daemon_device dev;
            dev.name = d.value("name", std::string());
            dev.type = d.value("type", std::string());
            for (const auto& o : d.value("options", json::array())) {
                if (o.is_string()) {
                    dev.options.push_back(o.get<std::string>());
                }
            }
            dev.state = d.value("state", std::string());
            dev.error = d.value("error", std::string());
            dev.logical_block_size = d.value("logical_block_size", 512u);
            const json exp = d.value("export", json::object());
            dev.export_type = exp.is_object() ? exp.value("type", std::string("none")) : "none";
            for (auto& [key, value] : export_paths(exp)) {
                dev.export_location[key] = value;
            }
            out.push_back(std::move(dev));
        }
        return out;
    }
};

}  // namespace

int run_fat(int argc, char** argv)
{
    fat_daemon_directory daemon;
    return fat::cli_main(argc, argv, &daemon);
}

}  // namespace softblk::cli
