// The rbd target's way to its image (rbd_connect.hpp): the cluster
// connection with its timeouts, creating the image, opening it read-write,
// read-only or at a snapshot; errors that say which option to change.
#include "rbd_connect.hpp"

#include <cerrno>
#include <cstring>
#include <fmt/core.h>
#include <unistd.h>

namespace softblk::targets::rbd {

namespace {

result<void> set_conf(rados_t cluster, const char* key, const std::string& value)
{
    const int rc = librbd().rados_conf_set(cluster, key, value.c_str());
    if (rc < 0) {
        return make_error(
            -rc, fmt::format("rbd: setting {}={} refused: {}", key, value, errno_text(rc)));
    }
    return {};
}

}  // namespace

std::string errno_text(int negative_errno)
{
    return std::strerror(-negative_errno);
}

std::string no_osd_answered(const rbd_settings& set, osd_timeout timeout)
{
    return fmt::format("image={}: no OSD answered within {}={} s; are the OSDs of pool {} up?",
                       set.image, timeout.option, timeout.seconds, set.pool);
}

result<void> open_image(const rbd_settings& set, osd_timeout timeout, rbd_handles& h)
{
    const std::string& pool = set.pool;
    const std::string& image = set.image;
    const std::string& id = set.id;
    const std::string& conf = set.conf;
    const std::string& keyring = set.keyring;
    const std::string& snap = set.snap;
    const bool create = set.create;
    const bool read_only = set.read_only;
    int rc = librbd().rados_create(&h.cluster, id.c_str());
    if (rc < 0) {
        return make_error(-rc, fmt::format("id={}: rados_create: {}", id, errno_text(rc)));
    }
    // conf= empty: librados's own search ($CEPH_CONF, /etc/ceph/ceph.conf,
    // ~/.ceph/ceph.conf, ./ceph.conf).
    rc = librbd().rados_conf_read_file(h.cluster, conf.empty() ? nullptr : conf.c_str());
    if (rc < 0) {
        return make_error(
            -rc, conf.empty() ? fmt::format("conf: no ceph.conf found ($CEPH_CONF, "
                                            "/etc/ceph/ceph.conf): {}; give conf=PATH",
                                            errno_text(rc))
                              : fmt::format("conf={}: cannot read it: {}", conf, errno_text(rc)));
    }
    if (!keyring.empty()) {
        if (access(keyring.c_str(), R_OK) != 0) {
            return make_error(errno, fmt::format("keyring={}: {}", keyring, std::strerror(errno)));
        }
        if (auto s = set_conf(h.cluster, "keyring", keyring); !s) {
            return std::unexpected(s.error());
        }
    }
    const std::string connect_timeout = std::to_string(set.connect_timeout);
    for (const char* key : {"client_mount_timeout", "rados_mon_op_timeout"}) {
        if (auto s = set_conf(h.cluster, key, connect_timeout); !s) {
            return std::unexpected(s.error());
        }
    }
    if (auto s = set_conf(h.cluster, "rados_osd_op_timeout", std::to_string(timeout.seconds)); !s) {
        return std::unexpected(s.error());
    }
    // librbd's logs go to the daemon's stderr otherwise (the daemon's log).
    (void)librbd().rados_conf_set(h.cluster, "log_to_stderr", "false");
    (void)librbd().rados_conf_set(h.cluster, "err_to_stderr", "false");
    rc = librbd().rados_connect(h.cluster);
    if (rc < 0) {
        std::string why;
        if (rc == -ETIMEDOUT || rc == -ENOTCONN) {
            why = fmt::format(
                "no monitor answered within connect_timeout={} s; is the cluster "
                "up and conf= right?",
                connect_timeout);
        } else if (rc == -EACCES || rc == -EPERM || rc == -ENOENT || rc == -EINVAL) {
            why = fmt::format("client.{} was refused; check id= and keyring=", id);
        } else {
            why = errno_text(rc);
        }
        return make_error(-rc, fmt::format("rbd: cannot connect to the cluster ({}): {}",
                                           conf.empty() ? "default ceph.conf" : conf, why));
    }
    rc = librbd().rados_ioctx_create(h.cluster, pool.c_str(), &h.io);
    if (rc < 0) {
        return make_error(-rc, rc == -ENOENT
                                   ? fmt::format("pool={}: no such pool in the cluster", pool)
                                   : fmt::format("pool={}: {}", pool, errno_text(rc)));
    }
    if (create) {
        int order = 0;
        rc = librbd().rbd_create(h.io, image.c_str(), set.size, &order);
        if (rc == -ETIMEDOUT) {
            return make_error(ETIMEDOUT, no_osd_answered(set, timeout));
        }
        if (rc < 0 && rc != -EEXIST) {
            return make_error(-rc, fmt::format("image={}: cannot create it in pool {}: {}", image,
                                               pool, errno_text(rc)));
        }
    }
    const char* snap_name = snap.empty() ? nullptr : snap.c_str();
    rc = read_only ? librbd().rbd_open_read_only(h.io, image.c_str(), &h.image, snap_name)
                   : librbd().rbd_open(h.io, image.c_str(), &h.image, nullptr);
    if (rc < 0) {
        if (rc == -ENOENT && snap_name != nullptr) {
            // Tell a missing image from a missing snapshot.
            rbd_image_t probe = nullptr;
            if (librbd().rbd_open_read_only(h.io, image.c_str(), &probe, nullptr) == 0) {
                librbd().rbd_close(probe);
                return make_error(ENOENT, fmt::format("snap={}: image {}/{} has no such snapshot",
                                                      snap, pool, image));
            }
        }
        if (rc == -ENOENT) {
            return make_error(ENOENT, fmt::format("image={}: no such image in pool {} (create=1 "
                                                  "size= creates it)",
                                                  image, pool));
        }
        if (rc == -ETIMEDOUT) {
            return make_error(ETIMEDOUT, no_osd_answered(set, timeout));
        }
        return make_error(-rc, fmt::format("image={}: cannot open {}/{}: {}", image, pool, image,
                                           errno_text(rc)));
    }
    return {};
}

}  // namespace softblk::targets::rbd
