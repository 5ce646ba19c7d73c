// librbd and librados, loaded when the first rbd device is made rather than
// when softblk starts. Linked at build time, the two (with libceph-common,
// Boost and some 40 other libraries) cost every start of every program that
// holds the rbd target some 60 ms of relocation, page faults and Ceph's
// static constructors, and over a second under AddressSanitizer, though
// almost no start makes an rbd device. QEMU loads its rbd driver the same
// way, as a module. The headers still come from librbd-dev: the table's
// types are the C API's own declarations, so a mismatch fails to compile.
#pragma once

#include <softblk/types.hpp>

#include <rados/librados.h>
#include <rbd/librbd.h>

namespace softblk::targets {

// X-list of every librados and librbd function the rbd target calls; a new
// call is one more line here.
#define SOFTBLK_LIBRBD_FUNCTIONS(X) \
    X(rados_create)                 \
    X(rados_conf_read_file)         \
    X(rados_conf_set)               \
    X(rados_connect)                \
    X(rados_ioctx_create)           \
    X(rados_ioctx_destroy)          \
    X(rados_shutdown)               \
    X(rbd_create)                   \
    X(rbd_open)                     \
    X(rbd_open_read_only)           \
    X(rbd_close)                    \
    X(rbd_get_size)                 \
    X(rbd_stat)                     \
    X(rbd_get_stripe_count)         \
    X(rbd_update_watch)             \
    X(rbd_update_unwatch)           \
    X(rbd_diff_iterate2)            \
    X(rbd_aio_create_completion)    \
    X(rbd_aio_release)              \
    X(rbd_aio_get_return_value)     \
    X(rbd_aio_read)                 \
    X(rbd_aio_write)                \
    X(rbd_aio_flush)                \
    X(rbd_aio_discard)              \
    X(rbd_aio_write_zeroes)

// The loaded functions, each a member named as the C function.
struct librbd_calls {
#define SOFTBLK_LIBRBD_MEMBER(name) decltype(&::name) name = nullptr;
    SOFTBLK_LIBRBD_FUNCTIONS(SOFTBLK_LIBRBD_MEMBER)
#undef SOFTBLK_LIBRBD_MEMBER
};

// Loads librbd (and librados, its dependency) on the first call, from any
// thread; every later call returns the first one's outcome at once. The
// libraries stay loaded until the process exits (librados's threads and
// static state do not survive an unload). On failure the error names the
// library and says what installs it.
result<const librbd_calls*> load_librbd();

// The table after load_librbd() succeeded (the rbd target makes no device
// before it has); any thread.
const librbd_calls& librbd();

}  // namespace softblk::targets
