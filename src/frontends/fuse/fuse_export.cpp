// The FUSE export: its options, start and stop (mount, loop device, worker
// threads) and what `list` shows. The workers' loop with its adaptive busy
// polling and async mode is in worker_loop.cpp, the FUSE operations in
// file_ops.cpp, libfuse's callbacks in libfuse_ops.cpp, FUSE over io_uring
// (ring mode) in fuse_ring.cpp.
#include "session.hpp"

#include "fuse_ring.hpp"
#include "loop_device.hpp"
#include "mounts.hpp"

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
#include <linux/fuse.h>
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

thread_local worker* t_worker = nullptr;

namespace {

constexpr option_def k_options[] = {
    {.name = "loop",
     .kind = option_kind::boolean,
     .default_value = "1",
     .unit = "",
     .help =
         "attach the file to a loop device with direct I/O (needs root; a daemon that is not root "
         "defaults to 0); 0: the file only"},
    {.name = "threads",
     .kind = option_kind::text,
     .default_value = "0",
     .unit = "",
     .help =
         "FUSE worker threads. 0: one per submit queue. auto: the number of active workers (1 "
         "up to one per CPU, at least one per submit queue) that gives the most requests per "
         "second here, measured as poll_us=auto is (`softblk list --json` shows it under "
         "\"workers\" with why); with the ring: one ring thread per submit queue. A single worker "
         "that "
         "owns its queue keeps many requests in flight (it replies as the device completes "
         "them); several workers each wait for their own request. With the ring: ring threads, "
         "at most one per possible CPU, each keeping many requests in flight on a queue of its "
         "own",
     .check = check_threads},
    {.name = "poll_us",
     .kind = option_kind::text,
     .default_value = "auto",
     .unit = "us",
     .help = "after a request, one worker at a time busy-polls /dev/fuse (with the ring: its "
             "ring), yielding the CPU to any other ready thread, for up to this long before "
             "sleeping. auto: the window (0 to 512 us) that gives the most requests per second "
             "on this machine, measured over 10 ms epochs and measured again now and then "
             "(`softblk list --json` shows the rates and why); 0: never poll",
     .check = check_poll_window},
    {.name = "ring",
     .kind = option_kind::text,
     .default_value = "auto",
     .unit = "",
     .help =
         "FUSE over io_uring (Linux 6.14+, CONFIG_FUSE_IO_URING, and "
         "/sys/module/fuse/parameters/enable_uring set to Y by an administrator): requests come "
         "through per-CPU ring queues instead of read/write on /dev/fuse. auto: where the kernel "
         "allows it; on: an error (saying what is missing) where it does not; off: never"},
};

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

}  // namespace

