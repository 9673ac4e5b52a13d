/* ckpt_writer: a worker's side of a checkpoint save (DESIGN.md, Checkpoints).
 *
 * A save stages this rank's master, m and v shards into a host image laid out as its shard
 * file (proto/ckpt.h) — the only part that holds up training — and writes the image into
 * CKPT/step-N.partial.A/rank-R-of-F.bin: on the writer thread for an async save (training goes
 * on), in the caller for a sync one.  Either way the result (file, size, header CRC, or the
 * error) goes to the report callback, from the thread that wrote.  At most one save is in
 * flight: ckpt_writer_busy says whether the thread still writes, and the caller decides
 * (worker/train.c skips or waits).  An abort request for the save in flight stops its write
 * at the next 64 MiB chunk; the file is removed and the report says "aborted".
 *
 * With in-memory checkpoints (daemon/memory_ckpt.h) the image is the rank's memory file of the
 * node's daemon, inherited and mapped shared: it outlives the worker.  With two images a save goes
 * into the one holding the older step, so the newest sealed step survives a failure in the
 * middle of a save.  A save first breaks the image's
 * seal (ckpt_unseal_image), stages into it, then seals it (ckpt_seal_image) and reports it
 * (`memory` set) — a memory save ends there; a disk save then writes the sealed image to its
 * file (ckpt_write_sealed) and reports that as before.  One image serves both: the state is
 * in host memory once.
 *
 * Only ranks below the shard group size write (with no_shard every rank holds the same
 * state: rank 0 writes it); for the others every call is a no-op.
 *
 * Fault point ckpt_write=RANK:ACTION[:STEP] (base/fault.h) makes RANK, halfway through
 * writing its first save at or after step STEP (its first save when STEP is absent):
 *   stall  sleep for checkpoint.timeout_s + 2 s, once (a stuck disk: not interrupted by
 *          an abort), then go on;
 *   die    kill itself with SIGKILL. */
#ifndef FSDP_CKPT_WRITER_H
#define FSDP_CKPT_WRITER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "base/errbuf.h"
#include "base/path.h"
#include "proto/ckpt.h"
#include "worker/fsdp.h"

/* What a save reports when its writing is over. */
typedef struct ckpt_report {
    int64_t step;
    int attempt;
    int rank;
    int sync;
    int memory;        /* this report is of the sealed image in memory, not of a file */
    int ok;            /* the file is written and fsynced (memory: the image sealed) */
    int aborted;       /* stopped by ckpt_writer_abort (ok is 0) */
    char error[1024];  /* why not ok */
    char file[CKPT_NAME_MAX];
    uint64_t bytes;
    uint32_t header_crc;
    double stage_s, write_s; /* staging (training stalled) and writing times */
    /* Carried from the save request for the manifest: */
    int64_t optimizer_step, tokens_seen;
    const ckpt_layout *layout;
} ckpt_report;

typedef void (*ckpt_report_fn)(void *arg, const ckpt_report *r);

typedef struct ckpt_writer_options {
    const char *dir;  /* checkpoint.dir */
    int memory_fd;          /* this rank's in-memory images (daemon/memory_ckpt.h) at memory_fd + s, -1: none */
    int memory_slots;       /* how many it uses: 1, or 2 (a save overwrites the older) */
    int rank;         /* this rank; it writes file `rank` when rank < the shard group size */
    int timeout_s;    /* checkpoint.timeout_s (for the stall fault) */
    ckpt_report_fn report;
    void *arg;
} ckpt_writer_options;

typedef struct ckpt_writer {
    char dir[PATH_BYTES];
    int memory_fd;              /* the first image's fd, -1 for none */
    int rank;
    int timeout_s;
    ckpt_report_fn report;
    void *arg;

    int saves;                  /* saves started */

    ckpt_layout layout;         /* built at the first save */
    ckpt_file_header plan;
    uint8_t *image;             /* plan.file_bytes bytes: malloc'd, or slot_image[slot] */
    int slots;                  /* memory images (0: none, the image is malloc'd) */
    uint8_t *slot_image[2];     /* mapped from memory_fd + slot */
    int64_t slot_step[2];       /* the step each holds sealed, -1 for none */
    int slot;                   /* the one the save in flight uses */
    kctx *ctx;                  /* the context the pinned images are registered with */
    int pinned;                 /* bit i: image i is */

    pthread_t thread;
    int thread_started;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int pending;                /* a staged save waits for the thread */
    int busy;                   /* a save is staged or being written */
    int memory_only;            /* the save in flight writes no file */
    int quit;
    atomic_int abort;           /* stop the save in flight */
    ckpt_report job;            /* the save in flight */
    char path[PATH_BYTES];            /* its file */
} ckpt_writer;

int ckpt_writer_init(ckpt_writer *w, const ckpt_writer_options *opt, errbuf *err);
/* Waits for a save in flight to finish (or aborts it first when abort is set), then frees
 * everything (the context the images are pinned with must still be alive). */
void ckpt_writer_destroy(ckpt_writer *w, int abort);

/* Whether an async save is still being sealed or written; _disk: whether a file is. */
int ckpt_writer_busy(ckpt_writer *w);
int ckpt_writer_busy_disk(ckpt_writer *w);
/* Waits until no save is in flight. */
void ckpt_writer_wait(ckpt_writer *w);
/* Asks the save of (step, attempt), if it is the one in flight, to stop. */
void ckpt_writer_abort(ckpt_writer *w, int64_t step, int attempt);

/* Builds the file layout and allocates the staging image (touching every page), so that the
 * first save does not pay for it; ckpt_writer_save does it if it was not done. */
int ckpt_writer_prepare(ckpt_writer *w, const fsdp *f, errbuf *err);

/* Saves f's state as of optimizer step `step` into attempt `attempt`'s partial directory
 * (created if needed), first waiting for a save in flight; memory_only: into the memory
 * image alone (a memory directory is needed).  Returns once the state is staged
 * (async) or written (sync).  A save that fails (no memory for the image, a write error)
 * says so in its report; -1 only when copying the state off the device fails, which training
 * cannot survive either. */
int ckpt_writer_save(ckpt_writer *w, fsdp *f, int64_t step, int attempt, int sync, int memory_only,
                     int64_t tokens_seen, errbuf *err);

#endif
