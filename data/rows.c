/* rows: the token cache's records assembled into training rows (packing, the split, the epoch order); see rows.h. */
#include "data/rows.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "proto/rng.h"

void row_fill_record(const tok_cache *c, uint64_t r, int seq_len, int32_t *input_ids,
                     int32_t *labels) {
    uint64_t begin = c->offsets[r], n = tok_record_len(c, r);
    for (int t = 0; t < seq_len; t++) {
        if ((uint64_t)t < n) {
            input_ids[t] = c->tokens[begin + t];
            labels[t] = c->mask[begin + t] ? c->tokens[begin + t] : -100;
        } else {
            input_ids[t] = 0;
            labels[t] = -100;
        }
    }
}

int rows_pack(const tok_cache *c, int seq_len, uint64_t **row_start, uint64_t *n_rows,
              uint64_t *real_tokens, errbuf *err) {
    uint64_t *starts = malloc((c->n_records + 1) * sizeof *starts), rows = 0, fill = 0, real = 0;
    if (!starts) return errf(err, "%s: out of memory packing %llu records", c->path,
                             (unsigned long long)c->n_records);
    for (uint64_t r = 0; r < c->n_records; r++) {
        uint64_t len = tok_record_len(c, r);
        if (len > (uint64_t)seq_len) len = (uint64_t)seq_len;
        if (rows == 0 || fill + len > (uint64_t)seq_len) {
            starts[rows++] = r;
            fill = 0;
        }
        fill += len;
        real += len;
    }
    starts[rows] = c->n_records;
    *row_start = starts;
    *n_rows = rows;
    if (real_tokens) *real_tokens = real;
    return 0;
}

void row_fill_packed(const tok_cache *c, const uint64_t *row_start, uint64_t row, int seq_len,
                     int32_t *input_ids, int32_t *labels, int32_t *doc_start, int32_t *doc_end) {
    int t = 0;
    for (uint64_t r = row_start[row]; r < row_start[row + 1] && t < seq_len; r++) {
        uint64_t begin = c->offsets[r], n = tok_record_len(c, r);
        if (n > (uint64_t)(seq_len - t)) n = (uint64_t)(seq_len - t); /* a record cut at seq_len */
        int32_t start = t, end = t + (int32_t)n;
        for (uint64_t k = 0; k < n; k++, t++) {
            input_ids[t] = c->tokens[begin + k];
            labels[t] = k > 0 && c->mask[begin + k] ? c->tokens[begin + k] : -100;
            doc_start[t] = start;
            doc_end[t] = end;
        }
    }
    for (int32_t start = t; t < seq_len; t++) { /* the padding: one more document */
        input_ids[t] = 0;
        labels[t] = -100;
        doc_start[t] = start;
        doc_end[t] = seq_len;
    }
}

int row_batch_init(row_batch *b, int n, int seq_len, bool packed, errbuf *err) {
    memset(b, 0, sizeof *b);
    size_t bytes = (size_t)n * (size_t)seq_len * sizeof(int32_t);
    b->n = n;
    b->seq_len = seq_len;
    b->input_ids = malloc(bytes);
    b->labels = malloc(bytes);
    if (packed) {
        b->doc_start = malloc(bytes);
        b->doc_end = malloc(bytes);
    }
    if (b->input_ids && b->labels && (!packed || (b->doc_start && b->doc_end))) return 0;
    row_batch_free(b);
    return errf(err, "out of memory for a batch of %d x %d", n, seq_len);
}

void row_batch_free(row_batch *b) {
    free(b->input_ids);
    free(b->labels);
    free(b->doc_start);
    free(b->doc_end);
    memset(b, 0, sizeof *b);
}

/* Sample i is held out when floor((i+1) f) > floor(i f): a share f, spread evenly. */
static int split_eval(row_source *s, double f, errbuf *err) {
    s->train_idx = malloc(s->n_samples * sizeof *s->train_idx);
    s->eval_idx = malloc((f > 0 ? s->n_samples : 1) * sizeof *s->eval_idx);
    if (!s->train_idx || !s->eval_idx) return errf(err, "out of memory for the sample split");
    for (uint64_t i = 0; i < s->n_samples; i++) {
        int held = f > 0 && floor((double)(i + 1) * f) > floor((double)i * f);
        if (held) s->eval_idx[s->n_eval++] = i;
        else s->train_idx[s->n_train++] = i;
    }
    return 0;
}

