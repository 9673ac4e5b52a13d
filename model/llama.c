/* llama: per-unit forward and backward of the Llama model (see llama.h), every op through
 * kernels.h. */
#include "model/llama.h"

#include <stddef.h>
#include <stdio.h>

#include "base/philox.h"

/* ---- carving activation structs out of one allocation ---- */

/* Sub-buffers start on 256-byte boundaries (what CUDA allocations guarantee). */
#define CARVE_ALIGN 256

typedef struct carver {
    char *base; /* NULL: only measure */
    size_t used;
} carver;

static void *carve(carver *cv, size_t bytes) {
    void *p = cv->base ? cv->base + cv->used : NULL;
    cv->used += (bytes + CARVE_ALIGN - 1) / CARVE_ALIGN * CARVE_ALIGN;
    return p;
}

typedef struct dims {
    size_t N, C, I, Q, KV, V, heads, kv_heads;
} dims;

/* The MLP's rows at a time for N rows: mlp_rows, or N (0 or more than N). */
static size_t mlp_rows_of(size_t N, int mlp_rows) {
    return mlp_rows > 0 && (size_t)mlp_rows < N ? (size_t)mlp_rows : N;
}

static dims dims_of(const llama_layout *lo, int B, int T) {
    const llama_config *c = &lo->cfg;
    return (dims){
        .N = (size_t)B * (size_t)T,
        .C = (size_t)c->hidden_size,
        .I = (size_t)c->intermediate_size,
        .Q = (size_t)c->num_attention_heads * (size_t)c->head_dim,
        .KV = (size_t)c->num_key_value_heads * (size_t)c->head_dim,
        .V = (size_t)c->vocab_size,
        .heads = (size_t)c->num_attention_heads,
        .kv_heads = (size_t)c->num_key_value_heads,
    };
}

/* The adapted modules of each part: q, k, v, o in the attention's, the rest in the MLP's. */
static llama_acts_part lora_part(int m) {
    return m == LORA_GATE || m == LORA_UP || m == LORA_DOWN ? LLAMA_ACTS_MLP : LLAMA_ACTS_ATTENTION;
}

size_t llama_layer_acts_carve_part(llama_layer_acts *a, void *mem, llama_acts_part part,
                                   const llama_layout *lo, const lora_layout *lora,
                                   size_t elem_size, int B, int T, int mlp_rows) {
    dims d = dims_of(lo, B, T);
    size_t rows = mlp_rows_of(d.N, mlp_rows);
    size_t e = elem_size;
    carver cv = {mem, 0};
    if (part & LLAMA_ACTS_ATTENTION) {
        a->ln1 = carve(&cv, d.N * d.C * e);
        a->q = carve(&cv, d.N * d.Q * e);
        a->k = carve(&cv, d.N * d.KV * e);
        a->v = carve(&cv, d.N * d.KV * e);
        a->rstd1 = carve(&cv, d.N * sizeof(float));
        int qk = lo->cfg.qk_norm;
        a->q_pre = qk ? carve(&cv, d.N * d.Q * e) : NULL;
        a->k_pre = qk ? carve(&cv, d.N * d.KV * e) : NULL;
        a->rstd_q = qk ? carve(&cv, d.N * d.heads * sizeof(float)) : NULL;
        a->rstd_k = qk ? carve(&cv, d.N * d.kv_heads * sizeof(float)) : NULL;
    }
    if (part & LLAMA_ACTS_CONTEXT) {
        a->att = carve(&cv, d.N * d.Q * e);
        a->lse = carve(&cv, d.N * d.heads * sizeof(float));
    }
    if (part & LLAMA_ACTS_RESIDUAL) a->h = carve(&cv, d.N * d.C * e);
    if (part & LLAMA_ACTS_MLP) {
        a->ln2 = carve(&cv, d.N * d.C * e);
        a->gate = carve(&cv, rows * d.I * e);
        a->up = carve(&cv, rows * d.I * e);
        a->sw = carve(&cv, rows * d.I * e);
        a->rstd2 = carve(&cv, d.N * sizeof(float));
        a->mlp_rows = (int)rows;
    }
    for (int m = 0; m < LORA_MODULES; m++) {
        if (!(part & lora_part(m))) continue;
        llama_lora_group g = lora ? llama_lora_group_of(&lora->cfg, m) : (llama_lora_group){.column = 0};
        if (g.column > 0) continue; /* carved with its group's first */
        a->lora_t[m] = NULL;
        if (!lora || !lora->site[m].on) continue;
        size_t n = lora_part(m) == LLAMA_ACTS_MLP ? rows : d.N, r = (size_t)lora->cfg.rank;
        char *t = carve(&cv, n * (size_t)g.n * r * e);
        for (int j = 0; j < g.n; j++) a->lora_t[g.member[j]] = t ? t + (size_t)j * r * e : NULL;
    }
    return cv.used;
}

llama_lora_group llama_lora_group_of(const lora_config *cfg, int m) {
    static const int groups[][3] = {{LORA_Q, LORA_K, LORA_V}, {LORA_GATE, LORA_UP, -1}};
    llama_lora_group alone = {.n = 1, .member = {m, -1, -1}, .column = 0};
    /* a member's columns start 16 bytes apart at a rank of 8 or a multiple (bf16): the layouts
     * cuBLASLt was checked with (check_kernels); other ranks run module by module */
    if (cfg->dropout > 0 || cfg->rank % 8 || !(cfg->targets >> m & 1u)) return alone;
    for (size_t i = 0; i < sizeof groups / sizeof groups[0]; i++) {
        llama_lora_group g = {.n = 0, .member = {-1, -1, -1}, .column = -1};
        for (int j = 0; j < 3; j++) {
            int k = groups[i][j];
            if (k < 0 || !(cfg->targets >> k & 1u)) continue;
            if (k == m) g.column = g.n;
            g.member[g.n++] = k;
        }
        if (g.column >= 0) return g.n > 1 ? g : alone;
    }
    return alone;
}

size_t llama_layer_acts_carve(llama_layer_acts *a, void *mem, const llama_layout *lo,
                              const lora_layout *lora, size_t elem_size, int B, int T) {
    return llama_layer_acts_carve_part(a, mem, LLAMA_ACTS_ALL, lo, lora, elem_size, B, T, 0);
}

