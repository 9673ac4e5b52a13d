/* memory_plan: worker/fsdp.c's context memory, computed.  See memory_plan.h.  Each function
 * below names the fsdp.c code it mirrors; a change there must come here too (the test in
 * tests/unit/test_memory_plan.c fails until it does). */
#include "model/memory_plan.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "base/bytes.h"
#include "model/llama.h"

/* fsdp.c's IMAGE_CHUNK: fsdp_load_image stages an adapter job's base through this many fp32
 * elements of context memory. */
#define LOAD_STAGING_ELEMENTS ((size_t)16 << 20)

/* fsdp.c's rank_stats (loss sum, squared norm, target count, FSDP_VOTES votes): what
 * gather_stats gathers, one a rank, when there are several. */
typedef struct plan_rank_stats {
    double loss_sum, sumsq;
    int64_t count;
    int64_t vote[6];
} plan_rank_stats;

/* fsdp_pref.h's PREF_STATS: the figures of a preference step, doubles, one set a rank. */
#define PLAN_PREF_STATS 9

/* What every category's arithmetic reads. */
typedef struct plan_in {
    const memory_plan_options *o;
    const llama_layout *lo;
    const lora_layout *lora; /* NULL: a full fine-tune */
    model_image_quant quant; /* PLAIN unless adapters sit on an NF4 base */
    int group;               /* the shard group: world (full_shard, shard_grad_op), 1 (no_shard), a
                                node's ranks (hybrid_shard) */
    size_t cs;
} plan_in;

/* shard_of: a flat parameter of numel elements, padded to the shard group. */
static size_t padded_of(const plan_in *in, size_t numel) { return round_up(numel, (size_t)in->group); }

/* carve_frozen and ensure_activations: buffers carved at 256-byte boundaries. */
static size_t carved(size_t bytes) { return round_up(bytes, 256); }

static int is_nf4(const plan_in *in, int u) {
    return in->quant != MODEL_IMAGE_PLAIN && u >= 1 && u <= in->lo->n_layers;
}

/* bytes_of: a byte flat whose shards are multiples of align bytes; its padded size. */
static size_t bytes_padded(const plan_in *in, size_t bytes, size_t align) {
    return round_up(bytes, (size_t)in->group * align);
}

/* alloc_frozen (lay_out_frozen): the frozen units' shards (offload_params: an NF4 layer's
 * nested absmax and norms only), an NF4 base's dequantized layer and, sharded or streamed,
 * its two slots of codes and absmax.  *max_padded: the largest plain frozen unit, padded. */
static void plan_frozen(const plan_in *in, memory_plan *p, size_t *max_padded) {
    const llama_layout *lo = in->lo;
    int dq = in->quant == MODEL_IMAGE_NF4_DQ;
    model_image_nf4_layer nl = {0};
    if (in->quant != MODEL_IMAGE_PLAIN) model_image_nf4_layer_of(lo, MODEL_IMAGE_F32, in->quant, &nl);
    size_t packed = bytes_padded(in, nl.packed_bytes, 32), absmax = bytes_padded(in, nl.absmax_bytes, dq ? 64 : 4 * 64);
    int kept = !in->o->offload_params;
    *max_padded = 0;
    for (int u = 0; u < lo->n_units; u++) {
        size_t padded = padded_of(in, lo->units[u].numel), shard = padded / (size_t)in->group;
        if (!is_nf4(in, u)) {
            if (padded > *max_padded) *max_padded = padded;
            p->frozen += kept ? carved(shard * in->cs) : 0;
            continue;
        }
        p->frozen += (kept ? carved(packed / (size_t)in->group) + carved(absmax / (size_t)in->group) : 0) +
                     (dq ? carved(nl.n_nested * sizeof(float)) : 0) + carved(nl.n_plain * sizeof(float));
    }
    if (in->quant == MODEL_IMAGE_PLAIN) return;
    p->gather_slots += padded_of(in, lo->units[llama_layer_unit(0)].numel) * in->cs; /* dequant */
    if (in->group > 1 || in->o->offload_params) p->gather_slots += 2 * (packed + absmax);
}

/* alloc_trainable: master, m, v and grad of every trainable unit's shard, fp32, and with
 * compute_copies their copies; with cpu_offload (alloc_offloaded) the grads and, unless
 * offload_params, the compute copies, the rest pinned on the host.  *max_padded: the
 * largest trainable unit, padded. */
