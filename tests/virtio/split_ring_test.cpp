// Split virtqueues (src/virtio): the driver's half and the device's half
// of one ring in the same memory, as a back end and softblk's driver use
// them; notification suppression with and without event indices; index
// wrap-around; and the chain walker on every kind of malformed chain a
// hostile driver can build (loops, indices and buffers out of range,
// indirect tables where they are not allowed).
#include <softblk/virtio/split_ring.hpp>

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

using namespace softblk::virtio;

namespace {

constexpr uint64_t k_gpa = 0x10'0000;           // guest addresses of the memory
constexpr uint64_t k_uaddr = 0x7f00'0000'0000;  // the front end's addresses of it
constexpr size_t k_bytes = 1 << 20;

struct shared_memory {
    shared_memory()
    {
        host = static_cast<uint8_t*>(std::aligned_alloc(4096, k_bytes));
        std::memset(host, 0, k_bytes);
        EXPECT_TRUE(
            mem.add({.guest_addr = k_gpa, .user_addr = k_uaddr, .size = k_bytes, .host = host}));
    }
    ~shared_memory() { std::free(host); }
    uint64_t gpa(size_t off) const { return k_gpa + off; }
    uint64_t uaddr(const void* p) const
    {
        return k_uaddr + (static_cast<const uint8_t*>(p) - host);
    }

    uint8_t* host = nullptr;
    guest_memory mem;
};

// A driver and a device on one ring of `num` entries.
struct ring_pair {
    explicit ring_pair(uint32_t entries, bool event_idx = true, bool indirect = true) : num(entries)
    {
        driver.init(m.host, entries, event_idx);
        const char* err =
            device.attach(m.mem, m.uaddr(driver.desc_addr()), m.uaddr(driver.avail_addr()),
                          m.uaddr(driver.used_addr()), entries, event_idx, indirect);
        EXPECT_EQ(err, nullptr) << err;
        device.set_last_avail(0);
    }
    void set(uint16_t i, uint64_t off, uint32_t len, uint16_t flags, uint16_t next = 0)
    {
        driver.table()[i] =
            vring_desc{.addr = m.gpa(off), .len = len, .flags = flags, .next = next};
    }
    chain_error walk(uint16_t head, chain& c) { return device.walk(m.mem, head, c); }

    uint32_t num;
    shared_memory m;
    driver_ring driver;
    device_ring device;
};

constexpr size_t k_data = 64 << 10;  // buffers start here, rings below

}  // namespace

TEST(split_ring, request_round_trip)
{
    ring_pair p(8);
    // header (readable), data (writable), status (writable)
    p.set(0, k_data, 16, VRING_DESC_F_NEXT, 1);
    p.set(1, k_data + 4096, 4096, VRING_DESC_F_NEXT | VRING_DESC_F_WRITE, 2);
    p.set(2, k_data + 16, 1, VRING_DESC_F_WRITE);
    p.driver.add(0);
    EXPECT_TRUE(p.driver.publish()) << "the first chain needs a kick";

    uint16_t head = 99;
    ASSERT_EQ(p.device.pop(head), 1);
    EXPECT_EQ(head, 0);
    EXPECT_EQ(p.device.pop(head), 0);
    segment storage[8];
    chain c{.storage = storage};
    ASSERT_EQ(p.walk(head, c), chain_error::none);
    EXPECT_EQ(c.count, 3u);
    EXPECT_EQ(c.readable, 1u);
    EXPECT_EQ(c.readable_bytes, 16u);
    EXPECT_EQ(c.writable_bytes, 4097u);
    EXPECT_EQ(c.readable_segments()[0].ptr, p.m.host + k_data);
    EXPECT_EQ(c.writable_segments()[0].ptr, p.m.host + k_data + 4096);
    EXPECT_EQ(c.writable_segments()[1].len, 1u);

    p.device.push_used(head, 4097);
    EXPECT_EQ(p.device.unpublished(), 1);
    EXPECT_TRUE(p.device.publish_used()) << "used_event 0 asks for the first completion";
    uint32_t id = 0, len = 0;
    ASSERT_TRUE(p.driver.next_used(id, len));
    EXPECT_EQ(id, 0u);
    EXPECT_EQ(len, 4097u);
    EXPECT_FALSE(p.driver.next_used(id, len));
}

