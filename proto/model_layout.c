/* model_layout: where every Hugging Face tensor sits in the FSDP units; see model_layout.h. */
#include "model_layout.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Appends a tensor to the end of `unit`, which must be the unit being built; cols 0: a
 * vector. */
static void add_tensor(llama_layout *lo, int unit, const char *name, int64_t rows, int64_t cols,
                       int is_norm, int is_bias) {
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
    s->is_bias = is_bias;
    u->numel += s->numel;
    if (s->numel > lo->max_tensor_numel) lo->max_tensor_numel = s->numel;
}

/* Which of a layer's tensors the config has. */
static int layer_has(const llama_config *c, int t) {
    if (t < LLAMA_BASE_TENSORS) return 1;
    if (t <= LLAMA_V_BIAS) return c->attention_bias;
    return c->qk_norm;
}

static void add_layer(llama_layout *lo, int l) {
    const llama_config *c = &lo->cfg;
    int64_t C = c->hidden_size, I = c->intermediate_size, hd = c->head_dim;
    int64_t Q = (int64_t)c->num_attention_heads * c->head_dim;
    int64_t KV = (int64_t)c->num_key_value_heads * c->head_dim;
    static const char *const names[LLAMA_LAYER_TENSORS] = {
        [LLAMA_Q] = "self_attn.q_proj.weight",   [LLAMA_K] = "self_attn.k_proj.weight",
        [LLAMA_V] = "self_attn.v_proj.weight",   [LLAMA_O] = "self_attn.o_proj.weight",
        [LLAMA_GATE] = "mlp.gate_proj.weight",   [LLAMA_UP] = "mlp.up_proj.weight",
        [LLAMA_DOWN] = "mlp.down_proj.weight",   [LLAMA_LN1] = "input_layernorm.weight",
        [LLAMA_LN2] = "post_attention_layernorm.weight",
        [LLAMA_Q_BIAS] = "self_attn.q_proj.bias", [LLAMA_K_BIAS] = "self_attn.k_proj.bias",
        [LLAMA_V_BIAS] = "self_attn.v_proj.bias", [LLAMA_Q_NORM] = "self_attn.q_norm.weight",
        [LLAMA_K_NORM] = "self_attn.k_norm.weight",
    };
    const int64_t shapes[LLAMA_LAYER_TENSORS][2] = {
        [LLAMA_Q] = {Q, C},    [LLAMA_K] = {KV, C},  [LLAMA_V] = {KV, C},
        [LLAMA_O] = {C, Q},    [LLAMA_GATE] = {I, C}, [LLAMA_UP] = {I, C},
        [LLAMA_DOWN] = {C, I}, [LLAMA_LN1] = {C, 0},  [LLAMA_LN2] = {C, 0},
        [LLAMA_Q_BIAS] = {Q, 0}, [LLAMA_K_BIAS] = {KV, 0}, [LLAMA_V_BIAS] = {KV, 0},
        [LLAMA_Q_NORM] = {hd, 0}, [LLAMA_K_NORM] = {hd, 0},
    };
    int at = 0;
    for (int t = 0; t < LLAMA_LAYER_TENSORS; t++) {
        lo->layer_index[t] = layer_has(c, t) ? at++ : -1;
        if (lo->layer_index[t] < 0) continue;
        char name[96];
        snprintf(name, sizeof name, "model.layers.%d.%s", l, names[t]);
        int is_bias = t >= LLAMA_Q_BIAS && t <= LLAMA_V_BIAS;
        add_tensor(lo, llama_layer_unit(l), name, shapes[t][0], shapes[t][1],
                   shapes[t][1] == 0 && !is_bias, is_bias);
    }
    lo->layer_tensors = at;
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
    int max_tensors = 1 + lo->n_layers * LLAMA_LAYER_TENSORS + 2; /* at most */
    lo->units = calloc((size_t)lo->n_units, sizeof *lo->units);
    lo->tensors = calloc((size_t)max_tensors, sizeof *lo->tensors);
    if (!lo->units || !lo->tensors) {
        llama_layout_free(lo);
        return errf(err, "llama layout: out of memory for %d layers", c->num_hidden_layers);
    }
    add_tensor(lo, LLAMA_EMBED_UNIT, "model.embed_tokens.weight", c->vocab_size, c->hidden_size,
               0, 0);
    for (int l = 0; l < lo->n_layers; l++) add_layer(lo, l);
    add_tensor(lo, llama_head_unit(lo), "model.norm.weight", c->hidden_size, 0, 1, 0);
    if (!c->tie_word_embeddings)
        add_tensor(lo, llama_head_unit(lo), "lm_head.weight", c->vocab_size, c->hidden_size, 0, 0);
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

const st_tensor *llama_checkpoint_tensor(const llama_tensor_slot *slot, const st_model *st,
                                         errbuf *err) {
    const st_tensor *t = st_model_find(st, slot->name);
    if (!t) {
        errf(err, "%s: tensor %s is missing", st->dir, slot->name);
        return NULL;
    }
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
        errf(err, "%s: tensor %s has shape [%s], expected %s", st->dir, slot->name, have, want);
        return NULL;
    }
    if (t->dtype != ST_F32 && t->dtype != ST_BF16 && t->dtype != ST_F16 && t->dtype != ST_F64) {
        errf(err, "%s: tensor %s has dtype %s, expected a float type", st->dir, slot->name,
             st_dtype_name(t->dtype));
        return NULL;
    }
    return t;
}
