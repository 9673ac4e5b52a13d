/* base/fp8.h and the CPU backend's FP8 ops (F45): every one of the 256 codes of e4m3 and
 * e5m2 decoded against values derived from the bit layout with ldexp; encoding the exact
 * inverse on every finite code; ties to even at every midpoint between neighbours; saturation,
 * NaN, signed zeros, the subnormal boundary; the scale rule; k_fp8_cast (tensorwise and
 * rowwise) against a loop of its own; k_fp8_cast_t against k_fp8_cast of the transpose; k_fp8_gemm against a double sum over the decoded codes;
 * the refusals.  (All 2^16 bf16 inputs against ml_dtypes: tests/integration/test_fp8_table.sh.) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/bf16.h"
#include "base/fp8.h"
#include "kernels/kernels.h"

/* The value of a code from its fields alone: sign, exponent field E, mantissa field M. */
static double derived(uint8_t code, fp8_format f) {
    int mbits = f == FP8_E4M3 ? 3 : 2, bias = f == FP8_E4M3 ? 7 : 15;
    int E = (code & 0x7f) >> mbits, M = code & ((1 << mbits) - 1), top = (1 << (7 - mbits)) - 1;
    double s = code & 0x80 ? -1.0 : 1.0;
    if (f == FP8_E4M3 && E == top && M == (1 << mbits) - 1) return NAN;
    if (f == FP8_E5M2 && E == top) return M ? NAN : s * INFINITY;
    if (E == 0) return s * ldexp(M, 1 - bias - mbits);
    return s * ldexp((1 << mbits) + M, E - bias - mbits);
}

static int is_nan_code(uint8_t code, fp8_format f) {
    return isnan(derived(code, f));
}

static int is_inf_code(uint8_t code, fp8_format f) {
    return isinf(derived(code, f));
}

static void check_decode(fp8_format f) {
    int nans = 0;
    for (int c = 0; c < 256; c++) {
        double want = derived((uint8_t)c, f);
        float got = fp8_to_f32((uint8_t)c, f);
        if (isnan(want)) {
            assert_true(isnan(got));
            nans++;
            continue;
        }
        if ((double)got != want || !signbit(got) != !signbit(want))
            fail_msg("format %d code 0x%02x: decoded %a, its bits say %a", f, c, (double)got, want);
    }
    assert_int_equal(nans, f == FP8_E4M3 ? 2 : 6);
    assert_true(fp8_to_f32(fp8_max_code(f), f) == fp8_max(f));
}

static void test_decode_all_codes(void **state) {
    (void)state;
    check_decode(FP8_E4M3);
    check_decode(FP8_E5M2);
    assert_true(fp8_to_f32(0x7e, FP8_E4M3) == 448.0f);
    assert_true(fp8_to_f32(0x01, FP8_E4M3) == 0x1p-9f);
    assert_true(fp8_to_f32(0x7b, FP8_E5M2) == 57344.0f);
    assert_true(fp8_to_f32(0x01, FP8_E5M2) == 0x1p-16f);
    assert_true(isinf(fp8_to_f32(0xfc, FP8_E5M2)) && fp8_to_f32(0xfc, FP8_E5M2) < 0);
}

static void check_inverse(fp8_format f) {
    for (int c = 0; c < 256; c++) {
        if (is_nan_code((uint8_t)c, f) || is_inf_code((uint8_t)c, f)) continue;
        uint8_t back = fp8_from_f32(fp8_to_f32((uint8_t)c, f), f);
        if (back != c) fail_msg("format %d code 0x%02x encodes back to 0x%02x", f, c, back);
    }
}

static void test_encode_inverts_decode(void **state) {
    (void)state;
    check_inverse(FP8_E4M3);
    check_inverse(FP8_E5M2);
}

/* Between neighbours c and c + 1 (positive, finite) the midpoint goes to the one whose code is
 * even (its mantissa's last bit 0), and the floats either side of it to the nearer code. */
static void check_midpoints(fp8_format f) {
    for (int c = 0; c < fp8_max_code(f); c++) {
        float lo = fp8_to_f32((uint8_t)c, f), hi = fp8_to_f32((uint8_t)(c + 1), f);
        float mid = (float)(((double)lo + hi) / 2); /* exact: a few bits apart */
        assert_true((double)mid == ((double)lo + hi) / 2);
        uint8_t even = c % 2 ? (uint8_t)(c + 1) : (uint8_t)c;
        for (int s = 0; s < 2; s++) {
            float sign = s ? -1.0f : 1.0f;
            uint8_t sbit = s ? 0x80 : 0;
            if (fp8_from_f32(sign * mid, f) != (sbit | even))
                fail_msg("format %d: midpoint %a of 0x%02x and 0x%02x gave 0x%02x", f,
                         (double)(sign * mid), c, c + 1, fp8_from_f32(sign * mid, f));
            assert_int_equal(fp8_from_f32(sign * nextafterf(mid, 0.0f), f), sbit | c);
            assert_int_equal(fp8_from_f32(sign * nextafterf(mid, INFINITY), f), sbit | (c + 1));
        }
    }
}

