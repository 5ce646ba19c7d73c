// libFuzzer target: the input is a disk image. Mount it (read-only or
// read-write by the low bit of the size), walk every directory, read every
// file, and on read-write mounts create, write, rename, truncate and delete.
// Any crash, hang, leak or huge allocation is a bug: corrupt images must
// give errors.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <softblk/fat/block_device.hpp>
#include <softblk/fat/volume.hpp>

using namespace softblk::fat;

namespace {

int g_budget = 0;

void walk(volume& v, const std::string& dir, int depth)
{
    if (depth > 6 || g_budget <= 0) {
        return;
    }
    auto list = v.readdir(dir);
    if (!list) {
        return;
    }
    for (auto& e : *list) {
        if (--g_budget <= 0) {
            return;
        }
        std::string path = dir == "/" ? "/" + e.name : dir + "/" + e.name;
        (void)v.stat(path);
        if (e.stat.is_directory) {
            walk(v, path, depth + 1);
            continue;
        }
        auto f = v.open(path, k_open_read);
        if (!f) {
            continue;
        }
        char buf[8192];
        for (uint64_t off = 0; off < (256u << 10); off += sizeof buf) {
            if (f->pread(buf, sizeof buf, off) <= 0) {
                break;
            }
        }
    }
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
    auto v = volume::mount(dev, o);
    if (!v) {
        return 0;
    }
    g_budget = 400;
    walk(**v, "/", 0);
    if (writable) {
        (void)(*v)->mkdir("/fuzz dir");
        if (auto f = (*v)->create("/fuzz dir/A Long File Name.bin"); f) {
            const char text[] = "fuzz";
            (void)f->pwrite(text, sizeof text, 0);
            (void)f->pwrite(text, sizeof text, 70000);
            (void)f->truncate(100);
        }
        (void)(*v)->rename("/fuzz dir", "/renamed");
        auto list = (*v)->readdir("/");
        if (list) {
            int n = 0;
            for (auto& e : *list) {
                if (n++ > 8) {
                    break;
                }
                if (e.stat.is_directory) {
                    (void)(*v)->rmdir("/" + e.name);
                } else {
                    (void)(*v)->unlink("/" + e.name);
                }
            }
        }
        (void)(*v)->sync();
    }
    (void)(*v)->unmount();
    return 0;
}
