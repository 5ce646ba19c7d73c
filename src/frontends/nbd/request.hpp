// Request execution of the NBD server (private to src/frontends/nbd): one
// NBD request from its parsed header to its reply (nbd_op), the per-loop
// hold on a device queue (queue_binding), the buffer pool and the zero
// buffer for emulated WRITE_ZEROES. The code that turns a request into
// device requests (event_loop::start_op, fill_chunk, submit_chunks,
// on_device_complete, finish_op) is in request.cpp, with these.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <softblk/device.hpp>

#include "codec.hpp"

namespace softblk::nbd {

struct connection;
struct server_export;

// The zero buffer's size: emulated WRITE_ZEROES writes at most this much
// per device request.
inline constexpr uint32_t k_zero_buffer = 1u << 20;

// Zeros for emulated WRITE_ZEROES (read only; shared by all threads).
const uint8_t* zero_buffer();

// Buffers by power-of-two size class (4 KiB .. 32 MiB), kept per loop
// (one thread; no locking).
class buffer_pool {
public:
    ~buffer_pool();
    static unsigned size_class(uint32_t bytes);
    // A buffer of at least `bytes` (its class in `cls`), or nullptr when
    // memory is exhausted. The caller owns it until put().
    uint8_t* get(uint32_t bytes, unsigned& cls);
    void put(uint8_t* p, unsigned cls);

private:
    static constexpr uint64_t k_keep = 128ull << 20;
    std::vector<void*> _free[16];
    uint64_t _free_bytes = 0;
};

// One NBD request, from its header to the end of its reply's send.
struct nbd_op {
    connection* conn = nullptr;
    request_header h;
    uint8_t* buf = nullptr;  // read data / write payload
    unsigned buf_class = 0;
    uint64_t next_offset = 0;  // next device chunk
    uint64_t left_to_submit = 0;
    unsigned pending = 0;  // device requests in flight
    int error = 0;         // first negative errno
    bool submitting = false;
    bool in_device = false;  // counted in connection::ops_in_device
    bool waiting = false;    // on its queue_binding's waiting list
    io_op dev_op = io_op::read;
    uint32_t dev_flags = 0;
    uint32_t chunk_max = 0;
    // Reply: header bytes, then data (read) or `extra` (block status).
    uint8_t hdr[32];
    uint8_t hdr_len = 0;
    uint32_t data_len = 0;
    std::vector<uint8_t> extra;
    nbd_op* next = nullptr;
};

struct op_fifo {
    nbd_op* head = nullptr;
    nbd_op* tail = nullptr;
    bool empty() const { return head == nullptr; }
    void push(nbd_op* o)
    {
        o->next = nullptr;
        if (tail != nullptr) {
            tail->next = o;
        } else {
            head = o;
        }
        tail = o;
    }
    nbd_op* pop()
    {
        nbd_op* o = head;
        if (o != nullptr) {
            head = o->next;
            if (head == nullptr) {
                tail = nullptr;
            }
        }
        return o;
    }
    // Unlinks `o`, which is on this list. Linear, for the rare case of an
    // op that leaves a queue_binding's waiting list before its turn.
    void remove(nbd_op* o)
    {
        nbd_op* prev = nullptr;
        for (nbd_op* p = head; p != nullptr; prev = p, p = p->next) {
            if (p != o) {
                continue;
            }
            (prev != nullptr ? prev->next : head) = p->next;
            if (tail == p) {
                tail = prev;
            }
            p->next = nullptr;
            return;
        }
    }
};

// A loop's hold on one queue of one device.
struct queue_binding {
    std::shared_ptr<server_export> exp;
    io_queue* queue = nullptr;
    unsigned users = 0;
    op_fifo waiting;  // ops that found no free tag
};

}  // namespace softblk::nbd
