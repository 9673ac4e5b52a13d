/* sample: one JSONL record rendered and tokenized into ids and a loss mask; see sample.h. */
#include "data/sample.h"

#include <stdlib.h>
#include <string.h>

int sample_spec_init(sample_spec *s, const tokenizer *tk, job_data_format format,
                     chat_template tpl, int seq_len, bool truncate, errbuf *err) {
    memset(s, 0, sizeof *s);
    if (format == JOB_DATA_ALPACA && tpl != TPL_ALPACA && tpl != TPL_NONE)
        return errf(err, "data.template: alpaca records take the alpaca template, not %s (%s is "
                         "for data.format chat)", chat_template_name(tpl), chat_template_name(tpl));
    if (format == JOB_DATA_TEXT && tpl != TPL_NONE)
        return errf(err, "data.template: text records take no template (%s given)",
                    chat_template_name(tpl));
    if (format == JOB_DATA_CHAT && tpl == TPL_NONE)
        return errf(err, "data.template: chat records need a template (one of " CHAT_TEMPLATE_NAMES ")");
    if (format == JOB_DATA_TOKENS || format == JOB_DATA_AUTO)
        return errf(err, "data.format: %s has no JSONL records", job_data_format_name(format));
    if (format == JOB_DATA_ALPACA) tpl = TPL_ALPACA;
    if (tpl_tokens_find(tpl, tk, &s->tok, err)) return -1;
    s->tk = tk;
    s->format = format;
    s->tpl = tpl;
    s->seq_len = seq_len;
    s->truncate = truncate;
    s->text_field = "text";
    return 0;
}

int sample_buf_init(sample_buf *b, const tokenizer *tk, errbuf *err) {
    memset(b, 0, sizeof *b);
    if (!(b->st = tk_state_new(tk))) return errf(err, "out of memory");
    return 0;
}

void sample_buf_free(sample_buf *b) {
    tk_state_free(b->st);
    record_free(&b->rec);
    tpl_segs_free(&b->segs);
    free(b->run);
    tk_ids_free(&b->ids);
    tk_ids_free(&b->scratch);
    tk_ids_free(&b->three);
    free(b->mask);
    memset(b, 0, sizeof *b);
}

static int push_token(sample_buf *b, int32_t id, bool loss) {
    if (b->ids.n == b->mask_cap) {
        size_t cap = b->mask_cap ? 2 * b->mask_cap : 1024;
        uint8_t *m = realloc(b->mask, cap);
        if (!m) return -1;
        b->mask = m;
        b->mask_cap = cap;
    }
    b->mask[b->ids.n] = loss;
    return tk_ids_push(&b->ids, id);
}

static int run_put(sample_buf *b, size_t at, const char *s, size_t n) {
    if (at + n > b->run_cap) {
        size_t cap = b->run_cap ? b->run_cap : 4096;
        while (cap < at + n) cap *= 2;
        char *r = realloc(b->run, cap);
        if (!r) return -1;
        b->run = r;
        b->run_cap = cap;
    }
    memcpy(b->run + at, s, n);
    return 0;
}

/* segs[from, to): text segments, encoded as one string; tokens before each switch of the
 * loss flag are those the text before it encodes to. */
static int encode_run(const sample_spec *s, sample_buf *b, const tpl_seg *g, size_t n, errbuf *err) {
    size_t len = 0;
    for (size_t i = 0; i < n; i++, len += g[i - 1].len)
        if (run_put(b, len, g[i].s, g[i].len)) return errf(err, "out of memory");
    b->scratch.n = 0;
    if (tokenizer_encode(s->tk, b->st, b->run, len, TK_SPLIT_SPECIAL, &b->scratch, err)) return -1;
    tk_ids full = b->scratch;
    b->scratch = (tk_ids){0};
    size_t done = 0, at = 0;
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < n; at += g[i].len, i++) {
        size_t until = full.n; /* the tokens of segments [.., i] */
        if (i + 1 < n && g[i + 1].loss != g[i].loss) {
            b->scratch.n = 0;
            rc = tokenizer_encode(s->tk, b->st, b->run, at + g[i].len, TK_SPLIT_SPECIAL, &b->scratch, err);
            until = b->scratch.n < full.n ? b->scratch.n : full.n;
        } else if (i + 1 < n) continue;
        for (; rc == 0 && done < until; done++)
            if (push_token(b, full.v[done], g[i].loss)) rc = errf(err, "out of memory");
    }
    tk_ids_free(&full);
    return rc;
}

