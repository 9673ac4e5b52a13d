/* llama: the Llama model's forward and backward pass, organised in FSDP units.
 *
 * Parameters are grouped in units (DESIGN.md, Sharding model):
 *   unit 0       model.embed_tokens.weight
 *   unit 1+l     decoder layer l: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj,
 *                down_proj, input_layernorm, post_attention_layernorm (in this order)
 *   unit L+1     model.norm.weight, then lm_head.weight (absent with tied embeddings: the
 *                head then reads unit 0's embedding and accumulates its gradient there)
 * A unit's parameters live in one contiguous flat buffer of the context's compute dtype,
 * the buffer FSDP all-gathers into; its gradients in one contiguous fp32 buffer of the same
 * element layout, accumulated (+=) by every backward call.
 *
 * Three levels:
 *   - the layout (llama_layout): which tensor sits where in which unit;
 *   - per-unit compute (llama_embed_*, llama_layer_*, llama_head_forward_backward), which
 *     FSDP calls one unit at a time with that unit's gathered buffer;
 *   - a whole-model driver for one process (llama_model) that owns every unit.
 *
 * Activations: a decoder layer's input is kept apart from its internals
 * (llama_layer_acts), in two parts: the attention block's and the MLP's.  Activation
 * checkpointing keeps, per layer, its input only, or also its attention part, or everything
 * (llama_keep); what a layer did not keep lives in one reusable part, rebuilt by
 * llama_layer_recompute just before llama_layer_backward.
 * Every op goes through kernels.h, so the same code runs on the CPU and CUDA backends. */
#ifndef FSDP_LLAMA_H
#define FSDP_LLAMA_H

#include <stddef.h>
#include <stdint.h>

#include "base/errbuf.h"
#include "kernels/kernels.h"
#include "proto/lora_layout.h"
#include "proto/model_config.h"
#include "proto/model_layout.h"
#include "proto/safetensors.h"

/* Reads the checkpoint tensor of `slot` from st into host fp32 dst[slot->numel], converting
 * F32/BF16/F16/F64; errors name the tensor when it is missing or has another shape. */
int llama_read_tensor_f32(const llama_tensor_slot *slot, const st_model *st, float *dst,
                          errbuf *err);

/* Checks a batch: token ids in [0, vocab), labels in [0, vocab) or -100, 0 < T <= the
 * positions the config covers (llama_config_max_positions), B > 0; errors name the offending position.  labels may be NULL. */
int llama_check_batch(const llama_config *cfg, const int32_t *input_ids, const int32_t *labels,
                      int B, int T, errbuf *err);

/* A packed batch (several documents in a row) is given by each token's document bounds,
 * host int32 [B*T] each: row positions start[b*T+t] .. end[b*T+t] - 1 hold the document of
 * token (b, t), the k_docs of kctx.h (its RoPE position is t - start).  data/rows.h builds
 * them with the rows.  llama_check_docs checks that they tile each row as k_docs says
 * (start <= t < end <= T; a token's bounds are the previous token's unless a document starts
 * at it, where the previous one ends); errors name the token. */
int llama_check_docs(const int32_t *start, const int32_t *end, int B, int T, errbuf *err);
/* A batch that comes as positions instead, host int32 [B,T]: each token's position in its
 * document, as Hugging Face's position_ids from DataCollatorWithFlattening: 0 starts a
 * document, anything else is the previous token's position + 1 (so every row starts with
 * 0).  Their document bounds, computed once where such a batch is made (never in a step):
 * start[b*T+t] and end[b*T+t], host int32 [B*T].  Errors name the position. */
int llama_doc_bounds(const int32_t *positions, int B, int T, int32_t *start, int32_t *end,
                     errbuf *err);

/* RoPE inverse frequencies [head_dim/2] on the host from the config's rope parameters. */
void llama_rope_inv_freq(const llama_config *cfg, float *host_inv_freq);

/* ---- activations ----
 * Buffers are in context memory; `void *` ones hold the compute dtype.  Each *_carve
 * function lays its struct out in mem and returns the bytes it needs; called with mem NULL
 * it only returns the size (and sets the pointers to NULL), so a caller can size one
 * allocation for many structs.  N = B*T rows, Q = heads*head_dim, KV = kv_heads*head_dim. */

