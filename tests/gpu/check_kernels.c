/* check_kernels: the CUDA backend of kernels.h against the CPU reference, op by op, at real
 * Llama shapes; with --bench, each CUDA kernel timed at Llama-2-7B shapes.
 *
 * Checks: inputs are drawn fresh for every check (fixed seeds) and rounded to bf16, so the
 * CPU (fp32, reductions in double) and the GPU (bf16 storage, fp32 math) see the same values.
 * GPU outputs are poisoned (every bit set: NaN in bf16 and fp32) before each run unless the
 * op accumulates into them; any NaN fails.  The error is ||gpu - cpu|| / ||cpu|| over the
 * whole tensor, against a tolerance for what the op does: 0 for copies, casts and gathers,
 * 1e-5 for fp32 math, 1e-4 for fp32 sums, 1e-2 for bf16 outputs, 2e-2 for bf16 GEMMs.
 * Dropout is compared element by element instead: the same elements dropped as on the CPU
 * (one Philox, base/philox.h), and every value within one bf16 rounding of the CPU's.
 * NF4 dequantization is compared element by element: every value the CPU's fp32 product
 * rounded once to bf16, bit for bit.  FP8 casts: every code and scale bit for bit; the FP8
 * GEMM element by element within a bound derived from the formats (check_fp8_gemm).
 * One line per check; the last line is "N passed, N failed"; exit status 1 on any failure.
 *
 * --cpu runs every check with the CPU backend standing in for CUDA (compute buffers are then
 * fp32): a test of this program itself on a machine without a GPU.
 *
 * Bench: per op the median of 20 timed runs (CUDA events, after 3 warm-up runs) on random
 * data, the bytes it must move or the FLOPs it must do, and its floor on an H200: bytes at
 * 4.27 TB/s or FLOPs at 785 TFLOP/s (the copy and bf16-GEMM rates measured on one). */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <time.h>

#include <cuda_runtime.h>

#include "base/philox.h"
#include "kernels/kernels.h"

#define TOL_EXACT 0.0
#define TOL_F32 1e-5
#define TOL_SUM 1e-4
#define TOL_BF16 1e-2
#define TOL_GEMM 2e-2

static kctx cpu, gpu;
static int n_passed, n_failed, n_skipped;

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "check_kernels: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(2);
}

/* ---- random numbers (xorshift64*), bf16 rounding ---- */

static uint64_t rng_state = 1;

static void seed(uint64_t s) {
    rng_state = s * 0x9E3779B97F4A7C15ULL + 1;
}

static uint64_t next_u64(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1DULL;
}