TEST(split_ring, event_index_suppresses_kicks_and_interrupts)
{
    ring_pair p(8);
    for (uint16_t i = 0; i < 8; ++i) {
        p.set(i, k_data + i * 512u, 512, 0);
    }
    p.driver.add(0);
    EXPECT_TRUE(p.driver.publish());
    uint16_t head;
    ASSERT_EQ(p.device.pop(head), 1);
    // The device is busy (it did not ask for kicks again): no kick.
    p.driver.add(1);
    EXPECT_FALSE(p.driver.publish());
    // Going idle it asks again, sees chain 1 and does not sleep.
    EXPECT_TRUE(p.device.enable_kicks());
    ASSERT_EQ(p.device.pop(head), 1);
    EXPECT_EQ(head, 1);
    EXPECT_FALSE(p.device.enable_kicks());
    p.driver.add(2);
    EXPECT_TRUE(p.driver.publish()) << "the device asked for this kick";

    // Interrupts: the driver polls.
    p.driver.disable_interrupts();
    p.device.push_used(0, 0);
    EXPECT_FALSE(p.device.publish_used());
    uint32_t id, len;
    ASSERT_TRUE(p.driver.next_used(id, len));
    EXPECT_FALSE(p.driver.enable_interrupts()) << "nothing new since the last used entry";
    p.device.push_used(1, 0);
    EXPECT_TRUE(p.device.publish_used());
    // Arming while an entry is already there says so.
    EXPECT_TRUE(p.driver.enable_interrupts());
}

TEST(split_ring, flags_without_event_index)
{
    ring_pair p(4, false, false);
    p.set(0, k_data, 512, 0);
    p.driver.add(0);
    EXPECT_TRUE(p.driver.publish());
    p.device.disable_kicks();
    p.driver.add(0);
    EXPECT_FALSE(p.driver.publish()) << "VRING_USED_F_NO_NOTIFY";
    EXPECT_TRUE(p.device.enable_kicks()) << "two chains are waiting";
    p.driver.disable_interrupts();
    p.device.push_used(0, 0);
    EXPECT_FALSE(p.device.publish_used()) << "VRING_AVAIL_F_NO_INTERRUPT";
    p.driver.enable_interrupts();
    p.device.push_used(0, 0);
    EXPECT_TRUE(p.device.publish_used());
}

TEST(split_ring, indices_wrap_around)
{
    ring_pair p(4);
    p.set(0, k_data, 512, 0);
    p.set(1, k_data + 512, 512, 0);
    segment storage[4];
    for (uint32_t n = 0; n < 70'000; ++n) {
        const uint16_t h = n % 2;
        p.driver.add(h);
        p.driver.publish();
        uint16_t head;
        ASSERT_EQ(p.device.pop(head), 1) << n;
        ASSERT_EQ(head, h);
        chain c{.storage = storage};
        ASSERT_EQ(p.walk(head, c), chain_error::none);
        p.device.push_used(head, n);
        p.device.publish_used();
        uint32_t id, len;
        ASSERT_TRUE(p.driver.next_used(id, len));
        ASSERT_EQ(id, h);
        ASSERT_EQ(len, n);
    }
}

TEST(split_ring, available_index_running_ahead_is_refused)
{
    ring_pair p(4);
    for (int i = 0; i < 5; ++i) {
        p.driver.add(0);
    }
    p.driver.publish();
    uint16_t head;
    EXPECT_EQ(p.device.pop(head), -1) << "5 chains on a ring of 4";
}

