// Whether a ublk write goes with zero copy or is copied in with pread,
// decided per size from what the queue measures. Zero copy saves the copy
// (its cost grows with the size: slow where a user copy is slow, as under
// QEMU's software emulation) but costs every write more work in the
// kernel (registering the pages, a write that io_uring hands to a worker
// where the copied one is written by the queue's thread). Which wins for a
// size depends on the machine, so each size class (powers of two from
// 4 KiB to 1 MiB) keeps the mean time from dispatch to completion of both
// ways and takes the faster one, trying the other one write in
// k_explore_every so that a change (another load, another file system) is
// seen. One per queue thread: no locking.
#pragma once

#include <array>
#include <bit>
#include <cstdint>

namespace softblk::ublk {

class copy_chooser {
public:
    static constexpr unsigned k_classes = 9;         // 4 KiB .. 1 MiB and more
    static constexpr unsigned k_warmup = 8;          // samples of each way first
    static constexpr unsigned k_explore_every = 32;  // then one write in 32 the other way

    // True: send a write of `bytes` with zero copy.
    bool zero_copy(uint32_t bytes)
    {
        size_class& c = _classes[class_of(bytes)];
        ++c.count;
        if (c.samples[0] < k_warmup || c.samples[1] < k_warmup) {
            return c.samples[1] <= c.samples[0];
        }
        const bool faster = c.mean_ns[1] < c.mean_ns[0];
        return c.count % k_explore_every == 0 ? !faster : faster;
    }

    // A write of `bytes` sent that way took `ns` from dispatch to completion.
    void record(uint32_t bytes, bool zero_copy, uint64_t ns)
    {
        size_class& c = _classes[class_of(bytes)];
        const unsigned way = zero_copy ? 1 : 0;
        const bool warm = c.samples[0] >= k_warmup && c.samples[1] >= k_warmup;
        const bool favourite = (c.mean_ns[1] < c.mean_ns[0]) == zero_copy;
        if (c.samples[way] == 0) {
            c.mean_ns[way] = static_cast<double>(ns);
        } else {
            // The way taken: a moving mean over about its last 16 writes.
            // The way only explored gets one write in k_explore_every, so
            // a sample of it weighs more; otherwise its mean would trail
            // by hundreds of writes after a change of load (a QD 32 job's
            // slow copies kept 4 KiB writes at QD 1 on zero copy at a
            // third of the copied rate for a whole run).
            const double weight = warm && !favourite ? 2.0 : 16.0;
            c.mean_ns[way] += (static_cast<double>(ns) - c.mean_ns[way]) / weight;
        }
        if (c.samples[way] < UINT32_MAX) {
            ++c.samples[way];
        }
    }

    // For describe(): the smallest size class where zero copy is ahead
    // (bytes), 0 when it is nowhere yet.
    uint32_t zero_copy_from() const
    {
        for (unsigned i = 0; i < k_classes; ++i) {
            const size_class& c = _classes[i];
            if (c.samples[0] >= k_warmup && c.samples[1] >= k_warmup &&
                c.mean_ns[1] < c.mean_ns[0]) {
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
    struct size_class {
        std::array<double, 2> mean_ns{0, 0};  // [copied, zero copy]
        std::array<uint32_t, 2> samples{0, 0};
        uint32_t count = 0;
    };
    std::array<size_class, k_classes> _classes{};
};

}  // namespace softblk::ublk
