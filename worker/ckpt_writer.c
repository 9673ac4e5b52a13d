/* ckpt_writer: staging a rank's shard state and writing its shard file.  See ckpt_writer.h. */
#include "worker/ckpt_writer.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/fault.h"
#include "base/fileio.h"

/* Runs the ckpt_write fault halfway through the file (the save of its STEP, else the first),
 * and says whether to stop writing. */
static int on_progress(void *arg, uint64_t written, uint64_t total) {
    ckpt_writer *w = arg;
    const fault *f = fault_get(FAULT_CKPT_WRITE, w->rank);
    int this_save = f && (f->n ? w->job.step >= f->n : w->saves == 1);
    if (this_save && written >= total / 2) {
        if (!strcmp(f->action, "die")) {
            fprintf(stderr, "fsdp-worker rank %d: test fault: dying while writing %s\n", w->rank, w->path);
            raise(SIGKILL);
        }
        if (fault_once(f)) {
            fprintf(stderr, "fsdp-worker rank %d: test fault: stalling %d s while writing %s\n", w->rank,
                    w->timeout_s + 2, w->path);
            clock_sleep_s(w->timeout_s + 2.0);
        }
    }
    return atomic_load(&w->abort);
}

/* Seals the memory image and reports it (memory_ckpt.h). */
static void seal_memory(ckpt_writer *w) {
    double t0 = clock_now_s();
    ckpt_seal_image(w->image, &w->plan);
    w->slot_step[w->slot] = w->job.step;
    ckpt_report sealed = w->job;
    sealed.memory = sealed.ok = 1;
    sealed.bytes = w->plan.file_bytes;
    sealed.header_crc = w->plan.crc;
    sealed.write_s = clock_now_s() - t0;
    w->report(w->arg, &sealed);
}

/* Writes the staged image and reports, in whichever thread runs it. */
static void write_staged(ckpt_writer *w) {
    ckpt_report *job = &w->job;
    errbuf err;
    w->plan.step = (uint64_t)job->step;
    if (w->slots) seal_memory(w);
    if (w->memory_only) return;
    double t0 = clock_now_s();
    int rc = w->slots ? ckpt_write_sealed(w->path, w->image, &w->plan, on_progress, w, &err)
                              : ckpt_write_image(w->path, w->image, &w->plan, on_progress, w, &err);
    if (rc == 0) {
        job->ok = 1;
        job->bytes = w->plan.file_bytes;
        job->header_crc = w->plan.crc;
    } else {
        job->aborted = atomic_load(&w->abort);
        snprintf(job->error, sizeof job->error, "%s", err.msg);
    }
    job->write_s = clock_now_s() - t0;
    w->report(w->arg, job);
}

static void *writer_main(void *arg) {
    ckpt_writer *w = arg;
    pthread_mutex_lock(&w->lock);
    for (;;) {
        while (!w->pending && !w->quit) pthread_cond_wait(&w->cond, &w->lock);
        if (!w->pending) break;
        pthread_mutex_unlock(&w->lock);
        write_staged(w);
        pthread_mutex_lock(&w->lock);
        w->pending = 0;
        w->busy = 0;
        pthread_cond_broadcast(&w->cond);
    }
    pthread_mutex_unlock(&w->lock);
    return NULL;
}

