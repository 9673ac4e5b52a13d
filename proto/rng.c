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

float rng_normal(uint64_t seed, uint64_t stream, uint64_t counter) {
    uint64_t r[2];
    block(seed, stream, counter, r);
    double u1 = 1.0 - to_unit(r[0]); /* (0, 1]: log(u1) is finite */
    double u2 = to_unit(r[1]);
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

void rng_fill_normal(float *out, size_t n, float std, uint64_t seed, uint64_t stream,
                     uint64_t first_index) {
    for (size_t i = 0; i < n; i++) out[i] = std * rng_normal(seed, stream, first_index + i);
}
