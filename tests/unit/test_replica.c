/* Unit tests for proto/replica (the image stream's header and trailer, strict) and
 * daemon/replica (a node's images copied to a spare's sink over loopback: the step held,
 * adopted as a spare's own; a sender without the secret, and a stream of another shape,
 * left out). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/clock.h"
#include "daemon/replica.h"
#include "proto/ckpt.h"
#include "proto/replica.h"

static void refused(void (*poke)(uint8_t *), const char *want) {
    replica_header h = {.node = 1, .nodes = 3, .place = 0, .places = 2, .step = 7, .bytes = 4096};
    uint8_t raw[REPLICA_HEADER];
    errbuf err = {""};
    replica_encode(&h, raw);
    poke(raw);
    if (replica_decode(&h, raw, &err) == 0) fail_msg("accepted; wanted '%s'", want);
    if (!strstr(err.msg, want)) fail_msg("'%s' does not say '%s'", err.msg, want);
}
static void bad_magic(uint8_t *r) { r[0] = 'X'; }
static void bad_version(uint8_t *r) { r[8] = 2; }
static void bad_node(uint8_t *r) { r[12] = 3; }
static void bad_place(uint8_t *r) { r[20] = 2; }
static void no_bytes(uint8_t *r) { memset(r + 40, 0, 8); }
static void reserved(uint8_t *r) { r[50] = 1; }
static void negative_step(uint8_t *r) { r[39] = 0x80; }

static void test_header(void **state) {
    (void)state;
    replica_header h = {.node = 2, .nodes = 3, .place = 1, .places = 2, .step = 9, .bytes = 1ull << 33}, back;
    uint8_t raw[REPLICA_HEADER];
    errbuf err = {""};
    replica_encode(&h, raw);
    assert_int_equal(replica_decode(&back, raw, &err), 0);
    assert_memory_equal(&h, &back, sizeof h);
    refused(bad_magic, "bad magic");
    refused(bad_version, "version 2");
    refused(bad_node, "node 3 of 3");
    refused(bad_place, "place 2 of 2");
    refused(no_bytes, "0 bytes");
    refused(reserved, "reserved byte 50");
    refused(negative_step, "step -");
    assert_int_equal(replica_trailer((const uint8_t *)REPLICA_DONE, &err), 1);
    assert_int_equal(replica_trailer((const uint8_t *)REPLICA_TORN, &err), 0);
    assert_int_equal(replica_trailer((const uint8_t *)"FSDPNONE", &err), -1);
}

/* A sealed shard image of `step` in a new memory file: a one-unit layout's file 0 of 1. */
static int sealed_image(int64_t step) {
    ckpt_layout lo;
    errbuf err = {""};
    assert_int_equal(ckpt_layout_alloc(&lo, 1, 1, 1, &err), 0);
    lo.units[0] = (ckpt_unit){.numel = 1000, .padded = 1000, .shard = 1000, .first = 0, .count = 1};
    lo.tensors[0] = (ckpt_tensor){.name = "w", .numel = 1000, .ndim = 1, .shape = {1000}};
    ckpt_file_header h;
    assert_int_equal(ckpt_plan(&h, &lo, 0, step, &err), 0);
    uint8_t *image = calloc(1, h.file_bytes);
    assert_non_null(image);
    for (uint64_t i = 0; i < h.sections[0].bytes; i++) image[h.sections[0].offset + i] = (uint8_t)(i * 13 + (uint64_t)step);
    ckpt_seal_image(image, &h);
    int fd = memfd_create("test-image", MFD_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, image, h.file_bytes, 0), (ssize_t)h.file_bytes);
    free(image);
    ckpt_file_header_free(&h);
    ckpt_layout_free(&lo);
    return fd;
}

/* Waits up to 10 s for the sink to hold `step` of (node, place). */
static int held(replica_sink *s, int node, int place, int64_t step) {
    for (double end = clock_now_s() + 10; clock_now_s() < end; clock_sleep_s(0.01))
        if (replica_sink_step(s, node, place) == step) return 1;
    return 0;
}

