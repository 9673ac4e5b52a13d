/* Reading tokenizer.json into a tokenizer: every part it names is either understood or
 * refused with an error naming it (model type, normalizer, pre-tokenizer, post-processor,
 * decoder, truncation, padding, added-token options). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/tk_internal.h"
#include "proto/json_kind.h"

/* Bounds the id -> token table a hostile file could ask for. */
#define MAX_TOKEN_ID (1 << 24)

typedef struct reader {
    const char *name;
    errbuf *err;
} reader;

/* json_kind, also for a missing value. */
static const char *kind_of(const json_t *v) { return v ? json_kind(v) : "nothing"; }

static int oom(const reader *r) { return errf(r->err, "%s: out of memory", r->name); }

/* obj[key] when it is present and not null, else NULL. */
static json_t *get(json_t *obj, const char *key) {
    json_t *v = json_object_get(obj, key);
    return v && !json_is_null(v) ? v : NULL;
}

static int get_bool(const reader *r, json_t *obj, const char *where, const char *key, int *out) {
    json_t *v = get(obj, key);
    if (!v) return 0;
    if (!json_is_boolean(v))
        return errf(r->err, "%s: %s.%s must be a boolean, got %s", r->name, where, key, kind_of(v));
    *out = json_is_true(v);
    return 0;
}

/* A string member (required): its text and length. */
static int get_string(const reader *r, json_t *obj, const char *where, const char *key,
                      const char **s, size_t *len) {
    json_t *v = get(obj, key);
    if (!json_is_string(v))
        return errf(r->err, "%s: %s.%s must be a string, got %s", r->name, where, key,
                    kind_of(v));
    *s = json_string_value(v);
    *len = json_string_length(v);
    return 0;
}

static char *dup_bytes(const char *s, size_t n) {
    char *p = malloc(n + 1);
    if (p) {
        if (n) memcpy(p, s, n);
        p[n] = 0;
    }
    return p;
}

static const char *type_of(json_t *obj) {
    json_t *t = json_object_get(obj, "type");
    return json_is_string(t) ? json_string_value(t) : NULL;
}

static int need_object(const reader *r, json_t *v, const char *where) {
    if (json_is_object(v) && type_of(v)) return 0;
    return errf(r->err, "%s: %s must be an object with a \"type\", got %s", r->name, where,
                kind_of(v));
}

/* A {"String": s} pattern's text; a {"Regex": ...} one is *is_regex = 1. */
static int get_pattern(const reader *r, json_t *obj, const char *where, const char **s,
                       size_t *len, int *is_regex) {
    json_t *p = get(obj, "pattern");
    *is_regex = 0;
    if (json_is_object(p) && json_is_string(json_object_get(p, "String")))
        return get_string(r, p, where, "String", s, len);
    if (json_is_object(p) && json_is_string(json_object_get(p, "Regex"))) {
        *is_regex = 1;
        return get_string(r, p, where, "Regex", s, len);
    }
    return errf(r->err, "%s: %s.pattern must be {\"String\": ...} or {\"Regex\": ...}", r->name,
                where);
}

/* ---- model ---------------------------------------------------------------------------- */

static int read_vocab(const reader *r, tokenizer *tk, json_t *vocab) {
    if (!json_is_object(vocab))
        return errf(r->err, "%s: model.vocab must be an object, got %s", r->name, kind_of(vocab));
    const char *key;
    json_t *v;
    json_object_foreach(vocab, key, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= MAX_TOKEN_ID)
            return errf(r->err, "%s: model.vocab[\"%s\"] must be an id in [0, %d)", r->name, key,
                        MAX_TOKEN_ID);
        if (tk_strmap_put(&tk->vocab, key, strlen(key), (int32_t)json_integer_value(v))) return oom(r);
    }
    return 0;
}

