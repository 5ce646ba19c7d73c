// VFAT name rules: 8.3 fitting with NT case bits, ~N tails, checksums, UTF-8.
#include <gtest/gtest.h>

#include <cstring>

#include "layout.hpp"
#include "names.hpp"

using namespace softblk::fat::detail;

namespace {

std::string s11(const short_name& n)
{
    return std::string(reinterpret_cast<const char*>(n.data()), 11);
}

TEST(FatNames, ExactShortNamesUseCaseBitsInsteadOfLongEntries)
{
    auto p = plan_short_name("readme.txt");
    EXPECT_FALSE(p.needs_lfn);
    EXPECT_EQ(s11(p.name), "README  TXT");
    EXPECT_EQ(p.nt_flags, 0x18);
    p = plan_short_name("README.txt");
    EXPECT_FALSE(p.needs_lfn);
    EXPECT_EQ(p.nt_flags, 0x10);
    p = plan_short_name("Makefile");
    EXPECT_TRUE(p.needs_lfn);  // mixed case within the base
    p = plan_short_name("A");
    EXPECT_FALSE(p.needs_lfn);
    EXPECT_EQ(s11(p.name), "A          ");
}

TEST(FatNames, LongNamesGetNumericTails)
{
    auto p = plan_short_name("Hello World.text");
    ASSERT_TRUE(p.needs_lfn);
    EXPECT_EQ(p.basis_base, "HELLOWOR");
    EXPECT_EQ(p.basis_ext, "TEX");
    EXPECT_EQ(s11(numbered_short_name(p, 1, 0x1234)), "HELLOW~1TEX");
    EXPECT_EQ(s11(numbered_short_name(p, 4, 0x1234)), "HELLOW~4TEX");
    EXPECT_EQ(s11(numbered_short_name(p, 5, 0x1234)), "HE1234~5TEX");
    EXPECT_EQ(s11(numbered_short_name(p, 12, 0xABCD)), "HEABC~12TEX");
    p = plan_short_name(".bashrc");
    ASSERT_TRUE(p.needs_lfn);
    EXPECT_EQ(p.basis_base, "BASHRC");
    p = plan_short_name("a+b[1].c;d");
    EXPECT_EQ(p.basis_base, "A_B_1_");
    p = plan_short_name("Über.txt");
    EXPECT_EQ(p.basis_base, "_BER");
}

TEST(FatNames, ChecksumMatchesTheSpecification)
{
    // Worked example: sum over "HELLOW~1TEX" computed by hand with the
    // rotate-right-and-add rule.
    const uint8_t name[11] = {'H', 'E', 'L', 'L', 'O', 'W', '~', '1', 'T', 'E', 'X'};
    uint8_t sum = 0;
    for (uint8_t c : name) {
        sum = static_cast<uint8_t>(((sum & 1) ? 0x80 : 0) + (sum >> 1) + c);
    }
    EXPECT_EQ(lfn_checksum(name), sum);
}

TEST(FatNames, Utf8RoundTripsThroughUtf16)
{
    std::u16string u;
    ASSERT_TRUE(utf8_to_utf16("a\xC3\xA4\xE2\x82\xAC\xF0\x9F\x98\x80", u));
    EXPECT_EQ(u.size(), 5u);  // a, ä, €, and a surrogate pair
    EXPECT_EQ(utf16_to_utf8(u), "a\xC3\xA4\xE2\x82\xAC\xF0\x9F\x98\x80");
    EXPECT_FALSE(utf8_to_utf16("\xC3", u));
    EXPECT_FALSE(utf8_to_utf16("\xC0\xAF", u));  // overlong '/'
}

TEST(FatNames, ValidityRules)
{
    EXPECT_TRUE(valid_long_name("a b.c d"));
    EXPECT_FALSE(valid_long_name(""));
    EXPECT_FALSE(valid_long_name("."));
    EXPECT_FALSE(valid_long_name("a:b"));
    EXPECT_FALSE(valid_long_name("a\x01"));
    EXPECT_FALSE(valid_long_name(std::string(256, 'x')));
    EXPECT_TRUE(valid_long_name(std::string(255, 'x')));
    EXPECT_EQ(strip_trailing("name.. "), "name");
    short_name sn;
    EXPECT_TRUE(parse_short("hellow~1.tex", sn));
    EXPECT_EQ(s11(sn), "HELLOW~1TEX");
    EXPECT_FALSE(parse_short("toolongname.txt", sn));
}

TEST(FatNames, TimestampsRoundTripAtTwoSecondResolution)
{
    std::time_t t = 1700000000;  // 2023-11-14
    fat_time f = to_fat_time(t);
    EXPECT_EQ(from_fat_time(f.date, f.time, f.tenth), t);
    EXPECT_EQ(from_fat_time(f.date, f.time), t - (t % 2));
}

}  // namespace
