// start_export's queue choices on an export's kernel disk
// (include/softblk/kernel_disk.hpp), against a sysfs tree of files in a
// temporary directory: no_sched=1 writes "none" and puts back what was
// there on stop, no_sched=0 leaves the disk alone, and a write that fails
// leaves the export serving with a warning in its description. The real
// disks: tests/frontends/fuse/fuse_no_sched.sh (loop), tests/vm/tests/sched_ublk.sh.
#include "test_util.hpp"

#include <softblk/kernel_disk.hpp>
#include <softblk/target.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <gtest/gtest.h>
#include <unistd.h>

namespace softblk {
namespace {

namespace fs = std::filesystem;

struct sys_tree {
    fs::path root;
    sys_tree()
    {
        char tmpl[] = "/tmp/softblk-sysblock.XXXXXX";
        root = ::mkdtemp(tmpl);
    }
    ~sys_tree() { fs::remove_all(root); }
    // A disk whose queue/scheduler file says `text` (a file takes what is
    // written, as the kernel's would with only the bracket moving).
    void add(const std::string& disk, const std::string& text) const
    {
        fs::create_directories(root / disk / "queue");
        std::ofstream(root / disk / "queue" / "scheduler") << text;
    }
    std::string read(const std::string& disk) const
    {
        std::ifstream in(root / disk / "queue" / "scheduler");
        return std::string(std::istreambuf_iterator<char>(in), {});
    }
};

class fake_export final : public device_export {
public:
    explicit fake_export(std::string disk, bool* stopped = nullptr)
        : _disk(std::move(disk)), _stopped(stopped)
    {
    }
    nlohmann::json describe() const override { return {{"block", "/dev/" + _disk}}; }
    result<void> stop() override
    {
        if (_stopped != nullptr) {
            *_stopped = true;
        }
        return {};
    }
    std::string kernel_disk() const override { return _disk; }

private:
    std::string _disk;
    bool* _stopped;
};

TEST(kernel_disk, reads_the_active_scheduler)
{
    sys_tree sys;
    sys.add("a", "none [mq-deadline] kyber\n");
    sys.add("b", "none\n");
    sys.add("c", "garbage\n");
    EXPECT_EQ(disk_scheduler(sys.root.string(), "a").value(), "mq-deadline");
    EXPECT_EQ(disk_scheduler(sys.root.string(), "b").value(), "none");
    EXPECT_FALSE(disk_scheduler(sys.root.string(), "c"));
    auto missing = disk_scheduler(sys.root.string(), "d");
    ASSERT_FALSE(missing);
    EXPECT_NE(missing.error().message.find("d/queue/scheduler"), std::string::npos);
}

TEST(kernel_disk, no_sched_writes_none_and_stop_puts_back_the_old_one)
{
    sys_tree sys;
    sys.add("loop7", "none [mq-deadline] kyber\n");
    auto d = make_null({"no_sched=1"});
    bool stopped = false;
    auto exp =
        apply_disk_choices(*d, std::make_unique<fake_export>("loop7", &stopped), sys.root.string());
    EXPECT_EQ(sys.read("loop7"), "none");
    const auto j = exp->describe();
    EXPECT_EQ(j["block"], "/dev/loop7");  // the front end's own description stays
    EXPECT_EQ(j["scheduler"], "none");
    EXPECT_FALSE(j.contains("warning"));
    EXPECT_EQ(exp->kernel_disk(), "loop7");
    ASSERT_TRUE(exp->stop());
    EXPECT_TRUE(stopped);
    EXPECT_EQ(sys.read("loop7"), "mq-deadline");
}

TEST(kernel_disk, without_no_sched_the_disk_keeps_its_scheduler)
{
    sys_tree sys;
    sys.add("ublkb0", "none [mq-deadline]\n");
    auto d = make_null({});
    auto exp = apply_disk_choices(*d, std::make_unique<fake_export>("ublkb0"), sys.root.string());
    EXPECT_EQ(sys.read("ublkb0"), "none [mq-deadline]\n");
    EXPECT_EQ(exp->describe()["scheduler"], "mq-deadline");
    ASSERT_TRUE(exp->stop());
    EXPECT_EQ(sys.read("ublkb0"), "none [mq-deadline]\n");
}

TEST(kernel_disk, a_failed_write_leaves_the_export_with_a_warning)
{
    sys_tree sys;
    // A directory where the file should be: the write fails (EISDIR).
    fs::create_directories(sys.root / "loop3" / "queue" / "scheduler");
    auto d = make_null({"no_sched=1"});
    auto exp = apply_disk_choices(*d, std::make_unique<fake_export>("loop3"), sys.root.string());
    ASSERT_NE(exp, nullptr);
    const auto j = exp->describe();
    ASSERT_TRUE(j.contains("scheduler_error"));
    EXPECT_NE(j["scheduler_error"].get<std::string>().find("loop3/queue/scheduler"),
              std::string::npos);
    EXPECT_NE(j["warning"].get<std::string>().find("no_sched=1 not applied"), std::string::npos);
    EXPECT_TRUE(exp->stop());
}

TEST(kernel_disk, an_export_without_a_kernel_disk_is_left_as_it_is)
{
    sys_tree sys;
    auto d = make_null({"no_sched=1"});
    auto inner = std::make_unique<fake_export>("");
    device_export* raw = inner.get();
    auto exp = apply_disk_choices(*d, std::move(inner), sys.root.string());
    EXPECT_EQ(exp.get(), raw);
    EXPECT_FALSE(exp->describe().contains("scheduler"));
}

TEST(kernel_disk, no_sched_is_an_option_of_every_target_type)
{
    for (const target_type* t : target_types()) {
        const auto defs = options_for(t->name);
        EXPECT_EQ(std::count_if(defs.begin(), defs.end(),
                                [](const option_def& d) { return d.name == "no_sched"; }),
                  1)
            << t->name;
    }
}

}  // namespace
}  // namespace softblk
