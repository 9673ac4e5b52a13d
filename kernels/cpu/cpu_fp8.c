/* CPU backend: FP8 casts with tensorwise or rowwise scaling, and the FP8 GEMM, the reference
 * the CUDA kernels are checked against (base/fp8.h's rounding, bit for bit for the casts). */
#include "kernels/cpu/cpu_kernels.h"

#include <math.h>
#include <stdlib.h>

#include "base/bf16.h"

/* max(m, |x|), NaNs dropped, quiet or signaling: glibc's fmaxf follows IEEE 754-2008 maxNum
 * and returns NaN for a signaling one, where CUDA's max.f32 (the kernels') drops every NaN
 * (the H200 found the 63 columns of every bf16 value whose NaNs are signaling). */
static float max_abs(float m, float x) {
    float a = fabsf(x);
    return a > m ? a : m;
}

static float amax_of(const float *x, size_t n) {
    float m = 0.0f;
    for (size_t i = 0; i < n; i++) m = max_abs(m, x[i]);
    return m;
}

/* out = fp8(in * scale) for n values; returns the inverse scale. */
static float cast_scaled(uint8_t *out, const float *in, size_t n, float amax, fp8_format fmt) {
    float scale = fp8_scale(amax, fmt);
    for (size_t i = 0; i < n; i++) out[i] = fp8_from_f32(in[i] * scale, fmt);
    return fp8_inverse_scale(scale);
}

void cpu_fp8_cast(kctx *c, uint8_t *out, float *scale_inv, const void *in, int rows, int cols,
                  fp8_format fmt, k_fp8_scaling scaling) {
    if (k_fp8_bad_args(c, "fp8_cast", fmt, fmt, scaling, 0) || rows <= 0 || cols <= 0) return;
    const float *x = in;
    size_t n = (size_t)rows * (size_t)cols;
    if (scaling == K_FP8_TENSORWISE) {
        scale_inv[0] = cast_scaled(out, x, n, amax_of(x, n), fmt);
        return;
    }
    for (size_t r = 0; r < (size_t)rows; r++) {
        const float *row = x + r * (size_t)cols;
        scale_inv[r] = cast_scaled(out + r * (size_t)cols, row, (size_t)cols,
                                   amax_of(row, (size_t)cols), fmt);
    }
}

void cpu_fp8_cast_t(kctx *c, uint8_t *out, float *scale_inv, const void *in, int rows, int cols,
                    fp8_format fmt, k_fp8_scaling scaling) {
    if (k_fp8_bad_args(c, "fp8_cast_t", fmt, fmt, scaling, 0) || rows <= 0 || cols <= 0) return;
    const float *x = in;
    size_t R = (size_t)rows, C = (size_t)cols;
    float *scale = malloc(C * sizeof *scale);
    if (!scale) {
        k_fail(c, "fp8_cast_t: out of host memory (%d columns)", cols);
        return;
    }
    float amax = scaling == K_FP8_TENSORWISE ? amax_of(x, R * C) : 0.0f;
    for (size_t j = 0; j < C; j++) {
        float m = amax;
        for (size_t i = 0; scaling == K_FP8_ROWWISE && i < R; i++) m = max_abs(m, x[i * C + j]);
        scale[j] = fp8_scale(m, fmt);
        if (scaling == K_FP8_ROWWISE || j == 0) scale_inv[j] = fp8_inverse_scale(scale[j]);
    }
    for (size_t i = 0; i < R; i++)
        for (size_t j = 0; j < C; j++) out[j * R + i] = fp8_from_f32(x[i * C + j] * scale[j], fmt);
    free(scale);
}

/* n codes of format fmt decoded into a new fp32 buffer (NULL after a k_fail). */
static float *decoded(kctx *c, const uint8_t *codes, size_t n, fp8_format fmt) {
    float *x = malloc(n * sizeof *x);
    if (!x) {
        k_fail(c, "fp8_gemm: out of host memory (%zu values)", n);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) x[i] = fp8_to_f32(codes[i], fmt);
    return x;
}

/* The products of two fp8 values are exact in fp32 (at most 4 x 4 significant bits), so the
 * fp32 GEMM of the decoded codes (cpu_linear_fwd_ld) sums exact terms; the scales come after,
 * then one rounding to bf16 as the CUDA output's. */
void cpu_fp8_gemm(kctx *c, void *out, const uint8_t *a, const float *a_scale_inv, fp8_format fa,
                  const uint8_t *b, const float *b_scale_inv, fp8_format fb, int M, int N, int K,
                  k_fp8_scaling scaling) {
    if (k_fp8_bad_args(c, "fp8_gemm", fa, fb, scaling, 1) || M <= 0 || N <= 0 || K <= 0) return;
    float *da = decoded(c, a, (size_t)M * (size_t)K, fa);
    float *db = da ? decoded(c, b, (size_t)N * (size_t)K, fb) : NULL;
    if (db) {
        float *o = out;
        cpu_linear_fwd_ld(c, o, da, K, db, M, K, N, 0);
        int row = scaling == K_FP8_ROWWISE;
        for (size_t m = 0; m < (size_t)M; m++)
            for (size_t n = 0; n < (size_t)N; n++) {
                float s = a_scale_inv[row ? m : 0] * b_scale_inv[row ? n : 0];
                float *y = o + m * (size_t)N + n;
                *y = bf16_to_f32(bf16_from_f32(*y * s));
            }
    }
    free(da);
    free(db);
}

/* ---- FP8 gathers: from fp32 masters (the CPU's compute dtype is fp32: no rounding) ---- */

void cpu_fp8_amax_f32(kctx *c, float *amax, const float *x, size_t n) {
    (void)c;
    amax[0] = amax_of(x, n);
}

void cpu_fp8_cast_f32(kctx *c, uint8_t *out, const float *x, size_t n, const float *scale, fp8_format fmt) {
    if (k_fp8_bad_args(c, "fp8_cast_f32", fmt, fmt, K_FP8_TENSORWISE, 0)) return;
    for (size_t i = 0; i < n; i++) out[i] = fp8_from_f32(x[i] * scale[0], fmt);
}

void cpu_fp8_transpose(kctx *c, uint8_t *out, const uint8_t *in, int rows, int cols) {
    (void)c;
    for (size_t i = 0; i < (size_t)(rows > 0 ? rows : 0); i++)
        for (size_t j = 0; j < (size_t)(cols > 0 ? cols : 0); j++) out[j * (size_t)rows + i] = in[i * (size_t)cols + j];
}
