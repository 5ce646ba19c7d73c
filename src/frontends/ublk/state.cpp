#include "state.hpp"

#include "abi.hpp"

#include <softblk/support/clock.hpp>
#include <softblk/support/trusted_dir.hpp>

#include <cerrno>
#include <cstdio>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fmt/core.h>
#include <fstream>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

namespace softblk::ublk {

nlohmann::json to_json(const export_state& s)
{
    return nlohmann::json{
        {"version", k_state_version},
        {"device", s.device},
        {"dev_id", s.dev_id},
        {"flags", s.flags},
        {"nr_queues", s.nr_queues},
        {"depth", s.depth},
        {"max_io_buf_bytes", s.max_io_buf_bytes},
        {"daemon_pid", s.daemon_pid},
        {"cookie", s.cookie},
    };
}

result<export_state> state_from_json(const nlohmann::json& j)
{
    if (!j.is_object()) {
        return make_error(EINVAL, "ublk state: not a JSON object");
    }
    export_state s;
    try {
        const int version = j.at("version").get<int>();
        if (version < k_oldest_state_version || version > k_state_version) {
            return make_error(
                EINVAL, fmt::format("ublk state: version {} (this build reads {} to {})", version,
                                    k_oldest_state_version, k_state_version));
        }
        s.device = j.at("device").get<std::string>();
        s.dev_id = j.at("dev_id").get<uint32_t>();
        s.flags = j.at("flags").get<uint64_t>();
        s.nr_queues = j.at("nr_queues").get<unsigned>();
        s.depth = j.at("depth").get<unsigned>();
        s.max_io_buf_bytes = j.at("max_io_buf_bytes").get<uint32_t>();
        s.daemon_pid = j.at("daemon_pid").get<int32_t>();
        s.cookie = j.value("cookie", uint64_t{0});  // absent in older state files
    } catch (const nlohmann::json::exception& e) {
        return make_error(EINVAL, fmt::format("ublk state: {}", e.what()));
    }
    if (s.device.empty() || s.nr_queues == 0 || s.depth == 0 || s.max_io_buf_bytes == 0) {
        return make_error(EINVAL,
                          "ublk state: device, nr_queues, depth and max_io_buf_bytes must be set");
    }
    return s;
}

bool is_ours(const export_state& state, const dev_info& info)
{
    if (state.cookie != 0) {
        return info.ublksrv_flags == state.cookie;
    }
    return info.ublksrv_pid == state.daemon_pid && info.nr_hw_queues == state.nr_queues &&
           info.queue_depth == state.depth && info.max_io_buf_bytes == state.max_io_buf_bytes;
}

bool pid_alive(int32_t pid)
{
    return pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM);
}

uint64_t new_cookie()
{
    uint64_t c = 0;
    while (c == 0) {
        if (::getrandom(&c, sizeof c, 0) != static_cast<ssize_t>(sizeof c)) {
            // No entropy source (cannot happen on Linux 3.17+): time and pid
            // still tell two devices of one machine apart.
            c = (static_cast<uint64_t>(::getpid()) << 32) ^ monotonic_ns();
        }
    }
    return c;
}

std::string state_path(const std::string& run_dir, const std::string& device)
{
    return fmt::format("{}/ublk/{}.json", run_dir, device);
}

result<void> write_state(const std::string& path, const export_state& state)
{
    const auto slash = path.rfind('/');
    if (slash != std::string::npos) {
        const std::string dir = path.substr(0, slash);
        std::error_code ec;
        std::filesystem::create_directories(dir, ec);
        if (ec) {
            return make_error(ec.value(), fmt::format("{}: cannot create the state directory: {}",
                                                      dir, ec.message()));
        }
    }
    // In the run directory, as the daemon's other state files: never
    // through a link planted there, replaced whole, durable.
    return write_file_atomically(path, to_json(state).dump(2) + "\n", 0600, true);
}

result<export_state> read_state(const std::string& path)
{
    std::ifstream in(path);
    if (!in) {
        return make_error(ENOENT, fmt::format("{}: no ublk state file", path));
    }
    nlohmann::json j;
    try {
        in >> j;
    } catch (const nlohmann::json::exception& e) {
        return make_error(EINVAL, fmt::format("{}: not valid JSON: {}", path, e.what()));
    }
    auto s = state_from_json(j);
    if (!s) {
        return make_error(EINVAL, fmt::format("{}: {}", path, s.error().message));
    }
    return s;
}

}  // namespace softblk::ublk
