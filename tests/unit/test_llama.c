/* worker/llama: the whole-model forward and backward against transformers' golden outputs,
 * against finite differences of an independent float64 implementation written here from
 * the formulas, and the properties FSDP builds on (loss normalisation across calls,
 * activation checkpointing, input checks). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "proto/rng.h"
#include "model/llama.h"
#include "tests/unit/fixtures.h"

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    assert_non_null(p);
    return p;
}

/* llama_model_forward_backward that must succeed. */
static void forward_backward(llama_model *m, const int32_t *ids, const int32_t *labels, int B,
                             int T, float dscale, float *loss_sum, int64_t *count,
                             float *logits) {
    errbuf err = {{0}};
    if (llama_model_forward_backward(m, ids, labels, B, T, dscale, loss_sum, count, logits, &err))
        fail_msg("%s", err.msg);
}

/* ---- (1) transformers' golden outputs ---- */

static void read_i32(const st_file *f, const char *name, int32_t *dst, size_t n) {
    const st_tensor *t = st_find(f, name);
    assert_non_null(t);
    assert_int_equal(t->dtype, ST_I32);
    assert_int_equal(t->numel, n);
    memcpy(dst, t->data, n * sizeof *dst);
}

/* Compares host fp32 `got` with the F32 tensor `name` of expected; returns the error. */
static double check_golden(const st_file *expected, const char *name, const float *got,
                             size_t n, double *worst, char *worst_name) {
    const st_tensor *t = st_find(expected, name);
    if (!t) fail_msg("expected.safetensors has no %s", name);
    assert_int_equal(t->dtype, ST_F32);
    assert_int_equal(t->numel, n);
    float *want = xmalloc(n * sizeof *want);
    memcpy(want, t->data, n * sizeof *want);
    double e = rel_error(got, want, n);
    free(want);
    if (e > 1e-4) fail_msg("%s: relative error %.3e > 1e-4", name, e);
    if (e > *worst) {
        *worst = e;
        snprintf(worst_name, 128, "%s", name);
    }
    return e;
}

static void test_golden_tiny_mha(void **state) {
    (void)state;
    char dir[512], path[600];
    fixture_path(dir, sizeof dir, "golden/tiny-mha");
    errbuf err = {{0}};
    llama_config cfg;
    if (llama_config_load(&cfg, dir, &err)) fail_msg("%s", err.msg);
    st_model st;
    if (st_model_open(&st, dir, &err)) fail_msg("%s", err.msg);
    st_file batch, expected;
    snprintf(path, sizeof path, "%s/batch.safetensors", dir);
    if (st_open(&batch, path, &err)) fail_msg("%s", err.msg);
    snprintf(path, sizeof path, "%s/expected.safetensors", dir);
    if (st_open(&expected, path, &err)) fail_msg("%s", err.msg);

    const st_tensor *ids_t = st_find(&batch, "input_ids");
    assert_non_null(ids_t);
    int B = (int)ids_t->shape[0], T = (int)ids_t->shape[1], V = cfg.vocab_size;
    size_t N = (size_t)B * T;
    int32_t *ids = xmalloc(N * sizeof *ids), *labels = xmalloc(N * sizeof *labels);
    int32_t *shifted = xmalloc(N * sizeof *shifted);
    read_i32(&batch, "input_ids", ids, N);
    read_i32(&batch, "labels", labels, N);
    int64_t count = k_shift_labels(labels, shifted, B, T);
    assert_true(count > 0);

    kctx ctx;
    if (kctx_init(&ctx, K_CPU, 0, &err)) fail_msg("%s", err.msg);
    llama_model m;
    if (llama_model_init(&m, &cfg, &ctx, 0, &err)) fail_msg("%s", err.msg);
    if (llama_model_load_hf(&m, &st, &err)) fail_msg("%s", err.msg);

    float *logits = xmalloc(N * V * sizeof *logits);
    float loss_sum;
    int64_t n_targets;
    forward_backward(&m, ids, labels, B, T, (float)(1.0 / count), &loss_sum, &n_targets, logits);
    assert_int_equal(n_targets, count);

    double worst = 0.0;
    char worst_name[128] = "";
    float loss = (float)((double)loss_sum / n_targets);
    double e_logits = check_golden(&expected, "logits", logits, N * V, &worst, worst_name);
    double e_loss = check_golden(&expected, "loss", &loss, 1, &worst, worst_name);

    /* Gradients, then one AdamW step from them (PyTorch semantics, decay on everything). */
    const llama_layout *lo = &m.layout;
    float *p = xmalloc(lo->max_tensor_numel * sizeof *p);
    float *g = xmalloc(lo->max_tensor_numel * sizeof *g);
    float *mom = xmalloc(lo->max_tensor_numel * sizeof *mom);
    float *var = xmalloc(lo->max_tensor_numel * sizeof *var);
    double worst_grad = 0.0, worst_adamw = 0.0;
    for (int i = 0; i < lo->n_tensors; i++) {
        const llama_tensor_slot *s = &lo->tensors[i];
        char name[160];
        if (llama_model_get_grad(&m, s->name, g, s->numel, &err)) fail_msg("%s", err.msg);
        snprintf(name, sizeof name, "grad.%s", s->name);
        double e = check_golden(&expected, name, g, s->numel, &worst, worst_name);
        if (e > worst_grad) worst_grad = e;

        if (llama_model_get_param(&m, s->name, p, s->numel, &err)) fail_msg("%s", err.msg);
        memset(mom, 0, s->numel * sizeof *mom);
        memset(var, 0, s->numel * sizeof *var);
        k_adamw(&ctx, p, g, mom, var, s->numel, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1, 1.0f, NULL);
        if (k_check(&ctx, &err)) fail_msg("%s", err.msg);
        snprintf(name, sizeof name, "adamw.%s", s->name);
        e = check_golden(&expected, name, p, s->numel, &worst, worst_name);
        if (e > worst_adamw) worst_adamw = e;
    }
    /* Every tensor of the golden file was checked: logits, loss, grad.* and adamw.*. */
    assert_int_equal(expected.n_tensors, 2 + 2 * lo->n_tensors);
    printf("golden tiny-mha: logits %.2e, loss %.2e, worst grad %.2e, worst adamw %.2e; "
           "worst overall %.2e (%s)\n",
           e_logits, e_loss, worst_grad, worst_adamw, worst, worst_name);

    free(p), free(g), free(mom), free(var), free(logits);
    free(ids), free(labels), free(shifted);
    llama_model_destroy(&m);
    kctx_destroy(&ctx);
    st_close(&batch);
    st_close(&expected);
    st_model_close(&st);
}

