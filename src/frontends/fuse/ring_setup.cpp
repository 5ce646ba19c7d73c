// Ring mode's setup: whether FUSE over io_uring can be used (plan_ring),
// the INIT exchange that turns it on, and starting and stopping the ring
// threads (fuse_ring.cpp).
//
// libfuse 3.14 keeps mounting, unmounting and the INIT negotiation, but
// its INIT reply cannot carry FUSE_OVER_IO_URING (a flags2 bit it does not
// know). In ring mode the session gets a custom I/O (libfuse's
// fuse_session_custom_io, on the descriptor fuse_session_mount opened):
// its read notes the INIT request and whether the kernel offers the ring;
// its writev adds FUSE_OVER_IO_URING to libfuse's INIT reply. Only then
// does the kernel take ring commands, and once every queue has an entry it
// sends every request through the ring; FORGET and INTERRUPT still come
// through /dev/fuse, which ring thread 0 reads with libfuse.
#include "fuse_ring.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <fmt/core.h>
#include <fstream>
#include <linux/fuse.h>
#include <poll.h>
#include <sys/uio.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <softblk/support/clock.hpp>

namespace softblk::fuse {

namespace {

constexpr const char* k_enable_uring = "/sys/module/fuse/parameters/enable_uring";
constexpr int k_init_timeout_ms = 10'000;

std::string first_line(const char* path)
{
    std::ifstream in(path);
    std::string line;
    std::getline(in, line);
    return line;
}

}  // namespace

ssize_t ring_init::read(int fd, void* buf, size_t len, void* userdata)
{
    ring_init& init = of(userdata);
    for (;;) {
        const ssize_t n = ::read(fd, buf, len);
        if (n < static_cast<ssize_t>(sizeof(fuse_in_header))) {
            return n;
        }
        fuse_in_header in;
        std::memcpy(&in, buf, sizeof(in));
        if (in.opcode == FUSE_INIT) {
            // A kernel that has the ring sends the whole fuse_init_in
            // (flags2 came with 7.36); a shorter one offers nothing.
            fuse_init_in arg;
            std::memset(&arg, 0, sizeof(arg));
            std::memcpy(&arg, static_cast<const char*>(buf) + sizeof(in),
                        std::min(sizeof(arg), static_cast<size_t>(n) - sizeof(in)));
            uint64_t flags = arg.flags;
            if ((flags & FUSE_INIT_EXT) != 0) {
                flags |= uint64_t{arg.flags2} << 32;
            }
            init.unique = in.unique;
            init.offered = (flags & ring_abi::k_over_io_uring) != 0;
        } else if (in.opcode == FUSE_INTERRUPT &&
                   init.drop_interrupts.load(std::memory_order_relaxed)) {
            continue;  // the descriptor is non-blocking by now: EAGAIN ends this
        }
        return n;
    }
}

ssize_t ring_init::writev(int fd, iovec* iov, int count, void* userdata)
{
    ring_init& init = of(userdata);
    if (init.unique == 0 || init.replied || count < 1 || iov[0].iov_len < sizeof(fuse_out_header)) {
        return ::writev(fd, iov, count);
    }
    fuse_out_header out;
    std::memcpy(&out, iov[0].iov_base, sizeof(out));
    if (out.unique != init.unique) {
        return ::writev(fd, iov, count);
    }
    init.replied = true;
    if (out.error != 0) {
        init.reply_error = -out.error;  // libfuse refused the connection
        return ::writev(fd, iov, count);
    }
    // libfuse 3.14 sends the whole 64-byte fuse_init_out to any kernel of
    // protocol 7.23 or later; flags2 (7.36) is in it. Anything else goes
    // as it is, without the ring.
    fuse_init_out reply;
    if (count != 2 || iov[0].iov_len != sizeof(out) || iov[1].iov_len != sizeof(reply)) {
        init.unknown_reply = true;
        return ::writev(fd, iov, count);
    }
    std::memcpy(&reply, iov[1].iov_base, sizeof(reply));
    init.max_write = reply.max_write;
    init.max_pages = (reply.flags & FUSE_MAX_PAGES) != 0 ? reply.max_pages : 0;
    if (init.offered) {
        reply.flags |= FUSE_INIT_EXT;
        reply.flags2 |= static_cast<uint32_t>(ring_abi::k_over_io_uring >> 32);
    }
    iovec mine[2] = {iov[0], {&reply, sizeof(reply)}};
    const ssize_t n = ::writev(fd, mine, 2);
    if (n < 0) {
        init.reply_error = errno;
    } else {
        init.ring_set = init.offered;
    }
    return n;
}

std::string ring_missing()
{
    std::string value = first_line(k_enable_uring);
    if (value.empty() && ::access("/sys/module/fuse", F_OK) != 0) {
        // The fuse module loads on the first open of /dev/fuse.
        const int fd = ::open("/dev/fuse", O_RDWR | O_CLOEXEC);
        if (fd >= 0) {
            ::close(fd);
        }
        value = first_line(k_enable_uring);
    }
    if (value.empty()) {
        utsname u{};
        ::uname(&u);
        return fmt::format(
            "this kernel ({}) has no FUSE over io_uring: {} is missing (it needs "
            "Linux 6.14 or later built with CONFIG_FUSE_IO_URING)",
            u.release, k_enable_uring);
    }
    if (value != "Y" && value != "1") {
        return fmt::format(
            "the kernel offers FUSE over io_uring but {} is {}; an administrator may enable it "
            "(echo Y > {})",
            k_enable_uring, value, k_enable_uring);
    }
    if (first_line("/proc/sys/kernel/io_uring_disabled") == "2") {
        return "io_uring is disabled on this system (/proc/sys/kernel/io_uring_disabled is 2)";
    }
    io_uring ring{};
    io_uring_params p{};
    p.flags = IORING_SETUP_SQE128;
    if (const int r = io_uring_queue_init_params(2, &ring, &p); r < 0) {
        return fmt::format(
            "this process cannot make an io_uring with 128-byte entries "
            "(IORING_SETUP_SQE128, Linux 5.19+): {}",
            std::strerror(-r));
    }
    io_uring_queue_exit(&ring);
    return {};
}

result<ring_plan> plan_ring(std::string_view mode)
{
    if (mode == "off") {
        return ring_plan{.use = false, .forced = false, .off_reason = "ring=off"};
    }
    if (mode != "auto" && mode != "on") {
        return make_error(EINVAL, fmt::format("ring={}: must be auto, on or off", mode));
    }
    std::string missing = ring_missing();
    if (missing.empty()) {
        return ring_plan{.use = true, .forced = mode == "on", .off_reason = {}};
    }
    if (mode == "on") {
        return make_error(EOPNOTSUPP,
                          fmt::format("ring=on: {}; or use ring=auto or ring=off", missing));
    }
    return ring_plan{.use = false, .forced = false, .off_reason = std::move(missing)};
}

error fuse_export::ring_error(int code, std::string what)
{
    _ring_failed = true;
    _ring_failure = what;
    return error{
        std::error_code(code, std::generic_category()),
        fmt::format("{}: {}{}", _name, _ring.forced ? "ring=on: " : "FUSE over io_uring: ", what)};
}

result<void> fuse_export::start_ring()
{
    const int fd = fuse_session_fd(_session);
    _ring_init = std::make_unique<ring_init>();
    // Plain read and writev, but for INIT (and INTERRUPT): ring_init.
    const fuse_custom_io io{.writev = ring_init::writev,
                            .read = ring_init::read,
                            .splice_receive = nullptr,
                            .splice_send = nullptr};
    if (const int r = fuse_session_custom_io(_session, &io, fd); r != 0) {
        return std::unexpected(ring_error(-r, "libfuse refused the custom I/O for the INIT reply"));
    }
    ring_init& init = *_ring_init;

    // The INIT request waits in /dev/fuse since the mount: take it here,
    // before any ring thread, since REGISTER needs the INIT reply first.
    fuse_buf buf{};
    const uint64_t deadline = monotonic_ns() + uint64_t{k_init_timeout_ms} * 1'000'000;
    while (!init.replied) {
        const uint64_t now = monotonic_ns();
        pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
        if (now >= deadline ||
            ::poll(&p, 1, static_cast<int>((deadline - now) / 1'000'000) + 1) == 0) {
            std::free(buf.mem);
            return std::unexpected(ring_error(ETIMEDOUT, "the kernel sent no INIT request"));
        }
        const int rc = fuse_session_receive_buf(_session, &buf);
        if (rc == -EINTR || rc == -EAGAIN) {
            continue;
        }
        if (rc <= 0) {
            std::free(buf.mem);
            return make_error(rc < 0 ? -rc : ENOTCONN,
                              fmt::format("{}: the FUSE connection ended before INIT", _name));
        }
        fuse_session_process_buf(_session, &buf);
    }
    std::free(buf.mem);
    if (init.reply_error != 0) {
        return make_error(init.reply_error, fmt::format("{}: the FUSE INIT reply failed: {}", _name,
                                                        std::strerror(init.reply_error)));
    }
    if (init.unknown_reply) {
        return std::unexpected(
            ring_error(EPROTO,
                       "libfuse's INIT reply is not the fuse_init_out this export can "
                       "add FUSE_OVER_IO_URING to"));
    }
    if (!init.ring_set) {
        return std::unexpected(ring_error(
            EOPNOTSUPP, fmt::format("the kernel's INIT request did not offer FUSE over io_uring "
                                    "({} was switched off meanwhile?)",
                                    k_enable_uring)));
    }

    // Each entry holds the largest request or reply the kernel may put
    // there: its max_write, or max_pages pages (fs/fuse/dev_uring.c).
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    const size_t payload =
        std::max<size_t>({FUSE_MIN_READ_BUFFER, init.max_write, size_t{init.max_pages} * page});
    // The kernel's background requests (the loop driver's I/O) are
    // limited to max_background in all, spread over the queues by the
    // submitting CPU; a queue gets its share, at least 8 and at most all.
    _ring_entries =
        std::clamp((k_max_background + _ring_queues - 1) / _ring_queues, 8u, k_max_background);
    // Thread 0 reads /dev/fuse too, without blocking.
    if (const int flags = ::fcntl(fd, F_GETFL); flags >= 0) {
        ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
    }
    for (unsigned t = 0; t < _thread_count; ++t) {
        auto w = make_worker(t);
        if (!w) {
            return std::unexpected(w.error());
        }
        // A thread that has its device queue to itself replies from the
        // completion, however many threads there are: it waits in its
        // ring for requests and completions alike.
        (*w)->async = (*w)->queue != nullptr;
        ring_thread_config cfg{.fuse_fd = fd,
                               .qids = {},
                               .entries = _ring_entries,
                               .payload_bytes = payload,
                               .serves_dev_fuse = t == 0};
        for (unsigned q = t; q < _ring_queues; q += _thread_count) {
            cfg.qids.push_back(static_cast<uint16_t>(q));
        }
        _rings.push_back(std::make_unique<ring_thread>(*this, **w, std::move(cfg)));
        _workers.push_back(std::move(*w));
        if (auto r = _rings.back()->start(); !r) {
            return std::unexpected(ring_error(r.error().code.value(), r.error().message));
        }
    }
    init.drop_interrupts.store(true, std::memory_order_relaxed);
    return {};
}

void fuse_export::stop_ring()
{
    for (auto& r : _rings) {
        r->request_exit();
    }
    for (auto& r : _rings) {
        r->join();
    }
    _rings.clear();
}

bool fuse_export::serve_dev_fuse(worker& w, fuse_buf& buf)
{
    for (;;) {
        const int rc = fuse_session_receive_buf(_session, &buf);
        if (rc == -EAGAIN || rc == -EINTR) {
            return true;
        }
        if (rc <= 0) {
            return false;  // -ENODEV: unmounted; 0: the connection is gone
        }
        w.receive = &buf;
        fuse_session_process_buf(_session, &buf);
        w.receive = nullptr;
    }
}

void fuse_export::describe_ring(nlohmann::json& out) const
{
    if (!_ring.use) {
        out["ring"] = fmt::format("off ({})", _ring.off_reason);
        return;
    }
    out["ring"] = "on";
    out["ring_queues"] = _ring_queues;
    out["ring_entries"] = _ring_entries;
    uint64_t requests = 0;
    for (const auto& r : _rings) {
        requests += r->requests();
    }
    out["ring_requests"] = requests;
}

}  // namespace softblk::fuse
