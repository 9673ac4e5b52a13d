/* model_layout: where every Hugging Face tensor of a Llama sits in the FSDP units — the
 * flat-parameter order that the workers, fsdpd's shared model memory and the checkpoints
 * agree on (DESIGN.md, Sharding model):
 *   unit 0       model.embed_tokens.weight
 *   unit 1+l     decoder layer l: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj,
 *                down_proj, input_layernorm, post_attention_layernorm (in this order), then
 *                the family's extras: q_proj.bias, k_proj.bias, v_proj.bias (qwen2),
 *                q_norm, k_norm (qwen3)
 *   unit L+1     model.norm.weight, then lm_head.weight (absent with tied embeddings)
 * A unit's flat parameter is its tensors back to back, each row-major in its HF shape. */
#ifndef FSDP_MODEL_LAYOUT_H
#define FSDP_MODEL_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "base/errbuf.h"
#include "model_config.h"
#include "safetensors.h"

/* The tensors of a decoder layer's unit, in flat-parameter order: Llama's nine (every
 * family has them, at these indices), then the extras a family has (the others absent, so
 * an extra's index in the unit is llama_layout.layer_index[]). */
enum llama_layer_tensor {
    LLAMA_Q, LLAMA_K, LLAMA_V, LLAMA_O, LLAMA_GATE, LLAMA_UP, LLAMA_DOWN, LLAMA_LN1, LLAMA_LN2,
    LLAMA_Q_BIAS, LLAMA_K_BIAS, LLAMA_V_BIAS, LLAMA_Q_NORM, LLAMA_K_NORM,
    LLAMA_LAYER_TENSORS
};
#define LLAMA_BASE_TENSORS (LLAMA_LN2 + 1) /* the ones every layer has */
/* Inside the head unit: the final norm, then lm_head (untied only). */
enum llama_head_tensor { LLAMA_NORM, LLAMA_LM_HEAD };

#define LLAMA_EMBED_UNIT 0

typedef struct llama_tensor_slot {
    char name[96];  /* Hugging Face name */
    int unit;
    size_t offset;  /* in elements, from the start of the unit's flat buffer */
    size_t numel;
    int ndim;       /* 2 for matrices [rows, cols], 1 for norm weights */
    int64_t shape[2];
    int is_norm;    /* RMSNorm weight: no weight decay in training */
    int is_bias;    /* a bias: initialised to 0, no weight decay in training */
} llama_tensor_slot;

/* Whether AdamW's weight decay applies (not to norms and biases, as the HF Trainer). */
static inline int llama_tensor_decays(const llama_tensor_slot *s) {
    return !s->is_norm && !s->is_bias;
}

typedef struct llama_unit {
    size_t numel; /* elements of the flat buffer (no padding: FSDP pads to the world size) */
    int first;    /* its tensors are layout.tensors[first .. first + count) */
    int count;
} llama_unit;

typedef struct llama_layout {
    llama_config cfg;
    int n_layers;
    int n_units; /* n_layers + 2 */
    llama_unit *units;
    int n_tensors;
    llama_tensor_slot *tensors; /* unit by unit, each unit's in flat order */
    size_t max_tensor_numel;
    int layer_tensors;                     /* tensors in each decoder layer's unit */
    int layer_index[LLAMA_LAYER_TENSORS];  /* where each sits in the unit; -1: absent */
} llama_layout;

int llama_layout_init(llama_layout *lo, const llama_config *cfg, errbuf *err);
void llama_layout_free(llama_layout *lo);
static inline int llama_layer_unit(int layer) { return 1 + layer; }
static inline int llama_head_unit(const llama_layout *lo) { return lo->n_layers + 1; }
/* The slot of a Hugging Face tensor name, or NULL. */
const llama_tensor_slot *llama_layout_find(const llama_layout *lo, const char *name);

/* The checkpoint tensor of `slot` in st: present, of the slot's shape and a floating-point
 * dtype; else NULL with an error naming the tensor. */
const st_tensor *llama_checkpoint_tensor(const llama_tensor_slot *slot, const st_model *st,
                                         errbuf *err);

#endif
