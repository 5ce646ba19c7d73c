/* softblk's fio engine: `fio --ioengine=external:libsoftblk_fio.so
 * --softblk_target=null --softblk_opts="memory_backed=1 size=1024"` drives
 * an in-process softblk device, as SPDK's fio plugin drives a bdev
 * (docs/fio.md). This file is the fio side, in C against fio's own headers
 * (the source of the installed fio, configured: scripts/fetch-fio-source.sh);
 * the device side is softblk_fio_device.cpp, behind softblk_fio.h.
 *
 * Asynchronous: queue() collects fio's I/Os, commit() submits them to the
 * core as bios, getevents() runs the queue until enough completed, event()
 * hands them back. Each fio job (thread or process) opens its own device
 * in init(); setup() opens one only to learn the size for fio's planning. */
#include "fio.h"
#include "optgroup.h"

#include "softblk_fio.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

struct softblk_fio_options {
    void* pad; /* fio's option parser keeps the thread_data here */
    char* target;
    char* opts;
    char* describe;
};

static struct fio_option options[] = {
    {
        .name = "softblk_target",
        .lname = "softblk target type",
        .type = FIO_OPT_STR_STORE,
        .off1 = offsetof(struct softblk_fio_options, target),
        .def = "null",
        .help = "softblk target type: null, file, rbd, ... (softblk features; not zoned ones)",
        .category = FIO_OPT_C_ENGINE,
        .group = FIO_OPT_G_INVALID,
    },
    {
        .name = "softblk_opts",
        .lname = "softblk device options",
        .type = FIO_OPT_STR_STORE,
        .off1 = offsetof(struct softblk_fio_options, opts),
        .help = "the target's key=value options separated by blanks, as for softblk add "
                "(\"memory_backed=1 size=1024\")",
        .category = FIO_OPT_C_ENGINE,
        .group = FIO_OPT_G_INVALID,
    },
    {
        .name = "softblk_describe",
        .lname = "softblk device state file",
        .type = FIO_OPT_STR_STORE,
        .off1 = offsetof(struct softblk_fio_options, describe),
        .help = "at the end of the job, write the device's state and counters as JSON here "
                "(with several jobs, job N writes this name followed by .N)",
        .category = FIO_OPT_C_ENGINE,
        .group = FIO_OPT_G_INVALID,
    },
    {
        .name = NULL,
    },
};

/* One job's engine state. */
struct softblk_fio_job {
    struct softblk_fio_device* device;
    /* Queued by queue(), submitted by commit(). */
    struct io_u** pending;
    unsigned pending_count;
    unsigned pending_size;
};

static struct softblk_fio_device* open_device(struct thread_data* td)
{
    struct softblk_fio_options* o = td->eo;
    char error[512];
    struct softblk_fio_device* d =
        softblk_fio_open(o->target, o->opts, td->o.iodepth, error, sizeof(error));
    if (d == NULL) {
        log_err("fio: softblk: %s\n", error);
    }
    return d;
}

static int softblk_setup(struct thread_data* td)
{
    struct softblk_fio_device* d;
    struct fio_file* f;
    unsigned i;

    /* No file of its own: the device stands for one (as engines/rbd.c). */
    if (!td->files_index) {
        add_file(td, "softblk", 0, 0);
        td->o.nr_files = td->o.nr_files ?: 1;
        td->o.open_files++;
    }
    /* fio would lay several files over the one device, each from offset
     * 0, and overwrite one file's blocks with another's. */
    if (td->files_index > 1) {
        log_err(
            "fio: softblk: a job drives one device: nrfiles=1 and one filename (or "
            "none), or one job per device\n");
        return 1;
    }
    d = open_device(td);
    if (d == NULL) {
        return 1;
    }
    for_each_file(td, f, i)
    {
        f->real_file_size = softblk_fio_capacity(d);
        fio_file_set_size_known(f);
    }
    softblk_fio_close(d);
    return 0;
}

static int softblk_init(struct thread_data* td)
{
    struct softblk_fio_job* job = calloc(1, sizeof(*job));
    if (job == NULL) {
        log_err("fio: softblk: out of memory\n");
        return 1;
    }
    job->pending_size = td->o.iodepth ? td->o.iodepth : 1;
    job->pending = calloc(job->pending_size, sizeof(*job->pending));
    job->device = job->pending != NULL ? open_device(td) : NULL;
    td->io_ops_data = job;
    return job->device == NULL;
}

static void softblk_cleanup(struct thread_data* td)
{
    struct softblk_fio_job* job = td->io_ops_data;
    struct softblk_fio_options* o = td->eo;
    if (job == NULL) {
        return;
    }
    if (job->device != NULL && o->describe != NULL && *o->describe != '\0') {
        char path[PATH_MAX];
        char error[512];
        /* Jobs do not share a device: with more than one, each writes
         * its own file, numbered as fio numbers its jobs (from 0). */
        if (thread_number > 1) {
            snprintf(path, sizeof(path), "%s.%u", o->describe, td->thread_number - 1);
        } else {
            snprintf(path, sizeof(path), "%s", o->describe);
        }
        if (softblk_fio_describe(job->device, path, error, sizeof(error)) != 0) {
            log_err("fio: softblk: %s\n", error);
            td_verror(td, EIO, "softblk_describe");
        }
    }
    softblk_fio_close(job->device);
    free(job->pending);
    free(job);
    td->io_ops_data = NULL;
}