/* The layout covers exactly llama_config_params' tensors, in units that partition them. */
static void test_layout_matches_config_params(void **state) {
    (void)state;
    char dir[512];
    fixture_path(dir, sizeof dir, "golden/tiny-mha");
    errbuf err = {{0}};
    llama_config cfg;
    if (llama_config_load(&cfg, dir, &err)) fail_msg("%s", err.msg);
    for (int tied = 0; tied <= 1; tied++) {
        cfg.tie_word_embeddings = tied;
        llama_layout lo;
        if (llama_layout_init(&lo, &cfg, &err)) fail_msg("%s", err.msg);
        int n = llama_config_params(&cfg, NULL, 0);
        llama_param_info *info = xmalloc((size_t)n * sizeof *info);
        assert_int_equal(llama_config_params(&cfg, info, n), n);
        assert_int_equal(lo.n_tensors, n);
        assert_int_equal(lo.n_units, cfg.num_hidden_layers + 2);
        uint64_t total = 0;
        for (int u = 0; u < lo.n_units; u++) total += lo.units[u].numel;
        assert_int_equal(total, llama_config_num_params(&cfg));
        for (int i = 0; i < n; i++) {
            const llama_tensor_slot *s = llama_layout_find(&lo, info[i].name);
            if (!s) fail_msg("layout lacks %s", info[i].name);
            assert_int_equal(s->ndim, info[i].ndim);
            assert_int_equal(s->shape[0], info[i].shape[0]);
            if (s->ndim == 2) assert_int_equal(s->shape[1], info[i].shape[1]);
            assert_int_equal(s->is_norm, info[i].is_norm);
            int want_unit = info[i].layer >= 0 ? llama_layer_unit(info[i].layer)
                            : strstr(info[i].name, "embed_tokens") ? LLAMA_EMBED_UNIT
                                                                    : llama_head_unit(&lo);
            assert_int_equal(s->unit, want_unit);
        }
        /* Tensors of a unit are back to back in the documented order. */
        const llama_tensor_slot *q = &lo.tensors[lo.units[llama_layer_unit(1)].first];
        assert_string_equal(q[LLAMA_Q].name, "model.layers.1.self_attn.q_proj.weight");
        assert_string_equal(q[LLAMA_LN2].name, "model.layers.1.post_attention_layernorm.weight");
        assert_int_equal(lo.layer_tensors, LLAMA_BASE_TENSORS);
        for (int t = 1; t < lo.layer_tensors; t++)
            assert_int_equal(q[t].offset, q[t - 1].offset + q[t - 1].numel);
        const llama_unit *head = &lo.units[llama_head_unit(&lo)];
        assert_int_equal(head->count, tied ? 1 : 2);
        assert_string_equal(lo.tensors[head->first + LLAMA_NORM].name, "model.norm.weight");
        free(info);
        llama_layout_free(&lo);
    }
}

/* ---- a small GQA model with tied embeddings and llama3 RoPE, random weights ---- */

enum { RB = 2, RT = 9 };

static llama_config small_config(void) {
    llama_config c;
    memset(&c, 0, sizeof c);
    c.hidden_size = 24;
    c.intermediate_size = 40;
    c.num_hidden_layers = 3;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 8; /* != 24 / 4 */
    c.vocab_size = 37;
    c.max_position_embeddings = 64;
    c.rms_norm_eps = 1e-5;
    c.tie_word_embeddings = 1;
    c.bos_token_id = c.eos_token_id = -1;
    /* wavelengths 6.3, 20, 63, 200 against low/high bounds 32 and 8: every llama3 branch */
    c.rope = (rope_config){.type = ROPE_LLAMA3, .theta = 100.0, .factor = 8.0,
                           .low_freq_factor = 1.0, .high_freq_factor = 4.0,
                           .original_max_position_embeddings = 32};
    return c;
}

/* The model plus a float64 copy of every parameter, by Hugging Face name. */
typedef struct fixture {
    llama_config cfg;
    kctx ctx;
    llama_model m;
    int n;
    char (*names)[96];
    size_t *numel;
    double **p;
} fixture;

static void fixture_init_config(fixture *f, const llama_config *cfg, uint64_t seed, int checkpoint) {
    errbuf err = {{0}};
    f->cfg = *cfg;
    if (kctx_init(&f->ctx, K_CPU, 0, &err)) fail_msg("%s", err.msg);
    if (llama_model_init(&f->m, &f->cfg, &f->ctx, checkpoint, &err)) fail_msg("%s", err.msg);
    const llama_layout *lo = &f->m.layout;
    f->n = lo->n_tensors;
    f->names = xmalloc((size_t)f->n * sizeof *f->names);
    f->numel = xmalloc((size_t)f->n * sizeof *f->numel);
    f->p = xmalloc((size_t)f->n * sizeof *f->p);
    for (int i = 0; i < f->n; i++) {
        const llama_tensor_slot *s = &lo->tensors[i];
        float *w = xmalloc(s->numel * sizeof *w);
        /* Larger than a real init so that every path carries a visible gradient. */
        rng_fill_normal(w, s->numel, s->is_norm ? 0.2f : 0.3f, seed, (uint64_t)i, 0);
        if (!strcmp(s->name, "model.embed_tokens.weight"))
            for (size_t j = 0; j < s->numel; j++) w[j] *= 3.0f;
        if (s->is_norm)
            for (size_t j = 0; j < s->numel; j++) w[j] += 1.0f;
        if (llama_model_set_param(&f->m, s->name, w, s->numel, &err)) fail_msg("%s", err.msg);
        snprintf(f->names[i], sizeof f->names[i], "%s", s->name);
        f->numel[i] = s->numel;
        f->p[i] = xmalloc(s->numel * sizeof *f->p[i]);
        for (size_t j = 0; j < s->numel; j++) f->p[i][j] = w[j];
        free(w);
    }
}

static void fixture_init(fixture *f, uint64_t seed, int checkpoint) {
    llama_config c = small_config();
    fixture_init_config(f, &c, seed, checkpoint);
}

static void fixture_free(fixture *f) {
    for (int i = 0; i < f->n; i++) free(f->p[i]);
    free(f->p), free(f->names), free(f->numel);
    llama_model_destroy(&f->m);
    kctx_destroy(&f->ctx);
}

static int fixture_index(const fixture *f, const char *name) {
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->names[i], name)) return i;
    fail_msg("no parameter %s", name);
    return -1;
}

