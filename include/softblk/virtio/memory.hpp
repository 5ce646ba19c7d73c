// The memory a virtio driver shares with its device, as the device sees it:
// regions of the driver's (guest's) address space mapped into this
// process. Every address that comes from the other side (descriptor
// addresses, ring addresses, indirect tables) goes through here, and only
// a range that lies inside one region gives a pointer, so a hostile driver
// can name no byte outside what it shared.
//
// Pure: standard library only (the fuzz targets build it with clang).
#pragma once

#include <cstdint>

namespace softblk::virtio {

struct memory_region {
    // Guest physical address of the region's first byte (what descriptors
    // carry).
    uint64_t guest_addr = 0;
    // The same byte in the front end's virtual address space (what
    // vhost-user ring addresses carry).
    uint64_t user_addr = 0;
    uint64_t size = 0;
    // Where that byte is mapped in this process. Not owned: whoever maps
    // the region unmaps it after removing it here.
    uint8_t* host = nullptr;
};

class guest_memory {
public:
    // At most this many regions (what GET_MAX_MEM_SLOTS announces).
    static constexpr unsigned k_max_regions = 32;

    // Adds `r`. Returns false (and adds nothing) when the table is full,
    // the size is 0, an address range wraps around 2^64, or the region
    // overlaps another one in guest or user addresses.
    bool add(const memory_region& r);

    // Removes the region with exactly this guest address, user address and
    // size, copying it to `removed`. Returns false if there is none.
    bool remove(uint64_t guest_addr, uint64_t user_addr, uint64_t size, memory_region& removed);

    void clear() { _count = 0; }
    unsigned count() const { return _count; }
    const memory_region& region(unsigned i) const { return _regions[i]; }

    // The host address of [gpa, gpa + len) when the whole range lies in
    // one region; nullptr otherwise (len 0 counts as one byte).
    uint8_t* guest_to_host(uint64_t gpa, uint64_t len) const;

    // The host address of `gpa` and, in `contiguous`, how many of the `len`
    // bytes from there lie in the same region (1 .. len); nullptr when
    // `gpa` is in no region. For buffers that span adjacent regions.
    uint8_t* guest_to_host_partial(uint64_t gpa, uint64_t len, uint64_t& contiguous) const;

    // The host address of [uaddr, uaddr + len) in front-end virtual
    // addresses (vhost-user ring addresses); nullptr unless it lies in one
    // region.
    uint8_t* user_to_host(uint64_t uaddr, uint64_t len) const;

private:
    // The region holding `addr` in the address space `base` names (guest
    // or user), with the offset into it; nullptr if none.
    const memory_region* find(uint64_t addr, uint64_t memory_region::*base, uint64_t& offset) const;

    memory_region _regions[k_max_regions];
    unsigned _count = 0;
};

}  // namespace softblk::virtio