/* One merge as its two halves: "a b" (exactly one space) or ["a", "b"]. */
static int merge_parts(const reader *r, json_t *m, size_t i, const char **a, size_t *alen,
                       const char **b, size_t *blen) {
    if (json_is_string(m)) {
        const char *s = json_string_value(m), *sp = strchr(s, ' ');
        size_t n = json_string_length(m);
        if (!sp || memchr(sp + 1, ' ', n - (size_t)(sp + 1 - s)) || strlen(s) != n)
            return errf(r->err, "%s: model.merges[%zu] \"%s\" is not two tokens split by one space",
                        r->name, i, s);
        *a = s;
        *alen = (size_t)(sp - s);
        *b = sp + 1;
        *blen = n - *alen - 1;
        return 0;
    }
    if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
        json_is_string(json_array_get(m, 1))) {
        *a = json_string_value(json_array_get(m, 0));
        *alen = json_string_length(json_array_get(m, 0));
        *b = json_string_value(json_array_get(m, 1));
        *blen = json_string_length(json_array_get(m, 1));
        return 0;
    }
    return errf(r->err, "%s: model.merges[%zu] must be \"a b\" or [\"a\", \"b\"], got %s", r->name,
                i, kind_of(m));
}

static int read_merges(const reader *r, tokenizer *tk, json_t *merges) {
    if (!json_is_array(merges))
        return errf(r->err, "%s: model.merges must be a list, got %s", r->name, kind_of(merges));
    tk_buf joined = {0};
    int rc = 0;
    int strings = json_is_string(json_array_get(merges, 0));
    for (size_t i = 0; rc == 0 && i < json_array_size(merges); i++) {
        if (json_is_string(json_array_get(merges, i)) != strings) {
            rc = errf(r->err, "%s: model.merges[%zu]: the list mixes \"a b\" strings and [a, b] "
                      "pairs", r->name, i);
            break;
        }
        const char *a = NULL, *b = NULL;
        size_t alen = 0, blen = 0;
        if ((rc = merge_parts(r, json_array_get(merges, i), i, &a, &alen, &b, &blen))) break;
        int32_t ia = tk_strmap_get(&tk->vocab, a, alen), ib = tk_strmap_get(&tk->vocab, b, blen);
        joined.n = 0;
        if (tk_buf_put(&joined, a, alen) || tk_buf_put(&joined, b, blen)) {
            rc = oom(r);
            break;
        }
        int32_t inew = tk_strmap_get(&tk->vocab, joined.p, joined.n);
        if (ia < 0 || ib < 0 || inew < 0)
            rc = errf(r->err, "%s: model.merges[%zu]: \"%.*s\" is not in the vocab", r->name, i,
                      (int)(ia < 0 ? alen : ib < 0 ? blen : joined.n),
                      ia < 0 ? a : ib < 0 ? b : joined.p);
        /* a repeated pair keeps its last rank, as tokenizers' HashMap does */
        else if (tk_pairmap_put(&tk->merges, ia, ib, (uint32_t)i, inew)) rc = oom(r);
    }
    tk_buf_free(&joined);
    return rc;
}

static int refuse_affix(const reader *r, json_t *model, const char *key) {
    json_t *v = get(model, key);
    if (!v || (json_is_string(v) && json_string_length(v) == 0)) return 0;
    return errf(r->err, "%s: model.%s is not supported", r->name, key);
}

static int read_bpe_options(const reader *r, tokenizer *tk, json_t *model) {
    json_t *drop = get(model, "dropout");
    if (drop && !(json_is_number(drop) && json_number_value(drop) == 0.0))
        return errf(r->err, "%s: model.dropout is not supported (it makes encoding random)", r->name);
    if (refuse_affix(r, model, "continuing_subword_prefix") ||
        refuse_affix(r, model, "end_of_word_suffix"))
        return -1;
    if (get_bool(r, model, "model", "fuse_unk", &tk->fuse_unk) ||
        get_bool(r, model, "model", "byte_fallback", &tk->byte_fallback) ||
        get_bool(r, model, "model", "ignore_merges", &tk->ignore_merges))
        return -1;
    json_t *unk = get(model, "unk_token");
    if (unk) {
        const char *s;
        size_t n;
        if (get_string(r, model, "model", "unk_token", &s, &n)) return -1;
        if (!(tk->unk_token = dup_bytes(s, n))) return oom(r);
        tk->has_unk_token = 1;
        tk->unk_id = tk_strmap_get(&tk->vocab, s, n);
    }
    return 0;
}

