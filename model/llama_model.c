/* llama_model: the whole Llama model in one process (llm.c style): one struct owning every
 * unit's parameters and gradients and the activations of one forward/backward. */
#include "base/bytes.h"
#include "model/llama.h"

#include <stdlib.h>
#include <string.h>

#define UNIT_ALIGN 256 /* bytes; every unit's buffer starts aligned like a CUDA allocation */


/* Units lie back to back in one allocation: unit u starts at byte offsets[u] (n_units + 1
 * entries, the last being the total). */
static void unit_offsets(const llama_layout *lo, size_t elem_size, size_t *offsets) {
    offsets[0] = 0;
    for (int u = 0; u < lo->n_units; u++)
        offsets[u + 1] = offsets[u] + round_up(lo->units[u].numel * elem_size, UNIT_ALIGN);
}

static int alloc_params_and_grads(llama_model *m, errbuf *err) {
    const llama_layout *lo = &m->layout;
    size_t *param_at = malloc(((size_t)lo->n_units + 1) * sizeof *param_at);
    size_t *grad_at = malloc(((size_t)lo->n_units + 1) * sizeof *grad_at);
    if (!param_at || !grad_at) {
        free(param_at);
        free(grad_at);
        return errf(err, "out of host memory");
    }
    unit_offsets(lo, k_compute_size(m->ctx), param_at);
    unit_offsets(lo, sizeof(float), grad_at);
    m->param_memory = k_alloc(m->ctx, param_at[lo->n_units], err);
    m->grad_memory = m->param_memory ? k_alloc(m->ctx, grad_at[lo->n_units], err) : NULL;
    for (int u = 0; m->grad_memory && u < lo->n_units; u++) {
        m->params[u] = (char *)m->param_memory + param_at[u];
        m->grads[u] = (float *)((char *)m->grad_memory + grad_at[u]);
    }
    free(param_at);
    free(grad_at);
    return m->grad_memory ? 0 : -1;
}

int llama_model_init(llama_model *m, const llama_config *cfg, kctx *ctx,
                     int checkpoint_activations, errbuf *err) {
    memset(m, 0, sizeof *m);
    m->ctx = ctx;
    m->checkpoint_activations = checkpoint_activations;
    if (llama_layout_init(&m->layout, cfg, err)) return -1;
    const llama_layout *lo = &m->layout;
    m->params = calloc((size_t)lo->n_units, sizeof *m->params);
    m->grads = calloc((size_t)lo->n_units, sizeof *m->grads);
    size_t half = (size_t)cfg->head_dim / 2;
    float *inv_freq = malloc(half * sizeof *inv_freq);
    if (!m->params || !m->grads || !inv_freq) {
        free(inv_freq);
        llama_model_destroy(m);
        return errf(err, "llama model: out of host memory");
    }
    if (alloc_params_and_grads(m, err) ||
        !(m->inv_freq = k_alloc(ctx, half * sizeof(float), err))) {
        free(inv_freq);
        llama_model_destroy(m);
        return errprefix(err, "llama model");
    }
    llama_rope_inv_freq(cfg, inv_freq);
    k_copy_h2d(ctx, m->inv_freq, inv_freq, half * sizeof(float));
    free(inv_freq);
    if (k_sync(ctx, err)) {
        llama_model_destroy(m);
        return errprefix(err, "llama model");
    }
    return 0;
}

static void free_activations(llama_model *m) {
    if (m->act_memory) k_free(m->ctx, m->act_memory);
    if (m->samples) k_free(m->ctx, m->samples);
    m->samples = NULL;
    if (m->logits_f32) k_free(m->ctx, m->logits_f32);
    free(m->resid);
    free(m->layer_acts);
    m->act_memory = NULL;
    m->logits_f32 = NULL;
    m->resid = NULL;
    m->layer_acts = NULL;
    m->B = m->T = 0;
}

void llama_model_destroy(llama_model *m) {
    if (m->ctx) {
        free_activations(m);
        void *bufs[] = {m->param_memory, m->grad_memory, m->inv_freq, m->adapter_memory,
                        m->adapter_grad_memory, m->samples};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
            if (bufs[i]) k_free(m->ctx, bufs[i]);
    }
    free(m->params);
    free(m->grads);
    free(m->adapters);
    free(m->adapter_grads);
    llama_layout_free(&m->layout);
    lora_layout_free(&m->lora_layout);
    memset(m, 0, sizeof *m);
}

