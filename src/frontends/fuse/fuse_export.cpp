#define FUSE_USE_VERSION 312

#include "fuse_export.hpp"

#include "loop_device.hpp"
#include "mounts.hpp"
#include "open_reply.hpp"

#include <softblk/support/buffer_pool.hpp>
#include <softblk/support/clock.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <memory>
#include <mutex>
#include <optional>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include <fmt/core.h>

namespace softblk::fuse {

namespace {

constexpr fuse_ino_t k_file_ino = 2;
// Largest FUSE read or write: libfuse 3.14's receive buffer holds 256 pages.
constexpr uint32_t k_max_io = 1u << 20;
// Requests the kernel keeps in flight towards us (async direct I/O from the
// loop driver counts as background requests; the kernel's default is 12).
constexpr unsigned k_max_background = 128;
// lseek(SEEK_DATA/SEEK_HOLE) reads the allocation map in windows this big.
constexpr uint64_t k_map_window = 256ull << 20;
constexpr std::chrono::milliseconds k_join_timeout{10'000};

constexpr option_def k_options[] = {
    {.name = "loop",
     .kind = option_kind::boolean,
     .default_value = "1",
     .unit = "",
     .help =
         "attach the file to a loop device with direct I/O (needs root; a daemon that is not root "
         "defaults to 0); 0: the file only"},
    {.name = "threads",
     .kind = option_kind::integer,
     .default_value = "0",
     .unit = "",
     .help =
         "FUSE worker threads; 0: one per submit queue of the device. A single worker that owns "
         "its "
         "queue keeps many requests in flight (it replies as the device completes them); several "
         "workers each wait for their own request",
     .min = 0,
     .max = 64},
    {.name = "poll_us",
     .kind = option_kind::integer,
     .default_value = "50",
     .unit = "us",
     .help =
         "after a request, one worker at a time busy-polls /dev/fuse (yielding the CPU to any "
         "other ready thread) for up to this long before sleeping; the window adapts to the gap "
         "between requests (0 when they come further apart); 0: never poll. Not given: 50 with "
         "one worker, 0 with several (polling does not help them)",
     .min = 0,
     .max = 1000},
};

// Interrupts a worker blocked in read(/dev/fuse) during stop(). The handler
// does nothing: the point is the EINTR.
int wake_signal()
{
    return SIGRTMIN + 3;
}

void install_wake_handler()
{
    static std::once_flag once;
    std::call_once(once, [] {
        struct sigaction action {};
        action.sa_handler = [](int) {};
        sigemptyset(&action.sa_mask);
        action.sa_flags = 0;  // no SA_RESTART: read() must fail with EINTR
        ::sigaction(wake_signal(), &action, nullptr);
    });
}

// The first busy-poll window after a short sleep, as QEMU's adaptive
// polling starts (then doubled up to poll_us).
constexpr uint64_t k_poll_start_ns = 4'000;

uint64_t align_down(uint64_t value, uint64_t block)
{
    return value - value % block;
}
uint64_t align_up(uint64_t value, uint64_t block)
{
    return align_down(value + block - 1, block);
}

class fuse_export;
struct pending_io;

// One FUSE worker thread and what it owns.
struct worker {
    fuse_export* owner = nullptr;
    unsigned index = 0;
    std::thread thread;
    pthread_t handle{};
    std::atomic<bool> done{false};
    // Bounce buffer for reads, read-modify-write and zero filling:
    // k_max_io plus one block at each edge.
    char* scratch = nullptr;
    size_t scratch_size = 0;
    device* dev = nullptr;
    // The submit queue this worker drives alone, or nullptr when there are
    // more workers than submit queues (then device::execute shares them).
    io_queue* queue = nullptr;
    // Current busy-poll window (ns), between 0 and the export's poll_us.
    uint64_t poll_ns = 0;
    // Requests taken after a busy poll, after sleeping, and the time spent
    // polling (ns); read by describe() while the worker runs.
    std::atomic<uint64_t> polled_requests{0};
    std::atomic<uint64_t> slept_requests{0};
    std::atomic<uint64_t> poll_time_ns{0};

    // Asynchronous mode (the export's only worker, owning its queue):
    // reads and writes are submitted and replied to from their completion,
    // so that a device that takes time (completion_nsec, a file) has many
    // requests in flight; the worker sleeps on /dev/fuse and the queue's
    // event at once while any are.
    bool async = false;
    unsigned in_flight = 0;
    // Whether /dev/fuse is currently O_NONBLOCK (async mode sets it while
    // requests are in flight, so that a request gone between poll and read
    // cannot block the worker with completions waiting).
    bool fd_nonblocking = false;
    // libfuse's receive buffer of the request being processed: a write that
    // outlives its call keeps the buffer its data lies in.
    fuse_buf* receive = nullptr;
    std::vector<std::unique_ptr<pending_io>> pending_store;
    std::vector<pending_io*> pending_free;
    // Read buffers of async mode, reused.
    buffer_pool buffers;

    ~worker();

    // Synchronous I/O of any length (the core splits it): on the worker's
    // own queue, or through device::execute when workers share queues.
    // Returns 0 or -errno. Worker thread.
    int execute(io_op op, uint64_t offset, uint64_t length, void* buffer, uint32_t flags = 0);

    // The allocation map, through the worker's queue as execute() goes.
    result<std::vector<extent>> map(uint64_t offset, uint64_t length);

    pending_io* take_pending();
};

// A read or write in flight in async mode.
struct pending_io {
    bio request;
    worker* owner = nullptr;
    fuse_req_t req = nullptr;
    bool is_read = false;
    // Set by the completion, which also returns the record to the free
    // list (the submitter checks it right after submitting).
    bool completed = false;
    // Read: the buffer the device fills, its class, and where in it the
    // reply starts.
    uint8_t* data = nullptr;
    unsigned data_class = 0;
    uint64_t skip = 0;
    // Bytes to reply (read) or to acknowledge (write).
    size_t size = 0;
    // Write: libfuse's receive buffer holding the data, once the write
    // outlived the receive (freed at completion).
    void* receive_mem = nullptr;
};

void on_async_complete(bio& request, int status)
{
    auto* p = static_cast<pending_io*>(request.user_data);
    worker& w = *p->owner;
    if (status < 0) {
        fuse_reply_err(p->req, -status);
    } else if (p->is_read) {
        fuse_reply_buf(p->req, reinterpret_cast<const char*>(p->data) + p->skip, p->size);
    } else {
        fuse_reply_write(p->req, p->size);
    }
    if (p->data != nullptr) {
        w.buffers.put(p->data, p->data_class);
        p->data = nullptr;
    }
    std::free(p->receive_mem);
    p->receive_mem = nullptr;
    p->completed = true;
    --w.in_flight;
    w.pending_free.push_back(p);
}

worker::~worker()
{
    std::free(scratch);
}

pending_io* worker::take_pending()
{
    if (pending_free.empty()) {
        pending_store.push_back(std::make_unique<pending_io>());
        pending_store.back()->owner = this;
        return pending_store.back().get();
    }
    pending_io* p = pending_free.back();
    pending_free.pop_back();
    return p;
}

int worker::execute(io_op op, uint64_t offset, uint64_t length, void* buffer, uint32_t flags)
{
    bio b = make_bio(op, offset, length, buffer, flags);
    return queue != nullptr ? queue->run(b) : dev->execute(b);
}

result<std::vector<extent>> worker::map(uint64_t offset, uint64_t length)
{
    return queue != nullptr ? queue->map(offset, length) : dev->map(offset, length);
}

thread_local worker* t_worker = nullptr;

class fuse_export final : public device_export {
public:
    fuse_export(device& dev, const export_context& ctx, const option_set& options);
    ~fuse_export() override;

    result<void> start();
    nlohmann::json describe() const override;
    result<void> stop() override;
    std::string in_use() const override;

private:
    // ---- FUSE operations (worker threads)
    static void op_init(void* userdata, fuse_conn_info* conn);
    static void op_lookup(fuse_req_t req, fuse_ino_t parent, const char* name);
    static void op_getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
    static void op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set,
                           fuse_file_info* fi);
    static void op_open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
    static void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi);
    static void op_write(fuse_req_t req, fuse_ino_t ino, const char* buf, size_t size, off_t off,
                         fuse_file_info* fi);
    static void op_flush(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
    static void op_release(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
    static void op_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, fuse_file_info* fi);
    static void op_opendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
    static void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                           fuse_file_info* fi);
    static void op_releasedir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
    static void op_statfs(fuse_req_t req, fuse_ino_t ino);
    static void op_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t offset, off_t length,
                             fuse_file_info* fi);
    static void op_lseek(fuse_req_t req, fuse_ino_t ino, off_t off, int whence, fuse_file_info* fi);

