// Inflight I/O tracking (src/virtio/inflight.cpp): what a restarted back
// end resubmits is exactly what the previous one took and did not return,
// oldest first, including when it died between publishing a used batch
// and clearing the batch's marks; a region written with garbage by the
// front end makes it neither crash nor index outside the region.
#include <softblk/virtio/inflight.hpp>

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

using namespace softblk::virtio;

namespace {

struct region {
    explicit region(uint32_t entries) : num(entries), bytes(inflight_queue_bytes(entries), 0xff) {}
    void* data() { return bytes.data(); }
    uint32_t num;
    std::vector<uint8_t> bytes;
};

}  // namespace

TEST(inflight, fresh_region_has_nothing_in_flight)
{
    region r(16);
    inflight_tracker t;
    EXPECT_FALSE(t.attach(r.data(), r.num)) << "never used";
    std::vector<uint16_t> heads;
    EXPECT_EQ(t.recover(5, heads), 0u);
    EXPECT_TRUE(heads.empty());
    auto* h = static_cast<inflight_queue_header*>(r.data());
    EXPECT_EQ(h->version, 1);
    EXPECT_EQ(h->desc_num, 16);
    EXPECT_EQ(h->used_idx, 5);
}

TEST(inflight, restart_resubmits_what_was_in_flight_in_order)
{
    region r(16);
    uint16_t used = 0;
    {
        inflight_tracker t;
        t.attach(r.data(), r.num);
        std::vector<uint16_t> heads;
        t.recover(used, heads);
        for (uint16_t h : {7, 3, 11, 2}) {
            t.taken(h);
        }
        t.returned(3);
        ++used;
        t.published(used);
        // "killed" here: 7, 11, 2 were in flight, 7 the oldest.
    }
    inflight_tracker again;
    EXPECT_TRUE(again.attach(r.data(), r.num)) << "in use";
    std::vector<uint16_t> heads;
    ASSERT_EQ(again.recover(used, heads), 3u);
    EXPECT_EQ(heads, (std::vector<uint16_t>{7, 11, 2}));
    // New chains count after the recovered ones.
    again.taken(5);
    again.returned(7);
    again.returned(11);
    again.returned(2);
    used += 3;
    again.published(used);
    inflight_tracker third;
    third.attach(r.data(), r.num);
    ASSERT_EQ(third.recover(used, heads), 1u);
    EXPECT_EQ(heads, (std::vector<uint16_t>{5}));
}

TEST(inflight, death_between_publish_and_clear_completes_the_batch)
{
    region r(8);
    inflight_tracker t;
    t.attach(r.data(), r.num);
    std::vector<uint16_t> heads;
    t.recover(0, heads);
    t.taken(1);
    t.taken(4);
    t.taken(6);
    t.returned(4);
    t.returned(1);
    // The used ring's index went to 2, then the back end died before
    // published(2) cleared the marks.
    inflight_tracker after;
    after.attach(r.data(), r.num);
    ASSERT_EQ(after.recover(2, heads), 1u);
    EXPECT_EQ(heads, (std::vector<uint16_t>{6}));
}

TEST(inflight, queue_size_change_starts_empty)
{
    region r(16);
    inflight_tracker t;
    t.attach(r.data(), 16);
    std::vector<uint16_t> heads;
    t.recover(0, heads);
    t.taken(3);
    inflight_tracker smaller;
    EXPECT_FALSE(smaller.attach(r.data(), 8));
    EXPECT_EQ(smaller.recover(0, heads), 0u);
}

TEST(inflight, garbage_from_the_front_end_stays_inside)
{
    region r(8);
    auto* h = static_cast<inflight_queue_header*>(r.data());
    auto* d = reinterpret_cast<inflight_desc*>(h + 1);
    std::memset(r.data(), 0, r.bytes.size());
    h->version = 1;
    h->desc_num = 8;
    h->used_idx = 0;
    h->last_batch_head = 60000;  // out of range
    for (int i = 0; i < 8; ++i) {
        d[i].inflight = static_cast<uint8_t>(i % 3);  // 0, 1, 2 (2 is not "in flight")
        d[i].next = static_cast<uint16_t>(50000 + i);
        d[i].counter = static_cast<uint64_t>(100 - i);
    }
    inflight_tracker t;
    t.attach(r.data(), 8);
    std::vector<uint16_t> heads;
    EXPECT_EQ(t.recover(40000, heads), 3u);  // 1, 4, 7 in counter order: 7, 4, 1
    EXPECT_EQ(heads, (std::vector<uint16_t>{7, 4, 1}));
    t.taken(9);  // out of range: ignored
    t.returned(200);
    t.published(40001);
    EXPECT_EQ(h->used_idx, 40001);
}
