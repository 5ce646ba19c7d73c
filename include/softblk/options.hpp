// key=value options, in the manner of null_blk's configfs attributes.
//
// A target (and the core, for queue settings) declares its options in a
// table of option_def; option_set parses "key=value" strings against it,
// validates each value against the declared range and keeps the typed
// result. Unknown keys, malformed numbers and out-of-range values are errors
// that name the attribute and the valid range. Nothing is silently ignored.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <softblk/types.hpp>

namespace softblk {

enum class option_kind : uint8_t {
    integer,         // unsigned 64-bit, decimal or 0x-hex; range [min, max]
    signed_integer,  // signed 64-bit (home_node=-1); range [smin, smax]
    boolean,         // 0/1 (also accepts y/n, true/false, on/off)
    text,            // free text, validated by the owner (badblocks, fault specs)
};

// What happens to a value outside [min, max].
enum class option_range : uint8_t {
    reject,  // error naming the attribute and its range
    clamp,   // clamped silently, only where null_blk clamps (documented)
};

struct option_def {
    std::string_view name;
    option_kind kind = option_kind::integer;
    std::string_view default_value = {};
    std::string_view unit = {};  // "MiB", "ns", "bytes", "" ...
    std::string_view help = {};  // one line: meaning, and what softblk does with it
    uint64_t min = 0;
    uint64_t max = UINT64_MAX;
    int64_t smin = INT64_MIN;
    int64_t smax = INT64_MAX;
    option_range range = option_range::reject;
    std::string_view alias = {};  // e.g. "bs" for "blocksize"
    // Text options may be given more than once (badblocks=+0-7 badblocks=-3-3);
    // every occurrence is kept in order.
    bool repeatable = false;
};

// Parsed and validated options. Construct with option_set::parse.
class option_set {
public:
    // Parses `args` ("key=value" each) against `defs`. Later occurrences of
    // a non-repeatable key replace earlier ones. Returns an error for an
    // unknown key, a missing '=', a malformed or out-of-range value.
    // Runs on any thread; copies what it needs.
    static result<option_set> parse(std::span<const option_def> defs,
                                    std::span<const std::string> args);

    // Typed access. The name must be declared in the table (assertion).
    uint64_t u64(std::string_view name) const;
    int64_t i64(std::string_view name) const;
    bool flag(std::string_view name) const;
    const std::string& text(std::string_view name) const;
    // All values of a repeatable text option, in order given.
    const std::vector<std::string>& texts(std::string_view name) const;
    // True if the user gave the option (as opposed to the default).
    bool given(std::string_view name) const;

    // Every option as key=value with its effective value, in table order;
    // this is what the daemon persists so that a device can be re-created.
    std::vector<std::string> to_args() const;

    std::span<const option_def> defs() const { return _defs; }

private:
    struct value {
        uint64_t u = 0;
        int64_t s = 0;
        std::string text;
        std::vector<std::string> texts;
        bool given = false;
    };
    const value& find(std::string_view name) const;

    std::vector<option_def> _defs;
    std::map<std::string, value, std::less<>> _values;
};

// Parses a size with an optional binary suffix (K, M, G, T, with or
// without "iB"/"B"), e.g. "4G" -> 4294967296. Used by friendly CLI flags.
result<uint64_t> parse_size(std::string_view text);

}  // namespace softblk