int llama_model_init_lora(llama_model *m, const lora_config *cfg, uint64_t seed, errbuf *err) {
    if (m->has_lora) return errf(err, "llama model: adapters already added");
    lora_layout *ll = &m->lora_layout;
    if (lora_layout_init(ll, &m->layout.cfg, cfg, err)) return -1;
    int L = ll->n_units;
    size_t cs = k_compute_size(m->ctx), unit = ll->units[0].numel;
    size_t pbytes = round_up(unit * cs, UNIT_ALIGN), gbytes = round_up(unit * sizeof(float), UNIT_ALIGN);
    m->adapters = calloc((size_t)L, sizeof *m->adapters);
    m->adapter_grads = calloc((size_t)L, sizeof *m->adapter_grads);
    if (!m->adapters || !m->adapter_grads) return errf(err, "llama model: out of host memory");
    if (!(m->adapter_memory = k_alloc(m->ctx, (size_t)L * pbytes, err)) ||
        !(m->adapter_grad_memory = k_alloc(m->ctx, (size_t)L * gbytes, err)))
        return errprefix(err, "llama model: adapters");
    for (int l = 0; l < L; l++) {
        m->adapters[l] = (char *)m->adapter_memory + (size_t)l * pbytes;
        m->adapter_grads[l] = (float *)((char *)m->adapter_grad_memory + (size_t)l * gbytes);
    }
    k_free(m->ctx, m->grad_memory); /* the base is frozen */
    m->grad_memory = NULL;
    for (int u = 0; u < m->layout.n_units; u++) m->grads[u] = NULL;
    m->lora = (llama_lora){.layout = ll, .scale = (float)lora_scale(cfg),
                           .dropout = (float)cfg->dropout, .seed = seed};
    m->has_lora = 1;
    free_activations(m); /* re-carved with the adapters' buffers */
    return 0;
}

/* Carves every activation buffer for (B, T) out of one allocation: with mem NULL only
 * measures.  The order is the same in both passes. */
static size_t carve_activations(llama_model *m, char *mem, int B, int T) {
    const llama_layout *lo = &m->layout;
    size_t e = k_compute_size(m->ctx), N = (size_t)B * T, C = (size_t)lo->cfg.hidden_size;
    size_t resid_bytes = round_up(N * C * e, UNIT_ALIGN);
    size_t small = round_up(N * sizeof(int32_t), UNIT_ALIGN);
    size_t at = 0;
#define AT() (mem ? (void *)(mem + at) : NULL)
    for (int l = 0; l <= lo->n_layers; l++, at += resid_bytes) m->resid[l] = AT();
    m->dresid = AT();
    at += resid_bytes;
    m->tokens = AT();
    at += small;
    m->targets = AT();
    at += small;
    m->doc_start = AT();
    at += small;
    m->doc_end = AT();
    at += small;
    m->loss_sum = AT();
    at += UNIT_ALIGN;
    int n_acts = m->checkpoint_activations ? 1 : lo->n_layers;
    const lora_layout *lora = m->has_lora ? &m->lora_layout : NULL;
    for (int l = 0; l < n_acts; l++)
        at += llama_layer_acts_carve(&m->layer_acts[l], AT(), lo, lora, e, B, T);
    at += llama_head_acts_carve(&m->head, AT(), lo, e, B, T);
    at += llama_scratch_carve(&m->scratch, AT(), lo, lora, e, B, T, 0);

#undef AT
    return at;
}

static int ensure_activations(llama_model *m, int B, int T, errbuf *err) {
    if (m->act_memory && m->B == B && m->T == T) return 0;
    free_activations(m);
    int n_layers = m->layout.n_layers;
    m->resid = calloc((size_t)n_layers + 1, sizeof *m->resid);
    m->layer_acts = calloc((size_t)n_layers, sizeof *m->layer_acts);
    if (!m->resid || !m->layer_acts) {
        free_activations(m);
        return errf(err, "llama model: out of host memory");
    }
    size_t bytes = carve_activations(m, NULL, B, T);
    m->act_memory = k_alloc(m->ctx, bytes, err);
    if (!m->act_memory) {
        free_activations(m);
        return errprefix(err, "llama model: activations for batch [%d, %d]", B, T);
    }
    carve_activations(m, m->act_memory, B, T);
    if (m->has_lora && !(m->samples = k_alloc(m->ctx, (size_t)B * sizeof(int64_t), err))) {
        free_activations(m);
        return errprefix(err, "llama model: sample indices");
    }
    m->B = B;
    m->T = T;
    return 0;
}

/* ---- parameters and gradients by name ---- */

/* The slot of a base tensor or (is_adapter 1) of an adapter tensor named name. */
static const llama_tensor_slot *find_slot(const llama_model *m, const char *name, size_t n,
                                          int *is_adapter, errbuf *err) {
    const llama_tensor_slot *s = llama_layout_find(&m->layout, name);
    *is_adapter = 0;
    if (!s && m->has_lora && (s = lora_layout_find(&m->lora_layout, name))) *is_adapter = 1;
    if (!s) {
        errf(err, "llama model: no parameter named %s", name);
        return NULL;
    }
    if (s->numel != n) {
        errf(err, "llama model: %s has %zu elements, not %zu", name, s->numel, n);
        return NULL;
    }
    return s;
}

