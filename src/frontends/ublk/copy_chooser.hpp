// Whether a ublk write goes with zero copy or is copied in with pread,
// decided per size from what the queue measures. Zero copy saves the copy
// (its cost grows with the size: slow where a user copy is slow, as under
// QEMU's software emulation) but costs every write more work in the
// kernel (registering the pages, a write that io_uring hands to a worker
// where the copied one is written by the queue's thread). Which wins for a
// size depends on the machine, so each size class (powers of two from
// 4 KiB to 1 MiB) keeps the mean time from dispatch to completion of both
// ways and takes the faster one, trying the other one now and then (runs
// of k_explore_run writes) so that a change (another load, another file
// system) is seen (way_chooser); writes that find others in flight go
// zero copy unmeasured (zero_copy(bytes, alone, timed)). One per queue
// thread: no locking.
#pragma once

#include "way_chooser.hpp"

#include <array>
#include <bit>
#include <cstdint>

namespace softblk::ublk {

class copy_chooser {
public:
    static constexpr unsigned k_classes = 9;  // 4 KiB .. 1 MiB and more
    static constexpr unsigned k_warmup = way_chooser::k_warmup;
    // The other way is tried in runs of k_explore_run writes, one run in
    // k_explore_every writes (3% of them) while it is close behind, down
    // to one in k_max_stretch times as many where it is far behind. A
    // run's first write is not measured: a switch of way costs more than
    // either way does when taken (way_chooser). Warm-up: runs of both ways in turn until each has
    // k_warmup measured writes, k_warmup_takes writes in all.
    static constexpr unsigned k_explore_every = 128;
    static constexpr unsigned k_explore_run = 4;
    static constexpr double k_max_stretch = 8;
    static constexpr unsigned k_warmup_takes =
        2 * k_explore_run * ((k_warmup + k_explore_run - 2) / (k_explore_run - 1));

    // True: send a write of `bytes` with zero copy, as measured.
    bool zero_copy(uint32_t bytes) { return _classes[class_of(bytes)].take_second(); }

    // The way for a write of `bytes` that the device queue takes while
    // `alone` (nothing else in flight there) or not; `timed`: its time goes
    // to record(). Only a write alone is measured, and only it may be
    // copied. With others in flight a copy is a pread on the queue's
    // thread that every request behind it waits for, a cost the time of
    // the write itself does not show (in the VM lab the measured choice
    // sent 128 KiB zone writes at QD 32 copied, at 0.6 of the zero copy
    // rate; docs/benchmarks.md at 46583e9); zero copy leaves the bytes to the file
    // ring's kernel side. Alone, a copy can be faster: the file ring
    // writes a lone append from the queue's thread at once
    // (file_ring::append), where zero copy needs the ring and a worker.
    bool zero_copy(uint32_t bytes, bool alone, bool& timed)
    {
        timed = alone;
        return !alone || zero_copy(bytes);
    }

    // A write of `bytes` sent that way took `ns` from dispatch to completion.
    void record(uint32_t bytes, bool zero_copy, uint64_t ns)
    {
        _classes[class_of(bytes)].record(zero_copy, ns);
    }

    // For describe(): the smallest size class where zero copy is ahead
    // (bytes), 0 when it is nowhere yet.
    uint32_t zero_copy_from() const
    {
        for (unsigned i = 0; i < k_classes; ++i) {
            if (_classes[i].second_ahead()) {
                return 4096u << i;
            }
        }
        return 0;
    }

    static unsigned class_of(uint32_t bytes)
    {
        if (bytes <= 4096) {
            return 0;
        }
        // ceil(log2(bytes)) - 12, so 4097..8192 is class 1.
        const unsigned c = static_cast<unsigned>(std::bit_width(bytes - 1)) - 12;
        return c < k_classes ? c : k_classes - 1;
    }

private:
    // Per size class: the first way copies, the second is zero copy.
    // A write's time counts at most 4 times its way's mean; a way behind
    // by r is tried 1/r² as often (way_chooser).
    static constexpr way_chooser::config k_way{.margin = 1.0,
                                               .explore_every = k_explore_every,
                                               .run = k_explore_run,
                                               .outlier_cap = 4,
                                               .max_stretch = k_max_stretch};
    std::array<way_chooser, k_classes> _classes = [] {
        std::array<way_chooser, k_classes> a;
        a.fill(way_chooser(k_way));
        return a;
    }();
};

}  // namespace softblk::ublk
