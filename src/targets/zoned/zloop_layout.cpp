#include "zloop_layout.hpp"

#include <cerrno>
#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <fmt/core.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/vfs.h>
#include <unistd.h>

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

// Every zone file in `dir` must belong to the configuration: a file of the
// other type or past the last zone means the directory was made with other
// options (zloop would use it silently; softblk refuses).
result<bool> scan(int dir_fd, const std::string& dir, const geometry& g)
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
    bool first_zone = false;
    std::string error;
    while (const dirent* e = ::readdir(d)) {
        const parsed_name p = parse_name(e->d_name);
        if (!p.valid) {
            continue;
        }
        if (p.zone == 0) {
            first_zone = true;  // zloop_dev_exists: cnv-000000 or seq-000000
        }
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
    return first_zone;
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

zone_files::zone_files(zone_files&& other) noexcept
    : files(std::move(other.files)),
      block_size(other.block_size),
      restored(other.restored),
      dir_fd(other.dir_fd),
      dir(std::move(other.dir)),
      torn_writes_cut(std::move(other.torn_writes_cut))
{
    other.dir_fd = -1;
}

zone_files::~zone_files()
{
    if (dir_fd >= 0) {
        ::close(dir_fd);
    }
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

result<zone_files> open_zone_files(const std::string& dir, const geometry& g)
{
    zone_files out;
    out.dir = dir;
    out.dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (out.dir_fd < 0) {
        const int err = errno;
        return make_error(err == ENOENT ? ENOENT : err,
                          fmt::format("{}: {}; the zone files live in BASE_DIR/ID, which must "
                                      "exist (mkdir -p {}), as for the kernel's zloop",
                                      dir, std::strerror(err), dir));
    }
    auto restore = scan(out.dir_fd, dir, g);
    if (!restore) {
        return std::unexpected(restore.error());
    }
    out.restored = *restore;

    // zloop_get_block_size: the file system's block size up to 4 KiB, else
    // what direct I/O needs (known once the first file is open).
    struct statfs sfs {};
    if (::fstatfs(out.dir_fd, &sfs) != 0) {
        const int err = errno;
        return make_error(err, fmt::format("{}: statfs: {}", dir, std::strerror(err)));
    }
    uint32_t bs = sfs.f_bsize <= 4096 ? static_cast<uint32_t>(sfs.f_bsize) : 0;

    out.files.reserve(g.nr_zones);
    for (uint32_t i = 0; i < g.nr_zones; ++i) {
        const bool conv = i < g.conv_zones;
        const std::string path = dir + "/" + zone_file_name(i, conv);
        // A new conventional zone file is made sparse at the zone size by
        // the engine; a new sequential one is empty, made here (0600, as
        // zloop makes them).
        if (!out.restored && !conv) {
            const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
            if (fd < 0) {
                const int err = errno;
                return make_error(err, fmt::format("{}: {}", path, std::strerror(err)));
            }
            ::close(fd);
        }
        backing_file_options fo{.read_only = false,
                                .buffered_io = g.buffered_io,
                                .create = !out.restored && conv,
                                .grow_to = conv ? g.zone_size : 0};
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
            if (f.block_device()) {
                return make_error(EINVAL, fmt::format("{}: a block device; zone files are "
                                                      "regular files",
                                                      path));
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
                return make_error(ENOENT, fmt::format("{}: missing; the directory holds a zloop "
                                                      "device with fewer zones or other zone "
                                                      "types than this configuration",
                                                      path));
            }
            return std::unexpected(f.error());
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
    return out;
}

}  // namespace softblk::targets::zloop
