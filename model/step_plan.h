/* step_plan: what a job will need and take before it is submitted (F32; `fsdpctl plan`, and
 * fsdpd's refusal of a job that cannot fit, before it loads the model).
 *
 * Per GPU: the device memory of model/memory_plan.h (exact: what fsdp allocates) plus the CUDA
 * context with its workspace (the rates table's context_bytes).  Per node: host RAM (the model
 * memory every worker reads, cpu_offload's pinned state, the checkpoint writer's staging, the
 * token cache, the processes).  The checkpoint's size and write time.  The step time, from
 * the rates table of one GPU (proto/plan_rates.h, measured by bench/plan_rates.c):
 *   - every GEMM of a micro-batch at its shape (a layer's seven linears: forward, input
 *     gradient, and for what is trained the weight gradient; a LoRA's A and B at rank r; the
 *     head 2048 rows at a time), the shape looked up in the table (the nearest row in log
 *     space, scaled by the FLOPs, when it is missing);
 *   - attention forward and backward at (rows, T, heads, head dim);
 *   - the memory-bound kernels by the bytes they move (norms, RoPE, SwiGLU, residuals,
 *     casts, dropout, NF4 dequantization, cross entropy, AdamW) at the table's rates, and a
 *     launch each;
 *   - activation checkpointing's recomputed forward;
 *   - a preference objective: a micro-batch of train.micro_batch pairs is twice the rows, the
 *     policy's head runs its forward twice (the span sums, then with the backward), and DPO
 *     adds the reference's forward (no backward; with adapters the base alone) with its
 *     gathers, a unit at a time, unhidden;
 *   - communication: each layer's all-gathers (two a micro-batch, one with shard_grad_op) and
 *     gradient reduce-scatter over the shard group (no_shard: an all-reduce), hybrid_shard's
 *     all-reduce of the shard across nodes, as rings at the link's bandwidth (NVLink inside
 *     a node, a GPU's share of the network across), of which only what exceeds the
 *     neighbouring layer's compute is exposed (prefetch);
 *   - offload: the gradients' copy to the host and the uploads (cpu_offload), the host's
 *     AdamW beyond the next step's forward, and offload_params' streams of the frozen base
 *     beyond each micro-batch's compute, and offload_activations' layer inputs (to the host
 *     in forward, back in backward, each beside a layer's compute: what exceeds it).
 * Another GPU than the table's is scaled from datasheets (compute-bound rates by dense bf16
 * TFLOP/s, memory-bound by HBM bandwidth, copies by PCIe) and marked as unvalidated.  Not
 * modelled: several workers sharing one GPU, packed rows' shorter attention, power
 * throttling beyond what the table's runs saw. */
#ifndef FSDP_STEP_PLAN_H
#define FSDP_STEP_PLAN_H

#include <stddef.h>

#include "base/errbuf.h"
#include "model/memory_plan.h"
#include "proto/job.h"
#include "proto/model_config.h"
#include "proto/model_image.h"
#include "proto/plan_rates.h"

/* A GPU the plan knows: its memory and datasheet rates. */
typedef struct plan_gpu {
    const char *name;  /* h200, h100, a100-80, a100-40, l40s, 4090, 3090 */
    double memory_gib; /* usable device memory */
    double tflops;     /* dense bf16 tensor TFLOP/s, fp32 accumulation */
    double hbm_gbps;   /* memory bandwidth */
    double link_gbps;  /* NCCL bus bandwidth between the GPUs of a node (NVLink, else PCIe) */
    double pcie_gbps;  /* host copies */
} plan_gpu;

/* The GPU named name (NULL when the plan does not know it); names lists them all. */
const plan_gpu *plan_gpu_find(const char *name);
const char *plan_gpu_names(void);

/* Where a job runs. */
typedef struct plan_machine {
    int nodes, gpus_per_node;
    const plan_gpu *gpu;
    double net_gbps;   /* network bandwidth of a node (across nodes) */
    size_t data_bytes; /* the token cache (0: unknown) */
} plan_machine;

