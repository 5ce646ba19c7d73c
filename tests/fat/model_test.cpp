// Model-based test: thousands of random operations checked against an
// in-memory model, with periodic unmount/remount, then fsck.fat -n. And
// crash points: the dirty cache is dropped at random moments; afterwards
// nothing that was fsynced is missing and fsck.fat finds only what a crash
// may leave (the dirty bit).
#include "fat_test_util.hpp"

#include <cerrno>

using namespace fat_test;

namespace {

struct model {
    std::map<std::string, std::string> files;
    std::set<std::string> dirs = {""};

    std::vector<std::string> dir_list() const { return {dirs.begin(), dirs.end()}; }
    bool exists(const std::string& p) const { return files.count(p) || dirs.count(p); }
    bool dir_empty(const std::string& d) const
    {
        std::string prefix = d + "/";
        for (auto& [p, _] : files) {
            if (p.rfind(prefix, 0) == 0) {
                return false;
            }
        }
        for (auto& p : dirs) {
            if (p.rfind(prefix, 0) == 0) {
                return false;
            }
        }
        return true;
    }
};

const std::vector<std::string> k_names = {"a",
                                          "b.txt",
                                          "Long Name.data",
                                          "MiXeD.Case",
                                          "x.y.z",
                                          "lower.txt",
                                          "UPPER.TXT",
                                          "spaces in name",
                                          "\xC3\xA4.txt",
                                          "n1",
                                          "n2",
                                          "a very long file name that needs several slots.bin"};

std::string pick(std::mt19937_64& rng, const std::vector<std::string>& v)
{
    return v[rng() % v.size()];
}
std::string join(const std::string& d, const std::string& n)
{
    return d.empty() ? n : d + "/" + n;
}

class runner {
public:
    runner(memory_block_device& dev, uint64_t seed, mount_options opts)
        : _dev(dev), _rng(seed), _opts(opts)
    {
        mount();
    }

    void mount()
    {
        auto v = volume::mount(_dev, _opts);
        ASSERT_TRUE(v.has_value()) << v.error().message;
        _vol = std::move(*v);
    }
    void remount()
    {
        ASSERT_TRUE(_vol->unmount().has_value());
        _vol.reset();
        mount();
    }

    // One random operation, checked against the model.
    void step()
    {
        auto dirs = _m.dir_list();
        std::string dir = pick(_rng, dirs);
        std::string path = join(dir, pick(_rng, k_names));
        std::string abs = "/" + path;
        int op = static_cast<int>(_rng() % 100);
        if (op < 25) {  // write at a random offset (creating if needed)
            if (_m.dirs.count(path)) {
                return;
            }
            std::string& content = _m.files[path];
            auto f = _vol->open(abs, k_open_read | k_open_write | k_open_create);
            ASSERT_TRUE(f.has_value()) << abs << ": " << f.error().message;
            uint64_t off = _rng() % 3 == 0 ? content.size() : _rng() % (content.size() + 20000);
            std::string data = random_bytes(_rng, _rng() % 3 == 0 ? _rng() % 70000 : _rng() % 3000);
            int64_t n = f->pwrite(data.data(), data.size(), off);
            if (n == -ENOSPC) {
                return;  // the model keeps the old content: nothing was written
            }
            ASSERT_EQ(n, static_cast<int64_t>(data.size())) << abs;
            if (content.size() < off + data.size()) {
                content.resize(off + data.size(), '\0');
            }
            content.replace(off, data.size(), data);
            touched(path);
            if (_rng() % 8 == 0) {
                ASSERT_EQ(f->fsync(), 0);
                _durable[path] = content;
            }
        } else if (op < 35) {  // truncate
            if (!_m.files.count(path)) {
                return;
            }
            uint64_t size = _rng() % 40000;
            auto r = _vol->truncate(abs, size);
            if (!r && r.error().code.value() == ENOSPC) {
                return;
            }
            ASSERT_TRUE(r.has_value()) << abs << ": " << r.error().message;
            _m.files[path].resize(size, '\0');
            touched(path);
        } else if (op < 50) {  // read back
            if (!_m.files.count(path)) {
                EXPECT_FALSE(_m.dirs.count(path) == 0 && _vol->stat(abs).has_value())
                    << abs << " should not exist";
                return;
            }
            ASSERT_EQ(read_all(*_vol, abs), _m.files[path]) << abs;
        } else if (op < 58) {  // unlink
            auto r = _vol->unlink(abs);
            if (_m.files.count(path)) {
                ASSERT_TRUE(r.has_value()) << abs << ": " << r.error().message;
                _m.files.erase(path);
                touched(path);
            } else {
                ASSERT_FALSE(r.has_value());
                EXPECT_EQ(r.error().code.value(), _m.dirs.count(path) ? EISDIR : ENOENT) << abs;
            }
        } else if (op < 68) {  // mkdir
            if (dir.size() > 60) {
                return;
            }
            auto r = _vol->mkdir(abs);
            if (_m.exists(path)) {
                ASSERT_FALSE(r.has_value());
                EXPECT_EQ(r.error().code.value(), EEXIST);
            } else if (!r && r.error().code.value() == ENOSPC) {
                return;
            } else {
                ASSERT_TRUE(r.has_value()) << abs << ": " << r.error().message;
                _m.dirs.insert(path);
            }
        } else if (op < 74) {  // rmdir
            if (!_m.dirs.count(path)) {
                return;
            }
            auto r = _vol->rmdir(abs);
            if (_m.dir_empty(path)) {
                ASSERT_TRUE(r.has_value()) << abs << ": " << r.error().message;
                _m.dirs.erase(path);
            } else {
                ASSERT_FALSE(r.has_value());
                EXPECT_EQ(r.error().code.value(), ENOTEMPTY);
            }
        } else if (op < 88) {  // rename across directories
            std::string to = join(pick(_rng, dirs), pick(_rng, k_names));
            rename(path, to);
        } else if (op < 96) {  // readdir
            if (!_m.dirs.count(dir)) {
                return;
            }
            auto list = _vol->readdir("/" + dir);
            ASSERT_TRUE(list.has_value()) << dir << ": " << list.error().message;
            std::set<std::string> got;
            for (auto& e : *list) {
                got.insert(join(dir, e.name));
                if (e.stat.is_directory) {
                    EXPECT_TRUE(_m.dirs.count(join(dir, e.name))) << e.name;
                } else {
                    EXPECT_EQ(e.stat.size, _m.files[join(dir, e.name)].size()) << e.name;
                }
            }
            std::set<std::string> want;
            for (auto& [p, _] : _m.files) {
                if (parent(p) == dir) {
                    want.insert(p);
                }
            }
            for (auto& p : _m.dirs) {
                if (!p.empty() && parent(p) == dir) {
                    want.insert(p);
                }
            }
            EXPECT_EQ(got, want) << "directory /" << dir;
        } else {  // sync
            ASSERT_TRUE(_vol->sync().has_value());
            _durable = _m.files;
        }
    }

