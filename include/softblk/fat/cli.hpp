// `softblk fat ...`: mkfs, ls, cat, cp, mkdir, rm, mv, stat, df, mount.
//
// The tools run in any program: `softblk` (src/cli) calls cli_main for its
// `fat` sub-command, and `softblk-fat` is the same tools as a program of
// their own. To reach a device hosted by the softblk daemon
// (`softblk:NAME`) they need to ask the daemon where NAME is exported; the
// host program supplies that through daemon_directory, so the FAT library
// never depends on the daemon's client or protocol.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <softblk/types.hpp>

namespace softblk::fat {

// One device of the softblk daemon, as the daemon describes it: what the
// tools need to open its export from their own process.
struct daemon_device {
    std::string name;
    std::string type;                  // target type ("null")
    std::vector<std::string> options;  // the options it was created with
    std::string state;                 // "running" when usable
    std::string error;                 // why not, when not running
    uint32_t logical_block_size = 512;
    std::string export_type;  // "ublk", "fuse", "nbd", "none", ...
    // What the export says where it is: "block" (ublk node), "file" and
    // "loop" (FUSE), "uri" (NBD), "socket" (vhost-user-blk).
    std::map<std::string, std::string> export_location;
};

// How the tools ask the softblk daemon about its devices. Implemented by
// the host program (`softblk` with its control client). Main thread.
class daemon_directory {
public:
    virtual ~daemon_directory() = default;

    // Where the daemon is (its run directory), for messages.
    virtual std::string location() const = 0;
    // Every device of the daemon. Does not start a daemon. Errors say why
    // the daemon could not be asked and how to start one.
    virtual result<std::vector<daemon_device>> devices() = 0;
};

// argv[0] is "fat"; argv[1] the subcommand. `daemon` reaches the daemon's
// devices (`softblk:NAME`); without one such targets are refused with a
// message naming `softblk fat`. Returns the process exit code (0 success,
// 1 failure, 2 usage). Prints errors to stderr. Main thread; borrows
// `daemon` for the call.
int cli_main(int argc, char** argv, daemon_directory* daemon = nullptr);

}  // namespace softblk::fat
