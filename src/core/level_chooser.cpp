// level_chooser and shared_level_chooser (include/softblk/support/
// level_chooser.hpp): the sweep, the choice and its reasons.
#include <softblk/support/level_chooser.hpp>

#include <softblk/options.hpp>
#include <softblk/support/cpu_relax.hpp>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <ctime>
#include <utility>

#include <fmt/format.h>

namespace softblk {

namespace {

std::string rate_text(double per_second)
{
    return per_second >= 10'000 ? fmt::format("{:.1f}k/s", per_second / 1'000)
                                : fmt::format("{:.0f}/s", per_second);
}

uint64_t thread_cpu_ns()
{
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(ts.tv_nsec);
}

}  // namespace

level_chooser::level_chooser(config c) : _cfg(std::move(c))
{
    if (_cfg.levels.empty()) {
        _cfg.levels.push_back(0);
    }
    assert(std::is_sorted(_cfg.levels.begin(), _cfg.levels.end()));
    const size_t n = _cfg.levels.size();
    for (auto& pass : _pass) {
        pass.assign(n, {});
    }
    _rates.assign(n, 0);
    _spent_per_event.assign(n, 0);
    _cpu_per_event.assign(n, 0);
    _scores.assign(n, 0);
    if (_cfg.goal == objective::rate_per_cpu && _cfg.cpu_clock == nullptr) {
        _cfg.cpu_clock = thread_cpu_ns;
    }
    _exploit_len = _cfg.exploit_epochs;
    if (fixed()) {
        _phase = phase::exploit;
        _why = "given";
    } else {
        _why = "measuring";
    }
}

void level_chooser::start(uint64_t now)
{
    if (!_started) {
        _last_event = now;
    }
    _started = true;
    _epoch_start = now;
    _events = 0;
    _spent = 0;
    _epoch_cpu = read_cpu();
}

uint64_t level_chooser::read_cpu() const
{
    return _cfg.goal == objective::rate_per_cpu ? _cfg.cpu_clock() : 0;
}

double level_chooser::score(unsigned i) const
{
    return score_of({_rates[i], _spent_per_event[i], _cpu_per_event[i]});
}

double level_chooser::score_of(const epoch_figures& f) const
{
    if (_cfg.goal == objective::rate) {
        return f.rate;
    }
    // Rate per CPU ns per event; a level measured to cost nothing (a clock
    // too coarse for the epoch) counts as costing 1 ns.
    return f.rate / std::max(f.cpu_per_event, 1.0);
}

unsigned level_chooser::cheapest_near_best(const std::vector<double>& scores) const
{
    const auto n = static_cast<unsigned>(scores.size());
    const double top = *std::max_element(scores.begin(), scores.end());
    unsigned best = 0;
    if (_cfg.cost == cheaper::lower) {
        while (best + 1 < n && scores[best] * (1 + _cfg.margin) < top) {
            ++best;
        }
    } else {
        best = n - 1;
        while (best > 0 && scores[best] < top * (1 - _cfg.margin)) {
            --best;
        }
    }
    return best;
}

bool level_chooser::served(uint64_t now, uint64_t events, uint64_t spent)
{
    if (fixed()) {
        return false;
    }
    if (!_started) {
        start(now);
    }
    const unsigned before = _current;
    // An epoch that ran idle_ns without its events was idle, and so was
    // idle_ns without any event, also where the owner slept through it
    // and only the next load's first events tell (a loop that waits for
    // requests calls nothing meanwhile). Counted with them, the silence
    // used to end as one busy epoch of a few events per second, and the
    // choice made for the load before stood.
    // (Sums, not differences: threads that share a chooser may pass a
    // `now` a little older than the last one.)
    if ((now >= _epoch_start + _cfg.idle_ns && _events < _cfg.epoch_events) ||
        now >= _last_event + _cfg.idle_ns) {
        end_epoch(now, true);
    }
    if (events != 0) {
        _last_event = now;
    }
    _events += events;
    _spent += spent;
    if (now >= _epoch_start + _cfg.epoch_ns && _events >= _cfg.epoch_events) {
        end_epoch(now, false);
    }
    return _current != before;
}

