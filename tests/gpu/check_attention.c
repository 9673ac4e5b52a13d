/* check_attention: the CUDA attention op of kernels.h (causal, grouped-query heads; forward
 * and backward) against the CPU reference; with --bench, its speed at Llama shapes.
 *
 * Checks: fresh random inputs (fixed seeds) rounded to bf16, so both sides see the same values;
 * the backward of both sides gets the CPU forward's output (rounded to bf16) and lse.  GPU
 * outputs are poisoned (every bit set: NaN) before each run; any NaN fails.  The error is
 * ||gpu - cpu|| / ||cpu|| over a whole tensor: at most 2e-2 for out, dq, dk and dv (bf16
 * storage, bf16 probabilities in the products), and for the lse 1e-3 (or every element within
 * 1e-2).  Shapes: T = 1, 17, 300, 2048, 4097; head dim 64 and 128; Llama-2-7B (32 heads),
 * 70B (64 query heads, 8 kv heads) and GQA 8:1 and 3:1; packed rows (varlen, k_docs) of
 * documents of 1, 17, 300 and 2047 tokens mixed in every row (each row rotated, so its
 * boundaries differ), GQA 4:1 and 3:1, head dims 128, 64 and the plain path's 32; the CPU
 * reference gets the same documents.  Determinism: the same inputs twice
 * give the same bits.  Bad arguments fail the context with a message, and a bad
 * FSDP_CUDA_ATTENTION fails a context's set-up.  On a compute capability 9.0 device the
 * checks run the sm_90a kernels, with FSDP_CUDA_ATTENTION=mma the mma.sync ones (the first
 * line says which).  One line per check; the
 * last line is "N passed, N failed"; exit status 1 on any failure.
 *
 * The CPU reference is O(T^2) in double, so it runs one query head per task on every core
 * (dK and dV, which sum over the heads of a group, are summed afterwards in a fixed order).
 *
 * --quick: the small shapes only (for compute-sanitizer).  --cpu: the CPU backend stands in
 * for CUDA (a test of this program on any machine; the quick shapes).
 * --stress [CACHE T]: random document layouts at Llama-1.1B, 7B and 70B shapes (or the packed
 * rows of a token cache, 8 at a time), the sm_90a kernels beside the mma.sync ones.  In every
 * mode, kernels that do not finish within 60 s are a failure (exit 3, naming the check).
 * --bench [MODEL T]: forward, backward and forward+backward at Llama-2-7B and 70B shapes, the
 * median of 10 timed runs (CUDA events, after 3 warm-up runs) on random data; then packed rows
 * (one document a row, which costs what the unpacked row does plus the varlen masking, and
 * documents of 1024 and 512 tokens).  With MODEL and T, only the rows of that model and
 * length (for a profiler: `ncu ... check_attention --bench 70B 2048`).  FLOPs of the causal
 * forward: 4 B Hq T^2 hd / 2 (two products, half the scores); backward 2.5x that (five
 * products); forward+backward 3.5x. */
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime.h>

#include "data/rows.h"
#include "kernels/kernels.h"
#include "proto/tokens.h"

#define TOL_BF16 2e-2
#define DETERMINISM_RUNS 10 /* runs after the first that must give its bits */
#define TOL_LSE_REL 1e-3
#define TOL_LSE_ABS 1e-2

static kctx gpu;
/* On an sm_90 device: a second context with FSDP_CUDA_ATTENTION=mma (the mma.sync kernels),
 * whose backward every case is also compared with. */
static kctx mma;
static int have_mma;
static size_t esize; /* k_compute_size(&gpu): 2 (bf16) on CUDA, 4 with --cpu */
static int n_passed, n_failed;
static double reference_seconds;

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "check_attention: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(2);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- random numbers (xorshift64*), bf16 rounding ---- */

static uint64_t rng_state = 1;

static void seed(uint64_t s) {
    rng_state = s * 0x9E3779B97F4A7C15ULL + 1;
}

