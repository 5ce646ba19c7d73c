// The rbd target: a device whose data is a Ceph RADOS Block Device image,
// served through librbd's asynchronous C API (Debian's librbd-dev), as
// QEMU's and SPDK's rbd drivers serve it; librbd is loaded when the first
// rbd device is made (librbd_calls.hpp says why). docs/rbd.md has the
// options, the rules and the pitfalls.
//
// Built as the file target is (src/targets/file): an option table, a target
// (the cluster connection, the open image, the allocation map) and a
// target_queue (the hot path). librbd runs each request's completion
// callback on one of its own threads; the callback only pushes the request
// onto its queue's lock-free list and wakes the queue's eventfd, and the
// queue's own thread completes it from poll(). No thread per request, no
// polling while idle. Connecting to the cluster and opening the image is
// rbd_connect.cpp.
#include "completion_list.hpp"
#include "rbd_connect.hpp"
#include "librbd_calls.hpp"
#include "map_worker.hpp"

#include <softblk/support/intrusive_fifo.hpp>
#include <softblk/target.hpp>

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fmt/core.h>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

namespace softblk::targets {

namespace {

using namespace rbd;

// Largest read or write in one request: the image's object set (object
// size times stripe count, 4 MiB by default), as the kernel's rbd driver
// sets max_hw_sectors, so that a request the front end passes whole is one
// librbd call, never two that then queue behind each other in one object.
// At most 32 MiB, ublk's largest per-tag buffer (the ublk front end sizes
// its buffers from max_transfer; their pages are committed only as used).
constexpr uint64_t k_max_transfer_cap = 32u << 20;
constexpr uint32_t k_block = 512;

constexpr option_def k_rbd_options[] = {
    {.name = "pool",
     .kind = option_kind::text,
     .default_value = "rbd",
     .unit = "",
     .help = "the RADOS pool that holds the image"},
    {.name = "image",
     .kind = option_kind::text,
     .default_value = "",
     .unit = "",
     .help = "the RBD image (required)"},
    {.name = "id",
     .kind = option_kind::text,
     .default_value = "admin",
     .unit = "",
     .help = "the Ceph client name without 'client.' (its key must be in the keyring)"},
    {.name = "conf",
     .kind = option_kind::text,
     .default_value = "",
     .unit = "absolute path",
     .help = "ceph.conf to read; empty: $CEPH_CONF, then /etc/ceph/ceph.conf, ~/.ceph/ceph.conf, "
             "./ceph.conf",
     .check = check_absolute_path},
    {.name = "keyring",
     .kind = option_kind::text,
     .default_value = "",
     .unit = "absolute path",
     .help = "keyring with the client's key; empty: the conf file's keyring setting",
     .check = check_absolute_path},
    {.name = "snap",
     .kind = option_kind::text,
     .default_value = "",
     .unit = "",
     .help = "serve this snapshot of the image, read-only"},
    {.name = "create",
     .kind = option_kind::boolean,
     .default_value = "0",
     .unit = "",
     .help = "create the image with size= bytes if the pool has none of that name (the "
             "cluster's rbd_default_features); an existing image is opened as it is"},
    {.name = "size",
     .kind = option_kind::text,
     .default_value = "0",
     .unit = "bytes",
     .help = "size of the image create=1 makes, bytes with an optional binary suffix (64M, 2G); "
             "the device's size is always the image's"},
    {.name = "read_only",
     .kind = option_kind::boolean,
     .default_value = "0",
     .unit = "",
     .help = "open the image read-only and refuse writes"},
    {.name = "connect_timeout",
     .kind = option_kind::integer,
     .default_value = "10",
     .unit = "s",
     .help = "seconds to wait for the monitors at add time (client_mount_timeout, "
             "rados_mon_op_timeout): an unreachable cluster fails the add",
     .min = 1,
     .max = 600},
    {.name = "osd_op_timeout",
     .kind = option_kind::integer,
     .default_value = "0",
     .unit = "s",
     .help = "seconds an I/O may wait for the OSDs before it fails with ETIMEDOUT "
             "(rados_osd_op_timeout); 0: wait until the cluster serves again",
     .max = 3600},
};

// Per-request state while librbd holds it, in io_request::target_scratch:
//   [0] the result librbd gave (int64)
//   [1] the owning rbd_queue's address; bit 0 set while a FUA write waits
//       for its flush
constexpr uint64_t k_fua_pending = 1;

class rbd_target;

// Per-queue half. The queue's thread calls submit/poll/next_wakeup_ns;
// librbd's threads and the map worker call only on_aio_done / hand_back.
class rbd_queue final : public target_queue {
public:
    rbd_queue(rbd_image_t image, completion_sink& sink, int event_fd, rbd_target& target)
        : _image(image), _sink(sink), _target(target), _done(event_fd)
    {
    }
    ~rbd_queue() override;

