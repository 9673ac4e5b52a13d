/* CPU backend: host memory, copies and casts (the compute dtype is fp32, so casts copy). */
#include "kernels/cpu/cpu_kernels.h"

#include <stdlib.h>
#include <string.h>

void *cpu_alloc(kctx *c, size_t bytes, errbuf *err) {
    (void)c;
    /* calloc(0) may return NULL, which would read as a failure. */
    void *p = calloc(bytes ? bytes : 1, 1);
    if (!p) errf(err, "k_alloc: out of host memory allocating %zu bytes", bytes);
    return p;
}

void cpu_free(kctx *c, void *p) {
    (void)c;
    free(p);
}

/* Host and context memory are the same here, so every copy is one. */
static void copy(void *dst, const void *src, size_t bytes) {
    if (bytes) memmove(dst, src, bytes);
}

void *cpu_host_alloc(kctx *c, size_t bytes, errbuf *err) { return cpu_alloc(c, bytes, err); }

void cpu_host_free(kctx *c, void *p) { cpu_free(c, p); }

void cpu_copy_h2d(kctx *c, void *dst, const void *host_src, size_t bytes) {
    (void)c;
    copy(dst, host_src, bytes);
}

/* The copy lanes: each lane's count of copies started (its last ticket) and, once
 * k_cpu_defer_copies is on, the queue of its copies not run yet, oldest first (c->impl;
 * NULL: copies run at once and no ticket is counted, so waits have nothing to do). */
typedef struct deferred_copy {
    void *dst;
    const void *src;
    size_t bytes;
    uint64_t ticket;
} deferred_copy;
typedef struct copy_lane {
    deferred_copy *q;
    size_t head, n, cap; /* q[head .. n) are waiting */
    uint64_t started;
} copy_lane;
typedef struct copy_queue {
    copy_lane lanes[K_COPY_LANES];
} copy_queue;

int cpu_defer_copies(kctx *c, errbuf *err) {
    if (!c->impl && !(c->impl = calloc(1, sizeof(copy_queue)))) return errf(err, "k_cpu_defer_copies: out of memory");
    return 0;
}

uint64_t cpu_copy_h2d_start(kctx *c, int lane, void *dst, const void *host_src, size_t bytes) {
    copy_queue *cq = c->impl;
    if (!cq) {
        copy(dst, host_src, bytes);
        return 0;
    }
    copy_lane *l = &cq->lanes[lane];
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 16;
        deferred_copy *q = realloc(l->q, cap * sizeof *q);
        if (!q) {
            k_fail(c, "k_copy_h2d_start: out of memory deferring a copy");
            return l->started;
        }
        l->q = q, l->cap = cap;
    }
    l->q[l->n++] = (deferred_copy){dst, host_src, bytes, ++l->started};
    return l->started;
}

/* Runs lane's waiting copies up to ticket upto, in order. */
void cpu_copy_h2d_wait(kctx *c, int lane, uint64_t upto) {
    copy_queue *cq = c->impl;
    if (!cq) return;
    copy_lane *l = &cq->lanes[lane];
    for (; l->head < l->n && l->q[l->head].ticket <= upto; l->head++)
        copy(l->q[l->head].dst, l->q[l->head].src, l->q[l->head].bytes);
    if (l->head == l->n) l->head = l->n = 0;
}

void cpu_sync(kctx *c) {
    for (int lane = 0; lane < K_COPY_LANES; lane++) cpu_copy_h2d_wait(c, lane, K_COPY_ALL);
}

void cpu_destroy(kctx *c) {
    copy_queue *cq = c->impl;
    for (int lane = 0; cq && lane < K_COPY_LANES; lane++) free(cq->lanes[lane].q);
    free(cq);
    c->impl = NULL;
}

void cpu_host_register(kctx *c, const void *p, size_t bytes, int writable) {
    (void)c, (void)p, (void)bytes, (void)writable;
}

void cpu_host_unregister(kctx *c, const void *p) { (void)c, (void)p; }

void cpu_copy_d2h(kctx *c, void *host_dst, const void *src, size_t bytes) {
    (void)c;
    copy(host_dst, src, bytes);
}

void cpu_zero(kctx *c, void *p, size_t bytes) {
    (void)c;
    if (bytes) memset(p, 0, bytes);
}

void cpu_f32_to_compute(kctx *c, void *dst, const float *src, size_t n) {
    (void)c;
    copy(dst, src, n * sizeof(float));
}

void cpu_compute_to_f32(kctx *c, float *dst, const void *src, size_t n) {
    (void)c;
    copy(dst, src, n * sizeof(float));
}
