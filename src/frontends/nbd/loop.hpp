// The NBD server's event loop (private to src/frontends/nbd): a loop
// thread's io_uring, the connections it owns and their state. Who does what:
//   event_loop.cpp  the ring, the loop itself, waiting (polling, then sleeping)
//   receive.cpp     socket (or TLS session) input into the parser, hang-ups
//   send.cpp        output: replies gathered into iovecs, sent or posted
//   connection.cpp  accept, hand-off between loops, queue bindings, timers,
//                   close/free
//   handshake.cpp   the option haggling, the TLS handshake, into transmission
//   request.cpp     requests: parse -> device requests -> replies queued
//   coalesce.cpp    receive coalescing (the policy: coalesce.hpp)
//   server.cpp      listeners, exports, starting and stopping the loops
#pragma once

#include <atomic>
#include <cerrno>
#include <cstring>
#include <cstdint>
#include <liburing.h>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <sys/socket.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <unistd.h>
#include <vector>

#include <fmt/core.h>

#include "codec.hpp"
#include "coalesce.hpp"

#include <softblk/support/colocation.hpp>
#include <softblk/support/level_chooser.hpp>
#include "request.hpp"
#include "server.hpp"
#include "tls.hpp"

namespace softblk::nbd {

// Per connection: requests taken in and not yet fully answered.
inline constexpr unsigned k_max_ops = 128;
// The receive buffer of a connection.
inline constexpr size_t k_recv_buffer = 256 * 1024;
// A receive takes at most max(k_recv_chunk, 4 requests of the connection's
// recent average size): small requests stay in the L1 cache with what
// parsing copies out of them (with 256 KiB receives a QD 32 burst of 4 KiB
// writes came in at once, and copying each payload into its request's
// buffer read it back from further out: more CPU per request, docs/nbd.md
// "Copies"), while 64 KiB writes still come four to a receive (with 32 KiB
// receives each took two, and cost more).
inline constexpr size_t k_recv_chunk = 32 * 1024;
// A write payload at least this large with nothing else buffered is
// received straight into the request's buffer.
inline constexpr uint32_t k_direct_recv = 32 * 1024;
inline constexpr unsigned k_max_iov = 256;
inline constexpr size_t k_tls_in_buffer = 64 * 1024;
inline constexpr unsigned k_ring_entries = 1024;

// user_data tags in the low 3 bits of an 8-aligned pointer (a listener's
// index shifted for accepts).
enum token : uintptr_t {
    k_token_recv = 0,    // connection*
    k_token_send = 1,    // connection*
    k_token_accept = 2,  // listener index << 3
    k_token_wake = 3,    // event_loop*: the eventfd read
    k_token_timer = 4,   // event_loop*: the connection timer
    k_token_hup = 5,     // connection*: the poll for a peer gone while input is blocked
    k_token_ignore = 6,  // cancellations: nothing to do
    k_token_device = 7,  // queue_binding*: its device queue's event_fd() is readable
};
inline constexpr uintptr_t k_token_mask = 7;
// TCP keepalive of accepted connections: the first probe after this long
// without traffic, then every k_keepalive_interval_s, and the peer is
// declared dead after k_keepalive_count unanswered probes. Sent data left
// unacknowledged for k_tcp_user_timeout_ms also ends the connection.
inline constexpr int k_keepalive_idle_s = 30;
inline constexpr int k_keepalive_interval_s = 10;
inline constexpr int k_keepalive_count = 3;
inline constexpr unsigned k_tcp_user_timeout_ms = 60'000;
// The connection timer (handshake and idle timeouts) looks at least this
// often while it has deadlines: timeouts are whole seconds, so a deadline
// set later is never before the posted timer.
inline constexpr uint64_t k_timer_period_ns = 1'000'000'000;
// How long a loop with connections waiting for the server-wide buffer
// limit (server_config::total_buffer_bytes) sleeps before it looks again:
// other loops free buffers without waking it.
inline constexpr long long k_buffer_wait_ns = 1'000'000;
// After a pass of the loop that took in more than one request, the loop
// serves from any CPU for this long (colocate: the client pipelines).
inline constexpr uint64_t k_pipelined_ns = 100'000'000;

inline void* make_user_data(void* p, token t)
{
    return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(p) | t);
}

