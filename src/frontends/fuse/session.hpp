// The FUSE export's inner pieces, shared by its source files:
// fuse_export.cpp (options, lifecycle, worker threads and their polling),
// file_ops.cpp (the FUSE operations on the one file: attributes and the
// data path, answering through a reply_to), libfuse_ops.cpp (libfuse's
// callbacks on the /dev/fuse path, which call those operations) and
// fuse_ring.cpp (FUSE over io_uring, which calls them too). Private to
// this folder.
#pragma once

#define FUSE_USE_VERSION 312

#include "fuse_export.hpp"
#include "loop_device.hpp"
#include "reply.hpp"
#include "worker_policy.hpp"

#include <softblk/device.hpp>
#include <softblk/support/buffer_pool.hpp>
#include <softblk/support/level_chooser.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <ctime>
#include <fuse_lowlevel.h>
#include <memory>
#include <mutex>
#include <optional>
#include <pthread.h>
#include <string>
#include <string_view>
#include <sys/stat.h>
#include <thread>
#include <vector>

namespace softblk::fuse {

inline constexpr fuse_ino_t k_file_ino = 2;
// Largest FUSE read or write: libfuse 3.14's receive buffer holds 256 pages.
inline constexpr uint32_t k_max_io = 1u << 20;
// Requests the kernel keeps in flight towards us (async direct I/O from the
// loop driver counts as background requests; the kernel's default is 12).
inline constexpr unsigned k_max_background = 128;
// lseek(SEEK_DATA/SEEK_HOLE) reads the allocation map in windows this big.
inline constexpr uint64_t k_map_window = 256ull << 20;
inline constexpr std::chrono::milliseconds k_join_timeout{10'000};

inline uint64_t align_down(uint64_t value, uint64_t block)
{
    return value - value % block;
}
inline uint64_t align_up(uint64_t value, uint64_t block)
{
    return align_down(value + block - 1, block);
}

class fuse_export;
class ring_thread;
struct ring_init;
struct pending_io;

// Whether the export serves through FUSE over io_uring (fuse_ring.cpp),
// decided before mounting (ring=auto|on|off and what the kernel allows).
struct ring_plan {
    bool use = false;
    // ring=on: a ring that cannot start is an error, not a fallback.
    bool forced = false;
    // Why the ring is not used, for describe() ("ring=off", or what is
    // missing); empty when it is.
    std::string off_reason;
};

// Replies written straight to /dev/fuse with one writev (a fuse_out_header
// and the payload): the /dev/fuse workers' path for READ and WRITE, which
// skips libfuse's request object (an allocation, a mutex and two locked
// list updates per request). The request handle is the request's unique
// id. Any thread that serves the request (libfuse_ops.cpp).
class dev_fuse_sink final : public reply_sink {
public:
    int fd = -1;
    void error(void* request, int error) override;
    void data(void* request, const void* bytes, size_t size) override;
    char* buffer(void*, size_t) override { return nullptr; }
};

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
    // With more workers than submit queues (threads=auto on one submit
    // queue): worker 0's queue, which it drives alone (as `queue`, async)
    // while the other workers are parked, and shares through
    // device::execute while they are not.
    io_queue* solo_queue = nullptr;
    // threads=auto: set by the worker while it waits, parked, for the
    // active count to include it again (worker 0 waits for it before it
    // drives the queue alone).
    std::atomic<bool> parked{false};
    // Requests taken after a busy poll, after sleeping, and the time spent
    // polling (ns); read by describe() while the worker runs.
    std::atomic<uint64_t> polled_requests{0};
    std::atomic<uint64_t> slept_requests{0};
    std::atomic<uint64_t> poll_time_ns{0};
    // Requests served without libfuse (serve_direct).
    std::atomic<uint64_t> direct_requests{0};

    // Asynchronous mode (the export's only worker, owning its queue):
    // reads and writes are submitted and replied to from their completion,
    // so that a device that takes time (completion_nsec, a file) has many
    // requests in flight; the worker sleeps on /dev/fuse and the queue's
    // event at once while any are.
    bool async = false;
    unsigned in_flight = 0;
    // When (monotonic ns) a request last stayed in flight after its
    // submission: the device takes time, and one asynchronous worker
    // overlaps its requests where more synchronous ones would each wait
    // for one (threads=auto holds one worker then).
    uint64_t last_deferred_ns = 0;
    // Whether /dev/fuse is currently O_NONBLOCK (async mode sets it while
    // requests are in flight, so that a request gone between poll and read
    // cannot block the worker with completions waiting).
    bool fd_nonblocking = false;
    // libfuse's receive buffer of the request being processed: a write that
    // outlives its call keeps the buffer its data lies in. nullptr while a
    // ring request is served (its data stays in the ring entry).
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
    reply_to reply;
    bool is_read = false;
    // Set by the completion, which also returns the record to the free
    // list (the submitter checks it right after submitting).
    bool completed = false;
    // Read: the buffer the device fills, its class, and where in it the
    // reply starts. Not pooled: the reply's own buffer (a ring entry).
    uint8_t* data = nullptr;
    unsigned data_class = 0;
    bool pooled = false;
    uint64_t skip = 0;
    // Bytes to reply (read) or to acknowledge (write).
    size_t size = 0;
    // Write: libfuse's receive buffer holding the data, once the write
    // outlived the receive (freed at completion).
    void* receive_mem = nullptr;
};

// The worker running on this thread (set by run_worker), for the FUSE
// operations, which libfuse calls without it.
extern thread_local worker* t_worker;

// The signal that interrupts a worker blocked in read(/dev/fuse) (its
// handler does nothing: the point is the EINTR).
int wake_signal();

class fuse_export final : public device_export {
public:
    fuse_export(device& dev, const export_context& ctx, const option_set& options, ring_plan ring);
    ~fuse_export() override;

