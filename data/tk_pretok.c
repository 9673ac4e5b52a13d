/* The pre-tokenizers: Split (a PCRE2 regex in UTF + UCP mode; the matches are pieces of
 * their own (Isolated) or dropped (Removed), the text between them pieces too), ByteLevel
 * (optional prefix space and GPT-2 regex split, then every byte as its GPT-2 character) and
 * Metaspace without split (SentencePiece models as transformers converts them: every ' '
 * replaced by "▁", and "▁" put before a piece not starting with one: always, never, or
 * "first": only before the piece that begins the input, so not after an added token).
 * Empty pieces are dropped, as tokenizers does. */
#include <string.h>

#include "data/tk_internal.h"

/* The characters GPT-2 gives the 256 bytes: printable Latin-1 bytes are themselves, the
 * others 256, 257, ... in byte order. */
uint32_t tk_byte_to_char(unsigned char b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174) return b;
    uint32_t k = 0; /* its rank among the non-printable bytes */
    if (b <= 32) k = b;
    else if (b <= 160) k = 33 + (uint32_t)(b - 127);
    else k = 33 + 34; /* 173 */
    return 256 + k;
}

int tk_char_to_byte(uint32_t cp) {
    if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255))
        return (int)cp;
    if (cp < 256 || cp > 256 + 67) return -1;
    uint32_t k = cp - 256;
    if (k <= 32) return (int)k;
    if (k <= 66) return (int)(127 + k - 33);
    return 173;
}

static int match_error(int rc, errbuf *err) {
    PCRE2_UCHAR msg[256];
    if (pcre2_get_error_message(rc, msg, sizeof msg) < 0) strcpy((char *)msg, "unknown error");
    return errf(err, "pre-tokenizer regex failed on the text: %s", (const char *)msg);
}

/* Splits buf[sp] by re into out (offsets into the same buffer). */
static int split_regex(tk_state *st, const pcre2_code *re, int behavior, const char *buf,
                       tk_span sp, tk_spans *out, errbuf *err) {
    PCRE2_SPTR subj = (PCRE2_SPTR)(buf + sp.off);
    size_t n = sp.len, start = 0, prev = 0;
    while (start <= n) {
        int rc = pcre2_match(re, subj, n, start, PCRE2_NO_UTF_CHECK, st->md, st->mctx);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) return match_error(rc, err);
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(st->md);
        size_t ms = ov[0], me = ov[1];
        if (ms > prev && tk_spans_push(out, sp.off + prev, ms - prev)) return errf(err, "out of memory");
        if (behavior == SPLIT_ISOLATED && me > ms && tk_spans_push(out, sp.off + ms, me - ms))
            return errf(err, "out of memory");
        prev = me;
        if (me > ms) start = me;
        else if (me >= n) break;
        else start = me + utf8_seq_len((const unsigned char *)subj + me, n - me);
    }
    if (n > prev && tk_spans_push(out, sp.off + prev, n - prev)) return errf(err, "out of memory");
    return 0;
}

static int map_bytes(const char *s, size_t n, tk_buf *out) {
    char tmp[4];
    for (size_t i = 0; i < n; i++) {
        size_t k = utf8_encode(tk_byte_to_char((unsigned char)s[i]), tmp);
        if (tk_buf_put(out, tmp, k)) return -1;
    }
    return 0;
}

/* ByteLevel on every piece of (in, ins): into (out, outs). */
static int byte_level(tk_state *st, const tk_pre *p, const tk_buf *in, const tk_spans *ins,
                      tk_buf *out, tk_spans *outs, errbuf *err) {
    tk_buf *pre = &st->word; /* each piece, maybe with its prefix space */
    tk_spans split = {0};
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < ins->n; i++) {
        const char *s = in->p + ins->v[i].off;
        size_t n = ins->v[i].len;
        pre->n = 0;
        if (p->add_prefix_space && (n == 0 || s[0] != ' ') && tk_buf_put(pre, " ", 1)) rc = -1;
        if (rc == 0 && tk_buf_put(pre, s, n)) rc = -1;
        if (rc) break;
        split.n = 0;
        tk_span whole = {0, pre->n};
        if (p->re) rc = split_regex(st, p->re, SPLIT_ISOLATED, pre->p, whole, &split, err);
        else if (pre->n) rc = tk_spans_push(&split, 0, pre->n);
        for (size_t j = 0; rc == 0 && j < split.n; j++) {
            size_t at = out->n;
            if (map_bytes(pre->p + split.v[j].off, split.v[j].len, out) ||
                tk_spans_push(outs, at, out->n - at))
                rc = -1;
        }
    }
    tk_spans_free(&split);
    if (rc && !err->msg[0]) return errf(err, "out of memory");
    return rc;
}

/* Metaspace on every piece of (in, ins): into (out, outs). */
static int metaspace(const tk_pre *p, int at_start, const tk_buf *in, const tk_spans *ins,
                     tk_buf *out, tk_spans *outs) {
    for (size_t i = 0; i < ins->n; i++) {
        const char *s = in->p + ins->v[i].off;
        size_t n = ins->v[i].len, at = out->n;
        int first = at_start && ins->v[i].off == 0;
        int lead = n && s[0] == ' ' ? 1 : n >= p->rep_len && !memcmp(s, p->rep, p->rep_len);
        int prepend = !lead && (p->prepend == PREPEND_ALWAYS || (p->prepend == PREPEND_FIRST && first));
        if ((prepend && tk_buf_put(out, p->rep, p->rep_len)) ||
            tk_replace_all(" ", 1, p->rep, p->rep_len, s, n, out) ||
            (out->n > at && tk_spans_push(outs, at, out->n - at)))
            return -1;
    }
    return 0;
}

int tk_pretokenize(tk_state *st, const char *s, size_t n, int at_start, tk_buf **buf,
                   tk_spans **spans, errbuf *err) {
    tk_buf *cur = &st->pieces_a, *next = &st->pieces_b;
    tk_spans *cs = &st->spans_a, *ns = &st->spans_b;
    cur->n = 0;
    cs->n = 0;
    err->msg[0] = 0;
    if (tk_buf_put(cur, s, n) || (n && tk_spans_push(cs, 0, n))) return errf(err, "out of memory");
    for (size_t i = 0; i < st->tk->npres; i++) {
        const tk_pre *p = &st->tk->pres[i];
        ns->n = 0;
        if (p->kind == PRE_SPLIT) {
            for (size_t j = 0; j < cs->n; j++)
                if (split_regex(st, p->re, p->behavior, cur->p, cs->v[j], ns, err)) return -1;
            tk_spans *t = cs;
            cs = ns;
            ns = t;
            continue;
        }
        next->n = 0;
        if (p->kind == PRE_METASPACE ? metaspace(p, at_start, cur, cs, next, ns) && errf(err, "out of memory")
                                     : byte_level(st, p, cur, cs, next, ns, err))
            return -1;
        tk_buf *tb = cur;
        cur = next;
        next = tb;
        tk_spans *t = cs;
        cs = ns;
        ns = t;
    }
    *buf = cur;
    *spans = cs;
    return 0;
}