static int read_model(const reader *r, tokenizer *tk, json_t *model) {
    if (!model) return errf(r->err, "%s: missing \"model\"", r->name);
    if (need_object(r, model, "model")) return -1;
    if (strcmp(type_of(model), "BPE") != 0)
        return errf(r->err, "%s: model type \"%s\" is not supported (only BPE)", r->name,
                    type_of(model));
    if (read_vocab(r, tk, json_object_get(model, "vocab")) ||
        read_merges(r, tk, json_object_get(model, "merges")) || read_bpe_options(r, tk, model))
        return -1;
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        tk->byte_ids[b] = tk_strmap_get(&tk->vocab, name, 6);
    }
    return 0;
}

/* ---- normalizer ----------------------------------------------------------------------- */

static int push_norm(const reader *r, tokenizer *tk, tk_norm nm) {
    tk_norm *p = realloc(tk->norms, (tk->nnorms + 1) * sizeof *p);
    if (!p) return oom(r);
    tk->norms = p;
    tk->norms[tk->nnorms++] = nm;
    return 0;
}

static int read_normalizer(const reader *r, tokenizer *tk, json_t *n, int depth) {
    if (need_object(r, n, "normalizer")) return -1;
    const char *type = type_of(n), *a, *b;
    size_t alen, blen;
    if (strcmp(type, "Sequence") == 0 && depth < 4) {
        json_t *list = get(n, "normalizers");
        if (!json_is_array(list))
            return errf(r->err, "%s: normalizer Sequence needs a \"normalizers\" list", r->name);
        for (size_t i = 0; i < json_array_size(list); i++)
            if (read_normalizer(r, tk, json_array_get(list, i), depth + 1)) return -1;
        return 0;
    }
    if (strcmp(type, "Prepend") == 0) {
        if (get_string(r, n, "normalizer Prepend", "prepend", &a, &alen)) return -1;
        tk_norm nm = {NORM_PREPEND, dup_bytes(a, alen), NULL, alen, 0};
        if (!nm.a) return oom(r);
        return push_norm(r, tk, nm);
    }
    if (strcmp(type, "Replace") == 0) {
        int is_regex;
        if (get_pattern(r, n, "normalizer Replace", &a, &alen, &is_regex)) return -1;
        if (is_regex)
            return errf(r->err, "%s: normalizer Replace with a Regex pattern is not supported",
                        r->name);
        if (get_string(r, n, "normalizer Replace", "content", &b, &blen)) return -1;
        tk_norm nm = {NORM_REPLACE, dup_bytes(a, alen), dup_bytes(b, blen), alen, blen};
        if (!nm.a || !nm.b || push_norm(r, tk, nm)) {
            free(nm.a);
            free(nm.b);
            return oom(r);
        }
        return 0;
    }
    if (strcmp(type, "NFC") == 0) return push_norm(r, tk, (tk_norm){NORM_NFC, NULL, NULL, 0, 0});
    return errf(r->err, "%s: normalizer type \"%s\" is not supported (only Sequence, Prepend, "
                "Replace, NFC)", r->name, type);
}

/* ---- pre-tokenizer -------------------------------------------------------------------- */

static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int compile(const reader *r, const char *pat, size_t len, int literal, pcre2_code **re) {
    int ec;
    PCRE2_SIZE eo;
    uint32_t opts = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
    *re = pcre2_compile((PCRE2_SPTR)pat, len, opts, &ec, &eo, NULL);
    if (!*re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return errf(r->err, "%s: pre_tokenizer Split pattern does not compile at offset %zu: %s",
                    r->name, (size_t)eo, (const char *)msg);
    }
    if (!literal) { /* it compiles as written: now with Oniguruma's Unicode classes */
        pcre2_code_free(*re);
        tk_buf spelt = {0};
        if (tk_regex_rewrite(pat, len, &spelt)) return oom(r);
        *re = pcre2_compile((PCRE2_SPTR)spelt.p, spelt.n, opts, &ec, &eo, NULL);
        tk_buf_free(&spelt);
        if (!*re)
            return errf(r->err, "%s: pre_tokenizer Split pattern does not compile with its "
                        "Unicode classes spelt out (error %d)", r->name, ec);
    }
    (void)pcre2_jit_compile(*re, PCRE2_JIT_COMPLETE); /* without JIT it still matches */
    return 0;
}

static int push_pre(const reader *r, tokenizer *tk, tk_pre p) {
    tk_pre *v = realloc(tk->pres, (tk->npres + 1) * sizeof *v);
    if (!v) {
        pcre2_code_free(p.re);
        return oom(r);
    }
    tk->pres = v;
    tk->pres[tk->npres++] = p;
    return 0;
}

