// The daemon's default memory budget: MemTotal, cgroup v1 and v2 limits
// along the cgroup path, and the --memory-limit forms.
#include <gtest/gtest.h>

#include <cerrno>

#include "memory_limit.hpp"

using namespace softblk::host;

using softblk::k_mib;

namespace {

constexpr uint64_t k_gib = uint64_t{1} << 30;

TEST(memory_limit, mem_total_is_read_in_bytes)
{
    EXPECT_EQ(parse_meminfo_total("MemFree: 10 kB\nMemTotal:       24683548 kB\n"),
              uint64_t{24683548} * 1024);
    EXPECT_FALSE(parse_meminfo_total("MemFree: 10 kB\n"));
    EXPECT_FALSE(parse_meminfo_total("MemTotal: lots kB\n"));
}

TEST(memory_limit, cgroup_values)
{
    EXPECT_EQ(parse_cgroup_limit("2147483648\n"), 2 * k_gib);
    EXPECT_FALSE(parse_cgroup_limit("max\n"));
    EXPECT_FALSE(parse_cgroup_limit(""));
}

TEST(memory_limit, cgroup_v2_files_run_from_the_process_cgroup_to_the_root)
{
    const char* self = "0::/system.slice/softblk.service\n";
    const char* mounts =
        "22 1 0:21 / /proc rw,nosuid - proc proc rw\n"
        "30 24 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 "
        "rw,nsdelegate\n";
    EXPECT_EQ(cgroup_limit_files(self, mounts),
              (std::vector<std::string>{
                  "/sys/fs/cgroup/system.slice/softblk.service/memory.max",
                  "/sys/fs/cgroup/system.slice/memory.max",
                  "/sys/fs/cgroup/memory.max",
              }));
}

TEST(memory_limit, cgroup_v1_memory_controller_and_a_namespaced_root)
{
    const char* self = "9:name=systemd:/\n4:cpu,memory:/process_api/abc\n1:cpu:/\n0::/\n";
    // The v1 memory hierarchy mounted from /process_api (a container sees
    // only its part); the v2 mount does not show the process's cgroup.
    const char* mounts =
        "40 30 0:35 /process_api /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
        "41 30 0:36 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n"
        "42 30 0:37 /other /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n";
    EXPECT_EQ(cgroup_limit_files(self, mounts),
              (std::vector<std::string>{"/sys/fs/cgroup/memory/abc/memory.limit_in_bytes",
                                        "/sys/fs/cgroup/memory/memory.limit_in_bytes"}));
}

TEST(memory_limit, the_flag_forms)
{
    const machine_memory m{16 * k_gib, "MemTotal (16.0 GiB)"};
    auto def = choose_memory_limit("", m);
    ASSERT_TRUE(def);
    EXPECT_EQ(def->bytes, 8 * k_gib);
    EXPECT_NE(def->source.find("50% of MemTotal"), std::string::npos) << def->source;
    auto quarter = choose_memory_limit("25%", m);
    ASSERT_TRUE(quarter);
    EXPECT_EQ(quarter->bytes, 4 * k_gib);
    auto size = choose_memory_limit("64M", m);
    ASSERT_TRUE(size);
    EXPECT_EQ(size->bytes, 64 * k_mib);
    auto none = choose_memory_limit("none", m);
    ASSERT_TRUE(none);
    EXPECT_EQ(none->bytes, 0u);
    // 0 is not "no limit" in disguise: the error says to use none.
    auto zero = choose_memory_limit("0", m);
    ASSERT_FALSE(zero);
    EXPECT_EQ(zero.error().code.value(), EINVAL);
    EXPECT_NE(zero.error().message.find("use none"), std::string::npos) << zero.error().message;
    for (const char* bad : {"101%", "0%", "x%", "12Q", "4K", "0M", "0G"}) {
        auto r = choose_memory_limit(bad, m);
        ASSERT_FALSE(r) << bad;
        EXPECT_EQ(r.error().code.value(), EINVAL);
        EXPECT_NE(r.error().message.find("--memory-limit"), std::string::npos);
    }
}

TEST(memory_limit, this_machine_has_memory)
{
    auto m = read_machine_memory();
    ASSERT_TRUE(m) << m.error().message;
    EXPECT_GT(m->bytes, 64 * k_mib);
    EXPECT_FALSE(m->source.empty());
}

}  // namespace
