// An extension of a request, not part of every request: data a request
// carries outside the process's memory, where the ublk front end leaves
// it to save a copy (its zero copy and its user copy).
// io_request::external points to it (nullptr: the data is in `buffer`,
// as for every other front end). A target that takes such requests says
// so (target::takes_external_data()); the core passes that on to the
// consumer (device::takes_external_data()) and refuses the requests
// elsewhere; a front end that has such data asks the device before it
// sends any. Front ends, targets and decorators that do not use it never
// include this header.
#pragma once

#include <cstdint>

#include <softblk/types.hpp>

struct io_uring_sqe;  // liburing's, for kernel_buffer

namespace softblk {

// Where a request's data is when it lives in another address space that
// preadv and pwritev reach: at `offset` onwards of `fd` (ublk's USER_COPY
// window of the request on /dev/ublkcN). A target that takes data windows
// (external_data_support::data_windows) takes reads, writes and zone
// appends that carry one instead of a buffer, and copies the bytes between
// it and where it keeps them (the memory store's pages) itself: once,
// instead of through a front end's buffer. The front end fills it and keeps
// it until the request completes; the window stays open until then.
struct data_window {
    int fd = -1;
    uint64_t offset = 0;
};

// Data a request carries without the process seeing it: it stays in the
// kernel, in a request of a kernel front end (ublk's zero copy), and only
// io_uring can move it. A target that takes kernel buffers
// (external_data_support::kernel_buffers) takes such writes and zone
// appends; its ring (file_ring) puts the pages in its own table of fixed
// buffers at `index` with an entry made by prep_register, writes them from
// there, and takes them out with prep_unregister's entry when the write is
// done. The front end fills it and keeps it until the request completes.
//
// Two variations, both only in a ring the front end lent (ring_sharing.hpp):
// `in_table` says the kernel put the pages in that ring's table already
// (ublk's AUTO_BUF_REG) and takes them out itself, so the ring registers
// nothing; `prep_completion`, where set, makes the entry by which the
// front end itself ends the request, and the ring links it after each
// write of the rest of the request (queue_ring_sharing::links_completions
// says when a front end may ask for that): the kernel then completes the
// request as soon as the write is done, in the context that did it,
// without waiting for the front end's thread. The front end still sees
// the completion as usual afterwards.
struct kernel_buffer {
    void (*prep_register)(::io_uring_sqe& sqe, const kernel_buffer& kb) = nullptr;
    void (*prep_unregister)(::io_uring_sqe& sqe, const kernel_buffer& kb) = nullptr;
    void (*prep_completion)(::io_uring_sqe& sqe, const kernel_buffer& kb) = nullptr;
    // The front end's, for the functions above.
    void* owner = nullptr;
    // Where the data lives (for the functions above): ublk's /dev/ublkcN, queue, tag.
    int fd = -1;
    uint16_t queue = 0;
    uint16_t tag = 0;
    // The fixed-buffer slot: unique among the requests of one device queue
    // in flight, below `slots`.
    uint16_t index = 0;
    uint16_t slots = 0;
    bool in_table = false;
};

// What io_request::external points to: a request's data in one of the two
// places, instead of `buffer` (which is then nullptr). Owned by the front
// end (a decorator that sends a request of its own for part of the data
// keeps a copy of its own), and unchanged until the request completes.
struct external_data {
    enum class place : uint8_t {
        kernel,  // `kernel`: writes and zone appends only
        window,  // `window`
    };
    place where = place::kernel;
    kernel_buffer kernel{};
    data_window window{};
};

// The kinds of external_data a device's requests may carry: what its
// target takes (target::takes_external_data(): none unless it says so,
// and none through a decorator that does not pass requests on unchanged
// or copy the extension into its own), which the core checks every
// request against (-EINVAL).
struct external_data_support {
    bool kernel_buffers = false;
    bool data_windows = false;
};

// Request `r`'s data in the kernel, or nullptr.
inline const kernel_buffer* kernel_data(const io_request& r)
{
    return r.external != nullptr && r.external->where == external_data::place::kernel
               ? &r.external->kernel
               : nullptr;
}

// Request `r`'s data window, or nullptr.
inline const data_window* window_of(const io_request& r)
{
    return r.external != nullptr && r.external->where == external_data::place::window
               ? &r.external->window
               : nullptr;
}

}  // namespace softblk
