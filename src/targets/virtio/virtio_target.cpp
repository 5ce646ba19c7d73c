// Target type "virtio": a userspace virtio-blk driver that speaks
// vhost-user as the front end (what libblkio's virtio-blk-vhost-user
// driver does), so that every softblk front end, the FAT tools and the
// benchmarks run on a vhost-user-blk back end: softblk's own export or
// qemu-storage-daemon's.
//
// Memory: one memfd (sealed against resizing), shared with the back end
// as one region whose guest addresses are this process's addresses. It
// holds every ring, every tag's header area and every tag's data buffer
// (max_transfer bytes), so data is copied once each way between the
// caller's buffer and the shared one, and nothing is allocated per I/O.
// One virtqueue per device queue (submit_queues + poll_queues), each
// driven by the queue's thread (driver_queue). A thread of the target's
// (the connection thread) watches the socket: when the back end goes,
// requests in flight fail with EIO. When the core times out a request the
// back end holds (io_timeout), that thread replaces the connection: it
// closes the socket, connects again within connect_timeout with new memory
// (the old back end may still write into the old one), and the queues
// resubmit what they hold; if that fails, the device fails its requests.
#include <softblk/target.hpp>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <optional>
#include <poll.h>
#include <sys/eventfd.h>
#include <thread>
#include <unistd.h>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <softblk/support/clock.hpp>

#include "connection.hpp"
#include "driver_queue.hpp"