/* What a decoder layer's backward needs besides its input, in two parts. */
typedef struct llama_layer_acts {
    /* the attention part */
    void *ln1;   /* [N,C]  input_layernorm(x) */
    void *q;     /* [N,Q]  after RoPE */
    void *k;     /* [N,KV] after RoPE */
    void *v;     /* [N,KV] */
    void *att;   /* [N,Q]  attention output, before o_proj */
    void *h;     /* [N,C]  x + o_proj(att) */
    float *rstd1; /* [N] */
    float *lse;   /* [B,heads,T] */
    /* q_norm / k_norm (qwen3; NULL without): the projections before the per-head norm and
     * its rstd */
    void *q_pre;   /* [N,Q] */
    void *k_pre;   /* [N,KV] */
    float *rstd_q; /* [N*heads] */
    float *rstd_k; /* [N*kv_heads] */
    /* the MLP part */
    void *ln2;   /* [N,C]  post_attention_layernorm(h) */
    void *gate;  /* [N,I] */
    void *up;    /* [N,I] */
    void *sw;    /* [N,I]  silu(gate) * up */
    float *rstd2; /* [N] */
    /* [N,rank] scale * A(dropout(x)) of each adapted module, in its module's part */
    void *lora_t[LORA_MODULES];
    /* Rows gate, up, sw and the MLP adapters' lora_t hold: N, or fewer with fsdp.mlp_chunk
     * (llama_layers_acts_carve), when the MLP runs that many rows at a time and its backward
     * recomputes each chunk (ln2 and rstd2 stay [N]). */
    int mlp_rows;
} llama_layer_acts;

/* What a decoder layer keeps from its forward to its backward (activation checkpointing). */
typedef enum llama_keep {
    LLAMA_KEEP_INPUT,     /* its input only: the attention and MLP parts are recomputed */
    LLAMA_KEEP_RESIDUAL,  /* its input and h = x + attn(x): the attention recomputed up to
                             o_proj's input (o_proj itself and the add not), the MLP too */
    LLAMA_KEEP_CONTEXT,   /* also the attention's output (att, lse): q, k and v recomputed,
                             not the attention itself; the MLP too */
    LLAMA_KEEP_ATTENTION, /* its input and attention part: the MLP part is recomputed */
    LLAMA_KEEP_ALL,       /* everything: nothing is recomputed */
} llama_keep;

/* A model's activation checkpointing: the first `layers` decoder layers keep `keep`, the
 * others everything.  No checkpointing is {0} (what a zeroed struct says); full is
 * {n_layers, LLAMA_KEEP_INPUT}, selective {n_layers, LLAMA_KEEP_ATTENTION}. */
typedef struct llama_recompute {
    int layers;
    llama_keep keep;
} llama_recompute;

/* "input", "residual", "context", "attention" or "all" (fsdpctl plan --json's they_keep). */
const char *llama_keep_name(llama_keep k);
/* What layer l keeps under r. */
llama_keep llama_keep_of(llama_recompute r, int l);
/* What layer l's backward starts from under r, as llama_layer_recompute takes it: what it
 * kept, but LLAMA_KEEP_ALL (nothing to recompute) for the last layer that shares
 * activations, which still hold its forward (llama_layers_acts_carve). */
llama_keep llama_backward_from(llama_recompute r, int l, int L);

/* What fsdp.offload_activations and fsdp.mlp_chunk (F46) need, for L layers under r: 0 ..
 * L-1 layer inputs offloaded, with full recompute; MLP chunks (mlp_chunk > 0) with every
 * layer's MLP recomputed (full or selective) and no adapter dropout.  0, else -1 with why. */
int llama_check_long_settings(int L, llama_recompute r, int offload_layers, int mlp_chunk, double dropout,
                              errbuf *err);

/* "full: every layer recomputed from its input", "20 of 32 layers keep everything, the
 * others their attention (the MLP recomputed)", ... into out[n]. */
void llama_recompute_format(llama_recompute r, int L, char *out, size_t n);

/* The parts of llama_layer_acts. */
typedef enum llama_acts_part {
    LLAMA_ACTS_ATTENTION = 1, /* but the next two */
    LLAMA_ACTS_MLP = 2,
    LLAMA_ACTS_RESIDUAL = 4,  /* h */
    LLAMA_ACTS_CONTEXT = 8,   /* att, lse: the attention's output */
    LLAMA_ACTS_ALL = 15,
} llama_acts_part;