static void plan_trainable(const plan_in *in, memory_plan *p, size_t *max_padded) {
    int n = in->lora ? in->lora->n_units : in->lo->n_units;
    const llama_unit *units = in->lora ? in->lora->units : in->lo->units;
    size_t elements = 0; /* of every shard */
    *max_padded = 0;
    for (int u = 0; u < n; u++) {
        size_t padded = padded_of(in, units[u].numel);
        elements += padded / (size_t)in->group;
        if (padded > *max_padded) *max_padded = padded;
    }
    p->trainable_elems = elements;
    if (!in->o->cpu_offload) {
        p->trainable = 4 * elements * sizeof(float) + (in->o->compute_copies ? elements * in->cs : 0);
        return;
    }
    p->trainable = elements * sizeof(float) + (in->o->offload_params ? 0 : elements * in->cs);
    p->host_offload = elements * (4 * sizeof(float) + in->cs);
}

/* alloc_slots: gathered[0..2] (shard_grad_op: one slot of the largest unit for each of
 * the embedding, every layer and the head, kept from forward to backward), gathered_adapter
 * [0..1] (neither for trained units with compute copies) and full_grad[0..2]. */
static void plan_slots(const plan_in *in, memory_plan *p, size_t base_padded, size_t train_padded) {
    const llama_layout *lo = in->lo;
    int has_lora = in->lora != NULL, tied = lo->cfg.tie_word_embeddings;
    int kept = in->o->sharding == JOB_SHARD_GRAD_OP;
    size_t embed_padded = padded_of(in, lo->units[LLAMA_EMBED_UNIT].numel);
    int base_slots = (!has_lora && !in->o->compute_copies) || in->group > 1 || in->o->offload_params;
    if (kept) p->gather_slots += (size_t)(lo->n_layers + 2 - 3) * base_padded * in->cs;
    for (int slot = 0; slot < 3; slot++) {
        size_t n = slot < 2 || kept ? base_padded : tied ? embed_padded : 0;
        if (base_slots) p->gather_slots += n * in->cs;
        if (has_lora && slot < 2 && !in->o->compute_copies) p->gather_slots += train_padded * in->cs;
        size_t g = slot < 2 ? train_padded : tied && !has_lora ? embed_padded : 0;
        if (in->o->world > 1) p->grad_slots += g * sizeof(float);
    }
}

/* ensure_activations: one micro-batch's, in one allocation: L + 1 layer inputs (the head's
 * last) and dresid, of which offload_layers inputs live on the host, the device keeping
 * two for them and the two after them (worker/fsdp.c, "offloaded layer inputs"). */
static size_t plan_activations(const plan_in *in) {
    const llama_layout *lo = in->lo;
    int B = in->o->micro_batch, T = in->o->seq_len, L = lo->n_layers;
    size_t N = (size_t)B * T, C = (size_t)lo->cfg.hidden_size, cs = in->cs;
    llama_head_acts head;
    llama_scratch scratch;
    size_t resid_bytes = carved(N * C * cs);
    size_t acts_bytes = carved(llama_layers_acts_carve(NULL, NULL, in->o->recompute, lo, in->lora, cs, B, T, in->o->mlp_chunk));
    size_t head_bytes = carved(llama_head_acts_carve(&head, NULL, lo, cs, B, T));
    size_t scratch_bytes = carved(llama_scratch_carve(&scratch, NULL, lo, in->lora, cs, B, T, in->o->mlp_chunk));
    llama_fp8 fp8;
    size_t fp8_bytes = in->o->fp8 ? carved(llama_fp8_carve(&fp8, NULL, lo, cs, B, T, in->o->mlp_chunk)) : 0;
    size_t ids_bytes = carved(N * sizeof(int32_t)), samples_bytes = carved((size_t)B * sizeof(int64_t));
    return (size_t)(L + 2 - in->o->offload_layers) * resid_bytes + acts_bytes + head_bytes + scratch_bytes +
           fp8_bytes + 4 * ids_bytes + samples_bytes;
}