static const double *param(const fixture *f, int layer, const char *what) {
    char name[96];
    if (layer < 0) snprintf(name, sizeof name, "%s", what);
    else snprintf(name, sizeof name, "model.layers.%d.%s.weight", layer, what);
    return f->p[fixture_index(f, name)];
}

/* A random batch: ids in [0, V), labels = ids with about a quarter masked, and the first
 * three labels of the last sequence masked. */
static void random_batch(int B, int T, int V, uint64_t seed, int32_t *ids, int32_t *labels) {
    for (int i = 0; i < B * T; i++) {
        ids[i] = (int32_t)(rng_u64(seed, 1, (uint64_t)i) % (uint64_t)V);
        labels[i] = rng_uniform(seed, 2, (uint64_t)i) < 0.25 ? K_IGNORE_INDEX : ids[i];
    }
    for (int t = 0; t < 3; t++) labels[(B - 1) * T + t] = K_IGNORE_INDEX;
}

/* ---- the float64 reference, straight from the formulas ---- */

/* Llama 3 RoPE frequencies (transformers' _compute_llama3_parameters). */
static void ref_inv_freq(const llama_config *c, double *inv_freq) {
    const rope_config *r = &c->rope;
    double low_wavelen = r->original_max_position_embeddings / r->low_freq_factor;
    double high_wavelen = r->original_max_position_embeddings / r->high_freq_factor;
    for (int i = 0; i < c->head_dim / 2; i++) {
        double f = 1.0 / pow(r->theta, 2.0 * i / c->head_dim);
        double wavelen = 2 * M_PI / f;
        if (wavelen < high_wavelen) {
            inv_freq[i] = f;
        } else if (wavelen > low_wavelen) {
            inv_freq[i] = f / r->factor;
        } else {
            double smooth = (r->original_max_position_embeddings / wavelen - r->low_freq_factor) /
                            (r->high_freq_factor - r->low_freq_factor);
            inv_freq[i] = (1 - smooth) * f / r->factor + smooth * f;
        }
    }
}

static void ref_rmsnorm(const double *x, const double *w, double *out, int C, double eps) {
    double ss = 0;
    for (int i = 0; i < C; i++) ss += x[i] * x[i];
    double r = 1.0 / sqrt(ss / C + eps);
    for (int i = 0; i < C; i++) out[i] = x[i] * r * w[i];
}

/* out[o] = sum_i W[o,i] x[i] */
static void ref_matvec(const double *W, const double *x, double *out, int O, int I) {
    for (int o = 0; o < O; o++) {
        double s = 0;
        for (int i = 0; i < I; i++) s += W[(size_t)o * I + i] * x[i];
        out[o] = s;
    }
}

/* Rotates each head of x (H heads of hd) at position t: HF rotate_half. */
static void ref_rope(double *x, int H, int hd, int t, const double *inv_freq) {
    for (int h = 0; h < H; h++)
        for (int i = 0; i < hd / 2; i++) {
            double a = t * inv_freq[i], c = cos(a), s = sin(a);
            double x1 = x[h * hd + i], x2 = x[h * hd + i + hd / 2];
            x[h * hd + i] = x1 * c - x2 * s;
            x[h * hd + i + hd / 2] = x2 * c + x1 * s;
        }
}

/* Sum of the shifted token losses over the batch; logits (when not NULL) [B,T,V]. */
static double ref_loss_sum(const fixture *f, const int32_t *ids, const int32_t *labels, int B,
                           int T, double *logits) {
    const llama_config *c = &f->cfg;
    int C = c->hidden_size, I = c->intermediate_size, V = c->vocab_size, hd = c->head_dim;
    int Hq = c->num_attention_heads, Hkv = c->num_key_value_heads, Q = Hq * hd, KV = Hkv * hd;
    double eps = c->rms_norm_eps;
    double inv_freq[64];
    ref_inv_freq(c, inv_freq);
    double *x = xmalloc((size_t)T * C * sizeof *x), *h = xmalloc((size_t)T * C * sizeof *h);
    double *q = xmalloc((size_t)T * Q * sizeof *q), *k = xmalloc((size_t)T * KV * sizeof *k);
    double *v = xmalloc((size_t)T * KV * sizeof *v), *att = xmalloc((size_t)Q * sizeof *att);
    double *n = xmalloc((size_t)C * sizeof *n), *tmp = xmalloc((size_t)C * sizeof *tmp);
    double *g = xmalloc((size_t)I * sizeof *g), *u = xmalloc((size_t)I * sizeof *u);
    double *lg = xmalloc((size_t)V * sizeof *lg), *p = xmalloc((size_t)T * sizeof *p);
    const double *E = param(f, -1, "model.embed_tokens.weight");
    double total = 0;
    for (int b = 0; b < B; b++) {
        const int32_t *id = ids + (size_t)b * T, *lab = labels + (size_t)b * T;
        for (int t = 0; t < T; t++) memcpy(&x[t * C], &E[(size_t)id[t] * C], C * sizeof *x);
        for (int l = 0; l < c->num_hidden_layers; l++) {
            for (int t = 0; t < T; t++) {
                ref_rmsnorm(&x[t * C], param(f, l, "input_layernorm"), n, C, eps);
                ref_matvec(param(f, l, "self_attn.q_proj"), n, &q[t * Q], Q, C);
                ref_matvec(param(f, l, "self_attn.k_proj"), n, &k[t * KV], KV, C);
                ref_matvec(param(f, l, "self_attn.v_proj"), n, &v[t * KV], KV, C);
                ref_rope(&q[t * Q], Hq, hd, t, inv_freq);
                ref_rope(&k[t * KV], Hkv, hd, t, inv_freq);
            }
            for (int t = 0; t < T; t++) {
                for (int hq = 0; hq < Hq; hq++) {
                    int kv = hq / (Hq / Hkv);
                    double mx = -INFINITY, sum = 0;
                    for (int s = 0; s <= t; s++) {
                        double d = 0;
                        for (int i = 0; i < hd; i++)
                            d += q[t * Q + hq * hd + i] * k[s * KV + kv * hd + i];
                        p[s] = d / sqrt((double)hd);
                        if (p[s] > mx) mx = p[s];
                    }
                    for (int s = 0; s <= t; s++) sum += p[s] = exp(p[s] - mx);
                    for (int i = 0; i < hd; i++) {
                        double o = 0;
                        for (int s = 0; s <= t; s++) o += p[s] / sum * v[s * KV + kv * hd + i];
                        att[hq * hd + i] = o;
                    }
                }
                ref_matvec(param(f, l, "self_attn.o_proj"), att, tmp, C, Q);
                for (int i = 0; i < C; i++) h[t * C + i] = x[t * C + i] + tmp[i];
            }
            for (int t = 0; t < T; t++) {
                ref_rmsnorm(&h[t * C], param(f, l, "post_attention_layernorm"), n, C, eps);
                ref_matvec(param(f, l, "mlp.gate_proj"), n, g, I, C);
                ref_matvec(param(f, l, "mlp.up_proj"), n, u, I, C);
                for (int i = 0; i < I; i++) g[i] = g[i] / (1 + exp(-g[i])) * u[i];
                ref_matvec(param(f, l, "mlp.down_proj"), g, tmp, C, I);
                for (int i = 0; i < C; i++) x[t * C + i] = h[t * C + i] + tmp[i];
            }
        }
        for (int t = 0; t < T; t++) {
            ref_rmsnorm(&x[t * C], param(f, -1, "model.norm.weight"), n, C, eps);
            ref_matvec(E, n, lg, V, C); /* tied head */
            if (logits) memcpy(&logits[((size_t)b * T + t) * V], lg, V * sizeof *lg);
            if (t == T - 1 || lab[t + 1] == K_IGNORE_INDEX) continue;
            double mx = -INFINITY, sum = 0;
            for (int i = 0; i < V; i++) mx = lg[i] > mx ? lg[i] : mx;
            for (int i = 0; i < V; i++) sum += exp(lg[i] - mx);
            total += mx + log(sum) - lg[lab[t + 1]];
        }
    }
    free(x), free(h), free(q), free(k), free(v), free(att), free(n), free(tmp), free(g), free(u);
    free(lg), free(p);
    return total;
}

