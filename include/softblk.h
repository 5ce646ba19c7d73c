/*
 * libsoftblk: softblk's devices from C (docs/capi.md).
 *
 * A program creates a device from a target type ("null", "file", "zloop",
 * "zloop-ram", ...) and the same key=value options as `softblk add`, takes
 * its queues, submits requests to them and reaps their completions, and may
 * start an export ("fuse", "nbd", "ublk", "vhost-user-blk") of it by name.
 * Everything runs inside the calling process: no daemon is involved.
 *
 * Conventions (as libblkio's):
 *  - Functions that can fail return 0 (or a count) on success and a
 *    negative errno on failure; the calling thread's last error message is
 *    then softblk_get_error_msg(). Messages may change between releases;
 *    errno values are stable only where this header names them.
 *  - Offsets and lengths are bytes; they must be multiples of the device's
 *    logical block size (property "logical_block_size").
 *  - Handles are opaque. A device handle is used by one control thread at
 *    a time; each queue by one thread at a time (its submissions and
 *    softblk_queue_do_io); different queues may run on different threads.
 *  - No function throws. Submitting and reaping allocate and log nothing
 *    (docs/capi.md says which rare events some targets and front ends
 *    write to stderr).
 *
 * ABI: libsoftblk.so.0, every symbol in the version node SOFTBLK_0. Within
 * soname 0 functions are only added; the structures below keep their size
 * and layout, and gain fields only in their reserved space.
 */
#ifndef SOFTBLK_H
#define SOFTBLK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The version of this header; softblk_version() gives the library's. */
#define SOFTBLK_VERSION_MAJOR 0
#define SOFTBLK_VERSION_MINOR 1
#define SOFTBLK_VERSION_PATCH 0
#define SOFTBLK_VERSION_NUMBER(major, minor, patch) \
    (((uint32_t)(major) << 16) | ((uint32_t)(minor) << 8) | (uint32_t)(patch))
#define SOFTBLK_VERSION \
    SOFTBLK_VERSION_NUMBER(SOFTBLK_VERSION_MAJOR, SOFTBLK_VERSION_MINOR, SOFTBLK_VERSION_PATCH)

#if defined(__GNUC__)
#define SOFTBLK_API __attribute__((visibility("default")))
#else
#define SOFTBLK_API
#endif

struct softblk_device; /* a device */
struct softblk_queue;  /* one of its queues */
struct softblk_export; /* a running export of a device */

/* SOFTBLK_VERSION of the library the program runs with. Any thread. */
SOFTBLK_API uint32_t softblk_version(void);

/* The calling thread's message for the last call that failed, e.g.
 * "sizee: unknown option ...". Never NULL; "" before any error. Valid
 * until the thread's next failing call. */
SOFTBLK_API const char* softblk_get_error_msg(void);

/* ------------------------------------------------------------- devices */

/* Creates device `name` (1 to 64 letters, digits, '_', '-', '.') of target
 * type `type` from `options`: key=value pairs separated by white space,
 * exactly the options `softblk add NAME TYPE key=value...` takes (null_blk's
 * for "null": "memory_backed=1 size=1024 bs=4096"; `softblk features TYPE`
 * lists them). NULL or "" means none. The device is powered on (queues
 * made) unless the options say power=0. On success *devp is the device,
 * which the caller destroys with softblk_destroy().
 * Errors: -ENOENT unknown type or option, -EINVAL malformed or out of range
 * value, -ERANGE too wide, and what making the target gives (the message
 * names the option and its range). Control thread. */
SOFTBLK_API int softblk_create(const char* name, const char* type, const char* options,
                               struct softblk_device** devp);

/* The same with one option per array element (values may contain white
 * space): `options` holds `count` strings "key=value". */
SOFTBLK_API int softblk_create_argv(const char* name, const char* type, const char* const* options,
                                    size_t count, struct softblk_device** devp);

/* Stops the device's exports, powers it off and frees it, its queues and
 * its export handles; sets *devp to NULL. Requests still in flight on its
 * queues are waited for. NULL or *devp NULL: nothing. Control thread. */
SOFTBLK_API void softblk_destroy(struct softblk_device** devp);

/* null_blk's power attribute: start makes the queues (applying the
 * power-on rules to the options), stop destroys them; the data of a
 * memory-backed device stays. Queue handles taken before end there.
 * -EBUSY when requests are in flight or an export runs. Control thread. */
SOFTBLK_API int softblk_start(struct softblk_device* dev);
SOFTBLK_API int softblk_stop(struct softblk_device* dev);

/* One configfs write of option `key` (softblk set): the option's update
 * rule applies (-EBUSY for one that changes only while powered off, ...).
 * An option that re-makes the queues (submit_queues, poll_queues while
 * powered on) ends the queue handles taken before. Control thread. */
SOFTBLK_API int softblk_set_option(struct softblk_device* dev, const char* key, const char* value);

/* What a configfs read of option `key` gives, without the trailing newline,
 * written to `buf` (NUL-terminated, cut to `size`). Returns the length of
 * the whole value (as snprintf: a value >= size was cut) or -errno
 * (-ENOENT unknown option). Control thread. */