static int check_options(const memory_plan_options *o, errbuf *err) {
    if (!o->model) return errf(err, "memory plan: no model config");
    if (o->sharding != JOB_SHARD_FULL && o->sharding != JOB_SHARD_NONE &&
        o->sharding != JOB_SHARD_GRAD_OP && o->sharding != JOB_SHARD_HYBRID)
        return errf(err, "memory plan: sharding %d is not one fsdp builds", (int)o->sharding);
    if (o->sharding == JOB_SHARD_HYBRID && (o->group < 1 || o->world % o->group))
        return errf(err, "memory plan: hybrid_shard's group of %d ranks does not divide the world "
                         "of %d", o->group, o->world);
    if (o->sharding == JOB_SHARD_GRAD_OP && (o->lora || o->cpu_offload))
        return errf(err, "memory plan: shard_grad_op with adapters or cpu_offload is not built");
    if (o->world < 1 || o->rank < 0 || o->rank >= o->world)
        return errf(err, "memory plan: rank %d of world %d", o->rank, o->world);
    if (o->micro_batch < 1 || o->seq_len < 1)
        return errf(err, "memory plan: micro-batch %d x %d tokens", o->micro_batch, o->seq_len);
    if (o->compute_size != 2 && o->compute_size != 4)
        return errf(err, "memory plan: a compute dtype of %zu bytes", o->compute_size);
    if (llama_check_long_settings(o->model->num_hidden_layers, o->recompute, o->offload_layers, o->mlp_chunk,
                                  o->lora ? o->lora->dropout : 0, err))
        return errprefix(err, "memory plan");
    return 0;
}

/* Every category of in's plan; the total is the most held at once: the base loading
 * (frozen and trainable shards, slots and small buffers held, the staging buffer) or a step
 * (everything but the staging buffer, the activations and statistics added). */
static void plan_all(const plan_in *in, memory_plan *p) {
    const memory_plan_options *o = in->o;
    size_t base_padded = 0, train_padded = 0;
    int reference = !in->lora && o->objective == JOB_OBJECTIVE_DPO; /* the frozen start weights */
    memset(p, 0, sizeof *p);
    if (in->lora || reference) plan_frozen(in, p, &base_padded);
    plan_trainable(in, p, &train_padded);
    if (!in->lora) base_padded = train_padded;
    plan_slots(in, p, base_padded, train_padded);
    /* from the first step on: gather_stats' statistics, fsdp_pref_buffers' span sums and
     * gathered figures */
    size_t stats = o->world > 1 ? (size_t)o->world * sizeof(plan_rank_stats) : 0;
    if (o->objective != JOB_OBJECTIVE_SFT)
        stats += 2 * (size_t)o->micro_batch * sizeof(float) +
                 (o->world > 1 ? (size_t)o->world * PLAN_PREF_STATS * sizeof(double) : 0);
    /* alloc_shards' scalars: the step's two sums; FP8 gathers: 16 bytes on, the scales (a
     * stride each), each rank's amaxes */
    size_t n = o->fp8 && o->fp8_all_gather ? LLAMA_FP8_PROJECTIONS * (size_t)(o->model->num_hidden_layers - 2) : 0;
    size_t scalars = n ? 4 + (LLAMA_FP8_SCALE_STRIDE + (size_t)in->group) * n : 2;
    p->small = scalars * sizeof(float) + (size_t)(o->model->head_dim / 2) * sizeof(float) + stats;
    p->activations = plan_activations(in);
    p->host_activations = (size_t)o->offload_layers *
                          carved((size_t)o->micro_batch * o->seq_len * (size_t)o->model->hidden_size * in->cs);
    p->load_staging = in->lora || reference ? LOAD_STAGING_ELEMENTS * sizeof(float) : 0;
    size_t held = p->trainable + p->frozen + p->gather_slots + p->grad_slots + p->small - stats;
    size_t loading = held + p->load_staging, stepping = held + p->activations + stats;
    p->total = loading > stepping ? loading : stepping;
}

/* fsdp_init's shard group: 1 (no_shard), a node's ranks (hybrid_shard), else the world. */
static int group_of(const memory_plan_options *o) {
    return o->sharding == JOB_SHARD_NONE ? 1 : o->sharding == JOB_SHARD_HYBRID ? o->group : o->world;
}