    result<void> start();
    nlohmann::json describe() const override;
    result<void> stop() override;
    std::string in_use() const override;
    // loop=1: "loopN" while it is attached.
    std::string kernel_disk() const override;

    // The ring was wanted (ring=auto) but could not start after mounting:
    // start() failed for that alone, and an export without it may be
    // started instead. Control thread.
    bool ring_fell_through() const { return _ring_failed && !_ring.forced; }
    const std::string& ring_failure() const { return _ring_failure; }

    // ---- The FUSE operations (file_ops.cpp), whichever path the request
    // came by. Each ends `r` exactly once, now or (async reads and writes)
    // from the device's completion. Worker or ring threads (t_worker).
    void serve_lookup(const reply_to& r, uint64_t parent, std::string_view name);
    void serve_getattr(const reply_to& r, uint64_t ino);
    // `valid`: the kernel's FATTR_* bits (libfuse's FUSE_SET_ATTR_* are
    // the same); `size` counts with FATTR_SIZE.
    void serve_setattr(const reply_to& r, uint64_t ino, uint32_t valid, uint64_t size);
    void serve_open(const reply_to& r, uint64_t ino, uint32_t flags);
    void serve_opendir(const reply_to& r, uint64_t ino);
    void serve_readdir(const reply_to& r, uint64_t ino, uint64_t size, uint64_t offset);
    void serve_statfs(const reply_to& r);
    void serve_read(const reply_to& r, uint64_t size, int64_t off);
    void serve_write(const reply_to& r, const char* data, uint64_t size, int64_t off);
    void serve_fsync(const reply_to& r);
    void serve_fallocate(const reply_to& r, int mode, int64_t off, int64_t len);
    void serve_lseek(const reply_to& r, int64_t off, int whence);
    // flush, release, releasedir: nothing to do.
    static void serve_nothing(const reply_to& r) { r.error(0); }

    // The /dev/fuse workers' fast path: a READ or WRITE read into `buf`
    // (`size` bytes) is served here and answered through _direct_sink,
    // and an INTERRUPT dropped (as in ring mode: no request here waits for
    // anything an interrupt could end); false for anything else, which
    // libfuse then processes (libfuse_ops.cpp). Worker thread.
    bool serve_direct(worker& w, const fuse_buf& buf, size_t size);

    // Ring mode: thread 0 reads what still comes through /dev/fuse
    // (FORGET; anything else, should the kernel not use the ring) with
    // libfuse into `buf`, until it would block. False once the connection
    // is gone (ring_setup.cpp).
    bool serve_dev_fuse(worker& w, fuse_buf& buf);

private:
    // ---- libfuse's callbacks on the /dev/fuse path (libfuse_ops.cpp)
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

