/* fsdp: sharded parameters, the gather/compute/reduce order of a step, and AdamW on the
 * shards.  See fsdp.h. */
#include "base/bytes.h"
#include "worker/fsdp.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/bf16.h"
#include "base/fault.h"
#include "base/philox.h"
#include "proto/model_image.h"
#include "proto/rng.h"

static void build_plan(fsdp *f);

static int is_tied(const fsdp *f) { return f->layout.cfg.tie_word_embeddings; }

static comm_dtype compute_comm_dtype(const kctx *c) {
    return c->compute == K_BF16 ? COMM_BF16 : COMM_F32;
}

/* ---- set-up ---- */

/* Pads a flat parameter of numel elements to the shard group and picks this rank's part. */
static void shard_of(const fsdp *f, size_t numel, size_t *padded, size_t *shard, size_t *off) {
    *padded = round_up(numel, (size_t)f->group);
    *shard = *padded / (size_t)f->group;
    *off = (size_t)f->group_rank * *shard;
}

/* Whether model unit u is a decoder layer held in NF4 (QLoRA). */
static int is_nf4(const fsdp *f, int u) {
    return f->quant != MODEL_IMAGE_PLAIN && u >= 1 && u <= f->layout.n_layers;
}

/* ---- FP8 gathers (train.fp8_all_gather) ----
 *
 * An FP8 layer (llama_fp8_layer) is gathered one byte a parameter: each rank casts its shard
 * of the seven projections from the fp32 masters to e4m3 codes (k_fp8_cast_f32) under the
 * tensor's scale, and the codes are all-gathered into the slot at their element offsets
 * (bytes [0, padded)): half the bytes of the compute dtype's gather, and no cast of the
 * weight at each GEMM.  The rest of the unit, its plain part [P, numel) after the projections
 * (norms; Qwen's biases and q/k norms), stays in the compute dtype at its usual place, bytes
 * [P cs, numel cs) of the slot, past the codes (check_fp8_slots: P cs >= padded + staging).
 * With several ranks it is a second all-gather, of a chunk of n_plain values a rank (its own
 * values at their places, zero elsewhere) into the staging space between the two, from which
 * gather_wait copies each rank's own values into place (fp8_place_plain).
 * The scales are tensorwise, of the whole tensor, fixed once a step (fp8_refresh_scales):
 * each rank's amax of its part, all-gathered, the largest.  They are those k_fp8_cast finds
 * on the gathered compute-dtype weight, and the codes transposed under one scale are the
 * transposed cast's: the bits of fp8_all_gather off (tests/unit/test_fsdp.c). */

typedef struct fp8_slot_layout {
    size_t plain, n_plain; /* the plain part's first element and its count */
    size_t staging;        /* the byte offset of the ranks' plain chunks (several ranks) */
} fp8_slot_layout;

/* Whether model unit u is gathered as FP8 codes (a trained FP8 layer). */
static int fp8_gathered(const fsdp *f, int u) {
    int L = f->layout.n_layers;
    return f->fp8_gather && !f->has_lora && !f->reference && u >= 1 && u <= L && llama_fp8_layer(u - 1, L);
}

/* A decoder layer's plain part: its first element after the seven projections (LLAMA_LN1's
 * offset; every decoder layer has layer 0's offsets and size). */
static size_t layer_plain(const fsdp *f) {
    const llama_layout *lo = &f->layout;
    int u = llama_layer_unit(0);
    return lo->tensors[lo->units[u].first + lo->layer_index[LLAMA_LN1]].offset;
}

static fp8_slot_layout fp8_layout(const fsdp *f) {
    size_t numel = f->layout.units[llama_layer_unit(0)].numel, padded, shard, off, plain = layer_plain(f);
    shard_of(f, numel, &padded, &shard, &off);
    return (fp8_slot_layout){.plain = plain, .n_plain = numel - plain, .staging = round_up(padded, 256)};
}

/* The codes, the ranks' plain chunks and the plain part must not overlap in a slot. */
static int check_fp8_slots(const fsdp *f, errbuf *err) {
    if (!f->fp8_gather) return 0;
    fp8_slot_layout s = fp8_layout(f);
    size_t cs = k_compute_size(f->ctx), chunks = f->group > 1 ? (size_t)f->group * s.n_plain * cs : 0;
    if (s.staging + chunks > s.plain * cs)
        return errf(err, "train.fp8_all_gather: a decoder layer of %zu projection values and %zu others is too "
                         "small to hold its codes beside them over %d ranks (set train.fp8_all_gather false)",
                    s.plain, s.n_plain, f->group);
    return 0;
}

/* A byte flat of `bytes`, each rank's shard a multiple of `align` bytes (whole 64-value
 * blocks of codes: 32 bytes; of absmax: any multiple of its element size). */
static void bytes_of(const fsdp *f, fsdp_bytes *b, size_t bytes, size_t align) {
    b->bytes = bytes;
    b->padded = round_up(bytes, (size_t)f->group * align);
    b->shard = b->padded / (size_t)f->group;
    b->shard_off = (size_t)f->group_rank * b->shard;
}

/* Carves 256-byte aligned buffers out of one allocation (mem NULL: measures). */
static void *carve_frozen(char *mem, size_t *at, size_t bytes) {
    void *p = mem ? mem + *at : NULL;
    *at += round_up(bytes, 256);
    return p;
}

/* Lays out (mem NULL: only sizes) every frozen unit's buffers; returns the bytes and the
 * largest plain (not NF4) unit, padded.  With offload_params only an NF4 layer's small
 * replicated parts are kept: the rest is read from the model image at each use. */
static size_t lay_out_frozen(fsdp *f, char *mem, size_t *max_plain) {
    const llama_layout *lo = &f->layout;
    size_t cs = k_compute_size(f->ctx), at = 0;
    int kept = !f->offload_params;
    *max_plain = 0;
    for (int u = 0; u < lo->n_units; u++) {
        fsdp_frozen *F = &f->frozen[u];
        F->numel = lo->units[u].numel;
        shard_of(f, F->numel, &F->padded, &F->shard, &F->shard_off);
        if (!is_nf4(f, u)) {
            if (F->padded > *max_plain) *max_plain = F->padded;
            F->param = kept ? carve_frozen(mem, &at, F->shard * cs) : NULL;
            continue;
        }
        int dq = f->quant == MODEL_IMAGE_NF4_DQ;
        bytes_of(f, &F->packed, f->nl.packed_bytes, 32);
        bytes_of(f, &F->absmax, f->nl.absmax_bytes, dq ? 64 : 4 * 64);
        F->packed.data = kept ? carve_frozen(mem, &at, F->packed.shard) : NULL;
        F->absmax.data = kept ? carve_frozen(mem, &at, F->absmax.shard) : NULL;
        F->nested = dq ? carve_frozen(mem, &at, f->nl.n_nested * sizeof(float)) : NULL;
        F->norms = carve_frozen(mem, &at, f->nl.n_plain * sizeof(float));
    }
    return at;
}

/* LoRA: the frozen model units' shards, in one allocation; QLoRA: the layer that NF4 layers
 * are dequantized into (one: the compute stream orders its uses) and, unless one rank reads
 * its own shards in place, two layers' gathered (or streamed) codes and absmax. */
static int alloc_frozen(fsdp *f, size_t *max_plain, errbuf *err) {
    if (f->quant != MODEL_IMAGE_PLAIN) model_image_nf4_layer_of(&f->layout, MODEL_IMAGE_F32, f->quant, &f->nl);
    size_t bytes = lay_out_frozen(f, NULL, max_plain);
    if (!(f->frozen_memory = k_alloc(f->ctx, bytes, err))) return -1;
    lay_out_frozen(f, f->frozen_memory, max_plain);
    if (f->quant == MODEL_IMAGE_PLAIN) return 0;
    const fsdp_frozen *F = &f->frozen[llama_layer_unit(0)];
    if (!(f->dequant = k_alloc(f->ctx, F->padded * k_compute_size(f->ctx), err))) return -1;
    if (f->group == 1 && !f->offload_params) return 0;
    for (int slot = 0; slot < 2; slot++)
        if (!(f->gathered_packed[slot] = k_alloc(f->ctx, F->packed.padded, err)) ||
            !(f->gathered_absmax[slot] = k_alloc(f->ctx, F->absmax.padded, err)))
            return -1;
    return 0;
}

/* cpu_offload: the gradients (and, unless offload_params, the compute copies) in context
 * memory; master, m, v, the gradients' host copy and the compute copies pinned, in host_state
 * (each kind contiguous over the units, so a step's gradients come back in one copy). */
static int alloc_offloaded(fsdp *f, size_t total, errbuf *err) {
    size_t cs = k_compute_size(f->ctx);
    float *grad = f->units[0].grad = k_alloc(f->ctx, total * sizeof(float), err);
    if (!grad) return -1; /* from here on fsdp_destroy frees what there is */
    char *dev = NULL;
    if (!f->offload_params && !(dev = f->units[0].dev_param = k_alloc(f->ctx, total * cs, err)))
        return -1;
    float *host = f->host_state = k_host_alloc(f->ctx, total * (4 * sizeof(float) + cs), err);
    if (!host) return -1;
    float *master = host, *m = master + total, *v = m + total;
    char *param = (char *)(v + 2 * total);
    f->host_grad = v + total;
    for (int u = 0; u < f->n_train; u++) {
        fsdp_unit *U = &f->units[u];
        U->master = master, master += U->shard;
        U->m = m, m += U->shard;
        U->v = v, v += U->shard;
        U->grad = grad, grad += U->shard;
        U->host_param = param, param += U->shard * cs;
        if (dev) U->dev_param = dev, dev += U->shard * cs;
        U->uploaded_step = -1;
    }
    return 0;
}

/* The trainable units' fp32 shards (master, m, v, grad) and their compute copies, in one
 * allocation (cpu_offload: alloc_offloaded). */
static int alloc_trainable(fsdp *f, size_t *max_padded, errbuf *err) {
    size_t total = 0;
    *max_padded = 0;
    for (int u = 0; u < f->n_train; u++) {
        fsdp_unit *U = &f->units[u];
        U->numel = f->train_units[u].numel;
        shard_of(f, U->numel, &U->padded, &U->shard, &U->shard_off);
        total += U->shard;
        if (U->padded > *max_padded) *max_padded = U->padded;
    }
    if (f->cpu_offload) return alloc_offloaded(f, total, err);
    size_t cs = k_compute_size(f->ctx), copies = f->compute_copies ? total * cs : 0;
    float *mem = k_alloc(f->ctx, 4 * total * sizeof(float) + copies, err);
    if (!mem) return -1;
    char *copy = (char *)(mem + 4 * total);
    for (int u = 0; u < f->n_train; u++) {
        fsdp_unit *U = &f->units[u];
        U->master = mem, mem += U->shard;
        U->m = mem, mem += U->shard;
        U->v = mem, mem += U->shard;
        U->grad = mem, mem += U->shard;
        if (copies) U->copy = copy, copy += U->shard * cs;
    }
    return 0;
}

/* The gather and gradient slots.  Full fine-tune: gathered[0..1] and full_grad[0..1] of the
 * largest unit, slot 2 for a tied head's embedding.  LoRA: the adapters' slots beside, and
 * the frozen units' gathered[] (of the largest plain unit: NF4 layers go to their byte slots
 * and `dequant`) only when sharded or streamed: one rank reads its shards in place.  With
 * compute copies no trained unit has a gather slot (they are read in place). */
static int alloc_slots(fsdp *f, size_t base_padded, size_t train_padded, errbuf *err) {
    size_t cs = k_compute_size(f->ctx);
    size_t embed_padded = f->has_lora ? f->frozen[LLAMA_EMBED_UNIT].padded
                                      : f->units[LLAMA_EMBED_UNIT].padded;
    int base_slots = (!f->has_lora && !f->compute_copies) || f->group > 1 || f->offload_params;
    /* shard_grad_op: a slot a unit kept from forward to backward, each of the largest unit
     * (fsdp_gather_params reuses slot 0 for every unit). */
    for (int slot = 3; slot < f->n_slots; slot++)
        if (!(f->gathered[slot] = k_alloc(f->ctx, base_padded * cs, err))) return -1;
    for (int slot = 0; slot < 3; slot++) {
        size_t n = slot < 2 || f->sharding == JOB_SHARD_GRAD_OP ? base_padded : is_tied(f) ? embed_padded : 0;
        if (n && base_slots && !(f->gathered[slot] = k_alloc(f->ctx, n * cs, err))) return -1;
        if (f->has_lora && slot < 2 && !f->compute_copies &&
            !(f->gathered_adapter[slot] = k_alloc(f->ctx, train_padded * cs, err)))
            return -1;
        /* Gradients exist for trainable units only; one rank accumulates straight into its
         * grad shards (grad_buffer), so it needs none. */
        size_t g = slot < 2 ? train_padded : is_tied(f) && !f->has_lora ? embed_padded : 0;
        if (g == 0 || f->world == 1) continue;
        if (!(f->full_grad[slot] = k_alloc(f->ctx, g * sizeof(float), err))) return -1;
    }
    return 0;
}