/* The model's own (fp32) loss sum with parameter i set to w. */
static double model_loss_sum(fixture *f, int i, const float *w, const int32_t *ids,
                             const int32_t *labels, int B, int T) {
    errbuf err = {{0}};
    float loss_sum;
    int64_t count;
    if (llama_model_set_param(&f->m, f->names[i], w, f->numel[i], &err)) fail_msg("%s", err.msg);
    forward_backward(&f->m, ids, labels, B, T, 0.0f, &loss_sum, &count, NULL);
    return loss_sum;
}

/* The loss and logits against the float64 reference; then every parameter's gradient
 * against central differences of the reference loss (float64, so eps can be small and
 * the tolerance tight) and of the model's own fp32 loss (loose: fp32 rounding). */
static void test_small_gqa_model_gradients(void **state) {
    (void)state;
    fixture f;
    fixture_init(&f, 7, 0);
    const llama_config *c = &f.cfg;
    int B = RB, T = RT, V = c->vocab_size;
    int32_t ids[RB * RT], labels[RB * RT], shifted[RB * RT];
    random_batch(B, T, V, 11, ids, labels);
    int64_t count = k_shift_labels(labels, shifted, B, T);
    assert_true(count > 4 && count < B * (T - 1));
    double dscale = 1.0 / count;

    errbuf err = {{0}};
    float loss_sum, *logits = xmalloc((size_t)B * T * V * sizeof *logits);
    int64_t n_targets;
    forward_backward(&f.m, ids, labels, B, T, (float)dscale, &loss_sum, &n_targets, logits);
    assert_int_equal(n_targets, count);
    double *ref_logits = xmalloc((size_t)B * T * V * sizeof *ref_logits);
    double ref = ref_loss_sum(&f, ids, labels, B, T, ref_logits);
    double loss_err = fabs(loss_sum / (double)count - ref / count) / (ref / count);
    float *ref_logits_f = xmalloc((size_t)B * T * V * sizeof *ref_logits_f);
    for (int i = 0; i < B * T * V; i++) ref_logits_f[i] = (float)ref_logits[i];
    double logits_err = rel_error(logits, ref_logits_f, (size_t)B * T * V);
    printf("small GQA model: loss %.6f vs float64 %.6f (rel %.2e), logits rel %.2e\n",
           loss_sum / (double)count, ref / count, loss_err, logits_err);
    assert_true(loss_err <= 1e-5);
    assert_true(logits_err <= 1e-5);

    float **grads = xmalloc((size_t)f.n * sizeof *grads);
    for (int i = 0; i < f.n; i++) {
        grads[i] = xmalloc(f.numel[i] * sizeof *grads[i]);
        if (llama_model_get_grad(&f.m, f.names[i], grads[i], f.numel[i], &err))
            fail_msg("%s", err.msg);
    }

    enum { SAMPLES = 20 };
    double worst64 = 0, worst32 = 0;
    const char *worst64_name = "", *worst32_name = "";
    float *w = xmalloc(f.m.layout.max_tensor_numel * sizeof *w);
    for (int i = 0; i < f.n; i++) {
        float got[SAMPLES], fd64[SAMPLES], fd32[SAMPLES];
        int is_embed = !strcmp(f.names[i], "model.embed_tokens.weight");
        if (llama_model_get_param(&f.m, f.names[i], w, f.numel[i], &err)) fail_msg("%s", err.msg);
        for (int s = 0; s < SAMPLES; s++) {
            size_t j = rng_u64(99, (uint64_t)i, (uint64_t)s) % f.numel[i];
            /* For the tied embedding, half the samples sit in rows of input tokens, where
             * the embedding path adds to the head's gradient. */
            if (is_embed && s % 2 == 0)
                j = (size_t)ids[j % (size_t)(B * T)] * c->hidden_size + j % c->hidden_size;
            got[s] = grads[i][j];

            double *p = &f.p[i][j], saved = *p, h64 = 1e-5;
            *p = saved + h64;
            double up = ref_loss_sum(&f, ids, labels, B, T, NULL);
            *p = saved - h64;
            double down = ref_loss_sum(&f, ids, labels, B, T, NULL);
            *p = saved;
            fd64[s] = (float)((up - down) / (2 * h64) * dscale);

            float saved32 = w[j], h32 = 1e-3f;
            w[j] = saved32 + h32;
            double l_up = model_loss_sum(&f, i, w, ids, labels, B, T);
            w[j] = saved32 - h32;
            double l_down = model_loss_sum(&f, i, w, ids, labels, B, T);
            w[j] = saved32;
            model_loss_sum(&f, i, w, ids, labels, B, T);
            fd32[s] = (float)((l_up - l_down) / (2.0 * (double)h32) * dscale);
        }
        double e64 = rel_error(got, fd64, SAMPLES), e32 = rel_error(got, fd32, SAMPLES);
        if (e64 > 1e-4 || e32 > 2e-2)
            fail_msg("%s: gradient vs finite differences: float64 reference %.2e, fp32 model "
                     "%.2e", f.names[i], e64, e32);
        if (e64 > worst64) worst64 = e64, worst64_name = f.names[i];
        if (e32 > worst32) worst32 = e32, worst32_name = f.names[i];
    }
    printf("small GQA model: %d tensors x %d coordinates; worst gradient error vs float64 "
           "finite differences %.2e (%s), vs fp32 finite differences %.2e (%s)\n",
           f.n, SAMPLES, worst64, worst64_name, worst32, worst32_name);

    for (int i = 0; i < f.n; i++) free(grads[i]);
    free(grads), free(w), free(logits), free(ref_logits), free(ref_logits_f);
    fixture_free(&f);
}

