#include <softblk/virtio/split_ring.hpp>

#include <cstring>

namespace softblk::virtio {

namespace {

// Shared-memory fields are read and written with single atomic accesses:
// the other side may change them at any time, and a field must be read
// once before it is checked and used.
template <class T>
T load_relaxed(const T* p)
{
    return __atomic_load_n(p, __ATOMIC_RELAXED);
}
template <class T>
T load_acquire(const T* p)
{
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
template <class T>
void store_relaxed(T* p, T v)
{
    __atomic_store_n(p, v, __ATOMIC_RELAXED);
}
template <class T>
void store_release(T* p, T v)
{
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
}
void full_fence()
{
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

bool power_of_two(uint32_t n)
{
    return n != 0 && (n & (n - 1)) == 0;
}

uint16_t* used_event_of(vring_avail* avail, uint32_t num)
{
    return &avail->ring[num];
}
uint16_t* avail_event_of(vring_used* used, uint32_t num)
{
    return reinterpret_cast<uint16_t*>(&used->ring[num]);
}

uint64_t align64(uint64_t n)
{
    return (n + 63) & ~uint64_t{63};
}

}  // namespace

const char* to_string(chain_error e)
{
    switch (e) {
    case chain_error::none:
        return "no error";
    case chain_error::head_out_of_range:
        return "head index beyond the queue size";
    case chain_error::next_out_of_range:
        return "next index beyond the descriptor table";
    case chain_error::too_long:
        return "descriptor chain longer than its table (a loop)";
    case chain_error::indirect_not_negotiated:
        return "indirect descriptor without VIRTIO_RING_F_INDIRECT_DESC";
    case chain_error::indirect_bad_size:
        return "indirect table length is 0, not a multiple of 16 or too long";
    case chain_error::indirect_nested:
        return "indirect descriptor inside an indirect table";
    case chain_error::indirect_with_next:
        return "indirect descriptor with VRING_DESC_F_NEXT";
    case chain_error::indirect_unmapped:
        return "indirect table outside the shared memory";
    case chain_error::address_unmapped:
        return "buffer outside the shared memory";
    case chain_error::readable_after_writable:
        return "device-readable buffer after a device-writable one";
    case chain_error::too_many_segments:
        return "more buffers than a request may have";
    }
    return "?";
}

chain_error walk_chain(const guest_memory& mem, const vring_desc* table, uint32_t num,
                       uint16_t head, bool indirect_allowed, chain& out)
{
    out.count = 0;
    out.readable = 0;
    out.readable_bytes = 0;
    out.writable_bytes = 0;
    out.descriptors = 0;
    if (head >= num) {
        return chain_error::head_out_of_range;
    }
    const vring_desc* tab = table;
    uint32_t tab_size = num;
    uint32_t index = head;
    uint32_t walked = 0;  // in the current table: more than its size is a loop
    bool in_indirect = false;
    bool seen_writable = false;
    for (;;) {
        if (++walked > tab_size) {
            return chain_error::too_long;
        }
        // One copy of the descriptor, then only the copy is used (indirect
        // tables may be unaligned: memcpy).
        vring_desc d;
        std::memcpy(&d, &tab[index], sizeof d);
        ++out.descriptors;
        if ((d.flags & VRING_DESC_F_INDIRECT) != 0) {
            if (!indirect_allowed) {
                return chain_error::indirect_not_negotiated;
            }
            if (in_indirect) {
                return chain_error::indirect_nested;
            }
            if ((d.flags & VRING_DESC_F_NEXT) != 0) {
                return chain_error::indirect_with_next;
            }
            if (d.len == 0 || d.len % sizeof(vring_desc) != 0 ||
                d.len / sizeof(vring_desc) > k_max_queue_size) {
                return chain_error::indirect_bad_size;
            }
            const uint8_t* t = mem.guest_to_host(d.addr, d.len);
            if (t == nullptr) {
                return chain_error::indirect_unmapped;
            }
            tab = reinterpret_cast<const vring_desc*>(t);
            tab_size = d.len / sizeof(vring_desc);
            index = 0;
            walked = 0;
            in_indirect = true;
            continue;
        }
        const bool writable = (d.flags & VRING_DESC_F_WRITE) != 0;
        if (!writable && seen_writable) {
            return chain_error::readable_after_writable;
        }
        seen_writable = seen_writable || writable;
        uint64_t addr = d.addr;
        uint64_t left = d.len;
        while (left > 0) {
            uint64_t run = 0;
            uint8_t* p = mem.guest_to_host_partial(addr, left, run);
            if (p == nullptr) {
                return chain_error::address_unmapped;
            }
            if (out.count == out.storage.size()) {
                return chain_error::too_many_segments;
            }
            out.storage[out.count++] = segment{p, static_cast<uint32_t>(run)};
            addr += run;
            left -= run;
        }
        if (writable) {
            out.writable_bytes += d.len;
        } else {
            out.readable = out.count;
            out.readable_bytes += d.len;
        }
        if ((d.flags & VRING_DESC_F_NEXT) == 0) {
            return chain_error::none;
        }
        if (d.next >= tab_size) {
            return chain_error::next_out_of_range;
        }
        index = d.next;
    }
}

// ---------------------------------------------------------------- device

const char* device_ring::attach(const guest_memory& mem, uint64_t desc_uaddr, uint64_t avail_uaddr,
                                uint64_t used_uaddr, uint32_t num, bool event_idx, bool indirect)
{
    _desc = nullptr;
    if (!power_of_two(num) || num > k_max_queue_size) {
        return "queue size is not a power of two from 1 to 1024";
    }
    if (desc_uaddr % 16 != 0 || avail_uaddr % 2 != 0 || used_uaddr % 4 != 0) {
        return "ring address misaligned (descriptors 16, available ring 2, used ring 4 bytes)";
    }
    uint8_t* desc = mem.user_to_host(desc_uaddr, desc_table_bytes(num));
    uint8_t* avail = mem.user_to_host(avail_uaddr, avail_ring_bytes(num));
    uint8_t* used = mem.user_to_host(used_uaddr, used_ring_bytes(num));
    if (desc == nullptr || avail == nullptr || used == nullptr) {
        return "ring outside the shared memory";
    }
    if (reinterpret_cast<uintptr_t>(desc) % 16 != 0 || reinterpret_cast<uintptr_t>(avail) % 2 ||
        reinterpret_cast<uintptr_t>(used) % 4 != 0) {
        return "ring misaligned in the mapping (region offsets not page aligned)";
    }
    _desc = reinterpret_cast<vring_desc*>(desc);
    _avail = reinterpret_cast<vring_avail*>(avail);
    _used = reinterpret_cast<vring_used*>(used);
    _num = num;
    _event_idx = event_idx;
    _indirect = indirect;
    return nullptr;
}

void device_ring::set_last_avail(uint16_t idx)
{
    _last_avail = idx;
    _avail_cache = idx;
    _used_shadow = load_acquire(&_used->idx);
    _used_published = _used_shadow;
}

uint16_t device_ring::used_idx_in_ring() const
{
    return load_acquire(&_used->idx);
}

int device_ring::pop(uint16_t& head)
{
    if (_last_avail == _avail_cache) {
        _avail_cache = load_acquire(&_avail->idx);
        if (_avail_cache == _last_avail) {
            return 0;
        }
    }
    if (static_cast<uint16_t>(_avail_cache - _last_avail) > _num) {
        return -1;
    }
    head = load_relaxed(&_avail->ring[_last_avail & (_num - 1)]);
    ++_last_avail;
    return 1;
}

void device_ring::push_used(uint16_t head, uint32_t len)
{
    vring_used_elem* e = &_used->ring[_used_shadow & (_num - 1)];
    store_relaxed(&e->id, uint32_t{head});
    store_relaxed(&e->len, len);
    ++_used_shadow;
}

bool device_ring::publish_used()
{
    if (_used_shadow == _used_published) {
        return false;
    }
    const uint16_t old = _used_published;
    store_release(&_used->idx, _used_shadow);
    _used_published = _used_shadow;
    // The driver's suppression field is read after the index is visible
    // (the other side does the opposite), so one of us sees the other.
    full_fence();
    if (_event_idx) {
        const uint16_t event = load_relaxed(used_event_of(_avail, _num));
        return vring_need_event(event, _used_shadow, old) != 0;
    }
    return (load_relaxed(&_avail->flags) & VRING_AVAIL_F_NO_INTERRUPT) == 0;
}

bool device_ring::enable_kicks()
{
    if (_event_idx) {
        store_relaxed(avail_event_of(_used, _num), _last_avail);
    } else {
        store_relaxed(&_used->flags, uint16_t{0});
    }
    full_fence();
    _avail_cache = load_acquire(&_avail->idx);
    return _avail_cache != _last_avail;
}

void device_ring::disable_kicks()
{
    if (!_event_idx) {
        store_relaxed(&_used->flags, uint16_t{VRING_USED_F_NO_NOTIFY});
    }
}

// ---------------------------------------------------------------- driver

uint64_t driver_ring::bytes(uint32_t num)
{
    const uint64_t used_off = align64(desc_table_bytes(num) + avail_ring_bytes(num));
    return align64(used_off + used_ring_bytes(num));
}

void driver_ring::init(void* memory, uint32_t num, bool event_idx)
{
    std::memset(memory, 0, bytes(num));
    auto* base = static_cast<uint8_t*>(memory);
    _desc = reinterpret_cast<vring_desc*>(base);
    _avail = reinterpret_cast<vring_avail*>(base + desc_table_bytes(num));
    _used = reinterpret_cast<vring_used*>(base +
                                          align64(desc_table_bytes(num) + avail_ring_bytes(num)));
    _num = num;
    _event_idx = event_idx;
    _avail_shadow = 0;
    _avail_published = 0;
    _last_used = 0;
}

void driver_ring::add(uint16_t head)
{
    store_relaxed(&_avail->ring[_avail_shadow & (_num - 1)], head);
    ++_avail_shadow;
}

bool driver_ring::publish()
{
    if (_avail_shadow == _avail_published) {
        return false;
    }
    const uint16_t old = _avail_published;
    store_release(&_avail->idx, _avail_shadow);
    _avail_published = _avail_shadow;
    full_fence();
    if (_event_idx) {
        const uint16_t event = load_relaxed(avail_event_of(_used, _num));
        return vring_need_event(event, _avail_shadow, old) != 0;
    }
    return (load_relaxed(&_used->flags) & VRING_USED_F_NO_NOTIFY) == 0;
}

bool driver_ring::next_used(uint32_t& id, uint32_t& len)
{
    if (load_acquire(&_used->idx) == _last_used) {
        return false;
    }
    const vring_used_elem* e = &_used->ring[_last_used & (_num - 1)];
    id = load_relaxed(&e->id);
    len = load_relaxed(&e->len);
    ++_last_used;
    return true;
}

bool driver_ring::enable_interrupts()
{
    if (_event_idx) {
        store_relaxed(used_event_of(_avail, _num), _last_used);
    } else {
        store_relaxed(&_avail->flags, uint16_t{0});
    }
    full_fence();
    return load_acquire(&_used->idx) != _last_used;
}

void driver_ring::disable_interrupts()
{
    if (_event_idx) {
        store_relaxed(used_event_of(_avail, _num), static_cast<uint16_t>(_last_used + 0x8000));
    } else {
        store_relaxed(&_avail->flags, uint16_t{VRING_AVAIL_F_NO_INTERRUPT});
    }
}

}  // namespace softblk::virtio
