/* The seam between the fio engine (softblk_fio.c, C, compiled against fio's
 * headers) and a softblk device (softblk_fio_device.cpp, C++, the in-process
 * API). fio's headers are C that does not compile as C++, and softblk's API
 * is C++: each side stays in its own language and they meet here. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct softblk_fio_device;

enum softblk_fio_op {
    SOFTBLK_FIO_READ,
    SOFTBLK_FIO_WRITE,
    SOFTBLK_FIO_FLUSH,
    SOFTBLK_FIO_DISCARD,
};

/* Creates an in-process device of target type `target` from null_blk style
 * options separated by blanks ("memory_backed=1 size=1024"), driven from
 * one queue by the calling thread. `depth` (fio's iodepth) becomes the
 * queue's hw_queue_depth unless the options name it. On failure returns
 * NULL with a message in `error`. */
struct softblk_fio_device* softblk_fio_open(const char* target, const char* options, unsigned depth,
                                            char* error, size_t error_size);
void softblk_fio_close(struct softblk_fio_device* d);

uint64_t softblk_fio_capacity(const struct softblk_fio_device* d);
uint32_t softblk_fio_block_size(const struct softblk_fio_device* d);
int softblk_fio_can_discard(const struct softblk_fio_device* d);

/* Writes the device's state and counters (as `softblk list --json` shows
 * a device's: the target's, the cache's, the queues') to `path` as JSON.
 * Returns 0, or -1 with a message in `error`. */
int softblk_fio_describe(const struct softblk_fio_device* d, const char* path, char* error,
                         size_t error_size);

/* Per-I/O state (a bio), one for each of fio's io_u, made in io_u_init. */
void* softblk_fio_alloc_io(void);
void softblk_fio_free_io(void* io);

/* Submits `io` through the core (split on the device's limits, waiting for
 * a tag inside the core, never here); its completion is queued for
 * softblk_fio_reap with `cookie`. fua: force unit access on a write. */
void softblk_fio_submit(struct softblk_fio_device* d, void* io, enum softblk_fio_op op,
                        uint64_t offset, uint64_t length, void* buffer, int fua, void* cookie);

/* Runs the queue until at least `min` completions are waiting or
 * `timeout_ns` passed (negative: no limit), then takes up to `max` of them:
 * returns how many; softblk_fio_event(d, i, &status) gives the i-th one's
 * cookie and status (0 or a negative errno) until the next reap. */
unsigned softblk_fio_reap(struct softblk_fio_device* d, unsigned min, unsigned max,
                          int64_t timeout_ns);
void* softblk_fio_event(struct softblk_fio_device* d, unsigned index, int* status);

#ifdef __cplusplus
}
#endif
