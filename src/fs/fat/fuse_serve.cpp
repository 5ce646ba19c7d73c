// The serving loop of `softblk fat mount` (and of the benchmark's
// do-nothing file system): one thread reads requests from /dev/fuse,
// busy-polls for the next for a measured window before it sleeps, and
// runs where the core's colocation measures best. fuse_mount.cpp has the
// file system's operations and the mount itself.
#define FUSE_USE_VERSION 312
#include "fuse_mount.hpp"

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <linux/fuse.h>
#include <poll.h>
#include <sched.h>

#include <fmt/format.h>

#include <softblk/support/clock.hpp>
#include <softblk/support/colocation.hpp>
#include <softblk/support/level_chooser.hpp>

namespace softblk::fat::detail {

namespace {

// Whether a request (or the connection's end) waits on /dev/fuse now.
bool request_waiting(fuse_session* se)
{
    pollfd fd{.fd = fuse_session_fd(se), .events = POLLIN, .revents = 0};
    return ::poll(&fd, 1, 0) > 0;
}

// Waits for a request on /dev/fuse until `deadline` (ns, monotonic),
// polling on idle CPU time only. True when one is there (or the connection
// is gone: the read then says so).
bool poll_for_request(fuse_session* se, uint64_t deadline)
{
    do {
        if (request_waiting(se)) {
            return true;
        }
        // A thread that is ready here (often the client that will send the
        // next request) goes first.
        ::sched_yield();
    } while (!fuse_session_exited(se) && monotonic_ns() < deadline);
    return false;
}

// Read-ahead windows this large or larger (the kernel's smallest default).
constexpr uint32_t k_read_ahead_bytes = 128u << 10;

// Whether the thread that sent the request goes on without waiting for
// it: the kernel's writeback (a WRITE from the page cache) and read-ahead
// (a READ of a whole window through it; the reader copies the window
// before while the next one is filled). Served next to the sender, such a
// request only takes the sender's CPU: 64 KiB reads of a 256 MiB file
// through the mount ran at 2.2-2.5 GB/s served from any CPU and 1.6-1.8
// next to the reader (docs/fat.md).
// `direct_io`: the mount reads past the page cache, so no READ is the
// kernel's read-ahead.
bool sender_goes_on(const fuse_in_header& in, size_t size, bool direct_io)
{
    if (in.opcode == FUSE_WRITE && size >= sizeof in + sizeof(fuse_write_in)) {
        const auto* w = reinterpret_cast<const fuse_write_in*>(&in + 1);
        return (w->write_flags & FUSE_WRITE_CACHE) != 0;
    }
    if (in.opcode == FUSE_READ && size >= sizeof in + sizeof(fuse_read_in) && !direct_io) {
        const auto* r = reinterpret_cast<const fuse_read_in*>(&in + 1);
        return r->size >= k_read_ahead_bytes;
    }
    return false;
}

// Where the serving thread runs (support/colocation.hpp): from any CPU, or
// next to the thread that sent the request, as `placing` measured best;
// from any CPU for a request its sender does not wait for.
class placement {
public:
    placement(level_chooser& placing, bool direct_io) : _placing(placing), _direct_io(direct_io) {}

    void before(const fuse_buf& buf)
    {
        // A large write may be left in a pipe (splice): its header is not
        // in memory; the last client's CPU stays.
        const auto* in = (buf.flags & FUSE_BUF_IS_FD) == 0 && buf.size >= sizeof(fuse_in_header)
                             ? static_cast<const fuse_in_header*>(buf.mem)
                             : nullptr;
        if (_placing.level() == 0 || (in != nullptr && sender_goes_on(*in, buf.size, _direct_io))) {
            _place.release();
            return;
        }
        if (in != nullptr) {
            _place.follow(static_cast<pid_t>(in->pid), monotonic_ns());
        }
        _place.reply_begins();
    }

