// A choice between two ways of doing one thing, made from what each way
// was measured to cost (a time, smaller is better) and kept up to date:
// both ways are tried k_warmup times first, then the cheaper is taken,
// with the other tried once in k_explore_every so that a change of load
// or machine is seen. The second way must be cheaper than `margin` times
// the first to be taken, so that a first way that costs nothing extra
// (sleeping instead of spinning, say) keeps ties. One per thread: no
// locking. copy_chooser and the queue thread's idle spin use it.
#pragma once

#include <array>
#include <cstdint>

namespace softblk::ublk {

class way_chooser {
public:
    static constexpr unsigned k_warmup = 8;          // samples of each way first
    static constexpr unsigned k_explore_every = 32;  // then one in 32 the other way

    way_chooser() = default;
    explicit way_chooser(double margin) : _margin(margin) {}

    // True: take the second way this time.
    bool take_second()
    {
        ++_count;
        if (!warm()) {
            return _samples[1] <= _samples[0];
        }
        const bool ahead = second_ahead();
        return _count % k_explore_every == 0 ? !ahead : ahead;
    }

    // That way, taken, cost `cost` (nanoseconds, say).
    void record(bool second, uint64_t cost)
    {
        const unsigned way = second ? 1 : 0;
        const bool favourite = second_ahead() == second;
        if (_samples[way] == 0) {
            _mean[way] = static_cast<double>(cost);
        } else {
            // The way taken: a moving mean over about its last 16 samples.
            // The way only explored gets one try in k_explore_every, so a
            // sample of it weighs more; otherwise its mean would trail by
            // hundreds of tries after a change of load (a QD 32 job's slow
            // copies kept 4 KiB writes at QD 1 on zero copy at a third of
            // the copied rate for a whole run).
            const double weight = warm() && !favourite ? 2.0 : 16.0;
            _mean[way] += (static_cast<double>(cost) - _mean[way]) / weight;
        }
        if (_samples[way] < UINT32_MAX) {
            ++_samples[way];
        }
    }

    bool warm() const { return _samples[0] >= k_warmup && _samples[1] >= k_warmup; }
    // Measured enough, and the second way is the cheaper by the margin.
    bool second_ahead() const { return warm() && _mean[1] < _mean[0] * _margin; }
    double mean(bool second) const { return _mean[second ? 1 : 0]; }

private:
    double _margin = 1.0;
    std::array<double, 2> _mean{0, 0};
    std::array<uint32_t, 2> _samples{0, 0};
    uint32_t _count = 0;
};

}  // namespace softblk::ublk
