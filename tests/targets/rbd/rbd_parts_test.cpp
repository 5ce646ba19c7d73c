// The rbd target's parts that need no cluster: the option checks made
// before connecting, the completion list that brings requests back to the
// queue's thread, and the worker that answers allocation maps off that
// thread. The cluster tests are tests/targets/rbd/rbd_target.sh and rbd_outage.sh.
#include "completion_list.hpp"
#include "map_worker.hpp"
#include "test_util.hpp"

#include <poll.h>

#include <atomic>
#include <chrono>
#include <latch>
#include <thread>

namespace softblk::test {
namespace {

using targets::rbd::completion_list;
using targets::rbd::map_worker;

bool readable(int fd, int timeout_ms)
{
    pollfd p{fd, POLLIN, 0};
    return ::poll(&p, 1, timeout_ms) == 1;
}

completion_list make_list()
{
    return completion_list(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
}

std::vector<io_request*> drain(completion_list& list)
{
    std::vector<io_request*> out;
    for (io_request* r = list.take(); r != nullptr; r = r->next) {
        out.push_back(r);
    }
    return out;
}

TEST(RbdOptions, RefusedBeforeConnecting)
{
    // Each names the option to change; none gets as far as librados (no
    // cluster here: a connection attempt would fail differently).
    EXPECT_NE(create_error({}, nullptr, "rbd").find("image: the rbd target needs image="),
              std::string::npos);
    EXPECT_NE(create_error({"image=i", "size=64M"}, nullptr, "rbd").find("size: only create=1"),
              std::string::npos);
    EXPECT_NE(create_error({"image=i", "create=1"}, nullptr, "rbd").find("create=1 needs size="),
              std::string::npos);
    EXPECT_NE(create_error({"image=i", "create=1", "size=1000"}, nullptr, "rbd")
                  .find("size=1000: not a multiple of 512"),
              std::string::npos);
    EXPECT_NE(create_error({"image=i", "create=1", "size=64M", "snap=s"}, nullptr, "rbd")
                  .find("snap: a snapshot cannot be created"),
              std::string::npos);
    EXPECT_NE(create_error({"image=i", "size=lots", "create=1"}, nullptr, "rbd")
                  .find("size=lots: not a size"),
              std::string::npos);
    // librados says ENOENT ("No such file or directory") for a directory.
    int code = 0;
    EXPECT_NE(create_error({"image=i", "conf=/tmp"}, &code, "rbd")
                  .find("conf=/tmp: a directory; give the ceph.conf file itself"),
              std::string::npos);
    EXPECT_EQ(code, EISDIR);
    EXPECT_NE(
        create_error({"image=i", "connect_timeout=0"}, nullptr, "rbd").find("connect_timeout"),
        std::string::npos);
    EXPECT_NE(
        create_error({"image=i", "osd_op_timeout=3601"}, nullptr, "rbd").find("osd_op_timeout"),
        std::string::npos);
}

TEST(RbdCompletionList, OldestFirstAndOneWakeUpPerBatch)
{
    completion_list list = make_list();
    EXPECT_EQ(list.take(), nullptr);
    EXPECT_FALSE(list.ready_or_reset());
    EXPECT_FALSE(readable(list.fd(), 0));
    io_request a, b, c;
    list.push(a);
    EXPECT_TRUE(readable(list.fd(), 0));
    EXPECT_TRUE(list.ready_or_reset());
    list.push(b);
    list.push(c);
    EXPECT_EQ(drain(list), (std::vector<io_request*>{&a, &b, &c}));
    // take() reset the eventfd: an owner that sleeps now does not spin.
    EXPECT_FALSE(readable(list.fd(), 0));
    EXPECT_FALSE(list.ready_or_reset());
    list.push(b);
    EXPECT_TRUE(readable(list.fd(), 0));
    EXPECT_EQ(drain(list), (std::vector<io_request*>{&b}));
}

TEST(RbdCompletionList, StaleWakeUpIsResetBeforeSleeping)
{
    completion_list list = make_list();
    // A count left on the eventfd with nothing on the list (a wake-up for
    // requests an earlier take() already had) must not keep a
    // level-triggered sleep from sleeping.
    eventfd_write(list.fd(), 1);
    EXPECT_FALSE(list.ready_or_reset());
    EXPECT_FALSE(readable(list.fd(), 0));
}

TEST(RbdCompletionList, PushesFromManyThreadsAllArriveInEachThreadsOrder)
{
    constexpr unsigned k_threads = 4;
    constexpr unsigned k_each = 5000;
    completion_list list = make_list();
    std::vector<io_request> requests(k_threads * k_each);
    for (unsigned i = 0; i < requests.size(); ++i) {
        requests[i].target_scratch[0] = i;
    }
    std::vector<std::thread> pushers;
    for (unsigned t = 0; t < k_threads; ++t) {
        pushers.emplace_back([&, t] {
            for (unsigned i = 0; i < k_each; ++i) {
                list.push(requests[t * k_each + i]);
            }
        });
    }
    std::vector<uint64_t> last(k_threads, UINT64_MAX);
    unsigned got = 0;
    while (got < requests.size()) {
        if (!list.ready_or_reset()) {
            ASSERT_TRUE(readable(list.fd(), 5000)) << "a push did not wake the owner";
        }
        for (io_request* r : drain(list)) {
            const uint64_t i = r->target_scratch[0];
            const unsigned t = static_cast<unsigned>(i / k_each);
            EXPECT_TRUE(last[t] == UINT64_MAX || last[t] < i) << "thread " << t << " out of order";
            last[t] = i;
            ++got;
        }
    }
    for (auto& t : pushers) {
        t.join();
    }
    EXPECT_EQ(got, requests.size());
}

TEST(RbdMapWorker, AnswersInOrderThroughTheList)
{
    completion_list list = make_list();
    std::vector<io_request> requests(8);
    {
        map_worker worker([&](io_request& r) {
            r.target_scratch[0] = r.offset * 2;
            list.push(r);
        });
        for (unsigned i = 0; i < requests.size(); ++i) {
            requests[i].offset = i;
            worker.post(requests[i]);
        }
        std::vector<io_request*> back;
        while (back.size() < requests.size()) {
            ASSERT_TRUE(readable(list.fd(), 5000));
            for (io_request* r : drain(list)) {
                back.push_back(r);
            }
        }
        for (unsigned i = 0; i < back.size(); ++i) {
            EXPECT_EQ(back[i], &requests[i]);
            EXPECT_EQ(back[i]->target_scratch[0], i * 2);
        }
    }
}

TEST(RbdMapWorker, AMapThatHangsHoldsUpNoPosterAndNothingElseOnTheList)
{
    // The cluster away: the worker's answer waits. Whoever posts returns at
    // once, and requests that librbd hands back meanwhile (other pushes on
    // the same list) reach the queue's thread.
    completion_list list = make_list();
    std::latch cluster_back(1);
    std::atomic<bool> answering{false};
    io_request map_request, other_map, read_request;
    {
        map_worker worker([&](io_request& r) {
            answering = true;
            cluster_back.wait();
            list.push(r);
        });
        const auto t0 = std::chrono::steady_clock::now();
        worker.post(map_request);
        worker.post(other_map);
        EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(500));
        while (!answering) {
            std::this_thread::yield();
        }
        std::thread librbd([&] { list.push(read_request); });
        librbd.join();
        ASSERT_TRUE(readable(list.fd(), 5000));
        EXPECT_EQ(drain(list), (std::vector<io_request*>{&read_request}));
        EXPECT_FALSE(readable(list.fd(), 100)) << "a map came back while the cluster was away";
        cluster_back.count_down();
        std::vector<io_request*> back;
        while (back.size() < 2) {
            ASSERT_TRUE(readable(list.fd(), 5000));
            for (io_request* r : drain(list)) {
                back.push_back(r);
            }
        }
        EXPECT_EQ(back, (std::vector<io_request*>{&map_request, &other_map}));
    }
}

TEST(RbdMapWorker, DestructionAnswersWhatWasPosted)
{
    completion_list list = make_list();
    std::vector<io_request> requests(3);
    std::atomic<unsigned> answered{0};
    {
        map_worker worker([&](io_request& r) {
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
            ++answered;
            list.push(r);
        });
        for (auto& r : requests) {
            worker.post(r);
        }
    }
    EXPECT_EQ(answered.load(), 3u);
    EXPECT_EQ(drain(list).size(), 3u);
}

}  // namespace
}  // namespace softblk::test
