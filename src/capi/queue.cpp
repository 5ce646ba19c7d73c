// libsoftblk's request path: submissions on preallocated slots, the
// completion callback that files them, and softblk_queue_do_io. Nothing
// here allocates; errors are negative errno values, and a failed request's
// message is written into its slot.
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "capi.hpp"

namespace softblk::capi {
namespace {

constexpr uint32_t k_known_flags = SOFTBLK_REQ_FUA | SOFTBLK_REQ_NO_UNMAP | SOFTBLK_REQ_FAST_ZERO;
static_assert(uint32_t{SOFTBLK_REQ_FUA} == uint32_t{k_io_fua} &&
              uint32_t{SOFTBLK_REQ_NO_UNMAP} == uint32_t{k_io_no_unmap} &&
              uint32_t{SOFTBLK_REQ_FAST_ZERO} == uint32_t{k_io_fast_zero});

static_assert(sizeof(softblk_completion) == 64 && sizeof(softblk_zone) == 64);
// report_zones: the core fills zone_descriptors into the caller's array of
// softblk_zone, which the completion widens in place (see widen_zones).
static_assert(sizeof(zone_descriptor) <= sizeof(softblk_zone) &&
              alignof(zone_descriptor) <= alignof(softblk_zone));
static_assert(SOFTBLK_ZONE_TYPE_SEQWRITE_REQ ==
                  static_cast<int>(zone_type::sequential_write_required) &&
              SOFTBLK_ZONE_COND_OFFLINE == static_cast<int>(zone_condition::offline) &&
              SOFTBLK_ZONE_COND_EXP_OPEN == static_cast<int>(zone_condition::explicit_open));

bool is_zone_op(io_op op)
{
    switch (op) {
    case io_op::zone_open:
    case io_op::zone_close:
    case io_op::zone_finish:
    case io_op::zone_reset:
    case io_op::zone_reset_all:
    case io_op::zone_append:
    case io_op::report_zones:
        return true;
    default:
        return false;
    }
}

// The core wrote `count` zone_descriptors at the start of `zones`; each
// becomes a softblk_zone at its own index. Last first: a softblk_zone is
// larger, so entry i's destination covers only sources i and above, which
// are already done.
void widen_zones(softblk_zone* zones, uint64_t count)
{
    const auto* from = reinterpret_cast<const unsigned char*>(zones);
    for (uint64_t i = count; i-- > 0;) {
        zone_descriptor d;
        std::memcpy(&d, from + i * sizeof(zone_descriptor), sizeof(d));
        softblk_zone z{};
        z.start = d.start;
        z.length = d.length;
        z.capacity = d.capacity;
        z.write_pointer = d.write_pointer;
        z.type = static_cast<uint8_t>(d.type);
        z.condition = static_cast<uint8_t>(d.condition);
        std::memcpy(&zones[i], &z, sizeof(z));
    }
}

// What failed and why, for the completion's error_msg: the core's errno
// explained with what the library knows of the request and the device.
void explain(request_slot& s, const block_limits& limits)
{
    const bio& b = s.b;
    const int err = -s.status;
    const char* op = to_string(b.op);
    const uint64_t capacity = current_capacity(limits);
    const uint32_t block = limits.logical_block_size;
    char* out = s.message;
    const size_t size = sizeof(s.message);
    if (is_zone_op(b.op) && !limits.zoned && err == EOPNOTSUPP) {
        std::snprintf(out, size,
                      "%s at %" PRIu64
                      ": the device is not zoned (zone operations need a zoned "
                      "device, e.g. null with zoned=1, or zloop-ram)",
                      op, b.offset);
    } else if (b.offset >= capacity || b.length > capacity - b.offset) {
        std::snprintf(out, size,
                      "%s of %" PRIu64 " bytes at %" PRIu64
                      ": beyond the end of the device (%" PRIu64 " bytes): %s",
                      op, b.length, b.offset, capacity, strerrordesc_np(err));
    } else if (block != 0 && (b.offset % block != 0 || b.length % block != 0)) {
        std::snprintf(out, size,
                      "%s of %" PRIu64 " bytes at %" PRIu64
                      ": offset and length must be multiples of the logical block size (%" PRIu32
                      " bytes): %s",
                      op, b.length, b.offset, block, strerrordesc_np(err));
    } else {
        std::snprintf(out, size, "%s of %" PRIu64 " bytes at %" PRIu64 ": %s (%s)", op, b.length,
                      b.offset, strerrordesc_np(err), strerrorname_np(err));
    }
}

void on_complete(bio& b, int status)
{
    auto& s = *static_cast<request_slot*>(b.user_data);
    softblk_queue& q = *s.queue;
    s.status = status;
    if (status < 0) {
        explain(s, q.queue->limits());
    } else if (b.op == io_op::report_zones) {
        widen_zones(static_cast<softblk_zone*>(b.buffer), b.transferred);
    }
    s.next = nullptr;
    if (q.done_tail != nullptr) {
        q.done_tail->next = &s;
    } else {
        q.done_head = &s;
    }
    q.done_tail = &s;
    --q.submitted;
    ++q.done;
}

// Takes a free slot and submits `b` (filled but for the completion) on it.
int submit(softblk_queue* q, const bio& request, void* user_data, uint32_t flags)
{
    if (q == nullptr) {
        return fail(EINVAL, "%s: no queue (NULL)", to_string(request.op));
    }
    if ((flags & ~k_known_flags) != 0) {
        return fail(EINVAL,
                    "%s: unknown flags 0x%" PRIx32
                    " (known: SOFTBLK_REQ_FUA, "
                    "SOFTBLK_REQ_NO_UNMAP, SOFTBLK_REQ_FAST_ZERO)",
                    to_string(request.op), flags & ~k_known_flags);
    }
    request_slot* s = q->free_list;
    if (s == nullptr) {
        return fail(EAGAIN,
                    "%s: all %u requests of the queue are in flight or not reaped; reap "
                    "completions with softblk_queue_do_io first",
                    to_string(request.op), q->slot_count);
    }
    q->free_list = s->next;
    s->b = request;
    s->b.flags = flags;
    s->b.on_complete = on_complete;
    s->b.user_data = s;
    s->user_data = user_data;
    s->status = 0;
    s->message[0] = '\0';
    ++q->submitted;
    // May complete at once (refused, or an inline target): on_complete
    // files it before this returns.
    q->queue->submit(s->b);
    return 0;
}

bio make(io_op op, uint64_t offset, uint64_t length, const void* buffer)
{
    bio b;
    b.op = op;
    b.offset = offset;
    b.length = length;
    // The core writes only into the buffers of reads and reports.
    b.buffer = const_cast<void*>(buffer);
    return b;
}

// Moves up to `max` filed completions to `out`; their slots become free.
unsigned reap(softblk_queue& q, softblk_completion* out, unsigned max)
{
    unsigned n = 0;
    while (n < max && q.done_head != nullptr) {
        request_slot& s = *q.done_head;
        q.done_head = s.next;
        if (q.done_head == nullptr) {
            q.done_tail = nullptr;
        }
        --q.done;
        softblk_completion& c = out[n++];
        c = softblk_completion{};
        c.user_data = s.user_data;
        c.ret = s.status < 0 ? s.status : 0;
        c.error_msg = s.status < 0 ? s.message : nullptr;
        c.transferred = s.b.transferred;
        c.result_offset = s.b.result_offset;
        s.next = q.free_list;
        q.free_list = &s;
    }
    return n;
}

int do_io(softblk_queue* q, softblk_completion* out, unsigned min, unsigned max, int64_t timeout_ns)
{
    if (q == nullptr) {
        return fail(EINVAL, "softblk_queue_do_io: no queue (NULL)");
    }
    if (min > max || (max > 0 && out == nullptr)) {
        return fail(EINVAL,
                    "softblk_queue_do_io: min_completions (%u) above max_completions (%u), or "
                    "no completions array",
                    min, max);
    }
    if (min > q->submitted + q->done) {
        return fail(EINVAL,
                    "softblk_queue_do_io: waiting for %u completions with only %u requests in "
                    "flight would never end",
                    min, q->submitted + q->done);
    }
    using clock = std::chrono::steady_clock;
    // The clock is read only for a timeout: a loop that reaps with no
    // limit (-1) pays for no clock_gettime.
    const auto deadline =
        timeout_ns < 0 ? clock::time_point{} : clock::now() + std::chrono::nanoseconds(timeout_ns);
    q->queue->process();
    unsigned n = reap(*q, out, max);
    while (n < min) {
        int64_t left = -1;
        if (timeout_ns >= 0) {
            left = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - clock::now())
                       .count();
            if (left <= 0) {
                break;
            }
        }
        q->queue->wait(min - n, left);
        n += reap(*q, out + n, max - n);
    }
    return static_cast<int>(n);
}

}  // namespace
}  // namespace softblk::capi

