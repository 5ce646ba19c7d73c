#include "driver_queue.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sys/mman.h>
#include <unistd.h>

#include <softblk/support/clock.hpp>
#include <softblk/support/cpu_relax.hpp>

namespace softblk::virtio_driver {

namespace {

constexpr uint8_t k_no_status = 0xff;  // what a back end that never answers leaves

void kick(int fd)
{
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(fd, &one, sizeof one);
}

void drain(int fd)
{
    uint64_t v;
    [[maybe_unused]] ssize_t n = ::read(fd, &v, sizeof v);
}

void bump(std::atomic<uint64_t>& counter)
{
    // Single writer (the queue thread): no locked instruction needed.
    counter.store(counter.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
}

// _on_ring values.
constexpr uint8_t k_held = 0;     // pending, waiting for a connection to go on
constexpr uint8_t k_out = 1;      // in the current ring
constexpr uint8_t k_was_out = 2;  // in the ring of a connection being replaced (move_on)

uint32_t virtio_type(const io_request& r, bool flush_after_write)
{
    if (flush_after_write) {
        return VIRTIO_BLK_T_FLUSH;
    }
    switch (r.op) {
    case io_op::read:
        return VIRTIO_BLK_T_IN;
    case io_op::write:
        return VIRTIO_BLK_T_OUT;
    case io_op::flush:
        return VIRTIO_BLK_T_FLUSH;
    case io_op::discard:
        return VIRTIO_BLK_T_DISCARD;
    case io_op::write_zeroes:
        return VIRTIO_BLK_T_WRITE_ZEROES;
    case io_op::zone_open:
        return VIRTIO_BLK_T_ZONE_OPEN;
    case io_op::zone_close:
        return VIRTIO_BLK_T_ZONE_CLOSE;
    case io_op::zone_finish:
        return VIRTIO_BLK_T_ZONE_FINISH;
    case io_op::zone_reset:
        return VIRTIO_BLK_T_ZONE_RESET;
    case io_op::zone_reset_all:
        return VIRTIO_BLK_T_ZONE_RESET_ALL;
    case io_op::zone_append:
        return VIRTIO_BLK_T_ZONE_APPEND;
    case io_op::report_zones:
        return VIRTIO_BLK_T_ZONE_REPORT;
    case io_op::report_extents:
        break;
    }
    return UINT32_MAX;
}

}  // namespace

connection_memory::~connection_memory()
{
    for (const queue_layout& q : queues) {
        if (q.kick_fd >= 0) {
            ::close(q.kick_fd);  // the call eventfd is the queue's, not the connection's
        }
    }
    if (base != nullptr) {
        ::munmap(base, bytes);
    }
    if (memfd >= 0) {
        ::close(memfd);
    }
}

std::shared_ptr<connection_memory> backend_link::memory() const
{
    std::lock_guard lock(_mutex);
    return _memory;
}

void backend_link::request_reset(uint32_t generation)
{
    uint32_t expected = generation;
    if (_wanted.compare_exchange_strong(expected, generation + 1, std::memory_order_acq_rel)) {
        kick(_reset_fd);
    }
}

void backend_link::publish(std::shared_ptr<connection_memory> memory)
{
    const uint32_t generation = memory->generation;
    {
        std::lock_guard lock(_mutex);
        _memory = std::move(memory);
    }
    _ready.store(generation, std::memory_order_release);
}

driver_queue::driver_queue(unsigned index, backend_link& link) : _index(index), _link(link)
{
    attach(link.memory());
    const uint32_t depth = _layout.depth;
    _pending = std::make_unique<io_request*[]>(depth);
    _fua_pending = std::make_unique<uint8_t[]>(depth);
    _on_ring = std::make_unique<uint8_t[]>(depth);
    for (uint32_t t = 0; t < depth; ++t) {
        _pending[t] = nullptr;
        _fua_pending[t] = 0;
        _on_ring[t] = k_held;
    }
}

void driver_queue::attach(std::shared_ptr<connection_memory> memory)
{
    // The previous connection's memory is unmapped here when this queue
    // was the last to use it (once per reconnection).
    _memory = std::move(memory);
    _generation = _memory->generation;
    _layout = _memory->queues[_index];
    _ring.init(_layout.ring, _layout.num, _layout.event_idx);
    if (_layout.polling) {
        _ring.disable_interrupts();
    }
}

void driver_queue::move_on()
{
    // Only to the connection the queues should be on, once it is set up.
    if (_link.ready() != _link.wanted()) {
        return;
    }
    std::shared_ptr<connection_memory> next = _link.memory();
    if (next == nullptr || next->generation == _generation) {
        return;
    }
    for (uint32_t t = 0; t < _layout.depth; ++t) {
        if (_pending[t] != nullptr && _on_ring[t] == k_out) {
            _on_ring[t] = k_was_out;
        }
    }
    attach(std::move(next));
    // Everything pending goes to the new connection: what waited, and what
    // the old back end held and never returned. Completions delivered in
    // this loop may submit again (placed at once): those are k_out.
    for (uint32_t t = 0; t < _layout.depth; ++t) {
        io_request* r = _pending[t];
        if (r == nullptr || _on_ring[t] == k_out) {
            continue;
        }
        const bool was_out = _on_ring[t] == k_was_out;
        _on_ring[t] = k_held;
        if (was_out && r->op == io_op::zone_append) {
            // The old back end may have appended it: another append could
            // write the data twice.
            _pending[t] = nullptr;
            --_in_flight;
            deliver(*r, -EIO);
            continue;
        }
        if (was_out) {
            bump(_resubmitted);
        }
        place(*r, _fua_pending[t] != 0);
    }
}

uint64_t driver_queue::next_wakeup_ns() const
{
    // Unpublished requests go out at the next poll(); a polling queue
    // looks at the used ring all the time while requests are out.
    if (_ring.has_unpublished() || (_layout.polling && _in_flight != 0) ||
        (_in_flight != 0 && _link.dead())) {
        return 0;
    }
    // A new connection is ready for the requests that wait for one.
    if (_in_flight != 0 && _generation != _link.wanted() && _link.ready() == _link.wanted()) {
        return 0;
    }
    return UINT64_MAX;
}

void driver_queue::deliver(io_request& r, int result)
{
    _sink->complete(r, result);
}

void driver_queue::submit(io_request& r)
{
    if (_link.dead()) {
        deliver(r, -EIO);
        return;
    }
    if (r.tag >= _layout.depth || _pending[r.tag] != nullptr) {
        deliver(r, -EBUSY);  // a bug of the caller: two requests on one tag
        return;
    }
    if ((r.op == io_op::read || r.op == io_op::write || r.op == io_op::zone_append) &&
        r.length > _layout.data_bytes) {
        deliver(r, -EINVAL);
        return;
    }
    if (virtio_type(r, false) == UINT32_MAX) {
        deliver(r, -EOPNOTSUPP);
        return;
    }
    if (_generation != _link.wanted()) {
        move_on();
    }
    _pending[r.tag] = &r;
    _fua_pending[r.tag] = 0;
    ++_in_flight;
    place(r, false);
}

void driver_queue::place(io_request& r, bool flush_after_write)
{
    if (_generation != _link.wanted()) {
        // This connection is being replaced: wait for the next one.
        _on_ring[r.tag] = k_held;
        return;
    }
    prepare(r, flush_after_write);
    _on_ring[r.tag] = k_out;
}

bool driver_queue::timed_out(io_request& r)
{
    const uint32_t tag = r.tag;
    if (tag >= _layout.depth || _pending[tag] != &r) {
        return false;
    }
    _pending[tag] = nullptr;
    --_in_flight;
    if (_on_ring[tag] == k_out) {
        // The back end still holds the chain and may write into its slot at
        // any time: nothing goes on this connection's ring again, and the
        // connection is replaced.
        _on_ring[tag] = k_held;
        bump(_given_up);
        _link.request_reset(_generation);
    }
    return true;
}

void driver_queue::prepare(io_request& r, bool flush_after_write)
{
    const uint32_t tag = r.tag;
    tag_area& t = _layout.tags[tag];
    uint8_t* data = _layout.data + uint64_t{tag} * _layout.data_bytes;
    const uint32_t type = virtio_type(r, flush_after_write);
    t.header.type = type;
    t.header.ioprio = 0;
    t.header.sector =
        type == VIRTIO_BLK_T_FLUSH || type == VIRTIO_BLK_T_ZONE_RESET_ALL ? 0 : r.offset / 512;
    t.in[15] = k_no_status;

    vring_desc chain[3];
    unsigned n = 0;
    chain[n++] = vring_desc{.addr = addr(&t.header), .len = sizeof t.header, .flags = 0, .next = 0};
    bool status16 = false;
    switch (type) {
    case VIRTIO_BLK_T_IN:
        chain[n++] =
            vring_desc{.addr = addr(data), .len = r.length, .flags = VRING_DESC_F_WRITE, .next = 0};
        break;
    case VIRTIO_BLK_T_OUT:
        std::memcpy(data, r.buffer, r.length);
        chain[n++] = vring_desc{.addr = addr(data), .len = r.length, .flags = 0, .next = 0};
        break;
    case VIRTIO_BLK_T_ZONE_APPEND:
        std::memcpy(data, r.buffer, r.length);
        chain[n++] = vring_desc{.addr = addr(data), .len = r.length, .flags = 0, .next = 0};
        status16 = true;
        break;
    case VIRTIO_BLK_T_DISCARD:
    case VIRTIO_BLK_T_WRITE_ZEROES:
        t.range.sector = r.offset / 512;
        t.range.num_sectors = r.length / 512;
        t.range.flags = type == VIRTIO_BLK_T_WRITE_ZEROES && (r.flags & k_io_no_unmap) == 0
                            ? VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP
                            : 0;
        chain[n++] =
            vring_desc{.addr = addr(&t.range), .len = sizeof t.range, .flags = 0, .next = 0};
        break;
    case VIRTIO_BLK_T_ZONE_REPORT: {
        const uint64_t want =
            sizeof(virtio::virtio_blk_zone_report) +
            uint64_t{r.report_capacity} * sizeof(virtio::virtio_blk_zone_descriptor);
        const uint32_t len = static_cast<uint32_t>(std::min<uint64_t>(want, _layout.data_bytes));
        chain[n++] =
            vring_desc{.addr = addr(data), .len = len, .flags = VRING_DESC_F_WRITE, .next = 0};
        break;
    }
    default:  // FLUSH and zone management: header and status only
        break;
    }
    chain[n++] =
        status16
            ? vring_desc{.addr = addr(&t.in[0]), .len = 16, .flags = VRING_DESC_F_WRITE, .next = 0}
            : vring_desc{.addr = addr(&t.in[15]), .len = 1, .flags = VRING_DESC_F_WRITE, .next = 0};

    if (_layout.indirect) {
        for (unsigned i = 0; i < n; ++i) {
            chain[i].next = static_cast<uint16_t>(i + 1);
            chain[i].flags |= i + 1 < n ? VRING_DESC_F_NEXT : 0;
            t.indirect[i] = chain[i];
        }
        _ring.table()[tag] = vring_desc{.addr = addr(t.indirect),
                                        .len = static_cast<uint32_t>(n * sizeof(vring_desc)),
                                        .flags = VRING_DESC_F_INDIRECT,
                                        .next = 0};
        _ring.add(static_cast<uint16_t>(tag));
        return;
    }
    const uint16_t base = static_cast<uint16_t>(3 * tag);
    vring_desc* table = _ring.table();
    for (unsigned i = 0; i < n; ++i) {
        chain[i].next = static_cast<uint16_t>(base + i + 1);
        chain[i].flags |= i + 1 < n ? VRING_DESC_F_NEXT : 0;
        table[base + i] = chain[i];
    }
    _ring.add(base);
}

int driver_queue::finish_report(io_request& r, const tag_area& t)
{
    const uint8_t* data = _layout.data + uint64_t{r.tag} * _layout.data_bytes;
    virtio::virtio_blk_zone_report head;
    std::memcpy(&head, data, sizeof head);
    const uint64_t room =
        (std::min<uint64_t>(
             sizeof head + uint64_t{r.report_capacity} * sizeof(virtio::virtio_blk_zone_descriptor),
             _layout.data_bytes) -
         sizeof head) /
        sizeof(virtio::virtio_blk_zone_descriptor);
    const uint64_t n = std::min<uint64_t>(head.nr_zones, room);
    auto* out = static_cast<zone_descriptor*>(r.buffer);
    for (uint64_t i = 0; i < n; ++i) {
        virtio::virtio_blk_zone_descriptor d;
        std::memcpy(&d, data + sizeof head + i * sizeof d, sizeof d);
        zone_descriptor& z = out[i];
        z.start = d.z_start * 512;
        z.capacity = d.z_cap * 512;
        z.write_pointer = d.z_wp * 512;
        z.type = virtio::zone_type_from_virtio(d.z_type);
        z.condition = virtio::zone_condition_from_virtio(d.z_state);
        // Virtio reports no zone length: the zone size, short for a
        // smaller last zone.
        z.length = z.start < _layout.capacity_bytes
                       ? std::min(_layout.zone_bytes, _layout.capacity_bytes - z.start)
                       : _layout.zone_bytes;
    }
    return static_cast<int>(n);
}

void driver_queue::complete(uint32_t id)
{
    const uint32_t tag = _layout.indirect ? id : id / 3;
    const bool valid = _layout.indirect ? id < _layout.depth : id % 3 == 0 && tag < _layout.depth;
    if (!valid || _pending[tag] == nullptr || _on_ring[tag] != k_out) {
        // A back end that returns what it never got, or a chain given up
        // (timed out) that the back end of a connection being replaced
        // returns late: ignored.
        bump(_bogus);
        return;
    }
    io_request& r = *_pending[tag];
    const tag_area& t = _layout.tags[tag];
    int result = virtio::errno_from_status(t.in[15]);
    if (result == 0 && _fua_pending[tag] == 0) {
        switch (r.op) {
        case io_op::read:
            std::memcpy(r.buffer, _layout.data + uint64_t{tag} * _layout.data_bytes, r.length);
            result = static_cast<int>(r.length);
            break;
        case io_op::write:
            if ((r.flags & k_io_fua) != 0 && _layout.volatile_cache) {
                // Virtio 1.2 has no FUA: make the write durable with a FLUSH
                // on the same tag before it completes.
                _fua_pending[tag] = 1;
                place(r, true);
                return;
            }
            result = static_cast<int>(r.length);
            break;
        case io_op::zone_append: {
            uint64_t sector;
            std::memcpy(&sector, t.in, sizeof sector);
            r.result_offset = sector * 512;
            result = static_cast<int>(r.length);
            break;
        }
        case io_op::report_zones:
            result = finish_report(r, t);
            break;
        default:
            result = 0;
            break;
        }
    } else if (result == 0) {
        result = static_cast<int>(r.length);  // the FLUSH after a FUA write
    }
    _pending[tag] = nullptr;
    _on_ring[tag] = k_held;
    --_in_flight;
    deliver(r, result);
}

void driver_queue::fail_all(int result)
{
    for (uint32_t t = 0; t < _layout.depth; ++t) {
        if (io_request* r = _pending[t]) {
            _pending[t] = nullptr;
            _on_ring[t] = k_held;
            --_in_flight;
            deliver(*r, result);
        }
    }
}

unsigned driver_queue::poll()
{
    if (_generation != _link.wanted()) {
        move_on();
    }
    if (_ring.has_unpublished() && _ring.publish()) {
        kick(_layout.kick_fd);
    }
    unsigned done = 0;
    for (;;) {
        uint32_t id, len;
        while (_ring.next_used(id, len)) {
            complete(id);
            ++done;
        }
        if (_ring.has_unpublished() && _ring.publish()) {
            kick(_layout.kick_fd);  // FLUSHes after FUA writes
        }
        if (_in_flight == 0 || _layout.polling) {
            break;
        }
        // Before the owner sleeps on the call eventfd: clear it when it has
        // told us nothing new, ask for the next notification, and look once
        // more for entries that came in between.
        if (done == 0) {
            drain(_layout.call_fd);
        }
        if (!_ring.enable_interrupts()) {
            break;
        }
    }
    if (_layout.polling) {
        _ring.disable_interrupts();
    }
    if (_in_flight != 0 && _link.dead()) {
        fail_all(-EIO);
    }
    return done;
}

int driver_queue::run_sync(io_request& r, uint64_t timeout_ns)
{
    struct sync_sink final : completion_sink {
        void complete(io_request&, int result) override
        {
            done = true;
            value = result;
        }
        bool done = false;
        int value = 0;
    } sink;
    completion_sink* saved = _sink;
    _sink = &sink;
    r.tag = 0;
    submit(r);
    const uint64_t give_up = monotonic_ns() + timeout_ns;
    while (!sink.done && monotonic_ns() < give_up) {
        poll();
        if (!sink.done) {
            ::usleep(50);
        }
    }
    _sink = saved;
    if (!sink.done) {
        return -ETIMEDOUT;  // the tag stays taken: the device is not usable
    }
    return sink.value;
}

}  // namespace softblk::virtio_driver