int ckpt_writer_init(ckpt_writer *w, const ckpt_writer_options *opt, errbuf *err) {
    memset(w, 0, sizeof *w);
    if (snprintf(w->dir, sizeof w->dir, "%s", opt->dir) >= (int)sizeof w->dir)
        return errf(err, "%s: path too long", opt->dir);
    if (opt->memory_slots < 0 || opt->memory_slots > 2) return errf(err, "memory images: %d, not 0, 1 or 2", opt->memory_slots);
    w->slots = opt->memory_fd >= 0 ? opt->memory_slots : 0;
    w->memory_fd = opt->memory_fd;
    w->rank = opt->rank;
    w->timeout_s = opt->timeout_s;
    w->report = opt->report;
    w->arg = opt->arg;
    atomic_init(&w->abort, 0);
    if (pthread_mutex_init(&w->lock, NULL) != 0) return errf(err, "checkpoint writer: cannot create a mutex");
    if (pthread_cond_init(&w->cond, NULL) != 0) {
        pthread_mutex_destroy(&w->lock);
        return errf(err, "checkpoint writer: cannot create a condition variable");
    }
    if (pthread_create(&w->thread, NULL, writer_main, w) != 0) {
        pthread_cond_destroy(&w->cond);
        pthread_mutex_destroy(&w->lock);
        return errf(err, "checkpoint writer: cannot start its thread");
    }
    w->thread_started = 1;
    return 0;
}

void ckpt_writer_destroy(ckpt_writer *w, int abort) {
    if (!w->thread_started) return;
    if (abort) atomic_store(&w->abort, 1);
    pthread_mutex_lock(&w->lock);
    w->quit = 1;
    pthread_cond_broadcast(&w->cond);
    pthread_mutex_unlock(&w->lock);
    pthread_join(w->thread, NULL);
    pthread_cond_destroy(&w->cond);
    pthread_mutex_destroy(&w->lock);
    for (int i = 0; i < w->slots; i++) {
        if (w->pinned & (1 << i)) k_host_unregister(w->ctx, w->slot_image[i]);
        if (w->slot_image[i]) munmap(w->slot_image[i], w->plan.file_bytes);
    }
    if (!w->slots) free(w->image);
    ckpt_file_header_free(&w->plan);
    ckpt_layout_free(&w->layout);
    memset(w, 0, sizeof *w);
}

int ckpt_writer_busy(ckpt_writer *w) {
    pthread_mutex_lock(&w->lock);
    int busy = w->busy;
    pthread_mutex_unlock(&w->lock);
    return busy;
}

int ckpt_writer_busy_disk(ckpt_writer *w) {
    pthread_mutex_lock(&w->lock);
    int busy = w->busy && !w->memory_only;
    pthread_mutex_unlock(&w->lock);
    return busy;
}

void ckpt_writer_wait(ckpt_writer *w) {
    pthread_mutex_lock(&w->lock);
    while (w->busy) pthread_cond_wait(&w->cond, &w->lock);
    pthread_mutex_unlock(&w->lock);
}

void ckpt_writer_abort(ckpt_writer *w, int64_t step, int attempt) {
    pthread_mutex_lock(&w->lock);
    if (w->busy && w->job.step == step && w->job.attempt == attempt) atomic_store(&w->abort, 1);
    pthread_mutex_unlock(&w->lock);
}

/* The step an image holds sealed (ckpt_seal_image), -1 when it holds none. */
static int64_t sealed_step(const void *image, uint64_t bytes) {
    ckpt_file_header h;
    errbuf ignored;
    if (ckpt_decode_header(&h, image, (size_t)bytes, "image", &ignored)) return -1;
    int64_t step = (int64_t)h.step;
    ckpt_file_header_free(&h);
    return step;
}

/* The image the save of `step` overwrites: one that holds no step, or a step at or past this
 * one (left by a run that resumed from an older step: never to be resumed again), else the
 * older; never the newest step before this one. */
static void pick_slot(ckpt_writer *w, int64_t step) {
    int stale1 = w->slot_step[1] < 0 || w->slot_step[1] >= step, stale0 = w->slot_step[0] < 0 || w->slot_step[0] >= step;
    w->slot = w->slots == 2 && !stale0 && (stale1 || w->slot_step[1] < w->slot_step[0]);
    w->image = w->slot_image[w->slot];
}

/* Image `slot` (the daemon's memory file, inherited) mapped shared at the file's size, its
 * memory reserved now (no SIGBUS later).  One of the right size is kept as it is: a restarted
 * rank has just read its state from it. */