const char *llama_keep_name(llama_keep k) {
    switch (k) {
    case LLAMA_KEEP_INPUT: return "input";
    case LLAMA_KEEP_RESIDUAL: return "residual";
    case LLAMA_KEEP_CONTEXT: return "context";
    case LLAMA_KEEP_ATTENTION: return "attention";
    default: return "all";
    }
}

llama_keep llama_keep_of(llama_recompute r, int l) {
    return l < r.layers ? r.keep : LLAMA_KEEP_ALL;
}

llama_keep llama_backward_from(llama_recompute r, int l, int L) {
    return l == (r.layers < L ? r.layers : L) - 1 ? LLAMA_KEEP_ALL : llama_keep_of(r, l);
}

int llama_check_long_settings(int L, llama_recompute r, int offload_layers, int mlp_chunk, double dropout,
                              errbuf *err) {
    int most = L > 1 ? L - 1 : 0;
    if (offload_layers < 0 || offload_layers > most ||
        (offload_layers && (r.layers < L || r.keep != LLAMA_KEEP_INPUT)))
        return errf(err, "%d of %d layer inputs offloaded (0 .. %d, with full recompute)", offload_layers, L, most);
    if (mlp_chunk < 0 || (mlp_chunk && (r.layers < L || r.keep == LLAMA_KEEP_ALL || dropout > 0)))
        return errf(err, "mlp_chunk %d needs every layer's MLP recomputed and no adapter dropout", mlp_chunk);
    return 0;
}

void llama_recompute_format(llama_recompute r, int L, char *out, size_t n) {
    const char *keep = r.keep == LLAMA_KEEP_ATTENTION ? "their attention (the MLP recomputed)"
                       : r.keep == LLAMA_KEEP_RESIDUAL ? "their input and attention's output h (recomputed but o_proj)"
                       : r.keep == LLAMA_KEEP_CONTEXT ? "their input, h and the attention's output (q, k, v and the MLP recomputed)"
                                                      : "their input (recomputed)";
    if (r.layers <= 0 || r.keep == LLAMA_KEEP_ALL) snprintf(out, n, "none: every layer keeps its activations");
    else if (r.layers >= L && r.keep == LLAMA_KEEP_INPUT) snprintf(out, n, "full: every layer recomputed from its input");
    else if (r.layers >= L && r.keep == LLAMA_KEEP_RESIDUAL)
        snprintf(out, n, "every layer keeps its input and attention's output h, recomputed but o_proj");
    else if (r.layers >= L && r.keep == LLAMA_KEEP_CONTEXT)
        snprintf(out, n, "every layer keeps its input, h and the attention's output, q, k, v and the MLP recomputed");
    else if (r.layers >= L) snprintf(out, n, "selective: every layer keeps its attention, its MLP recomputed");
    else snprintf(out, n, "%d of %d layers keep everything, the others %s", L - r.layers, L, keep);
}

llama_acts_part llama_kept_parts(llama_keep k) {
    switch (k) {
    case LLAMA_KEEP_ALL: return LLAMA_ACTS_ALL;
    case LLAMA_KEEP_ATTENTION: return LLAMA_ACTS_ATTENTION | LLAMA_ACTS_CONTEXT | LLAMA_ACTS_RESIDUAL;
    case LLAMA_KEEP_CONTEXT: return LLAMA_ACTS_CONTEXT | LLAMA_ACTS_RESIDUAL;
    case LLAMA_KEEP_RESIDUAL: return LLAMA_ACTS_RESIDUAL;
    default: return 0;
    }
}

/* dst's pointers of `part` from src. */
static void share_part(llama_layer_acts *dst, const llama_layer_acts *src, llama_acts_part part) {
    if (part & LLAMA_ACTS_ATTENTION) {
        dst->ln1 = src->ln1, dst->q = src->q, dst->k = src->k, dst->v = src->v;
        dst->rstd1 = src->rstd1;
        dst->q_pre = src->q_pre, dst->k_pre = src->k_pre;
        dst->rstd_q = src->rstd_q, dst->rstd_k = src->rstd_k;
    }
    if (part & LLAMA_ACTS_CONTEXT) dst->att = src->att, dst->lse = src->lse;
    if (part & LLAMA_ACTS_RESIDUAL) dst->h = src->h;
    if (part & LLAMA_ACTS_MLP) {
        dst->ln2 = src->ln2, dst->gate = src->gate, dst->up = src->up, dst->sw = src->sw;
        dst->rstd2 = src->rstd2, dst->mlp_rows = src->mlp_rows;
    }
    for (int m = 0; m < LORA_MODULES; m++)
        if (part & lora_part(m)) dst->lora_t[m] = src->lora_t[m];
}

size_t llama_layers_acts_carve(llama_layer_acts *acts, void *mem, llama_recompute r,
                               const llama_layout *lo, const lora_layout *lora,
                               size_t elem_size, int B, int T, int mlp_rows) {
    int L = lo->n_layers;
    char *base = mem;
    size_t at = 0;
    llama_layer_acts shared = {0}, unused;
    llama_acts_part shared_parts = 0;
    for (int l = 0; l < L; l++) {
        llama_acts_part own = llama_kept_parts(llama_keep_of(r, l));
        shared_parts |= LLAMA_ACTS_ALL & ~own;
        if (own)
            at += llama_layer_acts_carve_part(acts ? &acts[l] : &unused, base ? base + at : NULL,
                                              own, lo, lora, elem_size, B, T, 0);
    }
    if (shared_parts)
        at += llama_layer_acts_carve_part(&shared, base ? base + at : NULL, shared_parts, lo, lora,
                                          elem_size, B, T, mlp_rows);
    for (int l = 0; acts && l < L; l++)
        share_part(&acts[l], &shared, LLAMA_ACTS_ALL & ~llama_kept_parts(llama_keep_of(r, l)));
    return at;
}

/* Rows of logits the head holds at a time (llama_head_forward_backward). */
static size_t head_rows(size_t N) { return N < LLAMA_HEAD_ROWS ? N : LLAMA_HEAD_ROWS; }

size_t llama_head_acts_carve(llama_head_acts *a, void *mem, const llama_layout *lo,
                             size_t elem_size, int B, int T) {
    dims d = dims_of(lo, B, T);
    carver cv = {mem, 0};
    a->lnf = carve(&cv, d.N * d.C * elem_size);
    a->rstd = carve(&cv, d.N * sizeof(float));
    a->logits = carve(&cv, head_rows(d.N) * d.V * elem_size);
    return cv.used;
}

