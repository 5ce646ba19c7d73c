// A thread of the rbd target's own for the one request librbd answers only
// synchronously: the allocation map (rbd_diff_iterate2 has no asynchronous
// form in Pacific 16.2). The queue's thread posts the request and goes on;
// the worker answers it and hands it back through the queue's
// completion_list, as librbd's callbacks hand back reads and writes. Needs
// no librbd, so the unit tests drive it alone
// (tests/targets/rbd/rbd_parts_test.cpp).
#pragma once

#include <softblk/support/intrusive_fifo.hpp>
#include <softblk/types.hpp>

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace softblk::targets::rbd {

class map_worker {
public:
    // `answer` runs on the worker's thread, once per posted request, in the
    // order posted, one at a time: it computes the result and hands the
    // request back to its queue. It may wait as long as the cluster makes
    // it (an OSD outage): only the requests posted after it wait too.
    explicit map_worker(std::function<void(io_request&)> answer)
        : _answer(std::move(answer)), _thread([this] { run(); })
    {
    }

    // Answers what was posted and not answered yet, then joins the thread
    // (the target's queues, destroyed first, wait for their requests, so
    // nothing is left here in practice).
    ~map_worker()
    {
        {
            std::lock_guard lock(_mutex);
            _stopping = true;
        }
        _wake.notify_one();
        _thread.join();
    }
    map_worker(const map_worker&) = delete;
    map_worker& operator=(const map_worker&) = delete;

    // Queues `r` for the worker. Any thread; never waits for an answer (the
    // mutex guards only the list). `r.next` belongs to the worker until
    // `answer` runs.
    void post(io_request& r)
    {
        {
            std::lock_guard lock(_mutex);
            _posted.push(r);
        }
        _wake.notify_one();
    }

private:
    void run()
    {
        std::unique_lock lock(_mutex);
        for (;;) {
            _wake.wait(lock, [this] { return _stopping || !_posted.empty(); });
            io_request* r = _posted.pop();
            if (r == nullptr) {
                return;  // stopping, nothing left
            }
            lock.unlock();
            _answer(*r);
            lock.lock();
        }
    }

    std::function<void(io_request&)> _answer;
    std::mutex _mutex;
    std::condition_variable _wake;
    intrusive_fifo<io_request> _posted;  // guarded by _mutex
    bool _stopping = false;              // guarded by _mutex
    std::thread _thread;                 // last: starts once the rest exists
};

}  // namespace softblk::targets::rbd
