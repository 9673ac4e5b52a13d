/* bf16: bfloat16 and half <-> fp32 conversions, round to nearest even; see bf16.h. */
#include "base/bf16.h"

#include <string.h>

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t bf16_from_f32(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1); /* round to nearest, ties to even */
    return (uint16_t)(u >> 16);
}

float bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

void bf16_to_f32_n(float *dst, const uint16_t *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = bf16_to_f32(src[i]);
}

float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | mant << 13); /* inf, NaN */
    if (exp == 0) {
        if (mant == 0) return bits_f32(sign);
        /* subnormal: normalize so the leading 1 moves into the implicit bit */
        int e = -1;
        do {
            mant <<= 1;
            e++;
        } while (!(mant & 0x400));
        return bits_f32(sign | (uint32_t)(127 - 15 - e) << 23 | (mant & 0x3ff) << 13);
    }
    return bits_f32(sign | (exp + 127 - 15) << 23 | mant << 13);
}

/* Shifts m right by s bits, rounding to nearest, ties to even. */
static uint32_t shift_round_even(uint32_t m, int s) {
    uint32_t q = m >> s, rem = m & ((1u << s) - 1), half = 1u << (s - 1);
    return q + (rem > half || (rem == half && (q & 1)));
}

uint16_t f16_from_f32(float f) {
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t abs = u & 0x7fffffffu;
    if (abs > 0x7f800000u) return sign | 0x7e00 | (uint16_t)((abs >> 13) & 0x3ff); /* NaN */
    int exp = (int)(abs >> 23) - 127 + 15;
    uint32_t mant = (abs & 0x7fffffu) | 0x800000u; /* with the implicit bit */
    if (exp >= 31) return sign | 0x7c00; /* overflow and inf */
    if (exp <= 0) { /* subnormal half, or zero */
        if (exp < -10) return sign;
        return sign | (uint16_t)shift_round_even(mant, 14 - exp);
    }
    /* a mantissa carry rolls into the exponent, up to inf: both are right */
    return sign | (uint16_t)(((uint32_t)exp << 10) + shift_round_even(mant & 0x7fffffu, 13));
}
