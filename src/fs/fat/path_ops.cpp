// volume's path operations: open, mkdir, rmdir, unlink, rename, truncate,
// stat, readdir, set_times, set_attributes. Each holds the volume for its
// whole length (op_guard) and reports failures through volume_state::fail.
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "volume_state.hpp"

namespace softblk::fat {

using namespace detail;

namespace {

// The frame of an operation on one existing path: holds the volume for the
// whole operation, checks that it can be used (for writing if `write`),
// resolves `path` and runs `body(info)`, which returns 0 or -errno. Errors
// name the path.
template <class F>
result<void> path_op(volume_state& v, bool write, std::string_view path, F&& body)
{
    op_guard op(v);
    entry_info info;
    int rc = v.check_usable(write);
    if (rc == 0) {
        rc = v.resolve_path(path, info);
    }
    if (rc == 0) {
        rc = body(static_cast<const entry_info&>(info));
    }
    if (rc < 0) {
        return v.fail(rc, path);
    }
    return {};
}

}  // namespace

result<file> volume::open(std::string_view path, unsigned flags)
{
    op_guard op(*_impl);
    auto& v = *_impl;
    bool writing = (flags & (k_open_write | k_open_create | k_open_truncate | k_open_append)) != 0;
    int rc = v.check_usable(writing);
    if (rc < 0) {
        return v.fail(rc, path);
    }
    auto parts = split_path(path);
    entry_info info;
    std::shared_ptr<node> n;
    if (parts.empty()) {
        if (writing) {
            return v.fail(-EISDIR, path);
        }
        rc = v.resolve_parts(parts, 0, info);
        n = v.node_for(info);
    } else {
        parent_dir parent;
        rc = v.resolve_parent(parts, parent);
        if (rc < 0) {
            return v.fail(rc, path);
        }
        uint32_t slot = 0;
        rc = v.lookup(*parent.index, parent.leaf, slot);
        if (rc == 0) {
            if ((flags & k_open_create) && (flags & k_open_exclusive)) {
                return v.fail(-EEXIST, path);
            }
            rc = v.read_info(*parent.index, slot, info);
            if (rc < 0) {
                return v.fail(rc, path);
            }
            if (info.is_dir && writing) {
                return v.fail(-EISDIR, path);
            }
            n = v.node_for(info);
            if ((flags & k_open_truncate) && (flags & k_open_write) && n->size != 0) {
                rc = v.truncate_node(*n, 0);
                if (rc < 0) {
                    return v.fail(rc, path);
                }
            }
        } else if (rc == -ENOENT && (flags & k_open_create)) {
            if (!valid_long_name(parent.leaf)) {
                return v.fail(parent.leaf.size() > 255 ? -ENAMETOOLONG : -EINVAL, path);
            }
            uint8_t tmpl[32] = {};
            tmpl[dirent::attr] = k_attr_archive;
            v.stamp(tmpl, true, true);
            rc = v.add_entry(*parent.index, parent.leaf, tmpl, slot);
            if (rc < 0) {
                return v.fail(rc, path);
            }
            rc = v.read_info(*parent.index, slot, info);
            if (rc < 0) {
                return v.fail(rc, path);
            }
            n = v.node_for(info);
        } else {
            return v.fail(rc, path);
        }
    }
    if (rc < 0) {
        return v.fail(rc, path);
    }
    if (!n->is_root) {
        v.open_nodes[volume_state::node_key(n->parent_key, n->slot)] = n;
    }
    ++n->open_count;
    file f;
    f._volume = _impl;
    f._node = std::move(n);
    f._flags = flags;
    return f;
}

result<void> volume::mkdir(std::string_view path)
{
    op_guard op(*_impl);
    auto& v = *_impl;
    int rc = v.check_usable(true);
    if (rc < 0) {
        return v.fail(rc, path);
    }
    auto parts = split_path(path);
    if (parts.empty()) {
        return v.fail(-EEXIST, path);
    }
    parent_dir parent;
    rc = v.resolve_parent(parts, parent);
    if (rc < 0) {
        return v.fail(rc, path);
    }
    uint32_t parent_key = parent.index->key;
    uint32_t slot = 0;
    if (v.lookup(*parent.index, parent.leaf, slot) == 0) {
        return v.fail(-EEXIST, path);
    }
    if (!valid_long_name(parent.leaf)) {
        return v.fail(-EINVAL, path);
    }
    if (v.fat->free_count() == 0) {
        return v.fail(-ENOSPC, path);
    }
    std::vector<uint32_t> fresh;
    rc = v.fat->allocate(1, v.fat->next_free(), fresh);
    if (rc < 0) {
        return v.fail(rc, path);
    }
    uint32_t c = fresh[0];
    rc = v.zero_dir_cluster(c);
    uint8_t tmpl[32] = {};
    tmpl[dirent::attr] = k_attr_directory;
    v.stamp(tmpl, true, true);
    v.set_entry_cluster(tmpl, c);
    if (rc == 0) {
        rc = v.add_entry(*parent.index, parent.leaf, tmpl, slot);
    }
    if (rc < 0) {
        (void)v.free_chain(c);
        return v.fail(rc, path);
    }
    // "." and "..": ".." holds 0 when the parent is the root (also on FAT32).
    uint8_t* buf = nullptr;
    uint64_t s = v.g.cluster_sector(c);
    rc = v.meta->get(s, s + 1, sector_cache::fill::read, buf);
    if (rc < 0) {
        return v.fail(rc, path);
    }
    v.meta->mark_dirty(s);
    std::memcpy(buf, tmpl, 32);
    std::memset(buf, ' ', 11);
    buf[0] = '.';
    std::memcpy(buf + 32, tmpl, 32);
    std::memset(buf + 32, ' ', 11);
    buf[32] = '.';
    buf[33] = '.';
    v.set_entry_cluster(buf + 32, parent.info.is_root ? 0 : parent_key);
    return {};
}

result<void> volume::rmdir(std::string_view path)
{
    auto& v = *_impl;
    return path_op(v, true, path, [&](const entry_info& info) {
        if (info.is_root) {
            return -EBUSY;
        }
        if (!info.is_dir) {
            return -ENOTDIR;
        }
        bool empty = false;
        int rc = v.dir_is_empty(info.first_cluster, empty);
        if (rc < 0) {
            return rc;
        }
        if (!empty) {
            return -ENOTEMPTY;
        }
        dir_index* parent = nullptr;
        rc = v.load_dir(info.parent_key, parent);
        return rc < 0 ? rc : v.remove_dir(*parent, info);
    });
}

result<void> volume::unlink(std::string_view path)
{
    auto& v = *_impl;
    return path_op(v, true, path, [&](const entry_info& info) {
        if (info.is_dir) {
            return -EISDIR;
        }
        dir_index* parent = nullptr;
        int rc = v.load_dir(info.parent_key, parent);
        return rc < 0 ? rc : v.remove_file(*parent, info);
    });
}

result<void> volume::rename(std::string_view from, std::string_view to)
{
    op_guard op(*_impl);
    auto& v = *_impl;
    std::string what = fmt::format("rename {} -> {}", from, to);
    int rc = v.check_usable(true);
    if (rc < 0) {
        return v.fail(rc, what);
    }
    auto src = split_path(from);
    auto dst = split_path(to);
    if (src.empty() || dst.empty()) {
        return v.fail(-EBUSY, what);
    }
    entry_info info;
    rc = v.resolve_parts(src, src.size(), info);
    if (rc < 0) {
        return v.fail(rc, what);
    }
    if (info.is_dir && dst.size() > src.size()) {
        bool inside = true;
        for (size_t i = 0; i < src.size(); ++i) {
            inside = inside && fold(src[i]) == fold(dst[i]);
        }
        if (inside) {
            return v.fail(-EINVAL, what);  // into its own subtree
        }
    }
    parent_dir to_parent;
    rc = v.resolve_parent(dst, to_parent);
    if (rc < 0) {
        return v.fail(rc, what);
    }
    dir_index* td = to_parent.index;
    const std::string& leaf = to_parent.leaf;
    uint32_t to_key = td->key;
    if (!valid_long_name(leaf)) {
        return v.fail(-EINVAL, what);
    }
    uint32_t existing = 0;
    bool same_entry = false;
    if (v.lookup(*td, leaf, existing) == 0) {
        if (td->key == info.parent_key && existing == info.slot) {
            same_entry = true;
            if (td->records.at(existing).name == leaf) {
                return {};
            }
        } else {
            entry_info target;
            rc = v.read_info(*td, existing, target);
            if (rc < 0) {
                return v.fail(rc, what);
            }
            if (info.is_dir) {
                if (!target.is_dir) {
                    return v.fail(-ENOTDIR, what);
                }
                bool empty = false;
                rc = v.dir_is_empty(target.first_cluster, empty);
                if (rc < 0) {
                    return v.fail(rc, what);
                }
                if (!empty) {
                    return v.fail(-ENOTEMPTY, what);
                }
                rc = v.load_dir(to_key, td);
                if (rc == 0) {
                    rc = v.remove_dir(*td, target);
                }
            } else {
                if (target.is_dir) {
                    return v.fail(-EISDIR, what);
                }
                rc = v.remove_file(*td, target);
            }
            if (rc < 0) {
                return v.fail(rc, what);
            }
        }
    }
    // Reload both (removing a directory may have dropped cached indexes).
    dir_index* sd = nullptr;
    rc = v.load_dir(info.parent_key, sd);
    if (rc == 0) {
        rc = v.load_dir(to_key, td);
    }
    if (rc < 0) {
        return v.fail(rc, what);
    }
    uint8_t tmpl[32];
    uint8_t* e = nullptr;
    rc = v.entry_at(*sd, info.slot, e, false);
    if (rc < 0) {
        return v.fail(rc, what);
    }
    std::memcpy(tmpl, e, 32);
    // A case-only rename must be able to reuse the entry's own short name.
    dir_record saved;
    if (same_entry) {
        saved = sd->records.at(info.slot);
        sd->by_name.erase(fold(saved.name));
        sd->by_short.erase(short_key(saved.sname));
    }
    uint32_t new_slot = 0;
    rc = v.add_entry(*td, leaf, tmpl, new_slot);
    if (rc < 0) {
        if (same_entry) {
            sd->by_name.emplace(fold(saved.name), info.slot);
            sd->by_short.emplace(short_key(saved.sname), info.slot);
        }
        return v.fail(rc, what);
    }
    rc = v.remove_entry(*sd, info.slot);
    if (rc < 0) {
        return v.fail(rc, what);
    }
    if (info.is_dir && info.parent_key != to_key) {
        dir_index* moved = nullptr;
        rc = v.load_dir(info.first_cluster, moved);
        if (rc < 0) {
            return v.fail(rc, what);
        }
        for (auto& [slot, rec] : moved->records) {
            if (rec.dot && rec.name == "..") {
                uint8_t* dd = nullptr;
                rc = v.entry_at(*moved, slot, dd, true);
                if (rc < 0) {
                    return v.fail(rc, what);
                }
                v.set_entry_cluster(dd, to_parent.info.is_root ? 0 : to_key);
                break;
            }
        }
    }
    auto it = v.open_nodes.find(volume_state::node_key(info.parent_key, info.slot));
    if (it != v.open_nodes.end()) {
        auto n = it->second;
        v.open_nodes.erase(it);
        n->parent_key = to_key;
        n->slot = new_slot;
        v.open_nodes[volume_state::node_key(to_key, new_slot)] = n;
    }
    return {};
}

result<void> volume::truncate(std::string_view path, uint64_t size)
{
    auto& v = *_impl;
    return path_op(v, true, path, [&](const entry_info& info) {
        if (info.is_dir) {
            return -EISDIR;
        }
        return v.truncate_node(*v.node_for(info), size);
    });
}

result<file_stat> volume::stat(std::string_view path)
{
    auto& v = *_impl;
    file_stat st;
    auto r = path_op(v, false, path, [&](const entry_info& info) { return v.stat_of(info, st); });
    if (!r) {
        return std::unexpected(r.error());
    }
    return st;
}

result<std::vector<dir_entry>> volume::readdir(std::string_view path)
{
    auto& v = *_impl;
    std::vector<dir_entry> out;
    auto r = path_op(v, false, path, [&](const entry_info& info) {
        if (!info.is_dir) {
            return -ENOTDIR;
        }
        dir_index* d = nullptr;
        int rc = v.load_dir(v.dir_key_of(info), d);
        if (rc < 0) {
            return rc;
        }
        out.reserve(d->records.size());
        for (auto& [slot, rec] : d->records) {
            if (rec.dot) {
                continue;
            }
            uint8_t* e = nullptr;
            rc = v.entry_at(*d, slot, e, false);
            if (rc < 0) {
                return rc;
            }
            dir_entry de;
            de.name = rec.name;
            de.short_name = short_to_string(rec.sname.data());
            v.fill_stat(e, de.stat);
            out.push_back(std::move(de));
        }
        return 0;
    });
    if (!r) {
        return std::unexpected(r.error());
    }
    return out;
}

result<void> volume::set_times(std::string_view path, std::time_t modified, std::time_t accessed)
{
    auto& v = *_impl;
    return path_op(v, true, path, [&](const entry_info& info) {
        if (info.is_root) {
            return 0;  // the root has no entry to hold times
        }
        uint8_t* e = nullptr;
        int rc = v.entry_of(info, e, true);
        if (rc < 0) {
            return rc;
        }
        fat_time m = to_fat_time(modified);
        fat_time a = to_fat_time(accessed);
        put16(e + dirent::wrt_time, m.time);
        put16(e + dirent::wrt_date, m.date);
        put16(e + dirent::acc_date, a.date);
        return 0;
    });
}

result<void> volume::set_attributes(std::string_view path, uint8_t attributes)
{
    auto& v = *_impl;
    return path_op(v, true, path, [&](const entry_info& info) {
        if (info.is_root) {
            return -EINVAL;
        }
        uint8_t* e = nullptr;
        int rc = v.entry_of(info, e, true);
        if (rc < 0) {
            return rc;
        }
        uint8_t keep = e[dirent::attr] & (k_attr_directory | k_attr_volume_id);
        e[dirent::attr] = static_cast<uint8_t>(
            keep |
            (attributes & (k_attr_read_only | k_attr_hidden | k_attr_system | k_attr_archive)));
        return 0;
    });
}

}  // namespace softblk::fat
