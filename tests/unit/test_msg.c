/* Unit tests for proto/msg: framing, the incremental decoder on whole, split and broken
 * streams, the blocking helpers over a socketpair, and the typed bodies: every type's
 * round trip and the strict decoder's refusals. */
#include <errno.h>
#include <math.h>
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

#include "proto/msg.h"

static void assert_contains(const char *msg, const char *part) {
    if (!strstr(msg, part)) fail_msg("message \"%s\" lacks \"%s\"", msg, part);
}

/* Encodes one frame into buf; returns its length. */
static size_t frame(uint8_t *buf, size_t cap, int type, const void *body, size_t len) {
    size_t n = 0;
    uint8_t *f;
    errbuf err = {""};
    if (msg_frame_encode(type, body, len, &f, &n, &err)) fail_msg("%s", err.msg);
    if (n > cap) fail_msg("frame of %zu bytes in a %zu-byte buffer", n, cap);
    memcpy(buf, f, n);
    free(f);
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
    uint8_t h[MSG_HEADER_SIZE];
    errbuf err = {""};
    assert_int_equal(msg_encode_header(h, MSG_CKPT_DONE, 0x000a0b0c, &err), 0);
    static const uint8_t want[MSG_HEADER_SIZE] = {'F', 'S', 'D', 'P', 1, 0, 8, 0,
                                                  0x0c, 0x0b, 0x0a, 0};
    assert_memory_equal(h, want, sizeof want);

    assert_int_equal(msg_encode_header(h, MSG_HELLO, (size_t)MSG_MAX_BODY + 1, &err), -1);
    assert_contains(err.msg, "HELLO: body of 16777217 bytes exceeds the 16777216-byte limit");
    assert_int_equal(msg_encode_header(h, 0, 0, &err), -1);
    assert_contains(err.msg, "message type 0: unknown");
    assert_int_equal(msg_encode_header(h, MSG_TYPE_END, 0, &err), -1);
}

static void test_type_names(void **state) {
    (void)state;
    assert_string_equal(msg_type_name(MSG_HELLO), "HELLO");
    assert_string_equal(msg_type_name(MSG_NCCL_ID), "NCCL_ID");
    assert_string_equal(msg_type_name(MSG_CKPT_ABORT), "CKPT_ABORT");
    assert_string_equal(msg_type_name(MSG_PEERS), "PEERS");
    assert_string_equal(msg_type_name(0), "UNKNOWN");
    assert_string_equal(msg_type_name(MSG_TYPE_END), "UNKNOWN");
    for (int t = 1; t < MSG_TYPE_END; t++) assert_string_not_equal(msg_type_name(t), "UNKNOWN");
}

static void test_round_trip_every_type(void **state) {
    (void)state;
    msg_decoder d;
    msg_decoder_init(&d);
    errbuf err = {""};
    for (int t = 1; t < MSG_TYPE_END; t++) {
        char body[64];
        int len = snprintf(body, sizeof body, "{\"type\":\"%s\",\"n\":%d}", msg_type_name(t), t);
        uint8_t buf[128];
        size_t n = frame(buf, sizeof buf, t, body, (size_t)len);
        assert_int_equal(n, MSG_HEADER_SIZE + (size_t)len);
        assert_int_equal(msg_decoder_feed(&d, buf, n, &err), 0);
        msg_frame m;
        assert_int_equal(msg_decoder_next(&d, &m, &err), 1);
        assert_int_equal(m.type, t);
        assert_int_equal(m.len, len);
        assert_string_equal(m.body, body);
        msg_frame_free(&m);
        assert_null(m.body);
        assert_int_equal(msg_decoder_next(&d, &m, &err), 0);
        assert_int_equal(msg_decoder_buffered(&d), 0);
    }
    msg_decoder_free(&d);
}

/* Three frames (an empty body, raw bytes with NULs, JSON) fed one byte at a time. */
static void test_one_byte_at_a_time(void **state) {
    (void)state;
    static const uint8_t nccl_id[8] = {0, 1, 2, 0, 0xff, 'F', 'S', 0};
    uint8_t stream[256];
    size_t n = frame(stream, sizeof stream, MSG_HEARTBEAT, NULL, 0);
    n += frame(stream + n, sizeof stream - n, MSG_NCCL_ID, nccl_id, sizeof nccl_id);
    n += frame(stream + n, sizeof stream - n, MSG_STOP, "{\"reason\":\"done\"}", 17);

    msg_decoder d;
    msg_decoder_init(&d);
    errbuf err = {""};
    msg_frame got[3];
    int count = 0;
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(msg_decoder_feed(&d, stream + i, 1, &err), 0);
        int r = msg_decoder_next(&d, &got[count], &err);
        assert_true(r == 0 || r == 1);
        if (r == 1) {
            assert_true(count < 3);
            count++;
            msg_frame none;
            assert_int_equal(msg_decoder_next(&d, &none, &err), 0);
        }
    }
    assert_int_equal(count, 3);
    assert_int_equal(got[0].type, MSG_HEARTBEAT);
    assert_int_equal(got[0].len, 0);
    assert_string_equal(got[0].body, "");
    assert_int_equal(got[1].type, MSG_NCCL_ID);
    assert_int_equal(got[1].len, sizeof nccl_id);
    assert_memory_equal(got[1].body, nccl_id, sizeof nccl_id);
    assert_int_equal(got[2].type, MSG_STOP);
    assert_string_equal(got[2].body, "{\"reason\":\"done\"}");
    for (int i = 0; i < 3; i++) msg_frame_free(&got[i]);
    msg_decoder_free(&d);
}

