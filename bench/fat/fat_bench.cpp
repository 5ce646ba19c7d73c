// softblk-bench-fat: FAT file system figures, through the library and
// through the FUSE mount, on a memory-backed softblk null device
// (memory_backed=1) or, where the core is not built in, the library's own
// memory device. mtools (mcopy in and out of an image in /dev/shm) and the
// Hermit unikernel's published figures are the peers.
//
// Usage: softblk-bench-fat [--volume-mib N] [--file-mib N] [--files N]
//                          [--random-ops N] [--no-fuse] [--no-mtools]
//                          [--device TYPE:KEY=VALUE,...] [--before]
//                          [--fuse-opt OPT]...
// --before adds the reference's "before" configuration (one sector per
// request, the smallest caches, no read-ahead: one_sector_device.hpp).
// --device runs the library on another softblk device type (e.g.
// virtio:path=SOCKET,poll_queues=0: through softblk's virtio-blk driver to
// a vhost-user-blk back end) instead of the memory-backed null device.
// --fuse-opt passes OPT to the FUSE mount (e.g. poll_us=0), once per flag.
// Prints a Markdown table (absolute figures and ratios) to stdout, with the
// bandwidth of one memcpy of the same buffers measured in the same run (the
// bound for a memory-backed device, which must copy the data at least once).
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <thread>
#include <tuple>
#include <unistd.h>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <softblk/fat/block_device.hpp>
#include <softblk/fat/volume.hpp>
#if defined(SOFTBLK_FAT_HAVE_DEVICE)
#include <softblk/fat/softblk_adapter.hpp>
#endif

#include "backends.hpp"
#include "fuse_mount.hpp"
#include "null_fuse.hpp"
#include "one_sector_device.hpp"

using namespace softblk::fat;
using namespace softblk::fat::bench;