    static fuse_export& self(fuse_req_t req)
    {
        return *static_cast<fuse_export*>(fuse_req_userdata(req));
    }
    static const fuse_lowlevel_ops& operations();

    void run_worker(worker& w);
    // Busy-polls /dev/fuse until a request is pending (true) or `deadline`
    // (monotonic ns) passes or the session ends (false). Worker thread.
    bool poll_for_request(uint64_t deadline) const;
    // Adapts the worker's poll window to how long it waited for its last
    // request (QEMU's rule): a wait the window did not cover but poll_us
    // would have grows it, a longer wait resets it to 0. Worker thread.
    void adapt_poll_window(worker& w, bool caught_by_poll, uint64_t waited_ns) const;
    // Async mode: sleeps until /dev/fuse has a request, the queue's event
    // descriptor fires or its next completion is due. False when it slept
    // and /dev/fuse has nothing to read. Worker thread.
    bool wait_request_or_completion(worker& w) const;
    void set_fd_nonblocking(worker& w, bool on) const;
    // Async mode: submits a read into a pooled buffer (reply: `size` bytes
    // from `skip`) or a write of `data`, replying at completion.
    static void submit_async(worker& w, fuse_req_t req, io_op op, uint64_t offset, uint32_t length,
                             const char* data, uint64_t skip, size_t size);
    struct stat file_attr() const;
    struct stat dir_attr() const;

    // Writes `length` bytes of `data` (nullptr: zeros) at an offset or
    // length that need not be block aligned, reading the edge blocks first.
    int write_unaligned(worker& w, uint64_t offset, size_t length, const char* data);
    // Makes [offset, offset+length) read as zeros: the aligned middle with
    // `op` (discard or write_zeroes), the edges by read-modify-write.
    int zero_range(worker& w, uint64_t offset, uint64_t length, bool punch);

    result<void> stop_impl(bool force);
    void join_workers();

    device& _dev;
    const block_limits _limits;
    std::string _name;
    std::string _mount_point;
    std::string _file_path;
    bool _privileged = false;
    bool _want_loop = false;
    unsigned _thread_count = 0;
    // Busy-poll limit (poll_us in ns; 0: never poll) and the token that lets
    // one worker at a time poll: on a machine with few CPUs two spinning
    // workers would take the CPUs the requests need.
    uint64_t _poll_max_ns = 0;
    std::atomic<bool> _polling{false};
    uid_t _uid = 0;
    gid_t _gid = 0;
    struct timespec _created {};

