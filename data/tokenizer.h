/* tokenizer: Hugging Face tokenizer.json, giving the ids the `tokenizers` library gives.
 *
 * Supported parts (everything else is refused at load with an error naming the part):
 *   model          BPE: merges as "a b" strings or [a, b] arrays, byte_fallback, fuse_unk,
 *                  ignore_merges, unk_token
 *   normalizer     Sequence, Prepend, Replace (String pattern)
 *   pre_tokenizer  Sequence, Split (Regex or String; Isolated or Removed), ByteLevel
 *   post_processor TemplateProcessing (single sequences), ByteLevel
 *   decoder        Sequence, ByteLevel, Replace (String), ByteFallback, Fuse, Strip
 *   added_tokens   matched leftmost-longest in the raw text (normalized: false) or in the
 *                  normalized text (normalized: true)
 *
 * A tokenizer is read-only once loaded and may be shared by threads; each thread encodes
 * through its own tk_state (scratch space and the word -> ids cache). */
#ifndef FSDP_DATA_TOKENIZER_H
#define FSDP_DATA_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "data/tk_ids.h"
#include "base/errbuf.h"

typedef struct tokenizer tokenizer;
typedef struct tk_state tk_state;


enum {
    TK_ADD_SPECIAL = 1,   /* run the post-processor (BOS/EOS), as add_special_tokens=True */
    TK_SPLIT_SPECIAL = 2, /* special-token text is plain text (encode_special_tokens=True) */
};

/* path: a tokenizer.json file, or a model directory holding tokenizer.json (and maybe
 * tokenizer_config.json, whose add_bos_token/add_eos_token win over the post-processor, as in
 * transformers' fast tokenizers; tokenizer_note() then says so). */
tokenizer *tokenizer_load(const char *path, errbuf *err);
/* tokenizer_config.json's text as a JSON object (a new reference; big integers read as reals,
 * as model_max_length often is 1e30): "PATH: not JSON: ... (line N)" or "PATH: not a JSON
 * object" otherwise, on every path that reads it. */
struct json_t;
struct json_t *tokenizer_config_parse(const char *text, size_t len, const char *path, errbuf *err);
/* Parses tokenizer.json text; config (tokenizer_config.json text) may be NULL.  name is used
 * in messages. */
tokenizer *tokenizer_parse(const char *json, size_t len, const char *config, size_t config_len,
                           const char *name, errbuf *err);
void tokenizer_free(tokenizer *tk);
/* A line worth logging about how the file was read ("" when none). */
const char *tokenizer_note(const tokenizer *tk);
/* One more than the largest id (the model's vocabulary and the added tokens). */
int32_t tokenizer_vocab_size(const tokenizer *tk);
/* The id of the token whose text is s (an added token, else a vocabulary entry), or -1. */
int32_t tokenizer_token_id(const tokenizer *tk, const char *s, size_t n);
/* BOS and EOS: tokenizer_config.json's bos_token/eos_token where given, else the
 * post-processor's single leading id (BOS) and a token named </s>, <|end_of_text|> or
 * <|endoftext|> (EOS); -1 when there is none. */
int32_t tokenizer_bos_id(const tokenizer *tk);
int32_t tokenizer_eos_id(const tokenizer *tk);
/* The ids the post-processor puts before a sequence (TK_ADD_SPECIAL), *n of them. */
const int32_t *tokenizer_prefix_ids(const tokenizer *tk, size_t *n);
/* The token string of id, or NULL. */
const char *tokenizer_id_to_token(const tokenizer *tk, int32_t id);

tk_state *tk_state_new(const tokenizer *tk);
void tk_state_free(tk_state *st);

/* Appends the ids of text (len bytes of UTF-8) to out.  flags: TK_ADD_SPECIAL, TK_SPLIT_SPECIAL. */
int tokenizer_encode(const tokenizer *tk, tk_state *st, const char *text, size_t len, int flags,
                     tk_ids *out, errbuf *err);
/* The text of ids (special tokens kept), malloc'd and NUL-terminated, its length in *len. */
char *tokenizer_decode(const tokenizer *tk, const int32_t *ids, size_t n, size_t *len,
                       errbuf *err);

#endif