static int read_split(const reader *r, tokenizer *tk, json_t *p) {
    const char *pat, *behavior;
    size_t len, blen;
    int is_regex, invert = 0;
    if (get_pattern(r, p, "pre_tokenizer Split", &pat, &len, &is_regex) ||
        get_string(r, p, "pre_tokenizer Split", "behavior", &behavior, &blen) ||
        get_bool(r, p, "pre_tokenizer Split", "invert", &invert))
        return -1;
    tk_pre pre = {.kind = PRE_SPLIT, .behavior = SPLIT_ISOLATED};
    if (strcmp(behavior, "Removed") == 0) pre.behavior = SPLIT_REMOVED;
    else if (strcmp(behavior, "Isolated") != 0)
        return errf(r->err, "%s: pre_tokenizer Split behavior \"%s\" is not supported (only "
                    "Isolated, Removed)", r->name, behavior);
    if (invert) return errf(r->err, "%s: pre_tokenizer Split invert is not supported", r->name);
    if (compile(r, pat, len, !is_regex, &pre.re)) return -1;
    return push_pre(r, tk, pre);
}

static int read_byte_level_pre(const reader *r, tokenizer *tk, json_t *p) {
    int use_regex = 1;
    tk_pre pre = {.kind = PRE_BYTELEVEL, .behavior = SPLIT_ISOLATED};
    if (get_bool(r, p, "pre_tokenizer ByteLevel", "add_prefix_space", &pre.add_prefix_space) ||
        get_bool(r, p, "pre_tokenizer ByteLevel", "use_regex", &use_regex))
        return -1;
    if (use_regex && compile(r, GPT2_PATTERN, sizeof GPT2_PATTERN - 1, 0, &pre.re)) return -1;
    return push_pre(r, tk, pre);
}

/* Metaspace as tokenizers reads it: prepend_scheme (default "always"; the older
 * add_prefix_space true/false means always/never), split (default true: refused). */
static int read_metaspace(const reader *r, tokenizer *tk, json_t *p) {
    const char *rep, *scheme = "always";
    size_t len, slen;
    int split = 1, add_prefix_space = 1;
    if (get_string(r, p, "pre_tokenizer Metaspace", "replacement", &rep, &len) ||
        get_bool(r, p, "pre_tokenizer Metaspace", "split", &split) ||
        get_bool(r, p, "pre_tokenizer Metaspace", "add_prefix_space", &add_prefix_space))
        return -1;
    if (!add_prefix_space) scheme = "never";
    if (get(p, "prepend_scheme") && get_string(r, p, "pre_tokenizer Metaspace", "prepend_scheme", &scheme, &slen))
        return -1;
    if (split)
        return errf(r->err, "%s: pre_tokenizer Metaspace with split true is not supported", r->name);
    if (len == 0 || len > 4 || utf8_seq_len((const unsigned char *)rep, len) != len)
        return errf(r->err, "%s: pre_tokenizer Metaspace.replacement must be one character", r->name);
    tk_pre pre = {.kind = PRE_METASPACE, .rep_len = len, .prepend = PREPEND_ALWAYS};
    memcpy(pre.rep, rep, len);
    if (!strcmp(scheme, "first")) pre.prepend = PREPEND_FIRST;
    else if (!strcmp(scheme, "never")) pre.prepend = PREPEND_NEVER;
    else if (strcmp(scheme, "always"))
        return errf(r->err, "%s: pre_tokenizer Metaspace.prepend_scheme \"%s\" is not one of always, "
                    "first, never", r->name, scheme);
    return push_pre(r, tk, pre);
}