void level_chooser::end_epoch(uint64_t now, bool idle)
{
    const uint64_t began = _epoch_start;
    const double seconds = static_cast<double>(now - _epoch_start) / 1e9;
    const double rate = static_cast<double>(_events) / seconds;
    const double spent_per_event =
        _events == 0 ? 0 : static_cast<double>(_spent) / static_cast<double>(_events);
    const uint64_t cpu_before = _epoch_cpu;
    const uint64_t events = _events;
    start(now);
    const double cpu_per_event =
        events == 0 ? 0
                    : static_cast<double>(_epoch_cpu - cpu_before) / static_cast<double>(events);

    if (idle) {
        // The load sets the rate: nothing to learn, nothing to spend.
        if (_phase != phase::idle) {
            _before_idle = _phase;
            _idle_from = _last_event;
            _phase = phase::idle;
            use(0);
            _why = fmt::format("idle (fewer than {} events in {} ms): {} {}", _cfg.epoch_events,
                               _cfg.idle_ns / 1'000'000, _cfg.levels[0], _cfg.unit);
        }
        return;
    }
    if (_phase == phase::idle) {
        // Busy again (this epoch ran at the lowest level, whatever the
        // choice: not a sample of it). A sweep cut short starts over.
        // After a second or more without a request the load is taken for
        // a new one (a benchmark's next job, a client that came back):
        // measured afresh. A choice kept for it by its rate alone (below)
        // stood where the other load ran at about the same rate at the
        // level in use but far better at another one (NBD at QD 32 after
        // QD 1: 150k requests/s next to the client, 290k apart).
        if (_before_idle == phase::sweep || _sweeps == 0 ||
            began >= _idle_from + k_new_load_after_ns) {
            start_sweep();
        } else {
            _phase = phase::exploit;
            _exploit_seen = 0;
            _baseline_rate = 0;
            _epoch_mean = 0;
            _epoch_m2 = 0;
            _verify = true;  // the load may be another one now
            use(_best);
            _why = fmt::format("busy again: {} {} as chosen before", _cfg.levels[_best], _cfg.unit);
        }
        return;
    }
    if (_phase == phase::sweep) {
        const unsigned level = sweep_level(_step);
        const unsigned pass = _step < _cfg.levels.size() ? 0 : 1;
        _pass[pass][level] = {rate, spent_per_event, cpu_per_event};
        ++_step;
        if (_step == 2 * _cfg.levels.size()) {
            finish_sweep();
        } else {
            use(sweep_level(_step));
        }
        return;
    }
    // Exploiting the winner: watch its rate for a change of load, against
    // what it gave in its first epochs here.
    ++_exploit_seen;
    // The epochs' spread (Welford, over every epoch of this run).
    const double delta = rate - _epoch_mean;
    _epoch_mean += delta / _exploit_seen;
    _epoch_m2 += delta * (rate - _epoch_mean);
    if (_verify && _exploit_seen == k_verify_epochs) {
        _verify = false;
        if (load_differs_from_sweep()) {
            _swept_again = true;
            start_sweep();
            return;
        }
    }
    constexpr unsigned k_baseline_epochs = 8;
    if (_exploit_seen <= k_baseline_epochs) {
        _baseline_rate = _epoch_mean;
        _recent_rate = _baseline_rate;
    } else {
        _recent_rate += (rate - _recent_rate) / 8;
        // A change of load moves the mean for good; noise moves the
        // figures by chance. Where epochs spread widely (an NBD client at
        // queue depth 1 on a loaded 2-CPU guest: 10 ms epochs of one load
        // from 4k/s to 96k/s), `drift` alone was passed by chance about
        // once a second, and each sweep spent a dozen epochs on levels
        // that lose. So the move must also pass 3 standard deviations of
        // what noise alone gives the difference of the baseline (a mean
        // of 8 epochs: variance s^2/8) and the 1/8 moving average (s^2/15).
        const double spread = std::sqrt(_epoch_m2 / (_exploit_seen - 1));
        const double noise = spread * std::sqrt(1.0 / 8 + 1.0 / 15);
        if (std::abs(_recent_rate - _baseline_rate) >
            std::max(_cfg.drift * _baseline_rate, 3 * noise)) {
            start_sweep();
            return;
        }
    }
    if (_exploit_left > 0 && --_exploit_left == 0) {
        start_sweep();
    }
}

