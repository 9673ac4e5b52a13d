/* comm (CPU backend over TCP): every collective against a reference, determinism, and the
 * failure modes (timeouts, a killed rank, comm_abort, strangers, leaks).
 *
 * Each multi-rank test forks one child per rank.  The parent makes every listener first,
 * so the rank table is known before the fork; a child closes the listeners that are not its
 * own, runs its part, and sends a report back through a pipe.  The parent waits with a
 * limit and SIGKILLs whatever is left, so a hang fails the test instead of the suite.
 * Children never call cmocka; they record the first failed check in their report. */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/fault.h"
#include "kernels/kernels.h"
#include "worker/comm.h"

#define MAX_PROCS 8
#define BIG_COUNT 262147 /* odd, prime: no world size divides it */

/* ---- the fork harness ------------------------------------------------------------------- */

typedef struct report {
    int ok;            /* every check of the child passed */
    char msg[512];     /* the first failed check */
    int call_failed;   /* fault tests: the collective under test returned -1 */
    double elapsed;    /* and how long it took, in seconds */
    char err[1024];    /* and its error message */
    uint64_t hash;     /* a digest of the results, compared across ranks */
} report;

typedef struct ranks {
    int world, nproc, nsets; /* children beyond `world` are outsiders (no rank) */
    comm_listener lis[2][MAX_PROCS];
    const char *addr[2][MAX_PROCS];
    comm_rank_table table[2]; /* two sets of listeners: two communicators in a row */
    comm_options opt;
    pid_t pid[MAX_PROCS];
    int rfd[MAX_PROCS];
    report rep[MAX_PROCS];
    int reported[MAX_PROCS];
    int status[MAX_PROCS];
} ranks;

typedef int (*child_fn)(ranks *j, int idx, void *arg, report *r);

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - floor(s)) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static int count_fds(void) {
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* Records the first failed check of a child; returns -1. */
static int fail_at(report *r, int line, const char *fmt, ...) {
    if (r->ok) {
        r->ok = 0;
        int n = snprintf(r->msg, sizeof r->msg, "line %d: ", line);
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->msg + n, sizeof r->msg - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return -1;
}
#define EXPECT(r, cond, ...)                                                                   \
    do {                                                                                       \
        if (!(cond)) return fail_at((r), __LINE__, __VA_ARGS__);                               \
    } while (0)

static void ranks_init(ranks *j, int world, int nproc, int nsets) {
    memset(j, 0, sizeof *j);
    j->world = world;
    j->nproc = nproc;
    j->nsets = nsets;
    errbuf err;
    for (int s = 0; s < nsets; s++) {
        for (int i = 0; i < nproc; i++) {
            if (comm_tcp_listen(&j->lis[s][i], "127.0.0.1", &err)) fail_msg("%s", err.msg);
            j->addr[s][i] = j->lis[s][i].addr;
        }
        j->table[s].world = world;
        j->table[s].addr = j->addr[s];
    }
    for (int i = 0; i < COMM_SECRET_BYTES; i++) j->opt.secret[i] = (unsigned char)(7 * i + 1);
    j->opt.timeout_s = 20;
    j->opt.init_timeout_s = 20;
}

static void child_main(ranks *j, int idx, child_fn fn, void *arg, int report_fd) {
    /* cmocka's crash handlers would longjmp back into the test runner, in the child. */
    signal(SIGSEGV, SIG_DFL);
    signal(SIGBUS, SIG_DFL);
    signal(SIGILL, SIG_DFL);
    signal(SIGFPE, SIG_DFL);
    signal(SIGABRT, SIG_DFL);
    for (int k = 0; k < idx; k++) close(j->rfd[k]);
    for (int s = 0; s < j->nsets; s++)
        for (int k = 0; k < j->nproc; k++)
            if (k != idx) comm_listener_close(&j->lis[s][k]);
    report r;
    memset(&r, 0, sizeof r);
    r.ok = 1;
    fn(j, idx, arg, &r);
    for (int s = 0; s < j->nsets; s++) comm_listener_close(&j->lis[s][idx]); /* if unused */
    ssize_t n = write(report_fd, &r, sizeof r); /* < PIPE_BUF: one piece */
    exit(n == (ssize_t)sizeof r ? 0 : 3); /* exit(), not _exit(): LeakSanitizer runs */
}

/* Reads the reports, SIGKILLs what is still running after limit_s, reaps everyone. */
static void ranks_collect(ranks *j, double limit_s) {
    double deadline = now_s() + limit_s;
    for (;;) {
        struct pollfd pf[MAX_PROCS];
        int who[MAX_PROCS], n = 0;
        for (int i = 0; i < j->nproc; i++)
            if (j->rfd[i] >= 0) {
                pf[n] = (struct pollfd){j->rfd[i], POLLIN, 0};
                who[n++] = i;
            }
        double left = deadline - now_s();
        if (n == 0 || left <= 0) break;
        if (poll(pf, (nfds_t)n, (int)(left * 1000) + 1) < 0 && errno != EINTR) break;
        for (int k = 0; k < n; k++) {
            if (!pf[k].revents) continue;
            int i = who[k];
            j->reported[i] = read(j->rfd[i], &j->rep[i], sizeof j->rep[i]) == sizeof j->rep[i];
            close(j->rfd[i]);
            j->rfd[i] = -1;
        }
    }
    for (int i = 0; i < j->nproc; i++) {
        if (j->rfd[i] >= 0) {
            kill(j->pid[i], SIGKILL);
            close(j->rfd[i]);
            j->rfd[i] = -1;
        }
        while (waitpid(j->pid[i], &j->status[i], 0) < 0 && errno == EINTR) {
        }
    }
}

static void ranks_run(ranks *j, child_fn fn, void *arg, double limit_s) {
    fflush(stdout);
    fflush(stderr);
    for (int i = 0; i < j->nproc; i++) {
        int p[2];
        assert_int_equal(pipe(p), 0);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            close(p[0]);
            child_main(j, i, fn, arg, p[1]);
        }
        close(p[1]);
        j->pid[i] = pid;
        j->rfd[i] = p[0];
    }
    for (int s = 0; s < j->nsets; s++)
        for (int i = 0; i < j->nproc; i++) comm_listener_close(&j->lis[s][i]);
    ranks_collect(j, limit_s);
}

/* Child i reported success and exited 0. */
static void expect_child_ok(const ranks *j, int i) {
    if (!j->reported[i]) fail_msg("child %d sent no report (wait status 0x%x)", i, j->status[i]);
    if (!j->rep[i].ok) fail_msg("child %d: %s", i, j->rep[i].msg);
    if (!WIFEXITED(j->status[i]) || WEXITSTATUS(j->status[i]) != 0)
        fail_msg("child %d ended with wait status 0x%x (sanitizer report?)", i, j->status[i]);
}

/* ---- data ------------------------------------------------------------------------------- */

static uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= UINT64_C(0xbf58476d1ce4e5b9);
    x ^= x >> 27;
    x *= UINT64_C(0x94d049bb133111eb);
    return x ^ (x >> 31);
}

