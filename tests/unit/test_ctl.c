/* Unit tests for proto/ctl: framing, the incremental decoder on whole, split and broken
 * streams, and the blocking helpers over a socketpair. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "proto/ctl.h"

static void assert_contains(const char *msg, const char *part) {
    if (!strstr(msg, part)) fail_msg("message \"%s\" lacks \"%s\"", msg, part);
}

/* Encodes one frame into buf; returns its length. */
static size_t frame(uint8_t *buf, size_t cap, int type, const void *body, size_t len) {
    size_t n = 0;
    errbuf err = {""};
    if (ctl_encode(type, body, len, buf, cap, &n, &err)) fail_msg("%s", err.msg);
    return n;
}

/* A frame header with arbitrary fields, for malformed streams. */
static void raw_header(uint8_t *h, const char *magic, uint16_t version, uint16_t type,
                       uint32_t len) {
    memcpy(h, magic, 4);
    h[4] = (uint8_t)version, h[5] = (uint8_t)(version >> 8);
    h[6] = (uint8_t)type, h[7] = (uint8_t)(type >> 8);
    for (int i = 0; i < 4; i++) h[8 + i] = (uint8_t)(len >> (8 * i));
}

static void test_header_layout(void **state) {
    (void)state;
    uint8_t h[CTL_HEADER_SIZE];
    errbuf err = {""};
    assert_int_equal(ctl_encode_header(h, CTL_CKPT_DONE, 0x000a0b0c, &err), 0);
    static const uint8_t want[CTL_HEADER_SIZE] = {'F', 'S', 'D', 'P', 1, 0, 8, 0,
                                                  0x0c, 0x0b, 0x0a, 0};
    assert_memory_equal(h, want, sizeof want);

    assert_int_equal(ctl_encode_header(h, CTL_HELLO, (size_t)CTL_MAX_BODY + 1, &err), -1);
    assert_contains(err.msg, "HELLO: body of 16777217 bytes exceeds the 16777216-byte limit");
    assert_int_equal(ctl_encode_header(h, 0, 0, &err), -1);
    assert_contains(err.msg, "message type 0: unknown");
    assert_int_equal(ctl_encode_header(h, CTL_TYPE_END, 0, &err), -1);

    uint8_t small[16];
    size_t n;
    assert_int_equal(ctl_encode(CTL_STOP, "{\"reason\":1}", 12, small, sizeof small, &n, &err), -1);
    assert_contains(err.msg, "STOP: frame of 24 bytes does not fit a 16-byte buffer");
}

static void test_type_names(void **state) {
    (void)state;
    assert_string_equal(ctl_type_name(CTL_HELLO), "HELLO");
    assert_string_equal(ctl_type_name(CTL_NCCL_ID), "NCCL_ID");
    assert_string_equal(ctl_type_name(CTL_CKPT_ABORT), "CKPT_ABORT");
    assert_string_equal(ctl_type_name(CTL_PEERS), "PEERS");
    assert_string_equal(ctl_type_name(0), "UNKNOWN");
    assert_string_equal(ctl_type_name(CTL_TYPE_END), "UNKNOWN");
    for (int t = 1; t < CTL_TYPE_END; t++) assert_string_not_equal(ctl_type_name(t), "UNKNOWN");
}

static void test_round_trip_every_type(void **state) {
    (void)state;
    ctl_decoder d;
    ctl_decoder_init(&d);
    errbuf err = {""};
    for (int t = 1; t < CTL_TYPE_END; t++) {
        char body[64];
        int len = snprintf(body, sizeof body, "{\"type\":\"%s\",\"n\":%d}", ctl_type_name(t), t);
        uint8_t buf[128];
        size_t n = frame(buf, sizeof buf, t, body, (size_t)len);
        assert_int_equal(n, CTL_HEADER_SIZE + (size_t)len);
        assert_int_equal(ctl_decoder_feed(&d, buf, n, &err), 0);
        ctl_msg m;
        assert_int_equal(ctl_decoder_next(&d, &m, &err), 1);
        assert_int_equal(m.type, t);
        assert_int_equal(m.len, len);
        assert_string_equal(m.body, body);
        json_t *j;
        if (ctl_msg_json(&m, &j, &err)) fail_msg("%s", err.msg);
        assert_int_equal(json_integer_value(json_object_get(j, "n")), t);
        json_decref(j);
        ctl_msg_free(&m);
        assert_null(m.body);
        assert_int_equal(ctl_decoder_next(&d, &m, &err), 0);
        assert_int_equal(ctl_decoder_buffered(&d), 0);
    }
    ctl_decoder_free(&d);
}

