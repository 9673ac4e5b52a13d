/* Learning-rate schedules against the Hugging Face formulas. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <math.h>

#include "worker/schedule.h"

static job_config job_with(job_schedule s, double lr, double min_lr, int warmup) {
    job_config j;
    job_defaults(&j);
    j.train.schedule = s;
    j.train.lr = lr;
    j.train.min_lr = min_lr;
    j.train.warmup_steps = warmup;
    return j;
}

static void test_warmup_is_linear_from_zero(void **state) {
    (void)state;
    job_config j = job_with(JOB_SCHEDULE_COSINE, 1e-3, 0, 10);
    assert_float_equal(schedule_lr(&j, 0, 100), 0.0, 1e-15);
    assert_float_equal(schedule_lr(&j, 5, 100), 5e-4, 1e-15);
    assert_float_equal(schedule_lr(&j, 10, 100), 1e-3, 1e-15); /* decay starts at full lr */
}

static void test_cosine_matches_hf(void **state) {
    (void)state;
    job_config j = job_with(JOB_SCHEDULE_COSINE, 2e-3, 0, 10);
    /* get_cosine_schedule_with_warmup: 0.5 * (1 + cos(pi * (s - w) / (T - w))) */
    for (long s = 10; s <= 100; s += 7) {
        double want = 2e-3 * 0.5 * (1 + cos(M_PI * (double)(s - 10) / 90.0));
        assert_float_equal(schedule_lr(&j, s, 100), want, 1e-15);
    }
    assert_float_equal(schedule_lr(&j, 100, 100), 0.0, 1e-15);
}

static void test_linear_and_constant_and_floor(void **state) {
    (void)state;
    job_config lin = job_with(JOB_SCHEDULE_LINEAR, 1e-3, 0, 0);
    assert_float_equal(schedule_lr(&lin, 25, 100), 0.75e-3, 1e-15);
    job_config cst = job_with(JOB_SCHEDULE_CONSTANT, 1e-3, 0, 4);
    assert_float_equal(schedule_lr(&cst, 2, 100), 0.5e-3, 1e-15);
    assert_float_equal(schedule_lr(&cst, 90, 100), 1e-3, 1e-15);
    job_config floor = job_with(JOB_SCHEDULE_COSINE, 1e-3, 1e-4, 0);
    assert_float_equal(schedule_lr(&floor, 100, 100), 1e-4, 1e-15);
    assert_float_equal(schedule_lr(&floor, 50, 100), 1e-4 + 0.9e-3 * 0.5, 1e-15);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_warmup_is_linear_from_zero),
        cmocka_unit_test(test_cosine_matches_hf),
        cmocka_unit_test(test_linear_and_constant_and_floor),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