static int softblk_io_u_init(struct thread_data* td, struct io_u* io_u)
{
    io_u->engine_data = softblk_fio_alloc_io();
    return io_u->engine_data == NULL;
}

static void softblk_io_u_free(struct thread_data* td, struct io_u* io_u)
{
    softblk_fio_free_io(io_u->engine_data);
    io_u->engine_data = NULL;
}

static enum fio_q_status softblk_queue(struct thread_data* td, struct io_u* io_u)
{
    struct softblk_fio_job* job = td->io_ops_data;

    fio_ro_check(td, io_u);
    if (io_u->ddir == DDIR_TRIM && !softblk_fio_can_discard(job->device)) {
        /* Refused here, so that fio names the cause (the target has no
         * discard: discard=1 in softblk_opts where the target offers it). */
        io_u->error = EOPNOTSUPP;
        return FIO_Q_COMPLETED;
    }
    if (io_u->ddir != DDIR_READ && io_u->ddir != DDIR_WRITE && io_u->ddir != DDIR_TRIM &&
        io_u->ddir != DDIR_SYNC && io_u->ddir != DDIR_DATASYNC) {
        io_u->error = EINVAL;
        return FIO_Q_COMPLETED;
    }
    if (job->pending_count == job->pending_size) {
        return FIO_Q_BUSY;
    }
    job->pending[job->pending_count++] = io_u;
    return FIO_Q_QUEUED;
}

static int softblk_commit(struct thread_data* td)
{
    struct softblk_fio_job* job = td->io_ops_data;
    unsigned i;

    for (i = 0; i < job->pending_count; ++i) {
        struct io_u* io_u = job->pending[i];
        enum softblk_fio_op op = SOFTBLK_FIO_READ;
        int fua = 0;
        switch (io_u->ddir) {
        case DDIR_READ:
            op = SOFTBLK_FIO_READ;
            break;
        case DDIR_WRITE:
            op = SOFTBLK_FIO_WRITE;
            /* sync=1 (O_SYNC) or sync=dsync: each write durable on
             * completion, as the kernel sends such writes with REQ_FUA. */
            fua = td->o.sync_io != 0;
            break;
        case DDIR_TRIM:
            op = SOFTBLK_FIO_DISCARD;
            break;
        default: /* DDIR_SYNC, DDIR_DATASYNC (queue() let nothing else in) */
            op = SOFTBLK_FIO_FLUSH;
            break;
        }
        softblk_fio_submit(job->device, io_u->engine_data, op, io_u->offset, io_u->xfer_buflen,
                           io_u->xfer_buf, fua, io_u);
    }
    if (job->pending_count > 0) {
        io_u_mark_submit(td, job->pending_count);
    }
    job->pending_count = 0;
    return 0;
}

static int softblk_getevents(struct thread_data* td, unsigned int min, unsigned int max,
                             const struct timespec* t)
{
    struct softblk_fio_job* job = td->io_ops_data;
    int64_t timeout_ns = t != NULL ? (int64_t)t->tv_sec * 1000000000 + t->tv_nsec : -1;
    return (int)softblk_fio_reap(job->device, min, max, timeout_ns);
}

static struct io_u* softblk_event(struct thread_data* td, int event)
{
    struct softblk_fio_job* job = td->io_ops_data;
    int status = 0;
    struct io_u* io_u = softblk_fio_event(job->device, (unsigned)event, &status);
    if (io_u != NULL) {
        io_u->error = status < 0 ? -status : 0;
        io_u->resid = status < 0 ? io_u->xfer_buflen : 0;
    }
    return io_u;
}

static int softblk_open_file(struct thread_data* td, struct fio_file* f)
{
    return 0;
}

static int softblk_invalidate(struct thread_data* td, struct fio_file* f)
{
    return 0;
}

/* What fio looks up in the library (dlsym "ioengine"). */
struct ioengine_ops ioengine = {
    .name = "softblk",
    .version = FIO_IOOPS_VERSION,
    .flags = FIO_DISKLESSIO | FIO_NOEXTEND | FIO_NODISKUTIL,
    .setup = softblk_setup,
    .init = softblk_init,
    .cleanup = softblk_cleanup,
    .queue = softblk_queue,
    .commit = softblk_commit,
    .getevents = softblk_getevents,
    .event = softblk_event,
    .io_u_init = softblk_io_u_init,
    .io_u_free = softblk_io_u_free,
    .open_file = softblk_open_file,
    .invalidate = softblk_invalidate,
    .option_struct_size = sizeof(struct softblk_fio_options),
    .options = options,
};
