/* comm: the backend-neutral half of comm.h -- argument checks, dead state, deadlines,
 * the comm_stall fault -- in front of a backend's comm_ops. */
#include "worker/comm.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "base/fault.h"
#include "worker/comm_backend.h"

int comm_setup(comm *c, const comm_ops *ops, int rank, int world, const comm_options *opt,
               errbuf *err) {
    if (!(opt->timeout_s > 0 && isfinite(opt->timeout_s)))
        return errf(err, "comm timeout_s %g must be a positive number of seconds", opt->timeout_s);
    if (!(opt->init_timeout_s > 0 && isfinite(opt->init_timeout_s)))
        return errf(err, "comm init_timeout_s %g must be a positive number of seconds",
                    opt->init_timeout_s);
    c->ops = ops;
    c->rank = rank;
    c->world = world;
    c->timeout_s = opt->timeout_s;
    atomic_init(&c->aborted, 0);
    c->dead = 0;
    c->ncalls = 0;
    c->gathered_bytes = 0;
    c->progress = opt->progress;
    c->unit = -1;
    c->busy_s = 0;
    c->device_timed = 0;
    return 0;
}

void comm_set_unit(comm *c, int unit) {
    if (c) c->unit = unit;
}

const char *comm_coll_name(int op) {
    static const char *const names[] = {[COMM_COLL_ALL_GATHER] = "all_gather",
                                        [COMM_COLL_REDUCE_SCATTER] = "reduce_scatter",
                                        [COMM_COLL_ALL_REDUCE] = "all_reduce",
                                        [COMM_COLL_BROADCAST] = "broadcast", [COMM_COLL_BARRIER] = "barrier"};
    return op >= 0 && op <= COMM_COLL_BARRIER ? names[op] : "unknown";
}

/* Collective t completed, as the host sees it. */
static void finished(comm *c, uint64_t t) {
    if (!c->progress) return;
    unsigned long long seen = atomic_load(&c->progress->finished);
    while (t > seen && !atomic_compare_exchange_weak(&c->progress->finished, &seen, t)) {
    }
}

int comm_rank(const comm *c) { return c->rank; }
unsigned long long comm_calls(const comm *c) { return c ? c->ncalls : 0; }

unsigned long long comm_gathered_bytes(const comm *c) { return c ? c->gathered_bytes : 0; }
double comm_busy_s(const comm *c) { return c ? c->busy_s : 0; }

/* The host's time in a call since t0, for a backend that does not time itself. */
static int timed(comm *c, double t0, int rc) {
    if (c && !c->device_timed) c->busy_s += clock_now_s() - t0;
    return rc;
}
int comm_world(const comm *c) { return c->world; }

size_t comm_dtype_size(comm_dtype dt) {
    switch (dt) {
    case COMM_F32: return 4;
    case COMM_BF16: return 2;
    case COMM_BYTE: return 1;
    }
    return 0;
}

/* Every collective starts here: refuses a dead communicator, runs the stall hook, sets
 * the deadline. */
static int begin(comm *c, comm_coll op, const char *name, errbuf *err) {
    if (!c) return errf(err, "%s: no communicator", name);
    if (atomic_load(&c->aborted)) return errf(err, "%s: the communicator was aborted", name);
    if (c->dead)
        return errf(err, "%s: the communicator is dead after an earlier error (%s)", name,
                    c->dead_reason);
    c->ncalls++;
    const fault *stall = fault_get(FAULT_COMM_STALL, c->rank);
    if (stall && c->ncalls == (uint64_t)stall->n) clock_sleep_s(stall->seconds); /* it never started */
    if (c->progress) {
        atomic_store(&c->progress->op, (int)op);
        atomic_store(&c->progress->unit, c->unit);
        atomic_store(&c->progress->started, c->ncalls);
    }
    c->deadline = clock_now_s() + c->timeout_s;
    return 0;
}

/* Every failure ends here: names the collective (NULL: the backend named it), kills the
 * communicator (which wakes the peers up) and remembers why, for the calls that come after. */
