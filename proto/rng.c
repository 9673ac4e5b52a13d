#include "proto/rng.h"

#include <math.h>

#define PHILOX_M0 UINT32_C(0xD2511F53)
#define PHILOX_M1 UINT32_C(0xCD9E8D57)
#define PHILOX_W0 UINT32_C(0x9E3779B9) /* golden ratio */
#define PHILOX_W1 UINT32_C(0xBB67AE85) /* sqrt(3) - 1 */

static void philox_round(uint32_t c[4], const uint32_t k[2]) {
    uint64_t p0 = (uint64_t)PHILOX_M0 * c[0];
    uint64_t p1 = (uint64_t)PHILOX_M1 * c[2];
    uint32_t next[4] = {
        (uint32_t)(p1 >> 32) ^ c[1] ^ k[0],
        (uint32_t)p1,
        (uint32_t)(p0 >> 32) ^ c[3] ^ k[1],
        (uint32_t)p0,
    };
    c[0] = next[0], c[1] = next[1], c[2] = next[2], c[3] = next[3];
}

void rng_philox4x32(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c[4] = {ctr[0], ctr[1], ctr[2], ctr[3]};
    uint32_t k[2] = {key[0], key[1]};
    for (int round = 0; round < 10; round++) {
        if (round > 0) k[0] += PHILOX_W0, k[1] += PHILOX_W1;
        philox_round(c, k);
    }
    out[0] = c[0], out[1] = c[1], out[2] = c[2], out[3] = c[3];
}

static void block(uint64_t seed, uint64_t stream, uint64_t counter, uint64_t out[2]) {
    const uint32_t ctr[4] = {(uint32_t)counter, (uint32_t)(counter >> 32), (uint32_t)stream,
                             (uint32_t)(stream >> 32)};
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t r[4];
    rng_philox4x32(ctr, key, r);
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