    fuse_session* _session = nullptr;
    bool _mounted = false;
    bool _registered = false;
    std::vector<std::unique_ptr<worker>> _workers;
    std::optional<loop_attachment> _loop;

    std::mutex _stop_lock;
    bool _stopped = false;
    // Serialises read-modify-write of partial blocks (unaligned writes
    // from programs; the loop driver always sends aligned requests).
    std::mutex _rmw_lock;
};

fuse_export::fuse_export(device& dev, const export_context& ctx, const option_set& options)
    : _dev(dev), _limits(dev.limits()), _name(dev.name())
{
    _mount_point = ctx.run_dir + "/fuse/" + _name;
    _file_path = _mount_point + "/" + _name;
    _privileged = ctx.privileged;
    // A daemon that is not root gets the file only, unless it asks for
    // loop=1 (and is then told why it cannot have it).
    _want_loop = options.flag("loop") && (ctx.privileged || options.given("loop"));
    _thread_count = static_cast<unsigned>(options.u64("threads"));
    if (_thread_count == 0) {
        _thread_count = std::max(1u, dev.info().queues.submit_queues);
    }
    _poll_max_ns = options.u64("poll_us") * 1'000;
    if (!options.given("poll_us") && _thread_count > 1) {
        _poll_max_ns = 0;
    }
    _uid = ::getuid();
    _gid = ::getgid();
    ::clock_gettime(CLOCK_REALTIME, &_created);
}

fuse_export::~fuse_export()
{
    (void)stop_impl(true);
}

const fuse_lowlevel_ops& fuse_export::operations()
{
    static const fuse_lowlevel_ops ops = [] {
        fuse_lowlevel_ops o{};
        o.init = op_init;
        o.lookup = op_lookup;
        o.getattr = op_getattr;
        o.setattr = op_setattr;
        o.open = op_open;
        o.read = op_read;
        o.write = op_write;
        o.flush = op_flush;
        o.release = op_release;
        o.fsync = op_fsync;
        o.opendir = op_opendir;
        o.readdir = op_readdir;
        o.releasedir = op_releasedir;
        o.statfs = op_statfs;
        o.fallocate = op_fallocate;
        o.lseek = op_lseek;
        return o;
    }();
    return ops;
}

result<void> fuse_export::start()
{
    if (_want_loop && !_privileged) {
        return make_error(EPERM,
                          fmt::format("{}: loop=1 needs root (the daemon is not privileged); "
                                      "use loop=0 to export the file only",
                                      _name));
    }
    const std::string fuse_dir = _mount_point.substr(0, _mount_point.rfind('/'));
    for (const mount_entry& entry : read_mounts()) {
        if (entry.mount_point != _mount_point) {
            continue;
        }
        if (entry.fstype != k_fstype || !is_stale(entry)) {
            return make_error(EEXIST,
                              fmt::format("{}: already mounted ({} {}); delete that export first",
                                          _mount_point, entry.fstype, entry.source));
        }
        if (!remove_stale_mount(_mount_point)) {
            return make_error(EBUSY,
                              fmt::format("{}: a stale mount of a dead daemon is still in use "
                                          "(its loop device is mounted?)",
                                          _mount_point));
        }
    }
    // Registered before the directory exists, so that cleanup_stale never
    // takes it for a leftover.
    register_live_mount(_mount_point);
    _registered = true;
    for (const std::string& dir :
         {fuse_dir.substr(0, fuse_dir.rfind('/')), fuse_dir, _mount_point}) {
        if (::mkdir(dir.c_str(), 0755) < 0 && errno != EEXIST) {
            const int e = errno;
            return make_error(
                e, fmt::format("{}: cannot create the mount point: {}", dir, std::strerror(e)));
        }
    }

    // libfuse parses its options from an argv.
    const std::string mount_options =
        fmt::format("fsname={}:{}:{},subtype={},default_permissions,max_read={}{}", k_subtype,
                    ::getpid(), _name, k_subtype, k_max_io, _privileged ? ",allow_other" : "");
    const char* argv[] = {"softblk", "-o", mount_options.c_str()};
    fuse_args args = FUSE_ARGS_INIT(3, const_cast<char**>(argv));
    _session = fuse_session_new(&args, &operations(), sizeof(fuse_lowlevel_ops), this);
    if (_session == nullptr) {
        return make_error(EINVAL, fmt::format("{}: libfuse rejected the session options '{}'",
                                              _name, mount_options));
    }
    if (fuse_session_mount(_session, _mount_point.c_str()) != 0) {
        return make_error(EIO, fmt::format("{}: FUSE mount failed (is /dev/fuse usable? as a user, "
                                           "fusermount3 must be installed)",
                                           _mount_point));
    }
    _mounted = true;

    install_wake_handler();
    for (unsigned i = 0; i < _thread_count; ++i) {
        auto w = std::make_unique<worker>();
        w->owner = this;
        w->index = i;
        w->scratch_size = k_max_io + 2 * size_t{_limits.logical_block_size};
        if (::posix_memalign(reinterpret_cast<void**>(&w->scratch), 4096, w->scratch_size) != 0) {
            return make_error(ENOMEM, fmt::format("{}: no memory for the worker buffers", _name));
        }
        std::memset(w->scratch, 0, w->scratch_size);
        w->dev = &_dev;
        // Each worker drives a submit queue of its own when there are
        // enough: no lock, no sharing.
        if (_thread_count <= _dev.info().queues.submit_queues) {
            w->queue = &_dev.queue(i);
            w->async = _thread_count == 1;
        }
        worker* raw = w.get();
        w->thread = std::thread([this, raw] { run_worker(*raw); });
        w->handle = w->thread.native_handle();
        _workers.push_back(std::move(w));
    }

    if (_want_loop) {
        auto loop = attach_loop(_file_path, _limits.logical_block_size, _limits.read_only);
        if (!loop) {
            return std::unexpected(loop.error());
        }
        _loop = *loop;
    }
    return {};
}

