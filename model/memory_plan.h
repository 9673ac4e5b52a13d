/* memory_plan: the device memory one worker's fsdp allocates (context memory, k_alloc), by
 * category, computed from the job's settings before anything is loaded.
 *
 * It mirrors worker/fsdp.c's allocations byte for byte (alloc_frozen, alloc_trainable,
 * alloc_slots, ensure_activations, fsdp_init's RoPE frequencies, the step's statistics, the
 * staging buffer of fsdp_load_image); tests/unit/test_memory_plan.c checks the total against
 * k_peak_bytes after fsdp_init, fsdp_load_image and a step, so the two cannot drift apart.
 * The worker checks runtime.gpu_memory_limit with it before fsdp_init (worker/train.c); fsdpd
 * and `fsdpctl plan` can use the same arithmetic (it needs the model config only).
 *
 * Not counted (not context memory): the CUDA runtime, cuBLASLt's workspace, NCCL's buffers,
 * host memory. */
#ifndef FSDP_MEMORY_PLAN_H
#define FSDP_MEMORY_PLAN_H

#include <stddef.h>

#include "base/errbuf.h"
#include "model/llama.h"
#include "proto/job.h"
#include "proto/lora_layout.h"
#include "proto/model_config.h"
#include "proto/model_image.h"

/* What the plan depends on: fsdp_options' settings, the world, one micro-batch's shape and
 * the context's compute dtype. */
typedef struct memory_plan_options {
    const llama_config *model;
    job_sharding sharding;      /* full_shard, shard_grad_op, no_shard or hybrid_shard */
    int world, rank;            /* every rank of full_shard holds shards of one size */
    int group;                  /* hybrid_shard: the shard group's ranks (a node's workers) */
    const lora_config *lora;    /* NULL: a full fine-tune; else adapters on a frozen base */
    model_image_quant quant;    /* with adapters: the base's (NF4 for QLoRA) */
    llama_recompute recompute;  /* fsdp.activation_checkpointing (memory_plan_job_options) */
    int micro_batch, seq_len;
    size_t compute_size;        /* bytes per element of the compute dtype (k_compute_size) */
    int cpu_offload, offload_params; /* fsdp.cpu_offload, fsdp.offload_params */
    int compute_copies;         /* fsdp_options.compute_copies (memory_plan_job_options decides) */
    int mlp_chunk;              /* fsdp.mlp_chunk: the MLP's rows at a time (0: all) */
    int fp8;                    /* train.precision fp8: the FP8 projections' buffers (llama_fp8) */
    int fp8_all_gather;         /* train.fp8_all_gather: the FP8 scales and amaxes (fsdp's scalars) */
    int offload_layers;         /* fsdp.offload_activations: the first this many layers' inputs in
                                   pinned host memory (memory_plan_offload_layers), 0..L-1 */
    job_objective objective;    /* train.objective: micro_batch counts rows, two a pair; a
                                   preference objective's buffers; DPO with a full fine-tune
                                   its reference, the frozen copy of the start weights */
} memory_plan_options;

/* Bytes per category.  Everything but load_staging is held from the first step on;
 * load_staging only while fsdp_load_image runs (before the activations exist). */
typedef struct memory_plan {
    size_t trainable;    /* fp32 master, m, v and grad shards of what is trained and with
                            compute_copies their copies in the compute dtype (cpu_offload:
                            the grad shards and, unless offload_params, compute copies) */
    size_t frozen;       /* adapters: the frozen base's shards (QLoRA: NF4 codes, absmax, norms);
                            a full DPO: its reference's shards */
    size_t gather_slots; /* gathered units (and adapters; NF4 codes and absmax when sharded) */
    size_t grad_slots;   /* full fp32 gradients being computed and reduced */
    size_t activations;  /* one micro-batch's (all layers', or one with checkpointing) */
    size_t small;        /* RoPE frequencies, the step's scalars, every rank's statistics (and a
                            preference objective's span sums and figures) */
    size_t load_staging; /* adapters, a full DPO: the staging buffer that loads the frozen units */
    size_t total;        /* the peak: the most held at any time */
    size_t host_offload; /* not context memory: cpu_offload's pinned host shards (master, m,
                            v, the gradients' copy, the compute copies) */
    size_t host_activations; /* not context memory: offload_layers layer inputs, pinned */
    size_t trainable_elems; /* elements of this rank's trainable shards */
} memory_plan;

