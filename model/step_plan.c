/* step_plan: memory, host RAM, checkpoint and step time of a job, predicted.  See
 * step_plan.h.  The step's ops follow model/llama.c (forward, backward, the head) and
 * worker/fsdp.c (gathers, reductions, AdamW, offload). */
#include "model/step_plan.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "base/bytes.h"
#include "proto/lora_layout.h"
#include "proto/model_layout.h"

static const plan_gpu gpus[] = {
    /* name       GiB    TFLOP/s  HBM GB/s  link GB/s  PCIe GB/s */
    {"h200", 139.8, 989, 4800, 400, 55},
    {"h100", 79.6, 989, 3350, 400, 55},
    {"a100-80", 79.3, 312, 2039, 230, 25},
    {"a100-40", 39.4, 312, 1555, 230, 25},
    {"l40s", 44.4, 362, 864, 20, 25},
    {"4090", 23.6, 165, 1008, 20, 25},
    {"3090", 23.6, 71, 936, 20, 25},
};
#define N_GPUS (sizeof gpus / sizeof gpus[0])

const plan_gpu *plan_gpu_find(const char *name) {
    for (size_t i = 0; i < N_GPUS; i++)
        if (!strcmp(gpus[i].name, name)) return &gpus[i];
    return NULL;
}

const char *plan_gpu_names(void) { return "h200, h100, a100-80, a100-40, l40s, 4090, 3090"; }

/* ---- rates: the table's, scaled to the GPU ---- */

typedef struct rates {
    const plan_rates *t;
    double compute, memory, copy; /* the table's time x these = this GPU's */
} rates;

/* Distance between two shapes in log space. */
static double shape_distance(const int *a, const int *b, int n) {
    double d = 0;
    for (int i = 0; i < n; i++) {
        double x = log((double)a[i] / (double)b[i]);
        d += x * x;
    }
    return d;
}

/* Seconds of the GEMM (N, I, O) of kind k (0 forward, 1 input gradient, 2 weight gradient):
 * its row, or the nearest row scaled by the FLOPs. */
static double gemm_s(const rates *r, int N, int I, int O, int k) {
    int want[3] = {N, I, O}, best = 0;
    double best_d = INFINITY;
    for (int i = 0; i < r->t->n_gemm; i++) {
        const plan_gemm_rate *g = &r->t->gemm[i];
        int have[3] = {g->N, g->I, g->O};
        double d = shape_distance(want, have, 3);
        if (d < best_d) best_d = d, best = i;
    }
    const plan_gemm_rate *g = &r->t->gemm[best];
    double ms = k == 0 ? g->fwd_ms : k == 1 ? g->dx_ms : g->dw_ms;
    double scale = (double)N * I * O / ((double)g->N * g->I * g->O);
    return ms * 1e-3 * scale * r->compute;
}

/* The share of causal attention's work a sliding window (0: none) leaves: the (query, key)
 * pairs of the band over those of the triangle. */
static double window_share(int T, int window) {
    if (window <= 0 || window >= T) return 1.0;
    return ((double)window * T - (double)window * (window - 1) / 2) / ((double)T * (T + 1) / 2);
}

/* Seconds of causal attention over B rows of T tokens (a sliding window as its share of the
 * pairs): forward (bwd 0) or backward. */
static double attention_s(const rates *r, int B, int T, int window, int Hq, int Hkv, int hd, int bwd) {
    int want[5] = {B, T, Hq, Hkv, hd}, best = 0;
    double best_d = INFINITY;
    for (int i = 0; i < r->t->n_attention; i++) {
        const plan_attention_rate *a = &r->t->attention[i];
        int have[5] = {a->B, a->T, a->Hq, a->Hkv, a->hd};
        double d = shape_distance(want, have, 5);
        if (d < best_d) best_d = d, best = i;
    }
    const plan_attention_rate *a = &r->t->attention[best];
    double flops = (double)B * Hq * (double)T * T * hd, have = (double)a->B * a->Hq * (double)a->T * a->T * a->hd;
    return (bwd ? a->bwd_ms : a->fwd_ms) * 1e-3 * flops / have * window_share(T, window) * r->compute;
}

