/* fsdp_pref: DPO and ORPO on chosen/rejected pairs; see fsdp_pref.h. */
#include "worker/fsdp_pref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "worker/fsdp.h"

/* log(sigmoid(x)), without overflow. */
static double log_sigmoid(double x) { return x < 0 ? x - log1p(exp(x)) : -log1p(exp(-x)); }
static double sigmoid(double x) { return exp(log_sigmoid(x)); }

/* Row b's completion: its first and last labelled positions (-1, -1: none). */
static void completion_of(const int32_t *labels, int T, int *first, int *last) {
    *first = *last = -1;
    for (int t = 0; t < T; t++)
        if (labels[t] != K_IGNORE_INDEX) {
            if (*first < 0) *first = t;
            *last = t;
        }
}

static int ensure_buffers(fsdp *f, int rows, errbuf *err) {
    fsdp_pref *p = &f->pref;
    if (p->rows == rows) return 0;
    fsdp_pref_free(f);
    p->spans = malloc(3 * (size_t)rows * sizeof *p->spans);
    p->n_completion = malloc((size_t)rows * sizeof *p->n_completion);
    p->ref = malloc((size_t)rows * sizeof *p->ref);
    p->host_sums = malloc(2 * (size_t)rows * sizeof *p->host_sums);
    if (!p->spans || !p->n_completion || !p->ref || !p->host_sums)
        return errf(err, "preference objective: out of host memory");
    if (!(p->sums = k_alloc(f->ctx, 2 * (size_t)rows * sizeof(float), err))) return -1;
    if (f->world > 1 && !p->gathered &&
        !(p->gathered = k_alloc(f->ctx, (size_t)f->world * PREF_STATS * sizeof(double), err)))
        return -1;
    p->rows = rows;
    return 0;
}

void fsdp_pref_free(fsdp *f) {
    fsdp_pref *p = &f->pref;
    free(p->spans);
    free(p->n_completion);
    free(p->ref);
    free(p->host_sums);
    if (p->sums) k_free(f->ctx, p->sums);
    p->spans = NULL, p->n_completion = NULL, p->ref = NULL, p->host_sums = NULL, p->sums = NULL;
    p->rows = 0;
}

/* Every rank's n doubles (mine), gathered in rank order into all[world x n]. */
static int gather_doubles(fsdp *f, const double *mine, int n, double *all, errbuf *err) {
    size_t bytes = (size_t)n * sizeof(double);
    if (f->world == 1) {
        memcpy(all, mine, bytes);
        return 0;
    }
    char *dev = f->pref.gathered;
    k_copy_h2d(f->ctx, dev + (size_t)f->rank * bytes, mine, bytes);
    comm_set_unit(f->comm, -1);
    if (k_sync(f->ctx, err) ||
        comm_all_gather(f->comm, dev + (size_t)f->rank * bytes, dev, bytes, COMM_BYTE, err))
        return -1;
    k_copy_d2h(f->ctx, all, dev, (size_t)f->world * bytes);
    return k_check(f->ctx, err);
}

int fsdp_pref_begin_step(fsdp *f, const fsdp_batch *b, errbuf *err) {
    fsdp_pref *p = &f->pref;
    int rows = b->n_micro * b->micro_batch;
    if (b->micro_batch % 2)
        return errf(err, "preference objective: a micro-batch of %d rows: pairs need an even count", b->micro_batch);
    if (b->doc_start) return errf(err, "preference objective: packed rows are not built yet");
    if (p->cfg.objective == JOB_OBJECTIVE_DPO && !f->has_lora)
        return errf(err, "train.objective dpo with a full fine-tune is not built yet (the frozen reference copy)");
    double mine[PREF_STATS] = {0};
    for (int r = 0; r < rows; r++) {
        int first, last;
        completion_of(b->labels + (size_t)r * b->T, b->T, &first, &last);
        if (first < 1)
            return errf(err, "preference objective: row %d has %s", r, first < 0 ? "no completion token" : "no prompt");
        if (r % 2 == 0) mine[0] += last; /* ORPO: the chosen row's targets, t = 0 .. last - 1 */
    }
    double *all = malloc((size_t)f->world * sizeof mine);
    if (!all || ensure_buffers(f, b->micro_batch, err)) {
        free(all);
        return all ? -1 : errf(err, "preference objective: out of host memory");
    }
    int rc = gather_doubles(f, mine, PREF_STATS, all, err);
    p->nll_count = 0;
    for (int r = 0; rc == 0 && r < f->world; r++) p->nll_count += all[(size_t)r * PREF_STATS];
    free(all);
    p->pairs = (double)rows / 2 * f->world;
    memset(p->stats, 0, sizeof p->stats);
    return rc;
}

static void add_span(fsdp_pref *p, int start, int n, int slot) {
    if (n > 0) p->spans[p->n_spans++] = (llama_span){.start = start, .n = n, .slot = slot};
}

