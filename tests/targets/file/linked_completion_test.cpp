// A front end that lends its io_uring to a device queue (ublk's queue
// thread) may have a write whose data is in the kernel carry the front
// end's own completion, linked after the write (kernel_buffer::
// prep_completion; ublk's batched commit). Checked here: which device
// queues allow it (queue_ring_sharing::links_completions), that the file ring links
// the entry after the write that ends the request (cancelled with it when
// the write fails), and that a write the bad-blocks decorator shortens
// carries none. The kernel's pages are stood in for by a user buffer
// registered in the owner's fixed-buffer table (where ublk's AUTO_BUF_REG
// puts them), which the kernel addresses differently, so its writes fail
// here; the VM test batch_io_ublk writes real request pages and checks
// what lands.
#include "owner_ring.hpp"
#include "test_util.hpp"

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <liburing.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <softblk/device.hpp>
#include <softblk/external_data.hpp>
#include <softblk/ring_sharing.hpp>

using namespace softblk;
using softblk::test::init_owner_ring;

namespace {

constexpr uint64_t k_own = uint64_t{1} << 63;

class temp_dir {
public:
    temp_dir()
    {
        char name[] = "/tmp/softblk-linked-XXXXXX";
        _path = ::mkdtemp(name);
    }
    ~temp_dir()
    {
        const std::string cmd = "rm -rf '" + _path + "'";
        [[maybe_unused]] int rc = std::system(cmd.c_str());
    }
    std::string path(const std::string& name) const { return _path + "/" + name; }

private:
    std::string _path;
};

std::unique_ptr<device> make(const std::string& type, std::vector<std::string> options)
{
    auto d = device::create("linked", type, options);
    EXPECT_TRUE(d.has_value()) << (d ? "" : d.error().message);
    return d ? std::move(*d) : nullptr;
}

std::vector<std::string> file_options(const temp_dir& dir, std::vector<std::string> more = {})
{
    std::vector<std::string> o{"path=" + dir.path("img"), "size=16M", "create=1",
                               "submit_queues=1"};
    o.insert(o.end(), more.begin(), more.end());
    return o;
}

// The queue's owner: its ring, a 64 KiB buffer at index 0 of its table,
// and the loop that runs the queue until a request completes.
struct owner {
    owner()
    {
        init_owner_ring(ring);
        data = static_cast<char*>(std::aligned_alloc(4096, k_bytes));
        for (unsigned i = 0; i < k_bytes; ++i) {
            data[i] = static_cast<char>(i * 7 + 3);
        }
        const iovec v{data, k_bytes};
        EXPECT_EQ(io_uring_register_buffers(&ring, &v, 1), 0);
        kernel_buffer& kb = in_kernel.kernel;
        kb.prep_completion = &prep_own_completion;
        kb.owner = this;
        kb.index = 0;
        kb.slots = 1;
        kb.in_table = true;
    }
    ~owner()
    {
        io_uring_queue_exit(&ring);
        std::free(data);
    }

    static void prep_own_completion(io_uring_sqe& sqe, const kernel_buffer& b)
    {
        auto& self = *static_cast<owner*>(b.owner);
        ++self.completions_prepared;
        io_uring_prep_nop(&sqe);
        io_uring_sqe_set_data64(&sqe, k_own | 1);
    }
    static void on_complete(io_request& r, int result)
    {
        auto& self = *static_cast<owner*>(r.user_data);
        self.result = result;
        self.done = true;
    }

    // A write of `length` bytes of the buffer at `offset`, with the data in
    // the "kernel"; its result (INT_MIN if it never completed).
    int write(io_queue& q, uint64_t offset, uint32_t length)
    {
        io_request* r = q.get_request();
        EXPECT_NE(r, nullptr);
        if (r == nullptr) {
            return INT_MIN;
        }
        r->op = io_op::write;
        r->flags = 0;
        r->offset = offset;
        r->length = length;
        r->buffer = nullptr;
        r->external = &in_kernel;
        r->on_complete = &on_complete;
        r->user_data = this;
        done = false;
        q.submit(*r);
        for (int i = 0; i < 2000 && !done; ++i) {
            q.process();
            if (done) {
                break;
            }
            __kernel_timespec ts{.tv_sec = 0, .tv_nsec = 10'000'000};
            io_uring_cqe* cqe = nullptr;
            io_uring_submit_and_wait_timeout(&ring, &cqe, 1, &ts, nullptr);
            unsigned head;
            unsigned seen = 0;
            io_uring_for_each_cqe(&ring, head, cqe)
            {
                if ((cqe->user_data & k_own) != 0) {
                    own_results.push_back(cqe->res);
                } else {
                    q.ring_sharing()->ring_completion(cqe->user_data, cqe->res);
                }
                ++seen;
            }
            io_uring_cq_advance(&ring, seen);
        }
        return done ? result : INT_MIN;
    }

