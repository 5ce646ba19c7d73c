// libFuzzer target: the descriptor-chain walker and the device side of a
// split ring, on memory a hostile driver controls. The input lays out 1 to
// 3 memory regions (guest addresses, sizes), the descriptor table, the
// available ring and the indirect tables inside them (their bytes come
// from the input), a queue size and whether indirect descriptors were
// negotiated. Invariants: every segment walk_chain returns lies inside a
// region's host mapping; the readable segments come first; the segment
// count never exceeds the caller's storage; pop() never hands out more
// than the queue size ahead; AddressSanitizer catches any read or write
// outside the regions.
#include <softblk/virtio/split_ring.hpp>

#include <cassert>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

using namespace softblk::virtio;

namespace {

struct reader {
    const uint8_t* p;
    size_t n;
    uint64_t take(unsigned bytes)
    {
        uint64_t v = 0;
        for (unsigned i = 0; i < bytes && n > 0; ++i, ++p, --n) {
            v |= uint64_t{*p} << (8 * i);
        }
        return v;
    }
};

bool inside(const guest_memory& mem, const std::vector<std::vector<uint8_t>>& backing,
            const segment& s)
{
    for (unsigned i = 0; i < mem.count(); ++i) {
        const memory_region& r = mem.region(i);
        if (s.ptr >= r.host && s.ptr + s.len <= r.host + r.size) {
            return true;
        }
    }
    return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size)
{
    reader in{data, size};
    const unsigned regions = 1 + static_cast<unsigned>(in.take(1) % 3);
    const uint32_t num = 1u << (in.take(1) % 8);  // 1 .. 128
    const bool indirect = (in.take(1) & 1) != 0;
    guest_memory mem;
    std::vector<std::vector<uint8_t>> backing;
    uint64_t gpa = in.take(2) * 4096;
    for (unsigned i = 0; i < regions; ++i) {
        const size_t bytes = 4096 * (1 + in.take(1) % 4);
        backing.emplace_back(bytes, 0);
        // Regions may be adjacent in guest addresses (buffers that span
        // them) or far apart.
        const uint64_t gap = (in.take(1) & 1) != 0 ? 0 : in.take(2) * 4096;
        mem.add(memory_region{.guest_addr = gpa + gap,
                              .user_addr = uint64_t{0x7f0000000000} + uint64_t{i} * 0x100000,
                              .size = bytes,
                              .host = backing.back().data()});
        gpa += gap + bytes;
    }
    // The rest of the input fills the regions (table, rings, tables).
    for (auto& b : backing) {
        for (auto& byte : b) {
            if (in.n == 0) {
                break;
            }
            byte = static_cast<uint8_t>(in.take(1));
        }
    }
    // Ring parts in region 0 when they fit: descriptors at 0, available
    // ring after them, used ring on the next 4-byte boundary.
    const uint64_t desc = 0x7f0000000000;
    const uint64_t avail = desc + desc_table_bytes(num);
    const uint64_t used = (avail + avail_ring_bytes(num) + 3) & ~uint64_t{3};
    device_ring ring;
    if (ring.attach(mem, desc, avail, used, num, true, indirect) != nullptr) {
        return 0;
    }
    ring.set_last_avail(0);
    std::vector<segment> storage(num + k_max_queue_size + 8);
    for (int i = 0; i < 16; ++i) {
        uint16_t head;
        const int r = ring.pop(head);
        if (r <= 0) {
            break;
        }
        chain c{.storage = storage};
        const chain_error e = ring.walk(mem, head, c);
        assert(c.count <= storage.size());
        assert(c.readable <= c.count);
        uint64_t readable = 0, writable = 0;
        for (unsigned s = 0; s < c.count; ++s) {
            assert(inside(mem, backing, c.storage[s]));
            (s < c.readable ? readable : writable) += c.storage[s].len;
        }
        if (e == chain_error::none) {
            assert(readable == c.readable_bytes);
            assert(writable == c.writable_bytes);
            // Touch every byte, as a device would.
            for (unsigned s = 0; s < c.count; ++s) {
                volatile uint8_t sink = 0;
                for (uint32_t k = 0; k < c.storage[s].len; ++k) {
                    sink = sink + c.storage[s].ptr[k];
                }
                if (s >= c.readable && c.storage[s].len > 0) {
                    c.storage[s].ptr[c.storage[s].len - 1] = 0;
                }
            }
        }
        ring.push_used(head < num ? head : 0, static_cast<uint32_t>(writable));
    }
    ring.publish_used();
    ring.enable_kicks();
    return 0;
}
