/* model/llama_decode and model/llama_generate: the KV-cache forward against transformers'
 * logits on the golden batch, greedy decoding against transformers' generate
 * (generate_expected.json), the sampler's distribution (softmax(logits / T) after top-k and
 * top-p, computed here independently, and a chi-square test of its draws), seeded
 * reproducibility, and the errors. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "model/llama.h"
#include "model/llama_decode.h"
#include "model/llama_generate.h"
#include "proto/rng.h"
#include "tests/unit/fixtures.h"

static const char *golden = "tiny-mha"; /* the golden model the fixtures open */

static const char *golden_dir(void) {
    static char dir[512];
    return fixture_path(dir, sizeof dir, "golden/%s", golden);
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    assert_non_null(p);
    return p;
}

typedef struct fixture {
    kctx ctx;
    llama_config cfg;
    llama_decoder d;
} fixture;

static void open_decoder(fixture *f, int rows, int len) {
    errbuf err = {{0}};
    st_model st;
    if (llama_config_load(&f->cfg, golden_dir(), &err) || st_model_open(&st, golden_dir(), &err) ||
        kctx_init(&f->ctx, K_CPU, 0, &err))
        fail_msg("%s", err.msg);
    if (llama_decoder_init(&f->d, &f->cfg, &f->ctx, rows, len, &err) ||
        llama_decoder_load_hf(&f->d, &st, &err))
        fail_msg("%s", err.msg);
    st_model_close(&st);
}

static void close_decoder(fixture *f) {
    llama_decoder_destroy(&f->d);
    kctx_destroy(&f->ctx);
}

/* ---- the KV-cache forward against transformers' logits ---- */

/* Row 0 prefilled with 5 tokens, row 1 with 9, then both a token a pass at their own
 * positions; every logits row after a fed token equals expected.safetensors' (1e-5), on the
 * golden model named by state (Llama; Qwen2's biases; Qwen3's q/k norms and head_dim;
 * Mistral's window, whose 12 positions the cache may fill, no more). */
static void test_decoder_logits_golden(void **state) {
    golden = *state;
    int limit = strcmp(golden, "tiny-mistral-sw") ? 33 : 12;
    fixture f;
    if (limit < 33) { /* past the window: refused, not attended wrongly */
        errbuf err = {{0}};
        llama_config cfg;
        kctx ctx;
        llama_decoder d;
        if (llama_config_load(&cfg, golden_dir(), &err) || kctx_init(&ctx, K_CPU, 0, &err)) fail_msg("%s", err.msg);
        assert_int_equal(llama_decoder_init(&d, &cfg, &ctx, 2, 33, &err), -1);
        assert_non_null(strstr(err.msg, "past the model's sliding_window 12: generation beyond the window is not built yet"));
        kctx_destroy(&ctx);
    }
    open_decoder(&f, 2, limit);
    errbuf err = {{0}};
    char path[600];
    st_file batch, expected;
    snprintf(path, sizeof path, "%s/batch.safetensors", golden_dir());
    if (st_open(&batch, path, &err)) fail_msg("%s", err.msg);
    snprintf(path, sizeof path, "%s/expected.safetensors", golden_dir());
    if (st_open(&expected, path, &err)) fail_msg("%s", err.msg);
    const st_tensor *ids_t = st_find(&batch, "input_ids"), *want_t = st_find(&expected, "logits");
    assert_non_null(ids_t);
    assert_non_null(want_t);
    const int32_t *ids = ids_t->data;
    const float *want = want_t->data;
    int T = (int)ids_t->shape[1], V = f.cfg.vocab_size, end = limit < T ? limit : T;
    float *logits = xmalloc(2 * (size_t)V * sizeof *logits);
    int32_t pre[2] = {5, 9};
    double worst = 0;
    for (int b = 0; b < 2; b++) {
        int32_t zero = 0;
        if (llama_decoder_forward(&f.d, b, 1, pre[b], ids + b * T, &zero, logits, &err)) fail_msg("%s", err.msg);
        double e = rel_error(logits, want + ((size_t)b * T + pre[b] - 1) * V, (size_t)V);
        worst = e > worst ? e : worst;
    }
    int32_t pos[2] = {pre[0], pre[1]}, feed[2];
    while (pos[1] < end) {
        feed[0] = ids[pos[0]], feed[1] = ids[T + pos[1]];
        if (llama_decoder_forward(&f.d, 0, 2, 1, feed, pos, logits, &err)) fail_msg("%s", err.msg);
        for (int b = 0; b < 2; b++) {
            double e = rel_error(logits + (size_t)b * V, want + ((size_t)b * T + pos[b]) * V, (size_t)V);
            worst = e > worst ? e : worst;
            pos[b]++;
        }
    }
    printf("%s: KV-cache logits vs transformers: worst relative error %.2e\n", golden, worst);
    assert_true(worst < 1e-5);
    /* a whole row in one pass: its last logits */
    int32_t zero = 0;
    if (llama_decoder_forward(&f.d, 1, 1, end, ids + T, &zero, logits, &err)) fail_msg("%s", err.msg);
    assert_true(rel_error(logits, want + ((size_t)T + end - 1) * V, (size_t)V) < 1e-5);
    /* errors: past the cache, a token outside the vocabulary */
    int32_t at = end, bad = V;
    char msg[96];
    snprintf(msg, sizeof msg, "row 0's 1 new tokens at position %d pass its %d positions", end, end);
    assert_int_equal(llama_decoder_forward(&f.d, 0, 1, 1, ids, &at, logits, &err), -1);
    assert_non_null(strstr(err.msg, msg));
    assert_int_equal(llama_decoder_forward(&f.d, 0, 1, 1, &bad, &zero, logits, &err), -1);
    snprintf(msg, sizeof msg, "%d", V);
    assert_non_null(strstr(err.msg, msg));
    free(logits);
    st_close(&batch);
    st_close(&expected);
    close_decoder(&f);
    golden = "tiny-mha";
}

