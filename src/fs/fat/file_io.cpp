// File data: the data path between a file's clusters and the caller's
// buffer (cached sectors, direct transfers of aligned runs, the
// write-behind run that gathers sequential writes), reading, writing and
// truncating a file, the nodes of open files, and class file.
#include <algorithm>
#include <cerrno>
#include <cstring>

#include "volume_state.hpp"

namespace softblk::fat {

using namespace detail;

namespace {

// Aligned transfers of at least this many bytes bypass the data cache.
constexpr uint32_t k_direct_min_bytes = 4096;

// A piece of a byte range of a file that is contiguous on disk. Disk
// positions are file-system byte addresses (sector * bps).
struct piece {
    uint64_t done;             // bytes of the range before this piece
    uint64_t disk_byte;        // where the piece starts on disk
    uint64_t length;           // its length
    uint64_t run_byte;         // where the run of contiguous clusters holding it starts
    uint64_t run_file_offset;  // the file offset held at run_byte
    uint64_t run_end_sector;   // the first sector past that run
};

// Calls step(piece) for each piece of [off, off+len) of `n`'s data, in
// order, mapping the chain as it goes (the chain must be long enough).
// Returns 0, or the first error of the mapping or of a step.
template <class F>
int for_each_piece(volume_state& v, node& n, uint64_t off, uint64_t len, F&& step)
{
    const geometry& g = v.g;
    uint64_t done = 0;
    while (done < len) {
        uint64_t pos = off + done;
        uint32_t in = static_cast<uint32_t>(pos % g.cluster_bytes);
        uint32_t disk = 0;
        uint32_t run = 0;
        int rc = v.map_cluster(n, static_cast<uint32_t>(pos / g.cluster_bytes), disk, run);
        if (rc < 0) {
            return rc;
        }
        piece p;
        p.done = done;
        p.length = std::min<uint64_t>(len - done, uint64_t{run} * g.cluster_bytes - in);
        p.run_byte = g.cluster_sector(disk) * g.bps;
        p.disk_byte = p.run_byte + in;
        p.run_file_offset = pos - in;
        p.run_end_sector = g.cluster_sector(disk) + uint64_t{run} * g.spc;
        rc = step(static_cast<const piece&>(p));
        if (rc < 0) {
            return rc;
        }
        done += p.length;
    }
    return 0;
}

// The frame of a call on an open file: -EBADF when the handle is closed or
// not `permitted` by its open flags; otherwise holds the volume, checks that
// it can be used (for writing if `write`) and returns `body(volume)`.
template <class F>
auto handle_op(volume_state* v, bool permitted, bool write, F&& body) -> decltype(body(*v))
{
    if (v == nullptr || !permitted) {
        return -EBADF;
    }
    op_guard op(*v);
    int rc = v->check_usable(write);
    if (rc < 0) {
        return rc;
    }
    return body(*v);
}

}  // namespace

std::shared_ptr<node> volume_state::node_for(const entry_info& info)
{
    if (!info.is_root) {
        auto it = open_nodes.find(node_key(info.parent_key, info.slot));
        if (it != open_nodes.end()) {
            return it->second;
        }
    }
    auto n = std::make_shared<node>();
    static_cast<entry_ref&>(*n) = info;
    n->first_cluster = info.is_root ? g.root_key() : info.first_cluster;
    n->size = info.is_dir ? 0 : info.size;
    return n;
}

void volume_state::close_node(const std::shared_ptr<node>& n)
{
    if (--n->open_count > 0) {
        return;
    }
    if (n->unlinked) {
        if (n->first_cluster != 0 && !dead && mounted) {
            (void)free_chain(n->first_cluster);
        }
    } else if (!n->is_root) {
        auto it = open_nodes.find(node_key(n->parent_key, n->slot));
        if (it != open_nodes.end() && it->second == n) {
            open_nodes.erase(it);
        }
    }
}

int volume_state::flush_pending()
{
    if (pending_bytes == 0) {
        return 0;
    }
    uint32_t bytes = pending_bytes;
    pending_bytes = 0;
    ++counters.direct_writes;
    return dev.write(pending_sector * g.ratio, bytes / g.bps * g.ratio, pending.data());
}

int volume_state::cached_read(uint64_t sector, uint64_t run_end, uint32_t in, uint32_t len,
                              uint8_t* out)
{
    uint8_t* buf = nullptr;
    int rc = data->get(sector, run_end, sector_cache::fill::read, buf);
    if (rc < 0) {
        return rc;
    }
    std::memcpy(out, buf + in, len);
    return 0;
}

// Reads `len` bytes at fs byte position `pos` (contiguous on disk,
// within sectors < run_end).
int volume_state::transfer_read(uint64_t pos, uint64_t len, uint8_t* out, uint64_t run_end)
{
    while (len > 0) {
        uint64_t sector = pos / g.bps;
        uint32_t in = static_cast<uint32_t>(pos % g.bps);
        if (in == 0 && len >= k_direct_min_bytes && len >= g.bps) {
            uint64_t count = std::min<uint64_t>(len / g.bps, (64u << 20) / g.bps);
            int rc = dev.read(sector * g.ratio, static_cast<uint32_t>(count * g.ratio), out);
            if (rc < 0) {
                return rc;
            }
            data->overlay_dirty(sector, count, out);
            ++counters.direct_reads;
            pos += count * g.bps;
            out += count * g.bps;
            len -= count * g.bps;
            continue;
        }
        uint32_t chunk = static_cast<uint32_t>(std::min<uint64_t>(len, g.bps - in));
        int rc = cached_read(sector, run_end, in, chunk, out);
        if (rc < 0) {
            return rc;
        }
        pos += chunk;
        out += chunk;
        len -= chunk;
    }
    return 0;
}

// Writes `len` bytes (zeros if src is null) at fs byte position `pos`.
// `init_from`: fs byte position from which the old content is garbage
// (sectors starting there are not read before a partial write).
int volume_state::transfer_write(uint64_t pos, uint64_t len, const uint8_t* src, uint64_t init_from)
{
    while (len > 0) {
        uint64_t sector = pos / g.bps;
        uint32_t in = static_cast<uint32_t>(pos % g.bps);
        if (in == 0 && len >= g.bps && (len >= k_direct_min_bytes || src == nullptr)) {
            uint64_t count = std::min<uint64_t>(len / g.bps, (64u << 20) / g.bps);
            if (src == nullptr) {
                count = std::min<uint64_t>(count, zeros.size() / g.bps);
            }
            data->invalidate(sector, count);
            uint64_t bytes = count * g.bps;
            const uint8_t* from = src != nullptr ? src : zeros.data();
            int rc = 0;
            if (opts.write_behind_bytes == mount_options::k_write_behind_auto) {
                // Asked of the device at the first direct write, not at
                // mount: a device may measure it, and read-only work never
                // needs it.
                opts.write_behind_bytes = dev.write_gather_bytes();
            }
            if (bytes < opts.write_behind_bytes) {
                if (pending_bytes != 0 &&
                    (sector * g.bps != pending_sector * g.bps + pending_bytes ||
                     pending_bytes + bytes > opts.write_behind_bytes)) {
                    rc = flush_pending();
                    if (rc < 0) {
                        return rc;
                    }
                }
                if (pending_bytes == 0) {
                    pending_sector = sector;
                    pending.resize(opts.write_behind_bytes);
                }
                std::memcpy(pending.data() + pending_bytes, from, bytes);
                pending_bytes += static_cast<uint32_t>(bytes);
            } else {
                rc = flush_pending();
                if (rc == 0) {
                    rc = dev.write(sector * g.ratio, static_cast<uint32_t>(count * g.ratio), from);
                    ++counters.direct_writes;
                }
                if (rc < 0) {
                    return rc;
                }
            }
            pos += count * g.bps;
            if (src != nullptr) {
                src += count * g.bps;
            }
            len -= count * g.bps;
            continue;
        }
        if (pending_bytes != 0) {
            int rc = flush_pending();  // keep the order of writes to one sector
            if (rc < 0) {
                return rc;
            }
        }
        uint32_t chunk = static_cast<uint32_t>(std::min<uint64_t>(len, g.bps - in));
        bool whole = chunk == g.bps;
        auto how = (whole || sector * g.bps >= init_from) ? sector_cache::fill::zero
                                                          : sector_cache::fill::read;
        uint8_t* buf = nullptr;
        int rc = data->get(sector, sector + 1, how, buf);
        if (rc < 0) {
            return rc;
        }
        if (src != nullptr) {
            std::memcpy(buf + in, src, chunk);
            src += chunk;
        } else {
            std::memset(buf + in, 0, chunk);
        }
        data->mark_dirty(sector);
        pos += chunk;
        len -= chunk;
    }
    return 0;
}

int64_t volume_state::read_node(node& n, uint8_t* out, size_t len, uint64_t off)
{
    if (n.is_dir) {
        return -EISDIR;
    }
    if (off >= n.size) {
        return 0;
    }
    int frc = flush_pending();
    if (frc < 0) {
        return frc;
    }
    uint64_t total = std::min<uint64_t>(len, n.size - off);
    // Map enough of the chain for this transfer in one walk.
    int rc =
        extend_map(n, static_cast<uint32_t>((off + total + g.cluster_bytes - 1) / g.cluster_bytes));
    if (rc == 0) {
        rc = for_each_piece(*this, n, off, total, [&](const piece& p) {
            return transfer_read(p.disk_byte, p.length, out + p.done, p.run_end_sector);
        });
    }
    return rc < 0 ? rc : static_cast<int64_t>(total);
}

// Writes [off, off+len) of the node's chain (already long enough).
int volume_state::write_range(node& n, const uint8_t* src, uint64_t len, uint64_t off,
                              uint64_t old_size)
{
    return for_each_piece(*this, n, off, len, [&](const piece& p) {
        // File offset `old_size` sits at this disk byte (if within the run).
        uint64_t init_from = old_size <= p.run_file_offset
                                 ? p.run_byte
                                 : p.run_byte + (old_size - p.run_file_offset);
        return transfer_write(p.disk_byte, p.length, src != nullptr ? src + p.done : nullptr,
                              init_from);
    });
}

int64_t volume_state::write_node(node& n, const uint8_t* src, size_t len, uint64_t off)
{
    if (n.is_dir) {
        return -EISDIR;
    }
    if (len == 0) {
        return 0;
    }
    if (off > k_max_file_size || len > k_max_file_size - off) {
        return -EFBIG;
    }
    uint64_t end = off + len;
    uint64_t old = n.size;
    uint64_t new_size = std::max(end, old);
    uint32_t want = static_cast<uint32_t>((new_size + g.cluster_bytes - 1) / g.cluster_bytes);
    int rc = ensure_clusters(n, want);
    if (rc < 0) {
        return rc;
    }
    if (off > old) {
        rc = write_range(n, nullptr, off - old, old, old);
        if (rc < 0) {
            return rc;
        }
    }
    rc = write_range(n, src, len, off, old);
    if (rc < 0) {
        return rc;
    }
    n.size = static_cast<uint32_t>(new_size);
    rc = write_entry(n, true);
    if (rc < 0) {
        return rc;
    }
    return static_cast<int64_t>(len);
}

int volume_state::truncate_node(node& n, uint64_t size)
{
    if (n.is_dir) {
        return -EISDIR;
    }
    if (size > k_max_file_size) {
        return -EFBIG;
    }
    uint32_t want = static_cast<uint32_t>((size + g.cluster_bytes - 1) / g.cluster_bytes);
    int rc = 0;
    if (size > n.size) {
        rc = ensure_clusters(n, want);
        if (rc < 0) {
            return rc;
        }
        rc = write_range(n, nullptr, size - n.size, n.size, n.size);
        if (rc < 0) {
            return rc;
        }
    } else {
        rc = extend_map(n, UINT32_MAX);
        if (rc < 0) {
            return rc;
        }
        if (n.mapped > want) {
            rc = shrink_clusters(n, want);
            if (rc < 0) {
                return rc;
            }
        }
    }
    n.size = static_cast<uint32_t>(size);
    return write_entry(n, true);
}

// ============================================================== file

file::file(file&& other) noexcept
    : _volume(other._volume),
      _node(std::move(other._node)),
      _flags(other._flags),
      _position(other._position)
{
    other._volume = nullptr;
}

file& file::operator=(file&& other) noexcept
{
    if (this != &other) {
        close();
        _volume = other._volume;
        _node = std::move(other._node);
        _flags = other._flags;
        _position = other._position;
        other._volume = nullptr;
    }
    return *this;
}

file::~file()
{
    close();
}

int64_t file::pread(void* buffer, size_t length, uint64_t offset)
{
    bool permitted = (_flags & k_open_read) || !(_flags & k_open_write);
    return handle_op(_volume.get(), permitted, false, [&](volume_state& v) {
        return v.read_node(*_node, static_cast<uint8_t*>(buffer), length, offset);
    });
}

int64_t file::pwrite(const void* buffer, size_t length, uint64_t offset)
{
    return handle_op(_volume.get(), (_flags & k_open_write) != 0, true, [&](volume_state& v) {
        uint64_t at = (_flags & k_open_append) ? _node->size : offset;
        return v.write_node(*_node, static_cast<const uint8_t*>(buffer), length, at);
    });
}

int64_t file::read(void* buffer, size_t length)
{
    int64_t n = pread(buffer, length, _position);
    if (n > 0) {
        _position += static_cast<uint64_t>(n);
    }
    return n;
}

int64_t file::write(const void* buffer, size_t length)
{
    int64_t n = pwrite(buffer, length, _position);
    if (n > 0) {
        _position = (_flags & k_open_append) ? size() : _position + static_cast<uint64_t>(n);
    }
    return n;
}

int file::truncate(uint64_t size)
{
    return handle_op(_volume.get(), (_flags & k_open_write) != 0, true,
                     [&](volume_state& v) { return v.truncate_node(*_node, size); });
}

int file::fsync()
{
    return handle_op(_volume.get(), true, false,
                     [&](volume_state& v) { return v.read_only ? 0 : v.sync_all(); });
}

uint64_t file::size() const
{
    if (_volume == nullptr) {
        return 0;
    }
    std::lock_guard lock(_volume->mu);
    return _node->size;
}

result<file_stat> file::stat() const
{
    if (_volume == nullptr) {
        return make_error(EBADF, "stat: the file is closed");
    }
    op_guard op(*_volume);
    auto& v = *_volume;
    file_stat st;
    if (_node->is_root || _node->unlinked) {
        st.is_directory = _node->is_dir;
        st.size = _node->size;
        st.first_cluster = _node->first_cluster;
        return st;
    }
    entry_info info;
    info.parent_key = _node->parent_key;
    info.slot = _node->slot;
    int rc = v.stat_of(info, st);
    if (rc < 0) {
        return v.fail(rc, "stat");
    }
    return st;
}

int file::close()
{
    if (_volume == nullptr) {
        return 0;
    }
    {
        op_guard op(*_volume);
        _volume->close_node(_node);
    }
    _node.reset();
    _volume = nullptr;
    return 0;
}

}  // namespace softblk::fat