/* Spans: DPO, each row one span (slot: the row); ORPO, a chosen row's prompt targets (slot
 * rows + row) then the rest (slot: the row).  Targets outside the completion are masked but
 * where ORPO's NLL reads the chosen prompt. */
int fsdp_pref_targets(fsdp *f, const fsdp_batch *b, int mb, int32_t *targets, errbuf *err) {
    fsdp_pref *p = &f->pref;
    int T = b->T, rows = b->micro_batch;
    const int32_t *ids = b->input_ids + (size_t)mb * rows * T, *labels = b->labels + (size_t)mb * rows * T;
    p->n_spans = 0;
    for (int r = 0; r < rows; r++) {
        int first, last;
        completion_of(labels + (size_t)r * T, T, &first, &last);
        p->n_completion[r] = last - first + 1;
        int32_t *tg = targets + (size_t)r * T;
        if (p->cfg.objective == JOB_OBJECTIVE_ORPO && r % 2 == 0) {
            for (int t = 0; t < first - 1; t++) tg[t] = ids[(size_t)r * T + t + 1];
            add_span(p, r * T, first - 1, rows + r);
            add_span(p, r * T + first - 1, T - first + 1, r);
        } else {
            add_span(p, r * T, T, r);
        }
    }
    (void)err;
    return 0;
}

/* The loss sums of every span of the uploaded micro-batch under the head, host_sums. */
static int span_sums(fsdp *f, const void *head_params, const void *embed, errbuf *err) {
    fsdp_pref *p = &f->pref;
    k_zero(f->ctx, p->sums, 2 * (size_t)p->rows * sizeof(float));
    llama_head_spans(f->ctx, &f->layout, head_params, NULL, embed, NULL, f->resid[f->layout.n_layers],
                     &f->head, &f->scratch, f->targets, f->B, f->T, p->spans, p->n_spans, p->sums, 0, NULL);
    k_copy_d2h(f->ctx, p->host_sums, p->sums, 2 * (size_t)p->rows * sizeof(float));
    return k_sync(f->ctx, err);
}

int fsdp_pref_reference(fsdp *f, errbuf *err) {
    const llama_layout *lo = &f->layout;
    kctx *c = f->ctx;
    int L = lo->n_layers, k = 0;
    void *adapters;
    const void *g = fsdp_gather_unit(f, LLAMA_EMBED_UNIT, f->plan[k++].slot, &adapters, err);
    if (!g) return -1;
    llama_embed_forward(c, lo, g, f->tokens, f->resid[0], f->B * f->T);
    for (int l = 0; l < L; l++) { /* the frozen base alone: the adapters off */
        if (!(g = fsdp_gather_unit(f, llama_layer_unit(l), f->plan[k++].slot, &adapters, err))) return -1;
        llama_layer_weights w = {.params = g, .layer = l};
        llama_layer_forward(c, lo, &w, f->inv_freq, NULL, f->resid[l], f->resid[l + 1], &f->layer_acts[l],
                            &f->scratch, f->B, f->T);
    }
    const void *embed = NULL;
    if (lo->cfg.tie_word_embeddings &&
        !(embed = fsdp_gather_unit(f, LLAMA_EMBED_UNIT, f->plan[k++].slot, &adapters, err)))
        return -1;
    if (!(g = fsdp_gather_unit(f, llama_head_unit(lo), f->plan[k].slot, &adapters, err)) ||
        span_sums(f, g, embed, err))
        return -1;
    for (int r = 0; r < f->pref.rows; r++) f->pref.ref[r] = f->pref.host_sums[r];
    return 0;
}

/* d(pair loss)/dz of DPO's sigmoid and robust losses, and the loss. */
static double dpo_z_loss(const fsdp_pref_config *c, double z, double *dz) {
    double e = c->label_smoothing;
    if (c->loss == JOB_DPO_ROBUST) {
        *dz = (-(1 - e) * sigmoid(-z) - e * sigmoid(z)) / (1 - 2 * e);
        return (-(1 - e) * log_sigmoid(z) + e * log_sigmoid(-z)) / (1 - 2 * e);
    }
    *dz = -(1 - e) * sigmoid(-z) + e * sigmoid(z);
    return -(1 - e) * log_sigmoid(z) - e * log_sigmoid(-z);
}

