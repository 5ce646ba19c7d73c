// An extension of a queue, not part of every queue: lending the io_uring an
// owner sleeps in (ublk's queue threads) to a target whose I/O goes through
// an io_uring of its own (the file and zloop targets' file rings). A front
// end that has such a ring asks the queue for it (io_queue::ring_sharing(),
// nullptr when the queue's target has no ring to run there); other front
// ends and targets never see it.
#pragma once

#include <cstdint>

struct io_uring;  // liburing's

namespace softblk {

// The consumer side: what io_queue::ring_sharing() gives the queue's owner.
class queue_ring_sharing {
public:
    // Lends the owner's io_uring to the queue, whose target then submits
    // its own I/O there, saving a system call and a wake-up through
    // event_fd() per request. The owner then marks its own entries'
    // user_data with bit 63, submits before each wait (what the target
    // queued goes with it) and passes every other completion to
    // ring_completion(). The ring needs room for the target's entries (up
    // to three per request) and must have no fixed-file table. wait() sees
    // none of the target's completions then. Only with nothing in flight.
    // True when the target took it; nullptr gives it back (before the
    // owner closes the ring; true once nothing is in flight). Owner thread.
    virtual bool share_ring(io_uring* ring) = 0;
    // A completion from the lent ring that is not the owner's (user_data
    // below 2^63). Owner thread.
    virtual void ring_completion(uint64_t user_data, int result) = 0;
    // With the ring shared: whether a write whose data is in the kernel
    // may carry the owner's completion linked after it (kernel_buffer::
    // prep_completion): the target ends such writes with their file
    // write's result, and the queue holds no completion back for a time
    // (irqmode=2).
    virtual bool links_completions() const = 0;

protected:
    ~queue_ring_sharing() = default;
};

// The provider side: what target_queue::ring_sharing() gives the core (and
// a decorator over the queue). Queue thread.
class target_ring_sharing {
public:
    // The queue's owner lends its io_uring: the target runs its I/O there
    // instead of in its own (file_ring::borrow_ring). True when it does;
    // nullptr gives the ring back (true once nothing is in flight).
    virtual bool share_ring(io_uring* ring) = 0;
    // A completion from the lent ring that is not the owner's: the
    // target's.
    virtual void ring_completion(uint64_t user_data, int result) = 0;
    // True when every request with a kernel_buffer (external_data.hpp)
    // ends with the result of its file ring's last write for it, at once
    // and unchanged (never given up at a timeout either: timed_out says
    // false): the owner may then link its own completion after that write
    // (kernel_buffer::prep_completion).
    // Decorators, which change results or their timing, say false.
    virtual bool ends_with_ring_write() const = 0;

protected:
    ~target_ring_sharing() = default;
};

}  // namespace softblk