/* Seconds to move bytes at gbps (a table rate), scaled by the GPU's memory bandwidth. */
static double bytes_s(const rates *r, double bytes, double gbps) { return bytes / (gbps * 1e9) * r->memory; }

/* ---- a micro-batch's compute ---- */

typedef struct model_shape {
    const llama_config *c;
    int B, T, N, C, I, q, kv, V;
    double cs; /* compute dtype bytes */
    const lora_config *lora; /* NULL: a full fine-tune */
    int nf4;
} model_shape;

typedef struct tally {
    double gemm, attention, memory;
    long launches;
} tally;

static void gemm(tally *t, const rates *r, int N, int I, int O, int k) {
    t->gemm += gemm_s(r, N, I, O, k);
    t->launches++;
}

/* An elementwise op moving `bytes`. */
static void moved(tally *t, const rates *r, double bytes, double gbps) {
    t->memory += bytes_s(r, bytes, gbps);
    t->launches++;
}

/* The seven linears of a layer: (in, out). */
static void linear_shapes(const model_shape *s, int in[7], int out[7]) {
    int i_[7] = {s->C, s->C, s->C, s->q, s->C, s->C, s->I};
    int o_[7] = {s->q, s->kv, s->kv, s->C, s->I, s->I, s->C};
    memcpy(in, i_, sizeof i_);
    memcpy(out, o_, sizeof o_);
}

/* One decoder layer's forward (llama_layer_forward) of the parts in `part`; recompute: as
 * llama_layer_recompute runs it (no down_proj, no residual add after it; the attention
 * without LLAMA_ACTS_RESIDUAL: no o_proj, no residual add after it, as with h kept; without
 * LLAMA_ACTS_CONTEXT no attention itself, as with its output kept). */
static void layer_forward(tally *t, const rates *r, const model_shape *s, llama_acts_part part,
                          int recompute) {
    int in[7], out[7];
    linear_shapes(s, in, out);
    double N = s->N, cs = s->cs, ew = r->t->elementwise_gbps;
    if (s->nf4) { /* the layer dequantized into one buffer first (fsdp) */
        double n = 0;
        for (int k = 0; k < 7; k++) n += (double)in[k] * out[k];
        moved(t, r, n * cs + n / 2 + n / 64, r->t->dequant_gbps);
        t->launches += 8;
    }
    for (int k = 0; k < 7; k++) {
        if (!(part & (k < 4 ? LLAMA_ACTS_ATTENTION : LLAMA_ACTS_MLP))) continue;
        /* only the adapter's inner activation */
        int down = (k == 6 && recompute) || (k == 3 && !(part & LLAMA_ACTS_RESIDUAL));
        if (!down) gemm(t, r, s->N, in[k], out[k], 0);
        if (s->lora && (s->lora->targets >> k & 1u)) {
            llama_lora_group g = llama_lora_group_of(s->lora, k);
            int rk = s->lora->rank;
            if (s->lora->dropout > 0) moved(t, r, 2 * N * in[k] * cs, ew);
            if (g.column == 0) { /* a fused group's A at once (llama_lora_group_of) */
                gemm(t, r, s->N, in[k], g.n * rk, 0);
                moved(t, r, 2 * N * g.n * rk * cs, ew); /* scale */
                if (g.n > 1) moved(t, r, 2.0 * g.n * rk * in[k] * cs, ew); /* the A's gathered */
            }
            if (!down) gemm(t, r, s->N, rk, out[k], 0); /* written: the base's GEMM adds onto it */
        }
    }
    if (part & LLAMA_ACTS_ATTENTION) {
        if (part & LLAMA_ACTS_CONTEXT) {
            t->attention += attention_s(r, s->B, s->T, s->c->sliding_window, s->c->num_attention_heads,
                                        s->c->num_key_value_heads, s->c->head_dim, 0);
            t->launches++;
        }
        moved(t, r, 2 * N * s->C * cs, ew);           /* RMSNorm */
        moved(t, r, 2 * N * (s->q + s->kv) * cs, ew); /* RoPE on q and k */
        if (part & LLAMA_ACTS_RESIDUAL) moved(t, r, 3 * N * s->C * cs, ew); /* the residual add */
        if (s->c->attention_bias) moved(t, r, 2 * N * (s->q + 2 * s->kv) * cs, ew); /* q/k/v biases */
        if (s->c->qk_norm) moved(t, r, 2 * N * (s->q + s->kv) * cs, ew);          /* q/k norms */
    }
    if (part & LLAMA_ACTS_MLP) {
        moved(t, r, 2 * N * s->C * cs, ew); /* RMSNorm */
        moved(t, r, 3 * N * s->I * cs, ew); /* SwiGLU */
        if (!recompute) moved(t, r, 3 * N * s->C * cs, ew); /* the residual add */
    }
}