/* Random bits for element i of rank's input in case `tag`: any rank can regenerate any
 * other rank's input. */
static uint64_t draw(uint64_t tag, int rank, size_t i) {
    return mix64(mix64(tag * UINT64_C(0x9e3779b97f4a7c15) + (uint64_t)rank + 1) ^
                 ((uint64_t)i + 1) * UINT64_C(0xd1b54a32d192ed03));
}

static float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint16_t f32_to_bf16(float f) { /* round to nearest even; no NaNs in these tests */
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* The reference inputs: f32 uniform in [-4, 4); bf16 small integers, so that sums are
 * exact in fp32 and the once-rounded result is known to the bit; bytes anything. */
static uint32_t value(comm_dtype dt, uint64_t tag, int rank, size_t i) {
    uint64_t x = draw(tag, rank, i);
    if (dt == COMM_F32) return f32_bits((float)((double)(x >> 11) * 0x1p-53 * 8.0 - 4.0));
    if (dt == COMM_BF16) return f32_to_bf16((float)((int)(x % 257) - 128));
    return (uint32_t)(x & 0xff);
}

static uint32_t get_raw(const void *buf, comm_dtype dt, size_t i) {
    if (dt == COMM_F32) return ((const uint32_t *)buf)[i];
    if (dt == COMM_BF16) return ((const uint16_t *)buf)[i];
    return ((const uint8_t *)buf)[i];
}

static void set_raw(void *buf, comm_dtype dt, size_t i, uint32_t v) {
    if (dt == COMM_F32)
        ((uint32_t *)buf)[i] = v;
    else if (dt == COMM_BF16)
        ((uint16_t *)buf)[i] = (uint16_t)v;
    else
        ((uint8_t *)buf)[i] = (uint8_t)v;
}

/* buf[0..n) = elements [off, off+n) of rank's input. */
static void gen(void *buf, comm_dtype dt, uint64_t tag, int rank, size_t off, size_t n) {
    for (size_t i = 0; i < n; i++) set_raw(buf, dt, i, value(dt, tag, rank, off + i));
}

static const char *dt_name(comm_dtype dt) {
    return dt == COMM_F32 ? "f32" : dt == COMM_BF16 ? "bf16" : "byte";
}

/* buf[0..n) equals elements [off, off+n) of rank's input, bit for bit. */
static int check_input(report *r, const char *what, const void *buf, comm_dtype dt,
                       uint64_t tag, int rank, size_t off, size_t n) {
    for (size_t i = 0; i < n; i++)
        EXPECT(r, get_raw(buf, dt, i) == value(dt, tag, rank, off + i),
               "%s %s count %zu: element %zu is not rank %d's", what, dt_name(dt), n, i, rank);
    return 0;
}

/* got[0..n) is the reduction over ranks of elements [off, off+n) of their inputs: f32 within
 * a tolerance (the order of the sum is the backend's), bf16 exactly round(sum) (the sums of
 * these inputs are exact in fp32, so rounding once leaves no choice). */
static int check_reduced(report *r, const char *what, const void *got, comm_dtype dt, comm_op op,
                         int world, uint64_t tag, size_t off, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (dt == COMM_F32) {
            double sum = 0, mag = 0;
            for (int q = 0; q < world; q++) {
                double v = bits_f32(value(dt, tag, q, off + i));
                sum += v;
                mag += fabs(v);
            }
            if (op == COMM_AVG) sum /= world, mag /= world;
            double g = ((const float *)got)[i];
            EXPECT(r, fabs(g - sum) <= 1e-6 * mag + 1e-30,
                   "%s f32 count %zu: element %zu is %.9g, expected %.9g", what, n, i, g, sum);
        } else {
            float sum = 0;
            for (int q = 0; q < world; q++) sum += bf16_to_f32((uint16_t)value(dt, tag, q, off + i));
            if (op == COMM_AVG) sum /= (float)world;
            uint16_t g = ((const uint16_t *)got)[i];
            EXPECT(r, g == f32_to_bf16(sum), "%s bf16 count %zu: element %zu is %g, expected %g",
                   what, n, i, bf16_to_f32(g), bf16_to_f32(f32_to_bf16(sum)));
        }
    }
    return 0;
}

/* ---- every collective against the reference -------------------------------------------- */