/* Three frames (an empty body, raw bytes with NULs, JSON) fed one byte at a time. */
static void test_one_byte_at_a_time(void **state) {
    (void)state;
    static const uint8_t nccl_id[8] = {0, 1, 2, 0, 0xff, 'F', 'S', 0};
    uint8_t stream[256];
    size_t n = frame(stream, sizeof stream, CTL_HEARTBEAT, NULL, 0);
    n += frame(stream + n, sizeof stream - n, CTL_NCCL_ID, nccl_id, sizeof nccl_id);
    n += frame(stream + n, sizeof stream - n, CTL_STOP, "{\"reason\":\"done\"}", 17);

    ctl_decoder d;
    ctl_decoder_init(&d);
    errbuf err = {""};
    ctl_msg got[3];
    int count = 0;
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(ctl_decoder_feed(&d, stream + i, 1, &err), 0);
        int r = ctl_decoder_next(&d, &got[count], &err);
        assert_true(r == 0 || r == 1);
        if (r == 1) {
            assert_true(count < 3);
            count++;
            ctl_msg none;
            assert_int_equal(ctl_decoder_next(&d, &none, &err), 0);
        }
    }
    assert_int_equal(count, 3);
    assert_int_equal(got[0].type, CTL_HEARTBEAT);
    assert_int_equal(got[0].len, 0);
    assert_string_equal(got[0].body, "");
    assert_int_equal(got[1].type, CTL_NCCL_ID);
    assert_int_equal(got[1].len, sizeof nccl_id);
    assert_memory_equal(got[1].body, nccl_id, sizeof nccl_id);
    assert_int_equal(got[2].type, CTL_STOP);
    assert_string_equal(got[2].body, "{\"reason\":\"done\"}");
    for (int i = 0; i < 3; i++) ctl_msg_free(&got[i]);
    ctl_decoder_free(&d);
}

static void test_two_messages_in_one_feed(void **state) {
    (void)state;
    uint8_t stream[128];
    size_t n = frame(stream, sizeof stream, CTL_CKPT_BEGIN, "{\"step\":400}", 12);
    n += frame(stream + n, sizeof stream - n, CTL_CKPT_ABORT, "{}", 2);
    size_t partial = frame(stream + n, sizeof stream - n, CTL_START, "{}", 2);
    n += partial - 1; /* the third is one byte short */

    ctl_decoder d;
    ctl_decoder_init(&d);
    errbuf err = {""};
    ctl_msg m;
    assert_int_equal(ctl_decoder_feed(&d, stream, n, &err), 0);
    assert_int_equal(ctl_decoder_next(&d, &m, &err), 1);
    assert_int_equal(m.type, CTL_CKPT_BEGIN);
    assert_string_equal(m.body, "{\"step\":400}");
    ctl_msg_free(&m);
    assert_int_equal(ctl_decoder_next(&d, &m, &err), 1);
    assert_int_equal(m.type, CTL_CKPT_ABORT);
    ctl_msg_free(&m);
    assert_int_equal(ctl_decoder_next(&d, &m, &err), 0);
    assert_int_equal(ctl_decoder_buffered(&d), partial - 1);
    assert_int_equal(ctl_decoder_feed(&d, "}", 1, &err), 0);
    assert_int_equal(ctl_decoder_next(&d, &m, &err), 1);
    assert_int_equal(m.type, CTL_START);
    ctl_msg_free(&m);
    ctl_decoder_free(&d);
}

