// `softblk fat mount`: the file system's operations on a volume through
// high-level libfuse, the options, and the mount. The loop that serves the
// requests is fuse_serve.cpp's.
#define FUSE_USE_VERSION 312
#include "fuse_mount.hpp"

#include "fuse_bdi.hpp"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <fuse.h>
#include <fuse_lowlevel.h>
#include <fcntl.h>
#include <linux/fuse.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <fmt/format.h>

#include <softblk/support/colocation.hpp>
#include <softblk/support/level_chooser.hpp>

namespace softblk::fat::detail {

namespace {

volume& vol()
{
    return *static_cast<volume*>(fuse_get_context()->private_data);
}

// Damage met while serving (a directory cycle, a broken chain) is logged
// to stderr, as the kernel logs a lookup that would make a directory its
// own ancestor: at most k_log_burst lines per k_log_window_s, then a count
// of what was left out. The volume also keeps the messages (problems()).
constexpr int k_log_burst = 10;
constexpr std::time_t k_log_window_s = 5;

void log_damage(const std::string& message)
{
    static std::mutex mu;
    static std::time_t window_start = 0;
    static int logged = 0;
    static uint64_t suppressed = 0;
    std::lock_guard lock(mu);
    std::time_t now = std::time(nullptr);
    if (now - window_start >= k_log_window_s) {
        if (suppressed > 0) {
            fmt::print(stderr, "softblk fat mount: {} more damage messages not logged\n",
                       suppressed);
        }
        window_start = now;
        logged = 0;
        suppressed = 0;
    }
    if (logged < k_log_burst) {
        ++logged;
        fmt::print(stderr, "softblk fat mount: {}\n", message);
    } else {
        ++suppressed;
    }
}

// The errno a FUSE operation returns for a failed call; damage (EIO, and
// ELOOP for a directory that leads back to an ancestor) is logged.
template <class T>
int err(const result<T>& r)
{
    int code = r.error().code.value();
    if (code == EIO || code == ELOOP) {
        log_damage(r.error().message);
    }
    return -code;
}

// How one open of a file reads and writes (open_files below).
enum class open_mode : uint8_t {
    cached,         // through the page cache
    direct,         // past it, while a direct_writer of the file is open
    direct_writer,  // a write-only open that skips it, and makes the file's
                    // other opens skip it until it is released
};

// One open of a file by the kernel (fuse_file_info::fh).
struct open_file {
    file f;
    open_mode mode = open_mode::cached;
};

open_file* opened(fuse_file_info* fi)
{
    return reinterpret_cast<open_file*>(fi->fh);
}

file* handle(fuse_file_info* fi)
{
    return &opened(fi)->f;
}

bool g_read_only = false;
// Owner of every file, as the process that serves the mount: asked once,
// not per reply (two system calls per GETATTR and per create otherwise).
uid_t g_uid = 0;
gid_t g_gid = 0;
bool g_direct_io = false;
// -o writeback=1 asks for the kernel's writeback cache, with this mount's
// own bdi limits lifted (fuse_bdi.hpp). The default (0) writes through:
// each write(2) is one request (up to max_write) that the writer waits
// for, and the page cache still serves reads. Neither mode won: both cost
// the writer and the server about 1.8x mtools' CPU per byte written (three
// copies: into the page cache, out to the server, into the device)
// and overlap little; writing through pays a round trip per write(2),
// the lifted cache pays for the writeback after the writes (docs/fat.md).
bool g_writeback_wanted = false;
// Set in init when the kernel agreed to cache writes (FUSE_CAP_WRITEBACK_CACHE).
bool g_writeback = false;

// Only this mount changes the volume, and the kernel updates its caches on
// every change made through it, so names and attributes may be cached long:
// a create then costs LOOKUP + CREATE (+ RELEASE), not a GETATTR per stat.
// (Not for another spelling of a name: "foo" found as "FOO" is a name of
// its own to the kernel and stays cached when "FOO" is removed; docs/fat.md.)
constexpr double k_cache_timeout = 3600.0;
// Larger writes and reads per request (the kernel caps them at
// fs.fuse.max_pages_limit pages, 1 MiB by default).
constexpr unsigned k_max_io = 1u << 20;

void fill(const file_stat& st, struct stat* out)
{
    std::memset(out, 0, sizeof *out);
    if (st.is_directory) {
        out->st_mode = S_IFDIR | 0755;
        out->st_nlink = 2;
    } else {
        out->st_mode = S_IFREG | ((st.attributes & k_attr_read_only) ? 0444 : 0644);
        out->st_nlink = 1;
    }
    out->st_size = static_cast<off_t>(st.size);
    out->st_blocks = static_cast<blkcnt_t>(st.allocated / 512);
    out->st_blksize = 65536;
    out->st_uid = g_uid;
    out->st_gid = g_gid;
    out->st_mtime = st.modified;
    out->st_ctime = st.modified;
    out->st_atime = st.accessed;
    out->st_ino = st.first_cluster;
}

int op_getattr(const char* path, struct stat* st, fuse_file_info* fi)
{
    if (fi != nullptr && fi->fh != 0) {
        auto r = handle(fi)->stat();
        if (r) {
            fill(*r, st);
            return 0;
        }
    }
    auto r = vol().stat(path);
    if (!r) {
        return err(r);
    }
    fill(*r, st);
    return 0;
}

int op_readdir(const char* path, void* buf, fuse_fill_dir_t filler, off_t, fuse_file_info*,
               fuse_readdir_flags)
{
    auto r = vol().readdir(path);
    if (!r) {
        return err(r);
    }
    filler(buf, ".", nullptr, 0, static_cast<fuse_fill_dir_flags>(0));
    filler(buf, "..", nullptr, 0, static_cast<fuse_fill_dir_flags>(0));
    for (auto& e : *r) {
        struct stat st;
        fill(e.stat, &st);
        filler(buf, e.name.c_str(), &st, 0, static_cast<fuse_fill_dir_flags>(0));
    }
    return 0;
}

unsigned flags_of(int f)
{
    unsigned flags = 0;
    switch (f & O_ACCMODE) {
    case O_RDONLY:
        flags = k_open_read;
        break;
    case O_WRONLY:
        // With the writeback cache the kernel reads pages of files opened
        // write-only (to fill partly written pages).
        flags = g_writeback ? k_open_read | k_open_write : k_open_write;
        break;
    default:
        flags = k_open_read | k_open_write;
    }
    if (f & O_TRUNC) {
        flags |= k_open_truncate;
    }
    // With the writeback cache the kernel places appends itself and writes
    // pages back in any order, each at its own offset: appending at the end
    // here would misplace them.
    if ((f & O_APPEND) && !g_writeback) {
        flags |= k_open_append;
    }
    if (f & O_CREAT) {
        flags |= k_open_create;
    }
    if (f & O_EXCL) {
        flags |= k_open_exclusive;
    }
    return flags;
}

// Writing through, a file opened write-only skips the page cache
// (FOPEN_DIRECT_IO for that open): such a descriptor can neither read nor
// be mapped, so the cache would only keep a copy of what it writes, one
// more copy of every byte (cp, dd and tar write this way). Opens that can
// read keep the cache, and shared mmap. Only while no other open of the
// file exists, and the file's later opens skip the cache too until that
// writer closes: kernels before the fix of 2025 ("fuse: invalidate page
// cache after DIO write") leave another open's cached pages stale after a
// direct write, and this way no open caches what such a writer changes.
// (Every open drops the file's cached pages: kernel_cache is off.) The
// writeback cache keeps every open cached, as asked.
class open_files {
public:
    // How the open of `f` with open(2) `flags` reads and writes; counted
    // until release().
    open_mode open(const file& f, int flags)
    {
        std::lock_guard lock(_mu);
        auto& n = _files[f.identity()];
        auto mode = n.direct_writers > 0 ? open_mode::direct : open_mode::cached;
        if ((flags & O_ACCMODE) == O_WRONLY && !g_writeback && n.opens == 0) {
            mode = open_mode::direct_writer;
            ++n.direct_writers;
        }
        ++n.opens;
        return mode;
    }