/* What a layer that keeps k recomputes: its forward but for what it kept. */
static void layer_recompute(tally *t, const rates *r, const model_shape *s, llama_keep k) {
    if (k != LLAMA_KEEP_ALL) layer_forward(t, r, s, LLAMA_ACTS_ALL & ~llama_kept_parts(k), 1);
}

/* One decoder layer's backward (llama_layer_backward): input gradients always, weight
 * gradients for a full fine-tune, the adapters' both with LoRA. */
static void layer_backward(tally *t, const rates *r, const model_shape *s) {
    int in[7], out[7];
    linear_shapes(s, in, out);
    double N = s->N, cs = s->cs, ew = r->t->elementwise_gbps;
    for (int k = 0; k < 7; k++) {
        gemm(t, r, s->N, in[k], out[k], 1);
        if (!s->lora) gemm(t, r, s->N, in[k], out[k], 2);
        if (s->lora && (s->lora->targets >> k & 1u)) {
            llama_lora_group g = llama_lora_group_of(s->lora, k);
            int rk = s->lora->rank;
            gemm(t, r, s->N, rk, out[k], 1); /* B: d(lora_t) and dB */
            gemm(t, r, s->N, rk, out[k], 2);
            if (g.column == 0) { /* A: dx and dA, a fused group's at once */
                moved(t, r, 2 * N * g.n * rk * cs, ew);
                gemm(t, r, s->N, in[k], g.n * rk, 1);
                gemm(t, r, s->N, in[k], g.n * rk, 2);
                if (g.n > 1) moved(t, r, g.n * rk * in[k] * (2 * cs + 12.0), ew); /* A gathered, dA added */
            }
            if (s->lora->dropout > 0) moved(t, r, 3 * N * in[k] * cs, ew);
        }
    }
    t->attention += attention_s(r, s->B, s->T, s->c->sliding_window, s->c->num_attention_heads,
                                s->c->num_key_value_heads, s->c->head_dim, 1);
    t->launches++;
    moved(t, r, 2 * 4 * N * s->C * cs, ew);       /* two RMSNorm backwards */
    moved(t, r, 2 * N * (s->q + s->kv) * cs, ew); /* RoPE's inverse */
    moved(t, r, 5 * N * s->I * cs, ew);           /* SwiGLU's backward */
    if (s->c->attention_bias) moved(t, r, N * (s->q + 2 * s->kv) * cs, ew); /* biases' sums */
    if (s->c->qk_norm) moved(t, r, 4 * N * (s->q + s->kv) * cs, ew);      /* q/k norms' backward */
    moved(t, r, 2 * 3 * N * s->C * cs, ew);       /* gradient accumulations */
}

