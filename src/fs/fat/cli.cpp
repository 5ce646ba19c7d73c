// `softblk fat`: mkfs, ls, cat, cp, mkdir, rm, mv, stat, df, mount.
//
// The first argument of every subcommand is the target: an image file (or
// block device node), `softblk:NAME` for a device of the softblk daemon
// (reached through its export), or `softblk:<type>:<key=value,...>` for a
// fresh in-process softblk device (useful with `mount --mkfs`). Paths inside the
// image are written `::/path` where they could be confused with host paths
// (cp); elsewhere a plain path is inside the image.
#include <softblk/fat/cli.hpp>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fcntl.h>
#include <filesystem>
#include <stdexcept>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <softblk/fat/block_device.hpp>
#include <softblk/fat/volume.hpp>
#if defined(SOFTBLK_FAT_HAVE_DEVICE)
#include <softblk/fat/softblk_adapter.hpp>
#endif
#if defined(SOFTBLK_FAT_HAVE_NBD)
#include <softblk/fat/nbd_adapter.hpp>
#endif
#if defined(SOFTBLK_FAT_HAVE_DAEMON)
#include <nlohmann/json.hpp>

#include "client.hpp"
#include "run_dir.hpp"
#endif

#include "fuse_mount.hpp"

namespace softblk::fat {

namespace {

struct cli_error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

template <class T>
T check(result<T> r)
{
    if (!r) {
        throw cli_error(r.error().message);
    }
    return std::move(*r);
}

void check(result<void> r)
{
    if (!r) {
        throw cli_error(r.error().message);
    }
}

uint64_t parse_size(const std::string& text)
{
    size_t pos = 0;
    uint64_t value = std::stoull(text, &pos);
    std::string unit = text.substr(pos);
    uint64_t mult = 1;
    if (unit == "" || unit == "B" || unit == "b") {
        mult = 1;
    } else if (unit == "K" || unit == "k" || unit == "KiB") {
        mult = 1ull << 10;
    } else if (unit == "M" || unit == "m" || unit == "MiB") {
        mult = 1ull << 20;
    } else if (unit == "G" || unit == "g" || unit == "GiB") {
        mult = 1ull << 30;
    } else {
        throw cli_error(
            fmt::format("size \"{}\": use a number with an optional K, M or G suffix", text));
    }
    return value * mult;
}

#if defined(SOFTBLK_FAT_HAVE_DAEMON)
// A device hosted by the softblk daemon: asks the daemon (over its control
// socket, `list`) where the device is exported and opens that export from
// this process: a ublk block node or a FUSE-exported file (O_DIRECT where
// aligned), or an NBD export through libnbd.
std::unique_ptr<block_device> open_daemon_device(const std::string& name, bool read_only)
{
    const std::string spec = "softblk:" + name;
    auto paths = softblk::cli::resolve_run_paths();
    if (!paths) {
        throw cli_error(fmt::format("{}: {}", spec, paths.error().message));
    }
    auto client = softblk::cli::control_client::connect(*paths, false);
    if (!client) {
        throw cli_error(fmt::format(
            "{}: no softblk daemon answers at {} ({}); `softblk list` starts one (it brings "
            "back the devices it kept) and shows the devices, `softblk add` creates one",
            spec, paths->socket, client.error().message));
    }
    auto list = check(client->call("list", nlohmann::json::object()));
    const nlohmann::json* found = nullptr;
    std::string names;
    for (const auto& d : list) {
        std::string n = d.value("name", std::string());
        if (n == name) {
            found = &d;
        }
        names += names.empty() ? n : ", " + n;
    }
    if (found == nullptr) {
        throw cli_error(
            fmt::format("{}: the daemon at {} has no device \"{}\" (its devices: {}); create it "
                        "with `softblk add null "
                        "memory_backed=1 size=1024 --name {} --export nbd`, or write "
                        "softblk:TYPE:OPTIONS for a device that "
                        "lives only in this process",
                        spec, paths->dir, name, names.empty() ? "none" : names, name));
    }
    const nlohmann::json& d = *found;
    if (d.value("state", std::string()) != "running") {
        throw cli_error(fmt::format("{}: the device is {} in the daemon: {} (see `softblk list`)",
                                    spec, d.value("state", std::string("?")),
                                    d.value("error", std::string("no reason"))));
    }
    const uint32_t block_size = d.value("logical_block_size", 512u);
    const nlohmann::json exp = d.value("export", nlohmann::json::object());
    const std::string type = exp.value("type", std::string("none"));
    std::string recreate = fmt::format("softblk del {0} && softblk add {1}", name,
                                       d.value("type", std::string("TYPE")));
    for (const auto& o : d.value("options", nlohmann::json::array())) {
        recreate += " " + o.get<std::string>();
    }
    recreate += fmt::format(" --name {} --export nbd", name);

    auto open_path = [&](const std::string& key) -> result<std::unique_ptr<block_device>> {
        std::string path = exp.value(key, std::string());
        if (path.empty()) {
            return make_error(ENOENT, fmt::format("the {} export names no {}", type, key));
        }
        auto dev = file_block_device::open(path, read_only, block_size, true);
        if (!dev) {
            return std::unexpected(dev.error());
        }
        return std::unique_ptr<block_device>(std::move(*dev));
    };
    if (type == "ublk") {
        auto dev = open_path("block");
        if (!dev) {
            throw cli_error(fmt::format(
                "{}: its ublk block device cannot be opened here: {} (ublk nodes belong to "
                "root unless the export is unprivileged)",
                spec, dev.error().message));
        }
        return std::move(*dev);
    }
    if (type == "fuse") {
        // The file the daemon serves through FUSE: one hop less than its
        // loop device, which sits on the same file.
        auto dev = open_path("file");
        if (!dev && exp.contains("loop")) {
            dev = open_path("loop");
        }
        if (!dev) {
            throw cli_error(
                fmt::format("{}: its FUSE-exported file cannot be opened here: {} (the FUSE mount "
                            "admits only the daemon's user; run as that user, or export the device "
                            "over NBD: {})",
                            spec, dev.error().message, recreate));
        }
        return std::move(*dev);
    }
    if (type == "nbd") {
#if defined(SOFTBLK_FAT_HAVE_NBD)
        std::string uri = exp.value("uri", std::string());
        auto dev = nbd_block_device::connect(uri, read_only, block_size);
        if (!dev) {
            throw cli_error(fmt::format("{}: {}", spec, dev.error().message));
        }
        return std::unique_ptr<block_device>(std::move(*dev));
#else
        throw cli_error(fmt::format(
            "{}: the device is exported over NBD, and this build has no libnbd (install "
            "libnbd-dev and rebuild)",
            spec));
#endif
    }
    if (type == "vhost-user-blk") {
        // softblk's own virtio-blk driver on the export's socket (one front
        // end at a time: a VM attached to it keeps this waiting).
        std::vector<std::string> options = {"path=" + exp.value("socket", std::string()),
                                            "poll_queues=0"};
        auto dev = softblk_block_device::create("fat0", "virtio", options);
        if (!dev) {
            throw cli_error(fmt::format("{}: through its vhost-user-blk export: {}", spec,
                                        dev.error().message));
        }
        return std::unique_ptr<block_device>(std::move(*dev));
    }
    if (type == "none") {
        throw cli_error(fmt::format(
            "{}: the device has no export, so only the daemon can reach it; re-create it "
            "with one (this loses its data): {}",
            spec, recreate));
    }
    throw cli_error(fmt::format(
        "{}: its export ({}) cannot be opened by softblk fat; use an nbd, fuse, ublk or "
        "vhost-user-blk export: {}",
        spec, type, recreate));
}
#endif

// `softblk:TYPE:OPTIONS` is a fresh device of this process, `softblk:NAME`
// a device of the daemon, anything else an image file or block device.
std::unique_ptr<block_device> open_target(const std::string& spec, bool read_only,
                                          uint64_t create_size = 0)
{
    if (spec.rfind("softblk:", 0) == 0) {
        if (create_size != 0) {
            throw cli_error(fmt::format(
                "{}: --size applies to image files; a softblk device has its own size", spec));
        }
        std::string rest = spec.substr(8);
        size_t colon = rest.find(':');
        if (colon == std::string::npos) {
#if defined(SOFTBLK_FAT_HAVE_DAEMON)
            return open_daemon_device(rest, read_only);
#else
            throw cli_error(
                fmt::format("{}: devices of the softblk daemon are not reachable from this build "
                            "(built without src/cli)",
                            spec));
#endif
        }
#if defined(SOFTBLK_FAT_HAVE_DEVICE)
        std::string type = rest.substr(0, colon);
        std::vector<std::string> options;
        std::string list = rest.substr(colon + 1);
        size_t i = 0;
        while (i <= list.size()) {
            size_t j = list.find(',', i);
            if (j == std::string::npos) {
                j = list.size();
            }
            if (j > i) {
                options.push_back(list.substr(i, j - i));
            }
            i = j + 1;
        }
        return check(softblk_block_device::create("fat0", type, options));
#else
        throw cli_error("softblk devices are not available in this build");
#endif
    }
    if (create_size != 0) {
        return check(file_block_device::create(spec, create_size));
    }
    return check(file_block_device::open(spec, read_only));
}

std::string inner(std::string p)
{
    if (p.rfind("::", 0) == 0) {
        p = p.substr(2);
    }
    if (p.empty() || p[0] != '/') {
        p = "/" + p;
    }
    return p;
}

bool is_inner(const std::string& p)
{
    return p.rfind("::", 0) == 0;
}

std::string join(const std::string& dir, const std::string& name)
{
    return dir.empty() || dir.back() == '/' ? dir + name : dir + "/" + name;
}

std::string base_name(std::string p)
{
    while (p.size() > 1 && p.back() == '/') {
        p.pop_back();
    }
    size_t s = p.rfind('/');
    return s == std::string::npos ? p : p.substr(s + 1);
}

std::string time_text(std::time_t t)
{
    std::tm tm{};
    localtime_r(&t, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
    return buf;
}

const char* type_name(fat_type t)
{
    switch (t) {
    case fat_type::fat12:
        return "FAT12";
    case fat_type::fat16:
        return "FAT16";
    case fat_type::fat32:
        return "FAT32";
    }
    return "FAT";
}

void print_problems(volume& v)
{
    for (auto& p : v.problems()) {
        fmt::print(stderr, "warning: {}\n", p);
    }
}

// ---------------------------------------------------------------- copies

constexpr size_t k_copy_buffer = 1 << 20;

void copy_host_to_image(volume& v, const std::string& host, const std::string& dst, bool recursive)
{
    struct stat st {};
    if (::stat(host.c_str(), &st) != 0) {
        throw cli_error(fmt::format("{}: {}", host, std::strerror(errno)));
    }
    if (S_ISDIR(st.st_mode)) {
        if (!recursive) {
            throw cli_error(fmt::format("{}: is a directory (use -r)", host));
        }
        auto existing = v.stat(dst);
        if (!existing) {
            check(v.mkdir(dst));
        } else if (!existing->is_directory) {
            throw cli_error(fmt::format("::{}: not a directory", dst));
        }
        for (auto& entry : std::filesystem::directory_iterator(host)) {
            copy_host_to_image(v, entry.path().string(),
                               join(dst, entry.path().filename().string()), true);
        }
        return;
    }
    int fd = ::open(host.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        throw cli_error(fmt::format("{}: {}", host, std::strerror(errno)));
    }
    auto f = v.open(dst, k_open_write | k_open_create | k_open_truncate);
    if (!f) {
        ::close(fd);
        throw cli_error(f.error().message);
    }
    std::vector<char> buf(k_copy_buffer);
    uint64_t off = 0;
    for (;;) {
        ssize_t n = ::read(fd, buf.data(), buf.size());
        if (n < 0) {
            int e = errno;
            ::close(fd);
            throw cli_error(fmt::format("{}: {}", host, std::strerror(e)));
        }
        if (n == 0) {
            break;
        }
        int64_t w = f->pwrite(buf.data(), static_cast<size_t>(n), off);
        if (w < 0) {
            ::close(fd);
            throw cli_error(fmt::format("::{}: {}", dst, std::strerror(static_cast<int>(-w))));
        }
        off += static_cast<uint64_t>(n);
    }
    ::close(fd);
    (void)v.set_times(dst, st.st_mtime, st.st_atime);
}

void copy_image_to_host(volume& v, const std::string& src, const std::string& host, bool recursive)
{
    auto st = check(v.stat(src));
    if (st.is_directory) {
        if (!recursive) {
            throw cli_error(fmt::format("::{}: is a directory (use -r)", src));
        }
        std::error_code ec;
        std::filesystem::create_directories(host, ec);
        if (ec) {
            throw cli_error(fmt::format("{}: {}", host, ec.message()));
        }
        for (auto& e : check(v.readdir(src))) {
            copy_image_to_host(v, join(src, e.name), join(host, e.name), true);
        }
        return;
    }
    auto f = check(v.open(src, k_open_read));
    int fd = ::open(host.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        throw cli_error(fmt::format("{}: {}", host, std::strerror(errno)));
    }
    std::vector<char> buf(k_copy_buffer);
    uint64_t off = 0;
    for (;;) {
        int64_t n = f.pread(buf.data(), buf.size(), off);
        if (n < 0) {
            ::close(fd);
            throw cli_error(fmt::format("::{}: {}", src, std::strerror(static_cast<int>(-n))));
        }
        if (n == 0) {
            break;
        }
        if (::write(fd, buf.data(), static_cast<size_t>(n)) != n) {
            int e = errno;
            ::close(fd);
            throw cli_error(fmt::format("{}: {}", host, std::strerror(e)));
        }
        off += static_cast<uint64_t>(n);
    }
    ::close(fd);
}

void copy_image_to_image(volume& v, const std::string& src, const std::string& dst, bool recursive)
{
    auto st = check(v.stat(src));
    if (st.is_directory) {
        if (!recursive) {
            throw cli_error(fmt::format("::{}: is a directory (use -r)", src));
        }
        if (!v.stat(dst)) {
            check(v.mkdir(dst));
        }
        for (auto& e : check(v.readdir(src))) {
            copy_image_to_image(v, join(src, e.name), join(dst, e.name), true);
        }
        return;
    }
    auto in = check(v.open(src, k_open_read));
    auto out = check(v.open(dst, k_open_write | k_open_create | k_open_truncate));
    std::vector<char> buf(k_copy_buffer);
    uint64_t off = 0;
    for (;;) {
        int64_t n = in.pread(buf.data(), buf.size(), off);
        if (n < 0) {
            throw cli_error(fmt::format("::{}: {}", src, std::strerror(static_cast<int>(-n))));
        }
        if (n == 0) {
            break;
        }
        int64_t w = out.pwrite(buf.data(), static_cast<size_t>(n), off);
        if (w < 0) {
            throw cli_error(fmt::format("::{}: {}", dst, std::strerror(static_cast<int>(-w))));
        }
        off += static_cast<uint64_t>(n);
    }
}

void remove_tree(volume& v, const std::string& path)
{
    for (auto& e : check(v.readdir(path))) {
        std::string child = join(path, e.name);
        if (e.stat.is_directory) {
            remove_tree(v, child);
        } else {
            check(v.unlink(child));
        }
    }
    check(v.rmdir(path));
}

void list(volume& v, const std::string& path, bool long_format, bool recursive, bool header)
{
    auto st = check(v.stat(path));
    if (!st.is_directory) {
        if (long_format) {
            fmt::print("-{} {:>10} {} {}\n", (st.attributes & k_attr_read_only) ? "r-" : "rw",
                       st.size, time_text(st.modified), path);
        } else {
            fmt::print("{}\n", path);
        }
        return;
    }
    auto entries = check(v.readdir(path));
    if (header) {
        fmt::print("{}:\n", path);
    }
    for (auto& e : entries) {
        if (long_format) {
            fmt::print("{}{} {:>10} {} {:<12} {}{}\n", e.stat.is_directory ? 'd' : '-',
                       (e.stat.attributes & k_attr_read_only) ? "r-" : "rw", e.stat.size,
                       time_text(e.stat.modified), e.short_name, e.name,
                       e.stat.is_directory ? "/" : "");
        } else {
            fmt::print("{}{}\n", e.name, e.stat.is_directory ? "/" : "");
        }
    }
    if (recursive) {
        for (auto& e : entries) {
            if (e.stat.is_directory) {
                fmt::print("\n");
                list(v, join(path, e.name), long_format, true, true);
            }
        }
    }
}

}  // namespace

int cli_main(int argc, char** argv)
{
    CLI::App app{"FAT12/16/32 file systems on image files and softblk devices", "softblk fat"};
    app.require_subcommand(1);
    std::string target;
    auto add_target = [&](CLI::App* c) {
        c->add_option("target", target,
                      "image file, block device, softblk:NAME (a device of the softblk daemon), or "
                      "softblk:TYPE:KEY=VALUE,... (a fresh device of this process)")
            ->required();
    };

    // mkfs
    auto* mkfs = app.add_subcommand("mkfs", "create an empty FAT file system (like mkfs.fat)");
    add_target(mkfs);
    std::string size_text;
    int fat_bits = 0;
    std::string cluster_text;
    std::string label = "NO NAME";
    uint32_t sector_size = 0;
    mkfs->add_option("-s,--size", size_text,
                     "create or resize the image file to this size (e.g. 64M)");
    mkfs->add_option("-F,--fat", fat_bits, "FAT type: 12, 16 or 32 (default: as mkfs.fat chooses)")
        ->check(CLI::IsMember({12, 16, 32}));
    mkfs->add_option("-c,--cluster-size", cluster_text, "bytes per cluster (e.g. 4K)");
    mkfs->add_option("-n,--label", label, "volume label (up to 11 characters)");
    mkfs->add_option("-S,--sector-size", sector_size, "bytes per logical sector");

    // ls
    auto* ls = app.add_subcommand("ls", "list a directory");
    add_target(ls);
    std::string path = "/";
    bool long_format = false;
    bool recursive = false;
    ls->add_option("path", path, "directory or file inside the image");
    ls->add_flag("-l", long_format, "long format: attributes, size, time, 8.3 name");
    ls->add_flag("-R", recursive, "recursive");

    auto* cat = app.add_subcommand("cat", "write a file's contents to stdout");
    add_target(cat);
    cat->add_option("path", path, "file inside the image")->required();

    auto* cp = app.add_subcommand(
        "cp", "copy files in, out or within (::/path names a path in the image)");
    add_target(cp);
    std::vector<std::string> cp_args;
    bool cp_recursive = false;
    cp->add_flag("-r,-R,--recursive", cp_recursive, "copy directories recursively");
    cp->add_option("paths", cp_args, "SOURCE... DEST; prefix paths inside the image with ::")
        ->required()
        ->expected(2, -1);

    auto* mkd = app.add_subcommand("mkdir", "create directories");
    add_target(mkd);
    std::vector<std::string> paths;
    bool parents = false;
    mkd->add_option("paths", paths, "directories inside the image")->required();
    mkd->add_flag("-p,--parents", parents, "create missing parents; no error if it exists");

    auto* rm = app.add_subcommand("rm", "remove files (and with -r directories)");
    add_target(rm);
    bool rm_recursive = false;
    rm->add_option("paths", paths, "paths inside the image")->required();
    rm->add_flag("-r,-R,--recursive", rm_recursive, "remove directories and their contents");

    auto* mv = app.add_subcommand("mv", "rename or move a file or directory");
    add_target(mv);
    std::string from;
    std::string to;
    mv->add_option("from", from)->required();
    mv->add_option("to", to)->required();

    auto* st = app.add_subcommand("stat", "show a file's directory entry");
    add_target(st);
    st->add_option("path", path, "path inside the image")->required();

    auto* df = app.add_subcommand("df", "show the volume's type, size and free space");
    add_target(df);

    auto* mount = app.add_subcommand("mount", "serve the file system through FUSE");
    add_target(mount);
    std::string mountpoint;
    bool foreground = false;
    bool read_only = false;
    bool mount_mkfs = false;
    std::vector<std::string> fuse_options;
    mount->add_option("mountpoint", mountpoint)->required();
    mount->add_flag("-f,--foreground", foreground, "stay in the foreground");
    mount->add_flag("--ro,--read-only", read_only, "mount read-only");
    mount->add_flag("--mkfs", mount_mkfs, "format the target first (for softblk: devices)");
    mount->add_option("-o", fuse_options, "extra FUSE options (allow_other, ...)")->delimiter(',');

    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e) == 0 ? 0 : 2;
    }