static int gather_cases(comm *c, report *r, size_t count, comm_dtype dt, uint64_t tag, char *a,
                        char *b) {
    int rank = comm_rank(c), world = comm_world(c);
    size_t es = comm_dtype_size(dt);
    errbuf err;
    gen(a, dt, tag, rank, 0, count);
    EXPECT(r, comm_all_gather(c, a, b, count, dt, &err) == 0, "%s", err.msg);
    for (int q = 0; q < world; q++)
        if (check_input(r, "all_gather", b + q * count * es, dt, tag, q, 0, count)) return -1;

    char *own = b + (size_t)rank * count * es; /* in place */
    gen(own, dt, tag + 1, rank, 0, count);
    EXPECT(r, comm_all_gather(c, own, b, count, dt, &err) == 0, "%s", err.msg);
    for (int q = 0; q < world; q++)
        if (check_input(r, "all_gather in place", b + q * count * es, dt, tag + 1, q, 0, count))
            return -1;

    /* Split phase, in place, as worker/fsdp.c prefetches; the ticket orders the calls. */
    comm_ticket t;
    gen(own, dt, tag + 3, rank, 0, count);
    EXPECT(r, comm_all_gather_start(c, own, b, count, dt, &t, &err) == 0, "%s", err.msg);
    EXPECT(r, t > 0, "ticket %llu", t);
    EXPECT(r, comm_wait(c, t, &err) == 0, "%s", err.msg);
    EXPECT(r, comm_wait(c, t, &err) == 0, "second wait: %s", err.msg);
    for (int q = 0; q < world; q++)
        if (check_input(r, "all_gather_start", b + q * count * es, dt, tag + 3, q, 0, count))
            return -1;

    int root = world - 1; /* not 0 once there is more than one rank */
    gen(a, dt, tag + 2, rank, 0, count);
    EXPECT(r, comm_broadcast(c, a, count, dt, root, &err) == 0, "%s", err.msg);
    return check_input(r, "broadcast", a, dt, tag + 2, root, 0, count);
}

static int reduce_cases(comm *c, report *r, size_t count, comm_dtype dt, uint64_t tag, char *a,
                        char *b) {
    int rank = comm_rank(c), world = comm_world(c);
    size_t es = comm_dtype_size(dt), mine = (size_t)rank * count;
    errbuf err;
    for (comm_op op = COMM_SUM; op <= COMM_AVG; op++) {
        uint64_t t = tag + 10 * op;
        gen(a, dt, t, rank, 0, (size_t)world * count);
        EXPECT(r, comm_reduce_scatter(c, a, b, count, dt, op, &err) == 0, "%s", err.msg);
        if (check_reduced(r, "reduce_scatter", b, dt, op, world, t, mine, count)) return -1;

        gen(a, dt, t + 1, rank, 0, (size_t)world * count); /* in place */
        EXPECT(r, comm_reduce_scatter(c, a, a + mine * es, count, dt, op, &err) == 0, "%s",
               err.msg);
        if (check_reduced(r, "reduce_scatter in place", a + mine * es, dt, op, world, t + 1, mine,
                          count))
            return -1;

        gen(a, dt, t + 2, rank, 0, count);
        EXPECT(r, comm_all_reduce(c, a, count, dt, op, &err) == 0, "%s", err.msg);
        if (check_reduced(r, "all_reduce", a, dt, op, world, t + 2, 0, count)) return -1;

        /* Split phase: two in flight, waited for by the later ticket alone. */
        comm_ticket t1, t2;
        gen(a, dt, t + 3, rank, 0, (size_t)world * count);
        gen(b, dt, t + 4, rank, 0, count);
        EXPECT(r, comm_reduce_scatter_start(c, a, a + mine * es, count, dt, op, &t1, &err) == 0,
               "%s", err.msg);
        EXPECT(r, comm_all_reduce_start(c, b, count, dt, op, &t2, &err) == 0, "%s", err.msg);
        EXPECT(r, t2 > t1, "tickets %llu then %llu", t1, t2);
        EXPECT(r, comm_wait(c, t2, &err) == 0, "%s", err.msg);
        if (check_reduced(r, "reduce_scatter_start", a + mine * es, dt, op, world, t + 3, mine,
                          count) ||
            check_reduced(r, "all_reduce_start", b, dt, op, world, t + 4, 0, count))
            return -1;
    }
    return 0;
}

/* arg != NULL: the communicator is wrapped by comm_stage_through_host over a CPU kernels
 * context, so every collective goes through the staging copies. */
static int collectives_child(ranks *j, int rank, void *arg, report *r) {
    static const size_t counts[] = {1, 7, 1001, BIG_COUNT};
    static const comm_dtype dts[] = {COMM_F32, COMM_BF16, COMM_BYTE};
    int fds = count_fds();
    errbuf err;
    comm *c;
    EXPECT(r, comm_init(&c, &j->opt, rank, &j->table[0], &j->lis[0][rank], &err) == 0, "%s",
           err.msg);
    kctx ctx;
    if (arg) {
        EXPECT(r, kctx_init(&ctx, K_CPU, 0, &err) == 0, "%s", err.msg);
        EXPECT(r, comm_stage_through_host(&c, &ctx, &err) == 0, "%s", err.msg);
    }
    EXPECT(r, comm_rank(c) == rank && comm_world(c) == j->world, "rank/world mismatch");
    size_t bytes = (size_t)j->world * BIG_COUNT * 4;
    char *a = malloc(bytes), *b = malloc(bytes);
    EXPECT(r, a && b, "out of memory");
    int rc = 0;
    for (int ci = 0; rc == 0 && ci < 4; ci++) {
        for (int di = 0; rc == 0 && di < 3; di++) {
            uint64_t tag = (uint64_t)(100 * ci + 1000 * di);
            rc = gather_cases(c, r, counts[ci], dts[di], tag, a, b);
            if (rc == 0 && dts[di] != COMM_BYTE)
                rc = reduce_cases(c, r, counts[ci], dts[di], tag + 50, a, b);
            if (rc == 0 && comm_barrier(c, &err)) rc = fail_at(r, __LINE__, "%s", err.msg);
        }
    }
    free(a);
    free(b);
    comm_destroy(c);
    if (arg) kctx_destroy(&ctx);
    if (rc) return rc;
    EXPECT(r, count_fds() == fds - 1, "%d fds open after comm_destroy, %d before (+ listener)",
           count_fds(), fds);
    return 0;
}

