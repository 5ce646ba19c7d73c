// What the ublk export keeps across processes and what the machine offers
// it: the state files under RUN_DIR/ublk with the kernel's view of their
// devices (cleanup_stale, saved_exports) and the kernel's feature bits
// (query_kernel_features, host_features). See ublk_export.hpp.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <dirent.h>
#include <unistd.h>

#include <fmt/core.h>
#include <fmt/ranges.h>

#include <softblk/ublk/ublk.hpp>

#include "abi.hpp"
#include "control.hpp"
#include "state.hpp"
#include "ublk_export.hpp"

namespace softblk::ublk {

namespace {

// A device whose ublk state file survives under RUN_DIR/ublk, with the
// kernel's view of it now.
struct state_entry {
    export_state saved;
    std::string state;         // LIVE, QUIESCED, FAIL_IO, DEAD; GONE: the kernel has no such device
    int32_t daemon_pid = 0;    // the pid the kernel has
    bool recoverable = false;  // USER_RECOVERY device whose daemon is gone
};

// Every state file under ctx.run_dir/ublk, in name order. Control thread.
result<std::vector<state_entry>> list_state(const export_context& ctx)
{
    std::vector<state_entry> out;
    const std::string dir = ctx.run_dir + "/ublk";
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) {
        if (errno == ENOENT) {
            return out;
        }
        const int e = errno;
        return make_error(e, fmt::format("{}: {}", dir, std::strerror(e)));
    }
    std::vector<std::string> files;
    while (dirent* e = ::readdir(d)) {
        const std::string name = e->d_name;
        if (name.size() > 5 && name.ends_with(".json")) {
            files.push_back(dir + "/" + name);
        }
    }
    ::closedir(d);
    std::sort(files.begin(), files.end());
    auto ctl = control::open();
    for (const auto& file : files) {
        auto st = read_state(file);
        if (!st) {
            continue;
        }
        state_entry r{.saved = std::move(*st), .state = "GONE"};
        if (ctl) {
            // A device of that id that is not ours is, for us, gone.
            if (auto info = (*ctl)->get_dev_info(r.saved.dev_id); info && is_ours(r.saved, *info)) {
                r.state = state_name(info->state);
                r.daemon_pid = info->ublksrv_pid;
                r.recoverable = (info->flags & k_f_user_recovery) != 0 &&
                                info->state != k_state_dead && !pid_alive(info->ublksrv_pid);
            }
        }
        out.push_back(std::move(r));
    }
    return out;
}

}  // namespace

void cleanup_stale(const export_context& ctx)
{
    auto list = list_state(ctx);
    if (!list) {
        return;
    }
    auto ctl = control::open();
    for (const auto& d : *list) {
        const std::string path = state_path(ctx.run_dir, d.saved.device);
        if (d.state == "GONE") {
            ::unlink(path.c_str());
            continue;
        }
        if (d.recoverable || pid_alive(d.daemon_pid)) {
            continue;
        }
        if (ctl) {
            (void)(*ctl)->stop_dev(d.saved.dev_id);
            (void)(*ctl)->del_dev(d.saved.dev_id);
        }
        ::unlink(path.c_str());
    }
}

result<std::vector<saved_export>> saved_exports(const export_context& ctx)
{
    auto list = list_state(ctx);
    if (!list) {
        return std::unexpected(list.error());
    }
    std::vector<saved_export> out;
    for (auto& d : *list) {
        out.push_back(saved_export{
            .device = std::move(d.saved.device),
            .recoverable = d.recoverable,
            .state = {{"dev_id", d.saved.dev_id}, {"state", d.state}, {"daemon_pid", d.daemon_pid}},
        });
    }
    return out;
}

result<kernel_features> query_kernel_features()
{
    auto ctl = control::open();
    if (!ctl) {
        return std::unexpected(ctl.error());
    }
    kernel_features f;
    f.bits = (*ctl)->features();
    if (f.bits) {
        f.names = feature_names(*f.bits);
    }
    f.ioctl_encode = (*ctl)->ioctl_encode();
    return f;
}

result<nlohmann::json> host_features()
{
    auto f = query_kernel_features();
    if (!f) {
        return std::unexpected(f.error());
    }
    // "text": the line `softblk features` prints.
    std::string text =
        f->bits ? fmt::format("kernel features (0x{:x}): {}", *f->bits, fmt::join(f->names, " "))
                : std::string(
                      "kernel features: not reported (kernel before 6.5, "
                      "no GET_FEATURES)");
    return nlohmann::json{{"bits", f->bits ? nlohmann::json(*f->bits) : nlohmann::json(nullptr)},
                          {"names", f->names},
                          {"ioctl_encode", f->ioctl_encode},
                          {"text", std::move(text)}};
}

}  // namespace softblk::ublk
