/* The tokenizer pipeline, in tokenizers' order: added tokens in the raw text, then for the
 * text between them the normalizer, added tokens in the normalized text, the pre-tokenizer and
 * the BPE model; the post-processor's ids around the result (TK_ADD_SPECIAL).  Loading also
 * reconciles tokenizer_config.json's add_bos_token/add_eos_token, as transformers does. */
#include "data/tokenizer.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "data/tk_internal.h"
#include "base/fileio.h"

#define MAX_TOKENIZER_BYTES (512u << 20)

int tk_read_json(tokenizer *tk, json_t *root, const char *name, errbuf *err);

void tokenizer_free(tokenizer *tk) {
    if (!tk) return;
    tk_strmap_free(&tk->vocab);
    tk_pairmap_free(&tk->merges);
    free(tk->unk_token);
    free(tk->char_ids);
    free(tk->id_tokens);
    for (size_t i = 0; i < tk->nnorms; i++) {
        free(tk->norms[i].a);
        free(tk->norms[i].b);
    }
    free(tk->norms);
    for (size_t i = 0; i < tk->npres; i++) pcre2_code_free(tk->pres[i].re);
    free(tk->pres);
    for (size_t i = 0; i < tk->ndecs; i++) {
        free(tk->decs[i].a);
        free(tk->decs[i].b);
    }
    free(tk->decs);
    for (size_t i = 0; i < tk->nadded; i++) free(tk->added[i].content);
    free(tk->added);
    tk_matcher_free(&tk->raw_added);
    tk_matcher_free(&tk->norm_added);
    free(tk->prefix);
    free(tk->suffix);
    free(tk);
}

int32_t tokenizer_token_id(const tokenizer *tk, const char *s, size_t n) {
    for (size_t i = 0; i < tk->nadded; i++)
        if (tk->added[i].len == n && memcmp(tk->added[i].content, s, n) == 0) return tk->added[i].id;
    return tk_strmap_get(&tk->vocab, s, n);
}

