/* comm_nccl: the GPU backend of comm.h over NCCL.
 *
 * The communicator is non-blocking (ncclConfig_t.blocking = 0), so no NCCL call can hang
 * the worker: initialisation and every collective are polled (ncclCommGetAsyncError, and an
 * event recorded after the collective) until they finish or the collective's deadline
 * (runtime.comm_timeout_s) passes; then the communicator is aborted (ncclCommAbort), which
 * makes the peers' collectives fail too, and the error names the collective and the time.
 * Collectives run on a stream of their own, ordered after the compute that produced their
 * input and before the compute that reads their output by events on the device (no
 * device-wide or host synchronisation of the compute stream); each call returns once its
 * result is in the buffer.
 *
 * Test-only hook (environment): FSDP_TEST_NCCL_HANG_AT=n makes this rank's n-th collective
 * wait behind a kernel that spins on a host flag, as a hung peer or a wedged kernel would;
 * the flag is released once the communicator has been aborted. */
#ifdef FSDP_HAVE_CUDA

#include <cuda_runtime.h>
#include <nccl.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/kernels.h"
#include "worker/comm_backend.h"
#include "worker/comm_nccl.h"

typedef struct nccl_comm {
    comm base;
    ncclComm_t nccl;
    cudaStream_t compute; /* the kernels context's stream */
    cudaStream_t stream;  /* the collectives' own */
    cudaEvent_t ready, done;
    uint64_t hang_at;   /* test hook: 0 when off */
    int *hang_flag;     /* mapped pinned memory the spinning kernel reads */
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
        if (comm_now() > deadline) return errf(err, "NCCL did not finish within the deadline");
        sched_yield();
    }
}

/* After a collective was enqueued: waits until it has run, or fails at the deadline. */
static int finish(nccl_comm *n, ncclResult_t enqueued, errbuf *err) {
    double deadline = n->base.deadline;
    if (enqueued != ncclSuccess && enqueued != ncclInProgress)
        return errf(err, "NCCL: %s", ncclGetErrorString(enqueued));
    if (wait_settled(n, deadline, err)) return -1;
    cudaError_t e = cudaEventRecord(n->done, n->stream);
    if (e != cudaSuccess) return errf(err, "cudaEventRecord: %s", cudaGetErrorString(e));
    while ((e = cudaEventQuery(n->done)) == cudaErrorNotReady) {
        ncclResult_t state;
        if (ncclCommGetAsyncError(n->nccl, &state) == ncclSuccess && state != ncclSuccess &&
            state != ncclInProgress)
            return errf(err, "NCCL: %s", ncclGetErrorString(state));
        if (comm_now() > deadline)
            return errf(err, "timed out after %.0f s (rank %d)", n->base.timeout_s, n->base.rank);
        sched_yield();
    }
    if (e != cudaSuccess) return errf(err, "CUDA: %s", cudaGetErrorString(e));
    /* Compute queued from now on reads the result only after the collective. */
    e = cudaStreamWaitEvent(n->compute, n->done, 0);
    return e == cudaSuccess ? 0 : errf(err, "cudaStreamWaitEvent: %s", cudaGetErrorString(e));
}

/* Before each collective: its stream waits for the compute queued so far (the input's
 * producer); and the test hook may park it behind a spinning kernel. */
static void maybe_hang(nccl_comm *n) {
    cudaEventRecord(n->ready, n->compute);
    cudaStreamWaitEvent(n->stream, n->ready, 0);
    if (n->hang_at && n->base.ncalls == n->hang_at) kcuda_test_spin(n->stream, n->hang_flag);
}

static ncclDataType_t nccl_type(comm_dtype dt) {
    return dt == COMM_F32 ? ncclFloat32 : dt == COMM_BF16 ? ncclBfloat16 : ncclUint8;
}

static ncclRedOp_t nccl_op(comm_op op) { return op == COMM_AVG ? ncclAvg : ncclSum; }

static int nccl_all_gather(comm *c, const void *send, void *recv, size_t count, comm_dtype dt,
                           errbuf *err) {
    nccl_comm *n = as_nccl(c);
    maybe_hang(n);
    return finish(n, ncclAllGather(send, recv, count, nccl_type(dt), n->nccl, n->stream), err);
}

