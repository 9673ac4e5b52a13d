/* fsdp: fully sharded data parallelism over the units of worker/llama (DESIGN.md, Sharding
 * model).
 *
 * Each unit's flat parameter (numel elements) is padded to a multiple of the shard group
 * size W and cut into W equal shards; rank r owns elements [r*S, (r+1)*S).  Per rank and
 * unit: an fp32 master shard, AdamW m and v shards and an fp32 gradient shard.  A step
 * all-gathers a unit's parameters (compute dtype) just before use and drops them after;
 * backward re-gathers, recomputes the layer when activation checkpointing is on, and
 * reduce-scatters the unit's gradients into the gradient shards.
 *
 * DPO with a full fine-tune (fsdp_options.pref): the reference is the start weights, a frozen
 * copy of the model's units held as an adapter job's base is (fsdp_frozen, sharded, compute
 * dtype, loaded by fsdp_load_image beside the masters), gathered only for the reference
 * forward, never updated.
 *
 * LoRA (fsdp_options.lora; DESIGN.md, LoRA and QLoRA): the model's units are frozen, held
 * sharded in the compute dtype (fsdp_frozen: no master, gradient or optimizer state) and
 * gathered as today (one rank uses its shards in place); the trainable flat parameters,
 * units[], are then the adapter units (proto/lora_layout.h, one per decoder layer), gathered
 * with their layer, with fp32 masters and AdamW.  Gradients reach only the adapters.
 *
 * Strategies: full_shard (W = world), shard_grad_op (W = world; a unit gathered in forward
 * stays gathered until its backward, which reads it again instead of re-gathering, with
 * activation checkpointing the recompute too: one slot a unit) and no_shard (W = 1: every
 * rank keeps the whole model and the gradients are all-reduced, i.e. DDP) and hybrid_shard
 * (W = a node's workers: full_shard inside each node over its shard communicator, each
 * reduce-scattered gradient shard then all-reduced over the replica communicator, the same
 * local rank of every node, queued right behind; node 0's ranks write the checkpoint).  Padding elements stay zero: their
 * gradients are zero, so AdamW leaves them at zero.
 *
 * Loss normalisation (DESIGN.md, Numerics): a step's loss is the sum of token losses over
 * every unmasked target of the global batch divided by the global count of those targets,
 * so the result does not depend on how the batch is split across ranks and micro-batches. */
#ifndef FSDP_FSDP_H
#define FSDP_FSDP_H

#include <stddef.h>
#include <stdint.h>

#include "base/errbuf.h"
#include "kernels/kernels.h"
#include "model/llama.h"
#include "proto/ckpt.h"
#include "proto/model_image.h"
#include "proto/job.h"
#include "worker/comm.h"
#include "worker/fsdp_pref.h"
#include "worker/host_optim.h"

/* Numbers every rank contributes to a step's first all-gather (fsdp.vote); the step's result
 * carries their maximum over the ranks (fsdp_step_result.vote_max), so the ranks take a
 * decision together, at the same step, without another collective.  The checkpoint trigger
 * and the stop use them (worker/train.c). */
#define FSDP_VOTES 6

typedef struct fsdp_unit {
    size_t numel;     /* elements of the unit's flat parameter */
    size_t padded;    /* numel rounded up to a multiple of the shard group size */
    size_t shard;     /* padded / group size */
    size_t shard_off; /* this rank's first element */
    float *master, *m, *v, *grad; /* [shard] fp32, context memory; with cpu_offload master, m
                                     and v are pinned host memory (grad stays) */
    /* cpu_offload: the shard in the compute dtype, which the gathers read: host_param (pinned,
     * written by the host optimizer) and its copy in context memory, uploaded once a step
     * (dev_param; NULL with offload_params, whose gathers read host_param itself). */
    void *host_param, *dev_param;
    int uploaded_step; /* the f->step dev_param holds (-1: none yet) */
    /* compute_copies: the shard (the whole unit: one rank) in the compute dtype, context
     * memory, written with the master by AdamW and by masters_changed; the forward and
     * backward read it in place (no gather, no cast a use).  NULL otherwise. */
    void *copy;
    /* One rank, a decoder layer of a full fine-tune (writes_grads): this step's backward has
     * not yet written its projections' part of grad, left unzeroed at the step's start. */
    int grad_unwritten;
} fsdp_unit;

/* A flat parameter of bytes (a frozen NF4 layer's codes or absmax), sharded like the others:
 * padded to whole 64-value blocks per rank. */
typedef struct fsdp_bytes {
    size_t bytes, padded, shard, shard_off;
    uint8_t *data; /* [shard], context memory */
} fsdp_bytes;

