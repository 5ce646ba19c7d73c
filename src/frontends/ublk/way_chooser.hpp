// A choice between two ways of doing one thing, made from what each way
// was measured to cost (a time, smaller is better) and kept up to date:
// both ways are tried first (warm-up), then the cheaper is taken, with the
// other tried now and then (one take in `explore_every`) so that a change
// of load or machine is seen. The second way must be cheaper than `margin`
// times the first to be taken, so that a first way that costs nothing
// extra (sleeping instead of spinning, say) keeps ties. One per thread: no
// locking. copy_chooser and the queue thread's idle spin use it.
//
// `run` > 1: each try of the other way is a run of that many takes, and
// the first take after a switch of way is not measured. Where a switch
// itself costs (the first zero-copy write after copied ones wakes an
// io-wq worker that had gone to sleep; the first copied one after zero
// copy finds the queue thread's copy path cold), a lone explored sample
// carries that cost and the favourite's samples do not, so the first way
// ahead stayed ahead: in the VM lab 4 KiB writes at QD 1 stayed on zero
// copy for a thousand writes at a third of the copied rate, because the
// copies explored among them cost 0.65 ms against 0.2 ms in a run of
// copies (docs/benchmarks.md). Runs compare the two ways as they cost
// when taken, which is what the choice is for.
#pragma once

#include <array>
#include <cstdint>
#include <utility>

namespace softblk::ublk {

class way_chooser {
public:
    static constexpr unsigned k_warmup = 8;  // measured samples of each way first

    struct config {
        double margin = 1.0;
        // After the warm-up, one take in this many tries the other way.
        unsigned explore_every = 32;
        unsigned run = 1;  // takes per try (see above)
    };

    way_chooser() = default;
    explicit way_chooser(config c) : _cfg(c) {}

    // True: take the second way this time.
    bool take_second()
    {
        ++_count;
        bool second;
        if (_run_left > 0) {
            --_run_left;
            second = _run_way;
        } else if (!warm()) {
            // Both ways in turn, the one with fewer samples next.
            second = _samples[1] <= _samples[0];
            start_run(second);
        } else if (_count % _cfg.explore_every == 0) {
            second = !second_ahead();
            start_run(second);
        } else {
            second = second_ahead();
        }
        _switched = !_taken || second != _last;
        _taken = true;
        _last = second;
        return second;
    }

    // That way, taken, cost `cost` (nanoseconds, say). Called once after
    // each take_second(), before the next.
    void record(bool second, uint64_t cost)
    {
        if (_cfg.run > 1 && std::exchange(_switched, false)) {
            return;  // the first take after a switch pays for the switch
        }
        const unsigned way = second ? 1 : 0;
        const bool favourite = second_ahead() == second;
        if (_samples[way] == 0) {
            _mean[way] = static_cast<double>(cost);
        } else {
            // The way taken: a moving mean over about its last 16 samples.
            // The way only explored is tried rarely, so a sample of it
            // weighs more; otherwise its mean would trail by hundreds of
            // tries after a change of load (a QD 32 job's slow copies kept
            // 4 KiB writes at QD 1 on zero copy at a third of the copied
            // rate for a whole run).
            const double weight = warm() && !favourite ? 2.0 : 16.0;
            _mean[way] += (static_cast<double>(cost) - _mean[way]) / weight;
        }
        if (_samples[way] < UINT32_MAX) {
            ++_samples[way];
        }
    }

    bool warm() const { return _samples[0] >= k_warmup && _samples[1] >= k_warmup; }
    // Measured enough, and the second way is the cheaper by the margin.
    bool second_ahead() const { return warm() && _mean[1] < _mean[0] * _cfg.margin; }
    double mean(bool second) const { return _mean[second ? 1 : 0]; }
    const config& settings() const { return _cfg; }

private:
    void start_run(bool second)
    {
        _run_way = second;
        _run_left = _cfg.run - 1;
    }

    config _cfg{};
    std::array<double, 2> _mean{0, 0};
    std::array<uint32_t, 2> _samples{0, 0};
    uint32_t _count = 0;
    unsigned _run_left = 0;
    bool _run_way = false;
    bool _last = false;
    bool _taken = false;
    bool _switched = false;
};

}  // namespace softblk::ublk