/* Where a parameter or gradient slot lives. */
static void *param_unit(llama_model *m, const llama_tensor_slot *s, int is_adapter) {
    return is_adapter ? m->adapters[s->unit] : m->params[s->unit];
}

int llama_model_set_param(llama_model *m, const char *name, const float *src, size_t n,
                          errbuf *err) {
    int ad;
    const llama_tensor_slot *s = find_slot(m, name, n, &ad, err);
    if (!s) return -1;
    kctx *c = m->ctx;
    float *staging = k_alloc(c, n * sizeof(float), err);
    if (!staging) return errprefix(err, "%s", name);
    k_copy_h2d(c, staging, src, n * sizeof(float));
    k_f32_to_compute(c, (char *)param_unit(m, s, ad) + s->offset * k_compute_size(c), staging, n);
    int rc = k_sync(c, err);
    k_free(c, staging);
    return rc ? errprefix(err, "%s", name) : 0;
}

int llama_model_get_param(llama_model *m, const char *name, float *dst, size_t n, errbuf *err) {
    int ad;
    const llama_tensor_slot *s = find_slot(m, name, n, &ad, err);
    if (!s) return -1;
    kctx *c = m->ctx;
    float *staging = k_alloc(c, n * sizeof(float), err);
    if (!staging) return errprefix(err, "%s", name);
    k_compute_to_f32(c, staging, (char *)param_unit(m, s, ad) + s->offset * k_compute_size(c), n);
    k_copy_d2h(c, dst, staging, n * sizeof(float));
    int rc = k_sync(c, err);
    k_free(c, staging);
    return rc ? errprefix(err, "%s", name) : 0;
}

int llama_model_get_grad(llama_model *m, const char *name, float *dst, size_t n, errbuf *err) {
    int ad;
    const llama_tensor_slot *s = find_slot(m, name, n, &ad, err);
    if (!s) return -1;
    float *g = ad ? m->adapter_grads[s->unit] : m->grads[s->unit];
    if (!g) return errf(err, "llama model: %s is frozen (no gradient)", name);
    k_copy_d2h(m->ctx, dst, g + s->offset, n * sizeof(float));
    return k_sync(m->ctx, err) ? errprefix(err, "%s", name) : 0;
}

void llama_model_zero_grad(llama_model *m) {
    const llama_layout *lo = &m->layout;
    for (int u = 0; u < lo->n_units; u++)
        if (m->grads[u]) k_zero(m->ctx, m->grads[u], lo->units[u].numel * sizeof(float));
    for (int l = 0; m->has_lora && l < m->lora_layout.n_units; l++)
        k_zero(m->ctx, m->adapter_grads[l], m->lora_layout.units[l].numel * sizeof(float));
}

int llama_model_load_hf(llama_model *m, const st_model *st, errbuf *err) {
    const llama_layout *lo = &m->layout;
    float *host = malloc(lo->max_tensor_numel * sizeof *host);
    if (!host) return errf(err, "%s: out of host memory", st->dir);
    for (int i = 0; i < lo->n_tensors; i++) {
        const llama_tensor_slot *s = &lo->tensors[i];
        if (llama_read_tensor_f32(s, st, host, err) ||
            llama_model_set_param(m, s->name, host, s->numel, err)) {
            free(host);
            return -1;
        }
    }
    free(host);
    return 0;
}

/* ---- forward and backward ---- */

int llama_model_forward_backward(llama_model *m, const int32_t *input_ids,
                                 const int32_t *labels, int B, int T, float dscale,
                                 float *loss_sum, int64_t *count, float *logits, errbuf *err) {
    return llama_model_forward_backward_packed(m, input_ids, labels, NULL, NULL, B, T, dscale,
                                               loss_sum, count, logits, err);
}

static llama_layer_weights layer_weights(llama_model *m, int l) {
    return (llama_layer_weights){.params = m->params[llama_layer_unit(l)],
                                 .grads = m->grads[llama_layer_unit(l)],
                                 .lora = m->has_lora ? &m->lora : NULL,
                                 .adapters = m->has_lora ? m->adapters[l] : NULL,
                                 .adapter_grads = m->has_lora ? m->adapter_grads[l] : NULL,
                                 .layer = l};
}

/* Row b of the batch is sample first_sample + b (the dropout masks' key). */
static void upload_samples(llama_model *m, int B) {
    int64_t host[256];
    for (int at = 0; at < B; at += 256) {
        int n = B - at < 256 ? B - at : 256;
        for (int b = 0; b < n; b++) host[b] = m->first_sample + at + b;
        k_copy_h2d(m->ctx, m->samples + at, host, (size_t)n * sizeof *host); /* pageable: consumed */
    }
    m->lora.samples = m->samples;
}

