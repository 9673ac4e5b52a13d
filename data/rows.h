/* rows: the token cache's records (proto/tokens.h) assembled into the rows a job trains on,
 * of seq_len tokens each: one record a row (truncated or padded) or, with data.packing,
 * records packed whole into rows; the held-out split (data.eval_fraction) and the epoch
 * order of the rest.  The worker trains on what row_source_fill hands it.
 *
 * Samples are addressed by a global position (samples consumed by the whole job): step s
 * takes positions [s*G, (s+1)*G) for the global batch G, and rank r of W takes the r-th G/W
 * of them.  An epoch is the largest multiple of G that fits in the samples; each epoch visits
 * them in an order shuffled by a seeded permutation keyed by (seed, epoch) (or in file order,
 * without data.shuffle), so every rank, any world size and a resumed run see the same
 * samples at the same positions.  A sample is a record, or with packing a packed row, so the
 * same holds of rows.  data.eval_fraction f holds out sample i when
 * floor((i+1) f) > floor(i f): by index, so the split is the same at any world size and
 * after a resume; the epochs are of the rest.
 *
 * Packed rows carry their documents as per-token bounds, computed here once, where the row
 * is laid out: doc_start[t] .. doc_end[t] - 1 are the row positions of the document holding
 * token t (kernels/kctx.h's k_docs, on the host), and t - doc_start[t] is its position in
 * that document (transformers' position_ids), which RoPE uses.  The batch carries them to
 * the step unchanged (worker/fsdp.h's fsdp_batch). */
#ifndef FSDP_DATA_ROWS_H
#define FSDP_DATA_ROWS_H

#include <stdbool.h>
#include <stdint.h>

#include "base/errbuf.h"
#include "proto/tokens.h"

/* One row from record r: its tokens, truncated or padded (pad id 0), and labels: the token
 * where the mask is 1, else -100 (padding is -100).  The Hugging Face shift (position t
 * predicts label t+1) happens in the loss, not here. */
void row_fill_record(const tok_cache *c, uint64_t r, int seq_len, int32_t *input_ids,
                     int32_t *labels);

/* Packing (data.packing): the records, in file order, placed whole into rows of seq_len
 * tokens, each row the consecutive records that fit (next fit; a record longer than seq_len
 * is a row of its own, cut at seq_len: the cache builder already applied data.truncate).
 * *row_start ([n_rows + 1], malloc'd): row r holds records row_start[r] .. row_start[r+1]-1.
 * *real_tokens (may be NULL): the tokens the rows hold (their efficiency is
 * real / (n_rows x seq_len)). */
int rows_pack(const tok_cache *c, int seq_len, uint64_t **row_start, uint64_t *n_rows,
              uint64_t *real_tokens, errbuf *err);
/* One packed row: its records one after another, each record's first label -100 (its first
 * token would be predicted from another document's last), then padding (id 0, label -100,
 * one more document), as transformers' DataCollatorWithFlattening lays them out; doc_start
 * and doc_end [seq_len] get each token's document bounds (above). */
void row_fill_packed(const tok_cache *c, const uint64_t *row_start, uint64_t row, int seq_len,
                     int32_t *input_ids, int32_t *labels, int32_t *doc_start, int32_t *doc_end);

/* n rows of seq_len tokens, host int32 [n, seq_len] each: input_ids, labels (unshifted, -100
 * masked) and, for packed rows, doc_start/doc_end (NULL for rows of one record each). */
typedef struct row_batch {
    int n, seq_len;
    int32_t *input_ids, *labels;
    int32_t *doc_start, *doc_end;
} row_batch;

int row_batch_init(row_batch *b, int n, int seq_len, bool packed, errbuf *err);
void row_batch_free(row_batch *b);

/* The rows a job trains and evaluates on, in the order above. */
typedef struct row_source {
    tok_cache cache;
    int seq_len;
    int global_batch;
    uint64_t seed;
    bool shuffle;        /* false: every epoch in file order */
    bool packing;        /* samples are packed rows (row_start), else records */
    bool pairs;          /* a cache of pairs (tok_format_pairs): a sample is a pair, two rows */
    uint64_t *row_start; /* [n_samples + 1] with packing */
    uint64_t n_samples;
    uint64_t real_tokens; /* with packing: the tokens the rows hold */
    uint64_t *train_idx;  /* [n_train]: the samples trained on, in sample order */
    uint64_t n_train;
    uint64_t *eval_idx;   /* [n_eval]: the samples held out (data.eval_fraction) */
    uint64_t n_eval;
    uint64_t epoch_len;  /* samples per epoch: a multiple of global_batch */
    int64_t perm_epoch;  /* the epoch perm holds, -1 for none */
    uint64_t *perm;      /* [n_train] */
} row_source;

/* Opens the cache (packing its records into rows with packing) and checks it fits the
 * model (ids below vocab) and holds at least one global batch. */
int row_source_open(row_source *s, const char *path, int seq_len, int global_batch,
                    uint64_t seed, bool shuffle, bool packing, double eval_fraction,
                    int vocab_size, errbuf *err);
void row_source_close(row_source *s);
static inline uint64_t row_source_steps_per_epoch(const row_source *s) {
    return s->epoch_len / (uint64_t)s->global_batch;
}
/* Fills b (made by row_batch_init with s's seq_len, and packed as s is) with the b->n
 * samples starting at global position first (pairs: b->n / 2 pairs, rows 2i and 2i+1). */
void row_source_fill(row_source *s, uint64_t first, row_batch *b);
/* The held-out samples first .. first+b->n-1 (eval order), as row_source_fill fills them. */
void row_source_fill_eval(row_source *s, uint64_t first, row_batch *b);
/* Held-out samples an evaluation covers: whole global batches of them. */
static inline uint64_t row_source_eval_batches(const row_source *s) {
    return s->n_eval / (uint64_t)s->global_batch;
}

#endif