/* ---- greedy against transformers' generate ---- */

static json_t *read_expected(void) {
    char path[600];
    snprintf(path, sizeof path, "%s/generate_expected.json", golden_dir());
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j) fail_msg("%s: %s", path, je.text);
    return j;
}

static int32_t *ints_of(json_t *a, int *n) {
    *n = (int)json_array_size(a);
    int32_t *v = xmalloc((size_t)*n * sizeof *v);
    for (int i = 0; i < *n; i++) v[i] = (int32_t)json_integer_value(json_array_get(a, (size_t)i));
    return v;
}

/* Every case's 24 greedy tokens, with `rows` rows a group (1: one prompt at a time, 3: the
 * three batched).  Where transformers' margin is below 1e-4, fp32 may pick the other token:
 * the comparison of that case stops there if it did (and says so), else goes on. */
static void greedy_golden(int rows) {
    fixture f;
    open_decoder(&f, rows, 64);
    json_t *j = read_expected(), *cases = json_object_get(j, "cases");
    int n = (int)json_array_size(cases);
    assert_int_equal(n, 3);
    gen_prompt prompts[3];
    int32_t *want[3];
    int n_want[3];
    double *margins[3];
    for (int i = 0; i < n; i++) {
        json_t *c = json_array_get(cases, (size_t)i);
        int32_t *p = ints_of(json_object_get(c, "prompt"), &prompts[i].n);
        prompts[i].ids = p;
        want[i] = ints_of(json_object_get(c, "new_tokens"), &n_want[i]);
        json_t *m = json_object_get(c, "margins");
        margins[i] = xmalloc(json_array_size(m) * sizeof(double));
        for (size_t k = 0; k < json_array_size(m); k++) margins[i][k] = json_real_value(json_array_get(m, k));
    }
    gen_model gm = llama_decoder_gen_model(&f.d);
    gen_options o = {.max_new_tokens = 24, .sampling = {.greedy = 1}};
    gen_reply r[3];
    errbuf err = {{0}};
    if (gen_run(&gm, prompts, n, &o, r, &err)) fail_msg("%s", err.msg);
    int compared = 0;
    for (int i = 0; i < n; i++) {
        assert_int_equal(r[i].n, n_want[i]);
        assert_int_equal(r[i].stop, GEN_STOP_LENGTH);
        for (int t = 0; t < n_want[i]; t++) {
            if (r[i].ids[t] != want[i][t] && margins[i][t] < 1e-4) {
                printf("case %d: token %d differs at a near tie (margin %.1e): compared up to it\n",
                       i, t, margins[i][t]);
                break;
            }
            if (r[i].ids[t] != want[i][t])
                fail_msg("case %d token %d: %d, transformers %d (margin %.2e)", i, t, r[i].ids[t],
                         want[i][t], margins[i][t]);
            compared++;
        }
    }
    printf("greedy, %d row(s) a group: %d of 72 tokens equal transformers'\n", rows, compared);
    assert_true(compared >= 48); /* cases 0 and 2 have no near tie: all of theirs */
    gen_replies_free(r, n);
    for (int i = 0; i < n; i++) free((void *)prompts[i].ids), free(want[i]), free(margins[i]);
    json_decref(j);
    close_decoder(&f);
}

