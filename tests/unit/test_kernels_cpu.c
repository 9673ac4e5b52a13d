/* Tests for the CPU (fp32 reference) backend of kernels.h.
 *
 * Every op with a backward pass is checked against numerical derivatives of the scalar
 * L = sum(out * R) for a fixed random R: the analytic gradient is the op's backward pass
 * applied to dout = R, the numerical one is a fourth-order central difference over the
 * fp32 inputs.  Both are compared as whole tensors (||a - b|| / ||b||) with a tolerance of
 * 1e-4: well above the finite-difference noise (about 1e-6 here) and far below what a
 * wrong sign or a missing term gives. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/philox.h"
#include "kernels/kernels.h"
#include "proto/nf4.h"

#define GRAD_TOL 1e-4

/* ---- helpers ---- */

static uint64_t rng_state = 0x2545F4914F6CDD1DULL;

static void seed(uint64_t s) {
    rng_state = s * 0x9E3779B97F4A7C15ULL + 1;
}

static float *floats(size_t n) {
    float *x = calloc(n, sizeof(float));
    assert_non_null(x);
    return x;
}

/* uniform in [-1, 1) */
static float frand(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    uint64_t r = rng_state * 0x2545F4914F6CDD1DULL;
    return (float)((double)(r >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static float *random_floats(size_t n, float scale) {
    float *x = floats(n);
    for (size_t i = 0; i < n; i++) x[i] = scale * frand();
    return x;
}

static float *filled(size_t n, float value) {
    float *x = floats(n);
    for (size_t i = 0; i < n; i++) x[i] = value;
    return x;
}

static double *doubles(size_t n) {
    double *x = calloc(n, sizeof(double));
    assert_non_null(x);
    return x;
}

static void init_cpu(kctx *c) {
    errbuf err;
    assert_int_equal(kctx_init(c, K_CPU, 0, &err), 0);
}

/* No failure may be pending in c. */
static void expect_ok(kctx *c) {
    errbuf err = {{0}};
    if (k_check(c, &err) != 0) fail_msg("unexpected kernel failure: %s", err.msg);
}

static double dot_f32(const float *a, const float *r, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += (double)a[i] * r[i];
    return s;
}

/* ||a - b|| / ||b||, where b is the reference; fails unless below tol.  b must be nonzero
 * or the comparison would prove nothing. */
static void expect_close(const char *what, const float *a, const double *b, size_t n,
                         double tol) {
    double diff = 0.0, ref = 0.0;
    for (size_t i = 0; i < n; i++) {
        diff += (a[i] - b[i]) * (a[i] - b[i]);
        ref += b[i] * b[i];
    }
    if (!(ref > 0.0)) fail_msg("%s: reference is all zero", what);
    double rel = sqrt(diff / ref);
    if (!(rel < tol)) fail_msg("%s: relative error %.3g (tolerance %.3g)", what, rel, tol);
}

/* Runs the forward pass on the current inputs and returns sum(out * R). */
typedef double (*loss_fn)(void *arg);

/* dL/dx[i] for every i by the fourth-order central difference
 * (L(x-2h) - 8 L(x-h) + 8 L(x+h) - L(x+2h)) / 12h, perturbing x in place. */
static void numeric_grad(float *x, size_t n, loss_fn loss, void *arg, double h, double *grad) {
    static const double steps[4] = {-2.0, -1.0, 1.0, 2.0};
    static const double weights[4] = {1.0, -8.0, 8.0, -1.0};
    for (size_t i = 0; i < n; i++) {
        float x0 = x[i];
        double g = 0.0;
        for (int s = 0; s < 4; s++) {
            x[i] = (float)(x0 + steps[s] * h);
            g += weights[s] * loss(arg);
        }
        x[i] = x0;
        grad[i] = g / (12.0 * h);
    }
}

/* Numerical gradient of loss with respect to x, compared with the analytic one. */
static void check_grad(const char *what, float *x, size_t n, loss_fn loss, void *arg,
                       const float *analytic, double h) {
    double *num = doubles(n);
    numeric_grad(x, n, loss, arg, h, num);
    expect_close(what, analytic, num, n, GRAD_TOL);
    free(num);
}

/* Varlen: rows packed with documents of lengths lens[0..n) (cycled, row b starting at its
 * b-th, the last one cut at T), as k_docs over start/end [B*T]. */
static k_docs pack_docs(int B, int T, const int *lens, int n, int32_t *start, int32_t *end) {
    for (int b = 0; b < B; b++)
        for (int t = 0, i = b; t < T; i++) {
            int len = lens[i % n] < T - t ? lens[i % n] : T - t;
            for (int u = t; u < t + len; u++) {
                start[(size_t)b * T + u] = t;
                end[(size_t)b * T + u] = t + len;
            }
            t += len;
        }
    return (k_docs){start, end};
}

/* ---- context, memory, elementwise ---- */

static void test_context(void **state) {
    (void)state;
    kctx c;
    errbuf err = {{0}};
    init_cpu(&c);
    assert_int_equal(c.backend, K_CPU);
    assert_int_equal(c.compute, K_F32);
    assert_int_equal(k_compute_size(&c), sizeof(float));
    assert_int_equal(c.failed, 0);
    kctx_destroy(&c);

    if (k_cuda_available() == 0) {
        kctx cuda;
        assert_int_equal(kctx_init(&cuda, K_CUDA, 0, &err), -1);
        assert_non_null(strstr(err.msg, "CUDA backend"));
    }
    kctx bad;
    assert_int_equal(kctx_init(&bad, (k_backend)7, 0, &err), -1);
    assert_non_null(strstr(err.msg, "unknown backend 7"));
}

/* k_cpu_defer_copies: copies started run at the wait that covers their ticket, or a sync,
 * from the source as it is then (what a GPU's copy stream may do), each lane on its own;
 * without it, at once. */
static void test_deferred_copies(void **state) {
    (void)state;
    kctx c;
    errbuf err = {{0}};
    float src[4] = {1, 2, 3, 4}, dst[4] = {0}, other[2] = {0};
    if (kctx_init(&c, K_CPU, 0, &err)) fail_msg("%s", err.msg);
    assert_int_equal(k_copy_h2d_start(&c, K_COPY_PARAMS, dst, src, sizeof src), 0); /* run already */
    assert_true(dst[3] == 4); /* at once */
    if (k_cpu_defer_copies(&c, &err)) fail_msg("%s", err.msg);
    memset(dst, 0, sizeof dst);
    uint64_t t1 = k_copy_h2d_start(&c, K_COPY_PARAMS, dst, src, sizeof src);
    uint64_t t2 = k_copy_h2d_start(&c, K_COPY_PARAMS, dst + 3, src, sizeof *src); /* in order: the later copy wins */
    uint64_t a1 = k_copy_h2d_start(&c, K_COPY_ACTIVATIONS, other, src + 2, sizeof *src);
    assert_true(t1 == 1 && t2 == 2 && a1 == 1);
    assert_true(dst[0] == 0 && dst[3] == 0 && other[0] == 0);
    src[0] = 9; /* overwritten before the wait: copied as it is then */
    k_copy_h2d_wait(&c, K_COPY_PARAMS, t1); /* the first only, and not the other lane's */
    assert_true(dst[0] == 9 && dst[1] == 2 && dst[3] == 4 && other[0] == 0);
    k_copy_h2d_wait(&c, K_COPY_PARAMS, K_COPY_ALL);
    assert_true(dst[3] == 9 && other[0] == 0);
    k_copy_h2d_wait(&c, K_COPY_ACTIVATIONS, a1);
    assert_true(other[0] == 3);
    k_copy_h2d_start(&c, K_COPY_PARAMS, dst, src + 1, sizeof *src);
    k_copy_h2d_start(&c, K_COPY_ACTIVATIONS, other + 1, src + 1, sizeof *src);
    assert_true(dst[0] == 9 && other[1] == 0);
    if (k_sync(&c, &err)) fail_msg("%s", err.msg); /* a sync runs every lane's */
    assert_true(dst[0] == 2 && other[1] == 2);
    k_copy_h2d_start(&c, K_COPY_LANES, dst, src, sizeof *src); /* no such lane */
    assert_int_equal(k_check(&c, &err), -1);
    assert_non_null(strstr(err.msg, "copy lane 2"));
    kctx_destroy(&c);
}

static void test_memory(void **state) {
    (void)state;
    kctx c;
    errbuf err;
    init_cpu(&c);
    float host[5] = {1, -2, 3.5f, 4, 5}, back[5];
    float *a = k_alloc(&c, sizeof host, &err), *b = k_alloc(&c, sizeof host, &err);
    for (int i = 0; i < 5; i++) assert_true(a[i] == 0.0f); /* zeroed */
    k_copy_h2d(&c, a, host, sizeof host);
    k_copy_d2h(&c, back, a, sizeof host);
    assert_memory_equal(back, host, sizeof host);
    k_f32_to_compute(&c, a, host, 5);
    k_compute_to_f32(&c, back, a, 5);
    assert_memory_equal(back, host, sizeof host);
    k_zero(&c, a, sizeof host);
    for (int i = 0; i < 5; i++) assert_true(a[i] == 0.0f);
    assert_int_equal(k_bytes_in_use(&c), 2 * sizeof host);
    float *staging = k_host_alloc(&c, sizeof host, &err); /* not context memory: not counted */
    assert_non_null(staging);
    for (int i = 0; i < 5; i++) assert_true(staging[i] == 0.0f);
    assert_int_equal(k_bytes_in_use(&c), 2 * sizeof host);
    k_host_free(&c, staging);
    k_host_free(&c, NULL);
    k_free(&c, a);
    k_free(&c, b);
    k_free(&c, NULL);
    assert_int_equal(k_bytes_in_use(&c), 0);
    assert_int_equal(k_peak_bytes(&c), 2 * sizeof host);
    expect_ok(&c);
    kctx_destroy(&c);
}

/* The count of context memory follows every block, in any order of frees, past the list's
 * first growth; the peak stays at the most ever held. */
static void test_memory_count(void **state) {
    (void)state;
    kctx c;
    errbuf err;
    init_cpu(&c);
    enum { N = 100 };
    void *p[N];
    size_t total = 0;
    for (int i = 0; i < N; i++) {
        p[i] = k_alloc(&c, (size_t)(i + 1) * 64, &err);
        assert_non_null(p[i]);
        total += (size_t)(i + 1) * 64;
    }
    assert_int_equal(k_bytes_in_use(&c), total);
    for (int i = 0; i < N; i += 2) k_free(&c, p[i]); /* every other one */
    size_t left = 0;
    for (int i = 1; i < N; i += 2) left += (size_t)(i + 1) * 64;
    assert_int_equal(k_bytes_in_use(&c), left);
    void *q = k_alloc(&c, 10, &err);
    assert_int_equal(k_bytes_in_use(&c), left + 10);
    assert_int_equal(k_peak_bytes(&c), total);
    k_free(&c, q);
    for (int i = N - 1; i >= 1; i -= 2) k_free(&c, p[i]);
    assert_int_equal(k_bytes_in_use(&c), 0);
    assert_int_equal(k_peak_bytes(&c), total);
    kctx_destroy(&c);
}

/* k_set_memory_limit: an allocation that would pass the limit is refused, naming the key,
 * the request, what is in use and the limit; up to the limit exactly is fine, freeing makes
 * room again, and 0 lifts it. */
static void test_memory_limit(void **state) {
    (void)state;
    kctx c;
    errbuf err = {{0}};
    init_cpu(&c);
    k_set_memory_limit(&c, 1000);
    void *a = k_alloc(&c, 600, &err);
    assert_non_null(a);
    assert_null(k_alloc(&c, 401, &err));
    assert_non_null(strstr(err.msg, "runtime.gpu_memory_limit"));
    assert_non_null(strstr(err.msg, "allocating 401 bytes with 600 in use"));
    assert_non_null(strstr(err.msg, "limit of 1000 bytes"));
    assert_int_equal(k_bytes_in_use(&c), 600);
    assert_int_equal(k_peak_bytes(&c), 600);
    assert_null(k_alloc(&c, SIZE_MAX, &err)); /* no overflow in the check */
    void *b = k_alloc(&c, 400, &err); /* to the limit exactly */
    assert_non_null(b);
    k_free(&c, a);
    void *d = k_alloc(&c, 600, &err);
    assert_non_null(d);
    k_set_memory_limit(&c, 0);
    void *e = k_alloc(&c, 5000, &err);
    assert_non_null(e);
    assert_int_equal(k_bytes_in_use(&c), 6000);
    k_free(&c, b), k_free(&c, d), k_free(&c, e);
    kctx_destroy(&c);
}

static void test_elementwise(void **state) {
    (void)state;
    kctx c;
    init_cpu(&c);
    float a[4] = {1, 2, 3, 4}, b[4] = {0.5f, -1, 2, -8}, out[4] = {0.5f, -1, 2, -8};
    k_accumulate(&c, out, a, 4);
    for (int i = 0; i < 4; i++) assert_true(out[i] == a[i] + b[i]);
    k_add_f32(&c, out, a, 4);
    for (int i = 0; i < 4; i++) assert_true(out[i] == 2 * a[i] + b[i]);
    float sum = 1.0f;
    k_sumsq_f32(&c, &sum, a, 4); /* adds into *out */
    assert_true(sum == 31.0f);
    k_sumsq_f32(&c, &sum, b, 4);
    assert_true(sum == 31.0f + 69.25f);
    expect_ok(&c);
    kctx_destroy(&c);
}

/* ---- scale, dropout ---- */

static void test_scale(void **state) {
    (void)state;
    kctx c;
    init_cpu(&c);
    seed(16);
    enum { n = 37 };
    float *x = random_floats(n, 3.0f), y[n];
    memcpy(y, x, sizeof y);
    k_scale(&c, y, -0.3f, n);
    for (int i = 0; i < n; i++) assert_true(y[i] == x[i] * -0.3f);
    k_scale(&c, y, 2.0f, 0); /* nothing */
    for (int i = 0; i < n; i++) assert_true(y[i] == x[i] * -0.3f);
    expect_ok(&c);
    free(x);
    kctx_destroy(&c);
}

/* [B, T, cols] inputs in [0.5, 1.5): never zero, so a zero output is a dropped element. */
static float *nonzero_floats(size_t n) {
    float *x = floats(n);
    for (size_t i = 0; i < n; i++) x[i] = 1.0f + 0.5f * frand();
    return x;
}

/* out = k_dropout(x) (accumulate 0), a fresh buffer of n = B * T * cols floats. */
static float *dropped(kctx *c, const float *x, const int64_t *samples, uint64_t key,
                      uint32_t site, int B, int T, int cols, float p) {
    float *out = filled((size_t)B * T * cols, 99.0f); /* overwritten */
    k_dropout(c, out, x, samples, key, site, B, T, cols, p, 0);
    expect_ok(c);
    return out;
}

/* Elements where exactly one of a and b is zero (their masks differ). */
static size_t mask_differences(const float *a, const float *b, size_t n) {
    size_t count = 0;
    for (size_t i = 0; i < n; i++) count += (a[i] == 0.0f) != (b[i] == 0.0f);
    return count;
}

/* Every element is the contract's: philox_dropout_keep of (seed, samples[b], site,
 * t * cols + j) decides, a kept one is x / (1 - p); rows of 35 elements, so groups of four
 * do not line up with rows; samples past 2^32.  Reproducible, in place, accumulating. */
static void test_dropout_contract(void **state) {
    (void)state;
    kctx c;
    init_cpu(&c);
    seed(17);
    enum { B = 3, T = 5, cols = 7, n = B * T * cols };
    const int64_t samples[B] = {0, INT64_C(12345678901), (INT64_C(1) << 47) + 5};
    const uint64_t key = UINT64_C(0x1234567887654321);
    const uint32_t site = philox_dropout_site(3, 5);
    const float p = 0.3f, keep_scale = 1.0f / (1.0f - p);
    float *x = nonzero_floats(n);
    float *out = dropped(&c, x, samples, key, site, B, T, cols, p);
    size_t kept = 0;
    for (int b = 0; b < B; b++)
        for (int e = 0; e < T * cols; e++) {
            int i = b * T * cols + e;
            int keep = philox_dropout_keep(key, (uint64_t)samples[b], site, (uint64_t)e,
                                           philox_dropout_threshold(p));
            assert_true(out[i] == (keep ? x[i] * keep_scale : 0.0f));
            kept += (size_t)keep;
        }
    assert_true(kept > 0 && kept < n); /* both kinds were seen */

    float *again = dropped(&c, x, samples, key, site, B, T, cols, p);
    assert_memory_equal(again, out, n * sizeof(float));

    float in_place[n];
    memcpy(in_place, x, sizeof in_place);
    k_dropout(&c, in_place, in_place, samples, key, site, B, T, cols, p, 0);
    assert_memory_equal(in_place, out, sizeof in_place);

    /* accumulate adds the same masked values (the backward on the gradient) */
    float *base = random_floats(n, 1.0f), acc[n];
    memcpy(acc, base, sizeof acc);
    k_dropout(&c, acc, x, samples, key, site, B, T, cols, p, 1);
    for (int i = 0; i < n; i++) assert_true(acc[i] == base[i] + out[i]);

    /* p = 0 is the identity */
    float *same = dropped(&c, x, samples, key, site, B, T, cols, 0.0f);
    assert_memory_equal(same, x, n * sizeof(float));
    expect_ok(&c);
    free(x), free(out), free(again), free(base), free(same);
    kctx_destroy(&c);
}

/* philox_dropout_keep is what base/philox.h documents: element e is kept when word e % 4 of
 * philox_block(seed, stream 4 << 48 | sample's low 48 bits, counter site << 40 | e / 4) is at
 * least the threshold (philox_block itself has Random123's known answers in test_rng). */
static void test_dropout_keep_formula(void **state) {
    (void)state;
    const uint64_t key = 77, samples[2] = {5, (UINT64_C(9) << 48) | 5}; /* the same stream */
    const uint32_t site = philox_dropout_site(2, 6), threshold = philox_dropout_threshold(0.5);
    assert_int_equal(threshold, UINT32_C(1) << 31);
    for (uint64_t e = 0; e < 64; e++) {
        uint32_t r[4];
        philox_block(key, UINT64_C(4) << 48 | 5, (uint64_t)site << 40 | e / 4, r);
        for (int k = 0; k < 2; k++)
            assert_int_equal(philox_dropout_keep(key, samples[k], site, e, threshold),
                             r[e % 4] >= threshold);
    }
}

/* The mask is keyed by (seed, sample, site) and nothing else: another of any of them gives
 * another mask (about half the elements differ at p = 0.5); the same sample gives the same
 * mask in any row of any batch. */
static void test_dropout_keys(void **state) {
    (void)state;
    kctx c;
    init_cpu(&c);
    seed(18);
    enum { T = 64, cols = 64, n = T * cols };
    const float p = 0.5f;
    float *x = nonzero_floats(2 * n);
    const int64_t one[1] = {7}, other[1] = {8}, pair[2] = {3, 7};
    float *ref = dropped(&c, x, one, 42, 1, 1, T, cols, p);
    float *by_site = dropped(&c, x, one, 42, 2, 1, T, cols, p);
    float *by_sample = dropped(&c, x, other, 42, 1, 1, T, cols, p);
    float *by_seed = dropped(&c, x, one, 43, 1, 1, T, cols, p);
    assert_true(mask_differences(ref, by_site, n) > n / 4);
    assert_true(mask_differences(ref, by_sample, n) > n / 4);
    assert_true(mask_differences(ref, by_seed, n) > n / 4);

    /* sample 7 as row 1 of a batch: row 1 of the input sees sample 7's mask */
    float *batch = dropped(&c, x, pair, 42, 1, 2, T, cols, p);
    float *row1 = dropped(&c, x + n, one, 42, 1, 1, T, cols, p);
    assert_memory_equal(batch + n, row1, n * sizeof(float));
    assert_true(mask_differences(batch, batch + n, n) > n / 4); /* rows 3 and 7 differ */
    expect_ok(&c);
    free(x), free(ref), free(by_site), free(by_sample), free(by_seed), free(batch), free(row1);
    kctx_destroy(&c);
}

/* Over 2^19 elements the kept fraction is 1 - p within 0.005 (over 7 standard deviations),
 * for small, middle and large p. */
static void test_dropout_fraction(void **state) {
    (void)state;
    kctx c;
    init_cpu(&c);
    seed(19);
    enum { B = 2, T = 256, cols = 1024 };
    const size_t n = (size_t)B * T * cols;
    const int64_t samples[B] = {100, 101};
    float *x = nonzero_floats(n);
    const float ps[3] = {0.05f, 0.5f, 0.9f};
    for (int k = 0; k < 3; k++) {
        float *out = dropped(&c, x, samples, 9, 4, B, T, cols, ps[k]);
        size_t kept = 0;
        for (size_t i = 0; i < n; i++) kept += out[i] != 0.0f;
        double fraction = (double)kept / (double)n;
        if (!(fabs(fraction - (1.0 - ps[k])) < 0.005))
            fail_msg("p %.2f: kept fraction %.4f", ps[k], fraction);
        free(out);
    }
    free(x);
    kctx_destroy(&c);
}

/* p outside [0, 1) is a failure naming it, and nothing is written. */
static void test_dropout_bad_p(void **state) {
    (void)state;
    kctx c;
    errbuf err;
    init_cpu(&c);
    const int64_t samples[1] = {0};
    float x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, out[8] = {0};
    const float bad[3] = {1.0f, -0.1f, NAN};
    for (int k = 0; k < 3; k++) {
        k_dropout(&c, out, x, samples, 1, 0, 1, 2, 4, bad[k], 0);
        assert_int_equal(k_check(&c, &err), -1);
        assert_non_null(strstr(err.msg, "dropout: probability"));
        assert_non_null(strstr(err.msg, "outside [0, 1)"));
        for (int i = 0; i < 8; i++) assert_true(out[i] == 0.0f);
    }
    kctx_destroy(&c);
}

/* ---- sticky failures ---- */

static void test_sticky_failure(void **state) {
    (void)state;
    kctx c;
    errbuf err = {{0}};
    init_cpu(&c);
    const int V = 7, C = 3;
    int32_t tokens[3] = {1, 9, 2};
    float *wte = random_floats((size_t)V * C, 1.0f), out[9];
    k_embedding_fwd(&c, out, tokens, wte, 3, C, V);
    assert_int_equal(c.failed, 1);
    int32_t worse[2] = {-5, 0};
    k_embedding_fwd(&c, out, worse, wte, 2, C, V); /* the first failure wins */
    assert_int_equal(k_check(&c, &err), -1);
    assert_non_null(strstr(err.msg, "token 9"));
    assert_non_null(strstr(err.msg, "row 1"));
    assert_null(strstr(err.msg, "-5"));
    assert_int_equal(k_check(&c, &err), 0); /* reported once, then cleared */

    k_embedding_fwd(&c, out, worse, wte, 2, C, V);
    assert_int_equal(k_sync(&c, &err), -1);
    assert_non_null(strstr(err.msg, "token -5"));
    assert_int_equal(k_sync(&c, &err), 0);
    free(wte);
    kctx_destroy(&c);
}

/* ---- embedding ---- */

typedef struct {
    kctx *c;
    const int32_t *tokens;
    float *wte, *out;
    const float *R;
    int N, C, V;
} embed_case;

static double embed_loss(void *arg) {
    embed_case *e = arg;
    k_embedding_fwd(e->c, e->out, e->tokens, e->wte, e->N, e->C, e->V);
    return dot_f32(e->out, e->R, (size_t)e->N * e->C);
}

static void test_embedding(void **state) {
    (void)state;
    kctx c;
    init_cpu(&c);
    seed(1);
    enum { N = 6, C = 4, V = 5 };
    int32_t tokens[N] = {3, 0, 3, 4, 3, 1}; /* repeats: gradients must add up */
    float *wte = random_floats(V * C, 1.0f), *R = random_floats(N * C, 1.0f);
    float out[N * C];
    k_embedding_fwd(&c, out, tokens, wte, N, C, V);
    for (int n = 0; n < N; n++)
        assert_memory_equal(out + n * C, wte + tokens[n] * C, C * sizeof(float));

    float *base = random_floats(V * C, 1.0f), *dwte = floats(V * C);
    memcpy(dwte, base, V * C * sizeof(float));
    k_embedding_bwd(&c, dwte, R, tokens, N, C, V);
    for (int i = 0; i < V * C; i++) dwte[i] -= base[i]; /* it accumulates */
    embed_case e = {&c, tokens, wte, out, R, N, C, V};
    check_grad("embedding dwte", wte, V * C, embed_loss, &e, dwte, 0.05);
    for (int i = 0; i < C; i++) assert_true(dwte[2 * C + i] == 0.0f); /* token 2 unused */
    expect_ok(&c);
    free(wte), free(R), free(base), free(dwte);
    kctx_destroy(&c);
}

/* ---- RMSNorm ---- */

typedef struct {
    kctx *c;
    float *in, *w, *out, *rstd;
    const float *R;
    int N, C;
    float eps;
} norm_case;

static double norm_loss(void *arg) {
    norm_case *e = arg;
    k_rmsnorm_fwd(e->c, e->out, e->rstd, e->in, e->w, e->N, e->C, e->eps);
    return dot_f32(e->out, e->R, (size_t)e->N * e->C);
}

static void test_rmsnorm_forward(void **state) {
    (void)state;
    kctx c;
    init_cpu(&c);
    seed(2);
    enum { N = 3, C = 16 };
    float *in = random_floats(N * C, 2.0f), *w = random_floats(C, 1.0f), out[N * C], rstd[N];
    double *ref = doubles(N * C);
    const float eps = 1e-5f;
    k_rmsnorm_fwd(&c, out, rstd, in, w, N, C, eps);
    for (int n = 0; n < N; n++) {
        double ms = 0.0;
        for (int i = 0; i < C; i++) ms += (double)in[n * C + i] * in[n * C + i] / C;
        double r = 1.0 / sqrt(ms + eps);
        assert_true(fabs(rstd[n] - r) <= 1e-6 * r);
        for (int i = 0; i < C; i++) ref[n * C + i] = in[n * C + i] * r * w[i];
    }
    expect_close("rmsnorm out", out, ref, N * C, 1e-6);
    expect_ok(&c);
    free(in), free(w), free(ref);
    kctx_destroy(&c);
}

static void test_rmsnorm_grad(void **state) {
    (void)state;
    kctx c;
    init_cpu(&c);
    seed(3);
    enum { N = 4, C = 8 };
    float *in = random_floats(N * C, 1.5f), *w = random_floats(C, 1.0f);
    float *R = random_floats(N * C, 1.0f), out[N * C], rstd[N];
    float *din_base = random_floats(N * C, 1.0f), *dw_base = random_floats(C, 1.0f);
    float din[N * C], dw[C];
    memcpy(din, din_base, sizeof din);
    memcpy(dw, dw_base, sizeof dw);
    norm_case e = {&c, in, w, out, rstd, R, N, C, 1e-5f};
    norm_loss(&e);
    k_rmsnorm_bwd(&c, din, dw, R, in, w, rstd, N, C);
    for (int i = 0; i < N * C; i++) din[i] -= din_base[i]; /* both accumulate */
    for (int i = 0; i < C; i++) dw[i] -= dw_base[i];
    check_grad("rmsnorm din", in, N * C, norm_loss, &e, din, 0.02);
    check_grad("rmsnorm dw", w, C, norm_loss, &e, dw, 0.05);
    expect_ok(&c);
    free(in), free(w), free(R), free(din_base), free(dw_base);
    kctx_destroy(&c);
}

/* A frozen norm (dw NULL) gets the very din it gets with dw. */
static void test_rmsnorm_bwd_frozen(void **state) {
    (void)state;
    kctx c;
    init_cpu(&c);
    seed(14);
    enum { N = 4, C = 8 };
    float *in = random_floats(N * C, 1.5f), *w = random_floats(C, 1.0f);
    float *dout = random_floats(N * C, 1.0f), *din0 = random_floats(N * C, 1.0f);
    float out[N * C], rstd[N], din[N * C], din_frozen[N * C], dw[C] = {0};
    k_rmsnorm_fwd(&c, out, rstd, in, w, N, C, 1e-5f);
    memcpy(din, din0, sizeof din);
    memcpy(din_frozen, din0, sizeof din_frozen);
    k_rmsnorm_bwd(&c, din, dw, dout, in, w, rstd, N, C);
    k_rmsnorm_bwd(&c, din_frozen, NULL, dout, in, w, rstd, N, C);
    assert_memory_equal(din_frozen, din, sizeof din);
    assert_memory_not_equal(din, din0, sizeof din); /* it did add something */
    expect_ok(&c);
    free(in), free(w), free(dout), free(din0);
    kctx_destroy(&c);
}

/* ---- RoPE ---- */

static void test_rope_inv_freq_default(void **state) {
    (void)state;
    k_rope_params p = {.theta = 10000.0};
    float f[4];
    k_rope_inv_freq(&p, 8, f);
    const double expect[4] = {1.0, 0.1, 0.01, 0.001}; /* 10000^(-2i/8) */
    for (int i = 0; i < 4; i++) assert_true(fabs(f[i] - expect[i]) <= 1e-7 * expect[i]);
}

/* Llama 3.1 scaling: theta 500000, factor 8, low 1, high 4, original 8192, hd 128, so
 * wavelengths above 8192 are divided by 8 and those below 2048 kept. */
static void test_rope_inv_freq_llama3(void **state) {
    (void)state;
    k_rope_params p = {.theta = 500000.0,
                       .kind = K_ROPE_LLAMA3,
                       .factor = 8.0,
                       .low_freq_factor = 1.0,
                       .high_freq_factor = 4.0,
                       .original_max_position_embeddings = 8192};
    float f[64];
    k_rope_inv_freq(&p, 128, f);
    /* i = 0: inv_freq 1, wavelength 2 pi: high frequency, unchanged */
    assert_true(f[0] == 1.0f);
    /* i = 63: inv_freq 500000^(-126/128) = 2.455140791e-6, wavelength 2.56e6 > 8192: / 8 */
    assert_true(fabs(f[63] - 3.068925988914511e-07) <= 1e-6 * 3.068925988914511e-07);
    /* i = 32: inv_freq 1/sqrt(500000) = 1.414213562e-3, wavelength 4442.88 (in between);
     * smooth = (8192 / 4442.88 - 1) / 3 = 0.2812826, so
     * (1 - smooth) * 1.414213562e-3 / 8 + smooth * 1.414213562e-3 = 5.248461610e-4 */
    assert_true(fabs(f[32] - 5.248461609929547e-4) <= 1e-6 * 5.248461609929547e-4);
    /* i = 28 is still high frequency (wavelength 1923 < 2048): unchanged */
    double f28 = pow(500000.0, -56.0 / 128.0);
    assert_true(fabs(f[28] - f28) <= 1e-6 * f28);
}

static void test_rope_forward(void **state) {
    (void)state;
    kctx c;
    init_cpu(&c);
    seed(4);
    enum { B = 2, T = 5, H = 3, hd = 8 };
    const size_t n = B * T * H * hd;
    k_rope_params p = {.theta = 10000.0};
    float inv_freq[hd / 2];
    k_rope_inv_freq(&p, hd, inv_freq);
    float *x = random_floats(n, 1.0f), *y = floats(n);
    memcpy(y, x, n * sizeof(float));
    k_rope(&c, y, inv_freq, NULL, B, T, H, hd, 0);
    /* position 0 is not rotated */
    for (int b = 0; b < B; b++)
        assert_memory_equal(y + (size_t)b * T * H * hd, x + (size_t)b * T * H * hd,
                            H * hd * sizeof(float));
    /* b = 1, t = 3, h = 2, pair i = 1: angle 3 * 0.1 */
    size_t o = ((size_t)(1 * T + 3) * H + 2) * hd;
    double cs = cos(0.3), sn = sin(0.3);
    assert_true(fabs(y[o + 1] - (x[o + 1] * cs - x[o + 5] * sn)) < 1e-6);
    assert_true(fabs(y[o + 5] - (x[o + 5] * cs + x[o + 1] * sn)) < 1e-6);
    /* the inverse undoes it */
    k_rope(&c, y, inv_freq, NULL, B, T, H, hd, 1);
    for (size_t i = 0; i < n; i++) assert_true(fabs(y[i] - x[i]) < 1e-6);
    expect_ok(&c);
    free(x), free(y);
    kctx_destroy(&c);
}

/* With docs, a token's position is its place in its document: each document of a packed row
 * rotates as the same tokens alone at the start of a row. */
static void test_rope_positions_restart(void **state) {
    (void)state;
    kctx c;
    init_cpu(&c);
    seed(41);
    enum { B = 2, T = 11, H = 3, hd = 8 };
    const int lens[] = {4, 1, 6};
    int32_t start[B * T], end[B * T];
    k_docs docs = pack_docs(B, T, lens, 3, start, end);
    const size_t row = (size_t)H * hd, n = B * T * row;
    k_rope_params p = {.theta = 10.0};
    float inv_freq[hd / 2];
    k_rope_inv_freq(&p, hd, inv_freq);
    float *x = random_floats(n, 1.0f), *y = floats(n), *alone = floats(n);
    memcpy(y, x, n * sizeof(float));
    k_rope(&c, y, inv_freq, &docs, B, T, H, hd, 0);
    for (int i = 0; i < B * T; i++) {
        if (start[i] != i % T) continue; /* a document starts at token i */
        int len = end[i] - start[i];
        memcpy(alone, x + i * row, len * row * sizeof(float));
        k_rope(&c, alone, inv_freq, NULL, 1, len, H, hd, 0);
        for (size_t j = 0; j < len * row; j++)
            assert_true(fabsf(y[i * row + j] - alone[j]) < 1e-6f);
    }
    /* and the inverse undoes it */
    k_rope(&c, y, inv_freq, &docs, B, T, H, hd, 1);
    for (size_t i = 0; i < n; i++) assert_true(fabs(y[i] - x[i]) < 1e-6);
    expect_ok(&c);
    free(x), free(y), free(alone);
    kctx_destroy(&c);
}

typedef struct {
    kctx *c;
    float *x, *y;
    const float *inv_freq, *R;
    int B, T, H, hd;
} rope_case;

static double rope_loss(void *arg) {
    rope_case *e = arg;
    size_t n = (size_t)e->B * e->T * e->H * e->hd;
    memcpy(e->y, e->x, n * sizeof(float));
    k_rope(e->c, e->y, e->inv_freq, NULL, e->B, e->T, e->H, e->hd, 0);
    return dot_f32(e->y, e->R, n);
}

static void test_rope_grad(void **state) {
    (void)state;
    kctx c;
    init_cpu(&c);
    seed(5);
    enum { B = 2, T = 5, H = 2, hd = 8 };
    const size_t n = B * T * H * hd;
    k_rope_params p = {.theta = 10.0}; /* low theta: large angles in every pair */
    float inv_freq[hd / 2];
    k_rope_inv_freq(&p, hd, inv_freq);
    float *x = random_floats(n, 1.0f), *R = random_floats(n, 1.0f), *y = floats(n);
    float *dx = floats(n);
    memcpy(dx, R, n * sizeof(float));
    k_rope(&c, dx, inv_freq, NULL, B, T, H, hd, 1); /* backward = inverse rotation of dout */
    rope_case e = {&c, x, y, inv_freq, R, B, T, H, hd};
    check_grad("rope dx", x, n, rope_loss, &e, dx, 0.05);
    expect_ok(&c);
    free(x), free(R), free(y), free(dx);
    kctx_destroy(&c);
}

/* ---- attention ---- */

typedef struct {
    int B, T, Hq, Hkv, hd;
} attn_shape;

static size_t attn_at(const attn_shape *s, int b, int t, int h, int H) {
    return (((size_t)b * s->T + t) * H + h) * s->hd;
}

/* Naive causal softmax attention in double: out and lse; window > 0: only keys j > t -
 * window (Mistral's sliding window). */
static void naive_attention_window(const attn_shape *s, const float *q, const float *k,
                                   const float *v, int window, double *out, double *lse) {
    double *w = doubles(s->T);
    for (int b = 0; b < s->B; b++)
        for (int h = 0; h < s->Hq; h++) {
            int g = h / (s->Hq / s->Hkv);
            for (int t = 0; t < s->T; t++) {
                const float *qr = q + attn_at(s, b, t, h, s->Hq);
                double sum = 0.0;
                int j0 = window > 0 && t - window + 1 > 0 ? t - window + 1 : 0;
                for (int j = j0; j <= t; j++) {
                    const float *kr = k + attn_at(s, b, j, g, s->Hkv);
                    double score = 0.0;
                    for (int d = 0; d < s->hd; d++) score += (double)qr[d] * kr[d];
                    w[j] = exp(score / sqrt(s->hd));
                    sum += w[j];
                }
                double *o = out + attn_at(s, b, t, h, s->Hq);
                for (int d = 0; d < s->hd; d++) {
                    o[d] = 0.0;
                    for (int j = j0; j <= t; j++)
                        o[d] += w[j] / sum * v[attn_at(s, b, j, g, s->Hkv) + d];
                }
                lse[((size_t)b * s->Hq + h) * s->T + t] = log(sum);
            }
        }
    free(w);
}

static void naive_attention(const attn_shape *s, const float *q, const float *k, const float *v,
                            double *out, double *lse) {
    naive_attention_window(s, q, k, v, 0, out, lse);
}

static void check_attention_forward(attn_shape s) {
    kctx c;
    init_cpu(&c);
    seed(6 + s.Hq);
    size_t nq = (size_t)s.B * s.T * s.Hq * s.hd, nkv = (size_t)s.B * s.T * s.Hkv * s.hd;
    size_t nl = (size_t)s.B * s.Hq * s.T;
    float *q = random_floats(nq, 1.5f), *k = random_floats(nkv, 1.5f);
    float *v = random_floats(nkv, 1.0f), *out = floats(nq), *lse = floats(nl);
    double *ref = doubles(nq), *ref_lse = doubles(nl);
    k_attention_fwd(&c, out, lse, q, k, v, NULL, 0, s.B, s.T, s.Hq, s.Hkv, s.hd);
    naive_attention(&s, q, k, v, ref, ref_lse);
    expect_close("attention out", out, ref, nq, 1e-6);
    expect_close("attention lse", lse, ref_lse, nl, 1e-6);
    expect_ok(&c);
    free(q), free(k), free(v), free(out), free(lse), free(ref), free(ref_lse);
    kctx_destroy(&c);
}

static void test_attention_forward(void **state) {
    (void)state;
    check_attention_forward((attn_shape){2, 5, 2, 2, 8});
    check_attention_forward((attn_shape){2, 5, 4, 2, 8});
    check_attention_forward((attn_shape){1, 7, 6, 1, 4});
}

/* Changing the key and value at position p changes no output before p, and changes p. */
static void test_attention_causal(void **state) {
    (void)state;
    kctx c;
    init_cpu(&c);
    seed(7);
    attn_shape s = {2, 5, 4, 2, 8};
    size_t nq = (size_t)s.B * s.T * s.Hq * s.hd, nkv = (size_t)s.B * s.T * s.Hkv * s.hd;
    float *q = random_floats(nq, 1.0f), *k = random_floats(nkv, 1.0f);
    float *v = random_floats(nkv, 1.0f), *a = floats(nq), *b = floats(nq);
    float lse[2 * 4 * 5];
    k_attention_fwd(&c, a, lse, q, k, v, NULL, 0, s.B, s.T, s.Hq, s.Hkv, s.hd);
    const int p = 3;
    for (int bb = 0; bb < s.B; bb++)
        for (int g = 0; g < s.Hkv; g++)
            for (int d = 0; d < s.hd; d++) {
                k[attn_at(&s, bb, p, g, s.Hkv) + d] += 1.0f;
                v[attn_at(&s, bb, p, g, s.Hkv) + d] -= 2.0f;
            }
    k_attention_fwd(&c, b, lse, q, k, v, NULL, 0, s.B, s.T, s.Hq, s.Hkv, s.hd);
    for (int bb = 0; bb < s.B; bb++) {
        size_t row = (size_t)s.Hq * s.hd; /* one position, all heads */
        size_t t0 = (size_t)bb * s.T * row;
        assert_memory_equal(a + t0, b + t0, p * row * sizeof(float));
        assert_memory_not_equal(a + t0 + p * row, b + t0 + p * row, row * sizeof(float));
    }
    expect_ok(&c);
    free(q), free(k), free(v), free(a), free(b);
    kctx_destroy(&c);
}

typedef struct {
    kctx *c;
    attn_shape s;
    float *q, *k, *v, *out, *lse;
    const float *R;
    const k_docs *docs;
    int window;
} attn_case;

static double attn_loss(void *arg) {
    attn_case *e = arg;
    attn_shape s = e->s;
    k_attention_fwd(e->c, e->out, e->lse, e->q, e->k, e->v, e->docs, e->window, s.B, s.T, s.Hq,
                    s.Hkv, s.hd);
    return dot_f32(e->out, e->R, (size_t)s.B * s.T * s.Hq * s.hd);
}

/* Finite differences of the attention's inputs; docs NULL: whole causal rows; window 0:
 * none. */
static void check_attention_grad_window(attn_shape s, const k_docs *docs, int window) {
    kctx c;
    init_cpu(&c);
    seed(8 + s.Hq);
    size_t nq = (size_t)s.B * s.T * s.Hq * s.hd, nkv = (size_t)s.B * s.T * s.Hkv * s.hd;
    float *q = random_floats(nq, 1.5f), *k = random_floats(nkv, 1.5f);
    float *v = random_floats(nkv, 1.0f), *R = random_floats(nq, 1.0f);
    float *out = floats(nq), *lse = floats((size_t)s.B * s.Hq * s.T);
    /* dq, dk, dv are overwritten: start them from garbage */
    float *dq = filled(nq, 7.0f), *dk = filled(nkv, -3.0f), *dv = filled(nkv, 5.0f);
    attn_case e = {&c, s, q, k, v, out, lse, R, docs, window};
    attn_loss(&e);
    k_attention_bwd(&c, dq, dk, dv, R, q, k, v, out, lse, docs, window, s.B, s.T, s.Hq, s.Hkv,
                    s.hd);
    expect_ok(&c);
    check_grad("attention dq", q, nq, attn_loss, &e, dq, 0.05);
    check_grad("attention dk", k, nkv, attn_loss, &e, dk, 0.05);
    check_grad("attention dv", v, nkv, attn_loss, &e, dv, 0.05);
    free(q), free(k), free(v), free(R), free(out), free(lse), free(dq), free(dk), free(dv);
    kctx_destroy(&c);
}

static void check_attention_grad_docs(attn_shape s, const k_docs *docs) {
    check_attention_grad_window(s, docs, 0);
}

static void check_attention_grad(attn_shape s) {
    check_attention_grad_docs(s, NULL);
}

/* The sliding window (Mistral): forward against the naive band, a window as long as the row
 * is none, finite differences of the backward with and without packed documents, and a
 * document of a packed row sees, windowed, what it sees alone in a row. */
static void test_attention_window(void **state) {
    (void)state;
    kctx c;
    init_cpu(&c);
    seed(43);
    attn_shape s = {2, 9, 4, 2, 8};
    size_t nq = (size_t)s.B * s.T * s.Hq * s.hd, nkv = (size_t)s.B * s.T * s.Hkv * s.hd;
    size_t nl = (size_t)s.B * s.Hq * s.T;
    float *q = random_floats(nq, 1.5f), *k = random_floats(nkv, 1.5f), *v = random_floats(nkv, 1.0f);
    float *out = floats(nq), *lse = floats(nl), *full = floats(nq);
    double *ref = doubles(nq), *ref_lse = doubles(nl);
    k_attention_fwd(&c, full, lse, q, k, v, NULL, 0, s.B, s.T, s.Hq, s.Hkv, s.hd);
    const int windows[] = {1, 3, 8, 9, 40};
    for (size_t i = 0; i < sizeof windows / sizeof windows[0]; i++) {
        k_attention_fwd(&c, out, lse, q, k, v, NULL, windows[i], s.B, s.T, s.Hq, s.Hkv, s.hd);
        naive_attention_window(&s, q, k, v, windows[i], ref, ref_lse);
        expect_close("windowed attention out", out, ref, nq, 1e-6);
        expect_close("windowed attention lse", lse, ref_lse, nl, 1e-6);
        /* the window matters exactly when it is shorter than the row */
        int same = !memcmp(out, full, nq * sizeof *out);
        assert_int_equal(same, windows[i] >= s.T);
    }
    expect_ok(&c);
    check_attention_grad_window(s, NULL, 3);
    const int lens[] = {2, 7, 5, 4};
    int32_t start[2 * 9], end[2 * 9];
    k_docs docs = pack_docs(s.B, s.T, lens, 4, start, end);
    check_attention_grad_window(s, &docs, 3);
    k_attention_fwd(&c, out, lse, q, k, v, &docs, 3, s.B, s.T, s.Hq, s.Hkv, s.hd);
    size_t qrow = (size_t)s.Hq * s.hd, kvrow = (size_t)s.Hkv * s.hd;
    for (int i = 0; i < s.B * s.T; i++) {
        if (start[i] != i % s.T) continue;
        int n = end[i] - start[i];
        k_attention_fwd(&c, full, lse, q + i * qrow, k + i * kvrow, v + i * kvrow, NULL, 3, 1, n,
                        s.Hq, s.Hkv, s.hd);
        for (size_t j = 0; j < n * qrow; j++) assert_true(fabsf(out[i * qrow + j] - full[j]) <= 1e-6f);
    }
    k_attention_fwd(&c, out, lse, q, k, v, NULL, -1, s.B, s.T, s.Hq, s.Hkv, s.hd);
    errbuf err;
    assert_int_equal(k_check(&c, &err), -1);
    assert_non_null(strstr(err.msg, "sliding window -1"));
    free(q), free(k), free(v), free(out), free(lse), free(full), free(ref), free(ref_lse);
    kctx_destroy(&c);
}

static void test_attention_grad_mha(void **state) {
    (void)state;
    check_attention_grad((attn_shape){2, 5, 2, 2, 8});
}

static void test_attention_grad_gqa(void **state) {
    (void)state;
    check_attention_grad((attn_shape){2, 5, 4, 2, 8});
    check_attention_grad((attn_shape){1, 3, 3, 1, 4}); /* one kv head for all */
}

/* Varlen: every document of a packed row (B rows, GQA) gets exactly the out, lse, dq, dk and
 * dv it gets alone in a row of its own length; and finite differences agree with dq, dk, dv. */
static void test_attention_varlen(void **state) {
    (void)state;
    kctx c;
    init_cpu(&c);
    seed(42);
    attn_shape s = {2, 12, 4, 2, 8};
    const int lens[] = {1, 5, 3, 7};
    int32_t start[2 * 12], end[2 * 12];
    k_docs docs = pack_docs(s.B, s.T, lens, 4, start, end);
    size_t qrow = (size_t)s.Hq * s.hd, kvrow = (size_t)s.Hkv * s.hd;
    size_t nq = s.B * s.T * qrow, nkv = s.B * s.T * kvrow, nl = (size_t)s.B * s.Hq * s.T;
    float *q = random_floats(nq, 1.5f), *k = random_floats(nkv, 1.5f);
    float *v = random_floats(nkv, 1.0f), *R = random_floats(nq, 1.0f);
    float *out = floats(nq), *lse = floats(nl), *dq = floats(nq), *dk = floats(nkv);
    float *dv = floats(nkv);
    k_attention_fwd(&c, out, lse, q, k, v, &docs, 0, s.B, s.T, s.Hq, s.Hkv, s.hd);
    k_attention_bwd(&c, dq, dk, dv, R, q, k, v, out, lse, &docs, 0, s.B, s.T, s.Hq, s.Hkv, s.hd);
    expect_ok(&c);
    float *o1 = floats(nq), *l1 = floats(nl), *dq1 = floats(nq), *dk1 = floats(nkv);
    float *dv1 = floats(nkv);
    for (int i = 0; i < s.B * s.T; i++) {
        if (start[i] != i % s.T) continue; /* document [i, i + n) of row i / T starts here */
        int b = i / s.T, t0 = i % s.T, n = end[i] - start[i];
        k_attention_fwd(&c, o1, l1, q + i * qrow, k + i * kvrow, v + i * kvrow, NULL, 0, 1, n,
                        s.Hq, s.Hkv, s.hd);
        k_attention_bwd(&c, dq1, dk1, dv1, R + i * qrow, q + i * qrow, k + i * kvrow,
                        v + i * kvrow, o1, l1, NULL, 0, 1, n, s.Hq, s.Hkv, s.hd);
        expect_ok(&c);
        for (size_t j = 0; j < n * qrow; j++) {
            assert_true(fabsf(out[i * qrow + j] - o1[j]) <= 1e-6f);
            assert_true(fabsf(dq[i * qrow + j] - dq1[j]) <= 1e-6f);
        }
        for (size_t j = 0; j < n * kvrow; j++) {
            assert_true(fabsf(dk[i * kvrow + j] - dk1[j]) <= 1e-6f);
            assert_true(fabsf(dv[i * kvrow + j] - dv1[j]) <= 1e-6f);
        }
        for (int h = 0; h < s.Hq; h++)
            for (int t = 0; t < n; t++)
                assert_true(fabsf(lse[((size_t)b * s.Hq + h) * s.T + t0 + t] - l1[h * n + t]) <=
                            1e-6f);
    }
    check_attention_grad_docs(s, &docs);
    free(q), free(k), free(v), free(R), free(out), free(lse), free(dq), free(dk), free(dv);
    free(o1), free(l1), free(dq1), free(dk1), free(dv1);
    kctx_destroy(&c);
}

/* k_attention_kv: rows decoded in pieces (a prefill of a few tokens, then one at a time, row
 * 1 behind row 0) give what k_rope then k_attention_fwd give on the whole rows; the cache
 * holds the rotated keys and the values; a position past the cache fails naming the row. */
static void test_attention_kv(void **state) {
    (void)state;
    kctx c;
    errbuf err;
    init_cpu(&c);
    seed(44);
    attn_shape s = {2, 9, 4, 2, 8};
    int T_max = 11;
    size_t qrow = (size_t)s.Hq * s.hd, kvrow = (size_t)s.Hkv * s.hd;
    size_t nq = s.B * s.T * qrow, nkv = s.B * s.T * kvrow;
    float *q = random_floats(nq, 1.5f), *k = random_floats(nkv, 1.5f), *v = random_floats(nkv, 1.0f);
    float *inv_freq = floats((size_t)s.hd / 2);
    k_rope_params rp = {.theta = 10000.0};
    k_rope_inv_freq(&rp, s.hd, inv_freq);
    float *qr = floats(nq), *kr = floats(nkv), *out = floats(nq), *lse = floats((size_t)s.B * s.Hq * s.T);
    memcpy(qr, q, nq * sizeof *q);
    memcpy(kr, k, nkv * sizeof *k);
    k_rope(&c, qr, inv_freq, NULL, s.B, s.T, s.Hq, s.hd, 0);
    k_rope(&c, kr, inv_freq, NULL, s.B, s.T, s.Hkv, s.hd, 0);
    k_attention_fwd(&c, out, lse, qr, kr, v, NULL, 0, s.B, s.T, s.Hq, s.Hkv, s.hd);
    expect_ok(&c);
    float *kc = floats((size_t)s.B * T_max * kvrow), *vc = floats((size_t)s.B * T_max * kvrow);
    float *qs = floats(nq), *ks = floats(nkv), *o = floats(nq);
    /* row b's tokens [t0, t0 + n) through the cache of row b alone */
    for (int b = 0; b < s.B; b++) {
        int t0 = 0;
        while (t0 < s.T) {
            int n = t0 == 0 ? 3 + b : 1;
            size_t at = (size_t)b * s.T + t0;
            int32_t pos = t0;
            memcpy(qs, q + at * qrow, n * qrow * sizeof *q);
            memcpy(ks, k + at * kvrow, n * kvrow * sizeof *k);
            k_attention_kv(&c, o, qs, ks, v + at * kvrow, kc + (size_t)b * T_max * kvrow,
                           vc + (size_t)b * T_max * kvrow, &pos, inv_freq, 1, n, T_max, s.Hq,
                           s.Hkv, s.hd);
            expect_ok(&c);
            for (size_t j = 0; j < n * qrow; j++) assert_true(fabsf(o[j] - out[at * qrow + j]) <= 1e-6f);
            for (size_t j = 0; j < n * kvrow; j++) {
                assert_true(fabsf(kc[((size_t)b * T_max + t0) * kvrow + j] - kr[at * kvrow + j]) <= 1e-6f);
                assert_true(vc[((size_t)b * T_max + t0) * kvrow + j] == v[at * kvrow + j]);
            }
            t0 += n;
        }
    }
    /* both rows' next token in one call, each at its own position */
    int32_t pos2[2] = {s.T, s.T - 1};
    float *q2 = random_floats(2 * qrow, 1.0f), *k2 = random_floats(2 * kvrow, 1.0f);
    float *v2 = random_floats(2 * kvrow, 1.0f), *o2 = floats(2 * qrow), *o1 = floats(qrow);
    float *q1 = floats(qrow), *k1 = floats(kvrow);
    memcpy(q1, q2 + qrow, qrow * sizeof *q1);
    memcpy(k1, k2 + kvrow, kvrow * sizeof *k1);
    k_attention_kv(&c, o1, q1, k1, v2 + kvrow, kc + (size_t)T_max * kvrow, vc + (size_t)T_max * kvrow,
                   &pos2[1], inv_freq, 1, 1, T_max, s.Hq, s.Hkv, s.hd);
    k_attention_kv(&c, o2, q2, k2, v2, kc, vc, pos2, inv_freq, 2, 1, T_max, s.Hq, s.Hkv, s.hd);
    expect_ok(&c);
    for (size_t j = 0; j < qrow; j++) assert_true(fabsf(o2[qrow + j] - o1[j]) <= 1e-6f);
    int32_t past = T_max;
    k_attention_kv(&c, o1, q1, k1, v2, kc, vc, &past, inv_freq, 1, 1, T_max, s.Hq, s.Hkv, s.hd);
    assert_int_equal(k_check(&c, &err), -1);
    assert_non_null(strstr(err.msg, "row 0's 1 new tokens at position 11 do not fit a cache of 11"));
    free(q), free(k), free(v), free(inv_freq), free(qr), free(kr), free(out), free(lse);
    free(kc), free(vc), free(qs), free(ks), free(o), free(q2), free(k2), free(v2), free(o2);
    free(o1), free(q1), free(k1);
    kctx_destroy(&c);
}

/* Document bounds that do not tile a row are a failure naming the token. */
static void test_attention_bad_docs(void **state) {
    (void)state;
    kctx c;
    errbuf err;
    init_cpu(&c);
    float x[1 * 4 * 8] = {0}, lse[4];
    int32_t start[4] = {0, 0, 2, 2}, end[4] = {2, 2, 4, 3}; /* token 3's document ends at 3 */
    k_docs docs = {start, end};
    k_attention_fwd(&c, x, lse, x, x, x, &docs, 0, 1, 4, 1, 1, 8);
    assert_int_equal(k_check(&c, &err), -1);
    assert_non_null(strstr(err.msg, "document bounds [2, 3) of token [0,3] do not tile"));
    end[3] = 4;
    start[1] = 1; /* token 1 starts a document while token 0's runs on to 2 */
    k_attention_bwd(&c, x, x, x, x, x, x, x, x, lse, &docs, 0, 1, 4, 1, 1, 8);
    assert_int_equal(k_check(&c, &err), -1);
    assert_non_null(strstr(err.msg, "token [0,1]"));
    kctx_destroy(&c);
}

static void test_attention_bad_heads(void **state) {
    (void)state;
    kctx c;
    errbuf err;
    init_cpu(&c);
    float x[2 * 3 * 4] = {0}, lse[6];
    k_attention_fwd(&c, x, lse, x, x, x, NULL, 0, 1, 2, 3, 2, 4);
    assert_int_equal(k_check(&c, &err), -1);
    assert_non_null(strstr(err.msg, "3 query heads"));
    kctx_destroy(&c);
}

/* ---- SwiGLU ---- */

typedef struct {
    kctx *c;
    float *gate, *up, *out;
    const float *R;
    size_t n;
} swiglu_case;

static double swiglu_loss(void *arg) {
    swiglu_case *e = arg;
    k_swiglu_fwd(e->c, e->out, e->gate, e->up, e->n);
    return dot_f32(e->out, e->R, e->n);
}

static void test_swiglu(void **state) {
    (void)state;
    kctx c;
    init_cpu(&c);
    seed(9);
    enum { n = 40 };
    float *gate = random_floats(n, 4.0f), *up = random_floats(n, 1.0f);
    float *R = random_floats(n, 1.0f), out[n];
    float *dgate = filled(n, 9.0f), *dup = filled(n, 9.0f);
    double ref[n];
    k_swiglu_fwd(&c, out, gate, up, n);
    for (int i = 0; i < n; i++) ref[i] = gate[i] / (1.0 + exp(-gate[i])) * up[i];
    expect_close("swiglu out", out, ref, n, 1e-6);
    k_swiglu_bwd(&c, dgate, dup, R, gate, up, n);
    swiglu_case e = {&c, gate, up, out, R, n};
    check_grad("swiglu dgate", gate, n, swiglu_loss, &e, dgate, 0.05);
    check_grad("swiglu dup", up, n, swiglu_loss, &e, dup, 0.05);
    expect_ok(&c);
    free(gate), free(up), free(R), free(dgate), free(dup);
    kctx_destroy(&c);
}

/* ---- biases ---- */

/* k_bias_fwd adds the bias to every row; k_bias_bwd accumulates the column sums. */
static void test_bias(void **state) {
    (void)state;
    kctx c;
    init_cpu(&c);
    seed(44);
    const int N = 7, O = 5;
    float *y = random_floats((size_t)N * O, 1.0f), *y0 = floats((size_t)N * O);
    float *b = random_floats(O, 1.0f), *db = filled(O, 0.5f);
    memcpy(y0, y, (size_t)N * O * sizeof *y);
    k_bias_fwd(&c, y, b, N, O);
    k_bias_bwd(&c, db, y0, N, O);
    expect_ok(&c);
    for (int o = 0; o < O; o++) {
        double sum = 0.5;
        for (int n = 0; n < N; n++) {
            assert_true(y[n * O + o] == y0[n * O + o] + b[o]);
            sum += y0[n * O + o];
        }
        assert_true(fabs(db[o] - sum) <= 1e-6 * (1 + fabs(sum)));
    }
    free(y), free(y0), free(b), free(db);
    kctx_destroy(&c);
}

/* ---- linear ---- */

typedef struct {
    kctx *c;
    float *in, *w, *out;
    const float *R;
    int N, I, O;
} linear_case;

static double linear_loss(void *arg) {
    linear_case *e = arg;
    k_linear_fwd(e->c, e->out, e->in, e->w, e->N, e->I, e->O);
    return dot_f32(e->out, e->R, (size_t)e->N * e->O);
}

static void test_linear(void **state) {
    (void)state;
    kctx c;
    init_cpu(&c);
    seed(10);
    enum { N = 5, I = 6, O = 3 };
    float *in = random_floats(N * I, 1.0f), *w = random_floats(O * I, 1.0f);
    float *R = random_floats(N * O, 1.0f), out[N * O];
    double ref[N * O];
    k_linear_fwd(&c, out, in, w, N, I, O);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < O; o++) {
            ref[n * O + o] = 0.0;
            for (int i = 0; i < I; i++) ref[n * O + o] += (double)in[n * I + i] * w[o * I + i];
        }
    expect_close("linear out", out, ref, N * O, 1e-6);

    linear_case e = {&c, in, w, out, R, N, I, O};
    float *din_base = random_floats(N * I, 1.0f), *dw_base = random_floats(O * I, 1.0f);
    float din[N * I], dw[O * I];
    /* accumulate_din = 0 overwrites din; dw always accumulates */
    memcpy(din, din_base, sizeof din);
    memcpy(dw, dw_base, sizeof dw);
    k_linear_bwd(&c, din, dw, R, in, w, N, I, O, 0);
    for (int i = 0; i < O * I; i++) dw[i] -= dw_base[i];
    check_grad("linear din", in, N * I, linear_loss, &e, din, 0.05);
    check_grad("linear dw", w, O * I, linear_loss, &e, dw, 0.05);

    /* accumulate_din = 1 adds to din */
    float din2[N * I];
    memcpy(din2, din_base, sizeof din2);
    k_linear_bwd(&c, din2, NULL, R, in, w, N, I, O, 1);
    for (int i = 0; i < N * I; i++) assert_true(fabsf(din2[i] - (din_base[i] + din[i])) < 1e-5f);

    /* NULL din: only dw, added once more */
    float dw2[O * I];
    memcpy(dw2, dw_base, sizeof dw2);
    k_linear_bwd(&c, NULL, dw2, R, in, w, N, I, O, 0);
    k_linear_bwd(&c, NULL, dw2, R, in, w, N, I, O, 0);
    for (int i = 0; i < O * I; i++) assert_true(fabsf(dw2[i] - (dw_base[i] + 2 * dw[i])) < 1e-5f);
    expect_ok(&c);
    free(in), free(w), free(R), free(din_base), free(dw_base);
    kctx_destroy(&c);
}

/* linear_fwd_acc adds exactly what linear_fwd writes (twice: twice). */
static void test_linear_fwd_acc(void **state) {
    (void)state;
    kctx c;
    init_cpu(&c);
    seed(15);
    enum { N = 5, I = 6, O = 3 };
    float *in = random_floats(N * I, 1.0f), *w = random_floats(O * I, 1.0f);
    float *base = random_floats(N * O, 1.0f), fresh[N * O], out[N * O];
    k_linear_fwd(&c, fresh, in, w, N, I, O);
    memcpy(out, base, sizeof out);
    k_linear_fwd_acc(&c, out, in, w, N, I, O);
    for (int i = 0; i < N * O; i++) assert_true(fabsf(out[i] - (base[i] + fresh[i])) < 1e-5f);
    k_linear_fwd_acc(&c, out, in, w, N, I, O);
    for (int i = 0; i < N * O; i++)
        assert_true(fabsf(out[i] - (base[i] + 2 * fresh[i])) < 1e-5f);
    expect_ok(&c);
    free(in), free(w), free(base);
    kctx_destroy(&c);
}

/* The _ld ops on a column slice of a wider matrix (rows LD apart, the fused LoRA inner
 * activations' layout) give the packed ops' results, and leave the other columns alone. */
static void test_linear_ld(void **state) {
    (void)state;
    kctx c;
    init_cpu(&c);
    seed(16);
    enum { N = 7, I = 4, O = 5, LD = 13, AT = 6 };
    float *wide = random_floats(N * LD, 1.0f), *w = random_floats(O * I, 1.0f);
    float *dout = random_floats(N * O, 1.0f), packed[N * I];
    for (int n = 0; n < N; n++) memcpy(packed + n * I, wide + n * LD + AT, I * sizeof *packed);
    float *base = random_floats(N * O, 1.0f), want[N * O], got[N * O];
    memcpy(want, base, sizeof want);
    memcpy(got, base, sizeof got);
    k_linear_fwd_acc(&c, want, packed, w, N, I, O);
    k_linear_fwd_ld(&c, got, wide + AT, LD, w, N, I, O, 1);
    assert_memory_equal(got, want, sizeof got);

    float dw_want[O * I] = {0}, dw_got[O * I] = {0}, din_want[N * I], before[N * LD];
    memcpy(before, wide, sizeof before);
    k_linear_bwd(&c, din_want, dw_want, dout, packed, w, N, I, O, 0);
    k_linear_bwd_ld(&c, NULL, dw_got, dout, wide + AT, LD, w, N, I, O, 0, 1);
    assert_memory_equal(dw_got, dw_want, sizeof dw_got);
    /* accumulate_dw 0 writes dw: the bits of adding onto zeros, whatever dw held (NaN) */
    for (int i = 0; i < O * I; i++) dw_got[i] = NAN;
    k_linear_bwd_ld(&c, NULL, dw_got, dout, wide + AT, LD, w, N, I, O, 0, 0);
    assert_memory_equal(dw_got, dw_want, sizeof dw_got);
    k_linear_bwd_ld(&c, wide + AT, NULL, dout, NULL, LD, w, N, I, O, 0, 1);
    for (int n = 0; n < N; n++)
        for (int j = 0; j < LD; j++) {
            float v = wide[n * LD + j];
            if (j >= AT && j < AT + I) assert_true(v == din_want[n * I + j - AT]);
            else assert_true(v == before[n * LD + j]);
        }
    expect_ok(&c);
    free(wide), free(w), free(dout), free(base);
    kctx_destroy(&c);
}

/* ---- cross-entropy ---- */

static void test_cross_entropy_value(void **state) {
    (void)state;
    kctx c;
    init_cpu(&c);
    /* row 0: logits (1, 2, 3), target 2: loss = log(1 + e^-1 + e^-2) = 0.40760596444438;
     * row 1 is masked; row 2: equal logits, target 0: loss = log 3. */
    float logits[9] = {1, 2, 3, 50, -50, 7, 0.5f, 0.5f, 0.5f};
    int32_t targets[3] = {2, K_IGNORE_INDEX, 0};
    float loss = 1.0f; /* added into */
    float dl[9];
    k_cross_entropy(&c, &loss, dl, logits, targets, 3, 3, 1.0f);
    assert_true(fabs(loss - (1.0 + 0.40760596444438 + log(3.0))) < 1e-6);
    for (int i = 3; i < 6; i++) assert_true(dl[i] == 0.0f); /* masked row: zero gradient */
    assert_true(fabs(dl[6] - (1.0 / 3 - 1.0)) < 1e-6);
    assert_true(fabs(dl[7] - 1.0 / 3) < 1e-6);

    /* large logits stay finite (max subtraction) */
    float big[3] = {1000, 0, -1000};
    int32_t t1[1] = {1};
    loss = 0.0f;
    k_cross_entropy(&c, &loss, NULL, big, t1, 1, 3, 1.0f);
    assert_true(fabs(loss - 1000.0) < 1e-3);

    /* every row masked: nothing added, dlogits all zero */
    int32_t none[3] = {K_IGNORE_INDEX, K_IGNORE_INDEX, K_IGNORE_INDEX};
    loss = 2.5f;
    k_cross_entropy(&c, &loss, logits, logits, none, 3, 3, 1.0f);
    assert_true(loss == 2.5f);
    for (int i = 0; i < 9; i++) assert_true(logits[i] == 0.0f);
    expect_ok(&c);
    kctx_destroy(&c);
}

typedef struct {
    kctx *c;
    float *logits;
    const int32_t *targets;
    int N, V;
} ce_case;

static double ce_loss(void *arg) {
    ce_case *e = arg;
    float loss = 0.0f;
    k_cross_entropy(e->c, &loss, NULL, e->logits, e->targets, e->N, e->V, 1.0f);
    return loss;
}

static void test_cross_entropy_grad(void **state) {
    (void)state;
    kctx c;
    init_cpu(&c);
    seed(11);
    enum { N = 6, V = 7 };
    int32_t targets[N] = {3, K_IGNORE_INDEX, 0, 6, K_IGNORE_INDEX, 3};
    float *logits = random_floats(N * V, 3.0f), dl[N * V], loss = 0.0f;
    const float dscale = 0.25f;
    k_cross_entropy(&c, &loss, dl, logits, targets, N, V, dscale);
    for (int i = 0; i < N * V; i++) dl[i] /= dscale;
    ce_case e = {&c, logits, targets, N, V};
    check_grad("cross_entropy dlogits", logits, N * V, ce_loss, &e, dl, 0.1);

    /* in place: dlogits = logits gives the same numbers */
    float inplace[N * V], loss2 = 0.0f;
    memcpy(inplace, logits, sizeof inplace);
    k_cross_entropy(&c, &loss2, inplace, inplace, targets, N, V, dscale);
    assert_true(loss2 == loss);
    for (int i = 0; i < N * V; i++) assert_true(inplace[i] == dl[i] * dscale);
    expect_ok(&c);
    free(logits);
    kctx_destroy(&c);
}

static void test_cross_entropy_bad_target(void **state) {
    (void)state;
    kctx c;
    errbuf err;
    init_cpu(&c);
    float logits[6] = {0}, loss = 0.0f;
    int32_t targets[2] = {1, 3};
    k_cross_entropy(&c, &loss, NULL, logits, targets, 2, 3, 1.0f);
    assert_int_equal(k_check(&c, &err), -1);
    assert_non_null(strstr(err.msg, "target 3"));
    assert_non_null(strstr(err.msg, "row 1"));
    kctx_destroy(&c);
}

static void test_shift_labels(void **state) {
    (void)state;
    int32_t labels[2 * 4] = {5, 6, K_IGNORE_INDEX, 8, K_IGNORE_INDEX, 1, 2, K_IGNORE_INDEX};
    int32_t targets[2 * 4];
    int32_t expect[2 * 4] = {6, K_IGNORE_INDEX, 8, K_IGNORE_INDEX,
                             1, 2, K_IGNORE_INDEX, K_IGNORE_INDEX};
    assert_int_equal(k_shift_labels(labels, targets, 2, 4), 4);
    assert_memory_equal(targets, expect, sizeof expect);
}

/* ---- AdamW ---- */

/* torch.optim.AdamW written out in double. */
static void adamw_reference(double *p, const float *grad, double *m, double *v, size_t n,
                            double lr, double b1, double b2, double eps, double wd, int step,
                            double grad_scale) {
    for (size_t i = 0; i < n; i++) {
        double g = grad[i] * grad_scale;
        p[i] -= lr * wd * p[i];
        m[i] = b1 * m[i] + (1 - b1) * g;
        v[i] = b2 * v[i] + (1 - b2) * g * g;
        double denom = sqrt(v[i]) / sqrt(1 - pow(b2, step)) + eps;
        p[i] -= lr / (1 - pow(b1, step)) * m[i] / denom;
    }
}

static void test_adamw(void **state) {
    (void)state;
    kctx c;
    init_cpu(&c);
    seed(12);
    enum { n = 32 };
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.5f;
    float *p = random_floats(n, 1.0f), m[n] = {0}, v[n] = {0};
    double rp[n], rm[n] = {0}, rv[n] = {0};
    for (int i = 0; i < n; i++) rp[i] = p[i];
    for (int step = 1; step <= 2; step++) {
        float *grad = random_floats(n, 1.0f), out[n];
        k_adamw(&c, p, grad, m, v, n, lr, b1, b2, eps, wd, step, gs, step == 2 ? out : NULL);
        adamw_reference(rp, grad, rm, rv, n, lr, b1, b2, eps, wd, step, gs);
        expect_close(step == 1 ? "adamw p, step 1" : "adamw p, step 2", p, rp, n, 1e-6);
        /* the compute copy (fp32 here): the new p's bits */
        if (step == 2) assert_memory_equal(out, p, sizeof out);
        expect_close("adamw m", m, rm, n, 1e-6);
        expect_close("adamw v", v, rv, n, 1e-6);
        free(grad);
    }
    /* the first step moves each parameter by about lr (m / sqrt(v) = sign(g)) */
    float q[1] = {1.0f}, g1[1] = {-4.0f}, m1[1] = {0}, v1[1] = {0};
    k_adamw(&c, q, g1, m1, v1, 1, lr, b1, b2, eps, 0.0f, 1, 1.0f, NULL);
    assert_true(fabsf(q[0] - (1.0f + lr)) < 1e-6f);
    expect_ok(&c);
    free(p);
    kctx_destroy(&c);
}

/* ---- NF4 dequantization ---- */

/* k_nf4_dequant on a tensor quantized by proto/nf4 gives nf4_dequantize's fp32 values, bit
 * for bit: single and double quantization, an odd count (the last byte's low nibble unused),
 * counts that are no multiple of the block, > 256 blocks (several nested absmax values), an
 * all-zero block and an outlier. */
static void check_nf4_dequant(kctx *c, size_t n, int double_quant) {
    float *w = random_floats(n, 0.05f);
    for (size_t i = 64; i < 128 && i < n; i++) w[i] = 0.0f; /* block 1: absmax 0 */
    w[n / 2] = 3.0f;                                         /* an outlier */
    nf4_tensor t = {0};
    errbuf err;
    int64_t shape[1] = {(int64_t)n};
    if (nf4_quantize(w, ST_F32, 1, shape, double_quant, &t, &err)) fail_msg("%s", err.msg);
    float *want = floats(n), *got = floats(n);
    if (nf4_dequantize(&t, want, &err)) fail_msg("%s", err.msg);
    if (double_quant)
        k_nf4_dequant(c, got, t.packed, t.absmax_q, t.nested_absmax, t.offset, n);
    else
        k_nf4_dequant(c, got, t.packed, t.absmax, NULL, 0.0f, n);
    expect_ok(c);
    for (size_t i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], sizeof(float)) != 0)
            fail_msg("nf4_dequant n=%zu double_quant=%d: value %zu is %.9g, nf4_dequantize %.9g", n,
                     double_quant, i, (double)got[i], (double)want[i]);
    nf4_free(&t);
    free(w);
    free(want);
    free(got);
}

