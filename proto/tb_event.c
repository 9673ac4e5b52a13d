/* tb_event: TensorBoard event records, encoded by hand; see tb_event.h. */
#include "proto/tb_event.h"

#include <stdlib.h>
#include <string.h>

#include "base/crc32c.h"
#include "base/grow.h"

enum { WIRE_VARINT = 0, WIRE_FIXED64 = 1, WIRE_BYTES = 2, WIRE_FIXED32 = 5 };
enum { DT_STRING = 7, SESSION_START = 1 };

void tb_buf_free(tb_buf *b) {
    free(b->data);
    *b = (tb_buf){0};
}

uint32_t tb_masked_crc32c(const void *data, size_t len) {
    uint32_t crc = crc32c(0, data, len);
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

static int put(tb_buf *b, const void *p, size_t n) {
    if (grow_array((void **)&b->data, &b->cap, b->len + n, 1)) return -1;
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    return 0;
}

static int put_le(tb_buf *b, uint64_t v, int bytes) {
    uint8_t le[8];
    for (int i = 0; i < bytes; i++) le[i] = (uint8_t)(v >> (8 * i));
    return put(b, le, (size_t)bytes);
}

static int put_varint(tb_buf *b, uint64_t v) {
    uint8_t out[10];
    size_t n = 0;
    do {
        out[n] = (uint8_t)(v & 0x7f);
        v >>= 7;
        if (v) out[n] |= 0x80;
        n++;
    } while (v);
    return put(b, out, n);
}

static int put_key(tb_buf *b, int field, int wire) { return put_varint(b, (uint64_t)field << 3 | (uint64_t)wire); }

static int put_int(tb_buf *b, int field, int64_t v) {
    return put_key(b, field, WIRE_VARINT) || put_varint(b, (uint64_t)v);
}

static int put_bytes(tb_buf *b, int field, const void *p, size_t n) {
    return put_key(b, field, WIRE_BYTES) || put_varint(b, n) || put(b, p, n);
}

static int put_string(tb_buf *b, int field, const char *s) { return put_bytes(b, field, s, strlen(s)); }

static int put_double(tb_buf *b, int field, double x) {
    uint64_t bits;
    memcpy(&bits, &x, sizeof bits);
    return put_key(b, field, WIRE_FIXED64) || put_le(b, bits, 8);
}

static int put_float(tb_buf *b, int field, float x) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    return put_key(b, field, WIRE_FIXED32) || put_le(b, bits, 4);
}

/* A nested message: its bytes, length-delimited. */
static int put_message(tb_buf *b, int field, const tb_buf *m) { return put_bytes(b, field, m->data, m->len); }

/* The event's bytes framed as one TFRecord into out. */
static int frame(tb_buf *out, const tb_buf *event) {
    uint8_t len[8];
    for (int i = 0; i < 8; i++) len[i] = (uint8_t)((uint64_t)event->len >> (8 * i));
    return put(out, len, sizeof len) || put_le(out, tb_masked_crc32c(len, sizeof len), 4) ||
           put(out, event->data, event->len) || put_le(out, tb_masked_crc32c(event->data, event->len), 4);
}

static int event_head(tb_buf *ev, double wall_time, int64_t step) {
    return put_double(ev, 1, wall_time) || put_int(ev, 2, step);
}

/* Frees the n scratch buffers; -1 with the message when rc says an append failed. */
static int done(int rc, tb_buf *scratch, size_t n, errbuf *err) {
    for (size_t i = 0; i < n; i++) tb_buf_free(&scratch[i]);
    return rc ? errf(err, "out of memory encoding a TensorBoard event") : 0;
}

int tb_record_file_version(tb_buf *out, double wall_time, errbuf *err) {
    tb_buf ev = {0};
    int rc = put_double(&ev, 1, wall_time) || put_string(&ev, 3, "brain.Event:2") || frame(out, &ev);
    return done(rc, &ev, 1, err);
}

int tb_record_session_start(tb_buf *out, double wall_time, int64_t step, errbuf *err) {
    enum { EV, LOG, N };
    tb_buf b[N] = {{0}};
    int rc = put_int(&b[LOG], 1, SESSION_START) || event_head(&b[EV], wall_time, step) ||
             put_message(&b[EV], 7, &b[LOG]) || frame(out, &b[EV]);
    return done(rc, b, N, err);
}

int tb_record_scalars(tb_buf *out, double wall_time, int64_t step, const tb_scalar *s, size_t n, errbuf *err) {
    enum { EV, SUMMARY, VALUE, N };
    tb_buf b[N] = {{0}};
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        b[VALUE].len = 0;
        rc = put_string(&b[VALUE], 1, s[i].tag) || put_float(&b[VALUE], 2, s[i].value) ||
             put_message(&b[SUMMARY], 1, &b[VALUE]);
    }
    rc = rc || event_head(&b[EV], wall_time, step) || put_message(&b[EV], 5, &b[SUMMARY]) || frame(out, &b[EV]);
    return done(rc, b, N, err);
}

int tb_record_text(tb_buf *out, double wall_time, int64_t step, const char *tag, const char *text, size_t len,
                   errbuf *err) {
    enum { EV, SUMMARY, VALUE, META, PLUGIN, TENSOR, SHAPE, N };
    tb_buf b[N] = {{0}};
    int rc = put_string(&b[PLUGIN], 1, "text") || /* content: empty (proto3 leaves it out) */
             put_message(&b[META], 1, &b[PLUGIN]) || put_int(&b[TENSOR], 1, DT_STRING) ||
             put_message(&b[TENSOR], 2, &b[SHAPE]) || put_bytes(&b[TENSOR], 8, text, len) ||
             put_string(&b[VALUE], 1, tag) || put_message(&b[VALUE], 8, &b[TENSOR]) ||
             put_message(&b[VALUE], 9, &b[META]) || put_message(&b[SUMMARY], 1, &b[VALUE]) ||
             event_head(&b[EV], wall_time, step) || put_message(&b[EV], 5, &b[SUMMARY]) || frame(out, &b[EV]);
    return done(rc, b, N, err);
}