static int fail(comm *c, const char *name, errbuf *err) {
    if (atomic_load(&c->aborted))
        errf(err, "%s: the communicator was aborted", name ? name : "wait"); /* our own shutdown */
    else if (name)
        errprefix(err, "%s", name);
    c->dead = 1;
    memcpy(c->dead_reason, err->msg, sizeof c->dead_reason);
    c->ops->abort(c);
    return -1;
}

/* Checks a buffer of count elements of dt, times `per` (world for the gathered side). */
static int check_buffer(const void *p, size_t count, comm_dtype dt, size_t per, const char *what,
                        errbuf *err) {
    size_t es = comm_dtype_size(dt);
    if (es == 0) return errf(err, "unknown dtype %d", (int)dt);
    if (count > SIZE_MAX / 8 / es / per)
        return errf(err, "count %zu is too large", count);
    if (!p && count > 0) return errf(err, "%s buffer is NULL", what);
    return 0;
}

static int check_reduction(comm_dtype dt, comm_op op, errbuf *err) {
    if (dt != COMM_F32 && dt != COMM_BF16)
        return errf(err, "dtype %d cannot be reduced (only COMM_F32 and COMM_BF16)", (int)dt);
    if (op != COMM_SUM && op != COMM_AVG) return errf(err, "unknown op %d", (int)op);
    return 0;
}

/* The plain and split-phase forms share these: t is NULL for a plain call. */
static int all_gather(comm *c, const void *send, void *recv, size_t count, comm_dtype dt,
                      comm_ticket *t, errbuf *err) {
    const char *name = "all_gather";
    errbuf local;
    if (!err) err = &local; /* the cause is kept for the calls that come after */
    if (begin(c, COMM_COLL_ALL_GATHER, name, err)) return -1;
    if (t) *t = c->ncalls;
    int split = t && c->ops->all_gather_start;
    if (check_buffer(send, count, dt, 1, "send", err) ||
        check_buffer(recv, count, dt, (size_t)c->world, "recv", err) ||
        (count > 0 && (split ? c->ops->all_gather_start(c, send, recv, count, dt, err)
                             : c->ops->all_gather(c, send, recv, count, dt, err))))
        return fail(c, name, err);
    if (!split) finished(c, c->ncalls);
    c->gathered_bytes += count * comm_dtype_size(dt);
    return 0;
}

static int reduce_scatter(comm *c, const void *send, void *recv, size_t count, comm_dtype dt,
                          comm_op op, comm_ticket *t, errbuf *err) {
    const char *name = "reduce_scatter";
    errbuf local;
    if (!err) err = &local; /* the cause is kept for the calls that come after */
    if (begin(c, COMM_COLL_REDUCE_SCATTER, name, err)) return -1;
    if (t) *t = c->ncalls;
    int split = t && c->ops->reduce_scatter_start;
    if (check_reduction(dt, op, err) ||
        check_buffer(send, count, dt, (size_t)c->world, "send", err) ||
        check_buffer(recv, count, dt, 1, "recv", err) ||
        (count > 0 && (split ? c->ops->reduce_scatter_start(c, send, recv, count, dt, op, err)
                             : c->ops->reduce_scatter(c, send, recv, count, dt, op, err))))
        return fail(c, name, err);
    if (!split) finished(c, c->ncalls);
    return 0;
}

static int all_reduce(comm *c, void *buf, size_t count, comm_dtype dt, comm_op op,
                      comm_ticket *t, errbuf *err) {
    const char *name = "all_reduce";
    errbuf local;
    if (!err) err = &local; /* the cause is kept for the calls that come after */
    if (begin(c, COMM_COLL_ALL_REDUCE, name, err)) return -1;
    if (t) *t = c->ncalls;
    int split = t && c->ops->all_reduce_start;
    if (check_reduction(dt, op, err) || check_buffer(buf, count, dt, 1, "data", err) ||
        (count > 0 && (split ? c->ops->all_reduce_start(c, buf, count, dt, op, err)
                             : c->ops->all_reduce(c, buf, count, dt, op, err))))
        return fail(c, name, err);
    if (!split) finished(c, c->ncalls);
    return 0;
}