/* A frozen unit's shard (LoRA): this rank's elements in the compute dtype.  A QLoRA job's
 * decoder layer (fsdp.quant NF4) holds instead its linears' packed NF4 codes and block
 * absmax as byte flats of their own (sharded, gathered as bytes: a quarter of the bf16
 * traffic) and, replicated since they are small, the nested absmax (context memory), the
 * offsets (host: they are kernel arguments) and the norms (fp32, context memory). */
typedef struct fsdp_frozen {
    size_t numel, padded, shard, shard_off;
    void *param; /* [shard] compute dtype, context memory; NULL for an NF4 layer */
    fsdp_bytes packed, absmax;
    float *nested, *norms;
    float offsets[MODEL_IMAGE_LINEARS];
} fsdp_frozen;

/* One all-gather of a micro-batch's schedule: which unit, into which slot of fsdp.gathered. */
typedef struct fsdp_gather {
    int unit, slot;
    int kept; /* shard_grad_op: the unit is still in its slot from its forward gather: no
                 collective (the backward and a tied head read the kept copy) */
} fsdp_gather;

/* A gradient reduction in flight, reading fsdp.full_grad[its slot]. */
typedef struct fsdp_reduce {
    int pending, unit;
    int into_grad;      /* the result lands in the grad shard itself (the first micro-batch) */
    comm_ticket ticket; /* 0: nothing to wait for (one rank) */
    comm_ticket replica_ticket; /* hybrid_shard: the all-reduce over the replicas (0: none) */
} fsdp_reduce;

/* offload_params: a slot's copies on the K_COPY_PARAMS lane (fsdp.c's stream_frozen, the
 * frozen unit from the model image; gather_trainable, a trained unit's compute copy from the
 * host): the last one's ticket (0: nothing to wait for), and the unit streamed into the slot
 * ahead of its plan entry's start (stream_ahead; -1: none). */
typedef struct fsdp_stream {
    uint64_t ticket;
    int ahead;
} fsdp_stream;

