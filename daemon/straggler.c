/* straggler: see straggler.h. */
#include "daemon/straggler.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* A slow rank's excess must be at least this share of the median step to count. */
#define MIN_EXCESS 0.05

typedef struct rank_state {
    int seen, node;
    long long steps;                  /* at the previous look */
    double step_s, comm_s, data_s;
    /* per step since the previous look (this look's sample) */
    int sampled;
    long long d_steps;
    double own, data, comm, step;
    double med_own, med_data, med_comm, med_step; /* the other ranks' medians */
    long long slow_steps; /* in a row */
    int named;
    const char *phase;
} rank_state;

struct straggler_watch {
    double factor;
    int need;
    rank_state *r;
    int n; /* ranks [0, n) have a slot */
};

straggler_watch *straggler_watch_new(double factor, int steps) {
    straggler_watch *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->factor = factor;
    w->need = steps;
    return w;
}

void straggler_watch_free(straggler_watch *w) {
    if (!w) return;
    free(w->r);
    free(w);
}

static int grow(straggler_watch *w, int rank) {
    if (rank < w->n) return 0;
    int n = rank + 1 > 2 * w->n ? rank + 1 : 2 * w->n;
    rank_state *r = realloc(w->r, (size_t)n * sizeof *r);
    if (!r) return -1;
    memset(r + w->n, 0, (size_t)(n - w->n) * sizeof *r);
    w->r = r;
    w->n = n;
    return 0;
}

static double number(const json_t *o, const char *key) { return json_number_value(json_object_get(o, key)); }

