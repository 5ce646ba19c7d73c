#define FUSE_USE_VERSION 312
#include "nullb_fs.hpp"

#include "nullb_tree.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <dirent.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <map>
#include <memory>
#include <optional>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <softblk/device.hpp>

#include "client.hpp"

namespace softblk::cli {

namespace {

using nlohmann::json;

// configfs attribute files are one page; a write stores at most a page
// less its terminating NUL (fill_write_buffer).
constexpr size_t k_page = 4096;

enum class kind : uint8_t { root, features, device_dir, group_dir, attribute, device_file };

struct node {
    kind what = kind::root;
    fuse_ino_t parent = 0;
    std::string name = {};    // in its parent
    std::string device = {};  // the device directory it is in
    std::string path = {};    // below the device directory ("size", "timeout_inject/times")
    mode_t mode = 0;
};

// What an open file shows: filled by the first read, as configfs fills its
// buffer once per open (configfs_read_iter).
struct open_file {
    bool filled = false;
    std::string text;
};

class nullb_fs {
public:
    nullb_fs(run_paths paths, nullb_fs_options options)
        : _paths(std::move(paths)), _options(std::move(options)), _tree(options_for("null"))
    {
        _nodes.push_back(node{});  // inode 0 unused
        _nodes.push_back(node{.what = kind::root, .parent = FUSE_ROOT_ID, .mode = 0755});
    }

    // Connects to the daemon (starting one). Main thread.
    result<void> connect()
    {
        auto c = control_client::connect(_paths, true);
        if (!c) {
            return std::unexpected(c.error());
        }
        _client.emplace(std::move(*c));
        return {};
    }

    static const fuse_lowlevel_ops& operations();

private:
    static nullb_fs& self(fuse_req_t req)
    {
        return *static_cast<nullb_fs*>(fuse_req_userdata(req));
    }

    // One request to the daemon, connecting again once if the daemon went
    // away meanwhile (a new one recovers the devices).
    result<json> call(std::string_view method, const json& params)
    {
        if (!_client) {
            if (auto r = connect(); !r) {
                return std::unexpected(r.error());
            }
        }
        auto r = _client->call(method, params);
        if (!r && (r.error().code.value() == EPIPE || r.error().code.value() == ECONNRESET ||
                   r.error().code.value() == ENOTCONN || r.error().code.value() == EBADF)) {
            _client.reset();
            if (auto c = connect(); !c) {
                return std::unexpected(c.error());
            }
            r = _client->call(method, params);
        }
        return r;
    }

    fuse_ino_t intern(fuse_ino_t parent, const std::string& name, node n)
    {
        auto key = std::make_pair(parent, name);
        if (auto it = _by_name.find(key); it != _by_name.end()) {
            _nodes[it->second] = std::move(n);
            _nodes[it->second].parent = parent;
            _nodes[it->second].name = name;
            return it->second;
        }
        n.parent = parent;
        n.name = name;
        _nodes.push_back(std::move(n));
        const fuse_ino_t ino = _nodes.size() - 1;
        _by_name.emplace(key, ino);
        return ino;
    }

    const node* at(fuse_ino_t ino) const
    {
        return ino < _nodes.size() && ino > 0 ? &_nodes[ino] : nullptr;
    }

    struct stat stat_of(fuse_ino_t ino, const node& n) const
    {
        struct stat st = {};
        st.st_ino = ino;
        const bool dir =
            n.what == kind::root || n.what == kind::device_dir || n.what == kind::group_dir;
        st.st_mode = (dir ? S_IFDIR : S_IFREG) | n.mode;
        st.st_nlink = dir ? 2 : 1;
        st.st_size = dir ? 0 : static_cast<off_t>(k_page);  // configfs shows a page
        st.st_uid = ::getuid();
        st.st_gid = ::getgid();
        st.st_atime = st.st_mtime = st.st_ctime = _mounted_at;
        return st;
    }

    void reply_entry(fuse_req_t req, fuse_ino_t ino)
    {
        fuse_entry_param e = {};
        e.ino = ino;
        e.attr = stat_of(ino, _nodes[ino]);
        // No caching: another client (softblk del, a second mount) may
        // change the tree at any time, as configfs' users may.
        e.attr_timeout = 0;
        e.entry_timeout = 0;
        fuse_reply_entry(req, &e);
    }