SOFTBLK_API int softblk_get_option(struct softblk_device* dev, const char* key, char* buf,
                                   size_t size);

/* Device properties, as last powered on (a device made with power=0 has
 * none yet: zero or defaults until its first softblk_start).
 * uint64: "capacity" (bytes), "logical_block_size", "physical_block_size",
 *   "max_transfer" (the largest piece the device takes; longer requests
 *   are split), "max_discard" (0: no discard), "max_write_zeroes" (0: the
 *   library writes zero buffers instead, or fails SOFTBLK_REQ_FAST_ZERO),
 *   "max_zone_append" (0: no zone append), all bytes;
 *   "zone_size", "zone_capacity" (bytes), "nr_zones", "conventional_zones",
 *   "max_open_zones", "max_active_zones" (0: no limit), "num_queues",
 *   "num_submit_queues", "num_poll_queues", "queue_depth", "memory_bytes".
 * bool: "zoned", "read_only", "volatile_write_cache", "fua", "rotational",
 *   "powered".
 * string: "name", "type" (softblk_get_str: as softblk_get_option returns).
 * -ENOENT for an unknown property (the message lists the known ones).
 * Control thread, or any thread while no control call runs. */
SOFTBLK_API int softblk_get_uint64(struct softblk_device* dev, const char* property,
                                   uint64_t* value);
SOFTBLK_API int softblk_get_bool(struct softblk_device* dev, const char* property, bool* value);
SOFTBLK_API int softblk_get_str(struct softblk_device* dev, const char* property, char* buf,
                                size_t size);

/* The registered target types (or export types), space separated, into
 * `buf` as softblk_get_option does. Any thread. */
SOFTBLK_API int softblk_get_target_types(char* buf, size_t size);
SOFTBLK_API int softblk_get_export_types(char* buf, size_t size);

/* -------------------------------------------------------------- queues */

/* Sets *qp to queue `index` (0 .. num_queues-1: the submit queues, then
 * the poll queues). Errors: -EINVAL index out of range, -ENODEV powered
 * off, -EBUSY an export drives the queues. The queue is the device's;
 * valid until it is powered off, destroyed or its queues are re-made.
 * Control thread. */
SOFTBLK_API int softblk_get_queue(struct softblk_device* dev, unsigned index,
                                  struct softblk_queue** qp);

/* Request flags. */
enum {
    SOFTBLK_REQ_FUA = 1u << 0,       /* write, zone append: durable at completion */
    SOFTBLK_REQ_NO_UNMAP = 1u << 1,  /* write zeroes: keep the blocks allocated */
    SOFTBLK_REQ_FAST_ZERO = 1u << 2, /* write zeroes: fail rather than write zeros */
};

/* Submission. Each call starts one request of any length (the library
 * splits it on the device's limits) and returns 0; the result arrives as a
 * completion carrying `user_data` from softblk_queue_do_io(). A request
 * the device refuses (beyond the end, misaligned, a zone operation on a
 * device that is not zoned, ...) is accepted here too and completes with
 * the error and a message. The buffer is the caller's until completion.
 * Errors here, with nothing submitted: -EAGAIN when queue_depth requests
 * of this queue are not yet reaped (reap some with softblk_queue_do_io),
 * -EINVAL for a NULL queue or unknown flags. Queue's thread. */
SOFTBLK_API int softblk_queue_read(struct softblk_queue* q, uint64_t offset, void* buf,
                                   uint64_t len, void* user_data, uint32_t flags);
SOFTBLK_API int softblk_queue_write(struct softblk_queue* q, uint64_t offset, const void* buf,
                                    uint64_t len, void* user_data, uint32_t flags);
SOFTBLK_API int softblk_queue_flush(struct softblk_queue* q, void* user_data, uint32_t flags);
SOFTBLK_API int softblk_queue_discard(struct softblk_queue* q, uint64_t offset, uint64_t len,
                                      void* user_data, uint32_t flags);
SOFTBLK_API int softblk_queue_write_zeroes(struct softblk_queue* q, uint64_t offset, uint64_t len,
                                           void* user_data, uint32_t flags);

/* Zones (the kernel's zoned block device model; docs/zoned.md). */
enum {
    SOFTBLK_ZONE_TYPE_CONVENTIONAL = 0x1,
    SOFTBLK_ZONE_TYPE_SEQWRITE_REQ = 0x2,
    SOFTBLK_ZONE_TYPE_SEQWRITE_PREF = 0x3,
};
enum {
    SOFTBLK_ZONE_COND_NOT_WP = 0x0,
    SOFTBLK_ZONE_COND_EMPTY = 0x1,
    SOFTBLK_ZONE_COND_IMP_OPEN = 0x2,
    SOFTBLK_ZONE_COND_EXP_OPEN = 0x3,
    SOFTBLK_ZONE_COND_CLOSED = 0x4,
    SOFTBLK_ZONE_COND_READONLY = 0xd,
    SOFTBLK_ZONE_COND_FULL = 0xe,
    SOFTBLK_ZONE_COND_OFFLINE = 0xf,
};

