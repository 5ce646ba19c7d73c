// Where the reply to one FUSE request goes. The FUSE operations
// (file_ops.cpp) answer through a reply_to and never see which path the
// request came by: libfuse's /dev/fuse loop (libfuse_ops.cpp) or a ring
// entry of FUSE over io_uring (fuse_ring.cpp). Private to this folder.
#pragma once

#include <cstddef>

namespace softblk::fuse {

// One implementation per path; `request` is that path's handle (libfuse's
// fuse_req_t, or the ring entry). Every request gets exactly one of
// error() or data(). Called on the thread that serves the request, or on
// the one that drives the device queue its I/O went to (the same thread
// in async mode).
class reply_sink {
public:
    // Ends `request` with `error`: 0 (success without payload) or a
    // positive errno.
    virtual void error(void* request, int error) = 0;
    // Ends `request` successfully with `size` bytes of payload: a kernel
    // reply structure, directory entries or read data.
    virtual void data(void* request, const void* bytes, size_t size) = 0;
    // A buffer of at least `size` bytes that data() sends without a copy
    // (a ring entry's payload), valid until the reply; nullptr where the
    // path has none (libfuse).
    virtual char* buffer(void* request, size_t size) = 0;

protected:
    ~reply_sink() = default;
};

// A request and its path: two pointers, copied into the record of an I/O
// in flight.
struct reply_to {
    reply_sink* sink = nullptr;
    void* request = nullptr;

    void error(int error) const { sink->error(request, error); }
    void data(const void* bytes, size_t size) const { sink->data(request, bytes, size); }
    template <class T>
    void value(const T& reply) const
    {
        sink->data(request, &reply, sizeof reply);
    }
    char* buffer(size_t size) const { return sink->buffer(request, size); }
};

}  // namespace softblk::fuse
