/* llama_decode: generation's forward over a KV cache (see llama_decode.h), every op through
 * kernels.h, in the order llama.c's training forward runs them. */
#include "model/llama_decode.h"

#include <stdlib.h>
#include <string.h>

#include "base/bytes.h"
#include "model/llama.h"

#define ALIGN 256 /* bytes: what CUDA allocations guarantee */

/* Token rows one pass of the whole-model decoder holds, at least (prompts go in chunks). */
#define DECODE_CHUNK 512

static void *carve(char *base, size_t *used, size_t bytes) {
    void *p = base ? base + *used : NULL;
    *used += round_up(bytes, ALIGN);
    return p;
}

size_t llama_decode_acts_carve(llama_decode_acts *a, void *mem, const llama_layout *lo,
                               size_t elem_size, int N, int rows) {
    const llama_config *cfg = &lo->cfg;
    size_t n = (size_t)N, e = elem_size, used = 0, C = (size_t)cfg->hidden_size;
    size_t Q = (size_t)cfg->num_attention_heads * cfg->head_dim;
    size_t KV = (size_t)cfg->num_key_value_heads * cfg->head_dim, I = (size_t)cfg->intermediate_size;
    a->ln = carve(mem, &used, n * C * e);
    a->q = carve(mem, &used, n * Q * e);
    a->k = carve(mem, &used, n * KV * e);
    a->v = carve(mem, &used, n * KV * e);
    a->att = carve(mem, &used, n * Q * e);
    a->h = carve(mem, &used, n * C * e);
    a->gate = carve(mem, &used, n * I * e);
    a->up = carve(mem, &used, n * I * e);
    a->sw = carve(mem, &used, n * I * e);
    a->rstd = carve(mem, &used, n * sizeof(float));
    a->rstd_qk = carve(mem, &used, n * (size_t)cfg->num_attention_heads * sizeof(float));
    a->logits = carve(mem, &used, (size_t)rows * cfg->vocab_size * e);
    return used;
}

/* Tensor `index` of a unit's gathered buffer. */
static const void *tensor_at(kctx *c, const llama_layout *lo, const void *params, int unit,
                             int index) {
    return (const char *)params + lo->tensors[lo->units[unit].first + index].offset * k_compute_size(c);
}

#define W(t) tensor_at(c, lo, params, llama_layer_unit(0), lo->layer_index[t]) /* layers share offsets */

void llama_layer_decode(kctx *c, const llama_layout *lo, const void *params,
                        const float *inv_freq, void *k_cache, void *v_cache,
                        const int32_t *pos, int T_max, const void *x, void *out,
                        llama_decode_acts *a, int B, int S) {
    const llama_config *cfg = &lo->cfg;
    int N = B * S, C = cfg->hidden_size, I = cfg->intermediate_size, hd = cfg->head_dim;
    int Hq = cfg->num_attention_heads, Hkv = cfg->num_key_value_heads;
    float eps = (float)cfg->rms_norm_eps;
    k_rmsnorm_fwd(c, a->ln, a->rstd, x, W(LLAMA_LN1), N, C, eps);
    k_linear_fwd(c, a->q, a->ln, W(LLAMA_Q), N, C, Hq * hd);
    k_linear_fwd(c, a->k, a->ln, W(LLAMA_K), N, C, Hkv * hd);
    k_linear_fwd(c, a->v, a->ln, W(LLAMA_V), N, C, Hkv * hd);
    if (cfg->attention_bias) { /* Qwen2's */
        k_bias_fwd(c, a->q, W(LLAMA_Q_BIAS), N, Hq * hd);
        k_bias_fwd(c, a->k, W(LLAMA_K_BIAS), N, Hkv * hd);
        k_bias_fwd(c, a->v, W(LLAMA_V_BIAS), N, Hkv * hd);
    }
    if (cfg->qk_norm) { /* Qwen3's per-head RMSNorm, before RoPE (in place: a row at a time) */
        k_rmsnorm_fwd(c, a->q, a->rstd_qk, a->q, W(LLAMA_Q_NORM), N * Hq, hd, eps);
        k_rmsnorm_fwd(c, a->k, a->rstd_qk, a->k, W(LLAMA_K_NORM), N * Hkv, hd, eps);
    }
    /* yarn's attention factor: training scales q and k after RoPE, a rotation, so before it
     * is the same */
    double af = rope_attention_factor(&cfg->rope);
    if (af != 1.0) {
        k_scale(c, a->q, (float)af, (size_t)N * Hq * hd);
        k_scale(c, a->k, (float)af, (size_t)N * Hkv * hd);
    }
    k_attention_kv(c, a->att, a->q, a->k, a->v, k_cache, v_cache, pos, inv_freq, B, S, T_max, Hq,
                   Hkv, hd);
    k_linear_fwd(c, a->h, a->att, W(LLAMA_O), N, Hq * hd, C);
    k_accumulate(c, a->h, x, (size_t)N * C);
    k_rmsnorm_fwd(c, a->ln, a->rstd, a->h, W(LLAMA_LN2), N, C, eps);
    k_linear_fwd(c, a->gate, a->ln, W(LLAMA_GATE), N, C, I);
    k_linear_fwd(c, a->up, a->ln, W(LLAMA_UP), N, C, I);
    k_swiglu_fwd(c, a->sw, a->gate, a->up, (size_t)N * I);
    k_linear_fwd(c, out, a->sw, W(LLAMA_DOWN), N, I, C);
    k_accumulate(c, out, a->h, (size_t)N * C);
}

