// The request path of libsoftblk allocates nothing: submissions take
// preallocated slots and softblk_queue_do_io returns them. This file
// replaces the program's operator new with one that counts (the shared
// library's calls reach it too: it does not define its own), and the
// test counts the allocations of a thousand requests.
#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <new>
#include <vector>

#include <gtest/gtest.h>

#include <softblk.h>

namespace {
std::atomic<uint64_t> g_allocations{0};
}  // namespace

// Every form of operator new and delete, so that whatever allocates (the
// library, the core, a sanitizer's runtime) allocates and frees through
// the same pair.
namespace {

void* allocate(size_t n, size_t align, bool nothrow)
{
    g_allocations.fetch_add(1, std::memory_order_relaxed);
    n = n == 0 ? 1 : n;
    void* p = align <= alignof(std::max_align_t)
                  ? std::malloc(n)
                  : std::aligned_alloc(align, (n + align - 1) / align * align);
    if (p == nullptr && !nothrow) {
        throw std::bad_alloc();
    }
    return p;
}

}  // namespace

void* operator new(size_t n)
{
    return allocate(n, 0, false);
}
void* operator new[](size_t n)
{
    return allocate(n, 0, false);
}
void* operator new(size_t n, const std::nothrow_t&) noexcept
{
    return allocate(n, 0, true);
}
void* operator new[](size_t n, const std::nothrow_t&) noexcept
{
    return allocate(n, 0, true);
}
void* operator new(size_t n, std::align_val_t a)
{
    return allocate(n, static_cast<size_t>(a), false);
}
void* operator new[](size_t n, std::align_val_t a)
{
    return allocate(n, static_cast<size_t>(a), false);
}
void* operator new(size_t n, std::align_val_t a, const std::nothrow_t&) noexcept
{
    return allocate(n, static_cast<size_t>(a), true);
}
void* operator new[](size_t n, std::align_val_t a, const std::nothrow_t&) noexcept
{
    return allocate(n, static_cast<size_t>(a), true);
}
void operator delete(void* p) noexcept
{
    std::free(p);
}
void operator delete[](void* p) noexcept
{
    std::free(p);
}
void operator delete(void* p, size_t) noexcept
{
    std::free(p);
}
void operator delete[](void* p, size_t) noexcept
{
    std::free(p);
}
void operator delete(void* p, std::align_val_t) noexcept
{
    std::free(p);
}
void operator delete[](void* p, std::align_val_t) noexcept
{
    std::free(p);
}
void operator delete(void* p, size_t, std::align_val_t) noexcept
{
    std::free(p);
}
void operator delete[](void* p, size_t, std::align_val_t) noexcept
{
    std::free(p);
}
void operator delete(void* p, const std::nothrow_t&) noexcept
{
    std::free(p);
}
void operator delete[](void* p, const std::nothrow_t&) noexcept
{
    std::free(p);
}

namespace {

TEST(capi_alloc, request_path_allocates_nothing)
{
    // memory_backed=0: the null target moves no data, so the target
    // allocates nothing itself (a memory-backed one allocates its pages on
    // first write); irqmode=1: completions go through the queue's deferred
    // list and do_io, the longer path.
    softblk_device* dev = nullptr;
    ASSERT_EQ(softblk_create("alloc0", "null", "size=16 irqmode=1 hw_queue_depth=8", &dev), 0)
        << softblk_get_error_msg();
    softblk_queue* q = nullptr;
    ASSERT_EQ(softblk_get_queue(dev, 0, &q), 0);
    std::vector<unsigned char> buf(8 * 4096);
    softblk_completion done[8];
    auto round = [&] {
        for (unsigned i = 0; i < 8; ++i) {
            const int rc = i % 2 == 0
                               ? softblk_queue_read(q, i * 4096, &buf[i * 4096], 4096, &buf, 0)
                               : softblk_queue_write(q, i * 4096, &buf[i * 4096], 4096, &buf, 0);
            ASSERT_EQ(rc, 0);
        }
        ASSERT_EQ(softblk_queue_flush(q, nullptr, 0), -EAGAIN);  // all 8 slots taken
        ASSERT_EQ(softblk_queue_do_io(q, done, 8, 8, -1), 8);
    };
    round();  // warm-up: whatever is made on first use
    const uint64_t before = g_allocations.load();
    for (int i = 0; i < 125; ++i) {
        round();
    }
    const uint64_t during = g_allocations.load() - before;
    softblk_destroy(&dev);
    EXPECT_EQ(during, 0u) << "allocations for 1000 requests";
}

}  // namespace