static void test_two_messages_in_one_feed(void **state) {
    (void)state;
    uint8_t stream[128];
    size_t n = frame(stream, sizeof stream, MSG_CKPT_BEGIN, "{\"step\":400}", 12);
    n += frame(stream + n, sizeof stream - n, MSG_CKPT_ABORT, "{}", 2);
    size_t partial = frame(stream + n, sizeof stream - n, MSG_START, "{}", 2);
    n += partial - 1; /* the third is one byte short */

    msg_decoder d;
    msg_decoder_init(&d);
    errbuf err = {""};
    msg_frame m;
    assert_int_equal(msg_decoder_feed(&d, stream, n, &err), 0);
    assert_int_equal(msg_decoder_next(&d, &m, &err), 1);
    assert_int_equal(m.type, MSG_CKPT_BEGIN);
    assert_string_equal(m.body, "{\"step\":400}");
    msg_frame_free(&m);
    assert_int_equal(msg_decoder_next(&d, &m, &err), 1);
    assert_int_equal(m.type, MSG_CKPT_ABORT);
    msg_frame_free(&m);
    assert_int_equal(msg_decoder_next(&d, &m, &err), 0);
    assert_int_equal(msg_decoder_buffered(&d), partial - 1);
    assert_int_equal(msg_decoder_feed(&d, "}", 1, &err), 0);
    assert_int_equal(msg_decoder_next(&d, &m, &err), 1);
    assert_int_equal(m.type, MSG_START);
    msg_frame_free(&m);
    msg_decoder_free(&d);
}

static void test_truncated_frames_need_more(void **state) {
    (void)state;
    uint8_t buf[64];
    size_t n = frame(buf, sizeof buf, MSG_METRICS, "{\"loss\":2.5}", 12);
    msg_decoder d;
    msg_decoder_init(&d);
    errbuf err = {""};
    msg_frame m;
    assert_int_equal(msg_decoder_next(&d, &m, &err), 0); /* nothing at all */
    assert_int_equal(msg_decoder_feed(&d, buf, 5, &err), 0);
    assert_int_equal(msg_decoder_next(&d, &m, &err), 0); /* part of a header */
    assert_int_equal(msg_decoder_feed(&d, buf + 5, MSG_HEADER_SIZE - 5, &err), 0);
    assert_int_equal(msg_decoder_next(&d, &m, &err), 0); /* a header, no body */
    assert_int_equal(msg_decoder_feed(&d, buf + MSG_HEADER_SIZE, n - MSG_HEADER_SIZE - 1, &err), 0);
    assert_int_equal(msg_decoder_next(&d, &m, &err), 0); /* one byte short */
    assert_int_equal(msg_decoder_buffered(&d), n - 1);
    assert_int_equal(msg_decoder_feed(&d, buf + n - 1, 1, &err), 0);
    assert_int_equal(msg_decoder_next(&d, &m, &err), 1);
    assert_int_equal(m.type, MSG_METRICS);
    msg_frame_free(&m);
    msg_decoder_free(&d);
}

/* Feeds bytes to a fresh decoder and expects the stream to be rejected with `part`. */
static void expect_broken(const void *bytes, size_t len, const char *part) {
    msg_decoder d;
    msg_decoder_init(&d);
    errbuf err = {""};
    msg_frame m;
    assert_int_equal(msg_decoder_feed(&d, bytes, len, &err), 0);
    assert_int_equal(msg_decoder_next(&d, &m, &err), -1);
    assert_contains(err.msg, part);
    /* A broken stream stays broken, with the same reason, whatever comes next. */
    uint8_t good[32];
    size_t n = frame(good, sizeof good, MSG_HEARTBEAT, "{}", 2);
    assert_int_equal(msg_decoder_feed(&d, good, n, &err), 0);
    errbuf again = {""};
    assert_int_equal(msg_decoder_next(&d, &m, &again), -1);
    assert_string_equal(again.msg, err.msg);
    msg_decoder_free(&d);
}

static void test_malformed_streams(void **state) {
    (void)state;
    uint8_t h[MSG_HEADER_SIZE];
    raw_header(h, "FSDP", MSG_VERSION, MSG_CONFIG, MSG_MAX_BODY + 1);
    expect_broken(h, sizeof h, "CONFIG: body of 16777217 bytes exceeds the 16777216-byte limit");
    raw_header(h, "FSDP", MSG_VERSION, MSG_CONFIG, 0xffffffffu);
    expect_broken(h, sizeof h, "exceeds");
    raw_header(h, "XSDP", MSG_VERSION, MSG_HELLO, 2);
    expect_broken(h, sizeof h, "bad magic: 58 53 44 50");
    raw_header(h, "FSDP", 2, MSG_HELLO, 2);
    expect_broken(h, sizeof h, "protocol version 2 (this build speaks version 1)");
    raw_header(h, "FSDP", MSG_VERSION, 0, 2);
    expect_broken(h, sizeof h, "unknown message type 0");
    raw_header(h, "FSDP", MSG_VERSION, 99, 2);
    expect_broken(h, sizeof h, "unknown message type 99");
    /* Garbage is caught from its first bytes, before a whole header has arrived. */
    expect_broken("GET / HTTP/1.1\r\n", 16, "bad magic: 47 45 54 20");
    expect_broken("{", 1, "bad magic: 7b (expected \"FSDP\"");
    expect_broken("FSX", 3, "bad magic: 46 53 58");
}

static void test_large_message_then_small(void **state) {
    (void)state;
    size_t len = 1u << 20;
    uint8_t *buf = malloc(MSG_HEADER_SIZE + len);
    char *body = malloc(len);
    assert_non_null(buf);
    assert_non_null(body);
    for (size_t i = 0; i < len; i++) body[i] = (char)('a' + i % 26);
    size_t n = frame(buf, MSG_HEADER_SIZE + len, MSG_PEERS, body, len);
    msg_decoder d;
    msg_decoder_init(&d);
    errbuf err = {""};
    msg_frame m;
    for (size_t off = 0; off < n; off += 4000) {
        size_t chunk = n - off < 4000 ? n - off : 4000;
        assert_int_equal(msg_decoder_feed(&d, buf + off, chunk, &err), 0);
        int r = msg_decoder_next(&d, &m, &err);
        assert_int_equal(r, off + chunk == n ? 1 : 0);
    }
    assert_int_equal(m.len, len);
    assert_memory_equal(m.body, body, len);
    msg_frame_free(&m);
    n = frame(buf, 64, MSG_HEARTBEAT, "{}", 2);
    assert_int_equal(msg_decoder_feed(&d, buf, n, &err), 0);
    assert_int_equal(msg_decoder_next(&d, &m, &err), 1);
    assert_int_equal(m.type, MSG_HEARTBEAT);
    msg_frame_free(&m);
    msg_decoder_free(&d);
    free(buf);
    free(body);
}