static void test_greedy_golden_one_by_one(void **state) {
    (void)state;
    greedy_golden(1);
}

static void test_greedy_golden_batched(void **state) {
    (void)state;
    greedy_golden(3);
}

/* A stop id ends a reply with it; the row's last position ends it too. */
static void test_stops(void **state) {
    (void)state;
    fixture f;
    open_decoder(&f, 2, 8);
    int32_t p0[] = {115}, p1[] = {137, 24, 132, 87, 189};
    gen_prompt prompts[] = {{p0, 1}, {p1, 5}};
    int32_t stop[] = {188}; /* case 0's third greedy token */
    gen_model gm = llama_decoder_gen_model(&f.d);
    gen_options o = {.max_new_tokens = 24, .stop_ids = stop, .n_stop = 1, .sampling = {.greedy = 1}};
    gen_reply r[2];
    errbuf err = {{0}};
    if (gen_run(&gm, prompts, 2, &o, r, &err)) fail_msg("%s", err.msg);
    assert_int_equal(r[0].n, 3);
    assert_int_equal(r[0].ids[2], 188);
    assert_int_equal(r[0].stop, GEN_STOP_ID);
    assert_int_equal(r[1].n, 4); /* positions 5, 6, 7 hold its first three; the fourth needs none */
    assert_int_equal(r[1].stop, GEN_STOP_POSITIONS);
    assert_string_equal(gen_stop_name(r[1].stop), "positions");
    gen_replies_free(r, 2);
    /* a prompt longer than the positions, an empty one, temperature 0 with sampling */
    int32_t long_prompt[9] = {0};
    gen_prompt bad[] = {{long_prompt, 9}};
    assert_int_equal(gen_run(&gm, bad, 1, &o, r, &err), -1);
    assert_non_null(strstr(err.msg, "prompt 0 has 9 tokens, more than the model's 8 positions"));
    bad[0].n = 0;
    assert_int_equal(gen_run(&gm, bad, 1, &o, r, &err), -1);
    assert_non_null(strstr(err.msg, "prompt 0 is empty"));
    o.sampling = (gen_sampling){.temperature = 0};
    assert_int_equal(gen_run(&gm, prompts, 1, &o, r, &err), -1);
    assert_non_null(strstr(err.msg, "--temperature 0: sampling needs a temperature above 0"));
    o.sampling = (gen_sampling){.temperature = 1, .top_p = 1.5};
    assert_int_equal(gen_sampling_check(&o.sampling, &err), -1);
    assert_non_null(strstr(err.msg, "--top-p 1.5 is not in (0, 1]"));
    close_decoder(&f);
}

/* ---- sampling ---- */

