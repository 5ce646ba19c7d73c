// libsoftblk's handles behind include/softblk.h: what a struct softblk_device,
// softblk_queue and softblk_export hold, and the pieces the C functions
// share (the thread's error message, the guard that keeps exceptions from
// crossing the C boundary). Internal to src/capi.
#pragma once

#include <cerrno>
#include <cstdarg>
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include <softblk.h>
#include <softblk/device.hpp>
#include <softblk/frontend.hpp>

struct softblk_queue;

namespace softblk::capi {

// Sets the calling thread's message (printf format) and returns -errno_value.
// Writes into a fixed thread-local buffer: no allocation, so the request
// path may use it too.
int fail(int errno_value, const char* format, ...) __attribute__((format(printf, 2, 3)));
// The same from a control-path error (its code and message).
int fail(const error& e);

// Copies `text` to `buf` as snprintf does: NUL-terminated, cut to `size`;
// returns the length of the whole text (or -EOVERFLOW above INT_MAX).
int copy_out(std::string_view text, char* buf, size_t size);

// Runs `body` (returning int), turning an exception into -ENOMEM or -EIO
// with a message: nothing may unwind into a C caller.
template <class F>
int guarded(const char* function, F&& body) noexcept
{
    try {
        return body();
    } catch (const std::bad_alloc&) {
        return fail(ENOMEM, "%s: out of memory", function);
    } catch (const std::exception& e) {
        return fail(EIO, "%s: internal error: %s", function, e.what());
    } catch (...) {
        return fail(EIO, "%s: internal error", function);
    }
}

// One request slot of a queue: preallocated when the queue handle is made
// (queue_depth of them), so submitting allocates nothing.
struct request_slot {
    bio b;
    struct softblk_queue* queue = nullptr;
    void* user_data = nullptr;
    int status = 0;
    request_slot* next = nullptr;  // free list or completed list
    // The completion's error_msg: what failed and why, written when the
    // request fails.
    char message[192] = {};
};

}  // namespace softblk::capi

struct softblk_queue {
    softblk::io_queue* queue = nullptr;
    struct softblk_device* dev = nullptr;
    std::unique_ptr<softblk::capi::request_slot[]> slots;
    unsigned slot_count = 0;
    softblk::capi::request_slot* free_list = nullptr;
    softblk::capi::request_slot* done_head = nullptr;
    softblk::capi::request_slot* done_tail = nullptr;
    unsigned submitted = 0;  // in the core, not completed
    unsigned done = 0;       // completed, not yet returned by do_io
};

struct softblk_export {
    struct softblk_device* dev = nullptr;
    std::unique_ptr<softblk::device_export> running;
};

struct softblk_device {
    std::unique_ptr<softblk::device> device;
    // One handle per device queue while powered on (made by sync_queues).
    std::vector<std::unique_ptr<softblk_queue>> queues;
    std::vector<std::unique_ptr<softblk_export>> exports;
};

namespace softblk::capi {

// Makes the queue handles match the device's queues after a control call
// that may have re-made them: handles of queues that are gone end, new
// ones get fresh slots. `remade`: the call re-made the queues (a power
// change, a `reconfigure` option), so every handle is new even where a
// new queue has the address of an old one. Control thread.
void sync_queues(struct softblk_device& dev, bool remade = false);

// Requests of the device's queue handles not yet returned by do_io.
unsigned requests_in_flight(const struct softblk_device& dev);

// Runs every queue until the requests in the core have completed (before a
// power off or a destruction). Control thread.
void drain_queues(struct softblk_device& dev);

// "key=value key=value" split at white space.
std::vector<std::string> split_options(const char* options);

}  // namespace softblk::capi
