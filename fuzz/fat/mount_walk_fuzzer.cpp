// libFuzzer target: the input is a disk image. Mount it (read-only or
// read-write by the low bit of the size) and walk it as `ls -R` and
// `cp -r` do: every directory (fat::walk, which must end on cycles and
// cross-linked directories), every entry stat'ed by its path, every file
// read to its end; a second walk starts below the root. Read-write mounts
// then create, write, rename, truncate and delete, and remove the first
// subdirectory's tree as `rm -r` does. Any crash, hang, leak or huge
// allocation is a bug: corrupt images must give errors.
#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <softblk/fat/block_device.hpp>
#include <softblk/fat/volume.hpp>
#include <softblk/fat/walk.hpp>

using namespace softblk::fat;

namespace {

// Work per input. A hostile image can give thousands of files one long
// chain, or list the same clusters under many directories: cp -r of it
// would copy all of that, and a fuzzer input must stay quick.
constexpr uint64_t k_read_budget = 16u << 20;
constexpr uint64_t k_entry_budget = 20000;

std::string join(const std::string& dir, const std::string& name)
{
    return dir == "/" ? "/" + name : dir + "/" + name;
}

// A walk that visits every entry of every directory, up to k_entry_budget
// entries.
class budgeted_walk : public walk_visitor {
public:
    explicit budgeted_walk(volume& v) : _v(v) {}

    softblk::result<void> enter(const std::string& path,
                                const std::vector<dir_entry>& entries) override
    {
        for (const auto& e : entries) {
            if (_entries_left == 0) {
                return softblk::make_error(E2BIG, "fuzz budget spent");  // stops the walk
            }
            --_entries_left;
            visit(join(path, e.name), e);
        }
        return {};
    }
    void skipped(const std::string&, const softblk::error&) override {}

protected:
    virtual void visit(const std::string& path, const dir_entry& e) = 0;

    volume& _v;

private:
    uint64_t _entries_left = k_entry_budget;
};

// ls -R and cp -r: stat every entry, read every file.
class reader final : public budgeted_walk {
public:
    using budgeted_walk::budgeted_walk;

private:
    void visit(const std::string& path, const dir_entry& e) override
    {
        (void)_v.stat(path);
        if (e.stat.is_directory) {
            return;
        }
        auto f = _v.open(path, k_open_read);
        if (!f) {
            return;
        }
        static char buf[64 * 1024];
        for (uint64_t off = 0; _bytes_left > 0;) {
            int64_t n = f->pread(buf, sizeof buf, off);
            if (n <= 0) {
                break;
            }
            off += static_cast<uint64_t>(n);
            _bytes_left -= std::min<uint64_t>(_bytes_left, static_cast<uint64_t>(n));
        }
    }

    uint64_t _bytes_left = k_read_budget;
};

// rm -r: files when a directory is entered, the directory when left.
class remover final : public budgeted_walk {
public:
    using budgeted_walk::budgeted_walk;

    softblk::result<void> leave(const std::string& path) override
    {
        (void)_v.rmdir(path);
        return {};
    }

private:
    void visit(const std::string& path, const dir_entry& e) override
    {
        if (!e.stat.is_directory) {
            (void)_v.unlink(path);
        }
    }
};

// The first subdirectory of the root, or "".
std::string first_subdirectory(volume& v)
{
    auto list = v.readdir("/");
    if (list) {
        for (const auto& e : *list) {
            if (e.stat.is_directory) {
                return "/" + e.name;
            }
        }
    }
    return {};
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size)
{
    if (size < 512 || size > (8u << 20)) {
        return 0;
    }
    std::vector<uint8_t> image(data, data + size);
    image.resize((size + 511) / 512 * 512, 0);
    memory_block_device dev(std::move(image));
    bool writable = (size & 1) != 0;
    mount_options o;
    o.read_only = !writable;
    o.meta_cache_sectors = 64;
    o.data_cache_sectors = 64;
    auto mounted = volume::mount(dev, o);
    if (!mounted) {
        return 0;
    }
    volume& v = **mounted;
    {
        reader all(v);
        (void)walk(v, "/", all);
    }
    std::string sub = first_subdirectory(v);
    if (!sub.empty()) {
        reader below(v);
        (void)walk(v, sub, below);
    }
    if (writable) {
        (void)v.mkdir("/fuzz dir");
        if (auto f = v.create("/fuzz dir/A Long File Name.bin"); f) {
            const char text[] = "fuzz";
            (void)f->pwrite(text, sizeof text, 0);
            (void)f->pwrite(text, sizeof text, 70000);
            (void)f->truncate(100);
        }
        (void)v.rename("/fuzz dir", "/renamed");
        auto list = v.readdir("/");
        if (list) {
            int n = 0;
            for (auto& e : *list) {
                if (n++ > 8) {
                    break;
                }
                if (e.stat.is_directory) {
                    (void)v.rmdir("/" + e.name);
                } else {
                    (void)v.unlink("/" + e.name);
                }
            }
        }
        std::string tree = first_subdirectory(v);
        if (!tree.empty()) {
            remover rm(v);
            (void)walk(v, tree, rm);
        }
        (void)v.sync();
    }
    (void)v.unmount();
    return 0;
}
