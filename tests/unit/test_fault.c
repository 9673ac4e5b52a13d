/* Unit tests for base/fault: the FSDP_FAULTS syntax, lookups by point and rank, refusals. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/fault.h"

static void must(const char *spec) {
    errbuf err = {""};
    if (fault_configure(spec, &err)) fail_msg("%s: %s", spec, err.msg);
}

static void refused(const char *spec, const char *want) {
    errbuf err = {""};
    must("nan_loss=0:1"); /* a refused spec leaves no table behind */
    if (fault_configure(spec, &err) == 0) fail_msg("%s was accepted", spec);
    if (!strstr(err.msg, want)) fail_msg("%s: \"%s\" lacks \"%s\"", spec, err.msg, want);
    assert_null(fault_get(FAULT_NAN_LOSS, 0));
}

static void test_lookups(void **state) {
    (void)state;
    must("worker=0:exit:2;worker=1:hang_on_stop;worker=3:hang:4;final_params=/tmp/a:b;comm_stall=1:2:0.5;nccl_hang=3;"
         "step_delay=2:0.25");
    const fault *f = fault_get(FAULT_WORKER, 0);
    assert_non_null(f);
    assert_string_equal(f->action, "exit");
    assert_int_equal(f->n, 2);
    f = fault_get(FAULT_WORKER, 1);
    assert_string_equal(f->action, "hang_on_stop");
    assert_int_equal(f->n, 0);
    assert_null(fault_get(FAULT_WORKER, 2));
    assert_string_equal(fault_get(FAULT_WORKER, 3)->action, "hang");
    assert_int_equal(fault_get(FAULT_WORKER, 3)->n, 4);
    assert_string_equal(fault_get(FAULT_FINAL_PARAMS, 5)->path, "/tmp/a:b"); /* no rank: any */
    assert_true(fault_get(FAULT_COMM_STALL, 1)->seconds == 0.5);
    assert_int_equal(fault_get(FAULT_COMM_STALL, 1)->n, 2);
    assert_int_equal(fault_get(FAULT_NCCL_HANG, 0)->n, 3);
    assert_true(fault_get(FAULT_STEP_DELAY, 2)->seconds == 0.25);
    assert_null(fault_get(FAULT_STEP_DELAY, 1));
    assert_null(fault_get(FAULT_NAN_LOSS, 0));
    must("");
    assert_null(fault_get(FAULT_WORKER, 0));
    must(NULL);
    setenv("FSDP_FAULTS", "nan_grad=1:3", 1);
    errbuf err;
    assert_int_equal(fault_init(&err), 0);
    assert_int_equal(fault_get(FAULT_NAN_GRAD, 1)->n, 3);
    unsetenv("FSDP_FAULTS");
    assert_int_equal(fault_init(&err), 0);
    assert_null(fault_get(FAULT_NAN_GRAD, 1));
}

static void test_refusals(void **state) {
    (void)state;
    refused("nan_lost=1:2", "FSDP_FAULTS: 'nan_lost' is not a fault point");
    refused("nan_loss", "'nan_loss' is not NAME=VALUE");
    refused("nan_loss=1", "nan_loss: too few fields (expected RN)");
    refused("nan_loss=1:2:3", "nan_loss: too many fields");
    refused("nan_loss=x:2", "nan_loss: 'x' is not a rank");
    refused("nan_loss=1:0", "nan_loss: '0' is not a positive integer");
    refused("worker=1:explode", "worker: 'explode' is not one of: exit hang hang_on_stop");
    refused("worker=1:hang_on", "is not one of");
    refused("comm_stall=1:2:-1", "comm_stall: '-1' is not a number of seconds");
    refused("final_params=", "final_params: a path is needed");
    refused("nan_loss=0:1;bogus=1", "'bogus' is not a fault point");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lookups),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
