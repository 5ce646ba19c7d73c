// The FUSE_OPEN reply with open flags that libfuse 3.14's fuse_file_info
// cannot express (FOPEN_PARALLEL_DIRECT_WRITES). Kept in its own file so
// that <linux/fuse.h> and libfuse's headers never meet.
#pragma once

struct fuse_req;

namespace softblk::fuse {

// Replies to an open with FOPEN_DIRECT_IO | FOPEN_NOFLUSH |
// FOPEN_PARALLEL_DIRECT_WRITES and file handle 0. Worker thread. Returns
// what fuse_reply_buf returns.
int reply_open_direct(fuse_req* request);

}  // namespace softblk::fuse
