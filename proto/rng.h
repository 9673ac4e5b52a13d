/* rng: a counter-based random number generator (Philox4x32-10, Salmon et al., SC'11).
 *
 * Every random number is a pure function of (seed, stream, counter): there is no state to
 * carry, split or save.  A stream names what the numbers are for (the init of parameter 7,
 * the dropout mask of sample 123, ...), the counter is the index within it, so the value
 * any process draws for an element is the same whatever the number of processes and
 * whatever else was drawn before (DESIGN.md, Checkpoints).
 *
 * Philox maps a 128-bit counter and a 64-bit key to 128 random bits; here the key is the
 * seed and the counter is (counter, stream).  The same function is available on GPUs
 * (curand's Philox4_32_10), so a CUDA kernel can reproduce these streams. */
#ifndef FSDP_RNG_H
#define FSDP_RNG_H

#include <stddef.h>
#include <stdint.h>

/* The raw block: Philox4x32-10 of ctr[4] under key[2] (Random123's philox4x32 10). */
void rng_philox4x32(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* 64 random bits for element `counter` of `stream`. */
uint64_t rng_u64(uint64_t seed, uint64_t stream, uint64_t counter);
/* Uniform in [0, 1), 53 random bits. */
double rng_uniform(uint64_t seed, uint64_t stream, uint64_t counter);
/* Element `counter` of a stream of standard normals: Philox block counter/4 gives four, by
 * Box-Muller in fp32 on its two pairs of 32-bit words (24 bits each: the tails end at 5.8
 * sigma, which an initialisation never misses).  Four normals a block and fp32 make a 70B
 * model's random init take a minute on 16 cores, not eight. */
float rng_normal(uint64_t seed, uint64_t stream, uint64_t counter);
/* out[i] = std * rng_normal(seed, stream, first_index + i) for i < n, so any slice of a
 * tensor can be generated on its own and equals the same part of the whole. */
void rng_fill_normal(float *out, size_t n, float std, uint64_t seed, uint64_t stream,
                     uint64_t first_index);

/* Streams: the top 16 bits name the purpose, the low 48 bits the index within it (a
 * parameter's index, a sample's index), so streams of different purposes never meet.
 * Add a purpose here when a new kind of randomness appears; never renumber one. */
typedef enum rng_purpose {
    RNG_PURPOSE_INIT = 1,  /* weight init: index = parameter index in checkpoint order */
    RNG_PURPOSE_SYNTH = 2, /* fsdpctl synth's records: index = record index */
    RNG_PURPOSE_SHUFFLE = 3, /* the data order: index = epoch */
    RNG_PURPOSE_DROPOUT = 4, /* LoRA dropout masks: index = sample (base/philox.h) */
    RNG_PURPOSE_LORA_INIT = 5, /* adapter init: index = layer * 8 + module */
    RNG_PURPOSE_SAMPLE = 6, /* generation's sampling: index = prompt, counter = new token */
} rng_purpose;

static inline uint64_t rng_stream(rng_purpose purpose, uint64_t index) {
    return (uint64_t)purpose << 48 | (index & ((UINT64_C(1) << 48) - 1));
}

#endif