enum class phase : uint8_t { handshake, tls_handshake, transmission };

struct alignas(8) connection {
    event_loop* loop = nullptr;
    int fd = -1;
    phase ph = phase::handshake;
    std::unique_ptr<handshake> hs;
    negotiated neg;
    server_export* exp = nullptr;
    queue_binding* binding = nullptr;

    // Plain text input.
    uint8_t* rbuf = nullptr;
    size_t rstart = 0;
    size_t rend = 0;
    nbd_op* payload_op = nullptr;  // write payload being received
    uint64_t payload_left = 0;     // bytes of payload still to come
    uint32_t payload_pos = 0;
    bool payload_discard = false;
    bool recv_posted = false;
    bool recv_direct = false;  // the posted recv targets payload_op's buffer
    bool read_eof = false;
    bool input_blocked = false;
    bool buffer_wait = false;  // blocked on the server-wide buffer limit (on _buffer_waiters)
    bool hup_posted = false;   // a poll for the peer hanging up (k_token_hup)
    bool tcp = false;
    pid_t peer_pid = 0;  // unix sockets: the process that connected (SO_PEERCRED)

    // Receive coalescing (server_config::coalesce_us, docs/nbd.md): for a
    // connection that pipelines, the next receive may be held back for a
    // window so that one wake-up takes several requests; the policy
    // measures which window, if any, serves the client.
    coalesce_policy coalesce;
    bool recv_deferred = false;               // on the loop's deferred list
    uint64_t recv_at_ns = 0;                  // when the deferred receive is posted
    uint64_t parsed = 0;                      // requests parsed so far
    uint32_t request_bytes = k_request_size;  // recent average request size, payload included
    uint64_t parsed_before = 0;               // ... at the last coalesce_receive
    bool disc = false;

    // Output.
    std::vector<uint8_t> out_bytes;     // handshake replies, or TLS ciphertext
    std::vector<uint8_t> out_inflight;  // what c.iov[0] sends (out_bytes taken)
    op_fifo replies;                    // ops whose reply waits to go out
    iovec iov[k_max_iov];
    nbd_op* iov_op[k_max_iov];  // op whose reply ends with this iovec
    unsigned iov_count = 0;
    unsigned iov_first = 0;
    msghdr msg{};
    bool send_posted = false;  // the rest of c.iov waits in the ring for room
    bool dirty = false;        // on the loop's flush list

    // TLS.
    bool tls = false;
    gnutls_session_t session = nullptr;
    tls_pipe pipe;

    // Bookkeeping.
    std::vector<nbd_op> ops;
    std::vector<nbd_op*> free_ops;
    unsigned ops_in_device = 0;
    uint64_t buffered = 0;
    bool closing = false;
    bool close_after_send = false;  // close once the pending output is sent
    bool handoff = false;           // move to `handoff_to` once no I/O is posted
    unsigned handoff_to = 0;
    bool counted = false;                // counted in exp->connections
    uint64_t handshake_deadline_ns = 0;  // CLOCK_MONOTONIC; 0: none
    // Idle timeout: receives and sends that moved bytes (counted on the hot
    // path, no clock read), and when the timer last saw the count change.
    uint32_t progress = 0;
    uint32_t progress_seen = 0;
    uint64_t last_progress_ns = 0;
    int send_queue_seen = -1;  // SIOCOUTQ at the last timer, for a posted send

    connection* next_dirty = nullptr;
};

