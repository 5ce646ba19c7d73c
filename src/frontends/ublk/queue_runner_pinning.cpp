// A ublk queue thread's CPU pinning (queue_affinity=): which CPUs it runs
// on, its io-wq workers' CPUs, and following the device's measured choice
// (queue_affinity=auto, device_pinning.hpp). The thread itself is
// queue_runner.cpp.
#include "queue_runner.hpp"

#include <softblk/support/clock.hpp>

#include <algorithm>
#include <sched.h>
#include <utility>

namespace softblk::ublk {

namespace {

cpu_set_t cpu_set_of(std::span<const unsigned> cpus)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    for (const unsigned cpu : cpus) {
        CPU_SET(cpu, &set);
    }
    return set;
}

}  // namespace

std::vector<unsigned> cpus_to_pin(std::span<const unsigned> queue_cpus, const cpu_set_t& allowed,
                                  bool one_cpu)
{
    std::vector<unsigned> chosen;
    for (const unsigned cpu : queue_cpus) {
        if (cpu < CPU_SETSIZE && CPU_ISSET(cpu, &allowed)) {
            chosen.push_back(cpu);
        }
    }
    if (one_cpu) {
        chosen.resize(std::min<size_t>(chosen.size(), 1));
    } else if (static_cast<int>(chosen.size()) == CPU_COUNT(&allowed)) {
        chosen.clear();
    }
    return chosen;
}

std::vector<unsigned> cpus_to_measure(const cpu_set_t& allowed)
{
    if (CPU_COUNT(&allowed) < 2) {
        return {};
    }
    for (unsigned cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
        if (CPU_ISSET(cpu, &allowed)) {
            return {cpu};
        }
    }
    return {};
}

std::vector<unsigned> queue_runner::pinned_cpus() const
{
    if (_measuring_pin && !_pinned_now.load(std::memory_order_relaxed)) {
        return {};
    }
    return _pinned_cpus;
}

// With queue_affinity=1 a queue's thread runs on the CPUs whose requests the
// kernel sends to that queue, as ublk servers commonly do: each request
// reaches the thread as task work queued from the submitting CPU, and its
// data is warm in that CPU's cache. (Off by default: under emulation it
// measured mixed, docs/ublk.md.) Where the queue serves every CPU the daemon may use there is nothing to
// choose; where it serves none of them (a narrower cpuset) the thread stays
// unpinned. queue_affinity=one keeps the thread on the first of those CPUs
// alone, as the kernel's kublk does: a thread that never moves is not
// where the submitting program wakes, so the two do not take turns on one
// CPU (under emulation each turn empties the software TLB).
// queue_affinity=auto: the device measures both, every queue's thread free
// and all of them on the first CPU the daemon may use (device_pinning),
// and starts free.
void queue_runner::pin_thread()
{
    cpu_set_t allowed;
    if (::sched_getaffinity(0, sizeof(allowed), &allowed) != 0) {
        return;
    }
    if (_cfg.pinning) {
        if (auto one = cpus_to_measure(allowed); !one.empty()) {
            _pinned_cpus = std::move(one);
            _free_cpus = allowed;
            _measuring_pin = true;
        }
        return;
    }
    std::vector<unsigned> chosen = cpus_to_pin(_cfg.cpus, allowed, _cfg.one_cpu);
    if (chosen.empty()) {
        return;
    }
    const cpu_set_t want = cpu_set_of(chosen);
    if (::sched_setaffinity(0, sizeof(want), &want) == 0) {
        _pinned_cpus = std::move(chosen);
    }
}

// The io-wq workers this thread's blocking file I/O goes to (an append to
// a zone file on ext4, for one) belong to the thread, whichever ring the
// I/O came through, and keep to the same CPUs. Their set can only be given
// once the thread has an io_uring context, i.e. after setup(); kernels
// before 5.14 lack the call and leave the workers where io-wq puts them.
void queue_runner::pin_io_workers()
{
    if (_pinned_cpus.empty() || _measuring_pin) {
        return;
    }
    const cpu_set_t set = cpu_set_of(_pinned_cpus);
    (void)io_uring_register_iowq_aff(&_ring, sizeof(set), &set);
}

void queue_runner::follow_device_pinning()
{
    device_pinning& device = *_cfg.pinning;
    if (device.due()) {
        device.update(monotonic_ns());
    }
    const bool pin = device.pinned();
    if (pin == _pinned_now.load(std::memory_order_relaxed)) {
        return;
    }
    const cpu_set_t set = pin ? cpu_set_of(_pinned_cpus) : _free_cpus;
    if (::sched_setaffinity(0, sizeof(set), &set) != 0) {
        // A cpuset changed under the daemon: leave the thread where it is.
        _pin_stuck = true;
        return;
    }
    if (pin) {
        (void)io_uring_register_iowq_aff(&_ring, sizeof(set), &set);
    } else {
        (void)io_uring_unregister_iowq_aff(&_ring);
    }
    _pinned_now.store(pin, std::memory_order_relaxed);
    _pin_switches.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace softblk::ublk
