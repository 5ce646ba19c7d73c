// The daemon's budget of data memory (docs/reliability.md, "Memory
// budget"): by default half of the memory the daemon may use, which is the
// smaller of the machine's MemTotal and the memory limit of the daemon's
// cgroup (cgroup v2 memory.max, v1 memory.limit_in_bytes, along the path up
// to the hierarchy's root); `softblk daemon --memory-limit` sets it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <softblk/memory_store.hpp>
#include <softblk/types.hpp>

namespace softblk::host {

// The default share of the machine's memory, as tmpfs' default size.
constexpr unsigned k_default_memory_percent = 50;

struct machine_memory {
    uint64_t bytes = 0;  // what the daemon may use
    std::string source;  // "MemTotal" or "memory.max of cgroup /a/b"
};

struct memory_limit_choice {
    uint64_t bytes = 0;  // 0: no limit
    std::string source;  // for `status` and the log, e.g. "50% of MemTotal (23.5 GiB)"
};

// MemTotal of /proc/meminfo's text, in bytes; nullopt if absent.
std::optional<uint64_t> parse_meminfo_total(std::string_view meminfo);

// A cgroup memory limit file's value ("max" or bytes); nullopt for "max" or
// text that is not a number.
std::optional<uint64_t> parse_cgroup_limit(std::string_view text);

// The memory limit files that apply to this process, from the texts of
// /proc/self/cgroup and /proc/self/mountinfo: for the cgroup v2 hierarchy
// and the v1 memory controller, the process's cgroup directory and each
// parent up to the mount's root, with memory.max (v2) or
// memory.limit_in_bytes (v1). Pure function.
std::vector<std::string> cgroup_limit_files(std::string_view self_cgroup,
                                            std::string_view mountinfo);

// The memory the daemon may use on this machine (reads /proc and the
// cgroup files). Error when /proc/meminfo has no MemTotal.
result<machine_memory> read_machine_memory();

// The budget for a --memory-limit value: "" the default
// (k_default_memory_percent of `machine`), "none" no limit, "N%" (1..100)
// of `machine`, or a size with a K/M/G/T suffix (at least 1 MiB). Errors
// name the flag and the accepted forms; "0" is one (it says to use none).
result<memory_limit_choice> choose_memory_limit(std::string_view flag,
                                                const machine_memory& machine);

// "1.5 GiB" and the like, for messages and tables (the core's).
using softblk::human_bytes;

}  // namespace softblk::host