static int alloc_shards(fsdp *f, errbuf *err) {
    size_t base_padded = 0, train_padded = 0;
    if (f->frozen && alloc_frozen(f, &base_padded, err)) return -1;
    if (alloc_trainable(f, &train_padded, err)) return -1;
    if (!f->has_lora) base_padded = train_padded;
    if (alloc_slots(f, base_padded, train_padded, err)) return -1;
    /* the step's two sums; FP8 gathers: 16 bytes on, the scales (each scale and inverse at a
     * 16-byte boundary: cuBLASLt's scale pointers), then each rank's amaxes */
    size_t n = (size_t)f->fp8_scale_count, words = n ? 4 + (LLAMA_FP8_SCALE_STRIDE + (size_t)f->group) * n : 2;
    f->scalars = k_alloc(f->ctx, words * sizeof(float), err);
    if (!f->scalars) return -1;
    f->fp8_scales = n ? f->scalars + 4 : NULL;
    f->fp8_amax = n ? f->fp8_scales + LLAMA_FP8_SCALE_STRIDE * n : NULL;
    return 0;
}

/* What is trained: the model's units, or (LoRA) the adapters'; what is frozen: the base of
 * adapters, or a full fine-tune's DPO reference (its start weights). */
static int set_trainable(fsdp *f, const fsdp_options *opt, errbuf *err) {
    const llama_layout *lo = &f->layout;
    if (opt->lora) {
        if (lora_layout_init(&f->lora_layout, &lo->cfg, opt->lora, err)) return -1;
        f->has_lora = 1;
        f->lora = (llama_lora){.layout = &f->lora_layout, .scale = (float)lora_scale(opt->lora),
                               .dropout = (float)opt->lora->dropout, .seed = opt->seed};
        f->quant = opt->quant;
    }
    if ((opt->lora || opt->pref.objective == JOB_OBJECTIVE_DPO) &&
        !(f->frozen = calloc((size_t)lo->n_units, sizeof *f->frozen)))
        return errf(err, "fsdp: out of host memory");
    const llama_layout *t = f->has_lora ? (const llama_layout *)NULL : lo;
    f->n_train = t ? t->n_units : f->lora_layout.n_units;
    f->train_units = t ? t->units : f->lora_layout.units;
    f->train_tensors = t ? t->tensors : f->lora_layout.tensors;
    f->n_train_tensors = t ? t->n_tensors : f->lora_layout.n_tensors;
    f->units = calloc((size_t)f->n_train, sizeof *f->units);
    return f->units ? 0 : errf(err, "fsdp: out of host memory");
}

/* The part [*a, *b) of tensor s (element offsets in its unit) that lies in shard U; empty
 * when *a >= *b. */
static void tensor_in_shard(const fsdp_unit *U, const llama_tensor_slot *s, size_t *a, size_t *b) {
    *a = s->offset > U->shard_off ? s->offset : U->shard_off;
    *b = s->offset + s->numel < U->shard_off + U->shard ? s->offset + s->numel
                                                        : U->shard_off + U->shard;
}

/* The host optimizer's tasks: every range of at most HOST_OPTIM_TASK_ELEMS elements of every
 * trainable tensor in this rank's shards, in unit order, into tasks (NULL: only counted);
 * returns how many. */
static int lay_out_tasks(fsdp *f, host_optim_task *tasks) {
    size_t cs = k_compute_size(f->ctx);
    int n = 0;
    for (int u = 0; u < f->n_train; u++) {
        const fsdp_unit *U = &f->units[u];
        const llama_unit *lu = &f->train_units[u];
        for (int i = lu->first; i < lu->first + lu->count; i++) {
            size_t a, b;
            tensor_in_shard(U, &f->train_tensors[i], &a, &b);
            for (size_t at = a; at < b; at += HOST_OPTIM_TASK_ELEMS, n++) {
                if (!tasks) continue;
                size_t o = at - U->shard_off;
                tasks[n] = (host_optim_task){
                    .unit = u, .master = U->master + o, .m = U->m + o, .v = U->v + o,
                    .grad = f->host_grad + (U->grad - f->units[0].grad) + o,
                    .param = (char *)U->host_param + o * cs,
                    .n = b - at < HOST_OPTIM_TASK_ELEMS ? b - at : HOST_OPTIM_TASK_ELEMS,
                    .decay = llama_tensor_decays(&f->train_tensors[i])};
            }
        }
    }
    return n;
}

/* cpu_offload: the host optimizer and the tasks of a step. */
static int init_host_optim(fsdp *f, int threads, errbuf *err) {
    f->n_optim_tasks = lay_out_tasks(f, NULL);
    f->optim_tasks = calloc((size_t)f->n_optim_tasks + 1, sizeof *f->optim_tasks);
    if (!f->optim_tasks) return errf(err, "fsdp: out of host memory");
    lay_out_tasks(f, f->optim_tasks);
    return host_optim_init(&f->optim, threads, f->n_train, f->ctx->compute, err);
}

/* hybrid_shard: shard over opt's shard group, replicate over its replica group (both NULL on
 * one node: the world is the shard group); the groups must tile the world node by node. */
static int set_hybrid(fsdp *f, const fsdp_options *opt, errbuf *err) {
    if (!opt->shard_comm != !opt->replica_comm)
        return errf(err, "fsdp: hybrid_shard needs both the shard and the replica communicator");
    if (!opt->shard_comm) return 0;
    int group = comm_world(opt->shard_comm), replicas = comm_world(opt->replica_comm);
    if (group * replicas != f->world || comm_rank(opt->shard_comm) != f->rank % group ||
        comm_rank(opt->replica_comm) != f->rank / group)
        return errf(err, "fsdp: rank %d of %d is rank %d of a shard group of %d and %d of %d "
                         "replicas: the groups do not tile the world node by node", f->rank, f->world,
                    comm_rank(opt->shard_comm), group, comm_rank(opt->replica_comm), replicas);
    f->shard_comm = opt->shard_comm;
    f->replica = opt->replica_comm;
    f->group = group;
    f->group_rank = f->rank % group;
    return 0;
}

/* train.precision fp8 and its gathers (fsdp_options' fp8, fp8_all_gather): what is built. */
static int set_fp8(fsdp *f, const llama_config *cfg, const fsdp_options *opt, errbuf *err) {
    f->fp8 = opt->fp8;
    f->fp8_linears = (llama_fp8){.scaling = opt->fp8_scaling, .grad_format = opt->fp8_grad_format};
    f->fp8_gather = opt->fp8 && opt->fp8_all_gather;
    f->fp8_scales_step = -1;
    if (!opt->fp8 && opt->fp8_all_gather) return errf(err, "fsdp: fp8_all_gather without FP8 linears");
    if (opt->fp8 && opt->lora) return errf(err, "fsdp: FP8 linears with adapters are not built yet");
    if (opt->fp8 && cfg->num_hidden_layers < 3)
        return errf(err, "train.precision fp8 keeps the first and the last decoder layer in bf16: a model of %d "
                         "layers has none to run in FP8", cfg->num_hidden_layers);
    if (f->fp8_gather && opt->fp8_scaling != K_FP8_TENSORWISE)
        return errf(err, "train.fp8_all_gather with rowwise scales is not built yet (the gathered codes carry one "
                         "scale a tensor; set train.fp8_all_gather false)");
    if (f->fp8_gather && opt->cpu_offload)
        return errf(err, "train.fp8_all_gather with fsdp.cpu_offload is not built yet (the codes are cast from "
                         "masters in GPU memory; set train.fp8_all_gather false)");
    f->fp8_scale_count = f->fp8_gather ? LLAMA_FP8_PROJECTIONS * (cfg->num_hidden_layers - 2) : 0;
    return 0;
}

int fsdp_init(fsdp *f, const llama_config *cfg, kctx *ctx, comm *comm, int rank, int world,
              const fsdp_options *opt, errbuf *err) {
    memset(f, 0, sizeof *f);
    f->ctx = ctx;
    f->comm = comm;
    f->shard_comm = comm;
    f->rank = rank;
    f->world = world;
    f->sharding = opt->sharding;
    f->recompute = opt->recompute;
    f->forward_prefetch = opt->forward_prefetch;
    f->backward_prefetch = opt->backward_prefetch;
    f->cpu_offload = opt->cpu_offload;
    f->offload_params = opt->offload_params;
    f->offload_layers = opt->offload_layers;
    f->mlp_rows = opt->mlp_chunk;
    f->pref.cfg = opt->pref;
    if (set_fp8(f, cfg, opt, err)) return -1;
    if (opt->sharding == JOB_SHARD_GRAD_OP && (opt->lora || opt->cpu_offload))
        return errf(err, "fsdp: shard_grad_op with adapters or cpu_offload is not built yet");
    if (opt->offload_params && !opt->lora && !opt->cpu_offload)
        return errf(err, "fsdp: offload_params in a full fine-tune needs cpu_offload (its "
                         "parameters are the master shards)");
    f->compute_copies = opt->compute_copies;
    if (opt->compute_copies && (opt->cpu_offload || f->fp8_gather || opt->sharding == JOB_SHARD_GRAD_OP))
        return errf(err, "fsdp: compute copies with shard_grad_op, cpu_offload or FP8 gathers are not built");
    if (llama_check_long_settings(cfg->num_hidden_layers, opt->recompute, opt->offload_layers, opt->mlp_chunk,
                                  opt->lora ? opt->lora->dropout : 0, err))
        return errprefix(err, "fsdp");
    if (world > 1 && !comm) return errf(err, "fsdp: %d ranks need a communicator", world);
    f->group = opt->sharding == JOB_SHARD_NONE ? 1 : world;
    f->group_rank = opt->sharding == JOB_SHARD_NONE ? 0 : rank;
    if (opt->sharding == JOB_SHARD_HYBRID && set_hybrid(f, opt, err)) return -1;
    if (opt->compute_copies && f->group > 1)
        return errf(err, "fsdp: compute copies need the whole model on each rank (a shard group of %d ranks)",
                    f->group);
    if (llama_layout_init(&f->layout, cfg, err) || check_fp8_slots(f, err)) return -1;
    size_t half = (size_t)cfg->head_dim / 2;
    float *inv_freq = malloc(half * sizeof *inv_freq);
    f->n_slots = fsdp_slots(opt->sharding, cfg->num_hidden_layers);
    f->plan = calloc(2 * (size_t)f->layout.n_layers + 3, sizeof *f->plan);
    f->gathered = calloc((size_t)f->n_slots, sizeof *f->gathered);
    f->gather_ticket = calloc((size_t)f->n_slots, sizeof *f->gather_ticket);
    f->streamed = calloc((size_t)f->n_slots, sizeof *f->streamed);
    f->slot_codes = calloc((size_t)f->n_slots, sizeof *f->slot_codes);
    int no_memory = !inv_freq || !f->plan || !f->gathered || !f->gather_ticket || !f->streamed || !f->slot_codes;
    for (int i = 0; !no_memory && i < f->n_slots; i++) f->streamed[i].ahead = -1;
    if (no_memory || set_trainable(f, opt, err)) {
        free(inv_freq);
        if (no_memory) errf(err, "fsdp: out of host memory");
        fsdp_destroy(f);
        return -1;
    }
    build_plan(f);
    int rc = alloc_shards(f, err);
    if (rc == 0 && f->cpu_offload) rc = init_host_optim(f, opt->offload_threads, err);
    if (rc == 0) f->inv_freq = k_alloc(ctx, half * sizeof(float), err);
    if (rc == 0 && f->inv_freq) {
        llama_rope_inv_freq(cfg, inv_freq);
        k_copy_h2d(ctx, f->inv_freq, inv_freq, half * sizeof(float));
    }
    free(inv_freq);
    if (rc != 0 || !f->inv_freq || k_sync(ctx, err)) {
        fsdp_destroy(f);
        return errprefix(err, "fsdp");
    }
    return 0;
}

static void free_activations(fsdp *f) {
    if (f->act_memory) k_free(f->ctx, f->act_memory);
    k_host_free(f->ctx, f->host_acts);
    free(f->host_resid);
    f->host_acts = NULL;
    f->host_resid = NULL;
    f->samples = NULL;
    free(f->resid);
    free(f->layer_acts);
    f->act_memory = NULL;
    f->resid = NULL;
    f->layer_acts = NULL;
    f->B = f->T = 0;
}

