/* data: which samples a step trains on.
 *
 * The job reads a token cache (proto/tokens.h).  Samples are addressed by a global position
 * (samples consumed by the whole job): step s takes positions [s*G, (s+1)*G) for the global
 * batch G, and rank r of W takes the r-th G/W of them.  An epoch is the largest multiple of
 * G that fits in the records; each epoch visits them in an order shuffled by a seeded
 * permutation keyed by (seed, epoch) (or in file order, without data.shuffle), so every
 * rank, any world size and a resumed run see the same samples at the same positions.
 * With packing a sample is a packed row (proto/tokens.h, tok_pack: records placed whole, in
 * file order, positions restarting at each), so the same holds of rows.  data.eval_fraction
 * f holds out sample i when floor((i+1) f) > floor(i f): by index, so the split is the same
 * at any world size and after a resume; the epochs are of the rest. */
#ifndef FSDP_DATA_H
#define FSDP_DATA_H

#include <stdbool.h>
#include <stdint.h>

#include "base/errbuf.h"
#include "proto/tokens.h"

typedef struct data_loader {
    tok_cache cache;
    int seq_len;
    int global_batch;
    uint64_t seed;
    bool shuffle;       /* false: every epoch in file order */
    bool packing;       /* samples are packed rows (row_start), else records */
    uint64_t *row_start; /* [n_samples + 1] with packing */
    uint64_t n_samples;
    uint64_t real_tokens; /* with packing: the tokens the rows hold */
    uint64_t *train_idx;  /* [n_train]: the samples trained on, in sample order */
    uint64_t n_train;
    uint64_t *eval_idx;   /* [n_eval]: the samples held out (data.eval_fraction) */
    uint64_t n_eval;
    uint64_t epoch_len; /* samples per epoch: a multiple of global_batch */
    int64_t perm_epoch; /* the epoch perm holds, -1 for none */
    uint64_t *perm;     /* [n_train] */
} data_loader;

/* Opens the cache (packing its records into rows with packing) and checks it fits the
 * model (ids below vocab) and holds at least one global batch. */
int data_open(data_loader *d, const char *path, int seq_len, int global_batch, uint64_t seed,
              bool shuffle, bool packing, double eval_fraction, int vocab_size, errbuf *err);
void data_close(data_loader *d);
static inline uint64_t data_steps_per_epoch(const data_loader *d) {
    return d->epoch_len / (uint64_t)d->global_batch;
}
/* Fills n samples starting at global position first: input_ids and labels [n, seq_len], and
 * with packing their positions (else positions is not touched and may be NULL). */
void data_fill(data_loader *d, uint64_t first, int n, int32_t *input_ids, int32_t *labels, int32_t *positions);
/* The held-out samples first .. first+n-1 (eval order), as data_fill fills them. */
void data_fill_eval(data_loader *d, uint64_t first, int n, int32_t *input_ids, int32_t *labels, int32_t *positions);
/* Held-out samples an evaluation covers: whole global batches of them. */
static inline uint64_t data_eval_batches(const data_loader *d) {
    return d->n_eval / (uint64_t)d->global_batch;
}

#endif
