// Request execution of the NBD server: parsing requests off a
// connection's input, turning each into one device bio (which the core
// splits, emulates and queues for tags), and queuing its reply. See
// request.hpp.
#include "loop.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace softblk::nbd {

// ---------------------------------------------------------------- buffer limits

bool event_loop::buffer_allowed(connection& c, uint64_t bytes)
{
    const server_config& cfg = _srv.config();
    if (c.buffered != 0 && c.buffered + bytes > cfg.conn_buffer_bytes) {
        // Its replies must go out first: on_send unblocks it.
        c.input_blocked = true;
        post_hup_poll(c);
        return false;
    }
    // Approximate across loops (each may pass the bound by one request):
    // a bound on memory, not an account.
    if (_srv.buffered_total().load(std::memory_order_relaxed) + bytes > cfg.total_buffer_bytes) {
        c.input_blocked = true;
        if (!c.buffer_wait) {
            c.buffer_wait = true;
            _buffer_waiters.push_back(&c);
        }
        post_hup_poll(c);
        return false;
    }
    return true;
}

void event_loop::buffer_acquired(connection& c, uint64_t bytes)
{
    c.buffered += bytes;
    _srv.buffered_total().fetch_add(bytes, std::memory_order_relaxed);
}

void event_loop::buffer_released(connection& c, uint64_t bytes)
{
    c.buffered -= bytes;
    _srv.buffered_total().fetch_sub(bytes, std::memory_order_relaxed);
}

void event_loop::retry_buffer_waiters()
{
    if (_srv.buffered_total().load(std::memory_order_relaxed) >= _srv.config().total_buffer_bytes) {
        return;
    }
    std::vector<connection*> waiters;
    waiters.swap(_buffer_waiters);
    for (connection* c : waiters) {
        c->buffer_wait = false;
        if (c->closing || c->close_after_send || !c->input_blocked) {
            continue;
        }
        c->input_blocked = false;
        pump_input(*c);
        maybe_free(*c);
    }
}

// ---------------------------------------------------------------- requests

nbd_op* event_loop::take_op(connection& c)
{
    nbd_op* o = c.free_ops.back();
    c.free_ops.pop_back();
    o->error = 0;
    o->data_len = 0;
    o->hdr_len = 0;
    o->extra.clear();
    o->in_device = false;
    return o;
}

void event_loop::release_op(nbd_op& o)
{
    connection& c = *o.conn;
    if (o.buf != nullptr) {
        buffer_released(c, buffer_pool::class_bytes(o.buf_class));
        _pool.put(o.buf, o.buf_class);
        o.buf = nullptr;
    }
    c.free_ops.push_back(&o);
}

void event_loop::reply_error(connection& c, const request_header& h, uint32_t error)
{
    nbd_op* o = take_op(c);
    o->h = h;
    o->error = 0;
    if (c.neg.structured_replies && (h.type == k_cmd_read || h.type == k_cmd_block_status)) {
        o->hdr_len = static_cast<uint8_t>(encode_error_chunk(o->hdr, h.cookie, error));
    } else {
        o->hdr_len = static_cast<uint8_t>(encode_simple_reply(o->hdr, h.cookie, error));
    }
    c.replies.push(*o);
    mark_dirty(c);
}

