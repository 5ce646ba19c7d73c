// A first-in first-out list threaded through a `next` pointer that the
// element provides (io_request::next, bio::next ...): no allocation, O(1)
// push and pop. Not thread-safe: one owner at a time.
#pragma once

namespace softblk {

template <class T, T* T::*Next = &T::next>
class intrusive_fifo {
public:
    bool empty() const { return _head == nullptr; }
    unsigned size() const { return _size; }
    T* front() const { return _head; }

    void push(T& item)
    {
        item.*Next = nullptr;
        if (_tail != nullptr) {
            _tail->*Next = &item;
        } else {
            _head = &item;
        }
        _tail = &item;
        ++_size;
    }

    // The oldest element, unlinked; nullptr when empty.
    T* pop()
    {
        T* h = _head;
        if (h != nullptr) {
            _head = h->*Next;
            if (_head == nullptr) {
                _tail = nullptr;
            }
            --_size;
        }
        return h;
    }

    // Empties the list and returns its elements as a chain through Next
    // (oldest first, last one's Next is nullptr).
    T* take_all()
    {
        T* h = _head;
        _head = _tail = nullptr;
        _size = 0;
        return h;
    }

    // Unlinks `item` if it is in the list (O(n)); true if it was.
    bool remove(T& item)
    {
        T* prev = nullptr;
        for (T* p = _head; p != nullptr; prev = p, p = p->*Next) {
            if (p != &item) {
                continue;
            }
            if (prev != nullptr) {
                prev->*Next = p->*Next;
            } else {
                _head = p->*Next;
            }
            if (_tail == p) {
                _tail = prev;
            }
            --_size;
            return true;
        }
        return false;
    }

private:
    T* _head = nullptr;
    T* _tail = nullptr;
    unsigned _size = 0;
};

}  // namespace softblk
