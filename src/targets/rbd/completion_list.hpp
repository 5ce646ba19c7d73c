// The rbd target's hand-over of finished requests from foreign threads
// (librbd's callback threads, the allocation-map worker) to the queue's own
// thread: a lock-free stack through io_request::next plus an eventfd that
// the queue's owner sleeps on (target_queue::wait_fd). Needs no librbd, so
// the unit tests drive it alone (tests/targets/rbd_parts_test.cpp).
#pragma once

#include <softblk/types.hpp>

#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <thread>

namespace softblk::targets::rbd {

class completion_list {
public:
    // Takes `event_fd` (an eventfd, non-blocking), closed by the destructor.
    explicit completion_list(int event_fd) : _event_fd(event_fd) {}
    ~completion_list()
    {
        wait_for_pushers();
        close(_event_fd);
    }
    completion_list(const completion_list&) = delete;
    completion_list& operator=(const completion_list&) = delete;

    int fd() const { return _event_fd; }

    // Hands `r` to the queue's thread. Any thread; lock-free. Only the push
    // that makes the list non-empty writes the eventfd: take() empties the
    // whole list at once.
    void push(io_request& r)
    {
        _pushing.fetch_add(1, std::memory_order_relaxed);
        io_request* head = _head.load(std::memory_order_relaxed);
        do {
            r.next = head;
        } while (!_head.compare_exchange_weak(head, &r, std::memory_order_release,
                                              std::memory_order_relaxed));
        if (head == nullptr) {
            eventfd_write(_event_fd, 1);
        }
        _pushing.fetch_sub(1, std::memory_order_release);
    }

    // Every request pushed so far, oldest first, as a chain through
    // io_request::next; nullptr when none. Resets the eventfd first, so a
    // push after the take writes it anew. The queue's thread.
    io_request* take()
    {
        eventfd_t value = 0;
        eventfd_read(_event_fd, &value);
        io_request* list = _head.exchange(nullptr, std::memory_order_acquire);
        io_request* ordered = nullptr;  // the stack is newest first
        while (list != nullptr) {
            io_request* next = list->next;
            list->next = ordered;
            ordered = list;
            list = next;
        }
        return ordered;
    }

    // Before the owner sleeps on fd(): true when requests already wait (do
    // not sleep). Otherwise resets the eventfd, so that a wake-up for
    // requests take() already had does not make a level-triggered sleep
    // spin, and looks again (a push after the reset writes anew). The
    // queue's thread.
    bool ready_or_reset() const
    {
        if (_head.load(std::memory_order_acquire) != nullptr) {
            return true;
        }
        eventfd_t value = 0;
        eventfd_read(_event_fd, &value);
        return _head.load(std::memory_order_acquire) != nullptr;
    }

    // Waits until no push() is still running (it may touch the list after
    // its request was taken): the last step before the owner of the list
    // frees it.
    void wait_for_pushers() const
    {
        while (_pushing.load(std::memory_order_acquire) != 0) {
            std::this_thread::yield();
        }
    }

private:
    int _event_fd;
    std::atomic<io_request*> _head{nullptr};
    std::atomic<unsigned> _pushing{0};
};

}  // namespace softblk::targets::rbd