/* A special token named in tokenizer_config.json: a string or {"content": ...}. */
static int32_t config_token_id(const tokenizer *tk, json_t *cfg, const char *key) {
    json_t *v = json_object_get(cfg, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    if (!json_is_string(v)) return -1;
    return tokenizer_token_id(tk, json_string_value(v), json_string_length(v));
}

/* The first of names that is a token, or -1. */
static int32_t first_token(const tokenizer *tk, const char *const *names) {
    for (; *names; names++) {
        int32_t id = tokenizer_token_id(tk, *names, strlen(*names));
        if (id >= 0) return id;
    }
    return -1;
}

/* BOS and EOS: tokenizer_config.json's bos_token/eos_token where it names them, else the
 * post-processor's single leading id (BOS) and the usual end-of-text names (EOS). */
static void find_bos_eos(tokenizer *tk, json_t *cfg) {
    static const char *const bos_names[] = {"<s>", "<|begin_of_text|>", NULL};
    static const char *const eos_names[] = {"</s>", "<|end_of_text|>", "<|endoftext|>", NULL};
    tk->bos_id = cfg ? config_token_id(tk, cfg, "bos_token") : -1;
    tk->eos_id = cfg ? config_token_id(tk, cfg, "eos_token") : -1;
    if (tk->bos_id < 0) tk->bos_id = tk->nprefix == 1 ? tk->prefix[0] : first_token(tk, bos_names);
    if (tk->eos_id < 0) tk->eos_id = first_token(tk, eos_names);
}

/* One side (BOS or EOS) as the config's add_X_token says: a change, or -1 on error. */
static int config_side(tokenizer *tk, json_t *cfg, const char *flag, const char *token,
                       int32_t **ids, size_t *n, const char *name, errbuf *err) {
    json_t *v = json_object_get(cfg, flag);
    if (!json_is_boolean(v)) return 0; /* absent: the post-processor decides */
    int32_t id = config_token_id(tk, cfg, token);
    int want = json_is_true(v);
    if (want && id < 0)
        return errf(err, "%s: %s is true but %s is not a token of tokenizer.json", name, flag, token);
    int has = *n == 1 && (*ids)[0] == id;
    if (want == has && (want || *n == 0)) return 0;
    free(*ids);
    *ids = NULL;
    *n = 0;
    if (want) {
        if (!(*ids = malloc(sizeof **ids))) return errf(err, "out of memory");
        (*ids)[0] = id;
        *n = 1;
    }
    return 1;
}

json_t *tokenizer_config_parse(const char *text, size_t len, const char *path, errbuf *err) {
    json_error_t je;
    /* model_max_length is often 1e30 written as an integer: too big for json_int_t */
    json_t *cfg = json_loadb(text, len, JSON_DECODE_INT_AS_REAL, &je);
    if (!cfg) return errf(err, "%s: not JSON: %s (line %d)", path, je.text, je.line), NULL;
    if (json_is_object(cfg)) return cfg;
    json_decref(cfg);
    return errf(err, "%s: not a JSON object", path), NULL;
}

static int apply_config(tokenizer *tk, const char *config, size_t len, const char *name, const char *cfg_path,
                        errbuf *err) {
    json_t *cfg = tokenizer_config_parse(config, len, cfg_path, err);
    if (!cfg) return -1;
    int bos = config_side(tk, cfg, "add_bos_token", "bos_token", &tk->prefix, &tk->nprefix, name, err);
    int eos = bos < 0 ? 0 : config_side(tk, cfg, "add_eos_token", "eos_token", &tk->suffix, &tk->nsuffix, name, err);
    int rc = bos < 0 || eos < 0 ? -1 : 0;
    find_bos_eos(tk, cfg);
    if (rc == 0 && (bos || eos))
        snprintf(tk->note, sizeof tk->note,
                 "%s: tokenizer_config.json's add_bos_token/add_eos_token differ from "
                 "tokenizer.json's post-processor; following tokenizer_config.json (as "
                 "transformers' fast tokenizer does): %zu BOS, %zu EOS ids",
                 name, tk->nprefix, tk->nsuffix);
    json_decref(cfg);
    return rc;
}

/* tokenizer_parse, with cfg_name naming the config in messages. */
static tokenizer *parse_with_config(const char *json, size_t len, const char *config, size_t config_len,
                                    const char *name, const char *cfg_name, errbuf *err) {
    tokenizer *tk = calloc(1, sizeof *tk);
    if (!tk) {
        errf(err, "out of memory");
        return NULL;
    }
    tk->unk_id = -1;
    json_error_t je;
    json_t *root = json_loadb(json, len, 0, &je);
    int rc = root ? tk_read_json(tk, root, name, err)
                  : errf(err, "%s: %s (line %d, column %d)", name, je.text, je.line, je.column);
    json_decref(root);
    if (rc == 0 && config) rc = apply_config(tk, config, config_len, name, cfg_name, err);
    else if (rc == 0) find_bos_eos(tk, NULL);
    if (rc) {
        tokenizer_free(tk);
        return NULL;
    }
    return tk;
}

tokenizer *tokenizer_parse(const char *json, size_t len, const char *config, size_t config_len,
                           const char *name, errbuf *err) {
    return parse_with_config(json, len, config, config_len, name, "tokenizer_config.json", err);
}

static int is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

tokenizer *tokenizer_load(const char *path, errbuf *err) {
    char file[4096], cfg_file[4096];
    char *json = NULL, *cfg = NULL;
    size_t len = 0, cfg_len = 0;
    int dir = is_dir(path);
    snprintf(file, sizeof file, dir ? "%s/tokenizer.json" : "%s", path);
    snprintf(cfg_file, sizeof cfg_file, "%s/tokenizer_config.json", path);
    if (file_read_all(file, MAX_TOKENIZER_BYTES, &json, &len, err)) return NULL;
    struct stat st;
    if (dir && stat(cfg_file, &st) == 0 &&
        file_read_all(cfg_file, MAX_TOKENIZER_BYTES, &cfg, &cfg_len, err)) {
        free(json);
        return NULL;
    }
    tokenizer *tk = parse_with_config(json, len, cfg, cfg_len, file, cfg_file, err);
    free(json);
    free(cfg);
    return tk;
}

const char *tokenizer_note(const tokenizer *tk) { return tk->note; }
int32_t tokenizer_vocab_size(const tokenizer *tk) { return tk->nids; }
int32_t tokenizer_bos_id(const tokenizer *tk) { return tk->bos_id; }
int32_t tokenizer_eos_id(const tokenizer *tk) { return tk->eos_id; }
const int32_t *tokenizer_prefix_ids(const tokenizer *tk, size_t *n) {
    *n = tk->nprefix;
    return tk->prefix;
}

const char *tokenizer_id_to_token(const tokenizer *tk, int32_t id) {
    return id >= 0 && id < tk->nids ? tk->id_tokens[id] : NULL;
}

tk_state *tk_state_new(const tokenizer *tk) {
    tk_state *st = calloc(1, sizeof *st);
    if (!st) return NULL;
    st->tk = tk;
    st->md = pcre2_match_data_create(2, NULL);
    st->mctx = pcre2_match_context_create(NULL);
    st->jit = pcre2_jit_stack_create(32 << 10, 8 << 20, NULL);
    if (!st->md || !st->mctx) {
        tk_state_free(st);
        return NULL;
    }
    if (st->jit) pcre2_jit_stack_assign(st->mctx, NULL, st->jit);
    return st;
}

void tk_state_free(tk_state *st) {
    if (!st) return;
    pcre2_match_data_free(st->md);
    pcre2_match_context_free(st->mctx);
    pcre2_jit_stack_free(st->jit);
    tk_buf_free(&st->norm);
    tk_buf_free(&st->pieces_a);
    tk_buf_free(&st->pieces_b);
    tk_buf_free(&st->word);
    tk_spans_free(&st->spans_a);
    tk_spans_free(&st->spans_b);
    tk_pieces_free(&st->raw_pieces);
    tk_pieces_free(&st->norm_pieces);
    free(st->syms);
    free(st->heap);
    tk_strmap_free(&st->cache);
    tk_ids_free(&st->cache_ids);
    free(st);
}

static int push_ids(tk_ids *out, const int32_t *ids, size_t n, errbuf *err) {
    for (size_t i = 0; i < n; i++)
        if (tk_ids_push(out, ids[i])) return errf(err, "out of memory");
    return 0;
}

/* Normalized text (not an added token; at_start: it begins the input): pre-tokenized, each
 * piece through BPE. */
static int encode_normalized(tk_state *st, const char *s, size_t n, int at_start, tk_ids *out,
                             errbuf *err) {
    tk_buf *buf;
    tk_spans *spans;
    if (tk_pretokenize(st, s, n, at_start, &buf, &spans, err)) return -1;
    for (size_t i = 0; i < spans->n; i++)
        if (tk_bpe_word(st, buf->p + spans->v[i].off, spans->v[i].len, out, err)) return -1;
    return 0;
}

/* Raw text between added tokens. */
static int encode_plain(tk_state *st, const char *s, size_t n, int at_start, int split_special,
                        tk_ids *out, errbuf *err) {
    const tokenizer *tk = st->tk;
    if (tk_normalize(tk, s, n, &st->norm)) return errf(err, "out of memory");
    if (!tk->norm_added.n) return encode_normalized(st, st->norm.p, st->norm.n, at_start, out, err);
    if (tk_split_added(&tk->norm_added, st->norm.p, st->norm.n, split_special, &st->norm_pieces))
        return errf(err, "out of memory");
    for (size_t i = 0; i < st->norm_pieces.n; i++) {
        tk_piece p = st->norm_pieces.v[i];
        int rc = p.id >= 0 ? push_ids(out, &p.id, 1, err)
                           : encode_normalized(st, st->norm.p + p.off, p.len, at_start && !p.off, out, err);
        if (rc) return -1;
    }
    return 0;
}

int tokenizer_encode(const tokenizer *tk, tk_state *st, const char *text, size_t len, int flags,
                     tk_ids *out, errbuf *err) {
    size_t bad = utf8_first_invalid(text, len);
    if (bad != len) return errf(err, "the text is not valid UTF-8 (at byte %zu)", bad);
    int split_special = (flags & TK_SPLIT_SPECIAL) != 0;
    if ((flags & TK_ADD_SPECIAL) && push_ids(out, tk->prefix, tk->nprefix, err)) return -1;
    if (tk_split_added(&tk->raw_added, text, len, split_special, &st->raw_pieces))
        return errf(err, "out of memory");
    /* the pieces are copied out: encode_plain reuses the normalized-piece list only */
    for (size_t i = 0; i < st->raw_pieces.n; i++) {
        tk_piece p = st->raw_pieces.v[i];
        int rc = p.id >= 0 ? push_ids(out, &p.id, 1, err)
                           : encode_plain(st, text + p.off, p.len, !p.off, split_special, out, err);
        if (rc) return -1;
    }
    if ((flags & TK_ADD_SPECIAL) && push_ids(out, tk->suffix, tk->nsuffix, err)) return -1;
    return 0;
}

char *tokenizer_decode(const tokenizer *tk, const int32_t *ids, size_t n, size_t *len,
                       errbuf *err) {
    tk_buf toks = {0}, out = {0};
    tk_spans spans = {0};
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        const char *t = tokenizer_id_to_token(tk, ids[i]);
        if (!t) {
            rc = errf(err, "id %d is not in the vocabulary (ids 0..%d)", ids[i], tk->nids - 1);
            break;
        }
        size_t at = toks.n;
        /* without a decoder tokenizers joins the tokens with spaces */
        if (!tk->ndecs && i && tk_buf_put(&toks, " ", 1)) rc = -1;
        if (rc == 0 && (tk_buf_put(&toks, t, strlen(t)) || tk_spans_push(&spans, at, toks.n - at)))
            rc = errf(err, "out of memory");
    }
    if (rc == 0 && tk_decode_tokens(tk, &toks, &spans, &out)) rc = errf(err, "out of memory");
    tk_buf_free(&toks);
    tk_spans_free(&spans);
    if (rc) {
        tk_buf_free(&out);
        return NULL;
    }
    *len = out.n;
    return out.p;
}