/* The head (llama_head_forward_backward: 2048 rows at a time) and the embedding. */
static void head_and_embedding(tally *t, const rates *r, const model_shape *s) {
    double cs = s->cs;
    for (int at = 0; at < s->N; at += 2048) {
        int rows = s->N - at < 2048 ? s->N - at : 2048;
        gemm(t, r, rows, s->C, s->V, 0);
        moved(t, r, 2.0 * rows * s->V * cs, r->t->cross_entropy_gbps);
        gemm(t, r, rows, s->C, s->V, 1);
        if (!s->lora) gemm(t, r, rows, s->C, s->V, 2);
    }
    moved(t, r, 2 * 4.0 * s->N * s->C * cs, r->t->elementwise_gbps); /* final norm, both ways */
    moved(t, r, 2.0 * s->N * s->C * cs, r->t->elementwise_gbps);     /* embedding */
    if (!s->lora) moved(t, r, s->N * s->C * (cs + 8.0), r->t->elementwise_gbps);
}

/* The head's forward alone (llama_head_spans without the backward: the final norm, the logits
 * 2048 rows at a time and their losses): a preference objective's span sums, and DPO's
 * reference. */
static void head_forward(tally *t, const rates *r, const model_shape *s) {
    for (int at = 0; at < s->N; at += 2048) {
        int rows = s->N - at < 2048 ? s->N - at : 2048;
        gemm(t, r, rows, s->C, s->V, 0);
        moved(t, r, (double)rows * s->V * s->cs, r->t->cross_entropy_gbps);
    }
    moved(t, r, 2.0 * s->N * s->C * s->cs, r->t->elementwise_gbps); /* final norm */
}

/* DPO's reference (fsdp's pref_reference): the micro-batch's forward through the frozen units
 * (the start weights; with adapters the base, the adapters off), no backward. */
static void reference_forward(tally *t, const rates *r, const model_shape *s) {
    model_shape base = *s;
    base.lora = NULL;
    for (int l = 0; l < s->c->num_hidden_layers; l++) layer_forward(t, r, &base, LLAMA_ACTS_ALL, 0);
    head_forward(t, r, s);
    moved(t, r, 2.0 * s->N * s->C * s->cs, r->t->elementwise_gbps); /* embedding */
}

/* ---- the plan ---- */

static size_t image_bytes(const llama_config *cfg, const job_config *j, model_image_quant q, errbuf *err) {
    llama_layout lo;
    if (llama_layout_init(&lo, cfg, err)) return 0;
    model_image_dtype dt = j->model.dtype == JOB_DTYPE_BF16 ? MODEL_IMAGE_BF16 : MODEL_IMAGE_F32;
    size_t n = model_image_bytes_q(&lo, dt, q);
    llama_layout_free(&lo);
    return n;
}

/* Units' elements: the model's, a layer's, and (for communication) the trained ones. */
typedef struct unit_sizes {
    double embed, layer, head, trained_layer, trained_total;
    double layer_linears;   /* the seven projections' values of a layer */
    double layer_nf4_bytes; /* an NF4 layer's codes and absmax */
} unit_sizes;

static void unit_sizes_of(const model_shape *s, unit_sizes *u) {
    int in[7], out[7];
    linear_shapes(s, in, out);
    double lin = 0, lora = 0;
    for (int k = 0; k < 7; k++) {
        lin += (double)in[k] * out[k];
        if (s->lora && (s->lora->targets >> k & 1u)) lora += (double)s->lora->rank * (in[k] + out[k]);
    }
    u->embed = (double)s->V * s->C;
    u->layer = (double)llama_config_layer_params(s->c); /* with its norms, biases, q/k norms */
    u->layer_linears = lin;
    u->head = (s->c->tie_word_embeddings ? 0.0 : (double)s->V * s->C) + s->C;
    u->layer_nf4_bytes = lin / 2 + lin / 64;
    u->trained_layer = s->lora ? lora : u->layer;
    u->trained_total = s->lora ? lora * s->c->num_hidden_layers
                               : u->embed + u->layer * s->c->num_hidden_layers + u->head;
}