static void make_pair(int sv[2]) { assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0); }

static void test_send_recv(void **state) {
    (void)state;
    int sv[2];
    make_pair(sv);
    errbuf err = {""};
    msg hello = {.type = MSG_HELLO, .u.hello = {.pid = 1234}};
    assert_int_equal(msg_send(sv[0], &hello, &err), 0);
    assert_int_equal(msg_send_frame(sv[0], MSG_HEARTBEAT, NULL, 0, &err), 0);

    msg_frame m;
    if (msg_recv_frame(sv[1], &m, 1000, &err)) fail_msg("%s", err.msg);
    assert_int_equal(m.type, MSG_HELLO);
    msg got;
    if (msg_decode(&m, &got, &err)) fail_msg("%s", err.msg);
    assert_int_equal(got.u.hello.pid, 1234);
    msg_frame_free(&m);
    if (msg_recv_frame(sv[1], &m, -1, &err)) fail_msg("%s", err.msg);
    assert_int_equal(m.type, MSG_HEARTBEAT);
    assert_int_equal(m.len, 0);
    msg_frame_free(&m);

    assert_int_equal(msg_send_frame(sv[0], 77, "{}", 2, &err), -1);
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
        _exit(msg_send_frame(sv[0], MSG_CONFIG, body, len, &err) == 0 ? 0 : 1);
    }
    close(sv[0]);
    errbuf err = {""};
    msg_frame m;
    if (msg_recv_frame(sv[1], &m, 10000, &err)) fail_msg("%s", err.msg);
    assert_int_equal(m.type, MSG_CONFIG);
    assert_int_equal(m.len, len);
    assert_memory_equal(m.body, body, len);
    msg_frame_free(&m);
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
    msg_frame m;
    double t0 = seconds();
    assert_int_equal(msg_recv_frame(sv[1], &m, 50, &err), -1);
    double waited = seconds() - t0;
    assert_contains(err.msg, "no message within 50 ms");
    assert_true(waited >= 0.045 && waited < 2.0);

    uint8_t buf[64];
    size_t n = frame(buf, sizeof buf, MSG_METRICS, "{\"step\":1}", 10);
    assert_int_equal(write(sv[0], buf, 5), 5);
    assert_int_equal(msg_recv_frame(sv[1], &m, 30, &err), -1);
    assert_contains(err.msg, "timed out after 30 ms inside a message header");

    close(sv[0]); /* a fresh pair: the old stream is mid-frame */
    close(sv[1]);
    make_pair(sv);
    assert_int_equal(write(sv[0], buf, n - 3), (ssize_t)(n - 3));
    assert_int_equal(msg_recv_frame(sv[1], &m, 30, &err), -1);
    assert_contains(err.msg, "METRICS: timed out after 30 ms with 7 of 10 body bytes");
    close(sv[0]);
    close(sv[1]);
}

static void test_peer_closed(void **state) {
    (void)state;
    int sv[2];
    errbuf err = {""};
    msg_frame m;
    make_pair(sv);
    close(sv[0]);
    assert_int_equal(msg_recv_frame(sv[1], &m, 1000, &err), -1);
    assert_string_equal(err.msg, "peer closed");
    assert_int_equal(msg_recv_frame(sv[1], &m, -1, &err), -1);
    assert_string_equal(err.msg, "peer closed");
    /* No SIGPIPE: sending to a closed peer is an error. */
    assert_int_equal(msg_send_frame(sv[1], MSG_FATAL, "{}", 2, &err), -1);
    assert_contains(err.msg, "sending FATAL: peer closed");
    close(sv[1]);

    uint8_t buf[64];
    size_t n = frame(buf, sizeof buf, MSG_FATAL, "{\"message\":\"x\"}", 15);
    make_pair(sv);
    assert_int_equal(write(sv[0], buf, 7), 7);
    close(sv[0]);
    assert_int_equal(msg_recv_frame(sv[1], &m, 1000, &err), -1);
    assert_contains(err.msg, "peer closed inside a message header (7 of 12 bytes)");
    close(sv[1]);

    make_pair(sv);
    assert_int_equal(write(sv[0], buf, n - 5), (ssize_t)(n - 5));
    close(sv[0]);
    assert_int_equal(msg_recv_frame(sv[1], &m, -1, &err), -1);
    assert_contains(err.msg, "FATAL: peer closed after 10 of 15 body bytes");
    close(sv[1]);
}

static void test_recv_rejects_bad_header(void **state) {
    (void)state;
    int sv[2];
    make_pair(sv);
    uint8_t h[MSG_HEADER_SIZE];
    raw_header(h, "FSDP", MSG_VERSION, MSG_HELLO, MSG_MAX_BODY + 1);
    assert_int_equal(write(sv[0], h, sizeof h), (ssize_t)sizeof h);
    errbuf err = {""};
    msg_frame m;
    assert_int_equal(msg_recv_frame(sv[1], &m, 1000, &err), -1);
    assert_contains(err.msg, "HELLO: body of 16777217 bytes exceeds");
    close(sv[0]);
    close(sv[1]);
}

/* ---- typed bodies ---- */

