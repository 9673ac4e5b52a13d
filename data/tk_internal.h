/* The tokenizer's parts, shared by data/tk_*.c and tokenizer.c (not a public interface: use
 * tokenizer.h). */
#ifndef FSDP_DATA_TK_INTERNAL_H
#define FSDP_DATA_TK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stddef.h>
#include <stdint.h>

#include "data/tk_ids.h"
#include "base/errbuf.h"

/* data/tokenizer.h's types (not included here: it is the module built on this one). */
typedef struct tokenizer tokenizer;
typedef struct tk_state tk_state;

/* ---- bytes: a growable buffer and a list of slices of one -------------------------- */
typedef struct tk_buf {
    char *p;
    size_t n, cap;
} tk_buf;

typedef struct tk_span {
    size_t off, len;
} tk_span;

typedef struct tk_spans {
    tk_span *v;
    size_t n, cap;
} tk_spans;

int tk_buf_put(tk_buf *b, const void *data, size_t len);
void tk_buf_free(tk_buf *b);
int tk_spans_push(tk_spans *s, size_t off, size_t len);
void tk_spans_free(tk_spans *s);

/* ---- UTF-8 ---------------------------------------------------------------------------- */
/* The length of the valid UTF-8 sequence at s (n bytes left), or 0 when it is not one. */
size_t utf8_seq_len(const unsigned char *s, size_t n);
/* Byte offset of the first invalid sequence, or n when all of s is valid. */
size_t utf8_first_invalid(const char *s, size_t n);
/* Decodes the (valid) sequence at s of length k. */
uint32_t utf8_decode(const unsigned char *s, size_t k);
/* Encodes cp into out (4 bytes room); returns its length. */
size_t utf8_encode(uint32_t cp, char *out);
/* Appends s to b, each ill-formed subsequence replaced by U+FFFD (Rust's from_utf8_lossy). */
int utf8_append_lossy(tk_buf *b, const char *s, size_t n);

/* ---- hash maps -------------------------------------------------------------------------- */
/* Byte string -> int32 (keys copied).  Inserting an existing key replaces its value. */
typedef struct tk_strmap {
    uint32_t *slots; /* entry index + 1; 0 = empty */
    size_t nslots;
    char **keys;
    uint32_t *klens;
    int32_t *vals;
    size_t n, cap;
} tk_strmap;

int tk_strmap_put(tk_strmap *m, const char *k, size_t len, int32_t val);
/* The value of k, or -1. */
int32_t tk_strmap_get(const tk_strmap *m, const char *k, size_t len);
void tk_strmap_free(tk_strmap *m);
uint64_t tk_hash_bytes(const void *p, size_t n);

/* (left id, right id) -> merge rank and merged id. */
typedef struct tk_merge {
    uint64_t key; /* (left << 32 | right) + 1; 0 = empty slot */
    uint32_t rank;
    int32_t new_id;
} tk_merge;

typedef struct tk_pairmap {
    tk_merge *slots;
    size_t nslots, n;
} tk_pairmap;

int tk_pairmap_put(tk_pairmap *m, int32_t a, int32_t b, uint32_t rank, int32_t new_id);
const tk_merge *tk_pairmap_get(const tk_pairmap *m, int32_t a, int32_t b);
void tk_pairmap_free(tk_pairmap *m);

/* ---- the parts of a tokenizer.json ------------------------------------------------------ */
enum { NORM_PREPEND, NORM_REPLACE, NORM_NFC };
typedef struct tk_norm {
    int kind;
    char *a, *b; /* PREPEND: a; REPLACE: a -> b */
    size_t alen, blen;
} tk_norm;

enum { PRE_SPLIT, PRE_BYTELEVEL, PRE_METASPACE };
enum { SPLIT_ISOLATED, SPLIT_REMOVED };
enum { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER }; /* Metaspace's prepend_scheme */
typedef struct tk_pre {
    int kind;
    pcre2_code *re; /* SPLIT, or BYTELEVEL with use_regex */
    int behavior;
    int add_prefix_space;
    char rep[5]; /* METASPACE: the replacement character (UTF-8), and prepend_scheme */
    size_t rep_len;
    int prepend;
} tk_pre;

enum { DEC_BYTELEVEL, DEC_REPLACE, DEC_BYTEFALLBACK, DEC_FUSE, DEC_STRIP };
typedef struct tk_dec {
    int kind;
    char *a, *b; /* REPLACE: a -> b */
    size_t alen, blen;
    uint32_t strip_char; /* STRIP */
    size_t strip_start, strip_stop;
} tk_dec;

typedef struct tk_added {
    char *content;
    size_t len;
    int32_t id;
    int special, normalized;
} tk_added;

/* Added tokens of one kind (raw-text or normalized-text), indexed by first byte, longest
 * first, for leftmost-longest matching. */
typedef struct tk_match_tok {
    char *s; /* the text matched: the content, normalized for normalized tokens */
    size_t len;
    int32_t id;
    int special;
} tk_match_tok;