static void run_collectives_with(int world, void *staged) {
    int fds = count_fds();
    ranks j;
    ranks_init(&j, world, world, 1);
    ranks_run(&j, collectives_child, staged, 50);
    for (int i = 0; i < world; i++) expect_child_ok(&j, i);
    assert_int_equal(count_fds(), fds); /* the parent closed every listener and pipe */
}

static void run_collectives(int world) { run_collectives_with(world, NULL); }

static void test_collectives_world1(void **state) { (void)state; run_collectives(1); }
static void test_collectives_staged_world3(void **state) {
    (void)state;
    static int staged = 1;
    run_collectives_with(3, &staged);
}
static void test_collectives_world2(void **state) { (void)state; run_collectives(2); }
static void test_collectives_world3(void **state) { (void)state; run_collectives(3); }
static void test_collectives_world4(void **state) { (void)state; run_collectives(4); }
static void test_collectives_world5(void **state) { (void)state; run_collectives(5); }

/* ---- determinism -------------------------------------------------------------------------- */

/* Inputs whose sums depend on the order: magnitudes over 2^-10..2^10, bf16 not integers. */
static void gen_wide(void *buf, comm_dtype dt, int rank, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint64_t x = draw(77, rank, i);
        float f = (float)(((double)(x >> 11) * 0x1p-53 - 0.5) * ldexp(1, (int)(x % 21) - 10));
        set_raw(buf, dt, i, dt == COMM_F32 ? f32_bits(f) : f32_to_bf16(f));
    }
}

static uint64_t digest(const void *p, size_t n) {
    uint64_t h = UINT64_C(0xcbf29ce484222325);
    for (size_t i = 0; i < n; i++) h = (h ^ ((const uint8_t *)p)[i]) * UINT64_C(0x100000001b3);
    return h;
}

/* Runs the same all_reduces (f32, bf16) and reduce_scatter on two fresh communicators and
 * compares the bits. */
static int repeat_child(ranks *j, int rank, void *arg, report *r) {
    (void)arg;
    const size_t n = BIG_COUNT, f32_bytes = n * 4, bf16_bytes = n * 2, rs_bytes = n * 4;
    const size_t total = f32_bytes + bf16_bytes + rs_bytes;
    char *out[2] = {malloc(total), malloc(total)};
    float *rs_in = malloc((size_t)j->world * n * 4);
    EXPECT(r, out[0] && out[1] && rs_in, "out of memory");
    errbuf err;
    for (int s = 0; s < 2; s++) {
        comm *c;
        EXPECT(r, comm_init(&c, &j->opt, rank, &j->table[s], &j->lis[s][rank], &err) == 0, "%s",
               err.msg);
        char *f32 = out[s], *rs = f32 + f32_bytes, *bf16 = rs + rs_bytes; /* aligned */
        gen_wide(f32, COMM_F32, rank, n);
        gen_wide(bf16, COMM_BF16, rank, n);
        gen_wide(rs_in, COMM_F32, rank, (size_t)j->world * n);
        int rc = comm_all_reduce(c, f32, n, COMM_F32, COMM_SUM, &err) ||
                 comm_all_reduce(c, bf16, n, COMM_BF16, COMM_AVG, &err) ||
                 comm_reduce_scatter(c, rs_in, rs, n, COMM_F32, COMM_SUM, &err);
        comm_destroy(c);
        EXPECT(r, rc == 0, "%s", err.msg);
    }
    EXPECT(r, memcmp(out[0], out[1], total) == 0, "two runs gave different bits");
    /* The all_reduce results: the same on every rank. */
    r->hash = digest(out[0], f32_bytes) ^ digest(out[0] + f32_bytes + rs_bytes, bf16_bytes);
    free(out[0]);
    free(out[1]);
    free(rs_in);
    return 0;
}

static void test_repeated_runs_same_bits(void **state) {
    (void)state;
    ranks j;
    ranks_init(&j, 4, 4, 2);
    ranks_run(&j, repeat_child, NULL, 30);
    for (int i = 0; i < 4; i++) expect_child_ok(&j, i);
    for (int i = 1; i < 4; i++) assert_true(j.rep[i].hash == j.rep[0].hash);
}

/* ---- faults ----------------------------------------------------------------------------- */

/* Runs `calls` (a barrier, then all_reduces of count floats) until one fails; records the
 * failed call's error and duration. */
static int run_until_failure(comm *c, int calls, size_t count, report *r) {
    float *buf = calloc(count, sizeof *buf);
    EXPECT(r, buf, "out of memory");
    errbuf err;
    int rc = comm_barrier(c, &err);
    for (int i = 0; rc == 0 && i < calls; i++) {
        double t0 = now_s();
        rc = comm_all_reduce(c, buf, count, COMM_F32, COMM_SUM, &err);
        r->elapsed = now_s() - t0;
    }
    free(buf);
    if (rc == 0) return 0;
    r->call_failed = 1;
    snprintf(r->err, sizeof r->err, "%s", err.msg);
    /* Dead from now on: the next call fails at once. */
    double t0 = now_s();
    EXPECT(r, comm_barrier(c, &err) != 0 && strstr(err.msg, "dead") && now_s() - t0 < 0.1,
           "a call after the failure did not fail at once: %s", err.msg);
    return 0;
}

static int stall_child(ranks *j, int rank, void *arg, report *r) {
    (void)arg;
    errbuf err;
    EXPECT(r, fault_configure("comm_stall=1:2:4", &err) == 0, "%s", err.msg); /* rank 1 sleeps 4 s before its 2nd call */
    comm *c;
    EXPECT(r, comm_init(&c, &j->opt, rank, &j->table[0], &j->lis[0][rank], &err) == 0, "%s",
           err.msg);
    int rc = run_until_failure(c, 1, 1001, r);
    comm_destroy(c);
    return rc;
}

