// FUSE over io_uring (ring mode, docs/fuse.md): the kernel hands requests
// to ring entries the server registered on per-CPU queues, and takes each
// reply with the command that fetches the entry's next request, so a
// request costs no read or write on /dev/fuse. fuse_ring_abi.hpp has the
// protocol.
//
// A ring_thread serves one or more of the kernel's queues from one
// io_uring of its own (128-byte entries; SINGLE_ISSUER and DEFER_TASKRUN
// where the kernel has them), and drives a device queue as a /dev/fuse
// worker does: alone and asynchronously (replying from the completion)
// when it has one to itself, else shared through device::execute. The
// operations are file_ops.cpp's; the thread is their reply_sink.
// ring_setup.cpp decides whether the ring is used and starts the threads.
#pragma once

#include "fuse_ring_abi.hpp"
#include "reply.hpp"
#include "session.hpp"

#include <atomic>
#include <cstdint>
#include <future>
#include <liburing.h>
#include <memory>
#include <string_view>
#include <sys/uio.h>
#include <thread>
#include <vector>

namespace softblk::fuse {

// ring=auto|on|off and what this system allows (ring_setup.cpp). Errors:
// a mode that is none of those (EINVAL); ring=on where the ring cannot
// work (EOPNOTSUPP, saying what is missing). Control thread.
result<ring_plan> plan_ring(std::string_view mode);

// What keeps FUSE over io_uring from working here, in words for a person
// (no kernel support, enable_uring is N, io_uring disabled), or empty.
// Loads the fuse module (opens /dev/fuse) to find out. Control thread.
std::string ring_missing();

// The INIT exchange as ring mode's custom I/O (ring_setup.cpp) sees it:
// libfuse replies to INIT, and the custom writev adds FUSE_OVER_IO_URING
// to the reply. Written by the control thread during start_ring() and
// read by it afterwards; ring thread 0 only reads drop_interrupts.
struct ring_init {
    uint64_t unique = 0;         // of the kernel's INIT request; 0: not seen yet
    bool offered = false;        // its flags have FUSE_OVER_IO_URING
    bool replied = false;        // libfuse's reply went out
    int reply_error = 0;         // errno of that reply (libfuse's or the write's)
    bool ring_set = false;       // ... with FUSE_OVER_IO_URING set
    bool unknown_reply = false;  // ... in a layout it could not add it to
    uint32_t max_write = 0;      // as the reply said
    uint32_t max_pages = 0;
    // Ring requests never pass through libfuse, so an interrupt of one
    // would wait in libfuse's list forever: dropped once the ring serves.
    std::atomic<bool> drop_interrupts{false};

    // The custom I/O; libfuse passes the session's userdata, the export.
    static ssize_t read(int fd, void* buf, size_t len, void* userdata);
    static ssize_t writev(int fd, iovec* iov, int count, void* userdata);
    static ring_init& of(void* userdata)
    {
        return *static_cast<fuse_export*>(userdata)->_ring_init;
    }
};

struct ring_thread_config {
    int fuse_fd = -1;  // the session's /dev/fuse, owned by libfuse
    // The kernel's queues this thread serves (its index, its index plus
    // the thread count, ...).
    std::vector<uint16_t> qids;
    unsigned entries = 0;      // per queue
    size_t payload_bytes = 0;  // per entry: the kernel's largest request or reply
    // Also reads /dev/fuse (thread 0): FORGET and INTERRUPT always come
    // that way.
    bool serves_dev_fuse = false;
};

class ring_thread final : public reply_sink {
public:
    // `w` is the thread's operation state (owned by the export, which
    // outlives the thread). Control thread.
    ring_thread(fuse_export& owner, worker& w, ring_thread_config cfg);
    ~ring_thread();
    ring_thread(const ring_thread&) = delete;
    ring_thread& operator=(const ring_thread&) = delete;

    // Starts the thread and returns once it has set up its ring and
    // registered every entry, or failed to: the error says which queue
    // and what the kernel answered. Control thread.
    result<void> start();
    // Asks the thread to end once the requests it serves are answered:
    // what is in flight in the device completes and is committed, then
    // its ring closes, which cancels the entries waiting in the kernel.
    // Any thread.
    void request_exit();
    void join();

    // Requests taken from ring entries. Any thread.
    uint64_t requests() const { return _requests.load(std::memory_order_relaxed); }

    // ---- reply_sink: `request` is the entry; the commit goes out with
    // the next submission of the ring. Ring thread.
    void error(void* request, int error) override;
    void data(void* request, const void* bytes, size_t size) override;
    char* buffer(void* request, size_t size) override;

private:
    struct entry {
        ring_abi::request_header* header = nullptr;
        char* payload = nullptr;
        iovec iov[ring_abi::k_register_iovecs]{};
        uint64_t commit_id = 0;
        uint64_t unique = 0;
        uint32_t last_cmd = 0;
        uint16_t qid = 0;
        bool gone = false;  // the kernel ended the entry (connection gone)
    };
    // user_data of our other entries; an entry's is its address.
    static constexpr uint64_t k_wake_data = 1;
    static constexpr uint64_t k_event_data = 2;
    static constexpr uint64_t k_dev_fuse_data = 3;

    void run(std::promise<result<void>>& ready);
    result<void> setup();
    void teardown();
    io_uring_sqe* next_sqe();
    void prep_command(entry& e, uint32_t op);
    void prep_wake_read();
    void arm_dev_fuse_poll();
    // Submits what is prepared and sleeps in the ring until a CQE (a
    // request, a wake-up) or, with device I/O in flight, its next event.
    int wait();
    // Nothing in flight: the export's adaptive busy poll (poll_us), then
    // sleep.
    int wait_idle();
    bool work_waiting() const;
    void handle_cqe(const io_uring_cqe& cqe);
    // A request arrived in `e`: hands it to the operation.
    void serve(entry& e);
    void commit(entry& e, int error, size_t size);

    fuse_export& _owner;
    worker& _w;
    ring_thread_config _cfg;
    std::thread _thread;
    io_uring _ring{};
    bool _ring_ok = false;
    bool _fixed_file = false;
    std::unique_ptr<entry[]> _entries;
    size_t _entry_count = 0;
    std::unique_ptr<ring_abi::request_header[]> _headers;
    char* _payloads = nullptr;
    size_t _payloads_len = 0;
    int _wake_fd = -1;
    uint64_t _wake_buf = 0;
    bool _event_poll_armed = false;
    bool _dev_fuse_armed = false;
    bool _dev_fuse_gone = false;
    fuse_buf _dev_fuse_buf{};  // libfuse's receive buffer (thread 0)
    std::atomic<bool> _exit_requested{false};
    std::atomic<uint64_t> _requests{0};
    uint64_t _requests_counted = 0;  // of _requests, given to the poll chooser
};

}  // namespace softblk::fuse