class event_loop {
public:
    event_loop(server& srv, unsigned index)
        : _srv(srv),
          _index(index),
          _poll(poll_config(srv.config())),
          _placing(placing_config(srv.config())),
          _coalesce_ns(uint64_t{srv.config().coalesce_us} * 1000),
          _idle_timeout_ns(uint64_t{srv.config().idle_timeout_ms} * 1'000'000)
    {
    }
    // The loop's poll window and why (level_chooser::describe). Any thread.
    nlohmann::json poll_choice() const { return _poll.describe(); }
    // Where the loop runs (colocate) and why. Any thread.
    nlohmann::json colocate_choice() const
    {
        nlohmann::json j = _placing.describe();
        if (_placing_refused.load(std::memory_order_acquire)) {
            j["level"] = 0;
            j["why"] = _placing_why;
        }
        return j;
    }
    ~event_loop()
    {
        if (_wake_fd >= 0) {
            ::close(_wake_fd);
        }
    }

    result<void> init()
    {
        _wake_fd = ::eventfd(0, EFD_CLOEXEC);
        if (_wake_fd < 0) {
            return make_error(errno, fmt::format("nbd: eventfd: {}", std::strerror(errno)));
        }
        return {};
    }

    void run();

    // Any thread.
    void wake()
    {
        const uint64_t one = 1;
        [[maybe_unused]] ssize_t n = ::write(_wake_fd, &one, sizeof one);
    }
    void request_stop()
    {
        _stop.store(true);
        wake();
    }
    void drop_export()
    {
        _check_exports.store(true);
        wake();
    }
    void adopt(connection* c)
    {
        {
            std::lock_guard lock(_inbox_mutex);
            _inbox.push_back(c);
        }
        wake();
    }

private:
    // What both of the loop's choosers maximise (poll-goal): requests per
    // second, or per CPU time. Only this loop's thread feeds them, so the
    // thread's CPU clock is the loop's cost.
    static level_chooser::config by_goal(level_chooser::config c, const server_config& cfg)
    {
        if (cfg.poll_per_cpu) {
            c.goal = level_chooser::objective::rate_per_cpu;
        }
        return c;
    }

    // The poll window's chooser: poll-us.
    static level_chooser::config poll_config(const server_config& cfg)
    {
        return by_goal(poll_window_config(cfg.poll_us), cfg);
    }

    // The placement's chooser (colocate). Next to a client that keeps many
    // requests in flight the loop shares the client's CPU: fewer requests
    // per second, each for less CPU (no cache lines crossing CPUs). Which
    // pays is the machine's: fio at QD 32 got 0.65x the requests at 0.68x
    // the CPU each on one Xeon guest (apart wins by requests per CPU time)
    // and 0.8x at 0.73x on another (next to it wins); docs/nbd.md "Serving
    // next to the client".
    static level_chooser::config placing_config(const server_config& cfg)
    {
        return by_goal(colocation_config(cfg.colocate), cfg);
    }

    // event_loop.cpp: the ring and the loop, waiting.
    io_uring_sqe* sqe();
    void post_accept(unsigned listener);
    void post_wake_read();
    void wait(bool device_fd, uint64_t device_wake);
    void wait_polling();
    // Submits what is queued and runs what completed meanwhile, without
    // waiting; true when a completion is there.
    bool next_is_in();
    // Around every wait (colocate): back to the thread's own policy before
    // it, and after it, next to the client (pinned, SCHED_IDLE until the
    // replies are out) when that is the level.
    void place_before_wait();
    void place_after_wait();
    // Feeds the placement's chooser the requests taken in since the last
    // call (place_before_wait does, and a pass that did not wait).
    void count_placed();

    // receive.cpp: input.
    void post_recv(connection& c);
    void on_recv(connection& c, int res);
    void pump_input(connection& c);
    void post_hup_poll(connection& c);
    void on_hup(connection& c, int res);

    // send.cpp: output.
    void post_send(connection& c);
    void on_send(connection& c, int res);
    void mark_dirty(connection& c);
    void flush(connection& c);
    void fill_iov(connection& c);
    bool send_direct(connection& c);
    void sent(connection& c, size_t n);

    // handshake.cpp: from the first option to transmission.
    bool parse_input(connection& c);
    bool parse_handshake(connection& c);
    void run_tls_handshake(connection& c);
    void enter_transmission(connection& c);

