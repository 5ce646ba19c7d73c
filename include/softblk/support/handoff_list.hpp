// A hand-over of elements from any number of threads to one taker thread:
// a lock-free stack threaded through the element's `next` pointer
// (io_request::next, bio::next ...), taken whole and returned oldest
// first. No allocation. The rbd target hands finished requests from
// librbd's threads to its queue with it (src/targets/rbd/completion_list.hpp
// adds the eventfd), the core's queues take control submissions from other
// threads with it (io_queue::post).
#pragma once

#include <atomic>
#include <thread>

namespace softblk {

template <class T, T* T::*Next = &T::next>
class handoff_list {
public:
    handoff_list() = default;
    handoff_list(const handoff_list&) = delete;
    handoff_list& operator=(const handoff_list&) = delete;
    ~handoff_list() { wait_for_pushers(); }

    // Hands `item` to the taker. Any thread; lock-free. Returns true when
    // the list was empty: the one push that needs to wake the taker (take()
    // empties the whole list at once).
    bool push(T& item)
    {
        return push(item, [] {});
    }

    // The same, calling `wake()` when the list was empty, before the push
    // counts as done (wait_for_pushers waits for it): what the taker sleeps
    // on may be closed once wait_for_pushers returned.
    template <class Wake>
    bool push(T& item, Wake&& wake)
    {
        _pushing.fetch_add(1, std::memory_order_relaxed);
        T* head = _head.load(std::memory_order_relaxed);
        do {
            item.*Next = head;
        } while (!_head.compare_exchange_weak(head, &item, std::memory_order_release,
                                              std::memory_order_relaxed));
        if (head == nullptr) {
            wake();
        }
        _pushing.fetch_sub(1, std::memory_order_release);
        return head == nullptr;
    }

    // Every element pushed so far, oldest first, as a chain through Next
    // (the last one's Next is nullptr); nullptr when none. The taker's
    // thread.
    T* take()
    {
        T* list = _head.exchange(nullptr, std::memory_order_acquire);
        T* ordered = nullptr;  // the stack is newest first
        while (list != nullptr) {
            T* next = list->*Next;
            list->*Next = ordered;
            ordered = list;
            list = next;
        }
        return ordered;
    }

    // True when nothing waits to be taken. Any thread.
    bool empty() const { return _head.load(std::memory_order_acquire) == nullptr; }

    // Waits until no push() is still running (it may touch the list after
    // its element was taken): the last step before the list's owner frees
    // it.
    void wait_for_pushers() const
    {
        while (_pushing.load(std::memory_order_acquire) != 0) {
            std::this_thread::yield();
        }
    }

private:
    std::atomic<T*> _head{nullptr};
    std::atomic<unsigned> _pushing{0};
};

}  // namespace softblk