void fuse_export::run_worker(worker& w)
{
    t_worker = &w;
    // Whatever the creating thread blocked, the wake signal must get through.
    sigset_t wake;
    sigemptyset(&wake);
    sigaddset(&wake, wake_signal());
    pthread_sigmask(SIG_UNBLOCK, &wake, nullptr);
    const std::string thread_name = fmt::format("fuse-{}", w.index);
    pthread_setname_np(pthread_self(), thread_name.c_str());

    fuse_buf buf{};
    w.receive = &buf;
    while (!fuse_session_exited(_session)) {
        if (w.in_flight != 0) {
            w.queue->process();
        }
        if (w.in_flight != 0) {
            // Requests in flight (async mode): wait for whichever comes
            // first, a new request or a completion.
            set_fd_nonblocking(w, true);
            if (!wait_request_or_completion(w)) {
                continue;
            }
            const int rc = fuse_session_receive_buf(_session, &buf);
            if (rc == -EINTR || rc == -EAGAIN) {
                continue;
            }
            if (rc <= 0) {
                break;
            }
            fuse_session_process_buf(_session, &buf);
            continue;
        }
        if (w.fd_nonblocking) {
            set_fd_nonblocking(w, false);
        }
        // Before sleeping in read(/dev/fuse), one worker polls for a while:
        // at queue depth 1 the next request often comes within tens of
        // microseconds, and a sleeping worker costs a wake-up on its path.
        const uint64_t start = _poll_max_ns != 0 ? monotonic_ns() : 0;
        bool caught = false;
        if (w.poll_ns != 0 && !_polling.exchange(true, std::memory_order_acquire)) {
            caught = poll_for_request(start + w.poll_ns);
            _polling.store(false, std::memory_order_release);
            w.poll_time_ns.fetch_add(monotonic_ns() - start, std::memory_order_relaxed);
        }
        const int rc = fuse_session_receive_buf(_session, &buf);
        if (rc == -EINTR || rc == -EAGAIN) {
            continue;
        }
        if (rc <= 0) {
            break;  // -ENODEV: unmounted; 0: the connection is gone
        }
        if (_poll_max_ns != 0) {
            (caught ? w.polled_requests : w.slept_requests).fetch_add(1, std::memory_order_relaxed);
            adapt_poll_window(w, caught, monotonic_ns() - start);
        }
        fuse_session_process_buf(_session, &buf);
    }
    // Completions still owed reply into the session, which lives until
    // the workers are joined.
    while (w.in_flight != 0) {
        w.queue->wait(1, 10'000'000);
    }
    if (w.fd_nonblocking) {
        set_fd_nonblocking(w, false);
    }
    w.receive = nullptr;
    std::free(buf.mem);
    w.done.store(true, std::memory_order_release);
}

void fuse_export::set_fd_nonblocking(worker& w, bool on) const
{
    const int fd = fuse_session_fd(_session);
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags >= 0) {
        ::fcntl(fd, F_SETFL, on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK));
    }
    w.fd_nonblocking = on;
}