    void submit(io_request& r) override;
    unsigned poll() override;
    bool busy() const override { return _in_flight != 0; }
    int wait_fd() const override { return _done.fd(); }
    uint64_t next_wakeup_ns() const override { return _done.ready_or_reset() ? 0 : UINT64_MAX; }
    // librbd (or the map worker) holds the request and may still fill its
    // buffer: it cannot be let go before it comes back.
    bool timed_out(io_request&) override { return false; }

    // librbd's completion callback (any librbd thread): hands the request
    // to its queue's thread.
    static void on_aio_done(rbd_completion_t c, void* arg);
    // Hands `r`, whose result is in target_scratch[0], back to the queue
    // that submitted it. Any thread.
    static void hand_back(io_request& r);

private:
    int start(io_request& r);
    void finish(io_request& r, int64_t res);
    void finish_map(io_request& r, int64_t res);

    rbd_image_t _image;
    completion_sink& _sink;
    rbd_target& _target;
    unsigned _in_flight = 0;  // queue thread only
    // Allocation maps: one at a time per queue on the target's map worker
    // (so one queue cannot fill the worker), the rest wait here in order.
    bool _map_posted = false;
    intrusive_fifo<io_request> _maps_waiting;
    // Requests that came back and poll() has not completed yet.
    rbd::completion_list _done;
};

class rbd_target final : public target {
public:
    rbd_target(rados_t cluster, rados_ioctx_t io, rbd_image_t image, const block_limits& limits,
               std::string pool, std::string image_name, std::string snap, std::string id)
        : _cluster(cluster),
          _io(io),
          _image(image),
          _limits(limits),
          _pool(std::move(pool)),
          _image_name(std::move(image_name)),
          _snap(std::move(snap)),
          _id(std::move(id)),
          _image_size(limits.capacity_bytes),
          _maps([this](io_request& r) {
              r.target_scratch[0] =
                  static_cast<uint64_t>(static_cast<int64_t>(answer_report_extents(*this, r)));
              rbd_queue::hand_back(r);
          })
    {
        // The image's header changes (resize, snapshots, features): re-read
        // its size, which `softblk list` shows and watch_capacity's callback
        // makes the device's.
        if (librbd().rbd_update_watch(_image, &_watch, &rbd_target::on_header_update, this) == 0) {
            _watching = true;
        }
    }

    ~rbd_target() override
    {
        if (_watching) {
            librbd().rbd_update_unwatch(_image, _watch);
        }
        // rbd_close flushes the cache and releases the exclusive lock; the
        // queues (destroyed before the target) have no request in flight.
        librbd().rbd_close(_image);
        librbd().rados_ioctx_destroy(_io);
        librbd().rados_shutdown(_cluster);
    }

    const block_limits& limits() const override { return _limits; }

    void watch_capacity(std::function<void(uint64_t bytes)> resized) override
    {
        std::lock_guard lock(_resize_mutex);
        _resized = std::move(resized);
        // A resize between rbd_open and now: the device learns it here.
        if (const uint64_t size = _image_size.load(std::memory_order_relaxed);
            size / k_block * k_block != _limits.capacity_bytes) {
            _resized(size);
        }
    }

