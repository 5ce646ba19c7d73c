// key=value options, in the manner of null_blk's configfs attributes.
//
// A target (and the core, for queue settings) declares its options in a
// table of option_def; option_set parses "key=value" strings against it and
// keeps the typed result. Values are parsed as the kernel parses a configfs
// write (kstrtouint/kstrtoul with base 0, kstrtobool), so that what null_blk
// accepts softblk accepts and what it refuses softblk refuses with the same
// errno (EINVAL malformed, ERANGE too wide for the attribute).
//
// Parsing a value and checking it against its range are two steps, as in
// null_blk: a configfs write only parses; the range rules (clamp or refuse)
// apply when the device is powered on (device::create, set_power).
// option_set::parse does both, for callers that want one step.
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
    integer,         // unsigned, `bits` wide, kstrtoull base 0; range [min, max]
    signed_integer,  // signed, `bits` wide, kstrtoll base 0; range [smin, smax]
    boolean,         // kstrtobool: 1/y/Y/t/T/on true, 0/n/N/f/F/off false
    text,            // free text, validated by the owner (badblocks, fault specs)
};

// What happens at power on to a value outside [min, max].
enum class option_range : uint8_t {
    reject,  // error naming the attribute and its range
    clamp,   // clamped and written back (reads show the clamped value), only where null_blk
             // clamps (documented)
};

// When an attribute may change (configfs' rules, docs/null.md).
enum class option_update : uint8_t {
    // Only while powered off: writing it while powered on fails with EBUSY,
    // as null_blk's attributes without an apply function do.
    powered_off,
    // At any time; while powered on the owner applies it at once (the core,
    // a decorator, or target::apply_option).
    live,
    // At any time; while powered on the device re-creates its queues
    // (submit_queues, poll_queues: blk_mq_update_nr_hw_queues), so whoever
    // drives them must let go first (the daemon restarts the export).
    reconfigure,
    // Only while powered on (zone_readonly, zone_offline: EINVAL while off,
    // the zones exist only then).
    powered_on,
    // Only when the device is made: module parameters (gb, timeout=...).
    // Not a configfs attribute; `set` fails with EPERM.
    creation,
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
    // Width of an integer as the kernel stores the attribute: 32 for an
    // unsigned int (kstrtouint), 64 for an unsigned long. Wider values are
    // ERANGE when parsed.
    uint8_t bits = 64;
    option_update update = option_update::powered_off;
    // The attribute can be written and not read (zone_readonly).
    bool write_only = false;
    // Text options: checks a value when it is written (at creation and by
    // set_option, powered on or off), so that a malformed one is refused
    // then, not at the next power on. The error says why; the caller
    // prefixes "name=value: ". nullptr: any text.
    result<void> (*check)(std::string_view text) = nullptr;
};

// The kernel's number and boolean parsers (lib/kstrtox.c), which configfs
// attributes use. `text` may end in one newline (what `echo` writes).
//   kstrtoull(s, 0): optional '+', "0x" hexadecimal, leading 0 octal, else
//   decimal; EINVAL when malformed, ERANGE above `max_value`.
result<uint64_t> parse_kernel_unsigned(std::string_view text, uint64_t max_value = UINT64_MAX);
//   kstrtoll(s, 0): as above with an optional '-'; ERANGE outside [min, max].
result<int64_t> parse_kernel_signed(std::string_view text, int64_t min_value = INT64_MIN,
                                    int64_t max_value = INT64_MAX);
//   kstrtobool: decided by the first character (and the second for on/off).
result<bool> parse_kernel_bool(std::string_view text);

// Parsed options. Construct with option_set::parse or parse_values.
class option_set {
public:
    // parse_values, then check_ranges: one step for callers that need no
    // power-on semantics (export options, tests). Runs on any thread.
    static result<option_set> parse(std::span<const option_def> defs,
                                    std::span<const std::string> args);