/* Seconds of a ring all-gather or reduce-scatter of `bytes` (the whole buffer) over `ranks`
 * GPUs at link GB/s: (ranks - 1) / ranks of it crosses each link. */
static double ring_s(double bytes, int ranks, double link) {
    return ranks > 1 ? bytes * (ranks - 1) / ranks / (link * 1e9) : 0;
}

/* A node's GPUs talk over NVLink (or PCIe); a ring across nodes goes at a GPU's share of the
 * network. */
static double link_of(const plan_machine *m, int ranks) {
    double net = m->net_gbps / m->gpus_per_node;
    return ranks > m->gpus_per_node ? fmin(m->gpu->link_gbps, net) : m->gpu->link_gbps;
}

static double tally_s(const tally *t, const rates *r) {
    return t->gemm + t->attention + t->memory + t->launches * r->t->launch_us * 1e-6;
}

static void step_time(const job_config *j, const model_shape *s, llama_recompute recompute,
                      const plan_machine *m, const rates *r, step_plan *p) {
    int L = s->c->num_hidden_layers, world = m->nodes * m->gpus_per_node;
    int n_micro = j->train.global_batch / (world * j->train.micro_batch); /* samples: pairs are 2 rows (s->B) */
    int pref = j->train.objective != JOB_OBJECTIVE_SFT, dpo = j->train.objective == JOB_OBJECTIVE_DPO;
    tally layer_f = {0}, layer_b = {0}, head = {0}, rec = {0}, ref = {0}; /* rec: every layer's recomputation */
    layer_forward(&layer_f, r, s, LLAMA_ACTS_ALL, 0);
    layer_backward(&layer_b, r, s);
    head_and_embedding(&head, r, s);
    if (pref) head_forward(&head, r, s); /* the span sums' forward before the one with the backward */
    if (dpo) reference_forward(&ref, r, s);
    for (int l = 0; l < L; l++) {
        llama_keep k = llama_backward_from(recompute, l, L);
        /* fsdp.mlp_chunk: the backward recomputes every layer's MLP, by chunk, the last one's too */
        layer_recompute(&rec, r, s, j->fsdp.mlp_chunk && k == LLAMA_KEEP_ALL ? LLAMA_KEEP_ATTENTION : k);
    }
    double f = tally_s(&layer_f, r), b = tally_s(&layer_b, r), h = tally_s(&head, r);
    p->gemm_s = n_micro * (L * (layer_f.gemm + layer_b.gemm) + rec.gemm + head.gemm + ref.gemm);
    p->attention_s = n_micro * (L * (layer_f.attention + layer_b.attention) + rec.attention + ref.attention);
    double micro_compute = L * (f + b) + tally_s(&rec, r) + h + tally_s(&ref, r);
    p->memory_s = n_micro * micro_compute - p->gemm_s - p->attention_s; /* and the launches */

    /* communication, a layer at a time, each hidden behind the neighbouring layer's compute
     * but for what exceeds it: the layer's all-gather in forward and (but with shard_grad_op)
     * again in backward over the shard group, its gradients' reduce-scatter there (no_shard:
     * an all-reduce over every rank), and hybrid_shard's all-reduce of the shard across nodes */
    unit_sizes u;
    unit_sizes_of(s, &u);
    job_sharding sh = j->fsdp.sharding;
    int group = sh == JOB_SHARD_NONE ? 1 : sh == JOB_SHARD_HYBRID && world > m->gpus_per_node ? m->gpus_per_node : world;
    double gather_bytes = s->lora ? (s->nf4 ? u.layer_nf4_bytes : u.layer * s->cs) + u.trained_layer * s->cs
                                  : u.layer * s->cs;
    if (j->fsdp.offload_params) gather_bytes = s->lora ? u.trained_layer * s->cs : gather_bytes;
    /* train.fp8_all_gather: layers 1 .. L-2 gathered as codes (a byte a projection value, the
     * rest in the compute dtype), the first and the last as before: the mean a layer */
    if (!s->lora && j->train.precision == JOB_PRECISION_FP8 && j->train.fp8_all_gather && L >= 3)
        gather_bytes = (2 * gather_bytes + (L - 2) * (u.layer_linears + (u.layer - u.layer_linears) * s->cs)) / L;
    double reduce_bytes = 4.0 * u.trained_layer;
    double ag = ring_s(gather_bytes, group, link_of(m, group));
    double rs = group > 1 ? ring_s(reduce_bytes, group, link_of(m, group))
                          : 2 * ring_s(reduce_bytes, world, link_of(m, world));
    double replica = group > 1 && group < world ? 2 * ring_s(reduce_bytes / group, world / group,
                                                             fmin(m->gpu->link_gbps, m->net_gbps / m->gpus_per_node))
                                                : 0;
    int regather = sh != JOB_SHARD_GRAD_OP;
    double fwd_unit = f, bwd_unit = tally_s(&rec, r) / L + b; /* a layer's compute in each pass */
    p->comm_s = n_micro * L * ((1 + regather + dpo) * ag + rs + replica);
    p->comm_exposed_s = n_micro * L * (fmax(0, ag - fwd_unit) + fmax(0, regather * ag + rs + replica - bwd_unit));
    /* DPO's reference gathers each layer once more, a unit at a time: nothing hides them */
    p->reference_s = n_micro * (tally_s(&ref, r) + dpo * L * ag);
    p->comm_exposed_s += n_micro * dpo * L * ag;

    /* offload_params: the frozen base streamed from the host twice a micro-batch (forward,
     * backward) on its own copy lane, two layers ahead of use; offload_activations: each
     * offloaded layer input to the host beside its layer's forward and back beside the next
     * layer's backward, on another lane.  The lanes run at once: in the forward they copy in
     * opposite directions, in the backward both from the host, so an offloaded layer's two
     * copies share the host-to-device bandwidth there. */
    double per_use = 0, d2h = 0, h2d = 0;
    int off = p->offload_layers;
    if (j->fsdp.offload_params && s->lora)
        per_use = (s->nf4 ? u.layer_nf4_bytes : u.layer * s->cs) / (r->t->registered_h2d_gbps * 1e9) * r->copy;
    if (off) {
        double input = (double)p->mem.host_activations / off;
        d2h = input / (r->t->d2h_gbps * 1e9) * r->copy, h2d = input / (r->t->h2d_gbps * 1e9) * r->copy;
    }
    p->offload_exposed_s = n_micro * (L * fmax(0, per_use - fwd_unit) + off * fmax(0, d2h - fwd_unit) +
                                      off * fmax(0, per_use + h2d - bwd_unit) + (L - off) * fmax(0, per_use - bwd_unit) +
                                      L * dpo * per_use);
    p->reference_s += n_micro * L * dpo * per_use;
    /* the optimizer: AdamW on the device over this rank's shards, or with cpu_offload the
     * gradients to the host, the host's AdamW (beside the next forward) and the uploads */
    double shard = p->mem.trainable_elems;
    if (p->compute_copies) { /* AdamW writes the copies in its pass: no casts at the gathers */
        p->optimizer_s = bytes_s(r, 30.0 * shard, r->t->adamw_gbps);
    } else if (!j->fsdp.cpu_offload) {
        p->optimizer_s = bytes_s(r, 28.0 * shard, r->t->adamw_gbps) +
                         bytes_s(r, 6.0 * shard * 2 * n_micro, r->t->elementwise_gbps); /* casts */
    } else {
        double copy = 4.0 * shard / (r->t->d2h_gbps * 1e9) * r->copy + s->cs * shard / (r->t->h2d_gbps * 1e9) * r->copy;
        double host = shard / (r->t->host_adamw_gelems * 1e9 / m->gpus_per_node);
        double forward = L * f + h;
        p->optimizer_s = copy;
        p->offload_exposed_s += fmax(0, host - forward);
    }
    p->step_s = n_micro * micro_compute + p->comm_exposed_s + p->offload_exposed_s + p->optimizer_s;
    p->tokens_per_s = (double)j->train.global_batch * job_rows_per_sample(j) * j->data.seq_len / p->step_s;
}