static int map_memory_image(ckpt_writer *w, int slot, errbuf *err) {
    uint64_t bytes = w->plan.file_bytes;
    int fd = w->memory_fd + slot;
    struct stat st;
    int rc = fstat(fd, &st) == 0 ? 0 : errf(err, "fd %d: fstat: %s", fd, strerror(errno));
    if (rc == 0 && (uint64_t)st.st_size != bytes && ftruncate(fd, 0) != 0)
        rc = errf(err, "fd %d: ftruncate: %s", fd, strerror(errno));
    int e = rc == 0 ? posix_fallocate(fd, 0, (off_t)bytes) : 0;
    if (e) rc = errf(err, "reserving %llu bytes: %s", (unsigned long long)bytes, strerror(e));
    void *p = rc == 0 ? mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0) : MAP_FAILED;
    if (rc == 0 && p == MAP_FAILED) rc = errf(err, "mmap of %llu bytes: %s", (unsigned long long)bytes, strerror(errno));
    if (rc) return errprefix(err, "in-memory checkpoint image %d", slot);
    w->slot_image[slot] = p;
    w->slot_step[slot] = sealed_step(p, bytes);
    return 0;
}

/* The images, pinned for the device's copies (a GPU's staging at full speed) where the device
 * lets them be (else staged through pageable memory, as a disk save's buffer is: said once),
 * and the one the next save goes into. */
static int map_memory_images(ckpt_writer *w, kctx *ctx, errbuf *err) {
    for (int i = 0; i < w->slots; i++) {
        if (map_memory_image(w, i, err)) return -1;
        errbuf why;
        k_host_register(ctx, w->slot_image[i], w->plan.file_bytes, 1);
        if (k_check(ctx, &why)) {
            fprintf(stderr, "fsdp-worker rank %d: in-memory checkpoint image %d not pinned (%s): its saves copy "
                            "through pageable memory\n", w->rank, i, why.msg);
            continue;
        }
        w->ctx = ctx;
        w->pinned |= 1 << i;
    }
    pick_slot(w, 0);
    return 0;
}

/* The state's shape never changes: one layout, plan and image serve every save. */
int ckpt_writer_prepare(ckpt_writer *w, const fsdp *f, errbuf *err) {
    if (w->image || w->rank >= f->group) return 0;
    if (fsdp_ckpt_layout(f, &w->layout, err) || ckpt_plan(&w->plan, &w->layout, w->rank, 0, err)) {
        ckpt_layout_free(&w->layout);
        return -1;
    }
    int rc = 0;
    if (w->slots) rc = map_memory_images(w, f->ctx, err);
    else if (!(w->image = malloc(w->plan.file_bytes)))
        rc = errf(err, "out of memory for a %llu-byte checkpoint image", (unsigned long long)w->plan.file_bytes);
    else memset(w->image, 0, w->plan.file_bytes); /* the gaps stay zero; the pages are mapped now */
    if (rc) {
        ckpt_file_header_free(&w->plan);
        ckpt_layout_free(&w->layout);
    }
    return rc;
}

/* Copies every unit's master, m and v shard to its section of the image (once the host
 * optimizer, with cpu_offload, has finished writing them). */
static int stage(ckpt_writer *w, fsdp *f, errbuf *err) {
    if (fsdp_wait_optimizer(f, err)) return -1;
    if (w->slots) {
        pick_slot(w, w->job.step);
        w->slot_step[w->slot] = -1;
        ckpt_unseal_image(w->image);
    }
    for (int u = 0; u < w->layout.n_units; u++) {
        const fsdp_unit *U = &f->units[u];
        const float *src[CKPT_KINDS] = {U->master, U->m, U->v};
        for (int kind = CKPT_MASTER; kind <= CKPT_KINDS; kind++) {
            const ckpt_section *s = &w->plan.sections[ckpt_section_index(w->layout.n_units, kind, u)];
            k_copy_d2h(f->ctx, w->image + s->offset, src[kind - 1], s->bytes);
        }
    }
    return k_sync(f->ctx, err);
}

