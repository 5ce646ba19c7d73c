// The core's block layer for requests of any size (struct bio): splitting
// on the device's limits and zone boundaries, write-zeroes emulation,
// waiting for free tags, and one completion per bio. Every front end hands
// its requests to the core here, so none of them splits or emulates.
//
// A bio's pieces are submitted in offset order, as many at once as the
// queue has free tags. A piece that completes hands its tag to the same
// bio's next piece, unless bios wait for tags: then the tag goes to the
// oldest waiting bio and this one queues behind (release_tag), so bios
// take turns and a large one does not hold up small ones. After an error no further
// piece starts; the bio completes once the pieces in flight are back, with
// the error of the lowest failing offset and the bytes before it.
#include "queue.hpp"

#include "device_impl.hpp"
#include "op_properties.hpp"

#include <cassert>
#include <cerrno>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include <fmt/core.h>

namespace softblk::core {

namespace {

// Zeros for emulated write_zeroes: read only, shared by every queue.
constexpr uint32_t k_zero_buffer_bytes = 1u << 20;

void* zero_buffer()
{
    static void* const zeros = [] {
        void* p = std::aligned_alloc(4096, k_zero_buffer_bytes);
        std::memset(p, 0, k_zero_buffer_bytes);
        return p;
    }();
    return zeros;
}

// The op's row of k_op_table; for an op outside the enum (which plan()
// refuses), a row with none of the properties.
const op_properties& row(io_op op)
{
    static constexpr op_properties k_none{};
    const op_properties* p = properties_of(op);
    return p != nullptr ? *p : k_none;
}

bool is_report(io_op op)
{
    return row(op).result == op_result::entries;
}

// A piece is still to go out: none yet, or bytes left and no error.
bool has_more_pieces(const bio& b)
{
    return b.split.status == 0 && (b.split.left != 0 || !b.split.started);
}

// The largest multiple of `block` that is at most `bytes` and fits an
// io_request's 32-bit length.
uint32_t piece_limit(uint64_t bytes, uint32_t block)
{
    const uint64_t capped = std::min<uint64_t>(bytes, UINT32_MAX);
    return static_cast<uint32_t>(capped - capped % block);
}

}  // namespace

int queue_impl::plan(bio& b) const
{
    const block_limits& lim = _dev.info().limits;
    const uint32_t block = lim.logical_block_size;
    bio::split_state& s = b.split;
    s = bio::split_state{};
    s.queue = const_cast<queue_impl*>(this);
    s.op = b.op;
    s.failed_at = UINT64_MAX;
    s.next_offset = b.offset;
    s.left = b.length;
    b.transferred = 0;
    b.result_offset = 0;

    const op_properties* p = properties_of(b.op);
    if (p == nullptr) {
        return -EOPNOTSUPP;
    }
    // Anything that would change a read-only device is refused first, as
    // the block layer does (bio_check_ro), whatever the target offers.
    if (p->changes_media && lim.read_only) {
        return -EPERM;
    }
    auto check_range = [&] { return check_block_range(lim, b.offset, b.length); };
    switch (p->split) {
    case op_split::pieces: {
        if (p->payload == op_payload::data && (b.length == 0 || b.buffer == nullptr)) {
            return -EINVAL;
        }
        const uint32_t limit = lim.*(p->length_limit);
        // max_transfer_bytes 0: no limit but an io_request's 32 bits.
        const uint32_t transfer_max = piece_limit(
            lim.max_transfer_bytes != 0 ? lim.max_transfer_bytes : uint64_t{UINT32_MAX}, block);
        if (!p->limit_is_capability) {
            s.piece_max = transfer_max;
        } else if (limit != 0) {
            s.piece_max = piece_limit(limit, block);
        } else if (!p->zero_fill_fallback) {
            return -EOPNOTSUPP;
        } else if ((b.flags & k_io_fast_zero) != 0) {
            return -EOPNOTSUPP;  // zeroing would mean writing zero buffers: not fast
        } else {
            // The target has no write_zeroes: write zeros, which also keeps
            // the blocks allocated as k_io_no_unmap asks.
            s.op = io_op::write;
            s.emulated_zeroes = true;
            s.piece_max = std::min(transfer_max, k_zero_buffer_bytes - k_zero_buffer_bytes % block);
        }
        return check_range();
    }
    case op_split::one_piece:
        // One piece; a range beyond 32 bits is answered in part, which the
        // operation allows (the caller asks again from where it ended).
        if (b.length == 0 || b.buffer == nullptr || b.report_capacity == 0) {
            return -EINVAL;
        }
        if (int rc = check_range(); rc != 0) {
            return rc;
        }
        s.left = piece_limit(b.length, block);
        return 0;
    case op_split::never:
        if (b.length > UINT32_MAX) {
            return -EINVAL;  // never split: the pieces could land apart
        }
        return 0;
    case op_split::no_length:
        // One request of length 0; the queue validates the rest.
        s.left = 0;
        return 0;
    }
    return -EOPNOTSUPP;
}

void queue_impl::fill_piece(bio& b, io_request& r)
{
    bio::split_state& s = b.split;
    uint32_t length = static_cast<uint32_t>(s.left);
    if (s.piece_max != 0) {
        uint64_t room = std::min<uint64_t>(s.left, s.piece_max);
        const block_limits& lim = _dev.info().limits;
        if (lim.zoned && lim.zone_size_bytes != 0) {
            // Pieces never cross a zone boundary (the kernel's chunk_sectors).
            const uint64_t zone_end =
                (s.next_offset / lim.zone_size_bytes + 1) * lim.zone_size_bytes;
            room = std::min(room, zone_end - s.next_offset);
        }
        length = static_cast<uint32_t>(room);
    }
    r.op = s.op;
    r.flags = s.emulated_zeroes ? (b.flags & k_io_fua) : b.flags;
    r.offset = s.next_offset;
    r.length = length;
    r.report_capacity = b.report_capacity;
    if (s.emulated_zeroes) {
        r.buffer = zero_buffer();
    } else if (row(s.op).payload == op_payload::data && row(s.op).split == op_split::pieces) {
        // Each piece of split data has its part of the buffer.
        r.buffer = static_cast<char*>(b.buffer) + (s.next_offset - b.offset);
    } else {
        r.buffer = b.buffer;
    }
    r.result_offset = 0;
    r.on_complete = &queue_impl::piece_done;
    r.user_data = &b;
    s.next_offset += length;
    s.left -= length;
    s.started = true;
    ++s.pending;
}

void queue_impl::submit(bio& b)
{
    if (const int rc = plan(b); rc != 0) {
        b.split.status = rc;
        b.split.failed_at = b.offset;
        finish(b);
        return;
    }
    if (b.length == 0 && (b.op == io_op::discard || b.op == io_op::write_zeroes)) {
        finish(b);  // nothing to do
        return;
    }
    // Behind bios that already wait: a new bio does not overtake them.
    if (!_bios_waiting.empty()) {
        b.split.waiting = true;
        _bios_waiting.push(b);
        return;
    }
    submit_pieces(b, nullptr);
}

void queue_impl::submit_pieces(bio& b, io_request* reuse)
{
    bio::split_state& s = b.split;
    assert(has_more_pieces(b));
    s.submitting = true;
    do {
        io_request* r = reuse;
        reuse = nullptr;
        if (r == nullptr) {
            r = get_request();
            if (r == nullptr) {
                s.waiting = true;
                _bios_waiting.push(b);
                break;
            }
        }
        fill_piece(b, *r);
        submit(*r);
    } while (has_more_pieces(b));
    s.submitting = false;
    if (s.pending == 0 && !has_more_pieces(b)) {
        if (s.waiting) {
            _bios_waiting.remove(b);
            s.waiting = false;
        }
        finish(b);
    }
}

bool queue_impl::give_tag_to_waiting(io_request& r)
{
    while (!_bios_waiting.empty()) {
        bio& b = *_bios_waiting.pop();
        b.split.waiting = false;
        if (has_more_pieces(b)) {
            r.state = k_owned;
            submit_pieces(b, &r);
            return true;
        }
        // Failed while it waited: it completes when its pieces are back.
    }
    return false;
}

void queue_impl::piece_done(io_request& r, int result)
{
    bio& b = *static_cast<bio*>(r.user_data);
    bio::split_state& s = b.split;
    auto& q = *static_cast<queue_impl*>(s.queue);
    --s.pending;
    if (result < 0) {
        const uint64_t failed_at = r.offset + r.transferred;
        if (failed_at < s.failed_at) {
            s.failed_at = failed_at;
            s.status = result;
        }
    } else if (is_report(r.op)) {
        b.transferred = static_cast<uint64_t>(result);
    } else if (row(r.op).returns_offset) {
        b.result_offset = r.result_offset;
    }
    if (s.submitting) {
        return;  // submit_pieces looks at the bio when it is done
    }
    if (has_more_pieces(b)) {
        if (!s.waiting) {
            q.submit_pieces(b, &r);  // this tag carries the next piece
        }
        // A waiting bio queues behind older ones: the released tag goes to
        // the oldest.
        return;
    }
    if (s.pending == 0) {
        if (s.waiting) {
            q._bios_waiting.remove(b);
            s.waiting = false;
        }
        q.finish(b);
    }
    // Returning without resubmitting: the queue releases the tag, and
    // release_tag gives it to a bio that waits.
}

void queue_impl::finish(bio& b)
{
    const bio::split_state& s = b.split;
    if (!is_report(b.op)) {
        if (s.status == 0) {
            b.transferred = row(b.op).result == op_result::length ? b.length : 0;
        } else {
            b.transferred = s.failed_at > b.offset ? s.failed_at - b.offset : 0;
        }
    }
    if (b.on_complete != nullptr) {
        b.on_complete(b, s.status);
    }
}

void queue_impl::serve_waiting()
{
    while (!_bios_waiting.empty()) {
        io_request* r = get_request();
        if (r == nullptr) {
            return;
        }
        if (!give_tag_to_waiting(*r)) {
            put_request(*r);
            return;
        }
    }
}

}  // namespace softblk::core

