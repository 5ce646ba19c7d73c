// libsoftblk's per-thread error message (softblk_get_error_msg), as
// libblkio keeps one: a fixed buffer per thread, so that setting it
// allocates nothing, on the request path either.
#include <climits>
#include <cstdio>
#include <cstring>

#include "capi.hpp"

namespace softblk::capi {
namespace {

thread_local char t_message[1024] = "";

}  // namespace

int fail(int errno_value, const char* format, ...)
{
    va_list args;
    va_start(args, format);
    std::vsnprintf(t_message, sizeof(t_message), format, args);
    va_end(args);
    return -errno_value;
}

int fail(const error& e)
{
    const int code = e.code.value() > 0 ? e.code.value() : EIO;
    return fail(code, "%s", e.message.c_str());
}

int copy_out(std::string_view text, char* buf, size_t size)
{
    if (text.size() > INT_MAX) {
        return fail(EOVERFLOW, "the value is %zu bytes, more than an int counts", text.size());
    }
    if (buf != nullptr && size > 0) {
        const size_t n = std::min(text.size(), size - 1);
        std::memcpy(buf, text.data(), n);
        buf[n] = '\0';
    }
    return static_cast<int>(text.size());
}

}  // namespace softblk::capi

extern "C" {

const char* softblk_get_error_msg(void)
{
    return softblk::capi::t_message;
}

uint32_t softblk_version(void)
{
    return SOFTBLK_VERSION;
}

}  // extern "C"