/* One zone as softblk_queue_report_zones fills it (bytes). write_pointer
 * is UINT64_MAX where the zone has none (conventional, full, read-only or
 * offline zones, as the device's model says). */
struct softblk_zone {
    uint64_t start;
    uint64_t length;
    uint64_t capacity;
    uint64_t write_pointer;
    uint8_t type;      /* SOFTBLK_ZONE_TYPE_* */
    uint8_t condition; /* SOFTBLK_ZONE_COND_* */
    uint8_t reserved[30];
};

/* Open, close, finish or reset the zone that starts at `zone_offset`; reset
 * all: every sequential zone. */
SOFTBLK_API int softblk_queue_zone_open(struct softblk_queue* q, uint64_t zone_offset,
                                        void* user_data, uint32_t flags);
SOFTBLK_API int softblk_queue_zone_close(struct softblk_queue* q, uint64_t zone_offset,
                                         void* user_data, uint32_t flags);
SOFTBLK_API int softblk_queue_zone_finish(struct softblk_queue* q, uint64_t zone_offset,
                                          void* user_data, uint32_t flags);
SOFTBLK_API int softblk_queue_zone_reset(struct softblk_queue* q, uint64_t zone_offset,
                                         void* user_data, uint32_t flags);
SOFTBLK_API int softblk_queue_zone_reset_all(struct softblk_queue* q, void* user_data,
                                             uint32_t flags);
/* Writes `len` bytes at the write pointer of the zone that starts at
 * `zone_offset`; the completion's result_offset says where they landed. */
SOFTBLK_API int softblk_queue_zone_append(struct softblk_queue* q, uint64_t zone_offset,
                                          const void* buf, uint64_t len, void* user_data,
                                          uint32_t flags);
/* Fills up to `nr_zones` entries of `zones` from the zone that holds
 * `offset` on; the completion's `transferred` is the number filled. */
SOFTBLK_API int softblk_queue_report_zones(struct softblk_queue* q, uint64_t offset,
                                           struct softblk_zone* zones, uint32_t nr_zones,
                                           void* user_data, uint32_t flags);

/* A finished request. */
struct softblk_completion {
    void* user_data;        /* as given at submission */
    const char* error_msg;  /* NULL on success; else what failed and why, valid until the
                              queue's next submission */
    uint64_t transferred;   /* data: bytes done (on error: those before the first failing
                              block); report_zones: entries filled */
    uint64_t result_offset; /* zone append: the byte offset where the data landed */
    int ret;                /* 0 or a negative errno */
    uint8_t reserved[28];
};

/* Runs the queue: delivers completions that are due and waits until at
 * least `min_completions` are available or `timeout_ns` passed (negative:
 * no limit; 0: no wait), then copies up to `max_completions` of them into
 * `completions` (which may be NULL when max_completions is 0). Returns
 * the number copied (fewer than min_completions only at the timeout) or
 * -EINVAL when min_completions > max_completions or more than the requests
 * in flight (the call would wait forever). Queue's thread. */
SOFTBLK_API int softblk_queue_do_io(struct softblk_queue* q, struct softblk_completion* completions,
                                    unsigned min_completions, unsigned max_completions,
                                    int64_t timeout_ns);

/* Requests submitted on `q` and not yet returned by softblk_queue_do_io. */
SOFTBLK_API unsigned softblk_queue_in_flight(const struct softblk_queue* q);

/* ------------------------------------------------------------- exports */

/* Starts export type `type` (softblk_get_export_types: "fuse", "nbd",
 * "ublk", "vhost-user-blk", as built) on `dev` with its export options
 * (key=value, white-space separated, as `softblk add --export-opt`; NULL or
 * ""). `run_dir` is a directory of the caller's own where the front end
 * puts its mount points and sockets (not the daemon's /run/softblk). While
 * it runs the export's threads drive the device's queues: take none, and
 * do not stop the device. On success *expp is the export, owned by the
 * device. Errors: -ENOENT unknown type (the message lists the known
 * ones), -EBUSY requests in flight on the device's queues, and the front
 * end's (a zoned device to a front end without zones, no /dev/fuse ...).
 * Control thread. */
SOFTBLK_API int softblk_export_start(struct softblk_device* dev, const char* type,
                                     const char* options, const char* run_dir,
                                     struct softblk_export** expp);

/* What reaches the export, as JSON (the `uri`, `file`, `loop` or `disk`
 * that `softblk list` shows), into `buf` as softblk_get_option does. */
SOFTBLK_API int softblk_export_describe(struct softblk_export* exp, char* buf, size_t size);

/* Stops the export and frees its handle, setting *expp to NULL. When it
 * cannot stop (a file system is mounted on its loop device: -EBUSY, the
 * message says which) the export keeps running and *expp stays. Control
 * thread. */
SOFTBLK_API int softblk_export_stop(struct softblk_export** expp);

#ifdef __cplusplus
}
#endif

#endif /* SOFTBLK_H */
