// The FUSE operations on the export's one file and its directory:
// attributes, then the data path (read, write, fsync, fallocate, lseek).
// They run on the worker threads; docs/fuse.md has the rules they follow.
#include "open_reply.hpp"
#include "session.hpp"

#include <softblk/support/buffer_pool.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
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

void fuse_export::op_init(void* userdata, fuse_conn_info* conn)
{
    // Splicing costs a pipe and two more system calls per request; for
    // block-sized I/O plain read/writev is faster.
    conn->want &= ~(FUSE_CAP_SPLICE_READ | FUSE_CAP_SPLICE_WRITE | FUSE_CAP_SPLICE_MOVE);
    // The loop driver's direct I/O is asynchronous: let several requests
    // of one file be in flight.
    if ((conn->capable & FUSE_CAP_ASYNC_DIO) != 0) {
        conn->want |= FUSE_CAP_ASYNC_DIO;
    }
    // O_TRUNC comes with open (and is ignored, as by a block device)
    // instead of as a separate truncate to size 0.
    if ((conn->capable & FUSE_CAP_ATOMIC_O_TRUNC) != 0) {
        conn->want |= FUSE_CAP_ATOMIC_O_TRUNC;
    }
    conn->max_write = k_max_io;
    conn->max_read = k_max_io;
    conn->max_background = k_max_background;
    conn->congestion_threshold = k_max_background * 3 / 4;
}

void fuse_export::op_lookup(fuse_req_t req, fuse_ino_t parent, const char* name)
{
    fuse_export& e = self(req);
    if (parent != FUSE_ROOT_ID || e._name != name) {
        fuse_reply_err(req, ENOENT);
        return;
    }
    fuse_entry_param entry{};
    entry.ino = k_file_ino;
    entry.generation = 1;
    entry.attr = e.file_attr();
    // Nothing about the file ever changes while it is mounted.
    entry.attr_timeout = 3600.0;
    entry.entry_timeout = 3600.0;
    fuse_reply_entry(req, &entry);
}

void fuse_export::op_getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*)
{
    fuse_export& e = self(req);
    if (ino == FUSE_ROOT_ID) {
        const struct stat st = e.dir_attr();
        fuse_reply_attr(req, &st, 3600.0);
    } else if (ino == k_file_ino) {
        const struct stat st = e.file_attr();
        fuse_reply_attr(req, &st, 3600.0);
    } else {
        fuse_reply_err(req, ENOENT);
    }
}

void fuse_export::op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set,
                             fuse_file_info*)
{
    fuse_export& e = self(req);
    if (ino != k_file_ino) {
        fuse_reply_err(req, EPERM);
        return;
    }
    // The file is a fixed-size device: truncating to its own size is a
    // no-op (as for a block device); any other size is refused. Mode and
    // owner are fixed; times are not stored (a block device node's times
    // do not reflect its contents either), so touch(1) succeeds.
    if ((to_set & (FUSE_SET_ATTR_MODE | FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID)) != 0) {
        fuse_reply_err(req, EPERM);
        return;
    }
    if ((to_set & FUSE_SET_ATTR_SIZE) != 0 &&
        static_cast<uint64_t>(attr->st_size) != current_capacity(e._limits)) {
        fuse_reply_err(req, EPERM);
        return;
    }
    const struct stat st = e.file_attr();
    fuse_reply_attr(req, &st, 3600.0);
}

void fuse_export::op_open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi)
{
    fuse_export& e = self(req);
    if (ino != k_file_ino) {
        fuse_reply_err(req, EISDIR);
        return;
    }
    if (e._limits.read_only && (fi->flags & O_ACCMODE) != O_RDONLY) {
        fuse_reply_err(req, EROFS);
        return;
    }
    reply_open_direct(req);
}

void fuse_export::op_flush(fuse_req_t req, fuse_ino_t, fuse_file_info*)
{
    // Nothing is buffered in the export (direct I/O); durability is
    // fsync's business. Opens say FOPEN_NOFLUSH, so this is rare.
    fuse_reply_err(req, 0);
}

void fuse_export::op_release(fuse_req_t req, fuse_ino_t, fuse_file_info*)
{
    fuse_reply_err(req, 0);
}