/* b->segs' first n segments onto b->ids. */
static int encode_first_segments(const sample_spec *s, sample_buf *b, size_t n, errbuf *err) {
    const tpl_seg *v = b->segs.v;
    for (size_t i = 0; i < n;) {
        if (v[i].id >= 0) {
            if (push_token(b, v[i].id, v[i].loss)) return errf(err, "out of memory");
            i++;
            continue;
        }
        size_t j = i;
        while (j < n && v[j].id < 0) j++;
        if (encode_run(s, b, v + i, j - i, err)) return -1;
        i = j;
    }
    return 0;
}

static int encode_segments(const sample_spec *s, sample_buf *b, errbuf *err) {
    return encode_first_segments(s, b, b->segs.n, err);
}

static int render(const sample_spec *s, sample_buf *b, errbuf *err) {
    const data_record *r = &b->rec;
    b->segs.n = 0;
    switch (s->format) {
    case JOB_DATA_ALPACA: return alpaca_render(&s->tok, r->instruction, r->input, r->output, &b->segs, err);
    case JOB_DATA_CHAT: return chat_render(s->tpl, &s->tok, r->msgs, r->n_msgs, &b->segs, err);
    case JOB_DATA_TEXT: {
        int rc = 0;
        for (size_t i = 0; i < s->tok.n_prefix; i++) rc = rc || tpl_control(&b->segs, s->tok.prefix[i], true);
        rc = rc || tpl_text(&b->segs, r->text.s, r->text.len, true) || tpl_control(&b->segs, s->tok.eos, true);
        return rc ? errf(err, "out of memory") : 0;
    }
    case JOB_DATA_PREFERENCE: /* pref_from_line */
    case JOB_DATA_TOKENS:
    case JOB_DATA_AUTO: break;
    }
    return errf(err, "data.format %s is not rendered as one sample", job_data_format_name(s->format));
}

/* ---- preference pairs (TRL 1.16.0's DPOTrainer._prepare_dataset and DataCollatorForPreference) ---- */

/* Conversation k of the record onto b->ids: its render, tokenized (the prompt's cut before
 * its empty assistant turn's loss: the generation prompt, as sample_prompt_from_line). */
static int pref_conversation(const sample_spec *s, sample_buf *b, int k, errbuf *err) {
    const data_record *r = &b->rec;
    b->segs.n = 0;
    if (chat_render(s->tpl, &s->tok, r->msgs + r->conv[k].start, r->conv[k].n, &b->segs, err)) return -1;
    size_t n = b->segs.n;
    if (k == PREF_PROMPT) {
        while (n > 0 && b->segs.v[n - 1].loss) n--;
        if (n == 0) return errf(err, "the template rendered no prompt before the reply");
    }
    return encode_first_segments(s, b, n, err);
}

/* prompt + side (+ the EOS token's text unless side ends with it) onto b->ids, tokenized as
 * TRL tokenizes a string: the post-processor's special tokens, special-token text matched. */
static int pref_string(const sample_spec *s, sample_buf *b, text_field side, bool eos, errbuf *err) {
    const data_record *r = &b->rec;
    const char *e = eos ? tokenizer_id_to_token(s->tk, s->tok.eos) : NULL;
    if (!e) e = "";
    size_t ne = strlen(e), at = r->prompt.len;
    if (ne && side.len >= ne && !memcmp(side.s + side.len - ne, e, ne)) ne = 0;
    if (run_put(b, 0, r->prompt.s, r->prompt.len) || run_put(b, at, side.s, side.len) ||
        run_put(b, at + side.len, e, ne))
        return errf(err, "out of memory");
    b->scratch.n = 0;
    size_t n = at + side.len + ne;
    if (tokenizer_encode(s->tk, b->st, b->run, n, TK_ADD_SPECIAL, &b->scratch, err)) return -1;
    for (size_t i = 0; i < b->scratch.n; i++)
        if (push_token(b, b->scratch.v[i], false)) return errf(err, "out of memory");
    return 0;
}

static size_t common_prefix(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
    size_t i = 0;
    while (i < na && i < nb && a[i] == b[i]) i++;
    return i;
}

/* One side, ids[0, n) with the prompt's plen, truncated onto b->ids with its loss mask;
 * SAMPLE_DROPPED when no loss token is left. */
static int pref_side(const sample_spec *s, sample_buf *b, const int32_t *ids, size_t n, size_t plen,
                     const char *name, errbuf *err) {
    size_t lo = 0, hi = n, loss = 0, max = (size_t)s->seq_len;
    if (n > max) {
        if (!s->truncate)
            return errf(err, "prompt + %s: %zu tokens, more than data.seq_len %d (data.truncate: true "
                             "cuts it)", name, n, s->seq_len);
        if (s->truncation_mode == JOB_TRUNC_KEEP_START) hi = max;
        else lo = n - max;
        b->truncated = true;
    }
    for (size_t i = lo; i < hi; i++) {
        loss += i >= plen;
        if (push_token(b, ids[i], i >= plen)) return errf(err, "out of memory");
    }
    return loss ? SAMPLE_OK : SAMPLE_DROPPED;
}