/* Reads every gradient of a model into one host array (layout order). */
static float *all_grads(llama_model *m, size_t *total) {
    const llama_layout *lo = &m->layout;
    size_t n = 0;
    for (int i = 0; i < lo->n_tensors; i++) n += lo->tensors[i].numel;
    float *g = xmalloc(n * sizeof *g);
    errbuf err = {{0}};
    size_t at = 0;
    for (int i = 0; i < lo->n_tensors; i++) {
        if (llama_model_get_grad(m, lo->tensors[i].name, g + at, lo->tensors[i].numel, &err))
            fail_msg("%s", err.msg);
        at += lo->tensors[i].numel;
    }
    *total = n;
    return g;
}

/* (4) Two calls of 2 sequences with dscale = 1/global count accumulate the same gradients
 * as one call of 4: what lets FSDP normalise by the global token count. */
static void test_loss_normalisation_across_calls(void **state) {
    (void)state;
    fixture f;
    fixture_init(&f, 21, 0);
    enum { B = 4, T = 7 };
    int32_t ids[B * T], labels[B * T], shifted[B * T];
    random_batch(B, T, f.cfg.vocab_size, 5, ids, labels);
    int64_t count = k_shift_labels(labels, shifted, B, T);
    float dscale = (float)(1.0 / count), whole, first, second;
    int64_t n_whole, n_first, n_second;
    forward_backward(&f.m, ids, labels, B, T, dscale, &whole, &n_whole, NULL);
    size_t n;
    float *g_whole = all_grads(&f.m, &n);

    llama_model_zero_grad(&f.m);
    float *g_zero = all_grads(&f.m, &n);
    for (size_t i = 0; i < n; i++) assert_true(g_zero[i] == 0.0f);
    forward_backward(&f.m, ids, labels, 2, T, dscale, &first, &n_first, NULL);
    forward_backward(&f.m, ids + 2 * T, labels + 2 * T, 2, T, dscale, &second, &n_second, NULL);
    float *g_split = all_grads(&f.m, &n);
    assert_int_equal(n_first + n_second, n_whole);
    assert_true(fabs((double)first + second - whole) <= 1e-6 * whole);
    double e = rel_error(g_split, g_whole, n);
    printf("loss normalisation: split vs whole batch gradients rel %.2e\n", e);
    assert_true(e <= 1e-6);
    free(g_whole), free(g_zero), free(g_split);
    fixture_free(&f);
}

/* (4b) The head computes its logits LLAMA_HEAD_ROWS rows at a time: a batch of more rows
 * than that has the loss, logits and gradients of the same rows run a few at a time (which
 * fit one chunk).  Tied embeddings: the head's gradient lands in the embedding's. */
static void test_head_in_chunks(void **state) {
    (void)state;
    fixture f;
    fixture_init(&f, 23, 0);
    enum { T = 64, B = LLAMA_HEAD_ROWS / T + 3, PART = 8 }; /* 2240 rows: two chunks */
    int32_t *ids = malloc(B * T * sizeof *ids), *labels = malloc(B * T * sizeof *labels);
    int32_t *shifted = malloc(B * T * sizeof *shifted);
    float *logits = malloc((size_t)B * T * f.cfg.vocab_size * sizeof *logits);
    float *part_logits = malloc((size_t)PART * T * f.cfg.vocab_size * sizeof *part_logits);
    assert_true(ids && labels && shifted && logits && part_logits);
    random_batch(B, T, f.cfg.vocab_size, 9, ids, labels);
    int64_t count = k_shift_labels(labels, shifted, B, T), n;
    float dscale = (float)(1.0 / count), whole, sum = 0, part;
    forward_backward(&f.m, ids, labels, B, T, dscale, &whole, &n, logits);
    size_t ng;
    float *g_whole = all_grads(&f.m, &ng);
    llama_model_zero_grad(&f.m);
    double worst_logits = 0;
    for (int b = 0; b < B; b += PART) {
        int rows = B - b < PART ? B - b : PART;
        forward_backward(&f.m, ids + b * T, labels + b * T, rows, T, dscale, &part, &n, part_logits);
        sum += part;
        size_t len = (size_t)rows * T * f.cfg.vocab_size;
        double e = rel_error(part_logits, logits + (size_t)b * T * f.cfg.vocab_size, len);
        worst_logits = e > worst_logits ? e : worst_logits;
    }
    float *g_parts = all_grads(&f.m, &ng);
    double e = rel_error(g_parts, g_whole, ng);
    printf("head in chunks (%d rows): loss %.6f vs %.6f, logits rel %.2e, gradients rel %.2e\n",
           B * T, whole, sum, worst_logits, e);
    assert_true(fabs((double)sum - whole) <= 1e-5 * fabs(whole));
    assert_true(worst_logits <= 1e-6 && e <= 1e-5);
    free(ids), free(labels), free(shifted), free(logits), free(part_logits), free(g_whole), free(g_parts);
    fixture_free(&f);
}

/* Activation checkpointing (recompute each layer from its saved input) changes nothing. */
static void test_activation_checkpointing(void **state) {
    (void)state;
    fixture plain, ckpt;
    fixture_init(&plain, 3, 0);
    fixture_init(&ckpt, 3, 1);
    int32_t ids[RB * RT], labels[RB * RT];
    random_batch(RB, RT, plain.cfg.vocab_size, 8, ids, labels);
    float l1, l2;
    int64_t n1, n2;
    forward_backward(&plain.m, ids, labels, RB, RT, 0.1f, &l1, &n1, NULL);
    forward_backward(&ckpt.m, ids, labels, RB, RT, 0.1f, &l2, &n2, NULL);
    size_t n;
    float *g1 = all_grads(&plain.m, &n), *g2 = all_grads(&ckpt.m, &n);
    assert_true(l1 == l2);
    double e = rel_error(g2, g1, n);
    assert_true(e <= 1e-6);
    free(g1), free(g2);
    fixture_free(&plain);
    fixture_free(&ckpt);
}