static void test_truncated_frames_need_more(void **state) {
    (void)state;
    uint8_t buf[64];
    size_t n = frame(buf, sizeof buf, CTL_METRICS, "{\"loss\":2.5}", 12);
    ctl_decoder d;
    ctl_decoder_init(&d);
    errbuf err = {""};
    ctl_msg m;
    assert_int_equal(ctl_decoder_next(&d, &m, &err), 0); /* nothing at all */
    assert_int_equal(ctl_decoder_feed(&d, buf, 5, &err), 0);
    assert_int_equal(ctl_decoder_next(&d, &m, &err), 0); /* part of a header */
    assert_int_equal(ctl_decoder_feed(&d, buf + 5, CTL_HEADER_SIZE - 5, &err), 0);
    assert_int_equal(ctl_decoder_next(&d, &m, &err), 0); /* a header, no body */
    assert_int_equal(ctl_decoder_feed(&d, buf + CTL_HEADER_SIZE, n - CTL_HEADER_SIZE - 1, &err), 0);
    assert_int_equal(ctl_decoder_next(&d, &m, &err), 0); /* one byte short */
    assert_int_equal(ctl_decoder_buffered(&d), n - 1);
    assert_int_equal(ctl_decoder_feed(&d, buf + n - 1, 1, &err), 0);
    assert_int_equal(ctl_decoder_next(&d, &m, &err), 1);
    assert_int_equal(m.type, CTL_METRICS);
    ctl_msg_free(&m);
    ctl_decoder_free(&d);
}

/* Feeds bytes to a fresh decoder and expects the stream to be rejected with `part`. */
static void expect_broken(const void *bytes, size_t len, const char *part) {
    ctl_decoder d;
    ctl_decoder_init(&d);
    errbuf err = {""};
    ctl_msg m;
    assert_int_equal(ctl_decoder_feed(&d, bytes, len, &err), 0);
    assert_int_equal(ctl_decoder_next(&d, &m, &err), -1);
    assert_contains(err.msg, part);
    /* A broken stream stays broken, with the same reason, whatever comes next. */
    uint8_t good[32];
    size_t n = frame(good, sizeof good, CTL_HEARTBEAT, "{}", 2);
    assert_int_equal(ctl_decoder_feed(&d, good, n, &err), 0);
    errbuf again = {""};
    assert_int_equal(ctl_decoder_next(&d, &m, &again), -1);
    assert_string_equal(again.msg, err.msg);
    ctl_decoder_free(&d);
}

static void test_malformed_streams(void **state) {
    (void)state;
    uint8_t h[CTL_HEADER_SIZE];
    raw_header(h, "FSDP", CTL_VERSION, CTL_CONFIG, CTL_MAX_BODY + 1);
    expect_broken(h, sizeof h, "CONFIG: body of 16777217 bytes exceeds the 16777216-byte limit");
    raw_header(h, "FSDP", CTL_VERSION, CTL_CONFIG, 0xffffffffu);
    expect_broken(h, sizeof h, "exceeds");
    raw_header(h, "XSDP", CTL_VERSION, CTL_HELLO, 2);
    expect_broken(h, sizeof h, "bad magic: 58 53 44 50");
    raw_header(h, "FSDP", 2, CTL_HELLO, 2);
    expect_broken(h, sizeof h, "protocol version 2 (this build speaks version 1)");
    raw_header(h, "FSDP", CTL_VERSION, 0, 2);
    expect_broken(h, sizeof h, "unknown message type 0");
    raw_header(h, "FSDP", CTL_VERSION, 99, 2);
    expect_broken(h, sizeof h, "unknown message type 99");
    /* Garbage is caught from its first bytes, before a whole header has arrived. */
    expect_broken("GET / HTTP/1.1\r\n", 16, "bad magic: 47 45 54 20");
    expect_broken("{", 1, "bad magic: 7b (expected \"FSDP\"");
    expect_broken("FSX", 3, "bad magic: 46 53 58");
}

