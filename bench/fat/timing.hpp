// Clocks for softblk-bench-fat: wall time since a point, and a thread's CPU
// time and run-queue wait from its schedstat.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <sys/types.h>

#include <fmt/format.h>

namespace softblk::fat::bench {

using clock_type = std::chrono::steady_clock;

// A thread's CPU time and run-queue wait so far (ns), from schedstat.
struct sched_times {
    uint64_t cpu_ns = 0;
    uint64_t wait_ns = 0;
};

inline std::optional<sched_times> thread_sched_times(pid_t tid)
{
    FILE* f = std::fopen(fmt::format("/proc/self/task/{}/schedstat", tid).c_str(), "r");
    if (f == nullptr) {
        return std::nullopt;
    }
    sched_times t;
    unsigned long long cpu = 0;
    unsigned long long wait = 0;
    bool ok = std::fscanf(f, "%llu %llu", &cpu, &wait) == 2;
    std::fclose(f);
    if (!ok) {
        return std::nullopt;
    }
    t.cpu_ns = cpu;
    t.wait_ns = wait;
    return t;
}

inline double seconds_since(clock_type::time_point t)
{
    return std::chrono::duration<double>(clock_type::now() - t).count();
}

}  // namespace softblk::fat::bench
