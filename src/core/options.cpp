#include <softblk/options.hpp>

#include <cassert>
#include <cerrno>
#include <fmt/core.h>

namespace softblk {

namespace {

std::string range_text(const option_def& def)
{
    switch (def.kind) {
    case option_kind::boolean:
        return "0 or 1";
    case option_kind::signed_integer:
        return fmt::format("{} to {}", def.smin, def.smax);
    case option_kind::integer:
        if (def.max == UINT64_MAX) {
            return fmt::format("at least {}", def.min);
        }
        return fmt::format("{} to {}", def.min, def.max);
    case option_kind::text:
        break;
    }
    return "text";
}

std::string unit_suffix(const option_def& def)
{
    return def.unit.empty() ? std::string() : fmt::format(" ({})", def.unit);
}

// A configfs write is a C string: what follows a NUL is not seen.
std::string_view c_string(std::string_view text)
{
    const size_t nul = text.find('\0');
    return nul == std::string_view::npos ? text : text.substr(0, nul);
}

// _kstrtoull: digits in `base` (0: from the prefix), then at most one
// newline. No sign.
result<uint64_t> kstrtoull_body(std::string_view s)
{
    unsigned base = 10;
    if (!s.empty() && s[0] == '0') {
        const bool hex = s.size() >= 3 && (s[1] == 'x' || s[1] == 'X') &&
                         std::isxdigit(static_cast<unsigned char>(s[2])) != 0;
        base = hex ? 16 : 8;
        if (hex) {
            s.remove_prefix(2);
        }
    }
    uint64_t value = 0;
    size_t digits = 0;
    bool overflow = false;
    for (; digits < s.size(); ++digits) {
        const char c = s[digits];
        unsigned d = 0;
        if (c >= '0' && c <= '9') {
            d = static_cast<unsigned>(c - '0');
        } else if (c >= 'a' && c <= 'f') {
            d = static_cast<unsigned>(c - 'a' + 10);
        } else if (c >= 'A' && c <= 'F') {
            d = static_cast<unsigned>(c - 'A' + 10);
        } else {
            break;
        }
        if (d >= base) {
            break;
        }
        if (value > (UINT64_MAX - d) / base) {
            overflow = true;
        }
        value = value * base + d;
    }
    if (overflow) {
        return make_error(ERANGE, "out of range");
    }
    if (digits == 0) {
        return make_error(EINVAL, "not a number");
    }
    std::string_view rest = s.substr(digits);
    if (!rest.empty() && rest[0] == '\n') {
        rest.remove_prefix(1);
    }
    if (!rest.empty()) {
        return make_error(EINVAL, "not a number");
    }
    return value;
}

}  // namespace

result<uint64_t> parse_kernel_unsigned(std::string_view text, uint64_t max_value)
{
    std::string_view s = c_string(text);
    if (!s.empty() && s[0] == '+') {
        s.remove_prefix(1);
    }
    auto v = kstrtoull_body(s);
    if (v && *v > max_value) {
        return make_error(ERANGE, "out of range");
    }
    return v;
}

result<int64_t> parse_kernel_signed(std::string_view text, int64_t min_value, int64_t max_value)
{
    std::string_view s = c_string(text);
    int64_t value = 0;
    if (!s.empty() && s[0] == '-') {
        auto v = kstrtoull_body(s.substr(1));
        if (!v) {
            return std::unexpected(v.error());
        }
        if (*v > uint64_t{1} << 63) {
            return make_error(ERANGE, "out of range");
        }
        value = static_cast<int64_t>(0 - *v);
    } else {
        auto v = parse_kernel_unsigned(s);
        if (!v) {
            return std::unexpected(v.error());
        }
        if (*v > static_cast<uint64_t>(INT64_MAX)) {
            return make_error(ERANGE, "out of range");
        }
        value = static_cast<int64_t>(*v);
    }
    if (value < min_value || value > max_value) {
        return make_error(ERANGE, "out of range");
    }
    return value;
}

result<bool> parse_kernel_bool(std::string_view text)
{
    const std::string_view s = c_string(text);
    switch (s.empty() ? '\0' : s[0]) {
    case 'y':
    case 'Y':
    case 't':
    case 'T':
    case '1':
        return true;
    case 'n':
    case 'N':
    case 'f':
    case 'F':
    case '0':
        return false;
    case 'o':
    case 'O':
        if (s.size() >= 2 && (s[1] == 'n' || s[1] == 'N')) {
            return true;
        }
        if (s.size() >= 2 && (s[1] == 'f' || s[1] == 'F')) {
            return false;
        }
        break;
    default:
        break;
    }
    return make_error(EINVAL, "not a boolean");
}

const option_def* option_set::find_def(std::span<const option_def> defs, std::string_view key)
{
    for (const option_def& def : defs) {
        if (def.name == key || (!def.alias.empty() && def.alias == key)) {
            return &def;
        }
    }
    return nullptr;
}

result<void> option_set::store(const option_def& def, std::string_view text, bool given)
{
    value& v = _values[std::string(def.name)];
    auto bad = [&](const error& why, std::string_view expected) -> result<void> {
        const bool range = why.code.value() == ERANGE;
        return make_error(why.code.value(),
                          fmt::format("{}={}: {}; {} takes {}", def.name, c_string(text),
                                      range ? "too large" : "not valid", def.name, expected));
    };
    switch (def.kind) {
    case option_kind::integer: {
        const uint64_t width = def.bits >= 64 ? UINT64_MAX : (uint64_t{1} << def.bits) - 1;
        auto n = parse_kernel_unsigned(text, width);
        if (!n) {
            return bad(n.error(), fmt::format("an unsigned {}-bit number (decimal, 0x hex or 0 "
                                              "octal), {}{}",
                                              def.bits >= 64 ? 64 : def.bits, range_text(def),
                                              unit_suffix(def)));
        }
        v.u = *n;
        v.s = static_cast<int64_t>(*n);
        break;
    }
    case option_kind::signed_integer: {
        // An int attribute (kstrtoint) is ERANGE outside 32 bits.
        const int64_t low = def.bits >= 64 ? INT64_MIN : -(int64_t{1} << (def.bits - 1));
        const int64_t high = def.bits >= 64 ? INT64_MAX : (int64_t{1} << (def.bits - 1)) - 1;
        auto n = parse_kernel_signed(text, low, high);
        if (!n) {
            return bad(n.error(),
                       fmt::format("a signed {}-bit number, {}{}", def.bits >= 64 ? 64 : def.bits,
                                   range_text(def), unit_suffix(def)));
        }
        v.s = *n;
        v.u = static_cast<uint64_t>(*n);
        break;
    }
    case option_kind::boolean: {
        auto b = parse_kernel_bool(text);
        if (!b) {
            return bad(b.error(), "0 or 1 (also y/n, t/f, on/off)");
        }
        v.u = *b ? 1 : 0;
        v.s = static_cast<int64_t>(v.u);
        break;
    }
    case option_kind::text: {
        std::string_view t = c_string(text);
        if (!t.empty() && t.back() == '\n') {
            t.remove_suffix(1);  // what `echo` adds
        }
        if (def.check != nullptr) {
            if (auto ok = def.check(t); !ok) {
                return make_error(ok.error().code.value(),
                                  fmt::format("{}={}: {}", def.name, t, ok.error().message));
            }
        }
        if (def.repeatable && given) {
            v.texts.emplace_back(t);
        }
        v.text = std::string(t);
        break;
    }
    }
    v.given = v.given || given;
    return {};
}

result<option_set> option_set::parse_values(std::span<const option_def> defs,
                                            std::span<const std::string> args,
                                            std::span<const std::string> defaults)
{
    option_set set;
    set._defs.assign(defs.begin(), defs.end());
    for (const option_def& def : set._defs) {
        if (set._values.contains(def.name)) {
            return make_error(EINVAL, fmt::format("option table declares {} twice", def.name));
        }
        if (auto r = set.store(def, def.default_value, false); !r) {
            return make_error(EINVAL,
                              fmt::format("bad default for {}: {}", def.name, r.error().message));
        }
    }
    for (auto list : {defaults, args}) {
        for (const std::string& arg : list) {
            const size_t eq = arg.find('=');
            if (eq == std::string::npos || eq == 0) {
                return make_error(EINVAL, fmt::format("{}: expected key=value", arg));
            }
            if (auto r = set.assign(std::string_view(arg).substr(0, eq),
                                    std::string_view(arg).substr(eq + 1));
                !r) {
                return std::unexpected(r.error());
            }
        }
    }
    return set;
}

result<option_set> option_set::parse(std::span<const option_def> defs,
                                     std::span<const std::string> args)
{
    auto set = parse_values(defs, args);
    if (!set) {
        return set;
    }
    if (auto r = set->check_ranges(); !r) {
        return std::unexpected(r.error());
    }
    return set;
}

result<const option_def*> option_set::assign(std::string_view key, std::string_view text)
{
    const option_def* def = find_def(_defs, key);
    if (def == nullptr) {
        return make_error(ENOENT,
                          fmt::format("{}: unknown option (`softblk features` lists them)", key));
    }
    if (auto r = store(*def, text, true); !r) {
        return std::unexpected(r.error());
    }
    return def;
}

result<void> option_set::check_ranges(std::vector<std::string>* notes)
{
    // Clamps first, then refusals: null_blk writes its clamps back before
    // the block layer can refuse (a refused power on leaves them written).
    for (const option_range pass : {option_range::clamp, option_range::reject}) {
        for (const option_def& def : _defs) {
            if (def.range != pass) {
                continue;
            }
            value& v = find(def.name);
            bool out = false;
            if (def.kind == option_kind::integer) {
                out = v.u < def.min || v.u > def.max;
            } else if (def.kind == option_kind::signed_integer) {
                out = v.s < def.smin || v.s > def.smax;
            }
            if (!out) {
                continue;
            }
            if (pass == option_range::reject) {
                return make_error(EINVAL, fmt::format("{}={}: out of range; {} must be {}{}",
                                                      def.name, value_text(def.name), def.name,
                                                      range_text(def), unit_suffix(def)));
            }
            const std::string before = value_text(def.name);
            if (def.kind == option_kind::integer) {
                v.u = v.u < def.min ? def.min : def.max;
                v.s = static_cast<int64_t>(v.u);
            } else {
                v.s = v.s < def.smin ? def.smin : def.smax;
                v.u = static_cast<uint64_t>(v.s);
            }
            if (notes != nullptr) {
                notes->push_back(fmt::format("{}={} clamped to {} ({} is {}{})", def.name, before,
                                             value_text(def.name), def.name, range_text(def),
                                             unit_suffix(def)));
            }
        }
    }
    return {};
}

const option_set::value& option_set::find(std::string_view name) const
{
    auto it = _values.find(name);
    assert(it != _values.end() && "option not declared in the table");
    return it->second;
}

option_set::value& option_set::find(std::string_view name)
{
    auto it = _values.find(name);
    assert(it != _values.end() && "option not declared in the table");
    return it->second;
}

void option_set::set_u64(std::string_view name, uint64_t number, bool given)
{
    option_set::value& v = find(name);
    v.u = number;
    v.s = static_cast<int64_t>(number);
    v.given = v.given || given;
}

void option_set::set_flag(std::string_view name, bool on)
{
    set_u64(name, on ? 1 : 0);
}

void option_set::set_texts(std::string_view name, std::vector<std::string> values)
{
    option_set::value& v = find(name);
    v.text = values.empty() ? std::string() : values.back();
    v.texts = std::move(values);
    v.given = !v.texts.empty();
}

uint64_t option_set::u64(std::string_view name) const
{
    return find(name).u;
}
int64_t option_set::i64(std::string_view name) const
{
    return find(name).s;
}
bool option_set::flag(std::string_view name) const
{
    return find(name).u != 0;
}
const std::string& option_set::text(std::string_view name) const
{
    return find(name).text;
}
const std::vector<std::string>& option_set::texts(std::string_view name) const
{
    return find(name).texts;
}
bool option_set::given(std::string_view name) const
{
    auto it = _values.find(name);
    return it != _values.end() && it->second.given;
}

std::string option_set::value_text(std::string_view name) const
{
    const option_def* def = find_def(_defs, name);
    assert(def != nullptr);
    const value& v = find(def->name);
    switch (def->kind) {
    case option_kind::integer:
    case option_kind::boolean:
        return std::to_string(v.u);
    case option_kind::signed_integer:
        return std::to_string(v.s);
    case option_kind::text:
        if (def->repeatable) {
            std::string out;
            for (const std::string& t : v.texts) {
                out += out.empty() ? "" : "\n";
                out += t;
            }
            return out;
        }
        return v.text;
    }
    return {};
}

std::vector<std::string> option_set::to_args() const
{
    std::vector<std::string> out;
    for (const option_def& def : _defs) {
        const value& v = find(def.name);
        if (def.kind == option_kind::text && def.repeatable) {
            for (const std::string& t : v.texts) {
                out.push_back(fmt::format("{}={}", def.name, t));
            }
            continue;
        }
        if (def.kind == option_kind::text && v.text.empty()) {
            continue;
        }
        out.push_back(fmt::format("{}={}", def.name, value_text(def.name)));
    }
    return out;
}

result<void> check_byte_size(std::string_view text)
{
    if (auto size = parse_size(text); !size) {
        return std::unexpected(size.error());
    }
    return {};
}

result<void> check_absolute_path(std::string_view text)
{
    if (!text.empty() && text.front() != '/') {
        return make_error(EINVAL,
                          "give an absolute path (the daemon opens it from its own "
                          "working directory, and again after a restart)");
    }
    return {};
}

result<uint64_t> parse_size(std::string_view text)
{
    constexpr std::string_view k_form =
        "a number of bytes, with K, M, G, T, P or E for binary "
        "units (64M, 1.5G)";
    size_t i = 0;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
        ++i;
    }
    if (i == 0) {
        return make_error(EINVAL, fmt::format("not a size: give {}", k_form));
    }
    const std::string_view whole = text.substr(0, i);
    std::string_view fraction;
    if (i < text.size() && text[i] == '.') {
        const size_t start = ++i;
        while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
            ++i;
        }
        fraction = text.substr(start, i - start);
        if (fraction.empty()) {
            return make_error(EINVAL, fmt::format("not a size: give {}", k_form));
        }
    }
    // A size is at most UINT64_MAX bytes: 16E - 1.
    constexpr std::string_view k_too_large =
        "too large: a size is at most 16E - 1 byte "
        "(18446744073709551615)";
    uint64_t number = 0;
    for (const char c : whole) {
        const unsigned d = static_cast<unsigned>(c - '0');
        if (number > (UINT64_MAX - d) / 10) {
            return make_error(ERANGE, std::string(k_too_large));
        }
        number = number * 10 + d;
    }
    std::string_view suffix = text.substr(i);
    unsigned shift = 0;
    if (!suffix.empty()) {
        constexpr std::string_view k_units = "BKMGTPE";
        const char unit = static_cast<char>(suffix[0] >= 'a' ? suffix[0] - 'a' + 'A' : suffix[0]);
        const size_t index = k_units.find(unit);
        const std::string_view rest = suffix.substr(1);
        if (index == std::string_view::npos || !(rest.empty() || rest == "iB" || rest == "B")) {
            return make_error(EINVAL,
                              fmt::format("unknown size suffix '{}': give {}", suffix, k_form));
        }
        shift = static_cast<unsigned>(index) * 10;
    }
    if (fraction.empty()) {
        if (shift != 0 && number > (UINT64_MAX >> shift)) {
            return make_error(ERANGE, std::string(k_too_large));
        }
        return number << shift;
    }
    // A decimal fraction, kept exact: (whole.fraction) * 2^shift must be a
    // whole number of bytes, i.e. whole_and_fraction * 2^shift divisible by
    // 10^digits = 2^digits * 5^digits.
    if (fraction.size() > 19) {
        return make_error(EINVAL, "not a size: at most 19 digits after the point");
    }
    using u128 = unsigned __int128;
    u128 scaled = number;
    u128 fives = 1;
    for (const char c : fraction) {
        scaled = scaled * 10 + static_cast<unsigned>(c - '0');
        fives *= 5;
    }
    const unsigned digits = static_cast<unsigned>(fraction.size());
    const std::string not_whole = fmt::format(
        "not a whole number of bytes; a fraction must give whole bytes (1.5G, "
        "0.5K), or give the size in {}",
        shift >= 10 ? "a smaller unit" : "bytes");
    if (scaled % fives != 0) {
        return make_error(EINVAL, not_whole);
    }
    u128 value = scaled / fives;
    if (shift >= digits) {
        if (value > (u128{UINT64_MAX} >> (shift - digits))) {
            return make_error(ERANGE, std::string(k_too_large));
        }
        value <<= shift - digits;
    } else {
        const u128 twos = u128{1} << (digits - shift);
        if (value % twos != 0) {
            return make_error(EINVAL, not_whole);
        }
        value /= twos;
    }
    if (value > UINT64_MAX) {
        return make_error(ERANGE, std::string(k_too_large));
    }
    return static_cast<uint64_t>(value);
}

}  // namespace softblk
