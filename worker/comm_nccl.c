/* comm_nccl: the GPU backend of comm.h over NCCL.
 *
 * The communicator is non-blocking (ncclConfig_t.blocking = 0), so no NCCL call can hang
 * the worker: initialisation and every collective are polled (ncclCommGetAsyncError, and an
 * event recorded after the collective) until they finish or the collective's deadline
 * (runtime.comm_timeout_s) passes; then the communicator is aborted (ncclCommAbort), which
 * makes the peers' collectives fail too, and the error names the collective and the time.
 * Collectives run on a stream of their own, ordered after the compute that produced their
 * input and before the compute that reads their output by events on the device (no
 * device-wide or host synchronisation of the compute stream).  A plain call returns once its
 * result is in the buffer; a split-phase one (*_start) returns once it is queued, and
 * comm_wait polls its event (up to NCCL_INFLIGHT of them in flight) against the deadline.
 *
 * Fault point nccl_hang=N (base/fault.h) makes this rank's N-th collective
 * wait behind a kernel that spins on a host flag, as a hung peer or a wedged kernel would;
 * the flag is released once the communicator has been aborted. */
#ifdef FSDP_HAVE_CUDA

#include <cuda_runtime.h>
#include <nccl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/fault.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/kernels.h"
#include "worker/comm_backend.h"
#include "worker/comm_nccl.h"

/* At most this many split-phase collectives in flight; one more waits for the oldest. */
#define NCCL_INFLIGHT 8

typedef struct nccl_pending {
    uint64_t ticket;  /* comm.ncalls of the collective */
    const char *name; /* for errors: "all_gather" ... */
    cudaEvent_t begin, done; /* recorded on the comm stream before and after it */
} nccl_pending;

typedef struct nccl_comm {
    comm base;
    ncclComm_t nccl;
    cudaStream_t compute; /* the kernels context's stream */
    cudaStream_t stream;  /* the collectives' own; a split communicator shares its parent's,
                             so that the two run in the order they were queued (hybrid_shard's
                             all-reduce of a reduce-scattered shard) */
    int owns_stream;
    cudaEvent_t ready, begin, done; /* begin, done: around a plain collective */
    int *hang_flag;     /* mapped pinned memory the spinning kernel reads */
    nccl_pending pending[NCCL_INFLIGHT]; /* a ring, oldest at [head] */
    int head, inflight;
} nccl_comm;

_Static_assert(sizeof(ncclUniqueId) == COMM_NCCL_ID_BYTES, "NCCL unique id size");

static nccl_comm *as_nccl(comm *c) { return (nccl_comm *)c; }

int comm_nccl_make_id(unsigned char id[COMM_NCCL_ID_BYTES], errbuf *err) {
    ncclUniqueId u;
    ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess) return errf(err, "ncclGetUniqueId: %s", ncclGetErrorString(r));
    memcpy(id, &u, sizeof u);
    return 0;
}

/* Waits while NCCL reports work in progress on the communicator (non-blocking mode). */
static int wait_settled(nccl_comm *n, double deadline, errbuf *err) {
    for (;;) {
        ncclResult_t state;
        ncclResult_t r = ncclCommGetAsyncError(n->nccl, &state);
        if (r != ncclSuccess) return errf(err, "ncclCommGetAsyncError: %s", ncclGetErrorString(r));
        if (state == ncclSuccess) return 0;
        if (state != ncclInProgress) return errf(err, "NCCL: %s", ncclGetErrorString(state));
        if (clock_now_s() > deadline) return errf(err, "NCCL did not finish within the deadline");
        sched_yield();
    }
}

/* Polls `ev` (recorded on the comm stream) until it has happened, NCCL reports an error or
 * the deadline passes; then the compute queued from now on waits for it on the device. */
static int wait_event(nccl_comm *n, cudaEvent_t ev, const char *name, errbuf *err) {
    cudaError_t e;
    while ((e = cudaEventQuery(ev)) == cudaErrorNotReady) {
        ncclResult_t state;
        if (ncclCommGetAsyncError(n->nccl, &state) == ncclSuccess && state != ncclSuccess &&
            state != ncclInProgress)
            return errf(err, "%sNCCL: %s", name, ncclGetErrorString(state));
        if (clock_now_s() > n->base.deadline)
            return errf(err, "%stimed out after %.0f s (rank %d)", name, n->base.timeout_s,
                        n->base.rank);
        sched_yield();
    }
    if (e != cudaSuccess) return errf(err, "%sCUDA: %s", name, cudaGetErrorString(e));
    e = cudaStreamWaitEvent(n->compute, ev, 0);
    return e == cudaSuccess ? 0 : errf(err, "cudaStreamWaitEvent: %s", cudaGetErrorString(e));
}

