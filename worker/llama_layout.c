/* llama_layout: where every Hugging Face tensor sits in the FSDP units, reading checkpoint
 * tensors into that layout, and the checks on a batch. */
#include "worker/llama.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Appends a tensor to the end of `unit`, which must be the unit being built. */
static void add_tensor(llama_layout *lo, int unit, const char *name, int64_t rows, int64_t cols,
                       int is_norm) {
    llama_tensor_slot *s = &lo->tensors[lo->n_tensors++];
    llama_unit *u = &lo->units[unit];
    if (u->count == 0) u->first = (int)(s - lo->tensors);
    u->count++;
    snprintf(s->name, sizeof s->name, "%s", name);
    s->unit = unit;
    s->offset = u->numel;
    s->ndim = cols ? 2 : 1;
    s->shape[0] = rows;
    s->shape[1] = cols;
    s->numel = (size_t)rows * (size_t)(cols ? cols : 1);
    s->is_norm = is_norm;
    u->numel += s->numel;
    if (s->numel > lo->max_tensor_numel) lo->max_tensor_numel = s->numel;
}

static void add_layer(llama_layout *lo, int l) {
    const llama_config *c = &lo->cfg;
    int64_t C = c->hidden_size, I = c->intermediate_size;
    int64_t Q = (int64_t)c->num_attention_heads * c->head_dim;
    int64_t KV = (int64_t)c->num_key_value_heads * c->head_dim;
    static const char *const names[LLAMA_LAYER_TENSORS] = {
        [LLAMA_Q] = "self_attn.q_proj",      [LLAMA_K] = "self_attn.k_proj",
        [LLAMA_V] = "self_attn.v_proj",      [LLAMA_O] = "self_attn.o_proj",
        [LLAMA_GATE] = "mlp.gate_proj",      [LLAMA_UP] = "mlp.up_proj",
        [LLAMA_DOWN] = "mlp.down_proj",      [LLAMA_LN1] = "input_layernorm",
        [LLAMA_LN2] = "post_attention_layernorm",
    };
    const int64_t shapes[LLAMA_LAYER_TENSORS][2] = {
        [LLAMA_Q] = {Q, C},    [LLAMA_K] = {KV, C},  [LLAMA_V] = {KV, C},
        [LLAMA_O] = {C, Q},    [LLAMA_GATE] = {I, C}, [LLAMA_UP] = {I, C},
        [LLAMA_DOWN] = {C, I}, [LLAMA_LN1] = {C, 0},  [LLAMA_LN2] = {C, 0},
    };
    for (int t = 0; t < LLAMA_LAYER_TENSORS; t++) {
        char name[96];
        snprintf(name, sizeof name, "model.layers.%d.%s.weight", l, names[t]);
        add_tensor(lo, llama_layer_unit(l), name, shapes[t][0], shapes[t][1], shapes[t][1] == 0);
    }
}

int llama_layout_init(llama_layout *lo, const llama_config *cfg, errbuf *err) {
    memset(lo, 0, sizeof *lo);
    const llama_config *c = cfg;
    if (c->hidden_size <= 0 || c->intermediate_size <= 0 || c->num_hidden_layers <= 0 ||
        c->num_attention_heads <= 0 || c->num_key_value_heads <= 0 || c->head_dim <= 0 ||
        c->vocab_size <= 0 || c->max_position_embeddings <= 0)
        return errf(err, "llama config: sizes must be positive");
    if (c->num_attention_heads % c->num_key_value_heads)
        return errf(err, "llama config: num_attention_heads %d not a multiple of "
                         "num_key_value_heads %d", c->num_attention_heads, c->num_key_value_heads);
    if (c->head_dim % 2) return errf(err, "llama config: head_dim %d is odd (RoPE)", c->head_dim);
    /* The kernels take int row and column counts. */
    if ((int64_t)c->num_attention_heads * c->head_dim > INT32_MAX)
        return errf(err, "llama config: num_attention_heads * head_dim too large");

    lo->cfg = *cfg;
    lo->n_layers = c->num_hidden_layers;
    lo->n_units = lo->n_layers + 2;
    int max_tensors = 1 + lo->n_layers * LLAMA_LAYER_TENSORS + 2;
    lo->units = calloc((size_t)lo->n_units, sizeof *lo->units);
    lo->tensors = calloc((size_t)max_tensors, sizeof *lo->tensors);
    if (!lo->units || !lo->tensors) {
        llama_layout_free(lo);
        return errf(err, "llama layout: out of memory for %d layers", c->num_hidden_layers);
    }
    add_tensor(lo, LLAMA_EMBED_UNIT, "model.embed_tokens.weight", c->vocab_size, c->hidden_size,
               0);
    for (int l = 0; l < lo->n_layers; l++) add_layer(lo, l);
    add_tensor(lo, llama_head_unit(lo), "model.norm.weight", c->hidden_size, 0, 1);
    if (!c->tie_word_embeddings)
        add_tensor(lo, llama_head_unit(lo), "lm_head.weight", c->vocab_size, c->hidden_size, 0);
    return 0;
}