/* The staged save written: by the thread (async), or here. */
static void hand_over(ckpt_writer *w, int memory_only, int sync) {
    pthread_mutex_lock(&w->lock);
    w->busy = 1; /* from here on ckpt_writer_abort may stop it */
    w->memory_only = memory_only;
    w->pending = !sync;
    pthread_cond_broadcast(&w->cond);
    pthread_mutex_unlock(&w->lock);
    if (!sync) return;
    write_staged(w);
    pthread_mutex_lock(&w->lock);
    w->busy = 0;
    pthread_cond_broadcast(&w->cond);
    pthread_mutex_unlock(&w->lock);
}

/* Images up to this size are sealed at once (a few ms at most): handed to the thread, a seal
 * still running when the ranks vote on the next step's save (microseconds later) would make
 * them skip it, and a small job would keep only every other step. */
#define SEAL_INLINE_BYTES ((uint64_t)16 << 20)

/* A memory save: staged into the image, sealed (here, or on the thread when async and large). */
static int save_memory(ckpt_writer *w, fsdp *f, int sync, errbuf *err) {
    double t0 = clock_now_s();
    int rc = ckpt_file_name(w->job.file, sizeof w->job.file, w->rank, f->group) ? errf(err, "name too long") : 0;
    if (rc == 0) rc = ckpt_writer_prepare(w, f, err);
    if (rc == 0) rc = stage(w, f, err);
    if (rc) return errprefix(err, "the in-memory checkpoint of step %lld", (long long)w->job.step);
    w->job.stage_s = clock_now_s() - t0;
    hand_over(w, 1, sync || w->plan.file_bytes <= SEAL_INLINE_BYTES);
    return 0;
}

int ckpt_writer_save(ckpt_writer *w, fsdp *f, int64_t step, int attempt, int sync, int memory_only,
                     int64_t tokens_seen, errbuf *err) {
    if (w->rank >= f->group) return 0; /* another rank writes this state */
    if (memory_only && !w->slots) return 0; /* this node keeps none (the others' go on: their manifest never completes) */
    ckpt_writer_wait(w);
    double t0 = clock_now_s();
    ckpt_report *job = &w->job;
    *job = (ckpt_report){.step = step, .attempt = attempt, .rank = w->rank, .sync = sync,
                         .optimizer_step = f->step, .tokens_seen = tokens_seen, .layout = &w->layout};
    atomic_store(&w->abort, 0);
    if (memory_only) return save_memory(w, f, sync, err);
    w->saves++;
    char partial[256];
    errbuf why;
    int rc = ckpt_partial_name(partial, sizeof partial, step, attempt) ||
                     ckpt_file_name(job->file, sizeof job->file, w->rank, f->group)
                 ? errf(&why, "checkpoint name too long")
                 : 0;
    if (rc == 0 && snprintf(w->path, sizeof w->path, "%s/%s", w->dir, partial) >= (int)sizeof w->path)
        rc = errf(&why, "%s/%s: path too long", w->dir, partial);
    if (rc == 0) rc = file_mkdir(w->path, &why);
    if (rc == 0 && snprintf(w->path + strlen(w->path), sizeof w->path - strlen(w->path), "/%s",
                            job->file) >= (int)(sizeof w->path - strlen(w->path)))
        rc = errf(&why, "%s: path too long", w->path);
    if (rc == 0) rc = ckpt_writer_prepare(w, f, &why);
    if (rc != 0) {
        snprintf(job->error, sizeof job->error, "%s", why.msg);
        w->report(w->arg, job);
        return 0;
    }
    if (stage(w, f, err)) return errprefix(err, "staging the checkpoint of step %lld", (long long)step);
    job->stage_s = clock_now_s() - t0;
    hand_over(w, 0, sync);
    return 0;
}
