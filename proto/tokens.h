/* tokens: the token-cache file, a tokenized dataset.  Each worker maps it read-only
 * (tok_open, data/rows.c), so a node's workers share its pages in the page cache; fsdpd
 * itself does not open it.  `fsdpctl synth` writes one.
 *
 * A cache holds records (documents or prompt/answer pairs): each a run of int32 token ids
 * with a loss mask (1 = the token is a training target, 0 = context only, e.g. a prompt).
 * Layout, all little-endian, every section 8-byte aligned:
 *
 *   offset 0   header (128 bytes)
 *                char     magic[8]      "FSDPTOK1"
 *                uint32   version       2
 *                uint32   vocab_size    every token id is < vocab_size
 *                uint64   n_records
 *                uint64   n_tokens
 *                uint32   crc32c        of the header from `format` on, then everything
 *                                       after the header (tok_checksum)
 *                uint32   format        TOK_FORMAT_*: what the records were made from
 *                uint32   template      TOK_TEMPLATE_*: the chat template (chat, alpaca)
 *                uint32   reserved0     zero
 *                uint8    tokenizer_sha256[32]  of the tokenizer.json that made the ids;
 *                                       all zero for TOK_FORMAT_TOKENS (no tokenizer)
 *                uint8    reserved[48]  zero
 *   128        uint64   offsets[n_records + 1]   record r is tokens[offsets[r] .. offsets[r+1])
 *              int32    tokens[n_tokens]
 *              uint8    mask[n_tokens], then zero padding to a multiple of 8
 *
 * Files are written atomically (tmp, fsync, rename) and validated on open: sizes, monotone
 * offsets, token ids below vocab_size, checksum, every header field (a version 1 file, from
 * before the header named its tokenizer, is refused: rebuild it). */
#ifndef FSDP_TOKENS_H
#define FSDP_TOKENS_H

#include <stddef.h>
#include <stdint.h>

#include "base/crc32c.h"
#include "base/errbuf.h"

#define TOK_MAGIC "FSDPTOK1"
#define TOK_VERSION 2
#define TOK_HEADER_BYTES 128
#define TOK_CRC_OFFSET 32
#define TOK_SHA256_BYTES 32

/* format: the job's data.format of the source (tokens: synthetic data or a batch file). */
enum { TOK_FORMAT_TOKENS = 0, TOK_FORMAT_ALPACA = 1, TOK_FORMAT_CHAT = 2, TOK_FORMAT_TEXT = 3,
       TOK_FORMAT_PAIRS = 4, TOK_FORMAT_PREFERENCE = 5 };
/* TOK_FORMAT_PAIRS (train.objective dpo, orpo; no tokenizer, like tokens): the records are
 * preference pairs, 2i prompt + chosen and 2i+1 prompt + rejected of pair i, the mask on the
 * completion; an even count of records.  TOK_FORMAT_PREFERENCE: the same records, made by a
 * tokenizer from data.format preference JSONL (its hash set; the template of conversational
 * records, or none for string records). */
static inline int tok_format_pairs(uint32_t format) {
    return format == TOK_FORMAT_PAIRS || format == TOK_FORMAT_PREFERENCE;
}
/* "tokens", "alpaca", "chat", "text", "pairs", "preference" ("unknown" for another value). */
const char *tok_format_name(uint32_t format);
/* template: data/chat_template.h's values (1..10: llama3, llama2, chatml, alpaca, qwen2.5, qwen3,
 * mistral, mistral-v3, mistral-tekken, qwen2). */
enum { TOK_TEMPLATE_NONE = 0, TOK_TEMPLATE_MAX = 10 };

/* The provenance a cache records. */
typedef struct tok_source {
    uint32_t format, template_id;
    uint8_t tokenizer_sha256[TOK_SHA256_BYTES];
} tok_source;

typedef struct tok_cache {
    char *path;
    void *map;
    size_t map_len;
    uint32_t vocab_size;
    uint64_t n_records;
    uint64_t n_tokens;
    tok_source source;
    const uint64_t *offsets;
    const int32_t *tokens;
    const uint8_t *mask;
} tok_cache;

/* What a data file is, by its content (never its name): a token cache (it starts with
 * TOK_MAGIC), JSONL (its first byte that is not white space is '{'), a JSON array ('['), empty
 * (or only white space), or something else. */
typedef enum tok_file_kind {
    TOK_FILE_CACHE, TOK_FILE_JSONL, TOK_FILE_JSON_ARRAY, TOK_FILE_EMPTY, TOK_FILE_OTHER
} tok_file_kind;
/* -1 (with the reason) when path cannot be read (or is not a regular file). */
int tok_probe(const char *path, tok_file_kind *kind, errbuf *err);
/* "a token cache", "JSONL", "a JSON array", "empty", "neither a token cache nor JSONL". */
const char *tok_file_kind_name(tok_file_kind kind);

int tok_open(tok_cache *c, const char *path, errbuf *err);
/* Only the header's provenance (fsdpd checks it without reading the whole file). */
int tok_read_source(const char *path, tok_source *src, errbuf *err);
/* Validates a whole file image held in memory (the fuzzing entry point); views point
 * into buf.  tok_close on such a cache frees only what tok_parse allocated. */
int tok_parse(tok_cache *c, const void *buf, size_t len, const char *name, errbuf *err);
void tok_close(tok_cache *c);
/* The checksum a whole file image (len >= TOK_HEADER_BYTES) should carry. */
uint32_t tok_checksum(const void *buf, size_t len);

/* A record's tokens and mask. */
static inline uint64_t tok_record_len(const tok_cache *c, uint64_t r) {
    return c->offsets[r + 1] - c->offsets[r];
}

/* Builds a cache in memory, then writes it. */
typedef struct tok_writer {
    uint32_t vocab_size;
    tok_source source; /* zero (format tokens) unless set before saving */
    uint64_t n_records;
    size_t cap_records;
    uint64_t *offsets;
    uint64_t n_tokens;
    size_t cap_tokens;
    int32_t *tokens;
    uint8_t *mask;
} tok_writer;

void tok_writer_init(tok_writer *w, uint32_t vocab_size);
int tok_writer_add(tok_writer *w, const int32_t *tokens, const uint8_t *mask, uint64_t n,
                   errbuf *err);
int tok_writer_save(const tok_writer *w, const char *path, errbuf *err);
void tok_writer_free(tok_writer *w);

#endif
