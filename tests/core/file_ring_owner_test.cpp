// Who drives a file ring: kernel buffers (ublk's zero copy, with
// stand-in register and unregister entries), a ring borrowed from the
// queue's owner, and the thread rules (DEFER_TASKRUN wake-ups through the
// eventfd, hand-over to another thread, a thread the kernel refuses).
#include "../support/owner_ring.hpp"
#include "file_engine_fixture.hpp"

#include <gtest/gtest.h>

#include <softblk/external_data.hpp>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <liburing.h>
#include <poll.h>
#include <string>
#include <sys/stat.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

namespace softblk {
namespace {

using namespace file_engine_test;
using test::init_owner_ring;

// Data in the kernel (ublk's zero copy) cannot be made on this host
// without ublk: the register and unregister entries here are stand-ins
// that count themselves, and the VM test zero_copy_ublk writes real
// request pages. What is checked: each buffer registered once and
// unregistered once, after its write and before its completion, the
// write never held, a refused registration failing the write with its
// own errno and nothing to unregister.
struct kernel_buffer_counts {
    static inline int registers = 0;
    static inline int unregisters = 0;
};

void prep_nop_register(::io_uring_sqe& sqe, const kernel_buffer&)
{
    ++kernel_buffer_counts::registers;
    io_uring_prep_nop(&sqe);
}

void prep_nop_unregister(::io_uring_sqe& sqe, const kernel_buffer&)
{
    ++kernel_buffer_counts::unregisters;
    io_uring_prep_nop(&sqe);
}

// A command the file's driver does not have: the register entry fails.
void prep_refused_register(::io_uring_sqe& sqe, const kernel_buffer& kb)
{
    ++kernel_buffer_counts::registers;
    io_uring_prep_rw(IORING_OP_URING_CMD, &sqe, kb.fd, nullptr, 0, 0);
}

TEST(FileRing, AKernelBufferIsRegisteredOnceAndUnregisteredBeforeItCompletes)
{
    temp_dir dir;
    make_file(dir.file("zone"), 0);
    auto f = open_file(dir.file("zone"), {});
    ASSERT_TRUE(f);
    ring_fixture t(*f);
    const bool deferred = t.ring->mode() == ring_mode::defer_taskrun;
    kernel_buffer_counts::registers = kernel_buffer_counts::unregisters = 0;
    // A request in flight when the first kernel buffer comes: a
    // DEFER_TASKRUN ring is rebuilt only after it completed.
    aligned_buffer first(4096);
    fill(first.data, first.size, 3);
    io_request before = ring_fixture::request(io_op::write, 8192, 4096, first.data);
    t.ring->write(before, 0, 8192, false);
    const external_data kb{.where = external_data::place::kernel,
                           .kernel = {.prep_register = &prep_nop_register,
                                      .prep_unregister = &prep_nop_unregister,
                                      .fd = f->buffered_fd(),
                                      .index = 3,
                                      .slots = 8}};
    io_request a = ring_fixture::request(io_op::write, 0, 65536, nullptr);
    a.external = &kb;
    t.ring->append(a, 0, 0, false);
    EXPECT_EQ(kernel_buffer_counts::registers, deferred ? 0 : 1)
        << "registered while the ring still had DEFER_TASKRUN";
    EXPECT_EQ(t.wait(before), 4096);
    EXPECT_NE(t.ring->mode(), ring_mode::defer_taskrun);
    EXPECT_EQ(t.stats.kernel_buffer_rings.load(), deferred ? 1u : 0u);
    EXPECT_EQ(kernel_buffer_counts::registers, 1);
    EXPECT_EQ(kernel_buffer_counts::unregisters, 0) << "unregistered before its write ran";
    // Slot 3 holds nothing (the stand-in registered nothing): the kernel
    // fails the write, and the buffer is still unregistered.
    EXPECT_EQ(t.wait(a), -EFAULT);
    EXPECT_EQ(kernel_buffer_counts::registers, 1);
    EXPECT_EQ(kernel_buffer_counts::unregisters, 1);
    EXPECT_EQ(t.stats.held_appends.load(), 0u) << "data in the kernel was held for pwritev2";
    EXPECT_EQ(t.stats.kernel_buffer_writes.load(), 1u);
    EXPECT_EQ(t.stats.kernel_buffer_errors.load(), 0u);
    EXPECT_EQ(t.ring->in_flight(), 0u);
    t.ring->poll();  // the unregister entry goes to the kernel
    EXPECT_EQ(t.ring->next_wakeup_ns(), UINT64_MAX) << "the ring kept work after the last entry";

    // A slot beyond the table: refused without an entry.
    const external_data beyond{.where = external_data::place::kernel,
                               .kernel = {.prep_register = &prep_nop_register,
                                          .prep_unregister = &prep_nop_unregister,
                                          .fd = f->buffered_fd(),
                                          .index = 8,
                                          .slots = 8}};
    io_request b = ring_fixture::request(io_op::write, 0, 4096, nullptr);
    b.external = &beyond;
    t.ring->write(b, 0, 0, false);
    EXPECT_EQ(t.wait(b), -EINVAL);
    EXPECT_EQ(kernel_buffer_counts::registers, 1);

    // A registration the kernel refuses: the write fails with its errno
    // (not the ECANCELED of a broken link) and nothing is unregistered.
    const external_data refused{.where = external_data::place::kernel,
                                .kernel = {.prep_register = &prep_refused_register,
                                           .prep_unregister = &prep_nop_unregister,
                                           .fd = f->buffered_fd(),
                                           .index = 0,
                                           .slots = 8}};
    io_request c = ring_fixture::request(io_op::write, 0, 4096, nullptr);
    c.external = &refused;
    t.ring->write(c, 0, 0, true);
    const int rc = t.wait(c);
    EXPECT_LT(rc, 0);
    EXPECT_NE(rc, -ECANCELED);
    EXPECT_NE(rc, INT_MIN) << "the refused registration left its write in flight";
    EXPECT_EQ(kernel_buffer_counts::registers, 2);
    EXPECT_EQ(kernel_buffer_counts::unregisters, 1);
    EXPECT_EQ(t.stats.kernel_buffer_errors.load(), 1u);

    // The ring still serves ordinary requests; the file holds what they
    // wrote, and nothing of the failed writes.
    aligned_buffer w(4096), back(12288);
    fill(w.data, w.size, 7);
    EXPECT_EQ(t.write(0, w.data, 4096), 4096);
    struct stat st {};
    ASSERT_EQ(::fstat(f->buffered_fd(), &st), 0);
    EXPECT_EQ(st.st_size, 12288);
    EXPECT_EQ(t.read(0, back.data, 12288), 12288);
    EXPECT_EQ(std::memcmp(back.data, w.data, 4096), 0);
    EXPECT_EQ(std::memcmp(back.data + 8192, first.data, 4096), 0);
    EXPECT_EQ(std::count(back.data + 4096, back.data + 8192, 0), 4096);
}

// A queue owner's io_uring lent to the file ring (ublk's queue thread):
// the file ring's entries go there, the owner submits them with its own
// and passes back the completions that are not its own (bit 63 clear).
struct owner_ring {
    owner_ring() { init_owner_ring(ring); }
    ~owner_ring() { io_uring_queue_exit(&ring); }