    // The node for `name` in device directory `device` (or group `group`).
    std::optional<node> child_of_device(const std::string& device, std::string_view group,
                                        std::string_view name) const
    {
        const std::string path =
            group.empty() ? std::string(name) : fmt::format("{}/{}", group, name);
        if (group.empty() && name == k_device_file) {
            return node{.what = kind::device_file, .device = device, .path = path, .mode = 0444};
        }
        if (group.empty() && _tree.is_group(name)) {
            return node{.what = kind::group_dir, .device = device, .path = path, .mode = 0755};
        }
        if (const option_def* def = _tree.attribute(path)) {
            return node{.what = kind::attribute,
                        .device = device,
                        .path = path,
                        .mode = mode_t(def->write_only ? 0200 : 0644)};
        }
        return std::nullopt;
    }

    // Error code of a daemon reply, for fuse_reply_err.
    static int code_of(const error& e)
    {
        const int c = e.code.value();
        return c > 0 ? c : EIO;
    }

    // ---- operations

    static void lookup(fuse_req_t req, fuse_ino_t parent, const char* name)
    {
        nullb_fs& fs = self(req);
        const node* p = fs.at(parent);
        if (p == nullptr) {
            fuse_reply_err(req, ENOENT);
            return;
        }
        const std::string child = name;
        if (p->what == kind::root) {
            if (child == "features") {
                fs.reply_entry(
                    req, fs.intern(parent, child, node{.what = kind::features, .mode = 0444}));
                return;
            }
            auto r = fs.call("get", json{{"name", child}, {"keys", json::array({"power"})}});
            if (!r || r->value("type", std::string("null")) != "null") {
                fuse_reply_err(req, ENOENT);
                return;
            }
            fs.reply_entry(
                req, fs.intern(parent, child,
                               node{.what = kind::device_dir, .device = child, .mode = 0755}));
            return;
        }
        if (p->what == kind::device_dir || p->what == kind::group_dir) {
            auto n =
                fs.child_of_device(p->device, p->what == kind::group_dir ? p->path : "", child);
            if (!n || (p->what == kind::group_dir && n->what != kind::attribute)) {
                fuse_reply_err(req, ENOENT);
                return;
            }
            fs.reply_entry(req, fs.intern(parent, child, std::move(*n)));
            return;
        }
        fuse_reply_err(req, ENOTDIR);
    }

    static void getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*)
    {
        nullb_fs& fs = self(req);
        const node* n = fs.at(ino);
        if (n == nullptr) {
            fuse_reply_err(req, ENOENT);
            return;
        }
        const struct stat st = fs.stat_of(ino, *n);
        fuse_reply_attr(req, &st, 0);
    }

    static void setattr(fuse_req_t req, fuse_ino_t ino, struct stat*, int, fuse_file_info* fi)
    {
        // `echo 1 > attr` truncates first; configfs lets it (nothing to cut).
        getattr(req, ino, fi);
    }

