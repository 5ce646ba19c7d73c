// `softblk fat ...`: mkfs, ls, cat, cp, mkdir, rm, mv, stat, df, mount.
#pragma once

namespace softblk::fat {

// argv[0] is "fat"; argv[1] the subcommand. Returns the process exit code
// (0 success, 1 failure, 2 usage). Prints errors to stderr. Main thread.
int cli_main(int argc, char** argv);

}  // namespace softblk::fat
