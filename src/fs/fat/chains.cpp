// Files' cluster chains: mapping a chain into runs of contiguous clusters
// (the extent cache of an open file), growing it next to its last cluster,
// cutting it, and freeing whole chains.
#include <algorithm>
#include <cerrno>

#include <fmt/format.h>

#include "volume_state.hpp"

namespace softblk::fat {

using namespace detail;

int volume_state::free_chain(uint32_t first)
{
    int frc = flush_pending();  // never write a freed cluster after its next owner
    if (frc < 0) {
        return frc;
    }
    uint32_t c = first;
    uint32_t steps = 0;
    while (c != 0) {
        if (!g.valid_cluster(c)) {
            return damage.corrupt(
                fmt::format("chain points to cluster {}, outside 2..{}", c, g.cluster_count + 1));
        }
        if (++steps > g.cluster_count) {
            return damage.corrupt(fmt::format("loop in the chain starting at cluster {}", first));
        }
        uint32_t v = 0;
        int rc = fat->get(c, v);
        if (rc < 0) {
            return rc;
        }
        if (v == 0) {
            break;  // already free: a damaged chain; stop here
        }
        rc = fat->set(c, 0);
        if (rc < 0) {
            return rc;
        }
        fat->release(c);
        forget_cluster_caches(c);
        if (v >= g.eoc_min || v == g.bad || !g.valid_cluster(v)) {
            break;
        }
        c = v;
    }
    return 0;
}

void volume_state::forget_cluster_caches(uint32_t c)
{
    meta->invalidate(g.cluster_sector(c), g.spc);
    data->invalidate(g.cluster_sector(c), g.spc);
}

int volume_state::map_cluster(node& n, uint32_t index, uint32_t& disk, uint32_t& run)
{
    int rc = extend_map(n, index + 1);
    if (rc < 0) {
        return rc;
    }
    if (index >= n.mapped) {
        return damage.corrupt(
            fmt::format("chain of cluster {} ends after {} clusters, the size needs more",
                        n.first_cluster, n.mapped));
    }
    auto it = std::upper_bound(n.extents.begin(), n.extents.end(), index,
                               [](uint32_t i, const extent_run& e) { return i < e.logical; });
    --it;
    disk = it->disk + (index - it->logical);
    run = it->count - (index - it->logical);
    return 0;
}

int volume_state::extend_map(node& n, uint32_t want)
{
    if (n.mapped >= want || n.chain_end) {
        return 0;
    }
    if (n.mapped == 0) {
        if (n.first_cluster == 0) {
            n.chain_end = true;
            return 0;
        }
        if (!g.valid_cluster(n.first_cluster)) {
            return damage.corrupt(fmt::format("first cluster {} is outside 2..{}", n.first_cluster,
                                              g.cluster_count + 1));
        }
        n.extents.push_back({0, n.first_cluster, 1});
        n.mapped = 1;
    }
    while (n.mapped < want) {
        auto& last = n.extents.back();
        uint32_t c = last.disk + last.count - 1;
        uint32_t next = 0;
        int rc = fat->next(c, next);
        if (rc < 0) {
            return rc;
        }
        if (next == 0) {
            n.chain_end = true;
            break;
        }
        if (n.mapped >= g.cluster_count) {
            return damage.corrupt(
                fmt::format("loop in the chain starting at cluster {}", n.first_cluster));
        }
        if (next == c + 1) {
            ++last.count;
        } else {
            n.extents.push_back({n.mapped, next, 1});
        }
        ++n.mapped;
    }
    return 0;
}

void volume_state::append_extent(node& n, uint32_t disk)
{
    if (!n.extents.empty()) {
        auto& last = n.extents.back();
        if (last.disk + last.count == disk) {
            ++last.count;
            ++n.mapped;
            return;
        }
    }
    n.extents.push_back({n.mapped, disk, 1});
    ++n.mapped;
}

int volume_state::ensure_clusters(node& n, uint32_t want)
{
    int rc = extend_map(n, UINT32_MAX);
    if (rc < 0) {
        return rc;
    }
    if (n.mapped >= want) {
        return 0;
    }
    uint32_t need = want - n.mapped;
    if (need > fat->free_count()) {
        return -ENOSPC;
    }
    uint32_t last = n.extents.empty() ? 0 : n.extents.back().disk + n.extents.back().count - 1;
    std::vector<uint32_t> fresh;
    rc = fat->allocate(need, last != 0 ? last + 1 : fat->next_free(), fresh);
    if (rc < 0) {
        return rc;
    }
    if (last == 0) {
        n.first_cluster = fresh[0];
    } else {
        rc = fat->set(last, fresh[0]);
        if (rc < 0) {
            return rc;
        }
    }
    for (uint32_t c : fresh) {
        append_extent(n, c);
    }
    n.chain_end = true;
    return 0;
}

int volume_state::shrink_clusters(node& n, uint32_t keep)
{
    if (keep == 0) {
        int rc = n.first_cluster != 0 ? free_chain(n.first_cluster) : 0;
        n.first_cluster = 0;
        n.extents.clear();
        n.mapped = 0;
        n.chain_end = true;
        return rc;
    }
    uint32_t disk = 0;
    uint32_t run = 0;
    int rc = map_cluster(n, keep - 1, disk, run);
    if (rc < 0) {
        return rc;
    }
    uint32_t next = 0;
    rc = fat->next(disk, next);
    if (rc < 0) {
        return rc;
    }
    rc = fat->set(disk, g.eoc);
    if (rc < 0) {
        return rc;
    }
    if (next != 0) {
        rc = free_chain(next);
    }
    while (!n.extents.empty() && n.extents.back().logical >= keep) {
        n.extents.pop_back();
    }
    if (!n.extents.empty()) {
        auto& last = n.extents.back();
        last.count = std::min(last.count, keep - last.logical);
    }
    n.mapped = keep;
    n.chain_end = true;
    return rc;
}

}  // namespace softblk::fat
