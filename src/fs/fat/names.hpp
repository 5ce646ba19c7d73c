// VFAT names: UTF-8 <-> UTF-16, 8.3 short names with the NT case bits,
// numeric tails (~N), validity. Internal to softblk_fat.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace softblk::fat::detail {

using short_name = std::array<uint8_t, 11>;

// Returns false on malformed UTF-8 (or code points beyond U+10FFFF).
bool utf8_to_utf16(std::string_view in, std::u16string& out);
// Unpaired surrogates become U+FFFD.
std::string utf16_to_utf8(std::u16string_view in);

// ASCII upper-casing: FAT's name comparison (no full Unicode folding).
std::string fold(std::string_view name);

// Windows drops trailing dots and spaces from names; so do we.
std::string_view strip_trailing(std::string_view name);

// A name a long entry may hold: 1..255 UTF-16 units, no control character,
// none of "*/:<>?\|, not "." or "..".
bool valid_long_name(std::string_view name);

// "README.TXT"-style text of an 11-byte name (0x05 lead byte -> 0xE5;
// bytes >= 0x80 shown as U+0080..U+00FF).
std::string short_to_string(const uint8_t* name);
// The name a reader shows for an entry without a long name: the 8.3 text
// with the NT lower-case bits applied ("readme.TXT").
std::string short_to_display(const uint8_t* name, uint8_t nt_flags);
// Whether the stored 11 bytes are acceptable as a short name (no control
// characters, no "*?<>|\"\\/:", not all spaces).
bool valid_stored_short(const uint8_t* name);

// How a new name is stored.
struct short_plan {
    short_name name{};     // the exact 8.3 name when !needs_lfn, else unused
    uint8_t nt_flags = 0;  // NT lower-case bits when !needs_lfn
    bool needs_lfn = false;
    std::string basis_base;  // uppercase, valid chars, up to 8
    std::string basis_ext;   // up to 3
};
short_plan plan_short_name(std::string_view name);

// The n-th candidate (n >= 1): "BASIS~N.EXT" for small n, then a hashed
// basis ("BA1F3C~N") so that thousands of similar names stay cheap.
short_name numbered_short_name(const short_plan& plan, uint32_t n, uint16_t hash);
uint16_t name_hash(std::string_view name);

// Parses "NAME.EXT" as a short name for lookup (upper-cased); false if it
// cannot be one.
bool parse_short(std::string_view name, short_name& out);

}  // namespace softblk::fat::detail