bool event_loop::parse_requests(connection& c)
{
    for (;;) {
        const size_t avail = c.rend - c.rstart;
        if (c.payload_left > 0) {
            if (avail == 0) {
                return true;
            }
            const size_t n = std::min<uint64_t>(avail, c.payload_left);
            if (!c.payload_discard) {
                std::memcpy(c.payload_op->buf + c.payload_pos, c.rbuf + c.rstart, n);
                c.payload_pos += static_cast<uint32_t>(n);
            }
            c.rstart += n;
            c.payload_left -= n;
        }
        if (c.payload_left == 0 && c.payload_op != nullptr) {
            nbd_op* o = c.payload_op;
            c.payload_op = nullptr;
            start_op(*o);
            if (c.closing) {
                return false;
            }
        }
        if (c.payload_left > 0) {
            continue;
        }
        c.payload_discard = false;
        if (c.disc) {
            c.rstart = c.rend;  // nothing after DISC counts
            return false;
        }
        if (c.rend - c.rstart < k_request_size) {
            return true;
        }
        if (c.free_ops.empty()) {
            c.input_blocked = true;  // on_send unblocks it as replies go out
            post_hup_poll(c);
            return false;
        }
        request_header h;
        if (!parse_request(c.rbuf + c.rstart, h)) {
            begin_close(c);  // out of sync: nothing else is safe
            return false;
        }
        const request_check check = check_request(h, c.neg);
        if (check.disposition == request_disposition::execute &&
            (h.type == k_cmd_read || h.type == k_cmd_write) &&
            !buffer_allowed(c, buffer_pool::class_bytes(buffer_pool::size_class(h.length)))) {
            return false;  // the header stays in the buffer for later
        }
        c.rstart += k_request_size;
        ++c.parsed;
        ++_requests_parsed;
        // The receive length follows it (post_recv); 7/8 of the old value
        // and 1/8 of this request's size.
        {
            const uint64_t bytes =
                k_request_size + (h.type == k_cmd_write ? uint64_t{h.length} : 0);
            c.request_bytes = static_cast<uint32_t>(
                (uint64_t{c.request_bytes} * 7 + std::min<uint64_t>(bytes, k_recv_buffer)) / 8);
        }
        switch (check.disposition) {
        case request_disposition::disconnect:
            if (h.type == k_cmd_disc) {
                c.disc = true;
                mark_dirty(c);
                if (c.ops_in_device == 0 && c.replies.empty() && !c.send_posted &&
                    c.free_ops.size() == k_max_ops) {
                    begin_close(c);
                }
            } else {
                begin_close(c);
            }
            return false;
        case request_disposition::error:
            reply_error(c, h, check.error);
            if (check.payload != 0) {
                c.payload_left = check.payload;
                c.payload_discard = true;
            }
            continue;
        case request_disposition::execute:
            break;
        }
        nbd_op* o = take_op(c);
        o->h = h;
        if (h.type == k_cmd_read || h.type == k_cmd_write) {
            o->buf = _pool.get(h.length, o->buf_class);
            if (o->buf != nullptr) {
                buffer_acquired(c, buffer_pool::class_bytes(o->buf_class));
            } else {
                release_op(*o);
                reply_error(c, h, k_enomem);
                if (h.type == k_cmd_write) {
                    c.payload_left = h.length;
                    c.payload_discard = true;
                }
                continue;
            }
        }
        if (h.type == k_cmd_write) {
            c.payload_op = o;
            c.payload_pos = 0;
            c.payload_left = h.length;
            continue;
        }
        start_op(*o);
        if (c.closing) {
            return false;
        }
    }
}

void event_loop::start_op(nbd_op& o)
{
    connection& c = *o.conn;
    const request_header& h = o.h;
    bio& b = o.dev;
    b = make_bio(io_op::read, h.offset, h.length, o.buf,
                 (h.flags & k_cmd_flag_fua) != 0 ? uint32_t{k_io_fua} : 0u);
    switch (h.type) {
    case k_cmd_read:
        b.flags = 0;
        break;
    case k_cmd_write:
        b.op = io_op::write;
        break;
    case k_cmd_flush:
        b.op = io_op::flush;
        b.length = 0;
        break;
    case k_cmd_trim:
        b.op = io_op::discard;
        break;
    case k_cmd_write_zeroes:
        // Where the device has no write zeroes the core writes zeros (which
        // also keeps the blocks allocated, as NO_HOLE asks), or refuses a
        // fast zero.
        b.op = io_op::write_zeroes;
        if ((h.flags & k_cmd_flag_no_hole) != 0) {
            b.flags |= k_io_no_unmap;
        }
        if ((h.flags & k_cmd_flag_fast_zero) != 0) {
            b.flags |= k_io_fast_zero;
        }
        break;
    case k_cmd_block_status: {
        // In whole blocks; block_status_reply cuts the answer to the range.
        const uint64_t block = c.exp->dev->limits().logical_block_size;
        const uint64_t end = h.offset + h.length;
        b.op = io_op::report_extents;
        b.flags = 0;
        b.offset = h.offset - h.offset % block;
        // The device may have shrunk below this connection's size: the
        // core then refuses the request beyond its end.
        const uint64_t capacity = current_capacity(c.exp->dev->limits());
        b.length =
            std::max(b.offset, std::min(capacity, (end + block - 1) / block * block)) - b.offset;
        if (!o.extents) {
            o.extents = std::make_unique<extent[]>(k_status_extents);
        }
        b.buffer = o.extents.get();
        b.report_capacity = k_status_extents;
        break;
    }
    case k_cmd_cache:
        // Advisory prefetch: the memory and null targets have nothing to
        // bring in, and the range was checked. Nothing to do.
        finish_op(o);
        return;
    default:
        o.error = -EINVAL;
        finish_op(o);
        return;
    }
    b.on_complete = &event_loop::on_device_complete;
    b.user_data = &o;
    o.in_device = true;
    ++c.ops_in_device;
    c.binding->queue->submit(b);
}