    result<std::unique_ptr<target_queue>> open_queue(unsigned index, completion_sink& sink) override
    {
        const int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (fd < 0) {
            return make_error(
                errno, fmt::format("rbd queue {}: eventfd: {}", index, std::strerror(errno)));
        }
        return std::make_unique<rbd_queue>(_image, sink, fd, *this);
    }

    int map_extents(uint64_t offset, uint64_t length, std::vector<extent>& out) override;

    void describe(nlohmann::json& out) const override
    {
        out["pool"] = _pool;
        out["image"] = _image_name;
        out["id"] = _id;
        if (!_snap.empty()) {
            out["snap"] = _snap;
        }
        const uint64_t size = _image_size.load(std::memory_order_relaxed);
        out["image_size"] = size;
        out["size_changes"] = _size_changes.load(std::memory_order_relaxed);
        out["io_errors"] = _io_errors.load(std::memory_order_relaxed);
    }

    void count_error() { _io_errors.fetch_add(1, std::memory_order_relaxed); }

    // Answers the report_extents request `r` on the map worker and hands it
    // back to its queue. A queue's thread.
    void post_map(io_request& r) { _maps.post(r); }

private:
    // librbd's watcher thread; rbd_update_unwatch (the destructor) waits
    // for a call in progress.
    static void on_header_update(void* arg)
    {
        auto* self = static_cast<rbd_target*>(arg);
        uint64_t size = 0;
        if (librbd().rbd_get_size(self->_image, &size) != 0) {
            return;
        }
        std::lock_guard lock(self->_resize_mutex);
        if (self->_image_size.exchange(size, std::memory_order_relaxed) == size) {
            return;  // another header change (a snapshot, a feature)
        }
        self->_size_changes.fetch_add(1, std::memory_order_relaxed);
        if (self->_resized) {
            self->_resized(size);
        }
    }