int comm_all_gather(comm *c, const void *send, void *recv, size_t count, comm_dtype dt,
                    errbuf *err) {
    double t0 = clock_now_s();
    return timed(c, t0, all_gather(c, send, recv, count, dt, NULL, err));
}

int comm_reduce_scatter(comm *c, const void *send, void *recv, size_t count, comm_dtype dt,
                        comm_op op, errbuf *err) {
    double t0 = clock_now_s();
    return timed(c, t0, reduce_scatter(c, send, recv, count, dt, op, NULL, err));
}

int comm_all_reduce(comm *c, void *buf, size_t count, comm_dtype dt, comm_op op, errbuf *err) {
    double t0 = clock_now_s();
    return timed(c, t0, all_reduce(c, buf, count, dt, op, NULL, err));
}

int comm_all_gather_start(comm *c, const void *send, void *recv, size_t count, comm_dtype dt,
                          comm_ticket *t, errbuf *err) {
    double t0 = clock_now_s();
    return timed(c, t0, all_gather(c, send, recv, count, dt, t, err));
}

int comm_reduce_scatter_start(comm *c, const void *send, void *recv, size_t count,
                              comm_dtype dt, comm_op op, comm_ticket *t, errbuf *err) {
    double t0 = clock_now_s();
    return timed(c, t0, reduce_scatter(c, send, recv, count, dt, op, t, err));
}

int comm_all_reduce_start(comm *c, void *buf, size_t count, comm_dtype dt, comm_op op,
                          comm_ticket *t, errbuf *err) {
    double t0 = clock_now_s();
    return timed(c, t0, all_reduce(c, buf, count, dt, op, t, err));
}

static int wait_for(comm *c, comm_ticket t, errbuf *err) {
    errbuf local;
    if (!err) err = &local;
    if (!c) return errf(err, "wait: no communicator");
    if (atomic_load(&c->aborted)) return errf(err, "wait: the communicator was aborted");
    if (c->dead)
        return errf(err, "wait: the communicator is dead after an earlier error (%s)", c->dead_reason);
    if (t > c->ncalls) return errf(err, "wait: collective %llu was never started", t);
    c->deadline = clock_now_s() + c->timeout_s;
    /* The backend names the collective that failed ("all_gather: timed out ..."). */
    if (c->ops->wait && c->ops->wait(c, t, err)) return fail(c, NULL, err);
    finished(c, t);
    return 0;
}

static int broadcast(comm *c, void *buf, size_t count, comm_dtype dt, int root, errbuf *err) {
    const char *name = "broadcast";
    errbuf local;
    if (!err) err = &local; /* the cause is kept for the calls that come after */
    if (begin(c, COMM_COLL_BROADCAST, name, err)) return -1;
    if (root < 0 || root >= c->world) {
        errf(err, "root %d is not a rank of a world of %d", root, c->world);
        return fail(c, name, err);
    }
    if (check_buffer(buf, count, dt, 1, "data", err) ||
        (count > 0 && c->ops->broadcast(c, buf, count, dt, root, err)))
        return fail(c, name, err);
    finished(c, c->ncalls);
    return 0;
}

static int barrier(comm *c, errbuf *err) {
    const char *name = "barrier";
    errbuf local;
    if (!err) err = &local; /* the cause is kept for the calls that come after */
    if (begin(c, COMM_COLL_BARRIER, name, err)) return -1;
    if (c->ops->barrier(c, err)) return fail(c, name, err);
    finished(c, c->ncalls);
    return 0;
}

int comm_wait(comm *c, comm_ticket t, errbuf *err) {
    double t0 = clock_now_s();
    return timed(c, t0, wait_for(c, t, err));
}

int comm_broadcast(comm *c, void *buf, size_t count, comm_dtype dt, int root, errbuf *err) {
    double t0 = clock_now_s();
    return timed(c, t0, broadcast(c, buf, count, dt, root, err));
}

int comm_barrier(comm *c, errbuf *err) {
    double t0 = clock_now_s();
    return timed(c, t0, barrier(c, err));
}

void comm_abort(comm *c) {
    if (!c) return;
    atomic_store(&c->aborted, 1);
    c->ops->abort(c);
}

void comm_destroy(comm *c) {
    if (c) c->ops->destroy(c);
}
