/* rng: Philox4x32-10, every number a pure function of (seed, stream, counter); see rng.h. */
#include "proto/rng.h"

#include <math.h>

#include "base/philox.h"

_Static_assert(RNG_PURPOSE_DROPOUT == PHILOX_PURPOSE_DROPOUT, "one dropout purpose");

void rng_philox4x32(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    philox4x32_10(ctr, key, out);
}

static void block(uint64_t seed, uint64_t stream, uint64_t counter, uint64_t out[2]) {
    uint32_t r[4];
    philox_block(seed, stream, counter, r);
    out[0] = (uint64_t)r[1] << 32 | r[0];
    out[1] = (uint64_t)r[3] << 32 | r[2];
}

/* The top 53 bits as a double in [0, 1). */
static double to_unit(uint64_t bits) { return (double)(bits >> 11) * 0x1.0p-53; }

uint64_t rng_u64(uint64_t seed, uint64_t stream, uint64_t counter) {
    uint64_t r[2];
    block(seed, stream, counter, r);
    return r[0];
}

double rng_uniform(uint64_t seed, uint64_t stream, uint64_t counter) {
    return to_unit(rng_u64(seed, stream, counter));
}

/* The four normals of block `b`: Box-Muller on words (0, 1) and (2, 3). */
static void normal_block(uint64_t seed, uint64_t stream, uint64_t b, float z[4]) {
    uint32_t r[4];
    philox_block(seed, stream, b, r);
    for (int p = 0; p < 2; p++) {
        float u1 = 1.0f - (float)(r[2 * p] >> 8) * 0x1.0p-24f; /* (0, 1]: logf(u1) is finite */
        float u2 = (float)(r[2 * p + 1] >> 8) * 0x1.0p-24f;
        float radius = sqrtf(-2.0f * logf(u1)), s, c;
        sincosf(6.28318530717958647692f * u2, &s, &c);
        z[2 * p] = radius * c;
        z[2 * p + 1] = radius * s;
    }
}

float rng_normal(uint64_t seed, uint64_t stream, uint64_t counter) {
    float z[4];
    normal_block(seed, stream, counter / 4, z);
    return z[counter % 4];
}

void rng_fill_normal(float *out, size_t n, float std, uint64_t seed, uint64_t stream,
                     uint64_t first_index) {
    float z[4];
    for (size_t i = 0; i < n;) {
        uint64_t at = first_index + i;
        normal_block(seed, stream, at / 4, z);
        for (unsigned k = (unsigned)(at % 4); k < 4 && i < n; k++, i++) out[i] = std * z[k];
    }
}
