#include "loop_device.hpp"

#include <softblk/support/fd_guard.hpp>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <fstream>
#include <linux/loop.h>
#include <optional>
#include <sstream>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <thread>
#include <unistd.h>

#include <fmt/core.h>

namespace softblk::fuse {

namespace {

std::string read_sysfs_line(const std::string& path)
{
    std::ifstream in(path);
    std::string line;
    if (!in || !std::getline(in, line)) {
        return {};
    }
    return line;
}

std::string sysfs_dir(unsigned number)
{
    return fmt::format("/sys/block/loop{}/loop", number);
}

std::string device_path(unsigned number)
{
    return fmt::format("/dev/loop{}", number);
}

// The backing file of the loop device open at `fd`; nullopt when it is not
// attached (ENXIO, also while it is being detached).
std::optional<loop_backing> status_of(int fd)
{
    loop_info64 info{};
    if (::ioctl(fd, LOOP_GET_STATUS64, &info) < 0) {
        return std::nullopt;
    }
    return loop_backing{.device = info.lo_device, .inode = info.lo_inode};
}

// True when loop device `number` is attached to a file other than
// `expected`: the one softblk attached is gone from it for certain.
bool backed_by_another(unsigned number, const loop_backing& expected)
{
    fd_guard loop{::open(device_path(number).c_str(), O_RDONLY | O_CLOEXEC)};
    if (loop.fd < 0) {
        return false;
    }
    const auto now = status_of(loop.fd);
    return now && *now != expected;
}

}  // namespace

std::optional<loop_backing> loop_backing_of(unsigned number)
{
    if (loop_backing_file(number).empty()) {
        return std::nullopt;
    }
    fd_guard loop{::open(device_path(number).c_str(), O_RDONLY | O_CLOEXEC)};
    if (loop.fd < 0) {
        return std::nullopt;
    }
    return status_of(loop.fd);
}

bool loop_backed_by(unsigned number, const loop_backing& backing)
{
    const auto now = loop_backing_of(number);
    return now && *now == backing;
}

std::string loop_backing_file(unsigned number)
{
    return read_sysfs_line(sysfs_dir(number) + "/backing_file");
}

result<loop_attachment> attach_loop(const std::string& file, uint32_t block_size, bool read_only)
{
    fd_guard backing{::open(file.c_str(), (read_only ? O_RDONLY : O_RDWR) | O_CLOEXEC)};
    if (backing.fd < 0) {
        const int e = errno;
        return make_error(
            e, fmt::format("{}: cannot open for the loop device: {}", file, std::strerror(e)));
    }
    fd_guard control{::open("/dev/loop-control", O_RDWR | O_CLOEXEC)};
    if (control.fd < 0) {
        const int e = errno;
        return make_error(
            e, fmt::format("/dev/loop-control: {} (loop=1 needs root and the loop driver; "
                           "use loop=0 to export the file only)",
                           std::strerror(e)));
    }
    // Another process may take the free device between GET_FREE and
    // CONFIGURE (EBUSY): ask again.
    for (int attempt = 0; attempt < 16; ++attempt) {
        const int number = ::ioctl(control.fd, LOOP_CTL_GET_FREE);
        if (number < 0) {
            const int e = errno;
            return make_error(
                e, fmt::format("/dev/loop-control: no free loop device: {}", std::strerror(e)));
        }
        const std::string path = fmt::format("/dev/loop{}", number);
        fd_guard loop{::open(path.c_str(), O_RDWR | O_CLOEXEC)};
        if (loop.fd < 0) {
            const int e = errno;
            return make_error(e, fmt::format("{}: {}", path, std::strerror(e)));
        }
        loop_config config{};
        config.fd = static_cast<uint32_t>(backing.fd);
        config.block_size = block_size;
        config.info.lo_flags = LO_FLAGS_DIRECT_IO | (read_only ? LO_FLAGS_READ_ONLY : 0);
        std::strncpy(reinterpret_cast<char*>(config.info.lo_file_name), file.c_str(),
                     LO_NAME_SIZE - 1);
        if (::ioctl(loop.fd, LOOP_CONFIGURE, &config) < 0) {
            const int e = errno;
            if (e == EBUSY) {
                continue;
            }
            return make_error(e, fmt::format("{}: LOOP_CONFIGURE with {} (block size {}): {}", path,
                                             file, block_size, std::strerror(e)));
        }
        // What proves later that the device is still ours: read on the
        // descriptor that attached it, before anyone else could detach it.
        const auto backing_now = status_of(loop.fd);
        if (!backing_now) {
            const int e = errno;
            (void)::ioctl(loop.fd, LOOP_CLR_FD, 0);
            return make_error(e, fmt::format("{}: LOOP_GET_STATUS64 after attaching {}: {}", path,
                                             file, std::strerror(e)));
        }
        loop_attachment out;
        out.path = path;
        out.number = static_cast<unsigned>(number);
        out.direct_io = read_sysfs_line(sysfs_dir(out.number) + "/dio") == "1";
        out.backing = *backing_now;
        return out;
    }
    return make_error(EBUSY,
                      "/dev/loop-control: every free loop device was taken by another process "
                      "before it could be configured (16 attempts)");
}

std::string loop_holder(unsigned number)
{
    const std::string path = fmt::format("/dev/loop{}", number);
    {
        fd_guard probe{::open(path.c_str(), O_RDONLY | O_EXCL | O_CLOEXEC)};
        if (probe.fd >= 0 || errno != EBUSY) {
            return {};
        }
    }
    // Which mount uses it: mountinfo's third field is the device number.
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0) {
        const std::string dev = fmt::format("{}:{}", major(st.st_rdev), minor(st.st_rdev));
        std::ifstream mountinfo("/proc/self/mountinfo");
        for (std::string line; std::getline(mountinfo, line);) {
            std::istringstream fields(line);
            std::string id, parent, device, root, mount_point;
            fields >> id >> parent >> device >> root >> mount_point;
            if (device != dev) {
                continue;
            }
            const size_t dash = line.find(" - ");
            std::string fstype;
            if (dash != std::string::npos) {
                std::istringstream(line.substr(dash + 3)) >> fstype;
            }
            return fmt::format("{} is mounted on {} ({})", path, mount_point, fstype);
        }
    }
    return fmt::format(
        "{} is held exclusively by another program (a file system in another "
        "mount namespace, device mapper, ...)",
        path);
}

