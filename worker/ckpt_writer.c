/* ckpt_writer: staging a rank's shard state and writing its shard file.  See ckpt_writer.h. */
#include "worker/ckpt_writer.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

/* Writes the staged image and reports, in whichever thread runs it. */
static void write_staged(ckpt_writer *w) {
    ckpt_report *job = &w->job;
    errbuf err;
    double t0 = clock_now_s();
    w->plan.step = (uint64_t)job->step;
    if (ckpt_write_image(w->path, w->image, &w->plan, on_progress, w, &err) == 0) {
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
    free(w->image);
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

/* The state's shape never changes: one layout, plan and image serve every save. */
int ckpt_writer_prepare(ckpt_writer *w, const fsdp *f, errbuf *err) {
    if (w->image || w->rank >= f->group) return 0;
    if (fsdp_ckpt_layout(f, &w->layout, err) || ckpt_plan(&w->plan, &w->layout, w->rank, 0, err)) {
        ckpt_layout_free(&w->layout);
        return -1;
    }
    w->image = malloc(w->plan.file_bytes);
    if (!w->image) {
        ckpt_file_header_free(&w->plan);
        ckpt_layout_free(&w->layout);
        return errf(err, "out of memory for a %llu-byte checkpoint image",
                    (unsigned long long)w->plan.file_bytes);
    }
    memset(w->image, 0, w->plan.file_bytes); /* the gaps stay zero; the pages are mapped now */
    return 0;
}

/* Copies every unit's master, m and v shard to its section of the image (once the host
 * optimizer, with cpu_offload, has finished writing them). */
static int stage(ckpt_writer *w, fsdp *f, errbuf *err) {
    if (fsdp_wait_optimizer(f, err)) return -1;
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

int ckpt_writer_save(ckpt_writer *w, fsdp *f, int64_t step, int attempt, int sync,
                     int64_t tokens_seen, errbuf *err) {
    if (w->rank >= f->group) return 0; /* another rank writes this state */
    ckpt_writer_wait(w);
    double t0 = clock_now_s();
    ckpt_report *job = &w->job;
    *job = (ckpt_report){.step = step, .attempt = attempt, .rank = w->rank, .sync = sync,
                         .optimizer_step = f->step, .tokens_seen = tokens_seen, .layout = &w->layout};
    w->saves++;
    atomic_store(&w->abort, 0);
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
    pthread_mutex_lock(&w->lock);
    w->busy = 1; /* from here on ckpt_writer_abort may stop it */
    w->pending = !sync;
    pthread_cond_broadcast(&w->cond);
    pthread_mutex_unlock(&w->lock);
    if (sync) {
        write_staged(w);
        pthread_mutex_lock(&w->lock);
        w->busy = 0;
        pthread_cond_broadcast(&w->cond);
        pthread_mutex_unlock(&w->lock);
    }
    return 0;
}