/* (6) Packing: a packed row's summed token loss and every gradient equal the sums over its
 * documents run one by one, each alone at the start of a row of the same length, padded
 * (positions restart at each document, no token attends across a boundary).  Each
 * document's first label is -100, as the data side makes it; the count is the real one.
 * (RoPE scores depend on relative positions only, so restarting them changes these numbers
 * only by rounding: test_kernels_cpu's test_rope_positions_restart checks the positions.) */
enum { PB = 2, PT = 16 };

/* Packs rows of documents of lengths lens[b][..] (0-terminated, summing to PT): positions
 * restart at 0 at each document and each document's first label is masked. */
static void pack_rows(const int lens[PB][6], int32_t *labels, int32_t *positions) {
    for (int b = 0; b < PB; b++)
        for (int d = 0, t = 0; lens[b][d]; t += lens[b][d++])
            for (int i = 0; i < lens[b][d]; i++) {
                positions[b * PT + t + i] = i;
                if (i == 0) labels[b * PT + t] = K_IGNORE_INDEX;
            }
}

static void check_packed_equals_documents(int checkpoint) {
    static const int lens[PB][6] = {{1, 5, 3, 7}, {6, 1, 9}};
    fixture packed, alone;
    fixture_init(&packed, 31, checkpoint);
    fixture_init(&alone, 31, checkpoint);
    int32_t ids[PB * PT], labels[PB * PT], positions[PB * PT];
    random_batch(PB, PT, packed.cfg.vocab_size, 9, ids, labels);
    pack_rows(lens, labels, positions);
    errbuf err = {{0}};
    float loss;
    int64_t count;
    int32_t start[PB * PT], end[PB * PT];
    if (llama_doc_bounds(positions, PB, PT, start, end, &err) ||
        llama_model_forward_backward_packed(&packed.m, ids, labels, start, end, PB, PT, 1.0f,
                                            &loss, &count, NULL, &err))
        fail_msg("%s", err.msg);

    double loss_sum = 0.0;
    int64_t count_sum = 0;
    for (int b = 0; b < PB; b++)
        for (int d = 0, t = 0; lens[b][d]; t += lens[b][d++]) {
            int32_t row_ids[PT], row_labels[PT];
            for (int i = 0; i < PT; i++) { /* the document, then padding */
                int in_doc = i < lens[b][d];
                row_ids[i] = in_doc ? ids[b * PT + t + i] : 0;
                row_labels[i] = in_doc ? labels[b * PT + t + i] : K_IGNORE_INDEX;
            }
            float l;
            int64_t n;
            forward_backward(&alone.m, row_ids, row_labels, 1, PT, 1.0f, &l, &n, NULL);
            loss_sum += l;
            count_sum += n;
        }
    size_t n;
    float *g_packed = all_grads(&packed.m, &n), *g_alone = all_grads(&alone.m, &n);
    double e = rel_error(g_packed, g_alone, n);
    printf("packing (checkpoint %d): loss %.6f vs %.6f, gradients rel %.2e\n", checkpoint, loss,
           loss_sum, e);
    assert_int_equal(count, count_sum);
    assert_true(fabs(loss - loss_sum) <= 1e-5 * loss_sum);
    assert_true(e <= 1e-5);
    free(g_packed), free(g_alone);
    fixture_free(&packed);
    fixture_free(&alone);
}

static void test_packed_equals_documents(void **state) {
    (void)state;
    check_packed_equals_documents(0);
    check_packed_equals_documents(1);
}

/* (6b) A packed row of 64k tokens (F46's long sequences; a data.pack row of many documents):
 * each document's loss and token count are those of the document run alone in a row of its
 * own length, and the row's summed loss and every gradient the sums over the documents.  The
 * documents are 1 to LONG_DOC tokens (a one-token document has no label).  Each document's
 * own loss out of the packed row: the row again with every other document's labels -100. */
enum { LONG_T = 65536, LONG_DOC = 256 };

static void test_packed_long_row(void **state) {
    (void)state;
    llama_config cfg = small_config();
    cfg.max_position_embeddings = LONG_T; /* a model whose RoPE covers the row (llama3, 8 x 8192) */
    cfg.rope.original_max_position_embeddings = LONG_T / 8;
    fixture packed, alone;
    fixture_init_config(&packed, &cfg, 41, 0);
    fixture_init_config(&alone, &cfg, 41, 0);
    size_t bytes = LONG_T * sizeof(int32_t);
    int32_t *ids = xmalloc(bytes), *labels = xmalloc(bytes), *positions = xmalloc(bytes);
    int32_t *start = xmalloc(bytes), *end = xmalloc(bytes), *only = xmalloc(bytes);
    int *lens = xmalloc(LONG_T * sizeof *lens), n_docs = 0, longest = 0;
    random_batch(1, LONG_T, cfg.vocab_size, 12, ids, labels);
    for (int t = 0; t < LONG_T; t += lens[n_docs++]) {
        int len = 1 + (int)(rng_u64(13, 1, (uint64_t)n_docs) % LONG_DOC);
        lens[n_docs] = len < LONG_T - t ? len : LONG_T - t;
        for (int i = 0; i < lens[n_docs]; i++) positions[t + i] = i;
        labels[t] = K_IGNORE_INDEX;
        if (lens[n_docs] > lens[longest]) longest = n_docs;
    }
    errbuf err = {{0}};
    float loss;
    int64_t count;
    if (llama_doc_bounds(positions, 1, LONG_T, start, end, &err) ||
        llama_model_forward_backward_packed(&packed.m, ids, labels, start, end, 1, LONG_T, 1.0f,
                                            &loss, &count, NULL, &err))
        fail_msg("%s", err.msg);

    double loss_sum = 0.0;
    int64_t count_sum = 0;
    float *doc_loss = xmalloc((size_t)n_docs * sizeof *doc_loss);
    int64_t *doc_count = xmalloc((size_t)n_docs * sizeof *doc_count);
    for (int d = 0, t = 0; d < n_docs; t += lens[d++]) {
        forward_backward(&alone.m, ids + t, labels + t, 1, lens[d], 1.0f, &doc_loss[d], &doc_count[d], NULL);
        loss_sum += doc_loss[d];
        count_sum += doc_count[d];
    }
    size_t n;
    float *g_packed = all_grads(&packed.m, &n), *g_alone = all_grads(&alone.m, &n);
    double e = rel_error(g_packed, g_alone, n);
    printf("a packed row of %d tokens, %d documents: loss %.3f vs %.3f, gradients rel %.2e\n",
           LONG_T, n_docs, loss, loss_sum, e);
    assert_true(n_docs > 300);
    assert_int_equal(count, count_sum);
    assert_true(fabs(loss - loss_sum) <= 1e-5 * loss_sum);
    assert_true(e <= 1e-5);

    const int check[] = {0, longest, n_docs - 1};
    for (size_t k = 0; k < sizeof check / sizeof check[0]; k++) {
        int d = check[k], t = 0;
        for (int i = 0; i < d; i++) t += lens[i];
        for (int i = 0; i < LONG_T; i++) only[i] = i >= t && i < t + lens[d] ? labels[i] : K_IGNORE_INDEX;
        float l;
        int64_t c;
        if (llama_model_forward_backward_packed(&packed.m, ids, only, start, end, 1, LONG_T, 0.0f, &l,
                                                &c, NULL, &err))
            fail_msg("%s", err.msg);
        printf("document %d (%d tokens at %d): loss %.6f, alone %.6f\n", d, lens[d], t, l, doc_loss[d]);
        assert_int_equal(c, doc_count[d]);
        assert_true(fabs(l - doc_loss[d]) <= 1e-5 * fabs(doc_loss[d]) + 1e-6);
    }
    free(g_packed), free(g_alone), free(doc_loss), free(doc_count), free(lens);
    free(ids), free(labels), free(positions), free(start), free(end), free(only);
    fixture_free(&packed);
    fixture_free(&alone);
}