typedef struct fsdp {
    kctx *ctx;
    comm *comm;       /* the world's: the step's statistics */
    comm *shard_comm; /* the shard group's: gathers and reduce-scatters (the world's unless
                         hybrid_shard spans nodes) */
    comm *replica;    /* hybrid_shard over nodes: the replica group's (the gradient all-reduce) */
    int rank, world;
    int group;  /* shard group size: world (full_shard, shard_grad_op), 1 (no_shard), the
                   shard communicator's (hybrid_shard) */
    int group_rank;
    job_sharding sharding;
    llama_recompute recompute;
    int forward_prefetch, backward_prefetch; /* see fsdp_options */
    llama_layout layout;
    fsdp_unit *units; /* the trainable flat parameters: the model's units, or with LoRA the
                         adapter units (n_train of them, laid out by train_units/tensors) */
    int n_train;
    const llama_unit *train_units;
    const llama_tensor_slot *train_tensors;
    int n_train_tensors;
    int step; /* optimizer steps taken */

    /* LoRA: the adapters' layout and compute settings, the frozen model units
     * ([layout.n_units]), the adapters' gather slots beside gathered[0..1], and the rows'
     * sample indices (dropout keys) of the micro-batch in progress. */
    int has_lora;
    lora_layout lora_layout;
    llama_lora lora;
    fsdp_frozen *frozen;        /* also a full fine-tune's DPO reference: the start weights */
    void *frozen_memory;        /* every frozen shard, one allocation */
    void *gathered_adapter[2];
    /* QLoRA: the base's quantization (the model image's), one layer's NF4 layout, and the
     * gathered codes and absmax of two layers, dequantized into `dequant` before use. */
    model_image_quant quant;
    model_image_nf4_layer nl;
    uint8_t *gathered_packed[2], *gathered_absmax[2];
    void *dequant; /* [a layer's padded] compute dtype */

    /* Offload (fsdp_options.cpu_offload, offload_params).  cpu_offload: the trainable
     * units' master, m, v and compute copies in one pinned host allocation (host_state),
     * their gradients copied to host_grad after each step, and AdamW on the host
     * (worker/host_optim.h) running beside the next step until each unit's first gather.
     * offload_params: the frozen units are not held in context memory: every gather copies
     * the whole unit from the node's model image (registered with the device), on the copy
     * stream, ahead of use (no collective: every node has the image). */
    int cpu_offload, offload_params;
    int compute_copies; /* fsdp_options.compute_copies: fsdp_unit.copy */
    void *host_state;
    float *host_grad;
    host_optim *optim;
    host_optim_task *optim_tasks;
    int n_optim_tasks;
    const void *image; /* offload_params: the model image the gathers read (registered) */
    model_image_nf4_layer image_nl; /* where the image keeps an NF4 layer's parts */
    fsdp_stream *streamed; /* [n_slots]: offload_params' copies into each slot */
    int64_t *samples; /* [B] context memory, in the activations' allocation */
    int64_t vote[FSDP_VOTES]; /* this rank's votes for the next step */

    /* Communication schedule of a micro-batch (fsdp.c explains the slots). */
    fsdp_gather *plan;   /* the all-gathers in the order their units are used */
    int n_plan, n_forward_plan; /* all of them; those before the first backward re-gather */
    int next_gather;     /* the first plan entry not started yet */
    comm_ticket (*gather_ticket)[3]; /* [n_slots] per slot: its all-gathers in flight (0:
                                        none): the parameters (or NF4 codes), NF4 absmax,
                                        adapters */
    fsdp_reduce reducing[3];      /* per full_grad slot */
    int first_micro;     /* the micro-batch in progress is the step's first */

    /* Working memory, sized for the largest unit and one micro-batch. */
    int n_slots;         /* of gathered[]: 3, or with shard_grad_op one a unit (fsdp_slots) */
    void **gathered;     /* [n_slots] of [max padded] compute dtype: [0], [1] alternate between
                            the units in use and prefetched; [2] the embedding for the tied
                            head.  shard_grad_op: the embedding, each layer, the head */
    float *full_grad[3]; /* [max padded] fp32: [0], [1] alternate between the unit in backward
                            and the one being reduced; [2] the tied embedding's.  One rank
                            has [0] only (as scratch): its grads go straight to the shards */
    float *inv_freq;
    int B, T;
    void *act_memory;
    void **resid;        /* [L+1] layer inputs, then the head's input */
    /* fsdp.offload_activations (fsdp_options.offload_layers): the inputs of the first
     * offload_layers layers in pinned host memory (host_resid[l]), copied there on the copy
     * stream as the forward goes and back one layer ahead in the backward; resid[0 ..
     * offload_layers + 1] share two device buffers (fsdp.c, "offloaded layer inputs"). */
    int offload_layers;
    int mlp_rows; /* fsdp.mlp_chunk (fsdp_options.mlp_chunk): the MLP's rows at a time; 0: all */
    void *host_acts;
    void **host_resid;   /* [offload_layers] */
    llama_layer_acts *layer_acts; /* [L]: a layer's own parts or shared ones (llama_layers_acts_carve) */
    llama_head_acts head;
    llama_scratch scratch;
    void *dresid;
    size_t resid_bytes;  /* each of resid's buffers */
    int32_t *tokens, *targets;
    int32_t *doc_start, *doc_end; /* [N]: a packed micro-batch's document bounds (k_docs) */
    void *stats;         /* [world] per-rank step statistics, gathered (context memory) */
    float *scalars;      /* [2] context memory: loss sum, squared-norm accumulator */

    fsdp_pref pref; /* train.objective dpo / orpo (fsdp_pref.h); pref.cfg.objective 0: SFT */
    /* DPO's reference forward in progress: the gathers read the frozen units (a full
     * fine-tune's frozen copy of its start weights, an adapter job's base), never the
     * trainable ones (the forward leaves an adapter job's adapters unused). */
    int reference;
    int forward_only; /* a pass without backward (evaluation, the reference): no backward prefetch */
    int fp8;          /* fsdp_options' fp8: fp8's buffers are carved with the activations */
    llama_fp8 fp8_linears;
    /* fsdp_options' fp8_all_gather: the FP8 layers (llama_fp8_layer) are gathered as e4m3
     * codes (fsdp.c, "FP8 gathers"), under tensorwise scales fixed once a step from the whole
     * tensors' amax: fp8_amax [group x fp8_scale_count] (each rank's, gathered), fp8_scales
     * [LLAMA_FP8_SCALE_STRIDE x fp8_scale_count] (llama_layer_weights.code_scales), both in the
     * `scalars` allocation, and fp8_scales_step the f->step they were computed at (-1: none);
     * slot_codes[slot]: the slot's gather in flight is of codes (its norms to be put in place). */
    int fp8_gather, fp8_scale_count, fp8_scales_step;
    float *fp8_amax, *fp8_scales;
    unsigned char *slot_codes;

    long layer_forwards; /* decoder-layer forward passes and recomputations (full or partial) run */
    long param_gathers;  /* units all-gathered over the shard group (shard_grad_op halves it) */
} fsdp;