static int read_pre_tokenizer(const reader *r, tokenizer *tk, json_t *p, int depth) {
    if (need_object(r, p, "pre_tokenizer")) return -1;
    const char *type = type_of(p);
    if (strcmp(type, "Sequence") == 0 && depth < 4) {
        json_t *list = get(p, "pretokenizers");
        if (!json_is_array(list))
            return errf(r->err, "%s: pre_tokenizer Sequence needs a \"pretokenizers\" list", r->name);
        for (size_t i = 0; i < json_array_size(list); i++)
            if (read_pre_tokenizer(r, tk, json_array_get(list, i), depth + 1)) return -1;
        return 0;
    }
    if (strcmp(type, "Split") == 0) return read_split(r, tk, p);
    if (strcmp(type, "ByteLevel") == 0) return read_byte_level_pre(r, tk, p);
    if (strcmp(type, "Metaspace") == 0) return read_metaspace(r, tk, p);
    return errf(r->err, "%s: pre_tokenizer type \"%s\" is not supported (only Sequence, Split, "
                "ByteLevel, Metaspace)", r->name, type);
}

/* ---- post-processor ------------------------------------------------------------------- */

static int push_id(const reader *r, int32_t **v, size_t *n, int32_t id) {
    int32_t *p = realloc(*v, (*n + 1) * sizeof *p);
    if (!p) return oom(r);
    *v = p;
    p[(*n)++] = id;
    return 0;
}

/* A template's SpecialToken: the ids special_tokens lists for it. */
static int template_special(const reader *r, json_t *specials, json_t *item, int32_t **v,
                            size_t *n) {
    json_t *name = json_object_get(item, "id");
    json_t *entry = json_is_string(name) ? json_object_get(specials, json_string_value(name)) : NULL;
    json_t *ids = json_object_get(entry, "ids");
    if (!json_is_array(ids))
        return errf(r->err, "%s: post_processor TemplateProcessing: special token %s has no ids in "
                    "special_tokens", r->name, json_is_string(name) ? json_string_value(name) : "?");
    for (size_t i = 0; i < json_array_size(ids); i++) {
        json_t *id = json_array_get(ids, i);
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= MAX_TOKEN_ID)
            return errf(r->err, "%s: post_processor TemplateProcessing: a bad id for %s", r->name,
                        json_string_value(name));
        if (push_id(r, v, n, (int32_t)json_integer_value(id))) return -1;
    }
    return 0;
}

static int read_template(const reader *r, tokenizer *tk, json_t *p) {
    json_t *single = get(p, "single"), *specials = get(p, "special_tokens");
    if (!json_is_array(single))
        return errf(r->err, "%s: post_processor TemplateProcessing needs a \"single\" list", r->name);
    int seen_a = 0;
    for (size_t i = 0; i < json_array_size(single); i++) {
        json_t *item = json_array_get(single, i), *sp = json_object_get(item, "SpecialToken");
        json_t *seq = json_object_get(item, "Sequence");
        if (json_is_object(sp)) {
            if (template_special(r, specials, sp, seen_a ? &tk->suffix : &tk->prefix,
                                 seen_a ? &tk->nsuffix : &tk->nprefix))
                return -1;
        } else if (json_is_object(seq) && !seen_a) seen_a = 1;
        else
            return errf(r->err, "%s: post_processor TemplateProcessing single[%zu] must be one "
                        "Sequence or a SpecialToken", r->name, i);
    }
    if (!seen_a)
        return errf(r->err, "%s: post_processor TemplateProcessing single has no Sequence", r->name);
    return 0;
}

static int read_post_processor(const reader *r, tokenizer *tk, json_t *p) {
    if (need_object(r, p, "post_processor")) return -1;
    const char *type = type_of(p);
    if (strcmp(type, "TemplateProcessing") == 0) return read_template(r, tk, p);
    if (strcmp(type, "ByteLevel") == 0) return 0; /* offsets only: the ids are unchanged */
    return errf(r->err, "%s: post_processor type \"%s\" is not supported (only "
                "TemplateProcessing, ByteLevel)", r->name, type);
}

/* ---- decoder -------------------------------------------------------------------------- */

static int push_dec(const reader *r, tokenizer *tk, tk_dec d) {
    tk_dec *v = realloc(tk->decs, (tk->ndecs + 1) * sizeof *v);
    if (!v) {
        free(d.a);
        free(d.b);
        return oom(r);
    }
    tk->decs = v;
    tk->decs[tk->ndecs++] = d;
    return 0;
}