void llama_head_logits(kctx *c, const llama_layout *lo, const void *head_params,
                       const void *embed_params, const void *x, llama_decode_acts *a,
                       float *logits_f32, int n) {
    const llama_config *cfg = &lo->cfg;
    int C = cfg->hidden_size, V = cfg->vocab_size, hu = llama_head_unit(lo);
    const void *head_w = cfg->tie_word_embeddings ? embed_params
                                                  : tensor_at(c, lo, head_params, hu, LLAMA_LM_HEAD);
    k_rmsnorm_fwd(c, a->ln, a->rstd, x, tensor_at(c, lo, head_params, hu, LLAMA_NORM), n, C,
                  (float)cfg->rms_norm_eps);
    k_linear_fwd(c, a->logits, a->ln, head_w, n, C, V);
    k_compute_to_f32(c, logits_f32, a->logits, (size_t)n * V);
}

/* ---- the whole model in one process ---- */

static int alloc_all(llama_decoder *d, errbuf *err) {
    const llama_layout *lo = &d->layout;
    const llama_config *cfg = &lo->cfg;
    kctx *c = d->ctx;
    size_t cs = k_compute_size(c), total = 0;
    for (int u = 0; u < lo->n_units; u++) total += round_up(lo->units[u].numel * cs, ALIGN);
    if (!(d->param_memory = k_alloc(c, total, err))) return -1;
    total = 0;
    for (int u = 0; u < lo->n_units; u++) {
        d->params[u] = (char *)d->param_memory + total;
        total += round_up(lo->units[u].numel * cs, ALIGN);
    }
    size_t kv = (size_t)cfg->num_key_value_heads * cfg->head_dim;
    size_t cache = round_up((size_t)d->max_batch * d->max_len * kv * cs, ALIGN);
    if (!(d->cache_memory = k_alloc(c, 2 * (size_t)lo->n_layers * cache, err))) return -1;
    for (int l = 0; l < lo->n_layers; l++) {
        d->k_cache[l] = (char *)d->cache_memory + (2 * (size_t)l) * cache;
        d->v_cache[l] = (char *)d->cache_memory + (2 * (size_t)l + 1) * cache;
    }
    size_t N = (size_t)d->max_tokens, C = (size_t)cfg->hidden_size;
    size_t resid = round_up(N * C * cs, ALIGN), small = round_up(N * sizeof(int32_t), ALIGN);
    size_t half = round_up((size_t)cfg->head_dim / 2 * sizeof(float), ALIGN);
    size_t logits = round_up((size_t)d->max_batch * cfg->vocab_size * sizeof(float), ALIGN);
    size_t acts = llama_decode_acts_carve(&d->acts, NULL, lo, cs, d->max_tokens, d->max_batch);
    char *m = d->act_memory = k_alloc(c, acts + 2 * resid + 2 * small + half + logits, err);
    if (!m) return -1;
    llama_decode_acts_carve(&d->acts, m, lo, cs, d->max_tokens, d->max_batch);
    d->resid[0] = m + acts;
    d->resid[1] = m + acts + resid;
    d->tokens = (int32_t *)(m + acts + 2 * resid);
    d->pos = (int32_t *)(m + acts + 2 * resid + small);
    d->inv_freq = (float *)(m + acts + 2 * resid + 2 * small);
    d->logits = (float *)(m + acts + 2 * resid + 2 * small + half);
    return 0;
}