/* The per-GPU memory by what it holds. */
static void by_kind(const job_config *j, step_plan *p, size_t cs) {
    const memory_plan *m = &p->mem;
    size_t e = m->trainable_elems;
    p->grads = 4 * e + m->grad_slots;
    p->optimizer = j->fsdp.cpu_offload ? 0 : 12 * e; /* master, m, v */
    p->params = m->frozen + (p->compute_copies || (j->fsdp.cpu_offload && !j->fsdp.offload_params) ? cs * e : 0);
    p->gathered = m->gather_slots;
    p->activations = m->activations;
    p->workspace = m->small + p->context;
}

int step_plan_job(const job_config *j, const llama_config *cfg, model_image_quant quant,
                  const plan_machine *m, const plan_rates *r, step_plan *p, errbuf *err) {
    memset(p, 0, sizeof *p);
    int cpu = j->runtime.backend == JOB_BACKEND_CPU;
    if (!cpu && j->runtime.backend != JOB_BACKEND_CUDA)
        return errf(err, "plan: runtime.backend not resolved (cpu or cuda)");
    const plan_gpu *table_gpu = cpu || !r ? NULL : plan_gpu_find(r->gpu);
    if (!cpu && (!m->gpu || !table_gpu))
        return errf(err, "plan: unknown GPU '%s' (known: %s)", m->gpu && r ? r->gpu : "?", plan_gpu_names());
    if (m->nodes < 1 || m->gpus_per_node < 1) return errf(err, "plan: %d nodes of %d workers", m->nodes, m->gpus_per_node);
    int world = m->nodes * m->gpus_per_node;
    size_t cs = cpu ? 4 : 2; /* the CPU kernels compute in fp32, the GPUs in bf16 (k_compute_size) */
    size_t gpu_total = cpu ? 0 : (size_t)(m->gpu->memory_gib * (double)(1ull << 30));
    memory_plan_options o;
    p->context = cpu ? 0 : (size_t)r->context_bytes;
    memory_plan_job_options(j, cfg, world, 0, quant, cs, step_plan_auto_budget(j, gpu_total, p->context), &o);
    if (memory_plan_compute(&o, &p->mem, err)) return errprefix(err, "plan");
    p->cpu = cpu;
    p->validated = !cpu && table_gpu == m->gpu;
    p->gpu_bytes = p->mem.total + p->context;
    p->recompute = o.recompute;
    p->offload_layers = o.offload_layers;
    p->compute_copies = o.compute_copies;
    by_kind(j, p, cs);
    /* The verdict is fsdpd's own admission check (step_plan_admit, as daemon/supervisor.c calls it):
     * the plan and fsdpd never disagree on whether a job fits. */
    errbuf verdict = {{0}};
    p->fits = step_plan_admit(j, cfg, world, quant, cs, gpu_total, PLAN_CONTEXT_BYTES, &verdict) == 0;
    if (!p->fits) snprintf(p->verdict, sizeof p->verdict, "%s", verdict.msg);
    size_t limit = j->runtime.gpu_memory_limit > 0 ? (size_t)j->runtime.gpu_memory_limit
                 : cpu                            ? SIZE_MAX
                 : gpu_total > PLAN_CONTEXT_BYTES + PLAN_MARGIN_BYTES ? gpu_total - PLAN_CONTEXT_BYTES - PLAN_MARGIN_BYTES
                                                                      : 0;
    int rows = j->train.global_batch / world;
    size_t fitted;
    p->max_micro_batch = limit ? memory_plan_largest_micro_batch(&o, rows, rows, limit, &fitted) : 0;

    /* host RAM of a node */
    if (!(p->host_model = image_bytes(cfg, j, o.lora ? quant : MODEL_IMAGE_PLAIN, err))) return errprefix(err, "plan");
    int memory = j->checkpoint.memory_interval_steps > 0;
    int saves = j->checkpoint.interval_steps > 0 || j->checkpoint.save_final || memory;
    p->host_offload = (p->mem.host_offload + p->mem.host_activations) * (size_t)m->gpus_per_node;
    p->host_workers = cpu ? p->mem.total * (size_t)m->gpus_per_node : 0;
    p->host_ckpt = saves ? 12 * p->mem.trainable_elems * (size_t)m->gpus_per_node : 0;
    p->host_memory_ckpt = memory ? p->host_ckpt : 0;
    p->host_data = m->data_bytes;
    p->host_processes = (size_t)m->gpus_per_node * ((size_t)600 << 20); /* measured: 0.5 to 1 GiB a worker */
    p->host_total = p->host_model + p->host_offload + p->host_workers + p->host_ckpt + p->host_data +
                    p->host_processes;

    model_shape s = {.c = cfg, .B = j->train.micro_batch * job_rows_per_sample(j), .T = j->data.seq_len, .C = cfg->hidden_size,
                     .I = cfg->intermediate_size, .q = cfg->num_attention_heads * cfg->head_dim,
                     .kv = cfg->num_key_value_heads * cfg->head_dim, .V = cfg->vocab_size, .cs = (double)cs,
                     .lora = o.lora, .nf4 = o.lora && quant != MODEL_IMAGE_PLAIN};
    s.N = s.B * s.T;
    unit_sizes u;
    unit_sizes_of(&s, &u);
    p->ckpt_bytes = (size_t)(12.0 * u.trained_total);
    p->ckpt_node_bytes = p->ckpt_bytes / (size_t)m->nodes;
    p->ckpt_write_s = r ? (double)p->ckpt_node_bytes / (r->disk_gbps * 1e9) : 0;
    if (cpu) return 0; /* no step time: the rates are a GPU's */

    rates rt = {.t = r, .compute = table_gpu->tflops / m->gpu->tflops,
                .memory = table_gpu->hbm_gbps / m->gpu->hbm_gbps, .copy = table_gpu->pcie_gbps / m->gpu->pcie_gbps};
    step_time(j, &s, o.recompute, m, &rt, p);
    return 0;
}