bool fuse_export::wait_request_or_completion(worker& w) const
{
    const uint64_t next = w.queue->next_event_ns();
    if (next == 0) {
        return true;
    }
    const int event_fd = w.queue->event_fd();
    // Nothing to wake us but a deadline: at most 10 ms, in case a target
    // completes in a way neither says (the loop then just processes).
    uint64_t wait_ns = event_fd >= 0 ? UINT64_MAX : 10'000'000;
    if (next != UINT64_MAX) {
        const uint64_t now = monotonic_ns();
        wait_ns = std::min(wait_ns, next > now ? next - now : 0);
    }
    if (wait_ns == 0) {
        return true;
    }
    pollfd fds[2] = {{.fd = fuse_session_fd(_session), .events = POLLIN, .revents = 0},
                     {.fd = event_fd, .events = POLLIN, .revents = 0}};
    struct timespec ts {};
    ts.tv_sec = static_cast<time_t>(wait_ns / 1'000'000'000u);
    ts.tv_nsec = static_cast<long>(wait_ns % 1'000'000'000u);
    if (::ppoll(fds, event_fd >= 0 ? 2 : 1, wait_ns == UINT64_MAX ? nullptr : &ts, nullptr) < 0) {
        return false;  // EINTR: the loop looks at the session first
    }
    return fds[0].revents != 0;
}

void fuse_export::submit_async(worker& w, fuse_req_t req, io_op op, uint64_t offset,
                               uint32_t length, const char* data, uint64_t skip, size_t size)
{
    pending_io* p = w.take_pending();
    p->req = req;
    p->is_read = op == io_op::read;
    p->completed = false;
    p->skip = skip;
    p->size = size;
    p->receive_mem = nullptr;
    p->data = nullptr;
    if (p->is_read) {
        p->data = w.buffers.get(length, p->data_class);
        if (p->data == nullptr) {
            w.pending_free.push_back(p);
            fuse_reply_err(req, ENOMEM);
            return;
        }
    }
    bio& b = p->request;
    b.op = op;
    b.flags = 0;
    b.offset = offset;
    b.length = length;
    // The target only reads from the buffer of a write.
    b.buffer = p->is_read ? static_cast<void*>(p->data) : const_cast<char*>(data);
    b.on_complete = on_async_complete;
    b.user_data = p;
    ++w.in_flight;
    w.queue->submit(b);
    // Completions deferred to the queue's loop (irqmode=1) are due now.
    w.queue->process();
    if (!p->completed && !p->is_read) {
        // The data lies in libfuse's receive buffer, which the next
        // request would overwrite: the write keeps it, libfuse allocates
        // another.
        p->receive_mem = w.receive->mem;
        w.receive->mem = nullptr;
    }
}

bool fuse_export::poll_for_request(uint64_t deadline) const
{
    pollfd fd{.fd = fuse_session_fd(_session), .events = POLLIN, .revents = 0};
    do {
        // POLLERR or POLLHUP (unmounted, aborted) counts as ready too: the
        // read then reports it.
        if (::poll(&fd, 1, 0) > 0) {
            return true;
        }
        // Poll on idle CPU time only: a thread that is ready to run here
        // (often the very client, loop worker or softirq thread that will
        // send the next request) goes first.
        ::sched_yield();
    } while (!fuse_session_exited(_session) && monotonic_ns() < deadline);
    return false;
}

void fuse_export::adapt_poll_window(worker& w, bool caught_by_poll, uint64_t waited_ns) const
{
    if (caught_by_poll) {
        return;
    }
    if (waited_ns > _poll_max_ns) {
        w.poll_ns = 0;  // requests come further apart than we would poll
    } else if (w.poll_ns < _poll_max_ns) {
        w.poll_ns = std::min(_poll_max_ns, w.poll_ns == 0 ? k_poll_start_ns : w.poll_ns * 2);
    }
}

nlohmann::json fuse_export::describe() const
{
    nlohmann::json out;
    out["file"] = _file_path;
    out["mount_point"] = _mount_point;
    out["threads"] = _thread_count;
    // "per_worker": worker i drives submit queue i alone; "shared": more
    // workers than submit queues, they share them through device::execute.
    out["queues"] = _thread_count <= _dev.info().queues.submit_queues ? "per_worker" : "shared";
    out["poll_us"] = _poll_max_ns / 1'000;
    out["async"] = _workers.size() == 1 && _workers.front()->async;
    uint64_t polled = 0;
    uint64_t slept = 0;
    uint64_t poll_ns = 0;
    for (const auto& w : _workers) {
        polled += w->polled_requests.load(std::memory_order_relaxed);
        slept += w->slept_requests.load(std::memory_order_relaxed);
        poll_ns += w->poll_time_ns.load(std::memory_order_relaxed);
    }
    // Only counted while polling is on (poll_us > 0).
    out["requests_after_poll"] = polled;
    out["requests_after_sleep"] = slept;
    out["poll_ms"] = poll_ns / 1'000'000;
    if (_loop) {
        out["loop"] = _loop->path;
        out["loop_direct_io"] = _loop->direct_io;
    }
    return out;
}

result<void> fuse_export::stop()
{
    return stop_impl(false);
}

std::string fuse_export::in_use() const
{
    // What makes stop() refuse: a loop device held exclusively. The file
    // itself being open does not (stop() aborts what its users still ask).
    return _loop ? loop_holder(_loop->number) : std::string();
}

void fuse_export::join_workers()
{
    if (_session != nullptr) {
        fuse_session_exit(_session);
    }
    const auto deadline = std::chrono::steady_clock::now() + k_join_timeout;
    for (auto& w : _workers) {
        if (!w->thread.joinable()) {
            continue;
        }
        // A worker blocked in read(/dev/fuse) leaves it on EINTR; a signal
        // sent just before it blocks is lost, so keep sending.
        while (!w->done.load(std::memory_order_acquire) &&
               std::chrono::steady_clock::now() < deadline) {
            pthread_kill(w->handle, wake_signal());
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        w->thread.join();
    }
    _workers.clear();
}

result<void> fuse_export::stop_impl(bool force)
{
    std::lock_guard guard(_stop_lock);
    if (_stopped) {
        return {};
    }
    if (_loop) {
        // Forced, a loop device that is still held (mounted) detaches itself
        // when it is last closed, so nothing stays attached to a dead file.
        auto detached = detach_loop(_loop->number, force ? 0 : 5000, force);
        if (!detached && !force) {
            return std::unexpected(detached.error());
        }
        _loop.reset();
    }
    // Workers first: fuse_session_unmount closes /dev/fuse, and a worker
    // still reading it would then use a closed (or reused) descriptor.
    join_workers();
    if (_mounted) {
        // Lazy when something still has the file open; closing /dev/fuse
        // (done by the unmount) aborts what those users still ask.
        fuse_session_unmount(_session);
        _mounted = false;
    }
    if (_session != nullptr) {
        fuse_session_destroy(_session);
        _session = nullptr;
    }
    if (_registered) {
        ::rmdir(_mount_point.c_str());
        unregister_live_mount(_mount_point);
        _registered = false;
    }
    _stopped = true;
    return {};
}

// ---------------------------------------------------------------- attributes

struct stat fuse_export::file_attr() const
{
    struct stat st {};
    st.st_ino = k_file_ino;
    st.st_mode = S_IFREG | (_limits.read_only ? 0440 : 0660);
    st.st_nlink = 1;
    st.st_uid = _uid;
    st.st_gid = _gid;
    st.st_size = static_cast<off_t>(_limits.capacity_bytes);
    st.st_blksize =
        static_cast<blksize_t>(std::max(_limits.physical_block_size, _limits.logical_block_size));
    st.st_blocks = static_cast<blkcnt_t>(_limits.capacity_bytes / 512);
    st.st_atim = st.st_mtim = st.st_ctim = _created;
    return st;
}

struct stat fuse_export::dir_attr() const
{
    struct stat st {};
    st.st_ino = FUSE_ROOT_ID;
    st.st_mode = S_IFDIR | 0755;
    st.st_nlink = 2;
    st.st_uid = _uid;
    st.st_gid = _gid;
    st.st_atim = st.st_mtim = st.st_ctim = _created;
    return st;
}

void fuse_export::op_init(void* userdata, fuse_conn_info* conn)
{
    // Splicing costs a pipe and two more system calls per request; for
    // block-sized I/O plain read/writev is faster.
    conn->want &= ~(FUSE_CAP_SPLICE_READ | FUSE_CAP_SPLICE_WRITE | FUSE_CAP_SPLICE_MOVE);
    // The loop driver's direct I/O is asynchronous: let several requests
    // of one file be in flight.
    if ((conn->capable & FUSE_CAP_ASYNC_DIO) != 0) {
        conn->want |= FUSE_CAP_ASYNC_DIO;
    }
    // O_TRUNC comes with open (and is ignored, as by a block device)
    // instead of as a separate truncate to size 0.
    if ((conn->capable & FUSE_CAP_ATOMIC_O_TRUNC) != 0) {
        conn->want |= FUSE_CAP_ATOMIC_O_TRUNC;
    }
    conn->max_write = k_max_io;
    conn->max_read = k_max_io;
    conn->max_background = k_max_background;
    conn->congestion_threshold = k_max_background * 3 / 4;
}

void fuse_export::op_lookup(fuse_req_t req, fuse_ino_t parent, const char* name)
{
    fuse_export& e = self(req);
    if (parent != FUSE_ROOT_ID || e._name != name) {
        fuse_reply_err(req, ENOENT);
        return;
    }
    fuse_entry_param entry{};
    entry.ino = k_file_ino;
    entry.generation = 1;
    entry.attr = e.file_attr();
    // Nothing about the file ever changes while it is mounted.
    entry.attr_timeout = 3600.0;
    entry.entry_timeout = 3600.0;
    fuse_reply_entry(req, &entry);
}

void fuse_export::op_getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*)
{
    fuse_export& e = self(req);
    if (ino == FUSE_ROOT_ID) {
        const struct stat st = e.dir_attr();
        fuse_reply_attr(req, &st, 3600.0);
    } else if (ino == k_file_ino) {
        const struct stat st = e.file_attr();
        fuse_reply_attr(req, &st, 3600.0);
    } else {
        fuse_reply_err(req, ENOENT);
    }
}

void fuse_export::op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set,
                             fuse_file_info*)
{
    fuse_export& e = self(req);
    if (ino != k_file_ino) {
        fuse_reply_err(req, EPERM);
        return;
    }
    // The file is a fixed-size device: truncating to its own size is a
    // no-op (as for a block device); any other size is refused. Mode and
    // owner are fixed; times are not stored (a block device node's times
    // do not reflect its contents either), so touch(1) succeeds.
    if ((to_set & (FUSE_SET_ATTR_MODE | FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID)) != 0) {
        fuse_reply_err(req, EPERM);
        return;
    }
    if ((to_set & FUSE_SET_ATTR_SIZE) != 0 &&
        static_cast<uint64_t>(attr->st_size) != e._limits.capacity_bytes) {
        fuse_reply_err(req, EPERM);
        return;
    }
    const struct stat st = e.file_attr();
    fuse_reply_attr(req, &st, 3600.0);
}

void fuse_export::op_open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi)
{
    fuse_export& e = self(req);
    if (ino != k_file_ino) {
        fuse_reply_err(req, EISDIR);
        return;
    }
    if (e._limits.read_only && (fi->flags & O_ACCMODE) != O_RDONLY) {
        fuse_reply_err(req, EROFS);
        return;
    }
    reply_open_direct(req);
}

