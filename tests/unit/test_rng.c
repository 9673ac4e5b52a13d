#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "proto/rng.h"

/* Random123's kat_vectors for philox4x32 10: counter, key, expected output. */
static void test_philox_known_answers(void **state) {
    (void)state;
    static const uint32_t kat[3][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
        {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d,
         0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
        {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09,
         0x94fdcceb, 0x5001e420, 0x24126ea1},
    };
    for (int i = 0; i < 3; i++) {
        uint32_t out[4];
        rng_philox4x32(&kat[i][0], &kat[i][4], out);
        for (int j = 0; j < 4; j++) assert_int_equal(out[j], kat[i][6 + j]);
    }
}

/* A pure function of (seed, stream, counter): the values drawn in order equal those drawn
 * again backwards with other streams drawn in between, rng_u64 is the raw Philox block of
 * counter (counter, stream) under key seed, and rng_normal is rng_fill_normal's element. */
static void test_deterministic(void **state) {
    (void)state;
    enum { N = 100 };
    const uint64_t seed = UINT64_C(0x123456789a), stream = rng_stream(RNG_PURPOSE_INIT, 7);
    uint64_t u[N];
    float z[N], filled[N];
    for (uint64_t i = 0; i < N; i++) {
        u[i] = rng_u64(seed, stream, i);
        z[i] = rng_normal(seed, stream, i);
    }
    rng_fill_normal(filled, N, 1.0f, seed, stream, 0);
    for (uint64_t k = 0; k < N; k++) {
        uint64_t i = N - 1 - k;
        (void)rng_u64(seed + 1, stream, i);
        (void)rng_normal(seed, stream + 1, k);
        assert_int_equal(rng_u64(seed, stream, i), u[i]);
        assert_true(rng_normal(seed, stream, i) == z[i]);
        assert_true(filled[i] == z[i]);
        const uint32_t ctr[4] = {(uint32_t)i, (uint32_t)(i >> 32), (uint32_t)stream, (uint32_t)(stream >> 32)};
        const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
        uint32_t block[4];
        rng_philox4x32(ctr, key, block);
        assert_int_equal(u[i], (uint64_t)block[1] << 32 | block[0]);
        assert_true(rng_uniform(seed, stream, i) == (double)(u[i] >> 11) * 0x1.0p-53);
    }
    /* a slice of a fill is the same part of the whole */
    float part[7];
    rng_fill_normal(part, 7, 1.0f, seed, stream, 41);
    assert_memory_equal(part, filled + 41, sizeof part);
    /* Pinned values: a change here silently changes every initialised model. */
    assert_int_equal(rng_u64(1234, 3, 5), UINT64_C(0x6257e120ca93914e));
    assert_true(rng_uniform(1234, 3, 5) == 0x1.895f84832a4e4p-2);
    /* libm's logf and sincosf may differ in the last bit between versions */
    assert_true(fabsf(rng_normal(1, 2, 3) - 0x1.77b4b6p-3f) <= 1e-7f);
}

static void test_streams_seeds_and_counters_differ(void **state) {
    (void)state;
    int same_stream = 0, same_seed = 0, same_counter = 0;
    for (uint64_t i = 0; i < 1000; i++) {
        uint64_t x = rng_u64(1, 0, i);
        same_stream += x == rng_u64(1, 1, i);
        same_seed += x == rng_u64(2, 0, i);
        same_counter += x == rng_u64(1, 0, i + 1);
    }
    assert_int_equal(same_stream, 0);
    assert_int_equal(same_seed, 0);
    assert_int_equal(same_counter, 0);
    /* Purposes keep streams apart even for the same index. */
    assert_true(rng_stream(RNG_PURPOSE_INIT, 3) != 3);
    assert_true(rng_stream(RNG_PURPOSE_INIT, 3) != rng_stream(RNG_PURPOSE_INIT, 4));
}

static void test_uniform_range_and_mean(void **state) {
    (void)state;
    const int n = 100000;
    double sum = 0;
    for (int i = 0; i < n; i++) {
        double u = rng_uniform(9, 2, (uint64_t)i);
        assert_true(u >= 0.0 && u < 1.0);
        sum += u;
    }
    assert_true(fabs(sum / n - 0.5) < 0.005); /* std of the mean: 0.29 / sqrt(n) = 0.0009 */
}

static void test_normal_moments(void **state) {
    (void)state;
    const size_t n = 100000;
    float *x = malloc(n * sizeof *x);
    assert_non_null(x);
    rng_fill_normal(x, n, 0.02f, 2024, rng_stream(RNG_PURPOSE_INIT, 0), 0);
    double sum = 0, sum2 = 0;
    size_t beyond_3sigma = 0;
    for (size_t i = 0; i < n; i++) {
        assert_true(isfinite(x[i]));
        sum += x[i];
        sum2 += (double)x[i] * x[i];
        beyond_3sigma += fabs(x[i]) > 3 * 0.02;
    }
    double mean = sum / n, std = sqrt(sum2 / n - mean * mean);
    free(x);
    assert_true(fabs(mean) < 0.0005);        /* 0.02 / sqrt(n) = 0.00006 */
    assert_true(fabs(std - 0.02) < 0.0004);  /* relative 2%; expected spread 0.2% */
    /* A normal puts 0.27% beyond 3 sigma: 270 of 1e5. */
    assert_true(beyond_3sigma > 180 && beyond_3sigma < 360);
}

static void test_slice_equals_part_of_full_fill(void **state) {
    (void)state;
    enum { N = 4096 };
    static float full[N], part[N];
    rng_fill_normal(full, N, 1.0f, 77, 11, 0);
    const size_t offsets[] = {1, 7, 1000, 4095};
    for (size_t k = 0; k < sizeof offsets / sizeof offsets[0]; k++) {
        size_t off = offsets[k], len = N - off;
        rng_fill_normal(part, len, 1.0f, 77, 11, off);
        assert_memory_equal(part, full + off, len * sizeof(float));
    }
    /* Scaling by std is exact per element. */
    rng_fill_normal(part, 10, 0.5f, 77, 11, 0);
    for (int i = 0; i < 10; i++) assert_true(part[i] == 0.5f * full[i]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_philox_known_answers),
        cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_streams_seeds_and_counters_differ),
        cmocka_unit_test(test_uniform_range_and_mean),
        cmocka_unit_test(test_normal_moments),
        cmocka_unit_test(test_slice_equals_part_of_full_fill),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