    static void readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*)
    {
        nullb_fs& fs = self(req);
        const node* found = fs.at(ino);
        if (found == nullptr) {
            fuse_reply_err(req, ENOENT);
            return;
        }
        // A copy: interning the children below may move the nodes.
        const node n = *found;
        // Each entry with the inode number lookup gives it: an entry with
        // d_ino 0 is skipped by readdir(3), so `ls` would show nothing.
        struct dir_entry {
            std::string name;
            fuse_ino_t ino;
            bool directory;
        };
        std::vector<dir_entry> names = {{".", ino, true}, {"..", n.parent, true}};
        if (n.what == kind::root) {
            names.push_back({"features",
                             fs.intern(ino, "features", node{.what = kind::features, .mode = 0444}),
                             false});
            auto list = fs.call("list", json::object());
            if (!list) {
                fuse_reply_err(req, code_of(list.error()));
                return;
            }
            for (const json& d : *list) {
                const std::string name = d.value("name", std::string());
                if (d.value("type", std::string()) != "null" || name == "features") {
                    continue;  // "features" is the file (a device of that name predates the rule)
                }
                names.push_back(
                    {name,
                     fs.intern(ino, name,
                               node{.what = kind::device_dir, .device = name, .mode = 0755}),
                     true});
            }
        } else if (n.what == kind::device_dir || n.what == kind::group_dir) {
            const bool group = n.what == kind::group_dir;
            const auto entries = group ? fs._tree.group_entries(n.path) : fs._tree.device_entries();
            for (const auto& e : entries) {
                auto c = fs.child_of_device(n.device, group ? n.path : "", e.name);
                if (!c) {
                    continue;
                }
                names.push_back({e.name, fs.intern(ino, e.name, std::move(*c)), e.directory});
            }
        } else {
            fuse_reply_err(req, ENOTDIR);
            return;
        }
        std::string buf(size, '\0');
        size_t used = 0;
        for (size_t i = static_cast<size_t>(off); i < names.size(); ++i) {
            struct stat st = {};
            st.st_ino = names[i].ino;
            st.st_mode = names[i].directory ? S_IFDIR : S_IFREG;
            const size_t len =
                fuse_add_direntry(req, buf.data() + used, size - used, names[i].name.c_str(), &st,
                                  static_cast<off_t>(i + 1));
            if (len > size - used) {
                break;
            }
            used += len;
        }
        fuse_reply_buf(req, buf.data(), used);
    }