void fuse_export::op_flush(fuse_req_t req, fuse_ino_t, fuse_file_info*)
{
    // Nothing is buffered in the export (direct I/O); durability is
    // fsync's business. Opens say FOPEN_NOFLUSH, so this is rare.
    fuse_reply_err(req, 0);
}

void fuse_export::op_release(fuse_req_t req, fuse_ino_t, fuse_file_info*)
{
    fuse_reply_err(req, 0);
}

void fuse_export::op_opendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi)
{
    if (ino != FUSE_ROOT_ID) {
        fuse_reply_err(req, ENOTDIR);
        return;
    }
    fuse_reply_open(req, fi);
}

void fuse_export::op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                             fuse_file_info*)
{
    fuse_export& e = self(req);
    if (ino != FUSE_ROOT_ID) {
        fuse_reply_err(req, ENOTDIR);
        return;
    }
    char buf[512];
    size_t used = 0;
    const struct stat dir = e.dir_attr();
    const struct stat file = e.file_attr();
    const struct {
        const char* name;
        const struct stat* st;
    } entries[] = {{".", &dir}, {"..", &dir}, {e._name.c_str(), &file}};
    const size_t limit = std::min(size, sizeof buf);
    for (off_t i = off; i < 3; ++i) {
        const size_t need =
            fuse_add_direntry(req, buf + used, limit - used, entries[i].name, entries[i].st, i + 1);
        if (need > limit - used) {
            break;
        }
        used += need;
    }
    fuse_reply_buf(req, buf, used);
}

void fuse_export::op_releasedir(fuse_req_t req, fuse_ino_t, fuse_file_info*)
{
    fuse_reply_err(req, 0);
}