size_t llama_scratch_carve(llama_scratch *s, void *mem, const llama_layout *lo,
                           const lora_layout *lora, size_t elem_size, int B, int T, int mlp_rows) {
    dims d = dims_of(lo, B, T);
    size_t e = elem_size, rows = mlp_rows_of(d.N, mlp_rows);
    carver cv = {mem, 0};
    s->mlp_rows = (int)rows;
    s->dsw = carve(&cv, rows * d.I * e);
    s->dln = carve(&cv, d.N * d.C * e);
    s->datt = carve(&cv, d.N * d.Q * e);
    s->dq = carve(&cv, d.N * d.Q * e);
    s->dk = carve(&cv, d.N * d.KV * e);
    s->dv = carve(&cv, d.N * d.KV * e);
    s->lora_dt = s->lora_xd = s->lora_dxd = s->lora_a = NULL;
    s->lora_da = NULL;
    if (lora) {
        size_t max_in = d.C > d.I ? d.C : d.I, widest = 1, r = (size_t)lora->cfg.rank;
        max_in = max_in > d.Q ? max_in : d.Q;
        for (int m = 0; m < LORA_MODULES; m++) {
            size_t n = (size_t)llama_lora_group_of(&lora->cfg, m).n;
            widest = n > widest ? n : widest;
        }
        s->lora_dt = carve(&cv, d.N * widest * r * e);
        if (widest > 1) { /* a group's inputs are the hidden size wide */
            s->lora_a = carve(&cv, widest * r * d.C * e);
            s->lora_da = carve(&cv, widest * r * d.C * sizeof(float));
        }
        if (lora->cfg.dropout > 0) {
            s->lora_xd = carve(&cv, d.N * max_in * e);
            s->lora_dxd = carve(&cv, d.N * max_in * e);
        }
    }
    return cv.used;
}

static size_t max_size(size_t a, size_t b) { return a > b ? a : b; }

size_t llama_fp8_carve(llama_fp8 *f, void *mem, const llama_layout *lo, size_t elem_size, int B, int T,
                       int mlp_rows) {
    dims d = dims_of(lo, B, T);
    size_t rows = mlp_rows_of(d.N, mlp_rows), side = max_size(max_size(d.C, d.Q), max_size(d.KV, d.I));
    /* a: x, dy or dy^T, [tokens, a projection's side]; b: W, W^T or x^T */
    size_t acts = max_size(d.N * max_size(d.C, d.Q), rows * max_size(d.C, d.I));
    size_t weight = d.C * max_size(max_size(d.Q, d.KV), d.I), b = max_size(acts, weight);
    carver cv = {mem, 0};
    f->a = carve(&cv, acts);
    f->b = carve(&cv, b);
    f->sa = carve(&cv, max_size(d.N, side) * sizeof(float));
    f->sb = carve(&cv, max_size(d.N, side) * sizeof(float));
    f->product = carve(&cv, b * elem_size);
    f->product_f32 = carve(&cv, weight * sizeof(float));
    return cv.used;
}

/* ---- tensors inside a unit's flat buffers ---- */

static const llama_tensor_slot *unit_slot(const llama_layout *lo, int unit, int index) {
    return &lo->tensors[lo->units[unit].first + index];
}

/* A tensor of a unit's parameter buffer (compute dtype). */
static const void *param_at(kctx *c, const llama_layout *lo, const void *params, int unit,
                            int index) {
    return (const char *)params + unit_slot(lo, unit, index)->offset * k_compute_size(c);
}

/* A tensor of a unit's gradient buffer; NULL for a frozen unit (grads NULL). */
static float *grad_at(const llama_layout *lo, float *grads, int unit, int index) {
    return grads ? grads + unit_slot(lo, unit, index)->offset : NULL;
}

/* Every decoder layer has the same offsets: layer 0's slots describe them all.  t is a
 * llama_layer_tensor the layer has (model_layout.h: the extras only in their families). */
#define LAYER_W(t) param_at(c, lo, w->params, llama_layer_unit(0), lo->layer_index[t])
#define LAYER_DW(t) grad_at(lo, w->grads, llama_layer_unit(0), lo->layer_index[t])

/* ---- a decoder projection: the compute dtype's GEMM, or FP8's (llama_fp8) ---- */

/* Projection t's FP8 weight, when the layer was gathered as FP8 codes (w->codes): its codes
 * [out, in] (its inverse scale: w->code_scales[LLAMA_FP8_SCALE_STRIDE t + 4]). */
static const uint8_t *codes_at(const llama_layout *lo, const llama_layer_weights *w, int t) {
    return w->codes + unit_slot(lo, llama_layer_unit(0), lo->layer_index[t])->offset;
}

/* y = x W_t^T (accumulate: y +=, onto the adapter's term the module's adapter wrote first), W_t
 * projection t of the layer. */
static void proj_fwd(kctx *c, const llama_layout *lo, const llama_layer_weights *w, void *y, const void *x, int t,
                     int N, int in, int out, int accumulate) {
    const llama_fp8 *f = w->fp8;
    if (!f) {
        k_linear_fwd_ld(c, y, x, in, LAYER_W(t), N, in, out, accumulate);
        return;
    }
    k_fp8_cast(c, f->a, f->sa, x, N, in, FP8_E4M3, f->scaling);
    const uint8_t *W = w->codes ? codes_at(lo, w, t) : f->b;
    const float *sw = w->codes ? w->code_scales + LLAMA_FP8_SCALE_STRIDE * t + 4 : f->sb;
    if (!w->codes) k_fp8_cast(c, f->b, f->sb, LAYER_W(t), out, in, FP8_E4M3, f->scaling);
    k_fp8_gemm(c, accumulate ? f->product : y, f->a, f->sa, FP8_E4M3, W, sw, FP8_E4M3, N, out, in, f->scaling);
    if (accumulate) k_accumulate(c, y, f->product, (size_t)N * out);
}

/* k_linear_bwd's for projection t: din = dy W_t (accumulate: din +=), dW_t += dy^T x (= with
 * w->grads_fresh); each skipped when NULL (dW_t: a frozen layer). */