static int read_strip(const reader *r, tokenizer *tk, json_t *d) {
    const char *c;
    size_t len;
    if (get_string(r, d, "decoder Strip", "content", &c, &len)) return -1;
    size_t k = len ? utf8_seq_len((const unsigned char *)c, len) : 0;
    json_t *start = json_object_get(d, "start"), *stop = json_object_get(d, "stop");
    if (k == 0 || k != len || !json_is_integer(start) || !json_is_integer(stop) ||
        json_integer_value(start) < 0 || json_integer_value(stop) < 0)
        return errf(r->err, "%s: decoder Strip needs one character content and start/stop counts",
                    r->name);
    tk_dec dec = {DEC_STRIP, NULL, NULL, 0, 0, utf8_decode((const unsigned char *)c, k),
                  (size_t)json_integer_value(start), (size_t)json_integer_value(stop)};
    return push_dec(r, tk, dec);
}

static int read_decoder(const reader *r, tokenizer *tk, json_t *d, int depth) {
    if (need_object(r, d, "decoder")) return -1;
    const char *type = type_of(d);
    if (strcmp(type, "Sequence") == 0 && depth < 4) {
        json_t *list = get(d, "decoders");
        if (!json_is_array(list))
            return errf(r->err, "%s: decoder Sequence needs a \"decoders\" list", r->name);
        for (size_t i = 0; i < json_array_size(list); i++)
            if (read_decoder(r, tk, json_array_get(list, i), depth + 1)) return -1;
        return 0;
    }
    tk_dec dec = {0};
    if (strcmp(type, "ByteLevel") == 0) dec.kind = DEC_BYTELEVEL;
    else if (strcmp(type, "ByteFallback") == 0) dec.kind = DEC_BYTEFALLBACK;
    else if (strcmp(type, "Fuse") == 0) dec.kind = DEC_FUSE;
    else if (strcmp(type, "Strip") == 0) return read_strip(r, tk, d);
    else if (strcmp(type, "Replace") == 0) {
        const char *a, *b;
        int is_regex;
        if (get_pattern(r, d, "decoder Replace", &a, &dec.alen, &is_regex)) return -1;
        if (is_regex)
            return errf(r->err, "%s: decoder Replace with a Regex pattern is not supported", r->name);
        if (get_string(r, d, "decoder Replace", "content", &b, &dec.blen)) return -1;
        dec.kind = DEC_REPLACE;
        dec.a = dup_bytes(a, dec.alen);
        dec.b = dup_bytes(b, dec.blen);
        if (!dec.a || !dec.b) {
            free(dec.a);
            free(dec.b);
            return oom(r);
        }
    } else
        return errf(r->err, "%s: decoder type \"%s\" is not supported (only Sequence, ByteLevel, "
                    "Replace, ByteFallback, Fuse, Strip)", r->name, type);
    return push_dec(r, tk, dec);
}

/* ---- added tokens --------------------------------------------------------------------- */

static int read_added_token(const reader *r, json_t *t, size_t i, tk_added *a) {
    char where[48];
    snprintf(where, sizeof where, "added_tokens[%zu]", i);
    const char *content;
    size_t len;
    json_t *id = json_object_get(t, "id");
    if (!json_is_object(t) || get_string(r, t, where, "content", &content, &len)) return -1;
    if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= MAX_TOKEN_ID)
        return errf(r->err, "%s: %s.id must be an id in [0, %d)", r->name, where, MAX_TOKEN_ID);
    static const char *const unsupported[] = {"single_word", "lstrip", "rstrip"};
    for (size_t k = 0; k < 3; k++) {
        int on = 0;
        if (get_bool(r, t, where, unsupported[k], &on)) return -1;
        if (on)
            return errf(r->err, "%s: added token \"%s\": %s is not supported", r->name, content,
                        unsupported[k]);
    }
    a->special = 0;
    if (get_bool(r, t, where, "special", &a->special)) return -1;
    a->normalized = !a->special; /* tokenizers' default */
    if (get_bool(r, t, where, "normalized", &a->normalized)) return -1;
    a->id = (int32_t)json_integer_value(id); /* provisional: see assign_added_ids */
    a->len = len;
    return (a->content = dup_bytes(content, len)) ? 0 : oom(r);
}

/* tokenizers ignores the ids the file gives added tokens: a token in the model's vocab has its
 * vocab id, a repeated one its first id, a new one the next id after the vocab (or after the
 * last new one), as AddedVocabulary::add_tokens. */
