/* lora_layout: where every LoRA adapter tensor sits in the flat parameters; see lora_layout.h. */
#include "proto/lora_layout.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert((int)LORA_Q == (int)LLAMA_Q && (int)LORA_DOWN == (int)LLAMA_DOWN,
               "lora modules are the layer's first tensors");

static const char *const module_names[LORA_MODULES] = {
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
static const char *const module_paths[LORA_MODULES] = {
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};

double lora_scale(const lora_config *c) {
    return c->rslora ? c->alpha / sqrt((double)c->rank) : c->alpha / (double)c->rank;
}

int lora_config_same_adapters(const lora_config *a, const lora_config *b) {
    return a->rank == b->rank && a->alpha == b->alpha && a->rslora == b->rslora &&
           a->targets == b->targets;
}

const char *lora_module_name(int module) {
    return module >= 0 && module < LORA_MODULES ? module_names[module] : "unknown";
}

int lora_module_from_name(const char *name) {
    for (int m = 0; m < LORA_MODULES; m++)
        if (strcmp(name, module_names[m]) == 0) return m;
    return -1;
}

void lora_tensor_name(char *out, size_t n, int layer, int module, int which) {
    snprintf(out, n, "base_model.model.model.layers.%d.%s.lora_%c.weight", layer,
             module_paths[module], which ? 'B' : 'A');
}

void lora_base_name(char *out, size_t n, int layer, int module) {
    snprintf(out, n, "model.layers.%d.%s.weight", layer, module_paths[module]);
}

static int check_config(const lora_config *c, errbuf *err) {
    if (c->rank < 1) return errf(err, "lora.rank: %d, expected at least 1", c->rank);
    if (!(c->alpha > 0) || !isfinite(c->alpha))
        return errf(err, "lora.alpha: %g, expected a positive number", c->alpha);
    if (!(c->dropout >= 0 && c->dropout < 1))
        return errf(err, "lora.dropout: %g, expected 0 <= dropout < 1", c->dropout);
    if ((c->targets & LORA_ALL_LINEAR) == 0 || (c->targets & ~LORA_ALL_LINEAR))
        return errf(err, "lora.targets: no module (or an unknown one) selected");
    return 0;
}

/* The [out, in] shape of module m's base weight. */
static void module_shape(const llama_config *c, int m, int *in, int *out) {
    int C = c->hidden_size, I = c->intermediate_size;
    int Q = c->num_attention_heads * c->head_dim, KV = c->num_key_value_heads * c->head_dim;
    static const int ins[LORA_MODULES] = {0, 0, 0, 1, 0, 0, 2}; /* 0: C, 1: Q, 2: I */
    static const int outs[LORA_MODULES] = {1, 3, 3, 0, 2, 2, 0}; /* 3: KV */
    int dims[4] = {C, Q, I, KV};
    *in = dims[ins[m]];
    *out = dims[outs[m]];
}

static void add_tensor(lora_layout *lo, int unit, int layer, int m, int which, int64_t rows,
                       int64_t cols) {
    llama_tensor_slot *s = &lo->tensors[lo->n_tensors++];
    llama_unit *u = &lo->units[unit];
    if (u->count == 0) u->first = (int)(s - lo->tensors);
    u->count++;
    lora_tensor_name(s->name, sizeof s->name, layer, m, which);
    s->unit = unit;
    s->offset = u->numel;
    s->ndim = 2;
    s->shape[0] = rows;
    s->shape[1] = cols;
    s->numel = (size_t)rows * (size_t)cols;
    u->numel += s->numel;
}

int lora_layout_init(lora_layout *lo, const llama_config *mcfg, const lora_config *cfg,
                     errbuf *err) {
    memset(lo, 0, sizeof *lo);
    if (check_config(cfg, err)) return -1;
    lo->cfg = *cfg;
    lo->n_layers = lo->n_units = mcfg->num_hidden_layers;
    size_t numel = 0;
    int per_layer = 0;
    for (int m = 0; m < LORA_MODULES; m++) {
        lora_site *s = &lo->site[m];
        module_shape(mcfg, m, &s->in, &s->out);
        if (!(cfg->targets & (1u << m))) continue;
        s->on = 1;
        s->a_off = numel;
        s->b_off = numel + (size_t)cfg->rank * (size_t)s->in;
        numel = s->b_off + (size_t)s->out * (size_t)cfg->rank;
        per_layer += 2;
    }
    lo->units = calloc((size_t)lo->n_units, sizeof *lo->units);
    lo->tensors = calloc((size_t)lo->n_units * (size_t)per_layer, sizeof *lo->tensors);
    if (!lo->units || !lo->tensors) {
        lora_layout_free(lo);
        return errf(err, "lora layout: out of memory for %d layers", lo->n_layers);
    }
    for (int l = 0; l < lo->n_layers; l++)
        for (int m = 0; m < LORA_MODULES; m++) {
            if (!lo->site[m].on) continue;
            add_tensor(lo, l, l, m, 0, cfg->rank, lo->site[m].in);
            add_tensor(lo, l, l, m, 1, lo->site[m].out, cfg->rank);
        }
    return 0;
}

void lora_layout_free(lora_layout *lo) {
    free(lo->units);
    free(lo->tensors);
    memset(lo, 0, sizeof *lo);
}

const llama_tensor_slot *lora_layout_find(const lora_layout *lo, const char *name) {
    for (int i = 0; i < lo->n_tensors; i++)
        if (strcmp(lo->tensors[i].name, name) == 0) return &lo->tensors[i];
    return NULL;
}

int lora_tensor_module(const lora_layout *lo, const llama_tensor_slot *t, int *which) {
    for (int m = 0; m < LORA_MODULES; m++) {
        if (!lo->site[m].on) continue;
        *which = t->offset == lo->site[m].b_off;
        if (t->offset == lo->site[m].a_off || *which) return m;
    }
    *which = -1;
    return -1;
}