/* The document bounds (NULL: none) checked and copied into m's doc_start/doc_end; *docs
 * points at them, or is NULL without bounds. */
static int upload_docs(llama_model *m, const int32_t *doc_start, const int32_t *doc_end, int B,
                       int T, const k_docs **docs, errbuf *err) {
    *docs = NULL;
    if (!doc_start) return 0;
    if (llama_check_docs(doc_start, doc_end, B, T, err)) return -1;
    size_t N = (size_t)B * T; /* pageable sources: consumed when the copies return */
    k_copy_h2d(m->ctx, m->doc_start, doc_start, N * sizeof *doc_start);
    k_copy_h2d(m->ctx, m->doc_end, doc_end, N * sizeof *doc_end);
    m->docs = (k_docs){m->doc_start, m->doc_end};
    *docs = &m->docs;
    return 0;
}

int llama_model_forward_backward_packed(llama_model *m, const int32_t *input_ids,
                                        const int32_t *labels, const int32_t *doc_start,
                                        const int32_t *doc_end, int B, int T, float dscale,
                                        float *loss_sum, int64_t *count, float *logits,
                                        errbuf *err) {
    const llama_layout *lo = &m->layout;
    kctx *c = m->ctx;
    if (llama_check_batch(&lo->cfg, input_ids, labels, B, T, err)) return -1;
    if ((int64_t)B * T > INT32_MAX / lo->cfg.vocab_size)
        return errf(err, "batch: [%d, %d] x vocab %d too large", B, T, lo->cfg.vocab_size);
    const k_docs *docs;
    if (ensure_activations(m, B, T, err) || upload_docs(m, doc_start, doc_end, B, T, &docs, err))
        return -1;
    int N = B * T, L = lo->n_layers, V = lo->cfg.vocab_size;
    if (logits && !m->logits_f32) {
        m->logits_f32 = k_alloc(c, (size_t)N * V * sizeof(float), err);
        if (!m->logits_f32) return errprefix(err, "llama model: logits");
    }

    int32_t *targets = malloc((size_t)N * sizeof *targets);
    if (!targets) return errf(err, "llama model: out of host memory");
    *count = k_shift_labels(labels, targets, B, T);
    k_copy_h2d(c, m->tokens, input_ids, (size_t)N * sizeof(int32_t));
    k_copy_h2d(c, m->targets, targets, (size_t)N * sizeof(int32_t));
    k_zero(c, m->loss_sum, sizeof(float));

    void *embed = m->params[LLAMA_EMBED_UNIT];
    float *dembed = m->grads[LLAMA_EMBED_UNIT];
    int ckpt = m->checkpoint_activations;
    if (m->has_lora) upload_samples(m, B);
    llama_embed_forward(c, lo, embed, m->tokens, m->resid[0], N);
    for (int l = 0; l < L; l++) {
        llama_layer_weights w = layer_weights(m, l);
        llama_layer_forward(c, lo, &w, m->inv_freq, docs, m->resid[l], m->resid[l + 1],
                            &m->layer_acts[ckpt ? 0 : l], &m->scratch, B, T);
    }

    int hu = llama_head_unit(lo);
    llama_head_forward_backward(c, lo, m->params[hu], m->grads[hu], embed, dembed, m->resid[L],
                                &m->head, &m->scratch, m->targets, B, T, dscale, m->loss_sum,
                                logits ? m->logits_f32 : NULL, m->dresid);

    for (int l = L - 1; l >= 0; l--) {
        llama_layer_weights w = layer_weights(m, l);
        llama_layer_acts *a = &m->layer_acts[ckpt ? 0 : l];
        /* With checkpointing the shared acts hold the last layer's forward; recompute the
         * others from their saved inputs. */
        if (ckpt && l != L - 1)
            llama_layer_recompute(c, lo, &w, m->inv_freq, docs, m->resid[l], LLAMA_KEEP_INPUT, a,
                                  &m->scratch, B, T);
        llama_layer_backward(c, lo, &w, m->inv_freq, docs, m->resid[l], a, &m->scratch,
                             m->dresid, B, T);
    }
    if (dembed) llama_embed_backward(c, lo, dembed, m->tokens, m->dresid, N);

    k_copy_d2h(c, loss_sum, m->loss_sum, sizeof(float));
    if (logits) k_copy_d2h(c, logits, m->logits_f32, (size_t)N * V * sizeof(float));
    free(targets);
    return k_sync(c, err) ? errprefix(err, "llama forward/backward") : 0;
}
