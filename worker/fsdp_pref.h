/* fsdp_pref: preference objectives (train.objective dpo, orpo) on chosen/rejected pairs, as
 * TRL's DPOTrainer and ORPOTrainer compute them (tests/fixtures/dpo: the golden).
 *
 * A preference batch holds pairs: rows 2i (prompt + chosen) and 2i+1 (prompt + rejected) of
 * every micro-batch, the labels on the completion only (each row: its prompt, then its
 * completion, then padding).  A micro-batch holds whole pairs, so everything a pair's loss
 * needs is on one rank, and its gradient weights are computed between the head's forward
 * and its backward: the head runs over spans of tokens (model/llama.h's llama_head_spans),
 * each sequence's summed completion log-probabilities read back, each span's weight set from
 * them, then the head's backward with those weights.  No new kernel: the spans are
 * k_cross_entropy calls.
 *
 * DPO: per pair z = beta ((pc - rc) - (pr - rr)), p and r the summed completion log-probs
 * under the policy and the reference; sigmoid -(1-e) logsig(z) - e logsig(-z) (e =
 * train.dpo_label_smoothing), robust (-(1-e) logsig(z) + e logsig(-z)) / (1-2e), ipo
 * (dc/nc - dr/nr - 1/(2 beta))^2 with per-token means.  The reference is the policy with its
 * adapters off, run forward once per micro-batch without gradients (adapter jobs only).
 * ORPO: the NLL of the chosen rows over every target after the first token (prompt
 * included, TRL's) normalised by the global batch's count of them, minus lambda times the
 * mean over pairs of logsig(log_odds), log_odds = (ac - ar) - (log(1-e^ac) - log(1-e^ar)),
 * a the per-token mean completion log-prob.  Every loss is a mean over the global batch's
 * pairs: the same at any world size and micro-batch split. */
#ifndef FSDP_FSDP_PREF_H
#define FSDP_FSDP_PREF_H

#include "base/errbuf.h"
#include "model/llama.h"
#include "proto/job.h"


typedef struct fsdp_pref_config {
    job_objective objective;
    job_dpo_loss loss;
    double beta;            /* DPO's beta, ORPO's lambda */
    double label_smoothing; /* DPO sigmoid and robust */
} fsdp_pref_config;

/* A step's figures as TRL logs them (means over the global batch's pairs); nll_loss,
 * log_odds_ratio and log_odds_chosen are ORPO's. */
enum {
    PREF_LOSS, PREF_REWARD_CHOSEN, PREF_REWARD_REJECTED, PREF_ACCURACY, PREF_LOGPS_CHOSEN,
    PREF_LOGPS_REJECTED, PREF_NLL, PREF_LOG_ODDS_RATIO, PREF_LOG_ODDS_CHOSEN, PREF_STATS
};

typedef struct fsdp_pref {
    fsdp_pref_config cfg;
    double pairs;              /* the global batch's pairs this step */
    double nll_count;          /* ORPO: the global count of the chosen rows' targets */
    double stats[PREF_STATS];  /* this rank's sums this step */
    int rows;                  /* the micro-batch's rows the buffers hold */
    llama_span *spans;         /* [3 rows] host: the micro-batch's spans */
    int n_spans;
    int *n_completion;         /* [rows] completion targets of each row */
    float *ref;                /* [rows] DPO: each row's reference loss sum (host) */
    float *sums;               /* [2 rows] context memory: span loss sums */
    float *host_sums;          /* [2 rows] */
    void *gathered;            /* [world x PREF_STATS] doubles, context memory */
} fsdp_pref;

struct fsdp;
struct fsdp_batch;

/* Checks a preference batch and readies the step: the global pair count and ORPO's token
 * count (a collective); the step's sums zeroed. */
int fsdp_pref_begin_step(struct fsdp *f, const struct fsdp_batch *b, errbuf *err);
/* Micro-batch mb's targets (host, shifted labels; ORPO: the chosen rows' whole sequences)
 * and spans; targets is [micro_batch x T]. */
int fsdp_pref_targets(struct fsdp *f, const struct fsdp_batch *b, int mb, int32_t *targets, errbuf *err);
/* DPO: the reference's loss sums of the uploaded micro-batch (adapters off, no gradients). */
int fsdp_pref_reference(struct fsdp *f, errbuf *err);
/* The head of the policy's pass: its forward over the spans, the weights, its backward. */
int fsdp_pref_head(struct fsdp *f, const void *head_params, float *head_grads, const void *embed,
                   float *embed_grads, errbuf *err);
/* After the micro-batches: every rank's sums gathered into out[PREF_STATS] (global means). */
int fsdp_pref_end_step(struct fsdp *f, double *out, errbuf *err);
void fsdp_pref_free(struct fsdp *f);

#endif