TEST(split_ring, attach_checks_the_ring)
{
    shared_memory m;
    device_ring d;
    EXPECT_NE(d.attach(m.mem, k_uaddr, k_uaddr + 4096, k_uaddr + 8192, 6, true, true), nullptr)
        << "not a power of two";
    EXPECT_NE(d.attach(m.mem, k_uaddr, k_uaddr + 4096, k_uaddr + 8192, 2048, true, true), nullptr)
        << "beyond 1024";
    EXPECT_NE(d.attach(m.mem, k_uaddr + 8, k_uaddr + 4096, k_uaddr + 8192, 8, true, true), nullptr)
        << "misaligned descriptors";
    EXPECT_NE(d.attach(m.mem, k_uaddr, k_uaddr + 4096, k_uaddr + k_bytes - 8, 8, true, true),
              nullptr)
        << "used ring past the end of the memory";
    EXPECT_NE(d.attach(m.mem, 0x1000, k_uaddr + 4096, k_uaddr + 8192, 8, true, true), nullptr)
        << "descriptors outside the memory";
    EXPECT_EQ(d.attach(m.mem, k_uaddr, k_uaddr + 4096, k_uaddr + 8192, 8, true, true), nullptr);
}

// ---------------------------------------------------------------- chains

TEST(chain_walker, refuses_malformed_chains)
{
    ring_pair p(8);
    segment storage[16];
    chain c{.storage = storage};

    EXPECT_EQ(p.walk(8, c), chain_error::head_out_of_range);

    p.set(0, k_data, 16, VRING_DESC_F_NEXT, 1);
    p.set(1, k_data, 16, VRING_DESC_F_NEXT, 0);
    EXPECT_EQ(p.walk(0, c), chain_error::too_long) << "0 -> 1 -> 0 loops";

    p.set(0, k_data, 16, VRING_DESC_F_NEXT, 0);
    EXPECT_EQ(p.walk(0, c), chain_error::too_long) << "a descriptor naming itself";

    p.set(0, k_data, 16, VRING_DESC_F_NEXT, 8);
    EXPECT_EQ(p.walk(0, c), chain_error::next_out_of_range);

    p.set(0, k_bytes - 8, 16, 0);
    EXPECT_EQ(p.walk(0, c), chain_error::address_unmapped) << "runs past the memory";
    p.driver.table()[0] = vring_desc{.addr = k_gpa - 8, .len = 16, .flags = 0, .next = 0};
    EXPECT_EQ(p.walk(0, c), chain_error::address_unmapped) << "starts below the memory";
    p.driver.table()[0] = vring_desc{.addr = ~uint64_t{0} - 4, .len = 16, .flags = 0, .next = 0};
    EXPECT_EQ(p.walk(0, c), chain_error::address_unmapped) << "wraps around 2^64";

    p.set(0, k_data, 1, VRING_DESC_F_NEXT | VRING_DESC_F_WRITE, 1);
    p.set(1, k_data, 16, 0);
    EXPECT_EQ(p.walk(0, c), chain_error::readable_after_writable);

    segment two[2];
    chain small{.storage = two};
    p.set(0, k_data, 16, VRING_DESC_F_NEXT, 1);
    p.set(1, k_data, 16, VRING_DESC_F_NEXT, 2);
    p.set(2, k_data, 1, VRING_DESC_F_WRITE);
    EXPECT_EQ(p.walk(0, small), chain_error::too_many_segments);

    // Zero-length descriptors take no segment.
    p.set(1, k_data, 0, VRING_DESC_F_NEXT, 2);
    ASSERT_EQ(p.walk(0, small), chain_error::none);
    EXPECT_EQ(small.count, 2u);
}