void fsdp_destroy(fsdp *f) {
    host_optim_destroy(f->optim); /* first: its threads write the host shards */
    if (f->ctx) {
        free_activations(f);
        fsdp_pref_free(&f->pref, f->ctx);
        if (f->pref.gathered) k_free(f->ctx, f->pref.gathered);
        if (f->image) k_host_unregister(f->ctx, f->image);
        if (f->cpu_offload && f->units) {
            k_free(f->ctx, f->units[0].grad);
            k_free(f->ctx, f->units[0].dev_param);
            k_host_free(f->ctx, f->host_state);
        } else if (f->units && f->units[0].master) {
            k_free(f->ctx, f->units[0].master);
        }
        for (int slot = 0; f->gathered && slot < f->n_slots; slot++)
            if (f->gathered[slot]) k_free(f->ctx, f->gathered[slot]);
        void *bufs[] = {f->full_grad[0], f->full_grad[1], f->full_grad[2], f->inv_freq, f->scalars, f->stats,
                        f->gathered_adapter[0], f->gathered_adapter[1], f->frozen_memory,
                        f->gathered_packed[0], f->gathered_packed[1], f->gathered_absmax[0],
                        f->gathered_absmax[1], f->dequant};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
            if (bufs[i]) k_free(f->ctx, bufs[i]);
    }
    free(f->units);
    free(f->frozen);
    free(f->plan);
    free(f->gathered);
    free(f->gather_ticket);
    free(f->streamed);
    free(f->slot_codes);
    free(f->optim_tasks);
    llama_layout_free(&f->layout);
    lora_layout_free(&f->lora_layout);
    memset(f, 0, sizeof *f);
}

/* Offloaded layer inputs: resid[j] for j <= offload_layers + 1 lives in device buffer j % 2
 * (the others in buffers of their own), and resid[j] for j < offload_layers also on the host.
 * Forward: before layer l runs, the copy of resid[l - 1] to the host is waited for (layer l
 * writes resid[l + 1] over it) and resid[l]'s started (it overlaps layer l).  Backward:
 * before layer l runs, the fetch of resid[l] is waited for and resid[l - 1]'s started into
 * the buffer layer l + 1 has finished with.  resid[offload_layers] and the one after are
 * still on the device when the backward starts: they never go to the host. */
static int host_resid_alloc(fsdp *f, size_t resid_bytes, errbuf *err) {
    int n = f->offload_layers;
    if (!n) return 0;
    f->host_resid = calloc((size_t)n, sizeof *f->host_resid);
    char *host = f->host_resid ? k_host_alloc(f->ctx, (size_t)n * resid_bytes, err) : NULL;
    if (!host) return f->host_resid ? errprefix(err, "fsdp.offload_activations") : errf(err, "fsdp: out of host memory");
    f->host_acts = host;
    for (int l = 0; l < n; l++) f->host_resid[l] = host + (size_t)l * resid_bytes;
    return 0;
}

/* Forward, before layer l: resid[l]'s copy to the host (see host_resid_alloc); layer
 * offload_layers only waits for the last one. */
static void offload_input(fsdp *f, int l) {
    if (l > f->offload_layers || !f->offload_layers) return;
    k_copy_h2d_wait(f->ctx, K_COPY_ACTIVATIONS, K_COPY_ALL);
    if (l < f->offload_layers) k_copy_h2d_start(f->ctx, K_COPY_ACTIVATIONS, f->host_resid[l], f->resid[l], f->resid_bytes);
}

/* Backward, before layer l: resid[l] back (fetched one layer ago: waited for, layer 0's
 * too), resid[l - 1]'s fetch started. */
static void fetch_input(fsdp *f, int l) {
    if (l > f->offload_layers || !f->offload_layers) return;
    k_copy_h2d_wait(f->ctx, K_COPY_ACTIVATIONS, K_COPY_ALL);
    if (l > 0) k_copy_h2d_start(f->ctx, K_COPY_ACTIVATIONS, f->resid[l - 1], f->host_resid[l - 1], f->resid_bytes);
}

/* Activations of one micro-batch of B sequences of T tokens, in one allocation. */
static int ensure_activations(fsdp *f, int B, int T, errbuf *err) {
    if (f->B == B && f->T == T) return 0;
    free_activations(f);
    const llama_layout *lo = &f->layout;
    int L = lo->n_layers;
    size_t cs = k_compute_size(f->ctx), N = (size_t)B * T, C = (size_t)lo->cfg.hidden_size;
    size_t resid_bytes = round_up(N * C * cs, 256);
    const lora_layout *lora = f->has_lora ? &f->lora_layout : NULL;
    size_t acts_bytes = round_up(llama_layers_acts_carve(NULL, NULL, f->recompute, lo, lora, cs, B, T, f->mlp_rows), 256);
    size_t head_bytes = round_up(llama_head_acts_carve(&f->head, NULL, lo, cs, B, T), 256);
    size_t scratch_bytes = round_up(llama_scratch_carve(&f->scratch, NULL, lo, lora, cs, B, T, f->mlp_rows), 256);
    size_t fp8_bytes = f->fp8 ? round_up(llama_fp8_carve(&f->fp8_linears, NULL, lo, cs, B, T, f->mlp_rows), 256) : 0;
    size_t ids_bytes = round_up(N * sizeof(int32_t), 256);
    size_t samples_bytes = round_up((size_t)B * sizeof(int64_t), 256);
    size_t total = (size_t)(L + 2 - f->offload_layers) * resid_bytes + acts_bytes + head_bytes +
                   scratch_bytes + fp8_bytes + 4 * ids_bytes + samples_bytes;
    f->resid = calloc((size_t)L + 1, sizeof *f->resid);
    f->layer_acts = calloc((size_t)L, sizeof *f->layer_acts);
    if (!f->resid || !f->layer_acts) {
        free_activations(f);
        return errf(err, "fsdp: out of host memory for activations");
    }
    if (host_resid_alloc(f, resid_bytes, err)) {
        free_activations(f);
        return -1;
    }
    char *mem = k_alloc(f->ctx, total, err);
    if (!mem) {
        free_activations(f);
        return errprefix(err, "fsdp: activations for micro-batch %d x %d", B, T);
    }
    f->act_memory = mem;
    f->resid_bytes = resid_bytes;
    int ring = f->offload_layers ? f->offload_layers + 2 : 0; /* resid[0 .. ring-1] share two */
    for (int l = 0; l <= L; l++)
        if (l >= ring || l < 2) f->resid[l] = mem, mem += resid_bytes;
        else f->resid[l] = f->resid[l % 2];
    f->dresid = mem, mem += resid_bytes;
    llama_layers_acts_carve(f->layer_acts, mem, f->recompute, lo, lora, cs, B, T, f->mlp_rows), mem += acts_bytes;
    llama_head_acts_carve(&f->head, mem, lo, cs, B, T), mem += head_bytes;
    llama_scratch_carve(&f->scratch, mem, lo, lora, cs, B, T, f->mlp_rows), mem += scratch_bytes;
    if (f->fp8) llama_fp8_carve(&f->fp8_linears, mem, lo, cs, B, T, f->mlp_rows), mem += fp8_bytes;
    f->tokens = (int32_t *)mem, mem += ids_bytes;
    f->targets = (int32_t *)mem, mem += ids_bytes;
    f->doc_start = (int32_t *)mem, mem += ids_bytes;
    f->doc_end = (int32_t *)mem, mem += ids_bytes;
    f->samples = (int64_t *)mem; /* the rows' sample indices, uploaded per micro-batch */
    f->lora.samples = f->samples;
    f->B = B;
    f->T = T;
    return 0;
}

/* ---- initial parameters ---- */

/* After the master shards were written (loaded, initialised, resumed): the compute copies
 * follow them (with cpu_offload on the host, each unit uploaded again at its next gather). */
static int masters_changed(fsdp *f, errbuf *err) {
    f->fp8_scales_step = -1; /* FP8 gathers: the scales of the new masters at the next gather */
    if (f->compute_copies) {
        for (int u = 0; u < f->n_train; u++) k_f32_to_compute(f->ctx, f->units[u].copy, f->units[u].master, f->units[u].shard);
        return k_check(f->ctx, err);
    }
    if (!f->cpu_offload) return 0;
    if (fsdp_wait_optimizer(f, err)) return -1;
    for (int u = 0; u < f->n_train; u++) {
        fsdp_unit *U = &f->units[u];
        host_optim_cast(f->ctx->compute, U->host_param, U->master, U->shard);
        U->uploaded_step = -1;
    }
    return 0;
}

/* The part of a flat parameter of numel elements in [off, off + shard) that is not padding. */
static size_t unpadded(size_t numel, size_t off, size_t shard) {
    return off >= numel ? 0 : numel - off < shard ? numel - off : shard;
}

/* The rank's slice of every unit as fp32 (master shards), or with LoRA in the compute dtype
 * (frozen shards) through a bounded staging buffer: a unit may be too big to stage whole
 * on a small card (a 70B embedding is 4 GiB in fp32). */
#define IMAGE_CHUNK ((size_t)16 << 20) /* elements */

/* This rank's part [shard_off, shard_off + shard) of a byte flat of the image (src holds
 * b->bytes); past the end is padding, left zero. */
static void load_bytes(fsdp *f, const fsdp_bytes *b, const unsigned char *src) {
    size_t n = unpadded(b->bytes, b->shard_off, b->shard);
    if (n && b->data) k_copy_h2d(f->ctx, b->data, src + b->shard_off, n);
}

/* An NF4 layer of an NF4 image: its shards of the codes and absmax, and the replicated
 * nested absmax, offsets and norms. */
static int load_nf4_unit(fsdp *f, const void *image, int u, float *host, errbuf *err) {
    fsdp_frozen *F = &f->frozen[u];
    model_image_nf4_layer nl; /* where the image keeps them (its norms in its dtype) */
    model_image_nf4_layer_of(&f->layout, model_image_dtype_of(image), f->quant, &nl);
    const unsigned char *unit = model_image_unit(image, &f->layout, u);
    load_bytes(f, &F->packed, unit + nl.packed);
    load_bytes(f, &F->absmax, unit + nl.absmax);
    if (F->nested) {
        k_copy_h2d(f->ctx, F->nested, unit + nl.nested, nl.n_nested * sizeof(float));
        memcpy(F->offsets, unit + nl.offsets, sizeof F->offsets);
    }
    model_image_read_f32(image, &f->layout, u, 0, nl.n_plain, host);
    k_copy_h2d(f->ctx, F->norms, host, nl.n_plain * sizeof *host);
    return k_sync(f->ctx, err); /* host is reused */
}

static int load_frozen_image(fsdp *f, const void *image, float *host, float *staging,
                             errbuf *err) {
    const llama_layout *lo = &f->layout;
    size_t cs = k_compute_size(f->ctx);
    int rc = 0;
    if (model_image_quant_of(image) != f->quant)
        return errf(err, "fsdp: the model memory is %s, the job's base %s",
                    model_image_quant_of(image) == MODEL_IMAGE_PLAIN ? "not quantized" : "NF4",
                    f->quant == MODEL_IMAGE_PLAIN ? "is not quantized" : "NF4");
    for (int u = 0; u < lo->n_units && rc == 0; u++) {
        if (is_nf4(f, u)) {
            rc = load_nf4_unit(f, image, u, host, err);
            continue;
        }
        const fsdp_frozen *F = &f->frozen[u];
        size_t n = unpadded(F->numel, F->shard_off, F->shard);
        for (size_t at = 0; F->param && at < F->shard && rc == 0; at += IMAGE_CHUNK) {
            size_t len = F->shard - at < IMAGE_CHUNK ? F->shard - at : IMAGE_CHUNK;
            size_t real = at >= n ? 0 : n - at < len ? n - at : len;
            memset(host + real, 0, (len - real) * sizeof *host);
            if (real) model_image_read_f32(image, lo, u, F->shard_off + at, real, host);
            k_copy_h2d(f->ctx, staging, host, len * sizeof *host);
            k_f32_to_compute(f->ctx, (char *)F->param + at * cs, staging, len);
            rc = k_sync(f->ctx, err); /* host and staging are reused */
        }
    }
    return rc;
}

static int load_master_image(fsdp *f, const void *image, float *host, errbuf *err) {
    int rc = 0;
    for (int u = 0; u < f->n_train && rc == 0; u++) {
        const fsdp_unit *U = &f->units[u];
        size_t n = unpadded(U->numel, U->shard_off, U->shard);
        memset(host + n, 0, (U->shard - n) * sizeof *host);
        model_image_read_f32(image, &f->layout, u, U->shard_off, n, host);
        k_copy_h2d(f->ctx, U->master, host, U->shard * sizeof *host);
        rc = k_sync(f->ctx, err); /* the host buffer is reused for the next unit */
    }
    return rc ? rc : masters_changed(f, err);
}

