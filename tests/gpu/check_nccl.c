/* check_nccl: the GPU comm paths on a machine with one GPU.
 *   1. The NCCL backend (world 1: NCCL refuses two ranks on one device): every collective on
 *      device buffers, in f32 and bf16, against the expected values.
 *   2. Its watchdog: a kernel spinning on a host flag in the comm stream (the fault point
 *      nccl_hang, base/fault.h) makes a collective time out; the call fails within the timeout
 *      + 2 s naming the time-out, the communicator is dead, and the GPU is usable afterwards.
 *   2b. Split-phase collectives (comm_*_start, comm_wait): more in flight than the backend's
 *      ring of events, all finished by waiting for the last ticket; and the watchdog on a
 *      started collective (comm_wait times out).
 *   3. Several ranks sharing the GPU: 3 processes, TCP comm staged through pinned host memory
 *      (comm_stage_through_host), collectives on device buffers.
 * Prints one line per check and "N passed, N failed". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/fault.h"
#include "kernels/kernels.h"
#include "worker/comm.h"
#include "worker/comm_nccl.h"

static int passed, failed;

static void check(int ok, const char *what, const char *detail) {
    printf("%-60s %s%s%s\n", what, ok ? "PASS" : "FAIL", detail ? "  " : "", detail ? detail : "");
    if (ok) passed++;
    else failed++;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Runs op on a device buffer holding host[n] floats and returns the result in host. */
typedef int (*op_fn)(comm *c, float *dev, size_t n, errbuf *err);

static int roundtrip(kctx *k, comm *c, op_fn op, float *host, size_t n_in, size_t n_out,
                     errbuf *err) {
    float *dev = k_alloc(k, n_out * sizeof(float), err);
    if (!dev) return -1;
    k_copy_h2d(k, dev, host, n_in * sizeof(float));
    int rc = k_sync(k, err);
    if (rc == 0) rc = op(c, dev, n_in, err);
    if (rc == 0) k_copy_d2h(k, host, dev, n_out * sizeof(float));
    if (rc == 0) rc = k_sync(k, err);
    k_free(k, dev);
    return rc;
}

static int op_all_reduce(comm *c, float *dev, size_t n, errbuf *err) {
    return comm_all_reduce(c, dev, n, COMM_F32, COMM_SUM, err);
}
static int op_all_gather(comm *c, float *dev, size_t n, errbuf *err) {
    return comm_all_gather(c, dev + (size_t)comm_rank(c) * n / (size_t)comm_world(c), dev,
                           n / (size_t)comm_world(c), COMM_F32, err);
}
static int op_reduce_scatter(comm *c, float *dev, size_t n, errbuf *err) {
    size_t per = n / (size_t)comm_world(c);
    return comm_reduce_scatter(c, dev, dev + (size_t)comm_rank(c) * per, per, COMM_F32, COMM_SUM, err);
}
static int op_broadcast(comm *c, float *dev, size_t n, errbuf *err) {
    return comm_broadcast(c, dev, n, COMM_F32, comm_world(c) - 1, err);
}

/* Rank r's input element i. */
static float input(int r, size_t i) { return (float)((r + 1) * 1000 + (int)(i % 997)); }

/* Runs every collective on rank r of comm c; returns the number of wrong results. */
static int run_collectives(kctx *k, comm *c, char *detail, size_t dn) {
    int world = comm_world(c), r = comm_rank(c), wrong = 0;
    size_t n = 3 * 1024 * 1024 + 3 * (size_t)world; /* divisible by world, not a power of two */
    n -= n % (size_t)world;
    float *h = malloc(n * sizeof *h);
    errbuf err;
    op_fn ops[] = {op_all_reduce, op_all_gather, op_reduce_scatter, op_broadcast};
    const char *names[] = {"all_reduce", "all_gather", "reduce_scatter", "broadcast"};
    for (int o = 0; o < 4 && h; o++) {
        for (size_t i = 0; i < n; i++) h[i] = input(r, i);
        if (roundtrip(k, c, ops[o], h, n, n, &err)) {
            snprintf(detail, dn, "%s: %s", names[o], err.msg);
            free(h);
            return 1000;
        }
        size_t per = n / (size_t)world;
        for (size_t i = 0; i < n; i++) {
            double want;
            if (o == 0) {
                want = 0;
                for (int q = 0; q < world; q++) want += input(q, i);
            } else if (o == 1) {
                want = input((int)(i / per), i);
            } else if (o == 2) {
                if (i / per != (size_t)r) continue;
                want = 0;
                for (int q = 0; q < world; q++) want += input(q, i);
            } else {
                want = input(world - 1, i);
            }
            if (h[i] != (float)want && wrong++ == 0)
                snprintf(detail, dn, "%s: element %zu is %g, expected %g", names[o], i, h[i], want);
        }
    }
    free(h);
    return h ? wrong : 1000;
}

