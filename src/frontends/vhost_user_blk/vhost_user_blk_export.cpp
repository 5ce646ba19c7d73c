#include "vhost_user_blk_export.hpp"

#include <atomic>
#include <cerrno>
#include <cstring>
#include <dirent.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <softblk/support/unix_socket.hpp>

#include "blk_config.hpp"
#include "queue_worker.hpp"
#include "session.hpp"

namespace softblk::vhost_user_blk {

namespace {

constexpr option_def k_options[] = {
    {.name = "socket",
     .kind = option_kind::text,
     .default_value = "",
     .unit = "absolute path",
     .help = "unix socket the front end connects to (QEMU: -chardev socket,path=PATH); default "
             "RUN_DIR/vhost-user-blk/NAME.sock",
     .check = check_absolute_path},
    k_socket_mode_option,
    k_socket_group_option,
    {.name = "num-queues",
     .kind = option_kind::integer,
     .default_value = "0",
     .unit = "",
     .help = "virtqueues offered (GET_QUEUE_NUM, config num_queues), each served by its own thread "
             "on its own device queue; 0: all of the device's queues (submit_queues + "
             "poll_queues)",
     .min = 0,
     .max = 256},
    {.name = "readonly",
     .kind = option_kind::boolean,
     .default_value = "0",
     .unit = "",
     .help = "export read-only (VIRTIO_BLK_F_RO): writes, discards, write zeroes and zone "
             "operations fail with VIRTIO_BLK_S_IOERR"},
    {.name = "poll-us",
     .kind = option_kind::text,
     .default_value = "auto",
     .unit = "us",
     .help = "each ring looks for new requests this long after its last one before it sleeps on "
             "its kick eventfd: lower latency, more CPU. auto: the window (0 to 512 us) that "
             "gives the ring the most requests per second on this machine, measured over 10 ms "
             "epochs and measured again now and then (`softblk list --json` shows why); 0: "
             "never poll",
     .check = check_poll_window},
};

// Seconds a front end may take to send the rest of a message it started.
constexpr int k_message_timeout_s = 10;

class export_impl final : public device_export {
public:
    export_impl(device& dev, export_settings settings)
        : _dev(dev),
          _settings(std::move(settings)),
          _counters(std::make_unique<ring_counters[]>(_settings.num_queues))
    {
        for (unsigned i = 0; i < _settings.num_queues; ++i) {
            _counters[i].poll.emplace(poll_window_config(_settings.poll_us));
        }
    }
    ~export_impl() override { (void)stop(); }

    // Binds the socket (permissions `mode`, group `group` before it
    // listens) and starts the export's thread. Control thread.
    result<void> listen(unsigned mode, int64_t group)
    {
        auto listener = listen_unix_socket(_settings.socket_path, mode, group, 4, SOCK_NONBLOCK);
        if (!listener) {
            return std::unexpected(listener.error());
        }
        _listener = *listener;
        _listen_fd = listener->fd;
        _stop_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (_stop_fd < 0) {
            const int e = errno;
            return make_error(e, fmt::format("eventfd: {}", std::strerror(e)));
        }
        _thread = std::thread([this] { serve(); });
        return {};
    }

    // Each ring's poll window now, and what its chooser says.
    nlohmann::json poll_levels() const
    {
        nlohmann::json out = nlohmann::json::array();
        for (unsigned i = 0; i < _settings.num_queues; ++i) {
            out.push_back(_counters[i].poll->level());
        }
        return out;
    }
    nlohmann::json poll_choices() const
    {
        nlohmann::json out = nlohmann::json::array();
        for (unsigned i = 0; i < _settings.num_queues; ++i) {
            out.push_back(_counters[i].poll->describe());
        }
        return out;
    }

    nlohmann::json describe() const override
    {
        uint64_t totals[17] = {};
        for (unsigned i = 0; i < _settings.num_queues; ++i) {
            const ring_counters& c = _counters[i];
            const std::atomic<uint64_t>* each[] = {
                &c.requests,     &c.reads,        &c.writes,      &c.flushes,
                &c.discards,     &c.write_zeroes, &c.get_id,      &c.zone_management,
                &c.zone_appends, &c.report_zones, &c.unsupported, &c.errors,
                &c.bad_requests, &c.resubmitted,  &c.bounced,     &c.wakeups,
                &c.notifications};
            for (unsigned k = 0; k < std::size(each); ++k) {
                totals[k] += each[k]->load(std::memory_order_relaxed);
            }
        }
        const char* names[] = {"requests",     "read",         "write",       "flush",
                               "discard",      "write_zeroes", "get_id",      "zone_management",
                               "zone_append",  "report_zones", "unsupported", "errors",
                               "bad_requests", "resubmitted",  "bounced",     "wakeups",
                               "notifications"};
        nlohmann::json stats = nlohmann::json::object();
        for (unsigned k = 0; k < std::size(names); ++k) {
            stats[names[k]] = totals[k];
        }
        return {{"socket", _settings.socket_path},
                {"queues", _settings.num_queues},
                {"read_only", _settings.read_only || _dev.limits().read_only},
                {"poll_us", poll_levels()},
                {"poll", poll_choices()},
                {"connected", _connected.load(std::memory_order_relaxed)},
                {"connections", _connections.load(std::memory_order_relaxed)},
                {"stats", std::move(stats)}};
    }