int memory_plan_compute(const memory_plan_options *o, memory_plan *p, errbuf *err) {
    memset(p, 0, sizeof *p);
    if (check_options(o, err)) return -1;
    llama_layout lo;
    lora_layout ll;
    memset(&ll, 0, sizeof ll);
    if (llama_layout_init(&lo, o->model, err)) return errprefix(err, "memory plan");
    if (o->lora && lora_layout_init(&ll, o->model, o->lora, err)) {
        llama_layout_free(&lo);
        return errprefix(err, "memory plan");
    }
    plan_in in = {.o = o, .lo = &lo, .lora = o->lora ? &ll : NULL,
                  .quant = o->lora ? o->quant : MODEL_IMAGE_PLAIN,
                  .group = group_of(o), .cs = o->compute_size};
    plan_all(&in, p);
    lora_layout_free(&ll);
    llama_layout_free(&lo);
    return 0;
}

static double gib(size_t bytes) { return (double)bytes / (double)(1ull << 30); }

/* Appends to out[n] (at *at), truncating at the end. */
static void append(char *out, size_t n, size_t *at, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void append(char *out, size_t n, size_t *at, const char *fmt, ...) {
    if (*at >= n) return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(out + *at, n - *at, fmt, ap);
    va_end(ap);
    *at = k < 0 ? n : *at + (size_t)k;
}

void memory_plan_format(const memory_plan *p, char *out, size_t n) {
    size_t at = 0;
    if (n) out[0] = '\0';
    append(out, n, &at, "%.1f GiB (%zu bytes): trainable shards %.1f GiB, frozen shards %.1f GiB, "
                        "gather slots %.1f GiB, gradient slots %.1f GiB, activations %.1f GiB, "
                        "small buffers %.1f GiB", gib(p->total), p->total, gib(p->trainable),
           gib(p->frozen), gib(p->gather_slots), gib(p->grad_slots), gib(p->activations), gib(p->small));
    if (p->load_staging) append(out, n, &at, ", loading the base %.1f GiB", gib(p->load_staging));
}

/* Whether o fits in limit; *total: its plan's (0 when it has none). */
static int fits(const memory_plan_options *o, size_t limit, size_t *total) {
    memory_plan p;
    errbuf ignored;
    *total = memory_plan_compute(o, &p, &ignored) == 0 ? p.total : 0;
    return *total && *total <= limit;
}

/* Whether fsdp builds compute copies for o (fsdp_init's refusals): what is trained whole on
 * each rank, no shard_grad_op, cpu_offload or FP8 gathers. */
static int copies_built(const memory_plan_options *o) {
    return group_of(o) == 1 && o->sharding != JOB_SHARD_GRAD_OP && !o->cpu_offload && !(o->fp8 && o->fp8_all_gather);
}

/* fsdp.activation_checkpointing but auto, for L layers. */
static llama_recompute recompute_of(job_act_ckpt a, int L) {
    switch (a) {
    case JOB_ACT_CKPT_FULL: return (llama_recompute){L, LLAMA_KEEP_INPUT};
    case JOB_ACT_CKPT_SELECTIVE: return (llama_recompute){L, LLAMA_KEEP_ATTENTION};
    default: return (llama_recompute){0, LLAMA_KEEP_ALL};
    }
}

void memory_plan_job_options(const job_config *j, const llama_config *cfg, int world, int rank,
                             model_image_quant quant, size_t compute_size, size_t budget,
                             memory_plan_options *out) {
    int adapters = j->train.type != JOB_TRAIN_FULL;
    const lora_config *lora = &j->lora.config; /* job_resolve's */
    *out = (memory_plan_options){
        .model = cfg, .sharding = j->fsdp.sharding, .world = world, .rank = rank,
        .group = world < j->runtime.workers_per_node ? world : j->runtime.workers_per_node,
        .lora = adapters ? lora : NULL, .quant = adapters ? quant : MODEL_IMAGE_PLAIN,
        .recompute = recompute_of(j->fsdp.activation_checkpointing, cfg->num_hidden_layers),
        .micro_batch = j->train.micro_batch * job_rows_per_sample(j), .seq_len = j->data.seq_len, .compute_size = compute_size,
        .cpu_offload = j->fsdp.cpu_offload, .offload_params = j->fsdp.offload_params,
        .objective = j->train.objective, .mlp_chunk = j->fsdp.mlp_chunk,
        .fp8 = j->train.precision == JOB_PRECISION_FP8,
        .fp8_all_gather = j->train.precision == JOB_PRECISION_FP8 && j->train.fp8_all_gather};
    if (j->fsdp.activation_checkpointing == JOB_ACT_CKPT_AUTO)
        out->recompute = memory_plan_auto_recompute(out, budget);
    if (j->fsdp.offload_activations) out->offload_layers = memory_plan_offload_layers(out, budget);
    if (copies_built(out)) {
        memory_plan_options with = *out;
        size_t total;
        with.compute_copies = 1;
        out->compute_copies = fits(&with, budget, &total);
    }
}

int memory_plan_offload_layers(const memory_plan_options *o, size_t budget) {
    int most = o->model->num_hidden_layers - 1;
    memory_plan_options alt = *o;
    size_t total;
    for (alt.offload_layers = 0; alt.offload_layers < most; alt.offload_layers++)
        if (fits(&alt, budget, &total)) break;
    return most > 0 ? alt.offload_layers : 0;
}

double memory_plan_recompute_flops(const memory_plan_options *o, llama_recompute r) {
    const llama_config *c = o->model;
    int L = c->num_hidden_layers;
    double N = (double)o->micro_batch * o->seq_len, C = c->hidden_size, I = c->intermediate_size;
    double Q = (double)c->num_attention_heads * c->head_dim, KV = (double)c->num_key_value_heads * c->head_dim;
    /* what rebuilding each part takes: q, k and v; the attention itself; o_proj; gate and up */
    double qkv = 2 * N * (C * Q + 2 * C * KV), o_proj = 2 * N * Q * C, mlp = 2 * N * 2 * C * I;
    double core = 2.0 * o->micro_batch * c->num_attention_heads * (double)o->seq_len * o->seq_len * c->head_dim;
    double flops = 0;
    for (int l = 0; l < L; l++) {
        llama_acts_part kept = llama_kept_parts(llama_backward_from(r, l, L));
        flops += (kept & LLAMA_ACTS_ATTENTION ? 0 : qkv) + (kept & LLAMA_ACTS_CONTEXT ? 0 : core) +
                 (kept & LLAMA_ACTS_RESIDUAL ? 0 : o_proj) + (kept & LLAMA_ACTS_MLP ? 0 : mlp);
    }
    return flops;
}

llama_recompute memory_plan_auto_recompute(const memory_plan_options *o, size_t budget) {
    int L = o->model->num_hidden_layers;
    llama_recompute best = {L, LLAMA_KEEP_INPUT};
    double best_flops = -1;
    size_t best_total = 0, total;
    memory_plan_options alt = *o;
    for (int layers = 0; layers <= L; layers++) {
        for (int keep = LLAMA_KEEP_INPUT; keep <= (layers ? LLAMA_KEEP_ATTENTION : LLAMA_KEEP_INPUT); keep++) {
            alt.recompute = (llama_recompute){layers, (llama_keep)keep};
            if (!fits(&alt, budget, &total)) continue;
            double flops = memory_plan_recompute_flops(&alt, alt.recompute);
            if (best_flops < 0 || flops < best_flops || (flops == best_flops && total < best_total))
                best = alt.recompute, best_flops = flops, best_total = total;
        }
    }
    return best;
}

int memory_plan_largest_micro_batch(const memory_plan_options *o, int rows, int most, size_t limit,
                                    size_t *total) {
    memory_plan_options alt = *o;
    int per = o->objective == JOB_OBJECTIVE_SFT ? 1 : 2; /* rows a sample */
    for (int m = most; m >= 1; m--) {
        alt.micro_batch = m * per;
        if (rows % m == 0 && fits(&alt, limit, total)) return m;
    }
    return 0;
}

/* full_shard: the fewest workers above o's world that fit (the shards shrink as the world
 * grows, the activations do not); 0: none up to 65536. */
static int fitting_world(memory_plan_options o, size_t limit, size_t *total) {
    if (o.sharding != JOB_SHARD_FULL) return 0;
    int lo = o.world, hi = o.world; /* lo does not fit; hi does, once found */
    o.rank = 0;
    do {
        lo = hi;
        hi = hi > 32768 ? 65536 : 2 * hi;
        o.world = hi;
    } while (!fits(&o, limit, total) && hi < 65536);
    if (!fits(&o, limit, total)) return 0;
    while (hi - lo > 1) {
        o.world = lo + (hi - lo) / 2;
        if (fits(&o, limit, total)) hi = o.world;
        else lo = o.world;
    }
    o.world = hi;
    fits(&o, limit, total);
    return hi;
}

/* "fsdp.activation_checkpointing=full (1.2 GiB); ..." for every single change of o that fits
 * in limit, into out[n]. */
static void suggest(const job_config *j, const memory_plan_options *o, const lora_config *lora,
                    size_t limit, char *out, size_t n) {
    size_t at = 0, total;
    out[0] = '\0';
    memory_plan_options alt = *o;
    alt.recompute = recompute_of(JOB_ACT_CKPT_FULL, o->model->num_hidden_layers);
    if ((o->recompute.layers < alt.recompute.layers || o->recompute.keep != LLAMA_KEEP_INPUT) &&
        fits(&alt, limit, &total))
        append(out, n, &at, "%sfsdp.activation_checkpointing=full (%.1f GiB)", at ? "; " : "", gib(total));
    int m = memory_plan_largest_micro_batch(o, j->train.global_batch / o->world, j->train.micro_batch - 1,
                                            limit, &total);
    if (m) append(out, n, &at, "%strain.micro_batch=%d (%.1f GiB)", at ? "; " : "", m, gib(total));
    int w = fitting_world(*o, limit, &total);
    if (w) append(out, n, &at, "%s%d workers (%.1f GiB)", at ? "; " : "", w, gib(total));
    static const struct {
        job_train_type type;
        const char *name;
        model_image_quant quant;
    } types[] = {{JOB_TRAIN_LORA, "lora", MODEL_IMAGE_PLAIN}, {JOB_TRAIN_QLORA, "qlora", MODEL_IMAGE_NF4_DQ}};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        if (types[t].type <= j->train.type) continue; /* only lighter than the job's */
        alt = *o;
        alt.lora = lora;
        alt.quant = types[t].quant;
        if (fits(&alt, limit, &total))
            append(out, n, &at, "%strain.type=%s (%.1f GiB)", at ? "; " : "", types[t].name, gib(total));
    }
    /* offload: the optimizer state, the frozen base (adapters), or both */
    static const struct {
        int cpu_offload, offload_params;
        const char *name;
    } offloads[] = {{1, 0, "fsdp.cpu_offload=true"},
                    {0, 1, "fsdp.offload_params=true"},
                    {1, 1, "fsdp.cpu_offload=true with fsdp.offload_params=true"}};
    for (size_t k = 0; k < sizeof offloads / sizeof offloads[0]; k++) {
        alt = *o;
        alt.cpu_offload |= offloads[k].cpu_offload;
        alt.offload_params |= offloads[k].offload_params;
        if ((alt.offload_params && !alt.lora && !alt.cpu_offload) ||
            (alt.cpu_offload == o->cpu_offload && alt.offload_params == o->offload_params))
            continue; /* what fsdp refuses, or the job's own setting */
        if (fits(&alt, limit, &total))
            append(out, n, &at, "%s%s (%.1f GiB)", at ? "; " : "", offloads[k].name, gib(total));
    }
}