    void check_all()
    {
        for (auto& [p, content] : _m.files) {
            ASSERT_EQ(read_all(*_vol, "/" + p), content) << p;
        }
        for (auto& d : _m.dirs) {
            auto st = _vol->stat("/" + d);
            ASSERT_TRUE(st.has_value() && st->is_directory) << d;
        }
    }

    // Drops the dirty cache as a power cut would, then checks that every
    // fsynced (and not modified since) file is intact.
    void crash_and_check(const std::string& image_path)
    {
        _vol->crash_for_testing();
        _vol.reset();
        save_image(_dev, image_path);
        auto r = run("fsck.fat -n " + quote(image_path));
        std::istringstream lines(r.output);
        std::string line;
        while (std::getline(lines, line)) {
            // A crash may leave the dirty bit set (and so the boot sector
            // differing from its backup in exactly that byte); nothing else.
            static const char* const k_allowed[] = {
                "fsck.fat ",
                "Dirty bit is set",
                "Automatically removing dirty bit",
                "Leaving filesystem unchanged",
                " files, ",
                "There are differences between boot sector and its backup",
                "This is mostly harmless. Differences: (offset:original/backup)",
                "  65:01/00",
                "Not automatically fixing this"};
            bool allowed = line.empty();
            for (const char* a : k_allowed) {
                allowed = allowed || line.find(a) != std::string::npos;
            }
            EXPECT_TRUE(allowed) << "fsck.fat after a crash: " << line << "\nfull output:\n"
                                 << r.output;
        }
        mount();
        for (auto& [p, content] : _durable) {
            ASSERT_EQ(read_all(*_vol, "/" + p), content) << "fsynced file lost or damaged: " << p;
        }
        // Continue from what is on disk.
        reload_model();
    }

    void reload_model()
    {
        _m = model{};
        _durable.clear();
        std::vector<std::string> todo = {""};
        while (!todo.empty()) {
            std::string d = todo.back();
            todo.pop_back();
            auto list = _vol->readdir("/" + d);
            ASSERT_TRUE(list.has_value());
            for (auto& e : *list) {
                std::string p = join(d, e.name);
                if (e.stat.is_directory) {
                    _m.dirs.insert(p);
                    todo.push_back(p);
                } else {
                    _m.files[p] = read_all(*_vol, "/" + p);
                }
            }
        }
    }

    volume& vol() { return *_vol; }
    void finish()
    {
        ASSERT_TRUE(_vol->unmount().has_value());
        _vol.reset();
    }

private:
    static std::string parent(const std::string& p)
    {
        size_t s = p.rfind('/');
        return s == std::string::npos ? "" : p.substr(0, s);
    }

    void touched(const std::string& path) { _durable.erase(path); }