static void test_stalled_rank_times_out(void **state) {
    (void)state;
    ranks j;
    ranks_init(&j, 3, 3, 1);
    j.opt.timeout_s = 2;
    ranks_run(&j, stall_child, NULL, 30);
    for (int i = 0; i < 3; i++) {
        expect_child_ok(&j, i);
        const report *r = &j.rep[i];
        print_message("rank %d: %.2f s: %s\n", i, r->elapsed, r->err);
        assert_true(r->call_failed);
        assert_non_null(strstr(r->err, "all_reduce"));
        if (i == 1) { /* the sleeper: its call starts after the others gave up */
            assert_true(r->elapsed < 4 + 1.5);
        } else {
            assert_true(r->elapsed >= 1.9 && r->elapsed <= 2 + 2);
        }
    }
    /* Rank 2 waits on rank 1's data: its own timeout, naming rank 1. */
    assert_non_null(strstr(j.rep[2].err, "timed out after 2 s"));
    assert_non_null(strstr(j.rep[2].err, "rank 1"));
}

static void *kill_self_soon(void *arg) {
    (void)arg;
    sleep_s(0.02);
    kill(getpid(), SIGKILL);
    return NULL;
}

#define KILLED 2

static int killed_child(ranks *j, int rank, void *arg, report *r) {
    (void)arg;
    const size_t count = (size_t)1 << 21; /* 8 MB per all_reduce */
    errbuf err;
    comm *c;
    EXPECT(r, comm_init(&c, &j->opt, rank, &j->table[0], &j->lis[0][rank], &err) == 0, "%s",
           err.msg);
    if (rank == KILLED) { /* the same calls as the others, until it dies in one of them */
        float *buf = calloc(count, sizeof *buf);
        EXPECT(r, buf, "out of memory");
        EXPECT(r, comm_barrier(c, &err) == 0, "%s", err.msg);
        EXPECT(r, comm_all_reduce(c, buf, count, COMM_F32, COMM_SUM, &err) == 0, "%s", err.msg);
        pthread_t th;
        EXPECT(r, pthread_create(&th, NULL, kill_self_soon, NULL) == 0, "pthread_create");
        for (;;) (void)comm_all_reduce(c, buf, count, COMM_F32, COMM_SUM, &err);
    }
    int rc = run_until_failure(c, 1000, count, r);
    comm_destroy(c);
    return rc;
}

static void test_killed_rank_fails_fast(void **state) {
    (void)state;
    ranks j;
    ranks_init(&j, 4, 4, 1);
    j.opt.timeout_s = 30;
    ranks_run(&j, killed_child, NULL, 40);
    assert_true(WIFSIGNALED(j.status[KILLED]) && WTERMSIG(j.status[KILLED]) == SIGKILL);
    for (int i = 0; i < 4; i++) {
        if (i == KILLED) continue;
        expect_child_ok(&j, i);
        const report *r = &j.rep[i];
        print_message("rank %d: %.2f s: %s\n", i, r->elapsed, r->err);
        assert_true(r->call_failed);
        assert_non_null(strstr(r->err, "all_reduce"));
        assert_true(r->elapsed < 3); /* the timeout is 30 s */
    }
    /* A neighbour of the killed rank names it: rank 3 receives from it, rank 1 sends to it.
     * Which closure each rank sees first is a race (rank 1's failure closes its sockets, so
     * rank 0 fails and closes, and rank 3 may see rank 0 go before rank 2): one CI run under
     * ASan had rank 3 name rank 0 while rank 1 named rank 2. */
    assert_true(strstr(j.rep[1].err, "rank 2") || strstr(j.rep[3].err, "rank 2"));
}

static void *abort_soon(void *arg) {
    sleep_s(0.3);
    comm_abort(arg);
    return NULL;
}

/* Rank 0 comes late; meanwhile a watchdog thread of rank 1 aborts its communicator in the
 * middle of a barrier.  Rank 1 returns at once, rank 2 hears of it, rank 0 finds out as
 * soon as it arrives: nobody waits for the 20 s timeout. */
static int abort_child(ranks *j, int rank, void *arg, report *r) {
    (void)arg;
    errbuf err;
    comm *c;
    EXPECT(r, comm_init(&c, &j->opt, rank, &j->table[0], &j->lis[0][rank], &err) == 0, "%s",
           err.msg);
    pthread_t th;
    if (rank == 0) sleep_s(1.5);
    if (rank == 1) EXPECT(r, pthread_create(&th, NULL, abort_soon, c) == 0, "pthread_create");
    double t0 = now_s();
    int rc = comm_barrier(c, &err);
    r->elapsed = now_s() - t0;
    if (rank == 1) EXPECT(r, pthread_join(th, NULL) == 0, "pthread_join");
    r->call_failed = rc != 0;
    snprintf(r->err, sizeof r->err, "%s", err.msg);
    rc = comm_all_reduce(c, NULL, 0, COMM_F32, COMM_SUM, &err); /* dead: fails at once */
    EXPECT(r, rc != 0, "a call after the abort succeeded");
    comm_destroy(c);
    return 0;
}

static void test_abort_wakes_everyone(void **state) {
    (void)state;
    ranks j;
    ranks_init(&j, 3, 3, 1);
    ranks_run(&j, abort_child, NULL, 30);
    for (int i = 0; i < 3; i++) {
        expect_child_ok(&j, i);
        print_message("rank %d: %.2f s: %s\n", i, j.rep[i].elapsed, j.rep[i].err);
        assert_true(j.rep[i].call_failed);
        assert_non_null(strstr(j.rep[i].err, "barrier"));
        assert_null(strstr(j.rep[i].err, "timed out"));
        assert_true(j.rep[i].elapsed < 1.5);
    }
    assert_non_null(strstr(j.rep[1].err, "aborted"));
}

