/* Unit tests for proto/tb_event: each record byte for byte as TensorBoard's own protobuf
 * classes serialize and frame it (the hex below was made with tensorboard 2.21's event_pb2
 * and its masked_crc32c), and TFRecord's masked CRC32C of the check string. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "proto/tb_event.h"

static void assert_hex(const tb_buf *b, const char *hex) {
    char got[512] = "";
    assert_true(b->len * 2 < sizeof got);
    for (size_t i = 0; i < b->len; i++) snprintf(got + 2 * i, 3, "%02x", b->data[i]);
    assert_string_equal(got, hex);
}

static void test_masked_crc(void **state) {
    (void)state;
    assert_int_equal(tb_masked_crc32c("123456789", 9), 0xc78ab0e5u);
}

static void test_records(void **state) {
    (void)state;
    errbuf err;
    tb_buf b = {0};
    assert_int_equal(tb_record_file_version(&b, 1.5, &err), 0);
    assert_hex(&b, "1800000000000000a37f4b2209000000000000f83f1a0d627261696e2e4576656e743a322a28646c");
    tb_buf_free(&b);

    tb_scalar s[] = {{"train/loss", 0.5f}, {"x", -2.0f}};
    assert_int_equal(tb_record_scalars(&b, 2.25, 3, s, 2, &err), 0);
    assert_hex(&b, "2a00000000000000ae8d91f509000000000000024010032a1d0a110a0a747261696e2f6c6f7373150000003f0a080a0178"
                   "15000000c044c8b6c1");
    tb_buf_free(&b);

    assert_int_equal(tb_record_session_start(&b, 2.25, 300, &err), 0);
    assert_hex(&b, "100000000000000095fbfe1809000000000000024010ac023a020801f166178e");
    tb_buf_free(&b);

    assert_int_equal(tb_record_text(&b, 1.0, 1, "job", "hi", 2, &err), 0);
    assert_hex(&b, "2800000000000000ff70164a09000000000000f03f10012a1b0a190a036a6f62420808071200420268694a080a060a047465"
                   "7874fd825acd");
    /* records append: a second one follows the first */
    size_t first = b.len;
    assert_int_equal(tb_record_file_version(&b, 1.5, &err), 0);
    assert_int_equal(b.len, first + 40);
    tb_buf_free(&b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_masked_crc),
        cmocka_unit_test(test_records),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