typedef struct step_plan {
    memory_plan mem;  /* a worker's device memory, by fsdp's categories */
    size_t context;   /* the CUDA context with its workspace */
    size_t gpu_bytes; /* mem.total + context: a worker's device memory at its peak */
    /* The same bytes by what they hold (they sum to mem.total, the staging buffer aside) */
    size_t params, grads, optimizer, gathered, activations, workspace;
    /* host RAM of a node (host_workers: on the CPU backend, the workers' memory above) */
    size_t host_model, host_offload, host_workers, host_ckpt, host_data, host_processes, host_total;
    /* in-memory checkpoints (daemon/memory_ckpt.h): their first image is host_ckpt's staging
     * buffer; a second of this many bytes a node where it fits in half the free memory (the
     * node decides at the start of a run: not in host_total) */
    size_t host_memory_ckpt;
    /* the checkpoint: all of it, a node's part, the seconds a node writes it */
    size_t ckpt_bytes, ckpt_node_bytes;
    double ckpt_write_s;
    /* the step: compute (GEMMs, attention, the rest), exposed communication and offload */
    double gemm_s, attention_s, memory_s, comm_s, comm_exposed_s, offload_exposed_s, optimizer_s;
    double step_s, tokens_per_s; /* tokens: of every row (a pair's two) */
    double reference_s; /* DPO: the reference's forward and its gathers (and streams), a part of step_s */
    llama_recompute recompute; /* the activation checkpointing planned (auto: the one chosen) */
    int offload_layers;        /* fsdp.offload_activations: layer inputs in host memory (a worker) */
    int compute_copies;        /* the trained weights kept in the compute dtype (memory_plan_job_options) */
    int max_micro_batch; /* the largest micro_batch that fits the GPU (dividing the rows of a
                            rank); 0: none */
    int validated;       /* the rates were measured on this GPU */
    int cpu;             /* the CPU backend: the memory is host memory; no context, no step time */
    int fits;            /* fsdpd admits the job (step_plan_admit); else verdict says why */
    char verdict[1024];
} step_plan;

/* The plan of job j (resolved and validated for nodes x gpus_per_node workers) over a model of
 * config cfg whose base is stored as quant, on m, from the rates table r, on the job's
 * runtime.backend: cuda needs m->gpu and r; cpu plans the memory (fp32 compute, no CUDA
 * context) and host RAM only (m->gpu and r may be NULL; with r, the checkpoint's write time).
 * fits and verdict are fsdpd's admission check (step_plan_admit with PLAN_CONTEXT_BYTES, as
 * daemon/supervisor.c runs it); max_micro_batch is the largest that this check admits. */
int step_plan_job(const job_config *j, const llama_config *cfg, model_image_quant quant,
                  const plan_machine *m, const plan_rates *r, step_plan *p, errbuf *err);

/* fsdpd's check before it loads the model: with runtime.gpu_memory_limit, the worker's own
 * check (memory_plan_check_job); else on gpu_bytes of device memory (0: none to check, the
 * CPU backend) a job whose worker needs more than gpu_bytes - PLAN_MARGIN_BYTES (its device
 * memory and the context) is refused, with what it needs and what would fit. */
#define PLAN_MARGIN_BYTES ((size_t)256 << 20)
/* A CUDA context with its workspace when no rates table says (the H200's measured 563 MiB). */
#define PLAN_CONTEXT_BYTES ((size_t)600 << 20)
/* What fsdp.activation_checkpointing auto leaves free besides PLAN_MARGIN_BYTES: what the plan
 * does not count (NCCL's buffers, the backend's scratch). */
#define PLAN_AUTO_HEADROOM_BYTES ((size_t)1 << 30)
/* The bytes auto plans a worker's activations within: runtime.gpu_memory_limit, else
 * gpu_bytes (0: unbounded, SIZE_MAX) less the context, the margin and the headroom. */
size_t step_plan_auto_budget(const job_config *j, size_t gpu_bytes, size_t context);
int step_plan_admit(const job_config *j, const llama_config *cfg, int world, model_image_quant quant,
                    size_t compute_size, size_t gpu_bytes, size_t context, errbuf *err);

#endif