/* offload_params: f reads the frozen units from the image from now on, which must then be in
 * the compute dtype (it is copied as it is); registered with the device, so that the copies
 * run at pinned speed on the copy stream. */
static int keep_image(fsdp *f, const void *image, size_t bytes, errbuf *err) {
    model_image_dtype dt = model_image_dtype_of(image);
    model_image_dtype want = f->ctx->compute == K_BF16 ? MODEL_IMAGE_BF16 : MODEL_IMAGE_F32;
    if (dt != want)
        return errf(err, "fsdp.offload_params: the model memory is %s and the workers compute in "
                         "%s; it is streamed as it is: set model.dtype to %s",
                    dt == MODEL_IMAGE_BF16 ? "bf16" : "fp32", want == MODEL_IMAGE_BF16 ? "bf16" : "fp32",
                    want == MODEL_IMAGE_BF16 ? "bf16" : "fp32");
    if (f->quant != MODEL_IMAGE_PLAIN) model_image_nf4_layer_of(&f->layout, dt, f->quant, &f->image_nl);
    k_host_register(f->ctx, image, bytes, 0);
    if (k_check(f->ctx, err)) return errprefix(err, "fsdp.offload_params: registering the model memory");
    f->image = image;
    return 0;
}

/* The frozen units (an adapter job's base, a full DPO's reference) through IMAGE_CHUNK
 * elements of host and context memory; the master shards through one unit's shard. */
static int load_frozen(fsdp *f, const void *image, errbuf *err) {
    float *host = malloc(IMAGE_CHUNK * sizeof *host);
    if (!host) return errf(err, "fsdp: out of host memory");
    float *staging = k_alloc(f->ctx, IMAGE_CHUNK * sizeof(float), err);
    int rc = staging ? load_frozen_image(f, image, host, staging, err) : -1;
    if (staging) k_free(f->ctx, staging);
    free(host);
    return rc;
}

static int load_masters(fsdp *f, const void *image, errbuf *err) {
    size_t max_shard = 0;
    for (int u = 0; u < f->n_train; u++)
        if (f->units[u].shard > max_shard) max_shard = f->units[u].shard;
    float *host = malloc(max_shard * sizeof *host);
    if (!host) return errf(err, "fsdp: out of host memory");
    int rc = load_master_image(f, image, host, err);
    free(host);
    return rc;
}

int fsdp_load_image(fsdp *f, const void *image, size_t bytes, errbuf *err) {
    if (f->offload_params && keep_image(f, image, bytes, err)) return -1;
    if (f->frozen && load_frozen(f, image, err)) return -1;
    return f->has_lora ? 0 : load_masters(f, image, err);
}

/* Element i of adapter tensor t (a PEFT-initialised value: lora_B zero; lora_A uniform in
 * [-1/sqrt(in), 1/sqrt(in)), kaiming_uniform_(a=sqrt(5)) as PEFT calls it). */
static float adapter_init(const fsdp *f, const llama_tensor_slot *t, size_t i) {
    int which, module = lora_tensor_module(&f->lora_layout, t, &which);
    if (which == 1) return 0.0f; /* lora_B */
    double bound = 1.0 / sqrt((double)t->shape[1]);
    uint64_t stream = rng_stream(RNG_PURPOSE_LORA_INIT, (uint64_t)philox_dropout_site(t->unit, module));
    return (float)((2.0 * rng_uniform(f->lora.seed, stream, i) - 1.0) * bound);
}

/* Fills this rank's adapter masters, unit by unit, from value(f, tensor, index, arg). */
typedef float (*adapter_value_fn)(const fsdp *f, const llama_tensor_slot *t, size_t i, void *arg);

static int fill_adapters(fsdp *f, adapter_value_fn value, void *arg, errbuf *err) {
    if (!f->has_lora) return errf(err, "fsdp: no adapters in a full fine-tune");
    size_t max_shard = 0;
    for (int u = 0; u < f->n_train; u++)
        if (f->units[u].shard > max_shard) max_shard = f->units[u].shard;
    float *host = calloc(max_shard, sizeof *host);
    if (!host) return errf(err, "fsdp: out of host memory");
    int rc = 0;
    for (int u = 0; u < f->n_train && rc == 0; u++) {
        const fsdp_unit *U = &f->units[u];
        const llama_unit *lu = &f->train_units[u];
        memset(host, 0, U->shard * sizeof *host);
        for (int i = lu->first; i < lu->first + lu->count; i++) {
            const llama_tensor_slot *t = &f->train_tensors[i];
            size_t a, b;
            tensor_in_shard(U, t, &a, &b);
            for (size_t e = a; e < b; e++) host[e - U->shard_off] = value(f, t, e - t->offset, arg);
        }
        k_copy_h2d(f->ctx, U->master, host, U->shard * sizeof *host);
        rc = k_sync(f->ctx, err);
    }
    free(host);
    return rc ? rc : masters_changed(f, err);
}

static float init_value(const fsdp *f, const llama_tensor_slot *t, size_t i, void *arg) {
    (void)arg;
    return adapter_init(f, t, i);
}

static float given_value(const fsdp *f, const llama_tensor_slot *t, size_t i, void *arg) {
    (void)f;
    float *const *units = arg;
    return units[t->unit][t->offset + i];
}

int fsdp_init_adapters(fsdp *f, errbuf *err) { return fill_adapters(f, init_value, NULL, err); }

int fsdp_set_adapters(fsdp *f, float *const *units, errbuf *err) {
    return fill_adapters(f, given_value, (void *)units, err);
}

/* ---- communication ----
 *
 * A micro-batch all-gathers units in a fixed order, the plan: the embedding, the layers,
 * the embedding again for a tied head, the head, then the layers backwards for the
 * backward pass.  Gathered units live in slots: the tied head's embedding in slot 2, the
 * others alternating between slots 0 and 1.  With prefetching, gather k+1 starts when
 * gather k is about to be used.  The compute of every earlier gather is queued by then,
 * and the collective is ordered after it, while gather k+1's slot differs from gather k's:
 * so a prefetch never overwrites a unit that compute still has to read, and at most two
 * gathered units (three with a tied head) exist at a time.
 *
 * Gradients take the same shape: each unit's full gradient is computed into a slot of its
 * own (the tied embedding's in slot 2, the others alternating), its reduction starts right
 * after its backward and runs during the next unit's; a slot's reduction is finished (and
 * this rank's part added to its grad shard) before compute writes that slot again. */

static void add_gather(fsdp *f, int unit, int slot, int *alternate) {
    if (slot < 0) slot = (*alternate)++ % 2;
    f->plan[f->n_plan++] = (fsdp_gather){.unit = unit, .slot = slot};
}

/* shard_grad_op: model unit u's own slot (the embedding 0, layer l 1 + l, the head L + 1),
 * gathered once in forward; `kept`: read again from there. */
static void add_kept(fsdp *f, int unit, int kept) {
    int L = f->layout.n_layers, head = llama_head_unit(&f->layout);
    int slot = unit == LLAMA_EMBED_UNIT ? 0 : unit == head ? L + 1 : unit; /* layer l is unit 1 + l */
    f->plan[f->n_plan++] = (fsdp_gather){.unit = unit, .slot = slot, .kept = kept};
}

static void build_kept_plan(fsdp *f) {
    int L = f->layout.n_layers;
    f->n_plan = 0;
    add_kept(f, LLAMA_EMBED_UNIT, 0);
    for (int l = 0; l < L; l++) add_kept(f, llama_layer_unit(l), 0);
    if (is_tied(f)) add_kept(f, LLAMA_EMBED_UNIT, 1);
    add_kept(f, llama_head_unit(&f->layout), 0);
    f->n_forward_plan = f->n_plan;
    for (int l = L - 1; l >= 0; l--) add_kept(f, llama_layer_unit(l), 1);
}

static void build_plan(fsdp *f) {
    if (f->sharding == JOB_SHARD_GRAD_OP) {
        build_kept_plan(f);
        return;
    }
    int L = f->layout.n_layers, alternate = 0;
    f->n_plan = 0;
    add_gather(f, LLAMA_EMBED_UNIT, -1, &alternate);
    for (int l = 0; l < L; l++) add_gather(f, llama_layer_unit(l), -1, &alternate);
    if (is_tied(f)) add_gather(f, LLAMA_EMBED_UNIT, 2, &alternate);
    add_gather(f, llama_head_unit(&f->layout), -1, &alternate);
    f->n_forward_plan = f->n_plan;
    for (int l = L - 1; l >= 0; l--) add_gather(f, llama_layer_unit(l), -1, &alternate);
}

int fsdp_slots(job_sharding sharding, int n_layers) {
    return sharding == JOB_SHARD_GRAD_OP ? n_layers + 2 : 3;
}

/* The trainable unit holding model unit u's trained parameters: u itself in a full
 * fine-tune; with LoRA a layer's adapter unit, and -1 for the embedding and the head. */
static int train_index(const fsdp *f, int u) {
    if (!f->has_lora) return u;
    return u >= 1 && u <= f->layout.n_layers ? u - 1 : -1;
}

/* cpu_offload: trainable unit a's compute copy, once the host optimizer has updated it, in
 * context memory (uploaded once a step) or with offload_params on the host. */
static const void *offloaded_params(fsdp *f, int a, errbuf *err) {
    fsdp_unit *U = &f->units[a];
    if (host_optim_wait(f->optim, a, err)) return errprefix(err, "host optimizer"), NULL;
    if (f->offload_params) return U->host_param;
    if (U->uploaded_step != f->step) /* pinned: queued, and host_param stays until the step ends */
        k_copy_h2d(f->ctx, U->dev_param, U->host_param, U->shard * k_compute_size(f->ctx));
    U->uploaded_step = f->step;
    return U->dev_param;
}

/* The FP8 layers' tensorwise scales for the masters of this step (once a step, at its first
 * FP8 gather: a collective every rank reaches at the same plan entry): each projection's
 * amax over this rank's part, all-gathered over the shard group, the largest; fp8_scale of
 * it and its inverse, uploaded.  The host computes what the kernels' fp8_scale would. */
static int fp8_refresh_scales(fsdp *f, errbuf *err) {
    const llama_layout *lo = &f->layout;
    size_t n = (size_t)f->fp8_scale_count, G = (size_t)f->group;
    float *mine = f->fp8_amax + (size_t)f->group_rank * n;
    for (int l = 1, i = 0; l < lo->n_layers - 1; l++) {
        const fsdp_unit *U = &f->units[llama_layer_unit(l)];
        for (int k = 0; k < LLAMA_FP8_PROJECTIONS; k++, i++) {
            size_t a, b;
            tensor_in_shard(U, &lo->tensors[lo->units[llama_layer_unit(l)].first + k], &a, &b);
            k_fp8_amax_f32(f->ctx, mine + i, U->master + (a - U->shard_off), b > a ? b - a : 0);
        }
    }
    size_t S = LLAMA_FP8_SCALE_STRIDE;
    float *host = calloc((G + S) * n, sizeof *host), *scales = host ? host + G * n : NULL;
    if (!host) return errf(err, "fsdp: out of host memory for the FP8 scales");
    comm_set_unit(f->shard_comm, -1);
    int rc = k_check(f->ctx, err) ||
             (G > 1 && comm_all_gather(f->shard_comm, mine, f->fp8_amax, n, COMM_F32, err));
    if (rc == 0) {
        k_copy_d2h(f->ctx, host, f->fp8_amax, G * n * sizeof *host);
        for (size_t i = 0; i < n; i++) {
            float amax = 0.0f;
            for (size_t r = 0; r < G; r++) amax = host[r * n + i] > amax ? host[r * n + i] : amax;
            scales[S * i] = fp8_scale(amax, FP8_E4M3);
            scales[S * i + 4] = fp8_inverse_scale(scales[S * i]);
        }
        k_copy_h2d(f->ctx, f->fp8_scales, scales, S * n * sizeof *scales); /* pageable: consumed on return */
        rc = k_check(f->ctx, err);
    }
    free(host);
    if (rc) return errprefix(err, "the FP8 scales");
    f->fp8_scales_step = f->step;
    return 0;
}

/* Layer l's scales in fp8_scales (llama_layer_weights.code_scales). */
static const float *fp8_layer_scales(const fsdp *f, int l) {
    return f->fp8_scales + LLAMA_FP8_SCALE_STRIDE * (size_t)LLAMA_FP8_PROJECTIONS * (size_t)(l - 1);
}