    // connection.cpp: accept, hand-off, bindings, timers, close/free.
    void on_accept(int listener, int fd);
    // One line on stderr (the daemon's log) about a client. Control path:
    // refusals and timeouts only, never per request.
    static void log_client(const connection& c, const std::string& what);
    void begin_close(connection& c, bool graceful = false);
    void maybe_free(connection& c);
    void adopt_inbox();
    void check_exports();
    // The connection timer: closes connections past their handshake or
    // idle deadline and posts itself for the next (at most
    // k_timer_period_ns on). post_timer posts it if it is not.
    void post_timer();
    void on_timer();
    queue_binding* bind(server_export& exp);
    // The binding at `address` (a device poll's user_data), or nullptr.
    queue_binding* binding_at(uintptr_t address) const;
    void unbind(queue_binding* b);
    // Erases the bindings unbind() retired. Loop thread, never inside a pass
    // over _bindings.
    void sweep_bindings();

    // request.cpp: requests, from parsing to queuing the reply.
    bool parse_requests(connection& c);
    // Whether `c` may take a request that needs a buffer of `bytes` now
    // (server_config::conn_buffer_bytes, total_buffer_bytes).
    bool buffer_allowed(connection& c, uint64_t bytes);
    void buffer_acquired(connection& c, uint64_t bytes);
    void buffer_released(connection& c, uint64_t bytes);
    // Gives connections waiting for the server-wide limit another try.
    void retry_buffer_waiters();
    nbd_op* take_op(connection& c);
    void release_op(nbd_op& o);
    void start_op(nbd_op& o);
    static void on_device_complete(bio& b, int status);
    void finish_op(nbd_op& o);
    void reply_error(connection& c, const request_header& h, uint32_t error);
    void queue_reply(nbd_op& o);
    // BLOCK_STATUS: the reply chunk from the extents the device reported.
    void block_status_reply(nbd_op& o);

    // coalesce.cpp: decides whether c's next receive is held back; true
    // when it was put on _deferred. Loop thread.
    bool coalesce_receive(connection& c);

    server& _srv;
    unsigned _index;
    io_uring _ring{};
    int _wake_fd = -1;
    uint64_t _wake_value = 0;
    std::atomic<bool> _stop{false};
    std::atomic<bool> _check_exports{false};
    std::mutex _inbox_mutex;
    std::vector<connection*> _inbox;
    std::vector<connection*> _conns;
    // Connections whose next receive is held back (receive coalescing).
    std::vector<connection*> _deferred;
    std::vector<std::unique_ptr<queue_binding>> _bindings;
    bool _bindings_retired = false;  // some binding waits for sweep_bindings()
    connection* _dirty = nullptr;
    buffer_pool _pool;
    std::vector<sockaddr_storage> _accept_addr;
    std::vector<socklen_t> _accept_len;
    bool _stopping = false;
    // Polling before sleeping (server_config::poll_us): the window measured
    // (or given), fed with the requests parsed since the last wait.
    shared_level_chooser _poll;
    // Where the loop runs (server_config::colocate): the chooser, fed
    // with the same requests, and the thread's placement (made on it).
    shared_level_chooser _placing;
    std::optional<colocation> _place;
    std::atomic<bool> _placing_refused{false};
    uint64_t _parsed_at_wait = 0;  // _requests_parsed after the last wait
    // By requests per second (poll-goal=rate) a client that pipelines is
    // served from any CPU: a pass that took in several requests frees the
    // loop until then.
    uint64_t _pipelined_until_ns = 0;
    std::string _placing_why;  // set before _placing_refused
    uint64_t _requests_parsed = 0;
    uint64_t _requests_counted = 0;
    uint64_t _requests_placed = 0;  // ... and fed to _placing
    uint64_t _coalesce_ns = 0;
    bool _taskrun_flag = false;  // the ring sets IORING_SQ_TASKRUN
    // The connection timer (an IORING_OP_TIMEOUT, see post_timer).
    __kernel_timespec _timer_ts{};
    bool _timer_posted = false;
    uint64_t _idle_timeout_ns = 0;
    // Connections blocked on the server-wide buffer limit.
    std::vector<connection*> _buffer_waiters;
};

}  // namespace softblk::nbd