/* m through a whole frame and the decoder, into *out. */
static void through_wire(const msg *m, msg *out) {
    uint8_t *f;
    size_t n;
    errbuf err = {""};
    if (msg_encode(m, &f, &n, &err)) fail_msg("%s", err.msg);
    msg_decoder d;
    msg_decoder_init(&d);
    msg_frame fr;
    assert_int_equal(msg_decoder_feed(&d, f, n, &err), 0);
    assert_int_equal(msg_decoder_next(&d, &fr, &err), 1);
    assert_int_equal(fr.type, m->type);
    if (msg_decode(&fr, out, &err)) fail_msg("%s: %s", msg_type_name(m->type), err.msg);
    msg_frame_free(&fr);
    msg_decoder_free(&d);
    free(f);
}

/* The JSON of a and b are equal. */
static void assert_same_body(const msg *a, const msg *b) {
    errbuf err = {""};
    json_t *ja = msg_to_json(a, &err), *jb = msg_to_json(b, &err);
    if (!ja || !jb) fail_msg("%s", err.msg);
    if (!json_equal(ja, jb)) {
        char *ta = json_dumps(ja, JSON_SORT_KEYS), *tb = json_dumps(jb, JSON_SORT_KEYS);
        fail_msg("%s: %s != %s", msg_type_name(a->type), ta, tb);
    }
    json_decref(ja);
    json_decref(jb);
}

/* A decode of `text` as a `type` body fails with a message containing want. */
static void refused(msg_type type, const char *text, const char *want) {
    msg_frame f = {type, (uint32_t)strlen(text), (char *)text};
    msg m;
    errbuf err = {""};
    if (msg_decode(&f, &m, &err) == 0) fail_msg("%s %s was accepted", msg_type_name(type), text);
    assert_contains(err.msg, want);
}

static void test_body_errors(void **state) {
    (void)state;
    refused(MSG_SAMPLE, "{\"step\":1,\"prompt_index\":0,\"reply_ids\":[],\"stop\":\"stop\"}",
            "SAMPLE: field 'reply_ids': must be a non-empty array of token ids");
    refused(MSG_SAMPLE, "{\"step\":1,\"prompt_index\":0,\"reply_ids\":[1,-2],\"stop\":\"stop\"}",
            "SAMPLE: field 'reply_ids': [1] is not a token id");
    refused(MSG_SAMPLE, "{\"step\":1,\"prompt_index\":0,\"reply_ids\":[1],\"stop\":\"eos\"}",
            "SAMPLE: field 'stop' is \"eos\", not stop, length or positions");
    refused(MSG_SAMPLE, "{\"step\":0,\"prompt_index\":0,\"reply_ids\":[1],\"stop\":\"stop\"}", "SAMPLE: field 'step'");
    refused(MSG_CKPT_DONE, "[1]", "CKPT_DONE: body must be a JSON object, got a list");
    refused(MSG_HELLO, "{\"a\":", "HELLO: body is not JSON (line 1, column");
    refused(MSG_HEARTBEAT, "", "HEARTBEAT: body is not JSON");
    refused(MSG_HELLO, "{\"pid\":1,\"pid\":2}", "HELLO: body is not JSON");
    refused(MSG_NCCL_ID, "abc", "NCCL_ID: 3 bytes, expected 128");
    msg m = {.type = MSG_METRICS, .u.metrics = {.step = 1, .loss = NAN}};
    errbuf err = {""};
    uint8_t *f;
    size_t n;
    assert_int_equal(msg_encode(&m, &f, &n, &err), -1);
    assert_contains(err.msg, "METRICS: field 'loss': cannot encode it");
}