int llama_decoder_init(llama_decoder *d, const llama_config *cfg, kctx *ctx, int max_batch,
                       int max_len, errbuf *err) {
    memset(d, 0, sizeof *d);
    if (max_batch < 1 || max_len < 1 || max_len > cfg->max_position_embeddings)
        return errf(err, "decoder: %d rows of %d positions (max_position_embeddings %d)",
                    max_batch, max_len, cfg->max_position_embeddings);
    /* The cache's attention sees every earlier position: within the window that is the band. */
    if (cfg->sliding_window > 0 && max_len > cfg->sliding_window)
        return errf(err, "decoder: %d positions, past the model's sliding_window %d: generation beyond the window "
                         "is not built yet (fewer --max-new-tokens, or a shorter prompt)",
                    max_len, cfg->sliding_window);
    if (llama_layout_init(&d->layout, cfg, err)) return -1;
    d->ctx = ctx;
    d->max_batch = max_batch;
    d->max_len = max_len;
    int chunk = max_len < DECODE_CHUNK ? max_len : DECODE_CHUNK;
    d->max_tokens = max_batch > chunk ? max_batch : chunk;
    const llama_layout *lo = &d->layout;
    d->params = calloc((size_t)lo->n_units, sizeof *d->params);
    d->k_cache = calloc((size_t)lo->n_layers, sizeof *d->k_cache);
    d->v_cache = calloc((size_t)lo->n_layers, sizeof *d->v_cache);
    float *inv_freq = malloc((size_t)cfg->head_dim / 2 * sizeof *inv_freq);
    int rc = d->params && d->k_cache && d->v_cache && inv_freq ? 0 : errf(err, "out of host memory");
    if (!rc) rc = alloc_all(d, err);
    if (!rc) {
        llama_rope_inv_freq(cfg, inv_freq);
        k_copy_h2d(ctx, d->inv_freq, inv_freq, (size_t)cfg->head_dim / 2 * sizeof(float));
        rc = k_sync(ctx, err);
    }
    free(inv_freq);
    if (rc) {
        llama_decoder_destroy(d);
        return errprefix(err, "decoder");
    }
    return 0;
}

void llama_decoder_destroy(llama_decoder *d) {
    if (d->ctx) {
        void *bufs[] = {d->param_memory, d->cache_memory, d->act_memory};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
            if (bufs[i]) k_free(d->ctx, bufs[i]);
    }
    free(d->params);
    free(d->k_cache);
    free(d->v_cache);
    llama_layout_free(&d->layout);
    memset(d, 0, sizeof *d);
}

static void *param_of(llama_decoder *d, const llama_tensor_slot *s) {
    return (char *)d->params[s->unit] + s->offset * k_compute_size(d->ctx);
}

/* src (host fp32 [n]) into dst in the compute dtype, through a staging buffer. */
static int upload(kctx *c, void *dst, const float *src, size_t n, errbuf *err) {
    float *tmp = k_alloc(c, n * sizeof(float), err);
    if (!tmp) return -1;
    k_copy_h2d(c, tmp, src, n * sizeof(float));
    k_f32_to_compute(c, dst, tmp, n);
    int rc = k_sync(c, err);
    k_free(c, tmp);
    return rc;
}

int llama_decoder_set_param(llama_decoder *d, const llama_tensor_slot *slot, const float *src,
                            errbuf *err) {
    return upload(d->ctx, param_of(d, slot), src, slot->numel, err) ? errprefix(err, "%s", slot->name) : 0;
}

int llama_decoder_load_hf(llama_decoder *d, const st_model *st, errbuf *err) {
    const llama_layout *lo = &d->layout;
    float *buf = malloc(lo->max_tensor_numel * sizeof *buf);
    if (!buf) return errf(err, "decoder: out of host memory");
    int rc = 0;
    for (int i = 0; rc == 0 && i < lo->n_tensors; i++) {
        const llama_tensor_slot *s = &lo->tensors[i];
        rc = llama_read_tensor_f32(s, st, buf, err);
        if (rc == 0) rc = llama_decoder_set_param(d, s, buf, err);
    }
    free(buf);
    return rc;
}

/* W [out, in] += (scale B) [out, r] (A^T)^T: k_linear_fwd_acc with A transposed on the host. */
int llama_decoder_merge_lora(llama_decoder *d, int layer, int module, const float *A,
                             const float *B, int rank, float scale, errbuf *err) {
    const llama_layout *lo = &d->layout;
    const llama_tensor_slot *s = &lo->tensors[lo->units[llama_layer_unit(layer)].first + module];
    int out = (int)s->shape[0], in = (int)s->shape[1];
    kctx *c = d->ctx;
    size_t cs = k_compute_size(c), nb = (size_t)out * rank, na = (size_t)in * rank;
    float *host = malloc((nb + na) * sizeof *host);
    char *dev = host ? k_alloc(c, round_up(nb * cs, ALIGN) + na * cs, err) : NULL;
    int rc = dev ? 0 : host ? -1 : errf(err, "out of host memory");
    if (!rc) {
        for (size_t i = 0; i < nb; i++) host[i] = scale * B[i];
        for (int r = 0; r < rank; r++)
            for (int j = 0; j < in; j++) host[nb + (size_t)j * rank + r] = A[(size_t)r * in + j];
        void *bs = dev, *at = dev + round_up(nb * cs, ALIGN);
        rc = upload(c, bs, host, nb, err);
        if (!rc) rc = upload(c, at, host + nb, na, err);
        if (!rc) {
            k_linear_fwd_acc(c, param_of(d, s), bs, at, out, rank, in);
            rc = k_sync(c, err);
        }
    }
    if (dev) k_free(c, dev);
    free(host);
    return rc ? errprefix(err, "merging the adapter of %s", s->name) : 0;
}