    void rename(const std::string& from, const std::string& to)
    {
        auto r = _vol->rename("/" + from, "/" + to);
        bool from_dir = _m.dirs.count(from) != 0;
        bool from_file = _m.files.count(from) != 0;
        if (!from_dir && !from_file) {
            ASSERT_FALSE(r.has_value());
            EXPECT_EQ(r.error().code.value(), ENOENT);
            return;
        }
        if (from == to) {
            EXPECT_TRUE(r.has_value());
            return;
        }
        if (from_dir && (to.rfind(from + "/", 0) == 0)) {
            ASSERT_FALSE(r.has_value());
            EXPECT_EQ(r.error().code.value(), EINVAL);
            return;
        }
        int expect = 0;
        if (_m.dirs.count(to)) {
            expect = from_file ? EISDIR : (_m.dir_empty(to) ? 0 : ENOTEMPTY);
        } else if (_m.files.count(to)) {
            expect = from_dir ? ENOTDIR : 0;
        }
        if (!r && r.error().code.value() == ENOSPC) {
            return;
        }
        if (expect != 0) {
            ASSERT_FALSE(r.has_value()) << from << " -> " << to;
            EXPECT_EQ(r.error().code.value(), expect) << from << " -> " << to;
            return;
        }
        ASSERT_TRUE(r.has_value()) << from << " -> " << to << ": " << r.error().message;
        touched(from);
        touched(to);
        if (from_file) {
            _m.files[to] = _m.files[from];
            _m.files.erase(from);
            return;
        }
        _m.dirs.erase(to);
        std::map<std::string, std::string> files;
        for (auto& [p, c] : _m.files) {
            if (p.rfind(from + "/", 0) == 0) {
                files[to + p.substr(from.size())] = c;
                _durable.erase(p);
            } else {
                files[p] = c;
            }
        }
        _m.files = std::move(files);
        std::set<std::string> dirs;
        for (auto& p : _m.dirs) {
            dirs.insert(p == from || p.rfind(from + "/", 0) == 0 ? to + p.substr(from.size()) : p);
        }
        _m.dirs = std::move(dirs);
    }

    memory_block_device& _dev;
    std::mt19937_64 _rng;
    mount_options _opts;
    std::unique_ptr<volume> _vol;
    model _m;
    std::map<std::string, std::string> _durable;
};

class FatModel : public ::testing::TestWithParam<fat_type> {};

TEST_P(FatModel, RandomOperationsMatchTheModelAcrossRemounts)
{
    FAT_REQUIRE_TOOL("fsck.fat");
    uint64_t size = GetParam() == fat_type::fat12   ? 3u << 20
                    : GetParam() == fat_type::fat16 ? 12u << 20
                                                    : 36u << 20;
    auto dev = formatted(size, GetParam(), GetParam() == fat_type::fat32 ? 512 : 1024);
    ASSERT_TRUE(dev->bytes()[510] == 0x55);
    // Small caches and a low write-back limit exercise eviction and runs.
    mount_options o;
    o.meta_cache_sectors = 64;
    o.data_cache_sectors = 64;
    o.read_ahead_sectors = 8;
    o.meta_dirty_limit = 32;
    runner r(*dev, 1234 + static_cast<int>(GetParam()), o);
    for (int i = 0; i < 3000; ++i) {
        ASSERT_NO_FATAL_FAILURE(r.step()) << "step " << i;
        if (i % 250 == 249) {
            ASSERT_NO_FATAL_FAILURE(r.remount());
            ASSERT_NO_FATAL_FAILURE(r.check_all());
        }
    }
    r.finish();
    temp_dir tmp;
    save_image(*dev, tmp / "model.img");
    EXPECT_TRUE(fsck_clean(tmp / "model.img"));
}

TEST_P(FatModel, CrashesLoseNothingFsynced)
{
    FAT_REQUIRE_TOOL("fsck.fat");
    uint64_t size = GetParam() == fat_type::fat12   ? 3u << 20
                    : GetParam() == fat_type::fat16 ? 12u << 20
                                                    : 36u << 20;
    auto dev = formatted(size, GetParam(), GetParam() == fat_type::fat32 ? 512 : 2048);
    ASSERT_TRUE(dev->bytes()[510] == 0x55);
    temp_dir tmp;
    std::mt19937_64 rng(99 + static_cast<int>(GetParam()));
    mount_options o;
    o.meta_cache_sectors = 128;
    o.data_cache_sectors = 64;
    o.meta_dirty_limit = 48;
    runner r(*dev, 77 + static_cast<int>(GetParam()), o);
    for (int round = 0; round < 12; ++round) {
        int steps = static_cast<int>(rng() % 150);
        for (int i = 0; i < steps; ++i) {
            ASSERT_NO_FATAL_FAILURE(r.step()) << "round " << round << " step " << i;
        }
        ASSERT_NO_FATAL_FAILURE(r.crash_and_check(tmp / "crash.img")) << "round " << round;
    }
    r.finish();
    save_image(*dev, tmp / "final.img");
    EXPECT_TRUE(fsck_clean(tmp / "final.img"));
}

INSTANTIATE_TEST_SUITE_P(Types, FatModel,
                         ::testing::Values(fat_type::fat12, fat_type::fat16, fat_type::fat32),
                         [](const auto& case_info) {
                             return "FAT" + std::to_string(static_cast<int>(case_info.param));
                         });

}  // namespace