static void test_every_type_round_trips(void **state) {
    (void)state;
    char addrs[2][MSG_ADDR_MAX] = {"127.0.0.1:4000", "127.0.0.1:4001"};
    json_t *units = json_pack("[{s:i}]", "unit", 0);
    json_t *settings = json_pack("{s:{s:f}, s:n}", "train", "lr", 1e-4, "model_config");
    int32_t reply[] = {5, 0, 2};
    json_t *reply_ids = msg_ids_json(reply, 3);
    json_t *rows = json_pack("[{s:i, s:i, s:b, s:I, s:n, s:{s:i, s:i, s:f}}]", "rank", 4, "pid", 99, "running", 1,
                             "host_rss_bytes", (json_int_t)1 << 30, "gpu_bytes", "progress", "work", 12, "step", 5,
                             "still_s", 0.5);
    /* the leader's progress: a METRICS body (msg_to_json of one) */
    msg rank0 = {.type = MSG_METRICS, .u.metrics = {.step = 7, .total_steps = 9, .loss = 2.0, .lr = 1e-4, .tokens = 5,
                                                    .tokens_seen = 35, .seconds = 0.5}};
    errbuf perr;
    json_t *progress = msg_to_json(&rank0, &perr);
    assert_non_null(progress);
    msg all[] = {
        {.type = MSG_HELLO, .u.hello = {.pid = 77}},
        {.type = MSG_START},
        {.type = MSG_HEARTBEAT, .u.heartbeat = {.ready = true}},
        {.type = MSG_HEARTBEAT, .u.heartbeat = {.has_step = true, .step = 5, .has_progress = true, .progress = 12,
                                                .has_mem_bytes = true, .mem_bytes = 1 << 20}},
        {.type = MSG_HEARTBEAT, .u.heartbeat = {.has_coll = true, .coll = {.started = 9, .finished = 8, .op = "all_gather", .unit = -1},
                                                .has_net = true, .net = {"Socket", true, 12.5}}},
        {.type = MSG_METRICS, .u.metrics = {.step = 3, .total_steps = 9, .loss = 2.5, .lr = 1e-4, .grad_norm = 0.75,
                                            .tokens = 100, .tokens_seen = 300, .seconds = 0.25, .layer_forwards = 6,
                                            .mem_bytes = 10, .mem_peak_bytes = 20, .all_gathers = 7,
                                            .replica_collectives = 5}},
        {.type = MSG_METRICS, .u.metrics = {.step = 4, .has_checkpoint = true,
                                            .checkpoint = {.step = 4, .attempt = 2, .mode = "sync", .request = 1},
                                            .has_eval_loss = true, .eval_loss = 1.75}},
        {.type = MSG_CKPT_BEGIN, .u.ckpt_begin = {.request = 3}},
        {.type = MSG_CKPT_BEGIN, .u.ckpt_begin = {.request = 4, .stop = true}},
        {.type = MSG_CKPT_BEGIN, .u.ckpt_begin = {.request = 5, .sync = true}},
        {.type = MSG_CKPT_DONE, .u.ckpt_done = {.step = 4, .attempt = 1, .rank = 0, .ok = true, .file = "rank-0.bin",
                                                .bytes = 4096, .header_crc32c = 0xfffffffful, .stage_s = 0.5,
                                                .has_optimizer_step = true, .optimizer_step = 4,
                                                .has_tokens_seen = true, .tokens_seen = 99, .units = units}},
        {.type = MSG_CKPT_DONE, .u.ckpt_done = {.step = 5, .attempt = 2, .rank = 1, .ok = true, .memory = true,
                                                .file = "rank-00001-of-00002.bin", .bytes = 8192, .write_s = 0.25}},
        {.type = MSG_CKPT_DONE, .u.ckpt_done = {.step = 4, .attempt = 1, .rank = 1, .aborted = true, .error = "disk full"}},
        {.type = MSG_CKPT_ABORT, .u.ckpt_abort = {.step = 4, .attempt = 1, .rank = 5}},
        {.type = MSG_STOP, .u.stop = {"done", false}},
        {.type = MSG_STOP, .u.stop = {"node 2 failed", true}},
        {.type = MSG_STOP, .u.stop = {"rank 3: a corrupt checkpoint", true, true}},
        {.type = MSG_FATAL, .u.fatal = {"rank 1 fell over", true}},
        {.type = MSG_ADDR, .u.addr = {"127.0.0.1:4000"}},
        {.type = MSG_PEERS, .u.peers = {.n = 2, .addrs = addrs}},
        {.type = MSG_JOIN, .u.join = {.node = 1, .nodes = 2, .slurm_node = 1, .host = "node-b", .workers = 8,
                                      .nonce = "00ff", .memory_step = 12, .settings = settings}},
        {.type = MSG_JOIN, .u.join = {.node = 0, .nodes = 2, .slurm_node = 3, .standby = true, .host = "node-d",
                                      .workers = 8, .nonce = "00ff", .memory_step = -1, .replica_port = 40123,
                                      .settings = settings}},
        {.type = MSG_RENDEZVOUS, .u.rendezvous = {.host = "10.0.0.1", .port = 40001, .nodes = 2, .job_id = "77",
                                                  .restart = 1, .attempt = 0, .secret = "ab", .nonce = "cd",
                                                  .launch = "job 77 step 0 restart 1 attempt 0",
                                                  .members = {.n = 2, .id = {0, 3}}}},
        {.type = MSG_RENDEZVOUS, .u.rendezvous = {.nodes = 1, .job_id = "77", .launch = "job 77 step 0 restart 0 attempt 2",
                                                  .members = {.n = 1}, .ended = "node(s) 2 gone"}},
        {.type = MSG_REFUSED, .u.refused = {"JOIN from a second node 1"}},
        {.type = MSG_NODE_ADDRS, .u.node_addrs = {.node = 1, .list = {.n = 2, .addrs = addrs}}},
        {.type = MSG_NODE_READY, .u.node_ready = {.node = 1}},
        {.type = MSG_NODE_DONE, .u.node_done = {.node = 1, .ok = false, .error = "rank 3 failed"}},
        {.type = MSG_NODE_DONE, .u.node_done = {.node = 1, .ok = false, .permanent = true, .error = "bad shard"}},
        {.type = MSG_NODE_HEARTBEAT, .u.node_heartbeat = {.node = 0, .state = "training"}},
        {.type = MSG_NODE_HEARTBEAT, .u.node_heartbeat = {.node = 2, .state = "setup", .ranks = rows}},
        {.type = MSG_NODE_HEARTBEAT, .u.node_heartbeat = {.node = 0, .state = "training", .progress = progress}},
        {.type = MSG_CKPT_REQUEST, .u.ckpt_request = {.kind = "stop_sync", .why = "SIGTERM on node 1"}},
        {.type = MSG_PLAN, .u.plan = {.attempt = 3, .resume_dir = "/ckpt/step-8", .memory_step = -1}},
        {.type = MSG_PLAN, .u.plan = {.attempt = 4, .memory_step = 13}},
        {.type = MSG_PLAN, .u.plan = {.attempt = 5, .memory_step = -1, .has_replicas = true, .replicas = {.n = 2, .addrs = addrs}}},
        {.type = MSG_PLAN, .u.plan = {.attempt = 1, .error = "corrupt manifest", .memory_step = -1}},
        {.type = MSG_SAMPLE, .u.sample = {.step = 4, .prompt_index = 1, .reply_ids = reply_ids, .stop = "stop"}},
    };
    int seen[MSG_TYPE_END] = {0};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        msg back;
        through_wire(&all[i], &back);
        assert_same_body(&all[i], &back);
        seen[all[i].type] = 1;
        msg_free(&back);
    }
    msg back;
    through_wire(&all[3], &back);
    assert_true(back.u.heartbeat.has_step && back.u.heartbeat.step == 5 && !back.u.heartbeat.ready);
    assert_true(back.u.heartbeat.has_progress && back.u.heartbeat.progress == 12);
    msg_free(&back);
    through_wire(&all[2], &back);
    assert_false(back.u.heartbeat.has_step);
    assert_false(back.u.heartbeat.has_progress);
    msg_free(&back);
    through_wire(&all[6], &back);
    assert_true(back.u.metrics.has_checkpoint);
    assert_string_equal(back.u.metrics.checkpoint.mode, "sync");
    msg_free(&back);
    through_wire(&all[19], &back); /* PEERS */
    assert_int_equal(back.u.peers.n, 2);
    assert_string_equal(back.u.peers.addrs[1], "127.0.0.1:4001");
    msg_free(&back);
    assert_null(back.u.peers.addrs);
    json_decref(units);
    json_decref(rows);
    json_decref(progress);
    json_decref(settings);
    json_decref(reply_ids);

    msg id = {.type = MSG_NCCL_ID};
    for (int i = 0; i < MSG_NCCL_ID_BYTES; i++) id.u.nccl_id.id[i] = (unsigned char)(i * 7);
    through_wire(&id, &back);
    assert_memory_equal(back.u.nccl_id.id, id.u.nccl_id.id, MSG_NCCL_ID_BYTES);
    seen[MSG_NCCL_ID] = seen[MSG_CONFIG] = 1; /* CONFIG: test_config */
    for (int t = 1; t < MSG_TYPE_END; t++)
        if (!seen[t]) fail_msg("%s has no round-trip case", msg_type_name(t));
}