typedef struct fsdp_options {
    job_sharding sharding;
    /* Activation checkpointing: what each decoder layer keeps (llama.h); {n_layers, any}
     * is none.  worker/train.c's job_recompute turns the job's setting into it. */
    llama_recompute recompute;
    /* Overlap (fsdp.forward_prefetch / backward_prefetch in the job): all-gather the next
     * unit while the current one computes, in forward / in backward, where the latter also
     * lets each unit's gradient reduction run during the next unit's backward.  Off, every
     * collective finishes before the compute that follows it is queued. */
    int forward_prefetch, backward_prefetch;
    const lora_config *lora; /* NULL: a full fine-tune; else adapters on a frozen base */
    uint64_t seed;           /* train.seed: adapter init and dropout streams */
    model_image_quant quant; /* with adapters: the base image's (NF4 for QLoRA) */
    /* fsdp.cpu_offload: master and AdamW state in pinned host memory, the step on the host
     * (offload_threads threads, 0: one a core); fsdp.offload_params: frozen units streamed
     * from the model image (needs adapters; the image must stay mapped until fsdp_destroy). */
    int cpu_offload, offload_params, offload_threads;
    /* A shard group of one rank (what is trained whole on every rank): keep the trained
     * weights (the model's, or the adapters') in the compute dtype beside their fp32 masters,
     * written by AdamW in the same pass (fsdp_unit.copy), so no unit is cast from its master
     * at each gather (twice a micro-batch: forward and backward).  model/memory_plan.h's
     * memory_plan_job_options decides it (where the plan has room); refused with several
     * ranks to a shard group, shard_grad_op, cpu_offload or FP8 gathers. */
    int compute_copies;
    /* fsdp.offload_activations: the first this many layers' inputs (0 .. L-1) on the host,
     * with full recompute (model/memory_plan.h's memory_plan_offload_layers decides it). */
    int offload_layers;
    /* fsdp.mlp_chunk: each layer's MLP this many tokens at a time (forward, and backward
     * recomputing each chunk; 0: all); needs every layer's MLP recomputed (full or
     * selective) and adapters without dropout. */
    int mlp_chunk;
    /* train.precision fp8 (F45): the decoder projections of every layer but the first and
     * the last in FP8 (llama_fp8), scaled fp8_scaling, the gradients' operands in
     * fp8_grad_format; a full fine-tune only. */
    int fp8;
    k_fp8_scaling fp8_scaling;
    fp8_format fp8_grad_format;
    /* train.fp8_all_gather: the FP8 layers gathered as codes (half the bytes, each weight cast
     * once a gather from its master instead of at each GEMM); tensorwise, masters in context
     * memory (not cpu_offload). */
    int fp8_all_gather;
    /* hybrid_shard over several nodes: the shard group (this node's ranks, rank r is r % its
     * size) and the replica group (this local rank on every node); NULL on one node, where
     * the world is the shard group. */
    comm *shard_comm, *replica_comm;
    fsdp_pref_config pref; /* train.objective and its settings; zero: SFT */
} fsdp_options;

/* The gather slots fsdp holds for a model of n_layers layers under `sharding` (model/
 * memory_plan mirrors it): 3, or with shard_grad_op n_layers + 2 (the embedding, which a
 * tied head reads again, each layer, the head). */
int fsdp_slots(job_sharding sharding, int n_layers);

/* Lays out the shards of a model of config cfg for `rank` of `world` (comm may be NULL when
 * world is 1) and allocates the fp32 shards, zeroed. */
int fsdp_init(fsdp *f, const llama_config *cfg, kctx *ctx, comm *comm, int rank, int world,
              const fsdp_options *opt, errbuf *err);
void fsdp_destroy(fsdp *f);

/* Fills this rank's master shards (LoRA: frozen shards; full DPO: both) from the node's
 * model image (proto/model_image.h, checked against this model's layout, `bytes` long), copying only
 * this rank's slices.  With offload_params f keeps reading the image's frozen units, and
 * registers it with the device: it must stay mapped until fsdp_destroy. */
int fsdp_load_image(fsdp *f, const void *image, size_t bytes, errbuf *err);
/* LoRA: this rank's adapter shards as PEFT initialises them (lora_A Kaiming-uniform, bound
 * 1/sqrt(in), each element keyed by (seed, layer, module, index): the same values at any
 * world size; lora_B zero). */
int fsdp_init_adapters(fsdp *f, errbuf *err);
/* LoRA: this rank's adapter shards from full host fp32 adapter units (units[l] laid out as
 * f->lora_layout's unit l), e.g. a PEFT adapter read with lora.init_from. */
