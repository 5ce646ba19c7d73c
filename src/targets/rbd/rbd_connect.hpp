// Private to the rbd target: reaching the image (rbd_connect.cpp). The
// settings create_rbd checked, the handles it owns while the target is
// built, and open_image, which connects to the cluster, creates the image
// when asked and opens it.
#pragma once

#include "librbd_calls.hpp"

#include <softblk/types.hpp>

#include <cstdint>
#include <string>

namespace softblk::targets::rbd {

// strerror of a negative errno, for messages.
std::string errno_text(int negative_errno);

// Owns the handles while the target is being built; whatever the target
// did not take is released on the way out.
struct rbd_handles {
    rados_t cluster = nullptr;
    rados_ioctx_t io = nullptr;
    rbd_image_t image = nullptr;
    ~rbd_handles()
    {
        if (image != nullptr) {
            librbd().rbd_close(image);
        }
        if (io != nullptr) {
            librbd().rados_ioctx_destroy(io);
        }
        if (cluster != nullptr) {
            librbd().rados_shutdown(cluster);
        }
    }
};

// What create_rbd reaches the image with, checked.
struct rbd_settings {
    std::string pool, image, id, conf, keyring, snap;
    bool create = false;
    uint64_t size = 0;  // create=1 only
    bool read_only = false;
    uint64_t connect_timeout = 0;
};

// The OSD timeout an open runs with, and the option that set it.
struct osd_timeout {
    uint64_t seconds = 0;  // 0: none
    const char* option = "osd_op_timeout";
};

// The message for an open that no OSD answered within `timeout`.
std::string no_osd_answered(const rbd_settings& set, osd_timeout timeout);

// Connects to the cluster with rados_osd_op_timeout=`timeout` (0: wait for
// the OSDs forever), creates the image when asked and opens it, into `h`.
// Errors name the option to change. Control thread.
result<void> open_image(const rbd_settings& set, osd_timeout timeout, rbd_handles& h);

}  // namespace softblk::targets::rbd