    static void open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi)
    {
        nullb_fs& fs = self(req);
        const node* n = fs.at(ino);
        if (n == nullptr) {
            fuse_reply_err(req, ENOENT);
            return;
        }
        const int acc = fi->flags & O_ACCMODE;
        const bool reading = acc == O_RDONLY || acc == O_RDWR;
        const bool writing = acc == O_WRONLY || acc == O_RDWR;
        // configfs_open_file: EACCES when the attribute has no show (or no
        // store) for the access asked, root included.
        if ((reading && (n->mode & 0444) == 0) || (writing && (n->mode & 0222) == 0)) {
            fuse_reply_err(req, EACCES);
            return;
        }
        fi->direct_io = 1;  // every read and write reaches us
        fi->fh = reinterpret_cast<uint64_t>(new open_file());
        fuse_reply_open(req, fi);
    }

    static void release(fuse_req_t req, fuse_ino_t, fuse_file_info* fi)
    {
        delete reinterpret_cast<open_file*>(fi->fh);
        fuse_reply_err(req, 0);
    }

    static void read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi)
    {
        nullb_fs& fs = self(req);
        const node* n = fs.at(ino);
        auto* f = reinterpret_cast<open_file*>(fi->fh);
        if (n == nullptr || f == nullptr) {
            fuse_reply_err(req, ENOENT);
            return;
        }
        if (!f->filled) {
            if (n->what == kind::features) {
                f->text = fs._tree.features();
            } else if (n->what == kind::device_file) {
                auto r =
                    fs.call("get", json{{"name", n->device}, {"keys", json::array({"power"})}});
                if (!r) {
                    fuse_reply_err(req, code_of(r.error()));
                    return;
                }
                f->text = nullb_tree::device_text(r->value("power", 0),
                                                  r->value("export", json::object()));
            } else {
                auto r =
                    fs.call("get", json{{"name", n->device}, {"keys", json::array({n->path})}});
                if (!r) {
                    fuse_reply_err(req, code_of(r.error()));
                    return;
                }
                f->text = (*r)["values"].value(n->path, std::string());
            }
            f->filled = true;
        }
        if (static_cast<size_t>(off) >= f->text.size()) {
            fuse_reply_buf(req, nullptr, 0);
            return;
        }
        const size_t n_bytes = std::min(size, f->text.size() - static_cast<size_t>(off));
        fuse_reply_buf(req, f->text.data() + off, n_bytes);
    }

    static void write(fuse_req_t req, fuse_ino_t ino, const char* buf, size_t size, off_t,
                      fuse_file_info*)
    {
        nullb_fs& fs = self(req);
        const node* n = fs.at(ino);
        if (n == nullptr || n->what != kind::attribute) {
            fuse_reply_err(req, n == nullptr ? ENOENT : EACCES);
            return;
        }
        if (size == 0) {
            fuse_reply_write(req, 0);
            return;
        }
        // Each write() is one store of what it carries (configfs_write_iter),
        // at most a page less one byte, and the store sees a C string.
        const size_t used = std::min(size, k_page - 1);
        const std::string value(buf, used);
        auto r =
            fs.call("set", json{{"name", n->device},
                                {"options", json::array({fmt::format("{}={}", n->path, value)})},
                                {"force", true}});
        if (!r) {
            fuse_reply_err(req, code_of(r.error()));
            return;
        }
        fuse_reply_write(req, used);
    }

    static void mkdir(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t)
    {
        nullb_fs& fs = self(req);
        const node* p = fs.at(parent);
        if (p == nullptr || p->what != kind::root) {
            // Lack of make_group: configfs says EPERM.
            fuse_reply_err(req, p == nullptr ? ENOENT : EPERM);
            return;
        }
        json params = {{"type", "null"}, {"name", name}, {"options", json::array({"power=0"})}};
        if (!fs._options.export_type.empty()) {
            params["export"] = fs._options.export_type;
        }
        if (!fs._options.export_options.empty()) {
            params["export_options"] = fs._options.export_options;
        }
        auto r = fs.call("add", params);
        if (!r) {
            fuse_reply_err(req, code_of(r.error()));
            return;
        }
        fs.reply_entry(
            req,
            fs.intern(parent, name, node{.what = kind::device_dir, .device = name, .mode = 0755}));
    }

    static void rmdir(fuse_req_t req, fuse_ino_t parent, const char* name)
    {
        nullb_fs& fs = self(req);
        const node* p = fs.at(parent);
        if (p == nullptr || p->what != kind::root) {
            // A default group (timeout_inject) cannot go on its own.
            fuse_reply_err(req, p == nullptr ? ENOENT : EPERM);
            return;
        }
        auto r = fs.call("del", json{{"name", name}});
        if (!r) {
            fuse_reply_err(req, code_of(r.error()));
            return;
        }
        fuse_reply_err(req, 0);
    }

    static void create(fuse_req_t req, fuse_ino_t, const char*, mode_t, fuse_file_info*)
    {
        fuse_reply_err(req, EACCES);  // configfs has no create
    }

    static void mknod(fuse_req_t req, fuse_ino_t, const char*, mode_t, dev_t)
    {
        fuse_reply_err(req, EACCES);
    }

    static void unlink(fuse_req_t req, fuse_ino_t, const char*)
    {
        fuse_reply_err(req, EPERM);  // configfs_unlink: only links go
    }

    static void rename(fuse_req_t req, fuse_ino_t, const char*, fuse_ino_t, const char*,
                       unsigned int)
    {
        fuse_reply_err(req, EPERM);  // configfs has no rename
    }

    run_paths _paths;
    nullb_fs_options _options;
    nullb_tree _tree;
    std::optional<control_client> _client;
    std::vector<node> _nodes;
    std::map<std::pair<fuse_ino_t, std::string>, fuse_ino_t> _by_name;
    time_t _mounted_at = ::time(nullptr);
};

const fuse_lowlevel_ops& nullb_fs::operations()
{
    static const fuse_lowlevel_ops ops = [] {
        fuse_lowlevel_ops o{};
        o.lookup = lookup;
        o.getattr = getattr;
        o.setattr = setattr;
        o.readdir = readdir;
        o.open = open;
        o.release = release;
        o.read = read;
        o.write = write;
        o.mkdir = mkdir;
        o.rmdir = rmdir;
        o.create = create;
        o.mknod = mknod;
        o.unlink = unlink;
        o.rename = rename;
        return o;
    }();
    return ops;
}