/* Starts gathering FP8 layer unit u into dst as codes and its plain part (t[0], t[1]). */
static int gather_codes(fsdp *f, int u, char *dst, comm_ticket *t, errbuf *err) {
    const llama_layout *lo = &f->layout;
    const fsdp_unit *U = &f->units[u];
    size_t cs = k_compute_size(f->ctx), off = U->shard_off, end = off + U->shard;
    fp8_slot_layout s = fp8_layout(f);
    if (f->fp8_scales_step != f->step && fp8_refresh_scales(f, err)) return -1;
    const float *scales = fp8_layer_scales(f, u - 1);
    for (int k = 0; k < LLAMA_FP8_PROJECTIONS; k++) {
        size_t a, b;
        tensor_in_shard(U, &lo->tensors[lo->units[u].first + k], &a, &b);
        if (b > a)
            k_fp8_cast_f32(f->ctx, (uint8_t *)dst + a, U->master + (a - off), b - a, scales + LLAMA_FP8_SCALE_STRIDE * k,
                           FP8_E4M3);
    }
    size_t a = off > s.plain ? off : s.plain, b = end < s.plain + s.n_plain ? end : s.plain + s.n_plain;
    if (f->group == 1) { /* no collective: the plain part straight into its place */
        k_f32_to_compute(f->ctx, dst + s.plain * cs, U->master + s.plain, s.n_plain);
        return 0;
    }
    if (end > a) k_zero(f->ctx, dst + a, end - a); /* the codes' bytes of the plain part and padding */
    char *chunk = dst + s.staging + (size_t)f->group_rank * s.n_plain * cs;
    k_zero(f->ctx, chunk, s.n_plain * cs);
    if (b > a) k_f32_to_compute(f->ctx, chunk + (a - s.plain) * cs, U->master + (a - off), b - a);
    return k_check(f->ctx, err) ||
           comm_all_gather_start(f->shard_comm, dst + off, dst, U->shard, COMM_BYTE, &t[0], err) ||
           comm_all_gather_start(f->shard_comm, chunk, dst + s.staging, s.n_plain * cs, COMM_BYTE, &t[1], err);
}

/* After an FP8 layer's gather (several ranks): each rank's own plain values from its chunk
 * into their place. */
static void fp8_place_plain(fsdp *f, char *dst) {
    fp8_slot_layout s = fp8_layout(f);
    size_t cs = k_compute_size(f->ctx), shard = f->units[llama_layer_unit(0)].shard;
    for (size_t r = 0; r < (size_t)f->group; r++) {
        size_t a = r * shard > s.plain ? r * shard : s.plain;
        size_t b = (r + 1) * shard < s.plain + s.n_plain ? (r + 1) * shard : s.plain + s.n_plain;
        if (b > a) k_copy_h2d(f->ctx, dst + a * cs, dst + s.staging + (r * s.n_plain + a - s.plain) * cs, (b - a) * cs);
    }
}

/* Starts gathering trainable unit a into dst (compute dtype, in place: this rank's shard is
 * cast, or with cpu_offload copied, into its own place of dst).  With offload_params on one
 * rank the copy from the host runs on the parameters' lane beside the compute, its ticket
 * raising *lane (the slot's, which gather_wait waits for; NULL: on the compute stream). */
static int gather_trainable(fsdp *f, int a, char *dst, comm_ticket *t, uint64_t *lane, errbuf *err) {
    const fsdp_unit *U = &f->units[a];
    char *mine = f->group == 1 ? dst : dst + U->shard_off * k_compute_size(f->ctx);
    size_t bytes = U->shard * k_compute_size(f->ctx);
    *t = 0;
    if (f->cpu_offload) {
        const void *src = offloaded_params(f, a, err);
        if (!src) return -1;
        if (lane && f->offload_params && f->group == 1) { /* pinned host memory, no collective next */
            uint64_t ticket = k_copy_h2d_start(f->ctx, K_COPY_PARAMS, mine, src, bytes);
            *lane = ticket > *lane ? ticket : *lane;
        } else {
            k_copy_h2d(f->ctx, mine, src, bytes);
        }
    } else {
        k_f32_to_compute(f->ctx, mine, U->master, U->shard);
    }
    if (f->group == 1) return 0;
    /* No host synchronisation: the comm orders itself after the queued compute (NCCL by a
     * device event, the host-memory backends by their synchronous copies). */
    return k_check(f->ctx, err) ||
           comm_all_gather_start(f->shard_comm, mine, dst, U->shard, compute_comm_dtype(f->ctx), t, err);
}

/* offload_params: frozen unit u, whole, from the model image into slot's buffers (an NF4
 * layer's codes and absmax; its small parts are kept), on the parameters' copy lane: no
 * collective, since every node has the image. */
static void stream_frozen(fsdp *f, int u, int slot) {
    const unsigned char *src = model_image_unit(f->image, &f->layout, u);
    const model_image_nf4_layer *nl = &f->image_nl;
    fsdp_stream *st = &f->streamed[slot];
    if (is_nf4(f, u)) {
        k_copy_h2d_start(f->ctx, K_COPY_PARAMS, f->gathered_packed[slot], src + nl->packed, nl->packed_bytes);
        st->ticket = k_copy_h2d_start(f->ctx, K_COPY_PARAMS, f->gathered_absmax[slot], src + nl->absmax, nl->absmax_bytes);
    } else {
        st->ticket = k_copy_h2d_start(f->ctx, K_COPY_PARAMS, f->gathered[slot], src,
                                      f->frozen[u].numel * k_compute_size(f->ctx));
    }
    st->ahead = -1; /* stream_ahead marks its own */
}

/* Starts gathering the whole of model unit u into slot `slot`: its parameters (a frozen
 * unit's straight from its compute-dtype shard, an NF4 layer's codes and absmax as bytes;
 * nothing to do for one rank, which reads its shards in place) and, with LoRA, its layer's
 * adapters into the adapter slot. */
static int gather_start(fsdp *f, int u, int slot, int codes, errbuf *err) {
    comm_ticket *t = f->gather_ticket[slot];
    t[0] = t[1] = t[2] = 0;
    comm_set_unit(f->shard_comm, u);
    int rc = 0, a = train_index(f, u);
    const fsdp_frozen *F = f->frozen ? &f->frozen[u] : NULL;
    f->slot_codes[slot] = (unsigned char)codes;
    if (codes) {
        rc = gather_codes(f, u, f->gathered[slot], t, err);
        comm_set_unit(f->shard_comm, u);
    } else if (!f->has_lora && !f->reference && !f->compute_copies) {
        rc = gather_trainable(f, u, f->gathered[slot], &t[0], &f->streamed[slot].ticket, err);
    } else if (f->offload_params) {
        if (f->streamed[slot].ahead != u) stream_frozen(f, u, slot);
        f->streamed[slot].ahead = -1;
    } else if (f->group > 1 && is_nf4(f, u)) {
        rc = comm_all_gather_start(f->shard_comm, F->packed.data, f->gathered_packed[slot], F->packed.shard,
                                   COMM_BYTE, &t[0], err);
        if (rc == 0)
            rc = comm_all_gather_start(f->shard_comm, F->absmax.data, f->gathered_absmax[slot],
                                       F->absmax.shard, COMM_BYTE, &t[1], err);
    } else if (f->group > 1) {
        rc = comm_all_gather_start(f->shard_comm, F->param, f->gathered[slot], F->shard,
                                   compute_comm_dtype(f->ctx), &t[0], err);
    }
    if (rc == 0 && f->has_lora && a >= 0 && !f->compute_copies)
        rc = gather_trainable(f, a, f->gathered_adapter[slot], &t[2], &f->streamed[slot].ticket, err);
    f->param_gathers += t[0] || t[1] || t[2];
    return rc ? errprefix(err, "unit %d", u) : 0;
}

/* Waits for slot's all-gathers (of unit u); compute queued from here on reads the unit. */
static int gather_wait(fsdp *f, int u, int slot, errbuf *err) {
    if (f->streamed[slot].ticket) { /* this slot's copy, not the one streamed ahead into the other */
        k_copy_h2d_wait(f->ctx, K_COPY_PARAMS, f->streamed[slot].ticket);
        f->streamed[slot].ticket = 0;
    }
    for (int i = 0; i < 3; i++) {
        comm_ticket t = f->gather_ticket[slot][i];
        f->gather_ticket[slot][i] = 0;
        if (t && comm_wait(f->shard_comm, t, err)) return errprefix(err, "unit %d", u);
    }
    if (f->slot_codes[slot] && f->group > 1) fp8_place_plain(f, f->gathered[slot]);
    f->slot_codes[slot] = 0;
    return 0;
}

/* An NF4 layer, gathered or streamed into slot (or one rank's own), dequantized into
 * f->dequant in the compute dtype at the unit's usual offsets: its seven linears, then its
 * norms. */
static void dequantize_layer(fsdp *f, int u, int slot) {
    const fsdp_frozen *F = &f->frozen[u];
    const model_image_nf4_layer *nl = &f->nl;
    const llama_tensor_slot *t = &f->layout.tensors[f->layout.units[u].first];
    int in_slot = f->group > 1 || f->offload_params;
    const uint8_t *packed = in_slot ? f->gathered_packed[slot] : F->packed.data;
    const uint8_t *absmax = in_slot ? f->gathered_absmax[slot] : F->absmax.data;
    int dq = f->quant == MODEL_IMAGE_NF4_DQ;
    size_t cs = k_compute_size(f->ctx);
    char *dst = f->dequant;
    for (int k = 0; k < MODEL_IMAGE_LINEARS; k++)
        k_nf4_dequant(f->ctx, dst + t[k].offset * cs, packed + nl->t_packed[k],
                      absmax + nl->t_block[k] * (dq ? 1 : sizeof(float)),
                      dq ? F->nested + nl->t_nested[k] : NULL, F->offsets[k], nl->t_numel[k]);
    /* the norms (and biases, q/k norms) follow the linears in the unit, as in the image */
    k_f32_to_compute(f->ctx, dst + t[MODEL_IMAGE_LINEARS].offset * cs, F->norms, nl->n_plain);
}

/* Plan entry k's parameters once gathered: its slot, the dequantized NF4 layer, or when one
 * rank holds it whole a frozen unit's own shard (the base, or in DPO's reference forward the
 * reference) or a trained unit's compute copy. */
static void *unit_params(fsdp *f, int u, int slot) {
    if (is_nf4(f, u)) {
        dequantize_layer(f, u, slot);
        return f->dequant;
    }
    int frozen = f->has_lora || f->reference;
    if (f->compute_copies && !frozen) return f->units[u].copy;
    return frozen && f->group == 1 && !f->offload_params ? f->frozen[u].param : f->gathered[slot];
}

/* Model unit u's adapters (LoRA) once gathered into slot: the slot, or their compute copy. */
static void *adapter_params(fsdp *f, int u, int slot) {
    return f->compute_copies ? f->units[train_index(f, u)].copy : f->gathered_adapter[slot];
}

static void *gathered_params(fsdp *f, int k) {
    return unit_params(f, f->plan[k].unit, f->plan[k].slot);
}

void *fsdp_gather_unit(fsdp *f, int u, int slot, void **adapters, errbuf *err) {
    if (gather_start(f, u, slot, 0, err) || gather_wait(f, u, slot, err)) return NULL;
    *adapters = f->has_lora && train_index(f, u) >= 0 ? adapter_params(f, u, slot) : NULL;
    return unit_params(f, u, slot);
}

/* Starts plan entry k's all-gathers (none for a kept unit, which is in its slot already). */
static int plan_start(fsdp *f, int k, errbuf *err) {
    const fsdp_gather *g = &f->plan[k];
    f->next_gather = k + 1;
    return g->kept ? 0 : gather_start(f, g->unit, g->slot, fp8_gathered(f, g->unit), err);
}

/* Whether plan entry k is prefetched: started when the entry before it is used (never past
 * the forward's end in a pass without backward). */
static int prefetched(const fsdp *f, int k) {
    return k < f->n_plan && (k < f->n_forward_plan ? f->forward_prefetch : f->backward_prefetch && !f->forward_only);
}

/* Whether plan entry k's gather streams a frozen unit from the image (gather_start). */
static int plan_streams(const fsdp *f, int k) {
    const fsdp_gather *g = &f->plan[k];
    return f->offload_params && (f->has_lora || f->reference) && !g->kept && !fp8_gathered(f, g->unit);
}

/* offload_params, once plan entry k's parameters are queued for use: entry k + 2's frozen
 * unit streamed now, an entry before its gather starts, so the copy lane runs two layers
 * ahead of the compute.  With one, each layer's copy (0.45 GB at 70B, 8.3 ms on an H200) could
 * start only once the layer before the one computing was done, and had that one layer's
 * compute (8.6 ms) to hide behind (bench/NOTES.md, F29).  Only into a slot that no compute
 * queued from here on reads: never entry k + 1's (consecutive entries have different slots:
 * see the plan above), and entry k's only where entry k's compute does not read what the
 * stream writes: an NF4 layer is read by its dequantization, queued by now, and a slot's NF4
 * codes and its compute-dtype buffer are apart. */