namespace softblk::virtio_driver {

namespace {

namespace vu = virtio::vhost_user;

constexpr option_def k_options[] = {
    {.name = "path",
     .kind = option_kind::text,
     .default_value = "",
     .unit = "absolute path",
     .help = "the vhost-user-blk back end's unix socket (softblk's vhost-user-blk export, "
             "qemu-storage-daemon --export type=vhost-user-blk); required",
     .check = check_absolute_path},
    {.name = "poll",
     .kind = option_kind::boolean,
     .default_value = "0",
     .unit = "",
     .help = "submit queues find completions by polling the used ring rather than sleeping on "
             "the call eventfd (poll queues always poll)"},
    {.name = "indirect",
     .kind = option_kind::boolean,
     .default_value = "0",
     .unit = "",
     .help = "one ring descriptor per request pointing to an indirect table "
             "(VIRTIO_RING_F_INDIRECT_DESC); 0: three direct descriptors per request"},
    {.name = "max_transfer",
     .kind = option_kind::integer,
     .default_value = "1024",
     .unit = "KiB",
     .help = "largest request (the core splits larger ones); each tag has a buffer this large in "
             "the memory shared with the back end",
     .min = 4,
     .max = 65536},
    {.name = "connect_timeout",
     .kind = option_kind::integer,
     .default_value = "5000",
     .unit = "ms",
     .help = "how long connecting to the back end may take in all: the socket accepting and the "
             "whole vhost-user handshake (also for a new connection after a request timed out)",
     .min = 1,
     .max = 60'000},
};

class virtio_target;

// The core's half of a queue: forwards to the target's driver_queue.
class queue_adapter final : public target_queue {
public:
    queue_adapter(target& t, driver_queue& q, completion_sink& sink)
        : _target(t), _queue(q), _sink(sink)
    {
        q.set_sink(&sink);
    }
    ~queue_adapter() override { _queue.set_sink(nullptr); }

    void submit(io_request& r) override
    {
        if (r.op == io_op::report_extents) {
            // Virtio has no allocation map: all data (map_extents' default).
            _sink.complete(r, answer_report_extents(_target, r));
            return;
        }
        _queue.submit(r);
    }
    unsigned poll() override { return _queue.poll(); }
    bool busy() const override { return _queue.busy(); }
    int wait_fd() const override { return _queue.wait_fd(); }
    uint64_t next_wakeup_ns() const override { return _queue.next_wakeup_ns(); }
    // Released at once; a request the back end holds costs its connection.
    bool timed_out(io_request& r) override { return _queue.timed_out(r); }

private:
    target& _target;
    driver_queue& _queue;
    completion_sink& _sink;
};

class virtio_target final : public target {
public:
    ~virtio_target() override
    {
        if (_monitor.joinable()) {
            const uint64_t one = 1;
            [[maybe_unused]] ssize_t n = ::write(_stop_fd, &one, sizeof one);
            _monitor.join();
        }
        _queues.clear();
        _client = vhost_user_client();  // closes the socket: the back end lets go
        _link.reset();                  // the last connection's memory
        for (int fd : _call_fds) {
            ::close(fd);
        }
        for (int fd : {_stop_fd, _reset_fd}) {
            if (fd >= 0) {
                ::close(fd);
            }
        }
    }

    const block_limits& limits() const override { return _limits; }

    result<std::unique_ptr<target_queue>> open_queue(unsigned index, completion_sink& sink) override
    {
        if (index >= _queues.size()) {
            return make_error(EINVAL, fmt::format("queue {}: only {} virtqueues were set up", index,
                                                  _queues.size()));
        }
        return std::make_unique<queue_adapter>(*this, *_queues[index], sink);
    }

    void describe(nlohmann::json& out) const override
    {
        out["path"] = _settings.path;
        out["features"] = fmt::format("{:#x}", _shape.features);
        out["virtqueues"] = _queues.size();
        out["backend_virtqueues"] = _shape.backend_queues;
        out["queue_size"] = _shape.ring_num;
        out["indirect"] = _settings.indirect;
        out["event_idx"] = (_shape.features & vu::feature_bit(VIRTIO_RING_F_EVENT_IDX)) != 0;
        out["shared_memory_bytes"] = _memory_bytes;
        out["connected"] = !_link->dead();
        out["reconnecting"] = !_link->dead() && _link->wanted() != _link->ready();
        out["connect_timeout_ms"] = _settings.connect_timeout_ms;
        out["reconnects"] = _reconnects.load(std::memory_order_relaxed);
        uint64_t bogus = 0, given_up = 0, resubmitted = 0;
        for (const auto& q : _queues) {
            bogus += q->bogus_completions();
            given_up += q->given_up();
            resubmitted += q->resubmitted();
        }
        out["bogus_completions"] = bogus;
        out["given_up"] = given_up;
        out["resubmitted"] = resubmitted;
    }

    result<void> setup(const option_set& o);

private:
    result<void> learn_zones(uint64_t deadline_ns);
    void watch();
    bool reconnect();
    void wake_queues();

    connection_settings _settings;
    device_shape _shape;
    block_limits _limits;
    size_t _memory_bytes = 0;
    vhost_user_client _client;   // the connection thread's after setup
    std::vector<int> _call_fds;  // per queue, the same for every connection
    int _stop_fd = -1;
    int _reset_fd = -1;
    std::optional<backend_link> _link;
    std::vector<std::unique_ptr<driver_queue>> _queues;
    std::atomic<uint64_t> _reconnects{0};
    std::thread _monitor;
};

result<void> virtio_target::learn_zones(uint64_t deadline_ns)
{
    // Virtio gives the zone size; softblk's limits also want the number of
    // conventional zones at the start and the zones' capacity.
    const uint64_t zones = zone_count(_limits);
    const uint32_t per_report = static_cast<uint32_t>(
        std::min<uint64_t>((_shape.data_bytes - sizeof(virtio::virtio_blk_zone_report)) /
                               sizeof(virtio::virtio_blk_zone_descriptor),
                           4096));
    std::vector<zone_descriptor> buf(per_report);
    uint64_t at = 0;
    uint32_t conventional = 0;
    _limits.zone_capacity_bytes = _limits.zone_size_bytes;
    while (at < _limits.capacity_bytes) {
        io_request r;
        r.op = io_op::report_zones;
        r.offset = at;
        r.buffer = buf.data();
        r.report_capacity = per_report;
        const uint64_t now = monotonic_ns();
        const int n = _queues[0]->run_sync(r, deadline_ns > now ? deadline_ns - now : 0);
        if (n <= 0) {
            return make_error(
                n < 0 ? -n : EPROTO,
                fmt::format("path={}: reporting the zones of a zoned device: {}", _settings.path,
                            n == -ETIMEDOUT ? fmt::format("no answer within connect_timeout={} ms",
                                                          _settings.connect_timeout_ms)
                            : n < 0         ? std::string(std::strerror(-n))
                                            : std::string("no zones")));
        }
        for (int i = 0; i < n; ++i) {
            if (buf[i].type != zone_type::conventional) {
                _limits.conventional_zones = conventional;
                _limits.zone_capacity_bytes = buf[i].capacity;
                return {};
            }
            ++conventional;
        }
        at = buf[n - 1].start + _limits.zone_size_bytes;
        if (conventional >= zones) {
            break;
        }
    }
    _limits.conventional_zones = conventional;
    return {};
}

result<void> virtio_target::setup(const option_set& o)
{
    connection_settings& s = _settings;
    s.path = o.text("path");
    if (s.path.empty()) {
        return make_error(EINVAL,
                          "path=: the back end's vhost-user socket is required (e.g. "
                          "path=/run/softblk/vhost-user-blk/d0.sock)");
    }
    s.connect_timeout_ms = static_cast<uint32_t>(o.u64("connect_timeout"));
    s.submit_queues = static_cast<unsigned>(o.u64("submit_queues"));
    s.queue_count = s.submit_queues + static_cast<unsigned>(o.u64("poll_queues"));
    s.depth = static_cast<uint32_t>(o.u64("hw_queue_depth"));
    s.max_transfer_bytes = o.u64("max_transfer") * 1024;
    s.indirect = o.flag("indirect");
    s.poll = o.flag("poll");
    const uint64_t deadline = monotonic_ns() + uint64_t{s.connect_timeout_ms} * 1'000'000;

    _stop_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    _reset_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (_stop_fd < 0 || _reset_fd < 0) {
        return make_error(errno, "eventfd");
    }
    _link.emplace(_reset_fd);
    for (unsigned q = 0; q < s.queue_count; ++q) {
        const int fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (fd < 0) {
            return make_error(EMFILE, "no eventfd for a virtqueue (out of descriptors?)");
        }
        _call_fds.push_back(fd);
    }
    auto c = open_connection(s, _shape, true, 1, _call_fds, _stop_fd);
    if (!c) {
        return std::unexpected(c.error());
    }
    _client = std::move(c->client);
    _limits = _shape.limits;
    _memory_bytes = c->memory->bytes;
    _link->publish(std::move(c->memory));
    for (unsigned q = 0; q < s.queue_count; ++q) {
        _queues.push_back(std::make_unique<driver_queue>(q, *_link));
    }
    if (_limits.zoned) {
        if (auto r = learn_zones(deadline); !r) {
            return r;
        }
    }
    _monitor = std::thread([this] { watch(); });
    return {};
}

void virtio_target::wake_queues()
{
    for (int fd : _call_fds) {
        const uint64_t one = 1;
        [[maybe_unused]] ssize_t n = ::write(fd, &one, sizeof one);
    }
}

bool virtio_target::reconnect()
{
    const uint32_t generation = _link->wanted();
    fmt::print(stderr,
               "virtio: the back end at {} did not complete a request within io_timeout; "
               "connecting again (connect_timeout={} ms)\n",
               _settings.path, _settings.connect_timeout_ms);
    // Closing the socket ends the back end's session: softblk's back end
    // finishes that session's requests before it serves the next front
    // end; one that takes longer than connect_timeout fails the device.
    _client = vhost_user_client();
    auto c = open_connection(_settings, _shape, false, generation, _call_fds, _stop_fd);
    if (!c) {
        if (c.error().code.value() != ECANCELED) {  // (not when the device goes)
            fmt::print(stderr, "virtio: {}; the device fails its requests with EIO\n",
                       c.error().message);
        }
        return false;
    }
    _client = std::move(c->client);
    _link->publish(std::move(c->memory));
    _reconnects.fetch_add(1, std::memory_order_relaxed);
    wake_queues();
    return true;
}

void virtio_target::watch()
{
    for (;;) {
        // The back end sends nothing unasked on this socket after setup: any
        // readable event is its end.
        pollfd fds[3] = {
            {_client.fd(), POLLIN | POLLRDHUP, 0}, {_stop_fd, POLLIN, 0}, {_reset_fd, POLLIN, 0}};
        if (::poll(fds, 3, -1) < 0) {
            continue;  // EINTR
        }
        if ((fds[1].revents & POLLIN) != 0) {
            return;
        }
        if ((fds[2].revents & POLLIN) != 0) {
            uint64_t v;
            [[maybe_unused]] ssize_t n = ::read(_reset_fd, &v, sizeof v);
            if (_link->wanted() != _link->ready() && !reconnect()) {
                break;
            }
            continue;
        }
        if (fds[0].revents != 0) {
            fmt::print(stderr,
                       "virtio: the back end at {} went away; requests in flight fail with EIO\n",
                       _settings.path);
            break;
        }
    }
    _link->fail();
    wake_queues();
}

result<std::unique_ptr<target>> create_virtio(const option_set& o)
{
    auto t = std::make_unique<virtio_target>();
    if (auto r = t->setup(o); !r) {
        return std::unexpected(r.error());
    }
    return t;
}

[[maybe_unused]] const bool k_registered = register_target_type(target_type{
    .name = "virtio",
    .description = "userspace virtio-blk driver on a vhost-user-blk back end (path=SOCKET): "
                   "softblk's vhost-user-blk export, qemu-storage-daemon, ...",
    .options = k_options,
    .create = create_virtio,
    .submit_queues = {},
});

}  // namespace

}  // namespace softblk::virtio_driver