// Why `dir` cannot take the tree, or "": it must be an empty directory
// that nothing is mounted on (configfs is mounted once; a mount over files
// would hide them).
std::string unusable_mount_point(const std::string& dir)
{
    struct statx stx = {};
    if (::statx(AT_FDCWD, dir.c_str(), 0, STATX_TYPE, &stx) != 0) {
        return fmt::format("{}: {}", dir, std::strerror(errno));
    }
    if (!S_ISDIR(stx.stx_mode)) {
        return fmt::format("{}: not a directory", dir);
    }
    if ((stx.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT) != 0 &&
        (stx.stx_attributes & STATX_ATTR_MOUNT_ROOT) != 0) {
        return fmt::format(
            "{}: something is mounted there already (a nullb tree is mounted "
            "once, as configfs is): unmount it first (softblk nullb umount {}) or "
            "choose an empty directory",
            dir, dir);
    }
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) {
        return fmt::format("{}: {}", dir, std::strerror(errno));
    }
    bool empty = true;
    while (const dirent* e = ::readdir(d)) {
        if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) {
            empty = false;
            break;
        }
    }
    ::closedir(d);
    if (!empty) {
        return fmt::format(
            "{}: not empty (the tree would hide what is in it): choose an empty "
            "directory",
            dir);
    }
    return {};
}

}  // namespace

int run_nullb_fs(const run_paths& paths, const nullb_fs_options& o)
{
    if (std::string why = unusable_mount_point(o.mount_point); !why.empty()) {
        fmt::print(stderr, "softblk nullb mount: {}\n", why);
        return 1;
    }
    auto fs = std::make_unique<nullb_fs>(paths, o);
    if (auto r = fs->connect(); !r) {
        fmt::print(stderr, "softblk nullb mount: {}\n", r.error().message);
        return 1;
    }
    const std::string mount_options =
        fmt::format("fsname=softblk-nullb,subtype=softblk-nullb,default_permissions{}",
                    ::geteuid() == 0 ? ",allow_other" : "");
    const char* argv[] = {"softblk", "-o", mount_options.c_str()};
    fuse_args args = FUSE_ARGS_INIT(3, const_cast<char**>(argv));
    fuse_session* session =
        fuse_session_new(&args, &nullb_fs::operations(), sizeof(fuse_lowlevel_ops), fs.get());
    // Parsing the options may have made libfuse copy the arguments; the
    // session keeps none of them (ASan's leak check found the copy).
    fuse_opt_free_args(&args);
    if (session == nullptr) {
        fmt::print(stderr, "softblk nullb mount: libfuse rejected '{}'\n", mount_options);
        return 1;
    }
    int status = 1;
    if (fuse_set_signal_handlers(session) != 0) {
        fmt::print(stderr, "softblk nullb mount: cannot install signal handlers\n");
    } else if (fuse_session_mount(session, o.mount_point.c_str()) != 0) {
        fmt::print(stderr,
                   "softblk nullb mount: FUSE mount on {} failed (is /dev/fuse usable? as a user, "
                   "fusermount3 must be installed)\n",
                   o.mount_point);
        fuse_remove_signal_handlers(session);
    } else {
        if (!o.foreground) {
            fmt::print("nullb tree mounted on {}\n", o.mount_point);
            std::fflush(stdout);
        }
        if (fuse_daemonize(o.foreground ? 1 : 0) == 0) {
            status = fuse_session_loop(session) == 0 ? 0 : 1;
        }
        fuse_session_unmount(session);
        fuse_remove_signal_handlers(session);
    }
    fuse_session_destroy(session);
    return status;
}

int unmount_nullb_fs(const std::string& mount_point)
{
    if (::geteuid() == 0) {
        if (::umount2(mount_point.c_str(), 0) == 0) {
            return 0;
        }
        fmt::print(stderr, "softblk nullb umount: {}: {}\n", mount_point, std::strerror(errno));
        return 1;
    }
    const pid_t pid = ::fork();
    if (pid == 0) {
        ::execlp("fusermount3", "fusermount3", "-u", mount_point.c_str(), nullptr);
        ::_exit(127);
    }
    int wstatus = 0;
    if (pid < 0 || ::waitpid(pid, &wstatus, 0) < 0 || !WIFEXITED(wstatus) ||
        WEXITSTATUS(wstatus) != 0) {
        fmt::print(stderr, "softblk nullb umount: fusermount3 -u {} failed\n", mount_point);
        return 1;
    }
    return 0;
}

}  // namespace softblk::cli