static int nccl_reduce_scatter(comm *c, const void *send, void *recv, size_t count,
                               comm_dtype dt, comm_op op, errbuf *err) {
    nccl_comm *n = as_nccl(c);
    maybe_hang(n);
    return finish(n, ncclReduceScatter(send, recv, count, nccl_type(dt), nccl_op(op), n->nccl,
                                       n->stream), err);
}

static int nccl_all_reduce(comm *c, void *buf, size_t count, comm_dtype dt, comm_op op,
                           errbuf *err) {
    nccl_comm *n = as_nccl(c);
    maybe_hang(n);
    return finish(n, ncclAllReduce(buf, buf, count, nccl_type(dt), nccl_op(op), n->nccl,
                                   n->stream), err);
}

static int nccl_broadcast(comm *c, void *buf, size_t count, comm_dtype dt, int root,
                          errbuf *err) {
    nccl_comm *n = as_nccl(c);
    maybe_hang(n);
    return finish(n, ncclBroadcast(buf, buf, count, nccl_type(dt), root, n->nccl, n->stream), err);
}

/* A one-byte all-reduce on a scratch byte: returns once every rank has reached it. */
static int nccl_barrier(comm *c, errbuf *err) {
    nccl_comm *n = as_nccl(c);
    maybe_hang(n);
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
    nccl_abort(c); /* collectives are synchronous: nothing is in flight here */
    if (n->done) cudaEventDestroy(n->done);
    if (n->ready) cudaEventDestroy(n->ready);
    if (n->stream) cudaStreamDestroy(n->stream);
    if (n->hang_flag) cudaFreeHost(n->hang_flag);
    free(n);
}

static const comm_ops nccl_ops = {
    .all_gather = nccl_all_gather,
    .reduce_scatter = nccl_reduce_scatter,
    .all_reduce = nccl_all_reduce,
    .broadcast = nccl_broadcast,
    .barrier = nccl_barrier,
    .abort = nccl_abort,
    .destroy = nccl_destroy,
};

int comm_nccl_init(comm **out, const comm_options *opt, int rank, int world,
                   const unsigned char id[COMM_NCCL_ID_BYTES], kctx *ctx, errbuf *err) {
    *out = NULL;
    if (ctx->backend != K_CUDA) return errf(err, "NCCL needs a CUDA kernels context");
    nccl_comm *n = calloc(1, sizeof *n);
    if (!n) return errf(err, "comm: out of memory");
    if (comm_setup(&n->base, &nccl_ops, rank, world, opt, err)) {
        free(n);
        return -1;
    }
    n->compute = (cudaStream_t)ctx->stream;
    const char *hang = getenv("FSDP_TEST_NCCL_HANG_AT");
    n->hang_at = hang ? strtoull(hang, NULL, 10) : 0;
    cudaError_t e = cudaSetDevice(ctx->device);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&n->ready, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&n->done, cudaEventDisableTiming);
    /* Mapped pinned memory: [0] the test hang flag, [1] the barrier's byte (device-visible). */
    if (e == cudaSuccess) e = cudaHostAlloc((void **)&n->hang_flag, 2 * sizeof(int), cudaHostAllocMapped);
    if (e != cudaSuccess) {
        nccl_destroy(&n->base);
        return errf(err, "NCCL set-up: %s", cudaGetErrorString(e));
    }
    memset(n->hang_flag, 0, 2 * sizeof(int));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclUniqueId uid;
    memcpy(&uid, id, sizeof uid);
    ncclResult_t r = ncclCommInitRankConfig(&n->nccl, world, uid, rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
        n->nccl = NULL;
        nccl_destroy(&n->base);
        return errf(err, "ncclCommInitRankConfig (rank %d of %d): %s", rank, world, ncclGetErrorString(r));
    }
    if (wait_settled(n, comm_now() + opt->init_timeout_s, err)) {
        nccl_destroy(&n->base);
        return errprefix(err, "NCCL init (rank %d of %d)", rank, world);
    }
    *out = &n->base;
    return 0;
}

#endif
