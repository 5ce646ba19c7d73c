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
// copies (docs/benchmarks.md at 46583e9). Runs compare the two ways as they cost
// when taken, which is what the choice is for.
//
// `outlier_cap` > 0: a sample counts at most that many times its way's
// mean. One copied 4 KiB write of several ms among 0.2 ms ones (a zone
// file's first block, a preempted thread) moved the favourite's mean by a
// sixteenth of it, enough to hand 50-80 writes to the other way at three
// times the cost; a real change of cost still comes through, a fifth more
// per sample with a cap of 4.
//
// `max_stretch` > 1: where the other way is behind by a ratio r, it is
// tried 1/r² as often (at most `max_stretch` times less often). Each take
// of it costs r - 1 favourite takes more, plus the switches; with 4 KiB
// zone writes at QD 1 and zero copy three times dearer, runs of 4 in 128
// took 5-10% off the rate (docs/benchmarks.md at 46583e9). Thinned by r², the price
// of exploring stays under 1% whatever r is, and a way close behind is
// still tried as often as before.
#pragma once

#include <algorithm>
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
        unsigned run = 1;        // takes per try (see above)
        double outlier_cap = 0;  // a sample counts at most this x its mean; 0: none
        double max_stretch = 1;  // explorations thinned at most this much (see above)
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
        } else if (_count % _cfg.explore_every == 0 && explore_now()) {
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
            double sample = static_cast<double>(cost);
            if (_cfg.outlier_cap > 0 && _mean[way] > 0) {
                sample = std::min(sample, _cfg.outlier_cap * _mean[way]);
            }
            // The way taken: a moving mean over about its last 16 samples.
            // The way only explored is tried rarely, so a sample of it
            // weighs more; otherwise its mean would trail by hundreds of
            // tries after a change of load (a QD 32 job's slow copies kept
            // 4 KiB writes at QD 1 on zero copy at a third of the copied
            // rate for a whole run).
            const double weight = warm() && !favourite ? 2.0 : 16.0;
            _mean[way] += (sample - _mean[way]) / weight;
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
    // How many times less often than every `explore_every` takes the
    // other way is tried now: (its mean / the favourite's)², within 1 and
    // max_stretch.
    double stretch() const
    {
        const bool fav = second_ahead();
        const double ahead = _mean[fav ? 1 : 0];
        if (_cfg.max_stretch <= 1 || ahead <= 0) {
            return 1;
        }
        const double r = _mean[fav ? 0 : 1] / ahead;
        return std::clamp(r * r, 1.0, _cfg.max_stretch);
    }

    // At each chance to explore: go if a chance's worth of credit (1 /
    // stretch per chance) has built up.
    bool explore_now()
    {
        _explore_credit += 1 / stretch();
        if (_explore_credit < 1) {
            return false;
        }
        _explore_credit -= 1;
        return true;
    }

    void start_run(bool second)
    {
        _run_way = second;
        _run_left = _cfg.run - 1;
    }

    config _cfg{};
    std::array<double, 2> _mean{0, 0};
    std::array<uint32_t, 2> _samples{0, 0};
    uint32_t _count = 0;
    double _explore_credit = 0;
    unsigned _run_left = 0;
    bool _run_way = false;
    bool _last = false;
    bool _taken = false;
    bool _switched = false;
};

}  // namespace softblk::ublk