using softblk::bio;
using softblk::io_op;
using softblk::capi::guarded;
using softblk::capi::make;
using softblk::capi::submit;

extern "C" {

int softblk_queue_read(softblk_queue* q, uint64_t offset, void* buf, uint64_t len, void* user_data,
                       uint32_t flags)
{
    return guarded(
        "read", [&] { return submit(q, make(io_op::read, offset, len, buf), user_data, flags); });
}

int softblk_queue_write(softblk_queue* q, uint64_t offset, const void* buf, uint64_t len,
                        void* user_data, uint32_t flags)
{
    return guarded(
        "write", [&] { return submit(q, make(io_op::write, offset, len, buf), user_data, flags); });
}

int softblk_queue_flush(softblk_queue* q, void* user_data, uint32_t flags)
{
    return guarded("flush",
                   [&] { return submit(q, make(io_op::flush, 0, 0, nullptr), user_data, flags); });
}

int softblk_queue_discard(softblk_queue* q, uint64_t offset, uint64_t len, void* user_data,
                          uint32_t flags)
{
    return guarded("discard", [&] {
        return submit(q, make(io_op::discard, offset, len, nullptr), user_data, flags);
    });
}

int softblk_queue_write_zeroes(softblk_queue* q, uint64_t offset, uint64_t len, void* user_data,
                               uint32_t flags)
{
    return guarded("write_zeroes", [&] {
        return submit(q, make(io_op::write_zeroes, offset, len, nullptr), user_data, flags);
    });
}

int softblk_queue_zone_open(softblk_queue* q, uint64_t zone_offset, void* user_data, uint32_t flags)
{
    return guarded("zone_open", [&] {
        return submit(q, make(io_op::zone_open, zone_offset, 0, nullptr), user_data, flags);
    });
}

int softblk_queue_zone_close(softblk_queue* q, uint64_t zone_offset, void* user_data,
                             uint32_t flags)
{
    return guarded("zone_close", [&] {
        return submit(q, make(io_op::zone_close, zone_offset, 0, nullptr), user_data, flags);
    });
}

int softblk_queue_zone_finish(softblk_queue* q, uint64_t zone_offset, void* user_data,
                              uint32_t flags)
{
    return guarded("zone_finish", [&] {
        return submit(q, make(io_op::zone_finish, zone_offset, 0, nullptr), user_data, flags);
    });
}

int softblk_queue_zone_reset(softblk_queue* q, uint64_t zone_offset, void* user_data,
                             uint32_t flags)
{
    return guarded("zone_reset", [&] {
        return submit(q, make(io_op::zone_reset, zone_offset, 0, nullptr), user_data, flags);
    });
}

int softblk_queue_zone_reset_all(softblk_queue* q, void* user_data, uint32_t flags)
{
    return guarded("zone_reset_all", [&] {
        return submit(q, make(io_op::zone_reset_all, 0, 0, nullptr), user_data, flags);
    });
}

int softblk_queue_zone_append(softblk_queue* q, uint64_t zone_offset, const void* buf, uint64_t len,
                              void* user_data, uint32_t flags)
{
    return guarded("zone_append", [&] {
        return submit(q, make(io_op::zone_append, zone_offset, len, buf), user_data, flags);
    });
}

int softblk_queue_report_zones(softblk_queue* q, uint64_t offset, softblk_zone* zones,
                               uint32_t nr_zones, void* user_data, uint32_t flags)
{
    return guarded("report_zones", [&] {
        bio b = make(io_op::report_zones, offset, 0, zones);
        b.report_capacity = nr_zones;
        return submit(q, b, user_data, flags);
    });
}

int softblk_queue_do_io(softblk_queue* q, softblk_completion* completions, unsigned min_completions,
                        unsigned max_completions, int64_t timeout_ns)
{
    return guarded("softblk_queue_do_io", [&] {
        return softblk::capi::do_io(q, completions, min_completions, max_completions, timeout_ns);
    });
}

unsigned softblk_queue_in_flight(const softblk_queue* q)
{
    return q == nullptr ? 0 : q->submitted + q->done;
}

}  // extern "C"