static void test_large_message_then_small(void **state) {
    (void)state;
    size_t len = 1u << 20;
    uint8_t *buf = malloc(CTL_HEADER_SIZE + len);
    char *body = malloc(len);
    assert_non_null(buf);
    assert_non_null(body);
    for (size_t i = 0; i < len; i++) body[i] = (char)('a' + i % 26);
    size_t n = frame(buf, CTL_HEADER_SIZE + len, CTL_PEERS, body, len);
    ctl_decoder d;
    ctl_decoder_init(&d);
    errbuf err = {""};
    ctl_msg m;
    for (size_t off = 0; off < n; off += 4000) {
        size_t chunk = n - off < 4000 ? n - off : 4000;
        assert_int_equal(ctl_decoder_feed(&d, buf + off, chunk, &err), 0);
        int r = ctl_decoder_next(&d, &m, &err);
        assert_int_equal(r, off + chunk == n ? 1 : 0);
    }
    assert_int_equal(m.len, len);
    assert_memory_equal(m.body, body, len);
    ctl_msg_free(&m);
    n = frame(buf, 64, CTL_HEARTBEAT, "{}", 2);
    assert_int_equal(ctl_decoder_feed(&d, buf, n, &err), 0);
    assert_int_equal(ctl_decoder_next(&d, &m, &err), 1);
    assert_int_equal(m.type, CTL_HEARTBEAT);
    ctl_msg_free(&m);
    ctl_decoder_free(&d);
    free(buf);
    free(body);
}

static void make_pair(int sv[2]) { assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0); }

static void test_send_recv(void **state) {
    (void)state;
    int sv[2];
    make_pair(sv);
    errbuf err = {""};
    json_t *hello = json_pack("{s:i, s:i}", "rank", 3, "pid", 1234);
    assert_int_equal(ctl_send_json(sv[0], CTL_HELLO, hello, &err), 0);
    json_decref(hello);
    assert_int_equal(ctl_send(sv[0], CTL_HEARTBEAT, NULL, 0, &err), 0);

    ctl_msg m;
    if (ctl_recv(sv[1], &m, 1000, &err)) fail_msg("%s", err.msg);
    assert_int_equal(m.type, CTL_HELLO);
    json_t *j;
    if (ctl_msg_json(&m, &j, &err)) fail_msg("%s", err.msg);
    assert_int_equal(json_integer_value(json_object_get(j, "rank")), 3);
    json_decref(j);
    ctl_msg_free(&m);
    if (ctl_recv(sv[1], &m, -1, &err)) fail_msg("%s", err.msg);
    assert_int_equal(m.type, CTL_HEARTBEAT);
    assert_int_equal(m.len, 0);
    ctl_msg_free(&m);

    assert_int_equal(ctl_send(sv[0], 77, "{}", 2, &err), -1);
    assert_contains(err.msg, "message type 77: unknown");
    close(sv[0]);
    close(sv[1]);
}

/* 4 MiB, far more than the socket buffer: the sender has to loop on partial writes while
 * the reader (another process) drains it. */
static void test_send_recv_large(void **state) {
    (void)state;
    int sv[2];
    make_pair(sv);
    size_t len = 4u << 20;
    char *body = malloc(len);
    assert_non_null(body);
    for (size_t i = 0; i < len; i++) body[i] = (char)(i * 7);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        errbuf err;
        close(sv[1]);
        _exit(ctl_send(sv[0], CTL_CONFIG, body, len, &err) == 0 ? 0 : 1);
    }
    close(sv[0]);
    errbuf err = {""};
    ctl_msg m;
    if (ctl_recv(sv[1], &m, 10000, &err)) fail_msg("%s", err.msg);
    assert_int_equal(m.type, CTL_CONFIG);
    assert_int_equal(m.len, len);
    assert_memory_equal(m.body, body, len);
    ctl_msg_free(&m);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    close(sv[1]);
    free(body);
}

static double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void test_recv_timeout(void **state) {
    (void)state;
    int sv[2];
    make_pair(sv);
    errbuf err = {""};
    ctl_msg m;
    double t0 = seconds();
    assert_int_equal(ctl_recv(sv[1], &m, 50, &err), -1);
    double waited = seconds() - t0;
    assert_contains(err.msg, "no message within 50 ms");
    assert_true(waited >= 0.045 && waited < 2.0);

    uint8_t buf[64];
    size_t n = frame(buf, sizeof buf, CTL_METRICS, "{\"step\":1}", 10);
    assert_int_equal(write(sv[0], buf, 5), 5);
    assert_int_equal(ctl_recv(sv[1], &m, 30, &err), -1);
    assert_contains(err.msg, "timed out after 30 ms inside a message header");

    close(sv[0]); /* a fresh pair: the old stream is mid-frame */
    close(sv[1]);
    make_pair(sv);
    assert_int_equal(write(sv[0], buf, n - 3), (ssize_t)(n - 3));
    assert_int_equal(ctl_recv(sv[1], &m, 30, &err), -1);
    assert_contains(err.msg, "METRICS: timed out after 30 ms with 7 of 10 body bytes");
    close(sv[0]);
    close(sv[1]);
}