void fuse_export::op_opendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi)
{
    if (ino != FUSE_ROOT_ID) {
        fuse_reply_err(req, ENOTDIR);
        return;
    }
    fuse_reply_open(req, fi);
}

void fuse_export::op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                             fuse_file_info*)
{
    fuse_export& e = self(req);
    if (ino != FUSE_ROOT_ID) {
        fuse_reply_err(req, ENOTDIR);
        return;
    }
    char buf[512];
    size_t used = 0;
    const struct stat dir = e.dir_attr();
    const struct stat file = e.file_attr();
    const struct {
        const char* name;
        const struct stat* st;
    } entries[] = {{".", &dir}, {"..", &dir}, {e._name.c_str(), &file}};
    const size_t limit = std::min(size, sizeof buf);
    for (off_t i = off; i < 3; ++i) {
        const size_t need =
            fuse_add_direntry(req, buf + used, limit - used, entries[i].name, entries[i].st, i + 1);
        if (need > limit - used) {
            break;
        }
        used += need;
    }
    fuse_reply_buf(req, buf, used);
}

void fuse_export::op_releasedir(fuse_req_t req, fuse_ino_t, fuse_file_info*)
{
    fuse_reply_err(req, 0);
}

void fuse_export::op_statfs(fuse_req_t req, fuse_ino_t)
{
    fuse_export& e = self(req);
    struct statvfs st {};
    // The loop driver takes f_bsize as its discard granularity.
    st.f_bsize = e._limits.logical_block_size;
    st.f_frsize = e._limits.logical_block_size;
    st.f_blocks = current_capacity(e._limits) / e._limits.logical_block_size;
    st.f_files = 1;
    st.f_namemax = 255;
    fuse_reply_statfs(req, &st);
}

// ---------------------------------------------------------------- data path

