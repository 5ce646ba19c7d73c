// Walking a directory tree safely on damaged images. See walk.hpp.
#include <softblk/fat/walk.hpp>

#include <algorithm>
#include <cerrno>
#include <unordered_set>

#include <fmt/format.h>

namespace softblk::fat {

namespace {

std::string join(const std::string& dir, const std::string& name)
{
    return dir.empty() || dir.back() == '/' ? dir + name : dir + "/" + name;
}

error walk_error(int code, std::string message)
{
    return error{std::error_code(code, std::generic_category()), std::move(message)};
}

struct subdirectory {
    std::string name;
    uint32_t cluster = 0;  // first cluster: what makes two entries the same directory
};

// A directory being walked: its subdirectories, and how far the walk got.
struct frame {
    std::string path;
    uint32_t cluster = 0;
    std::vector<subdirectory> subdirectories;
    size_t next = 0;
    size_t name_bytes = 0;  // held by `subdirectories` (entries and names)
};

class walker {
public:
    walker(volume& vol, walk_visitor& visitor, const walk_limits& limits)
        : _vol(vol), _visitor(visitor), _limits(limits)
    {
    }

    result<walk_summary> run(std::string start)
    {
        auto st = _vol.stat(start);
        if (!st) {
            return std::unexpected(st.error());
        }
        if (!st->is_directory) {
            return make_error(ENOTDIR, fmt::format("{}: not a directory", start));
        }
        auto entries = _vol.readdir(start);
        if (!entries) {
            return std::unexpected(entries.error());
        }
        // The directories above the start are ancestors too: an entry
        // below it may lead back to one of them.
        note_ancestor("/");
        for (size_t slash = start.find('/', 1); slash != std::string::npos;
             slash = start.find('/', slash + 1)) {
            note_ancestor(start.substr(0, slash));
        }
        auto r = enter(std::move(start), st->first_cluster, *entries);
        while (r && !_stack.empty()) {
            r = step();
        }
        if (!r) {
            return std::unexpected(r.error());
        }
        return _summary;
    }

private:
    // Hands a directory to the visitor and plans its subdirectories.
    result<void> enter(std::string path, uint32_t cluster, const std::vector<dir_entry>& entries)
    {
        _walked.insert(cluster);
        ++_summary.directories;
        auto r = _visitor.enter(path, entries);
        if (!r) {
            return r;
        }
        frame f;
        f.path = std::move(path);
        f.cluster = cluster;
        for (const auto& e : entries) {
            if (e.stat.is_directory) {
                f.name_bytes += sizeof(subdirectory) + e.name.size();
                f.subdirectories.push_back({e.name, e.stat.first_cluster});
            }
        }
        if (_pending_bytes + f.name_bytes > _limits.max_pending_bytes) {
            skip(f.path, E2BIG,
                 fmt::format("{}: its {} subdirectories are not walked: the walk already holds "
                             "{} bytes of subdirectories for the directories above (limit {})",
                             f.path, f.subdirectories.size(), _pending_bytes,
                             _limits.max_pending_bytes));
            f.subdirectories.clear();
            f.name_bytes = 0;
        }
        _pending_bytes += f.name_bytes;
        _stack.push_back(std::move(f));
        return {};
    }

    void note_ancestor(const std::string& path)
    {
        if (auto st = _vol.stat(path); st && st->is_directory) {
            _above.push_back({path, st->first_cluster});
        }
    }

    // The path of the directory `cluster` on the current path (the start's
    // ancestors included), or nullptr.
    const std::string* ancestor(uint32_t cluster) const
    {
        for (const auto& f : _stack) {
            if (f.cluster == cluster) {
                return &f.path;
            }
        }
        for (const auto& a : _above) {
            if (a.cluster == cluster) {
                return &a.name;
            }
        }
        return nullptr;
    }

    // Walks into the next subdirectory of the innermost directory, or
    // leaves that directory when it has none left.
    result<void> step()
    {
        frame& top = _stack.back();
        if (top.next == top.subdirectories.size()) {
            _pending_bytes -= top.name_bytes;
            std::string path = std::move(top.path);
            _stack.pop_back();
            return _visitor.leave(path);
        }
        const subdirectory& sub = top.subdirectories[top.next++];
        std::string path = join(top.path, sub.name);
        if (refused(path, sub.cluster)) {
            return {};
        }
        if (path.size() > _limits.max_path_bytes) {
            skip(path, ENAMETOOLONG,
                 fmt::format("{}...: path longer than {} bytes, not walked", path.substr(0, 64),
                             _limits.max_path_bytes));
            return {};
        }
        // The path names the first entry of that name: with duplicate names
        // (damage) it is another directory than the entry listed.
        auto st = _vol.stat(path);
        if (!st) {
            unreadable(path, st.error());
            return {};
        }
        if (st->first_cluster != sub.cluster && refused(path, st->first_cluster)) {
            return {};
        }
        auto entries = _vol.readdir(path);
        if (!entries) {
            unreadable(path, entries.error());
            return {};
        }
        return enter(std::move(path), st->first_cluster, *entries);
    }

    // Whether the directory `cluster`, reached as `path`, must not be
    // walked: one of its ancestors (a cycle) or walked already (cross-
    // linked). Reports it.
    bool refused(const std::string& path, uint32_t cluster)
    {
        if (const std::string* back = ancestor(cluster)) {
            skip(path, ELOOP,
                 fmt::format("{}: directory cycle: it leads back to {} (cluster {}), not walked; "
                             "the image is damaged (fsck.fat repairs it)",
                             path, *back == "/" ? "the root directory" : *back, cluster));
            return true;
        }
        if (_walked.contains(cluster)) {
            skip(path, EMLINK,
                 fmt::format("{}: the same directory (cluster {}) as one already walked, not "
                             "walked twice; the image is damaged (fsck.fat repairs it)",
                             path, cluster));
            return true;
        }
        return false;
    }

    void unreadable(const std::string& path, const error& why)
    {
        ++_summary.skipped;
        _visitor.skipped(path, why);
    }

    void skip(const std::string& path, int code, std::string message)
    {
        unreadable(path, walk_error(code, std::move(message)));
    }

    volume& _vol;
    walk_visitor& _visitor;
    const walk_limits& _limits;
    std::vector<frame> _stack;             // the current path, start first
    std::vector<subdirectory> _above;      // the start's ancestors: (path, cluster)
    std::unordered_set<uint32_t> _walked;  // first clusters of directories entered
    size_t _pending_bytes = 0;             // name_bytes of the frames on _stack
    walk_summary _summary;
};

}  // namespace

result<walk_summary> walk(volume& vol, std::string_view start, walk_visitor& visitor,
                          const walk_limits& limits)
{
    walker w(vol, visitor, limits);
    return w.run(std::string(start));
}

}  // namespace softblk::fat