bool level_chooser::load_differs_from_sweep()
{
    // The choice was made at the sweep's rate. A load that changed right
    // after it (a fill's 1 MiB writes swept, then 4 KiB ones at queue depth
    // 1) or during an idle spell (a benchmark's next job) sets the
    // baseline the drift check compares with, so that check never sees
    // the change, and the choice made for the other load stood for the
    // whole exploitation (20 s for colocation's 200 ms epochs: a whole QD 1
    // run served apart from its client at 4 times the CPU per request).
    // So the first epochs are compared with the sweep's rate as well, by
    // the drift check's rule (the epochs' spread: a 2-epoch mean against
    // a k_verify_epochs one).
    const double swept = _rates[_best];
    const double spread = std::sqrt(_epoch_m2 / (_exploit_seen - 1));
    const double noise = spread * std::sqrt(1.0 / k_verify_epochs + 1.0 / 2);
    if (std::abs(_epoch_mean - swept) <= std::max(_cfg.drift * swept, 3 * noise)) {
        return false;
    }
    _why = fmt::format("the load changed since the sweep: {} at {} {}, swept at {}",
                       rate_text(_epoch_mean), _cfg.levels[_best], _cfg.unit, rate_text(swept));
    return true;
}

unsigned level_chooser::sweep_level(unsigned step) const
{
    const auto n = static_cast<unsigned>(_cfg.levels.size());
    return step < n ? step : 2 * n - 1 - step;
}

void level_chooser::start_sweep()
{
    _phase = phase::sweep;
    _step = 0;
    use(sweep_level(0));
}

