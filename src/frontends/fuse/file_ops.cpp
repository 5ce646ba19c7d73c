// The FUSE operations on the export's one file and its directory:
// attributes, then the data path (read, write, fsync, fallocate, lseek).
// They run on the worker or ring threads and reply through a reply_to,
// with the kernel's reply structures, whichever path the request came by;
// docs/fuse.md has the rules they follow.
#include "session.hpp"

#include <softblk/support/buffer_pool.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <linux/fuse.h>
#include <mutex>
#include <unistd.h>

namespace softblk::fuse {

// ---------------------------------------------------------------- attributes

struct stat fuse_export::file_attr() const
{
    struct stat st {};
    st.st_ino = k_file_ino;
    st.st_mode = S_IFREG | (_limits.read_only ? 0440 : 0660);
    st.st_nlink = 1;
    st.st_uid = _uid;
    st.st_gid = _gid;
    st.st_size = static_cast<off_t>(current_capacity(_limits));
    st.st_blksize =
        static_cast<blksize_t>(std::max(_limits.physical_block_size, _limits.logical_block_size));
    st.st_blocks = static_cast<blkcnt_t>(current_capacity(_limits) / 512);
    st.st_atim = st.st_mtim = st.st_ctim = _created;
    return st;
}

struct stat fuse_export::dir_attr() const
{
    struct stat st {};
    st.st_ino = FUSE_ROOT_ID;
    st.st_mode = S_IFDIR | 0755;
    st.st_nlink = 2;
    st.st_uid = _uid;
    st.st_gid = _gid;
    st.st_atim = st.st_mtim = st.st_ctim = _created;
    return st;
}

namespace {

// Attributes and names are not expected to change while mounted.
constexpr uint64_t k_attr_valid_s = 3600;

fuse_attr kernel_attr(const struct stat& st)
{
    fuse_attr a{};
    a.ino = st.st_ino;
    a.size = static_cast<uint64_t>(st.st_size);
    a.blocks = static_cast<uint64_t>(st.st_blocks);
    a.atime = static_cast<uint64_t>(st.st_atim.tv_sec);
    a.mtime = static_cast<uint64_t>(st.st_mtim.tv_sec);
    a.ctime = static_cast<uint64_t>(st.st_ctim.tv_sec);
    a.atimensec = static_cast<uint32_t>(st.st_atim.tv_nsec);
    a.mtimensec = static_cast<uint32_t>(st.st_mtim.tv_nsec);
    a.ctimensec = static_cast<uint32_t>(st.st_ctim.tv_nsec);
    a.mode = st.st_mode;
    a.nlink = static_cast<uint32_t>(st.st_nlink);
    a.uid = st.st_uid;
    a.gid = st.st_gid;
    a.rdev = static_cast<uint32_t>(st.st_rdev);
    a.blksize = static_cast<uint32_t>(st.st_blksize);
    return a;
}

void reply_attr(const reply_to& r, const struct stat& st)
{
    fuse_attr_out out{};
    out.attr_valid = k_attr_valid_s;
    out.attr = kernel_attr(st);
    r.value(out);
}

// One directory entry as the kernel reads them (struct fuse_dirent, padded
// to 8 bytes) at `out`, if `room` holds it. Returns its padded size.
size_t add_dirent(char* out, size_t room, std::string_view name, const struct stat& st,
                  uint64_t next)
{
    const size_t size = FUSE_DIRENT_ALIGN(FUSE_NAME_OFFSET + name.size());
    if (size > room) {
        return size;
    }
    std::memset(out, 0, size);
    auto* d = reinterpret_cast<fuse_dirent*>(out);
    d->ino = st.st_ino;
    d->off = next;
    d->namelen = static_cast<uint32_t>(name.size());
    d->type = (st.st_mode & S_IFMT) >> 12;
    std::memcpy(out + FUSE_NAME_OFFSET, name.data(), name.size());
    return size;
}

}  // namespace

void fuse_export::serve_lookup(const reply_to& r, uint64_t parent, std::string_view name)
{
    if (parent != FUSE_ROOT_ID || _name != name) {
        r.error(ENOENT);
        return;
    }
    fuse_entry_out out{};
    out.nodeid = k_file_ino;
    out.generation = 1;
    out.entry_valid = k_attr_valid_s;
    out.attr_valid = k_attr_valid_s;
    out.attr = kernel_attr(file_attr());
    r.value(out);
}

void fuse_export::serve_getattr(const reply_to& r, uint64_t ino)
{
    if (ino == FUSE_ROOT_ID) {
        reply_attr(r, dir_attr());
    } else if (ino == k_file_ino) {
        reply_attr(r, file_attr());
    } else {
        r.error(ENOENT);
    }
}

void fuse_export::serve_setattr(const reply_to& r, uint64_t ino, uint32_t valid, uint64_t size)
{
    if (ino != k_file_ino) {
        r.error(EPERM);
        return;
    }
    // The file is a fixed-size device: truncating to its own size is a
    // no-op (as for a block device); any other size is refused. Mode and
    // owner are fixed; times are not stored (a block device node's times
    // do not reflect its contents either), so touch(1) succeeds.
    if ((valid & (FATTR_MODE | FATTR_UID | FATTR_GID)) != 0) {
        r.error(EPERM);
        return;
    }
    if ((valid & FATTR_SIZE) != 0 && size != current_capacity(_limits)) {
        r.error(EPERM);
        return;
    }
    reply_attr(r, file_attr());
}

void fuse_export::serve_open(const reply_to& r, uint64_t ino, uint32_t flags)
{
    if (ino != k_file_ino) {
        r.error(EISDIR);
        return;
    }
    if (_limits.read_only && (flags & O_ACCMODE) != O_RDONLY) {
        r.error(EROFS);
        return;
    }
    fuse_open_out out{};
    // Direct I/O: every read and write reaches the device (no page cache,
    // O_DIRECT or not). No flush on close: nothing is buffered here.
    // Parallel direct writes: the kernel does not serialise writes on the
    // inode lock (the loop driver's requests overlap). libfuse 3.14's
    // fuse_file_info cannot say the last one, hence the raw reply.
    out.open_flags = FOPEN_DIRECT_IO | FOPEN_NOFLUSH | FOPEN_PARALLEL_DIRECT_WRITES;
    r.value(out);
}

void fuse_export::serve_opendir(const reply_to& r, uint64_t ino)
{
    if (ino != FUSE_ROOT_ID) {
        r.error(ENOTDIR);
        return;
    }
    r.value(fuse_open_out{});
}

void fuse_export::serve_readdir(const reply_to& r, uint64_t ino, uint64_t size, uint64_t offset)
{
    if (ino != FUSE_ROOT_ID) {
        r.error(ENOTDIR);
        return;
    }
    char buf[512];
    size_t used = 0;
    const struct stat dir = dir_attr();
    const struct stat file = file_attr();
    const struct {
        std::string_view name;
        const struct stat* st;
    } entries[] = {{".", &dir}, {"..", &dir}, {_name, &file}};
    const size_t limit = std::min<uint64_t>(size, sizeof buf);
    for (uint64_t i = offset; i < std::size(entries); ++i) {
        const size_t need =
            add_dirent(buf + used, limit - used, entries[i].name, *entries[i].st, i + 1);
        if (need > limit - used) {
            break;
        }
        used += need;
    }
    r.data(buf, used);
}

void fuse_export::serve_statfs(const reply_to& r)
{
    fuse_statfs_out out{};
    // The loop driver takes the block size as its discard granularity.
    out.st.bsize = _limits.logical_block_size;
    out.st.frsize = _limits.logical_block_size;
    out.st.blocks = current_capacity(_limits) / _limits.logical_block_size;
    out.st.files = 1;
    out.st.namelen = 255;
    r.value(out);
}

// ---------------------------------------------------------------- data path

void fuse_export::serve_read(const reply_to& r, uint64_t size, int64_t off)
{
    worker& w = *t_worker;
    const uint64_t capacity = current_capacity(_limits);
    const uint64_t block = _limits.logical_block_size;
    if (off < 0) {
        r.error(EINVAL);
        return;
    }
    const uint64_t offset = static_cast<uint64_t>(off);
    if (offset >= capacity || size == 0) {
        r.data(nullptr, 0);
        return;
    }
    size = std::min<uint64_t>(size, capacity - offset);
    const uint64_t start = align_down(offset, block);
    const uint64_t end = align_up(offset + size, block);
    if (end - start > w.scratch_size) {
        r.error(EINVAL);  // larger than max_read: the kernel never sends it
        return;
    }
    if (w.async) {
        submit_async(w, r, io_op::read, start, static_cast<uint32_t>(end - start), nullptr,
                     offset - start, size);
        return;
    }
    // An aligned read goes straight into the reply's own buffer where the
    // path has one (a ring entry), else through the scratch buffer.
    char* into = start == offset && end - start == size ? r.buffer(size) : nullptr;
    if (into == nullptr) {
        into = w.scratch;
    }
    const int rc = w.execute(io_op::read, start, end - start, into);
    if (rc < 0) {
        r.error(-rc);
        return;
    }
    r.data(into + (offset - start), size);
}

int fuse_export::write_unaligned(worker& w, uint64_t offset, size_t length, const char* data)
{
    const uint64_t block = _limits.logical_block_size;
    const uint64_t start = align_down(offset, block);
    const uint64_t end = align_up(offset + length, block);
    // An async write still in flight may cover an edge block: let it land
    // before reading that block back.
    while (w.in_flight != 0) {
        w.queue->wait(1);
    }
    std::lock_guard guard(_rmw_lock);
    if (start != offset) {
        const int rc = w.execute(io_op::read, start, static_cast<uint32_t>(block), w.scratch);
        if (rc < 0) {
            return rc;
        }
    }
    const uint64_t last = end - block;
    if (end != offset + length && (last != start || start == offset)) {
        const int rc =
            w.execute(io_op::read, last, static_cast<uint32_t>(block), w.scratch + (last - start));
        if (rc < 0) {
            return rc;
        }
    }
    if (data != nullptr) {
        std::memcpy(w.scratch + (offset - start), data, length);
    } else {
        std::memset(w.scratch + (offset - start), 0, length);
    }
    return w.execute(io_op::write, start, static_cast<uint32_t>(end - start), w.scratch);
}

void fuse_export::serve_write(const reply_to& r, const char* data, uint64_t size, int64_t off)
{
    worker& w = *t_worker;
    const uint64_t capacity = current_capacity(_limits);
    const uint64_t block = _limits.logical_block_size;
    if (_limits.read_only) {
        r.error(EROFS);
        return;
    }
    if (off < 0) {
        r.error(EINVAL);
        return;
    }
    const uint64_t offset = static_cast<uint64_t>(off);
    if (size == 0) {
        r.value(fuse_write_out{});
        return;
    }
    if (offset >= capacity) {
        r.error(ENOSPC);  // as a block device does at its end
        return;
    }
    size = std::min<uint64_t>(size, capacity - offset);
    int rc = 0;
    if (offset % block == 0 && size % block == 0 && w.async) {
        submit_async(w, r, io_op::write, offset, static_cast<uint32_t>(size), data, 0, size);
        return;
    }
    if (offset % block == 0 && size % block == 0) {
        // The target only reads from the buffer of a write.
        rc = w.execute(io_op::write, offset, size, const_cast<char*>(data));
    } else if (align_up(offset + size, block) - align_down(offset, block) <= w.scratch_size) {
        rc = write_unaligned(w, offset, size, data);
    } else {
        rc = -EINVAL;  // larger than max_write: the kernel never sends it
    }
    if (rc < 0) {
        r.error(-rc);
        return;
    }
    fuse_write_out out{};
    out.size = static_cast<uint32_t>(size);
    r.value(out);
}

void fuse_export::serve_fsync(const reply_to& r)
{
    int rc = t_worker->execute(io_op::flush, 0, 0, nullptr);
    // Without a volatile cache there is nothing to flush.
    if (rc == -EOPNOTSUPP && !_limits.volatile_write_cache) {
        rc = 0;
    }
    r.error(rc < 0 ? -rc : 0);
}

int fuse_export::zero_range(worker& w, uint64_t offset, uint64_t length, bool punch)
{
    const uint64_t block = _limits.logical_block_size;
    const uint64_t end = offset + length;
    const uint64_t inner_start = align_up(offset, block);
    const uint64_t inner_end = std::max(align_down(end, block), inner_start);
    if (inner_end > inner_start) {
        int rc = 0;
        const uint64_t inner = inner_end - inner_start;
        if (punch && _limits.max_discard_bytes != 0) {
            rc = w.execute(io_op::discard, inner_start, inner, nullptr);
        } else if (punch) {
            // A hole may be unmapped, but only if that is cheap: the core
            // refuses a fast zero it would have to write out.
            rc = w.execute(io_op::write_zeroes, inner_start, inner, nullptr, k_io_fast_zero);
        } else {
            // A zeroed range stays allocated (the core writes zeros where
            // the device has no write zeroes).
            rc = w.execute(io_op::write_zeroes, inner_start, inner, nullptr, k_io_no_unmap);
        }
        if (rc < 0) {
            return rc;
        }
    }
    // Partial blocks at the edges: zero the bytes, keep the rest.
    if (offset < inner_start) {
        const uint64_t head_end = std::min(end, inner_start);
        const int rc = write_unaligned(w, offset, head_end - offset, nullptr);
        if (rc < 0) {
            return rc;
        }
    }
    if (end > inner_end) {
        const uint64_t tail_start = inner_end;
        const int rc = write_unaligned(w, tail_start, end - tail_start, nullptr);
        if (rc < 0) {
            return rc;
        }
    }
    return 0;
}

void fuse_export::serve_fallocate(const reply_to& r, int mode, int64_t off, int64_t len)
{
    worker& w = *t_worker;
    const uint64_t capacity = current_capacity(_limits);
    const int known = FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE;
    if ((mode & ~known) != 0 ||
        ((mode & FALLOC_FL_PUNCH_HOLE) != 0 && (mode & FALLOC_FL_ZERO_RANGE) != 0)) {
        r.error(EOPNOTSUPP);
        return;
    }
    if (off < 0 || len <= 0) {
        r.error(EINVAL);
        return;
    }
    if (_limits.read_only) {
        r.error(EROFS);
        return;
    }
    uint64_t offset = static_cast<uint64_t>(off);
    uint64_t end = offset + static_cast<uint64_t>(len);
    if (end > capacity) {
        // The file cannot grow; with KEEP_SIZE the part past the end is
        // simply outside the file.
        if ((mode & FALLOC_FL_KEEP_SIZE) == 0) {
            r.error(EFBIG);
            return;
        }
        end = capacity;
    }
    if (offset >= end) {
        r.error(0);
        return;
    }
    int rc = 0;
    if ((mode & FALLOC_FL_PUNCH_HOLE) != 0) {
        rc = zero_range(w, offset, end - offset, true);
    } else if ((mode & FALLOC_FL_ZERO_RANGE) != 0) {
        rc = zero_range(w, offset, end - offset, false);
    } else {
        // Plain allocation: the device cannot reserve space, so succeed
        // only where every block already is allocated.
        auto map = w.map(offset, end - offset);
        if (!map) {
            rc = -map.error().code.value();
        } else {
            for (const extent& x : *map) {
                if (!x.allocated) {
                    rc = -EOPNOTSUPP;
                    break;
                }
            }
        }
    }
    r.error(rc < 0 ? -rc : 0);
}

void fuse_export::serve_lseek(const reply_to& r, int64_t off, int whence)
{
    const uint64_t capacity = current_capacity(_limits);
    if (whence != SEEK_DATA && whence != SEEK_HOLE) {
        r.error(EINVAL);
        return;
    }
    if (off < 0 || static_cast<uint64_t>(off) >= capacity) {
        r.error(ENXIO);
        return;
    }
    const uint64_t offset = static_cast<uint64_t>(off);
    // Data: allocated and not known to read as zeros. A hole: the rest.
    for (uint64_t window = offset; window < capacity; window += k_map_window) {
        auto map = t_worker->map(window, std::min(k_map_window, capacity - window));
        if (!map) {
            r.error(map.error().code.value());
            return;
        }
        for (const extent& x : *map) {
            const bool data = x.allocated && !x.zero;
            if (x.offset + x.length <= offset || data != (whence == SEEK_DATA)) {
                continue;
            }
            fuse_lseek_out out{};
            out.offset = std::max(offset, x.offset);
            r.value(out);
            return;
        }
    }
    if (whence == SEEK_DATA) {
        r.error(ENXIO);
    } else {
        fuse_lseek_out out{};
        out.offset = capacity;  // the hole at the end of the file
        r.value(out);
    }
}

}  // namespace softblk::fuse
