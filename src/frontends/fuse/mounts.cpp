#include "mounts.hpp"

#include "loop_device.hpp"

#include <cerrno>
#include <csignal>
#include <dirent.h>
#include <mutex>
#include <set>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

namespace softblk::fuse {

namespace {

std::mutex g_live_lock;
std::multiset<std::string, std::less<>>& live_mounts()
{
    static std::multiset<std::string, std::less<>> mounts;
    return mounts;
}

bool starts_with_dir(const std::string& path, const std::string& dir)
{
    return path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 &&
           path[dir.size()] == '/';
}

}  // namespace

pid_t source_pid(const std::string& source)
{
    const std::string prefix = std::string(k_subtype) + ":";
    if (source.compare(0, prefix.size(), prefix) != 0) {
        return -1;
    }
    const size_t end = source.find(':', prefix.size());
    if (end == std::string::npos || end == prefix.size()) {
        return -1;
    }
    const std::string digits = source.substr(prefix.size(), end - prefix.size());
    if (digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 9) {
        return -1;
    }
    return static_cast<pid_t>(std::stol(digits));
}

void register_live_mount(const std::string& mount_point)
{
    std::lock_guard guard(g_live_lock);
    live_mounts().insert(mount_point);
}

void unregister_live_mount(const std::string& mount_point)
{
    std::lock_guard guard(g_live_lock);
    auto& mounts = live_mounts();
    if (auto it = mounts.find(mount_point); it != mounts.end()) {
        mounts.erase(it);
    }
}

bool is_live_mount(const std::string& mount_point)
{
    std::lock_guard guard(g_live_lock);
    return live_mounts().contains(mount_point);
}

bool is_stale(const mount_entry& entry)
{
    if (is_live_mount(entry.mount_point)) {
        return false;
    }
    const pid_t pid = source_pid(entry.source);
    if (pid <= 0 || (::kill(pid, 0) < 0 && errno == ESRCH)) {
        return true;
    }
    // The pid exists: it is another daemon serving this run directory, or
    // a new process that reused the number. A dead connection tells.
    struct statfs st {};
    return ::statfs(entry.mount_point.c_str(), &st) < 0 && errno == ENOTCONN;
}

bool remove_stale_mount(const mount_entry& entry)
{
    bool clean = true;
    for (unsigned number : loops_backed_under(entry.mount_point + "/")) {
        // Ours only if its file is on this very mount.
        const auto backing = loop_backing_of(number);
        if (backing && backing->device == entry.device && !detach_loop(number, *backing, 2000)) {
            clean = false;
        }
    }
    // By path: only while the stale mount is what the path reaches (a
    // mount on top of it is someone else's).
    if (auto top = top_mount_at(entry.mount_point); top && top->device == entry.device) {
        if (::umount2(entry.mount_point.c_str(), MNT_DETACH) < 0 && errno != EINVAL &&
            errno != ENOENT) {
            clean = false;
        }
    } else if (top) {
        clean = false;
    }
    if (::rmdir(entry.mount_point.c_str()) < 0 && errno != ENOENT) {
        clean = false;
    }
    return clean;
}

void cleanup_stale_under(const std::string& fuse_dir)
{
    std::set<std::string> mounted;
    for (const mount_entry& entry : read_mounts()) {
        if (!starts_with_dir(entry.mount_point, fuse_dir)) {
            continue;
        }
        mounted.insert(entry.mount_point);
        if (entry.fstype == k_fstype && is_stale(entry)) {
            remove_stale_mount(entry);
        }
    }
    // No pass over loop devices whose backing path lies below fuse_dir
    // without a mount: the file of a lazily unmounted export shows as
    // "/NAME" (unreachable from here), so such a path is a file of the file
    // system beneath or of another mount namespace's mount: not ours.
    // Directories left without a mount.
    DIR* dir = ::opendir(fuse_dir.c_str());
    if (dir == nullptr) {
        return;
    }
    std::vector<std::string> empty;
    while (const dirent* entry = ::readdir(dir)) {
        const std::string name = entry->d_name;
        if (name == "." || name == "..") {
            continue;
        }
        const std::string path = fuse_dir + "/" + name;
        if (!mounted.contains(path) && !is_live_mount(path)) {
            empty.push_back(path);
        }
    }
    ::closedir(dir);
    for (const std::string& path : empty) {
        ::rmdir(path.c_str());  // only succeeds when empty: never removes user data
    }
}

}  // namespace softblk::fuse