typedef struct tk_matcher {
    tk_match_tok *tokens;
    size_t n;
    size_t first[257]; /* tokens[first[c] .. first[c+1]) start with byte c */
} tk_matcher;

#define TK_BMP 0x10000
struct tokenizer {
    /* model: BPE */
    tk_strmap vocab;
    tk_pairmap merges;
    int32_t unk_id; /* -1: none */
    int has_unk_token;
    char *unk_token;
    int byte_fallback, fuse_unk, ignore_merges;
    int32_t byte_ids[256]; /* <0xXX> ids for byte_fallback, -1 when absent */
    int32_t *char_ids;     /* the vocab id of each one-character BMP token, or -1 */
    /* id -> token string, for decoding */
    char **id_tokens;
    int32_t nids;
    tk_norm *norms;
    size_t nnorms;
    tk_pre *pres;
    size_t npres;
    tk_dec *decs;
    size_t ndecs;
    tk_added *added;
    size_t nadded;
    tk_matcher raw_added, norm_added;
    /* post-processor: the ids before and after the sequence */
    int32_t *prefix, *suffix;
    size_t nprefix, nsuffix;
    int32_t bos_id, eos_id; /* -1: none */
    char note[512];
};

/* A piece of text split by added tokens: the token's id, or -1 for plain text. */
typedef struct tk_piece {
    size_t off, len;
    int32_t id;
} tk_piece;
typedef struct tk_pieces {
    tk_piece *v;
    size_t n, cap;
} tk_pieces;

/* One heap entry of the BPE merge loop. */
typedef struct tk_heap_item {
    uint32_t rank;
    uint32_t pos;
    int32_t new_id;
} tk_heap_item;

typedef struct tk_symbol {
    int32_t id;
    int32_t prev, next;
    uint32_t len; /* bytes; 0 = merged away */
} tk_symbol;

struct tk_state {
    const tokenizer *tk;
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit;
    tk_buf norm, pieces_a, pieces_b, word;
    tk_spans spans_a, spans_b;
    tk_pieces raw_pieces, norm_pieces;
    tk_symbol *syms;
    size_t syms_cap;
    tk_heap_item *heap;
    size_t heap_cap;
    /* word -> ids cache */
    tk_strmap cache;
    tk_ids cache_ids; /* cache values index runs here: [start] = count, then ids */
};

/* ---- stages (tk_normalize.c, tk_pretok.c, tk_bpe.c, tk_added.c, tk_decode.c) ---------- */
int tk_normalize(const tokenizer *tk, const char *s, size_t n, tk_buf *out);
/* Appends the NFC form of the valid UTF-8 s to out (tk_nfc.c). */
int tk_nfc(const char *s, size_t n, tk_buf *out);
/* tk_nfc.c's tables (tk_nfc_tables.c): a code point's full canonical decomposition
 * (tk_nfc_decomp_cps[off .. off+len)), combining class ranges, composition pairs, each
 * sorted. */
typedef struct tk_nfc_decomp {
    uint32_t cp, off, len;
} tk_nfc_decomp;
typedef struct tk_nfc_class {
    uint32_t lo, hi, ccc;
} tk_nfc_class;
typedef struct tk_nfc_pair {
    uint32_t a, b, c;
} tk_nfc_pair;
/* Appends s to out with every non-overlapping a (left to right) replaced by b. */
int tk_replace_all(const char *a, size_t alen, const char *b, size_t blen, const char *s,
                   size_t n, tk_buf *out);
/* Splits s into pieces (written to st->pieces_a / st->spans_a; the result is in *buf and
 * *spans).  at_start: s begins the input text (Metaspace's prepend_scheme "first"). */
int tk_pretokenize(tk_state *st, const char *s, size_t n, int at_start, tk_buf **buf,
                   tk_spans **spans, errbuf *err);
int tk_bpe_word(tk_state *st, const char *w, size_t n, tk_ids *out, errbuf *err);
/* Splits s by the added tokens of m. */
int tk_split_added(const tk_matcher *m, const char *s, size_t n, int split_special,
                   tk_pieces *out);
void tk_pieces_free(tk_pieces *p);
/* The matcher of the added tokens whose normalized flag is `normalized` (their content
 * normalized by tk's normalizers when it is set). */
int tk_matcher_build(const tokenizer *tk, tk_matcher *m, int normalized);
void tk_matcher_free(tk_matcher *m);
/* pattern with \p{L}, \p{N}, \s (and negations) as Oniguruma's code point ranges
 * (tk_regex.c); out is NUL-terminated. */
int tk_regex_rewrite(const char *pattern, size_t len, tk_buf *out);
/* The GPT-2 byte <-> character maps of ByteLevel. */
uint32_t tk_byte_to_char(unsigned char b);
int tk_char_to_byte(uint32_t cp); /* -1 when cp is not one of the 256 */
int tk_decode_tokens(const tokenizer *tk, tk_buf *toks, tk_spans *spans, tk_buf *out);

#endif
