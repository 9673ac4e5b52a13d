/* cache_build: a JSONL data file -> a token cache (proto/tokens.h), on every core.
 *
 * Lines are cut into chunks that threads turn into samples (data/sample.h); the chunks are
 * joined in file order, so the cache is the same at any thread count.  A bad record (not
 * JSON, a missing field, roles a template cannot take, too long without truncate) stops
 * the build with its line and reason (on_bad_record fail) or is skipped and counted, the
 * first few logged with their line numbers (skip).  A sample with no loss token left after
 * truncation is dropped and counted.  The cache records the sha256 of tokenizer.json, the
 * format and the template.  Preference records (data/sample.h) make a cache of pairs
 * (TOK_FORMAT_PREFERENCE: two records a pair, samples counting pairs); the first record that
 * says decides whether they are conversational (the template's) or strings (no template). */
#ifndef FSDP_DATA_CACHE_BUILD_H
#define FSDP_DATA_CACHE_BUILD_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "base/errbuf.h"
#include "data/chat_template.h"
#include "proto/job.h"
#include "proto/tokens.h"

typedef struct cache_build_opts {
    const char *tokenizer;  /* a model directory or a tokenizer.json */
    const char *data;       /* the JSONL file */
    job_data_format format; /* alpaca, chat, text or preference */
    const char *text_field; /* text's field; NULL: "text" */
    chat_template tpl;      /* TPL_NONE for text (alpaca: TPL_NONE or TPL_ALPACA) */
    int seq_len;
    bool truncate;
    job_truncation_mode truncation_mode; /* preference */
    job_bad_record on_bad_record;
    size_t max_record_bytes; /* a longer line is a bad record; 0: JOB_MAX_RECORD_BYTES */
    int threads;            /* 0: every core */
    FILE *log;              /* skipped records are reported here (NULL: nowhere) */
    bool progress;          /* a progress bar on stderr */
} cache_build_opts;

typedef struct cache_build_stats {
    uint64_t lines, samples, skipped, dropped, truncated, tokens, loss_tokens;
} cache_build_stats;

/* Builds the cache in w (tok_writer_init'ed here; the caller saves and frees it). */
int cache_build(const cache_build_opts *o, tok_writer *w, cache_build_stats *stats, errbuf *err);

/* sha256 of the tokenizer.json at path (a model directory or the file). */
int tokenizer_file_sha256(const char *path, uint8_t out[TOK_SHA256_BYTES], errbuf *err);
/* The template data.template names for format, "auto" (or "") resolved from the
 * tokenizer's directory for chat (and for preference, TPL_NONE where there is none: string
 * records need none): TPL_NONE for text and alpaca's default. */
int resolve_template(const char *name, job_data_format format, const char *tokenizer_path,
                     chat_template *t, errbuf *err);

#endif
