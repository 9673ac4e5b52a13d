/* llama_generate: the sampler and the decoding loop (see llama_generate.h). */
#include "model/llama_generate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "proto/rng.h"

int gen_sampling_check(const gen_sampling *s, errbuf *err) {
    if (s->greedy) return 0;
    if (!(s->temperature > 0) || !isfinite(s->temperature))
        return errf(err, "--temperature %g: sampling needs a temperature above 0 (--greedy for "
                         "the argmax)", s->temperature);
    if (!(s->top_p > 0 && s->top_p <= 1))
        return errf(err, "--top-p %g is not in (0, 1]", s->top_p);
    if (s->top_k < 0) return errf(err, "--top-k %d is negative (0 turns it off)", s->top_k);
    return 0;
}

static int32_t argmax(const float *x, int V) {
    int32_t best = 0;
    for (int i = 1; i < V; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* Larger logit first; equal logits by index. */
static int by_logit_desc(const void *a, const void *b, void *arg) {
    const float *x = arg;
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    if (x[i] != x[j]) return x[i] > x[j] ? -1 : 1;
    return (i > j) - (i < j);
}

/* Fills order with the indices by descending logit and probs with the distribution; returns
 * how many of order's first tokens it keeps. */
static int distribution(const gen_sampling *s, const float *logits, int V, double *probs,
                        int32_t *order) {
    for (int i = 0; i < V; i++) order[i] = i;
    qsort_r(order, (size_t)V, sizeof *order, by_logit_desc, (void *)logits);
    memset(probs, 0, (size_t)V * sizeof *probs);
    int kept = V;
    if (s->top_k > 0 && s->top_k < V) { /* transformers keeps every logit >= the k-th */
        kept = s->top_k;
        while (kept < V && logits[order[kept]] == logits[order[s->top_k - 1]]) kept++;
    }
    double top = (double)logits[order[0]] / s->temperature, sum = 0.0;
    for (int r = 0; r < kept; r++)
        sum += probs[order[r]] = exp((double)logits[order[r]] / s->temperature - top);
    if (s->top_p < 1) { /* keep rank r while the mass before it is below top_p */
        double before = 0.0;
        int r = 0;
        while (r < kept && (r == 0 || before < s->top_p)) before += probs[order[r++]] / sum;
        for (int q = r; q < kept; q++) probs[order[q]] = 0.0;
        kept = r;
        sum = 0.0;
        for (int q = 0; q < kept; q++) sum += probs[order[q]];
    }
    for (int r = 0; r < kept; r++) probs[order[r]] /= sum;
    return kept;
}

void gen_distribution(const gen_sampling *s, const float *logits, int V, double *probs,
                      int32_t *order) {
    if (!s->greedy) {
        distribution(s, logits, V, probs, order);
        return;
    }
    memset(probs, 0, (size_t)V * sizeof *probs);
    probs[argmax(logits, V)] = 1.0;
}

int32_t gen_pick(const gen_sampling *s, const float *logits, int V, double u, double *probs,
                 int32_t *order) {
    if (s->greedy) return argmax(logits, V);
    int kept = distribution(s, logits, V, probs, order);
    double cum = 0.0;
    for (int r = 0; r < kept - 1; r++)
        if (u < (cum += probs[order[r]])) return order[r];
    return order[kept - 1];
}

const char *gen_stop_name(gen_stop s) {
    return s == GEN_STOP_ID ? "stop" : s == GEN_STOP_LENGTH ? "length" : "positions";
}

void gen_replies_free(gen_reply *replies, int n) {
    for (int i = 0; replies && i < n; i++) free(replies[i].ids);
}

static int is_stop(const gen_options *o, int32_t id) {
    for (int i = 0; i < o->n_stop; i++)
        if (o->stop_ids[i] == id) return 1;
    return 0;
}

typedef struct run {
    const gen_model *m;
    const gen_options *o;
    float *logits;   /* [rows, V] */
    double *probs;   /* [V] */
    int32_t *order;  /* [V] */
    int32_t *feed, *pos; /* [rows] */
} run;

/* Picks prompt i's next token from its logits (row b), appends it to r and says whether the
 * row stops; *rc gets on_token's refusal. */
static int next_token(run *R, int i, int b, gen_reply *r, int next_pos, int *rc) {
    const gen_options *o = R->o;
    int V = R->m->vocab_size;
    double u = rng_uniform(o->sampling.seed, rng_stream(RNG_PURPOSE_SAMPLE, (uint64_t)i), (uint64_t)r->n);
    int32_t id = gen_pick(&o->sampling, R->logits + (size_t)b * V, V, u, R->probs, R->order);
    r->ids[r->n++] = id;
    if (o->on_token && (*rc = o->on_token(o->user, i, id))) return 1;
    if (is_stop(o, id)) r->stop = GEN_STOP_ID;
    else if (r->n >= o->max_new_tokens) r->stop = GEN_STOP_LENGTH;
    else if (next_pos >= R->m->max_positions) r->stop = GEN_STOP_POSITIONS;
    return r->stop != 0;
}

/* Prompts first .. first+G-1 in rows 0 .. G-1. */
static int run_group(run *R, const gen_prompt *prompts, int first, int G, gen_reply *replies,
                     errbuf *err) {
    const gen_model *m = R->m;
    int rc = 0, active = 0;
    for (int b = 0; b < G; b++) {
        const gen_prompt *p = &prompts[first + b];
        int32_t zero = 0;
        if (m->forward(m->self, b, 1, p->n, p->ids, &zero, R->logits + (size_t)b * m->vocab_size, err))
            return errprefix(err, "prompt %d", first + b);
        R->pos[b] = p->n;
        if (!next_token(R, first + b, b, &replies[first + b], p->n, &rc)) active++;
        if (rc) return rc;
    }
    while (active > 0) {
        for (int b = 0; b < G; b++) { /* a stopped row runs too (at position 0), unread */
            gen_reply *r = &replies[first + b];
            R->feed[b] = r->stop ? 0 : r->ids[r->n - 1];
            R->pos[b] = r->stop ? 0 : R->pos[b];
        }
        if (m->forward(m->self, 0, G, 1, R->feed, R->pos, R->logits, err))
            return errprefix(err, "prompts %d .. %d", first, first + G - 1);
        for (int b = 0; b < G; b++) {
            if (replies[first + b].stop) continue;
            R->pos[b]++;
            if (next_token(R, first + b, b, &replies[first + b], R->pos[b], &rc)) active--;
            if (rc) return rc;
        }
    }
    return 0;
}

int gen_run(const gen_model *m, const gen_prompt *prompts, int n, const gen_options *o,
            gen_reply *replies, errbuf *err) {
    memset(replies, 0, (size_t)n * sizeof *replies);
    if (o->max_new_tokens < 1) return errf(err, "max_new_tokens %d: at least 1", o->max_new_tokens);
    if (gen_sampling_check(&o->sampling, err)) return -1;
    for (int i = 0; i < n; i++) {
        if (prompts[i].n < 1) return errf(err, "prompt %d is empty", i);
        if (prompts[i].n > m->max_positions)
            return errf(err, "prompt %d has %d tokens, more than the model's %d positions "
                             "(max_position_embeddings)", i, prompts[i].n, m->max_positions);
    }
    size_t V = (size_t)m->vocab_size, rows = (size_t)m->rows;
    run R = {.m = m, .o = o, .logits = malloc(rows * V * sizeof(float)),
             .probs = malloc(V * sizeof(double)), .order = malloc(V * sizeof(int32_t)),
             .feed = malloc(rows * sizeof(int32_t)), .pos = malloc(rows * sizeof(int32_t))};
    int rc = R.logits && R.probs && R.order && R.feed && R.pos ? 0 : errf(err, "out of memory");
    for (int i = 0; rc == 0 && i < n; i++)
        if (!(replies[i].ids = malloc((size_t)o->max_new_tokens * sizeof(int32_t))))
            rc = errf(err, "out of memory");
    for (int first = 0; rc == 0 && first < n; first += m->rows)
        rc = run_group(&R, prompts, first, n - first < m->rows ? n - first : m->rows, replies, err);
    free(R.logits);
    free(R.probs);
    free(R.order);
    free(R.feed);
    free(R.pos);
    if (rc) gen_replies_free(replies, n);
    return rc;
}
