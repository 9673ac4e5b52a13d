/* fsdp_pref: DPO and ORPO on chosen/rejected pairs; see fsdp_pref.h. */
#include "worker/fsdp_pref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>


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

int fsdp_pref_buffers(fsdp_pref *p, kctx *c, int rows, int world, errbuf *err) {
    if (p->rows == rows) return 0;
    fsdp_pref_free(p, c);
    p->spans = malloc(3 * (size_t)rows * sizeof *p->spans);
    p->n_completion = malloc((size_t)rows * sizeof *p->n_completion);
    p->ref = malloc((size_t)rows * sizeof *p->ref);
    p->host_sums = malloc(2 * (size_t)rows * sizeof *p->host_sums);
    if (!p->spans || !p->n_completion || !p->ref || !p->host_sums)
        return errf(err, "preference objective: out of host memory");
    if (!(p->sums = k_alloc(c, 2 * (size_t)rows * sizeof(float), err))) return -1;
    if (world > 1 && !p->gathered && !(p->gathered = k_alloc(c, (size_t)world * PREF_STATS * sizeof(double), err)))
        return -1;
    p->rows = rows;
    return 0;
}

void fsdp_pref_free(fsdp_pref *p, kctx *c) {
    free(p->spans);
    free(p->n_completion);
    free(p->ref);
    free(p->host_sums);
    if (p->sums) k_free(c, p->sums);
    p->spans = NULL, p->n_completion = NULL, p->ref = NULL, p->host_sums = NULL, p->sums = NULL;
    p->rows = 0;
}

int fsdp_pref_check_rows(const int32_t *labels, int rows, int micro, int T, double *nll_targets, errbuf *err) {
    if (micro % 2)
        return errf(err, "preference objective: a micro-batch of %d rows: pairs need an even count", micro);
    *nll_targets = 0;
    for (int r = 0; r < rows; r++) {
        int first, last;
        completion_of(labels + (size_t)r * T, T, &first, &last);
        if (first < 1)
            return errf(err, "preference objective: row %d has %s", r, first < 0 ? "no completion token" : "no prompt");
        if (r % 2 == 0) *nll_targets += last; /* the chosen row's targets t = 0 .. last - 1 */
    }
    return 0;
}

static void add_span(fsdp_pref *p, int start, int n, int slot) {
    if (n > 0) p->spans[p->n_spans++] = (llama_span){.start = start, .n = n, .slot = slot};
}

/* Spans: DPO, each row one span (slot: the row); ORPO, a chosen row's prompt targets (slot
 * rows + row) then the rest (slot: the row).  Targets outside the completion are masked but
 * where ORPO's NLL reads the chosen prompt. */
void fsdp_pref_targets(fsdp_pref *p, const int32_t *ids, const int32_t *labels, int rows, int T, int32_t *targets) {
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

int fsdp_pref_weights(fsdp_pref *p, errbuf *err) {
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
    return 0;
}

void fsdp_pref_means(const fsdp_pref *p, const double *all, int world, double *out) {
    for (int i = 0; i < PREF_STATS; i++) {
        out[i] = 0;
        for (int r = 0; r < world; r++) out[i] += all[(size_t)r * PREF_STATS + i];
        if (i != PREF_LOSS && i != PREF_NLL) out[i] /= p->pairs; /* those two are normalised already */
    }
}