static void proj_bwd(kctx *c, const llama_layout *lo, const llama_layer_weights *w, void *din, int t,
                     const void *dy, const void *x, int N, int in, int out, int accumulate) {
    const llama_fp8 *f = w->fp8;
    float *dW = LAYER_DW(t);
    if (!f) {
        k_linear_bwd_ld(c, din, dW, dy, x, in, LAYER_W(t), N, in, out, accumulate, !w->grads_fresh);
        return;
    }
    fp8_format g = f->grad_format;
    if (din) { /* dy [N, out] by W^T [in, out]: under one tensorwise scale, W's codes transposed */
        void *to = accumulate ? f->product : din;
        k_fp8_cast(c, f->a, f->sa, dy, N, out, g, f->scaling);
        if (w->codes) k_fp8_transpose(c, f->b, codes_at(lo, w, t), out, in);
        else k_fp8_cast_t(c, f->b, f->sb, LAYER_W(t), out, in, FP8_E4M3, f->scaling);
        const float *sw = w->codes ? w->code_scales + LLAMA_FP8_SCALE_STRIDE * t + 4 : f->sb;
        k_fp8_gemm(c, to, f->a, f->sa, g, f->b, sw, FP8_E4M3, N, in, out, f->scaling);
        if (accumulate) k_accumulate(c, din, f->product, (size_t)N * in);
    }
    if (dW) { /* dy^T [out, N] by x^T [in, N] */
        k_fp8_cast_t(c, f->a, f->sa, dy, N, out, g, f->scaling);
        k_fp8_cast_t(c, f->b, f->sb, x, N, in, FP8_E4M3, f->scaling);
        k_fp8_gemm(c, f->product, f->a, f->sa, g, f->b, f->sb, FP8_E4M3, out, in, N, f->scaling);
        k_compute_to_f32(c, w->grads_fresh ? dW : f->product_f32, f->product, (size_t)out * in);
        if (!w->grads_fresh) k_add_f32(c, dW, f->product_f32, (size_t)out * in);
    }
}

/* ---- LoRA: y += scale * B(A(dropout(x))) on module m (nothing when m has no adapter) ---- */

static int lora_on(const llama_layer_weights *w, int m) {
    return w->lora && w->lora->layout->site[m].on;
}

/* x as the adapter of module m sees it: x itself, or its dropped-out copy in scratch. */
static const void *lora_input(kctx *c, const llama_layer_weights *w, int m, const void *x,
                              void *xd, int B, int T) {
    const llama_lora *L = w->lora;
    if (!(L->dropout > 0)) return x;
    k_dropout(c, xd, x, L->samples, L->seed, philox_dropout_site(w->layer, m), B, T,
              L->layout->site[m].in, L->dropout, 0);
    return xd;
}

/* Forward: t = scale * A(dropout(x)) (saved), y = t B^T, the base's GEMM then adding x W^T onto
 * it (its epilogue reads y: the adapter's term costs a write of y, not a read and a write); y
 * NULL: t only (a recomputation whose output is not needed). */
static void lora_forward(kctx *c, const llama_layer_weights *w, int m, const void *x, void *y,
                         llama_layer_acts *a, void *xd, int B, int T) {
    if (!lora_on(w, m)) return;
    const lora_site *st = &w->lora->layout->site[m];
    int N = B * T, r = w->lora->layout->cfg.rank;
    size_t cs = k_compute_size(c);
    const void *A = (const char *)w->adapters + st->a_off * cs;
    const void *Bw = (const char *)w->adapters + st->b_off * cs;
    k_linear_fwd(c, a->lora_t[m], lora_input(c, w, m, x, xd, B, T), A, N, st->in, r);
    k_scale(c, a->lora_t[m], w->lora->scale, (size_t)N * r);
    if (y) k_linear_fwd(c, y, a->lora_t[m], Bw, N, r, st->out);
}

/* Backward of lora_forward: dB += dy^T t, dt = scale * dy B, dA += dt^T dropout(x),
 * dx += dropout'(dt A) (the same mask, redrawn). */
static void lora_backward(kctx *c, const llama_layer_weights *w, int m, const void *x,
                          void *dx, const void *dy, const llama_layer_acts *a, llama_scratch *s,
                          int B, int T) {
    if (!lora_on(w, m)) return;
    const llama_lora *L = w->lora;
    const lora_site *st = &L->layout->site[m];
    int N = B * T, r = L->layout->cfg.rank;
    size_t cs = k_compute_size(c);
    const void *A = (const char *)w->adapters + st->a_off * cs;
    const void *Bw = (const char *)w->adapters + st->b_off * cs;
    float *dA = w->adapter_grads + st->a_off, *dB = w->adapter_grads + st->b_off;
    k_linear_bwd(c, s->lora_dt, dB, dy, a->lora_t[m], Bw, N, r, st->out, 0);
    k_scale(c, s->lora_dt, L->scale, (size_t)N * r);
    const void *xin = lora_input(c, w, m, x, s->lora_xd, B, T);
    if (xin == x) {
        k_linear_bwd(c, dx, dA, s->lora_dt, x, A, N, st->in, r, 1);
        return;
    }
    k_linear_bwd(c, s->lora_dxd, dA, s->lora_dt, xin, A, N, st->in, r, 0);
    k_dropout(c, dx, s->lora_dxd, L->samples, L->seed, philox_dropout_site(w->layer, m), B, T,
              st->in, L->dropout, 1);
}

/* A fused group's A matrices one after another in s->lora_a: [n rank, in]. */
static const void *lora_group_a(kctx *c, const llama_layer_weights *w, const llama_lora_group *g,
                                llama_scratch *s) {
    const lora_layout *L = w->lora->layout;
    size_t cs = k_compute_size(c), bytes = (size_t)L->cfg.rank * L->site[g->member[0]].in * cs;
    for (int j = 0; j < g->n; j++)
        k_copy_h2d(c, (char *)s->lora_a + j * bytes, (const char *)w->adapters + L->site[g->member[j]].a_off * cs,
                   bytes);
    return s->lora_a;
}

/* Forward of fused group g on its input x: t = scale * x [A_1; ...; A_n]^T, one GEMM into the
 * group's [N, n rank] inner activation, then each member's y_j = t_j B_j^T (lora_forward). */
static void lora_group_forward(kctx *c, const llama_layer_weights *w, const llama_lora_group *g,
                               const void *x, void *const ys[], llama_layer_acts *a, llama_scratch *s, int B,
                               int T) {
    const lora_layout *L = w->lora->layout;
    int N = B * T, r = L->cfg.rank, ld = g->n * r;
    size_t cs = k_compute_size(c);
    void *t = a->lora_t[g->member[0]];
    k_linear_fwd(c, t, x, lora_group_a(c, w, g, s), N, L->site[g->member[0]].in, ld);
    k_scale(c, t, w->lora->scale, (size_t)N * ld);
    for (int j = 0; j < g->n; j++) {
        const lora_site *st = &L->site[g->member[j]];
        k_linear_fwd_ld(c, ys[j], a->lora_t[g->member[j]], ld, (const char *)w->adapters + st->b_off * cs, N, r,
                        st->out, 0);
    }
}