void fuse_export::op_statfs(fuse_req_t req, fuse_ino_t)
{
    fuse_export& e = self(req);
    struct statvfs st {};
    // The loop driver takes f_bsize as its discard granularity.
    st.f_bsize = e._limits.logical_block_size;
    st.f_frsize = e._limits.logical_block_size;
    st.f_blocks = e._limits.capacity_bytes / e._limits.logical_block_size;
    st.f_files = 1;
    st.f_namemax = 255;
    fuse_reply_statfs(req, &st);
}

// ---------------------------------------------------------------- data path

void fuse_export::op_read(fuse_req_t req, fuse_ino_t, size_t size, off_t off, fuse_file_info*)
{
    fuse_export& e = self(req);
    worker& w = *t_worker;
    const uint64_t capacity = e._limits.capacity_bytes;
    const uint64_t block = e._limits.logical_block_size;
    if (off < 0) {
        fuse_reply_err(req, EINVAL);
        return;
    }
    const uint64_t offset = static_cast<uint64_t>(off);
    if (offset >= capacity || size == 0) {
        fuse_reply_buf(req, nullptr, 0);
        return;
    }
    size = std::min<uint64_t>(size, capacity - offset);
    const uint64_t start = align_down(offset, block);
    const uint64_t end = align_up(offset + size, block);
    if (end - start > w.scratch_size) {
        fuse_reply_err(req, EINVAL);  // larger than max_read: the kernel never sends it
        return;
    }
    if (w.async) {
        submit_async(w, req, io_op::read, start, static_cast<uint32_t>(end - start), nullptr,
                     offset - start, size);
        return;
    }
    const int rc = w.execute(io_op::read, start, end - start, w.scratch);
    if (rc < 0) {
        fuse_reply_err(req, -rc);
        return;
    }
    fuse_reply_buf(req, w.scratch + (offset - start), size);
}

int fuse_export::write_unaligned(worker& w, uint64_t offset, size_t length, const char* data)
{
    const uint64_t block = _limits.logical_block_size;
    const uint64_t start = align_down(offset, block);
    const uint64_t end = align_up(offset + length, block);
    // An async write still in flight may cover an edge block: let it land
    // before reading that block back.
    while (w.in_flight != 0) {
        w.queue->wait(1);
    }
    std::lock_guard guard(_rmw_lock);
    if (start != offset) {
        const int rc = w.execute(io_op::read, start, static_cast<uint32_t>(block), w.scratch);
        if (rc < 0) {
            return rc;
        }
    }
    const uint64_t last = end - block;
    if (end != offset + length && (last != start || start == offset)) {
        const int rc =
            w.execute(io_op::read, last, static_cast<uint32_t>(block), w.scratch + (last - start));
        if (rc < 0) {
            return rc;
        }
    }
    if (data != nullptr) {
        std::memcpy(w.scratch + (offset - start), data, length);
    } else {
        std::memset(w.scratch + (offset - start), 0, length);
    }
    return w.execute(io_op::write, start, static_cast<uint32_t>(end - start), w.scratch);
}

void fuse_export::op_write(fuse_req_t req, fuse_ino_t, const char* buf, size_t size, off_t off,
                           fuse_file_info*)
{
    fuse_export& e = self(req);
    worker& w = *t_worker;
    const uint64_t capacity = e._limits.capacity_bytes;
    const uint64_t block = e._limits.logical_block_size;
    if (e._limits.read_only) {
        fuse_reply_err(req, EROFS);
        return;
    }
    if (off < 0) {
        fuse_reply_err(req, EINVAL);
        return;
    }
    const uint64_t offset = static_cast<uint64_t>(off);
    if (size == 0) {
        fuse_reply_write(req, 0);
        return;
    }
    if (offset >= capacity) {
        fuse_reply_err(req, ENOSPC);  // as a block device does at its end
        return;
    }
    size = std::min<uint64_t>(size, capacity - offset);
    int rc = 0;
    if (offset % block == 0 && size % block == 0 && w.async) {
        submit_async(w, req, io_op::write, offset, static_cast<uint32_t>(size), buf, 0, size);
        return;
    }
    if (offset % block == 0 && size % block == 0) {
        // The target only reads from the buffer of a write.
        rc = w.execute(io_op::write, offset, size, const_cast<char*>(buf));
    } else if (align_up(offset + size, block) - align_down(offset, block) <= w.scratch_size) {
        rc = e.write_unaligned(w, offset, size, buf);
    } else {
        rc = -EINVAL;  // larger than max_write: the kernel never sends it
    }
    if (rc < 0) {
        fuse_reply_err(req, -rc);
        return;
    }
    fuse_reply_write(req, size);
}

void fuse_export::op_fsync(fuse_req_t req, fuse_ino_t, int, fuse_file_info*)
{
    fuse_export& e = self(req);
    int rc = t_worker->execute(io_op::flush, 0, 0, nullptr);
    // Without a volatile cache there is nothing to flush.
    if (rc == -EOPNOTSUPP && !e._limits.volatile_write_cache) {
        rc = 0;
    }
    fuse_reply_err(req, rc < 0 ? -rc : 0);
}