static void test_strict_decoder(void **state) {
    (void)state;
    refused(MSG_HELLO, "{\"pid\":1,\"rank\":0}", "HELLO: unknown field 'rank'");
    refused(MSG_HELLO, "{}", "HELLO: field 'pid' is missing");
    refused(MSG_JOIN, "{\"node\":1,\"nodes\":2,\"slurm_node\":1,\"standby\":false,\"host\":\"h\",\"workers\":1,\"nonce\":\"0\",\"memory_step\":-1,\"replica_port\":0,\"settings\":[]}",
            "JOIN: field 'settings' must be an object");
    refused(MSG_JOIN, "{\"node\":1,\"nodes\":2,\"slurm_node\":1,\"standby\":false,\"host\":\"h\",\"workers\":1,\"nonce\":\"0\",\"memory_step\":-1,\"replica_port\":0}",
            "JOIN: field 'settings' is missing");
    refused(MSG_JOIN, "{\"node\":1,\"nodes\":2,\"slurm_node\":1,\"standby\":false,\"host\":\"h\",\"workers\":1,\"nonce\":\"0\",\"settings\":{}}",
            "JOIN: field 'memory_step' is missing");
    refused(MSG_JOIN, "{\"node\":1,\"nodes\":2,\"slurm_node\":1,\"standby\":false,\"host\":\"h\",\"workers\":1,\"nonce\":\"0\",\"memory_step\":-2,\"settings\":{}}",
            "JOIN: field 'memory_step' = -2 is out of range");
    refused(MSG_JOIN, "{\"node\":1,\"nodes\":2,\"slurm_node\":1,\"standby\":true,\"host\":\"h\",\"workers\":1,\"nonce\":\"0\",\"memory_step\":-1,\"replica_port\":65536,\"settings\":{}}",
            "JOIN: field 'replica_port' = 65536 is out of range");
    refused(MSG_HELLO, "{\"pid\":\"12\"}", "HELLO: field 'pid' must be an integer, got a string");
    refused(MSG_HELLO, "{\"pid\":0}", "HELLO: field 'pid' = 0 is out of range [1, 2147483647]");
    refused(MSG_HELLO, "{\"pid\":4294967296}", "out of range");
    refused(MSG_START, "{\"x\":1}", "START: unknown field 'x'");
    refused(MSG_HEARTBEAT, "{\"ready\":1}", "HEARTBEAT: field 'ready' must be true or false, got an integer");
    refused(MSG_HEARTBEAT, "{\"ready\":false,\"step\":-1}", "field 'step' = -1 is out of range");
    refused(MSG_METRICS, "{\"step\":1}", "METRICS: field 'total_steps' is missing");
    refused(MSG_CKPT_BEGIN, "{\"request\":1.5,\"stop\":false}", "field 'request' must be an integer, got a real number");
    refused(MSG_ADDR, "{\"addr\":\"0123456789012345678901234567890123456789012345678901234567890123456789"
                      "0123456789\"}",
            "ADDR: field 'addr' must be a string of fewer than 80 bytes");
    refused(MSG_STOP, "{\"reason\":\"a\\u0000b\"}", "STOP: body is not JSON");
    refused(MSG_STOP, "{\"reason\":\"x\"}", "STOP: field 'failed' is missing");
    refused(MSG_STOP, "{\"reason\":\"x\",\"failed\":true}", "STOP: field 'permanent' is missing");
    static const char rendezvous[] = "{\"host\":\"h\",\"port\":1,\"nodes\":%d,\"job_id\":\"1\",\"restart\":0,"
                                     "\"attempt\":0,\"secret\":\"\",\"nonce\":\"\",\"launch\":\"l\",\"members\":%s,"
                                     "\"ended\":\"\"}";
    char r[512];
    snprintf(r, sizeof r, rendezvous, 2, "[0,2,2]");
    refused(MSG_RENDEZVOUS, r, "RENDEZVOUS: members lists node 2 twice");
    snprintf(r, sizeof r, rendezvous, 3, "[0,1]");
    refused(MSG_RENDEZVOUS, r, "RENDEZVOUS: field 'members' lists 2 nodes, field 'nodes' says 3");
    snprintf(r, sizeof r, rendezvous, 2, "[1,0]");
    refused(MSG_RENDEZVOUS, r, "RENDEZVOUS: field 'members' must begin with node 0, the leader");
    snprintf(r, sizeof r, rendezvous, 1, "[]");
    refused(MSG_RENDEZVOUS, r, "RENDEZVOUS: field 'members' must be an array of 1 to 1024 node indices");
    snprintf(r, sizeof r, rendezvous, 2, "[0,-1]");
    refused(MSG_RENDEZVOUS, r, "RENDEZVOUS: members[1] is not a node index");
    refused(MSG_RENDEZVOUS, "{\"host\":\"h\",\"port\":0,\"nodes\":1,\"job_id\":\"1\",\"restart\":0,\"attempt\":0,"
                            "\"secret\":\"\",\"nonce\":\"\",\"launch\":\"l\",\"members\":[0],\"ended\":\"\"}",
            "RENDEZVOUS: field 'port' is 0, and the launch has not ended");
    refused(MSG_CKPT_REQUEST, "{\"kind\":\"later\",\"why\":\"x\"}",
            "CKPT_REQUEST: field 'kind' is \"later\", not checkpoint, stop or stop_sync");
    refused(MSG_NODE_HEARTBEAT, "{\"node\":1,\"state\":\"training\",\"ranks\":[{\"rank\":2,\"pid\":3}]}",
            "NODE_HEARTBEAT: ranks[0] needs an integer 'rank' >= 0, an integer 'pid' and a boolean 'running'");
    refused(MSG_NODE_HEARTBEAT, "{\"node\":1,\"state\":\"t\",\"ranks\":[{\"rank\":2,\"pid\":3,\"running\":true,"
                                "\"gpu_bytes\":-4}]}", "NODE_HEARTBEAT: ranks[0].gpu_bytes must be a byte count or null");
    refused(MSG_NODE_HEARTBEAT, "{\"node\":1,\"state\":\"t\",\"ranks\":[{\"rank\":2,\"pid\":3,\"running\":true,"
                                "\"cpu\":1}]}", "NODE_HEARTBEAT: ranks[0] has an unknown member");
    refused(MSG_NODE_HEARTBEAT, "{\"node\":1,\"state\":\"t\",\"ranks\":[{\"rank\":2,\"pid\":3,\"running\":true,"
                                "\"progress\":{\"work\":0,\"step\":1,\"still_s\":2}}]}",
            "NODE_HEARTBEAT: ranks[0].progress must be {\"work\" >= 1, \"step\" >= 0, \"still_s\" >= 0}");
    refused(MSG_NODE_HEARTBEAT, "{\"node\":1,\"state\":\"t\",\"ranks\":{}}", "NODE_HEARTBEAT: field 'ranks' must be an array");
    refused(MSG_NODE_HEARTBEAT, "{\"node\":0,\"state\":\"t\",\"progress\":{\"step\":1}}",
            "NODE_HEARTBEAT: field 'progress': METRICS");
    refused(MSG_PLAN, "{\"attempt\":0,\"resume_dir\":\"\",\"memory_step\":-1,\"error\":\"\"}", "PLAN: field 'attempt' = 0 is out of range");
    refused(MSG_PLAN, "{\"attempt\":1,\"resume_dir\":\"\",\"error\":\"\"}", "PLAN: field 'memory_step' is missing");
    refused(MSG_PEERS, "{\"addrs\":[]}", "PEERS: field 'addrs' must be a non-empty array of strings");
    refused(MSG_PEERS, "{\"addrs\":[\"a\",2]}", "PEERS: addrs[1] must be a string");
    refused(MSG_CKPT_DONE, "{\"step\":1,\"attempt\":1,\"rank\":0,\"sync\":false,\"ok\":true,\"aborted\":false,\"memory\":false,"
                           "\"error\":\"\",\"file\":\"f\",\"bytes\":1,\"header_crc32c\":4294967296,\"stage_s\":0,"
                           "\"write_s\":0}", "field 'header_crc32c' = 4294967296 is out of range");
    refused(MSG_CKPT_DONE, "{\"step\":1,\"attempt\":1,\"rank\":0,\"sync\":false,\"ok\":true,\"aborted\":false,\"memory\":false,"
                           "\"error\":\"\",\"file\":\"f\",\"bytes\":1,\"header_crc32c\":1,\"stage_s\":0,"
                           "\"write_s\":0,\"units\":3}", "field 'units' must be an array or object");
    refused(MSG_CKPT_DONE, "{\"step\":1,\"attempt\":1,\"rank\":0,\"sync\":false,\"ok\":true,\"aborted\":false,"
                           "\"error\":\"\",\"file\":\"f\",\"bytes\":1,\"header_crc32c\":1,\"stage_s\":0,"
                           "\"write_s\":0}", "CKPT_DONE: field 'memory' is missing");
    static const char metrics[] = "{\"step\":1,\"total_steps\":1,\"loss\":1,\"lr\":0,\"grad_norm\":0,\"tokens\":1,"
                                  "\"tokens_seen\":1,\"seconds\":0,\"layer_forwards\":0,\"mem_bytes\":0,"
                                  "\"mem_peak_bytes\":0,\"all_gathers\":0,\"replica_collectives\":0,\"gathered_bytes\":0,"
                                  "\"checkpoint\":%s}";
    char text[512];
    snprintf(text, sizeof text, metrics, "{\"step\":1,\"attempt\":1,\"mode\":\"later\",\"request\":0}");
    refused(MSG_METRICS, text, "METRICS: field 'checkpoint.mode' is \"later\"");
    snprintf(text, sizeof text, metrics, "{\"step\":1,\"attempt\":1,\"mode\":\"sync\",\"request\":0,\"x\":0}");
    refused(MSG_METRICS, text, "METRICS: unknown field 'checkpoint.x'");
    snprintf(text, sizeof text, metrics, "{\"step\":1,\"mode\":\"sync\",\"request\":0}");
    refused(MSG_METRICS, text, "METRICS: field 'checkpoint.attempt' is missing");
    snprintf(text, sizeof text, metrics, "[]");
    refused(MSG_METRICS, text, "METRICS: checkpoint.body must be a JSON object");
}