/* A collective's device time, from when its stream reached it to its end (comm_busy_s).  A
 * pair that cannot be timed is left out: the figure is for the stragglers' watch. */
static void count_device_time(nccl_comm *n, cudaEvent_t begin, cudaEvent_t end) {
    float ms;
    if (cudaEventElapsedTime(&ms, begin, end) == cudaSuccess) n->base.busy_s += ms / 1e3;
}

/* Checks what NCCL said when the collective was enqueued and waits until it is queued. */
static int enqueued(nccl_comm *n, ncclResult_t r, errbuf *err) {
    if (r != ncclSuccess && r != ncclInProgress) return errf(err, "NCCL: %s", ncclGetErrorString(r));
    return wait_settled(n, n->base.deadline, err);
}

/* After a plain collective was enqueued: waits until it has run, or fails at the deadline.
 * The stream runs in order, so every split-phase collective before it has finished too. */
static int finish(nccl_comm *n, ncclResult_t r, errbuf *err) {
    if (enqueued(n, r, err)) return -1;
    cudaError_t e = cudaEventRecord(n->done, n->stream);
    if (e != cudaSuccess) return errf(err, "cudaEventRecord: %s", cudaGetErrorString(e));
    if (wait_event(n, n->done, "", err)) return -1;
    count_device_time(n, n->begin, n->done);
    for (; n->inflight > 0; n->inflight--, n->head = (n->head + 1) % NCCL_INFLIGHT) /* done before it */
        count_device_time(n, n->pending[n->head].begin, n->pending[n->head].done);
    return 0;
}

/* Waits for the oldest split-phase collective in flight. */
static int retire_oldest(nccl_comm *n, errbuf *err) {
    nccl_pending *p = &n->pending[n->head];
    char name[40];
    snprintf(name, sizeof name, "%s: ", p->name);
    if (wait_event(n, p->done, name, err)) return -1;
    count_device_time(n, p->begin, p->done);
    n->head = (n->head + 1) % NCCL_INFLIGHT;
    n->inflight--;
    return 0;
}

/* After a split-phase collective was enqueued: marks its end with an event. */
static int started(nccl_comm *n, const char *name, ncclResult_t r, errbuf *err) {
    if (enqueued(n, r, err)) return -1;
    nccl_pending *p = &n->pending[(n->head + n->inflight) % NCCL_INFLIGHT];
    cudaError_t e = cudaEventRecord(p->done, n->stream);
    if (e != cudaSuccess) return errf(err, "cudaEventRecord: %s", cudaGetErrorString(e));
    p->ticket = n->base.ncalls;
    p->name = name;
    n->inflight++;
    return 0;
}

static int nccl_wait(comm *c, uint64_t t, errbuf *err) {
    nccl_comm *n = as_nccl(c);
    while (n->inflight > 0 && n->pending[n->head].ticket <= t)
        if (retire_oldest(n, err)) return -1;
    return 0;
}

/* Before each collective: its stream waits for the compute queued so far (the input's
 * producer), then records `begin`; and the nccl_hang fault may park it behind a spinning
 * kernel. */
static int before_collective(nccl_comm *n, cudaEvent_t begin, errbuf *err) {
    cudaError_t e = cudaEventRecord(n->ready, n->compute);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(n->stream, n->ready, 0);
    if (e == cudaSuccess) e = cudaEventRecord(begin, n->stream);
    if (e != cudaSuccess) return errf(err, "ordering after the compute: %s", cudaGetErrorString(e));
    const fault *hang = fault_get(FAULT_NCCL_HANG, n->base.rank);
    if (hang && n->base.ncalls == (uint64_t)hang->n) cuda_test_spin(n->stream, n->hang_flag);
    return 0;
}

static ncclDataType_t nccl_type(comm_dtype dt) {
    return dt == COMM_F32 ? ncclFloat32 : dt == COMM_BF16 ? ncclBfloat16 : ncclUint8;
}

static ncclRedOp_t nccl_op(comm_op op) { return op == COMM_AVG ? ncclAvg : ncclSum; }

static int nccl_all_gather(comm *c, const void *send, void *recv, size_t count, comm_dtype dt,
                           errbuf *err) {
    nccl_comm *n = as_nccl(c);
    if (before_collective(n, n->begin, err)) return -1;
    return finish(n, ncclAllGather(send, recv, count, nccl_type(dt), n->nccl, n->stream), err);
}

/* A split-phase start first makes room in the ring of events. */
static int make_room(nccl_comm *n, errbuf *err) {
    if (n->inflight == NCCL_INFLIGHT && retire_oldest(n, err)) return -1;
    return before_collective(n, n->pending[(n->head + n->inflight) % NCCL_INFLIGHT].begin, err);
}