/* The adapters of modules first .. first + count - 1 (which share input x) into their outputs
 * ys[m - first], before the bases add onto them: a fused group at once, the others one by
 * one. */
static void lora_inputs_forward(kctx *c, const llama_layer_weights *w, int first, int count, const void *x,
                                void *const ys[], llama_layer_acts *a, llama_scratch *s, int B, int T) {
    for (int m = first; m < first + count; m++) {
        if (!lora_on(w, m)) continue;
        llama_lora_group g = llama_lora_group_of(&w->lora->layout->cfg, m);
        if (g.n == 1) {
            lora_forward(c, w, m, x, ys[m - first], a, s->lora_xd, B, T);
        } else if (g.column == 0) {
            void *gy[3];
            for (int j = 0; j < g.n; j++) gy[j] = ys[g.member[j] - first];
            lora_group_forward(c, w, &g, x, gy, a, s, B, T);
        }
    }
}

/* Whether module m's adapter runs in a fused group (its backward then comes after the bases'). */
static int lora_fused(const llama_layer_weights *w, int m) {
    return lora_on(w, m) && llama_lora_group_of(&w->lora->layout->cfg, m).n > 1;
}

/* Backward of the fused group of modules first .. first + count - 1 (nothing when they are not
 * fused), their output gradients dys[m - first]: each member's dB_j += dy_j^T t_j and
 * dt_j = scale * dy_j B_j into its columns of dt, then dx += dt [A_1; ...; A_n] and
 * [dA_1; ...; dA_n] += dt^T x, one GEMM each. */
static void lora_inputs_backward(kctx *c, const llama_layer_weights *w, int first, int count, const void *x,
                                 void *dx, const void *const dys[], const llama_layer_acts *a, llama_scratch *s,
                                 int B, int T) {
    int m0 = first;
    while (m0 < first + count && !lora_on(w, m0)) m0++;
    if (m0 == first + count || !lora_fused(w, m0)) return;
    const lora_layout *L = w->lora->layout;
    llama_lora_group g = llama_lora_group_of(&L->cfg, m0);
    int N = B * T, r = L->cfg.rank, ld = g.n * r, in = L->site[m0].in;
    size_t cs = k_compute_size(c);
    for (int j = 0; j < g.n; j++) {
        const lora_site *st = &L->site[g.member[j]];
        k_linear_bwd_ld(c, (char *)s->lora_dt + (size_t)j * r * cs, w->adapter_grads + st->b_off,
                        dys[g.member[j] - first], a->lora_t[g.member[j]], ld, (const char *)w->adapters + st->b_off * cs,
                        N, r, st->out, 0, 1);
    }
    k_scale(c, s->lora_dt, w->lora->scale, (size_t)N * ld);
    k_linear_bwd_ld(c, dx, s->lora_da, s->lora_dt, x, in, lora_group_a(c, w, &g, s), N, in, ld, 1, 0);
    for (int j = 0; j < g.n; j++)
        k_add_f32(c, w->adapter_grads + L->site[g.member[j]].a_off, s->lora_da + (size_t)j * r * in, (size_t)r * in);
}

/* ---- embedding ---- */

void llama_embed_forward(kctx *c, const llama_layout *lo, const void *params,
                         const int32_t *tokens, void *out, int N) {
    k_embedding_fwd(c, out, tokens, params, N, lo->cfg.hidden_size, lo->cfg.vocab_size);
}

void llama_embed_backward(kctx *c, const llama_layout *lo, float *grads, const int32_t *tokens,
                          const void *dresid, int N) {
    k_embedding_bwd(c, grads, dresid, tokens, N, lo->cfg.hidden_size, lo->cfg.vocab_size);
}

/* ---- decoder layer ---- */

/* y = x W_t^T (+ bias, Qwen2's q/k/v), for a projection of the attention, onto its adapter's
 * term when it has one (lora_inputs_forward, first). */
static void attn_proj_forward(kctx *c, const llama_layout *lo, const llama_layer_weights *w,
                              int t, int bias, const void *x, void *y, int N, int in, int out) {
    proj_fwd(c, lo, w, y, x, t, N, in, out, lora_on(w, t));
    if (lo->cfg.attention_bias) k_bias_fwd(c, y, LAYER_W(bias), N, out);
}

/* q or k from its projection: Qwen3's per-head RMSNorm (pre -> x, rstd saved) when the
 * config has it, then RoPE, then yarn's attention factor. */
static void qk_forward(kctx *c, const llama_layout *lo, const llama_layer_weights *w, int norm,
                       const float *inv_freq, const k_docs *docs, const void *pre, void *x,
                       float *rstd, int B, int T, int H) {
    const llama_config *cfg = &lo->cfg;
    int hd = cfg->head_dim;
    if (cfg->qk_norm)
        k_rmsnorm_fwd(c, x, rstd, pre, LAYER_W(norm), B * T * H, hd, (float)cfg->rms_norm_eps);
    k_rope(c, x, inv_freq, docs, B, T, H, hd, 0);
    double af = rope_attention_factor(&cfg->rope);
    if (af != 1.0) k_scale(c, x, (float)af, (size_t)B * T * H * hd);
}

/* h = x + o_proj(attention(rope(q), rope(k), v)) over input_layernorm(x), but for what a
 * layer that kept `kept` still holds (a recomputation; the forward: LLAMA_KEEP_INPUT): with
 * h, o_proj and the add are skipped (its adapter's inner activation made), with the
 * attention's output the attention too. */