TEST(chain_walker, indirect_tables)
{
    ring_pair with(8, true, true);
    segment storage[16];
    chain c{.storage = storage};
    // An indirect table of 3 at k_data + 8192: header, data, status.
    auto* table = reinterpret_cast<vring_desc*>(with.m.host + k_data + 8192);
    table[0] =
        vring_desc{.addr = with.m.gpa(k_data), .len = 16, .flags = VRING_DESC_F_NEXT, .next = 1};
    table[1] = vring_desc{.addr = with.m.gpa(k_data + 4096),
                          .len = 4096,
                          .flags = VRING_DESC_F_NEXT | VRING_DESC_F_WRITE,
                          .next = 2};
    table[2] = vring_desc{
        .addr = with.m.gpa(k_data + 16), .len = 1, .flags = VRING_DESC_F_WRITE, .next = 0};
    with.set(0, k_data + 8192, 48, VRING_DESC_F_INDIRECT);
    ASSERT_EQ(with.walk(0, c), chain_error::none);
    EXPECT_EQ(c.count, 3u);
    EXPECT_EQ(c.readable, 1u);
    EXPECT_EQ(c.writable_bytes, 4097u);

    // Normal descriptors before the indirect one are allowed.
    with.set(1, k_data + 100, 8, VRING_DESC_F_NEXT, 0);
    ASSERT_EQ(with.walk(1, c), chain_error::none);
    EXPECT_EQ(c.count, 4u);
    EXPECT_EQ(c.readable_bytes, 24u);

    with.set(0, k_data + 8192, 48, VRING_DESC_F_INDIRECT | VRING_DESC_F_NEXT, 1);
    EXPECT_EQ(with.walk(0, c), chain_error::indirect_with_next);
    with.set(0, k_data + 8192, 40, VRING_DESC_F_INDIRECT);
    EXPECT_EQ(with.walk(0, c), chain_error::indirect_bad_size);
    with.set(0, k_data + 8192, 0, VRING_DESC_F_INDIRECT);
    EXPECT_EQ(with.walk(0, c), chain_error::indirect_bad_size);
    with.set(0, k_data + 8192, 16 * 2048, VRING_DESC_F_INDIRECT);
    EXPECT_EQ(with.walk(0, c), chain_error::indirect_bad_size);
    with.set(0, k_bytes - 16, 48, VRING_DESC_F_INDIRECT);
    EXPECT_EQ(with.walk(0, c), chain_error::indirect_unmapped);

    table[1].flags = VRING_DESC_F_INDIRECT;
    with.set(0, k_data + 8192, 48, VRING_DESC_F_INDIRECT);
    EXPECT_EQ(with.walk(0, c), chain_error::indirect_nested);

    table[1] =
        vring_desc{.addr = with.m.gpa(k_data), .len = 16, .flags = VRING_DESC_F_NEXT, .next = 0};
    EXPECT_EQ(with.walk(0, c), chain_error::too_long) << "a loop inside the table";
    table[1].next = 3;
    EXPECT_EQ(with.walk(0, c), chain_error::next_out_of_range);

    ring_pair without(8, true, false);
    without.set(0, k_data + 8192, 48, VRING_DESC_F_INDIRECT);
    EXPECT_EQ(without.walk(0, c), chain_error::indirect_not_negotiated);
}

TEST(chain_walker, buffer_across_two_regions)
{
    // Guest addresses contiguous, host mappings not: one descriptor, two
    // segments.
    std::vector<uint8_t> a(8192), b(8192);
    guest_memory mem;
    ASSERT_TRUE(
        mem.add({.guest_addr = 0x1000, .user_addr = 0x1000, .size = 4096, .host = a.data()}));
    ASSERT_TRUE(
        mem.add({.guest_addr = 0x2000, .user_addr = 0x2000, .size = 4096, .host = b.data()}));
    EXPECT_FALSE(
        mem.add({.guest_addr = 0x1800, .user_addr = 0x9000, .size = 4096, .host = a.data()}))
        << "overlapping guest addresses";
    EXPECT_FALSE(
        mem.add({.guest_addr = 0x9000, .user_addr = 0x1800, .size = 4096, .host = a.data()}))
        << "overlapping user addresses";
    alignas(16) vring_desc table[1] = {{.addr = 0x1800, .len = 4096, .flags = 0, .next = 0}};
    segment storage[4];
    chain c{.storage = storage};
    ASSERT_EQ(walk_chain(mem, table, 1, 0, false, c), chain_error::none);
    ASSERT_EQ(c.count, 2u);
    EXPECT_EQ(c.storage[0].ptr, a.data() + 0x800);
    EXPECT_EQ(c.storage[0].len, 0x800u);
    EXPECT_EQ(c.storage[1].ptr, b.data());
    EXPECT_EQ(c.storage[1].len, 0x800u);
    EXPECT_EQ(mem.guest_to_host(0x1800, 4096), nullptr) << "not inside one region";

    memory_region removed;
    ASSERT_TRUE(mem.remove(0x2000, 0x2000, 4096, removed));
    EXPECT_EQ(removed.host, b.data());
    EXPECT_EQ(walk_chain(mem, table, 1, 0, false, c), chain_error::address_unmapped);
}