/* One pass of S new tokens of B rows, B * S <= max_tokens; logits of each row's last one. */
static int forward_pass(llama_decoder *d, int row0, int B, int S, const int32_t *tokens,
                        const int32_t *pos, float *logits, errbuf *err) {
    const llama_layout *lo = &d->layout;
    kctx *c = d->ctx;
    size_t cs = k_compute_size(c), C = (size_t)lo->cfg.hidden_size, V = (size_t)lo->cfg.vocab_size;
    size_t row_cache = (size_t)row0 * d->max_len * lo->cfg.num_key_value_heads * lo->cfg.head_dim * cs;
    k_copy_h2d(c, d->tokens, tokens, (size_t)B * S * sizeof(int32_t));
    k_copy_h2d(c, d->pos, pos, (size_t)B * sizeof(int32_t));
    llama_embed_forward(c, lo, d->params[LLAMA_EMBED_UNIT], d->tokens, d->resid[0], B * S);
    int at = 0;
    for (int l = 0; l < lo->n_layers; l++, at ^= 1)
        llama_layer_decode(c, lo, d->params[llama_layer_unit(l)], d->inv_freq,
                           (char *)d->k_cache[l] + row_cache, (char *)d->v_cache[l] + row_cache,
                           d->pos, d->max_len, d->resid[at], d->resid[at ^ 1], &d->acts, B, S);
    const void *head = d->params[llama_head_unit(lo)], *embed = d->params[LLAMA_EMBED_UNIT];
    if (S == 1) {
        llama_head_logits(c, lo, head, embed, d->resid[at], &d->acts, d->logits, B);
    } else {
        for (int b = 0; b < B; b++)
            llama_head_logits(c, lo, head, embed,
                              (char *)d->resid[at] + ((size_t)b * S + S - 1) * C * cs, &d->acts,
                              d->logits + (size_t)b * V, 1);
    }
    k_copy_d2h(c, logits, d->logits, (size_t)B * V * sizeof(float));
    return k_sync(c, err);
}

int llama_decoder_forward(llama_decoder *d, int row0, int B, int S, const int32_t *tokens,
                          const int32_t *pos, float *logits, errbuf *err) {
    if (row0 < 0 || B < 1 || S < 1 || row0 + B > d->max_batch)
        return errf(err, "decoder: rows %d .. %d of %d", row0, row0 + B - 1, d->max_batch);
    for (int b = 0; b < B; b++)
        if (pos[b] < 0 || pos[b] + S > d->max_len)
            return errf(err, "decoder: row %d's %d new tokens at position %d pass its %d positions",
                        row0 + b, S, pos[b], d->max_len);
    if (llama_check_batch(&d->layout.cfg, tokens, NULL, B, S, err)) return errprefix(err, "decoder");
    if ((size_t)B * S <= (size_t)d->max_tokens)
        return forward_pass(d, row0, B, S, tokens, pos, logits, err);
    if (B > 1) return errf(err, "decoder: %d rows of %d tokens pass one pass's %d", B, S, d->max_tokens);
    /* one long row (a prompt), in chunks: each chunk's keys join the cache for the next */
    for (int s0 = 0; s0 < S; s0 += d->max_tokens) {
        int n = S - s0 < d->max_tokens ? S - s0 : d->max_tokens, p = pos[0] + s0;
        if (forward_pass(d, row0, 1, n, tokens + s0, &p, logits, err)) return -1;
    }
    return 0;
}

static int gen_forward(void *self, int row0, int B, int S, const int32_t *tokens,
                       const int32_t *pos, float *logits, errbuf *err) {
    return llama_decoder_forward(self, row0, B, S, tokens, pos, logits, err);
}

gen_model llama_decoder_gen_model(llama_decoder *d) {
    return (gen_model){.self = d, .forward = gen_forward, .vocab_size = d->layout.cfg.vocab_size,
                       .rows = d->max_batch, .max_positions = d->max_len};
}
