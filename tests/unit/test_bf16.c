/* base/bf16: the array conversion is the scalar one element by element (normal, subnormal,
 * signed zero, infinities, NaN), and rounding to bf16 is to nearest, ties to even. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "base/bf16.h"

static void test_array_is_scalar(void **state) {
    (void)state;
    const uint16_t h[] = {0x3f80, 0xbf80, 0x0001, 0x8000, 0x7f80, 0xff80, 0x7fc1, 0x4049, 0x0000};
    size_t n = sizeof h / sizeof h[0];
    float got[sizeof h / sizeof h[0]];
    bf16_to_f32_n(got, h, n);
    for (size_t i = 0; i < n; i++) {
        float want = bf16_to_f32(h[i]);
        assert_memory_equal(&got[i], &want, sizeof want);
    }
    assert_true(got[0] == 1.0f && got[1] == -1.0f && isinf(got[4]) && isnan(got[6]));
    bf16_to_f32_n(got, h, 0); /* nothing to do */
}

static void test_rounding(void **state) {
    (void)state;
    assert_int_equal(bf16_from_f32(1.0f), 0x3f80);
    assert_int_equal(bf16_from_f32(1.00390625f), 0x3f80); /* halfway: ties to even (down) */
    assert_int_equal(bf16_from_f32(1.01171875f), 0x3f82); /* halfway: ties to even (up) */
    assert_int_equal(bf16_from_f32(NAN) & 0x7fc0, 0x7fc0); /* stays a quiet NaN */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_array_is_scalar),
        cmocka_unit_test(test_rounding),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