/* The plan of o, or -1 with the reason (a bad model or adapter config, a sharding fsdp does
 * not build, ranks or sizes out of range). */
int memory_plan_compute(const memory_plan_options *o, memory_plan *p, errbuf *err);

/* "1.5 GiB (1610612736 bytes): trainable shards 0.4 GiB, frozen shards 0.0 GiB, ..." into
 * out[n]: the total, then every category in GiB with one decimal. */
void memory_plan_format(const memory_plan *p, char *out, size_t n);

/* Job j's options on `world` ranks: its fsdp, train and adapter settings (out->lora points
 * at j->lora.config, job_resolve's, unless a full fine-tune: j must outlive out), the base's quantization
 * and the compute dtype's size.  fsdp.activation_checkpointing: none keeps every layer
 * whole, full their inputs only, selective their attention parts (the MLP is recomputed),
 * auto what memory_plan_auto_recompute picks for `budget` bytes (SIZE_MAX: no bound);
 * fsdp.offload_activations the layer inputs memory_plan_offload_layers moves for it; then
 * compute_copies where fsdp builds them and the plan with them still fits in budget (kept
 * activations first: a layer's recompute saved is worth more a byte than the casts). */
void memory_plan_job_options(const job_config *j, const llama_config *cfg, int world, int rank,
                             model_image_quant quant, size_t compute_size, size_t budget,
                             memory_plan_options *out);

/* fsdp.activation_checkpointing auto: of every {layers, keep} (llama.h), the one that
 * recomputes the fewest FLOPs a micro-batch and whose plan (o with it) fits in budget
 * bytes, the smaller plan of two equal ones; full recompute when none fits. */
llama_recompute memory_plan_auto_recompute(const memory_plan_options *o, size_t budget);

/* fsdp.offload_activations: the fewest layer inputs (0 .. L-1) to keep in host memory for o's
 * plan to fit in budget bytes ("offload only what must go"); L-1 when none fits. */
int memory_plan_offload_layers(const memory_plan_options *o, size_t budget);

/* The FLOPs a micro-batch's backward recomputes under r (a decoder layer's attention part:
 * its q, k, v, o projections and attention, but o with h kept and the attention with its
 * output kept; its MLP part: gate and up). */
double memory_plan_recompute_flops(const memory_plan_options *o, llama_recompute r);

/* The largest micro_batch up to `most` that divides `rows` (a rank's samples: pairs for a
 * preference objective, of two rows each) and whose plan (o with that many samples a
 * micro-batch) fits in limit bytes, its total in *total; 0: none. */
int memory_plan_largest_micro_batch(const memory_plan_options *o, int rows, int most, size_t limit,
                                    size_t *total);

/* runtime.gpu_memory_limit for job j (as memory_plan_job_options takes it): 0 when there is
 * no limit or the plan fits; else -1 with what the job needs (total and categories), the
 * limit, and which settings would fit, each changed alone: fsdp.activation_checkpointing
 * full, the largest smaller train.micro_batch (dividing the rows of a rank), the fewest
 * workers that fit (full_shard), train.type lora or qlora (with the job's lora settings),
 * fsdp.cpu_offload, fsdp.offload_params (adapters), both. */
int memory_plan_check_job(const job_config *j, const llama_config *cfg, int world, int rank,
                          model_image_quant quant, size_t compute_size, errbuf *err);
/* The same against any limit of device memory a worker; `what` names it in the message
 * ("runtime.gpu_memory_limit", "the GPU's memory ..."). */
int memory_plan_check_limit(const job_config *j, const llama_config *cfg, int world, int rank,
                            model_image_quant quant, size_t compute_size, size_t limit,
                            const char *what, errbuf *err);
/* The same check on options already resolved (memory_plan_job_options with limit as the
 * budget): a worker resolves them once and both trains and checks with them. */
int memory_plan_check_options(const job_config *j, const memory_plan_options *o, size_t limit, const char *what,
                              errbuf *err);

#endif