static void test_copies(void **state) {
    (void)state;
    errbuf err = {""};
    replica_sink *sink;
    unsigned char secret[MSG_SECRET_BYTES], other[MSG_SECRET_BYTES];
    memset(secret, 7, sizeof secret);
    memset(other, 8, sizeof other);
    assert_int_equal(replica_sink_open(&sink, 1, &err), 0);
    replica_sink_secret(sink, secret, sizeof secret);
    char addr[MSG_ADDR_MAX];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", replica_sink_port(sink));
    msg_peers targets = {.n = 1, .addrs = &addr};
    /* node 1 of 2, one place: its images hold steps 5 and 4 */
    int fds[2] = {sealed_image(5), sealed_image(4)};
    memory_images im = {.workers = 1, .fd = fds};
    replica_source *wrong, *src;
    assert_int_equal(replica_source_start(&wrong, &im, 1, 2, 1, &targets, other, sizeof other, &err), 0);
    replica_source_push(wrong, 5);
    clock_sleep_s(0.3);
    replica_source_stop(wrong);
    assert_int_equal(replica_sink_step(sink, 1, 0), -1); /* no secret, no copy */
    assert_int_equal(replica_source_start(&src, &im, 1, 2, 1, &targets, secret, sizeof secret, &err), 0);
    replica_source_push(src, 4);
    assert_true(held(sink, 1, 0, 4));
    replica_source_push(src, 5);
    assert_true(held(sink, 1, 0, 5));
    replica_source_push(src, 6); /* no image holds 6: nothing sent, 5 kept */
    clock_sleep_s(0.2);
    assert_int_equal(replica_sink_step(sink, 1, 0), 5);
    replica_source_stop(src);
    /* the spare takes node 1's place: the copies become its images */
    int mine[2] = {memfd_create("a", MFD_CLOEXEC), memfd_create("b", MFD_CLOEXEC)};
    memory_images spare = {.workers = 1, .fd = mine};
    assert_int_equal(replica_sink_adopt(sink, 0, &spare, &err), -1); /* node 0 sent nothing */
    assert_true(spare.fd[0] == mine[0] && spare.fd[1] == mine[1]);
    ckpt_file_header h;
    int found = 0;
    assert_int_equal(replica_sink_adopt(sink, 1, &spare, &err), 0);
    for (int j = 0; j < 2; j++)
        if (ckpt_read_header(&h, spare.fd[j], "copy", &err) == 0) {
            found |= h.step == 5 ? 1 : h.step == 4 ? 2 : 0;
            ckpt_file_header_free(&h);
        }
    assert_int_equal(found, 3);
    replica_sink_close(sink);
    for (int j = 0; j < 2; j++) close(fds[j]), close(spare.fd[j]);
}

/* A spare that accepts and never answers: the handshake waits, and a stop ends it at once. */
static void test_stop_mid_handshake(void **state) {
    (void)state;
    errbuf err = {""};
    int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    assert_true(l >= 0);
    assert_int_equal(bind(l, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(l, 4), 0);
    assert_int_equal(getsockname(l, (struct sockaddr *)&a, &len), 0);
    char addr[MSG_ADDR_MAX];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", ntohs(a.sin_port));
    msg_peers targets = {.n = 1, .addrs = &addr};
    int fds[2] = {sealed_image(3), sealed_image(2)};
    memory_images im = {.workers = 1, .fd = fds};
    unsigned char secret[MSG_SECRET_BYTES] = {1};
    replica_source *src;
    assert_int_equal(replica_source_start(&src, &im, 0, 1, 1, &targets, secret, sizeof secret, &err), 0);
    replica_source_push(src, 3);
    clock_sleep_s(0.3); /* in the handshake by now (REPLICA_HANDSHAKE_S: 5 s) */
    double t0 = clock_now_s();
    replica_source_stop(src);
    assert_true(clock_now_s() - t0 < 2.0);
    close(l);
    close(fds[0]), close(fds[1]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_header),
        cmocka_unit_test(test_copies),
        cmocka_unit_test(test_stop_mid_handshake),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