/* The parts a layer that keeps k owns (the rest it shares, and a recomputation rebuilds). */
llama_acts_part llama_kept_parts(llama_keep k);

/* Rows of logits the head computes at a time. */
#define LLAMA_HEAD_ROWS 2048

typedef struct llama_head_acts {
    void *lnf;    /* [N,C] model.norm(x) */
    float *rstd;  /* [N] */
    void *logits; /* [min(N, LLAMA_HEAD_ROWS), V]: a chunk of rows; the backward turns it
                     into dlogits in place */
} llama_head_acts;

/* Scratch shared by every unit's backward (and by the adapters' dropout in forward). */
typedef struct llama_scratch {
    void *dsw;               /* [N,I] (gate's and up's gradients overwrite their activations) */
    void *dln;               /* [N,C] gradient of a norm's output */
    void *datt, *dq;         /* [N,Q] */
    void *dk, *dv;           /* [N,KV] */
    void *lora_dt;           /* [N,n rank] an adapter's (or a fused group's) inner gradient */
    void *lora_xd, *lora_dxd; /* [N,max in] a dropped-out input and its gradient (dropout > 0) */
    void *lora_a;            /* [n rank,C] a fused group's A, gathered (NULL: no group) */
    float *lora_da;          /* [n rank,C] a fused group's dA, before it is added to each */
    int mlp_rows;             /* dsw's rows: N, or llama_layers_acts_carve's mlp_rows */
} llama_scratch;

/* lora: the adapters' layout, or NULL without adapters (no LoRA buffers).  _part carves
 * only the pointers of `part` (the others are left as they are), its MLP buffers of
 * mlp_rows rows (0 or >= N: N). */
size_t llama_layer_acts_carve(llama_layer_acts *a, void *mem, const llama_layout *lo,
                              const lora_layout *lora, size_t elem_size, int B, int T);
size_t llama_layer_acts_carve_part(llama_layer_acts *a, void *mem, llama_acts_part part,
                                   const llama_layout *lo, const lora_layout *lora,
                                   size_t elem_size, int B, int T, int mlp_rows);
/* Every decoder layer's activations under r, acts[n_layers]: each layer's own parts (what
 * it keeps), then one copy of each part that a layer recomputes, which those layers share.
 * acts may be NULL with mem NULL (the size only).  The shared parts hold, after a forward,
 * the last layer's that uses them: that layer's backward needs no recomputation (but for its
 * MLP in chunks).  mlp_rows (fsdp.mlp_chunk; 0: N): the shared MLP part's rows, when every
 * layer recomputes its MLP (r full or selective over every layer) and no adapter drops out:
 * the MLP then runs that many rows at a time in forward and backward (which recomputes each
 * chunk), its [mlp_rows, intermediate] buffers in place of [N, intermediate]. */
size_t llama_layers_acts_carve(llama_layer_acts *acts, void *mem, llama_recompute r,
                               const llama_layout *lo, const lora_layout *lora,
                               size_t elem_size, int B, int T, int mlp_rows);
size_t llama_head_acts_carve(llama_head_acts *a, void *mem, const llama_layout *lo,
                             size_t elem_size, int B, int T);
size_t llama_scratch_carve(llama_scratch *s, void *mem, const llama_layout *lo,
                           const lora_layout *lora, size_t elem_size, int B, int T, int mlp_rows);

/* ---- LoRA ----
 * What every decoder layer's adapters share (DESIGN.md, LoRA and QLoRA): each adapted
 * module computes y = x W^T + scale * B(A(dropout(x))) as PEFT does, dropout with a mask of
 * its own per (sample, layer, module) (base/philox.h), so q, k and v see different masks of
 * the same input and a recomputation redraws the same ones. */
typedef struct llama_lora {
    const lora_layout *layout;
    float scale;            /* lora_scale(&layout->cfg) */
    float dropout;          /* the drop probability now: layout->cfg.dropout, 0 in evaluation */
    uint64_t seed;          /* train.seed: the dropout streams' key */
    const int64_t *samples; /* [B] context memory: each row's global sample index */
} llama_lora;

