// queue_affinity=auto for a whole device: its queues' threads go between
// running free and all on one CPU together, as pin_chooser decides from
// what the device served. Shared by the device's queue threads.
//
// Why the device and not each queue: a queue of some CPUs gets the
// requests of the programs that run on them, and pinning moves those
// programs, so a queue's own rate cannot compare the two ways (tried per
// queue with 2 queues, it lost 0.73 at 4 KiB QD 1). The device's rate
// can. And the pinned way that paid with 2 queues on 2
// CPUs was the whole daemon on one CPU (0.98-1.31 of free on the Intel
// Xeon host, docs/benchmarks.md at 46583e9): the submitting programs then have the
// other CPU to themselves, and nobody takes turns with the daemon. (The
// export measures devices of 1 or 2 queues only: a pinned try of more
// queues' threads on one CPU would starve them.)
//
// Any thread may end an epoch: a queue whose CPUs submit nothing sleeps
// as long as its queue stays empty, so no one thread can be relied on to.
// The chooser sits behind a mutex taken only when an epoch can end
// (every 32 requests of the device, 10 ms at least), and a thread that
// finds it taken goes on with its requests. The counts a request adds are
// relaxed atomics: an epoch's sums may miss a request in flight between
// two threads, which is one in 32 at most.
#pragma once

#include "pin_chooser.hpp"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>

namespace softblk::ublk {

class device_pinning {
public:
    device_pinning() = default;
    explicit device_pinning(pin_chooser::config c) : _idle_break_ns(c.idle_break_ns), _chooser(c) {}
    device_pinning(const device_pinning&) = delete;
    device_pinning& operator=(const device_pinning&) = delete;

    // A queue's thread took a request of `length` bytes.
    void served(uint64_t length)
    {
        _requests.fetch_add(1, std::memory_order_relaxed);
        _blocks.fetch_add(std::max<uint64_t>(1, length / pin_chooser::k_block_bytes),
                          std::memory_order_relaxed);
    }
    uint64_t requests() const { return _requests.load(std::memory_order_relaxed); }

    // A queue's thread waited `ns` for a request, the device having served
    // `requests_before` when it began. Where the device served none
    // meanwhile, it was idle that long: the epoch is dropped if that is
    // idle_break_ns or more. (A queue of other CPUs' requests waits while
    // the device is busy: that is no idle device.)
    void waited(uint64_t ns, uint64_t requests_before)
    {
        if (ns >= _idle_break_ns && requests() == requests_before) {
            _idle.store(true, std::memory_order_relaxed);
        }
    }

    // Whether an epoch can end now: the threads ask each turn, and read
    // the clock only where it can.
    bool due() const
    {
        return _idle.load(std::memory_order_relaxed) ||
               requests() >= _due_at.load(std::memory_order_relaxed);
    }

    // Ends the epoch where it is over (one thread at a time; another that
    // comes meanwhile goes on), and publishes the way.
    void update(uint64_t now_ns)
    {
        std::unique_lock lock(_mutex, std::try_to_lock);
        if (!lock.owns_lock()) {
            return;
        }
        if (_idle.exchange(false, std::memory_order_relaxed)) {
            _chooser.waited(_idle_break_ns);
        }
        const uint64_t measured = _chooser.epochs();
        const bool pin =
            _chooser.update(now_ns, requests(), _blocks.load(std::memory_order_relaxed));
        _due_at.store(_chooser.due_at(), std::memory_order_relaxed);
        if (_chooser.epochs() != measured) {
            _epochs.store(_chooser.epochs(), std::memory_order_relaxed);
            _free_ns.store(static_cast<uint64_t>(_chooser.mean_ns(false)),
                           std::memory_order_relaxed);
            _pinned_ns.store(static_cast<uint64_t>(_chooser.mean_ns(true)),
                             std::memory_order_relaxed);
        }
        _pinned.store(pin, std::memory_order_relaxed);
    }

    // The way the device's threads go now.
    bool pinned() const { return _pinned.load(std::memory_order_relaxed); }
    // Epochs measured (not dropped).
    uint64_t epochs() const { return _epochs.load(std::memory_order_relaxed); }
    // The time per 4 KiB measured each way (ns; 0 until measured).
    uint64_t ns_per_block(bool pinned) const
    {
        return (pinned ? _pinned_ns : _free_ns).load(std::memory_order_relaxed);
    }

private:
    const uint64_t _idle_break_ns = pin_chooser::config{}.idle_break_ns;
    std::atomic<uint64_t> _requests{0}, _blocks{0};
    std::atomic<uint64_t> _due_at{0};  // 0: the first turn starts the first epoch
    std::atomic<bool> _idle{false};
    std::atomic<bool> _pinned{false};
    std::atomic<uint64_t> _epochs{0}, _free_ns{0}, _pinned_ns{0};
    std::mutex _mutex;
    pin_chooser _chooser;  // under _mutex
};

}  // namespace softblk::ublk
