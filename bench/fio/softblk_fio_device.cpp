// The softblk side of the fio engine (softblk_fio.h): one in-process device
// per fio job, driven by the job's thread from queue 0 through the core's
// bio path (split, tag waits, completion modes), as a front end drives it.
// Completions are collected on an intrusive list, so nothing is allocated
// per I/O.
#include "softblk_fio.h"

#include <softblk/device.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cstdio>
#include <ctime>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace {

struct fio_io {
    softblk::bio b;
    softblk_fio_device* device = nullptr;
    void* cookie = nullptr;
    int status = 0;
    fio_io* next = nullptr;
};

uint64_t monotonic_ns()
{
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(ts.tv_nsec);
}

std::vector<std::string> split_blanks(std::string_view text)
{
    std::vector<std::string> words;
    size_t i = 0;
    while (i < text.size()) {
        while (i < text.size() && (text[i] == ' ' || text[i] == '\t' || text[i] == '\n')) {
            ++i;
        }
        size_t j = i;
        while (j < text.size() && text[j] != ' ' && text[j] != '\t' && text[j] != '\n') {
            ++j;
        }
        if (j > i) {
            words.emplace_back(text.substr(i, j - i));
        }
        i = j;
    }
    return words;
}

void set_error(char* error, size_t error_size, const std::string& message)
{
    if (error != nullptr && error_size > 0) {
        std::snprintf(error, error_size, "%s", message.c_str());
    }
}

}  // namespace

struct softblk_fio_device {
    std::unique_ptr<softblk::device> dev;
    softblk::io_queue* queue = nullptr;
    // Completed, not reaped yet: in completion order.
    fio_io* done_head = nullptr;
    fio_io* done_tail = nullptr;
    unsigned done_count = 0;
    // What the last reap took, for softblk_fio_event.
    std::vector<fio_io*> events;
    unsigned event_count = 0;

    static void on_complete(softblk::bio& b, int status)
    {
        auto* io = static_cast<fio_io*>(b.user_data);
        softblk_fio_device* d = io->device;
        io->status = status;
        io->next = nullptr;
        if (d->done_tail != nullptr) {
            d->done_tail->next = io;
        } else {
            d->done_head = io;
        }
        d->done_tail = io;
        ++d->done_count;
    }
};