    // An entry of the owner's own.
    void own_nop()
    {
        io_uring_sqe* sqe = io_uring_get_sqe(&ring);
        io_uring_prep_nop(sqe);
        io_uring_sqe_set_data64(sqe, (uint64_t{1} << 63) | 7);
    }

    // Runs the owner's loop until `r` completed: the queue's poll(), a
    // submit and wait, the completions handed out. Returns r's result
    // (INT_MIN on timeout).
    int wait(file_ring& fr, io_request& r)
    {
        for (int i = 0; i < 5000 && r.state == 0; ++i) {
            fr.poll();
            if (r.state != 0) {
                break;
            }
            __kernel_timespec ts{.tv_sec = 0, .tv_nsec = 10'000'000};
            io_uring_cqe* cqe = nullptr;
            io_uring_submit_and_wait_timeout(&ring, &cqe, 1, &ts, nullptr);
            unsigned head;
            unsigned seen = 0;
            io_uring_for_each_cqe(&ring, head, cqe)
            {
                if ((cqe->user_data >> 63) != 0) {
                    ++own_completions;
                } else {
                    fr.on_completion(cqe->user_data, cqe->res);
                }
                ++seen;
            }
            io_uring_cq_advance(&ring, seen);
        }
        return r.state != 0 ? r.status : INT_MIN;
    }

