// backing_file: opening a file or block device for the file engine
// (include/softblk/file_engine.hpp). Control path only: every refusal is a
// message naming the path and the cause, and a refusal leaves the file
// system as it found it (a file this call created is removed again, and
// nothing is ever truncated).
#include <softblk/file_engine.hpp>

#include <softblk/support/fd_guard.hpp>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <fmt/core.h>
#include <fstream>
#include <linux/fs.h>
#include <linux/magic.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

namespace softblk {

namespace {

// A number from a sysfs attribute of block device `dev`; `fallback` when it
// cannot be read.
uint64_t sysfs_queue_value(dev_t dev, const char* attribute, uint64_t fallback)
{
    const std::string path =
        fmt::format("/sys/dev/block/{}:{}/queue/{}", major(dev), minor(dev), attribute);
    std::ifstream in(path);
    uint64_t value = 0;
    if (in >> value) {
        return value;
    }
    return fallback;
}

// A name for the file system under `fd`, for messages.
std::string file_system_name(int fd)
{
    struct statfs fs {};
    if (::fstatfs(fd, &fs) != 0) {
        return "the file system";
    }
    switch (static_cast<unsigned long>(fs.f_type)) {
    case TMPFS_MAGIC:
        return "tmpfs";
    case RAMFS_MAGIC:
        return "ramfs";
    case FUSE_SUPER_MAGIC:
        return "a FUSE file system";
    case OVERLAYFS_SUPER_MAGIC:
        return "overlayfs";
    case NFS_SUPER_MAGIC:
        return "NFS";
    default:
        return fmt::format("the file system (type 0x{:x})", static_cast<unsigned long>(fs.f_type));
    }
}

std::string errno_text(int err)
{
    return fmt::format("{} ({})", std::strerror(err), strerrorname_np(err));
}

bool power_of_two(uint64_t v)
{
    return v != 0 && (v & (v - 1)) == 0;
}

// Not in <linux/magic.h>: configfs's and fusectl's.
constexpr unsigned long k_configfs_magic = 0x62656570;
constexpr unsigned long k_fusectl_magic = 0x65735543;

// The name of pseudo file system `type`, or nullptr for any other. Its
// files are the kernel's interfaces, not storage: a write renames a thread
// (/proc/self/comm), changes a setting, moves a process to a cgroup.
const char* pseudo_file_system(unsigned long type)
{
    switch (type) {
    case PROC_SUPER_MAGIC:
        return "proc";
    case SYSFS_MAGIC:
        return "sysfs";
    case DEBUGFS_MAGIC:
        return "debugfs";
    case k_configfs_magic:
        return "configfs";
    case CGROUP_SUPER_MAGIC:
        return "cgroup";
    case CGROUP2_SUPER_MAGIC:
        return "cgroup2";
    case TRACEFS_MAGIC:
        return "tracefs";
    case SECURITYFS_MAGIC:
        return "securityfs";
    case BPF_FS_MAGIC:
        return "bpf";
    case PSTOREFS_MAGIC:
        return "pstore";
    case EFIVARFS_MAGIC:
        return "efivarfs";
    case SELINUX_MAGIC:
        return "selinuxfs";
    case SMACK_MAGIC:
        return "smackfs";
    case BINFMTFS_MAGIC:
        return "binfmt_misc";
    case RDTGROUP_SUPER_MAGIC:
        return "resctrl";
    case NSFS_MAGIC:
        return "nsfs";
    case k_fusectl_magic:
        return "fusectl";
    default:
        return nullptr;
    }
}

result<void> check_file_system(const std::string& path, const struct statfs& fs)
{
    if (const char* name = pseudo_file_system(static_cast<unsigned long>(fs.f_type))) {
        return make_error(EINVAL, fmt::format("path={}: a file of {}, a kernel interface rather "
                                              "than storage; give an image file or a block device",
                                              path, name));
    }
    return {};
}

// What `st` (the path, or what it opened) is must be what `options` take.
result<void> check_type(const std::string& path, const struct stat& st,
                        const backing_file_options& options)
{
    if (options.own_file && S_ISLNK(st.st_mode)) {
        return make_error(ELOOP, fmt::format("path={}: a symbolic link, where softblk keeps a "
                                             "file of its own; it does not follow links there: "
                                             "remove it",
                                             path));
    }
    if (S_ISDIR(st.st_mode)) {
        return make_error(EISDIR, fmt::format("path={}: is a directory; give an image file or a "
                                              "block device",
                                              path));
    }
    if (options.own_file && !S_ISREG(st.st_mode)) {
        return make_error(EINVAL, fmt::format("path={}: not a regular file, where softblk "
                                              "keeps one of its own: remove what took its place",
                                              path));
    }
    if (!S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode)) {
        return make_error(EINVAL,
                          fmt::format("path={}: not a regular file or a block device", path));
    }
    return {};
}

}  // namespace

