#include "names.hpp"

#include <atomic>
#include <climits>
#include <cstring>
#include <ctime>

#include <fmt/format.h>

#include "layout.hpp"

namespace softblk::fat::detail {

namespace {

bool short_char_ok(unsigned char c)
{
    if (c >= 0x80) {
        return true;
    }
    if ((c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) {
        return true;
    }
    return std::strchr("$%'-_@~`!(){}^#&", c) != nullptr && c != 0;
}

bool is_lower(unsigned char c)
{
    return c >= 'a' && c <= 'z';
}
bool is_upper(unsigned char c)
{
    return c >= 'A' && c <= 'Z';
}
unsigned char to_upper(unsigned char c)
{
    return is_lower(c) ? static_cast<unsigned char>(c - 32) : c;
}

void append_utf8(std::string& out, uint32_t cp)
{
    if (cp < 0x80) {
        out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
        out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
        out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
}

}  // namespace

bool utf8_to_utf16(std::string_view in, std::u16string& out)
{
    out.clear();
    size_t i = 0;
    while (i < in.size()) {
        auto c = static_cast<unsigned char>(in[i]);
        uint32_t cp = 0;
        int extra = 0;
        if (c < 0x80) {
            cp = c;
        } else if ((c & 0xE0) == 0xC0) {
            cp = c & 0x1F;
            extra = 1;
        } else if ((c & 0xF0) == 0xE0) {
            cp = c & 0x0F;
            extra = 2;
        } else if ((c & 0xF8) == 0xF0) {
            cp = c & 0x07;
            extra = 3;
        } else {
            return false;
        }
        if (i + static_cast<size_t>(extra) >= in.size() && extra > 0) {
            return false;
        }
        for (int k = 1; k <= extra; ++k) {
            auto cc = static_cast<unsigned char>(in[i + k]);
            if ((cc & 0xC0) != 0x80) {
                return false;
            }
            cp = (cp << 6) | (cc & 0x3F);
        }
        if ((extra == 1 && cp < 0x80) || (extra == 2 && cp < 0x800) ||
            (extra == 3 && cp < 0x10000) || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
            return false;
        }
        i += 1 + static_cast<size_t>(extra);
        if (cp >= 0x10000) {
            cp -= 0x10000;
            out.push_back(static_cast<char16_t>(0xD800 + (cp >> 10)));
            out.push_back(static_cast<char16_t>(0xDC00 + (cp & 0x3FF)));
        } else {
            out.push_back(static_cast<char16_t>(cp));
        }
    }
    return true;
}

std::string utf16_to_utf8(std::u16string_view in)
{
    std::string out;
    out.reserve(in.size());
    for (size_t i = 0; i < in.size(); ++i) {
        uint32_t u = in[i];
        if (u >= 0xD800 && u <= 0xDBFF && i + 1 < in.size() && in[i + 1] >= 0xDC00 &&
            in[i + 1] <= 0xDFFF) {
            uint32_t cp = 0x10000 + ((u - 0xD800) << 10) + (in[i + 1] - 0xDC00);
            append_utf8(out, cp);
            ++i;
        } else if (u >= 0xD800 && u <= 0xDFFF) {
            append_utf8(out, 0xFFFD);
        } else {
            append_utf8(out, u);
        }
    }
    return out;
}

std::string fold(std::string_view name)
{
    std::string out(name);
    for (auto& c : out) {
        c = static_cast<char>(to_upper(static_cast<unsigned char>(c)));
    }
    return out;
}

std::string_view strip_trailing(std::string_view name)
{
    while (!name.empty() && (name.back() == '.' || name.back() == ' ')) {
        name.remove_suffix(1);
    }
    return name;
}

bool valid_long_name(std::string_view name)
{
    if (name.empty() || name == "." || name == "..") {
        return false;
    }
    for (char ch : name) {
        auto c = static_cast<unsigned char>(ch);
        if (c < 0x20 || c == 0x7F || std::strchr("\"*/:<>?\\|", c) != nullptr) {
            return false;
        }
    }
    std::u16string units;
    if (!utf8_to_utf16(name, units)) {
        return false;
    }
    return units.size() <= 255;
}

std::string short_to_string(const uint8_t* name)
{
    std::string out;
    auto add = [&](uint8_t c, bool first) {
        if (first && c == 0x05) {
            c = 0xE5;
        }
        append_utf8(out, c);
    };
    int base_end = 8;
    while (base_end > 0 && name[base_end - 1] == ' ') {
        --base_end;
    }
    for (int i = 0; i < base_end; ++i) {
        add(name[i], i == 0);
    }
    int ext_end = 11;
    while (ext_end > 8 && name[ext_end - 1] == ' ') {
        --ext_end;
    }
    if (ext_end > 8) {
        out.push_back('.');
        for (int i = 8; i < ext_end; ++i) {
            add(name[i], false);
        }
    }
    return out;
}

std::string short_to_display(const uint8_t* name, uint8_t nt_flags)
{
    uint8_t copy[11];
    std::memcpy(copy, name, 11);
    for (int i = 0; i < 11; ++i) {
        bool lower = i < 8 ? (nt_flags & 0x08) != 0 : (nt_flags & 0x10) != 0;
        if (lower && is_upper(copy[i])) {
            copy[i] = static_cast<uint8_t>(copy[i] + 32);
        }
    }
    return short_to_string(copy);
}

bool valid_stored_short(const uint8_t* name)
{
    if (name[0] == ' ') {
        return false;
    }
    for (int i = 0; i < 11; ++i) {
        uint8_t c = name[i];
        if ((c < 0x20 && !(i == 0 && c == 0x05)) || c == 0x7F ||
            std::strchr("*?<>|\"\\/:", c) != nullptr) {
            return false;
        }
    }
    return true;
}

short_plan plan_short_name(std::string_view name)
{
    short_plan plan;
    // 1. Does the name fit 8.3 as it is (with one case per part)?
    size_t dot = name.rfind('.');
    std::string_view base = dot == std::string_view::npos ? name : name.substr(0, dot);
    std::string_view ext =
        dot == std::string_view::npos ? std::string_view{} : name.substr(dot + 1);
    auto part_ok = [](std::string_view part, size_t max, bool& lower) {
        if (part.size() > max) {
            return false;
        }
        bool has_lower = false;
        bool has_upper = false;
        for (char ch : part) {
            auto c = static_cast<unsigned char>(ch);
            if (c >= 0x80 || !(short_char_ok(to_upper(c)))) {
                return false;
            }
            has_lower |= is_lower(c);
            has_upper |= is_upper(c);
        }
        lower = has_lower;
        return !(has_lower && has_upper);
    };
    bool base_lower = false;
    bool ext_lower = false;
    if (!base.empty() && base.find('.') == std::string_view::npos && part_ok(base, 8, base_lower) &&
        part_ok(ext, 3, ext_lower) && !(dot != std::string_view::npos && ext.empty())) {
        plan.name.fill(' ');
        for (size_t i = 0; i < base.size(); ++i) {
            plan.name[i] = to_upper(static_cast<unsigned char>(base[i]));
        }
        for (size_t i = 0; i < ext.size(); ++i) {
            plan.name[8 + i] = to_upper(static_cast<unsigned char>(ext[i]));
        }
        if (plan.name[0] == 0xE5) {
            plan.name[0] = 0x05;
        }
        plan.nt_flags = static_cast<uint8_t>((base_lower ? 0x08 : 0) | (ext_lower ? 0x10 : 0));
        plan.needs_lfn = false;
        return plan;
    }
    // 2. A long name; derive the basis for BASIS~N.EXT.
    plan.needs_lfn = true;
    std::string_view body = name;
    while (!body.empty() && (body.front() == '.' || body.front() == ' ')) {
        body.remove_prefix(1);
    }
    size_t last_dot = body.rfind('.');
    std::string_view b = last_dot == std::string_view::npos ? body : body.substr(0, last_dot);
    std::string_view e =
        last_dot == std::string_view::npos ? std::string_view{} : body.substr(last_dot + 1);
    auto convert = [](std::string_view part, size_t max) {
        std::string out;
        for (size_t i = 0; i < part.size() && out.size() < max; ++i) {
            auto c = static_cast<unsigned char>(part[i]);
            if (c == ' ' || c == '.') {
                continue;
            }
            if (c >= 0x80) {
                // One '_' per code point: skip continuation bytes.
                while (i + 1 < part.size() &&
                       (static_cast<unsigned char>(part[i + 1]) & 0xC0) == 0x80) {
                    ++i;
                }
                out.push_back('_');
                continue;
            }
            c = to_upper(c);
            out.push_back(short_char_ok(c) ? static_cast<char>(c) : '_');
        }
        return out;
    };
    plan.basis_base = convert(b, 8);
    plan.basis_ext = convert(e, 3);
    if (plan.basis_base.empty()) {
        // push_back, not = "_": GCC 12 warns -Wrestrict, wrongly, on a
        // string assigned a literal after inlining (GCC bug 105329).
        plan.basis_base.push_back('_');
    }
    return plan;
}

uint16_t name_hash(std::string_view name)
{
    uint32_t h = 2166136261u;
    for (char c : name) {
        h = (h ^ static_cast<unsigned char>(c)) * 16777619u;
    }
    return static_cast<uint16_t>(h ^ (h >> 16));
}

short_name numbered_short_name(const short_plan& plan, uint32_t n, uint16_t hash)
{
    std::string tail = fmt::format("~{}", n);
    std::string base = plan.basis_base;
    if (n > 4) {
        base = base.substr(0, std::min<size_t>(2, base.size())) + fmt::format("{:04X}", hash);
    }
    base = base.substr(0, std::min(base.size(), 8 - tail.size())) + tail;
    short_name out;
    out.fill(' ');
    std::memcpy(out.data(), base.data(), base.size());
    std::memcpy(out.data() + 8, plan.basis_ext.data(), plan.basis_ext.size());
    return out;
}

bool parse_short(std::string_view name, short_name& out)
{
    size_t dot = name.rfind('.');
    std::string_view base = dot == std::string_view::npos ? name : name.substr(0, dot);
    std::string_view ext =
        dot == std::string_view::npos ? std::string_view{} : name.substr(dot + 1);
    if (base.empty() || base.size() > 8 || ext.size() > 3 ||
        base.find('.') != std::string_view::npos) {
        return false;
    }
    out.fill(' ');
    for (size_t i = 0; i < base.size(); ++i) {
        auto c = to_upper(static_cast<unsigned char>(base[i]));
        if (!short_char_ok(c) || c >= 0x80) {
            return false;
        }
        out[i] = c;
    }
    for (size_t i = 0; i < ext.size(); ++i) {
        auto c = to_upper(static_cast<unsigned char>(ext[i]));
        if (!short_char_ok(c) || c >= 0x80) {
            return false;
        }
        out[8 + i] = c;
    }
    return true;
}

namespace {

// Days from 1970-01-01 to y-m-d of the proleptic Gregorian calendar
// (H. Hinnant's days_from_civil). Linear in the day, so a day past the
// month's end counts on into the next month, as mktime normalises it.
constexpr int64_t days_from_civil(int64_t y, unsigned m, unsigned d)
{
    y -= m <= 2 ? 1 : 0;
    const int64_t era = (y >= 0 ? y : y - 399) / 400;
    const auto yoe = static_cast<unsigned>(y - era * 400);
    const unsigned doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
    const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + static_cast<int64_t>(doe) - 719468;
}

// The UTC offset that placed the last local time; neighbouring entries
// almost always share it. Only a hint: every use is checked.
std::atomic<long> g_last_offset{LONG_MIN};

}  // namespace

std::time_t from_fat_time(uint16_t date, uint16_t time, uint8_t tenth)
{
    if (date == 0) {
        return 0;
    }
    std::tm tm{};
    tm.tm_year = 80 + (date >> 9);
    tm.tm_mon = ((date >> 5) & 0x0F) - 1;
    tm.tm_mday = date & 0x1F;
    tm.tm_hour = time >> 11;
    tm.tm_min = (time >> 5) & 0x3F;
    tm.tm_sec = (time & 0x1F) * 2 + (tenth >= 100 && tenth < 200 ? 1 : 0);
    tm.tm_isdst = -1;
    if (tm.tm_mon < 0 || tm.tm_mon > 11 || tm.tm_mday == 0) {
        return 0;
    }
    // glibc's mktime checks the zone file again (a stat of /etc/localtime)
    // on every call: three system calls per stat of an entry, 15000 for a
    // listing of 5000 files. A local time is t + offset(t); the offset that
    // placed the last one is tried first and checked with localtime_r (no
    // system call). A time in a DST gap fits no offset and goes to mktime;
    // one in the repeated hour takes the offset of its neighbours.
    const int64_t local = days_from_civil(1900 + tm.tm_year, static_cast<unsigned>(tm.tm_mon + 1),
                                          static_cast<unsigned>(tm.tm_mday)) *
                              86400 +
                          tm.tm_hour * 3600 + tm.tm_min * 60 + tm.tm_sec;
    long offset = g_last_offset.load(std::memory_order_relaxed);
    std::tm check{};
    if (offset == LONG_MIN) {
        const auto guess = static_cast<std::time_t>(local);
        offset = localtime_r(&guess, &check) != nullptr ? check.tm_gmtoff : 0;
    }
    for (int attempt = 0; attempt < 2; ++attempt) {
        const auto t = static_cast<std::time_t>(local - offset);
        if (localtime_r(&t, &check) == nullptr) {
            break;
        }
        if (check.tm_gmtoff == offset) {
            g_last_offset.store(offset, std::memory_order_relaxed);
            return t;
        }
        offset = check.tm_gmtoff;
    }
    return mktime(&tm);
}

}  // namespace softblk::fat::detail