    try {
        if (mkfs->parsed()) {
            uint64_t size = size_text.empty() ? 0 : parse_size(size_text);
            auto dev = open_target(target, false, size);
            format_options o;
            if (fat_bits != 0) {
                o.type = static_cast<fat_type>(fat_bits);
            }
            o.cluster_size =
                cluster_text.empty() ? 0 : static_cast<uint32_t>(parse_size(cluster_text));
            o.label = label;
            o.sector_size = sector_size;
            check(format(*dev, o));
            auto v = check(volume::mount(*dev, mount_options{.read_only = true}));
            auto s = check(v->statfs());
            fmt::print("{}: {}, {} clusters of {} bytes, {} bytes free\n", target,
                       type_name(s.type), s.total_clusters, s.cluster_size,
                       uint64_t{s.free_clusters} * s.cluster_size);
            return 0;
        }
        bool writes = cp->parsed() || mkd->parsed() || rm->parsed() || mv->parsed() ||
                      (mount->parsed() && !read_only);
        if (cp->parsed()) {
            bool any_out = false;
            for (size_t i = 0; i + 1 < cp_args.size(); ++i) {
                any_out |= is_inner(cp_args[i]);
            }
            writes = is_inner(cp_args.back()) || !any_out;
        }
        auto dev = open_target(target, !writes);
        if (mount->parsed() && mount_mkfs) {
            check(format(*dev, {}));
        }
        auto v = check(volume::mount(*dev, mount_options{.read_only = !writes}));
        int rc = 0;
        if (ls->parsed()) {
            list(*v, inner(path), long_format, recursive, false);
        } else if (cat->parsed()) {
            auto f = check(v->open(inner(path), k_open_read));
            std::vector<char> buf(k_copy_buffer);
            uint64_t off = 0;
            for (;;) {
                int64_t n = f.pread(buf.data(), buf.size(), off);
                if (n < 0) {
                    throw cli_error(
                        fmt::format("{}: {}", path, std::strerror(static_cast<int>(-n))));
                }
                if (n == 0) {
                    break;
                }
                std::fwrite(buf.data(), 1, static_cast<size_t>(n), stdout);
                off += static_cast<uint64_t>(n);
            }
        } else if (cp->parsed()) {
            std::string dest = cp_args.back();
            std::vector<std::string> sources(cp_args.begin(), cp_args.end() - 1);
            if (is_inner(dest)) {
                std::string d = inner(dest);
                auto ds = v->stat(d);
                bool into = ds && ds->is_directory;
                if (sources.size() > 1 && !into) {
                    throw cli_error(fmt::format("{}: not a directory (several sources)", dest));
                }
                for (auto& s : sources) {
                    std::string target_path =
                        into ? join(d, base_name(is_inner(s) ? inner(s) : s)) : d;
                    if (is_inner(s)) {
                        copy_image_to_image(*v, inner(s), target_path, cp_recursive);
                    } else {
                        copy_host_to_image(*v, s, target_path, cp_recursive);
                    }
                }
            } else {
                bool into = std::filesystem::is_directory(dest);
                if (sources.size() > 1 && !into) {
                    throw cli_error(fmt::format("{}: not a directory (several sources)", dest));
                }
                for (auto& s : sources) {
                    if (!is_inner(s)) {
                        throw cli_error(fmt::format(
                            "{}: one side must be inside the image (prefix it with ::)", s));
                    }
                    std::string target_path = into ? join(dest, base_name(inner(s))) : dest;
                    copy_image_to_host(*v, inner(s), target_path, cp_recursive);
                }
            }
        } else if (mkd->parsed()) {
            for (auto& p : paths) {
                std::string full = inner(p);
                if (parents) {
                    std::string cur;
                    std::stringstream ss(full);
                    std::string part;
                    while (std::getline(ss, part, '/')) {
                        if (part.empty()) {
                            continue;
                        }
                        cur += "/" + part;
                        auto s = v->stat(cur);
                        if (!s) {
                            check(v->mkdir(cur));
                        } else if (!s->is_directory) {
                            throw cli_error(fmt::format("{}: exists and is not a directory", cur));
                        }
                    }
                } else {
                    check(v->mkdir(full));
                }
            }
        } else if (rm->parsed()) {
            for (auto& p : paths) {
                std::string full = inner(p);
                auto s = check(v->stat(full));
                if (s.is_directory) {
                    if (!rm_recursive) {
                        throw cli_error(fmt::format("{}: is a directory (use -r)", p));
                    }
                    remove_tree(*v, full);
                } else {
                    check(v->unlink(full));
                }
            }
        } else if (mv->parsed()) {
            std::string f = inner(from);
            std::string t = inner(to);
            auto ts = v->stat(t);
            if (ts && ts->is_directory) {
                auto fs = check(v->stat(f));
                (void)fs;
                t = join(t, base_name(f));
            }
            check(v->rename(f, t));
        } else if (st->parsed()) {
            std::string full = inner(path);
            auto s = check(v->stat(full));
            fmt::print(
                "  File: {}\n  Type: {}\n  Size: {}\n  Allocated: {}\n  First cluster: {}\n"
                "  Attributes: {:#04x}{}{}{}{}\n  Modified: {}\n  Created: {}\n  Accessed: {}\n",
                full, s.is_directory ? "directory" : "regular file", s.size, s.allocated,
                s.first_cluster, s.attributes,
                (s.attributes & k_attr_read_only) ? " read-only" : "",
                (s.attributes & k_attr_hidden) ? " hidden" : "",
                (s.attributes & k_attr_system) ? " system" : "",
                (s.attributes & k_attr_archive) ? " archive" : "", time_text(s.modified),
                time_text(s.created), time_text(s.accessed).substr(0, 10));
        } else if (df->parsed()) {
            auto s = check(v->statfs());
            uint64_t total = uint64_t{s.total_clusters} * s.cluster_size;
            uint64_t free = uint64_t{s.free_clusters} * s.cluster_size;
            fmt::print(
                "Type: {}\nLabel: {}\nVolume ID: {:04X}-{:04X}\nCluster size: {}\nClusters: {} ({} "
                "free)\n"
                "Size: {} bytes\nUsed: {} bytes\nFree: {} bytes ({:.1f}%)\n{}",
                type_name(s.type), s.label, s.volume_id >> 16, s.volume_id & 0xFFFF, s.cluster_size,
                s.total_clusters, s.free_clusters, total, total - free, free,
                total != 0 ? 100.0 * static_cast<double>(free) / static_cast<double>(total) : 0.0,
                s.was_dirty ? "State: dirty (not cleanly unmounted; run fsck.fat)\n"
                            : "State: clean\n");
        } else if (mount->parsed()) {
            rc = detail::serve_fuse(*v, mountpoint, foreground, read_only, fuse_options);
        }
        print_problems(*v);
        check(v->unmount());
        return rc;
    } catch (const cli_error& e) {
        fmt::print(stderr, "softblk fat: {}\n", e.what());
        return 1;
    } catch (const std::exception& e) {
        fmt::print(stderr, "softblk fat: {}\n", e.what());
        return 1;
    }
}

}  // namespace softblk::fat