size_t step_plan_auto_budget(const job_config *j, size_t gpu_bytes, size_t context) {
    if (j->runtime.gpu_memory_limit > 0) return (size_t)j->runtime.gpu_memory_limit;
    if (gpu_bytes == 0) return SIZE_MAX;
    size_t kept = context + PLAN_MARGIN_BYTES + PLAN_AUTO_HEADROOM_BYTES;
    return gpu_bytes > kept ? gpu_bytes - kept : 0;
}

int step_plan_admit(const job_config *j, const llama_config *cfg, int world, model_image_quant quant,
                    size_t compute_size, size_t gpu_bytes, size_t context, errbuf *err) {
    if (j->runtime.gpu_memory_limit > 0)
        return memory_plan_check_job(j, cfg, world, 0, quant, compute_size, err);
    if (gpu_bytes == 0) return 0;
    if (gpu_bytes <= context + PLAN_MARGIN_BYTES) return errf(err, "the GPU's %zu bytes hold no job", gpu_bytes);
    char what[256];
    snprintf(what, sizeof what, "the GPU's memory (%.1f GiB, less %.1f GiB for the CUDA context and a %.2f GiB margin)",
             (double)gpu_bytes / (1ull << 30), (double)context / (1ull << 30),
             (double)PLAN_MARGIN_BYTES / (1ull << 30));
    return memory_plan_check_limit(j, cfg, world, 0, quant, compute_size, gpu_bytes - context - PLAN_MARGIN_BYTES,
                                   what, err);
}
