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
#include <functional>
#include <stdexcept>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <softblk/fat/block_device.hpp>
#include <softblk/fat/volume.hpp>
#include <softblk/fat/walk.hpp>

#include "cli_target.hpp"
#include "fuse_mount.hpp"
#include "version.hpp"

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

void copy_file_to_host(volume& v, const std::string& src, const std::string& host)
{
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

void copy_file_in_image(volume& v, const std::string& src, const std::string& dst)
{
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

// ---------------------------------------------------------------- walks

// The tree commands (ls -R, cp -r out of the image and within it, rm -r)
// walk with fat::walk, which refuses directory cycles and cross-linked
// directories of a damaged image. What it skips is reported on stderr, the
// rest is done, and the command fails at the end. Errors of the command's
// own work (a file that cannot be copied) stop it, as they always did.
class tree_visitor : public walk_visitor {
public:
    void skipped(const std::string&, const error& why) override
    {
        fmt::print(stderr, "softblk fat: {}\n", why.message);
        ++_skipped;
    }
    uint64_t skipped_count() const { return _skipped; }

protected:
    // Runs `work`, turning the tools' exceptions into the walk's errors
    // (walk() is library code: it returns errors, it does not carry
    // exceptions).
    template <class F>
    static result<void> guarded(F&& work)
    {
        try {
            work();
        } catch (const cli_error& e) {
            return make_error(EIO, e.what());
        }
        return {};
    }

private:
    uint64_t _skipped = 0;
};

// Runs the walk of `start`; returns how many directories it skipped.
uint64_t run_walk(volume& v, const std::string& start, tree_visitor& visitor)
{
    auto r = walk(v, start, visitor);
    if (!r) {
        throw cli_error(r.error().message);
    }
    return visitor.skipped_count();
}

// cp -r out of the image or within it: each directory of the source tree
// is made at the destination, then its files are copied.
class tree_copy final : public tree_visitor {
public:
    using make_dir_fn = std::function<void(const std::string& dir)>;
    using copy_fn = std::function<void(const std::string& from, const std::string& to)>;

    tree_copy(const std::string& src, const std::string& dst, make_dir_fn make_dir, copy_fn copy)
        : _src(src), _dst(dst), _make_dir(std::move(make_dir)), _copy(std::move(copy))
    {
    }

    result<void> enter(const std::string& path, const std::vector<dir_entry>& entries) override
    {
        return guarded([&] {
            std::string dir = destination(path);
            _make_dir(dir);
            for (auto& e : entries) {
                if (!e.stat.is_directory) {
                    _copy(join(path, e.name), join(dir, e.name));
                }
            }
        });
    }

private:
    // Where the walk's `path` (the source, or below it) goes.
    std::string destination(const std::string& path) const
    {
        std::string rest = path.substr(std::min(_src.size(), path.size()));
        while (!rest.empty() && rest.front() == '/') {
            rest.erase(0, 1);
        }
        return rest.empty() ? _dst : join(_dst, rest);
    }

    const std::string& _src;
    const std::string& _dst;
    make_dir_fn _make_dir;
    copy_fn _copy;
};

// The source of a copy out of the image or within it; a directory needs -r.
file_stat copy_source(volume& v, const std::string& src, bool recursive)
{
    auto st = check(v.stat(src));
    if (st.is_directory && !recursive) {
        throw cli_error(fmt::format("::{}: is a directory (use -r)", src));
    }
    return st;
}

// Copies `src` (a path in the image) to `dst` on the host or in the image;
// returns how many directories the walk skipped.
uint64_t copy_from_image(volume& v, const std::string& src, const std::string& dst, bool recursive,
                         bool to_host)
{
    tree_copy::copy_fn copy = [&](const std::string& from, const std::string& to) {
        to_host ? copy_file_to_host(v, from, to) : copy_file_in_image(v, from, to);
    };
    auto st = copy_source(v, src, recursive);
    if (!st.is_directory) {
        copy(src, dst);
        return 0;
    }
    tree_copy::make_dir_fn make_dir = [](const std::string& dir) {
        std::error_code ec;
        std::filesystem::create_directories(dir, ec);
        if (ec) {
            throw cli_error(fmt::format("{}: {}", dir, ec.message()));
        }
    };
    if (!to_host) {
        // A copy into the source's own subtree would copy what it creates.
        bool into_itself = st.first_cluster == check(v.stat("/")).first_cluster;
        for (std::string p = dst; !into_itself && !p.empty() && p != "/";
             p = p.substr(0, p.rfind('/'))) {
            auto s = v.stat(p);
            into_itself = s && s->is_directory && s->first_cluster == st.first_cluster;
        }
        if (into_itself) {
            throw cli_error(
                fmt::format("::{}: cannot copy a directory into itself (::{})", src, dst));
        }
        make_dir = [&](const std::string& dir) {
            if (!v.stat(dir)) {
                check(v.mkdir(dir));
            }
        };
    }
    tree_copy visitor(src, dst, std::move(make_dir), std::move(copy));
    return run_walk(v, src, visitor);
}

uint64_t remove_tree(volume& v, const std::string& path)
{
    struct remover : tree_visitor {
        volume& v;
        explicit remover(volume& vol) : v(vol) {}
        result<void> enter(const std::string& dir, const std::vector<dir_entry>& entries) override
        {
            for (auto& e : entries) {
                if (!e.stat.is_directory) {
                    if (auto r = v.unlink(join(dir, e.name)); !r) {
                        return r;
                    }
                }
            }
            return {};
        }
        result<void> leave(const std::string& dir) override
        {
            auto r = v.rmdir(dir);
            if (!r && r.error().code.value() == ENOTEMPTY && skipped_count() > 0) {
                // It still holds what the walk refused to enter.
                fmt::print(stderr, "softblk fat: {}\n", r.error().message);
                return {};
            }
            return r;
        }
    } visitor(v);
    return run_walk(v, path, visitor);
}

void print_entries(const std::vector<dir_entry>& entries, bool long_format)
{
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
}

// Returns how many directories a recursive listing skipped.
uint64_t list(volume& v, const std::string& path, bool long_format, bool recursive)
{
    auto st = check(v.stat(path));
    if (!st.is_directory) {
        if (long_format) {
            fmt::print("-{} {:>10} {} {}\n", (st.attributes & k_attr_read_only) ? "r-" : "rw",
                       st.size, time_text(st.modified), path);
        } else {
            fmt::print("{}\n", path);
        }
        return 0;
    }
    if (!recursive) {
        print_entries(check(v.readdir(path)), long_format);
        return 0;
    }
    struct lister : tree_visitor {
        const std::string& start;
        bool long_format;
        lister(const std::string& s, bool l) : start(s), long_format(l) {}
        result<void> enter(const std::string& dir, const std::vector<dir_entry>& entries) override
        {
            if (dir != start) {
                fmt::print("\n{}:\n", dir);
            }
            print_entries(entries, long_format);
            return {};
        }
    } visitor(path, long_format);
    return run_walk(v, path, visitor);
}

}  // namespace

int cli_main(int argc, char** argv, daemon_directory* daemon)
{
    CLI::App app{"FAT12/16/32 file systems on image files and softblk devices", "softblk fat"};
    app.require_subcommand(1);
    app.set_version_flag("--version", std::string("softblk-fat ") + softblk::version_string());
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
    mount
        ->add_option("-o", fuse_options,
                     "extra FUSE options (allow_other, direct_io, threads=N, poll_us=auto|N, ...)")
        ->delimiter(',');

    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e) == 0 ? 0 : 2;
    }

    try {
        if (mkfs->parsed()) {
            uint64_t size = size_text.empty() ? 0 : parse_size(size_text);
            auto dev = check(detail::open_target(target, false, size, daemon));
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
        auto dev = check(detail::open_target(target, !writes, 0, daemon));
        if (mount->parsed() && mount_mkfs) {
            check(format(*dev, {}));
        }
        auto v = check(volume::mount(*dev, mount_options{.read_only = !writes}));
        int rc = 0;
        uint64_t skipped = 0;  // directories a walk refused (reported already)
        if (ls->parsed()) {
            skipped += list(*v, inner(path), long_format, recursive);
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
                        skipped += copy_from_image(*v, inner(s), target_path, cp_recursive, false);
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
                    skipped += copy_from_image(*v, inner(s), target_path, cp_recursive, true);
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
                    skipped += remove_tree(*v, full);
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
        return rc == 0 && skipped > 0 ? 1 : rc;
    } catch (const cli_error& e) {
        fmt::print(stderr, "softblk fat: {}\n", e.what());
        return 1;
    } catch (const std::exception& e) {
        fmt::print(stderr, "softblk fat: {}\n", e.what());
        return 1;
    }
}

}  // namespace softblk::fat
