/* philox: Philox4x32-10 (Salmon et al., SC'11; Random123's philox4x32 with 10 rounds), the
 * one counter-based generator behind every random stream (proto/rng.h) and every dropout
 * mask (kernels' k_dropout).  Header-only, so that the CPU code and CUDA device code compile
 * the same definition and draw the same bits.
 *
 * Dropout (DESIGN.md, Checkpoints: every random stream is keyed by seed, sample and purpose,
 * never by rank): the keep decision for element e of a sample's [T, cols] input at dropout
 * site s (a layer and a module: philox_dropout_site) is a pure function of (seed, sample, s,
 * e), so a recomputation, another world size or another backend draws the same mask. */
#ifndef FSDP_PHILOX_H
#define FSDP_PHILOX_H

#include <stdint.h>

#ifdef __CUDACC__
#define PHILOX_FN static inline __host__ __device__
#else
#define PHILOX_FN static inline
#endif

PHILOX_FN void philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3], k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; round++) {
        if (round > 0) k0 += UINT32_C(0x9E3779B9), k1 += UINT32_C(0xBB67AE85);
        uint64_t p0 = (uint64_t)UINT32_C(0xD2511F53) * c0;
        uint64_t p1 = (uint64_t)UINT32_C(0xCD9E8D57) * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)p1, c3 = (uint32_t)p0, c0 = n0, c2 = n2;
    }
    out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

/* The 128 bits of element `counter` of `stream` under `seed` (proto/rng.h's streams). */
PHILOX_FN void philox_block(uint64_t seed, uint64_t stream, uint64_t counter, uint32_t out[4]) {
    const uint32_t ctr[4] = {(uint32_t)counter, (uint32_t)(counter >> 32), (uint32_t)stream,
                             (uint32_t)(stream >> 32)};
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    philox4x32_10(ctr, key, out);
}

/* The dropout streams' purpose (proto/rng.h's rng_purpose RNG_PURPOSE_DROPOUT). */
#define PHILOX_PURPOSE_DROPOUT 4

/* A dropout site: decoder layer `layer`, module `module` (0..7: q, k, v, o, gate, up, down). */
PHILOX_FN uint32_t philox_dropout_site(int layer, int module) {
    return (uint32_t)layer * 8u + (uint32_t)module;
}

/* The keep threshold of drop probability p in [0, 1): an element is kept when its 32 random
 * bits are >= the threshold, so P(drop) = threshold / 2^32 (p rounded to a multiple of
 * 2^-32). */
static inline uint32_t philox_dropout_threshold(double p) {
    double t = p * 4294967296.0;
    return t >= 4294967295.0 ? UINT32_C(4294967295) : (uint32_t)t;
}

/* The keep decisions of elements 4g .. 4g+3 (row-major indices into the sample's [T, cols]
 * input) of `sample` at `site`: kept when their word of one block is >= the threshold.
 * Stream: (purpose dropout, sample); counter: site << 40 | g.  One block serves the four
 * neighbours, so a kernel draws it once for them (philox_dropout_keep is one of the four). */
PHILOX_FN void philox_dropout_keep4(uint64_t seed, uint64_t sample, uint32_t site, uint64_t g,
                                    uint32_t threshold, int keep[4]) {
    uint32_t r[4];
    uint64_t stream = (uint64_t)PHILOX_PURPOSE_DROPOUT << 48 | (sample & ((UINT64_C(1) << 48) - 1));
    philox_block(seed, stream, (uint64_t)site << 40 | g, r);
    for (int j = 0; j < 4; j++) keep[j] = r[j] >= threshold;
}

/* Whether element e (row-major index into the sample's [T, cols] input) of `sample` at
 * `site` is kept: word e % 4 of the block of e / 4 (philox_dropout_keep4). */
PHILOX_FN int philox_dropout_keep(uint64_t seed, uint64_t sample, uint32_t site, uint64_t e,
                                  uint32_t threshold) {
    int keep[4];
    philox_dropout_keep4(seed, sample, site, e >> 2, threshold, keep);
    return keep[e & 3];
}

#endif