static const char *pref_kind_name(bool conversational) { return conversational ? "conversational" : "string"; }

/* Onto b->ids: k 0 the prompt, 1 prompt + chosen, 2 prompt + rejected. */
static int pref_encode(const sample_spec *s, sample_buf *b, int k, errbuf *err) {
    static const int conv[] = {PREF_PROMPT, PREF_CHOSEN, PREF_REJECTED};
    const data_record *r = &b->rec;
    if (r->pref_conversational) return pref_conversation(s, b, conv[k], err);
    text_field side = k == 0 ? (text_field){"", 0} : k == 1 ? r->chosen : r->rejected;
    return pref_string(s, b, side, k > 0, err);
}

static int pref_from_line(const sample_spec *s, sample_buf *b, const char *line, size_t len, errbuf *err) {
    data_record *r = &b->rec;
    if (record_parse(r, JOB_DATA_PREFERENCE, NULL, line, len, err)) return -1;
    if (r->pref_conversational != s->pref_conversational)
        return errf(err, "a %s record among %s ones (the file's first record decides, as a dataset's columns do)",
                    pref_kind_name(r->pref_conversational), pref_kind_name(s->pref_conversational));
    size_t n[3];
    for (int k = 0; k < 3; k++) {
        size_t before = b->ids.n;
        if (pref_encode(s, b, k, err)) return -1;
        n[k] = b->ids.n - before;
    }
    tk_ids three = b->ids; /* the three, kept; b->ids rebuilt as the pair */
    b->ids = b->three;
    b->three = three;
    b->ids.n = 0;
    const int32_t *p = three.v, *c = p + n[0], *rj = c + n[1];
    size_t plen = common_prefix(p, n[0], c, n[1]), pr = common_prefix(p, n[0], rj, n[2]);
    if (pr < plen) plen = pr;
    if (s->truncate && s->truncation_mode == JOB_TRUNC_KEEP_START && plen >= (size_t)s->seq_len)
        return SAMPLE_DROPPED;
    int rc = pref_side(s, b, c, n[1], plen, "chosen", err);
    b->split = b->ids.n;
    int rr = rc < 0 ? rc : pref_side(s, b, rj, n[2], plen, "rejected", err);
    if (rc < 0 || rr < 0) return -1;
    return rc == SAMPLE_DROPPED || rr == SAMPLE_DROPPED ? SAMPLE_DROPPED : SAMPLE_OK;
}

int sample_from_line(const sample_spec *s, sample_buf *b, const char *line, size_t len,
                     errbuf *err) {
    b->ids.n = 0;
    b->truncated = false;
    b->split = 0;
    if (s->format == JOB_DATA_PREFERENCE) return pref_from_line(s, b, line, len, err);
    if (record_parse(&b->rec, s->format, s->text_field, line, len, err) || render(s, b, err) ||
        encode_segments(s, b, err))
        return -1;
    if (b->ids.n > (size_t)s->seq_len) {
        if (!s->truncate)
            return errf(err, "%zu tokens, more than data.seq_len %d (data.truncate: true cuts it)",
                        b->ids.n, s->seq_len);
        b->ids.n = (size_t)s->seq_len;
        b->truncated = true;
    }
    for (size_t i = 0; i < b->ids.n; i++)
        if (b->mask[i]) return SAMPLE_OK;
    return SAMPLE_DROPPED;
}

int sample_prompt_from_line(const sample_spec *s, sample_buf *b, const char *line, size_t len,
                            text_field *reference, errbuf *err) {
    b->ids.n = 0;
    if (s->format != JOB_DATA_CHAT) return errf(err, "a prompt is a chat record");
    if (record_parse_prompt(&b->rec, line, len, reference, err) || render(s, b, err) ||
        encode_segments(s, b, err))
        return -1;
    size_t start = b->ids.n; /* the reply's first token: the last run of loss tokens' */
    while (start > 0 && !b->mask[start - 1]) start--;
    while (start > 0 && b->mask[start - 1]) start--;
    if (start == 0) return errf(err, "the template rendered no prompt before the reply");
    b->ids.n = start;
    if (b->ids.n > (size_t)s->seq_len)
        return errf(err, "the prompt has %zu tokens, more than %d", b->ids.n, s->seq_len);
    return 0;
}