    // Parses `args` ("key=value" each) against `defs` as configfs writes:
    // syntax and width only, no range. `defaults` ("key=value", e.g. module
    // parameters) are parsed first and count as given. Later occurrences of
    // a non-repeatable key replace earlier ones. Errors: an unknown key
    // (ENOENT), a missing '=' or a malformed value (EINVAL), a value too
    // wide (ERANGE); the message names the attribute. Any thread.
    static result<option_set> parse_values(std::span<const option_def> defs,
                                           std::span<const std::string> args,
                                           std::span<const std::string> defaults = {});

    // Applies every table's range: a `reject` value out of range is an
    // error naming the attribute and the range (EINVAL); a `clamp` value is
    // clamped and written back, with a line in `notes` when given.
    result<void> check_ranges(std::vector<std::string>* notes = nullptr);

    // One configfs write: parses `text` for `key` (a name or an alias) into
    // this set, as parse_values does. A repeatable text option appends.
    // Returns the attribute's definition. Any thread (not concurrently with
    // readers of this set).
    result<const option_def*> assign(std::string_view key, std::string_view text);

    // Write-back of effective values (null_blk's null_validate_conf changes
    // the device's fields). `given` marks the option given (persisted); a
    // value the device assigns itself (index) is not.
    void set_u64(std::string_view name, uint64_t value, bool given = true);
    void set_flag(std::string_view name, bool value);
    // Replaces every value of a repeatable text option (empty: none given).
    void set_texts(std::string_view name, std::vector<std::string> values);

    // Typed access. The name must be declared in the table (assertion).
    uint64_t u64(std::string_view name) const;
    int64_t i64(std::string_view name) const;
    bool flag(std::string_view name) const;
    const std::string& text(std::string_view name) const;
    // All values of a repeatable text option, in order given.
    const std::vector<std::string>& texts(std::string_view name) const;
    // True if the user gave the option (as opposed to the default).
    bool given(std::string_view name) const;
    // The value as a configfs read shows it, without the newline: integers
    // in decimal, booleans 0 or 1, text as given (repeatable: one per line).
    std::string value_text(std::string_view name) const;

    // Every option as key=value with its effective value, in table order;
    // this is what the daemon persists so that a device can be re-created.
    std::vector<std::string> to_args() const;

    std::span<const option_def> defs() const { return _defs; }
    // The definition of `key` (name or alias) in `defs`, or nullptr.
    static const option_def* find_def(std::span<const option_def> defs, std::string_view key);

private:
    struct value {
        uint64_t u = 0;
        int64_t s = 0;
        std::string text;
        std::vector<std::string> texts;
        bool given = false;
    };
    const value& find(std::string_view name) const;
    value& find(std::string_view name);
    result<void> store(const option_def& def, std::string_view text, bool given);

    std::vector<option_def> _defs;
    std::map<std::string, value, std::less<>> _values;
};

// Parses a size with an optional binary suffix (K, M, G, T, P, E, with or
// without "iB"/"B"), e.g. "4G" -> 4294967296, and a decimal fraction that
// gives whole bytes ("1.5G", "0.5K"; "1.1K" is refused). Errors (EINVAL
// malformed, ERANGE above UINT64_MAX bytes) say why without repeating
// `text`. Used by friendly CLI flags and byte-size options.
result<uint64_t> parse_size(std::string_view text);

// option_def::check for options that name a file, directory or socket: the
// value must be empty (the option's default) or an absolute path. The
// daemon opens such paths from its own working directory (/), not the
// caller's, and opens them again after a restart, so a relative path would
// name another file, or none. Runs on any thread.
result<void> check_absolute_path(std::string_view text);

// option_def::check for text options that hold a byte size (`size=` of the
// file and pattern targets): parse_size must accept the value, so a
// bad size is refused when written, also while the device is off.
result<void> check_byte_size(std::string_view text);

}  // namespace softblk