/* Positions must restart at 0 or count up by one; and one document a row is the unpacked batch. */
static void test_packed_positions(void **state) {
    (void)state;
    int32_t pos[2 * 4] = {0, 1, 0, 1, 0, 1, 2, 3}, start[8], end[8];
    errbuf err = {{0}};
    assert_int_equal(llama_doc_bounds(pos, 2, 4, start, end, &err), 0);
    const int32_t want_start[8] = {0, 0, 2, 2, 0, 0, 0, 0}, want_end[8] = {2, 2, 4, 4, 4, 4, 4, 4};
    assert_memory_equal(start, want_start, sizeof start);
    assert_memory_equal(end, want_end, sizeof end);
    pos[3] = 2;
    assert_int_equal(llama_doc_bounds(pos, 2, 4, start, end, &err), -1);
    assert_non_null(strstr(err.msg, "positions[0,3] = 2"));
    pos[3] = 1;
    pos[4] = 1; /* a row must start a document */
    assert_int_equal(llama_doc_bounds(pos, 2, 4, start, end, &err), -1);
    assert_non_null(strstr(err.msg, "positions[1,0] = 1"));

    /* so does a batch made of them, and a packed batch of one document a row is the plain
     * one; the model refuses bounds that do not tile a row */
    fixture f;
    fixture_init(&f, 2, 0);
    int32_t ids[RB * RT], labels[RB * RT], positions[RB * RT], bs[RB * RT], be[RB * RT];
    random_batch(RB, RT, f.cfg.vocab_size, 6, ids, labels);
    for (int i = 0; i < RB * RT; i++) positions[i] = i % RT;
    positions[RT + 2] = 7;
    float l1, l2;
    int64_t n1, n2;
    assert_int_equal(llama_doc_bounds(positions, RB, RT, bs, be, &err), -1);
    assert_non_null(strstr(err.msg, "positions[1,2] = 7"));
    positions[RT + 2] = 2;
    if (llama_doc_bounds(positions, RB, RT, bs, be, &err) ||
        llama_model_forward_backward_packed(&f.m, ids, labels, bs, be, RB, RT, 1.0f, &l1, &n1,
                                            NULL, &err))
        fail_msg("%s", err.msg);
    forward_backward(&f.m, ids, labels, RB, RT, 1.0f, &l2, &n2, NULL);
    assert_true(l1 == l2);
    assert_int_equal(n1, n2);
    bs[RT + 2] = 1; /* token [1,2] in a document that starts at 1, which [1,1] is not in */
    assert_int_equal(llama_model_forward_backward_packed(&f.m, ids, labels, bs, be, RB, RT,
                                                         1.0f, &l1, &n1, NULL, &err), -1);
    assert_non_null(strstr(err.msg, "of token [1,2] do not tile the row"));
    bs[RT + 2] = 0;
    be[RT - 1] = RT - 1; /* a document that ends before its last token */
    assert_int_equal(llama_check_docs(bs, be, RB, RT, &err), -1);
    assert_non_null(strstr(err.msg, "of token [0,"));
    fixture_free(&f);
}

/* (5) Bad inputs and bad checkpoints are errors that name what is wrong. */
/* YaRN's attention factor s multiplies cos and sin, so q and k after RoPE: a yarn model with
 * factor 1 (the frequencies unchanged) and s = 1.3 is a default-RoPE model whose q_proj and
 * k_proj (Qwen2's biases with them) are s times as large.  The logits agree, and by the chain
 * rule the yarn model's gradients of those four tensors are s times the scaled model's (the
 * others equal). */