/* The same seed gives the same replies, batched or not; another seed others. */
static void test_sampling_reproducible(void **state) {
    (void)state;
    fixture f;
    open_decoder(&f, 2, 40);
    int32_t p0[] = {115}, p1[] = {36, 21, 205, 141, 193};
    gen_prompt prompts[] = {{p0, 1}, {p1, 5}};
    gen_model gm = llama_decoder_gen_model(&f.d);
    gen_options o = {.max_new_tokens = 20, .sampling = {.temperature = 1.0, .top_p = 1.0, .seed = 7}};
    gen_reply a[2], b[2], c[2];
    errbuf err = {{0}};
    if (gen_run(&gm, prompts, 2, &o, a, &err) || gen_run(&gm, prompts, 2, &o, b, &err))
        fail_msg("%s", err.msg);
    gm.rows = 1; /* one prompt at a time: the same draws */
    gen_reply single[2];
    if (gen_run(&gm, prompts, 2, &o, single, &err)) fail_msg("%s", err.msg);
    o.sampling.seed = 8;
    if (gen_run(&gm, prompts, 2, &o, c, &err)) fail_msg("%s", err.msg);
    int differ = 0;
    for (int i = 0; i < 2; i++) {
        assert_int_equal(a[i].n, 20);
        assert_memory_equal(a[i].ids, b[i].ids, 20 * sizeof(int32_t));
        assert_memory_equal(a[i].ids, single[i].ids, 20 * sizeof(int32_t));
        differ += memcmp(a[i].ids, c[i].ids, 20 * sizeof(int32_t)) != 0;
    }
    assert_true(differ > 0);
    gen_replies_free(a, 2), gen_replies_free(b, 2), gen_replies_free(c, 2);
    gen_replies_free(single, 2);
    close_decoder(&f);
}

static int cmp_desc(const void *a, const void *b, void *arg) {
    const double *x = arg;
    int i = *(const int *)a, j = *(const int *)b;
    return x[i] != x[j] ? (x[i] > x[j] ? -1 : 1) : (i > j) - (i < j);
}

/* softmax(logits / T) after top-k then top-p, from the definitions (transformers' warpers). */
static void expected_dist(const float *logits, int V, double T, int top_k, double top_p, double *p) {
    double *x = xmalloc((size_t)V * sizeof *x);
    int *ord = xmalloc((size_t)V * sizeof *ord);
    for (int i = 0; i < V; i++) x[i] = logits[i] / T, ord[i] = i;
    qsort_r(ord, (size_t)V, sizeof *ord, cmp_desc, x);
    if (top_k > 0)
        for (int i = 0; i < V; i++)
            if (x[i] < x[ord[top_k - 1]]) x[i] = -INFINITY;
    double mx = x[ord[0]], s = 0;
    for (int i = 0; i < V; i++) s += p[i] = exp(x[i] - mx);
    for (int i = 0; i < V; i++) p[i] /= s;
    if (top_p < 1) { /* transformers: sorted ascending, drop while the cumulative mass <= 1 - p */
        double cum = 0;
        for (int r = V - 1; r > 0; r--) {
            cum += p[ord[r]];
            if (cum <= 1 - top_p) p[ord[r]] = 0;
        }
        s = 0;
        for (int i = 0; i < V; i++) s += p[i];
        for (int i = 0; i < V; i++) p[i] /= s;
    }
    free(x);
    free(ord);
}

/* Pearson's statistic of counts[V] (n draws) against p, bins of expected count < 5 merged;
 * *df its degrees of freedom.  A draw where p is 0 fails. */
static double chi_square(const long *counts, const double *p, int V, long n, int *df) {
    double stat = 0, rest_e = 0;
    long rest_o = 0;
    int bins = 0;
    for (int i = 0; i < V; i++) {
        if (p[i] == 0) {
            if (counts[i]) fail_msg("token %d drawn %ld times outside top-k/top-p", i, counts[i]);
            continue;
        }
        double e = p[i] * n;
        if (e < 5) {
            rest_e += e, rest_o += counts[i];
            continue;
        }
        stat += (counts[i] - e) * (counts[i] - e) / e;
        bins++;
    }
    if (rest_e > 0) stat += (rest_o - rest_e) * (rest_o - rest_e) / rest_e, bins++;
    *df = bins - 1;
    return stat;
}

/* The chi-square quantile at 1 - 1e-4 (Wilson-Hilferty; z = 3.719). */
static double chi_square_critical(int df) {
    double k = df, z = 3.719;
    return k * pow(1 - 2 / (9 * k) + z * sqrt(2 / (9 * k)), 3);
}