    // A worker's state (scratch buffer, device queue); the thread is
    // started by the caller. Control thread.
    result<std::unique_ptr<worker>> make_worker(unsigned index);
    void run_worker(worker& w);
    // Busy-polls /dev/fuse until a request is pending (true) or `deadline`
    // (monotonic ns) passes or the session ends (false). Worker thread.
    bool poll_for_request(uint64_t deadline) const;
    // threads=auto. Worker 0 makes the chooser's worker count the active
    // one: raising it, it first waits for its own requests in flight and
    // leaves the queue to device::execute; lowering it, it waits until the
    // workers beyond the count parked (signalling them out of read), and
    // alone again it drives its queue asynchronously. Worker 0.
    void apply_worker_count(worker& w);
    // A worker beyond the active count waits until it is included again
    // or the session ends. Worker thread.
    void park(worker& w);
    // Async mode: sleeps until /dev/fuse has a request, the queue's event
    // descriptor fires or its next completion is due. False when it slept
    // and /dev/fuse has nothing to read. Worker thread.
    bool wait_request_or_completion(worker& w) const;
    void set_fd_nonblocking(worker& w, bool on) const;
    // Async mode: submits a read (reply: `size` bytes from `skip`) into
    // the reply's own buffer where it has one and the read needs no
    // widening, else a pooled one; or a write of `data`. Replies at
    // completion.
    static void submit_async(worker& w, const reply_to& r, io_op op, uint64_t offset,
                             uint32_t length, const char* data, uint64_t skip, size_t size);
    struct stat file_attr() const;
    struct stat dir_attr() const;

    // Writes `length` bytes of `data` (nullptr: zeros) at an offset or
    // length that need not be block aligned, reading the edge blocks first.
    int write_unaligned(worker& w, uint64_t offset, size_t length, const char* data);
    // Makes [offset, offset+length) read as zeros: the aligned middle with
    // `op` (discard or write_zeroes), the edges by read-modify-write.
    int zero_range(worker& w, uint64_t offset, uint64_t length, bool punch);

    // ---- Ring mode (fuse_ring.cpp): after mounting, takes the INIT
    // exchange (its reply says FUSE_OVER_IO_URING), then starts the ring
    // threads, which register their entries. Control thread.
    result<void> start_ring();
    void stop_ring();
    // The ring's part of describe(): "ring" ("on", or "off (why)"), and
    // in ring mode its queues, entries and requests served.
    void describe_ring(nlohmann::json& out) const;
    // The error start() returns for a ring that cannot start; remembers
    // it for ring_fell_through().
    error ring_error(int code, std::string what);

    result<void> stop_impl(bool force);
    void join_workers();

    // The device's capacity changed (device::add_capacity_listener): the
    // file takes the new size, and the loop device attached to it too.
    void capacity_changed(uint64_t bytes);

    friend class ring_thread;
    friend struct ring_init;

    device& _dev;
    block_limits _limits;  // capacity_bytes changes with the device's (set_capacity)
    uint64_t _capacity_listener = 0;
    std::string _name;
    std::string _mount_point;
    std::string _file_path;
    bool _privileged = false;
    bool _want_loop = false;
    // Workers (or ring threads) made; with threads=auto the most that may
    // be active, the others parked.
    unsigned _thread_count = 0;
    // More workers than submit queues: they share them through
    // device::execute (worker 0 drives its queue alone while the others
    // are parked).
    bool _shared_queues = false;
    // How many workers serve (threads=auto: measured, level_chooser) and
    // why, where it is not measured; the count in effect (worker 0 sets it)
    // and what parked workers wait on.
    std::optional<shared_level_chooser> _worker_count;
    std::string _worker_count_why;
    std::atomic<unsigned> _active{1};
    // threads=auto: the chooser asked for more workers while worker 0's
    // device kept requests in flight (shown in describe()).
    std::atomic<bool> _held_async{false};
    std::mutex _park_lock;
    std::condition_variable _park_wake;
    // The busy-poll window (poll_us: auto, measured, or given) and the token
    // that lets one worker at a time poll: on a machine with few CPUs two
    // spinning workers would take the CPUs their clients need.
    std::optional<shared_level_chooser> _poll;
    std::atomic<bool> _polling{false};
    uid_t _uid = 0;
    gid_t _gid = 0;
    struct timespec _created {};

    fuse_session* _session = nullptr;
    dev_fuse_sink _direct_sink;
    bool _mounted = false;
    uint64_t _mount_device = 0;     // st_dev of our mount (mountinfo), 0: not found
    std::string _mount_point_seen;  // _mount_point as mountinfo shows it (links resolved)
    bool _registered = false;
    std::vector<std::unique_ptr<worker>> _workers;
    std::optional<loop_attachment> _loop;

    // Ring mode: the plan, what went wrong when it could not start, the
    // INIT exchange as the ring's custom I/O saw it, and the threads.
    ring_plan _ring;
    bool _ring_failed = false;
    std::string _ring_failure;
    std::unique_ptr<ring_init> _ring_init;
    std::vector<std::unique_ptr<ring_thread>> _rings;
    unsigned _ring_queues = 0;
    unsigned _ring_entries = 0;

    std::mutex _stop_lock;
    bool _stopped = false;
    // Serialises read-modify-write of partial blocks (unaligned writes
    // from programs; the loop driver always sends aligned requests).
    std::mutex _rmw_lock;
};

}  // namespace softblk::fuse