static void test_peer_closed(void **state) {
    (void)state;
    int sv[2];
    errbuf err = {""};
    ctl_msg m;
    make_pair(sv);
    close(sv[0]);
    assert_int_equal(ctl_recv(sv[1], &m, 1000, &err), -1);
    assert_string_equal(err.msg, "peer closed");
    assert_int_equal(ctl_recv(sv[1], &m, -1, &err), -1);
    assert_string_equal(err.msg, "peer closed");
    /* No SIGPIPE: sending to a closed peer is an error. */
    assert_int_equal(ctl_send(sv[1], CTL_FATAL, "{}", 2, &err), -1);
    assert_contains(err.msg, "sending FATAL: peer closed");
    close(sv[1]);

    uint8_t buf[64];
    size_t n = frame(buf, sizeof buf, CTL_FATAL, "{\"message\":\"x\"}", 15);
    make_pair(sv);
    assert_int_equal(write(sv[0], buf, 7), 7);
    close(sv[0]);
    assert_int_equal(ctl_recv(sv[1], &m, 1000, &err), -1);
    assert_contains(err.msg, "peer closed inside a message header (7 of 12 bytes)");
    close(sv[1]);

    make_pair(sv);
    assert_int_equal(write(sv[0], buf, n - 5), (ssize_t)(n - 5));
    close(sv[0]);
    assert_int_equal(ctl_recv(sv[1], &m, -1, &err), -1);
    assert_contains(err.msg, "FATAL: peer closed after 10 of 15 body bytes");
    close(sv[1]);
}

static void test_recv_rejects_bad_header(void **state) {
    (void)state;
    int sv[2];
    make_pair(sv);
    uint8_t h[CTL_HEADER_SIZE];
    raw_header(h, "FSDP", CTL_VERSION, CTL_HELLO, CTL_MAX_BODY + 1);
    assert_int_equal(write(sv[0], h, sizeof h), (ssize_t)sizeof h);
    errbuf err = {""};
    ctl_msg m;
    assert_int_equal(ctl_recv(sv[1], &m, 1000, &err), -1);
    assert_contains(err.msg, "HELLO: body of 16777217 bytes exceeds");
    close(sv[0]);
    close(sv[1]);
}

static void test_msg_json(void **state) {
    (void)state;
    errbuf err = {""};
    json_t *j;
    ctl_msg m = {CTL_CKPT_DONE, 3, "[1]"};
    assert_int_equal(ctl_msg_json(&m, &j, &err), -1);
    assert_contains(err.msg, "CKPT_DONE: body is not a JSON object");
    ctl_msg bad = {CTL_HELLO, 5, "{\"a\":"};
    assert_int_equal(ctl_msg_json(&bad, &j, &err), -1);
    assert_contains(err.msg, "HELLO: body is not JSON (line 1, column");
    ctl_msg empty = {CTL_HEARTBEAT, 0, ""};
    assert_int_equal(ctl_msg_json(&empty, &j, &err), -1);
    assert_contains(err.msg, "HEARTBEAT: body is not JSON");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_header_layout),
        cmocka_unit_test(test_type_names),
        cmocka_unit_test(test_round_trip_every_type),
        cmocka_unit_test(test_one_byte_at_a_time),
        cmocka_unit_test(test_two_messages_in_one_feed),
        cmocka_unit_test(test_truncated_frames_need_more),
        cmocka_unit_test(test_malformed_streams),
        cmocka_unit_test(test_large_message_then_small),
        cmocka_unit_test(test_send_recv),
        cmocka_unit_test(test_send_recv_large),
        cmocka_unit_test(test_recv_timeout),
        cmocka_unit_test(test_peer_closed),
        cmocka_unit_test(test_recv_rejects_bad_header),
        cmocka_unit_test(test_msg_json),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
