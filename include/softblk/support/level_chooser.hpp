// A setting decided at run time from what it was measured to give: one of
// a few ordered levels (a busy-poll window of 0, 16, 32 ... µs; receive
// coalescing off or on), chosen by the rate of work the owner got done
// (requests served per second) over short epochs at each level. The front
// ends' polling and coalescing defaults use it, so that what won on the
// machine the code was written on is not assumed to win on this one:
// where waking a vCPU is expensive, spinning for the next request pays
// (a FUSE export went from 14k to 41k requests/s at one job); where it is
// cheap, spinning only burns a CPU that the client could have used.
//
// How it chooses:
// - a sweep measures every level, each for two epochs (ascending, then
//   descending, so that a load that drifts during the sweep is seen by
//   every level alike); a level's rate is the mean of its two epochs;
// - the level kept is the cheapest whose rate is within `margin` of the
//   best rate measured: the lowest one where higher levels cost more (a
//   longer busy-poll spends more CPU: it must earn that), the highest one
//   where they cost less (a longer receive hold saves system calls and
//   wake-ups, as long as the client does not wait for it); a later sweep
//   keeps the level in use while it is still within the margin;
// - a costlier level must also win each pass on its own: each pass
//   chooses by the same rule from its own epochs, and where a pass (or
//   the mean) chooses a cheaper level, that one is kept. A load that
//   changes once during the sweep (a program going from one phase of its
//   work to the next, a device's first writes meeting fresh memory) moves
//   one pass and the mean, not both passes alike;
// - the winner is used for `exploit_epochs`, doubled after each sweep that
//   chose the same level (up to `exploit_max_epochs`), reset when the
//   choice changed; after a sweep whose passes disagreed, for
//   `recheck_epochs` where that is set: the levels did not meet one load
//   (a benchmark going from one phase to the next in mid-sweep), so the
//   cheaper level kept is measured again soon instead of held for the
//   whole spell; a sweep comes early when the winner's rate moved by
//   more than `drift` from what its first epochs after the sweep measured
//   (the load changed; not from the sweep's figure, which the choice of
//   the best of several noisy figures biases upwards), and by more than
//   the epochs' own spread lets chance move it (3 standard deviations:
//   noisy epochs alone do not bring sweeps);
// - after an idle spell of a second or more (from the last event) the
//   levels are swept afresh: the load is likely another one;
// - the winner's first epochs after a sweep, and after a shorter idle
//   spell, are also compared with the rate it was swept at, by the same
//   rule: a load that changed right after the sweep or while idle (a
//   fill's 1 MiB writes, then 4 KiB ones at queue depth 1) sets the
//   baseline the drift check compares with, so only this comparison sees
//   it. A sweep it brings is not checked so again (one more sweep per
//   change at most);
// - an epoch ends after `epoch_ns` and `epoch_events` events; one that
//   took `idle_ns` without reaching `epoch_events` says the load sets the
//   rate (an idle device, a client that paces itself): it is not measured,
//   the lowest level is used until a busy epoch comes, and a sweep cut
//   short by it starts again then.
// A single level (a value the user gave) is never swept.
//
// What "best" means is the config's `objective`:
// - objective::rate (the default): the most events per second, as above;
// - objective::rate_per_cpu: events per second divided by the owner's CPU
//   time per event (config::cpu_clock, read at each epoch's ends; the
//   calling thread's by default): a level may cost x times the CPU per
//   request only where it serves x times the requests per second. A busy
//   poll that catches the next request where a wake-up costs more than the
//   spin still wins; one that only buys rate with CPU (a loaded machine,
//   where spinning takes the CPU the client needed) does not. The margin
//   and the "cheapest within it" rule then apply to that score.
//
// level_chooser is one thread's; shared_level_chooser lets several
// threads count into one and read its level. `describe()` says what was
// chosen and why, for `softblk list --json`.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <softblk/types.hpp>

namespace softblk {

class level_chooser {
public:
    // Which way levels cost: lower (a busy-poll window) or higher.
    enum class cheaper : uint8_t { lower, higher };
    // What a sweep maximises (see the top of this file).
    enum class objective : uint8_t { rate, rate_per_cpu };
    // CPU time in ns on a clock that only moves while the owner runs.
    using cpu_clock_fn = uint64_t (*)();

    struct config {
        std::vector<uint64_t> levels{0};  // ascending; the unit is the owner's
        std::string unit = "us";          // for describe()
        cheaper cost = cheaper::lower;
        uint64_t epoch_ns = 10'000'000;
        uint64_t epoch_events = 32;
        uint64_t idle_ns = 100'000'000;
        double margin = 0.05;
        unsigned exploit_epochs = 100;
        unsigned exploit_max_epochs = 1'000;
        // After a sweep whose passes disagreed (the mean chose a costlier
        // level than a pass did, and the cheaper one is kept): the epochs
        // before the next sweep, fewer than exploit_epochs to measure again
        // soon; 0: exploit_epochs as after any sweep (see the top of this
        // file).
        unsigned recheck_epochs = 0;
        double drift = 0.25;
        objective goal = objective::rate;
        // objective::rate_per_cpu only: read at every epoch's start and
        // end, never per event. nullptr: the calling thread's CPU time
        // (CLOCK_THREAD_CPUTIME_ID), right where one thread feeds the
        // chooser.
        cpu_clock_fn cpu_clock = nullptr;
    };

    level_chooser() : level_chooser(config{}) {}
    explicit level_chooser(config c);