static int nccl_all_gather_start(comm *c, const void *send, void *recv, size_t count,
                                 comm_dtype dt, errbuf *err) {
    nccl_comm *n = as_nccl(c);
    if (make_room(n, err)) return -1;
    return started(n, "all_gather", ncclAllGather(send, recv, count, nccl_type(dt), n->nccl,
                                                  n->stream), err);
}

static int nccl_reduce_scatter_start(comm *c, const void *send, void *recv, size_t count,
                                     comm_dtype dt, comm_op op, errbuf *err) {
    nccl_comm *n = as_nccl(c);
    if (make_room(n, err)) return -1;
    return started(n, "reduce_scatter", ncclReduceScatter(send, recv, count, nccl_type(dt),
                                                          nccl_op(op), n->nccl, n->stream), err);
}

static int nccl_all_reduce_start(comm *c, void *buf, size_t count, comm_dtype dt, comm_op op,
                                 errbuf *err) {
    nccl_comm *n = as_nccl(c);
    if (make_room(n, err)) return -1;
    return started(n, "all_reduce", ncclAllReduce(buf, buf, count, nccl_type(dt), nccl_op(op),
                                                  n->nccl, n->stream), err);
}

static int nccl_reduce_scatter(comm *c, const void *send, void *recv, size_t count,
                               comm_dtype dt, comm_op op, errbuf *err) {
    nccl_comm *n = as_nccl(c);
    if (before_collective(n, n->begin, err)) return -1;
    return finish(n, ncclReduceScatter(send, recv, count, nccl_type(dt), nccl_op(op), n->nccl,
                                       n->stream), err);
}

static int nccl_all_reduce(comm *c, void *buf, size_t count, comm_dtype dt, comm_op op,
                           errbuf *err) {
    nccl_comm *n = as_nccl(c);
    if (before_collective(n, n->begin, err)) return -1;
    return finish(n, ncclAllReduce(buf, buf, count, nccl_type(dt), nccl_op(op), n->nccl,
                                   n->stream), err);
}

static int nccl_broadcast(comm *c, void *buf, size_t count, comm_dtype dt, int root,
                          errbuf *err) {
    nccl_comm *n = as_nccl(c);
    if (before_collective(n, n->begin, err)) return -1;
    return finish(n, ncclBroadcast(buf, buf, count, nccl_type(dt), root, n->nccl, n->stream), err);
}

/* A one-byte all-reduce on a scratch byte: returns once every rank has reached it. */
static int nccl_barrier(comm *c, errbuf *err) {
    nccl_comm *n = as_nccl(c);
    if (before_collective(n, n->begin, err)) return -1;
    return finish(n, ncclAllReduce(n->hang_flag + 1, n->hang_flag + 1, 1, ncclUint8, ncclSum,
                                   n->nccl, n->stream), err);
}

static void nccl_abort(comm *c) {
    nccl_comm *n = as_nccl(c);
    /* Release a test hang first: the abort may wait for work queued on the stream. */
    if (n->hang_flag) __atomic_store_n(n->hang_flag, 1, __ATOMIC_RELEASE);
    if (n->nccl) ncclCommAbort(n->nccl);
    n->nccl = NULL;
}

static void nccl_destroy(comm *c) {
    nccl_comm *n = as_nccl(c);
    nccl_abort(c); /* ends whatever split-phase collective is still in flight */
    for (int i = 0; i < NCCL_INFLIGHT; i++) {
        if (n->pending[i].done) cudaEventDestroy(n->pending[i].done);
        if (n->pending[i].begin) cudaEventDestroy(n->pending[i].begin);
    }
    if (n->done) cudaEventDestroy(n->done);
    if (n->begin) cudaEventDestroy(n->begin);
    if (n->ready) cudaEventDestroy(n->ready);
    if (n->stream && n->owns_stream) cudaStreamDestroy(n->stream);
    if (n->hang_flag) cudaFreeHost(n->hang_flag);
    free(n);
}

static const comm_ops nccl_ops = {
    .all_gather = nccl_all_gather,
    .reduce_scatter = nccl_reduce_scatter,
    .all_reduce = nccl_all_reduce,
    .broadcast = nccl_broadcast,
    .barrier = nccl_barrier,
    .all_gather_start = nccl_all_gather_start,
    .reduce_scatter_start = nccl_reduce_scatter_start,
    .all_reduce_start = nccl_all_reduce_start,
    .wait = nccl_wait,
    .abort = nccl_abort,
    .destroy = nccl_destroy,
};