namespace softblk {

namespace {

// What a synchronous caller on the queue's thread waits for.
struct sync_completion {
    int status = 0;
    bool done = false;
};

void on_sync_complete(bio& b, int status)
{
    auto* c = static_cast<sync_completion*>(b.user_data);
    c->status = status;
    c->done = true;
}

// What call() waits for: the completion runs on the owner's thread, and
// signals under the mutex so that the waiter cannot free this before the
// signal is done.
struct call_completion {
    std::mutex lock;
    std::condition_variable cv;
    int status = 0;
    bool done = false;
};

void on_call_complete(bio& b, int status)
{
    auto* c = static_cast<call_completion*>(b.user_data);
    std::lock_guard guard(c->lock);
    c->status = status;
    c->done = true;
    c->cv.notify_one();
}

// Runs `go` (submit `b` and wait) with b's completion sent to `fn` with
// `c`, then gives the caller's completion back. Returns c's status.
template <class Completion, class Go>
int run_redirected(bio& b, Completion& c, bio_completion_fn fn, Go&& go)
{
    const bio_completion_fn their_fn = b.on_complete;
    void* const their_data = b.user_data;
    b.on_complete = fn;
    b.user_data = &c;
    go();
    b.on_complete = their_fn;
    b.user_data = their_data;
    return c.status;
}

}  // namespace

int io_queue::run(bio& b)
{
    sync_completion c;
    return run_redirected(b, c, on_sync_complete, [&] {
        submit(b);
        while (!c.done) {
            wait(1, -1);
        }
    });
}

int io_queue::call(bio& b)
{
    call_completion c;
    return run_redirected(b, c, on_call_complete, [&] {
        post(b);
        std::unique_lock guard(c.lock);
        c.cv.wait(guard, [&] { return c.done; });
    });
}

result<std::vector<extent>> io_queue::map(uint64_t offset, uint64_t length)
{
    // The map is asked for in whole blocks and cut back to the range.
    const block_limits& lim = limits();
    std::vector<extent> out;
    const uint64_t capacity = current_capacity(lim);
    if (offset >= capacity) {
        return out;
    }
    const uint64_t end = offset + std::min(length, capacity - offset);
    const uint64_t block = lim.logical_block_size;
    uint64_t at = offset - offset % block;
    const uint64_t block_end = std::min(capacity, (end + block - 1) / block * block);
    extent window[64];
    auto append = [&](extent e) {
        const uint64_t from = std::max(e.offset, offset);
        const uint64_t to = std::min(e.offset + e.length, end);
        if (from >= to) {
            return;
        }
        e.offset = from;
        e.length = to - from;
        if (!out.empty() && out.back().allocated == e.allocated && out.back().zero == e.zero) {
            out.back().length += e.length;
        } else {
            out.push_back(e);
        }
    };
    while (at < block_end) {
        bio b;
        b.op = io_op::report_extents;
        b.offset = at;
        b.length = block_end - at;
        b.buffer = window;
        b.report_capacity = std::size(window);
        const int rc = run(b);
        if (rc == -EOPNOTSUPP) {
            // A target without an allocation map: all of it is data.
            append(extent{at, block_end - at, true, false});
            break;
        }
        if (rc < 0 || b.transferred == 0) {
            const int err = rc < 0 ? -rc : EIO;
            return make_error(err, fmt::format("cannot read the allocation map at offset {}: {}",
                                               at, std::strerror(err)));
        }
        for (uint64_t i = 0; i < b.transferred && at < block_end; ++i) {
            const extent& e = window[i];
            if (e.offset != at || e.length == 0) {
                return make_error(EIO,
                                  fmt::format("the allocation map has a gap at offset {}", at));
            }
            append(e);
            at += e.length;
        }
    }
    return out;
}

}  // namespace softblk
