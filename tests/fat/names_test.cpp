// VFAT name rules: 8.3 fitting with NT case bits, ~N tails, checksums, UTF-8.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <ctime>

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

// from_fat_time places a local time without mktime's system call per
// conversion; it must still give what mktime gives. A zone with DST (as a
// POSIX TZ string, so no tzdata is needed), every 37 minutes and 11
// seconds over three years: the conversions cross every transition. In
// the repeated hour both readings are right; the result must read back
// as the same local time.
TEST(FatNames, LocalTimesConvertAsMktimeDoesAcrossDstChanges)
{
    const char* old_tz = getenv("TZ");
    std::string saved = old_tz != nullptr ? old_tz : "";
    for (const char* zone : {"CET-1CEST,M3.5.0,M10.5.0/3", "EST5EDT,M3.2.0,M11.1.0", "UTC0",
                             "<+1030>-10:30<+11>-11,M10.1.0,M4.1.0"}) {
        setenv("TZ", zone, 1);
        tzset();
        int checked = 0;
        for (std::time_t t = 1577836800; t < 1577836800 + 3 * 366 * 86400; t += 37 * 60 + 11) {
            fat_time f = to_fat_time(t);
            std::tm want{};
            want.tm_year = 80 + (f.date >> 9);
            want.tm_mon = ((f.date >> 5) & 0x0F) - 1;
            want.tm_mday = f.date & 0x1F;
            want.tm_hour = f.time >> 11;
            want.tm_min = (f.time >> 5) & 0x3F;
            want.tm_sec = (f.time & 0x1F) * 2;
            want.tm_isdst = -1;
            std::tm fields = want;
            const std::time_t expected = mktime(&want);
            const std::time_t got = from_fat_time(f.date, f.time);
            std::tm back{};
            ASSERT_NE(localtime_r(&got, &back), nullptr);
            ASSERT_EQ(back.tm_hour * 3600 + back.tm_min * 60 + back.tm_sec,
                      fields.tm_hour * 3600 + fields.tm_min * 60 + fields.tm_sec)
                << zone << " at " << t;
            ASSERT_EQ(back.tm_mday, fields.tm_mday) << zone << " at " << t;
            if (got != expected) {
                // Only a local time that occurs twice may be read either way.
                ASSERT_EQ(std::abs(got - expected), std::abs(back.tm_gmtoff - want.tm_gmtoff))
                    << zone << " at " << t;
            }
            ++checked;
        }
        EXPECT_GT(checked, 40000);
        // Fields FAT can hold but a calendar cannot (31 February, hour 31)
        // count on as mktime counts them; a time that a change to DST
        // skips (02:30 on 31 March and 10 March 2024) is mktime's.
        for (uint16_t date : {static_cast<uint16_t>((44 << 9) | (2 << 5) | 31),
                              static_cast<uint16_t>((45 << 9) | (12 << 5) | 31),
                              static_cast<uint16_t>((44 << 9) | (3 << 5) | 31),
                              static_cast<uint16_t>((44 << 9) | (3 << 5) | 10)}) {
            for (uint16_t time : {static_cast<uint16_t>((31 << 11) | (63 << 5) | 31),
                                  static_cast<uint16_t>((12 << 11) | (0 << 5) | 0),
                                  static_cast<uint16_t>((2 << 11) | (30 << 5) | 0)}) {
                std::tm tm{};
                tm.tm_year = 80 + (date >> 9);
                tm.tm_mon = ((date >> 5) & 0x0F) - 1;
                tm.tm_mday = date & 0x1F;
                tm.tm_hour = time >> 11;
                tm.tm_min = (time >> 5) & 0x3F;
                tm.tm_sec = (time & 0x1F) * 2;
                tm.tm_isdst = -1;
                EXPECT_EQ(from_fat_time(date, time), mktime(&tm)) << zone;
            }
        }
    }
    if (old_tz != nullptr) {
        setenv("TZ", saved.c_str(), 1);
    } else {
        unsetenv("TZ");
    }
    tzset();
}

}  // namespace
