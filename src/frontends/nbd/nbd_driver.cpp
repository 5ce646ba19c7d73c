// softblk-nbd: creates devices in-process and serves them over NBD through
// the registered export type "nbd" (the same code path as `softblk add
// ... --export nbd`), for tests and benchmarks that must not depend on the
// daemon.
//
//   softblk-nbd [--run-dir DIR] [-o KEY=VALUE]... NAME TYPE [OPTION...] [, NAME TYPE [OPTION...]]...
//
// -o passes an export option (socket=, tcp=, tls=, tls-certs=, tls-psk=,
// tls-verify-peer=, threads= ...: every option of the export type). With
// threads=N a device gets submit_queues=N unless it says otherwise. Prints
// one JSON line per export (its description, with "name"), then "ready",
// and serves until SIGINT/SIGTERM. With --commands it also reads lines on
// stdin: "del NAME" stops one export (answers "ok" or "error ...").
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <pthread.h>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include <softblk/device.hpp>
#include <softblk/frontend.hpp>

namespace {

struct served {
    std::unique_ptr<softblk::device> dev;
    std::unique_ptr<softblk::device_export> exp;
};

int usage(const char* self)
{
    std::cerr << "usage: " << self
              << " [--run-dir DIR] [--commands] [-o KEY=VALUE]... NAME TYPE [OPTION...] [, NAME "
                 "TYPE [OPTION...]]...\n";
    return 2;
}

}  // namespace

int main(int argc, char** argv)
{
    softblk::export_context ctx;
    const char* env = std::getenv("SOFTBLK_RUN_DIR");
    ctx.run_dir = env != nullptr ? env : "/tmp/softblk-nbd";
    ctx.privileged = false;
    std::vector<std::string> export_options;
    std::vector<std::vector<std::string>> devices(1);
    bool commands = false;
    std::string threads;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        if (arg == "--run-dir" && i + 1 < argc) {
            ctx.run_dir = argv[++i];
        } else if (arg == "-o" && i + 1 < argc) {
            export_options.emplace_back(argv[++i]);
            if (export_options.back().rfind("threads=", 0) == 0) {
                threads = export_options.back().substr(8);
            }
        } else if (arg == "--commands") {
            commands = true;
        } else if (arg == ",") {
            devices.emplace_back();
        } else if (arg.starts_with("-") && devices.back().empty()) {
            return usage(argv[0]);
        } else {
            devices.back().push_back(arg);
        }
    }
    if (devices.back().size() < 2) {
        return usage(argv[0]);
    }
    const softblk::export_type* type = softblk::find_export_type("nbd");
    if (type == nullptr) {
        std::cerr << "export type nbd is not linked in\n";
        return 2;
    }
    // Signals are taken by sigwait below; every thread inherits the mask.
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGINT);
    sigaddset(&signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);
    std::signal(SIGPIPE, SIG_IGN);

    std::map<std::string, served> all;
    for (const auto& d : devices) {
        if (d.size() < 2) {
            return usage(argv[0]);
        }
        std::vector<std::string> options(d.begin() + 2, d.end());
        bool has_queues = false;
        for (const auto& o : options) {
            has_queues = has_queues || o.rfind("submit_queues=", 0) == 0;
        }
        if (!threads.empty() && threads != "0" && !has_queues) {
            options.push_back("submit_queues=" + threads);
        }
        auto dev = softblk::device::create(d[0], d[1], options);
        if (!dev) {
            std::cerr << d[0] << ": " << dev.error().message << "\n";
            return 1;
        }
        auto exp = start_export(*type, **dev, ctx, export_options);
        if (!exp) {
            std::cerr << d[0] << ": " << exp.error().message << "\n";
            return 1;
        }
        nlohmann::json j = (*exp)->describe();
        j["name"] = d[0];
        std::cout << j.dump() << std::endl;
        all[d[0]] = served{std::move(*dev), std::move(*exp)};
    }
    std::cout << "ready" << std::endl;

    if (commands) {
        std::thread([] {
            // Run the command loop on the main thread; this one only waits
            // for a signal and turns it into end of input.
            sigset_t s;
            sigemptyset(&s);
            sigaddset(&s, SIGINT);
            sigaddset(&s, SIGTERM);
            int sig = 0;
            sigwait(&s, &sig);
            std::_Exit(0);
        }).detach();
        std::string line;
        while (std::getline(std::cin, line)) {
            if (line.rfind("del ", 0) == 0) {
                auto it = all.find(line.substr(4));
                if (it == all.end()) {
                    std::cout << "error no such export" << std::endl;
                    continue;
                }
                auto rc = it->second.exp->stop();
                it->second.exp.reset();
                all.erase(it);
                std::cout << (rc ? std::string("ok") : "error " + rc.error().message) << std::endl;
            } else if (line == "quit") {
                break;
            } else if (!line.empty()) {
                std::cout << "error unknown command" << std::endl;
            }
        }
    } else {
        int sig = 0;
        sigwait(&signals, &sig);
    }
    for (auto& [name, s] : all) {
        if (auto rc = s.exp->stop(); !rc) {
            std::cerr << name << ": " << rc.error().message << "\n";
        }
        s.exp.reset();
    }
    return 0;
}
