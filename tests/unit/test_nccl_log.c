/* proto/nccl_log: the transport NCCL chose, from its INFO lines. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "proto/nccl_log.h"

static const char *transport(const char *text) {
    static char out[64];
    nccl_log_transport(text, strlen(text), out, sizeof out);
    return out;
}

static void test_using_network(void **state) {
    (void)state;
    assert_string_equal(transport("n0:11:11 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>\n"
                                  "n0:11:11 [0] NCCL INFO NET/IB : No device found.\n"
                                  "n0:11:11 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>\n"
                                  "n0:11:11 [0] NCCL INFO Using network Socket\n"),
                        "Socket");
    assert_string_equal(transport("x NCCL INFO NET/Plugin: Loaded net plugin Libfabric (v8)\n"
                                  "x NCCL INFO NET/OFI Selected Provider is efa (found 32 nics)\n"
                                  "x NCCL INFO Using network AWS Libfabric\r\n"),
                        "AWS Libfabric");
    assert_true(nccl_transport_is_socket(transport("a\nNCCL INFO Using network Socket")));
    assert_false(nccl_transport_is_socket(transport("NCCL INFO Using network IB\n")));
}

static void test_net_tags_alone(void **state) {
    (void)state;
    assert_string_equal(transport("x NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB\n"), "IB");
    assert_string_equal(transport("x NCCL INFO NET/Plugin: no plugin\nx NCCL INFO NET/OFI Selected Provider is efa\n"),
                        "OFI");
    char out[8];
    assert_int_equal(nccl_log_transport("nothing here", 12, out, sizeof out), 0);
    assert_string_equal(out, "");
    assert_int_equal(nccl_log_transport("Using network ", 14, out, sizeof out), 0); /* cut short */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_using_network),
        cmocka_unit_test(test_net_tags_alone),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