static void test_yarn_attention_factor(void **state) {
    (void)state;
    const float s = 1.3f;
    llama_config c = small_config();
    c.tie_word_embeddings = 0;
    c.family = FAMILY_QWEN2;
    c.attention_bias = 1;
    llama_config yarn = c;
    c.rope = (rope_config){.type = ROPE_DEFAULT, .theta = 100.0};
    yarn.rope = (rope_config){.type = ROPE_YARN, .theta = 100.0, .factor = 1.0, .beta_fast = 32,
                              .beta_slow = 1, .truncate = 1, .attention_factor = s,
                              .original_max_position_embeddings = 32};
    assert_true(rope_attention_factor(&yarn.rope) == s);
    kctx ctx;
    errbuf err = {{0}};
    llama_model m[2];
    if (kctx_init(&ctx, K_CPU, 0, &err) || llama_model_init(&m[0], &yarn, &ctx, 0, &err) ||
        llama_model_init(&m[1], &c, &ctx, 0, &err))
        fail_msg("%s", err.msg);
    const llama_layout *lo = &m[0].layout;
    for (int i = 0; i < lo->n_tensors; i++) {
        const llama_tensor_slot *t = &lo->tensors[i];
        float *w = xmalloc(t->numel * sizeof *w);
        rng_fill_normal(w, t->numel, 0.3f, 77, (uint64_t)i, 0);
        if (t->is_norm)
            for (size_t j = 0; j < t->numel; j++) w[j] += 1.0f;
        if (llama_model_set_param(&m[0], t->name, w, t->numel, &err)) fail_msg("%s", err.msg);
        int scaled = strstr(t->name, "q_proj") || strstr(t->name, "k_proj");
        for (size_t j = 0; scaled && j < t->numel; j++) w[j] *= s;
        if (llama_model_set_param(&m[1], t->name, w, t->numel, &err)) fail_msg("%s", err.msg);
        free(w);
    }
    int32_t ids[RB * RT], labels[RB * RT];
    random_batch(RB, RT, c.vocab_size, 5, ids, labels);
    size_t nl = (size_t)RB * RT * c.vocab_size;
    float *logits[2] = {xmalloc(nl * sizeof(float)), xmalloc(nl * sizeof(float))};
    float loss[2];
    int64_t count;
    for (int k = 0; k < 2; k++)
        if (llama_model_forward_backward(&m[k], ids, labels, RB, RT, 1.0f, &loss[k], &count,
                                         logits[k], &err))
            fail_msg("%s", err.msg);
    double d = 0, n = 0;
    for (size_t j = 0; j < nl; j++) d += pow(logits[0][j] - logits[1][j], 2), n += pow(logits[1][j], 2);
    double logits_rel = sqrt(d / n);
    if (logits_rel > 1e-5) fail_msg("yarn logits rel %.3e off the scaled model's", logits_rel);
    for (int i = 0; i < lo->n_tensors; i++) {
        const llama_tensor_slot *t = &lo->tensors[i];
        float *g[2] = {xmalloc(t->numel * sizeof(float)), xmalloc(t->numel * sizeof(float))};
        for (int k = 0; k < 2; k++)
            if (llama_model_get_grad(&m[k], t->name, g[k], t->numel, &err)) fail_msg("%s", err.msg);
        float mul = strstr(t->name, "q_proj") || strstr(t->name, "k_proj") ? s : 1.0f;
        d = n = 0;
        for (size_t j = 0; j < t->numel; j++) d += pow(g[0][j] - mul * g[1][j], 2), n += pow(mul * g[1][j], 2);
        if (!(n > 0) || sqrt(d / n) > 1e-4)
            fail_msg("%s: yarn gradient rel %.3e off %g x the scaled model's", t->name, sqrt(d / n), mul);
        free(g[0]), free(g[1]);
    }
    printf("yarn attention factor %.2f: logits rel %.2e; %d gradients as the chain rule says\n", s,
           logits_rel, lo->n_tensors);
    free(logits[0]), free(logits[1]);
    llama_model_destroy(&m[0]);
    llama_model_destroy(&m[1]);
    kctx_destroy(&ctx);
}

static void test_bad_inputs(void **state) {
    (void)state;
    fixture f;
    fixture_init(&f, 1, 0);
    int V = f.cfg.vocab_size;
    int32_t ids[RB * RT], labels[RB * RT];
    random_batch(RB, RT, V, 4, ids, labels);
    errbuf err = {{0}};
    float loss;
    int64_t count;

    ids[RT + 3] = V;
    assert_int_equal(llama_model_forward_backward(&f.m, ids, labels, RB, RT, 1.0f, &loss, &count,
                                                  NULL, &err), -1);
    assert_non_null(strstr(err.msg, "input_ids[1,3] = 37"));
    ids[RT + 3] = -1;
    assert_int_equal(llama_check_batch(&f.cfg, ids, labels, RB, RT, &err), -1);
    assert_non_null(strstr(err.msg, "input_ids[1,3] = -1"));
    ids[RT + 3] = 0;
    labels[4] = V + 5;
    assert_int_equal(llama_check_batch(&f.cfg, ids, labels, RB, RT, &err), -1);
    assert_non_null(strstr(err.msg, "labels[0,4] = 42"));
    labels[4] = K_IGNORE_INDEX;
    assert_int_equal(llama_check_batch(&f.cfg, ids, labels, RB, RT, &err), 0);
    /* past what the RoPE scaling covers (checked before a token is read) */
    assert_int_equal(llama_check_batch(&f.cfg, ids, labels, 1, (int)llama_config_max_positions(&f.cfg) + 1,
                                       &err), -1);
    if (!strstr(err.msg, "max_position_embeddings")) fail_msg("%s", err.msg);

    /* Parameters by name: unknown names and wrong sizes. */
    float one = 1.0f;
    assert_int_equal(llama_model_set_param(&f.m, "model.layers.9.mlp.up_proj.weight", &one, 1,
                                           &err), -1);
    assert_non_null(strstr(err.msg, "model.layers.9.mlp.up_proj.weight"));
    assert_int_equal(llama_model_get_grad(&f.m, "model.norm.weight", &one, 1, &err), -1);
    assert_non_null(strstr(err.msg, "model.norm.weight"));
    fixture_free(&f);

    /* A checkpoint that does not fit the config: a wrong shape, a missing layer. */
    char dir[512];
    fixture_path(dir, sizeof dir, "golden/tiny-mha");
    llama_config cfg;
    st_model st;
    if (llama_config_load(&cfg, dir, &err) || st_model_open(&st, dir, &err))
        fail_msg("%s", err.msg);
    kctx ctx;
    llama_model m;
    if (kctx_init(&ctx, K_CPU, 0, &err)) fail_msg("%s", err.msg);
    cfg.intermediate_size = 100;
    if (llama_model_init(&m, &cfg, &ctx, 0, &err)) fail_msg("%s", err.msg);
    assert_int_equal(llama_model_load_hf(&m, &st, &err), -1);
    assert_non_null(strstr(err.msg, "model.layers.0.mlp.gate_proj.weight has shape [172, 64], "
                                    "expected [100, 64]"));
    llama_model_destroy(&m);
    cfg.intermediate_size = 172;
    cfg.num_hidden_layers = 3;
    if (llama_model_init(&m, &cfg, &ctx, 0, &err)) fail_msg("%s", err.msg);
    assert_int_equal(llama_model_load_hf(&m, &st, &err), -1);
    assert_non_null(strstr(err.msg, "model.layers.2.self_attn.q_proj.weight is missing"));
    llama_model_destroy(&m);
    kctx_destroy(&ctx);
    st_model_close(&st);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_tiny_mha),
        cmocka_unit_test(test_layout_matches_config_params),
        cmocka_unit_test(test_small_gqa_model_gradients),
        cmocka_unit_test(test_loss_normalisation_across_calls),
        cmocka_unit_test(test_head_in_chunks),
        cmocka_unit_test(test_activation_checkpointing),
        cmocka_unit_test(test_bad_inputs),
        cmocka_unit_test(test_packed_equals_documents),
        cmocka_unit_test(test_packed_long_row),
        cmocka_unit_test(test_packed_positions),
        cmocka_unit_test(test_yarn_attention_factor),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
