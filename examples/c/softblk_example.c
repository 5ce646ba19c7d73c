/*
 * libsoftblk from C: a memory-backed null device written and read back
 * with verification, then a zoned one whose zone appends land where the
 * write pointer was. Built out of the tree against an installed libsoftblk:
 *
 *   cc -std=c11 -o softblk_example softblk_example.c $(pkg-config --cflags --libs softblk)
 *
 * Exits 0 when every check passed, 1 (with the reason on stderr) otherwise.
 */
#include <softblk.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BLOCK 4096u
#define DEPTH 8u

static int failed(const char* what, int rc)
{
    fprintf(stderr, "softblk_example: %s: %s (%s)\n", what, softblk_get_error_msg(), strerror(-rc));
    return 1;
}

/* Fills `buf` with a pattern that names its block, so a block read from the
 * wrong place is caught. */
static void fill(unsigned char* buf, uint64_t block, unsigned seed)
{
    for (unsigned i = 0; i < BLOCK; ++i) {
        buf[i] = (unsigned char)(block * 131u + i * 7u + seed);
    }
}

/* Writes DEPTH blocks at once (one cookie each), reaps them, reads them back
 * at once and compares. */
static int null_device(void)
{
    struct softblk_device* dev = NULL;
    int rc = softblk_create("example-null", "null", "memory_backed=1 size=64 bs=4096", &dev);
    if (rc < 0) {
        return failed("create null", rc);
    }
    uint64_t capacity = 0;
    uint64_t block_size = 0;
    if ((rc = softblk_get_uint64(dev, "capacity", &capacity)) < 0 ||
        (rc = softblk_get_uint64(dev, "logical_block_size", &block_size)) < 0) {
        softblk_destroy(&dev);
        return failed("properties", rc);
    }
    if (capacity != 64u << 20 || block_size != BLOCK) {
        fprintf(stderr, "softblk_example: capacity %" PRIu64 ", block size %" PRIu64 "\n", capacity,
                block_size);
        softblk_destroy(&dev);
        return 1;
    }
    struct softblk_queue* q = NULL;
    if ((rc = softblk_get_queue(dev, 0, &q)) < 0) {
        softblk_destroy(&dev);
        return failed("queue 0", rc);
    }
    static unsigned char out[DEPTH][BLOCK];
    static unsigned char in[DEPTH][BLOCK];
    struct softblk_completion done[DEPTH];
    int status = 0;
    for (unsigned i = 0; i < DEPTH && status == 0; ++i) {
        const uint64_t block = (uint64_t)i * 97u % (capacity / BLOCK);
        fill(out[i], block, 1);
        rc = softblk_queue_write(q, block * BLOCK, out[i], BLOCK, out[i], 0);
        status = rc < 0 ? failed("write", rc) : 0;
    }
    rc = softblk_queue_do_io(q, done, DEPTH, DEPTH, -1);
    if (status == 0 && rc != (int)DEPTH) {
        status = failed("reap writes", rc < 0 ? rc : -EIO);
    }
    for (int i = 0; status == 0 && i < rc; ++i) {
        if (done[i].ret != 0) {
            fprintf(stderr, "softblk_example: write: %s\n", done[i].error_msg);
            status = 1;
        }
    }
    for (unsigned i = 0; i < DEPTH && status == 0; ++i) {
        const uint64_t block = (uint64_t)i * 97u % (capacity / BLOCK);
        rc = softblk_queue_read(q, block * BLOCK, in[i], BLOCK, in[i], 0);
        status = rc < 0 ? failed("read", rc) : 0;
    }
    rc = softblk_queue_do_io(q, done, DEPTH, DEPTH, -1);
    if (status == 0 && rc != (int)DEPTH) {
        status = failed("reap reads", rc < 0 ? rc : -EIO);
    }
    for (int i = 0; status == 0 && i < rc; ++i) {
        /* The cookie is the read's buffer: compare it with its write's. */
        const unsigned char* buf = done[i].user_data;
        const unsigned idx = (unsigned)((buf - &in[0][0]) / BLOCK);
        if (done[i].ret != 0 || done[i].transferred != BLOCK ||
            memcmp(in[idx], out[idx], BLOCK) != 0) {
            fprintf(stderr, "softblk_example: read %u: %s\n", idx,
                    done[i].ret != 0 ? done[i].error_msg : "data differs from what was written");
            status = 1;
        }
    }
    softblk_destroy(&dev);
    if (status == 0) {
        printf("null: %u blocks written and read back\n", DEPTH);
    }
    return status;
}