/* The adapters that share module m's input and run as one (F47): without dropout, the adapted
 * modules among q, k, v (input_layernorm's output) or gate, up (post_attention_layernorm's), when
 * two or more are.  Their A projections are one GEMM into one [rows, n rank] inner activation
 * (member j's rank columns at j rank, rows n rank apart: lora_t of each member points at its
 * columns), their dt one [rows, n rank] and their input gradient one GEMM of depth n rank.
 * With dropout each module keeps a mask of its own (as PEFT: one nn.Dropout a module), so
 * nothing is fused; nor at a rank that is no multiple of 8.  n 1: m alone (not adapted, not in
 * a group, or not fused). */
typedef struct llama_lora_group {
    int n;         /* members */
    int member[3]; /* their modules, in order */
    int column;    /* m's place among them */
} llama_lora_group;
llama_lora_group llama_lora_group_of(const lora_config *cfg, int m);

/* What a decoder layer's compute reads and accumulates into. */
/* FP8 linears (train.precision fp8, F45): a decoder layer's seven projections in float8 with
 * dynamic scaling, each GEMM's operands cast (amax and cast, k_fp8_cast / k_fp8_cast_t) just
 * before it: forward y = x W^T with x and W in e4m3; backward din = dy W with dy in
 * grad_format and W^T in e4m3, dW += dy^T x with dy^T in grad_format and x^T in e4m3; the
 * products rounded to bf16 (k_fp8_gemm), the weight gradient then added to the fp32 one.
 * Scales tensorwise or rowwise (one a row of each operand's GEMM layout).  The buffers are
 * scratch, used one GEMM at a time (llama_fp8_carve). */
typedef struct llama_fp8 {
    k_fp8_scaling scaling;
    fp8_format grad_format;
    uint8_t *a, *b;  /* the GEMM's two operands' codes */
    float *sa, *sb;  /* their inverse scales */
    void *product;   /* compute dtype: a product added afterwards (accumulated din, dW) */
    float *product_f32; /* dW's product in fp32, added to the gradient */
} llama_fp8;

/* The bytes of llama_fp8's buffers for B x T tokens (MLP rows mlp_rows at a time, as
 * llama_scratch_carve), carved from mem when not NULL. */
size_t llama_fp8_carve(llama_fp8 *f, void *mem, const llama_layout *lo, size_t elem_size, int B, int T,
                       int mlp_rows);

typedef struct llama_layer_weights {
    const void *params;     /* the layer's unit, gathered (compute dtype) */
    float *grads;           /* its fp32 gradient (+=); NULL: a frozen base, none computed */
    /* With grads: its seven projections' part (before LLAMA_LN1's offset) holds nothing yet
     * (the caller left it unzeroed, the rest of the unit zero): the backward writes those
     * gradients rather than adding to them (the MLP's first chunk; later chunks add). */
    int grads_fresh;
    const llama_lora *lora; /* NULL: no adapters */
    const void *adapters;   /* the layer's adapter unit, gathered (compute dtype) */
    float *adapter_grads;   /* its fp32 gradient (+=) */
    int layer;              /* the decoder layer's index (dropout sites) */
    const llama_fp8 *fp8;   /* NULL: the projections in the compute dtype */
    /* With fp8: NULL, each weight cast at each GEMM; else the layer gathered as FP8 (train.
     * fp8_all_gather, worker/fsdp.c): the seven projections' e4m3 codes at their element
     * offsets of the unit (params then holds the norms and the rest, compute dtype, at theirs)
     * and code_scales (context memory): projection t's scale and inverse scale at
     * [LLAMA_FP8_SCALE_STRIDE t] and 4 floats after it (each 16-byte aligned, as cuBLASLt's
     * scale pointers must be), tensorwise, the backward's W^T the codes transposed. */
    const uint8_t *codes;
    const float *code_scales;
} llama_layer_weights;

/* train.precision fp8's recipe (after torchao's): the projections of every decoder layer but
 * the first and the last in FP8. */
#define LLAMA_FP8_PROJECTIONS 7 /* LLAMA_Q .. LLAMA_DOWN, the first seven of a layer's tensors */
#define LLAMA_FP8_SCALE_STRIDE 8 /* floats a projection's scale pair takes in code_scales */
static inline int llama_fp8_layer(int l, int n_layers) { return l > 0 && l < n_layers - 1; }

