#include "zloop_layout.hpp"

#include <cerrno>
#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <fmt/core.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/vfs.h>
#include <unistd.h>
#include <utility>

#include <softblk/support/fd_guard.hpp>
#include <softblk/support/trusted_dir.hpp>

namespace softblk::targets::zloop {

namespace {

// A zone file's name parsed: cnv-/seq- and six or more digits.
struct parsed_name {
    bool valid = false;
    bool conventional = false;
    uint32_t zone = 0;
};

parsed_name parse_name(const char* name)
{
    parsed_name p;
    const size_t len = std::strlen(name);
    if (len < 10 || name[3] != '-') {
        return p;
    }
    if (std::strncmp(name, "cnv", 3) == 0) {
        p.conventional = true;
    } else if (std::strncmp(name, "seq", 3) != 0) {
        return p;
    }
    const char* first = name + 4;
    const char* last = name + len;
    auto [end, ec] = std::from_chars(first, last, p.zone);
    p.valid = ec == std::errc() && end == last;
    return p;
}

// What scan() found in the directory.
struct scanned {
    bool first_zone = false;  // cnv-000000 or seq-000000: a restore
    int64_t last_zone = -1;   // the highest zone with a file
};

// Every zone file in `dir` must belong to the configuration: a file of the
// other type or past the last zone means the directory was made with other
// options (zloop would use it silently; softblk refuses).
result<scanned> scan(int dir_fd, const std::string& dir, const geometry& g)
{
    const int fd = ::dup(dir_fd);
    if (fd < 0) {
        return make_error(errno, fmt::format("{}: {}", dir, std::strerror(errno)));
    }
    DIR* d = ::fdopendir(fd);
    if (d == nullptr) {
        const int err = errno;
        ::close(fd);
        return make_error(err, fmt::format("{}: {}", dir, std::strerror(err)));
    }
    scanned found;
    std::string error;
    while (const dirent* e = ::readdir(d)) {
        const parsed_name p = parse_name(e->d_name);
        if (!p.valid) {
            continue;
        }
        if (p.zone == 0) {
            found.first_zone = true;  // zloop_dev_exists: cnv-000000 or seq-000000
        }
        found.last_zone = std::max<int64_t>(found.last_zone, p.zone);
        if (p.zone >= g.nr_zones) {
            error = fmt::format(
                "{}/{}: zone {} is beyond the {} zones of this configuration "
                "(capacity_mb / zone_size_mb differ from the ones the directory "
                "was made with)",
                dir, e->d_name, p.zone, g.nr_zones);
            break;
        }
        if (p.conventional != (p.zone < g.conv_zones)) {
            error = fmt::format(
                "{}/{}: zone {} is {} here but {} in this configuration "
                "(conv_zones={} differs from the one the directory was made with)",
                dir, e->d_name, p.zone, p.conventional ? "conventional" : "sequential",
                p.conventional ? "sequential" : "conventional", g.conv_zones);
            break;
        }
    }
    ::closedir(d);
    if (!error.empty()) {
        return make_error(EINVAL, error);
    }
    return found;
}

// A restore found zone `zone`'s file missing: deleted (a later zone has a
// file) or a directory of fewer zones.
std::unexpected<error> missing_zone_file(const std::string& path, uint32_t zone,
                                         const scanned& found, const geometry& g)
{
    if (found.last_zone > zone) {
        return make_error(
            ENOENT, fmt::format("{}: missing, though the zone files up to zone {} "
                                "exist: it was deleted or renamed, and zone {}'s "
                                "data with it; put it back{}",
                                path, found.last_zone, zone,
                                zone < g.conv_zones ? " (a conventional zone file holds the zone "
                                                      "size)"
                                                    : " (an empty file makes an empty zone)"));
    }
    return make_error(ENOENT, fmt::format("{}: missing; the directory holds a zloop device of "
                                          "{} zones, fewer than the {} of this configuration "
                                          "(capacity_mb / zone_size_mb differ from the ones it "
                                          "was made with)",
                                          path, found.last_zone + 1, g.nr_zones));
}

// base_dir and BASE_DIR/ID hold files the daemon names itself: only the
// daemon's user or root may own them, and no one else write them.
constexpr directory_rules k_zone_dir_rules{
    .role = "base_dir",
    .remedy = "use a directory of your own (or root's) as base_dir",
    .root_may_own = true,
    .trust_root_groups = true,
};

// Opens `base` (a directory, or a link to one owned by root or us) and
// checks it and every directory above it.
result<int> open_base_dir(const std::string& base)
{
    if (auto ok = check_dirs_above(base, k_zone_dir_rules); !ok) {
        return std::unexpected(ok.error());
    }
    struct stat st {};
    if (::lstat(base.c_str(), &st) != 0) {
        const int err = errno;
        return make_error(err, fmt::format("base_dir={}: {}{}", base, std::strerror(err),
                                           err == ENOENT ? fmt::format("; create it and the "
                                                                       "device's directory "
                                                                       "(mkdir -p {}/0)",
                                                                       base)
                                                         : ""));
    }
    const bool link = S_ISLNK(st.st_mode);
    if (link && st.st_uid != 0 && st.st_uid != ::geteuid()) {
        return make_error(EPERM, fmt::format("base_dir={} is a symbolic link owned by {}: that "
                                             "user could point it elsewhere; give the directory "
                                             "itself",
                                             base, describe_uid(st.st_uid)));
    }
    fd_guard fd;
    fd.fd = ::open(base.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | (link ? 0 : O_NOFOLLOW));
    if (fd.fd < 0 || ::fstat(fd.fd, &st) != 0) {
        const int err = errno;
        return make_error(err, fmt::format("base_dir={}: {}", base, std::strerror(err)));
    }
    if (auto ok = check_trusted_dir(base, st, k_zone_dir_rules); !ok) {
        return std::unexpected(ok.error());
    }
    return fd.release();
}

// Opens, checks and locks `base`/`id` below `base_fd`. ENOENT when it does
// not exist, EWOULDBLOCK when another device holds it.
result<zone_dir> open_id_dir(int base_fd, const std::string& base, int64_t id)
{
    zone_dir d;
    d.id = id;
    d.path = fmt::format("{}/{}", base, id);
    d.fd = ::openat(base_fd, std::to_string(id).c_str(),
                    O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (d.fd < 0) {
        const int err = errno;
        if (err == ENOENT) {
            return make_error(ENOENT, fmt::format("{}: no such directory; the zone files live "
                                                  "in BASE_DIR/ID, which must exist (mkdir {}), "
                                                  "as for the kernel's zloop",
                                                  d.path, d.path));
        }
        // A link or something else than a directory: named as such.
        struct stat st {};
        if ((err == ELOOP || err == ENOTDIR) &&
            ::fstatat(base_fd, std::to_string(id).c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
            if (auto ok = check_trusted_dir(d.path, st, k_zone_dir_rules); !ok) {
                return std::unexpected(ok.error());
            }
        }
        return make_error(err, fmt::format("{}: {}", d.path, std::strerror(err)));
    }
    struct stat st {};
    if (::fstat(d.fd, &st) != 0) {
        const int err = errno;
        return make_error(err, fmt::format("{}: {}", d.path, std::strerror(err)));
    }
    if (auto ok = check_trusted_dir(d.path, st, k_zone_dir_rules); !ok) {
        return std::unexpected(ok.error());
    }
    // One device per directory, in this daemon or another (flock is per
    // open file description, so two devices of one process conflict too).
    if (::flock(d.fd, LOCK_EX | LOCK_NB) != 0) {
        const int err = errno;
        if (err == EWOULDBLOCK) {
            return make_error(EWOULDBLOCK,
                              fmt::format("{} is in use by another zloop device (of this daemon "
                                          "or another: the directory is locked)",
                                          d.path));
        }
        return make_error(err, fmt::format("{}: flock: {}", d.path, std::strerror(err)));
    }
    return d;
}

}  // namespace

std::string zone_file_name(uint32_t zone, bool conventional)
{
    return fmt::format("{}-{:06}", conventional ? "cnv" : "seq", zone);
}

namespace {

// Whether appends of one block to an unnamed direct file in `dir_fd` go
// without blocking (RWF_NOWAIT), its rest preallocated first or not. The
// first append blocks (a new file's timestamps); a later one may still be
// refused for a timestamp that the clock's tick made stale, hence a few.
bool appends_do_not_block(int dir_fd, uint32_t block_size, bool preallocate)
{
    const int fd = ::openat(dir_fd, ".", O_TMPFILE | O_RDWR | O_DIRECT | O_CLOEXEC, 0600);
    if (fd < 0) {
        return false;
    }
    constexpr int k_appends = 4;
    bool unblocked = false;
    const size_t room = std::max<size_t>(block_size, 4096);
    void* block = std::aligned_alloc(room, room);
    if (block != nullptr &&
        (!preallocate || ::fallocate(fd, FALLOC_FL_KEEP_SIZE, 0,
                                     static_cast<off_t>(block_size) * (k_appends + 1)) == 0)) {
        std::memset(block, 0, block_size);
        iovec v{block, block_size};
        bool ok = ::pwritev2(fd, &v, 1, 0, 0) == static_cast<ssize_t>(block_size);
        for (int i = 1; ok && !unblocked && i <= k_appends; ++i) {
            const ssize_t n = ::pwritev2(fd, &v, 1, static_cast<off_t>(block_size) * i, RWF_NOWAIT);
            unblocked = n == static_cast<ssize_t>(block_size);
            ok = unblocked || (n < 0 && errno == EAGAIN &&
                               ::pwritev2(fd, &v, 1, static_cast<off_t>(block_size) * i, 0) ==
                                   static_cast<ssize_t>(block_size));
        }
    }
    std::free(block);
    ::close(fd);
    return unblocked;
}

}  // namespace

bool preallocation_unblocks_appends(int dir_fd, uint32_t block_size)
{
    return !appends_do_not_block(dir_fd, block_size, false) &&
           appends_do_not_block(dir_fd, block_size, true);
}

zone_dir::zone_dir(zone_dir&& other) noexcept
    : fd(other.fd), id(other.id), path(std::move(other.path))
{
    other.fd = -1;
}

namespace {

void unlock_and_close(int fd)
{
    if (fd >= 0) {
        ::flock(fd, LOCK_UN);
        ::close(fd);
    }
}

}  // namespace

zone_dir& zone_dir::operator=(zone_dir&& other) noexcept
{
    if (this != &other) {
        unlock_and_close(fd);
        fd = std::exchange(other.fd, -1);
        id = other.id;
        path = std::move(other.path);
    }
    return *this;
}

zone_dir::~zone_dir()
{
    unlock_and_close(fd);
}

result<zone_dir> open_zone_dir(std::string base, int64_t id)
{
    while (base.size() > 1 && base.back() == '/') {
        base.pop_back();
    }
    if (base.empty() || base.front() != '/') {
        return make_error(EINVAL, fmt::format("base_dir={}: an absolute path", base));
    }
    auto base_fd = open_base_dir(base);
    if (!base_fd) {
        return std::unexpected(base_fd.error());
    }
    fd_guard base_guard{*base_fd};
    if (id >= 0) {
        auto d = open_id_dir(*base_fd, base, id);
        if (!d && d.error().code.value() == EWOULDBLOCK) {
            return make_error(EEXIST, fmt::format("id={}: {}", id, d.error().message));
        }
        return d;
    }
    unsigned busy = 0;
    int64_t missing = -1;
    for (int64_t n = 0; n < 1024; ++n) {
        auto d = open_id_dir(*base_fd, base, n);
        if (d) {
            return d;
        }
        if (d.error().code.value() == EWOULDBLOCK) {
            ++busy;  // another device's: the next one
        } else if (d.error().code.value() != ENOENT) {
            return std::unexpected(d.error());
        } else if (missing < 0) {
            missing = n;
        }
    }
    return make_error(ENOENT, fmt::format("id=-1: no free directory {}/ID ({} in use by other "
                                          "zloop devices); create one: mkdir {}/{}",
                                          base, busy, base, missing < 0 ? 1024 : missing));
}

void zone_files::remove_created()
{
    for (auto it = created.rbegin(); it != created.rend(); ++it) {
        remove_if_same(dir.fd, it->first, it->second);
    }
    created.clear();
}

int64_t stored_bytes(int fd, const geometry& g)
{
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        return -errno;
    }
    const auto size = static_cast<uint64_t>(st.st_size);
    if (size == g.zone_size && g.zone_capacity < g.zone_size) {
        return static_cast<int64_t>(g.zone_capacity);
    }
    return static_cast<int64_t>(size);
}

result<zone_files> open_zone_files(zone_dir dir, const geometry& g)
{
    zone_files out;
    out.dir = std::move(dir);
    const std::string& path_of_dir = out.dir.path;
    const int dir_fd = out.dir.fd;
    auto found = scan(dir_fd, path_of_dir, g);
    if (!found) {
        return std::unexpected(found.error());
    }
    out.restored = found->first_zone;
    // A refusal removes what this call created.
    struct undo {
        zone_files& files;
        bool armed = true;
        ~undo()
        {
            if (armed) {
                files.remove_created();
            }
        }
    } undo_creation{out};

    // zloop_get_block_size: the file system's block size up to 4 KiB, else
    // what direct I/O needs (known once the first file is open).
    struct statfs sfs {};
    if (::fstatfs(dir_fd, &sfs) != 0) {
        const int err = errno;
        return make_error(err, fmt::format("{}: statfs: {}", path_of_dir, std::strerror(err)));
    }
    uint32_t bs = sfs.f_bsize <= 4096 ? static_cast<uint32_t>(sfs.f_bsize) : 0;

    out.files.reserve(g.nr_zones);
    for (uint32_t i = 0; i < g.nr_zones; ++i) {
        const bool conv = i < g.conv_zones;
        const std::string name = zone_file_name(i, conv);
        const std::string path = path_of_dir + "/" + name;
        // A new conventional zone file is made sparse at the zone size by
        // the engine; a new sequential one is empty, made here (0600, as
        // zloop makes them). Never through a link: O_EXCL, and O_NOFOLLOW
        // for one that exists.
        if (!out.restored && !conv) {
            const int fd = ::openat(dir_fd, name.c_str(),
                                    O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
            if (fd >= 0) {
                struct stat st {};
                const bool known = ::fstat(fd, &st) == 0;
                ::close(fd);
                if (known) {
                    out.created.emplace_back(name, identity_of(st));
                }
            } else if (errno != EEXIST) {
                const int err = errno;
                return make_error(err, fmt::format("{}: {}", path, std::strerror(err)));
            }
        }
        backing_file_options fo{.read_only = false,
                                .buffered_io = g.buffered_io,
                                .create = !out.restored && conv,
                                .grow_to = conv ? g.zone_size : 0,
                                .dir_fd = dir_fd,
                                .own_file = true};
        auto check = [&](const backing_file& f) -> result<void> {
            if (bs == 0) {
                bs = std::max<uint32_t>(f.min_block_size(), 512);
            }
            if (bs < f.min_block_size()) {
                return make_error(EINVAL, fmt::format("{}: direct I/O needs blocks of {} bytes, "
                                                      "more than the file system's {}; give "
                                                      "buffered_io=1",
                                                      path, f.min_block_size(), bs));
            }
            const uint64_t size = f.size();
            if (conv) {
                if (out.restored ? size != g.zone_size : size > g.zone_size) {
                    return make_error(EINVAL,
                                      fmt::format("{}: {} bytes, but a conventional zone file "
                                                  "holds the zone size, {} bytes (zone_size_mb "
                                                  "differs from the directory's)",
                                                  path, size, g.zone_size));
                }
                return {};
            }
            if (size > g.zone_capacity && size != g.zone_size) {
                return make_error(EINVAL, fmt::format("{}: {} bytes, more than the zone capacity "
                                                      "({} bytes; zone_size_mb or "
                                                      "zone_capacity_mb differ from the "
                                                      "directory's)",
                                                      path, size, g.zone_capacity));
            }
            return {};
        };
        auto f = backing_file::open(path, fo, check);
        if (!f) {
            if (out.restored && f.error().code.value() == ENOENT) {
                return missing_zone_file(path, i, *found, g);
            }
            return std::unexpected(f.error());
        }
        if ((*f)->created()) {
            out.created.emplace_back(name, (*f)->identity());
        }
        if (!conv && (*f)->size() % bs != 0) {
            // A write torn by a crash (a buffered write, a file system that
            // grew the file before the data landed): the partial block was
            // never acknowledged, so it goes, and the zone comes back at the
            // last whole block. (zloop refuses such a file.)
            const uint64_t keep = (*f)->size() - (*f)->size() % bs;
            if (::ftruncate((*f)->buffered_fd(), static_cast<off_t>(keep)) != 0) {
                const int err = errno;
                return make_error(err, fmt::format("{}: cutting a torn write back to {} bytes: {}",
                                                   path, keep, std::strerror(err)));
            }
            out.torn_writes_cut.push_back(i);
        }
        out.files.push_back(std::move(*f));
    }
    if (g.zone_capacity % bs != 0) {
        return make_error(EINVAL, fmt::format("zone_capacity_mb: {} bytes is not whole blocks of "
                                              "{} bytes (the file system's block size)",
                                              g.zone_capacity, bs));
    }
    out.block_size = bs;
    undo_creation.armed = false;
    return out;
}

}  // namespace softblk::targets::zloop
