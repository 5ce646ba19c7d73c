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
// driven by the queue's thread (driver_queue). A thread watches the
// socket: when the back end goes, requests in flight fail with EIO.
#include <softblk/target.hpp>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <thread>
#include <unistd.h>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <linux/virtio_config.h>

#include "driver_queue.hpp"
#include "vhost_user_client.hpp"

namespace softblk::virtio_driver {

namespace {

namespace vu = virtio::vhost_user;
using vu::feature_bit;

constexpr option_def k_options[] = {
    {.name = "path",
     .kind = option_kind::text,
     .default_value = "",
     .unit = "path",
     .help = "the vhost-user-blk back end's unix socket (softblk's vhost-user-blk export, "
             "qemu-storage-daemon --export type=vhost-user-blk); required"},
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
             "whole vhost-user handshake",
     .min = 1,
     .max = 60'000},
};

constexpr uint64_t k_wanted_features =
    feature_bit(VIRTIO_F_VERSION_1) | feature_bit(VIRTIO_RING_F_EVENT_IDX) |
    feature_bit(vu::k_f_protocol_features) | feature_bit(VIRTIO_BLK_F_SIZE_MAX) |
    feature_bit(VIRTIO_BLK_F_SEG_MAX) | feature_bit(VIRTIO_BLK_F_BLK_SIZE) |
    feature_bit(VIRTIO_BLK_F_TOPOLOGY) | feature_bit(VIRTIO_BLK_F_MQ) |
    feature_bit(VIRTIO_BLK_F_RO) | feature_bit(VIRTIO_BLK_F_FLUSH) |
    feature_bit(VIRTIO_BLK_F_CONFIG_WCE) | feature_bit(VIRTIO_BLK_F_DISCARD) |
    feature_bit(VIRTIO_BLK_F_WRITE_ZEROES) | feature_bit(VIRTIO_BLK_F_ZONED);
constexpr uint64_t k_wanted_protocol =
    feature_bit(vu::k_pf_mq) | feature_bit(vu::k_pf_reply_ack) | feature_bit(vu::k_pf_config);

// Config bytes read: through write_zeroes_may_unmap and its padding, or
// through the zoned characteristics.
constexpr uint32_t k_config_bytes = offsetof(virtio_blk_config, unused1) + 3;

uint64_t align_up(uint64_t n, uint64_t a)
{
    return (n + a - 1) / a * a;
}

uint32_t round_bytes(uint64_t sectors, uint32_t lbs)
{
    const uint64_t bytes = std::min<uint64_t>(sectors * 512, UINT32_MAX);
    return static_cast<uint32_t>(bytes - bytes % lbs);
}

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
    // A request the back end holds cannot be taken back from the ring.
    bool timed_out(io_request&) override { return false; }

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
        for (int fd : _event_fds) {
            ::close(fd);
        }
        if (_stop_fd >= 0) {
            ::close(_stop_fd);
        }
        if (_memory != nullptr) {
            ::munmap(_memory, _memory_bytes);
        }
        if (_memfd >= 0) {
            ::close(_memfd);
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
        out["path"] = _client.path();
        out["features"] = fmt::format("{:#x}", _features);
        out["virtqueues"] = _queues.size();
        out["backend_virtqueues"] = _backend_queues;
        out["queue_size"] = _queues.empty() ? 0 : _queues[0]->layout().num;
        out["indirect"] = _indirect;
        out["event_idx"] = (_features & feature_bit(VIRTIO_RING_F_EVENT_IDX)) != 0;
        out["shared_memory_bytes"] = _memory_bytes;
        out["connected"] = !_dead.load(std::memory_order_relaxed);
        uint64_t bogus = 0;
        for (const auto& q : _queues) {
            bogus += q->bogus_completions();
        }
        out["bogus_completions"] = bogus;
    }

    result<void> setup(const option_set& o);

private:
    result<void> negotiate(const option_set& o, uint64_t& protocol);
    result<void> read_config(const virtio::blk_config& cfg, const option_set& o);
    result<void> share_memory(const option_set& o);
    result<void> set_features();
    result<void> learn_zones();
    void watch();