/* The next-token logits of a prompt on the tiny model; gen_distribution equals the
 * definition, and 40000 draws of gen_pick pass a chi-square test against it (and fail one
 * against the distribution of another temperature: the test has the power to see it). */
static void test_sampling_distribution(void **state) {
    (void)state;
    fixture f;
    open_decoder(&f, 1, 8);
    int V = f.cfg.vocab_size;
    float *logits = xmalloc((size_t)V * sizeof *logits);
    int32_t prompt[] = {137, 24, 132}, zero = 0;
    errbuf err = {{0}};
    if (llama_decoder_forward(&f.d, 0, 1, 3, prompt, &zero, logits, &err)) fail_msg("%s", err.msg);
    /* the tiny model's logits are flat: scaled to a standard deviation of 2, so that top-k
     * and top-p cut somewhere in a spread distribution */
    double mean = 0, var = 0;
    for (int i = 0; i < V; i++) mean += logits[i] / V;
    for (int i = 0; i < V; i++) var += (logits[i] - mean) * (logits[i] - mean) / V;
    for (int i = 0; i < V; i++) logits[i] = (float)((logits[i] - mean) * 2 / sqrt(var));
    const struct { double T; int k; double p; } cases[] = {
        {1.0, 0, 1.0}, {0.7, 0, 1.0}, {1.3, 20, 1.0}, {1.0, 0, 0.8}, {0.9, 50, 0.9}, {2.0, 5, 0.5}};
    double *want = xmalloc((size_t)V * sizeof *want), *got = xmalloc((size_t)V * sizeof *got);
    double *other = xmalloc((size_t)V * sizeof *other);
    int32_t *order = xmalloc((size_t)V * sizeof *order);
    long *counts = xmalloc((size_t)V * sizeof *counts);
    const long n = 40000;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        gen_sampling s = {.temperature = cases[c].T, .top_k = cases[c].k, .top_p = cases[c].p, .seed = 11 + c};
        expected_dist(logits, V, s.temperature, s.top_k, s.top_p, want);
        gen_distribution(&s, logits, V, got, order);
        int support = 0;
        for (int i = 0; i < V; i++) {
            assert_true(fabs(got[i] - want[i]) < 1e-12);
            support += want[i] > 0;
        }
        memset(counts, 0, (size_t)V * sizeof *counts);
        for (long d = 0; d < n; d++) {
            double u = rng_uniform(s.seed, rng_stream(RNG_PURPOSE_SAMPLE, 0), (uint64_t)d);
            counts[gen_pick(&s, logits, V, u, got, order)]++;
        }
        int df;
        double stat = chi_square(counts, want, V, n, &df), crit = chi_square_critical(df);
        printf("T %.1f top-k %d top-p %.1f: %d tokens kept, chi-square %.1f on %d df (critical %.1f)\n",
               s.temperature, s.top_k, s.top_p, support, stat, df, crit);
        assert_true(df >= 1);
        assert_true(stat < crit);
        /* power: the draws against the distribution of a 15% higher temperature */
        expected_dist(logits, V, s.temperature * 1.15, s.top_k, 1.0, other);
        for (int i = 0; i < V; i++)
            if (want[i] == 0) other[i] = 0;
        double so = 0;
        for (int i = 0; i < V; i++) so += other[i];
        for (int i = 0; i < V; i++) other[i] /= so;
        int df2;
        assert_true(chi_square(counts, other, V, n, &df2) > chi_square_critical(df2));
    }
    free(logits), free(want), free(got), free(other), free(order), free(counts);
    close_decoder(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_prestate(test_decoder_logits_golden, "tiny-mha"),
        cmocka_unit_test_prestate(test_decoder_logits_golden, "tiny-qwen2"),
        cmocka_unit_test_prestate(test_decoder_logits_golden, "tiny-qwen3"),
        cmocka_unit_test_prestate(test_decoder_logits_golden, "tiny-mistral-sw"),
        cmocka_unit_test(test_greedy_golden_one_by_one),
        cmocka_unit_test(test_greedy_golden_batched),
        cmocka_unit_test(test_stops),
        cmocka_unit_test(test_sampling_reproducible),
        cmocka_unit_test(test_sampling_distribution),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