backing_file::~backing_file()
{
    // Unlock explicitly: an io_uring that had the descriptors registered
    // may drop its references only later (its teardown is asynchronous),
    // and a device created next on this file must not find it locked.
    if (_buffered_fd >= 0) {
        ::flock(_buffered_fd, LOCK_UN);
    }
    if (_buffered_fd >= 0 && _buffered_fd != _fd) {
        ::close(_buffered_fd);
    }
    if (_fd >= 0) {
        ::close(_fd);  // releases the flock too
    }
}

result<std::unique_ptr<backing_file>> backing_file::open(const std::string& path,
                                                         const backing_file_options& options,
                                                         const backing_file_check& check)
{
    if (path.empty() || path.front() != '/') {
        return make_error(EINVAL, fmt::format("path={}: give an absolute path (the daemon opens "
                                              "the file, and opens it again after a restart)",
                                              path.empty() ? "\"\"" : path));
    }
    if (options.read_only && options.create) {
        return make_error(EINVAL, fmt::format("path={}: create=1 and read_only=1 together: a "
                                              "read-only device cannot create its file",
                                              path));
    }

    std::unique_ptr<backing_file> f(new backing_file());
    f->_path = path;
    f->_read_only = options.read_only;
    // With the caller's directory, the file is its entry there.
    const int at = options.dir_fd >= 0 ? options.dir_fd : AT_FDCWD;
    const std::string name = options.dir_fd >= 0 ? path.substr(path.rfind('/') + 1) : path;
    const int no_follow = options.own_file ? O_NOFOLLOW : 0;

    // What is there now decides whether this call creates the file.
    struct stat st {};
    bool exists = true;
    if (::fstatat(at, name.c_str(), &st, options.own_file ? AT_SYMLINK_NOFOLLOW : 0) != 0) {
        const int err = errno;
        if (err != ENOENT || !options.create) {
            if (err == ENOENT) {
                return make_error(ENOENT, fmt::format("path={}: no such file (give create=1 and "
                                                      "size= to create a sparse image)",
                                                      path));
            }
            return make_error(err, fmt::format("path={}: {}", path, errno_text(err)));
        }
        exists = false;
        if (options.grow_to == 0) {
            return make_error(EINVAL, fmt::format("path={}: no such file, and create=1 needs "
                                                  "size= to know how large to make it",
                                                  path));
        }
    } else if (auto ok = check_type(path, st, options); !ok) {
        return std::unexpected(ok.error());
    }
    if (exists) {
        // Refused before it is opened: opening a kernel interface may do
        // something already.
        struct statfs fs {};
        const int rc =
            options.dir_fd >= 0 ? ::fstatfs(options.dir_fd, &fs) : ::statfs(path.c_str(), &fs);
        if (rc == 0) {
            if (auto ok = check_file_system(path, fs); !ok) {
                return std::unexpected(ok.error());
            }
        }
    }

    const int access = options.read_only ? O_RDONLY : O_RDWR;
    // The buffered descriptor first: it is the one that creates the file
    // (an O_DIRECT open on a file system that refuses it fails only after
    // creating the file, which would leave it behind). A new file is made
    // with O_EXCL, which never follows a link, and only its owner may read
    // it: it is to hold a device's data.
    fd_guard buffered;
    buffered.fd = ::openat(at, name.c_str(),
                           access | O_CLOEXEC | no_follow | (exists ? 0 : O_CREAT | O_EXCL), 0600);
    if (buffered.fd < 0) {
        const int err = errno;
        std::string cause = errno_text(err);
        if (err == EACCES || err == EPERM) {
            cause = fmt::format("permission denied: {} access needed{}",
                                options.read_only ? "read" : "read and write",
                                options.read_only ? "" : " (read_only=1 needs only read)");
        } else if (err == EROFS) {
            cause = "the file system is read-only (give read_only=1)";
        } else if (err == EBUSY) {
            cause = "the block device is in use";
        } else if ((err == ELOOP && options.own_file) || err == EEXIST) {
            cause =
                "it was replaced while being opened (a symbolic link or a new file took its "
                "place); try again, and check who else writes to its directory";
        }
        return make_error(err, fmt::format("path={}: {}", path, cause));
    }
    // The file opened must be the one looked at (a link or a file swapped
    // in between is refused), and is what it says it is.
    struct stat opened {};
    if (::fstat(buffered.fd, &opened) != 0) {
        const int err = errno;
        return make_error(err, fmt::format("path={}: {}", path, errno_text(err)));
    }
    if (exists && identity_of(opened) != identity_of(st)) {
        return make_error(EAGAIN, fmt::format("path={}: it was replaced while being opened; try "
                                              "again, and check who else writes to its directory",
                                              path));
    }
    st = opened;
    f->_created = !exists;
    f->_identity = identity_of(st);
    // Whatever fails from here removes the file this call created (if it
    // is still the one it created).
    struct unlink_guard {
        int at;
        const std::string& name;
        file_identity id;
        bool armed;
        ~unlink_guard()
        {
            if (armed) {
                remove_if_same(at, name, id);
            }
        }
    } remove_created{at, name, f->_identity, f->_created};
    if (auto ok = check_type(path, st, options); !ok) {
        return std::unexpected(ok.error());
    }
    if (struct statfs fs{}; ::fstatfs(buffered.fd, &fs) == 0) {
        if (auto ok = check_file_system(path, fs); !ok) {
            return std::unexpected(ok.error());
        }
    }
    f->_block_device = S_ISBLK(st.st_mode);

    // One device per image: flock is per open file description, so two
    // devices in one process conflict as two processes do. Read-only
    // devices share the file.
    if (::flock(buffered.fd, (options.read_only ? LOCK_SH : LOCK_EX) | LOCK_NB) != 0) {
        const int err = errno;
        if (err == EWOULDBLOCK) {
            return make_error(EBUSY,
                              fmt::format("path={}: in use by another device (flock); two devices "
                                          "may share a file only when both are read_only=1",
                                          path));
        }
        return make_error(err, fmt::format("path={}: flock: {}", path, errno_text(err)));
    }

    fd_guard direct;
    if (!options.buffered_io) {
        // A writable block device is claimed exclusively (O_EXCL), so that
        // a mounted file system or another holder is refused.
        const int excl = f->_block_device && !options.read_only ? O_EXCL : 0;
        direct.fd = ::openat(at, name.c_str(), access | O_CLOEXEC | O_DIRECT | no_follow | excl);
        struct stat same {};
        if (direct.fd >= 0 &&
            (::fstat(direct.fd, &same) != 0 || identity_of(same) != f->_identity)) {
            return make_error(EAGAIN, fmt::format("path={}: it was replaced while being opened; "
                                                  "try again, and check who else writes to its "
                                                  "directory",
                                                  path));
        }
        if (direct.fd < 0) {
            const int err = errno;
            if (err != EINVAL) {
                std::string cause = errno_text(err);
                if (err == EBUSY) {
                    cause = "the block device is in use (mounted, or claimed by another holder)";
                }
                return make_error(err, fmt::format("path={}: {}", path, cause));
            }
            f->_direct_refused =
                fmt::format("{} refuses O_DIRECT (open: EINVAL); using buffered I/O",
                            file_system_name(buffered.fd));
        }
    }

    if (f->_block_device) {
        uint64_t bytes = 0;
        int lbs = 512;
        unsigned pbs = 512;
        if (::ioctl(buffered.fd, BLKGETSIZE64, &bytes) != 0 ||
            ::ioctl(buffered.fd, BLKSSZGET, &lbs) != 0) {
            const int err = errno;
            return make_error(err, fmt::format("path={}: cannot read the block device's size: {}",
                                               path, errno_text(err)));
        }
        if (::ioctl(buffered.fd, BLKPBSZGET, &pbs) != 0) {
            pbs = static_cast<unsigned>(lbs);
        }
        f->_size = bytes;
        f->_min_block = static_cast<uint32_t>(lbs);
        f->_physical_block = pbs;
        f->_mem_align = static_cast<uint32_t>(
            sysfs_queue_value(st.st_rdev, "dma_alignment", static_cast<uint64_t>(lbs) - 1) + 1);
        f->_max_discard =
            options.read_only ? 0 : sysfs_queue_value(st.st_rdev, "discard_max_bytes", 0);
    } else {
        f->_size = static_cast<uint64_t>(st.st_size);
        f->_physical_block = power_of_two(static_cast<uint64_t>(st.st_blksize))
                                 ? static_cast<uint32_t>(st.st_blksize)
                                 : 4096;
        f->_max_discard = options.read_only ? 0 : UINT32_MAX;
        struct statfs fs {};
        if (::fstatfs(buffered.fd, &fs) == 0) {
            const auto type = static_cast<unsigned long>(fs.f_type);
            f->_memory_fs = type == TMPFS_MAGIC || type == RAMFS_MAGIC;
        }
        if (direct.fd >= 0) {
            struct statx sx {};
            if (::statx(direct.fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 &&
                (sx.stx_mask & STATX_DIOALIGN) != 0 && sx.stx_dio_offset_align != 0) {
                f->_min_block = sx.stx_dio_offset_align;
                f->_mem_align = std::max<uint32_t>(sx.stx_dio_mem_align, 1);
            } else {
                // No alignment reported: the block size of the device the
                // file system sits on is what direct I/O needs.
                f->_min_block =
                    static_cast<uint32_t>(sysfs_queue_value(st.st_dev, "logical_block_size", 512));
                f->_mem_align = f->_min_block;
            }
        }
    }
    if (f->_mem_align < 1 || !power_of_two(f->_mem_align)) {
        f->_mem_align = f->_min_block;
    }

    if (direct.fd >= 0) {
        // Some file systems accept the O_DIRECT open and refuse the I/O:
        // read one block (an empty file reads nothing, which is fine).
        void* probe = std::aligned_alloc(std::max<uint32_t>(f->_mem_align, 4096),
                                         std::max<uint32_t>(f->_min_block, 4096));
        const ssize_t n = probe != nullptr ? ::pread(direct.fd, probe, f->_min_block, 0) : 0;
        const int err = n < 0 ? errno : 0;
        std::free(probe);
        if (err == EINVAL) {
            ::close(direct.release());
            f->_direct_refused =
                fmt::format("{} refuses O_DIRECT reads (EINVAL); using buffered I/O",
                            file_system_name(buffered.fd));
        }
    }
    if (direct.fd < 0) {
        f->_min_block = 512;
        f->_mem_align = 1;
    }

    if (check) {
        if (auto ok = check(*f); !ok) {
            return std::unexpected(ok.error());
        }
    }
    f->_direct = direct.fd >= 0;
    f->_buffered_fd = buffered.release();
    f->_fd = f->_direct ? direct.release() : f->_buffered_fd;
    if (options.create) {
        // A refusal still removes a file this call created (the guard),
        // then closes it (f).
        if (auto grown = f->grow(options.grow_to); !grown) {
            return std::unexpected(grown.error());
        }
    }
    remove_created.armed = false;
    return f;
}

result<uint64_t> backing_file::measure_size()
{
    uint64_t bytes = 0;
    if (_block_device) {
        if (::ioctl(_buffered_fd, BLKGETSIZE64, &bytes) != 0) {
            const int err = errno;
            return make_error(err, fmt::format("path={}: cannot read the block device's size: {}",
                                               _path, errno_text(err)));
        }
    } else {
        struct stat st {};
        if (::fstat(_buffered_fd, &st) != 0) {
            const int err = errno;
            return make_error(err, fmt::format("path={}: {}", _path, errno_text(err)));
        }
        bytes = static_cast<uint64_t>(st.st_size);
    }
    _size.store(bytes, std::memory_order_relaxed);
    return bytes;
}

result<void> backing_file::grow(uint64_t bytes)
{
    if (bytes <= size()) {
        return {};
    }
    if (_block_device) {
        return make_error(EINVAL, fmt::format("path={}: size={} is larger than the block device "
                                              "({} bytes), which cannot grow",
                                              _path, bytes, size()));
    }
    if (_read_only) {
        return make_error(EROFS, fmt::format("path={}: size={} is larger than the file ({} "
                                             "bytes), and a read_only=1 device does not grow it",
                                             _path, bytes, size()));
    }
    if (::ftruncate(_buffered_fd, static_cast<off_t>(bytes)) != 0) {
        const int err = errno;
        return make_error(err, fmt::format("path={}: cannot grow the file to size={}: {}", _path,
                                           bytes, errno_text(err)));
    }
    _size.store(bytes, std::memory_order_relaxed);
    return {};
}

}  // namespace softblk
