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

#include "proto/job_flags.h"
#include "worker/schedule.h"

/* The job of a command line (argv split at spaces). */
static job_config job_of(const char *line) {
    static char buf[512], *argv[32];
    static job_args a;
    job_config j;
    errbuf err = {""};
    int argc = 0;
    snprintf(buf, sizeof buf, "fsdpd %s", line);
    for (char *w = strtok(buf, " "); w && argc < 32; w = strtok(NULL, " ")) argv[argc++] = w;
    if (job_args_parse(argc, argv, &a, &err) || job_args_load(&j, &a, NULL, &err)) fail_msg("%s: %s", line, err.msg);
    return j;
}

/* transformers' lambdas (optimization.py), lr(s) = lr x lambda(s), over T steps, warm-up w. */
static double hf_linear(long s, long w, long T) {
    if (s < w) return (double)s / (double)(w > 1 ? w : 1);
    double x = (double)(T - s) / (double)(T - w > 1 ? T - w : 1);
    return x > 0 ? x : 0;
}
static double hf_cosine(long s, long w, long T) {
    if (s < w) return (double)s / (double)(w > 1 ? w : 1);
    double p = (double)(s - w) / (double)(T - w > 1 ? T - w : 1);
    double x = 0.5 * (1.0 + cos(M_PI * 0.5 * 2.0 * p));
    return x > 0 ? x : 0;
}
static double hf_constant_with_warmup(long s, long w) { return s < w ? (double)s / (double)(w > 1 ? w : 1) : 1.0; }
/* fsdp_qlora's _get_cosine_one_cycle_lr_lambda, min_lr_fraction 0.1 */
static double qlora_cosine(long s, long w, long T) {
    if (s < w) return (double)s / (double)(w > 1 ? w : 1);
    double p = (double)(s - w) / (double)(T - w > 1 ? T - w : 1);
    return (cos(M_PI * p) + 1) * 0.5 * 0.9 + 0.1;
}

/* Each scheduler flag of the Trainer and of fsdp_qlora, over a run whose warm-up fraction is
 * not whole (53 steps: the Trainer's ceil(1.59) = 2 with ratio 0.03, fsdp_qlora's int(5.3) = 5). */
static void test_flags_match_their_tools(void **state) {
    (void)state;
    const long T = 53;
    job_config lin = job_of("--learning_rate 1e-3 --lr_scheduler_type linear --warmup_ratio 0.03");
    job_config cos_ = job_of("--learning_rate 1e-3 --lr_scheduler_type cosine --warmup_ratio 0.03");
    job_config cst = job_of("--learning_rate 1e-3 --lr_scheduler_type constant");
    job_config cww = job_of("--learning_rate 1e-3 --lr_scheduler_type constant_with_warmup --warmup_steps 4");
    job_config qcos = job_of("--lr 1e-3 --lr_scheduler cosine");
    job_config qlin = job_of("--lr 1e-3 --lr_scheduler linear");
    job_config qcst = job_of("--lr 1e-3 --lr_scheduler constant");
    assert_int_equal(job_warmup_steps(&lin, T), 2);
    assert_int_equal(job_warmup_steps(&qcos, T), 5);
    for (long s = 0; s <= T; s++) {
        assert_float_equal(schedule_lr(&lin, s, T), 1e-3 * hf_linear(s, 2, T), 1e-15);
        assert_float_equal(schedule_lr(&cos_, s, T), 1e-3 * hf_cosine(s, 2, T), 1e-15);
        assert_float_equal(schedule_lr(&cst, s, T), 1e-3, 1e-15); /* no warm-up: lr from step 0 */
        assert_float_equal(schedule_lr(&cww, s, T), 1e-3 * hf_constant_with_warmup(s, 4), 1e-15);
        assert_float_equal(schedule_lr(&qcos, s, T), 1e-3 * qlora_cosine(s, 5, T), 1e-15);
        assert_float_equal(schedule_lr(&qlin, s, T), 1e-3 * hf_linear(s, 5, T), 1e-15);
        assert_float_equal(schedule_lr(&qcst, s, T), 1e-3, 1e-15);
    }
}

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
        cmocka_unit_test(test_flags_match_their_tools),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
