// libfuse's lowlevel callbacks on the /dev/fuse path: each takes its
// arguments from libfuse and calls the operation (file_ops.cpp) with a
// reply_to that answers through fuse_reply_buf / fuse_reply_err. The
// operations build the kernel's reply structures themselves, so the ring
// path (fuse_ring.cpp) sends the very same bytes.
#include "session.hpp"

#include <cerrno>
#include <cstring>
#include <linux/fuse.h>
#include <sys/uio.h>

namespace softblk::fuse {

namespace {

class libfuse_sink final : public reply_sink {
public:
    void error(void* request, int error) override
    {
        fuse_reply_err(static_cast<fuse_req_t>(request), error);
    }
    void data(void* request, const void* bytes, size_t size) override
    {
        fuse_reply_buf(static_cast<fuse_req_t>(request), static_cast<const char*>(bytes), size);
    }
    char* buffer(void*, size_t) override { return nullptr; }
};

libfuse_sink g_libfuse_sink;

reply_to to(fuse_req_t req)
{
    return reply_to{.sink = &g_libfuse_sink, .request = req};
}

}  // namespace

void dev_fuse_sink::error(void* request, int error)
{
    fuse_out_header out{.len = sizeof(fuse_out_header),
                        .error = -error,
                        .unique = reinterpret_cast<uint64_t>(request)};
    // ENOENT: the request was interrupted or the connection aborted
    // meanwhile; nothing waits for the reply (libfuse ignores it too).
    (void)!::write(fd, &out, sizeof out);
}

void dev_fuse_sink::data(void* request, const void* bytes, size_t size)
{
    fuse_out_header out{.len = static_cast<uint32_t>(sizeof(fuse_out_header) + size),
                        .error = 0,
                        .unique = reinterpret_cast<uint64_t>(request)};
    iovec iov[2] = {{.iov_base = &out, .iov_len = sizeof out},
                    {.iov_base = const_cast<void*>(bytes), .iov_len = size}};
    (void)!::writev(fd, iov, size != 0 ? 2 : 1);
}

bool fuse_export::serve_direct(worker& w, const fuse_buf& buf, size_t size)
{
    if ((buf.flags & FUSE_BUF_IS_FD) != 0 || size < sizeof(fuse_in_header)) {
        return false;
    }
    fuse_in_header in;
    std::memcpy(&in, buf.mem, sizeof in);
    const char* arg = static_cast<const char*>(buf.mem) + sizeof in;
    const size_t arg_size = size - sizeof in;
    const reply_to r{.sink = &_direct_sink, .request = reinterpret_cast<void*>(in.unique)};
    switch (in.opcode) {
    case FUSE_READ: {
        fuse_read_in a;
        if (arg_size < sizeof a) {
            return false;
        }
        std::memcpy(&a, arg, sizeof a);
        w.direct_requests.fetch_add(1, std::memory_order_relaxed);
        serve_read(r, a.size, static_cast<int64_t>(a.offset));
        return true;
    }
    case FUSE_WRITE: {
        // The data follows the whole fuse_write_in: libfuse's INIT reply
        // says protocol 7.31, past the short struct of 7.8 and before.
        fuse_write_in a;
        if (arg_size < sizeof a) {
            return false;
        }
        std::memcpy(&a, arg, sizeof a);
        if (arg_size - sizeof a < a.size) {
            return false;
        }
        w.direct_requests.fetch_add(1, std::memory_order_relaxed);
        serve_write(r, arg + sizeof a, a.size, static_cast<int64_t>(a.offset));
        return true;
    }
    case FUSE_INTERRUPT:
        return true;
    default:
        return false;
    }
}

void fuse_export::op_init(void*, fuse_conn_info* conn)
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
    self(req).serve_lookup(to(req), parent, name);
}

void fuse_export::op_getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*)
{
    self(req).serve_getattr(to(req), ino);
}

void fuse_export::op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set,
                             fuse_file_info*)
{
    // libfuse's FUSE_SET_ATTR_* bits are the kernel's FATTR_* ones.
    self(req).serve_setattr(to(req), ino, static_cast<uint32_t>(to_set),
                            static_cast<uint64_t>(attr->st_size));
}

void fuse_export::op_open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi)
{
    self(req).serve_open(to(req), ino, static_cast<uint32_t>(fi->flags));
}

void fuse_export::op_read(fuse_req_t req, fuse_ino_t, size_t size, off_t off, fuse_file_info*)
{
    self(req).serve_read(to(req), size, off);
}

void fuse_export::op_write(fuse_req_t req, fuse_ino_t, const char* buf, size_t size, off_t off,
                           fuse_file_info*)
{
    self(req).serve_write(to(req), buf, size, off);
}

void fuse_export::op_flush(fuse_req_t req, fuse_ino_t, fuse_file_info*)
{
    // Nothing is buffered in the export (direct I/O); durability is
    // fsync's business. Opens say FOPEN_NOFLUSH, so this is rare.
    serve_nothing(to(req));
}

void fuse_export::op_release(fuse_req_t req, fuse_ino_t, fuse_file_info*)
{
    serve_nothing(to(req));
}

void fuse_export::op_fsync(fuse_req_t req, fuse_ino_t, int, fuse_file_info*)
{
    self(req).serve_fsync(to(req));
}

void fuse_export::op_opendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info*)
{
    self(req).serve_opendir(to(req), ino);
}

void fuse_export::op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                             fuse_file_info*)
{
    self(req).serve_readdir(to(req), ino, size, static_cast<uint64_t>(off));
}

void fuse_export::op_releasedir(fuse_req_t req, fuse_ino_t, fuse_file_info*)
{
    serve_nothing(to(req));
}

void fuse_export::op_statfs(fuse_req_t req, fuse_ino_t)
{
    self(req).serve_statfs(to(req));
}

void fuse_export::op_fallocate(fuse_req_t req, fuse_ino_t, int mode, off_t offset, off_t length,
                               fuse_file_info*)
{
    self(req).serve_fallocate(to(req), mode, offset, length);
}

void fuse_export::op_lseek(fuse_req_t req, fuse_ino_t, off_t off, int whence, fuse_file_info*)
{
    self(req).serve_lseek(to(req), off, whence);
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

}  // namespace softblk::fuse