static float frand(void) { /* uniform in [-1, 1) */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    uint64_t r = rng_state * 0x2545F4914F6CDD1DULL;
    return (float)((double)(r >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static uint16_t bf16_bits(float f) { /* round to nearest even */
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static float bf16_value(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static float round_bf16(float f) {
    return bf16_value(bf16_bits(f));
}

/* ---- host and device buffers of one check, released together ---- */

#define MAX_ALLOCS 64
static void *host_allocs[MAX_ALLOCS], *dev_allocs[MAX_ALLOCS];
static int n_host, n_dev;

static float *hfloats(size_t n) {
    if (n_host == MAX_ALLOCS) die("too many host allocations in one check");
    float *p = calloc(n ? n : 1, sizeof(float));
    if (!p) die("out of host memory (%zu floats)", n);
    return host_allocs[n_host++] = p;
}

/* int32 host memory, zeroed, released with the check's other buffers (4-byte slots). */
static int32_t *hints(size_t n) {
    return (int32_t *)hfloats(n);
}

/* scale * U(-1, 1), rounded to bf16 */
static float *hrandom(size_t n, float scale) {
    float *p = hfloats(n);
    for (size_t i = 0; i < n; i++) p[i] = round_bf16(scale * frand());
    return p;
}

static void *dev_bytes(size_t bytes) {
    if (n_dev == MAX_ALLOCS) die("too many device allocations in one check");
    errbuf err;
    void *p = k_alloc(&gpu, bytes, &err);
    if (!p) die("%s", err.msg);
    return dev_allocs[n_dev++] = p;
}

static void release_all(void) {
    for (int i = 0; i < n_host; i++) free(host_allocs[i]);
    for (int i = 0; i < n_dev; i++) k_free(&gpu, dev_allocs[i]);
    n_host = n_dev = 0;
}

/* Host values (already bf16 values) into a compute-dtype device buffer. */
static void put_comp(void *dev, const float *host, size_t n) {
    if (esize == sizeof(float)) {
        k_copy_h2d(&gpu, dev, host, n * sizeof(float));
        return;
    }
    uint16_t *bits = malloc(n * sizeof *bits + 1);
    if (!bits) die("out of host memory");
    for (size_t i = 0; i < n; i++) bits[i] = bf16_bits(host[i]);
    k_copy_h2d(&gpu, dev, bits, n * sizeof *bits); /* pageable: consumed on return */
    free(bits);
}

static void *dcomp(const float *host, size_t n) {
    void *d = dev_bytes(n * esize);
    put_comp(d, host, n);
    return d;
}

static float *df32(const float *host, size_t n) {
    float *d = dev_bytes(n * sizeof(float));
    k_copy_h2d(&gpu, d, host, n * sizeof(float));
    return d;
}

/* Every bit set: NaN as bf16 and as fp32. */
static void poison(void *dev, size_t bytes) {
    static unsigned char *ones;
    const size_t chunk = (size_t)64 << 20;
    if (!ones) {
        if (!(ones = malloc(chunk))) die("out of host memory");
        memset(ones, 0xff, chunk);
    }
    for (size_t at = 0; at < bytes; at += chunk)
        k_copy_h2d(&gpu, (char *)dev + at, ones, bytes - at < chunk ? bytes - at : chunk);
}

static void *dpoisoned(size_t bytes) {
    void *d = dev_bytes(bytes);
    poison(d, bytes);
    return d;
}

static float *get_comp(const void *dev, size_t n) {
    float *out = hfloats(n);
    if (esize == sizeof(float)) {
        k_copy_d2h(&gpu, out, dev, n * sizeof(float));
        return out;
    }
    uint16_t *bits = malloc(n * sizeof *bits + 1);
    if (!bits) die("out of host memory");
    k_copy_d2h(&gpu, bits, dev, n * sizeof *bits);
    for (size_t i = 0; i < n; i++) out[i] = bf16_value(bits[i]);
    free(bits);
    return out;
}

static float *get_f32(const float *dev, size_t n) {
    float *out = hfloats(n);
    k_copy_d2h(&gpu, out, dev, n * sizeof(float));
    return out;
}

static int same_bits(const void *dev_a, const void *dev_b, size_t bytes) {
    unsigned char *a = malloc(bytes + 1), *b = malloc(bytes + 1);
    if (!a || !b) die("out of host memory");
    k_copy_d2h(&gpu, a, dev_a, bytes);
    k_copy_d2h(&gpu, b, dev_b, bytes);
    int same = memcmp(a, b, bytes) == 0;
    free(a);
    free(b);
    return same;
}

/* ---- reporting ---- */

/* A pending failure of the GPU context (reported and cleared), or NULL. */
static const char *pending_failure(void) {
    static errbuf err;
    return k_sync(&gpu, &err) ? err.msg : NULL;
}

static void verdict(const char *op, const char *shp, const char *measure, int ok,
                    const char *note) {
    printf("%-22s %-34s %-32s %s%s%s\n", op, shp, measure, ok ? "PASS" : "FAIL",
           note[0] ? "  " : "", note);
    fflush(stdout);
    if (ok)
        n_passed++;
    else
        n_failed++;
}

/* ||got - want|| / ||want||, passing at rel_tol, or where every element is within abs_tol
 * (abs_tol 0: relative only). */
static void report(const char *op, const char *shp, const float *got, const float *want,
                   size_t n, double rel_tol, double abs_tol) {
    const char *failure = pending_failure();
    double diff = 0.0, norm = 0.0, max_abs = 0.0;
    size_t nans = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(got[i])) {
            nans++;
            continue;
        }
        double d = fabs((double)got[i] - want[i]);
        diff += d * d;
        norm += (double)want[i] * want[i];
        if (d > max_abs) max_abs = d;
    }
    double rel = norm > 0.0 ? sqrt(diff / norm) : sqrt(diff);
    char measure[64], note[64] = "";
    snprintf(measure, sizeof measure, "rel %.2e max %.1e (tol %.0e)", rel, max_abs, rel_tol);
    if (nans) snprintf(note, sizeof note, "%zu of %zu NaN (unwritten?)", nans, n);
    int ok = !failure && nans == 0 && (rel <= rel_tol || (abs_tol > 0 && max_abs <= abs_tol));
    verdict(op, shp, measure, ok, failure ? failure : note);
}

static void report_bool(const char *op, const char *shp, int ok, const char *measure) {
    const char *failure = pending_failure();
    verdict(op, shp, measure, ok && !failure, failure ? failure : "");
}

/* ---- stalls ---- */

/* Kernels that do not finish within STALL_S of being queued are a failure, not a hang that
 * waits for the caller's timeout: the alarm prints which check and exits with status 3. */
#define STALL_S 60
static char stall_note[512];
static void on_stall(int sig) {
    (void)sig;
    static const char head[] = "\nFAIL attention stall: the kernels did not finish in 60 s: ";
    if (write(STDOUT_FILENO, head, sizeof head - 1) < 0 ||
        write(STDOUT_FILENO, stall_note, strlen(stall_note)) < 0 || write(STDOUT_FILENO, "\n", 1) < 0)
        _exit(4);
    _exit(3);
}
static void stall_watch(const char *what) {
    snprintf(stall_note, sizeof stall_note, "%s", what);
    alarm(STALL_S);
}

/* ---- the CPU reference, one query head per task, on every core ---- */

typedef struct reference {
    int B, T, Hq, Hkv, hd;
    const k_docs *docs; /* host [B*T], or NULL: whole causal rows */
    int window;         /* sliding window, 0: none */
    const float *q, *k, *v, *dout;
    float *out, *lse, *dq;
    float *dk_part, *dv_part; /* [B, Hq, T, hd]: each query head's share of dK and dV */
    pthread_mutex_t lock;
    int next_task; /* (b, h) = (task / Hq, task % Hq) */
    errbuf failure; /* the first worker's failure, if any */
    int failed;
} reference;

/* Row t of head h of a [B, T, H, hd] tensor. */
static size_t at(int b, int t, int h, int T, int H, int hd) {
    return (((size_t)b * T + t) * H + h) * hd;
}

static void gather_head(float *dst, const float *src, int b, int h, int T, int H, int hd) {
    for (int t = 0; t < T; t++)
        memcpy(dst + (size_t)t * hd, src + at(b, t, h, T, H, hd), (size_t)hd * sizeof(float));
}

static void *reference_worker(void *arg) {
    reference *r = arg;
    int T = r->T, hd = r->hd, group = r->Hq / r->Hkv;
    size_t th = (size_t)T * hd;
    float *buf = malloc((10 * th + 2 * (size_t)T) * sizeof(float));
    kctx cpu;
    errbuf err;
    if (!buf || kctx_init(&cpu, K_CPU, 0, &err)) die("reference: out of memory");
    float *q = buf, *k = q + th, *v = k + th, *dout = v + th, *out = dout + th, *out16 = out + th;
    float *dq = out16 + th, *dk = dq + th, *dv = dk + th, *lse = dv + th;
    for (;;) {
        pthread_mutex_lock(&r->lock);
        int task = r->next_task++;
        pthread_mutex_unlock(&r->lock);
        if (task >= r->B * r->Hq) break;
        int b = task / r->Hq, h = task % r->Hq, g = h / group;
        gather_head(q, r->q, b, h, T, r->Hq, hd);
        gather_head(k, r->k, b, g, T, r->Hkv, hd);
        gather_head(v, r->v, b, g, T, r->Hkv, hd);
        gather_head(dout, r->dout, b, h, T, r->Hq, hd);
        const k_docs row_docs = {r->docs ? r->docs->start + (size_t)b * T : NULL,
                                 r->docs ? r->docs->end + (size_t)b * T : NULL};
        const k_docs *docs = r->docs ? &row_docs : NULL; /* row b's documents */
        k_attention_fwd(&cpu, out, lse, q, k, v, docs, r->window, 1, T, 1, 1, hd);
        for (size_t i = 0; i < th; i++) out16[i] = round_bf16(out[i]); /* bf16 on the GPU */
        k_attention_bwd(&cpu, dq, dk, dv, dout, q, k, v, out16, lse, docs, r->window, 1, T, 1, 1,
                        hd);
        if (k_check(&cpu, &err)) {
            pthread_mutex_lock(&r->lock);
            if (!r->failed) r->failure = err;
            r->failed = 1;
            pthread_mutex_unlock(&r->lock);
            break;
        }
        for (int t = 0; t < T; t++) {
            memcpy(r->out + at(b, t, h, T, r->Hq, hd), out + (size_t)t * hd, hd * sizeof(float));
            memcpy(r->dq + at(b, t, h, T, r->Hq, hd), dq + (size_t)t * hd, hd * sizeof(float));
        }
        memcpy(r->lse + ((size_t)b * r->Hq + h) * T, lse, (size_t)T * sizeof(float));
        memcpy(r->dk_part + ((size_t)b * r->Hq + h) * th, dk, th * sizeof(float));
        memcpy(r->dv_part + ((size_t)b * r->Hq + h) * th, dv, th * sizeof(float));
    }
    kctx_destroy(&cpu);
    free(buf);
    return NULL;
}

/* out, lse and dq of every query head; dk, dv summed over each group in head order. */
static void run_reference(reference *r, float *dk, float *dv) {
    double start = now();
    int B = r->B, T = r->T, Hq = r->Hq, Hkv = r->Hkv, hd = r->hd, group = Hq / Hkv;
    size_t th = (size_t)T * hd;
    r->dk_part = hfloats((size_t)B * Hq * th);
    r->dv_part = hfloats((size_t)B * Hq * th);
    r->next_task = 0;
    r->failed = 0;
    if (pthread_mutex_init(&r->lock, NULL)) die("pthread_mutex_init failed");
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int n = cores < 1 ? 1 : cores > 64 ? 64 : (int)cores;
    if (n > B * Hq) n = B * Hq;
    pthread_t threads[64];
    for (int i = 0; i < n; i++)
        if (pthread_create(&threads[i], NULL, reference_worker, r)) die("pthread_create failed");
    for (int i = 0; i < n; i++) pthread_join(threads[i], NULL);
    pthread_mutex_destroy(&r->lock);
    if (r->failed) die("CPU reference: %s", r->failure.msg);
    for (int b = 0; b < B; b++)
        for (int g = 0; g < Hkv; g++)
            for (int t = 0; t < T; t++)
                for (int d = 0; d < hd; d++) {
                    double sk = 0.0, sv = 0.0;
                    for (int h = g * group; h < (g + 1) * group; h++) {
                        size_t i = ((size_t)b * Hq + h) * th + (size_t)t * hd + d;
                        sk += r->dk_part[i];
                        sv += r->dv_part[i];
                    }
                    dk[at(b, t, g, T, Hkv, hd) + d] = (float)sk;
                    dv[at(b, t, g, T, Hkv, hd) + d] = (float)sv;
                }
    reference_seconds += now() - start;
}

/* ---- checks ---- */

/* Varlen: rows packed with documents (k_docs), host and device copies of their bounds. */
typedef struct packing {
    k_docs host, dev;
    char name[48];
} packing;

/* Row b holds the n documents of lengths lens, rotated by b (row 1 starts with lens[1], ...),
 * so every row is T = sum(lens) tokens long and each has its boundaries elsewhere. */
static int pack_rows(packing *pk, int B, const int *lens, int n) {
    int T = 0;
    for (int i = 0; i < n; i++) T += lens[i];
    int32_t *start = hints((size_t)B * T), *end = hints((size_t)B * T);
    for (int b = 0; b < B; b++)
        for (int i = 0, t = 0; i < n; t += lens[(b + i++) % n])
            for (int u = t; u < t + lens[(b + i) % n]; u++) {
                start[(size_t)b * T + u] = t;
                end[(size_t)b * T + u] = t + lens[(b + i) % n];
            }
    int32_t *dstart = dev_bytes((size_t)B * T * sizeof *dstart);
    int32_t *dend = dev_bytes((size_t)B * T * sizeof *dend);
    k_copy_h2d(&gpu, dstart, start, (size_t)B * T * sizeof *start);
    k_copy_h2d(&gpu, dend, end, (size_t)B * T * sizeof *end);
    pk->host = (k_docs){start, end};
    pk->dev = (k_docs){dstart, dend};
    int at = snprintf(pk->name, sizeof pk->name, " docs");
    for (int i = 0; i < n && at < (int)sizeof pk->name; i++)
        at += snprintf(pk->name + at, sizeof pk->name - at, " %d", lens[i]);
    return T;
}

/* The backward on the CUDA context DETERMINISM_RUNS more times into fresh buffers (nq, nkv
 * elements of esize bytes): 1 if every run gave the bits of dq, dk, dv. */
static int bwd_same_bits_again(const void *dq, const void *dk, const void *dv, const void *dout,
                               const void *q, const void *k, const void *v, const void *out,
                               const float *lse, const k_docs *docs, int window, int B, int T,
                               int Hq, int Hkv, int hd) {
    size_t nq = (size_t)B * T * Hq * hd, nkv = (size_t)B * T * Hkv * hd;
    void *dq2 = dpoisoned(nq * esize), *dk2 = dpoisoned(nkv * esize), *dv2 = dpoisoned(nkv * esize);
    int same = 1;
    for (int run = 0; run < DETERMINISM_RUNS; run++) {
        k_attention_bwd(&gpu, dq2, dk2, dv2, dout, q, k, v, out, lse, docs, window, B, T, Hq, Hkv,
                        hd);
        same &= same_bits(dq, dq2, nq * esize) && same_bits(dk, dk2, nkv * esize) &&
                same_bits(dv, dv2, nkv * esize);
    }
    return same;
}

/* One shape; pk NULL: whole causal rows, else the packed rows of pk (made for B, T); window
 * > 0: Mistral's sliding window (the band mask), 0: none. */
static void check_case(int B, int T, int Hq, int Hkv, int hd, const packing *pk, int window,
                       int determinism) {
    seed((uint64_t)T * 1000003u + (uint64_t)Hq * 101u + (uint64_t)hd);
    size_t nq = (size_t)B * T * Hq * hd, nkv = (size_t)B * T * Hkv * hd, nl = (size_t)B * Hq * T;
    const k_docs *docs = pk ? &pk->dev : NULL;
    char shp[96];
    char band[24] = "";
    if (window) snprintf(band, sizeof band, " window %d", window);
    snprintf(shp, sizeof shp, "B=%d T=%d Hq=%d Hkv=%d hd=%d%s%s", B, T, Hq, Hkv, hd,
             pk ? pk->name : "", band);
    /* scores q.k/sqrt(hd) with a spread of a few units: peaked rows, the online rescaling
     * exercised */
    float *q = hrandom(nq, 4.0f), *k = hrandom(nkv, 2.0f), *v = hrandom(nkv, 1.0f);
    float *dout = hrandom(nq, 1.0f);
    reference r = {.B = B, .T = T, .Hq = Hq, .Hkv = Hkv, .hd = hd, .docs = pk ? &pk->host : NULL,
                   .window = window, .q = q, .k = k, .v = v, .dout = dout, .out = hfloats(nq), .lse = hfloats(nl),
                   .dq = hfloats(nq)};
    float *want_dk = hfloats(nkv), *want_dv = hfloats(nkv);
    run_reference(&r, want_dk, want_dv);

    stall_watch(shp);
    void *dq_in = dcomp(q, nq), *dk_in = dcomp(k, nkv), *dv_in = dcomp(v, nkv);
    void *ddout = dcomp(dout, nq);
    void *out = dpoisoned(nq * esize);
    float *lse = dpoisoned(nl * sizeof(float));
    k_attention_fwd(&gpu, out, lse, dq_in, dk_in, dv_in, docs, window, B, T, Hq, Hkv, hd);
    report("attention_fwd out", shp, get_comp(out, nq), r.out, nq, TOL_BF16, 0.0);
    report("attention_fwd lse", shp, get_f32(lse, nl), r.lse, nl, TOL_LSE_REL, TOL_LSE_ABS);

    /* the backward of both sides starts from the CPU's forward: out as bf16, lse */
    float *out16 = hfloats(nq);
    for (size_t i = 0; i < nq; i++) out16[i] = round_bf16(r.out[i]);
    void *dout_in = dcomp(out16, nq);
    float *dlse = df32(r.lse, nl);
    void *gq = dpoisoned(nq * esize), *gk = dpoisoned(nkv * esize), *gv = dpoisoned(nkv * esize);
    k_attention_bwd(&gpu, gq, gk, gv, ddout, dq_in, dk_in, dv_in, dout_in, dlse, docs, window, B,
                    T, Hq, Hkv, hd);
    report("attention_bwd dq", shp, get_comp(gq, nq), r.dq, nq, TOL_BF16, 0.0);
    report("attention_bwd dk", shp, get_comp(gk, nkv), want_dk, nkv, TOL_BF16, 0.0);
    report("attention_bwd dv", shp, get_comp(gv, nkv), want_dv, nkv, TOL_BF16, 0.0);

    if (have_mma) { /* the sm_90a backward beside the mma.sync one, from the same inputs */
        void *mq = dpoisoned(nq * esize), *mk = dpoisoned(nkv * esize), *mv = dpoisoned(nkv * esize);
        k_attention_bwd(&mma, mq, mk, mv, ddout, dq_in, dk_in, dv_in, dout_in, dlse, docs, window,
                        B, T, Hq, Hkv, hd);
        errbuf err;
        if (k_sync(&mma, &err)) die("the mma.sync context: %s", err.msg);
        report("sm90 bwd dq ~ mma.sync", shp, get_comp(gq, nq), get_comp(mq, nq), nq, TOL_BF16, 0.0);
        report("sm90 bwd dk ~ mma.sync", shp, get_comp(gk, nkv), get_comp(mk, nkv), nkv, TOL_BF16, 0.0);
        report("sm90 bwd dv ~ mma.sync", shp, get_comp(gv, nkv), get_comp(mv, nkv), nkv, TOL_BF16, 0.0);
    }
    if (determinism) { /* DETERMINISM_RUNS more runs, each the first's bits */
        void *out2 = dpoisoned(nq * esize);
        float *lse2 = dpoisoned(nl * sizeof(float));
        int fwd_same = 1;
        for (int run = 0; run < DETERMINISM_RUNS; run++) {
            k_attention_fwd(&gpu, out2, lse2, dq_in, dk_in, dv_in, docs, window, B, T, Hq, Hkv, hd);
            fwd_same &= same_bits(out, out2, nq * esize) && same_bits(lse, lse2, nl * sizeof(float));
        }
        int bwd_same = bwd_same_bits_again(gq, gk, gv, ddout, dq_in, dk_in, dv_in, dout_in, dlse,
                                           docs, window, B, T, Hq, Hkv, hd);
        char runs[64];
        snprintf(runs, sizeof runs, "out, lse: the same bits %d more times", DETERMINISM_RUNS);
        report_bool("deterministic fwd", shp, fwd_same, runs);
        snprintf(runs, sizeof runs, "dq, dk, dv: the same bits %d more times", DETERMINISM_RUNS);
        report_bool("deterministic bwd", shp, bwd_same, runs);
    }
    alarm(0);
    release_all();
}

static void check_attention(int B, int T, int Hq, int Hkv, int hd, int determinism) {
    check_case(B, T, Hq, Hkv, hd, NULL, 0, determinism);
}

/* Mistral's sliding window over whole rows. */
static void check_attention_window(int B, int T, int Hq, int Hkv, int hd, int window,
                                   int determinism) {
    check_case(B, T, Hq, Hkv, hd, NULL, window, determinism);
}

/* Varlen: B rows packed with the n documents of lens (see pack_rows). */
static void check_attention_docs(int B, int Hq, int Hkv, int hd, const int *lens, int n,
                                 int determinism) {
    packing pk;
    int T = pack_rows(&pk, B, lens, n);
    check_case(B, T, Hq, Hkv, hd, &pk, 0, determinism);
}

/* The window inside packed documents. */
static void check_attention_docs_window(int B, int Hq, int Hkv, int hd, const int *lens, int n,
                                        int window) {
    packing pk;
    int T = pack_rows(&pk, B, lens, n);
    check_case(B, T, Hq, Hkv, hd, &pk, window, 1);
}

/* Bad arguments: k_sync reports the wanted message, then the context is clear again. */
static void expect_failure(const char *what, const char *wanted) {
    errbuf err = {{0}}, again = {{0}};
    int failed = k_sync(&gpu, &err) != 0, cleared = k_sync(&gpu, &again) == 0;
    char note[1200];
    snprintf(note, sizeof note, "\"%s\"", failed ? err.msg : "no failure reported");
    verdict("attention bad input", what, "reported by k_sync",
            failed && cleared && strstr(err.msg, wanted) != NULL, note);
}

static void check_failures(void) {
    char *buf = dev_bytes(1 << 20);
    float *lse = dev_bytes(4096);
    k_attention_fwd(&gpu, buf, lse, buf, buf, buf, NULL, 0, 1, 4, 2, 1, 300);
    expect_failure("head dim 300", "head dim 300 is not supported");
    k_attention_bwd(&gpu, buf, buf, buf, buf, buf, buf, buf, buf, lse, NULL, 0, 1, 4, 6, 4, 64);
    expect_failure("6 query heads, 4 kv heads", "6 query heads are not a multiple of 4");
    k_attention_fwd(&gpu, buf + 2, lse, buf, buf, buf, NULL, 0, 1, 4, 2, 1, 64);
    expect_failure("unaligned out", "16-byte aligned");
    k_attention_fwd(&gpu, buf, lse, buf, buf, buf, NULL, -1, 1, 4, 2, 1, 64);
    expect_failure("window -1", "sliding window -1 is negative");
    release_all();
}

/* FSDP_CUDA_ATTENTION picks the kernels ("wgmma": the sm_90a ones, the default on Hopper;
 * "mma": the mma.sync ones): any other value fails a context's set-up, naming it. */
static void check_path_choice(void) {
    const char *was = getenv("FSDP_CUDA_ATTENTION");
    char *saved = was ? strdup(was) : NULL;
    if (was && !saved) die("out of host memory");
    if (setenv("FSDP_CUDA_ATTENTION", "bogus", 1)) die("setenv failed");
    kctx other;
    errbuf err = {{0}};
    int failed = kctx_init(&other, K_CUDA, 0, &err) != 0;
    if (!failed) kctx_destroy(&other);
    if (saved ? setenv("FSDP_CUDA_ATTENTION", saved, 1) : unsetenv("FSDP_CUDA_ATTENTION"))
        die("restoring FSDP_CUDA_ATTENTION failed");
    free(saved);
    char note[1200];
    snprintf(note, sizeof note, "\"%s\"", failed ? err.msg : "the context was set up");
    verdict("attention bad input", "FSDP_CUDA_ATTENTION=bogus", "kctx_init fails",
            failed && strstr(err.msg, "FSDP_CUDA_ATTENTION=bogus") != NULL, note);
}

/* Which kernels the checks run: the sm_90a ones on a compute capability 9.0 device unless
 * FSDP_CUDA_ATTENTION=mma (kernels/cuda/cuda_kernels.h). */
static int sm90_path(struct cudaDeviceProp *prop) {
    if (cudaGetDeviceProperties(prop, gpu.device) != cudaSuccess) die("cudaGetDeviceProperties");
    const char *choice = getenv("FSDP_CUDA_ATTENTION");
    return prop->major == 9 && prop->minor == 0 && !(choice && !strcmp(choice, "mma"));
}

static void print_path(void) {
    struct cudaDeviceProp prop;
    int sm90 = sm90_path(&prop);
    printf("attention on %s (compute capability %d.%d): %s kernels (head dims 64, 128)%s\n",
           prop.name, prop.major, prop.minor, sm90 ? "sm_90a (wgmma, TMA)" : "mma.sync",
           sm90 ? "; the backward also beside the mma.sync one" : "");
}

static void open_mma_context(void) {
    struct cudaDeviceProp prop;
    if (!sm90_path(&prop)) return; /* the checks run the mma.sync kernels already */
    const char *was = getenv("FSDP_CUDA_ATTENTION");
    char *saved = was ? strdup(was) : NULL;
    if (was && !saved) die("out of host memory");
    errbuf err;
    if (setenv("FSDP_CUDA_ATTENTION", "mma", 1)) die("setenv failed");
    if (kctx_init(&mma, K_CUDA, 0, &err)) die("the mma.sync context: %s", err.msg);
    if (saved ? setenv("FSDP_CUDA_ATTENTION", saved, 1) : unsetenv("FSDP_CUDA_ATTENTION"))
        die("restoring FSDP_CUDA_ATTENTION failed");
    free(saved);
    have_mma = 1;
}

/* ---- bench ---- */

#define REPS 10
#define WARMUP 3

static void cuda_or_die(cudaError_t e, const char *what) {
    if (e != cudaSuccess) die("%s: %s", what, cudaGetErrorString(e));
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Random bf16 device data from a host pool (never zeros: they can run faster). */
static void *bench_bf16(size_t n, float scale) {
    enum { POOL = 1 << 22 };
    static uint16_t *pool;
    if (!pool) {
        if (!(pool = malloc(2 * POOL * sizeof *pool))) die("out of host memory");
        for (size_t i = 0; i < 2 * (size_t)POOL; i++) pool[i] = bf16_bits(frand());
    }
    uint16_t *bits = malloc(POOL * sizeof *bits);
    if (!bits) die("out of host memory");
    void *d = dev_bytes(n * 2);
    for (size_t at = 0; at < n; at += POOL) {
        size_t chunk = n - at < POOL ? n - at : POOL, start = (at / POOL * 7919) % POOL;
        for (size_t i = 0; i < chunk; i++) bits[i] = bf16_bits(bf16_value(pool[start + i]) * scale);
        k_copy_h2d(&gpu, (char *)d + at * 2, bits, chunk * 2);
    }
    free(bits);
    return d;
}

typedef enum { BENCH_FWD, BENCH_BWD, BENCH_FWD_BWD } bench_kind;

typedef struct bench_case {
    void *q, *k, *v, *out, *dout, *dq, *dk, *dv;
    float *lse;
    int B, T, Hq, Hkv, hd;
    const k_docs *docs; /* packed rows, or NULL */
    int window;         /* sliding window, 0: none */
} bench_case;

static void bench_run(const bench_case *c, bench_kind kind) {
    if (kind != BENCH_BWD)
        k_attention_fwd(&gpu, c->out, c->lse, c->q, c->k, c->v, c->docs, c->window, c->B, c->T,
                        c->Hq, c->Hkv, c->hd);
    if (kind != BENCH_FWD)
        k_attention_bwd(&gpu, c->dq, c->dk, c->dv, c->dout, c->q, c->k, c->v, c->out, c->lse,
                        c->docs, c->window, c->B, c->T, c->Hq, c->Hkv, c->hd);
}

/* Median milliseconds of REPS runs after WARMUP. */
static double bench_ms(const bench_case *c, bench_kind kind) {
    cudaStream_t stream = (cudaStream_t)gpu.stream;
    cudaEvent_t ev[REPS + 1];
    for (int i = 0; i <= REPS; i++) cuda_or_die(cudaEventCreate(&ev[i]), "cudaEventCreate");
    for (int w = 0; w < WARMUP; w++) bench_run(c, kind);
    for (int r = 0; r < REPS; r++) {
        cuda_or_die(cudaEventRecord(ev[r], stream), "cudaEventRecord");
        bench_run(c, kind);
    }
    cuda_or_die(cudaEventRecord(ev[REPS], stream), "cudaEventRecord");
    cuda_or_die(cudaEventSynchronize(ev[REPS]), "cudaEventSynchronize");
    errbuf err;
    if (k_sync(&gpu, &err)) die("bench: %s", err.msg);
    float ms[REPS];
    for (int r = 0; r < REPS; r++)
        cuda_or_die(cudaEventElapsedTime(&ms[r], ev[r], ev[r + 1]), "cudaEventElapsedTime");
    for (int i = 0; i <= REPS; i++) cudaEventDestroy(ev[i]);
    qsort(ms, REPS, sizeof ms[0], cmp_float);
    return (ms[REPS / 2 - 1] + ms[REPS / 2]) / 2.0;
}

/* doc > 0: rows packed with documents of doc tokens (T a multiple of it); window > 0: a
 * sliding window over whole rows.  FLOPs count the work inside the documents or the band
 * only. */
/* --bench MODEL T: the rows to run (NULL: all). */
static const char *bench_only_model;
static int bench_only_T;

static void bench_shape_band(const char *model, int B, int T, int Hq, int Hkv, int hd, int doc,
                             int window) {
    if (bench_only_model && (strcmp(model, bench_only_model) || T != bench_only_T)) return;
    size_t nq = (size_t)B * T * Hq * hd, nkv = (size_t)B * T * Hkv * hd;
    bench_case c = {.B = B, .T = T, .Hq = Hq, .Hkv = Hkv, .hd = hd, .window = window};
    packing pk;
    int lens[64];
    if (doc > 0) {
        if (T / doc > 64) die("bench: more than 64 documents a row");
        for (int i = 0; i < T / doc; i++) lens[i] = doc;
        if (pack_rows(&pk, B, lens, T / doc) != T)
            die("bench: T %d is not a multiple of %d", T, doc);
        c.docs = &pk.dev;
    }
    c.q = bench_bf16(nq, 2.0f);
    c.k = bench_bf16(nkv, 2.0f);
    c.v = bench_bf16(nkv, 1.0f);
    c.dout = bench_bf16(nq, 1.0f);
    c.out = dev_bytes(nq * 2);
    c.dq = dev_bytes(nq * 2);
    c.dk = dev_bytes(nkv * 2);
    c.dv = dev_bytes(nkv * 2);
    c.lse = dev_bytes((size_t)B * Hq * T * sizeof(float));
    bench_run(&c, BENCH_FWD); /* out and lse for the backward-only runs */
    double span = doc > 0 ? doc : T; /* the causal span of each query's keys */
    if (window > 0 && window < T) /* twice the mean keys a query sees */
        span = 2.0 * ((double)window * T - (double)window * (window - 1) / 2) / T;
    double fwd_flops = 4.0 * B * Hq * (double)T * span * hd / 2.0;
    double f = bench_ms(&c, BENCH_FWD), b = bench_ms(&c, BENCH_BWD);
    double fb = bench_ms(&c, BENCH_FWD_BWD);
    char name[32];
    if (doc > 0 || window > 0)
        snprintf(name, sizeof name, "%s/%d", model, doc > 0 ? doc : window);
    else
        snprintf(name, sizeof name, "%s", model);
    printf("%-9s %3d %6d %4d %4d %4d %10.3f %8.1f %10.3f %8.1f %10.3f %8.1f\n", name, B, T, Hq,
           Hkv, hd, f, fwd_flops / f / 1e9, b, 2.5 * fwd_flops / b / 1e9, fb,
           3.5 * fwd_flops / fb / 1e9);
    fflush(stdout);
    release_all();
}

static void bench_shape_docs(const char *model, int B, int T, int Hq, int Hkv, int hd, int doc) {
    bench_shape_band(model, B, T, Hq, Hkv, hd, doc, 0);
}

static void bench_shape(const char *model, int B, int T, int Hq, int Hkv, int hd) {
    bench_shape_docs(model, B, T, Hq, Hkv, hd, 0);
}

static void run_bench(void) {
    struct cudaDeviceProp prop;
    cuda_or_die(cudaGetDeviceProperties(&prop, gpu.device), "cudaGetDeviceProperties");
    seed(99);
    printf("bench: %s, %d SMs; causal attention, bf16; median of %d runs after %d warm-ups\n",
           prop.name, prop.multiProcessorCount, REPS, WARMUP);
    printf("FLOPs: fwd 4*B*Hq*T^2*hd/2, bwd 2.5x fwd, fwd+bwd 3.5x fwd\n");
    printf("packed rows: model/document length (varlen, FLOPs inside the documents)\n");
    printf("%-9s %3s %6s %4s %4s %4s %10s %8s %10s %8s %10s %8s\n", "model", "B", "T", "Hq",
           "Hkv", "hd", "fwd ms", "TFLOP/s", "bwd ms", "TFLOP/s", "f+b ms", "TFLOP/s");
    bench_shape("7B", 4, 2048, 32, 32, 128);
    bench_shape("7B", 4, 8192, 32, 32, 128);
    bench_shape("70B", 4, 2048, 64, 8, 128);
    bench_shape("70B", 4, 8192, 64, 8, 128);
    bench_shape("hd64", 4, 2048, 32, 8, 64);
    bench_shape_docs("7B", 4, 8192, 32, 32, 128, 8192); /* one document a row: varlen overhead */
    bench_shape_docs("7B", 4, 8192, 32, 32, 128, 1024);
    bench_shape_docs("70B", 4, 8192, 64, 8, 128, 512);
    bench_shape_band("w", 4, 8192, 32, 8, 128, 0, 4096); /* Mistral 7B v0.1's window */
}

/* ---- stress: document layouts at a model's shape, sm_90a beside mma.sync ---- */

/* One batch of rows with the documents start/end (host [B*T]; NULL: whole rows), forward and
 * backward on the sm_90a kernels and on the mma.sync ones from the same inputs, within the
 * mma's tolerance; name says where the batch came from.  determinism: the sm_90a backward
 * DETERMINISM_RUNS more times, each the first's bits. */
static void check_layout(const int32_t *start, const int32_t *end, int B, int T, int Hq, int Hkv,
                         int hd, const char *name, int determinism) {
    size_t nq = (size_t)B * T * Hq * hd, nkv = (size_t)B * T * Hkv * hd, nl = (size_t)B * Hq * T;
    k_docs docs_dev = {NULL, NULL};
    if (start) {
        int32_t *dstart = dev_bytes((size_t)B * T * sizeof *dstart);
        int32_t *dend = dev_bytes((size_t)B * T * sizeof *dend);
        k_copy_h2d(&gpu, dstart, start, (size_t)B * T * sizeof *start);
        k_copy_h2d(&gpu, dend, end, (size_t)B * T * sizeof *end);
        docs_dev = (k_docs){dstart, dend};
    }
    const k_docs *docs = start ? &docs_dev : NULL;
    void *q = bench_bf16(nq, 2.0f), *k = bench_bf16(nkv, 2.0f), *v = bench_bf16(nkv, 1.0f);
    void *dout = bench_bf16(nq, 1.0f);
    void *out[2], *dq[2], *dk[2], *dv[2];
    float *lse[2];
    kctx *ctx[2] = {&gpu, &mma};
    stall_watch(name);
    for (int i = 0; i < 2; i++) {
        out[i] = dpoisoned(nq * 2), dq[i] = dpoisoned(nq * 2);
        dk[i] = dpoisoned(nkv * 2), dv[i] = dpoisoned(nkv * 2);
        lse[i] = dpoisoned(nl * sizeof(float));
        k_attention_fwd(ctx[i], out[i], lse[i], q, k, v, docs, 0, B, T, Hq, Hkv, hd);
        k_attention_bwd(ctx[i], dq[i], dk[i], dv[i], dout, q, k, v, out[i], lse[i], docs, 0, B,
                        T, Hq, Hkv, hd);
        errbuf err;
        if (k_sync(ctx[i], &err)) die("%s: %s", name, err.msg);
    }
    alarm(0);
    char shp[160];
    snprintf(shp, sizeof shp, "B=%d T=%d Hq=%d Hkv=%d hd=%d %s", B, T, Hq, Hkv, hd, name);
    report("sm90 fwd out ~ mma.sync", shp, get_comp(out[0], nq), get_comp(out[1], nq), nq, TOL_BF16, 0.0);
    report("sm90 bwd dq ~ mma.sync", shp, get_comp(dq[0], nq), get_comp(dq[1], nq), nq, TOL_BF16, 0.0);
    report("sm90 bwd dk ~ mma.sync", shp, get_comp(dk[0], nkv), get_comp(dk[1], nkv), nkv, TOL_BF16, 0.0);
    report("sm90 bwd dv ~ mma.sync", shp, get_comp(dv[0], nkv), get_comp(dv[1], nkv), nkv, TOL_BF16, 0.0);
    if (determinism) {
        stall_watch(name);
        int same = bwd_same_bits_again(dq[0], dk[0], dv[0], dout, q, k, v, out[0], lse[0], docs, 0,
                                       B, T, Hq, Hkv, hd);
        alarm(0);
        char runs[64];
        snprintf(runs, sizeof runs, "dq, dk, dv: the same bits %d more times", DETERMINISM_RUNS);
        report_bool("deterministic bwd", shp, same, runs);
    }
    release_all();
}

/* Row b of start/end from document lengths lens[0..n-1] (summing to T). */
static void lay_out_row(int32_t *start, int32_t *end, const int *lens, int n) {
    for (int i = 0, t = 0; i < n; t += lens[i++])
        for (int u = t; u < t + lens[i]; u++) start[u] = t, end[u] = t + lens[i];
}

/* The sm_90a backward's GQA schedule (cuda_attention_sm90.cu, bwd_item) beside mma.sync at the
 * shapes that take its other layouts on a device of 132 (H100, H200) or more multiprocessors:
 * two rows a (batch, kv head) in two rounds (32 pairs of 16 key blocks); the same with
 * documents (a block a key block, the first key blocks first); rows of the device's width
 * (266 key blocks, the third row partial). */
static void check_gqa_schedule(void) {
    if (!have_mma) return; /* the mma.sync context is CUDA's; --cpu has none */
    check_layout(NULL, NULL, 4, 2048, 16, 8, 128, "rows of 8, 2 rounds", 1);
    static const int lens[] = {1000, 1048};
    int32_t *start = hints(4 * 2048), *end = hints(4 * 2048);
    for (int b = 0; b < 4; b++) lay_out_row(start + b * 2048, end + b * 2048, lens, 2);
    check_layout(start, end, 4, 2048, 16, 8, 64, "documents 1000 1048: a block a key block", 1);
    check_layout(NULL, NULL, 1, 34000, 2, 1, 64, "rows of the device's width", 1);
}

/* Random layouts as packing makes them: documents of 1-8, 9-300 and 300-T tokens, cut
 * where the row ends; some rows of documents ending on tile edges. */
static void stress_random(int batches, int B, int T, int Hq, int Hkv, int hd) {
    int *lens = malloc((size_t)T * sizeof *lens);
    if (!lens) die("out of host memory");
    for (int i = 0; i < batches; i++) {
        /* fresh each batch: check_layout's release_all frees them */
        int32_t *start = hints((size_t)B * T), *end = hints((size_t)B * T);
        for (int b = 0; b < B; b++) {
            int n = 0;
            for (int t = 0; t < T;) {
                float r = 0.5f * (frand() + 1.0f);
                int len = r < 0.3f   ? 1 + (int)(8 * r / 0.3f)
                          : r < 0.6f ? 9 + (int)(291 * (r - 0.3f) / 0.3f)
                                     : 300 + (int)((T - 300) * (r - 0.6f) / 0.4f);
                if ((i + b) % 7 == 0) len = 64 * (1 + (int)(4 * r)); /* tile edges */
                if (len > T - t) len = T - t;
                lens[n++] = len;
                t += len;
            }
            lay_out_row(start + (size_t)b * T, end + (size_t)b * T, lens, n);
        }
        char name[64];
        snprintf(name, sizeof name, "random layout %d", i);
        check_layout(start, end, B, T, Hq, Hkv, hd, name, 0);
    }
    free(lens);
}

/* The packed rows of a token cache (data/rows.h), B at a time in file order. */
static void stress_cache(const char *path, int T, int B, int Hq, int Hkv, int hd) {
    errbuf err;
    tok_cache c;
    uint64_t *row_start, n_rows;
    if (tok_open(&c, path, &err) || rows_pack(&c, T, &row_start, &n_rows, NULL, &err))
        die("%s: %s", path, err.msg);
    int32_t *ids = malloc((size_t)T * sizeof *ids), *labels = malloc((size_t)T * sizeof *labels);
    if (!ids || !labels) die("out of host memory");
    for (uint64_t r0 = 0; r0 + (uint64_t)B <= n_rows; r0 += (uint64_t)B) {
        int32_t *start = hints((size_t)B * T), *end = hints((size_t)B * T);
        for (int b = 0; b < B; b++)
            row_fill_packed(&c, row_start, r0 + (uint64_t)b, T, ids, labels, start + (size_t)b * T,
                            end + (size_t)b * T);
        char name[96];
        snprintf(name, sizeof name, "rows %llu-%llu", (unsigned long long)r0,
                 (unsigned long long)(r0 + (uint64_t)B - 1));
        check_layout(start, end, B, T, Hq, Hkv, hd, name, 0);
    }
    free(ids);
    free(labels);
    free(row_start);
    tok_close(&c);
}

/* ---- main ---- */

/* --stress [CACHE T]: layouts of documents at the models' shapes, sm_90a beside mma.sync;
 * with CACHE, the packed rows of that token cache at T tokens a row (Llama-1.1B's heads). */
static int run_stress(int argc, char **argv) {
    open_mma_context();
    if (!have_mma) die("--stress: needs the sm_90a kernels (a compute capability 9.0 device)");
    seed(2026);
    if (argc == 4) {
        int T = atoi(argv[3]);
        if (T < 64 || T > 65536) die("--stress %s %s: T from 64 to 65536", argv[2], argv[3]);
        stress_cache(argv[2], T, 8, 32, 4, 64);
    } else {
        stress_random(40, 8, 1024, 32, 4, 64);   /* Llama-1.1B: GQA 8:1, hd 64 */
        stress_random(10, 2, 2048, 64, 8, 128);  /* 70B: GQA 8:1, hd 128 */
        stress_random(10, 2, 2048, 32, 32, 128); /* 7B: MHA, hd 128 */
        stress_random(10, 4, 1000, 12, 4, 64);   /* partial tiles */
    }
    printf("%d passed, %d failed\n", n_passed, n_failed);
    kctx_destroy(&mma);
    kctx_destroy(&gpu);
    return n_failed ? 1 : 0;
}

int main(int argc, char **argv) {
    const char *mode = argc >= 2 ? argv[1] : "";
    int bench = !strcmp(mode, "--bench"), self_test = !strcmp(mode, "--cpu");
    int quick = self_test || !strcmp(mode, "--quick"), stress = !strcmp(mode, "--stress");
    if ((argc > 2 && !((stress || bench) && argc == 4)) ||
        (argc == 2 && !bench && !quick && !stress)) {
        fprintf(stderr, "usage: %s [--quick | --bench [MODEL T] | --cpu | --stress [CACHE T]]\n",
                argv[0]);
        return 2;
    }
    if (bench && argc == 4) {
        bench_only_model = argv[2];
        if ((bench_only_T = atoi(argv[3])) <= 0)
            die("--bench %s %s: T must be a positive length", argv[2], argv[3]);
    }
    errbuf err;
    if (self_test) {
        if (kctx_init(&gpu, K_CPU, 0, &err)) die("%s", err.msg);
    } else {
        if (!k_cuda_available()) die("no CUDA device visible (k_cuda_available() is 0)");
        if (kctx_init(&gpu, K_CUDA, 0, &err)) die("%s", err.msg);
    }
    esize = k_compute_size(&gpu);
    if (signal(SIGALRM, on_stall) == SIG_ERR) die("signal(SIGALRM) failed");
    if (stress) return run_stress(argc, argv);
    if (bench) {
        run_bench();
        kctx_destroy(&gpu);
        return 0;
    }
    double start = now();
    if (gpu.backend == K_CUDA) {
        print_path();
        check_failures();
        check_path_choice();
        open_mma_context();
    }
    check_attention(2, 1, 4, 2, 128, 0);
    check_attention(2, 17, 4, 1, 128, 1);
    check_attention(2, 17, 6, 3, 64, 0);
    check_attention(1, 300, 12, 4, 128, 1); /* GQA 3:1, partial tiles */
    check_attention(2, 300, 6, 2, 64, 0);
    /* the plain path (cuda_attention_generic.cu) for other head dims */
    check_attention(2, 33, 4, 4, 16, 1);
    check_attention(2, 65, 8, 4, 32, 1);
    check_attention(1, 129, 6, 2, 96, 0);
    /* varlen (packed rows, k_docs): documents of 1, 17, 300 and 2047 tokens mixed in each row */
    /* small: the last query tile of each row skips the key tiles before its document */
    static const int mixed[] = {1, 17, 300, 2047}, small[] = {1, 17, 300, 5, 77};
    check_attention_docs(2, 4, 1, 128, small, 5, 1);
    check_attention_docs(2, 6, 2, 64, small, 5, 0);
    check_attention_docs(2, 4, 2, 32, small, 5, 1); /* the plain path */
    /* a document starting 4 and 6 key tiles past its query tile's first (warpgroup 1 of the
     * sm_90a forward skips more tiles than its ring holds: once a kernel that never ended) */
    static const int late[] = {513, 511}, later[] = {788, 236};
    check_attention_docs(2, 8, 1, 64, late, 2, 0);
    check_attention_docs(2, 4, 2, 128, later, 2, 1);
    /* Mistral's sliding window (F43): the band across tile edges, key tiles before it skipped
     * (forward, dQ) and query tiles after it (dK/dV), alone and inside packed documents, on
     * the tensor-core paths (hd 128, 64) and the plain one (hd 32); a window of 1 (a token
     * sees itself only) and one as long as the row (none) */
    check_attention_window(2, 300, 4, 2, 128, 37, 1);
    check_attention_window(2, 300, 6, 2, 64, 100, 0);
    check_attention_window(2, 65, 4, 2, 32, 12, 1);
    check_attention_window(1, 129, 2, 2, 128, 1, 0);
    check_attention_window(1, 200, 2, 1, 128, 200, 0);
    check_attention_docs_window(2, 4, 2, 128, small, 5, 23);
    check_attention_docs_window(2, 4, 2, 32, small, 5, 23);
    if (!quick) {
        check_attention_window(1, 4097, 8, 1, 128, 4096, 1); /* Mistral 7B v0.1's window */
        check_attention_window(1, 4097, 8, 2, 64, 1000, 0);
        check_attention_docs_window(2, 8, 2, 128, mixed, 4, 500);
        check_attention_docs(2, 8, 2, 128, mixed, 4, 1); /* GQA 4:1 */
        check_attention_docs(2, 6, 2, 64, mixed, 4, 1);  /* GQA 3:1 */
        check_attention_docs(2, 4, 4, 128, mixed, 4, 0);
        check_attention_docs(1, 4, 2, 32, mixed, 4, 0);  /* the plain path */
        check_attention(1, 2048, 32, 32, 128, 0); /* Llama-2-7B */
        check_attention(1, 2048, 64, 8, 128, 1);  /* Llama-2-70B, GQA 8:1 */
        check_attention(1, 4097, 8, 1, 128, 0);
        check_attention(2, 2048, 8, 2, 64, 0);
        check_attention(1, 4097, 4, 1, 64, 1);
        check_gqa_schedule(); /* large shapes: not for compute-sanitizer's --quick */
    }
    printf("(%.0f s, %.0f s of it the CPU reference)\n", now() - start, reference_seconds);
    printf("%d passed, %d failed\n", n_passed, n_failed);
    if (have_mma) kctx_destroy(&mma);
    kctx_destroy(&gpu);
    return n_failed ? 1 : 0;
}