int row_source_open(row_source *s, const char *path, int seq_len, int global_batch,
                    uint64_t seed, bool shuffle, bool packing, double eval_fraction,
                    int vocab_size, errbuf *err) {
    memset(s, 0, sizeof *s);
    s->perm_epoch = -1;
    if (tok_open(&s->cache, path, err)) return -1;
    if (s->cache.vocab_size > (uint32_t)vocab_size) {
        uint32_t v = s->cache.vocab_size;
        row_source_close(s);
        return errf(err, "%s: token ids up to %u do not fit the model's vocabulary of %d", path,
                    v - 1, vocab_size);
    }
    s->packing = packing;
    s->pairs = tok_format_pairs(s->cache.source.format);
    if (s->pairs && packing) {
        row_source_close(s);
        return errf(err, "%s: packing a cache of pairs is not built yet", path);
    }
    s->n_samples = s->pairs ? s->cache.n_records / 2 : s->cache.n_records;
    if (packing && rows_pack(&s->cache, seq_len, &s->row_start, &s->n_samples, &s->real_tokens, err)) {
        row_source_close(s);
        return -1;
    }
    if (split_eval(s, eval_fraction, err)) {
        row_source_close(s);
        return errprefix(err, "%s", path);
    }
    if (s->n_train < (uint64_t)global_batch) {
        uint64_t n = s->n_train;
        row_source_close(s);
        return errf(err, "%s: %llu %s to train on, fewer than one global batch (%d)", path, (unsigned long long)n,
                    packing ? "packed rows" : "records", global_batch);
    }
    if (eval_fraction > 0 && s->n_eval < (uint64_t)global_batch) {
        uint64_t n = s->n_eval;
        row_source_close(s);
        return errf(err, "%s: data.eval_fraction holds out %llu samples, fewer than one global batch (%d)", path,
                    (unsigned long long)n, global_batch);
    }
    s->seq_len = seq_len;
    s->global_batch = global_batch;
    s->seed = seed;
    s->shuffle = shuffle;
    s->epoch_len = s->n_train / (uint64_t)global_batch * (uint64_t)global_batch;
    s->perm = malloc(s->n_train * sizeof *s->perm);
    if (!s->perm) {
        row_source_close(s);
        return errf(err, "%s: out of memory for the sample order", path);
    }
    return 0;
}

void row_source_close(row_source *s) {
    tok_close(&s->cache);
    free(s->perm);
    free(s->row_start);
    free(s->train_idx);
    free(s->eval_idx);
    memset(s, 0, sizeof *s);
}

/* Fisher-Yates over every sample, driven by the (seed, epoch) stream; without shuffling,
 * file order. */
static void shuffle_epoch(row_source *s, int64_t epoch) {
    uint64_t n = s->n_train, stream = rng_stream(RNG_PURPOSE_SHUFFLE, (uint64_t)epoch);
    for (uint64_t i = 0; i < n; i++) s->perm[i] = s->train_idx[i];
    for (uint64_t i = n - 1; s->shuffle && i > 0; i--) {
        uint64_t j = rng_u64(s->seed, stream, i) % (i + 1);
        uint64_t t = s->perm[i];
        s->perm[i] = s->perm[j];
        s->perm[j] = t;
    }
    s->perm_epoch = epoch;
}

/* Sample `sample` into row i of b. */
static void fill_row(const row_source *s, uint64_t sample, int i, row_batch *b) {
    size_t at = (size_t)i * (size_t)s->seq_len;
    if (s->packing)
        row_fill_packed(&s->cache, s->row_start, sample, s->seq_len, b->input_ids + at,
                        b->labels + at, b->doc_start + at, b->doc_end + at);
    else
        row_fill_record(&s->cache, sample, s->seq_len, b->input_ids + at, b->labels + at);
}

/* Sample `sample` into b: row i, or pair i's rows 2i, 2i+1. */
static void fill_sample(const row_source *s, uint64_t sample, int i, row_batch *b) {
    if (!s->pairs) {
        fill_row(s, sample, i, b);
        return;
    }
    fill_row(s, 2 * sample, 2 * i, b);
    fill_row(s, 2 * sample + 1, 2 * i + 1, b);
}

void row_source_fill(row_source *s, uint64_t first, row_batch *b) {
    for (int i = 0; i < b->n / (s->pairs ? 2 : 1); i++) {
        uint64_t pos = first + (uint64_t)i;
        int64_t epoch = (int64_t)(pos / s->epoch_len);
        if (epoch != s->perm_epoch) shuffle_epoch(s, epoch);
        fill_sample(s, s->perm[pos % s->epoch_len], i, b);
    }
}

void row_source_fill_eval(row_source *s, uint64_t first, row_batch *b) {
    for (int i = 0; i < b->n / (s->pairs ? 2 : 1); i++)
        fill_sample(s, s->eval_idx[(first + (uint64_t)i) % s->n_eval], i, b);
}