    io_uring ring{};
    unsigned own_completions = 0;
};

TEST(FileRing, ABorrowedRingCarriesTheRequestsAndIsGivenBack)
{
    temp_dir dir;
    make_file(dir.file("zone"), 0);
    auto f = open_file(dir.file("zone"), {});
    ASSERT_TRUE(f);
    ring_fixture t(*f);
    owner_ring owner;
    ASSERT_TRUE(t.ring->borrow_ring(&owner.ring));
    EXPECT_TRUE(t.ring->borrowed());
    EXPECT_EQ(t.stats.borrowed_rings.load(), 1u);
    EXPECT_EQ(t.ring->event_fd(), -1) << "the owner's ring wakes it, not the eventfd";
    owner_ring other;
    EXPECT_FALSE(t.ring->borrow_ring(&other.ring)) << "a second ring while one is borrowed";

    aligned_buffer w(3 * 65536), back(3 * 65536);
    fill(w.data, w.size, 11);
    // Written through the owner's ring, with an entry of the owner's beside.
    owner.own_nop();
    io_request a = ring_fixture::request(io_op::write, 0, 65536, w.data);
    t.ring->write(a, 0, 0, false);
    EXPECT_EQ(t.ring->next_wakeup_ns(), UINT64_MAX) << "the owner submits: nothing for poll()";
    EXPECT_FALSE(t.ring->borrow_ring(nullptr)) << "given back with a request in flight";
    EXPECT_EQ(owner.wait(*t.ring, a), 65536);
    EXPECT_EQ(owner.own_completions, 1u);
    // An append alone is still held and written by poll(); two together go
    // through the owner's ring.
    io_request b = ring_fixture::request(io_op::write, 65536, 65536, w.data + 65536);
    t.ring->append(b, 0, 65536, false);
    EXPECT_EQ(t.ring->next_wakeup_ns(), 0u) << "the owner would sleep on a held append";
    EXPECT_EQ(owner.wait(*t.ring, b), 65536);
    EXPECT_EQ(t.stats.held_appends.load(), 1u);
    io_request c = ring_fixture::request(io_op::write, 131072, 32768, w.data + 131072);
    io_request d = ring_fixture::request(io_op::write, 163840, 32768, w.data + 163840);
    t.ring->append(c, 0, 131072, false);
    t.ring->append(d, 0, 163840, false);
    EXPECT_EQ(owner.wait(*t.ring, c), 32768);
    EXPECT_EQ(owner.wait(*t.ring, d), 32768);
    EXPECT_EQ(t.stats.held_appends.load(), 1u);
    io_request rd = ring_fixture::request(io_op::read, 0, 3 * 65536, back.data);
    t.ring->read(rd, 0, 0);
    EXPECT_EQ(owner.wait(*t.ring, rd), 3 * 65536);
    EXPECT_EQ(std::memcmp(back.data, w.data, 3 * 65536), 0);

    // A kernel buffer: registered in the borrowed ring's table as it is
    // (no DEFER_TASKRUN rebuild: that is the owner's ring), unregistered
    // before the write completes; the stand-in registers nothing, so the
    // kernel fails the write.
    kernel_buffer_counts::registers = kernel_buffer_counts::unregisters = 0;
    const external_data kb{.where = external_data::place::kernel,
                           .kernel = {.prep_register = &prep_nop_register,
                                      .prep_unregister = &prep_nop_unregister,
                                      .fd = f->buffered_fd(),
                                      .index = 1,
                                      .slots = 4}};
    io_request k = ring_fixture::request(io_op::write, 3 * 65536, 4096, nullptr);
    k.external = &kb;
    t.ring->append(k, 0, 3 * 65536, false);
    EXPECT_EQ(owner.wait(*t.ring, k), -EFAULT);
    EXPECT_EQ(kernel_buffer_counts::registers, 1);
    EXPECT_EQ(kernel_buffer_counts::unregisters, 1);
    EXPECT_EQ(t.stats.kernel_buffer_rings.load(), 0u);
    EXPECT_EQ(t.ring->in_flight(), 0u);

    // Given back: the own ring (and its eventfd) serve again.
    EXPECT_TRUE(t.ring->borrow_ring(nullptr));
    EXPECT_FALSE(t.ring->borrowed());
    EXPECT_EQ(t.stats.borrowed_rings.load(), 0u);
    EXPECT_GE(t.ring->event_fd(), 0);
    EXPECT_EQ(t.read(65536, back.data, 65536), 65536);
    EXPECT_EQ(std::memcmp(back.data, w.data + 65536, 65536), 0);
    // The owner's ring holds none of the files any more: it can be lent again.
    EXPECT_TRUE(t.ring->borrow_ring(&owner.ring));
    EXPECT_TRUE(t.ring->borrow_ring(nullptr));
}

TEST(FileRing, ARingWithAFileTableOfItsOwnIsNotBorrowed)
{
    temp_dir dir;
    make_file(dir.file("zone"), 4096);
    auto f = open_file(dir.file("zone"), {});
    ASSERT_TRUE(f);
    ring_fixture t(*f);
    owner_ring owner;
    const int fd = f->fd();
    ASSERT_EQ(io_uring_register_files(&owner.ring, &fd, 1), 0);
    EXPECT_FALSE(t.ring->borrow_ring(&owner.ring));
    EXPECT_FALSE(t.ring->borrowed());
    EXPECT_EQ(t.stats.borrowed_rings.load(), 0u);
    aligned_buffer back(4096);
    EXPECT_EQ(t.read(0, back.data, 4096), 4096) << "the own ring no longer serves";
}

TEST(FileRing, DeferTaskrunWakesTheOwnerThroughTheEventfd)
{
    temp_dir dir;
    auto f = open_file(dir.file("wake.img"), {.create = true, .grow_to = 1 << 20});
    ASSERT_TRUE(f);
    ring_fixture t(*f, 32);
    // This kernel (6.1+) has DEFER_TASKRUN; the mode is shown either way.
    RecordProperty("ring_mode", to_string(t.ring->mode()));
    aligned_buffer buf(32 * 4096);
    io_request reqs[32];
    for (unsigned i = 0; i < 32; ++i) {
        reqs[i] = ring_fixture::request(io_op::write, i * 4096u, 4096, buf.data + i * 4096);
        t.ring->write(reqs[i], 0, i * 4096u, false);
    }
    EXPECT_EQ(t.ring->in_flight(), 32u);
    EXPECT_EQ(t.ring->next_wakeup_ns(), 0u) << "queued requests need a poll() now";
    t.ring->poll();
    // Submitted: sleep on the eventfd (UINT64_MAX), or look again at once
    // (0) when some writes completed since poll(), which a fast disk may do.
    const uint64_t wakeup = t.ring->next_wakeup_ns();
    EXPECT_TRUE(wakeup == UINT64_MAX || wakeup == 0) << wakeup;
    // From here only the eventfd says when to look: sleep on it alone, as
    // an owner does (next_wakeup_ns before each sleep).
    unsigned done = t.sink.completed;
    for (int i = 0; i < 200 && done < 32; ++i) {
        if (t.ring->next_wakeup_ns() != 0) {
            pollfd p{t.ring->event_fd(), POLLIN, 0};
            // Generous: the writes go to a disk that other work may keep busy.
            const int n = ::poll(&p, 1, 20000);
            ASSERT_EQ(n, 1) << "completions pending but the eventfd stayed quiet for 20 s";
        }
        t.ring->poll();
        done = t.sink.completed;
    }
    EXPECT_EQ(done, 32u);
    pollfd p{t.ring->event_fd(), POLLIN, 0};
    EXPECT_EQ(::poll(&p, 1, 0), 0)
        << "an idle ring leaves its eventfd readable (owners would spin)";
}

TEST(FileRing, AnotherThreadTakesOverAnIdleQueue)
{
    temp_dir dir;
    auto f = open_file(dir.file("handover.img"), {.create = true, .grow_to = 1 << 20});
    ASSERT_TRUE(f);
    ring_fixture t(*f);
    aligned_buffer w(4096), r(4096);
    fill(w.data, 4096, 8);
    ASSERT_EQ(t.write(0, w.data, 4096), 4096);
    const ring_mode first = t.ring->mode();
    int rc = INT_MIN;
    std::thread other([&] { rc = t.read(0, r.data, 4096); });
    other.join();
    EXPECT_EQ(rc, 4096);
    EXPECT_EQ(std::memcmp(w.data, r.data, 4096), 0);
    if (first == ring_mode::defer_taskrun) {
        EXPECT_EQ(t.ring->mode(), ring_mode::coop_taskrun);
        EXPECT_EQ(t.stats.ring_handovers.load(), 1u);
    }
    // And back: the rebuilt ring serves any thread.
    EXPECT_EQ(t.read(0, r.data, 4096), 4096);
}

TEST(FileRing, AThreadAfterTheOwnerExitedTakesTheRingOver)
{
    // The owner thread ends, a new one drives the queue (a benchmark's or a
    // caller's thread per run). The new thread often reuses the old one's
    // thread-local storage: it must still be seen as another thread and get
    // the ring handed over, not be taken for the owner and have the kernel
    // refuse every submission (EEXIST) while poll() retries for ever.
    temp_dir dir;
    auto f = open_file(dir.file("after-exit.img"), {.create = true, .grow_to = 1 << 20});
    ASSERT_TRUE(f);
    ring_fixture t(*f);
    aligned_buffer w(4096), r(4096);
    fill(w.data, 4096, 9);
    int rc = INT_MIN;
    std::thread first([&] { rc = t.write(0, w.data, 4096); });
    first.join();
    ASSERT_EQ(rc, 4096);
    const ring_mode mode = t.ring->mode();
    rc = INT_MIN;
    std::thread second([&] { rc = t.read(0, r.data, 4096); });
    second.join();
    EXPECT_EQ(rc, 4096) << "INT_MIN: the request never completed";
    EXPECT_EQ(std::memcmp(w.data, r.data, 4096), 0);
    EXPECT_EQ(t.stats.ring_errors.load(), 0u);
    if (mode == ring_mode::defer_taskrun) {
        EXPECT_EQ(t.stats.ring_handovers.load(), 1u);
    }
}

TEST(FileRing, ThreadTheKernelRefusesFailsItsRequestsWithoutSpinning)
{
    // A thread the kernel did not bind the single-issuer ring to, but that
    // the ring takes for its owner: a forked child of the owner thread (the
    // same thread-local state, another task). io_uring_enter answers EEXIST
    // every time; the requests must fail with -EBUSY at once, not spin.
    temp_dir dir;
    auto f = open_file(dir.file("refused.img"), {.create = true, .grow_to = 1 << 20});
    ASSERT_TRUE(f);
    ring_fixture t(*f);
    aligned_buffer w(4096), r(4096);
    fill(w.data, 4096, 10);
    ASSERT_EQ(t.write(0, w.data, 4096), 4096);
    if (t.ring->mode() != ring_mode::defer_taskrun) {
        GTEST_SKIP() << "this kernel has no SINGLE_ISSUER/DEFER_TASKRUN ring ("
                     << to_string(t.ring->mode()) << ")";
    }
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        // Exit codes: 0 as expected; 1 the first request did not fail with
        // -EBUSY; 2 the next one was not refused; 3 not counted.
        int code = 0;
        if (t.read(0, r.data, 4096) != -EBUSY) {
            code = 1;
        } else if (t.write(4096, w.data, 4096) != -EBUSY) {
            code = 2;
        } else if (t.stats.ring_errors.load() != 1 || t.ring->in_flight() != 0 ||
                   t.ring->next_wakeup_ns() != UINT64_MAX) {
            code = 3;
        }
        ::_exit(code);
    }
    int status = 0;
    pid_t done = 0;
    for (int i = 0; i < 2000 && done == 0; ++i) {  // 20 s
        done = ::waitpid(child, &status, WNOHANG);
        if (done == 0) {
            ::usleep(10000);
        }
    }
    if (done == 0) {
        ::kill(child, SIGKILL);
        ::waitpid(child, &status, 0);
        FAIL() << "the child still ran after 20 s: the ring spins on EEXIST";
    }
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0);
    // The owner's ring is untouched.
    EXPECT_EQ(t.read(0, r.data, 4096), 4096);
    EXPECT_EQ(std::memcmp(w.data, r.data, 4096), 0);
}

}  // namespace
}  // namespace softblk
