/* comm_staged: a comm whose buffers live in a kernels context's memory (a GPU), carried by
 * a host-memory comm (TCP) through one pinned staging buffer.  See comm_stage_through_host. */
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "worker/comm.h"
#include "worker/comm_backend.h"

typedef struct staged_comm {
    comm base;
    comm *inner;
    kctx *ctx;
    char *host; /* pinned, host_bytes */
    size_t host_bytes;
} staged_comm;

static staged_comm *staged(comm *c) { return (staged_comm *)c; }

/* Pinned room for n bytes; the inner comm's deadline follows ours. */
static int prepare(staged_comm *s, size_t n, errbuf *err) {
    s->inner->deadline = s->base.deadline;
    if (n <= s->host_bytes) return 0;
    k_host_free(s->ctx, s->host);
    s->host_bytes = 0;
    s->host = k_host_alloc(s->ctx, n, err);
    if (!s->host) return -1;
    s->host_bytes = n;
    return 0;
}

static int to_host(staged_comm *s, void *host, const void *dev, size_t n, errbuf *err) {
    k_copy_d2h(s->ctx, host, dev, n);
    return k_check(s->ctx, err);
}

static int to_device(staged_comm *s, void *dev, const void *host, size_t n, errbuf *err) {
    k_copy_h2d(s->ctx, dev, host, n);
    return k_sync(s->ctx, err); /* the staging buffer is reused by the next collective */
}

static int staged_all_gather(comm *c, const void *send, void *recv, size_t count, comm_dtype dt,
                             errbuf *err) {
    staged_comm *s = staged(c);
    size_t n = count * comm_dtype_size(dt), all = n * (size_t)c->world;
    char *mine;
    if (prepare(s, all, err)) return -1;
    mine = s->host + (size_t)c->rank * n;
    if (to_host(s, mine, send, n, err) ||
        s->inner->ops->all_gather(s->inner, mine, s->host, count, dt, err))
        return -1;
    return to_device(s, recv, s->host, all, err);
}

static int staged_reduce_scatter(comm *c, const void *send, void *recv, size_t count,
                                 comm_dtype dt, comm_op op, errbuf *err) {
    staged_comm *s = staged(c);
    size_t n = count * comm_dtype_size(dt), all = n * (size_t)c->world;
    char *mine;
    if (prepare(s, all, err)) return -1;
    mine = s->host + (size_t)c->rank * n;
    if (to_host(s, s->host, send, all, err) ||
        s->inner->ops->reduce_scatter(s->inner, s->host, mine, count, dt, op, err))
        return -1;
    return to_device(s, recv, mine, n, err);
}

static int staged_all_reduce(comm *c, void *buf, size_t count, comm_dtype dt, comm_op op,
                             errbuf *err) {
    staged_comm *s = staged(c);
    size_t n = count * comm_dtype_size(dt);
    if (prepare(s, n, err) || to_host(s, s->host, buf, n, err) ||
        s->inner->ops->all_reduce(s->inner, s->host, count, dt, op, err))
        return -1;
    return to_device(s, buf, s->host, n, err);
}

static int staged_broadcast(comm *c, void *buf, size_t count, comm_dtype dt, int root,
                            errbuf *err) {
    staged_comm *s = staged(c);
    size_t n = count * comm_dtype_size(dt);
    if (prepare(s, n, err) || (c->rank == root && to_host(s, s->host, buf, n, err)) ||
        s->inner->ops->broadcast(s->inner, s->host, count, dt, root, err))
        return -1;
    return to_device(s, buf, s->host, n, err);
}

static int staged_barrier(comm *c, errbuf *err) {
    staged_comm *s = staged(c);
    s->inner->deadline = c->deadline;
    return s->inner->ops->barrier(s->inner, err);
}

static void staged_abort(comm *c) { comm_abort(staged(c)->inner); }

static void staged_destroy(comm *c) {
    staged_comm *s = staged(c);
    comm_destroy(s->inner);
    k_host_free(s->ctx, s->host);
    free(s);
}

static const comm_ops staged_ops = {
    .all_gather = staged_all_gather,
    .reduce_scatter = staged_reduce_scatter,
    .all_reduce = staged_all_reduce,
    .broadcast = staged_broadcast,
    .barrier = staged_barrier,
    .abort = staged_abort,
    .destroy = staged_destroy,
};

int comm_stage_through_host(comm **c, kctx *ctx, errbuf *err) {
    staged_comm *s = calloc(1, sizeof *s);
    if (!s) return errf(err, "comm: out of memory");
    comm_options opt = {.timeout_s = (*c)->timeout_s, .init_timeout_s = 1};
    if (comm_setup(&s->base, &staged_ops, (*c)->rank, (*c)->world, &opt, err)) {
        free(s);
        return -1;
    }
    s->inner = *c;
    s->ctx = ctx;
    s->base.progress = s->inner->progress; /* the caller's collectives are the outer ones */
    s->inner->progress = NULL;
    *c = &s->base;
    return 0;
}
