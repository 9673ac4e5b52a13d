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
 * k_cross_entropy calls.  This module is the host side (spans, weights, figures); the
 * passes themselves are worker/fsdp.c's (its "preference objectives" part).
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
#include "kernels/kernels.h"
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

/* The buffers for micro-batches of `rows` rows (kept while rows stays; c: the context's
 * memory for the span sums and, world > 1, the gathered figures). */
int fsdp_pref_buffers(fsdp_pref *p, kctx *c, int rows, int world, errbuf *err);
void fsdp_pref_free(fsdp_pref *p, kctx *c);
/* A preference batch's rows (labels [rows x T]) checked: each a prompt then a completion,
 * micro-batches of whole pairs; *nll_targets: ORPO's count of the chosen rows' targets. */
int fsdp_pref_check_rows(const int32_t *labels, int rows, int micro, int T, double *nll_targets, errbuf *err);
/* A micro-batch's targets (host, the shifted labels; ORPO: the chosen rows' prompts too, from
 * ids) and its spans. */
void fsdp_pref_targets(fsdp_pref *p, const int32_t *ids, const int32_t *labels, int rows, int T, int32_t *targets);
/* From host_sums (the policy's span sums) and ref (DPO): each pair's loss, each span's
 * dscale, the step's sums (stats) added. */
int fsdp_pref_weights(fsdp_pref *p, errbuf *err);
/* Every rank's stats (all[world x PREF_STATS]) into the step's figures out[PREF_STATS]. */
void fsdp_pref_means(const fsdp_pref *p, const double *all, int world, double *out);

#endif