/* 12 collectives started (more than NCCL_INFLIGHT), each from its own input to its own
 * output, then one comm_wait for the last ticket: every output must be there. */
static void check_split_phase(kctx *k, comm *c) {
    enum { N_OPS = 12, COUNT = 1 << 20 };
    errbuf err;
    float *dev = k_alloc(k, 2 * N_OPS * (size_t)COUNT * sizeof(float), &err);
    float *h = malloc((size_t)COUNT * sizeof *h);
    int ok = dev && h, wrong = 0;
    comm_ticket t = 0;
    for (int o = 0; o < N_OPS && ok; o++) {
        for (size_t i = 0; i < COUNT; i++) h[i] = input(o, i);
        k_copy_h2d(k, dev + (size_t)o * COUNT, h, (size_t)COUNT * sizeof *h);
        ok = k_sync(k, &err) == 0;
    }
    for (int o = 0; o < N_OPS && ok; o++) {
        float *in = dev + (size_t)o * COUNT, *out = dev + (size_t)(N_OPS + o) * COUNT;
        ok = (o % 3 == 0   ? comm_all_gather_start(c, in, out, COUNT, COMM_F32, &t, &err)
              : o % 3 == 1 ? comm_reduce_scatter_start(c, in, out, COUNT, COMM_F32, COMM_SUM, &t, &err)
                           : comm_all_reduce_start(c, in, COUNT, COMM_F32, COMM_SUM, &t, &err)) == 0;
    }
    if (ok) ok = comm_wait(c, t, &err) == 0;
    for (int o = 0; o < N_OPS && ok; o++) {
        float *res = dev + (size_t)((o % 3 == 2 ? 0 : N_OPS) + o) * COUNT;
        k_copy_d2h(k, h, res, (size_t)COUNT * sizeof *h);
        ok = k_sync(k, &err) == 0;
        for (size_t i = 0; i < COUNT && ok; i++) wrong += h[i] != input(o, i);
    }
    char detail[1100];
    snprintf(detail, sizeof detail, "%s%d wrong", ok ? "" : err.msg, wrong);
    check(ok && wrong == 0, "12 split-phase collectives, one wait", detail);
    free(h);
    if (dev) k_free(k, dev);
}

/* comm_busy_s on NCCL: the collectives' device time (events around each), plain and started:
 * more than nothing, and no more than the wall time they took. */
static void check_device_time(kctx *k, comm *c) {
    errbuf err;
    size_t n = 16u << 20; /* 64 MB of f32 */
    float *dev = k_alloc(k, n * sizeof(float), &err);
    double busy0 = comm_busy_s(c), t0 = now_s();
    int rc = dev ? 0 : -1;
    for (int i = 0; rc == 0 && i < 8; i++) rc = comm_all_reduce(c, dev, n, COMM_F32, COMM_SUM, &err);
    comm_ticket t = 0;
    for (int i = 0; rc == 0 && i < 12; i++) rc = comm_all_reduce_start(c, dev, n, COMM_F32, COMM_SUM, &t, &err);
    if (rc == 0) rc = comm_wait(c, t, &err);
    double wall = now_s() - t0, busy = comm_busy_s(c) - busy0;
    char detail[160];
    snprintf(detail, sizeof detail, "%.4f s of device time in %.4f s of wall time", busy, wall);
    check(rc == 0 && busy > 0 && busy <= wall * 1.01 + 1e-3, "nccl collectives' device time (comm_busy_s)", rc ? err.msg : detail);
    k_free(k, dev);
}

