// The rbd target's hand-over of finished requests from foreign threads
// (librbd's callback threads, the allocation-map worker) to the queue's own
// thread: the shared lock-free handoff_list through io_request::next plus
// an eventfd that the queue's owner sleeps on (target_queue::wait_fd).
// Needs no librbd, so the unit tests drive it alone
// (tests/targets/rbd/rbd_parts_test.cpp).
#pragma once

#include <softblk/support/handoff_list.hpp>
#include <softblk/types.hpp>

#include <sys/eventfd.h>
#include <unistd.h>

namespace softblk::targets::rbd {

class completion_list {
public:
    // Takes `event_fd` (an eventfd, non-blocking), closed by the destructor.
    explicit completion_list(int event_fd) : _event_fd(event_fd) {}
    ~completion_list()
    {
        _list.wait_for_pushers();
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
        _list.push(r, [this] { eventfd_write(_event_fd, 1); });
    }

    // Every request pushed so far, oldest first, as a chain through
    // io_request::next; nullptr when none. Resets the eventfd first, so a
    // push after the take writes it anew. The queue's thread.
    io_request* take()
    {
        eventfd_t value = 0;
        eventfd_read(_event_fd, &value);
        return _list.take();
    }

    // Before the owner sleeps on fd(): true when requests already wait (do
    // not sleep). Otherwise resets the eventfd, so that a wake-up for
    // requests take() already had does not make a level-triggered sleep
    // spin, and looks again (a push after the reset writes anew). The
    // queue's thread.
    bool ready_or_reset() const
    {
        if (!_list.empty()) {
            return true;
        }
        eventfd_t value = 0;
        eventfd_read(_event_fd, &value);
        return !_list.empty();
    }

    // Waits until no push() is still running (it may touch the list after
    // its request was taken): the last step before the owner of the list
    // frees it.
    void wait_for_pushers() const { _list.wait_for_pushers(); }

private:
    int _event_fd;
    handoff_list<io_request> _list;
};

}  // namespace softblk::targets::rbd