static void attention_forward(kctx *c, const llama_layout *lo, const llama_layer_weights *w,
                              const float *inv_freq, const k_docs *docs, const void *x,
                              llama_layer_acts *a, llama_scratch *s, llama_keep kept, int B, int T) {
    const llama_config *cfg = &lo->cfg;
    int N = B * T, C = cfg->hidden_size, hd = cfg->head_dim;
    int Hq = cfg->num_attention_heads, Hkv = cfg->num_key_value_heads;
    void *xd = s->lora_xd; /* a dropped-out adapter input, used at once */
    void *q = cfg->qk_norm ? a->q_pre : a->q, *k = cfg->qk_norm ? a->k_pre : a->k;
    k_rmsnorm_fwd(c, a->ln1, a->rstd1, x, LAYER_W(LLAMA_LN1), N, C, (float)cfg->rms_norm_eps);
    if (w->lora) lora_inputs_forward(c, w, LORA_Q, 3, a->ln1, (void *[]){q, k, a->v}, a, s, B, T);
    attn_proj_forward(c, lo, w, LLAMA_Q, LLAMA_Q_BIAS, a->ln1, q, N, C, Hq * hd);
    attn_proj_forward(c, lo, w, LLAMA_K, LLAMA_K_BIAS, a->ln1, k, N, C, Hkv * hd);
    attn_proj_forward(c, lo, w, LLAMA_V, LLAMA_V_BIAS, a->ln1, a->v, N, C, Hkv * hd);
    qk_forward(c, lo, w, LLAMA_Q_NORM, inv_freq, docs, q, a->q, a->rstd_q, B, T, Hq);
    qk_forward(c, lo, w, LLAMA_K_NORM, inv_freq, docs, k, a->k, a->rstd_k, B, T, Hkv);
    if (kept < LLAMA_KEEP_CONTEXT)
        k_attention_fwd(c, a->att, a->lse, a->q, a->k, a->v, docs, cfg->sliding_window, B, T, Hq, Hkv, hd);
    lora_forward(c, w, LORA_O, a->att, kept == LLAMA_KEEP_INPUT ? a->h : NULL, a, xd, B, T);
    if (kept != LLAMA_KEEP_INPUT) return;
    proj_fwd(c, lo, w, a->h, a->att, LLAMA_O, N, Hq * hd, C, lora_on(w, LORA_O));
    k_accumulate(c, a->h, x, (size_t)N * C);
}

/* The MLP's rows [r0, r0 + n) of B x T (all of them, or a chunk of fsdp.mlp_chunk: rows
 * r0.. of a's [N] buffers, gate, up, sw and the MLP adapters' lora_t from their row 0).
 * Adapters' dropout is keyed by (row, position): a chunk is rows (1, n) only without it. */
typedef struct mlp_chunk {
    llama_layer_acts v; /* a, with ln2 and h at row r0 */
    int r0, n, B, T;    /* B x T: n rows as the adapters see them */
} mlp_chunk;

/* The MLP's rows at a time of a's N rows (a carved by llama_layer_acts_carve_part). */
static int mlp_step(const llama_layer_acts *a, int N) { return (int)mlp_rows_of((size_t)N, a->mlp_rows); }

static mlp_chunk mlp_chunk_at(kctx *c, const llama_layout *lo, const llama_layer_acts *a, int r0, int B, int T) {
    size_t at = (size_t)r0 * lo->cfg.hidden_size * k_compute_size(c);
    int N = B * T, step = mlp_step(a, N), n = N - r0 < step ? N - r0 : step;
    mlp_chunk ch = {.v = *a, .r0 = r0, .n = n, .B = n == N ? B : 1, .T = n == N ? T : n};
    ch.v.ln2 = (char *)a->ln2 + at;
    ch.v.h = (char *)a->h + at;
    return ch;
}

/* out = h + down_proj(silu(gate_proj(n)) * up_proj(n)) for chunk ch's rows (out at its row
 * r0); out NULL: up to silu(gate) * up and the down adapter's inner activation (a
 * recomputation). */
static void mlp_chunk_forward(kctx *c, const llama_layout *lo, const llama_layer_weights *w,
                              mlp_chunk *ch, llama_scratch *s, void *out) {
    int n = ch->n, C = lo->cfg.hidden_size, I = lo->cfg.intermediate_size;
    llama_layer_acts *a = &ch->v;
    void *xd = s->lora_xd, *o = out ? (char *)out + (size_t)ch->r0 * C * k_compute_size(c) : NULL;
    if (w->lora) lora_inputs_forward(c, w, LORA_GATE, 2, a->ln2, (void *[]){a->gate, a->up}, a, s, ch->B, ch->T);
    proj_fwd(c, lo, w, a->gate, a->ln2, LLAMA_GATE, n, C, I, lora_on(w, LORA_GATE));
    proj_fwd(c, lo, w, a->up, a->ln2, LLAMA_UP, n, C, I, lora_on(w, LORA_UP));
    k_swiglu_fwd(c, a->sw, a->gate, a->up, (size_t)n * I);
    lora_forward(c, w, LORA_DOWN, a->sw, o, a, xd, ch->B, ch->T);
    if (o) proj_fwd(c, lo, w, o, a->sw, LLAMA_DOWN, n, I, C, lora_on(w, LORA_DOWN));
    if (o) k_accumulate(c, o, a->h, (size_t)n * C);
}

/* out = h + down_proj(silu(gate_proj(n)) * up_proj(n)), n = post_attention_layernorm(h), a
 * chunk of rows at a time; out NULL: a recomputation, up to silu(gate) * up and the down
 * adapter's inner activation (in chunks: up to n, the backward recomputes each chunk). */
static void mlp_forward(kctx *c, const llama_layout *lo, const llama_layer_weights *w,
                        llama_layer_acts *a, llama_scratch *s, void *out, int B, int T) {
    const llama_config *cfg = &lo->cfg;
    int N = B * T, C = cfg->hidden_size;
    k_rmsnorm_fwd(c, a->ln2, a->rstd2, a->h, LAYER_W(LLAMA_LN2), N, C, (float)cfg->rms_norm_eps);
    if (!out && mlp_step(a, N) < N) return;
    for (int r0 = 0; r0 < N; r0 += mlp_step(a, N)) {
        mlp_chunk ch = mlp_chunk_at(c, lo, a, r0, B, T);
        mlp_chunk_forward(c, lo, w, &ch, s, out);
    }
}

void llama_layer_forward(kctx *c, const llama_layout *lo, const llama_layer_weights *w,
                         const float *inv_freq, const k_docs *docs, const void *x, void *out,
                         llama_layer_acts *a, llama_scratch *s, int B, int T) {
    attention_forward(c, lo, w, inv_freq, docs, x, a, s, LLAMA_KEEP_INPUT, B, T);
    mlp_forward(c, lo, w, a, s, out, B, T);
}

