/* llama_decode: the Llama model's forward for generation, a few new tokens a row over a KV
 * cache (k_attention_kv), organised in the FSDP units as llama.h is, so that a caller holding
 * one gathered unit at a time (the worker, for samples during training) runs the same code as
 * the whole-model decoder here (fsdpctl generate).
 *
 *   - per unit: llama_embed_forward (llama.h), llama_layer_decode, llama_head_logits;
 *   - llama_decoder: every unit's parameters, the caches and buffers of one process, and
 *     llama_decoder_forward, which runs rows [row0, row0 + B) through them.
 *
 * The caches: per decoder layer, keys and values [rows, T_max, kv_heads * head_dim] in the
 * compute dtype; a row's positions 0 .. pos-1 hold its tokens so far.  Rows are independent
 * (each has its own position), so prompts of different lengths decode in one batch. */
#ifndef FSDP_LLAMA_DECODE_H
#define FSDP_LLAMA_DECODE_H

#include <stddef.h>
#include <stdint.h>

#include "base/errbuf.h"
#include "kernels/kernels.h"
#include "model/llama_generate.h"
#include "proto/model_layout.h"
#include "proto/safetensors.h"

/* What a decoder layer's decode step computes on its way, for N = B*S token rows (context
 * memory, compute dtype; rstd fp32), and the head's buffers for up to `rows` rows. */
typedef struct llama_decode_acts {
    void *ln, *q, *k, *v, *att, *h, *gate, *up, *sw; /* [N, C|Q|KV|I] */
    float *rstd;                                     /* [N] */
    float *rstd_qk;                                  /* [N, Hq]: Qwen3's q/k norms */
    void *logits;                                    /* [rows, V] */
} llama_decode_acts;

/* Lays the buffers out in mem and returns the bytes they take; mem NULL only measures. */
size_t llama_decode_acts_carve(llama_decode_acts *a, void *mem, const llama_layout *lo,
                               size_t elem_size, int N, int rows);

/* One decoder layer on S new tokens of each of B rows (x, out [B*S, C]; out must not alias
 * x): out = h + mlp(h), h = x + attn(x), the attention over the layer's caches k_cache,
 * v_cache [B, T_max, KV] (this layer's, from its first row on), where row b's new tokens go
 * at positions pos[b] .. pos[b]+S-1 (int32 [B], context memory).  params: the layer's unit,
 * gathered.  inv_freq: [head_dim/2] fp32 in context memory (llama_rope_inv_freq). */
void llama_layer_decode(kctx *c, const llama_layout *lo, const void *params,
                        const float *inv_freq, void *k_cache, void *v_cache,
                        const int32_t *pos, int T_max, const void *x, void *out,
                        llama_decode_acts *a, int B, int S);
/* logits_f32 [n, V] (fp32, context memory) of the rows x [n, C]: the final norm and lm_head
 * (embed_params, unit 0, with tied embeddings).  n <= the rows a was carved for. */
void llama_head_logits(kctx *c, const llama_layout *lo, const void *head_params,
                       const void *embed_params, const void *x, llama_decode_acts *a,
                       float *logits_f32, int n);

/* ---- the whole model in one process ---- */

typedef struct llama_decoder {
    llama_layout layout;
    kctx *ctx;
    int max_batch, max_len; /* rows of the caches, positions a row */
    int max_tokens;         /* token rows one pass holds (longer prompts go in chunks) */

    void *param_memory;
    void **params;   /* [n_units] into param_memory (compute dtype) */
    float *inv_freq; /* [head_dim/2] */
    void *cache_memory;
    void **k_cache, **v_cache; /* [n_layers], each [max_batch, max_len, KV] */

    void *act_memory;
    llama_decode_acts acts;
    void *resid[2];   /* [max_tokens, C]: a layer's input and output, in turn */
    int32_t *tokens;  /* [max_tokens] */
    int32_t *pos;     /* [max_batch] */
    float *logits;    /* [max_batch, V] fp32 */
} llama_decoder;

/* Allocates (through k_alloc) the parameters (zero), caches for max_batch rows of max_len
 * positions (at most max_position_embeddings) and the buffers of one pass. */
int llama_decoder_init(llama_decoder *d, const llama_config *cfg, kctx *ctx, int max_batch,
                       int max_len, errbuf *err);
void llama_decoder_destroy(llama_decoder *d);
/* Sets one parameter from host fp32 src[slot->numel] (slot: of d->layout). */
int llama_decoder_set_param(llama_decoder *d, const llama_tensor_slot *slot, const float *src,
                            errbuf *err);
/* Copies every parameter from a Hugging Face checkpoint (llama_read_tensor_f32's checks). */
int llama_decoder_load_hf(llama_decoder *d, const st_model *st, errbuf *err);
/* Adds scale * B A onto layer `layer`'s weight of module `module` (a LoRA adapter merged, as
 * PEFT's merge_and_unload): A host fp32 [rank, in], B [out, rank]. */
int llama_decoder_merge_lora(llama_decoder *d, int layer, int module, const float *A,
                             const float *B, int rank, float scale, errbuf *err);
/* Runs S new tokens (host int32 [B*S], row by row) of rows row0 .. row0+B-1, row b's at
 * positions pos[b] .. pos[b]+S-1 (host [B]; pos[b] + S <= max_len; positions from pos[b] on
 * are overwritten), and writes each row's logits after its last new token into logits
 * (host fp32 [B, V]).  Token ids are checked against the vocabulary. */
int llama_decoder_forward(llama_decoder *d, int row0, int B, int S, const int32_t *tokens,
                          const int32_t *pos, float *logits, errbuf *err);
/* d as gen_run's model (its forward is llama_decoder_forward). */
gen_model llama_decoder_gen_model(llama_decoder *d);

#endif