static float frand(void) { /* uniform in [-1, 1) */
    return (float)((double)(next_u64() >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static int irand(int n) {
    return (int)(next_u64() % (uint64_t)n);
}

/* The bf16 bits of f, rounded to nearest even (what __float2bfloat16_rn does). */
static uint16_t bf16_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0; /* NaN */
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

/* ---- allocations of one check, released together by release_all() ---- */

#define MAX_ALLOCS 128
static void *host_allocs[MAX_ALLOCS], *dev_allocs[MAX_ALLOCS];
static int n_host_allocs, n_dev_allocs;
/* 1: device buffers start one element past an aligned address (exercises the unaligned,
 * one-element-per-thread paths and cuBLASLt's small-alignment algorithms). */
static int misalign;

static void *host_bytes(size_t bytes) {
    if (n_host_allocs == MAX_ALLOCS) die("too many host allocations in one check");
    void *p = calloc(bytes ? bytes : 1, 1); /* calloc: untouched pages of huge tables stay free */
    if (!p) die("out of host memory (%zu bytes)", bytes);
    return host_allocs[n_host_allocs++] = p;
}

static float *hfloats(size_t n) {
    return host_bytes(n * sizeof(float));
}

/* scale * U(-1, 1), rounded to bf16 */
static float *hrandom(size_t n, float scale) {
    float *p = hfloats(n);
    for (size_t i = 0; i < n; i++) p[i] = round_bf16(scale * frand());
    return p;
}

static float *hcopy(const float *src, size_t n) {
    float *p = hfloats(n);
    memcpy(p, src, n * sizeof(float));
    return p;
}

static int32_t *hints(size_t n) {
    return host_bytes(n * sizeof(int32_t));
}

static void *dev_bytes(size_t bytes, size_t elem) {
    if (n_dev_allocs == MAX_ALLOCS) die("too many device allocations in one check");
    errbuf err;
    size_t offset = misalign ? elem : 0;
    char *base = k_alloc(&gpu, bytes + offset, &err);
    if (!base) die("%s", err.msg);
    dev_allocs[n_dev_allocs++] = base;
    return base + offset;
}

static void release_all(void) {
    for (int i = 0; i < n_host_allocs; i++) free(host_allocs[i]);
    for (int i = 0; i < n_dev_allocs; i++) k_free(&gpu, dev_allocs[i]);
    n_host_allocs = n_dev_allocs = 0;
}

/* Buffers of the compute dtype: bf16 on CUDA; fp32 when the CPU backend stands in (--cpu).
 * Host values given to them are already bf16 values, so both sides hold the same numbers. */
static size_t esize; /* k_compute_size(&gpu) */

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
    void *d = dev_bytes(n * esize, esize);
    put_comp(d, host, n);
    return d;
}

static float *df32(const float *host, size_t n) {
    float *d = dev_bytes(n * sizeof(float), sizeof(float));
    k_copy_h2d(&gpu, d, host, n * sizeof(float));
    return d;
}

static int32_t *dints(const int32_t *host, size_t n) {
    int32_t *d = dev_bytes(n * sizeof(int32_t), sizeof(int32_t));
    k_copy_h2d(&gpu, d, host, n * sizeof(int32_t));
    return d;
}

static int64_t *dlongs(const int64_t *host, size_t n) {
    int64_t *d = dev_bytes(n * sizeof(int64_t), sizeof(int64_t));
    k_copy_h2d(&gpu, d, host, n * sizeof(int64_t));
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

static void *dpoison_comp(size_t n) {
    void *d = dev_bytes(n * esize, esize);
    poison(d, n * esize);
    return d;
}

static float *dpoison_f32(size_t n) {
    float *d = dev_bytes(n * sizeof(float), sizeof(float));
    poison(d, n * sizeof(float));
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

/* ---- reporting ---- */

static const char *shape(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static const char *shape(const char *fmt, ...) {
    static char buf[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (misalign && n > 0 && (size_t)n < sizeof buf)
        snprintf(buf + n, sizeof buf - (size_t)n, " unaligned");
    return buf;
}

/* A pending failure in either context (reported and cleared), or NULL. */
static const char *pending_failure(void) {
    static errbuf err;
    if (k_sync(&gpu, &err)) return err.msg;
    if (k_sync(&cpu, &err)) return err.msg;
    return NULL;
}

/* One line: op, shape, what was measured, PASS or FAIL, then any note. */
static void verdict(const char *op, const char *shp, const char *measure, int ok,
                    const char *note) {
    printf("%-27s %-40s %-26s %s%s%s\n", op, shp, measure, ok ? "PASS" : "FAIL",
           note[0] ? "  " : "", note);
    fflush(stdout);
    if (ok)
        n_passed++;
    else
        n_failed++;
}

/* A check that cannot run on this device: printed and counted, never a pass. */
static void skip(const char *op, const char *shp, const char *why) {
    printf("%-27s %-40s %-26s SKIP  %s\n", op, shp, "not run", why);
    fflush(stdout);
    n_skipped++;
}

/* ||got - want|| / ||want|| (the plain norm of the difference when want is all zeros). */
static void report(const char *op, const char *shp, const float *got, const float *want,
                   size_t n, double tol) {
    const char *failure = pending_failure();
    double diff = 0.0, norm = 0.0;
    size_t nans = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(got[i])) {
            nans++;
            continue;
        }
        double d = (double)got[i] - want[i];
        diff += d * d;
        norm += (double)want[i] * want[i];
    }
    double rel = norm > 0.0 ? sqrt(diff / norm) : sqrt(diff);
    char measure[64], note[64] = "";
    snprintf(measure, sizeof measure, "rel %.2e (tol %.0e)", rel, tol);
    if (nans) snprintf(note, sizeof note, "%zu of %zu NaN (unwritten?)", nans, n);
    verdict(op, shp, measure, !failure && nans == 0 && rel <= tol, failure ? failure : note);
}

/* A check with a yes/no outcome; measure says what was compared. */
static void report_bool(const char *op, const char *shp, int ok, const char *measure) {
    const char *failure = pending_failure();
    verdict(op, shp, measure, ok && !failure, failure ? failure : "");
}

/* ---- memory and casts ---- */

static void check_memory(size_t n) {
    seed(1);
    float *fresh = dev_bytes(n * sizeof(float), sizeof(float));
    float *got = get_f32(fresh, n);
    size_t nonzero = 0;
    for (size_t i = 0; i < n; i++) nonzero += got[i] != 0.0f;
    report_bool("k_alloc (zeroed)", shape("n=%zu", n), nonzero == 0, "all zero");

    poison(fresh, n * sizeof(float));
    k_zero(&gpu, fresh, n * sizeof(float));
    got = get_f32(fresh, n);
    nonzero = 0;
    for (size_t i = 0; i < n; i++) nonzero += got[i] != 0.0f;
    report_bool("k_zero", shape("n=%zu", n), nonzero == 0, "all zero");

    float *src = hrandom(n, 1.0f);
    got = get_f32(df32(src, n), n);
    report_bool("k_copy_h2d, k_copy_d2h", shape("n=%zu", n),
                memcmp(got, src, n * sizeof(float)) == 0, "same bits");
    release_all();
}

/* The copy stream (k_copy_h2d_start / k_copy_h2d_wait) from read-only registered host memory
 * (k_host_register: what offload_params does with the model image): a copy started after a
 * queued copy into the same buffer lands after it, and compute queued after the wait reads
 * it; host memory on either side of k_copy_h2d (CPU offload's shards) is a copy too. */
static void check_copy_stream(size_t n) {
    seed(16);
    size_t bytes = n * sizeof(float), page = 4096, mapped = (bytes + page - 1) / page * page;
    float *first = hrandom(n, 1.0f);
    float *image = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (image == MAP_FAILED) die("mmap of %zu bytes failed", mapped);
    for (size_t i = 0; i < n; i++) image[i] = frand();
    if (mprotect(image, mapped, PROT_READ)) die("mprotect failed");
    errbuf err = {{0}};
    k_host_register(&gpu, image, mapped, 0);
    int registered = k_check(&gpu, &err) == 0;
    report_bool("k_host_register (read-only)", shape("bytes=%zu", mapped), registered, registered ? "registered" : err.msg);
    float *dst = dev_bytes(bytes, sizeof(float)), *sum = dev_bytes(bytes, sizeof(float));
    k_copy_h2d(&gpu, dst, first, bytes);                      /* queued on the compute stream */
    uint64_t t = k_copy_h2d_start(&gpu, K_COPY_PARAMS, dst, image, bytes); /* after it, on a lane */
    k_copy_h2d_wait(&gpu, K_COPY_PARAMS, t);
    k_add_f32(&gpu, sum, dst, n); /* compute after the wait reads the image */
    float *got = get_f32(sum, n);
    report_bool("k_copy_h2d_start, k_copy_h2d_wait", shape("n=%zu", n),
                memcmp(got, image, bytes) == 0, "same bits, in order");
    /* two lanes, tickets: a wait for the first of two copies on a lane, then for the other
     * lane's copy; every copy COPY_EVENTS + 1 copies back (its event reused) still waited for */
    float *other = dev_bytes(bytes, sizeof(float));
    k_zero(&gpu, dst, bytes);
    uint64_t first_t = k_copy_h2d_start(&gpu, K_COPY_PARAMS, dst, image, bytes);
    for (int i = 0; i < 9; i++) k_copy_h2d_start(&gpu, K_COPY_PARAMS, other, first, bytes);
    uint64_t act = k_copy_h2d_start(&gpu, K_COPY_ACTIVATIONS, sum, first, bytes);
    k_copy_h2d_wait(&gpu, K_COPY_PARAMS, first_t);
    k_copy_h2d_wait(&gpu, K_COPY_ACTIVATIONS, act);
    k_add_f32(&gpu, sum, dst, n); /* first + image */
    float *want = hfloats(n);
    for (size_t i = 0; i < n; i++) want[i] = first[i] + image[i];
    got = get_f32(sum, n);
    report_bool("k_copy_h2d_start lanes and tickets", shape("n=%zu", n),
                t + 1 == first_t && act == 1 && memcmp(got, want, bytes) == 0, "the tickets' copies waited for");
    float *host_dst = hfloats(n);
    k_copy_h2d(&gpu, host_dst, image, bytes); /* host to host */
    k_copy_d2h(&gpu, got, dst, bytes);
    report_bool("k_copy_h2d, k_copy_d2h with host memory on both sides", shape("n=%zu", n),
                k_sync(&gpu, &err) == 0 && memcmp(host_dst, image, bytes) == 0 &&
                    memcmp(got, image, bytes) == 0, "same bits");
    if (registered) k_host_unregister(&gpu, image);
    report_bool("k_host_unregister", shape("bytes=%zu", mapped), k_check(&gpu, &err) == 0, "no error");
    munmap(image, mapped);
    release_all();
}

/* An in-memory checkpoint image (worker/ckpt_writer.h): a memory file mapped shared and
 * registered writable, the destination of k_copy_d2h: the device's bits land in it, seen
 * through a second mapping of the same file (what a restarted rank reads). */
static void check_shared_image(size_t n) {
    seed(17);
    size_t bytes = n * sizeof(float), page = 4096, mapped = (bytes + page - 1) / page * page;
    int fd = memfd_create("check-image", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)mapped) != 0) die("memfd of %zu bytes failed", mapped);
    float *image = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    float *other = mmap(NULL, mapped, PROT_READ, MAP_SHARED, fd, 0);
    if (image == MAP_FAILED || other == MAP_FAILED) die("mmap of %zu bytes failed", mapped);
    errbuf err = {{0}};
    k_host_register(&gpu, image, mapped, 1);
    int registered = k_check(&gpu, &err) == 0;
    report_bool("k_host_register (writable, a shared memory file)", shape("bytes=%zu", mapped), registered,
                registered ? "registered" : err.msg);
    float *src = hrandom(n, 1.0f), *dev = dev_bytes(bytes, sizeof(float));
    k_copy_h2d(&gpu, dev, src, bytes);
    k_copy_d2h(&gpu, image, dev, bytes);
    report_bool("k_copy_d2h into a registered shared image", shape("n=%zu", n),
                k_sync(&gpu, &err) == 0 && memcmp(other, src, bytes) == 0, "same bits through the file");
    if (registered) k_host_unregister(&gpu, image);
    report_bool("k_host_unregister (writable)", shape("bytes=%zu", mapped), k_check(&gpu, &err) == 0, "no error");
    munmap(image, mapped);
    munmap(other, mapped);
    close(fd);
    release_all();
}

static size_t count_different(const float *a, const float *b, size_t n) {
    size_t count = 0;
    for (size_t i = 0; i < n; i++) count += memcmp(&a[i], &b[i], sizeof(float)) != 0;
    return count;
}

/* f32 -> compute rounds to nearest even, ties included (a copy on the CPU backend);
 * compute -> f32 is exact. */
static void check_casts(size_t n) {
    seed(2);
    float *src = hfloats(n), *want = hfloats(n);
    for (size_t i = 0; i < n; i++) {
        src[i] = 100.0f * frand();
        if (i % 7 == 0) { /* exactly half-way between two bf16 values */
            uint32_t u = ((uint32_t)bf16_bits(src[i]) << 16) | 0x8000u;
            memcpy(&src[i], &u, sizeof u);
        }
        want[i] = esize == sizeof(float) ? src[i] : round_bf16(src[i]);
    }
    void *comp = dpoison_comp(n);
    k_f32_to_compute(&gpu, comp, df32(src, n), n);
    char measure[64];
    size_t wrong = count_different(get_comp(comp, n), want, n);
    snprintf(measure, sizeof measure, "%zu of %zu wrong", wrong, n);
    report_bool("f32_to_compute", shape("n=%zu", n), wrong == 0, measure);

    float *back = dpoison_f32(n);
    k_compute_to_f32(&gpu, back, comp, n);
    wrong = count_different(get_f32(back, n), want, n);
    snprintf(measure, sizeof measure, "%zu of %zu wrong", wrong, n);
    report_bool("compute_to_f32", shape("n=%zu", n), wrong == 0, measure);
    release_all();
}

/* ---- elementwise ---- */

static void check_elementwise(size_t n) {
    seed(3);
    float *a = hrandom(n, 1.0f), *b = hrandom(n, 1.0f);

    float *want = hcopy(a, n);
    k_accumulate(&cpu, want, b, n);
    void *acc = dcomp(a, n);
    k_accumulate(&gpu, acc, dcomp(b, n), n);
    report("accumulate", shape("n=%zu", n), get_comp(acc, n), want, n, TOL_BF16);

    want = hcopy(a, n);
    k_add_f32(&cpu, want, b, n);
    float *acc32 = df32(a, n);
    k_add_f32(&gpu, acc32, df32(b, n), n);
    report("add_f32", shape("n=%zu", n), get_f32(acc32, n), want, n, TOL_F32);

    want = hcopy(a, n);
    k_scale(&cpu, want, -1.7f, n);
    void *scaled = dcomp(a, n);
    k_scale(&gpu, scaled, -1.7f, n);
    report("scale", shape("n=%zu", n), get_comp(scaled, n), want, n, TOL_BF16);

    float want_sum = 2.0f;
    k_sumsq_f32(&cpu, &want_sum, a, n);
    float *sum = df32(&(float){2.0f}, 1);
    k_sumsq_f32(&gpu, sum, df32(a, n), n);
    report("sumsq_f32", shape("n=%zu", n), get_f32(sum, 1), &want_sum, 1, TOL_F32);
    release_all();
}

/* Qwen2's q/k/v biases (F43): out += bias on every row; dbias += the column sums (onto a
 * nonzero dbias: it accumulates). */
static void check_bias(int N, int O) {
    seed(43);
    size_t n = (size_t)N * O;
    float *y = hrandom(n, 1.0f), *b = hrandom((size_t)O, 1.0f), *db = hrandom((size_t)O, 1.0f);
    float *want = hcopy(y, n);
    k_bias_fwd(&cpu, want, b, N, O);
    void *out = dcomp(y, n);
    k_bias_fwd(&gpu, out, dcomp(b, (size_t)O), N, O);
    report("bias_fwd", shape("N=%d O=%d", N, O), get_comp(out, n), want, n, TOL_BF16);
    float *want_db = hcopy(db, (size_t)O);
    k_bias_bwd(&cpu, want_db, y, N, O);
    float *ddb = df32(db, (size_t)O);
    k_bias_bwd(&gpu, ddb, dcomp(y, n), N, O);
    report("bias_bwd", shape("N=%d O=%d", N, O), get_f32(ddb, (size_t)O), want_db, (size_t)O, TOL_SUM);
    release_all();
}

static void check_swiglu(size_t n) {
    seed(4);
    float *gate = hrandom(n, 4.0f), *up = hrandom(n, 1.0f), *dout = hrandom(n, 1.0f);
    void *dgate_in = dcomp(gate, n), *dup_in = dcomp(up, n), *ddout = dcomp(dout, n);

    float *want = hfloats(n);
    k_swiglu_fwd(&cpu, want, gate, up, n);
    void *out = dpoison_comp(n);
    k_swiglu_fwd(&gpu, out, dgate_in, dup_in, n);
    report("swiglu_fwd", shape("n=%zu", n), get_comp(out, n), want, n, TOL_BF16);

    float *want_dg = hfloats(n), *want_du = hfloats(n);
    k_swiglu_bwd(&cpu, want_dg, want_du, dout, gate, up, n);
    void *dg = dpoison_comp(n), *du = dpoison_comp(n);
    k_swiglu_bwd(&gpu, dg, du, ddout, dgate_in, dup_in, n);
    report("swiglu_bwd dgate", shape("n=%zu", n), get_comp(dg, n), want_dg, n, TOL_BF16);
    report("swiglu_bwd dup", shape("n=%zu", n), get_comp(du, n), want_du, n, TOL_BF16);

    /* in place: dgate over gate, dup over up */
    k_swiglu_bwd(&gpu, dgate_in, dup_in, ddout, dgate_in, dup_in, n);
    report("swiglu_bwd in place dgate", shape("n=%zu", n), get_comp(dgate_in, n), want_dg, n,
           TOL_BF16);
    report("swiglu_bwd in place dup", shape("n=%zu", n), get_comp(dup_in, n), want_du, n,
           TOL_BF16);
    release_all();
}

/* ---- embedding ---- */

/* Tokens with long runs of repeats: 40% one token, 30% from 64 values, 30% anywhere. */
static int32_t *repeating_tokens(int N, int V) {
    int32_t *tok = hints((size_t)N);
    for (int n = 0; n < N; n++) {
        int kind = irand(10);
        tok[n] = kind < 4 ? 7 % V : kind < 7 ? irand(64 < V ? 64 : V) : irand(V);
    }
    tok[0] = 0;
    tok[N - 1] = V - 1;
    return tok;
}

static void check_embedding_fwd(int N, int C, int V) {
    seed(5);
    size_t nc = (size_t)N * C;
    int32_t *tok = hints((size_t)N);
    for (int n = 0; n < N; n++) tok[n] = irand(V);
    tok[0] = 0;
    tok[N - 1] = V - 1;
    /* Only the rows the tokens use get values: the tables can be gigabytes. */
    float *table = hfloats((size_t)V * C);
    void *dtable = dev_bytes((size_t)V * C * esize, esize);
    for (int n = 0; n < N; n++) {
        float *row = table + (size_t)tok[n] * C;
        for (int i = 0; i < C; i++) row[i] = round_bf16(frand());
        put_comp((char *)dtable + (size_t)tok[n] * C * esize, row, (size_t)C);
    }
    float *want = hfloats(nc);
    k_embedding_fwd(&cpu, want, tok, table, N, C, V);
    void *out = dpoison_comp(nc);
    k_embedding_fwd(&gpu, out, dints(tok, (size_t)N), dtable, N, C, V);
    report("embedding_fwd", shape("N=%d C=%d V=%d", N, C, V), get_comp(out, nc), want, nc,
           TOL_EXACT);
    release_all();
}

/* dwte starts random in the rows the tokens use and zero elsewhere; the whole table is
 * compared, so a write to any other row shows. */
static void check_embedding_bwd(int N, int C, int V) {
    seed(6);
    size_t nc = (size_t)N * C, vc = (size_t)V * C;
    int32_t *tok = repeating_tokens(N, V);
    float *dout = hrandom(nc, 1.0f);
    float *want = hfloats(vc);
    float *dwte = dev_bytes(vc * sizeof(float), sizeof(float));
    for (int n = 0; n < N; n++) {
        float *row = want + (size_t)tok[n] * C;
        for (int i = 0; i < C; i++) row[i] = frand();
        k_copy_h2d(&gpu, dwte + (size_t)tok[n] * C, row, (size_t)C * sizeof(float));
    }
    k_embedding_bwd(&cpu, want, dout, tok, N, C, V);
    k_embedding_bwd(&gpu, dwte, dcomp(dout, nc), dints(tok, (size_t)N), N, C, V);
    report("embedding_bwd", shape("N=%d C=%d V=%d repeats", N, C, V), get_f32(dwte, vc), want,
           vc, TOL_F32);
    release_all();
}

/* ---- RMSNorm, RoPE ---- */

static void check_rmsnorm(int N, int C) {
    seed(7);
    size_t nc = (size_t)N * C;
    float eps = 1e-5f;
    float *x = hrandom(nc, 2.0f), *w = hfloats((size_t)C);
    for (int i = 0; i < C; i++) w[i] = round_bf16(1.0f + 0.2f * frand());
    void *dx = dcomp(x, nc), *dw_in = dcomp(w, (size_t)C);

    float *want = hfloats(nc), *want_rstd = hfloats((size_t)N);
    k_rmsnorm_fwd(&cpu, want, want_rstd, x, w, N, C, eps);
    void *out = dpoison_comp(nc);
    float *rstd = dpoison_f32((size_t)N);
    k_rmsnorm_fwd(&gpu, out, rstd, dx, dw_in, N, C, eps);
    report("rmsnorm_fwd out", shape("N=%d C=%d", N, C), get_comp(out, nc), want, nc, TOL_BF16);
    report("rmsnorm_fwd rstd", shape("N=%d C=%d", N, C), get_f32(rstd, (size_t)N), want_rstd,
           (size_t)N, TOL_F32);

    /* backward from the CPU's rstd (both sides see the same), accumulating into din and dw */
    float *dout = hrandom(nc, 1.0f), *din0 = hrandom(nc, 1.0f);
    float *dw0 = hrandom((size_t)C, sqrtf((float)N) / 3.0f);
    float *want_din = hcopy(din0, nc), *want_dw = hcopy(dw0, (size_t)C);
    k_rmsnorm_bwd(&cpu, want_din, want_dw, dout, x, w, want_rstd, N, C);
    void *din = dcomp(din0, nc), *ddout = dcomp(dout, nc);
    float *dw = df32(dw0, (size_t)C), *drstd = df32(want_rstd, (size_t)N);
    k_rmsnorm_bwd(&gpu, din, dw, ddout, dx, dw_in, drstd, N, C);
    report("rmsnorm_bwd din", shape("N=%d C=%d", N, C), get_comp(din, nc), want_din, nc,
           TOL_BF16);
    report("rmsnorm_bwd dw", shape("N=%d C=%d", N, C), get_f32(dw, (size_t)C), want_dw,
           (size_t)C, TOL_SUM);

    /* a frozen norm (dw NULL): the same din */
    void *din_frozen = dcomp(din0, nc);
    k_rmsnorm_bwd(&gpu, din_frozen, NULL, ddout, dx, dw_in, drstd, N, C);
    report("rmsnorm_bwd din, dw NULL", shape("N=%d C=%d", N, C), get_comp(din_frozen, nc),
           want_din, nc, TOL_BF16);
    release_all();
}

/* A frozen norm (dw NULL) at a hidden size whose dw sums would not fit in a block's shared
 * memory (C floats): without dw the backward needs none, so it runs. */
static void check_rmsnorm_frozen(int N, int C) {
    seed(14);
    size_t nc = (size_t)N * C;
    float *x = hrandom(nc, 2.0f), *w = hfloats((size_t)C), *rstd = hfloats((size_t)N);
    for (int i = 0; i < C; i++) w[i] = round_bf16(1.0f + 0.2f * frand());
    float *dout = hrandom(nc, 1.0f), *din0 = hrandom(nc, 1.0f), *fwd = hfloats(nc);
    k_rmsnorm_fwd(&cpu, fwd, rstd, x, w, N, C, 1e-5f);
    float *want = hcopy(din0, nc);
    k_rmsnorm_bwd(&cpu, want, NULL, dout, x, w, rstd, N, C);
    void *din = dcomp(din0, nc);
    k_rmsnorm_bwd(&gpu, din, NULL, dcomp(dout, nc), dcomp(x, nc), dcomp(w, (size_t)C),
                  df32(rstd, (size_t)N), N, C);
    report("rmsnorm_bwd din, dw NULL", shape("N=%d C=%d", N, C), get_comp(din, nc), want, nc,
           TOL_BF16);
    release_all();
}

static const k_rope_params llama2_rope = {.theta = 10000.0};
static const k_rope_params llama3_rope = {.theta = 500000.0,
                                          .kind = K_ROPE_LLAMA3,
                                          .factor = 8.0,
                                          .low_freq_factor = 1.0,
                                          .high_freq_factor = 4.0,
                                          .original_max_position_embeddings = 8192};

/* doc > 0: packed rows (k_docs) of documents of doc tokens, the last cut at T, so positions
 * restart at every document. */
static void check_rope_docs(int B, int T, int H, int hd, const k_rope_params *p,
                            const char *name, int doc) {
    seed(8);
    size_t n = (size_t)B * T * H * hd;
    float *inv_freq = hfloats((size_t)hd / 2);
    k_rope_inv_freq(p, hd, inv_freq);
    float *dinv = df32(inv_freq, (size_t)hd / 2);
    float *x = hrandom(n, 1.0f);
    k_docs host_docs = {NULL, NULL}, dev_docs = {NULL, NULL};
    if (doc > 0) {
        int32_t *start = hints((size_t)B * T), *end = hints((size_t)B * T);
        for (int i = 0; i < B * T; i++) { /* bounds are positions within the row */
            start[i] = i % T / doc * doc;
            end[i] = start[i] + doc < T ? start[i] + doc : T;
        }
        host_docs = (k_docs){start, end};
        dev_docs = (k_docs){dints(start, (size_t)B * T), dints(end, (size_t)B * T)};
    }
    for (int inverse = 0; inverse <= 1; inverse++) {
        float *want = hcopy(x, n);
        k_rope(&cpu, want, inv_freq, doc > 0 ? &host_docs : NULL, B, T, H, hd, inverse);
        void *dx = dcomp(x, n);
        k_rope(&gpu, dx, dinv, doc > 0 ? &dev_docs : NULL, B, T, H, hd, inverse);
        report(inverse ? "rope inverse" : "rope",
               shape("B=%d T=%d H=%d hd=%d %s%s", B, T, H, hd, name, doc > 0 ? " docs" : ""),
               get_comp(dx, n), want, n, TOL_BF16);
    }
    release_all();
}

static void check_rope(int B, int T, int H, int hd, const k_rope_params *p, const char *name) {
    check_rope_docs(B, T, H, hd, p, name, 0);
}

/* ---- attention over a KV cache (generation) ---- */

/* Rows at positions pos[B] (each row's earlier cache filled by a first call of pos[b] new
 * tokens at 0, then S new tokens): the output and both caches against the CPU's. */
static void check_attention_kv(int B, int S, int T_max, int Hq, int Hkv, int hd, const int32_t *pos) {
    seed(12);
    size_t qn = (size_t)B * S * Hq * hd, kn = (size_t)B * S * Hkv * hd, cn = (size_t)B * T_max * Hkv * hd;
    k_rope_params rp = {.theta = 10000.0};
    float *inv_freq = hfloats((size_t)hd / 2);
    k_rope_inv_freq(&rp, hd, inv_freq);
    float *dinv = df32(inv_freq, (size_t)hd / 2);
    /* the caches as earlier tokens left them: random keys and values, bf16-exact */
    float *kc = hrandom(cn, 1.0f), *vc = hrandom(cn, 1.0f);
    for (size_t i = 0; i < cn; i++) kc[i] = bf16_value(bf16_bits(kc[i])), vc[i] = bf16_value(bf16_bits(vc[i]));
    float *q = hrandom(qn, 1.0f), *k = hrandom(kn, 1.0f), *v = hrandom(kn, 1.0f);
    void *dq = dcomp(q, qn), *dk = dcomp(k, kn), *dv = dcomp(v, kn), *dkc = dcomp(kc, cn), *dvc = dcomp(vc, cn);
    q = get_comp(dq, qn), k = get_comp(dk, kn), v = get_comp(dv, kn); /* the inputs as the GPU sees them */
    float *out = hfloats(qn);
    void *dout = dcomp(out, qn);
    k_attention_kv(&cpu, out, q, k, v, kc, vc, pos, inv_freq, B, S, T_max, Hq, Hkv, hd);
    k_attention_kv(&gpu, dout, dq, dk, dv, dkc, dvc, dints(pos, (size_t)B), dinv, B, S, T_max, Hq, Hkv, hd);
    const char *shp = shape("B=%d S=%d T_max=%d Hq=%d Hkv=%d hd=%d pos0=%d", B, S, T_max, Hq, Hkv, hd, pos[0]);
    report("attention_kv", shp, get_comp(dout, qn), out, qn, TOL_BF16);
    report("attention_kv k cache", shp, get_comp(dkc, cn), kc, cn, TOL_BF16);
    report("attention_kv v cache", shp, get_comp(dvc, cn), vc, cn, TOL_EXACT);
    release_all();
}

/* ---- linear ---- */

static void check_linear(int N, int I, int O) {
    seed(9);
    size_t ni = (size_t)N * I, no = (size_t)N * O, oi = (size_t)O * I;
    float *in = hrandom(ni, 1.0f), *w = hrandom(oi, 1.0f), *dout = hrandom(no, 1.0f);
    void *din_ = dcomp(in, ni), *dw_ = dcomp(w, oi), *ddout = dcomp(dout, no);
    const char *shp = shape("N=%d I=%d O=%d", N, I, O);
    char shp_copy[128];
    snprintf(shp_copy, sizeof shp_copy, "%s", shp);

    float *want = hfloats(no);
    k_linear_fwd(&cpu, want, in, w, N, I, O);
    void *out = dpoison_comp(no);
    k_linear_fwd(&gpu, out, din_, dw_, N, I, O);
    report("linear_fwd", shp_copy, get_comp(out, no), want, no, TOL_GEMM);

    /* accumulating forward (LoRA's B added onto the base's output): out += in W^T */
    float *out0 = hrandom(no, sqrtf((float)I) / 3.0f), *want_acc = hcopy(out0, no);
    k_linear_fwd_acc(&cpu, want_acc, in, w, N, I, O);
    void *acc = dcomp(out0, no);
    k_linear_fwd_acc(&gpu, acc, din_, dw_, N, I, O);
    report("linear_fwd_acc (+=)", shp_copy, get_comp(acc, no), want_acc, no, TOL_GEMM);

    /* accumulating: din += dout W, dw += dout^T in, both from random starting values */
    float *din0 = hrandom(ni, sqrtf((float)O) / 3.0f), *dw0 = hrandom(oi, sqrtf((float)N) / 3.0f);
    float *want_din = hcopy(din0, ni), *want_dw = hcopy(dw0, oi);
    k_linear_bwd(&cpu, want_din, want_dw, dout, in, w, N, I, O, 1);
    void *din = dcomp(din0, ni);
    float *dw = df32(dw0, oi);
    k_linear_bwd(&gpu, din, dw, ddout, din_, dw_, N, I, O, 1);
    report("linear_bwd din (+=)", shp_copy, get_comp(din, ni), want_din, ni, TOL_GEMM);
    report("linear_bwd dw (+=)", shp_copy, get_f32(dw, oi), want_dw, oi, TOL_GEMM);

    /* overwriting din, no dw */
    float *want_din2 = hfloats(ni);
    k_linear_bwd(&cpu, want_din2, NULL, dout, in, w, N, I, O, 0);
    void *din2 = dpoison_comp(ni);
    k_linear_bwd(&gpu, din2, NULL, ddout, din_, dw_, N, I, O, 0);
    report("linear_bwd din (=)", shp_copy, get_comp(din2, ni), want_din2, ni, TOL_GEMM);
    release_all();
}

/* Whether the device buffers hold the same bytes. */
static int same_bits(const void *dev_a, const void *dev_b, size_t bytes) {
    unsigned char *a = host_bytes(bytes), *b = host_bytes(bytes);
    k_copy_d2h(&gpu, a, dev_a, bytes);
    k_copy_d2h(&gpu, b, dev_b, bytes);
    return memcmp(a, b, bytes) == 0;
}

/* The _ld ops on columns [at, at + I) of a wide [N, ld] matrix (a fused LoRA group's inner
 * activations: B's input, dB's input, dt's output), against the CPU's on the same layout; the
 * other columns of the output stay as they were. */
static void check_linear_ld(int N, int I, int O, int ld, int at) {
    seed(10);
    size_t nw = (size_t)N * ld, no = (size_t)N * O, oi = (size_t)O * I;
    float *wide = hrandom(nw, 1.0f), *w = hrandom(oi, 1.0f), *dout = hrandom(no, 1.0f);
    void *dwide = dcomp(wide, nw), *dw_ = dcomp(w, oi), *ddout = dcomp(dout, no);
    const char *shp = shape("N=%d I=%d O=%d ld=%d at=%d", N, I, O, ld, at);
    char shp_copy[128];
    snprintf(shp_copy, sizeof shp_copy, "%s", shp);

    float *out0 = hrandom(no, sqrtf((float)I) / 3.0f), *want = hcopy(out0, no);
    k_linear_fwd_ld(&cpu, want, wide + at, ld, w, N, I, O, 1);
    void *out = dcomp(out0, no);
    k_linear_fwd_ld(&gpu, out, (char *)dwide + (size_t)at * 2, ld, dw_, N, I, O, 1);
    report("linear_fwd_ld (+=)", shp_copy, get_comp(out, no), want, no, TOL_GEMM);

    float *dw0 = hrandom(oi, sqrtf((float)N) / 3.0f), *want_dw = hcopy(dw0, oi), *want_wide = hcopy(wide, nw);
    k_linear_bwd_ld(&cpu, want_wide + at, want_dw, dout, wide + at, ld, w, N, I, O, 0, 1);
    float *dw = df32(dw0, oi);
    void *dwide_out = dcomp(wide, nw);
    k_linear_bwd_ld(&gpu, (char *)dwide_out + (size_t)at * 2, dw, ddout, (char *)dwide + (size_t)at * 2, ld, dw_, N,
                    I, O, 0, 1);
    report("linear_bwd_ld dw (+=)", shp_copy, get_f32(dw, oi), want_dw, oi, TOL_GEMM);
    report("linear_bwd_ld din (=, its columns)", shp_copy, get_comp(dwide_out, nw), want_wide, nw, TOL_GEMM);
    /* accumulate_dw 0 writes dw (beta 0): the bits of adding onto zeros, whatever it held */
    float *nans = hcopy(dw0, oi), *zeros = hcopy(dw0, oi);
    for (size_t i = 0; i < oi; i++) nans[i] = NAN, zeros[i] = 0.0f;
    float *dw_set = df32(nans, oi), *dw_add = df32(zeros, oi);
    k_linear_bwd_ld(&gpu, NULL, dw_set, ddout, (char *)dwide + (size_t)at * 2, ld, dw_, N, I, O, 0, 0);
    k_linear_bwd_ld(&gpu, NULL, dw_add, ddout, (char *)dwide + (size_t)at * 2, ld, dw_, N, I, O, 0, 1);
    report_bool("linear_bwd_ld dw (=)", shp_copy, same_bits(dw_set, dw_add, oi * sizeof(float)),
                "the bits of += onto zeros, over NaNs");
    release_all();
}

/* ---- dropout ---- */

/* Elements zero on one side only (the masks differ) and elements further from the CPU's fp32
 * value than one bf16 rounding (half an ulp, at most 2^-8 of the value); NaNs count as both. */
static void report_dropout(const char *op, const char *shp, const float *got,
                           const float *want, size_t n) {
    size_t mask_wrong = 0, value_wrong = 0;
    for (size_t i = 0; i < n; i++) {
        int nan = isnan(got[i]);
        mask_wrong += nan || (got[i] == 0.0f) != (want[i] == 0.0f);
        value_wrong += nan || fabsf(got[i] - want[i]) > fabsf(want[i]) * (1.0f / 256.0f);
    }
    char measure[64];
    snprintf(measure, sizeof measure, "%zu mask, %zu value wrong", mask_wrong, value_wrong);
    report_bool(op, shp, mask_wrong == 0 && value_wrong == 0, measure);
}

/* out = dropout(x), out += dropout(x) (the backward on the gradient) and in place, against
 * the CPU.  Samples past 2^32 and one past 2^48 (the stream keeps its low 48 bits). */
static void check_dropout(int B, int T, int cols, float p) {
    seed(13);
    size_t n = (size_t)B * T * cols;
    int64_t *samples = host_bytes((size_t)B * sizeof(int64_t));
    for (int b = 0; b < B; b++) samples[b] = (INT64_C(1) << 40) + 7919 * (int64_t)b;
    samples[B - 1] = INT64_C(3) << 50 | 17;
    const uint64_t key = UINT64_C(0x9E3779B97F4A7C15);
    const uint32_t site = philox_dropout_site(5, 2);
    int64_t *dsamples = dlongs(samples, (size_t)B);
    float *x = hrandom(n, 2.0f);
    void *dx = dcomp(x, n);
    const char *shp = shape("B=%d T=%d cols=%d p=%g", B, T, cols, (double)p);
    char shp_copy[128];
    snprintf(shp_copy, sizeof shp_copy, "%s", shp);

    float *want = hfloats(n);
    k_dropout(&cpu, want, x, samples, key, site, B, T, cols, p, 0);
    void *out = dpoison_comp(n);
    k_dropout(&gpu, out, dx, dsamples, key, site, B, T, cols, p, 0);
    report_dropout("dropout", shp_copy, get_comp(out, n), want, n);

    float *base = hrandom(n, 1.0f), *want_acc = hcopy(base, n);
    k_dropout(&cpu, want_acc, x, samples, key, site, B, T, cols, p, 1);
    void *acc = dcomp(base, n);
    k_dropout(&gpu, acc, dx, dsamples, key, site, B, T, cols, p, 1);
    report_dropout("dropout (+=)", shp_copy, get_comp(acc, n), want_acc, n);

    k_dropout(&gpu, dx, dx, dsamples, key, site, B, T, cols, p, 0);
    report_dropout("dropout in place", shp_copy, get_comp(dx, n), want, n);
    release_all();
}

/* ---- cross-entropy, AdamW ---- */

/* Zeroes each unmasked row's target entry, leaving the softmax part of dlogits. */
static void drop_targets(float *d, const int32_t *targets, int N, int V) {
    for (int n = 0; n < N; n++)
        if (targets[n] != K_IGNORE_INDEX) d[(size_t)n * V + targets[n]] = 0.0f;
}

static void check_cross_entropy(int N, int V) {
    seed(10);
    size_t nv = (size_t)N * V;
    float *logits = hrandom(nv, 4.0f);
    int32_t *targets = hints((size_t)N);
    int count = 0;
    for (int n = 0; n < N; n++) {
        targets[n] = irand(10) == 0 ? K_IGNORE_INDEX : irand(V);
        count += targets[n] != K_IGNORE_INDEX;
    }
    targets[0] = V - 1;
    targets[N - 1] = 0;
    float dscale = 1.0f / (float)(count + 2);
    const char *shp = shape("N=%d V=%d", N, V);
    char shp_copy[128];
    snprintf(shp_copy, sizeof shp_copy, "%s", shp);
    int32_t *dtargets = dints(targets, (size_t)N);
    void *dlogits_in = dcomp(logits, nv);

    float want_loss = 1.25f, *want = hfloats(nv);
    k_cross_entropy(&cpu, &want_loss, want, logits, targets, N, V, dscale);
    float *loss = df32(&(float){1.25f}, 1);
    void *d = dpoison_comp(nv);
    k_cross_entropy(&gpu, loss, d, dlogits_in, dtargets, N, V, dscale);
    report("cross_entropy loss", shp_copy, get_f32(loss, 1), &want_loss, 1, TOL_F32);
    float *got = get_comp(d, nv);
    report("cross_entropy dlogits", shp_copy, got, want, nv, TOL_BF16);
    float *want_soft = hcopy(want, nv);
    drop_targets(got, targets, N, V);
    drop_targets(want_soft, targets, N, V);
    report("cross_entropy dlogits soft", shp_copy, got, want_soft, nv, TOL_BF16);

    /* in place, as the model does it */
    float *loss2 = df32(&(float){1.25f}, 1);
    k_cross_entropy(&gpu, loss2, dlogits_in, dlogits_in, dtargets, N, V, dscale);
    report("cross_entropy in place loss", shp_copy, get_f32(loss2, 1), &want_loss, 1, TOL_F32);
    report("cross_entropy in place dlog", shp_copy, get_comp(dlogits_in, nv), want, nv,
           TOL_BF16);

    /* loss only */
    float *loss3 = df32(&(float){1.25f}, 1);
    k_cross_entropy(&gpu, loss3, NULL, dcomp(logits, nv), dtargets, N, V, dscale);
    report("cross_entropy loss only", shp_copy, get_f32(loss3, 1), &want_loss, 1, TOL_F32);
    release_all();
}

static void check_adamw(size_t n, int step) {
    seed(11);
    float *p = hfloats(n), *g = hfloats(n), *m = hfloats(n), *v = hfloats(n);
    for (size_t i = 0; i < n; i++) {
        p[i] = frand();
        g[i] = frand();
        m[i] = 0.1f * frand();
        float r = frand();
        v[i] = 0.01f * r * r;
    }
    float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.5f;
    float *dp = df32(p, n), *dg = df32(g, n), *dm = df32(m, n), *dv = df32(v, n);
    k_adamw(&cpu, p, g, m, v, n, lr, b1, b2, eps, wd, step, gs, NULL);
    void *out = dev_bytes(n * esize, esize), *cast = dev_bytes(n * esize, esize);
    k_adamw(&gpu, dp, dg, dm, dv, n, lr, b1, b2, eps, wd, step, gs, out);
    k_f32_to_compute(&gpu, cast, dp, n);
    const char *shp = shape("n=%zu step=%d", n, step);
    char shp_copy[128];
    snprintf(shp_copy, sizeof shp_copy, "%s", shp);
    report("adamw p", shp_copy, get_f32(dp, n), p, n, TOL_F32);
    report("adamw m", shp_copy, get_f32(dm, n), m, n, TOL_F32);
    report("adamw v", shp_copy, get_f32(dv, n), v, n, TOL_F32);
    /* the compute copy it writes: f32_to_compute's bits of the new p */
    report_bool("adamw out", shp_copy, same_bits(out, cast, n * esize), "same bits as f32_to_compute(p)");
    release_all();
}

/* ---- NF4 dequantization (QLoRA) ---- */

/* n random bytes (every code of both nibbles) in host memory. */
static uint8_t *hrandom_bytes(size_t n) {
    uint8_t *p = host_bytes(n);
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(next_u64() >> 56);
    return p;
}

static uint8_t *dbytes(const uint8_t *host, size_t n) {
    uint8_t *d = dev_bytes(n, 1);
    k_copy_h2d(&gpu, d, host, n);
    return d;
}

/* Random codes and absmax values (single quantization, or double: 8-bit codes, nested absmax
 * and an offset as bnb's), dequantized by both backends: every CUDA value must be the CPU's
 * fp32 product rounded once to bf16 (the same bits; on --cpu the product itself). */
static void check_nf4_dequant(size_t n, int double_quant) {
    seed(15);
    size_t blocks = (n + 63) / 64, nested_n = (blocks + 255) / 256;
    uint8_t *packed = hrandom_bytes((n + 1) / 2);
    float *absmax = hfloats(blocks), *nested = hfloats(nested_n), offset = 0.0f;
    uint8_t *absmax_q = hrandom_bytes(blocks);
    for (size_t b = 0; b < blocks; b++) absmax[b] = 0.05f * (1.0f + frand());
    for (size_t b = 0; b < nested_n; b++) nested[b] = 0.02f * (1.0f + frand());
    if (double_quant) offset = 0.05f;
    const void *cpu_absmax = double_quant ? (const void *)absmax_q : (const void *)absmax;
    float *want = hfloats(n);
    k_nf4_dequant(&cpu, want, packed, cpu_absmax, double_quant ? nested : NULL, offset, n);
    if (esize != sizeof(float))
        for (size_t i = 0; i < n; i++) want[i] = round_bf16(want[i]);

    const void *dabsmax = double_quant ? (const void *)dbytes(absmax_q, blocks)
                                       : (const void *)df32(absmax, blocks);
    void *out = dpoison_comp(n);
    k_nf4_dequant(&gpu, out, dbytes(packed, (n + 1) / 2), dabsmax,
                  double_quant ? df32(nested, nested_n) : NULL, offset, n);
    float *got = get_comp(out, n);
    size_t wrong = count_different(got, want, n);
    char measure[64];
    snprintf(measure, sizeof measure, "%zu of %zu wrong", wrong, n);
    report_bool(double_quant ? "nf4_dequant double quant" : "nf4_dequant", shape("n=%zu", n),
                wrong == 0, measure);
    release_all();
}

/* ---- FP8 (F45): casts bit for bit, the GEMM within a bound derived from the formats ---- */

static const char *fp8_name(fp8_format f, k_fp8_scaling s) {
    static const char *names[2][2] = {{"fp8_cast e4m3 tensorwise", "fp8_cast e4m3 rowwise"},
                                      {"fp8_cast e5m2 tensorwise", "fp8_cast e5m2 rowwise"}};
    return names[f][s];
}

typedef void fp8_cast_fn(kctx *c, uint8_t *out, float *scale_inv, const void *in, int rows,
                         int cols, fp8_format fmt, k_fp8_scaling scaling);

/* x cast by both backends with k_fp8_cast (transposed 0) or k_fp8_cast_t (1): every code and
 * every inverse scale the same bits. */
static void compare_cast(const float *x, int rows, int cols, fp8_format f, k_fp8_scaling s,
                         int transposed, const char *shp) {
    fp8_cast_fn *cast = transposed ? k_fp8_cast_t : k_fp8_cast;
    size_t n = (size_t)rows * cols;
    size_t ns = s == K_FP8_ROWWISE ? (size_t)(transposed ? cols : rows) : 1;
    uint8_t *want = host_bytes(n), *got = host_bytes(n);
    float *want_si = hfloats(ns);
    cast(&cpu, want, want_si, x, rows, cols, f, s);
    uint8_t *dout = dev_bytes(n, 1);
    float *dsi = dpoison_f32(ns);
    poison(dout, n);
    cast(&gpu, dout, dsi, dcomp(x, n), rows, cols, f, s);
    k_copy_d2h(&gpu, got, dout, n);
    size_t wrong = 0;
    for (size_t i = 0; i < n; i++) wrong += got[i] != want[i];
    float *got_si = get_f32(dsi, ns);
    size_t wrong_si = count_different(got_si, want_si, ns);
    char op[40], measure[64];
    snprintf(op, sizeof op, "%s%s", fp8_name(f, s), transposed ? " (T)" : "");
    snprintf(measure, sizeof measure, "%zu of %zu codes, %zu of %zu scales wrong", wrong, n,
             wrong_si, ns);
    report_bool(op, shp, wrong == 0 && wrong_si == 0, measure);
    for (size_t i = 0, shown = 0; i < ns && shown < 4; i++) /* the first few, to diagnose */
        if (memcmp(&got_si[i], &want_si[i], sizeof got_si[i]))
            printf("    scale_inv[%zu]: got %a, want %a\n", i, got_si[i], want_si[i]), shown++;
}

/* Random bf16 values, row r (transposed: column r) scaled by 2^(r % 41 - 20) (so the
 * scales differ and small rows reach e4m3's and e5m2's subnormals under a tensorwise scale),
 * a NaN (ignored by the amax, cast to 0x7f) and a zero row (a zero column when transposed:
 * scale 1); cast plainly or transposed (k_fp8_cast_t). */
static void check_fp8_cast(int rows, int cols, int transposed) {
    seed(16);
    size_t n = (size_t)rows * cols;
    float *x = hrandom(n, 1.0f);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            x[(size_t)r * cols + c] *= ldexpf(1.0f, (transposed ? c : r) % 41 - 20);
    if (!transposed && rows > 2) memset(x + (size_t)(rows / 2) * cols, 0, (size_t)cols * sizeof(float));
    for (int r = 0; transposed && cols > 2 && r < rows; r++) x[(size_t)r * cols + cols / 2] = 0.0f;
    x[n / 3] = NAN;
    for (int f = 0; f < 2; f++)
        for (int s = 0; s < 2; s++)
            compare_cast(x, rows, cols, (fp8_format)f, (k_fp8_scaling)s, transposed,
                         shape("%dx%d", rows, cols));
    release_all();
}

/* The FP8 gathers' casts from fp32 masters (k_fp8_amax_f32, k_fp8_cast_f32): the GPU rounds each
 * fp32 value to bf16 first, the CPU (fp32 compute) takes them as they are: so the CPU is given
 * the bf16 roundings of the GPU's raw fp32 inputs (fp32 with low bits set, ties among them) and
 * both must give the same amax and the same codes under fp8_scale of it, each format; n odd
 * (the value-a-thread path) or a multiple of 4 (4 a thread). */
static void check_fp8_master(size_t n) {
    seed(18);
    float *raw = hfloats(n), *rounded = hfloats(n);
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        float v = frand() * ldexpf(1.0f, (int)(i % 23) - 11);
        memcpy(&u, &v, sizeof u);
        u = (u & ~0xffffu) | (uint32_t)(i % 3 == 0 ? 0x8000u : (i * 2654435761u) & 0xffffu); /* ties too */
        memcpy(&raw[i], &u, sizeof u);
        rounded[i] = round_bf16(raw[i]);
    }
    raw[n / 2] = NAN, rounded[n / 2] = NAN;
    float want_amax, got_amax;
    k_fp8_amax_f32(&cpu, &want_amax, rounded, n);
    float *damax = dpoison_f32(1), *draw = df32(raw, n);
    k_fp8_amax_f32(&gpu, damax, draw, n);
    k_copy_d2h(&gpu, &got_amax, damax, sizeof got_amax);
    char measure[96];
    snprintf(measure, sizeof measure, "amax %a, want %a", got_amax, want_amax);
    report_bool("fp8_amax_f32", shape("%zu", n), memcmp(&got_amax, &want_amax, sizeof got_amax) == 0, measure);
    for (int f = 0; f < 2; f++) {
        float scale = fp8_scale(want_amax, (fp8_format)f);
        uint8_t *want = host_bytes(n), *got = host_bytes(n), *dout = dev_bytes(n, 1);
        k_fp8_cast_f32(&cpu, want, rounded, n, &scale, (fp8_format)f);
        poison(dout, n);
        k_fp8_cast_f32(&gpu, dout, draw, n, df32(&scale, 1), (fp8_format)f);
        k_copy_d2h(&gpu, got, dout, n);
        size_t wrong = 0;
        for (size_t i = 0; i < n; i++) wrong += got[i] != want[i];
        snprintf(measure, sizeof measure, "%zu of %zu codes wrong", wrong, n);
        report_bool(f ? "fp8_cast_f32 e5m2" : "fp8_cast_f32 e4m3", shape("%zu", n), wrong == 0, measure);
    }
    release_all();
}

/* k_fp8_transpose: every byte in its place, 4 bytes a thread (multiples of 4) or one. */
static void check_fp8_transpose(int rows, int cols) {
    size_t n = (size_t)rows * cols;
    uint8_t *in = host_bytes(n), *want = host_bytes(n), *got = host_bytes(n), *din = dev_bytes(n, 1), *dout = dev_bytes(n, 1);
    for (size_t i = 0; i < n; i++) in[i] = (uint8_t)(i * 2654435761u >> 13);
    k_fp8_transpose(&cpu, want, in, rows, cols);
    k_copy_h2d(&gpu, din, in, n);
    poison(dout, n);
    k_fp8_transpose(&gpu, dout, din, rows, cols);
    k_copy_d2h(&gpu, got, dout, n);
    size_t wrong = 0;
    for (size_t i = 0; i < n; i++) wrong += got[i] != want[i];
    char measure[64];
    snprintf(measure, sizeof measure, "%zu of %zu bytes wrong", wrong, n);
    report_bool("fp8_transpose", shape("%dx%d", rows, cols), wrong == 0, measure);
    release_all();
}

/* Every bf16 bit pattern: tensorwise, the infinities make amax infinite, so the scale is 1 and
 * the codes are the plain conversions of all 65536 values (NaNs, infinities and overflow
 * saturated, every tie, every subnormal); rowwise, 256 rows of 256 consecutive patterns (rows
 * with an infinity or NaN exponent at scale 1, the others scaled). */
static void check_fp8_all_bf16(void) {
    float *x = hfloats(65536);
    for (uint32_t i = 0; i < 65536; i++) x[i] = bf16_value((uint16_t)i);
    for (int f = 0; f < 2; f++) {
        compare_cast(x, 1, 65536, (fp8_format)f, K_FP8_TENSORWISE, 0, "every bf16 value");
        compare_cast(x, 256, 256, (fp8_format)f, K_FP8_ROWWISE, 0, "every bf16 value, 256 rows");
        compare_cast(x, 256, 256, (fp8_format)f, K_FP8_ROWWISE, 1, "every bf16 value, 256 rows");
    }
    release_all();
}

/* Why the GPU refuses the rowwise FP8 GEMM ("not built yet" on devices without cuBLASLt's
 * outer-vector scales, sm_90), or NULL where it runs: one 16x16x16 product probes it. */
static const char *fp8_rowwise_refused(void) {
    static errbuf err;
    static int probed;
    if (probed) return err.msg[0] ? err.msg : NULL;
    probed = 1;
    uint8_t *codes = dev_bytes(256, 16);
    float *one = df32((float[16]){1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, 16);
    k_fp8_gemm(&gpu, dpoison_comp(256), codes, one, FP8_E4M3, codes, one, FP8_E4M3, 16, 16, 16,
               K_FP8_ROWWISE);
    if (!k_sync(&gpu, &err) || !strstr(err.msg, "not built yet")) err.msg[0] = '\0';
    return err.msg[0] ? err.msg : NULL;
}

/* The GEMM's bound, element by element.  Both sides multiply the same codes by the same
 * scales, and a product of two fp8 values is exact (at most 4 x 4 significant bits), so
 * they differ only in how the K products are summed and rounded:
 *   - the output rounding to bf16, on both sides: bf16 has 8 significant bits, so a rounding
 *     to nearest is off by at most half an ulp, 2^-8 |y| (not 2^-9: the H200 found one
 *     element of M=33 N=48 K=80 at 1.02 of a bound built on 2^-9, where K is too small for
 *     the sum terms to hide it); 2^-7 |y| together, |y| the unrounded value, at most
 *     (1 + 2^-7) |want|;
 *   - the CPU's fp32 sum (OpenBLAS): at most K 2^-24 S, S = sa sb sum_k |a_k b_k|;
 *   - cuBLASLt's: Hopper's FP8 MMA adds its products into an accumulator of fewer bits than
 *     fp32 (about 14 significant bits, as DeepSeek-V3 measured, section 3.3.2), which
 *     cuBLASLt (fast accumulation off) promotes to fp32 every few k-blocks; taking at most 16
 *     additions between promotions, each off by at most 2^-14 of a partial sum <= S, bounds
 *     it by 16 2^-14 S = 2^-10 S (the fp32 sums after that add K/16 2^-24 S, inside it).
 * So |gpu - cpu| <= (1 + 2^-7) (2^-7 |cpu| + 2^-10 S + K 2^-24 S) (the GPU's rounding acts on
 * its own sum, off from the CPU's by the sum terms: the 2^-8 of those folds into the first
 * factor), S from a CPU GEMM of the codes' magnitudes (rounded to bf16 itself: taken 1%
 * larger).  A wrong scale, layout or format is
 * off by far more: |y| and S are of one order where the terms do not cancel. */
static void check_fp8_gemm(int M, int N, int K, fp8_format fa, fp8_format fb, k_fp8_scaling s) {
    seed(17);
    size_t na = (size_t)M * K, nb = (size_t)N * K, no = (size_t)M * N;
    size_t nsa = s == K_FP8_ROWWISE ? (size_t)M : 1, nsb = s == K_FP8_ROWWISE ? (size_t)N : 1;
    float *x = hrandom(na, 1.0f), *w = hrandom(nb, 0.02f);
    uint8_t *a = host_bytes(na), *b = host_bytes(nb), *abs_a = host_bytes(na), *abs_b = host_bytes(nb);
    float *sa = hfloats(nsa), *sb = hfloats(nsb), *want = hfloats(no), *mag = hfloats(no);
    k_fp8_cast(&cpu, a, sa, x, M, K, fa, s);
    k_fp8_cast(&cpu, b, sb, w, N, K, fb, s);
    k_fp8_gemm(&cpu, want, a, sa, fa, b, sb, fb, M, N, K, s);
    for (size_t i = 0; i < na; i++) abs_a[i] = a[i] & 0x7f;
    for (size_t i = 0; i < nb; i++) abs_b[i] = b[i] & 0x7f;
    k_fp8_gemm(&cpu, mag, abs_a, sa, fa, abs_b, sb, fb, M, N, K, s);

    void *out = dpoison_comp(no);
    k_fp8_gemm(&gpu, out, dbytes(a, na), df32(sa, nsa), fa, dbytes(b, nb), df32(sb, nsb), fb, M,
               N, K, s);
    float *got = get_comp(out, no);
    size_t outside = 0;
    double worst = 0.0;
    for (size_t i = 0; i < no; i++) {
        double S = 1.01 * mag[i];
        double bound = (1.0 + ldexp(1.0, -7)) *
                       (ldexp(fabs(want[i]), -7) + ldexp(S, -10) + K * ldexp(S, -24));
        double ratio = fabs((double)got[i] - want[i]) / bound;
        if (!(ratio <= 1.0)) outside++; /* NaN counts */
        if (ratio > worst || isnan(ratio)) worst = ratio;
    }
    char op[48], measure[64];
    snprintf(op, sizeof op, "fp8_gemm %s*%s %s", fa == FP8_E4M3 ? "e4m3" : "e5m2",
             fb == FP8_E4M3 ? "e4m3" : "e5m2", s == K_FP8_ROWWISE ? "rows" : "tensor");
    snprintf(measure, sizeof measure, "%zu outside bound (worst %.2f)", outside, worst);
    report_bool(op, shape("M=%d N=%d K=%d", M, N, K), outside == 0, measure);
    report(op, shape("M=%d N=%d K=%d", M, N, K), got, want, no, TOL_GEMM);
    release_all();
}

/* The GEMM where no sum can round: codes of -1, 0 and 1 (e4m3), so every partial sum is an
 * integer of at most K <= 4096 in magnitude, exact in any accumulator of 13 bits or more, and
 * power-of-two scales (a different one a row when rowwise): both sides then round the same
 * exact value to bf16 and must agree bit for bit.  What this isolates from check_fp8_gemm's
 * bound: the layout (which operand is transposed), the scales' mapping onto rows and
 * columns, the output's order. */
static void check_fp8_gemm_exact(int M, int N, int K, k_fp8_scaling s) {
    seed(19);
    size_t na = (size_t)M * K, nb = (size_t)N * K, no = (size_t)M * N;
    size_t nsa = s == K_FP8_ROWWISE ? (size_t)M : 1, nsb = s == K_FP8_ROWWISE ? (size_t)N : 1;
    uint8_t *a = host_bytes(na), *b = host_bytes(nb);
    for (size_t i = 0; i < na; i++) a[i] = fp8_from_f32((float)irand(3) - 1.0f, FP8_E4M3);
    for (size_t i = 0; i < nb; i++) b[i] = fp8_from_f32((float)irand(3) - 1.0f, FP8_E4M3);
    float *sa = hfloats(nsa), *sb = hfloats(nsb), *want = hfloats(no);
    for (size_t i = 0; i < nsa; i++) sa[i] = ldexpf(1.0f, (int)(i % 7) - 3);
    for (size_t i = 0; i < nsb; i++) sb[i] = ldexpf(1.0f, (int)(i % 5) - 6);
    k_fp8_gemm(&cpu, want, a, sa, FP8_E4M3, b, sb, FP8_E4M3, M, N, K, s);
    void *out = dpoison_comp(no);
    k_fp8_gemm(&gpu, out, dbytes(a, na), df32(sa, nsa), FP8_E4M3, dbytes(b, nb), df32(sb, nsb),
               FP8_E4M3, M, N, K, s);
    size_t wrong = count_different(get_comp(out, no), want, no);
    char measure[64];
    snprintf(measure, sizeof measure, "%zu of %zu wrong", wrong, no);
    report_bool(s == K_FP8_ROWWISE ? "fp8_gemm exact rows" : "fp8_gemm exact tensor",
                shape("M=%d N=%d K=%d", M, N, K), wrong == 0, measure);
    release_all();
}

/* ---- determinism: the same inputs twice give the same bits (same_bits) ---- */

/* cross_entropy in place twice on the same logits: the same loss and dlogits bits. */
static void check_ce_determinism(int N, int V) {
    size_t nv = (size_t)N * V;
    float *logits = hrandom(nv, 4.0f);
    int32_t *targets = hints((size_t)N);
    for (int n = 0; n < N; n++) targets[n] = irand(V);
    int32_t *dtargets = dints(targets, (size_t)N);
    void *log_a = dcomp(logits, nv), *log_b = dcomp(logits, nv);
    float *loss_a = df32(&(float){0.0f}, 1), *loss_b = df32(&(float){0.0f}, 1);
    k_cross_entropy(&gpu, loss_a, log_a, log_a, dtargets, N, V, 1.0f / N);
    k_cross_entropy(&gpu, loss_b, log_b, log_b, dtargets, N, V, 1.0f / N);
    report_bool("deterministic cross_entropy", shape("N=%d V=%d", N, V),
                same_bits(loss_a, loss_b, 4) && same_bits(log_a, log_b, nv * esize),
                "same bits twice");
}

static void check_determinism(void) {
    seed(12);
    int N = 2046, C = 4096, V = 32000;
    size_t nc = (size_t)N * C, vc = (size_t)V * C;

    int32_t *tok = dints(repeating_tokens(N, V), (size_t)N);
    void *dout = dcomp(hrandom(nc, 1.0f), nc);
    float *dwte0 = hrandom(vc, 1.0f);
    float *dwte_a = df32(dwte0, vc), *dwte_b = df32(dwte0, vc);
    k_embedding_bwd(&gpu, dwte_a, dout, tok, N, C, V);
    k_embedding_bwd(&gpu, dwte_b, dout, tok, N, C, V);
    report_bool("deterministic embedding_bwd", shape("N=%d C=%d V=%d", N, C, V),
                same_bits(dwte_a, dwte_b, vc * sizeof(float)), "same bits twice");

    float *x = hrandom(nc, 1.0f), *din0 = hrandom(nc, 1.0f), *dw0 = hrandom((size_t)C, 10.0f);
    float *rstd0 = hfloats((size_t)N);
    for (int n = 0; n < N; n++) rstd0[n] = 1.0f + 0.1f * frand();
    void *dx = dcomp(x, nc), *w = dcomp(hrandom((size_t)C, 1.0f), (size_t)C);
    float *rstd = df32(rstd0, (size_t)N);
    void *din_a = dcomp(din0, nc), *din_b = dcomp(din0, nc);
    float *dw_a = df32(dw0, (size_t)C), *dw_b = df32(dw0, (size_t)C);
    k_rmsnorm_bwd(&gpu, din_a, dw_a, dout, dx, w, rstd, N, C);
    k_rmsnorm_bwd(&gpu, din_b, dw_b, dout, dx, w, rstd, N, C);
    report_bool("deterministic rmsnorm_bwd", shape("N=%d C=%d", N, C),
                same_bits(din_a, din_b, nc * esize) && same_bits(dw_a, dw_b, (size_t)C * 4),
                "same bits twice");

    check_ce_determinism(N, V);
    check_ce_determinism(64, 128256); /* Llama 3's rows, longer than shared memory: the tail read twice */

    size_t n = (size_t)50 << 20;
    float *big = df32(hrandom(n, 1.0f), n);
    float *sum_a = df32(&(float){0.0f}, 1), *sum_b = df32(&(float){0.0f}, 1);
    k_sumsq_f32(&gpu, sum_a, big, n);
    k_sumsq_f32(&gpu, sum_b, big, n);
    report_bool("deterministic sumsq_f32", shape("n=%zu", n), same_bits(sum_a, sum_b, 4),
                "same bits twice");

    int I = 4096, O = 4096;
    void *in = dcomp(hrandom((size_t)N * I, 1.0f), (size_t)N * I);
    void *g = dcomp(hrandom((size_t)N * O, 1.0f), (size_t)N * O);
    float *w0 = hrandom((size_t)O * I, 1.0f);
    float *gw_a = df32(w0, (size_t)O * I), *gw_b = df32(w0, (size_t)O * I);
    k_linear_bwd(&gpu, NULL, gw_a, g, in, NULL, N, I, O, 0);
    k_linear_bwd(&gpu, NULL, gw_b, g, in, NULL, N, I, O, 0);
    report_bool("deterministic linear_bwd dw", shape("N=%d I=%d O=%d", N, I, O),
                same_bits(gw_a, gw_b, (size_t)O * I * 4), "same bits twice");
    release_all();
}

/* ---- bad input: reported by k_sync with the CPU backend's wording, then cleared ---- */

static void expect_failure(const char *op, const char *wanted) {
    errbuf err = {{0}}, again = {{0}};
    int failed = k_sync(&gpu, &err) != 0;
    int cleared = k_sync(&gpu, &again) == 0;
    char note[1200];
    if (!failed)
        snprintf(note, sizeof note, "no failure reported (wanted \"%s\")", wanted);
    else if (!cleared)
        snprintf(note, sizeof note, "failure not cleared: %s", again.msg);
    else
        snprintf(note, sizeof note, "\"%s\"", err.msg);
    verdict(op, "bad input", "reported by k_sync", failed && strstr(err.msg, wanted) && cleared,
            note);
}

static void check_failures(void) {
    int N = 16, C = 64, V = 1000;
    int32_t tok[16] = {0};
    tok[5] = V;
    void *table = dev_bytes((size_t)V * C * esize, esize);
    void *out = dev_bytes((size_t)N * C * esize, esize);
    k_embedding_fwd(&gpu, out, dints(tok, 16), table, N, C, V);
    expect_failure("embedding_fwd", "token 1000 at row 5 is outside the vocabulary [0, 1000)");

    tok[5] = 0;
    tok[2] = -3;
    float *dwte = dev_bytes((size_t)V * C * 4, 4);
    k_embedding_bwd(&gpu, dwte, out, dints(tok, 16), N, C, V);
    expect_failure("embedding_bwd", "embedding backward: token -3 at row 2");

    int32_t targets[16];
    for (int n = 0; n < N; n++) targets[n] = n % 2 ? K_IGNORE_INDEX : n;
    targets[4] = V + 1;
    void *logits = dev_bytes((size_t)N * V * esize, esize);
    float *loss = dev_bytes(4, 4);
    k_cross_entropy(&gpu, loss, logits, logits, dints(targets, 16), N, V, 1.0f);
    expect_failure("cross_entropy", "target 1001 at row 4 is outside the vocabulary");

    float *p = dev_bytes(64 * 4, 4);
    k_adamw(&gpu, p, p, p, p, 64, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.0f, 0, 1.0f, NULL);
    expect_failure("adamw", "step 0 must count from 1");

    k_rope(&gpu, out, p, NULL, 1, 2, 2, 127, 0);
    expect_failure("rope", "head dim 127 is odd");

    k_dropout(&gpu, out, out, dlongs(&(int64_t){0}, 1), 1, 0, 1, N, C, 1.0f, 0);
    expect_failure("dropout", "dropout: probability 1 is outside [0, 1)");

    if (gpu.backend == K_CUDA) {
        uint8_t *codes = dev_bytes(4096, 16);
        k_fp8_gemm(&gpu, out, codes, p, FP8_E4M3, codes, p, FP8_E4M3, 4, 16, 100, K_FP8_TENSORWISE);
        expect_failure("fp8_gemm", "needs K % 16 == 0 and N % 8 == 0, not N=16 K=100");
        k_fp8_gemm(&gpu, out, codes + 1, p, FP8_E4M3, codes, p, FP8_E4M3, 4, 16, 64, K_FP8_TENSORWISE);
        expect_failure("fp8_gemm", "needs 16-byte aligned a, b and out");
        k_attention_fwd(&gpu, out, p, out, out, out, NULL, 0, 1, 4, 2, 1, 300);
        expect_failure("attention_fwd", "head dim 300 is not supported");
        k_attention_bwd(&gpu, out, out, out, out, out, out, out, out, p, NULL, 0, 1, 4, 2, 1, 300);
        expect_failure("attention_bwd", "head dim 300 is not supported");
    }
    release_all();
}

/* ---- bench ---- */

#define REPS 20
#define WARMUP 3
#define HBM_BYTES_PER_S 4.27e12
#define BF16_FLOPS_PER_S 785e12
#define FP8_FLOPS_PER_S (2 * BF16_FLOPS_PER_S) /* Hopper's FP8 peak is twice its bf16's */

static double flops_floor = BF16_FLOPS_PER_S; /* the FLOP rate of the floor of the next lines */

static cudaEvent_t events[REPS + 1];

static void cuda_or_die(cudaError_t e, const char *what) {
    if (e != cudaSuccess) die("%s: %s", what, cudaGetErrorString(e));
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Reads the events of the last timed runs and prints the op's line. */
static void bench_line(const char *op, const char *shp, double bytes, double flops) {
    float ms[REPS];
    cuda_or_die(cudaEventSynchronize(events[REPS]), "cudaEventSynchronize");
    errbuf err;
    if (k_sync(&gpu, &err)) die("%s: %s", op, err.msg);
    for (int r = 0; r < REPS; r++)
        cuda_or_die(cudaEventElapsedTime(&ms[r], events[r], events[r + 1]), "cudaEventElapsedTime");
    qsort(ms, REPS, sizeof ms[0], cmp_float);
    double s = (ms[REPS / 2 - 1] + ms[REPS / 2]) / 2.0 / 1e3; /* median */
    double floor_bytes = bytes / HBM_BYTES_PER_S, floor_flops = flops / flops_floor;
    double floor = floor_bytes > floor_flops ? floor_bytes : floor_flops;
    char rate[32];
    if (flops > 0)
        snprintf(rate, sizeof rate, "%7.1f TFLOP/s", flops / s / 1e12);
    else
        snprintf(rate, sizeof rate, "%7.0f GB/s", bytes / s / 1e9);
    printf("%-22s %-28s %10.1f us %16s %10.1f us %6.2fx\n", op, shp, s * 1e6, rate, floor * 1e6,
           s / floor);
    fflush(stdout);
}

/* Runs `...` WARMUP times, then REPS times between events, and prints its line. */
#define BENCH(op, shp, bytes, flops, ...)                                         \
    do {                                                                          \
        for (int w_ = 0; w_ < WARMUP; w_++) {                                     \
            __VA_ARGS__;                                                          \
        }                                                                         \
        for (int r_ = 0; r_ < REPS; r_++) {                                       \
            cuda_or_die(cudaEventRecord(events[r_], stream), "cudaEventRecord"); \
            __VA_ARGS__;                                                          \
        }                                                                         \
        cuda_or_die(cudaEventRecord(events[REPS], stream), "cudaEventRecord");   \
        bench_line(op, shp, (double)(bytes), (double)(flops));                   \
    } while (0)

/* Random device data from a host pool (never zeros: they can run faster than real data). */
#define POOL (16u << 20)
static float *pool;

static void fill(void *dev, size_t n, int bf16, float scale, int positive) {
    static uint16_t *bits;
    static float *vals;
    if (!pool) {
        pool = malloc(POOL * sizeof *pool);
        bits = malloc(POOL * sizeof *bits);
        vals = malloc(POOL * sizeof *vals);
        if (!pool || !bits || !vals) die("out of host memory");
        for (size_t i = 0; i < POOL; i++) pool[i] = frand();
    }
    size_t elem = bf16 ? 2 : 4;
    for (size_t at = 0; at < n; at += POOL) {
        size_t chunk = n - at < POOL ? n - at : POOL;
        for (size_t i = 0; i < chunk; i++) {
            float v = pool[(i + at / 7) % POOL] * scale; /* each chunk starts elsewhere */
            if (positive) v = fabsf(v);
            if (bf16)
                bits[i] = bf16_bits(v);
            else
                vals[i] = v;
        }
        k_copy_h2d(&gpu, (char *)dev + at * elem, bf16 ? (void *)bits : (void *)vals,
                   chunk * elem);
    }
}

static void *bench_bf16(size_t n, float scale) {
    void *d = dev_bytes(n * 2, 2);
    fill(d, n, 1, scale, 0);
    return d;
}

static float *bench_f32(size_t n, float scale, int positive) {
    float *d = dev_bytes(n * 4, 4);
    fill(d, n, 0, scale, positive);
    return d;
}

static void run_bench(void) {
    const int N = 4 * 2048, C = 4096, I = 11008, V = 32000, H = 32, hd = 128;
    const size_t nc = (size_t)N * C, ni = (size_t)N * I, nv = (size_t)N * V;
    const size_t layer = 4 * (size_t)C * C + 3 * (size_t)C * I + 2 * (size_t)C; /* 7B layer */
    cudaStream_t stream = (cudaStream_t)gpu.stream;
    struct cudaDeviceProp prop;
    cuda_or_die(cudaGetDeviceProperties(&prop, gpu.device), "cudaGetDeviceProperties");
    for (int i = 0; i <= REPS; i++) cuda_or_die(cudaEventCreate(&events[i]), "cudaEventCreate");
    seed(13);
    printf("bench: %s, %d SMs; Llama-2-7B shapes N=%d C=%d I=%d V=%d; median of %d runs\n",
           prop.name, prop.multiProcessorCount, N, C, I, V, REPS);
    printf("%-22s %-28s %13s %16s %13s %7s\n", "op", "shape", "time", "achieved", "floor",
           "/floor");

    /* parameters of one layer (fp32 master, grad, m, v and the bf16 copy) */
    float *p = bench_f32(layer, 1.0f, 0), *g = bench_f32(layer, 1.0f, 0);
    float *m = bench_f32(layer, 0.1f, 0), *v = bench_f32(layer, 0.01f, 1);
    void *p16 = dev_bytes(layer * 2, 2);
    float *sum = bench_f32(1, 1.0f, 1);
    char ls[32];
    snprintf(ls, sizeof ls, "n=%zu (7B layer)", layer);
    BENCH("f32_to_compute", ls, 6.0 * layer, 0, k_f32_to_compute(&gpu, p16, p, layer));
    BENCH("compute_to_f32", ls, 6.0 * layer, 0, k_compute_to_f32(&gpu, g, p16, layer));
    fill(g, layer, 0, 1.0f, 0);
    BENCH("add_f32", ls, 12.0 * layer, 0, k_add_f32(&gpu, m, g, layer));
    BENCH("sumsq_f32", ls, 4.0 * layer, 0, k_sumsq_f32(&gpu, sum, g, layer));
    fill(m, layer, 0, 0.1f, 0);
    BENCH("adamw", ls, 28.0 * layer, 0,
          k_adamw(&gpu, p, g, m, v, layer, 1e-5f, 0.9f, 0.95f, 1e-8f, 0.1f, 10, 1.0f, NULL));

    /* activations [N, C] */
    void *a = bench_bf16(nc, 1.0f), *b = bench_bf16(nc, 1.0f), *out = bench_bf16(nc, 1.0f);
    char sh[64];
    snprintf(sh, sizeof sh, "N=%d C=%d", N, C);
    BENCH("accumulate", sh, 6.0 * nc, 0, k_accumulate(&gpu, out, a, nc));
    BENCH("scale", sh, 4.0 * nc, 0, k_scale(&gpu, out, 1.0f, nc));
    const int64_t samples_host[4] = {0, 1, 2, 3};
    int64_t *samples = dlongs(samples_host, 4);
    snprintf(sh, sizeof sh, "B=4 T=2048 cols=%d p=0.1", C);
    BENCH("dropout", sh, 4.0 * nc, 0, k_dropout(&gpu, out, a, samples, 1, 0, 4, 2048, C, 0.1f, 0));
    BENCH("dropout (+=)", sh, 6.0 * nc, 0,
          k_dropout(&gpu, out, a, samples, 1, 0, 4, 2048, C, 0.1f, 1));

    int32_t *tok_host = hints((size_t)N);
    for (int n = 0; n < N; n++) tok_host[n] = irand(V);
    int32_t *tok = dints(tok_host, (size_t)N);
    void *wte = bench_bf16((size_t)V * C, 1.0f);
    float *dwte = bench_f32((size_t)V * C, 1.0f, 0);
    snprintf(sh, sizeof sh, "N=%d C=%d V=%d", N, C, V);
    BENCH("embedding_fwd", sh, 4.0 * nc + 4.0 * N, 0, k_embedding_fwd(&gpu, out, tok, wte, N, C, V));
    BENCH("embedding_bwd", sh, 2.0 * nc + 8.0 * nc + 4.0 * N, 0,
          k_embedding_bwd(&gpu, dwte, a, tok, N, C, V));

    void *w = bench_bf16((size_t)C, 1.0f);
    float *rstd = bench_f32((size_t)N, 1.0f, 1), *dw = bench_f32((size_t)C, 1.0f, 0);
    snprintf(sh, sizeof sh, "N=%d C=%d", N, C);
    BENCH("rmsnorm_fwd", sh, 4.0 * nc + 2.0 * C + 4.0 * N, 0,
          k_rmsnorm_fwd(&gpu, out, rstd, a, w, N, C, 1e-5f));
    BENCH("rmsnorm_bwd", sh, 8.0 * nc + 2.0 * C + 4.0 * N + 8.0 * C, 0,
          k_rmsnorm_bwd(&gpu, out, dw, a, b, w, rstd, N, C));

    float inv_host[64];
    k_rope_inv_freq(&llama2_rope, hd, inv_host);
    float *inv = df32(inv_host, (size_t)hd / 2);
    snprintf(sh, sizeof sh, "B=4 T=2048 H=%d hd=%d", H, hd);
    BENCH("rope", sh, 4.0 * nc, 0, k_rope(&gpu, out, inv, NULL, 4, 2048, H, hd, 0));
    BENCH("rope inverse", sh, 4.0 * nc, 0, k_rope(&gpu, out, inv, NULL, 4, 2048, H, hd, 1));
    snprintf(sh, sizeof sh, "B=4 T=2048 H=8 hd=%d", hd); /* GQA 4:1 k */
    BENCH("rope", sh, 4.0 * N * 8 * hd, 0, k_rope(&gpu, out, inv, NULL, 4, 2048, 8, hd, 0));

    /* MLP activations [N, I] */
    void *gate = bench_bf16(ni, 2.0f), *up = bench_bf16(ni, 1.0f), *sw = bench_bf16(ni, 1.0f);
    void *dgate = bench_bf16(ni, 1.0f), *dup = bench_bf16(ni, 1.0f);
    snprintf(sh, sizeof sh, "N=%d I=%d", N, I);
    BENCH("swiglu_fwd", sh, 6.0 * ni, 0, k_swiglu_fwd(&gpu, sw, gate, up, ni));
    BENCH("swiglu_bwd", sh, 10.0 * ni, 0, k_swiglu_bwd(&gpu, dgate, dup, sw, gate, up, ni));

    /* linear layers: q/o (C -> C), gate/up (C -> I), down (I -> C), lm_head (C -> V) */
    struct {
        const char *name;
        int in, out;
    } lin[] = {{"q_proj", C, C}, {"gate_proj", C, I}, {"down_proj", I, C}, {"lm_head", C, V}};
    void *logits = bench_bf16(nv, 2.0f);
    for (size_t k = 0; k < sizeof lin / sizeof lin[0]; k++) {
        int li = lin[k].in, lo = lin[k].out;
        size_t wi = (size_t)li * lo;
        void *W = bench_bf16(wi, 0.02f);
        float *dW = bench_f32(wi, 0.01f, 0);
        void *x = li == C ? a : sw, *y = lo == C ? out : lo == I ? gate : logits;
        void *dx = li == C ? b : dup;
        double flops = 2.0 * N * li * lo;
        snprintf(sh, sizeof sh, "%s N=%d %d->%d", lin[k].name, N, li, lo);
        BENCH("linear_fwd", sh, 2.0 * ((double)N * li + wi + (double)N * lo), flops,
              k_linear_fwd(&gpu, y, x, W, N, li, lo));
        BENCH("linear_bwd", sh,
              2.0 * ((double)N * lo + wi + (double)N * li) + 2.0 * ((double)N * lo + (double)N * li) +
                  8.0 * wi,
              2.0 * flops, k_linear_bwd(&gpu, dx, dW, y, x, W, N, li, lo, 0));
    }

    /* FP8 (F45): the fused cast of an activation [N, C] (bf16 in, codes and scales out), then
     * the GEMMs at the 7B training shapes, bf16 (linear_fwd) beside fp8 tensorwise and rowwise;
     * the fp8 floor at twice the bf16 rate */
    uint8_t *a8 = dev_bytes(ni, 16), *w8 = dev_bytes((size_t)I * C, 16);
    float *sa8 = bench_f32((size_t)N, 1.0f, 1), *sw8 = bench_f32((size_t)I, 1.0f, 1);
    for (int s = 0; s < 2; s++) {
        snprintf(sh, sizeof sh, "%s N=%d C=%d", s ? "rowwise" : "tensorwise", N, C);
        BENCH("fp8_cast e4m3", sh, 3.0 * nc + 4.0 * (s ? N : 1), 0,
              k_fp8_cast(&gpu, a8, sa8, a, N, C, FP8_E4M3, (k_fp8_scaling)s));
        BENCH("fp8_cast_t e4m3", sh, 3.0 * nc + 4.0 * (s ? C : 1), 0,
              k_fp8_cast_t(&gpu, a8, sa8, a, N, C, FP8_E4M3, (k_fp8_scaling)s));
    }
    const int fp8_outs[2] = {C, I};
    for (int k = 0; k < 2; k++) {
        int no8 = fp8_outs[k];
        void *W = bench_bf16((size_t)no8 * C, 0.02f), *y = no8 == C ? out : gate;
        double flops = 2.0 * N * C * no8, bytes16 = 2.0 * ((double)N * C + (double)no8 * C + (double)N * no8);
        snprintf(sh, sizeof sh, "M=%d N=%d K=%d", N, no8, C);
        BENCH("linear_fwd bf16", sh, bytes16, flops, k_linear_fwd(&gpu, y, a, W, N, C, no8));
        flops_floor = FP8_FLOPS_PER_S;
        for (int s = 0; s < 2; s++) {
            k_fp8_cast(&gpu, a8, sa8, a, N, C, FP8_E4M3, (k_fp8_scaling)s);
            k_fp8_cast(&gpu, w8, sw8, W, no8, C, FP8_E4M3, (k_fp8_scaling)s);
            if (s == K_FP8_ROWWISE && fp8_rowwise_refused()) {
                printf("%-22s %-28s not run: %s\n", "fp8_gemm rowwise", sh, fp8_rowwise_refused());
                continue;
            }
            BENCH(s ? "fp8_gemm rowwise" : "fp8_gemm tensorwise", sh,
                  (double)N * C + (double)no8 * C + 2.0 * N * no8, flops,
                  k_fp8_gemm(&gpu, y, a8, sa8, FP8_E4M3, w8, sw8, FP8_E4M3, N, no8, C,
                             (k_fp8_scaling)s));
        }
        flops_floor = BF16_FLOPS_PER_S;
    }

    /* LoRA, rank 16, on a C -> C projection: A (C -> r), then B (r -> C) added onto the output */
    const int r = 16;
    void *lora_a = bench_bf16((size_t)r * C, 0.02f), *lora_b = bench_bf16((size_t)C * r, 0.02f);
    void *h = bench_bf16((size_t)N * r, 1.0f);
    snprintf(sh, sizeof sh, "lora_A N=%d %d->%d", N, C, r);
    BENCH("linear_fwd", sh, 2.0 * ((double)N * C + (double)r * C + (double)N * r),
          2.0 * N * C * r, k_linear_fwd(&gpu, h, a, lora_a, N, C, r));
    snprintf(sh, sizeof sh, "lora_B N=%d %d->%d", N, r, C);
    BENCH("linear_fwd_acc", sh, 2.0 * ((double)N * r + (double)C * r + 2.0 * N * C),
          2.0 * N * r * C, k_linear_fwd_acc(&gpu, out, h, lora_b, N, r, C));

    int32_t *targets = dints(tok_host, (size_t)N);
    float *loss = bench_f32(1, 1.0f, 1);
    snprintf(sh, sizeof sh, "N=%d V=%d in place", N, V);
    BENCH("cross_entropy", sh, 4.0 * nv + 8.0 * N, 0,
          k_cross_entropy(&gpu, loss, logits, logits, targets, N, V, 1.0f / N));
    /* Llama 3's head, a chunk of 2048 rows: rows longer than shared memory */
    const int N3 = 2048, V3 = 128256;
    const size_t nv3 = (size_t)N3 * V3;
    void *logits3 = bench_bf16(nv3, 2.0f);
    snprintf(sh, sizeof sh, "N=%d V=%d in place", N3, V3);
    BENCH("cross_entropy", sh, 4.0 * nv3 + 8.0 * N3, 0,
          k_cross_entropy(&gpu, loss, logits3, logits3, targets, N3, V3, 1.0f / N3));

    /* NF4 dequantization of a QLoRA layer's base weights (bf16 out): q_proj and gate_proj;
     * bytes: codes n/2, bf16 out 2n, absmax (1 byte a block double quantized, else 4) */
    const struct {
        const char *name;
        size_t n;
    } nf4w[] = {{"q_proj", (size_t)C * C}, {"gate_proj", (size_t)C * I}};
    for (size_t k = 0; k < sizeof nf4w / sizeof nf4w[0]; k++) {
        size_t n = nf4w[k].n, blocks = n / 64, nested_n = (blocks + 255) / 256;
        uint8_t *codes = host_bytes(n / 2 + blocks);
        for (size_t i = 0; i < n / 2 + blocks; i++) codes[i] = (uint8_t)(next_u64() >> 56);
        uint8_t *dpacked = dbytes(codes, n / 2), *dabsmax_q = dbytes(codes + n / 2, blocks);
        float *dabsmax = bench_f32(blocks, 0.05f, 1), *dnested = bench_f32(nested_n, 0.02f, 1);
        void *w16 = dev_bytes(n * 2, 2);
        snprintf(sh, sizeof sh, "%s %zu values", nf4w[k].name, n);
        BENCH("nf4_dequant", sh, 2.5 * n + 4.0 * blocks, 0,
              k_nf4_dequant(&gpu, w16, dpacked, dabsmax, NULL, 0.0f, n));
        BENCH("nf4_dequant double", sh, 2.5 * n + 1.0 * blocks + 4.0 * nested_n, 0,
              k_nf4_dequant(&gpu, w16, dpacked, dabsmax_q, dnested, 0.01f, n));
    }
    release_all();
    for (int i = 0; i <= REPS; i++) cudaEventDestroy(events[i]);
}

/* ---- main ---- */

int main(int argc, char **argv) {
    const char *mode = argc == 2 ? argv[1] : "";
    int bench = strcmp(mode, "--bench") == 0, self_test = strcmp(mode, "--cpu") == 0;
    if (argc > 2 || (argc == 2 && !bench && !self_test)) {
        fprintf(stderr, "usage: %s [--bench | --cpu]\n", argv[0]);
        return 2;
    }
    errbuf err;
    if (self_test) { /* the CPU backend stands in for CUDA: checks this program itself */
        if (kctx_init(&gpu, K_CPU, 0, &err)) die("%s", err.msg);
    } else {
        if (!k_cuda_available()) die("no CUDA device visible (k_cuda_available() is 0)");
        if (kctx_init(&gpu, K_CUDA, 0, &err)) die("%s", err.msg);
    }
    esize = k_compute_size(&gpu);
    if (bench) {
        run_bench();
        kctx_destroy(&gpu);
        return 0;
    }
    if (kctx_init(&cpu, K_CPU, 0, &err)) die("%s", err.msg);
    time_t start = time(NULL);

    check_memory(((size_t)1 << 20) + 3);
    check_copy_stream(((size_t)64 << 20) + 5);
    check_shared_image(((size_t)32 << 20) + 3);
    check_failures();
    for (misalign = 0; misalign <= 1; misalign++) {
        size_t n = misalign ? 12345 : (size_t)2046 * 4096;
        check_casts(n);
        check_elementwise(n);
        check_swiglu(misalign ? n : (size_t)2046 * 11008);
    }
    misalign = 0;

    check_embedding_fwd(2046, 4096, 32000);
    check_embedding_fwd(2046, 8192, 128256); /* offsets past 2^31 bytes */
    check_embedding_bwd(2046, 4096, 32000);
    check_embedding_bwd(2046, 4096, 128256); /* fp32 offsets past 2^31 bytes */
    check_embedding_fwd(33, 100, 1001);      /* rows of odd length: one element per thread */
    check_embedding_bwd(33, 100, 1001);

    check_rmsnorm(2046, 4096);
    check_rmsnorm(257, 8192);
    check_rmsnorm(33, 4100); /* C % 8 != 0 */
    check_rmsnorm_frozen(8, 65536); /* dw's C floats would not fit in shared memory */

    check_rope(2, 1023, 64, 128, &llama3_rope, "llama3 q");
    check_rope(2, 1023, 8, 128, &llama3_rope, "llama3 kv");
    check_rope(1, 4096, 32, 128, &llama2_rope, "llama2");
    check_rope(1, 131072, 1, 128, &llama3_rope, "llama3 long");
    check_rope_docs(2, 1023, 8, 128, &llama3_rope, "llama3 kv", 300); /* packed rows */
    check_rope(2, 333, 128, 128, &llama3_rope, "llama3 405B q"); /* 128 heads: a token in two rounds */
    check_rope(2, 300, 8, 64, &llama2_rope, "llama2");
    check_rope_docs(2, 1023, 4, 64, &llama2_rope, "llama2", 17);
    check_rope(3, 77, 5, 72, &llama2_rope, "llama2");        /* hd/2 % 8 != 0: one at a time */
    check_rope(1, 3, 2, 12800, &llama2_rope, "llama2"); /* angles past shared memory */
    misalign = 1;
    check_rope(2, 100, 4, 128, &llama2_rope, "llama2");
    misalign = 0;

    check_linear(2046, 4096, 4096);
    check_linear(2046, 4096, 1024);   /* GQA k/v */
    check_linear(1023, 4096, 11008);  /* gate/up */
    check_linear(1023, 11008, 4096);  /* down */
    check_linear(257, 8192, 8192);    /* 70B q/o */
    check_linear(257, 4096, 32000);   /* Llama 2 head */
    check_linear(129, 4096, 128256);  /* Llama 3 head */
    check_linear(65, 4096, 32001);    /* a vocabulary with an added token */
    check_linear(2046, 4096, 16);     /* LoRA A, rank 16 */
    check_linear(2046, 16, 4096);     /* LoRA B */
    check_linear_ld(2046, 64, 4096, 192, 64); /* a fused q/k/v group's k: B, dB, dt */
    check_linear_ld(67, 8, 40, 24, 16);
    misalign = 1;
    check_linear(33, 100, 77);
    check_bias(4096, 3584 + 2 * 512); /* Qwen2.5-7B's q, k and v biases side by side */
    check_bias(8191, 512);            /* more rows than a partial pass has */
    check_bias(3, 37);
    misalign = 0;

    check_cross_entropy(2046, 32000);
    check_cross_entropy(257, 128256);
    check_cross_entropy(65, 32001); /* V % 8 != 0 */
    check_cross_entropy(3, 128256); /* a few rows of Llama 3: longer than shared memory */
    check_cross_entropy(5, 200000); /* many rounds of the block past shared memory */
    check_cross_entropy(1, 8);      /* a row shorter than a block */
    misalign = 1;                   /* one element at a time, row in shared memory or not */
    check_cross_entropy(33, 32000);
    check_cross_entropy(9, 128256);
    misalign = 0;

    { /* decode steps of rows at their own positions, a prefill, a long row (several chunks) */
        const int32_t pos3[] = {0, 37, 300}, pos1[] = {0}, pos_long[] = {1500};
        check_attention_kv(3, 1, 512, 32, 8, 128, pos3);
        check_attention_kv(3, 1, 512, 8, 8, 64, pos3);
        check_attention_kv(1, 77, 512, 32, 8, 128, pos1);
        check_attention_kv(1, 1, 2048, 4, 4, 16, pos_long);
    }

    check_adamw((size_t)16 << 20, 1);
    check_adamw((size_t)16 << 20, 1000);
    misalign = 1;
    check_adamw(1000003, 7);
    misalign = 0;

    check_dropout(4, 2048, 4096, 0.1f);  /* an attention projection's input */
    check_dropout(2, 1023, 11008, 0.05f); /* down_proj's */
    check_dropout(1, 64, 4096, 0.0f);     /* the identity */
    check_dropout(3, 33, 101, 0.5f);      /* rows of 3333: groups of 4 end short */
    misalign = 1;
    check_dropout(2, 16, 64, 0.3f);  /* whole groups, unaligned: one element at a time */
    check_dropout(3, 33, 101, 0.5f);
    misalign = 0;

    check_determinism();

    /* NF4: Llama-2-7B q_proj and gate_proj, an odd count (the one-value tail), > 256 blocks
     * that are no multiple of 256, and unaligned buffers (one value a thread throughout) */
    for (int dq = 0; dq <= 1; dq++) {
        check_nf4_dequant((size_t)4096 * 4096, dq);
        check_nf4_dequant((size_t)11008 * 4096, dq);
        check_nf4_dequant((size_t)333 * 77, dq);
        check_nf4_dequant(1, dq);
        misalign = 1;
        check_nf4_dequant(257 * 64 + 33, dq);
        misalign = 0;
    }

    /* FP8: the 7B activations and weights (q_proj, gate_proj), odd sizes (one value a thread),
     * unaligned buffers; the GEMM at the 7B shapes both scalings, a gradient's e5m2 on
     * either side, M not a multiple of 16 */
    check_fp8_all_bf16();
    check_fp8_cast(4096, 4096, 0);
    check_fp8_cast(8192, 11008, 0);
    check_fp8_cast(333, 77, 0);
    check_fp8_cast(1, 1, 0);
    check_fp8_cast(4096, 4096, 1);  /* W^T of q_proj */
    check_fp8_cast(8192, 11008, 1); /* dout^T of gate_proj */
    check_fp8_cast(333, 77, 1);
    check_fp8_cast(200, 72, 1); /* multiples of 8 (the 64 x 64 tiles' kernel), partial tiles */
    check_fp8_cast(8, 8, 1);
    check_fp8_master(4096 * 4096 + 4); /* q_proj's size: 4 a thread */
    check_fp8_master(100003);
    check_fp8_transpose(4096, 11008); /* gate_proj's W */
    check_fp8_transpose(200, 72);
    check_fp8_transpose(33, 70);
    misalign = 1;
    check_fp8_cast(129, 4096, 0);
    check_fp8_master(4096);
    check_fp8_transpose(64, 64);
    check_fp8_cast(129, 100, 1);
    misalign = 0;
    for (int s = 0; s < 2; s++) {
        if (s == K_FP8_ROWWISE && fp8_rowwise_refused()) {
            skip("fp8_gemm rows (7 cases)", "all shapes", fp8_rowwise_refused());
            continue;
        }
        check_fp8_gemm(8192, 4096, 4096, FP8_E4M3, FP8_E4M3, (k_fp8_scaling)s);
        check_fp8_gemm(2046, 11008, 4096, FP8_E4M3, FP8_E4M3, (k_fp8_scaling)s);
        check_fp8_gemm(2046, 4096, 11008, FP8_E5M2, FP8_E4M3, (k_fp8_scaling)s);
        check_fp8_gemm(2046, 4096, 4096, FP8_E4M3, FP8_E5M2, (k_fp8_scaling)s);
        check_fp8_gemm(33, 48, 80, FP8_E4M3, FP8_E4M3, (k_fp8_scaling)s);
        check_fp8_gemm_exact(2046, 1024, 4096, (k_fp8_scaling)s);
        check_fp8_gemm_exact(33, 48, 80, (k_fp8_scaling)s);
    }

    printf("(%ld s)\n", (long)(time(NULL) - start));
    if (n_skipped) printf("%d skipped (not runnable on this device, see SKIP above)\n", n_skipped);
    printf("%d passed, %d failed\n", n_passed, n_failed);
    kctx_destroy(&gpu);
    kctx_destroy(&cpu);
    return n_failed ? 1 : 0;
}