/* The rank's figures since its previous look: 1 when it stepped since. */
static int sample(straggler_watch *w, const json_t *row) {
    const json_t *t = json_object_get(row, "timing"), *rank = json_object_get(row, "rank");
    if (!json_is_object(t) || !json_is_integer(rank) || json_integer_value(rank) < 0 ||
        json_integer_value(rank) >= (1 << 20) || grow(w, (int)json_integer_value(rank)))
        return 0;
    rank_state *r = &w->r[json_integer_value(rank)];
    long long steps = json_integer_value(json_object_get(t, "steps"));
    double step_s = number(t, "step_s"), comm_s = number(t, "comm_s"), data_s = number(t, "data_s");
    r->node = (int)json_integer_value(json_object_get(row, "node"));
    int fresh = !r->seen || steps < r->steps; /* a new run counts from 0 again */
    long long d = steps - r->steps;
    if (!fresh && d > 0) {
        r->d_steps = d;
        r->step = (step_s - r->step_s) / (double)d;
        r->comm = (comm_s - r->comm_s) / (double)d;
        r->data = (data_s - r->data_s) / (double)d;
        r->own = r->step - r->comm;
        if (r->own < 0) r->own = 0; /* device time of collectives that overlapped the step's end */
        if (r->data > r->own) r->data = r->own;
        r->sampled = 1;
    }
    if (fresh || d > 0) {
        r->seen = 1;
        r->steps = steps, r->step_s = step_s, r->comm_s = comm_s, r->data_s = data_s;
    }
    return r->sampled;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of sorted[0, n) with one element equal to v taken out: the others' median. */
static double median_without(const double *sorted, int n, double v) {
    int lo = 0, hi = n - 1;
    while (lo < hi) { /* the first index of v */
        int mid = (lo + hi) / 2;
        if (sorted[mid] < v) lo = mid + 1;
        else hi = mid;
    }
    int m = n - 1;
#define AT(k) sorted[(k) < lo ? (k) : (k) + 1]
    double med = m % 2 ? AT(m / 2) : (AT(m / 2 - 1) + AT(m / 2)) / 2;
#undef AT
    return med;
}

/* Each sampled rank's field `off` (a double in rank_state), sorted, into out. */
static void sorted_values(const straggler_watch *w, size_t off, double *out) {
    int n = 0;
    for (int i = 0; i < w->n; i++)
        if (w->r[i].sampled) out[n++] = *(const double *)((const char *)&w->r[i] + off);
    qsort(out, (size_t)n, sizeof *out, by_value);
}

/* Slow in its own time on this look, and in which phase (NULL: not). */
static const char *own_phase(const straggler_watch *w, const rank_state *r) {
    if (!(r->own > w->factor * r->med_own && r->own - r->med_own > MIN_EXCESS * r->med_step)) return NULL;
    double data_excess = r->data - r->med_data;
    double compute_excess = (r->own - r->data) - (r->med_own - r->med_data);
    return data_excess > compute_excess ? "data" : "compute";
}

/* Slow in its collectives while every rank's own time is even (the others' waits are then
 * not a slow rank's doing): its link. */
static int collective_slow(const straggler_watch *w, const rank_state *r) {
    return r->comm > w->factor * r->med_comm && r->comm - r->med_comm > MIN_EXCESS * r->med_step;
}

static void add_line(json_t *news, const straggler_watch *w, int rank, const rank_state *r) {
    char line[512];
    if (!r->named)
        snprintf(line, sizeof line, "rank %d on node %d is no longer a straggler: %.3f s a step of its own against "
                 "the other ranks' median %.3f s", rank, r->node, r->own, r->med_own);
    else if (!strcmp(r->phase, "collective"))
        snprintf(line, sizeof line, "rank %d on node %d is a straggler: %.3f s a step in collectives against the "
                 "other ranks' median %.3f s (its own time %.3f s, theirs %.3f s), %.3f s a step in all, for %lld "
                 "steps (runtime.straggler_factor %g): phase collective", rank, r->node, r->comm, r->med_comm,
                 r->own, r->med_own, r->step, r->slow_steps, w->factor);
    else
        snprintf(line, sizeof line, "rank %d on node %d is a straggler: %.3f s a step of its own (compute %.3f s, "
                 "data %.3f s) against the other ranks' median %.3f s, %.3f s a step in all, for %lld steps "
                 "(runtime.straggler_factor %g): phase %s", rank, r->node, r->own, r->own - r->data, r->data,
                 r->med_own, r->step, r->slow_steps, w->factor, r->phase);
    json_array_append_new(news, json_string(line));
}

/* Every sampled rank's figures against the others' medians. */
static int set_medians(straggler_watch *w, int n) {
    static const size_t field[4] = {offsetof(rank_state, own), offsetof(rank_state, data), offsetof(rank_state, comm),
                                    offsetof(rank_state, step)};
    static const size_t median[4] = {offsetof(rank_state, med_own), offsetof(rank_state, med_data),
                                     offsetof(rank_state, med_comm), offsetof(rank_state, med_step)};
    double *sorted = malloc((size_t)n * sizeof *sorted);
    if (!sorted) return -1;
    for (int f = 0; f < 4; f++) {
        sorted_values(w, field[f], sorted);
        for (int k = 0; k < w->n; k++) {
            rank_state *r = &w->r[k];
            if (r->sampled)
                *(double *)((char *)r + median[f]) = median_without(sorted, n, *(double *)((char *)r + field[f]));
        }
    }
    free(sorted);
    return 0;
}

json_t *straggler_watch_look(straggler_watch *w, const json_t *ranks) {
    json_t *news = json_array();
    if (!news) return NULL;
    for (int i = 0; i < w->n; i++) w->r[i].sampled = 0;
    int n = 0;
    size_t i;
    const json_t *row;
    json_array_foreach(ranks, i, row) n += sample(w, row);
    if (n < 2) return news; /* one rank is compared with nobody */
    if (set_medians(w, n)) return json_decref(news), NULL;
    int any_own = 0;
    for (int k = 0; k < w->n; k++) any_own |= w->r[k].sampled && own_phase(w, &w->r[k]) != NULL;
    for (int k = 0; k < w->n; k++) {
        rank_state *r = &w->r[k];
        if (!r->sampled) continue;
        const char *phase = any_own ? own_phase(w, r) : collective_slow(w, r) ? "collective" : NULL;
        r->slow_steps = phase ? r->slow_steps + r->d_steps : 0;
        if (phase) r->phase = phase;
        int named = r->slow_steps >= w->need;
        if (named == r->named) continue;
        r->named = named;
        add_line(news, w, k, r);
    }
    return news;
}

json_t *straggler_watch_status(const straggler_watch *w) {
    json_t *out = json_array();
    for (int k = 0; out && k < w->n; k++) {
        const rank_state *r = &w->r[k];
        if (!r->named) continue;
        json_array_append_new(out, json_pack("{s:i, s:i, s:s, s:f, s:f, s:f, s:f, s:f, s:I}", "rank", k, "node", r->node,
                                             "phase", r->phase, "own_s", r->own, "median_own_s", r->med_own, "comm_s",
                                             r->comm, "median_comm_s", r->med_comm, "step_s", r->step, "steps",
                                             (json_int_t)r->slow_steps));
    }
    return out;
}