static void test_ties_to_even(void **state) {
    (void)state;
    check_midpoints(FP8_E4M3);
    check_midpoints(FP8_E5M2);
}

static void check_saturation(fp8_format f) {
    float max = fp8_max(f);
    uint8_t top = fp8_max_code(f);
    const float big[] = {max, nextafterf(max, INFINITY), max * 1.0625f, max * 1.5f, max * 2.0f,
                         1e30f, FLT_MAX, INFINITY};
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
        assert_int_equal(fp8_from_f32(big[i], f), top);
        assert_int_equal(fp8_from_f32(-big[i], f), 0x80 | top);
    }
    assert_int_equal(fp8_from_f32(nextafterf(max, 0.0f), f), top);
}

static void test_saturation(void **state) {
    (void)state;
    check_saturation(FP8_E4M3);
    check_saturation(FP8_E5M2);
    /* e4m3's 464 is the midpoint of 448 and the 480 it lacks: 448 whichever way */
    assert_int_equal(fp8_from_f32(464.0f, FP8_E4M3), 0x7e);
    assert_int_equal(fp8_from_f32(61440.0f, FP8_E5M2), 0x7b);
}

static void test_nan_zero_tiny(void **state) {
    (void)state;
    for (int f = 0; f < 2; f++) {
        assert_int_equal(fp8_from_f32(NAN, (fp8_format)f), FP8_NAN);
        assert_int_equal(fp8_from_f32(-NAN, (fp8_format)f), FP8_NAN);
        assert_true(is_nan_code(FP8_NAN, (fp8_format)f));
        assert_int_equal(fp8_from_f32(0.0f, (fp8_format)f), 0x00);
        assert_int_equal(fp8_from_f32(-0.0f, (fp8_format)f), 0x80);
        float sub = fp8_to_f32(1, (fp8_format)f); /* the smallest subnormal */
        assert_int_equal(fp8_from_f32(sub / 2, (fp8_format)f), 0x00);          /* tie: to 0 */
        assert_int_equal(fp8_from_f32(-sub / 2, (fp8_format)f), 0x80);
        assert_int_equal(fp8_from_f32(nextafterf(sub / 2, 1.0f), (fp8_format)f), 0x01);
        assert_int_equal(fp8_from_f32(sub * 1.5f, (fp8_format)f), 0x02);      /* tie: to 2 */
        assert_int_equal(fp8_from_f32(0x1p-140f, (fp8_format)f), 0x00);       /* fp32 subnormal */
        assert_int_equal(fp8_from_f32(-FLT_MIN, (fp8_format)f), 0x80);
    }
}

static void test_scale_rule(void **state) {
    (void)state;
    assert_true(fp8_scale(0.0f, FP8_E4M3) == 1.0f);
    assert_true(fp8_scale(INFINITY, FP8_E4M3) == 1.0f);
    assert_true(fp8_scale(NAN, FP8_E5M2) == 1.0f);
    assert_true(fp8_scale(448.0f, FP8_E4M3) == 1.0f);
    assert_true(fp8_scale(2.0f, FP8_E5M2) == 28672.0f);
    assert_true(fp8_scale(1e-30f, FP8_E4M3) == 448.0f / FP8_AMAX_EPS);
    assert_true(isfinite(fp8_scale(FLT_TRUE_MIN, FP8_E5M2)));
    assert_true(fp8_inverse_scale(4.0f) == 0.25f);
}

/* ---- the CPU backend's ops ---- */

static kctx cpu;

static int setup(void **state) {
    (void)state;
    errbuf err = {{0}};
    return kctx_init(&cpu, K_CPU, 0, &err);
}

static int teardown(void **state) {
    (void)state;
    kctx_destroy(&cpu);
    return 0;
}

static uint64_t rng = 88172645463325252ULL;

static float frand(void) { /* U(-1, 1), bf16-exact as the CUDA backend's inputs are */
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return bf16_to_f32(bf16_from_f32((float)((double)(rng >> 11) / 4503599627370496.0 - 1.0)));
}

static float *randoms(size_t n, float scale) {
    float *x = malloc(n * sizeof *x);
    assert_non_null(x);
    for (size_t i = 0; i < n; i++) x[i] = frand() * scale;
    return x;
}

static void expect_ok(void) {
    errbuf err = {{0}};
    if (k_check(&cpu, &err)) fail_msg("%s", err.msg);
}

