#include <softblk/options.hpp>

#include <cassert>
#include <cerrno>
#include <charconv>
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

result<uint64_t> parse_unsigned(std::string_view text)
{
    int base = 10;
    if (text.size() > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X')) {
        base = 16;
        text.remove_prefix(2);
    }
    uint64_t value = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value, base);
    if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
        return make_error(EINVAL, "not a number");
    }
    return value;
}

result<int64_t> parse_signed(std::string_view text)
{
    int64_t value = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value, 10);
    if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
        return make_error(EINVAL, "not a number");
    }
    return value;
}

result<bool> parse_bool(std::string_view text)
{
    if (text == "1" || text == "y" || text == "Y" || text == "yes" || text == "true" ||
        text == "on") {
        return true;
    }
    if (text == "0" || text == "n" || text == "N" || text == "no" || text == "false" ||
        text == "off") {
        return false;
    }
    return make_error(EINVAL, "not a boolean");
}

}  // namespace

result<option_set> option_set::parse(std::span<const option_def> defs,
                                     std::span<const std::string> args)
{
    option_set set;
    set._defs.assign(defs.begin(), defs.end());

    auto assign = [&](const option_def& def, std::string_view text, bool given) -> result<void> {
        value& v = set._values[std::string(def.name)];
        v.given = v.given || given;
        switch (def.kind) {
        case option_kind::integer: {
            auto n = parse_unsigned(text);
            if (!n) {
                return make_error(
                    EINVAL, fmt::format("{}={}: not a number; {} must be {}{}", def.name, text,
                                        def.name, range_text(def), unit_suffix(def)));
            }
            uint64_t x = *n;
            if (x < def.min || x > def.max) {
                if (def.range == option_range::clamp) {
                    x = x < def.min ? def.min : def.max;
                } else {
                    return make_error(
                        EINVAL, fmt::format("{}={}: out of range; {} must be {}{}", def.name, text,
                                            def.name, range_text(def), unit_suffix(def)));
                }
            }
            v.u = x;
            v.s = static_cast<int64_t>(x);
            v.text = std::string(text);
            return {};
        }
        case option_kind::signed_integer: {
            auto n = parse_signed(text);
            if (!n || *n < def.smin || *n > def.smax) {
                return make_error(EINVAL, fmt::format("{}={}: {}; {} must be {}{}", def.name, text,
                                                      n ? "out of range" : "not a number", def.name,
                                                      range_text(def), unit_suffix(def)));
            }
            v.s = *n;
            v.u = static_cast<uint64_t>(*n);
            v.text = std::string(text);
            return {};
        }
        case option_kind::boolean: {
            auto b = parse_bool(text);
            if (!b) {
                return make_error(
                    EINVAL, fmt::format("{}={}: {} must be 0 or 1", def.name, text, def.name));
            }
            v.u = *b ? 1 : 0;
            v.s = static_cast<int64_t>(v.u);
            v.text.assign(1, *b ? '1' : '0');
            return {};
        }
        case option_kind::text:
            if (def.repeatable && given) {
                v.texts.emplace_back(text);
            }
            v.text = std::string(text);
            return {};
        }
        return {};
    };

    for (const option_def& def : set._defs) {
        if (set._values.contains(def.name)) {
            return make_error(EINVAL, fmt::format("option table declares {} twice", def.name));
        }
        auto r = assign(def, def.default_value, false);
        if (!r) {
            return make_error(EINVAL,
                              fmt::format("bad default for {}: {}", def.name, r.error().message));
        }
    }

    for (const std::string& arg : args) {
        auto eq = arg.find('=');
        if (eq == std::string::npos || eq == 0) {
            return make_error(EINVAL, fmt::format("{}: expected key=value", arg));
        }
        std::string_view key(arg.data(), eq);
        std::string_view text(arg.data() + eq + 1, arg.size() - eq - 1);
        const option_def* found = nullptr;
        for (const option_def& def : set._defs) {
            if (def.name == key || (!def.alias.empty() && def.alias == key)) {
                found = &def;
                break;
            }
        }
        if (found == nullptr) {
            return make_error(
                EINVAL, fmt::format("{}: unknown option (`softblk features` lists them)", key));
        }
        auto r = assign(*found, text, true);
        if (!r) {
            return std::unexpected(r.error());
        }
    }
    return set;
}

const option_set::value& option_set::find(std::string_view name) const
{
    auto it = _values.find(name);
    assert(it != _values.end() && "option not declared in the table");
    return it->second;
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
        out.push_back(fmt::format("{}={}", def.name, v.text));
    }
    return out;
}

result<uint64_t> parse_size(std::string_view text)
{
    std::string_view digits = text;
    size_t i = 0;
    while (i < digits.size() && digits[i] >= '0' && digits[i] <= '9') {
        ++i;
    }
    auto number = parse_unsigned(digits.substr(0, i));
    if (!number) {
        return make_error(EINVAL, fmt::format("{}: not a size (e.g. 512M, 4G)", text));
    }
    std::string_view suffix = digits.substr(i);
    unsigned shift = 0;
    if (!suffix.empty()) {
        switch (suffix[0]) {
        case 'k':
        case 'K':
            shift = 10;
            break;
        case 'm':
        case 'M':
            shift = 20;
            break;
        case 'g':
        case 'G':
            shift = 30;
            break;
        case 't':
        case 'T':
            shift = 40;
            break;
        case 'b':
        case 'B':
            shift = 0;
            break;
        default:
            return make_error(EINVAL,
                              fmt::format("{}: unknown size suffix (use K, M, G or T)", text));
        }
        std::string_view rest = suffix.substr(1);
        if (!(rest.empty() || rest == "iB" || rest == "B" || (shift == 0 && rest.empty()))) {
            return make_error(EINVAL,
                              fmt::format("{}: unknown size suffix (use K, M, G or T)", text));
        }
    }
    if (shift != 0 && *number > (UINT64_MAX >> shift)) {
        return make_error(ERANGE, fmt::format("{}: too large", text));
    }
    return *number << shift;
}

}  // namespace softblk