result<void> set_loop_capacity(unsigned number, const loop_backing& expected)
{
    const std::string path = device_path(number);
    fd_guard loop{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
    if (loop.fd < 0) {
        const int e = errno;
        return make_error(e, fmt::format("{}: {}", path, std::strerror(e)));
    }
    if (status_of(loop.fd) != expected) {
        return {};  // not ours any more: its size is none of our business
    }
    if (::ioctl(loop.fd, LOOP_SET_CAPACITY, 0) < 0) {
        const int e = errno;
        return make_error(e, fmt::format("{}: LOOP_SET_CAPACITY: {}", path, std::strerror(e)));
    }
    return {};
}

result<void> detach_loop(unsigned number, const loop_backing& expected, unsigned timeout_ms,
                         bool even_if_held)
{
    const std::string path = device_path(number);
    if (loop_backing_file(number).empty()) {
        return {};
    }
    {
        // Held open from the check to LOOP_CLR_FD: while we hold it, the
        // device cannot detach (autoclear waits for the last close), so it
        // cannot be re-attached to another file in between either.
        fd_guard loop{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
        if (loop.fd < 0) {
            const int e = errno;
            if (e == ENOENT || e == ENXIO) {
                return {};  // gone, or being detached already
            }
            return make_error(e, fmt::format("{}: {}", path, std::strerror(e)));
        }
        if (status_of(loop.fd) != expected) {
            return {};  // detached, or attached to someone else's file: not ours
        }
        if (!even_if_held) {
            // A mounted file system holds the device exclusively: refuse
            // rather than leave a detach pending behind the user's back.
            if (std::string holder = loop_holder(number); !holder.empty()) {
                return make_error(EBUSY, fmt::format("{}; unmount it first", holder));
            }
        }
        if (::ioctl(loop.fd, LOOP_CLR_FD, 0) < 0 && errno != ENXIO) {
            const int e = errno;
            return make_error(e, fmt::format("{}: LOOP_CLR_FD: {}", path, std::strerror(e)));
        }
    }
    // The kernel releases the backing file on the last close of the device
    // (ours above, unless another program still has it open). Done when it
    // has no file, or already another one.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (!loop_backing_file(number).empty() && !backed_by_another(number, expected)) {
        if (std::chrono::steady_clock::now() >= deadline) {
            return make_error(
                EBUSY, fmt::format("{} is still open after {} ms; it detaches itself when the "
                                   "last user closes it",
                                   path, timeout_ms));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return {};
}

std::vector<unsigned> loops_backed_under(const std::string& prefix)
{
    std::vector<unsigned> out;
    DIR* dir = ::opendir("/sys/block");
    if (dir == nullptr) {
        return out;
    }
    while (const dirent* entry = ::readdir(dir)) {
        unsigned number = 0;
        char tail = 0;
        if (std::sscanf(entry->d_name, "loop%u%c", &number, &tail) != 1) {
            continue;
        }
        const std::string backing = loop_backing_file(number);
        if (!backing.empty() && backing.compare(0, prefix.size(), prefix) == 0) {
            out.push_back(number);
        }
    }
    ::closedir(dir);
    return out;
}

}  // namespace softblk::fuse