namespace {

constexpr double k_mib = 1024.0 * 1024.0;

// Hermit's figures after its cache fixes (references/hermit-virtio-blk-fat-pr.txt).
constexpr double k_hermit_read_mibs = 320.4;
constexpr double k_hermit_write_mibs = 21.9;
constexpr double k_hermit_create_us = 201.0;

struct settings {
    uint64_t volume_mib = 512;
    uint64_t file_mib = 256;
    int files = 5000;
    int random_ops = 20000;
    bool fuse = true;
    bool mtools = true;
    std::string device;  // TYPE:KEY=VALUE,... (empty: null, memory_backed=1)
    bool before = false;
    std::vector<std::string> fuse_options;  // --fuse-opt, for the mount
};

struct figures {
    std::string name;
    double seq_write_mibs = 0;
    double seq_write_only_mibs = 0;  // the same writes through a write-only open
    // How a FUSE mount's writes reach it, which says what floor the
    // do-nothing file system measured for them: -o direct_io skips the page
    // cache for every open; by default a write-only open skips it and a
    // read-write one writes through it; -o writeback=1 caches both (no
    // floor: the do-nothing file system has no writeback cache).
    enum class write_path : uint8_t { direct, write_through, writeback };
    write_path writes = write_path::write_through;
    double seq_read_mibs = 0;
    double rand_read_iops = 0;
    double rand_write_iops = 0;
    double create_us = 0;
    double delete_us = 0;
    std::optional<double> write_requests_per_mib;
    std::optional<double> read_requests_per_mib;
    // Requests the softblk device's queues saw (execute() splits at
    // max_transfer_bytes), when the device is a softblk device.
    std::optional<double> device_write_requests_per_mib;
    std::optional<double> device_read_requests_per_mib;
    // One request to the FUSE server and its answer (statfs, which the
    // kernel never caches and the volume answers from memory).
    std::optional<double> round_trip_us;
    // The FUSE server thread's CPU time and its time waiting for a CPU
    // (runnable, not running: /proc/self/task/TID/schedstat) per create:
    // on a shared machine the wait, not the work, sets a create's time.
    std::optional<double> server_cpu_per_create_us;
    std::optional<double> server_wait_per_create_us;
};

// Requests submitted to a softblk device's queues so far (0 for other devices).
uint64_t device_submitted(block_device* dev)
{
#if defined(SOFTBLK_FAT_HAVE_DEVICE)
    if (auto* sd = dynamic_cast<softblk_block_device*>(dev)) {
        uint64_t n = 0;
        for (unsigned q = 0; q < sd->device().queue_count(); ++q) {
            n += sd->device().queue(q).stats().submitted;
        }
        return n;
    }
#endif
    (void)dev;
    return 0;
}

bool is_softblk_device(block_device* dev)
{
#if defined(SOFTBLK_FAT_HAVE_DEVICE)
    return dynamic_cast<softblk_block_device*>(dev) != nullptr;
#else
    (void)dev;
    return false;
#endif
}

figures run_suite(backend& b, const std::string& name, const settings& s)
{
    figures fig;
    fig.name = name;
    const uint64_t file_bytes = s.file_mib << 20;
    std::vector<char> buf(1 << 16);
    std::mt19937_64 rng(1);
    for (auto& c : buf) {
        c = static_cast<char>(rng());
    }
    auto counters = [&]() { return b.device() ? b.device()->counters() : request_counters{}; };

    // Sequential writes (16 KiB buffers, then fsync, counted in the time)
    // through a write-only open (as cp, dd and tar write; a FUSE mount
    // may then skip the page cache), then through a read-write one, and a
    // sequential read (64 KiB buffers, after a remount: cold metadata).
    // Each round does all three, so that both writes meet the same
    // machine. Best of three: the machine is shared, the best run is the
    // least disturbed one.
    // The file in 16 KiB writes, then fsync: MiB/s.
    auto write_sequentially = [&](int slot) {
        const auto t = clock_type::now();
        for (uint64_t off = 0; off < file_bytes; off += 16384) {
            if (b.pwrite(slot, buf.data() + (off & 0xC000), 16384, off) != 16384) {
                fmt::print(stderr, "{}: write failed at {}\n", name, off);
                std::exit(1);
            }
        }
        b.fsync(slot);
        return static_cast<double>(s.file_mib) / seconds_since(t);
    };
    int f = -1;
    for (int round = 0; round < 3; ++round) {
        if (round > 0) {
            b.unlink("/seq.bin");
        }
        const int w = b.create_write_only("/seq.bin");
        fig.seq_write_only_mibs = std::max(fig.seq_write_only_mibs, write_sequentially(w));
        b.close(w);
        b.unlink("/seq.bin");

        f = b.open_file("/seq.bin", true);
        auto c0 = counters();
        uint64_t d0 = device_submitted(b.device());
        fig.seq_write_mibs = std::max(fig.seq_write_mibs, write_sequentially(f));
        auto c1 = counters();
        if (b.device()) {
            fig.write_requests_per_mib = static_cast<double>(c1.writes - c0.writes + c1.flushes -
                                                             c0.flushes + c1.reads - c0.reads) /
                                         static_cast<double>(s.file_mib);
        }
        if (is_softblk_device(b.device())) {
            fig.device_write_requests_per_mib =
                static_cast<double>(device_submitted(b.device()) - d0) /
                static_cast<double>(s.file_mib);
        }
        b.close(f);
        b.remount();
        f = b.open_file("/seq.bin", false);
        c0 = counters();
        d0 = device_submitted(b.device());
        const auto t = clock_type::now();
        for (uint64_t off = 0; off < file_bytes; off += 65536) {
            if (b.pread(f, buf.data(), 65536, off) != 65536) {
                fmt::print(stderr, "{}: read failed at {}\n", name, off);
                std::exit(1);
            }
        }
        fig.seq_read_mibs =
            std::max(fig.seq_read_mibs, static_cast<double>(s.file_mib) / seconds_since(t));
        c1 = counters();
        if (b.device()) {
            fig.read_requests_per_mib =
                static_cast<double>(c1.reads - c0.reads) / static_cast<double>(s.file_mib);
        }
        if (is_softblk_device(b.device())) {
            fig.device_read_requests_per_mib =
                static_cast<double>(device_submitted(b.device()) - d0) /
                static_cast<double>(s.file_mib);
        }
        if (round < 2) {
            b.close(f);
        }
    }

    // 4 KiB random reads and writes, aligned, over the file, starting with
    // nothing of it in the page cache (a mount point's cache would still
    // hold the sequential read).
    b.drop_cache(f);
    uint64_t blocks = file_bytes / 4096;
    auto t = clock_type::now();
    for (int i = 0; i < s.random_ops; ++i) {
        b.pread(f, buf.data(), 4096, (rng() % blocks) * 4096);
    }
    fig.rand_read_iops = s.random_ops / seconds_since(t);
    t = clock_type::now();
    for (int i = 0; i < s.random_ops; ++i) {
        b.pwrite(f, buf.data(), 4096, (rng() % blocks) * 4096);
    }
    b.fsync(f);
    fig.rand_write_iops = s.random_ops / seconds_since(t);
    b.close(f);

    // File creation and deletion in one directory (8.3 names, empty files).
    fig.round_trip_us = b.round_trip_us(s.files);
    b.mkdir("/many");
    const auto server0 = b.server_times();
    t = clock_type::now();
    for (int i = 0; i < s.files; ++i) {
        if (!b.create_empty(fmt::format("/many/f{:06d}.dat", i))) {
            fmt::print(stderr, "{}: create {} failed\n", name, i);
            std::exit(1);
        }
    }
    fig.create_us = seconds_since(t) * 1e6 / s.files;
    if (auto server1 = b.server_times(); server0 && server1) {
        fig.server_cpu_per_create_us =
            static_cast<double>(server1->cpu_ns - server0->cpu_ns) / 1e3 / s.files;
        fig.server_wait_per_create_us =
            static_cast<double>(server1->wait_ns - server0->wait_ns) / 1e3 / s.files;
    }
    t = clock_type::now();
    for (int i = 0; i < s.files; ++i) {
        b.unlink(fmt::format("/many/f{:06d}.dat", i));
    }
    fig.delete_us = seconds_since(t) * 1e6 / s.files;
    b.unlink("/seq.bin");
    return fig;
}

std::unique_ptr<block_device> make_device(const settings& s, std::string& label)
{
#if defined(SOFTBLK_FAT_HAVE_DEVICE)
    if (!s.device.empty()) {
        const size_t colon = s.device.find(':');
        std::vector<std::string> opts;
        std::string list = colon == std::string::npos ? "" : s.device.substr(colon + 1);
        for (size_t at = 0; at < list.size();) {
            size_t comma = list.find(',', at);
            if (comma == std::string::npos) {
                comma = list.size();
            }
            opts.push_back(list.substr(at, comma - at));
            at = comma + 1;
        }
        auto dev = softblk_block_device::create("fatbench", s.device.substr(0, colon), opts);
        if (!dev) {
            fmt::print(stderr, "--device {}: {}\n", s.device, dev.error().message);
            std::exit(1);
        }
        label = "softblk " + s.device;
        return std::move(*dev);
    }
    std::vector<std::string> opts = {"memory_backed=1", fmt::format("size={}", s.volume_mib),
                                     "bs=512", "irqmode=0"};
    auto dev = softblk_block_device::create("fatbench", "null", opts);
    if (dev) {
        label = "softblk null, memory_backed=1";
        return std::move(*dev);
    }
    fmt::print(stderr, "softblk null device unavailable ({}); using the library's memory device\n",
               dev.error().message);
#endif
    label = "fat::memory_block_device";
    return std::make_unique<memory_block_device>(s.volume_mib << 20);
}

void format_or_die(block_device& dev)
{
    auto r = format(dev);
    if (!r) {
        fmt::print(stderr, "mkfs: {}\n", r.error().message);
        std::exit(1);
    }
}

int shell(const std::string& cmd)
{
    return std::system(cmd.c_str());
}

// Volumes that fsck.fat did not accept (the exit status fails then).
std::vector<std::string> g_unclean;

// Runs `fsck.fat -n` on an image file and records the verdict.
void fsck_image(const std::string& image, const std::string& what)
{
    if (shell("command -v fsck.fat >/dev/null 2>&1") != 0) {
        fmt::print(stderr, "fsck.fat is not installed: the {} volume is not checked\n", what);
        return;
    }
    if (shell("fsck.fat -n " + image + " >/dev/null 2>&1") != 0) {
        g_unclean.push_back(what);
        shell("fsck.fat -n " + image + " >&2");
    }
}

// Copies an unmounted volume's device into a sparse file in /dev/shm and
// checks it with fsck.fat: every benchmark must leave a volume it accepts.
void fsck_device(block_device& dev, const std::string& what)
{
    char name[] = "/dev/shm/softblk-fat-bench-fsck-XXXXXX";
    int fd = mkstemp(name);
    if (fd < 0) {
        fmt::print(stderr, "{}: no room for a copy to check ({})\n", what, std::strerror(errno));
        g_unclean.push_back(what + " (not checked)");
        return;
    }
    const uint32_t ss = dev.sector_size();
    const uint32_t chunk = (1u << 20) / ss;
    std::vector<char> buf(static_cast<size_t>(chunk) * ss);
    bool ok = true;
    for (uint64_t lba = 0; lba < dev.sector_count() && ok; lba += chunk) {
        uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(chunk, dev.sector_count() - lba));
        size_t bytes = static_cast<size_t>(n) * ss;
        ok = dev.read(lba, n, buf.data()) == 0;
        if (ok && std::any_of(buf.begin(), buf.begin() + static_cast<long>(bytes),
                              [](char c) { return c != 0; })) {
            ok = ::pwrite(fd, buf.data(), bytes, static_cast<off_t>(lba * ss)) ==
                 static_cast<ssize_t>(bytes);
        }
    }
    ok = ok && ::ftruncate(fd, static_cast<off_t>(dev.sector_count() * ss)) == 0;
    ::close(fd);
    if (ok) {
        fsck_image(name, what);
    } else {
        g_unclean.push_back(what + " (could not be copied)");
    }
    ::unlink(name);
}

