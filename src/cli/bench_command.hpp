// `softblk bench PLAN ...`: runs the benchmark driver (bench/plans/,
// docs/bench-command.md) with the arguments.
#pragma once

#include <filesystem>
#include <vector>

namespace softblk::cli {

// Where the driver is looked for, in this order: $SOFTBLK_BENCH_DRIVER;
// an install's LIBEXECDIR/softblk/ beside the bin/ of `self`; the source
// tree this program was configured from.
std::vector<std::filesystem::path> bench_driver_candidates(const std::filesystem::path& self);

// argv[0] is "bench"; execs the driver (returns only on failure: the exit
// status to give).
int run_bench(int argc, char** argv);

}  // namespace softblk::cli