void level_chooser::finish_sweep()
{
    const size_t n = _cfg.levels.size();
    for (size_t i = 0; i < n; ++i) {
        // Every level has one epoch in each pass (a sweep cut short starts
        // over): the mean of the two.
        const epoch_figures& up = _pass[0][i];
        const epoch_figures& down = _pass[1][i];
        _rates[i] = (up.rate + down.rate) / 2;
        _spent_per_event[i] = (up.spent_per_event + down.spent_per_event) / 2;
        _cpu_per_event[i] = (up.cpu_per_event + down.cpu_per_event) / 2;
        _scores[i] = score(static_cast<unsigned>(i));
    }
    _swept_pass[0] = _pass[0];
    _swept_pass[1] = _pass[1];
    // The cheapest level within `margin` of the best score, by the mean
    // of both passes and by each pass alone; the cheapest of the three
    // choices is kept (a costlier level must win every time).
    const double top = *std::max_element(_scores.begin(), _scores.end());
    const unsigned by_mean = cheapest_near_best(_scores);
    unsigned best = by_mean;
    for (const auto& pass : _pass) {
        std::vector<double> scores(n);
        for (unsigned i = 0; i < n; ++i) {
            scores[i] = score_of(pass[i]);
        }
        const unsigned chosen = cheapest_near_best(scores);
        best = _cfg.cost == cheaper::lower ? std::min(best, chosen) : std::max(best, chosen);
    }
    // Hysteresis: the level in use stays while it is still within the
    // margin of the best (noise moves the best among near-equal levels,
    // and each change would cut the next exploitation short).
    bool kept = false;
    if (_sweeps > 0 && best != _best &&
        (_cfg.cost == cheaper::lower ? _scores[_best] * (1 + _cfg.margin) >= top
                                     : _scores[_best] >= top * (1 - _cfg.margin))) {
        best = _best;
        kept = true;
    }
    // The first epochs of the winner are checked against the sweep's rate,
    // unless this sweep came from that check: one sweep more per change of
    // load at most, whatever a level's rate in a sweep and after it.
    _verify = !std::exchange(_swept_again, false);
    // Passes that disagreed (a pass kept a cheaper level than the mean
    // chose) met different loads: with recheck_epochs set, measure again
    // soon. After such a short spell, a sweep that agrees starts the usual
    // one.
    const bool recheck = _cfg.recheck_epochs > 0 && !kept && best != by_mean;
    if (recheck) {
        _exploit_len = std::min(_cfg.recheck_epochs, _cfg.exploit_epochs);
    } else if (_sweeps > 0 && best == _best) {
        _exploit_len =
            std::min(std::max(_exploit_len * 2, _cfg.exploit_epochs), _cfg.exploit_max_epochs);
    } else {
        _exploit_len = _cfg.exploit_epochs;
    }
    _best = best;
    ++_sweeps;
    _phase = phase::exploit;
    _exploit_left = _exploit_len;
    _exploit_seen = 0;
    _baseline_rate = 0;
    _epoch_mean = 0;
    _epoch_m2 = 0;
    use(best);
    // Why, with the best score measured and the runner-up (or the best,
    // where the kept level is a cheaper one).
    const auto top_index =
        static_cast<unsigned>(std::max_element(_scores.begin(), _scores.end()) - _scores.begin());
    unsigned other = best == 0 ? 1 : 0;
    for (unsigned i = 0; i < n; ++i) {
        if (i != best && _scores[i] > _scores[other]) {
            other = i;
        }
    }
    const bool per_cpu = _cfg.goal == objective::rate_per_cpu;
    const auto at = [this, per_cpu](unsigned i) {
        if (per_cpu) {
            return fmt::format("{} at {:.1f} us CPU each at {} {}", rate_text(_rates[i]),
                               _cpu_per_event[i] / 1'000, _cfg.levels[i], _cfg.unit);
        }
        return fmt::format("{} at {} {}", rate_text(_rates[i]), _cfg.levels[i], _cfg.unit);
    };
    const char* most = per_cpu ? "the most requests per CPU time" : "the most requests";
    if (best == top_index) {
        _why = fmt::format("{} {}: {}, {} against {}", _cfg.levels[best], _cfg.unit, most, at(best),
                           at(other));
    } else if (!kept && best != by_mean) {
        _why = fmt::format("{} {}: {}; {} measured {} on average ({}) but not in both passes{}",
                           _cfg.levels[best], _cfg.unit, at(best), _cfg.levels[by_mean],
                           per_cpu ? "more requests per CPU time" : "more requests", at(by_mean),
                           recheck ? fmt::format(" (measuring again after {} epochs)", _exploit_len)
                                   : std::string());
    } else {
        // A level kept because it is in use may cost more than the best.
        _why = fmt::format("{} {}: {}, within {:.0f}% of {} ({}) {}", _cfg.levels[best], _cfg.unit,
                           at(best), _cfg.margin * 100, most, at(top_index),
                           kept ? "and in use" : "at less cost");
    }
}

void level_chooser::use(unsigned index)
{
    _current = index;
}

nlohmann::json level_chooser::describe() const
{
    nlohmann::json out{{"mode", fixed() ? "given" : "auto"},
                       {"level", level()},
                       {"unit", _cfg.unit},
                       {"why", _why}};
    if (fixed()) {
        return out;
    }
    if (_cfg.goal == objective::rate_per_cpu) {
        out["objective"] = "rate_per_cpu";
    }
    out["phase"] = _phase == phase::sweep ? "sweep" : _phase == phase::idle ? "idle" : "exploit";
    out["sweeps"] = _sweeps;
    if (_sweeps > 0) {
        nlohmann::json rates = nlohmann::json::object();
        nlohmann::json spent = nlohmann::json::object();
        for (size_t i = 0; i < _cfg.levels.size(); ++i) {
            const std::string key = std::to_string(_cfg.levels[i]);
            rates[key] = std::lround(_rates[i]);
            spent[key] = std::lround(_spent_per_event[i]);
        }
        out["rates_per_s"] = std::move(rates);
        out["spent_per_event_ns"] = std::move(spent);
        // Each pass's own rates: a costlier level must win both, so a
        // choice that looks short of the best mean shows why here.
        nlohmann::json by_pass = nlohmann::json::array();
        for (const auto& pass : _swept_pass) {
            nlohmann::json rates_of_pass = nlohmann::json::object();
            for (size_t i = 0; i < _cfg.levels.size(); ++i) {
                rates_of_pass[std::to_string(_cfg.levels[i])] = std::lround(pass[i].rate);
            }
            by_pass.push_back(std::move(rates_of_pass));
        }
        out["rates_per_s_by_pass"] = std::move(by_pass);
        if (_cfg.goal == objective::rate_per_cpu) {
            nlohmann::json cpu = nlohmann::json::object();
            for (size_t i = 0; i < _cfg.levels.size(); ++i) {
                cpu[std::to_string(_cfg.levels[i])] = std::lround(_cpu_per_event[i]);
            }
            out["cpu_per_event_ns"] = std::move(cpu);
        }
    }
    return out;
}

shared_level_chooser::shared_level_chooser(level_chooser::config c)
    : _chooser(std::move(c)), _level(_chooser.level()), _fixed(_chooser.fixed())
{
}

void shared_level_chooser::served(uint64_t now, uint64_t events, uint64_t spent)
{
    if (_fixed) {
        return;
    }
    if (events != 0) {
        _events.fetch_add(events, std::memory_order_relaxed);
    }
    if (spent != 0) {
        _spent.fetch_add(spent, std::memory_order_relaxed);
    }
    if (now < _due.load(std::memory_order_relaxed) ||
        _busy.test_and_set(std::memory_order_acquire)) {
        return;
    }
    _chooser.served(now, _events.exchange(0, std::memory_order_relaxed),
                    _spent.exchange(0, std::memory_order_relaxed));
    _level.store(_chooser.level(), std::memory_order_relaxed);
    // Nothing can end before a whole epoch has passed; after that, every
    // call looks (an epoch needs its events too).
    _due.store(now + std::min(_chooser.settings().epoch_ns, _chooser.settings().idle_ns) / 8,
               std::memory_order_relaxed);
    _busy.clear(std::memory_order_release);
}

nlohmann::json shared_level_chooser::describe() const
{
    while (_busy.test_and_set(std::memory_order_acquire)) {
        cpu_relax();
    }
    nlohmann::json out = _chooser.describe();
    _busy.clear(std::memory_order_release);
    return out;
}

result<void> check_poll_window(std::string_view text)
{
    if (text == "auto") {
        return {};
    }
    auto us = parse_kernel_unsigned(text, UINT64_MAX);
    if (!us || *us > k_max_poll_us) {
        return make_error(us ? ERANGE : EINVAL,
                          fmt::format("auto, or a window of 0 to {} us", k_max_poll_us));
    }
    return {};
}

level_chooser::config poll_window_config(std::string_view text)
{
    level_chooser::config c;
    c.unit = "us";
    if (text == "auto" || text.empty()) {
        c.levels = {0, 16, 32, 64, 128, 256, 512};
    } else {
        c.levels = {parse_kernel_unsigned(text, UINT64_MAX).value_or(0)};
    }
    return c;
}

}  // namespace softblk
