/* The decoders, each a pass over the token strings as tokenizers' decode_chain: Replace,
 * ByteFallback (<0xXX> runs become their UTF-8 text, or one U+FFFD a byte when invalid),
 * Fuse (one string), Strip (up to start/stop copies of a character) and ByteLevel (GPT-2
 * characters back to bytes, decoded lossily).  The result is the strings joined. */
#include <stdlib.h>
#include <string.h>

#include "data/tk_internal.h"

typedef struct toklist {
    tk_buf buf;
    tk_spans spans;
} toklist;

static int emit(toklist *out, const char *s, size_t n) {
    size_t at = out->buf.n;
    if (tk_buf_put(&out->buf, s, n)) return -1;
    return tk_spans_push(&out->spans, at, n);
}

static int replace_pass(const tk_dec *d, const toklist *in, toklist *out) {
    for (size_t i = 0; i < in->spans.n; i++) {
        size_t at = out->buf.n;
        if (tk_replace_all(d->a, d->alen, d->b, d->blen, in->buf.p + in->spans.v[i].off,
                           in->spans.v[i].len, &out->buf) ||
            tk_spans_push(&out->spans, at, out->buf.n - at))
            return -1;
    }
    return 0;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* The byte of a "<0xXX>" token (Rust's u8::from_str_radix also takes "+X"), or -1. */
static int fallback_byte(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
    int hi = s[3] == '+' ? 0 : hexval(s[3]), lo = hexval(s[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

static int flush_bytes(tk_buf *bytes, toklist *out) {
    if (!bytes->n) return 0;
    int rc = 0;
    if (utf8_first_invalid(bytes->p, bytes->n) == bytes->n) rc = emit(out, bytes->p, bytes->n);
    else
        for (size_t i = 0; rc == 0 && i < bytes->n; i++) rc = emit(out, "\xEF\xBF\xBD", 3);
    bytes->n = 0;
    return rc;
}

static int byte_fallback_pass(const toklist *in, toklist *out) {
    tk_buf bytes = {0};
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < in->spans.n; i++) {
        const char *s = in->buf.p + in->spans.v[i].off;
        size_t n = in->spans.v[i].len;
        int b = fallback_byte(s, n);
        if (b >= 0) {
            char c = (char)b;
            rc = tk_buf_put(&bytes, &c, 1);
        } else rc = flush_bytes(&bytes, out) || emit(out, s, n);
    }
    if (rc == 0) rc = flush_bytes(&bytes, out);
    tk_buf_free(&bytes);
    return rc;
}

static int fuse_pass(const toklist *in, toklist *out) {
    size_t at = out->buf.n;
    if (tk_buf_put(&out->buf, "", 0)) return -1; /* a buffer even for no tokens */
    for (size_t i = 0; i < in->spans.n; i++)
        if (tk_buf_put(&out->buf, in->buf.p + in->spans.v[i].off, in->spans.v[i].len)) return -1;
    return tk_spans_push(&out->spans, at, out->buf.n - at);
}

static int strip_pass(const tk_dec *d, const toklist *in, toklist *out) {
    char c[4];
    size_t cl = utf8_encode(d->strip_char, c);
    for (size_t i = 0; i < in->spans.n; i++) {
        const char *s = in->buf.p + in->spans.v[i].off;
        size_t n = in->spans.v[i].len;
        for (size_t k = 0; k < d->strip_start && n >= cl && memcmp(s, c, cl) == 0; k++) {
            s += cl;
            n -= cl;
        }
        for (size_t k = 0; k < d->strip_stop && n >= cl && memcmp(s + n - cl, c, cl) == 0; k++)
            n -= cl;
        if (emit(out, s, n)) return -1;
    }
    return 0;
}

/* A token's bytes: each character's byte when all are GPT-2 characters, else its own text. */
static int token_bytes(const char *s, size_t n, tk_buf *bytes) {
    size_t start = bytes->n;
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        size_t k = utf8_seq_len(u + i, n - i);
        int b = k ? tk_char_to_byte(utf8_decode(u + i, k)) : -1;
        if (b < 0) {
            bytes->n = start;
            return tk_buf_put(bytes, s, n);
        }
        char c = (char)b;
        if (tk_buf_put(bytes, &c, 1)) return -1;
        i += k;
    }
    return 0;
}

static int byte_level_pass(const toklist *in, toklist *out) {
    tk_buf bytes = {0}, text = {0};
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < in->spans.n; i++)
        rc = token_bytes(in->buf.p + in->spans.v[i].off, in->spans.v[i].len, &bytes);
    if (rc == 0) rc = utf8_append_lossy(&text, bytes.p ? bytes.p : "", bytes.n);
    if (rc == 0) rc = emit(out, text.p ? text.p : "", text.n);
    tk_buf_free(&bytes);
    tk_buf_free(&text);
    return rc;
}

static int run_pass(const tk_dec *d, const toklist *in, toklist *out) {
    switch (d->kind) {
    case DEC_REPLACE: return replace_pass(d, in, out);
    case DEC_BYTEFALLBACK: return byte_fallback_pass(in, out);
    case DEC_FUSE: return fuse_pass(in, out);
    case DEC_STRIP: return strip_pass(d, in, out);
    default: return byte_level_pass(in, out);
    }
}

int tk_decode_tokens(const tokenizer *tk, tk_buf *toks, tk_spans *spans, tk_buf *out) {
    toklist a = {*toks, *spans}, b = {0};
    memset(toks, 0, sizeof *toks);
    memset(spans, 0, sizeof *spans);
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < tk->ndecs; i++) {
        b.buf.n = 0;
        b.spans.n = 0;
        rc = run_pass(&tk->decs[i], &a, &b);
        toklist t = a;
        a = b;
        b = t;
    }
    for (size_t i = 0; rc == 0 && i < a.spans.n; i++)
        rc = tk_buf_put(out, a.buf.p + a.spans.v[i].off, a.spans.v[i].len);
    if (rc == 0) rc = tk_buf_put(out, "", 0);
    tk_buf_free(&a.buf);
    tk_buf_free(&b.buf);
    tk_spans_free(&a.spans);
    tk_spans_free(&b.spans);
    return rc;
}