// Interrupts a worker blocked in read(/dev/fuse) during stop(). The handler
// does nothing: the point is the EINTR.
int wake_signal()
{
    return SIGRTMIN + 3;
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

fuse_export::fuse_export(device& dev, const export_context& ctx, const option_set& options,
                         ring_plan ring)
    : _dev(dev), _limits(dev.limits()), _name(dev.name()), _ring(std::move(ring))
{
    _mount_point = ctx.run_dir + "/fuse/" + _name;
    _file_path = _mount_point + "/" + _name;
    _privileged = ctx.privileged;
    // A daemon that is not root gets the file only, unless it asks for
    // loop=1 (and is then told why it cannot have it).
    _want_loop = options.flag("loop") && (ctx.privileged || options.given("loop"));
    const long cpus = ::sysconf(_SC_NPROCESSORS_ONLN);
    worker_plan plan = plan_workers(options.text("threads"), dev.info().queues.submit_queues,
                                    cpus > 0 ? static_cast<unsigned>(cpus) : 1u, _ring.use);
    _thread_count = plan.threads;
    if (_ring.use) {
        // A ring thread serves one or more of the kernel's ring queues (one
        // per possible CPU): more threads than queues would have nothing.
        _ring_queues = possible_cpus();
        _thread_count = std::min(_thread_count, _ring_queues);
        plan.choice.levels = {_thread_count};
    }
    _shared_queues = _thread_count > dev.info().queues.submit_queues;
    _worker_count.emplace(std::move(plan.choice));
    _worker_count_why = std::move(plan.why);
    _active.store(static_cast<unsigned>(_worker_count->level()), std::memory_order_relaxed);
    _poll.emplace(poll_window_config(options.text("poll_us")));
    _uid = ::getuid();
    _gid = ::getgid();
    ::clock_gettime(CLOCK_REALTIME, &_created);
}

fuse_export::~fuse_export()
{
    (void)stop_impl(true);
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
        if (!remove_stale_mount(entry)) {
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
    // Parsing replaced args with a copy libfuse allocated: ours to free
    // (one leak per export otherwise; ASan's leak check found it).
    fuse_opt_free_args(&args);
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
    // The mount's device number: what proves at stop that the mount on
    // the path is still ours before it is unmounted. mountinfo shows the
    // path with its links resolved (a run directory under /var/run is
    // under /run there); only the parent is resolved, which is not on
    // our mount (no FUSE request).
    if (char* real = ::realpath(fuse_dir.c_str(), nullptr)) {
        _mount_point_seen = std::string(real) + "/" + _name;
        std::free(real);
    } else {
        _mount_point_seen = _mount_point;
    }
    const std::string source = fmt::format("{}:{}:{}", k_subtype, ::getpid(), _name);
    if (auto top = top_mount_at(_mount_point_seen); top && top->source == source) {
        _mount_device = top->device;
    }

    _direct_sink.fd = fuse_session_fd(_session);
    install_wake_handler();
    if (_ring.use) {
        if (auto ring = start_ring(); !ring) {
            return ring;
        }
    }
    // All workers exist before any runs: worker 0 looks at the others
    // when it changes the active count.
    for (unsigned i = 0; !_ring.use && i < _thread_count; ++i) {
        auto w = make_worker(i);
        if (!w) {
            return std::unexpected(w.error());
        }
        worker* raw = w->get();
        // A worker alone (the only one active) that drives its queue
        // replies from the completion: several would share /dev/fuse's
        // O_NONBLOCK flag (it is the open file's).
        raw->async = i == 0 && _active.load(std::memory_order_relaxed) == 1 &&
                     (raw->queue != nullptr || raw->solo_queue != nullptr);
        if (raw->async && raw->queue == nullptr) {
            raw->queue = raw->solo_queue;
        }
        _workers.push_back(std::move(*w));
    }
    for (unsigned i = 0; !_ring.use && i < _thread_count; ++i) {
        worker* raw = _workers[i].get();
        raw->thread = std::thread([this, raw] { run_worker(*raw); });
        raw->handle = raw->thread.native_handle();
    }

    if (_want_loop) {
        auto loop = attach_loop(_file_path, _limits.logical_block_size, _limits.read_only);
        if (!loop) {
            return std::unexpected(loop.error());
        }
        _loop = *loop;
    }
    _capacity_listener = _dev.add_capacity_listener([this](uint64_t b) { capacity_changed(b); });
    // A change before the listener was there.
    set_capacity(_limits, current_capacity(_dev.limits()));
    return {};
}

result<std::unique_ptr<worker>> fuse_export::make_worker(unsigned index)
{
    auto w = std::make_unique<worker>();
    w->owner = this;
    w->index = index;
    w->scratch_size = k_max_io + 2 * size_t{_limits.logical_block_size};
    if (::posix_memalign(reinterpret_cast<void**>(&w->scratch), 4096, w->scratch_size) != 0) {
        return make_error(ENOMEM, fmt::format("{}: no memory for the worker buffers", _name));
    }
    std::memset(w->scratch, 0, w->scratch_size);
    w->dev = &_dev;
    // Each worker drives a submit queue of its own when there are
    // enough: no lock, no sharing.
    if (!_shared_queues) {
        w->queue = &_dev.queue(index);
    } else if (index == 0 && !_worker_count->fixed()) {
        w->solo_queue = &_dev.queue(0);
    }
    return w;
}

void fuse_export::capacity_changed(uint64_t bytes)
{
    set_capacity(_limits, bytes);
    // The kernel keeps the file's attributes for attr_timeout (an hour):
    // drop them (a negative offset: the attributes only), so that the next
    // stat asks for the new size.
    if (_session != nullptr) {
        fuse_lowlevel_notify_inval_inode(_session, k_file_ino, -1, 0);
    }
    if (_loop) {
        // The loop driver takes the size from the file's inode, which only
        // a stat brings up to date; then LOOP_SET_CAPACITY (losetup -c).
        struct stat st;
        if (::stat(_file_path.c_str(), &st) == 0) {
            if (auto r = set_loop_capacity(_loop->number, _loop->backing); !r) {
                fmt::print(stderr, "fuse: {}: {}\n", _name, r.error().message);
            }
        }
    }
}

nlohmann::json fuse_export::describe() const
{
    nlohmann::json out;
    out["file"] = _file_path;
    out["mount_point"] = _mount_point;
    const unsigned active = _active.load(std::memory_order_relaxed);
    // Workers serving now (threads=auto: the count measured to give the
    // most requests per second here); "workers" says how and why.
    out["threads"] = active;
    nlohmann::json workers = _worker_count->describe();
    if (_worker_count->fixed()) {
        workers["why"] = _worker_count_why;
    } else if (_held_async.load(std::memory_order_relaxed)) {
        workers["why"] = fmt::format(
            "{} active, held: the device keeps requests in flight, which one asynchronous "
            "worker overlaps (more workers would wait for one each); measured: {}",
            active, workers["why"].get<std::string>());
    }
    workers["max"] = _thread_count;
    out["workers"] = std::move(workers);
    // "per_worker": worker i drives submit queue i alone; "shared": more
    // workers than submit queues, they share them through device::execute
    // (with threads=auto, worker 0 drives queue 0 alone while it is the
    // only one active).
    out["queues"] = _shared_queues ? "shared" : "per_worker";
    out["poll_us"] = _poll->level();
    out["poll"] = _poll->describe();
    // Ring threads that drive their queues reply from the completion;
    // /dev/fuse workers only while one serves alone.
    out["async"] =
        !_workers.empty() &&
        (_ring.use ? !_shared_queues : active == 1 && (!_shared_queues || !_worker_count->fixed()));
    describe_ring(out);
    uint64_t polled = 0;
    uint64_t slept = 0;
    uint64_t poll_ns = 0;
    uint64_t direct = 0;
    for (const auto& w : _workers) {
        direct += w->direct_requests.load(std::memory_order_relaxed);
        polled += w->polled_requests.load(std::memory_order_relaxed);
        slept += w->slept_requests.load(std::memory_order_relaxed);
        poll_ns += w->poll_time_ns.load(std::memory_order_relaxed);
    }
    out["requests_after_poll"] = polled;
    out["requests_after_sleep"] = slept;
    out["poll_ms"] = poll_ns / 1'000'000;
    // READ and WRITE served without libfuse's request object (/dev/fuse).
    out["requests_direct"] = direct;
    if (_loop) {
        // Shown only while it is still attached to our file: after a
        // refused stop it detaches itself on its last close, and the
        // number may then be someone else's.
        if (loop_backed_by(_loop->number, _loop->backing)) {
            out["loop"] = _loop->path;
            out["loop_direct_io"] = _loop->direct_io;
        } else {
            out["warning"] = fmt::format(
                "loop device {} detached (after a refused stop, or by someone else); power off "
                "and on for a new one",
                _loop->path);
        }
    }
    return out;
}

result<void> fuse_export::stop()
{
    return stop_impl(false);
}

std::string fuse_export::kernel_disk() const
{
    return _loop ? fmt::format("loop{}", _loop->number) : std::string();
}

std::string fuse_export::in_use() const
{
    // What makes stop() refuse: a loop device held exclusively. The file
    // itself being open does not (stop() aborts what its users still ask).
    return _loop && loop_backed_by(_loop->number, _loop->backing) ? loop_holder(_loop->number)
                                                                  : std::string();
}

void fuse_export::join_workers()
{
    stop_ring();
    if (_session != nullptr) {
        fuse_session_exit(_session);
    }
    _park_wake.notify_all();  // parked workers see the session end
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
    if (_capacity_listener != 0) {
        // Before the loop device goes: the listener uses it.
        _dev.remove_capacity_listener(_capacity_listener);
        _capacity_listener = 0;
    }
    if (_loop) {
        // Forced, a loop device that is still held (mounted) detaches itself
        // when it is last closed, so nothing stays attached to a dead file.
        // One that is no longer attached to our file is left alone.
        auto detached = detach_loop(_loop->number, _loop->backing, force ? 0 : 5000, force);
        if (!detached && !force) {
            // The export goes on serving, and following the device's size.
            _capacity_listener =
                _dev.add_capacity_listener([this](uint64_t b) { capacity_changed(b); });
            capacity_changed(current_capacity(_dev.limits()));
            return std::unexpected(detached.error());
        }
        _loop.reset();
    }
    // Workers first: fuse_session_unmount closes /dev/fuse, and a worker
    // still reading it would then use a closed (or reused) descriptor.
    join_workers();
    if (_mounted) {
        // Lazy when something still has the file open; closing /dev/fuse
        // (done by the unmount) aborts what those users still ask. Only
        // when the top mount on the path is still ours: someone may have
        // unmounted ours and mounted something of theirs there. Without the
        // unmount, destroying the session closes /dev/fuse all the same.
        // (Not found at start, in a mountinfo we cannot match: unmount as
        // before rather than leave the mount behind.)
        auto top = top_mount_at(_mount_point_seen);
        if (_mount_device == 0 || (top && top->device == _mount_device)) {
            fuse_session_unmount(_session);
        } else {
            fmt::print(stderr, "fuse: {}: {} is no longer our mount; not unmounting it\n", _name,
                       _mount_point);
            // libfuse unmounts by path while the connection is alive, and
            // frees its copy of the path only there. An unconnected
            // /dev/fuse descriptor put in our descriptor's place (which
            // closes ours: the connection aborts) makes it skip the
            // unmount (its poll sees POLLERR) and just close that one.
            const int blank = ::open("/dev/fuse", O_RDWR | O_CLOEXEC);
            if (blank >= 0) {
                ::dup3(blank, fuse_session_fd(_session), O_CLOEXEC);
                ::close(blank);
                fuse_session_unmount(_session);
            }
        }
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
    auto ring = plan_ring(parsed->text("ring"));
    if (!ring) {
        return std::unexpected(ring.error());
    }
    auto exported = std::make_unique<fuse_export>(dev, ctx, *parsed, *ring);
    if (auto started = exported->start(); !started) {
        (void)exported->stop();
        if (!exported->ring_fell_through()) {
            return std::unexpected(started.error());
        }
        // ring=auto and the ring would not start once mounted (the kernel
        // withdrew it, or refused our entries): the same export on
        // /dev/fuse, on a connection of its own.
        const std::string why = exported->ring_failure();
        exported.reset();
        exported = std::make_unique<fuse_export>(dev, ctx, *parsed,
                                                 ring_plan{.use = false, .off_reason = why});
        if (auto again = exported->start(); !again) {
            (void)exported->stop();
            return std::unexpected(again.error());
        }
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
