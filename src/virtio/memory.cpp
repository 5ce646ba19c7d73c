#include <softblk/virtio/memory.hpp>

namespace softblk::virtio {

namespace {

// [a, a + n) and [b, b + m) overlap (neither wraps: checked by add()).
bool overlaps(uint64_t a, uint64_t n, uint64_t b, uint64_t m)
{
    return a < b + m && b < a + n;
}

}  // namespace

bool guest_memory::add(const memory_region& r)
{
    if (_count == k_max_regions || r.size == 0 || r.host == nullptr ||
        r.guest_addr + r.size < r.guest_addr || r.user_addr + r.size < r.user_addr ||
        r.guest_addr + r.size == 0 || r.user_addr + r.size == 0) {
        return false;
    }
    for (unsigned i = 0; i < _count; ++i) {
        const memory_region& o = _regions[i];
        if (overlaps(r.guest_addr, r.size, o.guest_addr, o.size) ||
            overlaps(r.user_addr, r.size, o.user_addr, o.size)) {
            return false;
        }
    }
    _regions[_count++] = r;
    return true;
}

bool guest_memory::remove(uint64_t guest_addr, uint64_t user_addr, uint64_t size,
                          memory_region& removed)
{
    for (unsigned i = 0; i < _count; ++i) {
        const memory_region& r = _regions[i];
        if (r.guest_addr == guest_addr && r.user_addr == user_addr && r.size == size) {
            removed = r;
            _regions[i] = _regions[--_count];
            return true;
        }
    }
    return false;
}

const memory_region* guest_memory::find(uint64_t addr, uint64_t memory_region::*base,
                                        uint64_t& offset) const
{
    for (unsigned i = 0; i < _count; ++i) {
        const memory_region& r = _regions[i];
        if (addr >= r.*base && addr - r.*base < r.size) {
            offset = addr - r.*base;
            return &r;
        }
    }
    return nullptr;
}

uint8_t* guest_memory::guest_to_host(uint64_t gpa, uint64_t len) const
{
    uint64_t off = 0;
    const memory_region* r = find(gpa, &memory_region::guest_addr, off);
    return r != nullptr && (len == 0 ? 1 : len) <= r->size - off ? r->host + off : nullptr;
}

uint8_t* guest_memory::guest_to_host_partial(uint64_t gpa, uint64_t len, uint64_t& contiguous) const
{
    uint64_t off = 0;
    const memory_region* r = find(gpa, &memory_region::guest_addr, off);
    if (r == nullptr) {
        contiguous = 0;
        return nullptr;
    }
    contiguous = len < r->size - off ? len : r->size - off;
    return r->host + off;
}

uint8_t* guest_memory::user_to_host(uint64_t uaddr, uint64_t len) const
{
    uint64_t off = 0;
    const memory_region* r = find(uaddr, &memory_region::user_addr, off);
    return r != nullptr && (len == 0 ? 1 : len) <= r->size - off ? r->host + off : nullptr;
}

}  // namespace softblk::virtio
