#include "server.hpp"

#include <arpa/inet.h>
#include <cassert>
#include <cerrno>
#include <climits>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <liburing.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <netinet/tcp.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <fmt/core.h>

#include "tls.hpp"

#include "core/clock.hpp"

namespace softblk::nbd {

namespace {

// Per connection: requests taken in and not yet fully answered.
constexpr unsigned k_max_ops = 128;
// Per connection: payload bytes held by requests in flight; the connection
// stops reading requests beyond it (back-pressure through the socket).
constexpr uint64_t k_max_buffered = 64ull << 20;
constexpr size_t k_recv_buffer = 256 * 1024;
// A write payload at least this large with nothing else buffered is
// received straight into the request's buffer.
constexpr uint32_t k_direct_recv = 32 * 1024;
constexpr unsigned k_max_iov = 256;
constexpr size_t k_tls_in_buffer = 64 * 1024;
constexpr uint32_t k_zero_buffer = 1u << 20;
constexpr unsigned k_ring_entries = 1024;
// A reply send at most this large on a socket whose peer reads is expected
// to complete while it is submitted (see event_loop::run).
constexpr size_t k_inline_send = 128 * 1024;
// How long a wait that counts on such sends completing inline may last
// before the loop looks again (in case one did not: the socket was full).
constexpr long long k_inline_send_wait_ns = 1'000'000;
// Receive coalescing: a connection measures its request rate over epochs
// this long, and keeps its choice for this many epochs.
constexpr uint64_t k_coalesce_epoch_ns = 2'000'000;
constexpr uint8_t k_coalesce_exploit_epochs = 16;
// An epoch with fewer requests than this ends coalescing: the client has
// (nearly) stopped.
constexpr uint64_t k_coalesce_idle_requests = 4;

// user_data tags in the low bits of an aligned pointer.
enum token : uintptr_t {
    k_token_recv = 0,
    k_token_send = 1,
    k_token_accept = 2,
    k_token_wake = 3,
};

void* make_user_data(void* p, token t)
{
    return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(p) | t);
}

// Zeros for emulated WRITE_ZEROES (read only; shared by all threads).
using core::monotonic_ns;

// Who is at the other end of `fd`, for log lines: ADDRESS:PORT over TCP,
// the process id (SO_PEERCRED) on a unix socket.
std::string peer_name(int fd)
{
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0) {
        char host[INET6_ADDRSTRLEN] = "";
        if (ss.ss_family == AF_INET) {
            const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
            ::inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
            return fmt::format("{}:{}", host, ntohs(a->sin_port));
        }
        if (ss.ss_family == AF_INET6) {
            const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
            ::inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
            return fmt::format("[{}]:{}", host, ntohs(a->sin6_port));
        }
        ucred cred{};
        socklen_t n = sizeof cred;
        if (ss.ss_family == AF_UNIX && ::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &n) == 0) {
            return fmt::format("pid {} on the unix socket", cred.pid);
        }
    }
    return fmt::format("on fd {}", fd);
}

const uint8_t* zero_buffer()
{
    static const uint8_t* zeros =
        static_cast<const uint8_t*>(std::aligned_alloc(4096, k_zero_buffer));
    static const bool cleared = [] {
        std::memset(const_cast<uint8_t*>(zeros), 0, k_zero_buffer);
        return true;
    }();
    (void)cleared;
    return zeros;
}

// Buffers by power-of-two size class (4 KiB .. 32 MiB), kept per loop.
class buffer_pool {
public:
    ~buffer_pool()
    {
        for (auto& list : _free) {
            for (void* p : list) {
                std::free(p);
            }
        }
    }
    static unsigned size_class(uint32_t bytes)
    {
        unsigned c = 0;
        while ((uint64_t{4096} << c) < bytes) {
            ++c;
        }
        return c;
    }
    uint8_t* get(uint32_t bytes, unsigned& cls)
    {
        cls = size_class(bytes);
        if (!_free[cls].empty()) {
            void* p = _free[cls].back();
            _free[cls].pop_back();
            _free_bytes -= uint64_t{4096} << cls;
            return static_cast<uint8_t*>(p);
        }
        return static_cast<uint8_t*>(std::aligned_alloc(4096, uint64_t{4096} << cls));
    }
    void put(uint8_t* p, unsigned cls)
    {
        const uint64_t size = uint64_t{4096} << cls;
        if (_free_bytes + size > k_keep) {
            std::free(p);
            return;
        }
        _free[cls].push_back(p);
        _free_bytes += size;
    }

private:
    static constexpr uint64_t k_keep = 128ull << 20;
    std::vector<void*> _free[16];
    uint64_t _free_bytes = 0;
};

}  // namespace

struct connection;
struct queue_binding;

// One NBD request, from its header to the end of its reply's send.
struct nbd_op {
    connection* conn = nullptr;
    request_header h;
    uint8_t* buf = nullptr;  // read data / write payload
    unsigned buf_class = 0;
    uint64_t next_offset = 0;  // next device chunk
    uint64_t left_to_submit = 0;
    unsigned pending = 0;  // device requests in flight
    int error = 0;         // first negative errno
    bool submitting = false;
    bool in_device = false;  // counted in connection::ops_in_device
    bool waiting = false;    // on its queue_binding's waiting list
    io_op dev_op = io_op::read;
    uint32_t dev_flags = 0;
    uint32_t chunk_max = 0;
    // Reply: header bytes, then data (read) or `extra` (block status).
    uint8_t hdr[32];
    uint8_t hdr_len = 0;
    uint32_t data_len = 0;
    std::vector<uint8_t> extra;
    nbd_op* next = nullptr;
};

struct op_fifo {
    nbd_op* head = nullptr;
    nbd_op* tail = nullptr;
    bool empty() const { return head == nullptr; }
    void push(nbd_op* o)
    {
        o->next = nullptr;
        if (tail != nullptr) {
            tail->next = o;
        } else {
            head = o;
        }
        tail = o;
    }
    nbd_op* pop()
    {
        nbd_op* o = head;
        if (o != nullptr) {
            head = o->next;
            if (head == nullptr) {
                tail = nullptr;
            }
        }
        return o;
    }
};

// A loop's hold on one queue of one device.
struct queue_binding {
    std::shared_ptr<server_export> exp;
    io_queue* queue = nullptr;
    unsigned users = 0;
    op_fifo waiting;  // ops that found no free tag
    // A multishot poll on queue->event_fd() is in the loop's ring (targets
    // that complete on a descriptor, e.g. the file target's io_uring).
    bool event_poll_armed = false;
};

enum class phase : uint8_t { handshake, tls_handshake, transmission };

// Receive coalescing of a connection: off (not pipelining), measuring the
// request rate without (measure_plain) or with (measure_held) holding
// receives back, or using the better of the two (exploit).
enum class coalesce_phase : uint8_t { off, measure_plain, measure_held, exploit };

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

    // Receive coalescing (server_config::coalesce_us, docs/nbd.md): for a
    // connection that pipelines, the next receive may be held back for the
    // window so that one wake-up takes several requests. The connection
    // measures its request rate in epochs, without and then with holding
    // back, and keeps the better for a while before measuring again.
    coalesce_phase coalesce = coalesce_phase::off;
    bool coalesce_wins = false;
    bool recv_deferred = false;  // on the loop's deferred list
    uint8_t exploit_left = 0;    // epochs before measuring again
    uint64_t recv_at_ns = 0;     // when the deferred receive is posted
    uint64_t epoch_start_ns = 0;
    uint64_t epoch_requests = 0;
    uint64_t rate_plain = 0;     // requests per second without holding back
    uint64_t parsed = 0;         // requests parsed so far
    uint64_t parsed_before = 0;  // ... at the last coalesce_receive
    bool disc = false;

    // Output.
    std::vector<uint8_t> out_bytes;     // handshake replies, or TLS ciphertext
    std::vector<uint8_t> out_inflight;  // what the posted send is sending
    op_fifo replies;                    // ops whose reply waits to go out
    iovec iov[k_max_iov];
    nbd_op* iov_op[k_max_iov];  // op whose reply ends with this iovec
    unsigned iov_count = 0;
    unsigned iov_first = 0;
    size_t send_bytes = 0;  // what the posted send carries
    msghdr msg{};
    bool send_posted = false;
    bool dirty = false;  // on the loop's flush list

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

    connection* next_dirty = nullptr;
};