/* A CONFIG carries a resolved job and a model config, both decoded strictly. */
static void test_config(void **state) {
    (void)state;
    static msg m, back;
    errbuf err = {""};
    m.type = MSG_CONFIG;
    msg_config *c = &m.u.config;
    c->rank = 1, c->world = 2, c->ckpt_attempt = 1, c->model_fd = -1;
    strcpy(c->bind_host, "127.0.0.1");
    memset(c->secret, 'a', 2 * MSG_SECRET_BYTES);
    job_defaults(&c->job);
    strcpy(c->job.data.path, "data.tokens");
    c->job.model.init = JOB_INIT_RANDOM;
    strcpy(c->job.model.config, "tiny.json");
    c->job.train.global_batch = 4;
    if (job_resolve(&c->job, 2, &err) || job_validate(&c->job, 2, &err)) fail_msg("%s", err.msg);
    static const char tiny[] = "{\"model_type\":\"llama\",\"hidden_size\":64,\"intermediate_size\":172,"
                               "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"vocab_size\":211,"
                               "\"max_position_embeddings\":64,\"rms_norm_eps\":1e-5}";
    if (llama_config_parse(&c->model, tiny, strlen(tiny), "tiny", &err)) fail_msg("%s", err.msg);
    c->memory_fd = 5, c->memory_slots = 2, c->memory_resume = true;
    through_wire(&m, &back);
    assert_same_body(&m, &back);
    assert_memory_equal(&back.u.config.model, &c->model, sizeof c->model);
    assert_int_equal(back.u.config.memory_fd, 5);
    assert_int_equal(back.u.config.memory_slots, 2);
    assert_true(back.u.config.memory_resume);
    assert_int_equal(back.u.config.job.train.global_batch, 4);
    assert_int_equal(back.u.config.job.train.grad_accum, 2); /* not carried: recomputed */
    assert_string_equal(back.u.config.job.data.path, "data.tokens");
    assert_null(back.u.config.samples);
    msg_free(&back);

    /* The sample prompts: read back typed, every id below the model's vocabulary. */
    int32_t ids[] = {1, 7, 9, 1, 210}, stop[] = {2};
    int offsets[] = {0, 3, 5};
    msg_sample_prompts p = {.n = 2, .ids = ids, .offsets = offsets, .n_stop = 1, .stop = stop}, q;
    c->samples = msg_sample_prompts_json(&p);
    through_wire(&m, &back);
    assert_same_body(&m, &back);
    if (msg_sample_prompts_read(back.u.config.samples, 211, &q, &err)) fail_msg("%s", err.msg);
    assert_int_equal(q.n, 2);
    assert_memory_equal(q.offsets, offsets, sizeof offsets);
    assert_memory_equal(q.ids, ids, sizeof ids);
    assert_int_equal(q.n_stop, 1);
    assert_int_equal(q.stop[0], 2);
    msg_sample_prompts_free(&q);
    msg_free(&back);
    struct { const char *text, *want; } bad_samples[] = {
        {"{\"prompts\":[[1,211]],\"stop_ids\":[2]}", "'prompts'[0]: [1] = 211 is not below the vocabulary size 211"},
        {"{\"prompts\":[],\"stop_ids\":[2]}", "'prompts' must be a non-empty array"},
        {"{\"prompts\":[[1],[]],\"stop_ids\":[]}", "'prompts'[1]: must be a non-empty array of token ids"},
        {"{\"prompts\":[[1]],\"stop_ids\":[300]}", "'stop_ids': [0] = 300 is not below"},
        {"{\"prompts\":[[1]]}", "must be an object of exactly 'prompts' and 'stop_ids'"},
    };
    json_t *with = msg_to_json(&m, &err);
    for (size_t i = 0; i < sizeof bad_samples / sizeof bad_samples[0]; i++) {
        json_t *o = json_deep_copy(with);
        json_object_set_new(o, "samples", json_loads(bad_samples[i].text, 0, NULL));
        msg out;
        if (msg_from_json(&out, MSG_CONFIG, o, &err) == 0) fail_msg("CONFIG with samples %s accepted", bad_samples[i].text);
        assert_contains(err.msg, "CONFIG: field 'samples': ");
        assert_contains(err.msg, bad_samples[i].want);
        json_decref(o);
    }
    json_decref(with);
    json_decref(c->samples);
    c->samples = NULL;

    /* Each part is checked: the rank, the secret, the job (all keys, valid for the world),
     * the model. */
    json_t *good = msg_to_json(&m, &err);
    struct { const char *key; json_t *value; const char *want; } bad[] = {
        {"rank", json_integer(2), "CONFIG: rank 2 is not below world 2"},
        {"secret", json_string("xyz"), "CONFIG: field 'secret' must be 64 lower-case hex digits"},
        {"model", json_pack("{s:i}", "hidden_size", 64), "CONFIG: field 'model'"},
        {"job", json_pack("{s:{s:f}}", "train", "lr", 1e-4), "CONFIG: field 'job': CONFIG: model.path: missing"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_t *o = json_deep_copy(good);
        json_object_set_new(o, bad[i].key, bad[i].value);
        msg out;
        if (msg_from_json(&out, MSG_CONFIG, o, &err) == 0) fail_msg("CONFIG with a bad %s accepted", bad[i].key);
        assert_contains(err.msg, bad[i].want);
        json_decref(o);
    }
    json_t *o = json_deep_copy(good);
    json_t *train = json_object_get(json_object_get(o, "job"), "train");
    json_object_set_new(train, "global_batch", json_integer(3));
    msg out;
    assert_int_equal(msg_from_json(&out, MSG_CONFIG, o, &err), -1);
    assert_contains(err.msg, "CONFIG: field 'job': train.accumulation (--gradient_accumulation_steps) 2 and "
                             "train.global_batch 3 disagree");
    json_object_set_new(train, "accumulation", json_integer(0)); /* then the batch itself is wrong */
    assert_int_equal(msg_from_json(&out, MSG_CONFIG, o, &err), -1);
    assert_contains(err.msg, "CONFIG: field 'job': train.global_batch");
    json_decref(o);
    json_decref(good);
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
        cmocka_unit_test(test_body_errors),
        cmocka_unit_test(test_every_type_round_trips),
        cmocka_unit_test(test_strict_decoder),
        cmocka_unit_test(test_config),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
