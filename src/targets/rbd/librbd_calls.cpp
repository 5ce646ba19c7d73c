#include "librbd_calls.hpp"

#include <dlfcn.h>

#include <fmt/core.h>

namespace softblk::targets {

namespace {

librbd_calls g_calls;

result<const librbd_calls*> load_once()
{
    // RTLD_LOCAL: Ceph's many symbols stay out of the global namespace;
    // dlsym on librbd's handle also searches its dependencies (librados).
    void* handle = dlopen(SOFTBLK_LIBRBD_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
        const char* why = dlerror();
        return make_error(ENOENT,
                          fmt::format("the rbd target needs {} (Debian's librbd1 package): {}",
                                      SOFTBLK_LIBRBD_SONAME, why != nullptr ? why : "not found"));
    }
#define SOFTBLK_LIBRBD_LOAD(name)                                                                \
    g_calls.name = reinterpret_cast<decltype(&::name)>(dlsym(handle, #name));                    \
    if (g_calls.name == nullptr) {                                                               \
        return make_error(ENOSYS, fmt::format("{} has no {}: librbd older than the one softblk " \
                                              "was built with",                                  \
                                              SOFTBLK_LIBRBD_SONAME, #name));                    \
    }
    SOFTBLK_LIBRBD_FUNCTIONS(SOFTBLK_LIBRBD_LOAD)
#undef SOFTBLK_LIBRBD_LOAD
    return &g_calls;
}

}  // namespace

result<const librbd_calls*> load_librbd()
{
    // A function-local static: the first caller loads, concurrent callers
    // wait for it (C++ guarantees one initialisation).
    static const result<const librbd_calls*> loaded = load_once();
    return loaded;
}

const librbd_calls& librbd()
{
    return g_calls;
}

}  // namespace softblk::targets