/* A communicator's CUDA side on ctx's device: its events, the hang flag and, unless it shares
 * `stream` (a split's parent's), a stream of its own. */
static int nccl_new(nccl_comm **out, const comm_options *opt, int rank, int world, kctx *ctx,
                    cudaStream_t stream, errbuf *err) {
    *out = NULL;
    if (ctx->backend != K_CUDA) return errf(err, "NCCL needs a CUDA kernels context");
    nccl_comm *n = calloc(1, sizeof *n);
    if (!n) return errf(err, "comm: out of memory");
    if (comm_setup(&n->base, &nccl_ops, rank, world, opt, err)) {
        free(n);
        return -1;
    }
    n->base.device_timed = 1;
    n->compute = (cudaStream_t)ctx->stream;
    n->stream = stream;
    n->owns_stream = !stream;
    cudaError_t e = cudaSetDevice(ctx->device);
    /* The highest priority: the block scheduler starts a collective's blocks as soon as SMs
     * free up, instead of queueing them behind the compute kernels it overlaps with. */
    int least, greatest;
    if (e == cudaSuccess && !stream) e = cudaDeviceGetStreamPriorityRange(&least, &greatest);
    if (e == cudaSuccess && !stream) e = cudaStreamCreateWithPriority(&n->stream, cudaStreamNonBlocking, greatest);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&n->ready, cudaEventDisableTiming);
    /* timed: the collectives' device time (comm_busy_s) */
    if (e == cudaSuccess) e = cudaEventCreate(&n->begin);
    if (e == cudaSuccess) e = cudaEventCreate(&n->done);
    for (int i = 0; i < NCCL_INFLIGHT && e == cudaSuccess; i++) {
        e = cudaEventCreate(&n->pending[i].done);
        if (e == cudaSuccess) e = cudaEventCreate(&n->pending[i].begin);
    }
    /* Mapped pinned memory: [0] the test hang flag, [1] the barrier's byte (device-visible). */
    if (e == cudaSuccess) e = cudaHostAlloc((void **)&n->hang_flag, 2 * sizeof(int), cudaHostAllocMapped);
    if (e != cudaSuccess) {
        nccl_destroy(&n->base);
        return errf(err, "NCCL set-up: %s", cudaGetErrorString(e));
    }
    memset(n->hang_flag, 0, 2 * sizeof(int));
    *out = n;
    return 0;
}

/* After ncclCommInitRankConfig or ncclCommSplit returned r: waits for the new communicator. */
static int nccl_joined(nccl_comm *n, ncclResult_t r, const char *what, double init_timeout_s,
                       comm **out, errbuf *err) {
    int rank = n->base.rank, world = n->base.world;
    if (r != ncclSuccess && r != ncclInProgress) {
        n->nccl = NULL;
        nccl_destroy(&n->base);
        return errf(err, "%s (rank %d of %d): %s", what, rank, world, ncclGetErrorString(r));
    }
    if (wait_settled(n, clock_now_s() + init_timeout_s, err)) {
        nccl_destroy(&n->base);
        return errprefix(err, "%s (rank %d of %d)", what, rank, world);
    }
    *out = &n->base;
    return 0;
}

int comm_nccl_init(comm **out, const comm_options *opt, int rank, int world,
                   const unsigned char id[COMM_NCCL_ID_BYTES], kctx *ctx, errbuf *err) {
    nccl_comm *n;
    *out = NULL;
    if (nccl_new(&n, opt, rank, world, ctx, NULL, err)) return -1;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclUniqueId uid;
    memcpy(&uid, id, sizeof uid);
    ncclResult_t r = ncclCommInitRankConfig(&n->nccl, world, uid, rank, &config);
    return nccl_joined(n, r, "ncclCommInitRankConfig", opt->init_timeout_s, out, err);
}

int comm_nccl_split(comm *parent, const comm_options *opt, int color, int rank, int world,
                    kctx *ctx, comm **out, errbuf *err) {
    nccl_comm *p = as_nccl(parent), *n;
    *out = NULL;
    if (nccl_new(&n, opt, rank, world, ctx, p->stream, err)) return -1;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    /* key = the parent's rank: the members keep the parent's order (comm_tcp_split's) */
    ncclResult_t r = ncclCommSplit(p->nccl, color, parent->rank, &n->nccl, &config);
    if ((r == ncclSuccess || r == ncclInProgress) && wait_settled(p, clock_now_s() + opt->init_timeout_s, err)) {
        nccl_destroy(&n->base);
        return errprefix(err, "ncclCommSplit (color %d)", color);
    }
    return nccl_joined(n, r, "ncclCommSplit", opt->init_timeout_s, out, err);
}

#endif
