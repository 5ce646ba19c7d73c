#include "open_reply.hpp"

#include <cstddef>
#include <linux/fuse.h>

extern "C" int fuse_reply_buf(struct fuse_req* req, const char* buf, size_t size);

namespace softblk::fuse {

int reply_open_direct(fuse_req* request)
{
    fuse_open_out out{};
    out.fh = 0;
    // Direct I/O: every read and write reaches the device (no page cache,
    // O_DIRECT or not). No flush on close: nothing is buffered here.
    // Parallel direct writes: the kernel does not serialise writes on the
    // inode lock (the loop driver's requests overlap).
    out.open_flags = FOPEN_DIRECT_IO | FOPEN_NOFLUSH | FOPEN_PARALLEL_DIRECT_WRITES;
    return fuse_reply_buf(request, reinterpret_cast<const char*>(&out), sizeof out);
}

}  // namespace softblk::fuse