    // The level to use now.
    uint64_t level() const { return _cfg.levels[_current]; }
    // `events` events (requests served) at time `now` (ns, monotonic),
    // and `spent` ns the owner spent on the level's cost since the last
    // call (time spinning; 0 where there is none to count). Ends the
    // epoch when due. True when the level changed.
    bool served(uint64_t now, uint64_t events = 1, uint64_t spent = 0);
    // No event, but time passed (before a long sleep, or now and then):
    // ends an idle epoch when due. True when the level changed.
    bool tick(uint64_t now) { return served(now, 0, 0); }
    // Starts measuring at `now` (the first served() does it otherwise).
    void start(uint64_t now);

    bool fixed() const { return _cfg.levels.size() == 1; }
    // The last epoch was idle: the lowest level is used, nothing measured.
    bool idle() const { return _phase == phase::idle; }
    unsigned sweeps() const { return _sweeps; }
    const config& settings() const { return _cfg; }
    // {"mode": "auto"|"given", "level": L, "why": "...", "sweeps": N,
    //  "rates_per_s": {"L": per second ...}, "rates_per_s_by_pass":
    //  [{ascending pass}, {descending pass}], "spent_per_event_ns": {...}}, and
    // with objective::rate_per_cpu "objective": "rate_per_cpu",
    // "cpu_per_event_ns": {"L": ns ...}
    nlohmann::json describe() const;

private:
    // What one epoch of a sweep measured.
    struct epoch_figures {
        double rate = 0;             // events per second
        double spent_per_event = 0;  // ns
        double cpu_per_event = 0;    // ns (rate_per_cpu)
    };
    enum class phase : uint8_t { sweep, exploit, idle };

    void end_epoch(uint64_t now, bool idle);
    void start_sweep();
    void finish_sweep();
    void use(unsigned index);
    unsigned sweep_level(unsigned step) const;
    // The winner's first epochs after a sweep or an idle spell ran far
    // from the rate it was swept at: the load changed, measure again.
    bool load_differs_from_sweep();
    uint64_t read_cpu() const;
    // What the sweep maximises for level i (rate, or rate per CPU).
    double score(unsigned i) const;
    double score_of(const epoch_figures& f) const;
    // The cheapest level whose score is within the margin of the best.
    unsigned cheapest_near_best(const std::vector<double>& scores) const;

    config _cfg;
    phase _phase = phase::sweep;
    phase _before_idle = phase::sweep;
    unsigned _current = 0;
    bool _started = false;
    uint64_t _epoch_start = 0;
    uint64_t _last_event = 0;  // when served() last counted events
    uint64_t _idle_from = 0;   // the last event before the idle spell
    // An idle spell this long (from the last event) brings a new sweep.
    static constexpr uint64_t k_new_load_after_ns = 1'000'000'000;
    uint64_t _events = 0;
    uint64_t _spent = 0;
    uint64_t _epoch_cpu = 0;  // cpu_clock at the epoch's start (rate_per_cpu)
    // Sweep: the step (0 .. 2 * levels - 1), and what each level's epoch
    // measured in the ascending pass (0) and the descending one (1).
    unsigned _step = 0;
    std::vector<epoch_figures> _pass[2];
    // Last finished sweep: its passes' epochs, and their means.
    std::vector<epoch_figures> _swept_pass[2];
    std::vector<double> _rates;
    std::vector<double> _spent_per_event;
    std::vector<double> _cpu_per_event;
    std::vector<double> _scores;  // score() of each level, at the last sweep
    unsigned _best = 0;
    unsigned _sweeps = 0;
    // Exploit: epochs left, the current length, the winner's recent rate.
    unsigned _exploit_left = 0;
    unsigned _exploit_len = 0;
    unsigned _exploit_seen = 0;
    double _baseline_rate = 0;  // the winner's mean over its first exploit epochs
    double _epoch_mean = 0;     // the mean and squared deviations (Welford) of
    double _epoch_m2 = 0;       // ... every epoch since the sweep
    double _recent_rate = 0;
    // Compare the winner's first k_verify_epochs with its sweep's rate
    // (after a sweep or an idle spell); _swept_again: this sweep came from
    // that comparison.
    static constexpr unsigned k_verify_epochs = 4;
    bool _verify = false;
    bool _swept_again = false;
    std::string _why;
};

// One chooser fed by several threads: each counts what it served with a
// relaxed atomic add and reads the level with a relaxed load; whichever
// thread finds an epoch due runs the chooser, the others go on (a
// try-lock, never a wait).
class shared_level_chooser {
public:
    shared_level_chooser() = default;
    explicit shared_level_chooser(level_chooser::config c);

    uint64_t level() const { return _level.load(std::memory_order_relaxed); }
    // Any thread: `events` served at `now`, `spent` ns of cost.
    void served(uint64_t now, uint64_t events = 1, uint64_t spent = 0);
    void tick(uint64_t now) { served(now, 0, 0); }
    bool fixed() const { return _fixed; }
    nlohmann::json describe() const;

private:
    level_chooser _chooser;
    std::atomic<uint64_t> _events{0};
    std::atomic<uint64_t> _spent{0};
    std::atomic<uint64_t> _level{0};
    std::atomic<uint64_t> _due{0};  // when the next epoch may end (ns)
    mutable std::atomic_flag _busy = ATOMIC_FLAG_INIT;
    bool _fixed = true;
};

// Busy-poll windows, the option front ends call poll_us (vhost-user-blk:
// poll-us): "auto" (their default) or a window in µs, 0 (never poll) to
// k_max_poll_us. check_poll_window is its option_def::check;
// poll_window_config the chooser's config for a value: auto sweeps 0, 16,
// 32 ... 512 µs, a number is that window, fixed.
inline constexpr uint64_t k_max_poll_us = 1'000;
result<void> check_poll_window(std::string_view text);
level_chooser::config poll_window_config(std::string_view text);

}  // namespace softblk