/* ---- per-unit compute ----
 * `params` is a unit's flat buffer (compute dtype), `grads` its fp32 gradient buffer
 * (accumulated).  Tokens and targets are int32 in context memory, already checked.
 * The residual stream: x [N,C] (compute dtype) flows forward unit to unit; backward, one
 * buffer `dresid` [N,C] carries d(loss)/d(residual) from unit to unit, updated in place. */

/* out[N,C] = embedding of tokens. */
void llama_embed_forward(kctx *c, const llama_layout *lo, const void *params,
                         const int32_t *tokens, void *out, int N);
/* grads += scatter of dresid into the embedding rows of tokens. */
void llama_embed_backward(kctx *c, const llama_layout *lo, float *grads, const int32_t *tokens,
                          const void *dresid, int N);

/* One decoder layer: out = h + mlp(h), h = x + attn(x).  inv_freq: [head_dim/2] fp32 in
 * context memory.  docs: a packed batch's documents (kctx.h; positions restart and attention
 * stays inside each), or NULL: one sequence per row.  out must not alias x (x stays the
 * layer's saved input). */
void llama_layer_forward(kctx *c, const llama_layout *lo, const llama_layer_weights *w,
                         const float *inv_freq, const k_docs *docs, const void *x, void *out,
                         llama_layer_acts *a, llama_scratch *s, int B, int T);
/* Rebuilds in a what a layer that kept `kept` did not keep, from its input x (and what it
 * kept: llama_keep): the forward again as far as its backward needs, which stops before
 * down_proj (its output is not needed), with h kept before o_proj (only its adapter's inner
 * activation), with the attention's output kept q, k and v but not the attention.  Nothing
 * for LLAMA_KEEP_ALL. */
void llama_layer_recompute(kctx *c, const llama_layout *lo, const llama_layer_weights *w,
                           const float *inv_freq, const k_docs *docs, const void *x,
                           llama_keep kept, llama_layer_acts *a, llama_scratch *s, int B, int T);
/* On entry dresid = d/d(out), on return d/d(x); w->grads += d/d(params) (unless NULL),
 * w->adapter_grads += d/d(adapters).  a must hold this layer's forward on input x with the
 * same docs and dropout (a recomputation counts); the backward consumes it (a->gate and
 * a->up hold their gradients afterwards, a->sw down_proj's input gradient). */
void llama_layer_backward(kctx *c, const llama_layout *lo, const llama_layer_weights *w,
                          const float *inv_freq, const k_docs *docs, const void *x,
                          llama_layer_acts *a, llama_scratch *s, void *dresid, int B, int T);

/* The head: final RMSNorm, lm_head, cross entropy against targets (already shifted, see
 * k_shift_labels), and its backward.  *loss_sum (fp32, context memory) += the summed token
 * losses; gradients are those of dscale * loss_sum.  head_params/head_grads are the head
 * unit's; embed_params/embed_grads unit 0's, used (and then required) only with tied
 * embeddings.  head_grads/embed_grads NULL: frozen (no weight gradients).  logits_f32 (fp32
 * [N,V] in context memory) receives the logits when not NULL.
 * On return dresid = d/d(x). */
void llama_head_forward_backward(kctx *c, const llama_layout *lo, const void *head_params,
                                 float *head_grads, const void *embed_params, float *embed_grads,
                                 const void *x, llama_head_acts *a, llama_scratch *s,
                                 const int32_t *targets, int B, int T, float dscale,
                                 float *loss_sum, float *logits_f32, void *dresid);

/* A run of token positions [start, start + n) of the head's B*T rows: its summed token
 * losses go to sums[slot], its gradients are those of dscale times that sum. */
typedef struct llama_span {
    int start, n, slot;
    float dscale;
} llama_span;

/* The head over spans that partition [0, B*T) in order (preference objectives, whose
 * gradient weights differ by sequence): sums (fp32, context memory) += each span's summed
 * token losses against targets; with backward, the gradients of sum of dscale x span loss
 * accumulate as llama_head_forward_backward's, and dresid = d/d(x).  Without backward only
 * the sums (the weights and dresid untouched). */
void llama_head_spans(kctx *c, const llama_layout *lo, const void *head_params, float *head_grads,
                      const void *embed_params, float *embed_grads, const void *x, llama_head_acts *a,
                      llama_scratch *s, const int32_t *targets, int B, int T, const llama_span *spans,
                      int n_spans, float *sums, int backward, void *dresid);