static void expect_failure(const char *needle) {
    errbuf err = {{0}};
    assert_int_equal(k_check(&cpu, &err), -1);
    if (!strstr(err.msg, needle)) fail_msg("'%s' lacks '%s'", err.msg, needle);
}

/* rows [r0, r1) of x cast with one amax, as the op's contract says; returns the inverse scale */
static float want_cast(uint8_t *out, const float *x, int r0, int r1, int cols, fp8_format f) {
    float amax = 0.0f;
    for (size_t i = (size_t)r0 * cols; i < (size_t)r1 * cols; i++)
        if (fabsf(x[i]) > amax) amax = fabsf(x[i]);
    float scale = amax > 0 ? fp8_max(f) / amax : 1.0f;
    for (size_t i = (size_t)r0 * cols; i < (size_t)r1 * cols; i++)
        out[i] = fp8_from_f32(x[i] * scale, f);
    return 1.0f / scale;
}

static void check_cast(int rows, int cols, fp8_format f, k_fp8_scaling s) {
    size_t n = (size_t)rows * cols;
    float *x = randoms(n, 3.0f), si[64], want_si[64];
    for (int c = 0; c < cols; c++) x[(size_t)(rows / 2) * cols + c] = 0.0f; /* a zero row */
    x[n - 1] = NAN;                                                        /* ignored by amax */
    uint8_t *got = malloc(n), *want = malloc(n);
    assert_true(got && want && rows <= 64);
    k_fp8_cast(&cpu, got, si, x, rows, cols, f, s);
    expect_ok();
    if (s == K_FP8_TENSORWISE) {
        want_si[0] = want_cast(want, x, 0, rows, cols, f);
        assert_true(si[0] == want_si[0]);
    } else {
        for (int r = 0; r < rows; r++) {
            want_si[r] = want_cast(want, x, r, r + 1, cols, f);
            assert_true(si[r] == want_si[r]);
        }
        assert_true(si[rows / 2] == 1.0f);
    }
    assert_memory_equal(got, want, n);
    assert_int_equal(got[n - 1], FP8_NAN);
    /* each row's (or the tensor's) largest magnitude lands on the largest code */
    int hit_max = 0;
    for (size_t i = 0; i < n; i++) hit_max |= (got[i] & 0x7f) == fp8_max_code(f);
    assert_true(hit_max);
    free(x);
    free(got);
    free(want);
}

static void test_cast_op(void **state) {
    (void)state;
    for (int f = 0; f < 2; f++) {
        check_cast(7, 33, (fp8_format)f, K_FP8_TENSORWISE);
        check_cast(7, 33, (fp8_format)f, K_FP8_ROWWISE);
        check_cast(64, 128, (fp8_format)f, K_FP8_ROWWISE);
    }
}

/* The transposed cast: column j of x (a row of the transpose) cast as k_fp8_cast casts a row. */
static void check_cast_t(int rows, int cols, fp8_format f, k_fp8_scaling s) {
    size_t n = (size_t)rows * cols;
    float *x = randoms(n, 2.0f), *xt = malloc(n * sizeof *xt), si[64], want_si[64];
    uint8_t *got = malloc(n), *want = malloc(n);
    assert_true(xt && got && want && cols <= 64);
    for (int i = 0; i < rows; i++) x[(size_t)i * cols + cols - 1] *= 1e-3f; /* a small column */
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) xt[(size_t)j * rows + i] = x[(size_t)i * cols + j];
    k_fp8_cast_t(&cpu, got, si, x, rows, cols, f, s);
    expect_ok();
    k_fp8_cast(&cpu, want, want_si, xt, cols, rows, f, s);
    expect_ok();
    assert_memory_equal(got, want, n);
    assert_memory_equal(si, want_si, (s == K_FP8_ROWWISE ? (size_t)cols : 1) * sizeof(float));
    free(x);
    free(xt);
    free(got);
    free(want);
}

static void test_cast_t_op(void **state) {
    (void)state;
    for (int f = 0; f < 2; f++)
        for (int s = 0; s < 2; s++) {
            check_cast_t(33, 7, (fp8_format)f, (k_fp8_scaling)s);
            check_cast_t(1, 64, (fp8_format)f, (k_fp8_scaling)s);
        }
}

static uint8_t *random_codes(size_t n, fp8_format f) {
    uint8_t *c = malloc(n);
    assert_non_null(c);
    for (size_t i = 0; i < n; i++) c[i] = fp8_from_f32(frand() * fp8_max(f), f);
    return c;
}

