// Request execution of the NBD server: parsing requests off a
// connection's input, turning each into device requests (split on the
// device's limits, WRITE_ZEROES emulated with the zero buffer, waiting for
// a free tag), and queuing its reply. See request.hpp.
#include "loop.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace softblk::nbd {

const uint8_t* zero_buffer()
{
    static const uint8_t* zeros =
        static_cast<const uint8_t*>(std::aligned_alloc(4096, k_zero_buffer));
    static const bool cleared = [] {
        std::memset(const_cast<uint8_t*>(zeros), 0, k_zero_buffer);
        return true;
    }();
    (void)cleared;
    return zeros;
}

buffer_pool::~buffer_pool()
{
    for (auto& list : _free) {
        for (void* p : list) {
            std::free(p);
        }
    }
}

unsigned buffer_pool::size_class(uint32_t bytes)
{
    unsigned c = 0;
    while ((uint64_t{4096} << c) < bytes) {
        ++c;
    }
    return c;
}

uint8_t* buffer_pool::get(uint32_t bytes, unsigned& cls)
{
    cls = size_class(bytes);
    if (!_free[cls].empty()) {
        void* p = _free[cls].back();
        _free[cls].pop_back();
        _free_bytes -= uint64_t{4096} << cls;
        return static_cast<uint8_t*>(p);
    }
    return static_cast<uint8_t*>(std::aligned_alloc(4096, uint64_t{4096} << cls));
}

void buffer_pool::put(uint8_t* p, unsigned cls)
{
    const uint64_t size = uint64_t{4096} << cls;
    if (_free_bytes + size > k_keep) {
        std::free(p);
        return;
    }
    _free[cls].push_back(p);
    _free_bytes += size;
}

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
    o->pending = 0;
    o->left_to_submit = 0;
    o->data_len = 0;
    o->hdr_len = 0;
    o->extra.clear();
    o->in_device = false;
    o->waiting = false;
    return o;
}

void event_loop::release_op(nbd_op& o)
{
    connection& c = *o.conn;
    if (o.buf != nullptr) {
        buffer_released(c, uint64_t{4096} << o.buf_class);
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
    c.replies.push(o);
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
            !buffer_allowed(c, uint64_t{4096} << buffer_pool::size_class(h.length))) {
            return false;  // the header stays in the buffer for later
        }
        c.rstart += k_request_size;
        ++c.parsed;
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
                buffer_acquired(c, uint64_t{4096} << o->buf_class);
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
    const block_limits& lim = c.exp->dev->limits();
    const request_header& h = o.h;
    o.dev_flags = (h.flags & k_cmd_flag_fua) != 0 ? uint32_t{k_io_fua} : 0u;
    o.next_offset = h.offset;
    o.left_to_submit = h.length;
    switch (h.type) {
    case k_cmd_read:
        o.dev_op = io_op::read;
        o.chunk_max = lim.max_transfer_bytes;
        o.dev_flags = 0;
        break;
    case k_cmd_write:
        o.dev_op = io_op::write;
        o.chunk_max = lim.max_transfer_bytes;
        break;
    case k_cmd_flush:
        o.dev_op = io_op::flush;
        o.chunk_max = 0;
        o.left_to_submit = 1;  // one request of length 0
        break;
    case k_cmd_trim:
        o.dev_op = io_op::discard;
        o.chunk_max = lim.max_discard_bytes;
        break;
    case k_cmd_write_zeroes:
        if (lim.max_write_zeroes_bytes != 0) {
            o.dev_op = io_op::write_zeroes;
            o.chunk_max = lim.max_write_zeroes_bytes;
            if ((h.flags & k_cmd_flag_no_hole) != 0) {
                o.dev_flags |= k_io_no_unmap;
            }
            if ((h.flags & k_cmd_flag_fast_zero) != 0) {
                o.dev_flags |= k_io_fast_zero;
            }
        } else if ((h.flags & k_cmd_flag_fast_zero) != 0) {
            // Zeroing would mean writing zero buffers: not fast.
            o.error = -EOPNOTSUPP;
            o.left_to_submit = 0;
        } else {
            // The device has no write zeroes: write zeros (which also
            // keeps the blocks allocated, as NO_HOLE asks).
            o.dev_op = io_op::write;
            o.chunk_max =
                std::min(lim.max_transfer_bytes != 0 ? lim.max_transfer_bytes : k_zero_buffer,
                         k_zero_buffer);
        }
        break;
    case k_cmd_cache:
        // Advisory prefetch: the memory and null targets have nothing to
        // bring in, and the range was checked. Nothing to do.
        o.left_to_submit = 0;
        break;
    case k_cmd_block_status:
        block_status(o);
        o.left_to_submit = 0;
        break;
    default:
        o.error = -EINVAL;
        o.left_to_submit = 0;
        break;
    }
    if (o.chunk_max != 0) {
        o.chunk_max -= o.chunk_max % lim.logical_block_size;
    }
    if (o.left_to_submit == 0) {
        finish_op(o);
        return;
    }
    o.in_device = true;
    ++c.ops_in_device;
    submit_chunks(o, nullptr);
}

