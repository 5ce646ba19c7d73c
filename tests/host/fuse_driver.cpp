// softblk-fuse-driver: a small in-process host for the FUSE export, used by
// the host tests and the benchmark while they cannot rely on the `softblk`
// daemon. It reads one command per line on stdin and answers one line on
// stdout ("ok ..." or "error ..."):
//
//   add NAME TYPE [key=value ...] [-- export_key=value ...]
//                      create a device and export it; answers with the
//                      export's JSON (file, loop, ...)
//   del NAME           stop the export, destroy the device
//   list               JSON object: name -> export description
//   cleanup            run the export type's cleanup_stale
//   crash              _exit(9) without cleaning up (stale-state tests)
//   quit / EOF         delete every device and exit
//
// Options: --run-dir DIR (default $SOFTBLK_RUN_DIR or /run/softblk).
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

#include <nlohmann/json.hpp>

#include <softblk/device.hpp>
#include <softblk/frontend.hpp>

namespace {

struct exported_device {
    std::unique_ptr<softblk::device> dev;
    std::unique_ptr<softblk::device_export> exp;
};

void answer(const std::string& line)
{
    std::cout << line << std::endl;  // flushed: the caller waits for it
}

}  // namespace

int main(int argc, char** argv)
{
    softblk::export_context ctx;
    const char* env = std::getenv("SOFTBLK_RUN_DIR");
    ctx.run_dir = env != nullptr ? env : "/run/softblk";
    std::string export_type = "fuse";
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        if (arg == "--run-dir" && i + 1 < argc) {
            ctx.run_dir = argv[++i];
        } else if (arg == "--export" && i + 1 < argc) {
            export_type = argv[++i];
        } else {
            std::cerr << "usage: " << argv[0]
                      << " [--run-dir DIR] [--export TYPE]  (commands on stdin)\n";
            return 2;
        }
    }
    ctx.privileged = ::geteuid() == 0;
    const softblk::export_type* type = softblk::find_export_type(export_type);
    if (type == nullptr) {
        std::cerr << export_type << ": export type not linked into this driver\n";
        return 2;
    }
    if (type->cleanup_stale) {
        type->cleanup_stale(ctx);
    }

    std::map<std::string, exported_device> devices;
    std::string line;
    while (std::getline(std::cin, line)) {
        std::istringstream words(line);
        std::string command;
        words >> command;
        if (command.empty()) {
            continue;
        }
        if (command == "add") {
            std::string name, target;
            words >> name >> target;
            std::vector<std::string> device_options, export_options;
            bool after_dashes = false;
            for (std::string word; words >> word;) {
                if (word == "--") {
                    after_dashes = true;
                } else {
                    (after_dashes ? export_options : device_options).push_back(word);
                }
            }
            if (devices.contains(name)) {
                answer("error " + name + ": exists");
                continue;
            }
            auto dev = softblk::device::create(name, target, device_options);
            if (!dev) {
                answer("error " + dev.error().message);
                continue;
            }
            auto exp = start_export(*type, **dev, ctx, export_options);
            if (!exp) {
                answer("error " + exp.error().message);
                continue;
            }
            const std::string described = (*exp)->describe().dump();
            devices[name] = exported_device{std::move(*dev), std::move(*exp)};
            answer("ok " + described);
        } else if (command == "del") {
            std::string name;
            words >> name;
            auto it = devices.find(name);
            if (it == devices.end()) {
                answer("error " + name + ": no such device");
                continue;
            }
            if (auto stopped = it->second.exp->stop(); !stopped) {
                answer("error " + stopped.error().message);
                continue;
            }
            devices.erase(it);
            answer("ok");
        } else if (command == "list") {
            nlohmann::json out = nlohmann::json::object();
            for (const auto& [name, d] : devices) {
                out[name] = d.exp->describe();
            }
            answer("ok " + out.dump());
        } else if (command == "cleanup") {
            if (type->cleanup_stale) {
                type->cleanup_stale(ctx);
            }
            answer("ok");
        } else if (command == "crash") {
            std::_Exit(9);
        } else if (command == "quit") {
            break;
        } else {
            answer("error unknown command " + command);
        }
    }
    for (auto& [name, d] : devices) {
        if (auto stopped = d.exp->stop(); !stopped) {
            std::cerr << name << ": " << stopped.error().message << "\n";
        }
    }
    devices.clear();
    return 0;
}