/* DPO pair i: the weights of its rows' loss sums (d loss / d CE sum), its sums added. */
static void dpo_pair(fsdp_pref *p, int i, double *wc, double *wr) {
    const fsdp_pref_config *c = &p->cfg;
    double pc = -p->host_sums[2 * i], pr = -p->host_sums[2 * i + 1];
    double rc = -p->ref[2 * i], rr = -p->ref[2 * i + 1], b = c->beta, loss, dpc, dpr;
    if (c->loss == JOB_DPO_IPO) {
        double nc = p->n_completion[2 * i], nr = p->n_completion[2 * i + 1];
        double h = (pc - rc) / nc - (pr - rr) / nr - 1 / (2 * b);
        loss = h * h;
        dpc = 2 * h / nc, dpr = -2 * h / nr;
    } else {
        double dz;
        loss = dpo_z_loss(c, b * ((pc - rc) - (pr - rr)), &dz);
        dpc = b * dz, dpr = -b * dz;
    }
    *wc = -dpc / p->pairs, *wr = -dpr / p->pairs; /* CE sum = -log-prob */
    double *s = p->stats, rew_c = b * (pc - rc), rew_r = b * (pr - rr);
    s[PREF_LOSS] += loss / p->pairs;
    s[PREF_REWARD_CHOSEN] += rew_c, s[PREF_REWARD_REJECTED] += rew_r;
    s[PREF_ACCURACY] += rew_c > rew_r;
    s[PREF_LOGPS_CHOSEN] += pc, s[PREF_LOGPS_REJECTED] += pr;
}

/* f(a) = a - log(1 - e^a), the log-odds of a mean log-prob a < 0; f'(a) = 1 / (1 - e^a). */
static double log_odds(double a) { return a - log1p(-exp(a)); }

/* ORPO pair i: the weights of its rows' completion sums (the NLL's share aside). */
static void orpo_pair(fsdp_pref *p, int i, double *wc, double *wr) {
    double lam = p->cfg.beta, nc = p->n_completion[2 * i], nr = p->n_completion[2 * i + 1];
    double ac = -p->host_sums[2 * i] / nc, ar = -p->host_sums[2 * i + 1] / nr;
    double lo = log_odds(ac) - log_odds(ar), dlo = -lam * sigmoid(-lo) / p->pairs;
    double dac = dlo / -expm1(ac), dar = -dlo / -expm1(ar);
    *wc = -dac / nc, *wr = -dar / nr;
    double *s = p->stats, nll = (p->host_sums[2 * i] + p->host_sums[p->rows + 2 * i]) / p->nll_count;
    s[PREF_LOSS] += nll - lam * log_sigmoid(lo) / p->pairs;
    s[PREF_NLL] += nll;
    s[PREF_LOG_ODDS_RATIO] += log_sigmoid(lo), s[PREF_LOG_ODDS_CHOSEN] += lo;
    s[PREF_REWARD_CHOSEN] += lam * ac, s[PREF_REWARD_REJECTED] += lam * ar;
    s[PREF_ACCURACY] += ac > ar;
    s[PREF_LOGPS_CHOSEN] += ac, s[PREF_LOGPS_REJECTED] += ar;
}

int fsdp_pref_head(fsdp *f, const void *head_params, float *head_grads, const void *embed, float *embed_grads,
                   errbuf *err) {
    fsdp_pref *p = &f->pref;
    if (span_sums(f, head_params, embed, err)) return -1;
    double *w = malloc(2 * (size_t)p->rows * sizeof *w);
    if (!w) return errf(err, "preference objective: out of host memory");
    int orpo = p->cfg.objective == JOB_OBJECTIVE_ORPO;
    for (int i = 0; i < p->rows / 2; i++) {
        if (orpo) orpo_pair(p, i, &w[2 * i], &w[2 * i + 1]);
        else dpo_pair(p, i, &w[2 * i], &w[2 * i + 1]);
        w[p->rows + 2 * i] = orpo ? 1.0 / p->nll_count : 0; /* the chosen prompt's NLL */
    }
    for (int s = 0; s < p->n_spans; s++) {
        llama_span *q = &p->spans[s];
        q->dscale = (float)(w[q->slot] + (orpo && q->slot < p->rows && q->slot % 2 == 0 ? w[p->rows + q->slot] : 0));
    }
    free(w);
    llama_head_spans(f->ctx, &f->layout, head_params, head_grads, embed, embed_grads, f->resid[f->layout.n_layers],
                     &f->head, &f->scratch, f->targets, f->B, f->T, p->spans, p->n_spans, p->sums, 1, f->dresid);
    return 0;
}

int fsdp_pref_end_step(fsdp *f, double *out, errbuf *err) {
    fsdp_pref *p = &f->pref;
    double *all = malloc((size_t)f->world * sizeof p->stats);
    if (!all) return errf(err, "preference objective: out of host memory");
    int rc = gather_doubles(f, p->stats, PREF_STATS, all, err);
    for (int i = 0; i < PREF_STATS; i++) {
        out[i] = 0;
        for (int r = 0; rc == 0 && r < f->world; r++) out[i] += all[(size_t)r * PREF_STATS + i];
        if (i != PREF_LOSS && i != PREF_NLL) out[i] /= p->pairs; /* those two are normalised already */
    }
    free(all);
    return rc;
}