std::optional<figures> run_fuse(const settings& s, std::string& label, bool direct_io)
{
    if (access("/dev/fuse", R_OK | W_OK) != 0) {
        return std::nullopt;
    }
    auto dev = make_device(s, label);
    format_or_die(*dev);
    auto v = volume::mount(*dev);
    if (!v) {
        return std::nullopt;
    }
    char tmpl[] = "/tmp/softblk-fat-bench-XXXXXX";
    std::string mnt = mkdtemp(tmpl);
    volume& vol = **v;
    std::vector<std::string> fuse_options = s.fuse_options;
    if (direct_io) {
        fuse_options.push_back("direct_io");
    }
    std::atomic<pid_t> server_tid{0};
    std::thread server([&] {
        server_tid = ::gettid();
        softblk::fat::detail::serve_fuse(vol, mnt, true, false, fuse_options);
    });
    struct stat root {};
    struct stat parent {};
    for (int i = 0; i < 100; ++i) {
        ::stat(mnt.c_str(), &root);
        ::stat("/tmp", &parent);
        if (root.st_dev != parent.st_dev) {
            break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (root.st_dev == parent.st_dev) {
        fmt::print(stderr, "the FUSE mount at {} did not come up; skipping the FUSE figures\n",
                   mnt);
        server.join();
        rmdir(mnt.c_str());
        return std::nullopt;
    }
    posix_backend b(mnt, dev.get(), server_tid.load());
    // The name says the options the mount had: "default options" only when
    // neither --fuse-opt nor direct_io gave any.
    const std::string name = fuse_options.empty()
                                 ? std::string("FUSE mount (default options)")
                                 : fmt::format("FUSE mount, -o {}", fmt::join(fuse_options, ","));
    figures fig = run_suite(b, name, s);
    auto given = [&](const char* option) {
        return std::find(fuse_options.begin(), fuse_options.end(), option) != fuse_options.end();
    };
    fig.writes = given("direct_io")     ? figures::write_path::direct
                 : given("writeback=1") ? figures::write_path::writeback
                                        : figures::write_path::write_through;
    shell("fusermount3 -u " + mnt);
    server.join();
    (void)vol.unmount();
    v->reset();
    rmdir(mnt.c_str());
    fsck_device(*dev, fig.name);
    return fig;
}

struct mtools_figures {
    double in_mibs = 0;
    double out_mibs = 0;
    double create_us = 0;
};

std::optional<mtools_figures> run_mtools(const settings& s)
{
    if (shell("command -v mcopy >/dev/null 2>&1") != 0) {
        return std::nullopt;
    }
    std::string dir = "/dev/shm/softblk-fat-bench";
    shell("rm -rf " + dir + " && mkdir -p " + dir + "/small");
    std::string img = dir + "/fat.img";
    {
        auto dev = file_block_device::create(img, s.volume_mib << 20);
        if (!dev) {
            return std::nullopt;
        }
        format_or_die(**dev);
    }
    shell(fmt::format("head -c {} /dev/urandom > {}/src.bin", s.file_mib << 20, dir));
    mtools_figures m;
    auto t = clock_type::now();
    for (int round = 0; round < 3; ++round) {  // best of three, as for the library
        shell(fmt::format("mdel -i {} ::/big.bin >/dev/null 2>&1", img));
        t = clock_type::now();
        shell(fmt::format("mcopy -i {} {}/src.bin ::/big.bin", img, dir));
        m.in_mibs = std::max(m.in_mibs, static_cast<double>(s.file_mib) / seconds_since(t));
        t = clock_type::now();
        shell(fmt::format("mcopy -n -i {} ::/big.bin {}/out.bin", img, dir));
        m.out_mibs = std::max(m.out_mibs, static_cast<double>(s.file_mib) / seconds_since(t));
    }
    int n = std::min(s.files, 2000);
    shell(fmt::format("cd {}/small && for i in $(seq -f %06g 1 {}); do : > f$i.dat; done", dir, n));
    shell(fmt::format("mmd -i {} ::/many", img));
    t = clock_type::now();
    shell(fmt::format("mcopy -i {} {}/small/* ::/many/", img, dir));
    m.create_us = seconds_since(t) * 1e6 / n;
    fsck_image(img, "mtools");
    shell("rm -rf " + dir);
    return m;
}

std::string opt(const std::optional<double>& v)
{
    return v ? fmt::format("{:.1f}", *v) : "n/a";
}

// What one copy of the data costs on this machine, with the benchmark's
// sizes: 16 KiB copies from a hot 64 KiB source into a file-sized
// destination (a memory-backed device must copy written data at least once
// into its store), and 64 KiB copies from a file-sized source into a hot
// 64 KiB buffer (reads copy out of the store at least once). Best of three;
// the destination is touched first so that page faults are not counted.
struct copy_bound {
    double write_mibs = 0;
    double read_mibs = 0;
};

copy_bound measure_memcpy(const settings& s)
{
    const uint64_t bytes = s.file_mib << 20;
    std::vector<char> big(bytes);
    std::memset(big.data(), 1, bytes);
    std::vector<char> small(1 << 16, 2);
    copy_bound b;
    for (int round = 0; round < 3; ++round) {
        auto t = clock_type::now();
        for (uint64_t off = 0; off < bytes; off += 16384) {
            std::memcpy(big.data() + off, small.data() + (off & 0xC000), 16384);
        }
        asm volatile("" : : "r"(big.data()) : "memory");
        b.write_mibs = std::max(b.write_mibs, static_cast<double>(s.file_mib) / seconds_since(t));
        t = clock_type::now();
        for (uint64_t off = 0; off < bytes; off += 65536) {
            std::memcpy(small.data(), big.data() + off, 65536);
            asm volatile("" : : "r"(small.data()) : "memory");
        }
        b.read_mibs = std::max(b.read_mibs, static_cast<double>(s.file_mib) / seconds_since(t));
    }
    return b;
}

}  // namespace

int main(int argc, char** argv)
{
    settings s;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto next = [&]() -> uint64_t { return i + 1 < argc ? std::stoull(argv[++i]) : 0; };
        if (a == "--volume-mib") {
            s.volume_mib = next();
        } else if (a == "--file-mib") {
            s.file_mib = next();
        } else if (a == "--files") {
            s.files = static_cast<int>(next());
        } else if (a == "--random-ops") {
            s.random_ops = static_cast<int>(next());
        } else if (a == "--no-fuse") {
            s.fuse = false;
        } else if (a == "--no-mtools") {
            s.mtools = false;
        } else if (a == "--device" && i + 1 < argc) {
            s.device = argv[++i];
        } else if (a == "--before") {
            s.before = true;
        } else if (a == "--fuse-opt" && i + 1 < argc) {
            s.fuse_options.emplace_back(argv[++i]);
        } else {
            fmt::print(stderr,
                       "usage: {} [--volume-mib N] [--file-mib N] [--files N] [--random-ops N] "
                       "[--no-fuse] [--no-mtools] [--device TYPE:KEY=VALUE,...] [--before] "
                       "[--fuse-opt OPT]...\n",
                       argv[0]);
            return 2;
        }
    }
    std::vector<figures> rows;
    std::string lib_label;
    std::string layout;
    const copy_bound bound = measure_memcpy(s);
    {
        auto dev = make_device(s, lib_label);
        format_or_die(*dev);
        library_backend b(*dev);
        layout = b.describe();
        rows.push_back(run_suite(b, "library", s));
        b.unmount();
        fsck_device(*dev, "library");
    }
    {
        // The same device with sequential writes gathered into 1 MiB
        // requests (one more copy, 64 times fewer requests): the trade-off
        // that files and remote devices choose by default.
        std::string label;
        auto dev = make_device(s, label);
        format_or_die(*dev);
        mount_options o;
        o.write_behind_bytes = 1u << 20;
        library_backend b(*dev, o);
        rows.push_back(run_suite(b, "library, 1 MiB write-behind", s));
        b.unmount();
        fsck_device(*dev, "library, 1 MiB write-behind");
    }
    if (s.before) {
        std::string label;
        auto dev = make_device(s, label);
        format_or_die(*dev);
        one_sector_device one(*dev);
        library_backend b(one, before_options(), dev.get());
        rows.push_back(
            run_suite(b, "library, before (one sector per request, smallest caches)", s));
        b.unmount();
        fsck_device(*dev, "library, before");
    }
    if (lib_label != "fat::memory_block_device") {
        memory_block_device dev(s.volume_mib << 20);
        format_or_die(dev);
        library_backend b(dev);
        rows.push_back(run_suite(b, "library (fat::memory_block_device)", s));
        b.unmount();
        fsck_device(dev, "library (fat::memory_block_device)");
    }
    std::string fuse_label;
    if (s.fuse) {
        for (bool direct_io : {false, true}) {
            if (auto f = run_fuse(s, fuse_label, direct_io)) {
                rows.push_back(*f);
            }
        }
    }
    // The floor under any FUSE create here: a file system that does nothing.
    std::optional<softblk::fat::bench::null_fuse_figures> null_fuse;
    if (s.fuse) {
        std::string poll_us = "auto";  // the mount's defaults, or what --fuse-opt says
        std::string colocate = "auto";
        for (auto& o : s.fuse_options) {
            if (o.rfind("poll_us=", 0) == 0) {
                poll_us = o.substr(8);
            }
            if (o.rfind("colocate=", 0) == 0) {
                colocate = o.substr(9);
            }
        }
        null_fuse =
            softblk::fat::bench::measure_null_fuse(s.files, s.file_mib << 20, poll_us, colocate);
    }
    std::optional<mtools_figures> m;
    if (s.mtools) {
        m = run_mtools(s);
    }

    fmt::print(
        "Volume of {} MiB formatted as mkfs.fat would ({}), file of {} MiB, {} files, {} random 4 "
        "KiB ops.\n",
        s.volume_mib, layout, s.file_mib, s.files, s.random_ops);
    fmt::print("library device: {}; FUSE device: {}\n\n", lib_label,
               fuse_label.empty() ? "-" : fuse_label);
    fmt::print(
        "| path | seq write 16 KiB (MiB/s) | seq read 64 KiB (MiB/s) | 4 KiB rand read (IOPS) | "
        "4 KiB rand write (IOPS) | create (us/file) | delete (us/file) | requests/MiB write | "
        "requests/MiB read | seq write 16 KiB, write-only open (MiB/s) |\n");
    fmt::print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (auto& r : rows) {
        fmt::print(
            "| {} | {:.1f} | {:.1f} | {:.0f} | {:.0f} | {:.2f} | {:.2f} | {} | {} | {:.1f} |\n",
            r.name, r.seq_write_mibs, r.seq_read_mibs, r.rand_read_iops, r.rand_write_iops,
            r.create_us, r.delete_us, opt(r.write_requests_per_mib), opt(r.read_requests_per_mib),
            r.seq_write_only_mibs);
    }
    // mcopy has one way to write a file onto the volume: its figure stands
    // against both of the mount's.
    if (m) {
        fmt::print(
            "| mtools (mcopy in / out, image in /dev/shm) | {:.1f} | {:.1f} | - | - | {:.2f} | - | "
            "- | - | {:.1f} |\n",
            m->in_mibs, m->out_mibs, m->create_us, m->in_mibs);
    }
    fmt::print(
        "| Hermit after its fixes (published) | {:.1f} | {:.1f} | - | - | {:.0f} | - | - | - | - "
        "|\n",
        k_hermit_write_mibs, k_hermit_read_mibs, k_hermit_create_us);
    fmt::print(
        "| memcpy, one copy of the same buffers (bound) | {:.1f} | {:.1f} | - | - | - | - | - | - "
        "| {:.1f} |\n\n",
        bound.write_mibs, bound.read_mibs, bound.write_mibs);
    for (auto& r : rows) {
        if (r.device_write_requests_per_mib) {
            fmt::print(
                "{}: requests the softblk device's queues saw (execute() splits at "
                "max_transfer_bytes): "
                "{:.1f}/MiB written, {:.1f}/MiB read\n",
                r.name, *r.device_write_requests_per_mib,
                r.device_read_requests_per_mib.value_or(0));
        }
    }
    for (auto& r : rows) {
        if (r.round_trip_us) {
            // The goal for a create through the mount: within twice the
            // library's own create plus one FUSE round trip.
            fmt::print(
                "{}: one FUSE round trip (statfs) {:.2f} us; create {:.2f} us against "
                "2 x (library create + round trip) = {:.2f} us\n",
                r.name, *r.round_trip_us, r.create_us,
                2 * (rows.front().create_us + *r.round_trip_us));
            if (r.server_cpu_per_create_us && r.server_wait_per_create_us) {
                fmt::print(
                    "{}: per create, the FUSE server thread ran {:.2f} us and waited {:.2f} us "
                    "for a CPU\n",
                    r.name, *r.server_cpu_per_create_us, *r.server_wait_per_create_us);
            }
        }
    }
    if (null_fuse) {
        fmt::print(
            "do-nothing FUSE file system (low-level libfuse, the mount's loop): create {:.2f} us, "
            "statfs {:.2f} us, 16 KiB write (write-only open) {:.2f} us, (read-write open) "
            "{:.2f} us\n",
            null_fuse->create_us, null_fuse->statfs_us, null_fuse->write_16k_us,
            null_fuse->write_16k_rw_us);
        // What a 16 KiB write through any FUSE mount here costs at least:
        // the do-nothing file system's write and one copy of the data into
        // the volume's store.
        auto us_per_16k = [](double mibs) { return 16384.0 / (mibs * 1048576.0) * 1e6; };
        const double copy_us = us_per_16k(bound.write_mibs);
        for (auto& r : rows) {
            if (r.round_trip_us) {
                fmt::print("{}: create {:.2f}x the do-nothing file system's\n", r.name,
                           r.create_us / null_fuse->create_us);
                const std::string mtools =
                    m ? fmt::format("; mtools {:.2f} us", us_per_16k(m->in_mibs)) : std::string();
                if (r.writes == figures::write_path::writeback) {
                    fmt::print(
                        "{}: 16 KiB write (write-only open) {:.2f} us, (read-write open) {:.2f} "
                        "us, both through the writeback cache (no floor measured){}\n",
                        r.name, us_per_16k(r.seq_write_only_mibs), us_per_16k(r.seq_write_mibs),
                        mtools);
                    continue;
                }
                const double rw_floor_us = r.writes == figures::write_path::write_through
                                               ? null_fuse->write_16k_rw_us
                                               : null_fuse->write_16k_us;
                for (const auto& [open, mibs, floor_us] :
                     {std::tuple{"write-only", r.seq_write_only_mibs, null_fuse->write_16k_us},
                      std::tuple{"read-write", r.seq_write_mibs, rw_floor_us}}) {
                    fmt::print(
                        "{}: 16 KiB write ({} open) {:.2f} us against the do-nothing file "
                        "system's {:.2f} us + one copy {:.2f} us = {:.2f} us{}\n",
                        r.name, open, us_per_16k(mibs), floor_us, copy_us, floor_us + copy_us,
                        mtools);
                }
            }
        }
    }
    fmt::print("Library vs one memcpy of the same data: write {:.0f}%, read {:.0f}%\n",
               100.0 * rows.front().seq_write_mibs / bound.write_mibs,
               100.0 * rows.front().seq_read_mibs / bound.read_mibs);
    const figures& lib = rows.front();
    fmt::print("Ratios, library vs Hermit: write {:.1f}x, read {:.1f}x, create {:.1f}x faster\n",
               lib.seq_write_mibs / k_hermit_write_mibs, lib.seq_read_mibs / k_hermit_read_mibs,
               k_hermit_create_us / lib.create_us);
    if (m) {
        fmt::print("Ratios, library vs mtools: write {:.1f}x, read {:.1f}x, create {:.1f}x\n",
                   lib.seq_write_mibs / m->in_mibs, lib.seq_read_mibs / m->out_mibs,
                   m->create_us / lib.create_us);
        for (auto& r : rows) {
            if (r.name.rfind("FUSE", 0) == 0) {
                fmt::print(
                    "Ratios, {} vs mtools: write {:.1f}x (write-only open {:.1f}x), read {:.1f}x, "
                    "create {:.1f}x\n",
                    r.name, r.seq_write_mibs / m->in_mibs, r.seq_write_only_mibs / m->in_mibs,
                    r.seq_read_mibs / m->out_mibs, m->create_us / r.create_us);
            }
        }
        fmt::print(
            "mtools vs one memcpy: write {:.0f}%, read {:.0f}%; 10x mtools would be {:.0f} MiB/s "
            "written, "
            "{:.1f}x the one-copy bound\n",
            100.0 * m->in_mibs / bound.write_mibs, 100.0 * m->out_mibs / bound.read_mibs,
            10 * m->in_mibs, 10 * m->in_mibs / bound.write_mibs);
    }
    fmt::print(
        "Targets: >= 10x mtools, >= 1024 MiB/s sequential read, < 20 us per create: read {}, "
        "create {}\n",
        lib.seq_read_mibs >= 1024 ? "met" : "NOT met", lib.create_us < 20 ? "met" : "NOT met");
    if (!g_unclean.empty()) {
        for (auto& what : g_unclean) {
            fmt::print("fsck.fat -n did not accept the {} volume\n", what);
        }
        return 1;
    }
    fmt::print("fsck.fat -n accepted every volume\n");
    return 0;
}