/* Rank 2 leaves after a barrier; rank 1 then waits in a broadcast for the root, which is
 * late (stalled 2 s): rank 1 must notice at once that the rank it forwards to is gone. */
static int dead_next_child(ranks *j, int rank, void *arg, report *r) {
    (void)arg;
    errbuf err;
    EXPECT(r, fault_configure("comm_stall=0:2:2", &err) == 0, "%s", err.msg);
    comm *c;
    EXPECT(r, comm_init(&c, &j->opt, rank, &j->table[0], &j->lis[0][rank], &err) == 0, "%s",
           err.msg);
    int rc = comm_barrier(c, &err);
    if (rc == 0 && rank == 2) {
        comm_destroy(c);
        return 0;
    }
    char buf[1000] = {0};
    double t0 = now_s();
    if (rc == 0) rc = comm_broadcast(c, buf, sizeof buf, COMM_BYTE, 0, &err);
    r->elapsed = now_s() - t0;
    r->call_failed = rc != 0;
    snprintf(r->err, sizeof r->err, "%s", err.msg);
    comm_destroy(c);
    return 0;
}

static void test_dead_next_noticed_while_waiting(void **state) {
    (void)state;
    ranks j;
    ranks_init(&j, 3, 3, 1);
    ranks_run(&j, dead_next_child, NULL, 30);
    for (int i = 0; i < 3; i++) expect_child_ok(&j, i);
    print_message("rank 1: %.2f s: %s\n", j.rep[1].elapsed, j.rep[1].err);
    assert_true(j.rep[1].call_failed);
    assert_non_null(strstr(j.rep[1].err, "broadcast: rank 2 closed the connection"));
    assert_true(j.rep[1].elapsed < 1);
    assert_true(j.rep[0].call_failed); /* the root, once it comes */
}

/* ---- no leak over many calls ------------------------------------------------------------ */

static int many_child(ranks *j, int rank, void *arg, report *r) {
    (void)arg;
    int world = j->world, fds = count_fds();
    errbuf err;
    comm *c;
    EXPECT(r, comm_init(&c, &j->opt, rank, &j->table[0], &j->lis[0][rank], &err) == 0, "%s",
           err.msg);
    float *buf = malloc(BIG_COUNT * sizeof *buf);
    EXPECT(r, buf, "out of memory");
    int rc = 0;
    for (int it = 0; rc == 0 && it < 2050; it++) {
        size_t n = it < 2000 ? 7 : BIG_COUNT;
        for (size_t i = 0; i < n; i++) buf[i] = (float)(rank + it + (int)i % 3);
        if (comm_all_reduce(c, buf, n, COMM_F32, COMM_SUM, &err)) {
            rc = fail_at(r, __LINE__, "call %d: %s", it, err.msg);
            break;
        }
        for (size_t i = 0; rc == 0 && i < n; i++) /* small integers: exact */
            if (buf[i] != (float)(world * (world - 1) / 2 + world * (it + (int)i % 3)))
                rc = fail_at(r, __LINE__, "call %d: element %zu is %g", it, i, buf[i]);
    }
    free(buf);
    comm_destroy(c);
    if (rc) return rc;
    EXPECT(r, count_fds() == fds - 1, "%d fds open after comm_destroy, %d before (+ listener)",
           count_fds(), fds);
    return 0;
}

static void test_many_collectives_no_leak(void **state) {
    (void)state;
    int fds = count_fds();
    ranks j;
    ranks_init(&j, 3, 3, 1);
    ranks_run(&j, many_child, NULL, 50);
    for (int i = 0; i < 3; i++) expect_child_ok(&j, i);
    assert_int_equal(count_fds(), fds);
}

/* ---- progress (the hung-rank locator's figures) ------------------------------------------ */

/* Each rank: a plain all_reduce (no unit), a split all_gather of unit 7 waited for; the
 * progress follows: started as each begins, finished as each completes. */
static int progress_child(ranks *j, int idx, void *arg, report *r) {
    (void)arg;
    errbuf err;
    comm *c;
    comm_progress p = {0};
    comm_options opt = j->opt;
    opt.progress = &p;
    EXPECT(r, comm_init(&c, &opt, idx, &j->table[0], &j->lis[0][idx], &err) == 0, "%s", err.msg);
    float x[6] = {1, 2, 3, 4, 5, 6}, all[12];
    int rc = comm_all_reduce(c, x, 6, COMM_F32, COMM_SUM, &err);
    EXPECT(r, rc == 0, "%s", err.msg);
    EXPECT(r, atomic_load(&p.started) == 1 && atomic_load(&p.finished) == 1 && atomic_load(&p.unit) == -1 &&
                  atomic_load(&p.op) == COMM_COLL_ALL_REDUCE, "after the all_reduce: %llu %llu",
           (unsigned long long)atomic_load(&p.started), (unsigned long long)atomic_load(&p.finished));
    comm_set_unit(c, 7);
    comm_ticket t;
    EXPECT(r, comm_all_gather_start(c, x, all, 6, COMM_F32, &t, &err) == 0, "%s", err.msg);
    EXPECT(r, atomic_load(&p.started) == 2 && atomic_load(&p.unit) == 7 && atomic_load(&p.op) == COMM_COLL_ALL_GATHER,
           "the all_gather did not start as #2 of unit 7");
    EXPECT(r, comm_wait(c, t, &err) == 0, "%s", err.msg);
    EXPECT(r, atomic_load(&p.finished) == 2, "the all_gather's wait did not finish #2");
    EXPECT(r, !strcmp(comm_coll_name(COMM_COLL_REDUCE_SCATTER), "reduce_scatter"), "names");
    comm_destroy(c);
    return 0;
}