int memory_plan_check_job(const job_config *j, const llama_config *cfg, int world, int rank,
                          model_image_quant quant, size_t compute_size, errbuf *err) {
    if (j->runtime.gpu_memory_limit <= 0) return 0;
    return memory_plan_check_limit(j, cfg, world, rank, quant, compute_size,
                                   (size_t)j->runtime.gpu_memory_limit, "runtime.gpu_memory_limit", err);
}

int memory_plan_check_limit(const job_config *j, const llama_config *cfg, int world, int rank,
                            model_image_quant quant, size_t compute_size, size_t limit,
                            const char *what, errbuf *err) {
    memory_plan_options o;
    memory_plan_job_options(j, cfg, world, rank, quant, compute_size, limit, &o);
    return memory_plan_check_options(j, &o, limit, what, err);
}

int memory_plan_check_options(const job_config *j, const memory_plan_options *o, size_t limit, const char *what,
                              errbuf *err) {
    memory_plan p;
    if (memory_plan_compute(o, &p, err)) return errprefix(err, "%s", what);
    if (p.total <= limit) return 0;
    char need[400], alternatives[500];
    memory_plan_format(&p, need, sizeof need);
    suggest(j, o, &j->lora.config, limit, alternatives, sizeof alternatives);
    return errf(err, "%s: each worker needs %s; the limit is %.1f GiB (%zu "
                     "bytes). %s%s", what, need, gib(limit), limit,
                alternatives[0] ? "Each of these alone would fit: " : "No single change of "
                "fsdp.activation_checkpointing, train.micro_batch, the number of workers, "
                "train.type or offload fits it", alternatives);
}
