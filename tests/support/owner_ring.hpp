// The io_uring a queue's owner (ublk's queue thread) lends to the file
// ring, as tests make it: single issuer with deferred task work where the
// kernel has them, else a plain ring (the file ring serves both).
#pragma once

#include <gtest/gtest.h>
#include <liburing.h>

namespace softblk::test {

inline void init_owner_ring(io_uring& ring, unsigned entries = 64)
{
    io_uring_params p{};
    p.flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN;
    if (io_uring_queue_init_params(entries, &ring, &p) < 0) {
        io_uring_params plain{};
        EXPECT_EQ(io_uring_queue_init_params(entries, &ring, &plain), 0);
    }
}

}  // namespace softblk::test