void event_loop::on_device_complete(bio& b, int status)
{
    nbd_op& o = *static_cast<nbd_op*>(b.user_data);
    event_loop& self = *o.conn->loop;
    o.error = status;
    if (status == 0 && o.h.type == k_cmd_block_status) {
        self.block_status_reply(o);
    }
    self.finish_op(o);
}

void event_loop::finish_op(nbd_op& o)
{
    connection& c = *o.conn;
    if (o.in_device) {
        o.in_device = false;
        --c.ops_in_device;
    }
    const request_header& h = o.h;
    if (o.error != 0) {
        const uint32_t err = nbd_error_from_errno(o.error);
        if (o.buf != nullptr) {
            buffer_released(c, buffer_pool::class_bytes(o.buf_class));
            _pool.put(o.buf, o.buf_class);
            o.buf = nullptr;
        }
        o.extra.clear();
        o.data_len = 0;
        if (c.neg.structured_replies && (h.type == k_cmd_read || h.type == k_cmd_block_status)) {
            o.hdr_len = static_cast<uint8_t>(encode_error_chunk(o.hdr, h.cookie, err));
        } else {
            o.hdr_len = static_cast<uint8_t>(encode_simple_reply(o.hdr, h.cookie, err));
        }
    } else if (h.type == k_cmd_read) {
        if (c.neg.structured_replies) {
            o.hdr_len =
                static_cast<uint8_t>(encode_read_chunk(o.hdr, h.cookie, h.offset, h.length, true));
        } else {
            o.hdr_len = static_cast<uint8_t>(encode_simple_reply(o.hdr, h.cookie, 0));
        }
        o.data_len = h.length;
    } else if (h.type == k_cmd_block_status) {
        o.hdr_len = 0;  // the whole chunk is in `extra`
    } else {
        o.hdr_len = static_cast<uint8_t>(encode_simple_reply(o.hdr, h.cookie, 0));
        if (o.buf != nullptr) {
            buffer_released(c, buffer_pool::class_bytes(o.buf_class));
            _pool.put(o.buf, o.buf_class);
            o.buf = nullptr;
        }
    }
    if (c.closing) {
        release_op(o);
        maybe_free(c);
        return;
    }
    queue_reply(o);
}

void event_loop::queue_reply(nbd_op& o)
{
    connection& c = *o.conn;
    c.replies.push(o);
    mark_dirty(c);
}

void event_loop::block_status_reply(nbd_op& o)
{
    const request_header& h = o.h;
    std::vector<status_extent> out;
    const uint64_t end = h.offset + h.length;
    uint64_t pos = h.offset;
    for (uint64_t i = 0; i < o.dev.transferred; ++i) {
        const extent& x = o.extents[i];
        const uint64_t xs = std::max(x.offset, pos);
        const uint64_t xe = std::min(x.offset + x.length, end);
        if (xe <= xs) {
            continue;
        }
        if (xs != pos) {
            break;  // a gap: report what is contiguous from the start
        }
        uint32_t flags = 0;
        if (!x.allocated) {
            flags |= k_state_hole | k_state_zero;
        } else if (x.zero) {
            flags |= k_state_zero;
        }
        const auto len = static_cast<uint32_t>(xe - xs);
        if (!out.empty() && out.back().flags == flags) {
            out.back().length += len;
        } else {
            out.push_back({len, flags});
        }
        pos = xe;
    }
    if (out.empty()) {
        o.error = -EIO;
        return;
    }
    if ((h.flags & k_cmd_flag_req_one) != 0) {
        out.resize(1);
    }
    encode_block_status(o.extra, h.cookie, k_base_allocation_id, out);
}

}  // namespace softblk::nbd
