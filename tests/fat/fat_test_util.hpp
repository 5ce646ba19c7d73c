// Helpers for the FAT tests: temporary directories, running host tools
// (fsck.fat, mtools), saving memory images.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <random>
#include <sstream>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <softblk/fat/block_device.hpp>
#include <softblk/fat/volume.hpp>

namespace fat_test {

namespace fs = std::filesystem;
using namespace softblk::fat;

inline bool have_tool(const std::string& name)
{
    for (const char* dir : {"/usr/sbin/", "/usr/bin/", "/sbin/", "/bin/", "/usr/local/bin/"}) {
        if (access((std::string(dir) + name).c_str(), X_OK) == 0) {
            return true;
        }
    }
    return false;
}

#define FAT_REQUIRE_TOOL(name)                                                           \
    do {                                                                                 \
        if (!::fat_test::have_tool(name)) {                                              \
            GTEST_SKIP() << "SKIP: " << name << " is not installed (apt-get install "    \
                         << (std::string(name).find("fsck") != std::string::npos ||      \
                                     std::string(name).find("mkfs") != std::string::npos \
                                 ? "dosfstools"                                          \
                                 : "mtools")                                             \
                         << ")";                                                         \
        }                                                                                \
    } while (0)

struct command_result {
    int status = -1;
    std::string output;
};

// Runs a shell command, capturing stdout+stderr.
inline command_result run(const std::string& cmd)
{
    command_result r;
    FILE* p = popen((cmd + " 2>&1").c_str(), "r");
    if (p == nullptr) {
        return r;
    }
    char buf[4096];
    size_t n = 0;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) {
        r.output.append(buf, n);
    }
    int st = pclose(p);
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return r;
}

inline std::string quote(const std::string& s)
{
    return "'" + s + "'";
}

class temp_dir {
public:
    temp_dir()
    {
        std::string tmpl = (fs::temp_directory_path() / "softblk-fat-XXXXXX").string();
        char* p = mkdtemp(tmpl.data());
        _path = p != nullptr ? p : tmpl;
    }
    ~temp_dir()
    {
        std::error_code ec;
        fs::remove_all(_path, ec);
    }
    const std::string& path() const { return _path; }
    std::string operator/(const std::string& name) const { return _path + "/" + name; }

private:
    std::string _path;
};

inline void save_image(const memory_block_device& dev, const std::string& path)
{
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(dev.bytes().data()),
              static_cast<std::streamsize>(dev.bytes().size()));
}

inline std::vector<uint8_t> load_file(const std::string& path)
{
    std::ifstream in(path, std::ios::binary);
    return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
}

inline void write_file(const std::string& path, const std::string& data)
{
    std::ofstream out(path, std::ios::binary);
    out.write(data.data(), static_cast<std::streamsize>(data.size()));
}

// fsck.fat -n on an image file: exit 0 and no complaint.
inline ::testing::AssertionResult fsck_clean(const std::string& image)
{
    auto r = run("fsck.fat -n " + quote(image));
    if (r.status != 0) {
        return ::testing::AssertionFailure() << "fsck.fat -n exit " << r.status << ":\n"
                                             << r.output;
    }
    return ::testing::AssertionSuccess();
}

inline std::string random_bytes(std::mt19937_64& rng, size_t n)
{
    std::string s(n, '\0');
    for (size_t i = 0; i < n; ++i) {
        s[i] = static_cast<char>(rng() & 0xFF);
    }
    return s;
}

// Reads a whole file through the library.
inline std::string read_all(volume& v, const std::string& path)
{
    auto f = v.open(path, k_open_read);
    EXPECT_TRUE(f.has_value()) << path << ": " << (f ? "" : f.error().message);
    if (!f) {
        return {};
    }
    std::string out;
    std::string buf(1 << 16, '\0');
    uint64_t off = 0;
    for (;;) {
        int64_t n = f->pread(buf.data(), buf.size(), off);
        EXPECT_GE(n, 0) << path;
        if (n <= 0) {
            break;
        }
        out.append(buf.data(), static_cast<size_t>(n));
        off += static_cast<uint64_t>(n);
    }
    return out;
}

inline void write_all(volume& v, const std::string& path, const std::string& data)
{
    auto f = v.create(path);
    ASSERT_TRUE(f.has_value()) << path << ": " << f.error().message;
    ASSERT_EQ(f->pwrite(data.data(), data.size(), 0), static_cast<int64_t>(data.size())) << path;
}

inline std::unique_ptr<memory_block_device> formatted(uint64_t bytes, std::optional<fat_type> type,
                                                      uint32_t cluster = 0)
{
    auto dev = std::make_unique<memory_block_device>(bytes);
    format_options o;
    o.type = type;
    o.cluster_size = cluster;
    auto r = format(*dev, o);
    EXPECT_TRUE(r.has_value()) << (r ? "" : r.error().message);
    return dev;
}

}  // namespace fat_test