static void test_nf4_dequant(void **state) {
    (void)state;
    kctx c;
    init_cpu(&c);
    seed(13);
    const size_t counts[] = {1, 63, 333 * 77, 257 * 64 + 33, 1024 * 70};
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++)
        for (int dq = 0; dq <= 1; dq++) check_nf4_dequant(&c, counts[k], dq);
    kctx_destroy(&c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_context),
        cmocka_unit_test(test_memory),
        cmocka_unit_test(test_deferred_copies),
        cmocka_unit_test(test_memory_count),
        cmocka_unit_test(test_memory_limit),
        cmocka_unit_test(test_elementwise),
        cmocka_unit_test(test_scale),
        cmocka_unit_test(test_dropout_contract),
        cmocka_unit_test(test_dropout_keep_formula),
        cmocka_unit_test(test_dropout_keys),
        cmocka_unit_test(test_dropout_fraction),
        cmocka_unit_test(test_dropout_bad_p),
        cmocka_unit_test(test_sticky_failure),
        cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_rmsnorm_forward),
        cmocka_unit_test(test_rmsnorm_grad),
        cmocka_unit_test(test_rmsnorm_bwd_frozen),
        cmocka_unit_test(test_rope_inv_freq_default),
        cmocka_unit_test(test_rope_inv_freq_llama3),
        cmocka_unit_test(test_rope_forward),
        cmocka_unit_test(test_rope_grad),
        cmocka_unit_test(test_rope_positions_restart),
        cmocka_unit_test(test_attention_forward),
        cmocka_unit_test(test_attention_causal),
        cmocka_unit_test(test_attention_window),
        cmocka_unit_test(test_bias),
        cmocka_unit_test(test_attention_grad_mha),
        cmocka_unit_test(test_attention_grad_gqa),
        cmocka_unit_test(test_attention_bad_heads),
        cmocka_unit_test(test_attention_varlen),
        cmocka_unit_test(test_attention_bad_docs),
        cmocka_unit_test(test_attention_kv),
        cmocka_unit_test(test_swiglu),
        cmocka_unit_test(test_linear),
        cmocka_unit_test(test_linear_fwd_acc),
        cmocka_unit_test(test_linear_ld),
        cmocka_unit_test(test_cross_entropy_value),
        cmocka_unit_test(test_cross_entropy_grad),
        cmocka_unit_test(test_cross_entropy_bad_target),
        cmocka_unit_test(test_shift_labels),
        cmocka_unit_test(test_adamw),
        cmocka_unit_test(test_nf4_dequant),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