static void assign_added_ids(tokenizer *tk) {
    int32_t vocab_size = (int32_t)tk->vocab.n, max = -1;
    for (size_t i = 0; i < tk->nadded; i++) {
        tk_added *a = &tk->added[i];
        int32_t id = tk_strmap_get(&tk->vocab, a->content, a->len);
        for (size_t j = 0; id < 0 && j < i; j++)
            if (tk->added[j].len == a->len && memcmp(tk->added[j].content, a->content, a->len) == 0)
                id = tk->added[j].id;
        if (id < 0) id = max < 0 ? vocab_size : max >= vocab_size || vocab_size == 0 ? max + 1 : vocab_size;
        a->id = id;
        if (id > max) max = id;
    }
}

static int read_added_tokens(const reader *r, tokenizer *tk, json_t *list) {
    if (!list) return 0;
    if (!json_is_array(list))
        return errf(r->err, "%s: added_tokens must be a list, got %s", r->name, kind_of(list));
    if (!(tk->added = calloc(json_array_size(list) + 1, sizeof *tk->added))) return oom(r);
    for (size_t i = 0; i < json_array_size(list); i++) {
        if (read_added_token(r, json_array_get(list, i), i, &tk->added[tk->nadded])) return -1;
        tk->nadded++;
    }
    assign_added_ids(tk);
    return 0;
}

/* ---- the whole file ------------------------------------------------------------------- */

/* id -> token: the model's vocab, then the added tokens over it (as tokenizers decodes). */
static int build_id_table(const reader *r, tokenizer *tk) {
    int32_t max = -1;
    for (size_t i = 0; i < tk->vocab.n; i++)
        if (tk->vocab.vals[i] > max) max = tk->vocab.vals[i];
    for (size_t i = 0; i < tk->nadded; i++)
        if (tk->added[i].id > max) max = tk->added[i].id;
    tk->nids = max + 1;
    if (!(tk->id_tokens = calloc((size_t)tk->nids + 1, sizeof *tk->id_tokens))) return oom(r);
    for (size_t i = 0; i < tk->vocab.n; i++) tk->id_tokens[tk->vocab.vals[i]] = tk->vocab.keys[i];
    for (size_t i = 0; i < tk->nadded; i++) tk->id_tokens[tk->added[i].id] = tk->added[i].content;
    if (!(tk->char_ids = malloc(TK_BMP * sizeof *tk->char_ids))) return oom(r);
    for (size_t c = 0; c < TK_BMP; c++) tk->char_ids[c] = -1;
    for (size_t i = 0; i < tk->vocab.n; i++) {
        const unsigned char *k = (const unsigned char *)tk->vocab.keys[i];
        size_t n = tk->vocab.klens[i], sl = n ? utf8_seq_len(k, n) : 0;
        if (sl == n && sl && sl <= 3) tk->char_ids[utf8_decode(k, sl)] = tk->vocab.vals[i];
    }
    return 0;
}

static int refuse_present(const reader *r, json_t *root, const char *key, const char *why) {
    if (!get(root, key)) return 0;
    return errf(r->err, "%s: %s is not supported (%s)", r->name, key, why);
}

int tk_read_json(tokenizer *tk, json_t *root, const char *name, errbuf *err) {
    reader r = {name, err};
    if (!json_is_object(root)) return errf(err, "%s: must be a JSON object", name);
    json_t *v;
    if (refuse_present(&r, root, "truncation", "it changes the ids; fsdpd packs sequences itself") ||
        refuse_present(&r, root, "padding", "fsdpd packs sequences itself") ||
        read_model(&r, tk, json_object_get(root, "model")) ||
        read_added_tokens(&r, tk, get(root, "added_tokens")))
        return -1;
    if ((v = get(root, "normalizer")) && read_normalizer(&r, tk, v, 0)) return -1;
    if ((v = get(root, "pre_tokenizer")) && read_pre_tokenizer(&r, tk, v, 0)) return -1;
    if ((v = get(root, "post_processor")) && read_post_processor(&r, tk, v)) return -1;
    if ((v = get(root, "decoder")) && read_decoder(&r, tk, v, 0)) return -1;
    if (build_id_table(&r, tk)) return -1;
    if (tk_matcher_build(tk, &tk->raw_added, 0) || tk_matcher_build(tk, &tk->norm_added, 1))
        return oom(&r);
    return 0;
}