    static constexpr unsigned k_bytes = 65536;
    io_uring ring{};
    char* data = nullptr;
    external_data in_kernel;  // its data "in the kernel": a kernel_buffer
    unsigned completions_prepared = 0;
    std::vector<int> own_results;
    bool done = false;
    int result = 0;
};

bool links_when_shared(device& d)
{
    owner o;
    queue_ring_sharing* q = d.queue(0).ring_sharing();
    if (q == nullptr) {
        return false;  // no file ring: nothing to lend the ring to
    }
    EXPECT_FALSE(q->links_completions()) << "not without the owner's ring";
    if (!q->share_ring(&o.ring)) {
        return false;
    }
    const bool links = q->links_completions();
    EXPECT_TRUE(q->share_ring(nullptr));
    EXPECT_FALSE(q->links_completions()) << "the ring given back";
    return links;
}

// Ring sharing is an extension of the queues whose target runs a file
// ring (the file and zloop targets, behind any decorators), asked for by
// the front end that has a ring to lend; other queues offer none.
TEST(linked_completion, only_file_ring_queues_offer_ring_sharing)
{
    temp_dir dir;
    for (const char* extra : {"irqmode=0", "cache_size=1", "mbps=100"}) {
        auto d = make("file", file_options(dir, {extra}));
        ASSERT_TRUE(d);
        EXPECT_NE(d->queue(0).ring_sharing(), nullptr) << extra;
    }
    auto ram =
        make("zloop-ram", {"capacity_mb=16", "zone_size_mb=4", "conv_zones=1", "submit_queues=1"});
    ASSERT_TRUE(ram);
    EXPECT_EQ(ram->queue(0).ring_sharing(), nullptr);
}

TEST(linked_completion, which_device_queues_allow_it)
{
    temp_dir dir;
    for (const char* irqmode : {"irqmode=0", "irqmode=1"}) {
        auto d = make("file", file_options(dir, {irqmode}));
        ASSERT_TRUE(d);
        EXPECT_TRUE(links_when_shared(*d)) << irqmode;
    }
    {
        // A timer delays every completion: the kernel must not see it sooner.
        auto d = make("file", file_options(dir, {"irqmode=2", "completion_nsec=100000"}));
        ASSERT_TRUE(d);
        EXPECT_FALSE(links_when_shared(*d)) << "irqmode=2";
    }
    {
        // The throttle holds writes back before the target sees them only.
        auto d = make("file", file_options(dir, {"mbps=100"}));
        ASSERT_TRUE(d);
        EXPECT_TRUE(links_when_shared(*d)) << "mbps";
    }
    {
        // The write-back cache answers writes itself (and takes no kernel
        // buffers).
        auto d = make("file", file_options(dir, {"cache_size=1"}));
        ASSERT_TRUE(d);
        EXPECT_FALSE(links_when_shared(*d)) << "cache_size";
    }
    {
        ::mkdir(dir.path("zl").c_str(), 0755);
        ::mkdir(dir.path("zl/0").c_str(), 0755);
        auto d = make("zloop", {"base_dir=" + dir.path("zl"), "id=0", "capacity_mb=16",
                                "zone_size_mb=4", "conv_zones=1", "submit_queues=1"});
        ASSERT_TRUE(d);
        EXPECT_TRUE(links_when_shared(*d)) << "zloop";
    }
    {
        // The RAM variant has no file ring to lend the ring to.
        auto d = make("zloop-ram",
                      {"capacity_mb=16", "zone_size_mb=4", "conv_zones=1", "submit_queues=1"});
        ASSERT_TRUE(d);
        EXPECT_FALSE(links_when_shared(*d)) << "zloop-ram";
    }
}

TEST(linked_completion, the_owners_entry_is_linked_after_the_write_that_ends_the_request)
{
    temp_dir dir;
    auto d = make("file", file_options(dir, {"irqmode=0", "badblocks_partial_io=1"}));
    ASSERT_TRUE(d);
    io_queue& q = d->queue(0);
    owner o;
    queue_ring_sharing* shared = q.ring_sharing();
    ASSERT_NE(shared, nullptr);
    ASSERT_TRUE(shared->share_ring(&o.ring));
    ASSERT_TRUE(shared->links_completions());

    // The stand-in pages cannot be addressed from 0 as the kernel's are,
    // so the write fails (-EFAULT); the owner's entry, linked after it, is
    // cancelled with it rather than run.
    EXPECT_EQ(o.write(q, 0, 16384), -EFAULT);
    EXPECT_EQ(o.completions_prepared, 1u);
    ASSERT_EQ(o.own_results.size(), 1u);
    EXPECT_EQ(o.own_results[0], -ECANCELED) << "linked after the write";

    // A write that touches a bad block is shortened to the blocks before
    // it and fails: the shortened write must not end the request.
    ASSERT_TRUE(d->set_option("badblocks", "+40-47"));  // bytes 20480..24575
    EXPECT_EQ(o.write(q, 16384, 16384), -EIO);
    EXPECT_EQ(o.completions_prepared, 1u) << "no completion linked after a shortened write";
    EXPECT_EQ(o.own_results.size(), 1u);
    EXPECT_TRUE(shared->share_ring(nullptr));
}

}  // namespace