class event_loop {
public:
    event_loop(server& srv, unsigned index)
        : _srv(srv),
          _index(index),
          _poll_max_ns(uint64_t{srv.config().poll_us} * 1000),
          _coalesce_ns(uint64_t{srv.config().coalesce_us} * 1000)
    {
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
    // ring
    io_uring_sqe* sqe();
    void post_recv(connection& c);
    void post_send(connection& c);
    void post_accept(unsigned listener);
    void post_wake_read();

    // connections
    void on_accept(int listener, int fd);
    void on_recv(connection& c, int res);
    void on_send(connection& c, int res);
    void pump_input(connection& c);
    bool parse_input(connection& c);
    bool parse_handshake(connection& c);
    bool parse_requests(connection& c);
    void run_tls_handshake(connection& c);
    // One line on stderr (the daemon's log) about a client. Control path:
    // refusals and timeouts only, never per request.
    static void log_client(const connection& c, const std::string& what);
    void enter_transmission(connection& c);
    void begin_close(connection& c, bool graceful = false);
    void maybe_free(connection& c);
    void mark_dirty(connection& c);
    void flush(connection& c);
    void adopt_inbox();
    void check_exports();
    void wait_polling(unsigned wait_nr);
    void submit_and_block(unsigned wait_nr);
    void post_handshake_timer(uint64_t deadline_ns);
    void on_handshake_timer();
    static bool send_needs_no_wake(const connection& c);

    // requests
    nbd_op* take_op(connection& c);
    void release_op(nbd_op& o);
    void start_op(nbd_op& o);
    void submit_chunks(nbd_op& o, io_request* reuse);
    bool fill_chunk(nbd_op& o, io_request& r);
    static void on_device_complete(io_request& r, int result);
    void finish_op(nbd_op& o);
    void reply_error(connection& c, const request_header& h, uint32_t error);
    void queue_reply(nbd_op& o);
    void block_status(nbd_op& o);

    queue_binding* bind(server_export& exp);
    void unbind(queue_binding* b);
    // The binding at `address` (a poll's user_data), or nullptr.
    queue_binding* binding_at(uintptr_t address) const;

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
    // Decides whether c's next receive is held back; true when it was
    // put on _deferred. Loop thread.
    bool coalesce_receive(connection& c);
    std::vector<std::unique_ptr<queue_binding>> _bindings;
    connection* _dirty = nullptr;
    buffer_pool _pool;
    std::vector<sockaddr_storage> _accept_addr;
    std::vector<socklen_t> _accept_len;
    bool _stopping = false;
    // Adaptive polling before sleeping (server_config::poll_us): the current
    // window and its bound, in ns; 0 bound = never poll.
    uint64_t _poll_max_ns = 0;
    uint64_t _coalesce_ns = 0;
    uint64_t _poll_ns = 0;
    bool _taskrun_flag = false;  // the ring sets IORING_SQ_TASKRUN
    // Sends posted since the last wait (see run()).
    std::vector<connection*> _sends_now;
    // The handshake timer (an IORING_OP_TIMEOUT at the earliest deadline).
    __kernel_timespec _handshake_ts{};
    bool _handshake_timer_posted = false;
};

// ---------------------------------------------------------------- ring helpers

io_uring_sqe* event_loop::sqe()
{
    io_uring_sqe* s = io_uring_get_sqe(&_ring);
    while (s == nullptr) {
        io_uring_submit(&_ring);
        s = io_uring_get_sqe(&_ring);
    }
    return s;
}

void event_loop::post_wake_read()
{
    io_uring_sqe* s = sqe();
    io_uring_prep_read(s, _wake_fd, &_wake_value, sizeof _wake_value, 0);
    io_uring_sqe_set_data(s, make_user_data(this, k_token_wake));
}

void event_loop::post_accept(unsigned listener)
{
    io_uring_sqe* s = sqe();
    _accept_len[listener] = sizeof(sockaddr_storage);
    io_uring_prep_accept(s, _srv.listen_fds()[listener],
                         reinterpret_cast<sockaddr*>(&_accept_addr[listener]),
                         &_accept_len[listener], SOCK_CLOEXEC);
    // Listener index in the pointer bits: &_accept_len[listener] is 4-aligned,
    // so use the index shifted instead.
    io_uring_sqe_set_data(s, reinterpret_cast<void*>((uintptr_t{listener} << 2) | k_token_accept));
}

void event_loop::post_recv(connection& c)
{
    if (c.recv_posted || c.read_eof || c.closing) {
        return;
    }
    void* dst;
    size_t len;
    if (c.tls) {
        if (c.pipe.in_end == c.pipe.in.size()) {
            return;  // the session has not consumed what it has
        }
        dst = c.pipe.in.data() + c.pipe.in_end;
        len = c.pipe.in.size() - c.pipe.in_end;
        c.recv_direct = false;
    } else if (c.payload_left >= k_direct_recv && !c.payload_discard && c.rstart == c.rend) {
        dst = c.payload_op->buf + c.payload_pos;
        len = c.payload_left;
        c.recv_direct = true;
    } else {
        if (c.rstart == c.rend) {
            c.rstart = c.rend = 0;
        } else if (c.rstart > 0 && k_recv_buffer - c.rend < k_request_size * 4) {
            std::memmove(c.rbuf, c.rbuf + c.rstart, c.rend - c.rstart);
            c.rend -= c.rstart;
            c.rstart = 0;
        }
        if (c.rend == k_recv_buffer) {
            return;  // full of unparsed bytes: parsing is blocked
        }
        dst = c.rbuf + c.rend;
        len = k_recv_buffer - c.rend;
        c.recv_direct = false;
    }
    io_uring_sqe* s = sqe();
    io_uring_prep_recv(s, c.fd, dst, len, 0);
    io_uring_sqe_set_data(s, make_user_data(&c, k_token_recv));
    c.recv_posted = true;
}

// ---------------------------------------------------------------- loop

void event_loop::run()
{
    // One ring per thread, created on it (SINGLE_ISSUER), with DEFER_TASKRUN
    // where the kernel has it; older kernels get COOP_TASKRUN or nothing.
    io_uring_params p{};
    // TASKRUN_FLAG tells a polling loop that a completion waits to be run.
    const unsigned tries[] = {
        IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_TASKRUN_FLAG,
        IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN,
        IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG, IORING_SETUP_COOP_TASKRUN, 0};
    int rc = -EINVAL;
    for (unsigned flags : tries) {
        p = {};
        p.flags = flags;
        rc = io_uring_queue_init_params(k_ring_entries, &_ring, &p);
        if (rc == 0) {
            _taskrun_flag = (flags & IORING_SETUP_TASKRUN_FLAG) != 0;
            break;
        }
    }
    if (rc != 0) {
        fmt::print(stderr, "nbd: loop {}: io_uring_queue_init: {}\n", _index, std::strerror(-rc));
        std::abort();
    }
    const size_t listeners = _srv.listen_fds().size();
    _accept_addr.resize(listeners);
    _accept_len.resize(listeners);
    post_wake_read();
    if (_index == 0) {
        for (unsigned i = 0; i < listeners; ++i) {
            post_accept(i);
        }
    }

    for (;;) {
        if (_stop.load(std::memory_order_relaxed) && !_stopping) {
            _stopping = true;
            for (connection* c : _conns) {
                begin_close(*c);
            }
            std::vector<connection*> orphans;
            {
                std::lock_guard lock(_inbox_mutex);
                orphans.swap(_inbox);
            }
            for (connection* c : orphans) {
                _conns.push_back(c);
                c->loop = this;
                begin_close(*c);
            }
        }
        uint64_t deferred_wake = UINT64_MAX;
        // Receives held back (coalescing) are posted when their time comes;
        // the loop sleeps no longer than the earliest.
        if (!_deferred.empty()) {
            const uint64_t now = monotonic_ns();
            for (size_t i = 0; i < _deferred.size();) {
                connection* c = _deferred[i];
                if (c->recv_at_ns > now && !c->closing) {
                    deferred_wake = std::min(deferred_wake, c->recv_at_ns);
                    ++i;
                    continue;
                }
                _deferred[i] = _deferred.back();
                _deferred.pop_back();
                c->recv_deferred = false;
                if (c->closing) {
                    maybe_free(*c);
                } else {
                    post_recv(*c);
                }
            }
        }
        if (_stopping && _conns.empty()) {
            break;
        }
        // Device completions, which queue replies.
        // When the device queues next have completions that no new request
        // brings (a completion timer, a throttle): the loop wakes then.
        uint64_t device_wake = deferred_wake;
        bool device_fd = false;  // a queue whose descriptor the ring does not watch
        for (auto& b : _bindings) {
            for (int round = 0; round < 4 && b->queue->process() != 0; ++round) {
            }
            if (b->queue->in_flight() != 0) {
                device_wake = std::min(device_wake, b->queue->next_event_ns());
                const int fd = b->queue->event_fd();
                if (fd >= 0 && !b->event_poll_armed) {
                    // The target completes on its own descriptor: the ring
                    // watches it (multishot), so the loop sleeps until a
                    // completion or a socket event, whichever comes first.
                    io_uring_sqe* s = sqe();
                    io_uring_prep_poll_multishot(s, fd, POLLIN);
                    io_uring_sqe_set_data(s, make_user_data(b.get(), k_token_wake));
                    b->event_poll_armed = true;
                }
                device_fd = device_fd || (fd >= 0 && !b->event_poll_armed);
            }
        }
        while (connection* c = _dirty) {
            _dirty = c->next_dirty;
            c->next_dirty = nullptr;
            c->dirty = false;
            flush(*c);
            maybe_free(*c);
        }
        // A small reply's send on a socket completes while it is submitted,
        // and its completion only gives buffers back: when nothing waits for
        // it, wait for one event more than the sends posted, so that a round
        // trip costs one io_uring_enter (submit the reply, sleep until the
        // next request) instead of two. Should a send not complete inline
        // (the peer does not read), the wait ends after
        // k_inline_send_wait_ns anyway, so that no other event waits longer.
        unsigned wait_nr = 1;
        if (!_sends_now.empty()) {
            bool quiet = true;
            for (const connection* c : _sends_now) {
                quiet = quiet && send_needs_no_wake(*c);
            }
            if (quiet) {
                wait_nr += static_cast<unsigned>(_sends_now.size());
            }
            _sends_now.clear();
        }
        if (device_fd) {
            // The target completes on its own descriptor, which this ring
            // does not watch: look again soon.
            __kernel_timespec ts{0, 20'000};
            io_uring_cqe* cqe = nullptr;
            io_uring_submit_and_wait_timeout(&_ring, &cqe, wait_nr, &ts, nullptr);
        } else if (device_wake != UINT64_MAX) {
            // Sleep until the device's next event, or a socket event first.
            const uint64_t now = monotonic_ns();
            if (device_wake <= now) {
                io_uring_submit(&_ring);
            } else {
                const uint64_t delta = device_wake - now;
                __kernel_timespec ts{static_cast<int64_t>(delta / 1'000'000'000u),
                                     static_cast<long long>(delta % 1'000'000'000u)};
                io_uring_cqe* cqe = nullptr;
                io_uring_submit_and_wait_timeout(&_ring, &cqe, wait_nr, &ts, nullptr);
            }
        } else if (_poll_max_ns != 0) {
            wait_polling(wait_nr);
        } else {
            submit_and_block(wait_nr);
        }
        unsigned head;
        io_uring_cqe* cqe;
        unsigned seen = 0;
        io_uring_for_each_cqe(&_ring, head, cqe)
        {
            ++seen;
            const auto ud = static_cast<uintptr_t>(cqe->user_data);
            const int res = cqe->res;
            switch (static_cast<token>(ud & 3)) {
            case k_token_recv:
                on_recv(*reinterpret_cast<connection*>(ud & ~uintptr_t{3}), res);
                break;
            case k_token_send:
                on_send(*reinterpret_cast<connection*>(ud & ~uintptr_t{3}), res);
                break;
            case k_token_accept: {
                const unsigned listener = static_cast<unsigned>(ud >> 2);
                if (res >= 0) {
                    on_accept(static_cast<int>(listener), res);
                }
                if (!_stopping &&
                    (res >= 0 || res == -EINTR || res == -ECONNABORTED || res == -EMFILE ||
                     res == -ENFILE || res == -ENOBUFS || res == -ENOMEM)) {
                    post_accept(listener);
                }
                break;
            }
            case k_token_wake:
                if ((ud & ~uintptr_t{3}) == reinterpret_cast<uintptr_t>(&_handshake_ts)) {
                    on_handshake_timer();
                    break;
                }
                if (queue_binding* b = binding_at(ud & ~uintptr_t{3})) {
                    // A device queue's descriptor: the loop's next pass
                    // processes the queue. Re-armed there if the kernel
                    // ended the multishot poll.
                    b->event_poll_armed = (cqe->flags & IORING_CQE_F_MORE) != 0;
                    break;
                }
                if ((ud & ~uintptr_t{3}) != reinterpret_cast<uintptr_t>(this)) {
                    break;  // the poll of a binding that is gone
                }
                if (!_stopping) {
                    post_wake_read();
                }
                adopt_inbox();
                if (_check_exports.exchange(false)) {
                    check_exports();
                }
                break;
            }
        }
        io_uring_cq_advance(&_ring, seen);
    }
    // What is still posted (accepts, the wake read) dies with the ring.
    io_uring_queue_exit(&_ring);
    for (auto& b : _bindings) {
        b.reset();
    }
}

void event_loop::adopt_inbox()
{
    std::vector<connection*> in;
    {
        std::lock_guard lock(_inbox_mutex);
        in.swap(_inbox);
    }
    for (connection* c : in) {
        c->loop = this;
        _conns.push_back(c);
        if (_stopping) {
            begin_close(*c);
            maybe_free(*c);
            continue;
        }
        enter_transmission(*c);
    }
}

void event_loop::check_exports()
{
    for (connection* c : _conns) {
        if (c->exp != nullptr && c->exp->removed.load()) {
            begin_close(*c);
        }
    }
    // Connections with nothing posted are freed now.
    std::vector<connection*> copy = _conns;
    for (connection* c : copy) {
        maybe_free(*c);
    }
}

// ---------------------------------------------------------------- connections

void event_loop::on_accept(int listener, int fd)
{
    auto& count = _srv.connection_count();
    if (_stopping || count.load() >= _srv.config().max_connections) {
        ::close(fd);
        return;
    }
    count.fetch_add(1);
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one,
                 sizeof one);  // fails harmlessly on unix sockets
    auto* c = new connection();
    c->loop = this;
    c->fd = fd;
    c->rbuf = static_cast<uint8_t*>(std::aligned_alloc(4096, k_recv_buffer));
    c->hs = std::make_unique<handshake>(_srv, _srv.config().tls);
    c->hs->greet(c->out_bytes);
    if (const uint32_t ms = _srv.config().handshake_timeout_ms; ms != 0) {
        c->handshake_deadline_ns = monotonic_ns() + uint64_t{ms} * 1'000'000u;
        if (!_handshake_timer_posted) {
            post_handshake_timer(c->handshake_deadline_ns);
        }
    }
    _conns.push_back(c);
    mark_dirty(*c);
    post_recv(*c);
}

// Submits what is queued and waits for `wait_nr` completions, first by
// polling the completion ring for up to _poll_ns (which saves the sleep and
// the wake-up, each several microseconds, when the next request is that
// close), then by sleeping. The window adapts as QEMU's event loop does
// (poll-max-ns): it grows while events come within _poll_max_ns of going
// idle, shrinks when they come later. Polled time is CPU time of the loop
// and shows in its utime.
void event_loop::submit_and_block(unsigned wait_nr)
{
    if (wait_nr == 1) {
        io_uring_submit_and_wait(&_ring, 1);
        return;
    }
    __kernel_timespec ts{0, k_inline_send_wait_ns};
    io_uring_cqe* cqe = nullptr;
    io_uring_submit_and_wait_timeout(&_ring, &cqe, wait_nr, &ts, nullptr);
}

void event_loop::wait_polling(unsigned wait_nr)
{
    if (!_taskrun_flag) {
        submit_and_block(wait_nr);
        return;
    }
    const uint64_t start = monotonic_ns();
    if (_poll_ns != 0) {
        io_uring_submit(&_ring);
        uint64_t now = start;
        do {
            if (io_uring_cq_ready(&_ring) >= wait_nr) {
                return;  // found by polling: keep the window
            }
            if ((IO_URING_READ_ONCE(*_ring.sq.kflags) & IORING_SQ_TASKRUN) != 0) {
                io_uring_get_events(&_ring);  // runs the completions, does not sleep
                continue;
            }
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
            now = monotonic_ns();
        } while (now - start < _poll_ns);
    }
    submit_and_block(wait_nr);
    const uint64_t idle = monotonic_ns() - start;
    if (idle > _poll_max_ns) {
        _poll_ns /= 2;  // the next event came late: polling would have been wasted
        if (_poll_ns < 1000) {
            _poll_ns = 0;
        }
    } else if (_poll_ns < _poll_max_ns) {
        _poll_ns = std::min(_poll_max_ns, _poll_ns == 0 ? std::max<uint64_t>(_poll_max_ns / 8, 1000)
                                                        : _poll_ns * 2);
    }
}

void event_loop::post_handshake_timer(uint64_t deadline_ns)
{
    _handshake_ts.tv_sec = static_cast<int64_t>(deadline_ns / 1'000'000'000u);
    _handshake_ts.tv_nsec = static_cast<long long>(deadline_ns % 1'000'000'000u);
    io_uring_sqe* s = sqe();
    io_uring_prep_timeout(s, &_handshake_ts, 0, IORING_TIMEOUT_ABS);
    io_uring_sqe_set_data(s, make_user_data(&_handshake_ts, k_token_wake));
    _handshake_timer_posted = true;
}

// Closes the connections whose handshake outlived handshake_timeout_ms and
// sets the timer for the next deadline. Deadlines grow in accept order, so
// the timer, once set, is never later than a new connection's deadline.
void event_loop::on_handshake_timer()
{
    _handshake_timer_posted = false;
    const uint64_t now = monotonic_ns();
    uint64_t next = 0;
    std::vector<connection*> expired;
    for (connection* c : _conns) {
        if (c->ph == phase::transmission || c->closing || c->handshake_deadline_ns == 0) {
            continue;
        }
        if (c->handshake_deadline_ns <= now) {
            expired.push_back(c);
        } else if (next == 0 || c->handshake_deadline_ns < next) {
            next = c->handshake_deadline_ns;
        }
    }
    for (connection* c : expired) {
        log_client(
            *c, fmt::format("dropped: still in the {} {} ms after it connected (handshake-timeout)",
                            c->ph == phase::tls_handshake ? "TLS handshake" : "NBD handshake",
                            _srv.config().handshake_timeout_ms));
        begin_close(*c);
        maybe_free(*c);
    }
    if (next != 0 && !_stopping) {
        post_handshake_timer(next);
    }
}

void event_loop::mark_dirty(connection& c)
{
    if (!c.dirty) {
        c.dirty = true;
        c.next_dirty = _dirty;
        _dirty = &c;
    }
}

bool event_loop::coalesce_receive(connection& c)
{
    if (_coalesce_ns == 0 || c.ph != phase::transmission || c.recv_posted || c.recv_deferred ||
        c.read_eof || c.closing) {
        return false;
    }
    if (c.payload_left > 0) {
        return false;  // the rest of a write payload is on its way: take it
    }
    // Requests parsed since the last call (pump_input also runs when
    // input unblocks, without a receive).
    const uint64_t got = c.parsed - c.parsed_before;
    c.parsed_before = c.parsed;
    const uint64_t now = monotonic_ns();
    if (c.coalesce == coalesce_phase::off) {
        if (got < 2) {
            return false;  // one request at a time: nothing to gather
        }
        c.coalesce = coalesce_phase::measure_plain;
        c.epoch_start_ns = now;
        c.epoch_requests = 0;
        return false;
    }
    c.epoch_requests += got;
    if (now - c.epoch_start_ns >= k_coalesce_epoch_ns) {
        const uint64_t rate = c.epoch_requests * 1'000'000'000u / (now - c.epoch_start_ns);
        switch (c.coalesce) {
        case coalesce_phase::measure_plain:
            c.rate_plain = rate;
            c.coalesce = coalesce_phase::measure_held;
            break;
        case coalesce_phase::measure_held:
            // Holding back saves wake-ups (CPU); keep it unless it costs
            // more than 2% of the requests.
            c.coalesce_wins = rate * 100 >= c.rate_plain * 98;
            c.coalesce = coalesce_phase::exploit;
            c.exploit_left = k_coalesce_exploit_epochs;
            break;
        case coalesce_phase::exploit:
        case coalesce_phase::off:
            if (--c.exploit_left == 0) {
                // Measure again, or stop if the client no longer pipelines.
                c.coalesce = c.epoch_requests < k_coalesce_idle_requests
                                 ? coalesce_phase::off
                                 : coalesce_phase::measure_plain;
            }
            break;
        }
        c.epoch_start_ns = now;
        c.epoch_requests = 0;
    }
    const bool hold = c.coalesce == coalesce_phase::measure_held ||
                      (c.coalesce == coalesce_phase::exploit && c.coalesce_wins);
    if (!hold) {
        return false;
    }
    c.recv_deferred = true;
    c.recv_at_ns = now + _coalesce_ns;
    _deferred.push_back(&c);
    return true;
}

void event_loop::on_recv(connection& c, int res)
{
    c.recv_posted = false;
    if (res <= 0) {
        if (res == -EINTR || res == -EAGAIN) {
            post_recv(c);
            return;
        }
        c.read_eof = true;
        begin_close(c);
        maybe_free(c);
        return;
    }
    const auto n = static_cast<size_t>(res);
    if (c.tls) {
        c.pipe.in_end += n;
    } else if (c.recv_direct) {
        c.recv_direct = false;
        c.payload_pos += static_cast<uint32_t>(n);
        c.payload_left -= n;
    } else {
        c.rend += n;
    }
    pump_input(c);
    maybe_free(c);
}

// Moves plain text from the socket (or the TLS session) into the parser
// until it needs more bytes than are there or is blocked.
void event_loop::pump_input(connection& c)
{
    for (;;) {
        if (c.closing || c.close_after_send) {
            return;
        }
        if (c.ph == phase::tls_handshake) {
            run_tls_handshake(c);
            if (c.closing || c.close_after_send) {
                return;
            }
            if (c.ph == phase::tls_handshake) {
                post_recv(c);
                return;
            }
            continue;
        }
        if (!parse_input(c)) {
            return;  // blocked, handed off or closing
        }
        if (c.ph == phase::tls_handshake) {
            continue;  // STARTTLS: the session takes over the input
        }
        if (!c.tls) {
            if (!coalesce_receive(c)) {
                post_recv(c);
            }
            return;
        }
        // TLS: decrypt into the same place a plain recv would target.
        uint8_t* dst;
        size_t len;
        bool direct = false;
        if (c.payload_left >= k_direct_recv && !c.payload_discard && c.rstart == c.rend) {
            dst = c.payload_op->buf + c.payload_pos;
            len = c.payload_left;
            direct = true;
        } else {
            if (c.rstart == c.rend) {
                c.rstart = c.rend = 0;
            } else if (c.rstart > 0) {
                std::memmove(c.rbuf, c.rbuf + c.rstart, c.rend - c.rstart);
                c.rend -= c.rstart;
                c.rstart = 0;
            }
            if (c.rend == k_recv_buffer) {
                return;
            }
            dst = c.rbuf + c.rend;
            len = k_recv_buffer - c.rend;
        }
        const ssize_t n = gnutls_record_recv(c.session, dst, len);
        if (n == GNUTLS_E_AGAIN || n == GNUTLS_E_INTERRUPTED) {
            post_recv(c);
            return;
        }
        if (n <= 0) {
            c.read_eof = true;
            begin_close(c);
            return;
        }
        if (!c.pipe.out.empty()) {
            mark_dirty(c);  // the session had something to say (key update)
        }
        if (direct) {
            c.payload_pos += static_cast<uint32_t>(n);
            c.payload_left -= static_cast<uint64_t>(n);
        } else {
            c.rend += static_cast<size_t>(n);
        }
    }
}

bool event_loop::parse_input(connection& c)
{
    if (c.ph == phase::handshake) {
        return parse_handshake(c);
    }
    return parse_requests(c);
}

bool event_loop::parse_handshake(connection& c)
{
    std::vector<uint8_t> plain;
    const handshake_step step =
        c.hs->feed({c.rbuf + c.rstart, c.rend - c.rstart}, c.tls ? plain : c.out_bytes);
    c.rstart += step.consumed;
    if (c.tls && !plain.empty()) {
        // Options after STARTTLS are answered inside the session.
        size_t off = 0;
        while (off < plain.size()) {
            const ssize_t w = gnutls_record_send(c.session, plain.data() + off, plain.size() - off);
            if (w == GNUTLS_E_AGAIN || w == GNUTLS_E_INTERRUPTED) {
                continue;
            }
            if (w < 0) {
                begin_close(c);
                return false;
            }
            off += static_cast<size_t>(w);
        }
    }
    switch (step.action) {
    case handshake_action::need_more:
        mark_dirty(c);
        return true;
    case handshake_action::close:
        mark_dirty(c);
        begin_close(c, true);
        return false;
    case handshake_action::start_tls: {
        const tls_credentials* creds = _srv.tls();
        c.pipe.in.resize(k_tls_in_buffer);
        // The client may already have sent its first TLS bytes.
        const size_t early = c.rend - c.rstart;
        if (early > c.pipe.in.size()) {
            begin_close(c);
            return false;
        }
        std::memcpy(c.pipe.in.data(), c.rbuf + c.rstart, early);
        c.pipe.in_start = 0;
        c.pipe.in_end = early;
        c.rstart = c.rend = 0;
        // The ACK goes out in clear before anything the session writes.
        c.session = creds != nullptr ? creds->new_session(c.pipe) : nullptr;
        if (c.session == nullptr) {
            begin_close(c);
            return false;
        }
        c.tls = true;
        c.ph = phase::tls_handshake;
        mark_dirty(c);
        return true;
    }
    case handshake_action::transmission:
        c.neg = c.hs->result();
        c.hs.reset();
        c.exp = const_cast<server_export*>(static_cast<const server_export*>(c.neg.exp.get()));
        c.exp->connections.fetch_add(1);
        c.counted = true;
        if (c.exp->removed.load()) {
            begin_close(c);
            return false;
        }
        c.ph = phase::transmission;
        mark_dirty(c);
        {
            // Loop i drives queue i; a device with fewer queues than loops
            // is served by its first loops only.
            const unsigned queues = c.exp->dev->info().queues.submit_queues;
            const unsigned serving = std::min(queues, _srv.loop_count());
            unsigned target = _index;
            if (_index >= serving) {
                static std::atomic<unsigned> spread{0};
                target = spread.fetch_add(1) % serving;
            } else if (serving > 1) {
                static std::atomic<unsigned> spread{0};
                target = spread.fetch_add(1) % serving;
            }
            if (target != _index) {
                c.handoff = true;
                c.handoff_to = target;
                return false;
            }
        }
        enter_transmission(c);
        return !c.closing;
    }
    return false;
}

void event_loop::run_tls_handshake(connection& c)
{
    const int rc = gnutls_handshake(c.session);
    mark_dirty(c);  // whatever it wrote goes out
    if (rc == GNUTLS_E_SUCCESS) {
        if (std::string why = _srv.tls()->check_peer(c.session); !why.empty()) {
            log_client(c, fmt::format("refused after the TLS handshake: {}", why));
            gnutls_alert_send(c.session, GNUTLS_AL_FATAL, GNUTLS_A_BAD_CERTIFICATE);
            begin_close(c, true);
            return;
        }
        c.hs->tls_established();
        c.ph = phase::handshake;
        return;
    }
    if (rc == GNUTLS_E_AGAIN || rc == GNUTLS_E_INTERRUPTED || gnutls_error_is_fatal(rc) == 0) {
        return;
    }
    // Tell the client why (an alert), then hang up once that is sent.
    log_client(c, fmt::format("TLS handshake failed: {}",
                              tls_credentials::describe_failure(c.session, rc)));
    gnutls_alert_send_appropriate(c.session, rc);
    begin_close(c, true);
}

void event_loop::log_client(const connection& c, const std::string& what)
{
    fmt::print(stderr, "nbd: client {}: {}\n", peer_name(c.fd), what);
}

void event_loop::enter_transmission(connection& c)
{
    c.binding = bind(*c.exp);
    if (c.binding == nullptr) {
        begin_close(c);
        return;
    }
    c.ops.resize(k_max_ops);
    c.free_ops.reserve(k_max_ops);
    for (unsigned i = k_max_ops; i > 0; --i) {
        c.ops[i - 1].conn = &c;
        c.free_ops.push_back(&c.ops[i - 1]);
    }
    mark_dirty(c);
    pump_input(c);
}

queue_binding* event_loop::bind(server_export& exp)
{
    for (auto& b : _bindings) {
        if (b->exp.get() == &exp) {
            ++b->users;
            return b.get();
        }
    }
    if (_index >= exp.dev->queue_count()) {
        return nullptr;
    }
    auto b = std::make_unique<queue_binding>();
    // Keep the export alive while this loop holds its queue.
    {
        auto shared = _srv.find(exp.name);
        b->exp = std::const_pointer_cast<server_export>(
            std::static_pointer_cast<const server_export>(shared));
    }
    if (!b->exp || b->exp.get() != &exp) {
        return nullptr;
    }
    b->queue = &exp.dev->queue(_index);
    b->users = 1;
    _bindings.push_back(std::move(b));
    return _bindings.back().get();
}

queue_binding* event_loop::binding_at(uintptr_t address) const
{
    for (const auto& b : _bindings) {
        if (reinterpret_cast<uintptr_t>(b.get()) == address) {
            return b.get();
        }
    }
    return nullptr;
}

void event_loop::unbind(queue_binding* b)
{
    if (--b->users != 0) {
        return;
    }
    assert(b->queue->in_flight() == 0);
    if (b->event_poll_armed) {
        // Both completions (the removal's and the poll's last) find no
        // binding at this address and are dropped.
        io_uring_sqe* s = sqe();
        io_uring_prep_poll_remove(s, reinterpret_cast<uint64_t>(make_user_data(b, k_token_wake)));
        io_uring_sqe_set_data(s, make_user_data(b, k_token_wake));
    }
    for (auto it = _bindings.begin(); it != _bindings.end(); ++it) {
        if (it->get() == b) {
            _bindings.erase(it);
            return;
        }
    }
}

void event_loop::begin_close(connection& c, bool graceful)
{
    if (c.closing) {
        return;
    }
    if (graceful && !c.read_eof && (c.send_posted || !c.out_bytes.empty() || !c.pipe.out.empty())) {
        // Say the last word (an option's reply) first.
        c.close_after_send = true;
        c.input_blocked = true;
        mark_dirty(c);
        return;
    }
    c.closing = true;
    // Wakes a posted recv (and fails a posted send) so that nothing of this
    // connection stays in the ring.
    ::shutdown(c.fd, SHUT_RDWR);
}

void event_loop::maybe_free(connection& c)
{
    if (c.handoff && !c.recv_posted && !c.send_posted && !c.closing) {
        // Move to the loop that drives the device's queue.
        c.handoff = false;
        if (c.dirty) {
            // Unlink from the flush list.
            connection** p = &_dirty;
            while (*p != nullptr && *p != &c) {
                p = &(*p)->next_dirty;
            }
            if (*p == &c) {
                *p = c.next_dirty;
            }
            c.dirty = false;
            c.next_dirty = nullptr;
        }
        if (!c.out_bytes.empty()) {
            // The GO reply must leave first: keep it here until sent.
            c.handoff = true;
            mark_dirty(c);
            return;
        }
        std::erase(_conns, &c);
        _srv.loop(c.handoff_to).adopt(&c);
        return;
    }
    if (!c.closing || c.recv_posted || c.recv_deferred || c.send_posted || c.ops_in_device != 0) {
        return;
    }
    if (c.dirty) {
        return;  // freed from the flush pass, after its unlink
    }
    // Ops still queued for sending belong to this connection: release them.
    while (nbd_op* o = c.replies.pop()) {
        release_op(*o);
    }
    for (unsigned i = c.iov_first; i < c.iov_count; ++i) {
        if (c.iov_op[i] != nullptr) {
            release_op(*c.iov_op[i]);
        }
    }
    if (c.payload_op != nullptr) {
        release_op(*c.payload_op);
        c.payload_op = nullptr;
    }
    if (c.binding != nullptr) {
        unbind(c.binding);
        c.binding = nullptr;
    }
    if (c.session != nullptr) {
        gnutls_deinit(c.session);
    }
    ::close(c.fd);
    std::free(c.rbuf);
    std::erase(_conns, &c);
    server_export* exp = c.counted ? c.exp : nullptr;
    delete &c;
    _srv.connection_count().fetch_sub(1);
    if (exp != nullptr) {
        _srv.connection_closed(*exp);
    }
}

// ---------------------------------------------------------------- output

void event_loop::flush(connection& c)
{
    if (c.send_posted || c.fd < 0) {
        return;
    }
    if (c.closing) {
        return;
    }
    if (c.tls && c.ph == phase::transmission && !c.replies.empty()) {
        // Encrypt every waiting reply into one batch of records.
        gnutls_record_cork(c.session);
        while (nbd_op* o = c.replies.pop()) {
            auto send_all = [&](const uint8_t* p, size_t n) {
                while (n > 0) {
                    const ssize_t w = gnutls_record_send(c.session, p, n);
                    if (w == GNUTLS_E_AGAIN || w == GNUTLS_E_INTERRUPTED) {
                        continue;
                    }
                    if (w < 0) {
                        return false;
                    }
                    p += w;
                    n -= static_cast<size_t>(w);
                }
                return true;
            };
            bool ok = send_all(o->hdr, o->hdr_len);
            if (ok && o->data_len != 0) {
                ok = send_all(o->buf, o->data_len);
            }
            if (ok && !o->extra.empty()) {
                ok = send_all(o->extra.data(), o->extra.size());
            }
            release_op(*o);
            if (!ok) {
                begin_close(c);
                return;
            }
        }
        while (gnutls_record_uncork(c.session, GNUTLS_RECORD_WAIT) == GNUTLS_E_AGAIN) {
        }
    }
    if (c.tls && !c.pipe.out.empty()) {
        c.out_bytes.insert(c.out_bytes.end(), c.pipe.out.begin(), c.pipe.out.end());
        c.pipe.out.clear();
    }
    if (!c.out_bytes.empty()) {
        c.out_inflight.swap(c.out_bytes);
        c.out_bytes.clear();
        c.iov[0] = {c.out_inflight.data(), c.out_inflight.size()};
        c.iov_op[0] = nullptr;
        c.iov_first = 0;
        c.iov_count = 1;
    } else if (!c.tls && c.iov_count == 0) {
        unsigned n = 0;
        while (!c.replies.empty() && n + 3 <= k_max_iov) {
            nbd_op* o = c.replies.pop();
            c.iov[n] = {o->hdr, o->hdr_len};
            c.iov_op[n] = nullptr;
            ++n;
            if (o->data_len != 0) {
                c.iov[n] = {o->buf, o->data_len};
                c.iov_op[n] = nullptr;
                ++n;
            }
            if (!o->extra.empty()) {
                c.iov[n] = {o->extra.data(), o->extra.size()};
                c.iov_op[n] = nullptr;
                ++n;
            }
            c.iov_op[n - 1] = o;
        }
        c.iov_first = 0;
        c.iov_count = n;
    }
    if (c.iov_first < c.iov_count) {
        post_send(c);
    } else if (c.close_after_send) {
        begin_close(c);
    }
}

void event_loop::post_send(connection& c)
{
    c.msg = {};
    c.msg.msg_iov = c.iov + c.iov_first;
    c.msg.msg_iovlen = c.iov_count - c.iov_first;
    c.send_bytes = 0;
    for (unsigned i = c.iov_first; i < c.iov_count; ++i) {
        c.send_bytes += c.iov[i].iov_len;
    }
    io_uring_sqe* s = sqe();
    // MSG_WAITALL: io_uring completes the send once all of it is out (it
    // waits for room itself), so a completion never leaves a tail to post.
    io_uring_prep_sendmsg(s, c.fd, &c.msg, MSG_NOSIGNAL | MSG_WAITALL);
    io_uring_sqe_set_data(s, make_user_data(&c, k_token_send));
    c.send_posted = true;
    _sends_now.push_back(&c);
}

// True when the completion of `c`'s posted send only gives its buffers back:
// nothing else (input blocked on it, a close, a hand-off, replies beyond what
// one send takes) waits for it, and the connection's next request will wake
// the loop through its posted recv.
bool event_loop::send_needs_no_wake(const connection& c)
{
    return c.ph == phase::transmission && !c.tls && c.send_bytes <= k_inline_send &&
           c.recv_posted && !c.input_blocked && !c.close_after_send && !c.handoff && !c.disc &&
           !c.closing && c.replies.empty() && c.out_bytes.empty();
}

void event_loop::on_send(connection& c, int res)
{
    c.send_posted = false;
    if (res < 0) {
        if (res == -EINTR || res == -EAGAIN) {
            post_send(c);
            return;
        }
        c.read_eof = true;  // nothing more can go out
        begin_close(c);
        // Ops of the failed batch are released by maybe_free.
        maybe_free(c);
        return;
    }
    auto left = static_cast<size_t>(res);
    while (c.iov_first < c.iov_count) {
        iovec& v = c.iov[c.iov_first];
        if (left < v.iov_len) {
            v.iov_base = static_cast<uint8_t*>(v.iov_base) + left;
            v.iov_len -= left;
            break;
        }
        left -= v.iov_len;
        if (c.iov_op[c.iov_first] != nullptr) {
            release_op(*c.iov_op[c.iov_first]);
            c.iov_op[c.iov_first] = nullptr;
        }
        ++c.iov_first;
    }
    if (c.iov_first == c.iov_count) {
        c.iov_first = c.iov_count = 0;
        c.out_inflight.clear();
        if (c.disc && c.ops_in_device == 0 && c.replies.empty() && c.out_bytes.empty() &&
            c.free_ops.size() == k_max_ops) {
            begin_close(c);
        }
    }
    if (c.iov_first < c.iov_count) {
        post_send(c);
    } else {
        mark_dirty(c);
    }
    if (c.input_blocked && !c.closing) {
        c.input_blocked = false;
        pump_input(c);
    }
    maybe_free(c);
}

// ---------------------------------------------------------------- requests

nbd_op* event_loop::take_op(connection& c)
{
    nbd_op* o = c.free_ops.back();
    c.free_ops.pop_back();
    o->error = 0;
    o->pending = 0;
    o->left_to_submit = 0;
    o->data_len = 0;
    o->hdr_len = 0;
    o->extra.clear();
    o->in_device = false;
    o->waiting = false;
    return o;
}

void event_loop::release_op(nbd_op& o)
{
    connection& c = *o.conn;
    if (o.buf != nullptr) {
        c.buffered -= uint64_t{4096} << o.buf_class;
        _pool.put(o.buf, o.buf_class);
        o.buf = nullptr;
    }
    c.free_ops.push_back(&o);
}

void event_loop::reply_error(connection& c, const request_header& h, uint32_t error)
{
    nbd_op* o = take_op(c);
    o->h = h;
    o->error = 0;
    if (c.neg.structured_replies && (h.type == k_cmd_read || h.type == k_cmd_block_status)) {
        o->hdr_len = static_cast<uint8_t>(encode_error_chunk(o->hdr, h.cookie, error));
    } else {
        o->hdr_len = static_cast<uint8_t>(encode_simple_reply(o->hdr, h.cookie, error));
    }
    c.replies.push(o);
    mark_dirty(c);
}

bool event_loop::parse_requests(connection& c)
{
    for (;;) {
        const size_t avail = c.rend - c.rstart;
        if (c.payload_left > 0) {
            if (avail == 0) {
                return true;
            }
            const size_t n = std::min<uint64_t>(avail, c.payload_left);
            if (!c.payload_discard) {
                std::memcpy(c.payload_op->buf + c.payload_pos, c.rbuf + c.rstart, n);
                c.payload_pos += static_cast<uint32_t>(n);
            }
            c.rstart += n;
            c.payload_left -= n;
        }
        if (c.payload_left == 0 && c.payload_op != nullptr) {
            nbd_op* o = c.payload_op;
            c.payload_op = nullptr;
            start_op(*o);
            if (c.closing) {
                return false;
            }
        }
        if (c.payload_left > 0) {
            continue;
        }
        c.payload_discard = false;
        if (c.disc) {
            c.rstart = c.rend;  // nothing after DISC counts
            return false;
        }
        if (c.rend - c.rstart < k_request_size) {
            return true;
        }
        if (c.free_ops.empty() || c.buffered > k_max_buffered) {
            c.input_blocked = true;
            return false;
        }
        request_header h;
        if (!parse_request(c.rbuf + c.rstart, h)) {
            begin_close(c);  // out of sync: nothing else is safe
            return false;
        }
        c.rstart += k_request_size;
        ++c.parsed;
        const request_check check = check_request(h, c.neg);
        switch (check.disposition) {
        case request_disposition::disconnect:
            if (h.type == k_cmd_disc) {
                c.disc = true;
                mark_dirty(c);
                if (c.ops_in_device == 0 && c.replies.empty() && !c.send_posted &&
                    c.free_ops.size() == k_max_ops) {
                    begin_close(c);
                }
            } else {
                begin_close(c);
            }
            return false;
        case request_disposition::error:
            reply_error(c, h, check.error);
            if (check.payload != 0) {
                c.payload_left = check.payload;
                c.payload_discard = true;
            }
            continue;
        case request_disposition::execute:
            break;
        }
        nbd_op* o = take_op(c);
        o->h = h;
        if (h.type == k_cmd_read || h.type == k_cmd_write) {
            o->buf = _pool.get(h.length, o->buf_class);
            if (o->buf != nullptr) {
                c.buffered += uint64_t{4096} << o->buf_class;
            } else {
                release_op(*o);
                reply_error(c, h, k_enomem);
                if (h.type == k_cmd_write) {
                    c.payload_left = h.length;
                    c.payload_discard = true;
                }
                continue;
            }
        }
        if (h.type == k_cmd_write) {
            c.payload_op = o;
            c.payload_pos = 0;
            c.payload_left = h.length;
            continue;
        }
        start_op(*o);
        if (c.closing) {
            return false;
        }
    }
}

void event_loop::start_op(nbd_op& o)
{
    connection& c = *o.conn;
    const block_limits& lim = c.exp->dev->limits();
    const request_header& h = o.h;
    o.dev_flags = (h.flags & k_cmd_flag_fua) != 0 ? uint32_t{k_io_fua} : 0u;
    o.next_offset = h.offset;
    o.left_to_submit = h.length;
    switch (h.type) {
    case k_cmd_read:
        o.dev_op = io_op::read;
        o.chunk_max = lim.max_transfer_bytes;
        o.dev_flags = 0;
        break;
    case k_cmd_write:
        o.dev_op = io_op::write;
        o.chunk_max = lim.max_transfer_bytes;
        break;
    case k_cmd_flush:
        o.dev_op = io_op::flush;
        o.chunk_max = 0;
        o.left_to_submit = 1;  // one request of length 0
        break;
    case k_cmd_trim:
        o.dev_op = io_op::discard;
        o.chunk_max = lim.max_discard_bytes;
        break;
    case k_cmd_write_zeroes:
        if (lim.max_write_zeroes_bytes != 0) {
            o.dev_op = io_op::write_zeroes;
            o.chunk_max = lim.max_write_zeroes_bytes;
            if ((h.flags & k_cmd_flag_no_hole) != 0) {
                o.dev_flags |= k_io_no_unmap;
            }
            if ((h.flags & k_cmd_flag_fast_zero) != 0) {
                o.dev_flags |= k_io_fast_zero;
            }
        } else if ((h.flags & k_cmd_flag_fast_zero) != 0) {
            // Zeroing would mean writing zero buffers: not fast.
            o.error = -EOPNOTSUPP;
            o.left_to_submit = 0;
        } else {
            // The device has no write zeroes: write zeros (which also
            // keeps the blocks allocated, as NO_HOLE asks).
            o.dev_op = io_op::write;
            o.chunk_max =
                std::min(lim.max_transfer_bytes != 0 ? lim.max_transfer_bytes : k_zero_buffer,
                         k_zero_buffer);
        }
        break;
    case k_cmd_cache:
        // Advisory prefetch: the memory and null targets have nothing to
        // bring in, and the range was checked. Nothing to do.
        o.left_to_submit = 0;
        break;
    case k_cmd_block_status:
        block_status(o);
        o.left_to_submit = 0;
        break;
    default:
        o.error = -EINVAL;
        o.left_to_submit = 0;
        break;
    }
    if (o.chunk_max != 0) {
        o.chunk_max -= o.chunk_max % lim.logical_block_size;
    }
    if (o.left_to_submit == 0) {
        finish_op(o);
        return;
    }
    o.in_device = true;
    ++c.ops_in_device;
    submit_chunks(o, nullptr);
}

bool event_loop::fill_chunk(nbd_op& o, io_request& r)
{
    if (o.left_to_submit == 0) {
        return false;
    }
    uint32_t len;
    if (o.dev_op == io_op::flush) {
        len = 0;
        o.left_to_submit = 0;
    } else {
        len = static_cast<uint32_t>(o.chunk_max != 0
                                        ? std::min<uint64_t>(o.left_to_submit, o.chunk_max)
                                        : o.left_to_submit);
        o.left_to_submit -= len;
    }
    r.op = o.dev_op;
    r.flags = o.dev_flags;
    r.offset = o.next_offset;
    r.length = len;
    if (o.buf != nullptr) {
        r.buffer = o.buf + (o.next_offset - o.h.offset);
    } else if (o.dev_op == io_op::write) {
        r.buffer = const_cast<uint8_t*>(zero_buffer());
    } else {
        r.buffer = nullptr;
    }
    o.next_offset += len;
    r.on_complete = &event_loop::on_device_complete;
    r.user_data = &o;
    ++o.pending;
    return true;
}

void event_loop::submit_chunks(nbd_op& o, io_request* reuse)
{
    io_queue& q = *o.conn->binding->queue;
    o.submitting = true;
    if (reuse != nullptr) {
        if (fill_chunk(o, *reuse)) {
            q.submit(*reuse);
        }
    }
    while (o.left_to_submit != 0 && o.error == 0) {
        io_request* r = q.get_request();
        if (r == nullptr) {
            if (!o.waiting) {
                o.waiting = true;
                o.conn->binding->waiting.push(&o);
            }
            break;
        }
        fill_chunk(o, *r);
        q.submit(*r);
    }
    o.submitting = false;
    if (o.pending == 0 && (o.left_to_submit == 0 || o.error != 0)) {
        finish_op(o);
    }
}

void event_loop::on_device_complete(io_request& r, int result)
{
    nbd_op& o = *static_cast<nbd_op*>(r.user_data);
    connection& c = *o.conn;
    event_loop& self = *c.loop;
    --o.pending;
    if (result < 0 && o.error == 0) {
        o.error = result;
    }
    if (o.submitting) {
        return;  // submit_chunks looks at the op when it is done
    }
    queue_binding& b = *c.binding;
    if (o.error == 0 && o.left_to_submit != 0) {
        // Reuse the tag for the next chunk of the same request.
        self.submit_chunks(o, &r);
        return;
    }
    if (o.pending == 0) {
        self.finish_op(o);
    }
    // Give the tag to a request that waits for one.
    if (nbd_op* w = b.waiting.pop()) {
        w->waiting = false;
        if (w->error != 0) {
            if (w->pending == 0) {
                w->conn->loop->finish_op(*w);
            }
        } else {
            self.submit_chunks(*w, &r);
        }
    }
}

void event_loop::finish_op(nbd_op& o)
{
    connection& c = *o.conn;
    if (o.in_device) {
        o.in_device = false;
        --c.ops_in_device;
    }
    const request_header& h = o.h;
    if (o.error != 0) {
        const uint32_t err = nbd_error_from_errno(o.error);
        if (o.buf != nullptr) {
            c.buffered -= uint64_t{4096} << o.buf_class;
            _pool.put(o.buf, o.buf_class);
            o.buf = nullptr;
        }
        o.extra.clear();
        o.data_len = 0;
        if (c.neg.structured_replies && (h.type == k_cmd_read || h.type == k_cmd_block_status)) {
            o.hdr_len = static_cast<uint8_t>(encode_error_chunk(o.hdr, h.cookie, err));
        } else {
            o.hdr_len = static_cast<uint8_t>(encode_simple_reply(o.hdr, h.cookie, err));
        }
    } else if (h.type == k_cmd_read) {
        if (c.neg.structured_replies) {
            o.hdr_len =
                static_cast<uint8_t>(encode_read_chunk(o.hdr, h.cookie, h.offset, h.length, true));
        } else {
            o.hdr_len = static_cast<uint8_t>(encode_simple_reply(o.hdr, h.cookie, 0));
        }
        o.data_len = h.length;
    } else if (h.type == k_cmd_block_status) {
        o.hdr_len = 0;  // the whole chunk is in `extra`
    } else {
        o.hdr_len = static_cast<uint8_t>(encode_simple_reply(o.hdr, h.cookie, 0));
        if (o.buf != nullptr) {
            c.buffered -= uint64_t{4096} << o.buf_class;
            _pool.put(o.buf, o.buf_class);
            o.buf = nullptr;
        }
    }
    if (c.closing) {
        release_op(o);
        maybe_free(c);
        return;
    }
    queue_reply(o);
}

void event_loop::queue_reply(nbd_op& o)
{
    connection& c = *o.conn;
    c.replies.push(&o);
    mark_dirty(c);
}

void event_loop::block_status(nbd_op& o)
{
    connection& c = *o.conn;
    const request_header& h = o.h;
    auto map = c.exp->dev->map(h.offset, h.length);
    if (!map) {
        o.error = -EIO;
        return;
    }
    std::vector<status_extent> out;
    const uint64_t end = h.offset + h.length;
    uint64_t pos = h.offset;
    for (const extent& x : *map) {
        const uint64_t xs = std::max(x.offset, pos);
        const uint64_t xe = std::min(x.offset + x.length, end);
        if (xe <= xs) {
            continue;
        }
        if (xs != pos) {
            break;  // a gap: report what is contiguous from the start
        }
        uint32_t flags = 0;
        if (!x.allocated) {
            flags |= k_state_hole | k_state_zero;
        } else if (x.zero) {
            flags |= k_state_zero;
        }
        const auto len = static_cast<uint32_t>(xe - xs);
        if (!out.empty() && out.back().flags == flags) {
            out.back().length += len;
        } else {
            out.push_back({len, flags});
        }
        pos = xe;
        if ((h.flags & k_cmd_flag_req_one) != 0 && out.size() == 1 && pos < end) {
            // Keep merging the first run only.
            continue;
        }
    }
    if (out.empty()) {
        o.error = -EIO;
        return;
    }
    if ((h.flags & k_cmd_flag_req_one) != 0) {
        out.resize(1);
    }
    encode_block_status(o.extra, h.cookie, k_base_allocation_id, out);
}

// ---------------------------------------------------------------- server

namespace {

result<int> listen_unix(const std::string& path)
{
    sockaddr_un addr{};
    if (path.size() >= sizeof addr.sun_path) {
        return make_error(ENAMETOOLONG, fmt::format("socket={}: longer than {} bytes", path,
                                                    sizeof addr.sun_path - 1));
    }
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return make_error(errno, fmt::format("socket: {}", std::strerror(errno)));
    }
    // A socket left by a crashed server: replace it only if nobody listens.
    struct stat st;
    if (::lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) {
        const int probe = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        const bool alive = ::connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
        ::close(probe);
        if (alive) {
            ::close(fd);
            return make_error(EADDRINUSE,
                              fmt::format("socket={}: another server listens there", path));
        }
        ::unlink(path.c_str());
    }
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        ::listen(fd, 1024) != 0) {
        const int e = errno;
        ::close(fd);
        return make_error(e, fmt::format("socket={}: {}", path, std::strerror(e)));
    }
    return fd;
}

result<int> listen_tcp(const std::string& host, uint16_t port, uint16_t& bound)
{
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    addrinfo* list = nullptr;
    const std::string service = std::to_string(port);
    const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &list);
    if (rc != 0) {
        return make_error(EINVAL, fmt::format("tcp={}:{}: {}", host, port, gai_strerror(rc)));
    }
    int fd = -1;
    int err = 0;
    for (addrinfo* a = list; a != nullptr; a = a->ai_next) {
        fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        const int one = 1;
        ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 1024) == 0) {
            break;
        }
        err = errno;
        ::close(fd);
        fd = -1;
    }
    ::freeaddrinfo(list);
    if (fd < 0) {
        return make_error(err, fmt::format("tcp={}:{}: {}", host, port, std::strerror(err)));
    }
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
    bound = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                           : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
    return fd;
}

}  // namespace

server::server(const server_config& config) : _config(config)
{
}

server::~server()
{
    stop();
}

result<std::shared_ptr<server>> server::start(const server_config& config)
{
    std::shared_ptr<server> s(new server(config));
    if (config.threads == 0) {
        return make_error(EINVAL, "threads=0: need at least one loop thread");
    }
    if (config.tls != tls_mode::off) {
        auto creds = tls_credentials::load(config.tls_certs_dir, config.tls_psk_file,
                                           config.tls_verify_peer);
        if (!creds) {
            return std::unexpected(creds.error());
        }
        s->_tls = *creds;
    }
    if (config.socket_path.empty() && config.tcp_host.empty()) {
        return make_error(EINVAL, "nbd: neither a unix socket nor tcp= to listen on");
    }
    if (!config.socket_path.empty()) {
        auto fd = listen_unix(config.socket_path);
        if (!fd) {
            return std::unexpected(fd.error());
        }
        s->_listen_fds.push_back(*fd);
    }
    if (!config.tcp_host.empty()) {
        auto fd = listen_tcp(config.tcp_host, config.tcp_port, s->_bound_tcp_port);
        if (!fd) {
            s->stop();
            return std::unexpected(fd.error());
        }
        s->_listen_fds.push_back(*fd);
    }
    for (unsigned i = 0; i < config.threads; ++i) {
        auto loop = std::make_unique<event_loop>(*s, i);
        if (auto r = loop->init(); !r) {
            s->stop();
            return std::unexpected(r.error());
        }
        s->_loops.push_back(std::move(loop));
    }
    for (unsigned i = 0; i < config.threads; ++i) {
        s->_threads.emplace_back([srv = s.get(), i] {
            // Signals belong to the program's main thread.
            sigset_t all;
            sigfillset(&all);
            pthread_sigmask(SIG_BLOCK, &all, nullptr);
            srv->_loops[i]->run();
        });
    }
    return s;
}

void server::stop()
{
    if (_stopped) {
        return;
    }
    _stopped = true;
    for (auto& l : _loops) {
        l->request_stop();
    }
    for (auto& t : _threads) {
        t.join();
    }
    _threads.clear();
    _loops.clear();
    for (int fd : _listen_fds) {
        ::close(fd);
    }
    _listen_fds.clear();
    if (!_config.socket_path.empty()) {
        ::unlink(_config.socket_path.c_str());
    }
}

result<void> server::add_export(device& dev, bool read_only, std::string description)
{
    const device_info& info = dev.info();
    const block_limits& lim = info.limits;
    if (lim.zoned) {
        return make_error(EOPNOTSUPP,
                          fmt::format("{}: zoned devices cannot be exported over NBD, which has "
                                      "no zone commands",
                                      info.name));
    }
    auto e = std::make_shared<server_export>();
    e->name = info.name;
    e->description = description.empty() ? fmt::format("softblk {} device", info.target_type)
                                         : std::move(description);
    e->size = lim.capacity_bytes;
    e->min_block = lim.logical_block_size;
    e->preferred_block = std::max<uint32_t>(lim.physical_block_size, 4096);
    e->max_block = 32u << 20;
    e->read_only = read_only || lim.read_only;
    e->rotational = lim.rotational;
    e->can_trim = lim.max_discard_bytes != 0;
    // Every connection reaches the same device object, whose flush covers
    // what any queue wrote and whose data any queue reads back: a flush
    // on one connection serves all of them.
    e->can_multi_conn = true;
    e->dev = &dev;
    std::lock_guard lock(_mutex);
    if (_exports.count(e->name) != 0) {
        return make_error(EEXIST, fmt::format("{}: already exported on this NBD server", e->name));
    }
    _exports.emplace(e->name, std::move(e));
    return {};
}

result<void> server::remove_export(const std::string& name)
{
    std::shared_ptr<server_export> e;
    {
        std::lock_guard lock(_mutex);
        auto it = _exports.find(name);
        if (it == _exports.end()) {
            return make_error(ENOENT, fmt::format("{}: not exported on this NBD server", name));
        }
        e = it->second;
        _exports.erase(it);
    }
    e->removed.store(true);
    for (auto& l : _loops) {
        l->drop_export();
    }
    std::unique_lock lock(_mutex);
    _closed.wait(lock, [&] { return e->connections.load() == 0; });
    // The loops drop their hold (queue_binding) on it with their last connection.
    return {};
}

void server::connection_closed(server_export& exp)
{
    std::lock_guard lock(_mutex);
    exp.connections.fetch_sub(1);
    _closed.notify_all();
}

size_t server::export_count() const
{
    std::lock_guard lock(_mutex);
    return _exports.size();
}

std::shared_ptr<const export_details> server::find(std::string_view name) const
{
    std::lock_guard lock(_mutex);
    if (name.empty()) {
        if (_exports.size() == 1) {
            return _exports.begin()->second;
        }
        return nullptr;
    }
    auto it = _exports.find(name);
    if (it == _exports.end()) {
        return nullptr;
    }
    return it->second;
}

std::vector<std::shared_ptr<const export_details>> server::list() const
{
    std::lock_guard lock(_mutex);
    std::vector<std::shared_ptr<const export_details>> out;
    for (const auto& [name, e] : _exports) {
        out.push_back(e);
    }
    return out;
}

}  // namespace softblk::nbd
