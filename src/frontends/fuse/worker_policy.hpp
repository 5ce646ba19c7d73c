// How many /dev/fuse workers serve a FUSE export (option `threads`), and
// how that number is decided: `auto` (the default) measures it with the
// level_chooser that also picks the poll window (the number of active
// workers is its level: 1 .. the most that can help here, each tried for
// two epochs, the lowest within 5% of the best rate kept, measured again
// now and then); a number given is kept and never measured. Private to
// this folder; the unit test (tests/frontends/fuse/fuse_worker_policy_test.cpp)
// drives the decision with a fake clock.
#pragma once

#include <softblk/support/level_chooser.hpp>
#include <softblk/types.hpp>

#include <string>
#include <string_view>

namespace softblk::fuse {

// The most workers `threads` may ask for.
inline constexpr unsigned k_max_threads = 64;
// The most workers threads=auto tries: beyond this many CPUs, a loop
// device (one kernel worker per request in flight) does not keep more
// busy.
inline constexpr unsigned k_max_auto_workers = 8;

struct worker_plan {
    // Workers (or ring threads) to create; with `auto` the most that may
    // be active, the others parked.
    unsigned threads = 1;
    // The active workers: levels 1 .. threads (auto), or {threads}.
    level_chooser::config choice;
    // Why the number is what it is, where it is not measured (shown in
    // place of the chooser's "given").
    std::string why;
};

// The option's check: "auto", or 0 .. k_max_threads.
result<void> check_threads(std::string_view text);

// The plan for option text `text` on a device with `submit_queues`
// submit queues on a machine with `cpus` online CPUs; `ring`: FUSE over
// io_uring serves the export (ring threads are not measured: each keeps
// many requests in flight on a queue of its own).
worker_plan plan_workers(std::string_view text, unsigned submit_queues, unsigned cpus, bool ring);

}  // namespace softblk::fuse