static void stream_ahead(fsdp *f, int k) {
    int j = k + 2;
    if (!prefetched(f, j) || !plan_streams(f, j)) return;
    const fsdp_gather *g = &f->plan[j], *now = &f->plan[k];
    if (g->slot == now->slot && !is_nf4(f, now->unit) && !is_nf4(f, g->unit)) return;
    stream_frozen(f, g->unit, g->slot);
    f->streamed[g->slot].ahead = g->unit;
}

/* The parameters of plan entry k, gathered, for the compute queued next; starts entry k + 1
 * when it is prefetched (and streams entry k + 2's ahead). */
static void *gather_use(fsdp *f, int k, errbuf *err) {
    const fsdp_gather *g = &f->plan[k];
    if (f->next_gather <= k && plan_start(f, k, err)) return NULL;
    if (gather_wait(f, g->unit, g->slot, err)) return NULL;
    if (prefetched(f, k + 1) && plan_start(f, k + 1, err)) return NULL;
    void *params = gathered_params(f, k);
    stream_ahead(f, k);
    return params;
}

/* Finishes the reduction reading full_grad[slot], if one is in flight: this rank's part of
 * the summed gradient joins its grad shard. */
static int reduce_finish(fsdp *f, int slot, errbuf *err) {
    fsdp_reduce *r = &f->reducing[slot];
    if (!r->pending) return 0;
    r->pending = 0;
    if ((r->ticket && comm_wait(f->shard_comm, r->ticket, err)) ||
        (r->replica_ticket && comm_wait(f->replica, r->replica_ticket, err)))
        return errprefix(err, "unit %d", r->unit);
    const fsdp_unit *U = &f->units[r->unit];
    float *full = f->full_grad[slot];
    if (!r->into_grad)
        k_add_f32(f->ctx, U->grad, f->group > 1 ? full + U->shard_off : full, U->shard);
    return 0;
}

/* Starts summing model unit u's full gradient (its trainable unit's), in full_grad[slot],
 * over the ranks; finishes it at once unless backward overlap is on.  Sharded, the first
 * micro-batch's sum is scattered straight into the grad shards (nothing to zero or add);
 * later ones in place, then added.  A unit with nothing trainable has nothing to sum. */
static int reduce_start(fsdp *f, int u, int slot, errbuf *err) {
    int t = train_index(f, u);
    if (f->world == 1 || t < 0) return 0; /* one rank: already in the grad shard (grad_buffer) */
    const fsdp_unit *U = &f->units[t];
    float *full = f->full_grad[slot];
    fsdp_reduce *r = &f->reducing[slot];
    *r = (fsdp_reduce){.pending = 1, .unit = t, .into_grad = f->group > 1 && f->first_micro};
    int rc = k_check(f->ctx, err);
    comm_set_unit(f->shard_comm, u);
    if (rc == 0 && f->world > 1 && f->group == 1)
        rc = comm_all_reduce_start(f->shard_comm, full, U->padded, COMM_F32, COMM_SUM, &r->ticket, err);
    else if (rc == 0 && f->group > 1)
        rc = comm_reduce_scatter_start(f->shard_comm, full, r->into_grad ? U->grad : full + U->shard_off,
                                       U->shard, COMM_F32, COMM_SUM, &r->ticket, err);
    /* hybrid_shard: the shard summed over the replicas too, queued right behind (NCCL: on the
     * same stream, so it reads the reduce-scattered shard) and waited for with it. */
    if (rc == 0 && f->replica)
        rc = comm_all_reduce_start(f->replica, r->into_grad ? U->grad : full + U->shard_off, U->shard,
                                   COMM_F32, COMM_SUM, &r->replica_ticket, err);
    if (rc) {
        r->pending = 0;
        return errprefix(err, "unit %d", u);
    }
    return f->backward_prefetch ? 0 : reduce_finish(f, slot, err);
}

/* Where model unit u's backward accumulates (+=) its trainable gradient: full_grad[slot],
 * or with one rank, whose grad shard is the whole unit, the shard itself (zeroed at the
 * step's start: nothing to zero, reduce or add per micro-batch); NULL when nothing of u is
 * trained. */
static float *grad_buffer(fsdp *f, int u, int slot) {
    int t = train_index(f, u);
    if (t < 0) return NULL;
    return f->world == 1 ? f->units[t].grad : f->full_grad[slot];
}

/* Whether model unit u's backward writes its projections' gradients rather than adding them
 * to zeros (llama_layer_weights.grads_fresh: the seven weight-gradient GEMMs with beta 0), so
 * that only the unit's plain part is zeroed: a decoder layer of a full fine-tune.  Saved: the
 * zeroing of the projections' fp32 gradients, 4 bytes a parameter (26 GB a step at 7B), and
 * the GEMMs' reads of those zeros. */
static int writes_grads(const fsdp *f, int u) {
    return !f->has_lora && u >= 1 && u <= f->layout.n_layers;
}

/* Whether unit u's next backward writes its projections' gradients: with several ranks
 * every backward's (prepare_grad_slot zeroed the rest of its slot), with one the step's first
 * (fsdp_train_step zeroed the rest of the unit's gradient). */
static int grads_fresh(const fsdp *f, int u) {
    return writes_grads(f, u) && (f->world > 1 || f->units[u].grad_unwritten);
}

/* Before unit u's backward accumulates into full_grad[slot]: the slot's previous reduction
 * is finished and the slot zeroed (but the projections' part a fresh backward writes). */
static int prepare_grad_slot(fsdp *f, int u, int slot, errbuf *err) {
    int t = train_index(f, u);
    if (f->world == 1 || t < 0) return 0;
    if (reduce_finish(f, slot, err)) return -1;
    size_t from = writes_grads(f, u) ? layer_plain(f) : 0;
    k_zero(f->ctx, f->full_grad[slot] + from, (f->units[t].padded - from) * sizeof(float));
    return 0;
}

/* ---- a step ---- */

/* ---- preference objectives (fsdp_pref.h: the host side) ---- */

/* Every rank's n doubles (mine), gathered in rank order into all[world x n] (n <= PREF_STATS). */
static int gather_doubles(fsdp *f, const double *mine, int n, double *all, errbuf *err) {
    size_t bytes = (size_t)n * sizeof(double);
    if (f->world == 1) {
        memcpy(all, mine, bytes);
        return 0;
    }
    char *dev = f->pref.gathered;
    k_copy_h2d(f->ctx, dev + (size_t)f->rank * bytes, mine, bytes);
    comm_set_unit(f->comm, -1);
    if (k_sync(f->ctx, err) ||
        comm_all_gather(f->comm, dev + (size_t)f->rank * bytes, dev, bytes, COMM_BYTE, err))
        return -1;
    k_copy_d2h(f->ctx, all, dev, (size_t)f->world * bytes);
    return k_check(f->ctx, err);
}

/* Batch b checked, the buffers readied, the global pair count and ORPO's target count (a
 * collective), the step's sums zeroed. */
static int pref_begin_step(fsdp *f, const fsdp_batch *b, errbuf *err) {
    fsdp_pref *p = &f->pref;
    int rows = b->n_micro * b->micro_batch;
    double mine, *all = NULL;
    if (b->doc_start) return errf(err, "preference objective: packed rows are not built yet");
    if (fsdp_pref_check_rows(b->labels, rows, b->micro_batch, b->T, &mine, err) ||
        fsdp_pref_buffers(p, f->ctx, b->micro_batch, f->world, err))
        return -1;
    if (!(all = malloc((size_t)f->world * sizeof mine))) return errf(err, "preference objective: out of host memory");
    int rc = gather_doubles(f, &mine, 1, all, err);
    p->nll_count = 0;
    for (int r = 0; rc == 0 && r < f->world; r++) p->nll_count += all[r];
    free(all);
    p->pairs = (double)rows / 2 * f->world;
    memset(p->stats, 0, sizeof p->stats);
    return rc;
}

/* The loss sums of every span of the uploaded micro-batch under the head, into host_sums. */
static int span_sums(fsdp *f, const void *head_params, const void *embed, errbuf *err) {
    fsdp_pref *p = &f->pref;
    k_zero(f->ctx, p->sums, 2 * (size_t)p->rows * sizeof(float));
    llama_head_spans(f->ctx, &f->layout, head_params, NULL, embed, NULL, f->resid[f->layout.n_layers],
                     &f->head, &f->scratch, f->targets, f->B, f->T, p->spans, p->n_spans, p->sums, 0, NULL);
    k_copy_d2h(f->ctx, p->host_sums, p->sums, 2 * (size_t)p->rows * sizeof(float));
    return k_sync(f->ctx, err);
}

/* What decoder layer l's compute reads from plan entry k and accumulates into (grads: its
 * trainable gradient buffer, the base's or with LoRA the adapters'). */
static llama_layer_weights layer_weights(fsdp *f, int l, int k, const void *params, float *grads) {
    int fp8 = f->fp8 && llama_fp8_layer(l, f->layout.n_layers), codes = fp8_gathered(f, llama_layer_unit(l));
    if (!f->has_lora)
        return (llama_layer_weights){.params = params, .grads = grads, .layer = l, .fp8 = fp8 ? &f->fp8_linears : NULL,
                                     .codes = codes ? params : NULL, .code_scales = codes ? fp8_layer_scales(f, l) : NULL};
    return (llama_layer_weights){.params = params, .lora = &f->lora,
                                 .adapters = adapter_params(f, llama_layer_unit(l), f->plan[k].slot),
                                 .adapter_grads = grads, .layer = l};
}

/* The uploaded micro-batch's forward alone, no backward (DPO's reference; evaluation): the
 * forward's plan entries, prefetched as in training but never past the forward's end (no
 * gather is left in flight for a backward that does not come), no layer input offloaded.
 * With f->reference the frozen units with the adapters off (an adapter job's base, a full
 * fine-tune's copy of its start weights), else the trained model.  *head and *embed (tied
 * embeddings, else NULL): the head's parameters, gathered, for the caller's loss. */
static int forward_only(fsdp *f, const k_docs *docs, const void **head, const void **embed, errbuf *err) {
    const llama_layout *lo = &f->layout;
    kctx *c = f->ctx;
    int L = lo->n_layers, k = 0, rc = -1;
    const void *g;
    f->forward_only = 1;
    f->next_gather = 0;
    *embed = NULL;
    if (!(g = gather_use(f, k++, err))) goto out;
    llama_embed_forward(c, lo, g, f->tokens, f->resid[0], f->B * f->T);
    for (int l = 0; l < L; l++, k++) {
        if (!(g = gather_use(f, k, err))) goto out;
        llama_layer_weights w = f->reference ? (llama_layer_weights){.params = g, .layer = l} /* no adapters */
                                             : layer_weights(f, l, k, g, NULL);
        llama_layer_forward(c, lo, &w, f->inv_freq, docs, f->resid[l], f->resid[l + 1], &f->layer_acts[l],
                            &f->scratch, f->B, f->T);
        f->layer_forwards++;
    }
    if (is_tied(f) && !(*embed = gather_use(f, k++, err))) goto out;
    if ((*head = gather_use(f, k, err))) rc = 0;
out:
    f->forward_only = 0;
    return rc;
}

/* DPO's reference: the forward of the frozen units; its row sums into pref.ref. */
static int reference_forward(fsdp *f, errbuf *err) {
    const void *head, *embed;
    if (forward_only(f, NULL, &head, &embed, err) || span_sums(f, head, embed, err)) return -1;
    memcpy(f->pref.ref, f->pref.host_sums, (size_t)f->pref.rows * sizeof *f->pref.ref);
    return 0;
}

static int pref_reference(fsdp *f, errbuf *err) {
    f->reference = 1;
    int rc = reference_forward(f, err);
    f->reference = 0;
    return rc;
}

/* The policy's head: its forward over the spans, the weights on the host, its backward. */
static int pref_head(fsdp *f, const void *head_params, float *head_grads, const void *embed, float *embed_grads,
                     errbuf *err) {
    fsdp_pref *p = &f->pref;
    if (span_sums(f, head_params, embed, err) || fsdp_pref_weights(p, err)) return -1;
    llama_head_spans(f->ctx, &f->layout, head_params, head_grads, embed, embed_grads, f->resid[f->layout.n_layers],
                     &f->head, &f->scratch, f->targets, f->B, f->T, p->spans, p->n_spans, p->sums, 1, f->dresid);
    return 0;
}

/* After the micro-batches: every rank's sums gathered into the step's figures out. */
static int pref_end_step(fsdp *f, double *out, errbuf *err) {
    double *all = malloc((size_t)f->world * sizeof f->pref.stats);
    if (!all) return errf(err, "preference objective: out of host memory");
    int rc = gather_doubles(f, f->pref.stats, PREF_STATS, all, err);
    if (rc == 0) fsdp_pref_means(&f->pref, all, f->world, out);
    free(all);
    return rc;
}