bool event_loop::fill_chunk(nbd_op& o, io_request& r)
{
    if (o.left_to_submit == 0) {
        return false;
    }
    uint32_t len;
    if (o.dev_op == io_op::flush) {
        len = 0;
        o.left_to_submit = 0;
    } else {
        len = static_cast<uint32_t>(o.chunk_max != 0
                                        ? std::min<uint64_t>(o.left_to_submit, o.chunk_max)
                                        : o.left_to_submit);
        o.left_to_submit -= len;
    }
    r.op = o.dev_op;
    r.flags = o.dev_flags;
    r.offset = o.next_offset;
    r.length = len;
    if (o.buf != nullptr) {
        r.buffer = o.buf + (o.next_offset - o.h.offset);
    } else if (o.dev_op == io_op::write) {
        r.buffer = const_cast<uint8_t*>(zero_buffer());
    } else {
        r.buffer = nullptr;
    }
    o.next_offset += len;
    r.on_complete = &event_loop::on_device_complete;
    r.user_data = &o;
    ++o.pending;
    return true;
}

void event_loop::submit_chunks(nbd_op& o, io_request* reuse)
{
    io_queue& q = *o.conn->binding->queue;
    o.submitting = true;
    if (reuse != nullptr) {
        if (fill_chunk(o, *reuse)) {
            q.submit(*reuse);
        }
    }
    while (o.left_to_submit != 0 && o.error == 0) {
        io_request* r = q.get_request();
        if (r == nullptr) {
            if (!o.waiting) {
                o.waiting = true;
                o.conn->binding->waiting.push(&o);
            }
            break;
        }
        fill_chunk(o, *r);
        q.submit(*r);
    }
    if (o.waiting && o.left_to_submit == 0) {
        // Its own chunks' tags carried it through: leave the free tags to
        // the requests still waiting.
        o.conn->binding->waiting.remove(&o);
        o.waiting = false;
    }
    o.submitting = false;
    if (o.pending == 0 && (o.left_to_submit == 0 || o.error != 0)) {
        finish_op(o);
    }
}

void event_loop::on_device_complete(io_request& r, int result)
{
    nbd_op& o = *static_cast<nbd_op*>(r.user_data);
    connection& c = *o.conn;
    event_loop& self = *c.loop;
    --o.pending;
    if (result < 0 && o.error == 0) {
        o.error = result;
    }
    if (o.submitting) {
        return;  // submit_chunks looks at the op when it is done
    }
    queue_binding& b = *c.binding;
    if (o.error == 0 && o.left_to_submit != 0) {
        // Reuse the tag for the next chunk of the same request.
        self.submit_chunks(o, &r);
        return;
    }
    if (o.pending == 0) {
        self.finish_op(o);
    }
    // Give the tag to a request that waits for one.
    if (nbd_op* w = b.waiting.pop()) {
        w->waiting = false;
        if (w->error != 0) {
            if (w->pending == 0) {
                w->conn->loop->finish_op(*w);
            }
        } else {
            self.submit_chunks(*w, &r);
        }
    }
}

void event_loop::finish_op(nbd_op& o)
{
    connection& c = *o.conn;
    if (o.waiting) {
        // It waited for a tag and got through on its own (its chunks reused
        // their tag, or one failed): it must not be given a tag later.
        c.binding->waiting.remove(&o);
        o.waiting = false;
    }
    if (o.in_device) {
        o.in_device = false;
        --c.ops_in_device;
    }
    const request_header& h = o.h;
    if (o.error != 0) {
        const uint32_t err = nbd_error_from_errno(o.error);
        if (o.buf != nullptr) {
            buffer_released(c, uint64_t{4096} << o.buf_class);
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
            buffer_released(c, uint64_t{4096} << o.buf_class);
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
    c.replies.push(&o);
    mark_dirty(c);
}

void event_loop::block_status(nbd_op& o)
{
    connection& c = *o.conn;
    const request_header& h = o.h;
    auto map = c.exp->dev->map(h.offset, h.length);
    if (!map) {
        o.error = -EIO;
        return;
    }
    std::vector<status_extent> out;
    const uint64_t end = h.offset + h.length;
    uint64_t pos = h.offset;
    for (const extent& x : *map) {
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
        if ((h.flags & k_cmd_flag_req_one) != 0 && out.size() == 1 && pos < end) {
            // Keep merging the first run only.
            continue;
        }
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
