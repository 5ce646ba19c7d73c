// Directories and names: a directory is parsed once into an index (long
// names checked and joined, short names, used slots), and lookups, slot
// searches and ~N collision checks use it. Also path resolution, creating
// and removing entries, and reading and stamping an entry's fields.
#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "volume_state.hpp"

namespace softblk::fat {

using namespace detail;

int volume_state::entry_at(dir_index& d, uint32_t slot, uint8_t*& p, bool for_write)
{
    uint64_t byte = uint64_t{slot} * k_dirent_size;
    uint64_t sector = 0;
    uint64_t run_end = 0;
    if (d.fixed) {
        sector = g.root_start + byte / g.bps;
        run_end = g.root_start + g.root_sectors;
    } else {
        uint64_t ci = byte / g.cluster_bytes;
        if (ci >= d.clusters.size()) {
            return damage.corrupt(
                fmt::format("directory slot {} beyond the directory's clusters", slot));
        }
        uint64_t cs = g.cluster_sector(d.clusters[ci]);
        sector = cs + (byte % g.cluster_bytes) / g.bps;
        run_end = cs + g.spc;
    }
    uint8_t* buf = nullptr;
    int rc = meta->get(sector, run_end, sector_cache::fill::read, buf);
    if (rc < 0) {
        return rc;
    }
    if (for_write) {
        meta->mark_dirty(sector);
    }
    p = buf + byte % g.bps;
    return 0;
}

void volume_state::index_record(dir_index& d, dir_record rec)
{
    uint32_t slot = rec.slot;
    if (!rec.dot) {
        std::string folded = fold(rec.name);
        if (!d.by_name.emplace(folded, slot).second) {
            damage.note(
                fmt::format("duplicate name \"{}\" in directory at cluster {}", rec.name, d.key));
        }
        d.by_short.emplace(short_key(rec.sname), slot);
    }
    d.records.emplace(slot, std::move(rec));
}

int volume_state::load_dir(uint32_t key, dir_index*& out)
{
    auto found = dirs.find(key);
    if (found != dirs.end()) {
        out = found->second.get();
        return 0;
    }
    auto d = std::make_unique<dir_index>();
    d->key = key;
    if (key == 0 && g.type != fat_type::fat32) {
        d->fixed = true;
        d->capacity = g.root_entries;
    } else {
        if (!g.valid_cluster(key)) {
            return damage.corrupt(
                fmt::format("directory cluster {} is outside 2..{}", key, g.cluster_count + 1));
        }
        uint32_t max_clusters =
            std::max<uint32_t>(1, k_max_dir_entries * k_dirent_size / g.cluster_bytes);
        uint32_t c = key;
        while (c != 0) {
            if (d->clusters.size() >= max_clusters) {
                return damage.corrupt(fmt::format(
                    "directory at cluster {} is longer than 65536 entries (a loop?)", key));
            }
            d->clusters.push_back(c);
            uint32_t next = 0;
            int rc = fat->next(c, next);
            if (rc < 0) {
                return rc;
            }
            c = next;
        }
        d->capacity = static_cast<uint32_t>(d->clusters.size() * (g.cluster_bytes / k_dirent_size));
    }
    d->used.assign(d->capacity, 0);
    d->end_slot = d->capacity;
    // LFN sequence state
    std::u16string lfn(20 * 13, u'\0');
    int expect = -1;  // next ordinal expected; 0: complete; -1: none
    int total = 0;
    uint8_t sum = 0;
    uint32_t start = 0;
    for (uint32_t slot = 0; slot < d->capacity; ++slot) {
        uint8_t* e = nullptr;
        int rc = entry_at(*d, slot, e, false);
        if (rc < 0) {
            return rc;
        }
        if (e[0] == 0x00) {
            d->end_slot = slot;
            break;
        }
        if (e[0] == k_deleted) {
            expect = -1;
            continue;
        }
        d->used[slot] = 1;
        uint8_t attr = e[dirent::attr];
        if ((attr & k_attr_mask) == k_attr_lfn) {
            uint8_t ord = e[0];
            int k = ord & 0x1F;
            if (ord & k_lfn_last) {
                if (k == 0 || k > 20) {
                    expect = -1;
                    damage.note(
                        fmt::format("directory {}: long-name entry with ordinal {}", key, ord));
                    continue;
                }
                total = k;
                sum = e[13];
                start = slot;
                std::fill(lfn.begin(), lfn.end(), u'\0');
            } else if (expect <= 0 || k != expect || e[13] != sum) {
                if (expect != -1 || true) {
                    damage.note(fmt::format(
                        "directory {}: long-name entry out of sequence at slot {}", key, slot));
                }
                expect = -1;
                continue;
            }
            static constexpr int offsets[13] = {1, 3, 5, 7, 9, 14, 16, 18, 20, 22, 24, 28, 30};
            for (int u = 0; u < 13; ++u) {
                lfn[(k - 1) * 13 + u] = static_cast<char16_t>(le16(e + offsets[u]));
            }
            expect = k - 1;
            continue;
        }
        if (attr & k_attr_volume_id) {
            expect = -1;
            continue;
        }
        dir_record rec;
        std::memcpy(rec.sname.data(), e, 11);
        rec.slot = slot;
        static const uint8_t dot1[11] = {'.', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' '};
        static const uint8_t dot2[11] = {'.', '.', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' '};
        if (std::memcmp(e, dot1, 11) == 0 || std::memcmp(e, dot2, 11) == 0) {
            rec.dot = true;
            rec.name = e[1] == '.' ? ".." : ".";
            index_record(*d, std::move(rec));
            expect = -1;
            continue;
        }
        bool have_long = false;
        if (expect == 0) {
            if (lfn_checksum(e) == sum) {
                size_t len = 0;
                while (len < static_cast<size_t>(total) * 13 && lfn[len] != 0) {
                    ++len;
                }
                std::string name = utf16_to_utf8(std::u16string_view(lfn.data(), len));
                if (valid_long_name(name)) {
                    rec.name = std::move(name);
                    rec.lfn_slots = static_cast<uint8_t>(total);
                    have_long = true;
                } else {
                    damage.note(fmt::format(
                        "directory {}: unusable long name at slot {}; using the short name", key,
                        slot));
                }
            } else {
                damage.note(
                    fmt::format("directory {}: long name checksum mismatch at slot {}; using "
                                "the short name",
                                key, slot));
            }
            (void)start;
        }
        expect = -1;
        if (!have_long) {
            if (!valid_stored_short(e)) {
                uint8_t fixed[11];
                std::memcpy(fixed, e, 11);
                for (auto& c : fixed) {
                    if (c < 0x20 || c == 0x7F || std::strchr("*?<>|\"\\/:", c) != nullptr) {
                        c = '_';
                    }
                }
                rec.name = short_to_display(fixed, e[dirent::nt_res]);
                damage.note(
                    fmt::format("directory {}: invalid short name at slot {} shown as \"{}\"", key,
                                slot, rec.name));
            } else {
                rec.name = short_to_display(e, e[dirent::nt_res]);
            }
            if (rec.name.empty() || rec.name == "." || rec.name == "..") {
                rec.name = fmt::format("_slot{}", slot);
            }
        }
        index_record(*d, std::move(rec));
    }
    // Mark LFN slots of orphaned sequences as used so we don't reuse
    // part of them while they still sit before a live entry: already
    // marked above; free slots are exactly deleted or past-the-end ones.
    d->free_hint = 0;
    while (d->free_hint < d->capacity && d->used[d->free_hint]) {
        ++d->free_hint;
    }
    out = d.get();
    dirs.emplace(key, std::move(d));
    return 0;
}

// Finds `n` consecutive free slots; extends the directory if needed.
int volume_state::find_slots(dir_index& d, uint32_t n, uint32_t& slot)
{
    uint32_t run = 0;
    for (uint32_t s = d.free_hint; s < d.capacity; ++s) {
        run = d.used[s] ? 0 : run + 1;
        if (run == n) {
            slot = s + 1 - n;
            return 0;
        }
    }
    // Extend by a cluster.
    if (d.fixed) {
        return -ENOSPC;
    }
    uint32_t per_cluster = g.cluster_bytes / k_dirent_size;
    if (d.capacity + per_cluster > k_max_dir_entries) {
        return -ENOSPC;
    }
    if (fat->free_count() == 0) {
        return -ENOSPC;
    }
    std::vector<uint32_t> fresh;
    int rc = fat->allocate(1, d.clusters.back() + 1, fresh);
    if (rc < 0) {
        return rc;
    }
    rc = zero_dir_cluster(fresh[0]);
    if (rc < 0) {
        return rc;
    }
    rc = fat->set(d.clusters.back(), fresh[0]);
    if (rc < 0) {
        return rc;
    }
    d.clusters.push_back(fresh[0]);
    uint32_t old_capacity = d.capacity;
    d.capacity += per_cluster;
    d.used.resize(d.capacity, 0);
    if (d.end_slot == old_capacity) {
        d.end_slot = old_capacity;
    }
    return find_slots(d, n, slot);
}

int volume_state::zero_dir_cluster(uint32_t c)
{
    data->invalidate(g.cluster_sector(c), g.spc);
    for (uint32_t i = 0; i < g.spc; ++i) {
        uint8_t* buf = nullptr;
        uint64_t s = g.cluster_sector(c) + i;
        meta->invalidate(s, 1);
        int rc = meta->get(s, s + 1, sector_cache::fill::zero, buf);
        if (rc < 0) {
            return rc;
        }
        meta->mark_dirty(s);
    }
    return 0;
}

// Writes a new entry named `name` with the fields of `tmpl` (bytes
// 11..31 of a short entry). Returns the short entry's slot.
int volume_state::add_entry(dir_index& d, std::string_view name, const uint8_t* tmpl,
                            uint32_t& out_slot)
{
    short_plan plan = plan_short_name(name);
    std::u16string units;
    uint32_t lfn_n = 0;
    short_name sname = plan.name;
    uint8_t nt = plan.nt_flags;
    if (plan.needs_lfn) {
        if (!utf8_to_utf16(name, units)) {
            return -EINVAL;
        }
        if (units.size() > k_max_lfn_units) {
            return -ENAMETOOLONG;
        }
        lfn_n = static_cast<uint32_t>((units.size() + 12) / 13);
        uint16_t hash = name_hash(name);
        bool found = false;
        for (uint32_t n = 1; n < 1000000 && !found; ++n) {
            sname = numbered_short_name(plan, n, hash);
            found = d.by_short.count(short_key(sname)) == 0;
        }
        if (!found) {
            return -ENOSPC;
        }
        nt = 0;
    } else if (d.by_short.count(short_key(sname)) != 0) {
        return -EEXIST;
    }
    uint32_t slot = 0;
    int rc = find_slots(d, lfn_n + 1, slot);
    if (rc < 0) {
        return rc;
    }
    uint8_t sum = lfn_checksum(sname.data());
    for (uint32_t i = 0; i < lfn_n; ++i) {
        uint8_t* e = nullptr;
        rc = entry_at(d, slot + i, e, true);
        if (rc < 0) {
            return rc;
        }
        uint32_t k = lfn_n - i;  // ordinal
        std::memset(e, 0, k_dirent_size);
        e[0] = static_cast<uint8_t>(k | (i == 0 ? k_lfn_last : 0));
        e[dirent::attr] = k_attr_lfn;
        e[13] = sum;
        static constexpr int offsets[13] = {1, 3, 5, 7, 9, 14, 16, 18, 20, 22, 24, 28, 30};
        for (uint32_t u = 0; u < 13; ++u) {
            size_t pos = (k - 1) * 13 + u;
            uint16_t v = pos < units.size() ? units[pos] : (pos == units.size() ? 0x0000 : 0xFFFF);
            put16(e + offsets[u], v);
        }
    }
    uint8_t* e = nullptr;
    rc = entry_at(d, slot + lfn_n, e, true);
    if (rc < 0) {
        return rc;
    }
    std::memcpy(e + 11, tmpl + 11, k_dirent_size - 11);
    std::memcpy(e, sname.data(), 11);
    e[dirent::nt_res] = nt;
    uint32_t end = slot + lfn_n + 1;
    for (uint32_t s = slot; s < end; ++s) {
        d.used[s] = 1;
    }
    if (end > d.end_slot || slot >= d.end_slot) {
        // We wrote at or past the end marker: keep an end marker after us.
        if (end < d.capacity) {
            uint8_t* z = nullptr;
            rc = entry_at(d, end, z, true);
            if (rc < 0) {
                return rc;
            }
            if (!d.used[end]) {
                std::memset(z, 0, k_dirent_size);
            }
        }
        d.end_slot = std::max(d.end_slot, end);
    }
    while (d.free_hint < d.capacity && d.used[d.free_hint]) {
        ++d.free_hint;
    }
    dir_record rec;
    rec.name = std::string(name);
    rec.sname = sname;
    rec.slot = slot + lfn_n;
    rec.lfn_slots = static_cast<uint8_t>(lfn_n);
    index_record(d, std::move(rec));
    out_slot = slot + lfn_n;
    return 0;
}

int volume_state::remove_entry(dir_index& d, uint32_t slot)
{
    auto it = d.records.find(slot);
    if (it == d.records.end()) {
        return -ENOENT;
    }
    const dir_record& rec = it->second;
    for (uint32_t s = slot - rec.lfn_slots; s <= slot; ++s) {
        uint8_t* e = nullptr;
        int rc = entry_at(d, s, e, true);
        if (rc < 0) {
            return rc;
        }
        e[0] = k_deleted;
        d.used[s] = 0;
    }
    d.free_hint = std::min(d.free_hint, slot - rec.lfn_slots);
    auto n = d.by_name.find(fold(rec.name));
    if (n != d.by_name.end() && n->second == slot) {
        d.by_name.erase(n);
    }
    auto s = d.by_short.find(short_key(rec.sname));
    if (s != d.by_short.end() && s->second == slot) {
        d.by_short.erase(s);
    }
    d.records.erase(it);
    return 0;
}

int volume_state::lookup(dir_index& d, std::string_view name, uint32_t& slot)
{
    auto it = d.by_name.find(fold(name));
    if (it != d.by_name.end()) {
        slot = it->second;
        return 0;
    }
    short_name sn;
    if (parse_short(name, sn)) {
        auto s = d.by_short.find(short_key(sn));
        if (s != d.by_short.end()) {
            slot = s->second;
            return 0;
        }
    }
    return -ENOENT;
}

int volume_state::read_info(dir_index& d, uint32_t slot, entry_info& info)
{
    uint8_t* e = nullptr;
    int rc = entry_at(d, slot, e, false);
    if (rc < 0) {
        return rc;
    }
    info.parent_key = d.key;
    info.slot = slot;
    info.attr = e[dirent::attr];
    info.is_dir = (info.attr & k_attr_directory) != 0;
    info.first_cluster = entry_cluster(e);
    info.size = le32(e + dirent::size);
    // On FAT12/16 a directory entry holding cluster 0 names the root (as
    // `..` does): a cycle, which path resolution and walks refuse to follow.
    if (info.is_dir && info.first_cluster == 0 && g.root_key() != 0) {
        return damage.corrupt(
            fmt::format("directory entry at slot {} of directory {} has no cluster", slot, d.key));
    }
    if (info.first_cluster != 0 && !g.valid_cluster(info.first_cluster)) {
        return damage.corrupt(
            fmt::format("entry at slot {} of directory {} starts at cluster {}, outside 2..{}",
                        slot, d.key, info.first_cluster, g.cluster_count + 1));
    }
    return 0;
}

int volume_state::resolve_parts(const std::vector<std::string>& parts, size_t count,
                                entry_info& out)
{
    out = entry_info{};
    out.is_root = true;
    out.is_dir = true;
    out.first_cluster = g.root_key();
    out.attr = k_attr_directory;
    // The directories on the path so far (root first). A damaged image can
    // hold an entry that leads back to one of them; following it would make
    // a directory its own ancestor and every walk endless.
    std::vector<uint32_t> ancestors{out.first_cluster};
    for (size_t i = 0; i < count; ++i) {
        if (!out.is_dir) {
            return -ENOTDIR;
        }
        dir_index* d = nullptr;
        int rc = load_dir(out.first_cluster, d);
        if (rc < 0) {
            return rc;
        }
        uint32_t slot = 0;
        rc = lookup(*d, parts[i], slot);
        if (rc < 0) {
            return rc;
        }
        rc = read_info(*d, slot, out);
        if (rc < 0) {
            return rc;
        }
        out.is_root = false;
        if (!out.is_dir) {
            continue;
        }
        auto seen = std::find(ancestors.begin(), ancestors.end(), out.first_cluster);
        if (seen != ancestors.end()) {
            size_t depth = static_cast<size_t>(seen - ancestors.begin());
            // fmt::format, not "/" + string: GCC 12 warns -Wrestrict, wrongly,
            // on that operator+ after inlining (GCC bug 105329).
            const std::string back = depth == 0 ? std::string("the root directory")
                                                : fmt::format("/{}", join_parts(parts, depth));
            return damage.corrupt(
                fmt::format("directory cycle: /{} leads back to {} (cluster {}); the image is "
                            "damaged (fsck.fat repairs it)",
                            join_parts(parts, i + 1), back, out.first_cluster),
                -ELOOP);
        }
        ancestors.push_back(out.first_cluster);
    }
    return 0;
}

int volume_state::resolve_parent(const std::vector<std::string>& parts, parent_dir& out)
{
    int rc = resolve_parts(parts, parts.size() - 1, out.info);
    if (rc < 0) {
        return rc;
    }
    if (!out.info.is_dir) {
        return -ENOTDIR;
    }
    rc = load_dir(dir_key_of(out.info), out.index);
    if (rc < 0) {
        return rc;
    }
    out.leaf = strip_trailing(parts.back());
    return 0;
}

int volume_state::resolve_path(std::string_view path, entry_info& out)
{
    auto parts = split_path(path);
    return resolve_parts(parts, parts.size(), out);
}

int volume_state::entry_of(const entry_ref& ref, uint8_t*& e, bool for_write)
{
    dir_index* d = nullptr;
    int rc = load_dir(ref.parent_key, d);
    return rc < 0 ? rc : entry_at(*d, ref.slot, e, for_write);
}

uint32_t volume_state::entry_cluster(const uint8_t* e) const
{
    uint32_t hi = g.type == fat_type::fat32 ? le16(e + dirent::cluster_hi) : 0;
    return (hi << 16) | le16(e + dirent::cluster_lo);
}

void volume_state::set_entry_cluster(uint8_t* e, uint32_t cluster) const
{
    if (g.type == fat_type::fat32) {
        put16(e + dirent::cluster_hi, static_cast<uint16_t>(cluster >> 16));
    }
    put16(e + dirent::cluster_lo, static_cast<uint16_t>(cluster));
}

void volume_state::stamp(uint8_t* e, bool modified, bool created)
{
    std::time_t now = std::time(nullptr);
    if (now != stamp_second) {
        stamp_value = to_fat_time(now);
        stamp_second = now;
    }
    const fat_time& t = stamp_value;
    if (created) {
        e[dirent::crt_tenth] = t.tenth;
        put16(e + dirent::crt_time, t.time);
        put16(e + dirent::crt_date, t.date);
    }
    if (modified) {
        put16(e + dirent::wrt_time, t.time);
        put16(e + dirent::wrt_date, t.date);
    }
    put16(e + dirent::acc_date, t.date);
}

// Writes the node's cluster and size (and, if `modified`, mtime) to its entry.
int volume_state::write_entry(node& n, bool modified)
{
    if (n.is_root || n.unlinked) {
        return 0;
    }
    uint8_t* e = nullptr;
    int rc = entry_of(n, e, true);
    if (rc < 0) {
        return rc;
    }
    set_entry_cluster(e, n.first_cluster);
    put32(e + dirent::size, n.is_dir ? 0 : n.size);
    if (modified) {
        stamp(e, true, false);
        if (!n.is_dir) {
            e[dirent::attr] |= k_attr_archive;
        }
    }
    return 0;
}

void volume_state::fill_stat(const uint8_t* e, file_stat& st)
{
    st.attributes = e[dirent::attr];
    st.is_directory = (st.attributes & k_attr_directory) != 0;
    st.first_cluster = entry_cluster(e);
    st.size = st.is_directory ? 0 : le32(e + dirent::size);
    st.allocated = (st.size + g.cluster_bytes - 1) / g.cluster_bytes * g.cluster_bytes;
    st.modified = from_fat_time(le16(e + dirent::wrt_date), le16(e + dirent::wrt_time));
    st.created =
        from_fat_time(le16(e + dirent::crt_date), le16(e + dirent::crt_time), e[dirent::crt_tenth]);
    st.accessed = from_fat_time(le16(e + dirent::acc_date), 0);
}

int volume_state::stat_of(const entry_info& info, file_stat& st)
{
    if (info.is_root) {
        st = file_stat{};
        st.is_directory = true;
        st.attributes = k_attr_directory;
        st.first_cluster = g.root_key();
        return 0;
    }
    uint8_t* e = nullptr;
    int rc = entry_of(info, e, false);
    if (rc < 0) {
        return rc;
    }
    fill_stat(e, st);
    return 0;
}

// Removes a directory entry; frees the file's clusters unless it is
// open (then at its last close).
int volume_state::remove_file(dir_index& d, const entry_info& info)
{
    auto it = open_nodes.find(node_key(d.key, info.slot));
    std::shared_ptr<node> open;
    if (it != open_nodes.end()) {
        open = it->second;
        open_nodes.erase(it);
    }
    int rc = remove_entry(d, info.slot);
    if (rc < 0) {
        return rc;
    }
    if (open) {
        open->unlinked = true;
        return 0;
    }
    if (info.first_cluster != 0) {
        return free_chain(info.first_cluster);
    }
    return 0;
}

int volume_state::dir_is_empty(uint32_t key, bool& empty)
{
    dir_index* d = nullptr;
    int rc = load_dir(key, d);
    if (rc < 0) {
        return rc;
    }
    empty = true;
    for (auto& [slot, rec] : d->records) {
        if (!rec.dot) {
            empty = false;
            break;
        }
    }
    return 0;
}

int volume_state::remove_dir(dir_index& parent, const entry_info& info)
{
    int rc = remove_entry(parent, info.slot);
    if (rc < 0) {
        return rc;
    }
    dirs.erase(info.first_cluster);
    return free_chain(info.first_cluster);
}

}  // namespace softblk::fat