static void check_gemm(int M, int N, int K, fp8_format fa, fp8_format fb, k_fp8_scaling s) {
    uint8_t *a = random_codes((size_t)M * K, fa), *b = random_codes((size_t)N * K, fb);
    float sa[32], sb[32], *out = malloc((size_t)M * N * sizeof(float));
    assert_true(out && M <= 32 && N <= 32);
    for (int i = 0; i < 32; i++) sa[i] = 0.001f * (float)(i + 1), sb[i] = 0.01f / (float)(i + 1);
    k_fp8_gemm(&cpu, out, a, sa, fa, b, sb, fb, M, N, K, s);
    expect_ok();
    int row = s == K_FP8_ROWWISE;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double acc = 0, mag = 0, scale = (double)sa[row ? m : 0] * sb[row ? n : 0];
            for (int k = 0; k < K; k++) {
                double t = derived(a[(size_t)m * K + k], fa) * derived(b[(size_t)n * K + k], fb);
                acc += t, mag += fabs(t);
            }
            float want = bf16_to_f32(bf16_from_f32((float)(acc * scale)));
            float got = out[(size_t)m * N + n];
            /* one bf16 step (2^-8 relative: both sides round) plus the fp32 sum's rounding
             * (K terms, 2^-24 each, of at most the sum of magnitudes) */
            if (fabs((double)got - want) > ldexp(fabs(want), -8) + K * ldexp(mag * scale, -24))
                fail_msg("fp8_gemm [%d,%d]: %g, want %g", m, n, got, want);
            assert_true(bf16_to_f32(bf16_from_f32(got)) == got);
        }
    free(a);
    free(b);
    free(out);
}

static void test_gemm_op(void **state) {
    (void)state;
    check_gemm(5, 7, 48, FP8_E4M3, FP8_E4M3, K_FP8_TENSORWISE);
    check_gemm(5, 7, 48, FP8_E4M3, FP8_E4M3, K_FP8_ROWWISE);
    check_gemm(16, 32, 64, FP8_E4M3, FP8_E5M2, K_FP8_ROWWISE);
    check_gemm(3, 2, 16, FP8_E5M2, FP8_E4M3, K_FP8_TENSORWISE);
}

static void test_refusals(void **state) {
    (void)state;
    uint8_t codes[16] = {0};
    float x[16] = {0}, si[2] = {0}, out[4];
    k_fp8_gemm(&cpu, out, codes, si, FP8_E5M2, codes, si, FP8_E5M2, 1, 1, 16, K_FP8_TENSORWISE);
    expect_failure("e5m2 x e5m2");
    k_fp8_cast(&cpu, codes, si, x, 2, 8, (fp8_format)2, K_FP8_TENSORWISE);
    expect_failure("fp8 format 2");
    k_fp8_cast(&cpu, codes, si, x, 2, 8, FP8_E4M3, (k_fp8_scaling)5);
    expect_failure("fp8 scaling 5");
}
/* A signaling NaN (bf16 0x7f81, as the H200's every-bf16 check holds) is dropped from the
 * amax like a quiet one, as CUDA's max.f32 drops it, rowwise and per column. */
static void test_signaling_nan_dropped(void **state) {
    (void)state;
    float snan = fp8_bits_f32(0x7f810000u), qnan = fp8_bits_f32(0x7fc00000u);
    /* each NaN last in its fold: a later number would hide a NaN amax */
    float x[8] = {1.0f, 3.0f, 2.0f, snan, 0.5f, qnan, snan, 1.0f};
    uint8_t codes[8];
    float si[4];
    k_fp8_cast(&cpu, codes, si, x, 2, 4, FP8_E4M3, K_FP8_ROWWISE);
    expect_ok();
    assert_true(si[0] == fp8_inverse_scale(fp8_scale(3.0f, FP8_E4M3)));
    assert_true(si[1] == fp8_inverse_scale(fp8_scale(1.0f, FP8_E4M3)));
    assert_int_equal(codes[3], FP8_NAN);
    k_fp8_cast_t(&cpu, codes, si, x, 2, 4, FP8_E4M3, K_FP8_ROWWISE);
    expect_ok();
    assert_true(si[1] == fp8_inverse_scale(fp8_scale(3.0f, FP8_E4M3)));
    assert_true(si[2] == fp8_inverse_scale(fp8_scale(2.0f, FP8_E4M3)));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode_all_codes),
        cmocka_unit_test(test_encode_inverts_decode),
        cmocka_unit_test(test_ties_to_even),
        cmocka_unit_test(test_saturation),
        cmocka_unit_test(test_nan_zero_tiny),
        cmocka_unit_test(test_scale_rule),
        cmocka_unit_test(test_cast_op),
        cmocka_unit_test(test_cast_t_op),
        cmocka_unit_test(test_gemm_op),
        cmocka_unit_test(test_signaling_nan_dropped),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
