/* fp8: the two OCP 8-bit floating-point formats of FP8 training (F45), header-only so that the
 * CPU reference and CUDA device code compile one definition.
 *
 *   e4m3 (OCP E4M3FN, torch.float8_e4m3fn): sign, 4 exponent bits (bias 7), 3 mantissa bits;
 *        no infinities, NaN is S.1111.111 (0x7f, 0xff); largest finite 448 (0x7e).
 *   e5m2 (torch.float8_e5m2): sign, 5 exponent bits (bias 15), 2 mantissa bits, IEEE-like:
 *        infinities S.11111.00, NaNs S.11111.{01,10,11}; largest finite 57344 (0x7b).
 * Both have subnormals (exponent field 0: mantissa * 2^(1 - bias - mantissa bits)).
 *
 * fp8_from_f32 is what cuBLASLt's FP8 GEMMs expect of their inputs, and what CUDA's
 * cvt.rn.satfinite (and torch's `x.clamp(-max, max).to(float8)`) gives: one rounding of the
 * float to nearest even, magnitudes at or past the largest finite value (infinities too)
 * saturated to it, a NaN the canonical NaN 0x7f (its sign dropped), -0 and negatives that
 * round to zero 0x80.  fp8_to_f32 is exact.
 *
 * Scaling (tensorwise or rowwise, kernels' k_fp8_cast): scale = fp8_max / amax in fp32, so
 * the largest magnitude lands on the largest finite code; amax 0 (all zeros) or not finite
 * gives scale 1; amax is clamped below at FP8_AMAX_EPS (torchao's EPS), so that the scale of
 * a tiny tensor stays finite.  The GEMM takes the inverse, fp8_inverse_scale. */
#ifndef FSDP_FP8_H
#define FSDP_FP8_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define FP8_FN static inline __host__ __device__
#else
#define FP8_FN static inline
#endif

typedef enum fp8_format { FP8_E4M3 = 0, FP8_E5M2 = 1 } fp8_format;

#define FP8_E4M3_MAX 448.0f
#define FP8_E5M2_MAX 57344.0f
#define FP8_NAN 0x7f        /* the NaN fp8_from_f32 writes, in either format */
#define FP8_AMAX_EPS 1e-12f /* amax is clamped below to this before the division */

FP8_FN int fp8_mantissa_bits(fp8_format f) {
    return f == FP8_E4M3 ? 3 : 2;
}

FP8_FN int fp8_bias(fp8_format f) {
    return f == FP8_E4M3 ? 7 : 15;
}

FP8_FN float fp8_max(fp8_format f) {
    return f == FP8_E4M3 ? FP8_E4M3_MAX : FP8_E5M2_MAX;
}

FP8_FN uint8_t fp8_max_code(fp8_format f) {
    return f == FP8_E4M3 ? 0x7e : 0x7b;
}

FP8_FN uint32_t fp8_f32_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

FP8_FN float fp8_bits_f32(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* The value of `code` in format f, exactly (a NaN code gives a quiet NaN of its sign). */
FP8_FN float fp8_to_f32(uint8_t code, fp8_format f) {
    int m = fp8_mantissa_bits(f), bias = fp8_bias(f);
    uint32_t sign = (uint32_t)(code >> 7) << 31, exp = (code & 0x7fu) >> m,
             man = code & ((1u << m) - 1), top = (1u << (7 - m)) - 1;
    if (f == FP8_E4M3 && (code & 0x7fu) == 0x7fu) return fp8_bits_f32(sign | 0x7fc00000u);
    if (f == FP8_E5M2 && exp == top)
        return fp8_bits_f32(sign | (man ? 0x7fc00000u : 0x7f800000u));
    if (exp == 0) { /* zero or subnormal: man * 2^(1 - bias - m), normalised into fp32 */
        if (man == 0) return fp8_bits_f32(sign);
        int e = 1 - bias - m; /* the exponent of man's lowest bit */
        while (!(man & (1u << m))) man <<= 1, e--;
        return fp8_bits_f32(sign | (uint32_t)(e + m + 127) << 23 | (man & ((1u << m) - 1)) << (23 - m));
    }
    return fp8_bits_f32(sign | (exp - bias + 127) << 23 | man << (23 - m));
}

/* x rounded to nearest even in format f, saturated to +-max (see the top). */
FP8_FN uint8_t fp8_from_f32(float x, fp8_format f) {
    uint32_t u = fp8_f32_bits(x), a = u & 0x7fffffffu;
    uint8_t sign = (uint8_t)((u >> 31) << 7);
    if (a > 0x7f800000u) return FP8_NAN;
    if (fp8_bits_f32(a) >= fp8_max(f)) return sign | fp8_max_code(f);
    int m = fp8_mantissa_bits(f), emin = 1 - fp8_bias(f), e = (int)(a >> 23) - 127;
    if ((a >> 23) == 0) return sign; /* fp32 zero or subnormal: far below fp8's range */
    uint32_t sig = (a & 0x7fffffu) | 0x800000u;
    int lsb = (e < emin ? emin : e) - m; /* the exponent of the result's lowest bit */
    int shift = 23 - (e - lsb);          /* sig's bits below that bit */
    uint32_t q;
    if (shift > 24) {
        q = 0; /* below half the smallest subnormal */
    } else {
        uint32_t rem = sig & ((1u << shift) - 1), half = 1u << (shift - 1);
        q = sig >> shift;
        if (rem > half || (rem == half && (q & 1u))) q++;
    }
    /* A normal result is ((e + bias) << m) + q - 2^m; a subnormal one q; a carry out of the
     * mantissa moves into the exponent on its own. */
    return sign | (uint8_t)(((uint32_t)((e < emin ? emin : e) + fp8_bias(f) - 1) << m) + q);
}

/* The scale that maps amax onto fp8_max (see the top). */
FP8_FN float fp8_scale(float amax, fp8_format f) {
    if (!(amax > 0.0f) || fp8_f32_bits(amax) >= 0x7f800000u) return 1.0f;
    return fp8_max(f) / (amax < FP8_AMAX_EPS ? FP8_AMAX_EPS : amax);
}

/* What the GEMM multiplies by: 1 / scale in fp32. */
FP8_FN float fp8_inverse_scale(float scale) {
    return 1.0f / scale;
}

#endif