void llama_layer_recompute(kctx *c, const llama_layout *lo, const llama_layer_weights *w,
                           const float *inv_freq, const k_docs *docs, const void *x,
                           llama_keep kept, llama_layer_acts *a, llama_scratch *s, int B, int T) {
    if (kept == LLAMA_KEEP_ALL) return;
    if (kept < LLAMA_KEEP_ATTENTION) attention_forward(c, lo, w, inv_freq, docs, x, a, s, kept, B, T);
    mlp_forward(c, lo, w, a, s, NULL, B, T);
}

/* Backward of qk_forward: dx (d/d of q or k as attention saw it) becomes d/d(pre).  Without
 * q/k norms that is dx itself, returned; with them the norm's input gradient is written
 * over x (consumed by the attention's backward) and x returned. */
static void *qk_backward(kctx *c, const llama_layout *lo, const llama_layer_weights *w, int norm,
                         const float *inv_freq, const k_docs *docs, void *dx, void *x,
                         const void *pre, const float *rstd, int B, int T, int H) {
    const llama_config *cfg = &lo->cfg;
    int hd = cfg->head_dim;
    size_t n = (size_t)B * T * H * hd;
    double af = rope_attention_factor(&cfg->rope);
    if (af != 1.0) k_scale(c, dx, (float)af, n);
    k_rope(c, dx, inv_freq, docs, B, T, H, hd, 1);
    if (!cfg->qk_norm) return dx;
    k_zero(c, x, n * k_compute_size(c));
    k_rmsnorm_bwd(c, x, LAYER_DW(norm), dx, pre, LAYER_W(norm), rstd, B * T * H, hd);
    return x;
}

/* Backward of attn_proj_forward: din (+)= dy W_t (and the adapter's), dW_t and the bias's
 * gradient += (unless frozen). */
static void attn_proj_backward(kctx *c, const llama_layout *lo, const llama_layer_weights *w,
                               int t, int bias, const void *x, void *din, const void *dy,
                               const llama_layer_acts *a, llama_scratch *s, int accumulate,
                               int in, int out, int B, int T) {
    int N = B * T;
    float *dbias = lo->cfg.attention_bias ? LAYER_DW(bias) : NULL;
    if (dbias) k_bias_bwd(c, dbias, dy, N, out);
    proj_bwd(c, lo, w, din, t, dy, x, N, in, out, accumulate);
    if (!lora_fused(w, t)) lora_backward(c, w, t, x, din, dy, a, s, B, T);
}

/* Backward of mlp_chunk_forward but the norm: its rows of dresid (d/d(out)) into the rows of
 * s->dln (d/d(n)); the weights' gradients accumulate over the chunks. */
static void mlp_chunk_backward(kctx *c, const llama_layout *lo, const llama_layer_weights *w, mlp_chunk *ch,
                               llama_scratch *s, const void *dresid) {
    int n = ch->n, C = lo->cfg.hidden_size, I = lo->cfg.intermediate_size;
    size_t at = (size_t)ch->r0 * C * k_compute_size(c);
    const llama_layer_acts *a = &ch->v;
    const void *dy = (const char *)dresid + at;
    void *dln = (char *)s->dln + at;
    proj_bwd(c, lo, w, s->dsw, LLAMA_DOWN, dy, a->sw, n, I, C, 0);
    lora_backward(c, w, LORA_DOWN, a->sw, s->dsw, dy, a, s, ch->B, ch->T);
    /* gate and up are consumed here: their gradients take their place (in place: no [n, I]
     * scratch for them). */
    void *dgate = a->gate, *dup = a->up;
    k_swiglu_bwd(c, dgate, dup, s->dsw, a->gate, a->up, (size_t)n * I);
    proj_bwd(c, lo, w, dln, LLAMA_GATE, dgate, a->ln2, n, C, I, 0);
    if (!lora_fused(w, LORA_GATE)) lora_backward(c, w, LORA_GATE, a->ln2, dln, dgate, a, s, ch->B, ch->T);
    proj_bwd(c, lo, w, dln, LLAMA_UP, dup, a->ln2, n, C, I, 1);
    if (!lora_fused(w, LORA_UP)) lora_backward(c, w, LORA_UP, a->ln2, dln, dup, a, s, ch->B, ch->T);
    if (w->lora) lora_inputs_backward(c, w, LORA_GATE, 2, a->ln2, dln, (const void *[]){dgate, dup}, a, s, ch->B, ch->T);
}

void llama_layer_backward(kctx *c, const llama_layout *lo, const llama_layer_weights *w,
                          const float *inv_freq, const k_docs *docs, const void *x,
                          llama_layer_acts *a, llama_scratch *s, void *dresid, int B, int T) {
    const llama_config *cfg = &lo->cfg;
    int N = B * T, C = cfg->hidden_size, hd = cfg->head_dim;
    int Hq = cfg->num_attention_heads, Hkv = cfg->num_key_value_heads;

    /* MLP: dresid holds d/d(out); the residual passes it to h unchanged.  Fresh gradients
     * are written by the first chunk, added to by the others. */
    llama_layer_weights chunks = *w;
    for (int r0 = 0; r0 < N; r0 += mlp_step(a, N)) {
        mlp_chunk ch = mlp_chunk_at(c, lo, a, r0, B, T);
        if (mlp_step(a, N) < N) mlp_chunk_forward(c, lo, w, &ch, s, NULL); /* the chunk recomputed */
        mlp_chunk_backward(c, lo, &chunks, &ch, s, dresid);
        chunks.grads_fresh = 0;
    }
    k_rmsnorm_bwd(c, dresid, LAYER_DW(LLAMA_LN2), s->dln, a->h, LAYER_W(LLAMA_LN2), a->rstd2, N,
                  C);

    /* Attention: dresid now holds d/d(h), which also passes to x unchanged. */
    proj_bwd(c, lo, w, s->datt, LLAMA_O, dresid, a->att, N, Hq * hd, C, 0);
    lora_backward(c, w, LORA_O, a->att, s->datt, dresid, a, s, B, T);
    k_attention_bwd(c, s->dq, s->dk, s->dv, s->datt, a->q, a->k, a->v, a->att, a->lse, docs,
                    cfg->sliding_window, B, T, Hq, Hkv, hd);
    void *dq = qk_backward(c, lo, w, LLAMA_Q_NORM, inv_freq, docs, s->dq, a->q, a->q_pre,
                           a->rstd_q, B, T, Hq);
    void *dk = qk_backward(c, lo, w, LLAMA_K_NORM, inv_freq, docs, s->dk, a->k, a->k_pre,
                           a->rstd_k, B, T, Hkv);
    attn_proj_backward(c, lo, w, LLAMA_Q, LLAMA_Q_BIAS, a->ln1, s->dln, dq, a, s, 0, C, Hq * hd,
                       B, T);
    attn_proj_backward(c, lo, w, LLAMA_K, LLAMA_K_BIAS, a->ln1, s->dln, dk, a, s, 1, C,
                       Hkv * hd, B, T);
    attn_proj_backward(c, lo, w, LLAMA_V, LLAMA_V_BIAS, a->ln1, s->dln, s->dv, a, s, 1, C,
                       Hkv * hd, B, T);
    if (w->lora) lora_inputs_backward(c, w, LORA_Q, 3, a->ln1, s->dln, (const void *[]){dq, dk, s->dv}, a, s, B, T);
    k_rmsnorm_bwd(c, dresid, LAYER_DW(LLAMA_LN1), s->dln, x, LAYER_W(LLAMA_LN1), a->rstd1, N, C);
}

