// Request execution of the NBD server (private to src/frontends/nbd): one
// NBD request from its parsed header to its reply (nbd_op) and the per-loop
// hold on a device queue (queue_binding). The code that turns a request
// into a device bio and its completion into a reply (event_loop::start_op,
// on_device_complete, finish_op) is in request.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <softblk/device.hpp>
#include <softblk/support/buffer_pool.hpp>
#include <softblk/support/intrusive_fifo.hpp>

#include "codec.hpp"

namespace softblk::nbd {

struct connection;
struct server_export;

// One NBD request, from its header to the end of its reply's send. Its
// device work is one bio (the core splits it, emulates WRITE_ZEROES and
// waits for tags).
struct nbd_op {
    connection* conn = nullptr;
    request_header h;
    uint8_t* buf = nullptr;  // read data / write payload
    unsigned buf_class = 0;
    bio dev;  // the device request
    // BLOCK_STATUS: the allocation map the device reports (allocated on the
    // op's first BLOCK_STATUS, kept with the op).
    std::unique_ptr<extent[]> extents;
    int error = 0;           // negative errno for the reply, 0: success
    bool in_device = false;  // counted in connection::ops_in_device
    // Reply: header bytes, then data (read) or `extra` (block status).
    uint8_t hdr[32];
    uint8_t hdr_len = 0;
    uint32_t data_len = 0;
    std::vector<uint8_t> extra;
    nbd_op* next = nullptr;
};

// Replies waiting to go out, in order.
using op_fifo = intrusive_fifo<nbd_op>;

// BLOCK_STATUS asks for at most this many extents of the device at once.
inline constexpr uint32_t k_status_extents = 64;

// A loop's hold on one queue of one device.
struct queue_binding {
    std::shared_ptr<server_export> exp;
    io_queue* queue = nullptr;
    unsigned users = 0;
    // A multishot poll on queue->event_fd() is in the loop's ring (targets
    // that complete on a descriptor, e.g. the file target's io_uring).
    bool event_poll_armed = false;
};

}  // namespace softblk::nbd