    result<void> stop() override
    {
        if (_thread.joinable()) {
            const uint64_t one = 1;
            [[maybe_unused]] ssize_t n = ::write(_stop_fd, &one, sizeof one);
            _thread.join();
        }
        if (_listen_fd >= 0) {
            ::close(_listen_fd);
            _listen_fd = -1;
            // Only the socket listen() bound: not a file someone put there since.
            remove_socket_file(_settings.socket_path, _listener);
            _listener = {};
        }
        if (_stop_fd >= 0) {
            ::close(_stop_fd);
            _stop_fd = -1;
        }
        return {};
    }

    std::string in_use() const override
    {
        // A VM keeps its disk while connected; stopping the export is what
        // `del` asks for, and the guest sees the back end go (QEMU
        // reconnects if told to), so nothing is held hostage here.
        return {};
    }

private:
    // The export's thread: serves one front end at a time and handles its
    // messages; the rings have threads of their own. While a front end is
    // attached the next one waits in the listen backlog (a QEMU that
    // reconnects, a driver opened after another closed) until it goes.
    void serve()
    {
        std::unique_ptr<session> s;
        for (;;) {
            pollfd fds[3] = {{_stop_fd, POLLIN, 0}, {-1, 0, 0}, {-1, 0, 0}};
            if (s) {
                fds[1] = pollfd{s->fd(), POLLIN, 0};
                fds[2] = pollfd{s->error_fd(), POLLIN, 0};
            } else {
                fds[1] = pollfd{_listen_fd, POLLIN, 0};
            }
            if (::poll(fds, s ? 3 : 2, -1) < 0) {
                if (errno == EINTR) {
                    continue;
                }
                fmt::print(stderr, "vhost-user-blk {}: poll: {}\n", _settings.serial,
                           std::strerror(errno));
                break;
            }
            if ((fds[0].revents & POLLIN) != 0) {
                break;
            }
            if (!s) {
                if ((fds[1].revents & POLLIN) != 0) {
                    accept_one(s);
                }
                continue;
            }
            if ((fds[2].revents & POLLIN) != 0) {
                fmt::print(
                    stderr,
                    "vhost-user-blk {}: the front end broke a ring; closing the connection\n",
                    _settings.serial);
                end(s);
                continue;
            }
            if ((fds[1].revents & (POLLIN | POLLHUP | POLLERR)) != 0 && !s->handle_message()) {
                end(s);
            }
        }
        end(s);
    }

    void accept_one(std::unique_ptr<session>& s)
    {
        const int fd = ::accept4(_listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd < 0) {
            return;
        }
        const timeval tv{k_message_timeout_s, 0};
        ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        s = std::make_unique<session>(fd, _dev, _settings, _counters.get());
        _connected.store(true, std::memory_order_relaxed);
        _connections.fetch_add(1, std::memory_order_relaxed);
    }

    void end(std::unique_ptr<session>& s)
    {
        s.reset();
        _connected.store(false, std::memory_order_relaxed);
    }

    device& _dev;
    export_settings _settings;
    std::unique_ptr<ring_counters[]> _counters;
    unix_listener _listener;  // the socket file listen() bound
    int _listen_fd = -1;
    int _stop_fd = -1;
    std::thread _thread;
    std::atomic<bool> _connected{false};
    std::atomic<uint64_t> _connections{0};
};

}  // namespace

std::span<const option_def> export_options()
{
    return k_options;
}

result<std::unique_ptr<device_export>> start_export(device& dev, const export_context& ctx,
                                                    std::span<const std::string> options)
{
    auto parsed = option_set::parse(k_options, options);
    if (!parsed) {
        return std::unexpected(parsed.error());
    }
    const option_set& o = *parsed;
    export_settings s;
    s.socket_path = o.text("socket");
    if (s.socket_path.empty()) {
        const std::string dir = ctx.run_dir + "/vhost-user-blk";
        if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
            const int e = errno;
            return make_error(e, fmt::format("{}: {}", dir, std::strerror(e)));
        }
        s.socket_path = dir + "/" + dev.name() + ".sock";
    }
    s.num_queues = static_cast<unsigned>(o.u64("num-queues"));
    if (s.num_queues == 0) {
        s.num_queues = dev.queue_count();
    }
    if (s.num_queues > dev.queue_count()) {
        return make_error(
            EINVAL, fmt::format("num-queues={}: each virtqueue needs a device queue of its "
                                "own and {} has {} (submit_queues + poll_queues); give "
                                "num-queues=1..{} or create the device with more queues",
                                s.num_queues, dev.name(), dev.queue_count(), dev.queue_count()));
    }
    s.read_only = o.flag("readonly");
    s.poll_us = o.text("poll-us");
    s.serial = dev.name().substr(0, VIRTIO_BLK_ID_BYTES);
    auto mode = parse_socket_mode(o.text("mode"));
    if (!mode) {
        return std::unexpected(mode.error());
    }
    auto group = parse_socket_group(o.text("group"));
    if (!group) {
        return std::unexpected(group.error());
    }
    auto e = std::make_unique<export_impl>(dev, std::move(s));
    if (auto rc = e->listen(*mode, *group); !rc) {
        return std::unexpected(rc.error());
    }
    return e;
}

void cleanup_stale(const export_context& ctx)
{
    const std::string dir = ctx.run_dir + "/vhost-user-blk";
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) {
        return;
    }
    while (dirent* entry = ::readdir(d)) {
        const std::string name = entry->d_name;
        if (name.size() < 6 || name.substr(name.size() - 5) != ".sock") {
            continue;
        }
        const std::string path = dir + "/" + name;
        struct stat st;
        if (::lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) {
            (void)claim_socket_path(path);  // removes it only when stale and ours
        }
    }
    ::closedir(d);
}

}  // namespace softblk::vhost_user_blk