static void check_nccl_world1(void) {
    fprintf(stderr, "check_nccl: NCCL world 1...\n");
    kctx k;
    errbuf err;
    unsigned char id[COMM_NCCL_ID_BYTES];
    comm *c = NULL;
    comm_options opt = {.timeout_s = 30, .init_timeout_s = 60};
    char detail[1100] = "";
    int ok = kctx_init(&k, K_CUDA, 0, &err) == 0 && comm_nccl_make_id(id, &err) == 0 &&
             comm_nccl_init(&c, &opt, 0, 1, id, &k, &err) == 0;
    check(ok, "nccl init (world 1)", ok ? NULL : err.msg);
    if (!ok) return;
    check(run_collectives(&k, c, detail, sizeof detail) == 0, "nccl collectives on device buffers", detail);
    check(comm_barrier(c, &err) == 0, "nccl barrier", err.msg);
    check_split_phase(&k, c);
    check_device_time(&k, c);
    comm_destroy(c);

    /* The watchdog: the 2nd collective waits behind a spinning kernel. */
    opt.timeout_s = 3;
    ok = fault_configure("nccl_hang=2", &err) == 0 && comm_nccl_make_id(id, &err) == 0 &&
         comm_nccl_init(&c, &opt, 0, 1, id, &k, &err) == 0;
    check(ok, "nccl init for the watchdog test", ok ? NULL : err.msg);
    if (!ok) return;
    float *dev = k_alloc(&k, 1024 * sizeof(float), &err);
    int first = comm_all_reduce(c, dev, 1024, COMM_F32, COMM_SUM, &err);
    check(first == 0, "collective before the hang", first ? err.msg : NULL);
    double t0 = now_s();
    int rc = comm_all_reduce(c, dev, 1024, COMM_F32, COMM_SUM, &err);
    double took = now_s() - t0;
    snprintf(detail, sizeof detail, "%.2f s: %s", took, rc ? err.msg : "(succeeded)");
    check(rc != 0 && strstr(err.msg, "timed out") && took < opt.timeout_s + 2,
          "hung collective times out and aborts", detail);
    rc = comm_all_reduce(c, dev, 1024, COMM_F32, COMM_SUM, &err);
    check(rc != 0, "the aborted communicator refuses later calls", err.msg);
    comm_destroy(c);
    fault_configure(NULL, &err);
    /* The GPU must still work: the spinning kernel was released. */
    k_zero(&k, dev, 1024 * sizeof(float));
    rc = k_sync(&k, &err);
    check(rc == 0, "the GPU is usable after the abort", rc ? err.msg : NULL);

    /* The same for a started collective: comm_wait is where it times out. */
    ok = fault_configure("nccl_hang=1", &err) == 0 && comm_nccl_make_id(id, &err) == 0 &&
         comm_nccl_init(&c, &opt, 0, 1, id, &k, &err) == 0;
    comm_ticket t = 0;
    if (ok) ok = comm_all_gather_start(c, dev, dev, 1024, COMM_F32, &t, &err) == 0;
    check(ok, "split-phase start behind the hang returns", ok ? NULL : err.msg);
    if (ok) {
        t0 = now_s();
        rc = comm_wait(c, t, &err);
        took = now_s() - t0;
        snprintf(detail, sizeof detail, "%.2f s: %s", took, rc ? err.msg : "(succeeded)");
        check(rc != 0 && strstr(err.msg, "all_gather") && strstr(err.msg, "timed out") &&
                  took < opt.timeout_s + 2,
              "comm_wait on a hung collective times out", detail);
        comm_destroy(c);
        k_zero(&k, dev, 1024 * sizeof(float));
        rc = k_sync(&k, &err);
        check(rc == 0, "the GPU is usable after that abort", rc ? err.msg : NULL);
    }
    fault_configure(NULL, &err);
    k_free(&k, dev);
    kctx_destroy(&k);
}

/* One rank of the shared-GPU test, in its own process; exit status 0 = all right. */
static int shared_gpu_rank(int rank, const comm_rank_table *t, comm_listener *l) {
    kctx k;
    errbuf err;
    comm *c = NULL;
    comm_options opt = {.timeout_s = 30, .init_timeout_s = 30};
    memset(opt.secret, 7, sizeof opt.secret);
    if (kctx_init(&k, K_CUDA, 0, &err) || comm_init(&c, &opt, rank, t, l, &err) ||
        comm_stage_through_host(&c, &k, &err)) {
        fprintf(stderr, "rank %d: %s\n", rank, err.msg);
        return 1;
    }
    char detail[1100] = "";
    int wrong = run_collectives(&k, c, detail, sizeof detail);
    if (wrong) fprintf(stderr, "rank %d: %d wrong: %s\n", rank, wrong, detail);
    comm_destroy(c);
    kctx_destroy(&k);
    return wrong ? 1 : 0;
}

static void check_shared_gpu(int world) {
    fprintf(stderr, "check_nccl: %d ranks sharing the GPU...\n", world);
    comm_listener l[8];
    const char *addr[8];
    errbuf err;
    for (int r = 0; r < world; r++) {
        if (comm_tcp_listen(&l[r], "127.0.0.1", &err)) {
            check(0, "shared GPU: listen", err.msg);
            return;
        }
        addr[r] = l[r].addr;
    }
    comm_rank_table t = {.world = world, .addr = addr};
    pid_t pids[8];
    for (int r = 0; r < world; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            for (int q = 0; q < world; q++)
                if (q != r) comm_listener_close(&l[q]);
            _exit(shared_gpu_rank(r, &t, &l[r]));
        }
    }
    for (int r = 0; r < world; r++) comm_listener_close(&l[r]);
    int ok = 1;
    for (int r = 0; r < world; r++) {
        int status;
        ok &= waitpid(pids[r], &status, 0) == pids[r] && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    }
    char what[96];
    snprintf(what, sizeof what, "%d ranks on one GPU, TCP staged through pinned memory", world);
    check(ok, what, NULL);
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    /* First, before this process touches CUDA: forked children must not inherit a context. */
    check_shared_gpu(3);
    if (k_cuda_available() < 1) {
        fprintf(stderr, "check_nccl: no CUDA device visible\n");
        return 1;
    }
    check_nccl_world1();
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