/* ---- the whole model in one process ---- */

typedef struct llama_model {
    llama_layout layout;
    kctx *ctx;
    int checkpoint_activations; /* keep only layer inputs; recompute in backward */

    void *param_memory;  /* every unit's flat parameters, one allocation */
    void **params;       /* [n_units] into param_memory */
    void *grad_memory;
    float **grads;       /* [n_units] into grad_memory, fp32 */
    float *inv_freq;     /* [head_dim/2] */

    /* Activations, sized for the last (B, T). */
    int B, T;
    void *act_memory;
    void **resid;                 /* [n_layers+1]: layer l's input; resid[L] the head's */
    llama_layer_acts *layer_acts; /* [n_layers], or [1] with checkpointing */
    llama_head_acts head;
    llama_scratch scratch;
    void *dresid;                 /* [N,C] */
    int32_t *tokens, *targets;    /* [N] */
    int32_t *doc_start, *doc_end; /* [N]: a packed batch's document bounds */
    k_docs docs;                  /* pointing at them */
    float *loss_sum;              /* [1] */
    float *logits_f32;            /* [N,V], allocated when logits are first asked for */

    /* LoRA (llama_model_init_lora): adapter units, their gradients, the base frozen (its
     * grads NULL).  Dropout keys row b of a batch as sample first_sample + b. */
    int has_lora;
    lora_layout lora_layout;
    llama_lora lora;
    void *adapter_memory, **adapters;     /* [n_layers] compute dtype */
    void *adapter_grad_memory;
    float **adapter_grads;                /* [n_layers] fp32 */
    int64_t *samples;                     /* [B] context memory */
    int64_t first_sample;
} llama_model;

/* Allocates the units' parameters (zero) and gradients (zero) through k_alloc. */
int llama_model_init(llama_model *m, const llama_config *cfg, kctx *ctx,
                     int checkpoint_activations, errbuf *err);
void llama_model_destroy(llama_model *m);
/* Adds LoRA adapters (zero) on the layers, as cfg says, and freezes the base: its gradients
 * are freed and no longer computed.  seed keys the dropout masks. */
int llama_model_init_lora(llama_model *m, const lora_config *cfg, uint64_t seed, errbuf *err);
/* Copies every parameter from a Hugging Face checkpoint (F32/BF16/F16), checking that each
 * expected tensor exists with the expected shape (extra tensors are ignored). */
int llama_model_load_hf(llama_model *m, const st_model *st, errbuf *err);
/* One parameter or its gradient by Hugging Face name (or PEFT saved name for an adapter),
 * as host fp32 [n]; n must be its element count.  A frozen base has no gradient. */
int llama_model_set_param(llama_model *m, const char *name, const float *src, size_t n,
                          errbuf *err);
int llama_model_get_param(llama_model *m, const char *name, float *dst, size_t n, errbuf *err);
int llama_model_get_grad(llama_model *m, const char *name, float *dst, size_t n, errbuf *err);
void llama_model_zero_grad(llama_model *m);
/* Forward and backward on host int32 input_ids and labels [B,T] (both required; labels
 * unshifted, -100 = masked), checked with llama_check_batch.  Gradients of dscale * (sum of
 * token losses) are accumulated into the grads; *loss_sum gets that sum (unscaled) and
 * *count the number of unmasked targets after the shift.  logits (host fp32 [B,T,V])
 * receives the logits when not NULL. */
int llama_model_forward_backward(llama_model *m, const int32_t *input_ids,
                                 const int32_t *labels, int B, int T, float dscale,
                                 float *loss_sum, int64_t *count, float *logits, errbuf *err);
/* The same for a packed batch: doc_start/doc_end (host int32 [B*T], see llama_check_docs,
 * which checks them) bound each token's document: RoPE positions restart at each document,
 * and no token attends across a document boundary; NULL bounds is
 * llama_model_forward_backward.  Labels are as given: the data side masks each document's
 * first label (-100), and *count counts what is left. */
int llama_model_forward_backward_packed(llama_model *m, const int32_t *input_ids,
                                        const int32_t *labels, const int32_t *doc_start,
                                        const int32_t *doc_end, int B, int T, float dscale,
                                        float *loss_sum, int64_t *count, float *logits,
                                        errbuf *err);

#endif
