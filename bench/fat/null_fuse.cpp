#define FUSE_USE_VERSION 312
#include "null_fuse.hpp"
#include "timing.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <string>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include <fmt/format.h>

#include "fuse_mount.hpp"

namespace softblk::fat::bench {

namespace {

// As long as the FAT mount caches names and attributes (fuse_mount.cpp).
constexpr double k_timeout = 3600.0;

std::atomic<fuse_ino_t> g_next_ino{2};

void fill(fuse_ino_t ino, struct stat& st)
{
    std::memset(&st, 0, sizeof st);
    st.st_ino = ino;
    st.st_mode = ino == FUSE_ROOT_ID ? (S_IFDIR | 0755) : (S_IFREG | 0644);
    st.st_nlink = ino == FUSE_ROOT_ID ? 2 : 1;
    st.st_uid = getuid();
    st.st_gid = getgid();
}

void op_lookup(fuse_req_t req, fuse_ino_t, const char*)
{
    fuse_reply_err(req, ENOENT);  // every name is new: the benchmark's creates
}

void op_getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*)
{
    struct stat st;
    fill(ino, st);
    fuse_reply_attr(req, &st, k_timeout);
}

void op_create(fuse_req_t req, fuse_ino_t, const char*, mode_t, fuse_file_info* fi)
{
    fuse_entry_param e{};
    e.ino = g_next_ino.fetch_add(1);
    e.generation = 1;
    fill(e.ino, e.attr);
    e.attr_timeout = k_timeout;
    e.entry_timeout = k_timeout;
    fi->fh = 0;
    // As the FAT mount opens a file nobody else has open write-only.
    fi->direct_io = (fi->flags & O_ACCMODE) == O_WRONLY ? 1 : 0;
    fuse_reply_create(req, &e, fi);
}

void op_write(fuse_req_t req, fuse_ino_t, const char*, size_t size, off_t, fuse_file_info*)
{
    fuse_reply_write(req, size);
}

void op_release(fuse_req_t req, fuse_ino_t, fuse_file_info*)
{
    fuse_reply_err(req, 0);
}

}  // namespace

std::optional<null_fuse_figures> measure_null_fuse(int files, uint64_t write_bytes,
                                                   const std::string& poll_us,
                                                   const std::string& colocate)
{
    if (access("/dev/fuse", R_OK | W_OK) != 0 || files <= 0) {
        return std::nullopt;
    }
    fuse_lowlevel_ops ops{};
    ops.lookup = op_lookup;
    ops.getattr = op_getattr;
    ops.create = op_create;
    ops.release = op_release;
    ops.write = op_write;
    std::vector<std::string> args = {"softblk-null-fuse", "-o", "fsname=softblk-null-fuse"};
    std::vector<char*> argv;
    for (auto& a : args) {
        argv.push_back(a.data());
    }
    fuse_args fargs = FUSE_ARGS_INIT(static_cast<int>(argv.size()), argv.data());
    fuse_session* se = fuse_session_new(&fargs, &ops, sizeof ops, nullptr);
    fuse_opt_free_args(&fargs);
    if (se == nullptr) {
        return std::nullopt;
    }
    char tmpl[] = "/tmp/softblk-null-fuse-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
        fuse_session_destroy(se);
        return std::nullopt;
    }
    std::string dir = tmpl;
    if (fuse_session_mount(se, dir.c_str()) != 0) {
        fuse_session_destroy(se);
        rmdir(dir.c_str());
        return std::nullopt;
    }
    std::thread server([se, &poll_us, &colocate] {
        softblk::fat::detail::serve_session(se, poll_us, colocate, false);
    });
    null_fuse_figures fig;
    struct statfs sf {};
    // Requests for a while first, as the FAT mount has served before its
    // creates are timed: the poll window and the placement are chosen by
    // then (auto sweeps; a placement sweep is four epochs of 200 ms).
    auto t = std::chrono::steady_clock::now();
    while (seconds_since(t) < 1.0) {
        ::statfs(dir.c_str(), &sf);
    }
    t = std::chrono::steady_clock::now();
    for (int i = 0; i < files; ++i) {
        ::statfs(dir.c_str(), &sf);
    }
    fig.statfs_us = seconds_since(t) * 1e6 / files;
    bool ok = true;
    t = std::chrono::steady_clock::now();
    for (int i = 0; i < files && ok; ++i) {
        int fd = ::open(fmt::format("{}/f{:06d}.dat", dir, i).c_str(), O_WRONLY | O_CREAT | O_EXCL,
                        0644);
        ok = fd >= 0;
        if (ok) {
            ::close(fd);
        }
    }
    fig.create_us = seconds_since(t) * 1e6 / files;
    // 16 KiB writes, as the FAT benchmark's, best of three as its are:
    // through a write-only open (direct I/O), then a read-write one (the
    // page cache's write-through), each round on a new file.
    std::vector<char> data(16384, 'w');
    const uint64_t writes = std::max<uint64_t>(write_bytes / data.size(), 1);
    auto best_write_us = [&](int access, const char* prefix) {
        double best = 0;
        for (int round = 0; round < 3 && ok; ++round) {
            int fd = ::open(fmt::format("{}/{}{}.bin", dir, prefix, round).c_str(),
                            access | O_CREAT | O_EXCL, 0644);
            ok = fd >= 0;
            t = std::chrono::steady_clock::now();
            for (uint64_t i = 0; i < writes && ok; ++i) {
                ok = ::pwrite(fd, data.data(), data.size(), static_cast<off_t>(i * data.size())) ==
                     static_cast<ssize_t>(data.size());
            }
            const double us = seconds_since(t) * 1e6 / static_cast<double>(writes);
            best = round == 0 ? us : std::min(best, us);
            if (fd >= 0) {
                ::close(fd);
            }
        }
        return best;
    };
    fig.write_16k_us = best_write_us(O_WRONLY, "w");
    fig.write_16k_rw_us = best_write_us(O_RDWR, "rw");
    // The loop ends when the kernel says the file system is gone.
    ok = std::system(fmt::format("fusermount3 -u {}", dir).c_str()) == 0 && ok;
    if (!ok) {
        fuse_session_exit(se);
        fuse_session_unmount(se);
    }
    server.join();
    fuse_session_unmount(se);
    fuse_session_destroy(se);
    rmdir(dir.c_str());
    return ok ? std::optional(fig) : std::nullopt;
}

}  // namespace softblk::fat::bench