static void test_progress(void **state) {
    (void)state;
    ranks j;
    ranks_init(&j, 2, 2, 1);
    ranks_run(&j, progress_child, NULL, 20);
    for (int i = 0; i < 2; i++) expect_child_ok(&j, i);
}

/* ---- strangers ------------------------------------------------------------------------ */

static int raw_connect(const char *addr) {
    char host[64];
    const char *colon = strrchr(addr, ':');
    if (!colon || (size_t)(colon - addr) >= sizeof host) return -1;
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = '\0';
    struct addrinfo hints = {0}, *res;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, colon + 1, &hints, &res)) return -1;
    int fd = socket(res->ai_family, SOCK_STREAM, 0);
    if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen)) {
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    return fd;
}

/* Child 3 is an outsider: it opens a silent connection and a garbage one to the ranks'
 * listeners, then tries to join as rank 0 with the wrong secret.  Rank 0 arrives late, so
 * that rank 1 meets the impostor first. */
static int secret_child(ranks *j, int idx, void *arg, report *r) {
    (void)arg;
    errbuf err;
    comm *c;
    if (idx == 3) {
        int silent = raw_connect(j->addr[0][1]), junk = raw_connect(j->addr[0][2]);
        EXPECT(r, silent >= 0 && junk >= 0, "raw connect failed");
        char garbage[200];
        memset(garbage, 'x', sizeof garbage);
        EXPECT(r, send(junk, garbage, sizeof garbage, MSG_NOSIGNAL) == (ssize_t)sizeof garbage,
               "send");
        comm_options wrong = j->opt;
        wrong.secret[5] ^= 1;
        double t0 = now_s();
        EXPECT(r, comm_init(&c, &wrong, 0, &j->table[0], &j->lis[0][3], &err) != 0,
               "the impostor got in");
        r->elapsed = now_s() - t0;
        snprintf(r->err, sizeof r->err, "%s", err.msg);
        sleep_s(1); /* keep the silent connection open while the others set up */
        close(silent);
        close(junk);
        return 0;
    }
    if (idx == 0) sleep_s(0.5);
    EXPECT(r, comm_init(&c, &j->opt, idx, &j->table[0], &j->lis[0][idx], &err) == 0, "%s",
           err.msg);
    float x[5] = {(float)idx, 1, 2, 3, 4};
    int rc = comm_all_reduce(c, x, 5, COMM_F32, COMM_SUM, &err);
    comm_destroy(c);
    EXPECT(r, rc == 0, "%s", err.msg);
    EXPECT(r, x[0] == 3 && x[4] == 12, "wrong sum %g %g", x[0], x[4]);
    return 0;
}

static void test_wrong_secret_refused(void **state) {
    (void)state;
    ranks j;
    ranks_init(&j, 3, 4, 1);
    ranks_run(&j, secret_child, NULL, 30);
    for (int i = 0; i < 4; i++) expect_child_ok(&j, i);
    print_message("impostor: %.2f s: %s\n", j.rep[3].elapsed, j.rep[3].err);
    assert_non_null(strstr(j.rep[3].err, "rank 1"));
    assert_non_null(strstr(j.rep[3].err, "wrong job secret"));
    assert_true(j.rep[3].elapsed < 3); /* refused, not timed out (20 s) */
}

/* Rank 0 of 2 in a thread of the test, with init_timeout_s = 1. */
typedef struct lone_rank {
    ranks *j;
    int rc;
    errbuf err;
} lone_rank;

static void *lone_rank_main(void *arg) {
    lone_rank *l = arg;
    comm *c = NULL;
    l->rc = comm_init(&c, &l->j->opt, 0, &l->j->table[0], &l->j->lis[0][0], &l->err);
    comm_destroy(c);
    return NULL;
}

/* An eavesdropper posing as rank 1 records all that rank 0 sends it until rank 0 gives up:
 * the job secret is not in it (the handshake proves the secret, it does not send it). */
static void test_secret_never_sent(void **state) {
    (void)state;
    ranks j;
    ranks_init(&j, 2, 2, 1);
    j.opt.init_timeout_s = 1;
    lone_rank l = {&j, 0, {""}};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, lone_rank_main, &l), 0);
    struct pollfd p = {j.lis[0][1].fd, POLLIN, 0};
    assert_int_equal(poll(&p, 1, 5000), 1);
    int fd = accept(j.lis[0][1].fd, NULL, NULL);
    assert_true(fd >= 0);
    unsigned char heard[4096];
    size_t got = 0;
    ssize_t n;
    while (got < sizeof heard && (n = recv(fd, heard + got, sizeof heard - got, 0)) > 0)
        got += (size_t)n; /* ends when rank 0 times out and closes */
    assert_int_equal(pthread_join(t, NULL), 0);
    close(fd);
    comm_listener_close(&j.lis[0][1]);
    assert_int_not_equal(l.rc, 0);
    assert_true(got >= 8); /* it did speak */
    assert_null(memmem(heard, got, j.opt.secret, 8));
}

/* ---- single process: arguments, dead state, listener ------------------------------------ */

static comm *world1(void) {
    comm_options opt = {.timeout_s = 5, .init_timeout_s = 5};
    const char *addr[1] = {"127.0.0.1:1"};
    comm_rank_table table = {1, addr};
    comm *c = NULL;
    errbuf err;
    if (comm_init(&c, &opt, 0, &table, NULL, &err)) fail_msg("%s", err.msg);
    return c;
}