void fuse_export::op_read(fuse_req_t req, fuse_ino_t, size_t size, off_t off, fuse_file_info*)
{
    fuse_export& e = self(req);
    worker& w = *t_worker;
    const uint64_t capacity = current_capacity(e._limits);
    const uint64_t block = e._limits.logical_block_size;
    if (off < 0) {
        fuse_reply_err(req, EINVAL);
        return;
    }
    const uint64_t offset = static_cast<uint64_t>(off);
    if (offset >= capacity || size == 0) {
        fuse_reply_buf(req, nullptr, 0);
        return;
    }
    size = std::min<uint64_t>(size, capacity - offset);
    const uint64_t start = align_down(offset, block);
    const uint64_t end = align_up(offset + size, block);
    if (end - start > w.scratch_size) {
        fuse_reply_err(req, EINVAL);  // larger than max_read: the kernel never sends it
        return;
    }
    if (w.async) {
        submit_async(w, req, io_op::read, start, static_cast<uint32_t>(end - start), nullptr,
                     offset - start, size);
        return;
    }
    const int rc = w.execute(io_op::read, start, end - start, w.scratch);
    if (rc < 0) {
        fuse_reply_err(req, -rc);
        return;
    }
    fuse_reply_buf(req, w.scratch + (offset - start), size);
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

void fuse_export::op_write(fuse_req_t req, fuse_ino_t, const char* buf, size_t size, off_t off,
                           fuse_file_info*)
{
    fuse_export& e = self(req);
    worker& w = *t_worker;
    const uint64_t capacity = current_capacity(e._limits);
    const uint64_t block = e._limits.logical_block_size;
    if (e._limits.read_only) {
        fuse_reply_err(req, EROFS);
        return;
    }
    if (off < 0) {
        fuse_reply_err(req, EINVAL);
        return;
    }
    const uint64_t offset = static_cast<uint64_t>(off);
    if (size == 0) {
        fuse_reply_write(req, 0);
        return;
    }
    if (offset >= capacity) {
        fuse_reply_err(req, ENOSPC);  // as a block device does at its end
        return;
    }
    size = std::min<uint64_t>(size, capacity - offset);
    int rc = 0;
    if (offset % block == 0 && size % block == 0 && w.async) {
        submit_async(w, req, io_op::write, offset, static_cast<uint32_t>(size), buf, 0, size);
        return;
    }
    if (offset % block == 0 && size % block == 0) {
        // The target only reads from the buffer of a write.
        rc = w.execute(io_op::write, offset, size, const_cast<char*>(buf));
    } else if (align_up(offset + size, block) - align_down(offset, block) <= w.scratch_size) {
        rc = e.write_unaligned(w, offset, size, buf);
    } else {
        rc = -EINVAL;  // larger than max_write: the kernel never sends it
    }
    if (rc < 0) {
        fuse_reply_err(req, -rc);
        return;
    }
    fuse_reply_write(req, size);
}

void fuse_export::op_fsync(fuse_req_t req, fuse_ino_t, int, fuse_file_info*)
{
    fuse_export& e = self(req);
    int rc = t_worker->execute(io_op::flush, 0, 0, nullptr);
    // Without a volatile cache there is nothing to flush.
    if (rc == -EOPNOTSUPP && !e._limits.volatile_write_cache) {
        rc = 0;
    }
    fuse_reply_err(req, rc < 0 ? -rc : 0);
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

void fuse_export::op_fallocate(fuse_req_t req, fuse_ino_t, int mode, off_t off, off_t len,
                               fuse_file_info*)
{
    fuse_export& e = self(req);
    worker& w = *t_worker;
    const uint64_t capacity = current_capacity(e._limits);
    const int known = FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE;
    if ((mode & ~known) != 0 ||
        ((mode & FALLOC_FL_PUNCH_HOLE) != 0 && (mode & FALLOC_FL_ZERO_RANGE) != 0)) {
        fuse_reply_err(req, EOPNOTSUPP);
        return;
    }
    if (off < 0 || len <= 0) {
        fuse_reply_err(req, EINVAL);
        return;
    }
    if (e._limits.read_only) {
        fuse_reply_err(req, EROFS);
        return;
    }
    uint64_t offset = static_cast<uint64_t>(off);
    uint64_t end = offset + static_cast<uint64_t>(len);
    if (end > capacity) {
        // The file cannot grow; with KEEP_SIZE the part past the end is
        // simply outside the file.
        if ((mode & FALLOC_FL_KEEP_SIZE) == 0) {
            fuse_reply_err(req, EFBIG);
            return;
        }
        end = capacity;
    }
    if (offset >= end) {
        fuse_reply_err(req, 0);
        return;
    }
    int rc = 0;
    if ((mode & FALLOC_FL_PUNCH_HOLE) != 0) {
        rc = e.zero_range(w, offset, end - offset, true);
    } else if ((mode & FALLOC_FL_ZERO_RANGE) != 0) {
        rc = e.zero_range(w, offset, end - offset, false);
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
    fuse_reply_err(req, rc < 0 ? -rc : 0);
}

void fuse_export::op_lseek(fuse_req_t req, fuse_ino_t, off_t off, int whence, fuse_file_info*)
{
    fuse_export& e = self(req);
    const uint64_t capacity = current_capacity(e._limits);
    if (whence != SEEK_DATA && whence != SEEK_HOLE) {
        fuse_reply_err(req, EINVAL);
        return;
    }
    if (off < 0 || static_cast<uint64_t>(off) >= capacity) {
        fuse_reply_err(req, ENXIO);
        return;
    }
    const uint64_t offset = static_cast<uint64_t>(off);
    // Data: allocated and not known to read as zeros. A hole: the rest.
    for (uint64_t window = offset; window < capacity; window += k_map_window) {
        auto map = t_worker->map(window, std::min(k_map_window, capacity - window));
        if (!map) {
            fuse_reply_err(req, map.error().code.value());
            return;
        }
        for (const extent& x : *map) {
            const bool data = x.allocated && !x.zero;
            if (x.offset + x.length <= offset || data != (whence == SEEK_DATA)) {
                continue;
            }
            fuse_reply_lseek(req, static_cast<off_t>(std::max(offset, x.offset)));
            return;
        }
    }
    if (whence == SEEK_DATA) {
        fuse_reply_err(req, ENXIO);
    } else {
        fuse_reply_lseek(req, static_cast<off_t>(capacity));  // the hole at the end of the file
    }
}

}  // namespace softblk::fuse