/* Submits one request (already started: rc) and waits for it. */
static int wait_one(struct softblk_queue* q, int rc, struct softblk_completion* c, const char* what)
{
    if (rc < 0) {
        return failed(what, rc);
    }
    rc = softblk_queue_do_io(q, c, 1, 1, -1);
    if (rc != 1) {
        return failed(what, rc < 0 ? rc : -EIO);
    }
    if (c->ret != 0) {
        fprintf(stderr, "softblk_example: %s: %s\n", what, c->error_msg);
        return 1;
    }
    return 0;
}

/* A zoned null device: appends to zone 1 land at its write pointer, which
 * the report then shows moved; the data reads back. */
static int zoned_device(void)
{
    struct softblk_device* dev = NULL;
    int rc = softblk_create("example-zoned", "null",
                            "memory_backed=1 size=64 bs=4096 zoned=1 zone_size=4", &dev);
    if (rc < 0) {
        return failed("create zoned null", rc);
    }
    bool zoned = false;
    uint64_t zone_size = 0;
    struct softblk_queue* q = NULL;
    if ((rc = softblk_get_bool(dev, "zoned", &zoned)) < 0 ||
        (rc = softblk_get_uint64(dev, "zone_size", &zone_size)) < 0 ||
        (rc = softblk_get_queue(dev, 0, &q)) < 0) {
        softblk_destroy(&dev);
        return failed("zoned properties", rc);
    }
    int status = 0;
    if (!zoned || zone_size != 4u << 20) {
        fprintf(stderr, "softblk_example: zoned %d, zone size %" PRIu64 "\n", zoned, zone_size);
        status = 1;
    }
    static unsigned char out[2][BLOCK];
    static unsigned char in[BLOCK];
    struct softblk_completion c;
    const uint64_t zone = zone_size; /* zone 1 */
    for (unsigned i = 0; i < 2 && status == 0; ++i) {
        fill(out[i], i, 2);
        status = wait_one(q, softblk_queue_zone_append(q, zone, out[i], BLOCK, NULL, 0), &c,
                          "zone append");
        /* Sector (512 bytes) the append landed on: the zone's start, then
         * one block further. */
        const uint64_t expected = (zone + (uint64_t)i * BLOCK) / 512u;
        if (status == 0 && c.result_offset / 512u != expected) {
            fprintf(stderr,
                    "softblk_example: append %u landed at sector %" PRIu64 ", expected %" PRIu64
                    "\n",
                    i, c.result_offset / 512u, expected);
            status = 1;
        }
    }
    struct softblk_zone zones[2];
    if (status == 0) {
        status =
            wait_one(q, softblk_queue_report_zones(q, zone, zones, 2, NULL, 0), &c, "report zones");
    }
    if (status == 0 &&
        (c.transferred != 2 || zones[0].start != zone ||
         zones[0].write_pointer != zone + 2u * BLOCK ||
         zones[0].condition != SOFTBLK_ZONE_COND_IMP_OPEN || zones[1].write_pointer != 2u * zone)) {
        fprintf(stderr,
                "softblk_example: report: %" PRIu64 " zones, write pointer %" PRIu64
                ", condition %u\n",
                c.transferred, zones[0].write_pointer, zones[0].condition);
        status = 1;
    }
    if (status == 0) {
        status = wait_one(q, softblk_queue_read(q, zone + BLOCK, in, BLOCK, NULL, 0), &c, "read");
    }
    if (status == 0 && memcmp(in, out[1], BLOCK) != 0) {
        fprintf(stderr, "softblk_example: the second append reads back different\n");
        status = 1;
    }
    softblk_destroy(&dev);
    if (status == 0) {
        printf("zoned: 2 appends at the write pointer, read back\n");
    }
    return status;
}

int main(void)
{
    if (softblk_version() >> 16 != SOFTBLK_VERSION_MAJOR) {
        fprintf(stderr, "softblk_example: built for libsoftblk %u, runs with %u\n",
                SOFTBLK_VERSION_MAJOR, softblk_version() >> 16);
        return 1;
    }
    return null_device() != 0 || zoned_device() != 0;
}