    void release(const file& f, open_mode mode)
    {
        std::lock_guard lock(_mu);
        auto it = _files.find(f.identity());
        if (it == _files.end()) {
            return;
        }
        if (mode == open_mode::direct_writer) {
            --it->second.direct_writers;
        }
        if (--it->second.opens == 0) {
            _files.erase(it);
        }
    }

private:
    struct counts {
        unsigned opens = 0;
        unsigned direct_writers = 0;
    };
    std::mutex _mu;  // -o threads=N serves opens and releases at once
    std::unordered_map<const void*, counts> _files;
};

open_files g_open_files;

int serve_open(result<file> r, fuse_file_info* fi)
{
    if (!r) {
        return err(r);
    }
    auto* o = new open_file{std::move(*r)};
    o->mode = g_open_files.open(o->f, fi->flags);
    if (o->mode != open_mode::cached) {
        fi->direct_io = 1;
    }
    fi->fh = reinterpret_cast<uint64_t>(o);
    return 0;
}

int op_open(const char* path, fuse_file_info* fi)
{
    return serve_open(vol().open(path, flags_of(fi->flags)), fi);
}

int op_create(const char* path, mode_t, fuse_file_info* fi)
{
    return serve_open(vol().open(path, flags_of(fi->flags) | k_open_create), fi);
}

int op_read(const char*, char* buf, size_t size, off_t off, fuse_file_info* fi)
{
    return static_cast<int>(handle(fi)->pread(buf, size, static_cast<uint64_t>(off)));
}

int op_write(const char*, const char* buf, size_t size, off_t off, fuse_file_info* fi)
{
    return static_cast<int>(handle(fi)->pwrite(buf, size, static_cast<uint64_t>(off)));
}

// A WRITE, served past high-level libfuse (serve_session's shortcut): the
// request's fh is the open_file this mount gave the open (writeback's
// writes carry a writable open's too), so neither the path libfuse builds
// for every request (a lookup under its tree lock, a malloc) nor its
// request allocation is needed; for a WRITE libfuse keeps no state of its
// own. The volume's result is the reply, a negative errno as op_write's.
// A read-only mount never opens a file for writing.
bool write_past_libfuse(const fuse_in_header& in, size_t bytes, int fd)
{
    if (in.opcode != FUSE_WRITE || bytes < sizeof in + sizeof(fuse_write_in)) {
        return false;
    }
    const auto* w = reinterpret_cast<const fuse_write_in*>(&in + 1);
    if (w->fh == 0 || sizeof in + sizeof *w + w->size > bytes) {
        return false;  // libfuse answers what is malformed
    }
    auto* o = reinterpret_cast<open_file*>(w->fh);
    const int64_t n = o->f.pwrite(w + 1, w->size, w->offset);
    fuse_out_header out{
        .len = sizeof out, .error = n < 0 ? static_cast<int32_t>(n) : 0, .unique = in.unique};
    fuse_write_out reply{.size = n < 0 ? 0 : static_cast<uint32_t>(n), .padding = 0};
    iovec iov[2] = {{&out, sizeof out}, {&reply, sizeof reply}};
    if (n >= 0) {
        out.len += sizeof reply;
    }
    (void)::writev(fd, iov, n >= 0 ? 2 : 1);
    return true;
}

int op_release(const char*, fuse_file_info* fi)
{
    auto* o = opened(fi);
    g_open_files.release(o->f, o->mode);
    delete o;
    fi->fh = 0;
    return 0;
}

int op_fsync(const char*, int, fuse_file_info* fi)
{
    return handle(fi)->fsync();
}

int op_truncate(const char* path, off_t size, fuse_file_info* fi)
{
    if (fi != nullptr && fi->fh != 0) {
        return handle(fi)->truncate(static_cast<uint64_t>(size));
    }
    auto r = vol().truncate(path, static_cast<uint64_t>(size));
    return r ? 0 : err(r);
}

int op_unlink(const char* path)
{
    auto r = vol().unlink(path);
    return r ? 0 : err(r);
}

int op_mkdir(const char* path, mode_t)
{
    auto r = vol().mkdir(path);
    return r ? 0 : err(r);
}

int op_rmdir(const char* path)
{
    auto r = vol().rmdir(path);
    return r ? 0 : err(r);
}

int op_rename(const char* from, const char* to, unsigned int flags)
{
    if (flags & RENAME_EXCHANGE) {
        return -EINVAL;
    }
    if ((flags & RENAME_NOREPLACE) && vol().stat(to)) {
        return -EEXIST;
    }
    auto r = vol().rename(from, to);
    return r ? 0 : err(r);
}

int op_statfs(const char*, struct statvfs* st)
{
    auto r = vol().statfs();
    if (!r) {
        return err(r);
    }
    std::memset(st, 0, sizeof *st);
    st->f_bsize = r->cluster_size;
    st->f_frsize = r->cluster_size;
    st->f_blocks = r->total_clusters;
    st->f_bfree = r->free_clusters;
    st->f_bavail = r->free_clusters;
    st->f_namemax = 255;
    return 0;
}

int op_utimens(const char* path, const timespec tv[2], fuse_file_info*)
{
    std::time_t now = std::time(nullptr);
    std::time_t a = tv[0].tv_nsec == UTIME_NOW ? now : tv[0].tv_sec;
    std::time_t m = tv[1].tv_nsec == UTIME_NOW ? now : tv[1].tv_sec;
    if (tv[1].tv_nsec == UTIME_OMIT || tv[0].tv_nsec == UTIME_OMIT) {
        auto st = vol().stat(path);
        if (!st) {
            return err(st);
        }
        if (tv[0].tv_nsec == UTIME_OMIT) {
            a = st->accessed;
        }
        if (tv[1].tv_nsec == UTIME_OMIT) {
            m = st->modified;
        }
    }
    auto r = vol().set_times(path, m, a);
    return r ? 0 : err(r);
}

int op_chmod(const char* path, mode_t mode, fuse_file_info*)
{
    auto st = vol().stat(path);
    if (!st) {
        return err(st);
    }
    if (st->is_directory) {
        return 0;
    }
    uint8_t attr = st->attributes;
    attr = static_cast<uint8_t>((mode & 0222) ? (attr & ~k_attr_read_only)
                                              : (attr | k_attr_read_only));
    auto r = vol().set_attributes(path, attr);
    return r ? 0 : err(r);
}

int op_chown(const char*, uid_t, gid_t, fuse_file_info*)
{
    return 0;
}

void* op_init(fuse_conn_info* conn, fuse_config* cfg)
{
    cfg->use_ino = 0;
    cfg->nullpath_ok = 0;
    cfg->direct_io = g_direct_io ? 1 : 0;
    cfg->entry_timeout = k_cache_timeout;
    cfg->attr_timeout = k_cache_timeout;
    // Names that are not there are not cached: FAT finds an entry under
    // any ASCII case of its name and under its 8.3 alias, while the kernel
    // compares names exactly. A cached miss for "foo" hid the file "FOO"
    // created next (and "LONGNA~1.TXT" a new "long name.txt") for the
    // hour. A create pays nothing for it (its LOOKUP is needed anyway).
    cfg->negative_timeout = 0;
    // kernel_cache stays off: every open drops the file's cached pages, so
    // a reopened file is read from the volume (what benchmarks measure).
    g_writeback = false;
    if (!g_direct_io && !g_read_only && g_writeback_wanted &&
        (conn->capable & FUSE_CAP_WRITEBACK_CACHE) != 0) {
        conn->want |= FUSE_CAP_WRITEBACK_CACHE;
        g_writeback = true;
    }
    conn->max_write = k_max_io;
    conn->max_readahead = k_max_io;
    return fuse_get_context()->private_data;
}

void op_destroy(void* data)
{
    auto* v = static_cast<volume*>(data);
    (void)v->sync();
}

// Lifts the writeback limits of the mount on `mount_point` (just mounted,
// not yet serving) for -o writeback=1 and says what it set, or why not.
void say_writeback_limits(const std::string& mount_point)
{
    auto lifted = lift_writeback_limits(mount_point);
    if (lifted) {
        fmt::print(stderr, "softblk fat mount: writeback cache; this mount's {}: {}\n",
                   lifted->directory, lifted->summary);
    } else {
        fmt::print(stderr,
                   "softblk fat mount: writeback cache with the kernel's FUSE limits (writers "
                   "are paced to about 1% of the dirty limit): {}\n",
                   lifted.error().message);
    }
}

// Reads through the page cache come in read-ahead requests: the kernel
// gives a FUSE mount's bdi its default 128 KiB and INIT only lowers it, so
// max_readahead alone left sequential reads at eight requests per MiB.
// Raised on the mount's own bdi to one request of k_max_io (just mounted,
// before INIT); where it cannot be (not root), the kernel's stays and the
// mount says why.
void set_own_read_ahead(const std::string& mount_point)
{
    auto set = set_read_ahead(mount_point, k_max_io / 1024);
    if (!set) {
        fmt::print(stderr, "softblk fat mount: read-ahead stays at the kernel's default: {}\n",
                   set.error().message);
    }
}

constexpr unsigned k_max_threads = 64;

// The N of -o threads=N: 1..k_max_threads, digits only.
std::optional<unsigned> parse_threads(const std::string& text)
{
    if (text.empty() || text.size() > 2 ||
        text.find_first_not_of("0123456789") != std::string::npos) {
        return std::nullopt;
    }
    unsigned n = static_cast<unsigned>(std::stoul(text));
    if (n < 1 || n > k_max_threads) {
        return std::nullopt;
    }
    return n;
}

}  // namespace

int serve_fuse(volume& v, const std::string& mountpoint, bool foreground, bool read_only,
               const std::vector<std::string>& fuse_options)
{
    g_read_only = read_only;
    g_uid = getuid();
    g_gid = getgid();
    fuse_operations ops{};
    ops.getattr = op_getattr;
    ops.readdir = op_readdir;
    ops.open = op_open;
    ops.create = op_create;
    ops.read = op_read;
    ops.write = op_write;
    ops.release = op_release;
    ops.fsync = op_fsync;
    ops.truncate = op_truncate;
    ops.unlink = op_unlink;
    ops.mkdir = op_mkdir;
    ops.rmdir = op_rmdir;
    ops.rename = op_rename;
    ops.statfs = op_statfs;
    ops.utimens = op_utimens;
    ops.chmod = op_chmod;
    ops.chown = op_chown;
    ops.init = op_init;
    ops.destroy = op_destroy;

    std::string opts = fmt::format("fsname={},subtype=vfat", k_mount_source);
    if (read_only) {
        opts += ",ro";
    }
    g_direct_io = false;
    g_writeback_wanted = false;
    std::string writeback = "0";
    unsigned threads = 1;
    std::string poll_us = "auto";
    std::string colocate = "auto";
    for (auto& o : fuse_options) {
        if (o.rfind("writeback=", 0) == 0) {  // our choice, not a libfuse option
            writeback = o.substr(10);
            if (writeback != "0" && writeback != "1") {
                fmt::print(stderr,
                           "softblk fat mount: -o {}: writeback takes 0 (write through, the "
                           "default) or 1 (the kernel's writeback cache)\n",
                           o);
                return 1;
            }
            continue;
        }
        if (o == "direct_io") {
            g_direct_io = true;  // a fuse_config setting, not a mount option
            continue;
        }
        if (o.rfind("threads=", 0) == 0) {  // the session loop's, not the kernel's
            auto n = parse_threads(o.substr(8));
            if (!n) {
                fmt::print(stderr,
                           "softblk fat mount: -o {} takes a number of threads from 1 to {}\n", o,
                           k_max_threads);
                return 1;
            }
            threads = *n;
            continue;
        }
        if (o.rfind("poll_us=", 0) == 0) {  // the session loop's, not the kernel's
            auto ok = check_poll_window(o.substr(8));
            if (!ok) {
                fmt::print(stderr, "softblk fat mount: -o {}: poll_us takes {}\n", o,
                           ok.error().message);
                return 1;
            }
            poll_us = o.substr(8);
            continue;
        }
        if (o.rfind("colocate=", 0) == 0) {  // the session loop's, not the kernel's
            auto ok = check_colocation(o.substr(9));
            if (!ok) {
                fmt::print(stderr, "softblk fat mount: -o {}: colocate takes {}\n", o,
                           ok.error().message);
                return 1;
            }
            colocate = o.substr(9);
            continue;
        }
        opts += "," + o;
    }
    std::vector<std::string> args = {"softblk-fat", "-o", opts};
    std::vector<char*> argv;
    for (auto& a : args) {
        argv.push_back(a.data());
    }
    fuse_args fargs = FUSE_ARGS_INIT(static_cast<int>(argv.size()), argv.data());
    fuse* f = fuse_new(&fargs, &ops, sizeof ops, &v);
    fuse_opt_free_args(&fargs);
    if (f == nullptr) {
        fmt::print(stderr, "softblk fat mount: bad FUSE options \"{}\"\n", opts);
        return 1;
    }
    // Resolved before mounting: afterwards a lookup of the mount point
    // would wait for this thread to serve it.
    std::string absolute = mountpoint;
    if (char* real = ::realpath(mountpoint.c_str(), nullptr)) {
        absolute = real;
        std::free(real);
    }
    if (fuse_mount(f, mountpoint.c_str()) != 0) {
        fuse_destroy(f);
        fmt::print(stderr,
                   "softblk fat mount: cannot mount on {} (does it exist? is /dev/fuse usable?)\n",
                   mountpoint);
        return 1;
    }
    if (!g_direct_io) {
        set_own_read_ahead(absolute);
    }
    if (!read_only && !g_direct_io && writeback == "1") {
        g_writeback_wanted = true;
        say_writeback_limits(absolute);
    }
    int rc = 1;
    if (fuse_daemonize(foreground ? 1 : 0) == 0) {
        fuse_session* se = fuse_get_session(f);
        bool handlers = fuse_set_signal_handlers(se) == 0;
        // One thread serves every request unless -o threads=N says more.
        // The volume's lock serialises the operations anyway; more threads
        // only overlap what runs outside it (the kernel's copies to and
        // from the page cache) and cost the rest: the kernel hands each
        // request to the thread that has waited longest, so consecutive
        // requests bounce between threads, and a RELEASE served beside the
        // next create's LOOKUP contends for the lock. Measured with 8
        // threads (docs/fat.md has the figures): creates slower, sequential
        // reads through the page cache faster. The pool's
        // threads are never ended (libfuse's default): with at most 2 idle,
        // as before, a thread was started and ended every third create.
        if (threads > 1) {
            fuse_loop_config* cfg = fuse_loop_cfg_create();
            fuse_loop_cfg_set_max_threads(cfg, threads);
            rc = fuse_loop_mt(f, cfg) == 0 ? 0 : 1;
            fuse_loop_cfg_destroy(cfg);
        } else {
            rc = serve_session(se, poll_us, colocate, g_direct_io, write_past_libfuse);
        }
        if (handlers) {
            fuse_remove_signal_handlers(se);
        }
    }
    fuse_unmount(f);
    fuse_destroy(f);
    return rc;
}

}  // namespace softblk::fat::detail
