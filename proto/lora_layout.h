/* lora_layout: where every LoRA adapter tensor sits (DESIGN.md, LoRA and QLoRA) — the order
 * the workers, checkpoints and PEFT adapter files agree on.
 *
 * One flat parameter (an adapter unit) per decoder layer: unit l holds, for each targeted
 * module of layer l in the order q, k, v, o, gate, up, down,
 *     lora_A [rank, in]   then   lora_B [out, rank]
 * back to back, row-major, under PEFT's saved names
 *     base_model.model.model.layers.L.self_attn.q_proj.lora_A.weight  (mlp.gate_proj, ...)
 * As PEFT 0.21 computes it: y = W x + scale * B(A(dropout(x))), scale = alpha / rank, or
 * alpha / sqrt(rank) with rslora. */
#ifndef FSDP_LORA_LAYOUT_H
#define FSDP_LORA_LAYOUT_H

#include <stddef.h>

#include "base/errbuf.h"
#include "model_config.h"
#include "model_layout.h"

/* The adaptable modules of a decoder layer; the same numbers as llama_layer_tensor's. */
enum lora_module {
    LORA_Q, LORA_K, LORA_V, LORA_O, LORA_GATE, LORA_UP, LORA_DOWN, LORA_MODULES
};
#define LORA_ALL_LINEAR ((1u << LORA_MODULES) - 1)

typedef struct lora_config {
    int rank;
    double alpha;
    int rslora;       /* scale alpha / sqrt(rank) instead of alpha / rank */
    double dropout;   /* on each targeted module's input, a mask of its own */
    unsigned targets; /* bit m: module m is adapted */
} lora_config;

double lora_scale(const lora_config *c);
/* Whether a and b give adapters of one shape and scale: rank, alpha, rslora and targets
 * (dropout, a training setting, is not compared). */
int lora_config_same_adapters(const lora_config *a, const lora_config *b);
/* "q_proj" .. "down_proj"; and back (-1 when unknown). */
const char *lora_module_name(int module);
int lora_module_from_name(const char *name);

/* Where module m's adapter sits in a layer's unit (every layer alike). */
typedef struct lora_site {
    int on;             /* targeted */
    size_t a_off, b_off; /* elements from the unit's start: A [rank, in], B [out, rank] */
    int in, out;
} lora_site;

typedef struct lora_layout {
    lora_config cfg;
    int n_layers;
    lora_site site[LORA_MODULES];
    /* The same shape as llama_layout's, so code that walks a layout's units and tensors
     * (checkpoints, AdamW, consolidation) walks either: unit l = layer l's adapters. */
    int n_units;
    llama_unit *units;
    int n_tensors;
    llama_tensor_slot *tensors; /* unit by unit; .unit is the adapter unit (= layer) */
} lora_layout;

/* Checks the config (rank >= 1, alpha > 0, 0 <= dropout < 1, at least one target) and lays
 * out the adapters of a model of config mcfg; errors name the field. */
int lora_layout_init(lora_layout *lo, const llama_config *mcfg, const lora_config *cfg,
                     errbuf *err);
void lora_layout_free(lora_layout *lo);
/* The slot of a PEFT saved name (..."lora_A.weight"), or NULL. */
const llama_tensor_slot *lora_layout_find(const lora_layout *lo, const char *name);
/* The module of an adapter tensor of this layout, and *which: 0 for lora_A, 1 for lora_B. */
int lora_tensor_module(const lora_layout *lo, const llama_tensor_slot *t, int *which);
/* PEFT's saved name of layer l's module m, A (which 0) or B (1), into out[96]. */
void lora_tensor_name(char *out, size_t n, int layer, int module, int which);
/* The Hugging Face name of the base weight module m of layer l adapts
 * ("model.layers.L.self_attn.q_proj.weight"). */
void lora_base_name(char *out, size_t n, int layer, int module);

#endif