/* Forward and backward of the head; returns the plan entry that comes next, or -1. */
static int head_pass(fsdp *f, int k, float dscale, errbuf *err) {
    const llama_layout *lo = &f->layout;
    int head = llama_head_unit(lo), B = f->B, T = f->T;
    void *embed = NULL;
    float *embed_grad = NULL;
    if (is_tied(f)) {
        if (!(embed = gather_use(f, k++, err)) || prepare_grad_slot(f, LLAMA_EMBED_UNIT, 2, err))
            return -1;
        embed_grad = grad_buffer(f, LLAMA_EMBED_UNIT, 2);
    }
    void *g = gather_use(f, k++, err);
    if (!g || prepare_grad_slot(f, head, 0, err)) return -1;
    if (f->pref.cfg.objective != JOB_OBJECTIVE_SFT) {
        if (pref_head(f, g, grad_buffer(f, head, 0), embed, embed_grad, err)) return -1;
        return reduce_start(f, head, 0, err) ? -1 : k;
    }
    llama_head_forward_backward(f->ctx, lo, g, grad_buffer(f, head, 0), embed, embed_grad,
                                f->resid[lo->n_layers], &f->head, &f->scratch, f->targets, B, T,
                                dscale, &f->scalars[0], NULL, f->dresid);
    return reduce_start(f, head, 0, err) ? -1 : k;
}

static int forward_backward(fsdp *f, const k_docs *docs, float dscale, errbuf *err) {
    const llama_layout *lo = &f->layout;
    kctx *c = f->ctx;
    int L = lo->n_layers, B = f->B, T = f->T, N = B * T, k = 0;
    void *g;

    f->next_gather = 0;
    if (!(g = gather_use(f, k++, err))) return -1;
    llama_embed_forward(c, lo, g, f->tokens, f->resid[0], N);
    for (int l = 0; l < L; l++) {
        if (!(g = gather_use(f, k, err))) return -1;
        llama_layer_weights w = layer_weights(f, l, k++, g, NULL);
        offload_input(f, l);
        llama_layer_forward(c, lo, &w, f->inv_freq, docs, f->resid[l], f->resid[l + 1],
                            &f->layer_acts[l], &f->scratch, B, T);
        f->layer_forwards++;
    }
    if ((k = head_pass(f, k, dscale, err)) < 0) return -1;

    int slot = 0; /* the head's gradient slot */
    for (int l = L - 1; l >= 0; l--) {
        int u = llama_layer_unit(l);
        slot ^= 1;
        if (!(g = gather_use(f, k, err))) return -1;
        llama_layer_weights w = layer_weights(f, l, k++, g, grad_buffer(f, u, slot));
        llama_keep kept = llama_backward_from(f->recompute, l, L);
        fetch_input(f, l);
        if (kept != LLAMA_KEEP_ALL) {
            llama_layer_recompute(c, lo, &w, f->inv_freq, docs, f->resid[l], kept, &f->layer_acts[l],
                                  &f->scratch, B, T);
            f->layer_forwards++;
        }
        if (prepare_grad_slot(f, u, slot, err)) return -1;
        w.grads_fresh = w.grads && grads_fresh(f, u);
        llama_layer_backward(c, lo, &w, f->inv_freq, docs, f->resid[l], &f->layer_acts[l],
                             &f->scratch, f->dresid, B, T);
        if (w.grads_fresh && f->world == 1) f->units[u].grad_unwritten = 0;
        if (reduce_start(f, u, slot, err)) return -1;
    }

    /* The embedding's backward reads no parameters: nothing to gather; frozen, nothing to do. */
    int embed_slot = is_tied(f) ? 2 : slot ^ 1;
    float *embed_grad = grad_buffer(f, LLAMA_EMBED_UNIT, embed_slot);
    if (!is_tied(f) && prepare_grad_slot(f, LLAMA_EMBED_UNIT, embed_slot, err)) return -1;
    if (embed_grad) llama_embed_backward(c, lo, embed_grad, f->tokens, f->dresid, N);
    if (reduce_start(f, LLAMA_EMBED_UNIT, embed_slot, err)) return -1;
    for (int s = 0; s < 3; s++)
        if (reduce_finish(f, s, err)) return -1;
    return 0;
}

/* Every rank's (a, b) pair, summed in rank order so every rank gets the same bits. */
typedef struct rank_stats {
    double loss_sum, sumsq;
    int64_t count;
    int64_t vote[FSDP_VOTES];
} rank_stats;
_Static_assert(FSDP_VOTES == 6, "model/memory_plan.c's plan_rank_stats counts FSDP_VOTES votes: change both");
_Static_assert(PREF_STATS == 9, "model/memory_plan.c's PLAN_PREF_STATS counts PREF_STATS figures: change both");

static int gather_stats(fsdp *f, const rank_stats *mine, rank_stats *all, errbuf *err) {
    if (f->world == 1) {
        all[0] = *mine;
        return 0;
    }
    /* Through the context's memory: NCCL reads and writes device buffers only. */
    size_t bytes = (size_t)f->world * sizeof *mine;
    if (!f->stats && !(f->stats = k_alloc(f->ctx, bytes, err))) return -1;
    char *dev = f->stats;
    k_copy_h2d(f->ctx, dev + (size_t)f->rank * sizeof *mine, mine, sizeof *mine);
    comm_set_unit(f->comm, -1); /* the step's statistics, of no unit */
    if (k_sync(f->ctx, err) ||
        comm_all_gather(f->comm, dev + (size_t)f->rank * sizeof *mine, dev, sizeof *mine, COMM_BYTE, err))
        return -1;
    k_copy_d2h(f->ctx, all, dev, bytes);
    return k_check(f->ctx, err);
}

static int64_t count_targets(const int32_t *labels, int rows, int T) {
    int64_t n = 0;
    for (int b = 0; b < rows; b++)
        for (int t = 1; t < T; t++) n += labels[(size_t)b * T + t] != K_IGNORE_INDEX;
    return n;
}

/* AdamW over elements [a, b) of unit U's shard (offsets in the unit). */
static void adamw_range(fsdp *f, const fsdp_unit *U, size_t a, size_t b, int decays, const fsdp_hparams *hp,
                        float grad_scale) {
    size_t at = a - U->shard_off;
    void *copy = U->copy ? (char *)U->copy + at * k_compute_size(f->ctx) : NULL;
    k_adamw(f->ctx, U->master + at, U->grad + at, U->m + at, U->v + at, b - a, (float)hp->lr, (float)hp->beta1,
            (float)hp->beta2, (float)hp->eps, decays ? (float)hp->weight_decay : 0.0f, f->step, grad_scale, copy);
}

/* AdamW on unit u's shard: norm weights skip weight decay, the padding past the last tensor
 * is left alone (its gradient is zero); one launch a run of adjacent tensors that decay alike
 * (an adapter layer's 14 tensors are one: a launch each was launch-bound). */
static void adamw_unit(fsdp *f, int u, const fsdp_hparams *hp, float grad_scale) {
    const fsdp_unit *U = &f->units[u];
    const llama_unit *lu = &f->train_units[u];
    size_t run_a = 0, run_b = 0; /* the run so far, [run_a, run_b): none when empty */
    int run_decays = 0;
    for (int i = lu->first; i < lu->first + lu->count; i++) {
        const llama_tensor_slot *s = &f->train_tensors[i];
        size_t a, b;
        tensor_in_shard(U, s, &a, &b);
        if (a >= b) continue;
        int decays = llama_tensor_decays(s);
        if (run_b > run_a && a == run_b && decays == run_decays) {
            run_b = b;
            continue;
        }
        if (run_b > run_a) adamw_range(f, U, run_a, run_b, run_decays, hp, grad_scale);
        run_a = a, run_b = b, run_decays = decays;
    }
    if (run_b > run_a) adamw_range(f, U, run_a, run_b, run_decays, hp, grad_scale);
}

/* cpu_offload: the step's gradients to the host, and AdamW started there (the next step's
 * gathers wait for their units: offloaded_params). */
static int start_host_step(fsdp *f, const fsdp_hparams *hp, float grad_scale, errbuf *err) {
    size_t total = 0;
    for (int u = 0; u < f->n_train; u++) total += f->units[u].shard;
    k_copy_d2h(f->ctx, f->host_grad, f->units[0].grad, total * sizeof(float));
    if (k_check(f->ctx, err)) return -1;
    host_optim_step s = {.lr = (float)hp->lr, .beta1 = (float)hp->beta1, .beta2 = (float)hp->beta2,
                         .eps = (float)hp->eps, .weight_decay = (float)hp->weight_decay,
                         .grad_scale = grad_scale, .step = f->step};
    return host_optim_start(f->optim, f->optim_tasks, f->n_optim_tasks, &s, err);
}

int fsdp_wait_optimizer(fsdp *f, errbuf *err) {
    return f->optim && host_optim_wait_all(f->optim, err) ? errprefix(err, "host optimizer") : 0;
}

/* Whether fault point p (nan_loss, nan_grad: RANK:STEP) hits this rank's step in progress. */
static int fault_now(const fsdp *f, fault_point p) {
    const fault *x = fault_get(p, f->rank);
    return x && x->n == f->step + 1;
}

/* Fault nan_grad: the first element of this rank's gradient shard of unit 0 becomes NaN,
 * after the reductions, as a bad kernel or an overflow would leave it; the loss stays finite. */
static void poison_gradient(fsdp *f) {
    static const float nan = NAN;
    k_copy_h2d(f->ctx, f->units[0].grad, &nan, sizeof nan);
}

/* Row b of micro-batch mb: its sample index, uploaded for the dropout masks. */
static void upload_samples(fsdp *f, const fsdp_batch *b, int mb) {
    int64_t host[256];
    for (int at = 0; at < b->micro_batch; at += 256) {
        int n = b->micro_batch - at < 256 ? b->micro_batch - at : 256;
        for (int r = 0; r < n; r++) {
            int64_t row = (int64_t)mb * b->micro_batch + at + r;
            host[r] = b->samples ? b->samples[row] : row;
        }
        k_copy_h2d(f->ctx, f->samples + at, host, (size_t)n * sizeof *host); /* pageable: consumed */
    }
}

/* Evaluation's pass over the uploaded micro-batch: the forward alone, then the head's loss
 * (one span, the whole micro-batch) into scalars[0]; no gradient touched. */
static int eval_forward(fsdp *f, const k_docs *docs, errbuf *err) {
    const void *head, *embed;
    if (forward_only(f, docs, &head, &embed, err)) return -1;
    const llama_span all = {.start = 0, .n = f->B * f->T, .slot = 0, .dscale = 0.0f};
    llama_head_spans(f->ctx, &f->layout, head, NULL, embed, NULL, f->resid[f->layout.n_layers], &f->head,
                     &f->scratch, f->targets, f->B, f->T, &all, 1, f->scalars, 0, NULL);
    return 0;
}

/* Every micro-batch's forward and backward, the loss sum accumulating in scalars[0] (zeroed
 * here) and the gradients, scaled by dscale, reduced into the grad shards; evaluating, the
 * forwards alone (eval_forward). */
static int run_micro_batches(fsdp *f, const fsdp_batch *b, float dscale, int evaluating, errbuf *err) {
    kctx *c = f->ctx;
    int T = b->T, rc = 0;
    k_zero(c, f->scalars, 2 * sizeof(float));
    size_t N = (size_t)b->micro_batch * T;
    int32_t *targets = malloc(N * sizeof *targets);
    const k_docs docs = {f->doc_start, f->doc_end};
    if (!targets) rc = errf(err, "fsdp: out of host memory");
    for (int mb = 0; mb < b->n_micro && rc == 0; mb++) {
        f->first_micro = mb == 0;
        k_shift_labels(b->labels + mb * N, targets, b->micro_batch, T);
        if (f->pref.cfg.objective != JOB_OBJECTIVE_SFT)
            fsdp_pref_targets(&f->pref, b->input_ids + mb * N, b->labels + mb * N, b->micro_batch, T, targets);
        k_copy_h2d(c, f->tokens, b->input_ids + mb * N, N * sizeof(int32_t));
        k_copy_h2d(c, f->targets, targets, N * sizeof(int32_t));
        if (b->doc_start) { /* pageable sources: consumed when the copies return */
            k_copy_h2d(c, f->doc_start, b->doc_start + mb * N, N * sizeof(int32_t));
            k_copy_h2d(c, f->doc_end, b->doc_end + mb * N, N * sizeof(int32_t));
        }
        if (f->has_lora) upload_samples(f, b, mb);
        if (rc == 0 && f->pref.cfg.objective == JOB_OBJECTIVE_DPO) rc = pref_reference(f, err);
        const k_docs *d = b->doc_start ? &docs : NULL;
        if (rc == 0) rc = evaluating ? eval_forward(f, d, err) : forward_backward(f, d, dscale, err);
    }
    free(targets);
    return rc;
}

