/* Unit tests for base/sha256: FIPS 180-4 example vectors for SHA-256, RFC 4231 test cases
 * 1-4, 6 and 7 for HMAC-SHA256 (case 5 tests truncated output, which we do not offer), and
 * hashing in pieces across block boundaries. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/sha256.h"

static void to_hex(const unsigned char *d, char *hex) {
    for (int i = 0; i < SHA256_BYTES; i++) sprintf(hex + 2 * i, "%02x", d[i]);
}

static void expect_digest(const unsigned char *d, const char *want) {
    char hex[2 * SHA256_BYTES + 1];
    to_hex(d, hex);
    assert_string_equal(hex, want);
}

static void expect_sha256(const void *data, size_t len, const char *want) {
    unsigned char d[SHA256_BYTES];
    sha256(data, len, d);
    expect_digest(d, want);
}

static void test_fips_vectors(void **state) {
    (void)state;
    expect_sha256("", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    expect_sha256("abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const char *m448 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    expect_sha256(m448, strlen(m448),
                  "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

/* One million 'a', fed in uneven pieces so that pieces straddle the 64-byte blocks. */
static void test_million_a(void **state) {
    (void)state;
    const char *want = "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0";
    char *a = malloc(1000000);
    assert_non_null(a);
    memset(a, 'a', 1000000);
    expect_sha256(a, 1000000, want);
    sha256_ctx c;
    sha256_init(&c);
    size_t done = 0, piece = 1;
    while (done < 1000000) {
        size_t n = piece < 1000000 - done ? piece : 1000000 - done;
        sha256_update(&c, a + done, n);
        done += n;
        piece = piece * 3 % 997 + 1;
    }
    unsigned char d[SHA256_BYTES];
    sha256_final(&c, d);
    expect_digest(d, want);
    free(a);
}

/* Messages of every length around the padding boundaries (55, 56, 63, 64 bytes) hash the
 * same in one call and byte by byte. */
static void test_pieces_match_whole(void **state) {
    (void)state;
    unsigned char msg[200];
    for (int i = 0; i < 200; i++) msg[i] = (unsigned char)(i * 37 + 11);
    for (size_t len = 0; len <= 200; len++) {
        unsigned char whole[SHA256_BYTES], bytes[SHA256_BYTES];
        sha256(msg, len, whole);
        sha256_ctx c;
        sha256_init(&c);
        for (size_t i = 0; i < len; i++) sha256_update(&c, msg + i, 1);
        sha256_final(&c, bytes);
        assert_memory_equal(whole, bytes, SHA256_BYTES);
    }
}

static void expect_hmac(const void *key, size_t key_len, const void *data, size_t len,
                        const char *want) {
    unsigned char d[SHA256_BYTES];
    hmac_sha256(key, key_len, data, len, d);
    expect_digest(d, want);
}

static void test_rfc4231(void **state) {
    (void)state;
    unsigned char key[131], data[50];
    memset(key, 0x0b, 20); /* case 1 */
    expect_hmac(key, 20, "Hi There", 8,
                "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
    const char *q = "what do ya want for nothing?"; /* case 2: a key shorter than the output */
    expect_hmac("Jefe", 4, q, strlen(q),
                "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    memset(key, 0xaa, 20); /* case 3 */
    memset(data, 0xdd, 50);
    expect_hmac(key, 20, data, 50,
                "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
    for (int i = 0; i < 25; i++) key[i] = (unsigned char)(i + 1); /* case 4 */
    memset(data, 0xcd, 50);
    expect_hmac(key, 25, data, 50,
                "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
    memset(key, 0xaa, 131); /* cases 6 and 7: a key longer than a block is hashed first */
    const char *m6 = "Test Using Larger Than Block-Size Key - Hash Key First";
    expect_hmac(key, 131, m6, strlen(m6),
                "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
    const char *m7 = "This is a test using a larger than block-size key and a larger than "
                     "block-size data. The key needs to be hashed before being used by the "
                     "HMAC algorithm.";
    expect_hmac(key, 131, m7, strlen(m7),
                "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
}

/* The HMAC of a message given in pieces equals the one-call HMAC. */
static void test_hmac_pieces(void **state) {
    (void)state;
    const char *m = "This is a test using a larger than block-size key and a larger than "
                    "block-size data.";
    unsigned char whole[SHA256_BYTES], pieces[SHA256_BYTES];
    hmac_sha256("key", 3, m, strlen(m), whole);
    hmac_sha256_ctx c;
    hmac_sha256_init(&c, "key", 3);
    hmac_sha256_update(&c, m, 10);
    hmac_sha256_update(&c, m + 10, strlen(m) - 10);
    hmac_sha256_final(&c, pieces);
    assert_memory_equal(whole, pieces, SHA256_BYTES);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fips_vectors),     cmocka_unit_test(test_million_a),
        cmocka_unit_test(test_pieces_match_whole), cmocka_unit_test(test_rfc4231),
        cmocka_unit_test(test_hmac_pieces),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