/* ---- head ---- */

/* The head's weights: the final norm's and lm_head's (the embedding's when tied), with
 * their gradients (NULL: frozen). */
typedef struct head_weights {
    const void *norm_w, *head_w;
    float *dnorm_w, *dhead_w;
} head_weights;

static head_weights head_weights_of(kctx *c, const llama_layout *lo, const void *head_params,
                                    float *head_grads, const void *embed_params, float *embed_grads) {
    int hu = llama_head_unit(lo), tied = lo->cfg.tie_word_embeddings;
    return (head_weights){.norm_w = param_at(c, lo, head_params, hu, LLAMA_NORM),
                          .dnorm_w = grad_at(lo, head_grads, hu, LLAMA_NORM),
                          .head_w = tied ? embed_params : param_at(c, lo, head_params, hu, LLAMA_LM_HEAD),
                          .dhead_w = tied ? embed_grads : grad_at(lo, head_grads, hu, LLAMA_LM_HEAD)};
}

void llama_head_spans(kctx *c, const llama_layout *lo, const void *head_params, float *head_grads,
                      const void *embed_params, float *embed_grads, const void *x, llama_head_acts *a,
                      llama_scratch *s, const int32_t *targets, int B, int T, const llama_span *spans,
                      int n_spans, float *sums, int backward, void *dresid) {
    const llama_config *cfg = &lo->cfg;
    int N = B * T, C = cfg->hidden_size, V = cfg->vocab_size;
    head_weights hw = head_weights_of(c, lo, head_params, head_grads, embed_params, embed_grads);
    k_rmsnorm_fwd(c, a->lnf, a->rstd, x, hw.norm_w, N, C, (float)cfg->rms_norm_eps);
    size_t cs = k_compute_size(c), rows = head_rows((size_t)N);
    int sp = 0;
    for (size_t r0 = 0; r0 < (size_t)N; r0 += rows) {
        int n = (int)((size_t)N - r0 < rows ? (size_t)N - r0 : rows), end = (int)r0 + n;
        const char *lnf = (const char *)a->lnf + r0 * C * cs;
        k_linear_fwd(c, a->logits, lnf, hw.head_w, n, C, V);
        /* the spans partition [0, N) in order: those meeting this chunk, each cut to it */
        for (; sp < n_spans && spans[sp].start < end; sp++) {
            const llama_span *q = &spans[sp];
            int a0 = q->start > (int)r0 ? q->start : (int)r0;
            int a1 = q->start + q->n < end ? q->start + q->n : end;
            char *lg = (char *)a->logits + (size_t)(a0 - (int)r0) * V * cs;
            k_cross_entropy(c, &sums[q->slot], backward ? lg : NULL, lg, targets + a0, a1 - a0, V,
                            q->dscale);
            if (q->start + q->n > end) break; /* it goes on in the next chunk */
        }
        if (backward)
            k_linear_bwd(c, (char *)s->dln + r0 * C * cs, hw.dhead_w, a->logits, lnf, hw.head_w, n, C, V, 0);
    }
    if (!backward) return;
    k_zero(c, dresid, (size_t)N * C * k_compute_size(c));
    k_rmsnorm_bwd(c, dresid, hw.dnorm_w, s->dln, x, hw.norm_w, a->rstd, N, C);
}

void llama_head_forward_backward(kctx *c, const llama_layout *lo, const void *head_params,
                                 float *head_grads, const void *embed_params, float *embed_grads,
                                 const void *x, llama_head_acts *a, llama_scratch *s,
                                 const int32_t *targets, int B, int T, float dscale,
                                 float *loss_sum, float *logits_f32, void *dresid) {
    const llama_config *cfg = &lo->cfg;
    int N = B * T, C = cfg->hidden_size, V = cfg->vocab_size;
    head_weights hw = head_weights_of(c, lo, head_params, head_grads, embed_params, embed_grads);
    const void *norm_w = hw.norm_w, *head_w = hw.head_w;
    float *dnorm_w = hw.dnorm_w, *dhead_w = hw.dhead_w;

    k_rmsnorm_fwd(c, a->lnf, a->rstd, x, norm_w, N, C, (float)cfg->rms_norm_eps);
    /* The logits a few rows at a time, each chunk's backward right after its loss: the
     * [N, V] logits never exist whole (2 GiB at Llama 3's vocabulary and 8k tokens). */
    size_t cs = k_compute_size(c), rows = head_rows((size_t)N);
    for (size_t r0 = 0; r0 < (size_t)N; r0 += rows) {
        int n = (int)((size_t)N - r0 < rows ? (size_t)N - r0 : rows);
        const char *lnf = (const char *)a->lnf + r0 * C * cs;
        k_linear_fwd(c, a->logits, lnf, head_w, n, C, V);
        if (logits_f32) k_compute_to_f32(c, logits_f32 + r0 * V, a->logits, (size_t)n * V);
        k_cross_entropy(c, loss_sum, a->logits, a->logits, targets + r0, n, V, dscale);
        k_linear_bwd(c, (char *)s->dln + r0 * C * cs, dhead_w, a->logits, lnf, head_w, n, C, V, 0);
    }
    k_zero(c, dresid, (size_t)N * C * k_compute_size(c));
    k_rmsnorm_bwd(c, dresid, dnorm_w, s->dln, x, norm_w, a->rstd, N, C);
}
