#include "worker/data.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "proto/rng.h"

/* Sample i is held out when floor((i+1) f) > floor(i f): a share f, spread evenly. */
static int split_eval(data_loader *d, double f, errbuf *err) {
    d->train_idx = malloc(d->n_samples * sizeof *d->train_idx);
    d->eval_idx = malloc((f > 0 ? d->n_samples : 1) * sizeof *d->eval_idx);
    if (!d->train_idx || !d->eval_idx) return errf(err, "out of memory for the sample split");
    for (uint64_t i = 0; i < d->n_samples; i++) {
        int held = f > 0 && floor((double)(i + 1) * f) > floor((double)i * f);
        if (held) d->eval_idx[d->n_eval++] = i;
        else d->train_idx[d->n_train++] = i;
    }
    return 0;
}

int data_open(data_loader *d, const char *path, int seq_len, int global_batch, uint64_t seed,
              bool shuffle, bool packing, double eval_fraction, int vocab_size, errbuf *err) {
    memset(d, 0, sizeof *d);
    d->perm_epoch = -1;
    if (tok_open(&d->cache, path, err)) return -1;
    if (d->cache.vocab_size > (uint32_t)vocab_size) {
        uint32_t v = d->cache.vocab_size;
        data_close(d);
        return errf(err, "%s: token ids up to %u do not fit the model's vocabulary of %d", path,
                    v - 1, vocab_size);
    }
    d->packing = packing;
    d->n_samples = d->cache.n_records;
    if (packing && tok_pack(&d->cache, seq_len, &d->row_start, &d->n_samples, &d->real_tokens, err)) {
        data_close(d);
        return -1;
    }
    if (split_eval(d, eval_fraction, err)) {
        data_close(d);
        return errprefix(err, "%s", path);
    }
    if (d->n_train < (uint64_t)global_batch) {
        uint64_t n = d->n_train;
        data_close(d);
        return errf(err, "%s: %llu %s to train on, fewer than one global batch (%d)", path, (unsigned long long)n,
                    packing ? "packed rows" : "records", global_batch);
    }
    if (eval_fraction > 0 && d->n_eval < (uint64_t)global_batch) {
        uint64_t n = d->n_eval;
        data_close(d);
        return errf(err, "%s: data.eval_fraction holds out %llu samples, fewer than one global batch (%d)", path,
                    (unsigned long long)n, global_batch);
    }
    d->seq_len = seq_len;
    d->global_batch = global_batch;
    d->seed = seed;
    d->shuffle = shuffle;
    d->epoch_len = d->n_train / (uint64_t)global_batch * (uint64_t)global_batch;
    d->perm = malloc(d->n_train * sizeof *d->perm);
    if (!d->perm) {
        data_close(d);
        return errf(err, "%s: out of memory for the sample order", path);
    }
    return 0;
}

void data_close(data_loader *d) {
    tok_close(&d->cache);
    free(d->perm);
    free(d->row_start);
    free(d->train_idx);
    free(d->eval_idx);
    memset(d, 0, sizeof *d);
}

/* Fisher-Yates over every sample, driven by the (seed, epoch) stream; without shuffling,
 * file order. */
static void shuffle_epoch(data_loader *d, int64_t epoch) {
    uint64_t n = d->n_train, stream = rng_stream(RNG_PURPOSE_SHUFFLE, (uint64_t)epoch);
    for (uint64_t i = 0; i < n; i++) d->perm[i] = d->train_idx[i];
    for (uint64_t i = n - 1; d->shuffle && i > 0; i--) {
        uint64_t j = rng_u64(d->seed, stream, i) % (i + 1);
        uint64_t t = d->perm[i];
        d->perm[i] = d->perm[j];
        d->perm[j] = t;
    }
    d->perm_epoch = epoch;
}

static void fill_sample(data_loader *d, uint64_t sample, size_t at, int32_t *input_ids, int32_t *labels,
                        int32_t *positions) {
    if (d->packing)
        tok_packed_row(&d->cache, d->row_start, sample, d->seq_len, input_ids + at, labels + at, positions + at);
    else
        tok_sample(&d->cache, sample, d->seq_len, input_ids + at, labels + at);
}

void data_fill(data_loader *d, uint64_t first, int n, int32_t *input_ids, int32_t *labels, int32_t *positions) {
    for (int i = 0; i < n; i++) {
        uint64_t pos = first + (uint64_t)i;
        int64_t epoch = (int64_t)(pos / d->epoch_len);
        if (epoch != d->perm_epoch) shuffle_epoch(d, epoch);
        fill_sample(d, d->perm[pos % d->epoch_len], (size_t)i * d->seq_len, input_ids, labels, positions);
    }
}

void data_fill_eval(data_loader *d, uint64_t first, int n, int32_t *input_ids, int32_t *labels, int32_t *positions) {
    for (int i = 0; i < n; i++)
        fill_sample(d, d->eval_idx[(first + (uint64_t)i) % d->n_eval], (size_t)i * d->seq_len, input_ids, labels,
                    positions);
}