/* Checks batch b (its document bounds too, when packed) and readies the activations its
 * micro-batches need. */
static int prepare_batch(fsdp *f, const fsdp_batch *b, errbuf *err) {
    int rows = b->n_micro * b->micro_batch;
    if (llama_check_batch(&f->layout.cfg, b->input_ids, b->labels, rows, b->T, err)) return -1;
    if (b->doc_start && llama_check_docs(b->doc_start, b->doc_end, rows, b->T, err)) return -1;
    return ensure_activations(f, b->micro_batch, b->T, err);
}

int fsdp_eval_loss(fsdp *f, const fsdp_batch *b, double *loss_sum, int64_t *count, errbuf *err) {
    if (f->pref.cfg.objective != JOB_OBJECTIVE_SFT)
        return errf(err, "eval: the held-out loss of a preference objective is not built yet");
    if (prepare_batch(f, b, err)) return -1;
    rank_stats mine = {.count = count_targets(b->labels, b->n_micro * b->micro_batch, b->T)};
    rank_stats *all = calloc((size_t)f->world, sizeof *all);
    float dropout = f->lora.dropout;
    f->lora.dropout = 0; /* evaluation: no dropout, as model.eval() */
    int rc = all ? run_micro_batches(f, b, 0.0f, 1, err) : errf(err, "fsdp: out of host memory");
    f->lora.dropout = dropout;
    float scalars[2];
    if (rc == 0) k_copy_d2h(f->ctx, scalars, f->scalars, sizeof scalars);
    if (rc == 0) rc = k_sync(f->ctx, err);
    if (rc == 0) {
        mine.loss_sum = scalars[0];
        rc = gather_stats(f, &mine, all, err);
    }
    *loss_sum = 0;
    *count = 0;
    for (int r = 0; rc == 0 && r < f->world; r++) {
        *loss_sum += all[r].loss_sum;
        *count += all[r].count;
    }
    free(all);
    return rc ? errprefix(err, "eval, rank %d", f->rank) : 0;
}

int fsdp_train_step(fsdp *f, const fsdp_batch *b, const fsdp_hparams *hp, fsdp_step_result *res,
                    errbuf *err) {
    kctx *c = f->ctx;
    if (prepare_batch(f, b, err)) return -1;
    rank_stats mine = {.count = count_targets(b->labels, b->n_micro * b->micro_batch, b->T)};
    rank_stats *all = calloc((size_t)f->world, sizeof *all);
    if (!all) return errf(err, "fsdp: out of host memory");
    memcpy(mine.vote, f->vote, sizeof mine.vote);
    int rc = gather_stats(f, &mine, all, err);
    int64_t count = 0, vote_max[FSDP_VOTES];
    memcpy(vote_max, all[0].vote, sizeof vote_max);
    for (int r = 0; r < f->world; r++) {
        count += all[r].count;
        for (int v = 0; v < FSDP_VOTES; v++)
            if (all[r].vote[v] > vote_max[v]) vote_max[v] = all[r].vote[v];
    }
    float dscale = count > 0 ? 1.0f / (float)count : 0.0f;

    if (f->group == 1) /* sharded, the first micro-batch's reduction overwrites them */
        for (int u = 0; u < f->n_train; u++) { /* one rank: a fresh backward writes the projections' */
            size_t from = f->world == 1 && writes_grads(f, u) ? layer_plain(f) : 0;
            f->units[u].grad_unwritten = from > 0;
            k_zero(c, f->units[u].grad + from, (f->units[u].shard - from) * sizeof(float));
        }
    int pref = f->pref.cfg.objective != JOB_OBJECTIVE_SFT;
    if (rc == 0 && pref) rc = pref_begin_step(f, b, err);
    if (rc == 0) rc = run_micro_batches(f, b, dscale, 0, err);
    if (rc == 0 && pref) rc = pref_end_step(f, res->pref, err);
    if (rc == 0 && pref) /* this rank's share of the loss, summed over the ranks below */
        k_copy_h2d(c, f->scalars, &(float){(float)f->pref.stats[PREF_LOSS]}, sizeof(float));
    if (rc == 0 && fault_now(f, FAULT_NAN_GRAD)) poison_gradient(f);
    for (int u = 0; u < f->n_train && rc == 0; u++) k_sumsq_f32(c, &f->scalars[1], f->units[u].grad, f->units[u].shard);
    float scalars[2];
    if (rc == 0) k_copy_d2h(c, scalars, f->scalars, sizeof scalars);
    if (rc == 0) rc = k_sync(c, err);
    if (rc == 0 && fault_now(f, FAULT_NAN_LOSS)) scalars[0] = NAN; /* fault nan_loss */
    if (rc == 0) {
        mine.loss_sum = scalars[0];
        mine.sumsq = scalars[1];
        rc = gather_stats(f, &mine, all, err);
    }
    if (rc != 0) {
        free(all);
        return errprefix(err, "step %d, rank %d", f->step + 1, f->rank);
    }

    double loss_sum = 0, sumsq = 0;
    for (int r = 0; r < f->world; r++) {
        if (!isfinite(all[r].loss_sum) || !isfinite(all[r].sumsq)) {
            int bad_loss = !isfinite(all[r].loss_sum);
            free(all);
            return errf(err, "step %d: non-finite %s on rank %d", f->step + 1,
                        bad_loss ? "loss" : "gradient norm", r);
        }
        loss_sum += all[r].loss_sum;
        sumsq += all[r].sumsq;
    }
    /* Every replica holds the whole gradient, sharded over its group: the norm is one
     * replica's sum, this rank's (the same bits in each: all-reduced).  full_shard: every
     * rank; no_shard: this rank alone; hybrid_shard: this node's ranks. */
    sumsq = 0;
    for (int r = f->rank / f->group * f->group; r < (f->rank / f->group + 1) * f->group; r++)
        sumsq += all[r].sumsq;
    free(all);

    double norm = sqrt(sumsq);
    /* torch's clip_grad_norm_: scaled by max_norm / (norm + 1e-6) wherever that is below 1. */
    double clip_coef = hp->clip_norm / (norm + 1e-6);
    float grad_scale = hp->clip_norm > 0 && clip_coef < 1.0 ? (float)clip_coef : 1.0f;
    f->step++;
    if (f->cpu_offload) {
        if (start_host_step(f, hp, grad_scale, err)) return errprefix(err, "step %d, rank %d", f->step, f->rank);
    } else {
        for (int u = 0; u < f->n_train; u++) adamw_unit(f, u, hp, grad_scale);
    }
    if (k_sync(c, err)) return errprefix(err, "step %d, rank %d", f->step, f->rank);
    res->loss = pref ? res->pref[PREF_LOSS] : count > 0 ? loss_sum / (double)count : 0.0;
    res->tokens = count;
    res->grad_norm = norm;
    memcpy(res->vote_max, vote_max, sizeof vote_max);
    return 0;
}

/* ---- checkpoints ---- */

int fsdp_ckpt_layout(const fsdp *f, ckpt_layout *lo, errbuf *err) {
    if (ckpt_layout_alloc(lo, f->group, f->n_train, f->n_train_tensors, err)) return -1;
    for (int u = 0; u < f->n_train; u++)
        lo->units[u] = (ckpt_unit){.numel = f->units[u].numel, .padded = f->units[u].padded,
                                   .shard = f->units[u].shard, .first = f->train_units[u].first,
                                   .count = f->train_units[u].count};
    for (int i = 0; i < f->n_train_tensors; i++) {
        const llama_tensor_slot *s = &f->train_tensors[i];
        ckpt_tensor *t = &lo->tensors[i];
        snprintf(t->name, sizeof t->name, "%s", s->name);
        t->offset = s->offset;
        t->numel = s->numel;
        t->ndim = s->ndim;
        t->shape[0] = s->shape[0];
        t->shape[1] = s->ndim == 2 ? s->shape[1] : 0;
        t->is_norm = s->is_norm;
    }
    return 0;
}

/* The checkpoint's units and tensors are this model's (the shard sizes may differ). */
static int check_same_tensors(const fsdp *f, const ckpt_layout *saved, const char *dir, errbuf *err) {
    if (saved->n_units != f->n_train || saved->n_tensors != f->n_train_tensors)
        return errf(err, "%s: %d units and %d tensors; this %s has %d and %d", dir, saved->n_units,
                    saved->n_tensors, f->has_lora ? "job's adapters" : "model", f->n_train,
                    f->n_train_tensors);
    for (int i = 0; i < f->n_train_tensors; i++) {
        const ckpt_tensor *t = &saved->tensors[i];
        const llama_tensor_slot *s = &f->train_tensors[i];
        if (strcmp(t->name, s->name) || t->offset != s->offset || t->numel != s->numel)
            return errf(err, "%s: tensor %d is %s (offset %llu, %llu elements); this model has %s "
                             "(offset %zu, %zu elements)", dir, i, t->name,
                        (unsigned long long)t->offset, (unsigned long long)t->numel, s->name,
                        s->offset, s->numel);
    }
    return 0;
}

int fsdp_load_checkpoint(fsdp *f, const ckpt_manifest *m, const char *dir, fsdp_adopt_fn adopt, void *arg,
                         errbuf *err) {
    if (check_same_tensors(f, &m->layout, dir, err) || fsdp_wait_optimizer(f, err)) return -1;
    if (m->optimizer_step > INT32_MAX) return errf(err, "%s: optimizer step out of range", dir);
    size_t max_shard = 0;
    for (int u = 0; u < f->n_train; u++)
        if (f->units[u].shard > max_shard) max_shard = f->units[u].shard;
    float *host = malloc(max_shard * sizeof *host);
    ckpt_reader r;
    if (!host) return errf(err, "fsdp: out of host memory");
    if (ckpt_reader_open(&r, dir, m, err)) {
        free(host);
        return -1;
    }
    if (adopt && adopt(arg, &r, err)) {
        ckpt_reader_close(&r);
        free(host);
        return -1;
    }
    int rc = 0;
    for (int u = 0; u < f->n_train && rc == 0; u++) {
        fsdp_unit *U = &f->units[u];
        float *dst[CKPT_KINDS] = {U->master, U->m, U->v};
        for (int kind = CKPT_MASTER; kind <= CKPT_KINDS && rc == 0; kind++) {
            rc = ckpt_read_range(&r, kind, u, U->shard_off, U->shard, host, err);
            if (rc == 0) k_copy_h2d(f->ctx, dst[kind - 1], host, U->shard * sizeof *host);
            if (rc == 0) rc = k_sync(f->ctx, err); /* host is reused for the next section */
        }
    }
    ckpt_reader_close(&r);
    free(host);
    if (rc == 0) f->step = (int)m->optimizer_step;
    return rc ? rc : masters_changed(f, err);
}

/* n values of the compute dtype (host) as fp32 (host): the CPU backend's are fp32, CUDA's
 * bf16. */
static void compute_to_host_f32(const fsdp *f, float *dst, const void *src, size_t n) {
    if (k_compute_size(f->ctx) == sizeof(float)) {
        memcpy(dst, src, n * sizeof *dst);
        return;
    }
    bf16_to_f32_n(dst, src, n);
}

int fsdp_gather_params(fsdp *f, fsdp_tensor_fn fn, void *arg, errbuf *err) {
    size_t max_padded = 0;
    for (int u = 0; u < f->n_train; u++)
        if (f->units[u].padded > max_padded) max_padded = f->units[u].padded;
    float *host = malloc(max_padded * sizeof *host);
    void *copy = malloc(max_padded * k_compute_size(f->ctx)); /* the gathered unit, as is */
    if (!host || !copy) {
        free(host);
        free(copy);
        return errf(err, "fsdp: out of host memory");
    }
    void *slot = f->has_lora ? f->gathered_adapter[0] : f->gathered[0];
    int rc = 0;
    for (int u = 0; u < f->n_train && rc == 0; u++) {
        comm_ticket t = 0;
        comm_set_unit(f->shard_comm, u);
        if (!f->compute_copies) rc = gather_trainable(f, u, slot, &t, NULL, err);
        if (rc == 0 && t) rc = comm_wait(f->shard_comm, t, err);
        if (rc) break;
        k_copy_d2h(f->ctx, copy, f->compute_copies ? f->units[u].copy : slot, f->units[u].padded * k_compute_size(f->ctx));
        rc = k_sync(f->ctx, err);
        if (rc == 0) compute_to_host_f32(f, host, copy, f->units[u].padded);
        const llama_unit *lu = &f->train_units[u];
        for (int i = lu->first; i < lu->first + lu->count && rc == 0; i++)
            rc = fn(&f->train_tensors[i], host + f->train_tensors[i].offset, arg, err);
    }
    free(host);
    free(copy);
    return rc;
}
