// The FUSE export's worker count (worker_policy.hpp).
#include "worker_policy.hpp"

#include <softblk/options.hpp>

#include <algorithm>

#include <fmt/format.h>

namespace softblk::fuse {

result<void> check_threads(std::string_view text)
{
    if (text == "auto") {
        return {};
    }
    auto n = parse_kernel_unsigned(text, UINT64_MAX);
    if (!n || *n > k_max_threads) {
        return make_error(n ? ERANGE : EINVAL,
                          fmt::format("auto, or a number of workers from 0 (one per submit "
                                      "queue) to {}",
                                      k_max_threads));
    }
    return {};
}

worker_plan plan_workers(std::string_view text, unsigned submit_queues, unsigned cpus, bool ring)
{
    worker_plan plan;
    plan.choice.unit = "workers";
    plan.choice.cost = level_chooser::cheaper::lower;
    // The two choosers run at once: an epoch longer than a whole sweep of
    // the poll window (7 windows, two 10 ms epochs each) sees the same
    // mix of windows at every worker count, where a short one would
    // charge one count with the poll sweep's worst windows.
    plan.choice.epoch_ns = 200'000'000;
    // Idle: an epoch that took this long without its 32 requests.
    plan.choice.idle_ns = 400'000'000;
    const unsigned per_queue = std::max(1u, submit_queues);
    if (text == "auto" && !ring) {
        // More workers than CPUs only take turns; at least one per submit
        // queue, as threads=0 gives, so that each can own one.
        plan.threads = std::clamp(std::max(cpus, per_queue), 1u, k_max_auto_workers);
        plan.choice.levels.clear();
        for (unsigned n = 1; n <= plan.threads; ++n) {
            plan.choice.levels.push_back(n);
        }
        if (plan.threads == 1) {
            plan.why = "one CPU: one worker";
        }
        return plan;
    }
    if (text == "auto") {
        plan.threads = per_queue;
        plan.why = fmt::format(
            "ring: one ring thread per submit queue ({}), each keeping many "
            "requests in flight",
            per_queue);
    } else {
        const auto given = parse_kernel_unsigned(text, k_max_threads).value_or(0);
        plan.threads = given == 0 ? per_queue : static_cast<unsigned>(given);
        plan.why =
            given == 0 ? fmt::format("threads=0: one per submit queue ({})", per_queue) : "given";
    }
    plan.choice.levels = {plan.threads};
    return plan;
}

}  // namespace softblk::fuse