int fsdp_set_adapters(fsdp *f, float *const *units, errbuf *err);

typedef struct fsdp_hparams {
    double lr, beta1, beta2, eps, weight_decay; /* weight decay skips norm weights */
    double clip_norm;                           /* 0: no clipping */
} fsdp_hparams;

typedef struct fsdp_step_result {
    double loss;       /* global: summed token losses / global count */
    int64_t tokens;    /* global count of unmasked targets */
    double grad_norm;  /* global, before clipping */
    int64_t vote_max[FSDP_VOTES]; /* the maximum of every rank's fsdp.vote */
    double pref[PREF_STATS]; /* preference objectives: the step's figures (fsdp_pref.h); loss
                                is pref[PREF_LOSS] */
} fsdp_step_result;

/* This rank's share of a global batch: n_micro micro-batches of micro_batch sequences of T
 * (a preference objective: micro_batch / 2 pairs, rows 2i chosen and 2i+1 rejected)
 * tokens, input_ids/labels host int32 [n_micro*micro_batch, T] (labels unshifted, -100
 * masked).  doc_start/doc_end: NULL, or the same shape for packed rows: each token's
 * document bounds as data/rows.h builds them (model/llama.h's llama_check_docs checks them;
 * RoPE positions restart at each document, attention stays inside it).  samples: host int64
 * [rows], each row's global sample index (LoRA dropout keys), or NULL: the row's index. */
typedef struct fsdp_batch {
    const int32_t *input_ids, *labels;
    const int32_t *doc_start, *doc_end;
    const int64_t *samples;
    int n_micro, micro_batch, T;
} fsdp_batch;

/* One optimizer step on batch b.  A non-finite loss or gradient norm fails the step
 * (parameters untouched) with the step and the first rank where it appeared. */
int fsdp_train_step(fsdp *f, const fsdp_batch *b, const fsdp_hparams *hp, fsdp_step_result *res,
                    errbuf *err);
/* The summed token loss and target count of a held-out batch over every rank (collective),
 * the parameters untouched and dropout off.  It runs the training pass with the gradients
 * scaled by 0 (they land in the grad shards, which the next step overwrites or zeroes): one
 * code path for the loss, at the price of a backward. */
int fsdp_eval_loss(fsdp *f, const fsdp_batch *b, double *loss_sum, int64_t *count, errbuf *err);

/* cpu_offload: returns once the host optimizer has finished the last step (the master, m
 * and v shards are then final: a checkpoint reads them); at once without offload. */
int fsdp_wait_optimizer(fsdp *f, errbuf *err);

/* The checkpoint layout of this rank's state (proto/ckpt.h): one shard file per member of the
 * shard group, the trainable units and tensors (the model's, or the adapters'). */
int fsdp_ckpt_layout(const fsdp *f, ckpt_layout *lo, errbuf *err);
/* Fills this rank's master, m and v shards from the committed checkpoint in dir (manifest m,
 * written at any world size: re-sliced through ckpt_read_range, every section it touches
 * CRC-checked) and sets f->step to its optimizer step.  The checkpoint must hold this model:
 * the same units and tensors.  adopt (NULL: none) may give the reader files of its own before
 * it reads (ckpt_reader_adopt: in-memory images). */
typedef int (*fsdp_adopt_fn)(void *arg, ckpt_reader *r, errbuf *err);
int fsdp_load_checkpoint(fsdp *f, const ckpt_manifest *m, const char *dir, fsdp_adopt_fn adopt, void *arg,
                         errbuf *err);

/* Gathers model unit u whole into gather slot `slot` (0, 1 or 2; collective over the shard
 * group) and returns its parameters in the compute dtype, as a training forward reads them,
 * for the compute queued next (until the slot is gathered into again; read-only: with one
 * rank and adapters they may be the frozen shard itself).  *adapters: with LoRA, a decoder
 * layer's adapter unit (f->lora_layout's, gathered into the slot's adapter buffer, a copy
 * the caller may change), else NULL.  NULL with the reason. */
void *fsdp_gather_unit(fsdp *f, int u, int slot, void **adapters, errbuf *err);

/* Gathers the full trainable parameters (the model's, or the adapters') of every tensor as
 * host fp32 (collective: every rank calls it); calls fn for each tensor in layout order.
 * For tests and small models. */
typedef int (*fsdp_tensor_fn)(const llama_tensor_slot *slot, const float *data, void *arg,
                              errbuf *err);
int fsdp_gather_params(fsdp *f, fsdp_tensor_fn fn, void *arg, errbuf *err);

#endif
