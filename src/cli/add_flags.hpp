// The friendly flags of `softblk add` (--size 4G, --bs 4096,
// --memory-backed, --queues N, --depth N), turned into the target's own
// key=value options with the same meaning (--size 4G is size=4096 for the
// null target, whose size is in MiB). A flag that contradicts a key=value
// option given too is an error, never a silent choice.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <softblk/types.hpp>

namespace softblk::cli {

struct add_flags {
    std::optional<std::string> size;  // with a K/M/G/T suffix or in bytes
    std::optional<std::string> block_size;
    bool memory_backed = false;
    std::optional<std::string> queues;
    std::optional<std::string> depth;
};

// Appends the options the flags stand for to `options` (the key=value
// arguments given), using the option table of target type `type`. Returns
// an error naming the flag when the type has no such option, the value
// does not convert exactly into the option's unit, or the same option was
// given as key=value too.
result<std::vector<std::string>> apply_add_flags(std::string_view type,
                                                 std::vector<std::string> options,
                                                 const add_flags& flags);

}  // namespace softblk::cli
