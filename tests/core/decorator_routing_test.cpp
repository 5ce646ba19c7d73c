// The completion routing the decorators with requests of their own share
// (src/core/decorators/common.hpp): a consumer request passed through goes
// on to the consumer's sink unchanged, a decorator's own request comes
// back to the decorator, a proxy ends its original with where it wrote,
// and a timed-out original is let go through its proxy.
#include <gtest/gtest.h>

#include <vector>

#include "core/decorators/common.hpp"

namespace softblk::core {
namespace {

struct recording_sink final : completion_sink {
    struct call {
        io_request* request;
        int result;
    };
    std::vector<call> calls;
    void complete(io_request& r, int result) override { calls.push_back({&r, result}); }
};

// An inner queue that lets go of what `releasable` says.
struct inner_queue final : target_queue {
    std::vector<io_request*> asked;
    bool releasable = true;
    void submit(io_request&) override {}
    bool timed_out(io_request& r) override
    {
        asked.push_back(&r);
        return releasable;
    }
};

struct proxy_extra {
    io_request* original = nullptr;
};

TEST(decorator_routing, passes_consumer_requests_on_and_returns_its_own)
{
    request_pool<proxy_extra> pool(2, 0);
    recording_sink sink;
    io_request consumer;
    EXPECT_EQ(route_completion(pool, sink, consumer, 4096), nullptr);
    ASSERT_EQ(sink.calls.size(), 1u);
    EXPECT_EQ(sink.calls[0].request, &consumer);
    EXPECT_EQ(sink.calls[0].result, 4096);

    auto* own = pool.take();
    ASSERT_NE(own, nullptr);
    EXPECT_EQ(route_completion(pool, sink, own->request, -EIO), own);
    EXPECT_EQ(sink.calls.size(), 1u) << "the decorator finishes its own request";
}

TEST(decorator_routing, a_proxy_ends_its_original_with_where_it_wrote)
{
    recording_sink sink;
    io_request original;
    io_request proxy;
    original.result_offset = 0;
    proxy.result_offset = 0x10000;
    complete_original(sink, original, proxy, -EIO);
    ASSERT_EQ(sink.calls.size(), 1u);
    EXPECT_EQ(sink.calls[0].request, &original);
    EXPECT_EQ(sink.calls[0].result, -EIO);
    EXPECT_EQ(original.result_offset, 0x10000u);
}

TEST(decorator_routing, a_timed_out_original_is_let_go_through_its_proxy)
{
    request_pool<proxy_extra> pool(2, 0);
    inner_queue inner;
    io_request proxied;
    io_request passed_through;
    auto* e = pool.take();
    ASSERT_NE(e, nullptr);
    e->extra.original = &proxied;
    int released = 0;
    auto release = [&](auto& entry) {
        EXPECT_EQ(&entry, e);
        entry.extra.original = nullptr;
        pool.give_back(entry);
        ++released;
    };

    // The inner target still holds the proxy: the original stays.
    inner.releasable = false;
    EXPECT_FALSE(time_out_through(pool, inner, proxied, release));
    ASSERT_EQ(inner.asked.size(), 1u);
    EXPECT_EQ(inner.asked[0], &e->request) << "the inner target is asked about the proxy";
    EXPECT_EQ(released, 0);

    inner.releasable = true;
    EXPECT_TRUE(time_out_through(pool, inner, proxied, release));
    EXPECT_EQ(released, 1);
    EXPECT_EQ(pool.available(), 2u);

    // Not proxied: the inner target is asked about the request itself.
    EXPECT_TRUE(time_out_through(pool, inner, passed_through, release));
    EXPECT_EQ(inner.asked.back(), &passed_through);
    EXPECT_EQ(released, 1);
}

}  // namespace
}  // namespace softblk::core