    vhost_user_client _client;
    block_limits _limits;
    uint64_t _features = 0;
    unsigned _backend_queues = 1;
    unsigned _submit_queues = 1;
    unsigned _queue_count = 1;
    uint32_t _depth = 0;
    uint32_t _ring_num = 0;
    uint32_t _data_bytes = 0;
    bool _indirect = false;
    bool _polling = false;
    int _memfd = -1;
    void* _memory = nullptr;
    size_t _memory_bytes = 0;
    std::vector<int> _event_fds;  // kick, call per queue
    std::vector<std::unique_ptr<driver_queue>> _queues;
    std::atomic<bool> _dead{false};
    int _stop_fd = -1;
    std::thread _monitor;
};

result<void> virtio_target::negotiate(const option_set& o, uint64_t& protocol)
{
    auto offered = _client.get_u64(vu::k_get_features);
    if (!offered) {
        return std::unexpected(offered.error());
    }
    if ((*offered & feature_bit(VIRTIO_F_VERSION_1)) == 0) {
        return make_error(EPROTO, fmt::format("path={}: the back end does not offer "
                                              "VIRTIO_F_VERSION_1 (legacy devices are not "
                                              "supported)",
                                              _client.path()));
    }
    if ((*offered & feature_bit(vu::k_f_protocol_features)) == 0) {
        return make_error(EPROTO,
                          fmt::format("path={}: the back end has no vhost-user protocol features "
                                      "(needed for its config space)",
                                      _client.path()));
    }
    auto offered_protocol = _client.get_u64(vu::k_get_protocol_features);
    if (!offered_protocol) {
        return std::unexpected(offered_protocol.error());
    }
    protocol = *offered_protocol & k_wanted_protocol;
    if ((protocol & feature_bit(vu::k_pf_config)) == 0) {
        return make_error(EPROTO, fmt::format("path={}: the back end does not offer "
                                              "VHOST_USER_PROTOCOL_F_CONFIG (its geometry)",
                                              _client.path()));
    }
    if (auto r = _client.set_u64(vu::k_set_protocol_features, protocol); !r) {
        return r;
    }
    _client.set_reply_ack((protocol & feature_bit(vu::k_pf_reply_ack)) != 0);
    _backend_queues = 1;
    if ((protocol & feature_bit(vu::k_pf_mq)) != 0) {
        auto n = _client.get_u64(vu::k_get_queue_num);
        if (!n) {
            return std::unexpected(n.error());
        }
        _backend_queues = static_cast<unsigned>(std::min<uint64_t>(*n, 1024));
    }
    if (_queue_count > _backend_queues) {
        return make_error(
            EINVAL, fmt::format("path={}: the back end offers {} virtqueue{}, and this device "
                                "needs submit_queues + poll_queues = {}: give fewer (e.g. "
                                "poll_queues=0), or export with more queues",
                                _client.path(), _backend_queues, _backend_queues == 1 ? "" : "s",
                                _queue_count));
    }
    if (auto r = _client.set_owner(); !r) {
        return r;
    }
    _features = *offered & k_wanted_features;
    _indirect = o.flag("indirect");
    if (_indirect) {
        if ((*offered & feature_bit(VIRTIO_RING_F_INDIRECT_DESC)) == 0) {
            return make_error(EINVAL, fmt::format("indirect=1: the back end at {} does not offer "
                                                  "VIRTIO_RING_F_INDIRECT_DESC",
                                                  _client.path()));
        }
        _features |= feature_bit(VIRTIO_RING_F_INDIRECT_DESC);
    }
    return {};
}

result<void> virtio_target::read_config(const virtio::blk_config& cfg, const option_set& o)
{
    const virtio_blk_config& c = cfg.base;
    const auto has = [&](unsigned f) { return (_features & feature_bit(f)) != 0; };
    const uint32_t lbs = has(VIRTIO_BLK_F_BLK_SIZE) ? c.blk_size : 512;
    if (lbs < 512 || lbs > 65536 || (lbs & (lbs - 1)) != 0) {
        return make_error(EPROTO, fmt::format("path={}: the back end's block size {} is not a "
                                              "power of two from 512 to 65536",
                                              _client.path(), lbs));
    }
    _limits.logical_block_size = lbs;
    _limits.physical_block_size =
        has(VIRTIO_BLK_F_TOPOLOGY) && c.physical_block_exp < 8 ? lbs << c.physical_block_exp : lbs;
    _limits.capacity_bytes = c.capacity * 512;
    _limits.capacity_bytes -= _limits.capacity_bytes % lbs;
    uint64_t transfer = o.u64("max_transfer") * 1024;
    if (has(VIRTIO_BLK_F_SIZE_MAX) && c.size_max != 0) {
        transfer = std::min<uint64_t>(transfer, c.size_max);  // one data segment per request
    }
    transfer -= transfer % std::max<uint32_t>(lbs, 4096);
    if (transfer < lbs) {
        return make_error(EINVAL, fmt::format("max_transfer={}: smaller than a block ({} bytes) "
                                              "or the back end's size_max ({})",
                                              o.u64("max_transfer"), lbs, c.size_max));
    }
    _data_bytes = static_cast<uint32_t>(transfer);
    _limits.max_transfer_bytes = _data_bytes;
    _limits.read_only = has(VIRTIO_BLK_F_RO);
    _limits.volatile_write_cache =
        has(VIRTIO_BLK_F_FLUSH) && (!has(VIRTIO_BLK_F_CONFIG_WCE) || c.wce != 0);
    _limits.fua = false;
    if (has(VIRTIO_BLK_F_DISCARD)) {
        _limits.max_discard_bytes =
            round_bytes(c.max_discard_sectors != 0 ? c.max_discard_sectors : UINT32_MAX, lbs);
    }
    if (has(VIRTIO_BLK_F_WRITE_ZEROES)) {
        _limits.max_write_zeroes_bytes = round_bytes(
            c.max_write_zeroes_sectors != 0 ? c.max_write_zeroes_sectors : UINT32_MAX, lbs);
    }
    if (has(VIRTIO_BLK_F_ZONED)) {
        const auto& z = virtio::zoned_of(cfg);
        if (z.model != VIRTIO_BLK_Z_HM || z.zone_sectors == 0) {
            // Host-aware devices take random writes: used as a normal disk,
            // as Linux does.
            _features &= ~feature_bit(VIRTIO_BLK_F_ZONED);
        } else {
            _limits.zoned = true;
            _limits.zone_size_bytes = uint64_t{z.zone_sectors} * 512;
            _limits.max_open_zones = z.max_open_zones;
            _limits.max_active_zones = z.max_active_zones;
            _limits.max_zone_append_bytes =
                std::min<uint32_t>(round_bytes(z.max_append_sectors, lbs), _data_bytes);
        }
    }
    return {};
}

result<void> virtio_target::share_memory(const option_set& o)
{
    _ring_num = std::bit_ceil(_indirect ? _depth : 3 * _depth);
    if (_ring_num > virtio::k_max_queue_size) {
        return make_error(EINVAL,
                          fmt::format("hw_queue_depth={}: needs a ring of {} descriptors, more "
                                      "than {}; give hw_queue_depth={} at most, or indirect=1 "
                                      "(then up to {})",
                                      _depth, _ring_num, virtio::k_max_queue_size,
                                      virtio::k_max_queue_size / 3, virtio::k_max_queue_size));
    }
    const uint64_t page = 4096;
    const uint64_t ring_bytes = align_up(virtio::driver_ring::bytes(_ring_num), page);
    const uint64_t tag_bytes = align_up(uint64_t{_depth} * sizeof(tag_area), page);
    const uint64_t data_bytes = uint64_t{_depth} * _data_bytes;
    const uint64_t per_queue = data_bytes + ring_bytes + tag_bytes;
    _memory_bytes = per_queue * _queue_count;
    _memfd = ::memfd_create("softblk-virtio", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (_memfd < 0 || ::ftruncate(_memfd, static_cast<off_t>(_memory_bytes)) != 0) {
        const int e = errno;
        return make_error(e, fmt::format("shared memory of {} bytes (memfd): {}", _memory_bytes,
                                         std::strerror(e)));
    }
    // The back end maps it: it must not change size under its feet.
    ::fcntl(_memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
    _memory = ::mmap(nullptr, _memory_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, _memfd, 0);
    if (_memory == MAP_FAILED) {
        _memory = nullptr;
        const int e = errno;
        return make_error(e, fmt::format("mapping {} bytes of shared memory: {}", _memory_bytes,
                                         std::strerror(e)));
    }
    auto* base = static_cast<uint8_t*>(_memory);
    for (unsigned q = 0; q < _queue_count; ++q) {
        uint8_t* at = base + q * per_queue;
        queue_layout l;
        l.index = q;
        l.data = at;
        l.ring = at + data_bytes;
        l.tags = reinterpret_cast<tag_area*>(at + data_bytes + ring_bytes);
        l.num = _ring_num;
        l.depth = _depth;
        l.data_bytes = _data_bytes;
        l.event_idx = (_features & feature_bit(VIRTIO_RING_F_EVENT_IDX)) != 0;
        l.indirect = _indirect;
        l.polling = q >= _submit_queues || o.flag("poll");
        l.volatile_cache = _limits.volatile_write_cache;
        l.zone_bytes = _limits.zone_size_bytes;
        l.capacity_bytes = _limits.capacity_bytes;
        l.kick_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        l.call_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (l.kick_fd >= 0) {
            _event_fds.push_back(l.kick_fd);
        }
        if (l.call_fd >= 0) {
            _event_fds.push_back(l.call_fd);
        }
        if (l.kick_fd < 0 || l.call_fd < 0) {
            return make_error(EMFILE, "no eventfd for a virtqueue (out of descriptors?)");
        }
        _queues.push_back(std::make_unique<driver_queue>(l, _dead));
    }
    // Guest addresses are this process's addresses: descriptors carry
    // pointers as they are.
    const uint64_t where = reinterpret_cast<uint64_t>(_memory);
    return _client.set_mem_table({vu::region_desc{where, _memory_bytes, where, 0}}, {_memfd});
}

result<void> virtio_target::set_features()
{
    if (auto r = _client.set_u64(vu::k_set_features, _features); !r) {
        return r;
    }
    return {};
}

result<void> virtio_target::learn_zones()
{
    // Virtio gives the zone size; softblk's limits also want the number of
    // conventional zones at the start and the zones' capacity.
    const uint64_t zones = zone_count(_limits);
    const uint32_t per_report = static_cast<uint32_t>(
        std::min<uint64_t>((_data_bytes - sizeof(virtio::virtio_blk_zone_report)) /
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
        const int n = _queues[0]->run_sync(r, uint64_t{5'000'000'000});
        if (n <= 0) {
            return make_error(n < 0 ? -n : EPROTO,
                              fmt::format("path={}: reporting the zones of a zoned device: {}",
                                          _client.path(), n < 0 ? std::strerror(-n) : "no zones"));
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
    const std::string path = o.text("path");
    if (path.empty()) {
        return make_error(EINVAL,
                          "path=: the back end's vhost-user socket is required (e.g. "
                          "path=/run/softblk/vhost-user-blk/d0.sock)");
    }
    if (path.front() != '/') {
        // As the file target's path=: the daemon connects, from its own
        // working directory, and again after a restart.
        return make_error(EINVAL, fmt::format("path={}: give an absolute path (the daemon "
                                              "connects to the socket, from its own working "
                                              "directory, and again after a restart)",
                                              path));
    }
    _submit_queues = static_cast<unsigned>(o.u64("submit_queues"));
    _queue_count = _submit_queues + static_cast<unsigned>(o.u64("poll_queues"));
    _depth = static_cast<uint32_t>(o.u64("hw_queue_depth"));
    _polling = o.flag("poll");
    auto client = vhost_user_client::connect(path, static_cast<uint32_t>(o.u64("connect_timeout")));
    if (!client) {
        return std::unexpected(client.error());
    }
    _client = std::move(*client);
    uint64_t protocol = 0;
    if (auto r = negotiate(o, protocol); !r) {
        return r;
    }
    const uint32_t config_bytes = (_features & feature_bit(VIRTIO_BLK_F_ZONED)) != 0
                                      ? uint32_t{virtio::k_blk_config_bytes}
                                      : k_config_bytes;
    auto raw = _client.get_config(config_bytes);
    if (!raw) {
        return std::unexpected(raw.error());
    }
    virtio::blk_config cfg;
    std::memset(&cfg, 0, sizeof cfg);
    std::memcpy(&cfg, raw->data(), std::min<size_t>(raw->size(), sizeof cfg));
    if (auto r = read_config(cfg, o); !r) {
        return r;
    }
    if (auto r = set_features(); !r) {
        return r;
    }
    if (auto r = share_memory(o); !r) {
        return r;
    }
    for (unsigned q = 0; q < _queue_count; ++q) {
        const queue_layout& l = _queues[q]->layout();
        vhost_vring_addr addr{};
        addr.index = q;
        addr.desc_user_addr = reinterpret_cast<uint64_t>(l.ring);
        addr.avail_user_addr = reinterpret_cast<uint64_t>(_queues[q]->ring().avail_addr());
        addr.used_user_addr = reinterpret_cast<uint64_t>(_queues[q]->ring().used_addr());
        auto r = _client.set_state(vu::k_set_vring_num, q, l.num);
        if (r) {
            r = _client.set_state(vu::k_set_vring_base, q, 0);
        }
        if (r) {
            r = _client.set_vring_addr(addr);
        }
        if (r) {
            r = _client.set_vring_fd(vu::k_set_vring_kick, q, l.kick_fd);
        }
        if (r) {
            r = _client.set_vring_fd(vu::k_set_vring_call, q, l.call_fd);
        }
        if (r) {
            r = _client.set_state(vu::k_set_vring_enable, q, 1);
        }
        if (!r) {
            return r;
        }
    }
    if (_limits.zoned) {
        if (auto r = learn_zones(); !r) {
            return r;
        }
    }
    _stop_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (_stop_fd < 0) {
        return make_error(errno, "eventfd");
    }
    _monitor = std::thread([this] { watch(); });
    return {};
}

void virtio_target::watch()
{
    // The back end sends nothing unasked on this socket after setup: any
    // readable event is its end.
    pollfd fds[2] = {{_client.fd(), POLLIN | POLLRDHUP, 0}, {_stop_fd, POLLIN, 0}};
    while (::poll(fds, 2, -1) < 0 && errno == EINTR) {
    }
    if ((fds[1].revents & POLLIN) != 0) {
        return;
    }
    _dead.store(true, std::memory_order_release);
    fmt::print(stderr, "virtio: the back end at {} went away; requests in flight fail with EIO\n",
               _client.path());
    for (const auto& q : _queues) {
        const uint64_t one = 1;
        [[maybe_unused]] ssize_t n = ::write(q->layout().call_fd, &one, sizeof one);
    }
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