extern "C" {

softblk_fio_device* softblk_fio_open(const char* target, const char* options, unsigned depth,
                                     char* error, size_t error_size)
{
    if (target == nullptr || *target == '\0') {
        set_error(error, error_size,
                  "no target type: set softblk_target (null, file, zloop-ram, ...)");
        return nullptr;
    }
    std::vector<std::string> args = split_blanks(options != nullptr ? options : "");
    const bool depth_given = std::any_of(args.begin(), args.end(), [](const std::string& a) {
        return a.starts_with("hw_queue_depth=");
    });
    if (!depth_given && depth > 0) {
        // Every one of fio's I/Os gets a tag, so that iodepth is the depth
        // the target sees rather than the core's tag wait list.
        args.push_back("hw_queue_depth=" + std::to_string(depth));
    }
    auto created = softblk::device::create("fio", target, args);
    if (!created) {
        set_error(error, error_size,
                  std::string("softblk_target=") + target + ": " + created.error().message);
        return nullptr;
    }
    auto d = std::make_unique<softblk_fio_device>();
    d->dev = std::move(*created);
    if (d->dev->queue_count() == 0) {
        set_error(error, error_size,
                  "the device is powered off (power=0 in softblk_opts): it has no queue to "
                  "drive; leave power out");
        return nullptr;
    }
    if (d->dev->limits().zoned) {
        // fio would write anywhere in a zone: its zonemode=zbd needs the
        // engine's zone callbacks, which this engine does not have.
        set_error(error, error_size,
                  std::string("softblk_target=") + target +
                      " makes a zoned device, which this engine does not drive (fio's "
                      "zonemode=zbd is not supported); use a conventional target");
        return nullptr;
    }
    d->queue = &d->dev->queue(0);
    d->events.resize(std::max(depth, 1u));
    return d.release();
}

void softblk_fio_close(softblk_fio_device* d)
{
    if (d == nullptr) {
        return;
    }
    // fio reaps everything it queued before cleanup; an error path may
    // not have: the bios must not outlive the device's queue.
    while (d->queue != nullptr && d->queue->in_flight() > 0) {
        d->queue->wait(d->queue->in_flight(), 1'000'000'000);
    }
    delete d;
}

uint64_t softblk_fio_capacity(const softblk_fio_device* d)
{
    return d->dev->limits().capacity_bytes;
}

uint32_t softblk_fio_block_size(const softblk_fio_device* d)
{
    return d->dev->limits().logical_block_size;
}

int softblk_fio_can_discard(const softblk_fio_device* d)
{
    return d->dev->limits().max_discard_bytes > 0 ? 1 : 0;
}

int softblk_fio_describe(const softblk_fio_device* d, const char* path, char* error,
                         size_t error_size)
{
    nlohmann::json out;
    d->dev->describe(out);
    std::FILE* f = std::fopen(path, "w");
    if (f == nullptr) {
        set_error(
            error, error_size,
            std::string("cannot write softblk_describe=") + path + ": " + std::strerror(errno));
        return -1;
    }
    const std::string text = out.dump(2) + "\n";
    const bool written = std::fwrite(text.data(), 1, text.size(), f) == text.size();
    if (std::fclose(f) != 0 || !written) {
        set_error(
            error, error_size,
            std::string("cannot write softblk_describe=") + path + ": " + std::strerror(errno));
        return -1;
    }
    return 0;
}

void* softblk_fio_alloc_io(void)
{
    return new (std::nothrow) fio_io;
}

void softblk_fio_free_io(void* io)
{
    delete static_cast<fio_io*>(io);
}

void softblk_fio_submit(softblk_fio_device* d, void* io_ptr, softblk_fio_op op, uint64_t offset,
                        uint64_t length, void* buffer, int fua, void* cookie)
{
    auto* io = static_cast<fio_io*>(io_ptr);
    softblk::io_op sop = softblk::io_op::read;
    switch (op) {
    case SOFTBLK_FIO_READ:
        sop = softblk::io_op::read;
        break;
    case SOFTBLK_FIO_WRITE:
        sop = softblk::io_op::write;
        break;
    case SOFTBLK_FIO_FLUSH:
        sop = softblk::io_op::flush;
        offset = 0;
        length = 0;
        buffer = nullptr;
        break;
    case SOFTBLK_FIO_DISCARD:
        sop = softblk::io_op::discard;
        buffer = nullptr;
        break;
    }
    io->b =
        softblk::make_bio(sop, offset, length, buffer, fua != 0 ? uint32_t{softblk::k_io_fua} : 0u);
    io->b.on_complete = softblk_fio_device::on_complete;
    io->b.user_data = io;
    io->device = d;
    io->cookie = cookie;
    d->queue->submit(io->b);
}

unsigned softblk_fio_reap(softblk_fio_device* d, unsigned min, unsigned max, int64_t timeout_ns)
{
    softblk::io_queue& q = *d->queue;
    q.process();
    const uint64_t deadline =
        timeout_ns >= 0 ? monotonic_ns() + static_cast<uint64_t>(timeout_ns) : UINT64_MAX;
    while (d->done_count < min && q.in_flight() > 0) {
        int64_t left = -1;
        if (deadline != UINT64_MAX) {
            const uint64_t now = monotonic_ns();
            if (now >= deadline) {
                break;
            }
            left = static_cast<int64_t>(deadline - now);
        }
        q.wait(min - d->done_count, left);
    }
    const unsigned take = std::min({d->done_count, max, static_cast<unsigned>(d->events.size())});
    for (unsigned i = 0; i < take; ++i) {
        fio_io* io = d->done_head;
        d->done_head = io->next;
        d->events[i] = io;
    }
    if (d->done_head == nullptr) {
        d->done_tail = nullptr;
    }
    d->done_count -= take;
    d->event_count = take;
    return take;
}

void* softblk_fio_event(softblk_fio_device* d, unsigned index, int* status)
{
    if (index >= d->event_count) {
        return nullptr;
    }
    fio_io* io = d->events[index];
    *status = io->status;
    return io->cookie;
}

}  // extern "C"
