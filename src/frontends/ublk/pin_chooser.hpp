// Whether a device's queue threads keep to one CPU (queue_affinity=auto), chosen
// from what each way was measured to give: the time per 4 KiB served (a
// request without data counts as one), over epochs of at least `epoch_ns`
// and `epoch_requests`. Not per request: the block layer merges
// sequential writes into requests of up to a MiB, and merges more where
// the server is slower to take them, so fewer, larger requests would
// count against the way that moves more data.
//
// Why measured: on an Intel Xeon guest under KVM a 1-queue thread pinned
// to one CPU served 128 KiB sequential zone writes 16-22% faster (the
// program submitting them then stays on the other CPU and the two stop
// taking turns on one, each turn a switch of address space), and gave up
// 0-4% elsewhere; on AMD EPYC guests the same pinning cost 128 KiB random
// writes a third (docs/benchmarks.md at 46583e9). Which way wins is the machine's and
// the load's, so the threads try both and keep the faster.
//
// The time per block is the load's own rate only while the device is
// busy: an epoch in which it went `idle_break_ns` or longer without a
// request (an idle device, a program between two jobs) says nothing
// about the choice, and is dropped. Where the load sets the rate (requests
// that come at their own pace) both ways measure alike and the margin
// keeps the thread free.
//
// Single-threaded: device_pinning (device_pinning.hpp) feeds it what all
// of a device's queues served, one thread at a time.
#pragma once

#include "way_chooser.hpp"

#include <cstdint>

namespace softblk::ublk {

class pin_chooser {
public:
    static constexpr uint64_t k_block_bytes = 4096;

    struct config {
        uint64_t epoch_ns = 10'000'000;
        uint64_t epoch_requests = 32;
        uint64_t idle_break_ns = 10'000'000;
        // Free first, pinned second. Pinning must win by 5%: a free thread
        // also follows a load that moves. Runs of 3 epochs, the first
        // dropped: after a switch the submitting programs move as well.
        // One run in 32 epochs the other way (thinned where it is far
        // behind): 9% of the time, which costs 1-2% where one way is a
        // fifth to a half slower, and looks again every third of a second.
        way_chooser::config ways{
            .margin = 0.95, .explore_every = 32, .run = 3, .outlier_cap = 2, .max_stretch = 4};
    };

    pin_chooser() = default;
    explicit pin_chooser(config c) : _cfg(c), _ways(c.ways) {}

    // A wait of the device for a request of `ns`: an epoch holding one of
    // at least idle_break_ns is dropped.
    void waited(uint64_t ns)
    {
        if (ns >= _cfg.idle_break_ns) {
            _void = true;
        }
    }

    // The requests served from which update() could end an epoch (0: now):
    // the threads ask first, and read the clock only then.
    uint64_t due_at() const
    {
        return !_started || _void ? 0 : _epoch_requests + _cfg.epoch_requests;
    }
    bool due(uint64_t requests) const { return requests >= due_at(); }

    // Once per turn of the thread's loop (where due), with the time, and the requests
    // and 4 KiB blocks (a request without data: one) served so far;
    // returns whether the thread should be pinned now.
    bool update(uint64_t now_ns, uint64_t requests, uint64_t blocks)
    {
        if (!_started) {
            _started = true;
            _pinned = _ways.take_second();
            start_epoch(now_ns, requests, blocks);
            return _pinned;
        }
        const uint64_t served = requests - _epoch_requests;
        const uint64_t elapsed = now_ns - _epoch_start;
        if (served < _cfg.epoch_requests || elapsed < _cfg.epoch_ns) {
            if (elapsed >= _cfg.epoch_ns && _void) {
                // Idle: start afresh rather than stretch the epoch over it.
                start_epoch(now_ns, requests, blocks);
            }
            return _pinned;
        }
        if (!_void) {
            _ways.record(_pinned, elapsed / (blocks - _epoch_blocks));
            _pinned = _ways.take_second();
            ++_epochs;
        }
        start_epoch(now_ns, requests, blocks);
        return _pinned;
    }

    bool pinned() const { return _pinned; }
    // The way ahead so far (false until both were measured).
    bool pinned_ahead() const { return _ways.second_ahead(); }
    // Epochs measured (not dropped).
    uint64_t epochs() const { return _epochs; }
    double mean_ns(bool pinned) const { return _ways.mean(pinned); }

private:
    void start_epoch(uint64_t now_ns, uint64_t requests, uint64_t blocks)
    {
        _epoch_start = now_ns;
        _epoch_requests = requests;
        _epoch_blocks = blocks;
        _void = false;
    }

    config _cfg{};
    way_chooser _ways{_cfg.ways};
    bool _started = false;
    bool _pinned = false;
    bool _void = false;
    uint64_t _epoch_start = 0;
    uint64_t _epoch_requests = 0;
    uint64_t _epoch_blocks = 0;
    uint64_t _epochs = 0;
};

}  // namespace softblk::ublk
