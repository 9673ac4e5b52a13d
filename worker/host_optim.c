/* host_optim: AdamW on a pool of host threads, unit by unit.  See host_optim.h. */
#include "worker/host_optim.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/bf16.h"

typedef struct worker {
    host_optim *o;
    pthread_t thread;
    kctx cpu; /* the CPU backend's k_adamw runs in it */
} worker;

struct host_optim {
    pthread_mutex_t lock;
    pthread_cond_t work, done;
    worker *workers;
    int n_workers, started_workers;
    k_dtype compute;
    /* The step in progress (guarded by lock); tasks are handed out in order. */
    const host_optim_task *tasks;
    int n_tasks, next_task, finished_tasks;
    host_optim_step step;
    int n_units;
    int *unit_left; /* per unit: its tasks not finished */
    int failed;
    errbuf failure;
    int quit;
};

void host_optim_cast(k_dtype compute, void *dst, const float *src, size_t n) {
    if (compute == K_F32) {
        memcpy(dst, src, n * sizeof *src);
        return;
    }
    uint16_t *out = dst;
    for (size_t i = 0; i < n; i++) out[i] = bf16_from_f32(src[i]);
}

static int run_task(worker *w, const host_optim_task *t, const host_optim_step *s, errbuf *err) {
    k_adamw(&w->cpu, t->master, t->grad, t->m, t->v, t->n, s->lr, s->beta1, s->beta2, s->eps,
            t->decay ? s->weight_decay : 0.0f, s->step, s->grad_scale, NULL);
    if (k_check(&w->cpu, err)) return -1;
    host_optim_cast(w->o->compute, t->param, t->master, t->n);
    return 0;
}

static void *work_loop(void *arg) {
    worker *w = arg;
    host_optim *o = w->o;
    pthread_mutex_lock(&o->lock);
    for (;;) {
        while (!o->quit && o->next_task >= o->n_tasks) pthread_cond_wait(&o->work, &o->lock);
        if (o->quit) break;
        const host_optim_task *t = &o->tasks[o->next_task++];
        host_optim_step s = o->step;
        pthread_mutex_unlock(&o->lock);
        errbuf err = {{0}};
        int rc = run_task(w, t, &s, &err);
        pthread_mutex_lock(&o->lock);
        if (rc && !o->failed) {
            o->failed = 1;
            o->failure = err;
        }
        o->unit_left[t->unit]--;
        o->finished_tasks++;
        pthread_cond_broadcast(&o->done);
    }
    pthread_mutex_unlock(&o->lock);
    return NULL;
}

int host_optim_init(host_optim **out, int threads, int n_units, k_dtype compute, errbuf *err) {
    *out = NULL;
    if (threads <= 0) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        threads = cores > 0 ? (int)cores : 1;
    }
    host_optim *o = calloc(1, sizeof *o);
    if (!o) return errf(err, "host optimizer: out of memory");
    o->compute = compute;
    o->n_units = n_units;
    o->unit_left = calloc((size_t)n_units, sizeof *o->unit_left);
    o->workers = calloc((size_t)threads, sizeof *o->workers);
    if (!o->unit_left || !o->workers) {
        free(o->unit_left);
        free(o->workers);
        free(o);
        return errf(err, "host optimizer: out of memory");
    }
    if (pthread_mutex_init(&o->lock, NULL) || pthread_cond_init(&o->work, NULL) ||
        pthread_cond_init(&o->done, NULL)) {
        free(o->unit_left);
        free(o->workers);
        free(o);
        return errf(err, "host optimizer: cannot create its locks");
    }
    o->n_workers = threads;
    *out = o;
    for (int i = 0; i < threads; i++) {
        worker *w = &o->workers[i];
        w->o = o;
        if (kctx_init(&w->cpu, K_CPU, 0, err)) break;
        int e = pthread_create(&w->thread, NULL, work_loop, w);
        if (e) {
            kctx_destroy(&w->cpu);
            errf(err, "host optimizer: pthread_create: %s", strerror(e));
            break;
        }
        o->started_workers++;
    }
    if (o->started_workers == threads) return 0;
    host_optim_destroy(o);
    *out = NULL;
    return -1;
}

int host_optim_start(host_optim *o, const host_optim_task *tasks, int n, const host_optim_step *s,
                     errbuf *err) {
    pthread_mutex_lock(&o->lock);
    if (o->finished_tasks < o->n_tasks) {
        pthread_mutex_unlock(&o->lock);
        return errf(err, "host optimizer: a step is still in progress");
    }
    memset(o->unit_left, 0, (size_t)o->n_units * sizeof *o->unit_left);
    for (int i = 0; i < n; i++) o->unit_left[tasks[i].unit]++;
    o->tasks = tasks;
    o->n_tasks = n;
    o->next_task = o->finished_tasks = 0;
    o->step = *s;
    o->failed = 0;
    pthread_cond_broadcast(&o->work);
    pthread_mutex_unlock(&o->lock);
    return 0;
}

/* Waits until the tasks of unit (-1: every task) are done; reports the step's failure. */
static int wait_until(host_optim *o, int unit, errbuf *err) {
    pthread_mutex_lock(&o->lock);
    while (unit >= 0 ? o->unit_left[unit] > 0 : o->finished_tasks < o->n_tasks)
        pthread_cond_wait(&o->done, &o->lock);
    int failed = o->failed;
    if (failed && err) *err = o->failure;
    pthread_mutex_unlock(&o->lock);
    return failed ? -1 : 0;
}

int host_optim_wait(host_optim *o, int unit, errbuf *err) {
    if (unit < 0 || unit >= o->n_units) return errf(err, "host optimizer: no unit %d", unit);
    return wait_until(o, unit, err);
}

int host_optim_wait_all(host_optim *o, errbuf *err) { return wait_until(o, -1, err); }

void host_optim_destroy(host_optim *o) {
    if (!o) return;
    wait_until(o, -1, NULL);
    pthread_mutex_lock(&o->lock);
    o->quit = 1;
    pthread_cond_broadcast(&o->work);
    pthread_mutex_unlock(&o->lock);
    for (int i = 0; i < o->started_workers; i++) {
        pthread_join(o->workers[i].thread, NULL);
        kctx_destroy(&o->workers[i].cpu);
    }
    pthread_mutex_destroy(&o->lock);
    pthread_cond_destroy(&o->work);
    pthread_cond_destroy(&o->done);
    free(o->unit_left);
    free(o->workers);
    free(o);
}