    rados_t _cluster;
    rados_ioctx_t _io;
    rbd_image_t _image;
    block_limits _limits;
    std::string _pool;
    std::string _image_name;
    std::string _snap;
    std::string _id;
    uint64_t _watch = 0;
    bool _watching = false;
    std::atomic<uint64_t> _image_size;
    // The core's watch_capacity callback; the mutex also keeps two header
    // changes from reaching it out of order.
    std::mutex _resize_mutex;
    std::function<void(uint64_t)> _resized;
    std::atomic<uint64_t> _size_changes{0};
    std::atomic<uint64_t> _io_errors{0};
    // Idle when the destructor closes the image: the queues, destroyed
    // before the target, wait for their maps.
    rbd::map_worker _maps;
};

// ---------------------------------------------------------------- queue

rbd_queue::~rbd_queue()
{
    // A queue may be destroyed while librbd or the map worker still holds
    // requests (a front end stopped while the cluster was away): they will
    // come back to this queue, so wait for every one (the completions are
    // dropped, as the core already gave up on them). Maps that wait for
    // their turn were never posted: drop them now.
    while (_maps_waiting.pop() != nullptr) {
        --_in_flight;
    }
    while (_in_flight != 0) {
        pollfd p{_done.fd(), POLLIN, 0};
        ::poll(&p, 1, 100);
        for (io_request* r = _done.take(); r != nullptr; r = r->next) {
            --_in_flight;
        }
    }
    // ~completion_list waits for the last push to return.
}

void rbd_queue::hand_back(io_request& r)
{
    auto* q = reinterpret_cast<rbd_queue*>(r.target_scratch[1] & ~k_fua_pending);
    q->_done.push(r);
}

void rbd_queue::on_aio_done(rbd_completion_t c, void* arg)
{
    auto& r = *static_cast<io_request*>(arg);
    r.target_scratch[0] =
        static_cast<uint64_t>(static_cast<int64_t>(librbd().rbd_aio_get_return_value(c)));
    librbd().rbd_aio_release(c);
    hand_back(r);
}

int rbd_queue::start(io_request& r)
{
    rbd_completion_t c = nullptr;
    int rc = librbd().rbd_aio_create_completion(&r, &rbd_queue::on_aio_done, &c);
    if (rc < 0) {
        return rc;
    }
    char* buf = static_cast<char*>(r.buffer);
    if (r.target_scratch[1] & k_fua_pending) {
        rc = librbd().rbd_aio_flush(_image, c);
    } else {
        switch (r.op) {
        case io_op::read:
            rc = librbd().rbd_aio_read(_image, r.offset, r.length, buf, c);
            break;
        case io_op::write:
            rc = librbd().rbd_aio_write(_image, r.offset, r.length, buf, c);
            break;
        case io_op::flush:
            rc = librbd().rbd_aio_flush(_image, c);
            break;
        case io_op::discard:
            rc = librbd().rbd_aio_discard(_image, r.offset, r.length, c);
            break;
        case io_op::write_zeroes:
            // Without unmap the zeros stay allocated (thick provisioning):
            // librbd writes them, which is not fast.
            if ((r.flags & k_io_no_unmap) != 0 && (r.flags & k_io_fast_zero) != 0) {
                rc = -EOPNOTSUPP;
            } else {
                rc = librbd().rbd_aio_write_zeroes(
                    _image, r.offset, r.length, c,
                    (r.flags & k_io_no_unmap) != 0 ? RBD_WRITE_ZEROES_FLAG_THICK_PROVISION : 0, 0);
            }
            break;
        default:
            rc = -EOPNOTSUPP;
            break;
        }
    }
    if (rc < 0) {
        librbd().rbd_aio_release(c);
    }
    return rc;
}

void rbd_queue::submit(io_request& r)
{
    r.target_scratch[1] = reinterpret_cast<uint64_t>(this);
    if (r.op == io_op::report_extents) {
        // rbd_diff_iterate2 is synchronous (a few round trips to the OSDs,
        // forever while they are down): the target's worker runs it.
        ++_in_flight;
        if (_map_posted) {
            _maps_waiting.push(r);
        } else {
            _map_posted = true;
            _target.post_map(r);
        }
        return;
    }
    const int rc = start(r);
    if (rc < 0) {
        _target.count_error();
        _sink.complete(r, rc);
        return;
    }
    ++_in_flight;
}

void rbd_queue::finish_map(io_request& r, int64_t res)
{
    --_in_flight;
    if (io_request* next = _maps_waiting.pop(); next != nullptr) {
        _target.post_map(*next);
    } else {
        _map_posted = false;
    }
    _sink.complete(r, static_cast<int>(res));
}

void rbd_queue::finish(io_request& r, int64_t res)
{
    if (r.op == io_op::report_extents) {
        finish_map(r, res);
        return;
    }
    if (res >= 0 && r.op == io_op::write && (r.flags & k_io_fua) != 0 &&
        (r.target_scratch[1] & k_fua_pending) == 0) {
        // FUA: librbd has no such flag; the write is durable once a flush
        // issued after its completion completes (QEMU's rbd driver does the
        // same through the block layer).
        r.target_scratch[1] |= k_fua_pending;
        const int rc = start(r);
        if (rc == 0) {
            return;
        }
        res = rc;
    }
    --_in_flight;
    int result = 0;
    if (res < 0) {
        _target.count_error();
        result = static_cast<int>(res);
    } else if (r.op == io_op::read || r.op == io_op::write) {
        if (r.op == io_op::read && res < static_cast<int64_t>(r.length)) {
            // librbd ends a read at the image's end (an image shrunk under
            // the device): the rest reads as zeros, as QEMU's driver does.
            std::memset(static_cast<char*>(r.buffer) + res, 0, r.length - res);
        }
        result = static_cast<int>(r.length);
    }
    _sink.complete(r, result);
}

unsigned rbd_queue::poll()
{
    unsigned n = 0;
    for (io_request* r = _done.take(); r != nullptr;) {
        io_request* next = r->next;
        r->next = nullptr;
        const unsigned before = _in_flight;
        finish(*r, static_cast<int64_t>(r->target_scratch[0]));
        n += before - _in_flight;
        r = next;
    }
    return n;
}

// ---------------------------------------------------------------- map

struct diff_walk {
    uint64_t block;
    uint64_t at;  // the end of what `out` covers
    std::vector<extent>* out;
};

void append_extent(std::vector<extent>& out, uint64_t offset, uint64_t length, bool data)
{
    if (length == 0) {
        return;
    }
    if (!out.empty() && out.back().allocated == data &&
        out.back().offset + out.back().length == offset) {
        out.back().length += length;
        return;
    }
    out.push_back(extent{.offset = offset, .length = length, .allocated = data, .zero = !data});
}

int on_diff_extent(uint64_t offset, size_t length, int exists, void* arg)
{
    auto& w = *static_cast<diff_walk*>(arg);
    if (!exists) {
        // Only diffs between snapshots report removed extents; against
        // nothing (fromsnapname NULL) everything reported exists.
        return 0;
    }
    // Data is widened to whole blocks; what lies between is a hole.
    const uint64_t start = std::max(w.at, offset / w.block * w.block);
    const uint64_t end = (offset + length + w.block - 1) / w.block * w.block;
    if (end <= start) {
        return 0;
    }
    append_extent(*w.out, w.at, start - w.at, false);
    append_extent(*w.out, start, end - start, true);
    w.at = end;
    return 0;
}

int rbd_target::map_extents(uint64_t offset, uint64_t length, std::vector<extent>& out)
{
    // The image as it is now (the core has checked the range against the
    // device's capacity, which follows the image's size).
    const uint64_t image_end = _image_size.load(std::memory_order_relaxed) / k_block * k_block;
    const uint64_t end = std::min(image_end, offset + length);
    if (offset >= end) {
        return 0;
    }
    std::vector<extent> found;
    diff_walk w{.block = _limits.logical_block_size, .at = offset, .out = &found};
    // include_parent=1: a clone's data inherited from its parent is data.
    const int rc = librbd().rbd_diff_iterate2(_image, nullptr, offset, end - offset, 1, 0,
                                              &on_diff_extent, &w);
    if (rc < 0) {
        return rc;
    }
    if (w.at < end) {
        append_extent(found, w.at, end - w.at, false);
    }
    for (extent& e : found) {
        e.length = std::min(e.offset + e.length, end) - e.offset;
        append_extent(out, e.offset, e.length, e.allocated);
    }
    return 0;
}

// ---------------------------------------------------------------- create

result<std::unique_ptr<target>> create_rbd(const option_set& o)
{
    const std::string& pool = o.text("pool");
    const std::string& image = o.text("image");
    const std::string& id = o.text("id");
    const std::string& conf = o.text("conf");
    const std::string& keyring = o.text("keyring");
    const std::string& snap = o.text("snap");
    const bool create = o.flag("create");
    const bool read_only = o.flag("read_only") || !snap.empty();
    if (image.empty()) {
        return make_error(EINVAL,
                          "image: the rbd target needs image=NAME (and pool=, default rbd)");
    }
    if (pool.empty()) {
        return make_error(EINVAL, "pool: give the RADOS pool that holds the image");
    }
    auto size = parse_size(o.text("size"));
    if (!size) {
        return make_error(size.error().code.value(),
                          fmt::format("size={}: {}", o.text("size"), size.error().message));
    }
    if (create && *size == 0) {
        return make_error(EINVAL, fmt::format("image={}: create=1 needs size= (how large the "
                                              "image is)",
                                              image));
    }
    if (!create && *size != 0) {
        return make_error(EINVAL,
                          "size: only create=1 takes a size; the device's size is the "
                          "image's");
    }
    if (*size % k_block != 0) {
        return make_error(EINVAL,
                          fmt::format("size={}: not a multiple of {} bytes", *size, k_block));
    }
    if (create && !snap.empty()) {
        return make_error(EINVAL,
                          "snap: a snapshot cannot be created with create=1; give one "
                          "or the other");
    }

    if (!conf.empty()) {
        // librados reports a directory as ENOENT ("No such file or
        // directory"), which sends one looking for a missing file.
        struct stat st {};
        if (::stat(conf.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
            return make_error(EISDIR, fmt::format("conf={}: a directory; give the ceph.conf "
                                                  "file itself (conf={}/ceph.conf)",
                                                  conf, conf));
        }
    }

    if (auto loaded = load_librbd(); !loaded) {
        return std::unexpected(loaded.error());
    }
    const rbd_settings set{.pool = pool,
                           .image = image,
                           .id = id,
                           .conf = conf,
                           .keyring = keyring,
                           .snap = snap,
                           .create = create,
                           .size = *size,
                           .read_only = read_only,
                           .connect_timeout = o.u64("connect_timeout")};
    const uint64_t osd_op_timeout = o.u64("osd_op_timeout");
    if (osd_op_timeout == 0) {
        // Opening reads the image's header from an OSD, and without an
        // osd_op_timeout librados waits for one forever, holding up the
        // daemon's control thread: a first open on a handle of its own
        // with connect_timeout as its OSD timeout bounds the add.
        // Read-only: the probe takes no lock and writes nothing but the
        // image that create=1 makes.
        rbd_settings probe_set = set;
        probe_set.read_only = true;
        rbd_handles probe;
        if (auto r = open_image(probe_set, {set.connect_timeout, "connect_timeout"}, probe); !r) {
            return std::unexpected(r.error());
        }
    }
    rbd_handles h;
    if (auto r = open_image(set, {osd_op_timeout, "osd_op_timeout"}, h); !r) {
        return std::unexpected(r.error());
    }
    rbd_image_info_t info{};
    int rc = librbd().rbd_stat(h.image, &info, sizeof(info));
    uint64_t stripe_count = 1;
    if (rc == 0) {
        rc = librbd().rbd_get_stripe_count(h.image, &stripe_count);
    }
    if (rc < 0) {
        return make_error(-rc, fmt::format("image={}: cannot read its size and layout: {}", image,
                                           errno_text(rc)));
    }
    const uint64_t image_size = info.size;
    const uint64_t capacity = image_size / k_block * k_block;
    if (capacity == 0) {
        return make_error(EINVAL, fmt::format("image={}: {} bytes is less than one block ({} "
                                              "bytes)",
                                              image, image_size, k_block));
    }

    block_limits lim;
    lim.capacity_bytes = capacity;
    lim.logical_block_size = k_block;
    lim.physical_block_size = 4096;
    lim.max_transfer_bytes = static_cast<uint32_t>(std::clamp<uint64_t>(
        info.obj_size * std::max<uint64_t>(stripe_count, 1), 4096, k_max_transfer_cap));
    const uint32_t whole = UINT32_MAX / k_block * k_block;
    lim.max_discard_bytes = read_only ? 0 : whole;
    lim.max_write_zeroes_bytes = read_only ? 0 : whole;
    // librbd's cache (rbd_cache, on by default) holds writes until a flush:
    // the device has a volatile write cache and FLUSH is rbd_aio_flush. FUA
    // is a write followed by a flush.
    lim.volatile_write_cache = !read_only;
    lim.fua = !read_only;
    lim.read_only = read_only;
    lim.rotational = false;
    auto t = std::make_unique<rbd_target>(h.cluster, h.io, h.image, lim, pool, image, snap, id);
    h.cluster = nullptr;
    h.io = nullptr;
    h.image = nullptr;
    return t;
}

[[maybe_unused]] const bool k_registered = register_target_type(target_type{
    .name = "rbd",
    .description = "a Ceph RBD image through librbd's asynchronous API; the data lives in the "
                   "cluster",
    .options = k_rbd_options,
    .create = create_rbd,
    .submit_queues = nullptr,
});

}  // namespace

}  // namespace softblk::targets