static void test_bad_arguments_kill_the_communicator(void **state) {
    (void)state;
    errbuf err;
    uint8_t bytes[4] = {1, 2, 3, 4};
    comm *c = world1();
    assert_int_equal(comm_all_reduce(c, bytes, 4, COMM_BYTE, COMM_SUM, &err), -1);
    assert_non_null(strstr(err.msg, "all_reduce"));
    assert_non_null(strstr(err.msg, "cannot be reduced"));
    assert_int_equal(comm_barrier(c, &err), -1);
    assert_non_null(strstr(err.msg, "dead"));
    assert_non_null(strstr(err.msg, "cannot be reduced")); /* why it died */
    comm_destroy(c);

    c = world1();
    assert_int_equal(comm_broadcast(c, bytes, 4, COMM_BYTE, 1, &err), -1);
    assert_non_null(strstr(err.msg, "root 1"));
    comm_destroy(c);

    c = world1();
    assert_int_equal(comm_all_gather(c, NULL, bytes, 4, COMM_BYTE, &err), -1);
    assert_non_null(strstr(err.msg, "NULL"));
    comm_destroy(c);

    c = world1();
    assert_int_equal(comm_all_gather(c, bytes, bytes, SIZE_MAX / 4, COMM_F32, &err), -1);
    assert_non_null(strstr(err.msg, "too large"));
    comm_destroy(c);

    c = world1();
    assert_int_equal(comm_all_gather(c, bytes, bytes, 4, (comm_dtype)9, &err), -1);
    assert_non_null(strstr(err.msg, "dtype"));
    comm_destroy(c);

    c = world1();
    comm_abort(c);
    assert_int_equal(comm_barrier(c, &err), -1);
    assert_non_null(strstr(err.msg, "aborted"));
    assert_int_equal(comm_wait(c, 1, &err), -1);
    assert_non_null(strstr(err.msg, "aborted"));
    comm_destroy(c);
    comm_destroy(NULL);

    c = world1();
    comm_ticket t;
    assert_int_equal(comm_wait(c, 5, &err), -1);
    assert_non_null(strstr(err.msg, "never started"));
    assert_int_equal(comm_all_reduce_start(c, bytes, 4, COMM_BYTE, COMM_SUM, &t, &err), -1);
    assert_non_null(strstr(err.msg, "cannot be reduced"));
    assert_int_equal(comm_wait(c, t, &err), -1); /* the communicator died with the bad call */
    assert_non_null(strstr(err.msg, "dead"));
    comm_destroy(c);
}

static void test_bad_init(void **state) {
    (void)state;
    errbuf err;
    static char sentinel;
    comm *c = (comm *)&sentinel; /* must come back NULL */
    comm_listener l;
    assert_int_equal(comm_tcp_listen(&l, "127.0.0.1", &err), 0);
    const char *addr[2] = {l.addr, l.addr};
    comm_rank_table table = {2, addr};
    comm_options opt = {.timeout_s = 5, .init_timeout_s = 5};
    assert_int_equal(comm_init(&c, &opt, 2, &table, &l, &err), -1);
    assert_non_null(strstr(err.msg, "rank 2"));
    assert_null(c);
    assert_int_equal(l.fd, -1); /* closed on failure too */

    assert_int_equal(comm_tcp_listen(&l, "127.0.0.1", &err), 0);
    opt.timeout_s = 0;
    assert_int_equal(comm_init(&c, &opt, 0, &table, &l, &err), -1);
    assert_non_null(strstr(err.msg, "timeout_s"));
    assert_int_equal(l.fd, -1);

    /* Nobody listens at rank 1's address: retried until the deadline, then named. */
    assert_int_equal(comm_tcp_listen(&l, "127.0.0.1", &err), 0);
    comm_listener gone;
    assert_int_equal(comm_tcp_listen(&gone, "127.0.0.1", &err), 0);
    addr[1] = gone.addr;
    comm_listener_close(&gone);
    opt.timeout_s = 5;
    opt.init_timeout_s = 0.5;
    double t0 = now_s();
    assert_int_equal(comm_init(&c, &opt, 0, &table, &l, &err), -1);
    assert_true(now_s() - t0 < 2);
    assert_non_null(strstr(err.msg, "could not connect to rank 1"));
}

static void test_listen(void **state) {
    (void)state;
    errbuf err;
    comm_listener l;
    assert_int_equal(comm_tcp_listen(&l, "127.0.0.1", &err), 0);
    assert_true(l.fd >= 0);
    assert_int_equal(strncmp(l.addr, "127.0.0.1:", 10), 0);
    assert_true(atoi(l.addr + 10) > 0);
    comm_listener_close(&l);
    assert_int_equal(l.fd, -1);
    comm_listener_close(&l); /* twice is fine */

    assert_int_equal(comm_tcp_listen(&l, "0.0.0.0", &err), -1);
    assert_non_null(strstr(err.msg, "wildcard"));
    assert_int_equal(l.fd, -1);
    assert_int_equal(comm_tcp_listen(&l, "192.0.2.1", &err), -1); /* not an address of ours */
    assert_non_null(strstr(err.msg, "192.0.2.1"));
    if (comm_tcp_listen(&l, "::1", &err) == 0) { /* where IPv6 is configured */
        assert_int_equal(strncmp(l.addr, "[::1]:", 6), 0);
        comm_listener_close(&l);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_listen),
        cmocka_unit_test(test_bad_init),
        cmocka_unit_test(test_bad_arguments_kill_the_communicator),
        cmocka_unit_test(test_collectives_world1),
        cmocka_unit_test(test_collectives_staged_world3),
        cmocka_unit_test(test_collectives_world2),
        cmocka_unit_test(test_collectives_world3),
        cmocka_unit_test(test_collectives_world4),
        cmocka_unit_test(test_collectives_world5),
        cmocka_unit_test(test_repeated_runs_same_bits),
        cmocka_unit_test(test_many_collectives_no_leak),
        cmocka_unit_test(test_progress),
        cmocka_unit_test(test_wrong_secret_refused),
        cmocka_unit_test(test_secret_never_sent),
        cmocka_unit_test(test_abort_wakes_everyone),
        cmocka_unit_test(test_dead_next_noticed_while_waiting),
        cmocka_unit_test(test_stalled_rank_times_out),
        cmocka_unit_test(test_killed_rank_fails_fast),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