    void after()
    {
        if (!_placing.fixed()) {
            _placing.served(monotonic_ns());
        }
    }

    // Before the thread sleeps for the next request: back under its own
    // policy (a busy program on this CPU then delays it no more than
    // anyone). While requests come back to back (a writer's next write
    // queued while this one was answered) it stays as it is: the two
    // policy switches cost about 0.9 us per request on the Xeon guest,
    // a tenth of a 16 KiB write's round trip.
    void before_sleep() { _place.reply_done(); }

private:
    level_chooser& _placing;
    bool _direct_io;
    colocation _place;
};

// fuse_loop with a busy-poll window: after each request the thread polls
// /dev/fuse for up to the window before it sleeps in poll(). A create is
// two or three requests in a row, and on a virtual machine the wake-up of
// a sleeping server thread (and of its idle vCPU) costs more than the
// request itself (docs/fat.md has the figures). The window is the core's
// level_chooser's (as for the FUSE export's poll_us): auto measures which
// window serves the most requests per second on this machine.
int serve_polling(fuse_session* se, level_chooser& chooser, level_chooser& placing, bool direct_io,
                  request_shortcut shortcut)
{
    placement place(placing, direct_io);
    fuse_buf buf{};
    int rc = 0;
    // Reads that do not wait: a request that is there is taken with one
    // system call (not a poll to see whether one is, then the read), and
    // when none is the loop polls for the window, then sleeps in poll().
    const int fd = fuse_session_fd(se);
    const int flags = ::fcntl(fd, F_GETFL);
    const bool nonblocking = flags >= 0 && ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0;
    uint64_t polled_ns = 0;
    while (!fuse_session_exited(se)) {
        if (!nonblocking && !request_waiting(se)) {
            place.before_sleep();  // the read below sleeps
        }
        rc = fuse_session_receive_buf(se, &buf);
        if (rc == -EAGAIN) {
            rc = 0;
            if (const uint64_t window_ns = chooser.level() * 1'000; window_ns != 0) {
                const uint64_t start = monotonic_ns();
                const bool caught = poll_for_request(se, start + window_ns);
                polled_ns += monotonic_ns() - start;
                if (caught) {
                    continue;
                }
            }
            place.before_sleep();
            pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
            ::poll(&p, 1, -1);  // a signal (EINTR) or the unmount end it too
            continue;
        }
        if (rc == -EINTR) {
            rc = 0;
            continue;
        }
        if (rc <= 0) {
            break;  // 0: unmounted (libfuse ended the session); < 0: an error
        }
        if (!chooser.fixed()) {
            chooser.served(monotonic_ns(), 1, polled_ns);
        }
        polled_ns = 0;
        place.before(buf);
        if (shortcut == nullptr || (buf.flags & FUSE_BUF_IS_FD) != 0 ||
            buf.size < sizeof(fuse_in_header) ||
            !shortcut(*static_cast<const fuse_in_header*>(buf.mem), static_cast<size_t>(rc), fd)) {
            fuse_session_process_buf(se, &buf);
        }
        place.after();
    }
    if (nonblocking) {
        ::fcntl(fd, F_SETFL, flags);
    }
    std::free(buf.mem);
    fuse_session_reset(se);
    return rc < 0 ? 1 : 0;
}

}  // namespace

int serve_session(void* session, std::string_view poll_us, std::string_view colocate,
                  bool direct_io, request_shortcut shortcut)
{
    level_chooser chooser(poll_window_config(poll_us));
    if (colocate != "0") {
        if (auto ok = colocation::check(); !ok) {
            fmt::print(stderr, "softblk fat mount: colocate={}: serving from any CPU: {}\n",
                       colocate, ok.error().message);
            colocate = "0";
        }
    }
    level_chooser placing(colocation_config(colocate));
    return serve_polling(static_cast<fuse_session*>(session), chooser, placing, direct_io,
                         shortcut);
}

}  // namespace softblk::fat::detail