void llama_layout_free(llama_layout *lo) {
    free(lo->units);
    free(lo->tensors);
    memset(lo, 0, sizeof *lo);
}

const llama_tensor_slot *llama_layout_find(const llama_layout *lo, const char *name) {
    for (int i = 0; i < lo->n_tensors; i++)
        if (!strcmp(lo->tensors[i].name, name)) return &lo->tensors[i];
    return NULL;
}

/* The data pointer of a mapped tensor need not be aligned for its dtype: read through
 * memcpy. */
static void convert_to_f32(const st_tensor *t, float *dst) {
    const unsigned char *p = t->data;
    size_t n = t->numel, esize = st_dtype_size(t->dtype);
    if (t->dtype == ST_F32) {
        memcpy(dst, p, n * sizeof(float));
        return;
    }
    for (size_t i = 0; i < n; i++, p += esize) {
        if (t->dtype == ST_F64) {
            double d;
            memcpy(&d, p, sizeof d);
            dst[i] = (float)d;
        } else {
            uint16_t h;
            memcpy(&h, p, sizeof h);
            dst[i] = t->dtype == ST_BF16 ? st_bf16_to_f32(h) : st_f16_to_f32(h);
        }
    }
}

int llama_read_tensor_f32(const llama_tensor_slot *slot, const st_model *st, float *dst,
                          errbuf *err) {
    const st_tensor *t = st_model_find(st, slot->name);
    if (!t) return errf(err, "%s: tensor %s is missing", st->dir, slot->name);
    int shape_ok = t->ndim == slot->ndim && t->shape[0] == slot->shape[0] &&
                   (slot->ndim == 1 || t->shape[1] == slot->shape[1]);
    if (!shape_ok) {
        char want[64], have[128] = "";
        if (slot->ndim == 1)
            snprintf(want, sizeof want, "[%lld]", (long long)slot->shape[0]);
        else
            snprintf(want, sizeof want, "[%lld, %lld]", (long long)slot->shape[0],
                     (long long)slot->shape[1]);
        size_t len = 0;
        for (int d = 0; d < t->ndim && len < sizeof have - 24; d++)
            len += (size_t)snprintf(have + len, sizeof have - len, "%s%lld", d ? ", " : "",
                                    (long long)t->shape[d]);
        return errf(err, "%s: tensor %s has shape [%s], expected %s", st->dir, slot->name, have,
                    want);
    }
    if (t->dtype != ST_F32 && t->dtype != ST_BF16 && t->dtype != ST_F16 && t->dtype != ST_F64)
        return errf(err, "%s: tensor %s has dtype %s, expected a float type", st->dir,
                    slot->name, st_dtype_name(t->dtype));
    convert_to_f32(t, dst);
    return 0;
}

int llama_check_batch(const llama_config *cfg, const int32_t *input_ids, const int32_t *labels,
                      int B, int T, errbuf *err) {
    if (B <= 0 || T <= 0) return errf(err, "batch: shape [%d, %d] is empty", B, T);
    if (T > cfg->max_position_embeddings)
        return errf(err, "batch: sequence length %d exceeds max_position_embeddings %d", T,
                    cfg->max_position_embeddings);
    int V = cfg->vocab_size;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            int32_t id = input_ids[(size_t)b * T + t];
            if (id < 0 || id >= V)
                return errf(err, "batch: input_ids[%d,%d] = %d is not a token id in [0, %d)", b,
                            t, (int)id, V);
            if (!labels) continue;
            int32_t y = labels[(size_t)b * T + t];
            if (y != K_IGNORE_INDEX && (y < 0 || y >= V))
                return errf(err, "batch: labels[%d,%d] = %d is neither a token id in [0, %d) "
                                 "nor %d", b, t, (int)y, V, K_IGNORE_INDEX);
        }
    return 0;
}

void llama_rope_inv_freq(const llama_config *cfg, float *host_inv_freq) {
    const rope_config *r = &cfg->rope;
    k_rope_params p = {
        .theta = r->theta,
        .llama3 = r->type == ROPE_LLAMA3,
        .factor = r->factor,
        .low_freq_factor = r->low_freq_factor,
        .high_freq_factor = r->high_freq_factor,
        .original_max_position_embeddings = r->original_max_position_embeddings,
    };
    k_rope_inv_freq(&p, cfg->head_dim, host_inv_freq);
}
