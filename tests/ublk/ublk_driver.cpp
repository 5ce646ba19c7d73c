// softblk-ublk-driver: serves one softblk device over the ublk export, for
// the VM tests (and by hand) without the daemon.
//
//   softblk-ublk-driver serve --name NAME --type TYPE [--run-dir DIR]
//                             [--export KEY=VALUE]... [--ready-file FILE] [KEY=VALUE]...
//   softblk-ublk-driver recover --name NAME [--run-dir DIR] [--ready-file FILE]
//   softblk-ublk-driver features | list [--run-dir DIR] | cleanup [--run-dir DIR]
//
// serve creates the device from target options (KEY=VALUE, null_blk's
// names), starts the export, prints the export's describe() as one JSON
// line, touches --ready-file, and serves until SIGTERM or SIGINT, then
// stops the export (STOP_DEV, DEL_DEV) and exits 0. recover re-creates the
// device and export from RUN_DIR/ublk/NAME.json and re-attaches to the
// kernel device (START/END_USER_RECOVERY). Exit status 1 with a message on
// stderr when something fails.
#include <softblk/device.hpp>
#include <softblk/frontend.hpp>
#include <softblk/ublk/ublk.hpp>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <pthread.h>
#include <string>
#include <unistd.h>
#include <vector>

namespace {

struct args {
    std::string command;
    std::string name;
    std::string type;
    std::string run_dir = "/run/softblk";
    std::string ready_file;
    std::vector<std::string> export_options;
    std::vector<std::string> device_options;
};

[[noreturn]] void die(const std::string& message)
{
    std::cerr << "softblk-ublk-driver: " << message << '\n';
    std::exit(1);
}

args parse(int argc, char** argv)
{
    if (argc < 2) {
        die("usage: softblk-ublk-driver serve|recover|features|list|cleanup ... (see the source's "
            "header)");
    }
    args a;
    a.command = argv[1];
    if (const char* env = std::getenv("SOFTBLK_RUN_DIR")) {
        a.run_dir = env;
    }
    for (int i = 2; i < argc; ++i) {
        const std::string arg = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) {
                die(arg + " needs a value");
            }
            return argv[++i];
        };
        if (arg == "--name") {
            a.name = value();
        } else if (arg == "--type") {
            a.type = value();
        } else if (arg == "--run-dir") {
            a.run_dir = value();
        } else if (arg == "--ready-file") {
            a.ready_file = value();
        } else if (arg == "--export") {
            a.export_options.push_back(value());
        } else if (arg.find('=') != std::string::npos && arg[0] != '-') {
            a.device_options.push_back(arg);
        } else {
            die("unknown argument '" + arg + "'");
        }
    }
    return a;
}

int serve(const args& a, const std::string& type, const std::vector<std::string>& device_options,
          const std::vector<std::string>& export_options)
{
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGTERM);
    sigaddset(&stop_signals, SIGINT);
    // Blocked before any thread exists, so only sigwait below sees them.
    pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

    auto dev = softblk::device::create(a.name, type, device_options);
    if (!dev) {
        die(dev.error().message);
    }
    const softblk::export_type* ublk = softblk::find_export_type("ublk");
    if (ublk == nullptr) {
        die("export type ublk is not linked in");
    }
    softblk::export_context ctx{.run_dir = a.run_dir, .privileged = ::geteuid() == 0};
    auto exp = start_export(*ublk, **dev, ctx, export_options);
    if (!exp) {
        die(exp.error().message);
    }
    std::cout << (*exp)->describe().dump() << std::endl;
    if (!a.ready_file.empty()) {
        std::ofstream(a.ready_file) << (*exp)->describe().dump() << '\n';
    }
    int sig = 0;
    sigwait(&stop_signals, &sig);
    auto stopped = (*exp)->stop();
    exp->reset();
    if (!stopped) {
        die(stopped.error().message);
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv)
{
    const args a = parse(argc, argv);
    softblk::export_context ctx{.run_dir = a.run_dir, .privileged = ::geteuid() == 0};
    if (a.command == "serve") {
        if (a.name.empty() || a.type.empty()) {
            die("serve needs --name and --type");
        }
        return serve(a, a.type, a.device_options, a.export_options);
    }
    if (a.command == "recover") {
        if (a.name.empty()) {
            die("recover needs --name");
        }
        auto list = softblk::ublk::list_state(ctx);
        if (!list) {
            die(list.error().message);
        }
        for (const auto& d : *list) {
            if (d.device == a.name) {
                if (!d.recoverable) {
                    die(a.name + ": ublk device " + std::to_string(d.dev_id) + " is " + d.state +
                        ", daemon pid " + std::to_string(d.daemon_pid) + ": nothing to recover");
                }
                return serve(a, d.target_type, d.device_options, d.export_options);
            }
        }
        die(a.name + ": no ublk state under " + a.run_dir + "/ublk");
    }
    if (a.command == "features") {
        auto f = softblk::ublk::query_kernel_features();
        if (!f) {
            die(f.error().message);
        }
        nlohmann::json out;
        out["bits"] = f->bits ? nlohmann::json(*f->bits) : nlohmann::json(nullptr);
        out["names"] = f->names;
        out["ioctl_encode"] = f->ioctl_encode;
        std::cout << out.dump() << std::endl;
        return 0;
    }
    if (a.command == "list") {
        auto list = softblk::ublk::list_state(ctx);
        if (!list) {
            die(list.error().message);
        }
        nlohmann::json out = nlohmann::json::array();
        for (const auto& d : *list) {
            out.push_back({{"device", d.device},
                           {"dev_id", d.dev_id},
                           {"state", d.state},
                           {"daemon_pid", d.daemon_pid},
                           {"recoverable", d.recoverable}});
        }
        std::cout << out.dump() << std::endl;
        return 0;
    }
    if (a.command == "cleanup") {
        const softblk::export_type* ublk = softblk::find_export_type("ublk");
        ublk->cleanup_stale(ctx);
        return 0;
    }
    die("unknown command '" + a.command + "'");
}