int fuse_export::zero_range(worker& w, uint64_t offset, uint64_t length, bool punch)
{
    const uint64_t block = _limits.logical_block_size;
    const uint64_t end = offset + length;
    const uint64_t inner_start = align_up(offset, block);
    const uint64_t inner_end = std::max(align_down(end, block), inner_start);
    if (inner_end > inner_start) {
        int rc = 0;
        const uint64_t inner = inner_end - inner_start;
        if (punch && _limits.max_discard_bytes != 0) {
            rc = w.execute(io_op::discard, inner_start, inner, nullptr);
        } else if (punch) {
            // A hole may be unmapped, but only if that is cheap: the core
            // refuses a fast zero it would have to write out.
            rc = w.execute(io_op::write_zeroes, inner_start, inner, nullptr, k_io_fast_zero);
        } else {
            // A zeroed range stays allocated (the core writes zeros where
            // the device has no write zeroes).
            rc = w.execute(io_op::write_zeroes, inner_start, inner, nullptr, k_io_no_unmap);
        }
        if (rc < 0) {
            return rc;
        }
    }
    // Partial blocks at the edges: zero the bytes, keep the rest.
    if (offset < inner_start) {
        const uint64_t head_end = std::min(end, inner_start);
        const int rc = write_unaligned(w, offset, head_end - offset, nullptr);
        if (rc < 0) {
            return rc;
        }
    }
    if (end > inner_end) {
        const uint64_t tail_start = inner_end;
        const int rc = write_unaligned(w, tail_start, end - tail_start, nullptr);
        if (rc < 0) {
            return rc;
        }
    }
    return 0;
}

void fuse_export::op_fallocate(fuse_req_t req, fuse_ino_t, int mode, off_t off, off_t len,
                               fuse_file_info*)
{
    fuse_export& e = self(req);
    worker& w = *t_worker;
    const uint64_t capacity = e._limits.capacity_bytes;
    const int known = FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE;
    if ((mode & ~known) != 0 ||
        ((mode & FALLOC_FL_PUNCH_HOLE) != 0 && (mode & FALLOC_FL_ZERO_RANGE) != 0)) {
        fuse_reply_err(req, EOPNOTSUPP);
        return;
    }
    if (off < 0 || len <= 0) {
        fuse_reply_err(req, EINVAL);
        return;
    }
    if (e._limits.read_only) {
        fuse_reply_err(req, EROFS);
        return;
    }
    uint64_t offset = static_cast<uint64_t>(off);
    uint64_t end = offset + static_cast<uint64_t>(len);
    if (end > capacity) {
        // The file cannot grow; with KEEP_SIZE the part past the end is
        // simply outside the file.
        if ((mode & FALLOC_FL_KEEP_SIZE) == 0) {
            fuse_reply_err(req, EFBIG);
            return;
        }
        end = capacity;
    }
    if (offset >= end) {
        fuse_reply_err(req, 0);
        return;
    }
    int rc = 0;
    if ((mode & FALLOC_FL_PUNCH_HOLE) != 0) {
        rc = e.zero_range(w, offset, end - offset, true);
    } else if ((mode & FALLOC_FL_ZERO_RANGE) != 0) {
        rc = e.zero_range(w, offset, end - offset, false);
    } else {
        // Plain allocation: the device cannot reserve space, so succeed
        // only where every block already is allocated.
        auto map = w.map(offset, end - offset);
        if (!map) {
            rc = -map.error().code.value();
        } else {
            for (const extent& x : *map) {
                if (!x.allocated) {
                    rc = -EOPNOTSUPP;
                    break;
                }
            }
        }
    }
    fuse_reply_err(req, rc < 0 ? -rc : 0);
}

void fuse_export::op_lseek(fuse_req_t req, fuse_ino_t, off_t off, int whence, fuse_file_info*)
{
    fuse_export& e = self(req);
    const uint64_t capacity = e._limits.capacity_bytes;
    if (whence != SEEK_DATA && whence != SEEK_HOLE) {
        fuse_reply_err(req, EINVAL);
        return;
    }
    if (off < 0 || static_cast<uint64_t>(off) >= capacity) {
        fuse_reply_err(req, ENXIO);
        return;
    }
    const uint64_t offset = static_cast<uint64_t>(off);
    // Data: allocated and not known to read as zeros. A hole: the rest.
    for (uint64_t window = offset; window < capacity; window += k_map_window) {
        auto map = t_worker->map(window, std::min(k_map_window, capacity - window));
        if (!map) {
            fuse_reply_err(req, map.error().code.value());
            return;
        }
        for (const extent& x : *map) {
            const bool data = x.allocated && !x.zero;
            if (x.offset + x.length <= offset || data != (whence == SEEK_DATA)) {
                continue;
            }
            fuse_reply_lseek(req, static_cast<off_t>(std::max(offset, x.offset)));
            return;
        }
    }
    if (whence == SEEK_DATA) {
        fuse_reply_err(req, ENXIO);
    } else {
        fuse_reply_lseek(req, static_cast<off_t>(capacity));  // the hole at the end of the file
    }
}

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
    if (ctx.run_dir.empty() || ctx.run_dir[0] != '/') {
        return make_error(EINVAL,
                          fmt::format("run directory '{}' must be an absolute path", ctx.run_dir));
    }
    const block_limits& l = dev.limits();
    if (l.logical_block_size == 0 || l.capacity_bytes % l.logical_block_size != 0) {
        return make_error(EINVAL,
                          fmt::format("{}: capacity {} is not a multiple of the block size {}",
                                      dev.name(), l.capacity_bytes, l.logical_block_size));
    }
    auto exported = std::make_unique<fuse_export>(dev, ctx, *parsed);
    if (auto started = exported->start(); !started) {
        (void)exported->stop();
        return std::unexpected(started.error());
    }
    return exported;
}

void cleanup_stale(const export_context& ctx)
{
    if (ctx.run_dir.empty()) {
        return;
    }
    cleanup_stale_under(ctx.run_dir + "/fuse");
}

bool available()
{
    const int fd = ::open("/dev/fuse", O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        return false;
    }
    ::close(fd);
    return true;
}

}  // namespace softblk::fuse
