/* kernels: the backend-neutral part of kernels.h.
 *
 * Context set-up, the sticky failure record, the host helpers that are the same for every
 * backend, and dispatch: each backend fills one k_ops table with its implementation of every
 * op, and each k_* function forwards to the table of the context's backend.  Adding a
 * backend means writing its functions and one table here. */
#include "kernels/kernels.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_kernels.h"
#ifdef FSDP_HAVE_CUDA
#include "kernels/cuda/cuda_kernels.h"
#endif

typedef struct k_ops {
    void (*sync)(kctx *c); /* NULL: the backend runs every op synchronously */
    void (*destroy)(kctx *c); /* NULL: no backend state */
    void *(*alloc)(kctx *c, size_t bytes, errbuf *err);
    void (*free)(kctx *c, void *p);
    void *(*host_alloc)(kctx *c, size_t bytes, errbuf *err);
    void (*host_free)(kctx *c, void *p);
    void (*copy_h2d)(kctx *c, void *dst, const void *host_src, size_t bytes);
    void (*copy_d2h)(kctx *c, void *host_dst, const void *src, size_t bytes);
    void (*copy_d2d)(kctx *c, void *dst, const void *src, size_t bytes);
    void (*zero)(kctx *c, void *p, size_t bytes);
    void (*f32_to_compute)(kctx *c, void *dst, const float *src, size_t n);
    void (*compute_to_f32)(kctx *c, float *dst, const void *src, size_t n);
    void (*add)(kctx *c, void *out, const void *a, const void *b, size_t n);
    void (*accumulate)(kctx *c, void *dst, const void *src, size_t n);
    void (*add_f32)(kctx *c, float *dst, const float *src, size_t n);
    void (*scale_f32)(kctx *c, float *x, float s, size_t n);
    void (*sumsq_f32)(kctx *c, float *out, const float *x, size_t n);
    void (*embedding_fwd)(kctx *c, void *out, const int32_t *tokens, const void *wte, int N,
                          int C, int V);
    void (*embedding_bwd)(kctx *c, float *dwte, const void *dout, const int32_t *tokens, int N,
                          int C, int V);
    void (*rmsnorm_fwd)(kctx *c, void *out, float *rstd, const void *in, const void *w, int N,
                        int C, float eps);
    void (*rmsnorm_bwd)(kctx *c, void *din, float *dw, const void *dout, const void *in,
                        const void *w, const float *rstd, int N, int C);
    void (*rope)(kctx *c, void *x, const float *inv_freq, int B, int T, int H, int hd,
                 int inverse);
    void (*attention_fwd)(kctx *c, void *out, float *lse, const void *q, const void *k,
                          const void *v, int B, int T, int Hq, int Hkv, int hd);
    void (*attention_bwd)(kctx *c, void *dq, void *dk, void *dv, const void *dout,
                          const void *q, const void *k, const void *v, const void *out,
                          const float *lse, int B, int T, int Hq, int Hkv, int hd);
    void (*swiglu_fwd)(kctx *c, void *out, const void *gate, const void *up, size_t n);
    void (*swiglu_bwd)(kctx *c, void *dgate, void *dup, const void *dout, const void *gate,
                       const void *up, size_t n);
    void (*linear_fwd)(kctx *c, void *out, const void *in, const void *w, int N, int I, int O);
    void (*linear_bwd)(kctx *c, void *din, float *dw, const void *dout, const void *in,
                       const void *w, int N, int I, int O, int accumulate_din);
    void (*cross_entropy)(kctx *c, float *loss_sum, void *dlogits, const void *logits,
                          const int32_t *targets, int N, int V, float dscale);
    void (*adamw)(kctx *c, float *p, const float *grad, float *m, float *v, size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int step,
                  float grad_scale);
} k_ops;

static const k_ops cpu_ops = {
    .sync = NULL,
    .destroy = NULL,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .host_alloc = cpu_alloc,
    .host_free = cpu_free,
    .copy_h2d = cpu_copy,
    .copy_d2h = cpu_copy,
    .copy_d2d = cpu_copy,
    .zero = cpu_zero,
    .f32_to_compute = cpu_f32_to_compute,
    .compute_to_f32 = cpu_compute_to_f32,
    .add = cpu_add,
    .accumulate = cpu_accumulate,
    .add_f32 = cpu_add_f32,
    .scale_f32 = cpu_scale_f32,
    .sumsq_f32 = cpu_sumsq_f32,
    .embedding_fwd = cpu_embedding_fwd,
    .embedding_bwd = cpu_embedding_bwd,
    .rmsnorm_fwd = cpu_rmsnorm_fwd,
    .rmsnorm_bwd = cpu_rmsnorm_bwd,
    .rope = cpu_rope,
    .attention_fwd = cpu_attention_fwd,
    .attention_bwd = cpu_attention_bwd,
    .swiglu_fwd = cpu_swiglu_fwd,
    .swiglu_bwd = cpu_swiglu_bwd,
    .linear_fwd = cpu_linear_fwd,
    .linear_bwd = cpu_linear_bwd,
    .cross_entropy = cpu_cross_entropy,
    .adamw = cpu_adamw,
};

#ifdef FSDP_HAVE_CUDA
static const k_ops cuda_ops = {
    .sync = kcuda_sync,
    .destroy = kcuda_destroy,
    .alloc = kcuda_alloc,
    .free = kcuda_free,
    .host_alloc = kcuda_host_alloc,
    .host_free = kcuda_host_free,
    .copy_h2d = kcuda_copy_h2d,
    .copy_d2h = kcuda_copy_d2h,
    .copy_d2d = kcuda_copy_d2d,
    .zero = kcuda_zero,
    .f32_to_compute = kcuda_f32_to_compute,
    .compute_to_f32 = kcuda_compute_to_f32,
    .add = kcuda_add,
    .accumulate = kcuda_accumulate,
    .add_f32 = kcuda_add_f32,
    .scale_f32 = kcuda_scale_f32,
    .sumsq_f32 = kcuda_sumsq_f32,
    .embedding_fwd = kcuda_embedding_fwd,
    .embedding_bwd = kcuda_embedding_bwd,
    .rmsnorm_fwd = kcuda_rmsnorm_fwd,
    .rmsnorm_bwd = kcuda_rmsnorm_bwd,
    .rope = kcuda_rope,
    .attention_fwd = kcuda_attention_fwd,
    .attention_bwd = kcuda_attention_bwd,
    .swiglu_fwd = kcuda_swiglu_fwd,
    .swiglu_bwd = kcuda_swiglu_bwd,
    .linear_fwd = kcuda_linear_fwd,
    .linear_bwd = kcuda_linear_bwd,
    .cross_entropy = kcuda_cross_entropy,
    .adamw = kcuda_adamw,
};
#endif

/* The table of a context's backend.  kctx_init only accepts backends that have one, and a
 * zeroed kctx is a CPU context, so this never fails for a context in use. */
static const k_ops *ops(const kctx *c) {
#ifdef FSDP_HAVE_CUDA
    if (c->backend == K_CUDA) return &cuda_ops;
#else
    (void)c;
#endif
    return &cpu_ops;
}

/* ---- context and failures ---- */

int k_cuda_available(void) {
#ifdef FSDP_HAVE_CUDA
    return kcuda_device_count();
#else
    return 0;
#endif
}

int kctx_init(kctx *c, k_backend backend, int device, errbuf *err) {
    memset(c, 0, sizeof *c);
    c->device = device;
    switch (backend) {
    case K_CPU:
        c->backend = K_CPU;
        c->compute = K_F32;
        return 0;
    case K_CUDA:
#ifdef FSDP_HAVE_CUDA
        /* stream, cuBLASLt handle and workspace, error report; bf16 compute */
        c->backend = K_CUDA;
        c->compute = K_BF16;
        if (kcuda_init(c, device, err)) {
            memset(c, 0, sizeof *c);
            return -1;
        }
        return 0;
#else
        return errf(err, "CUDA backend: this build has no CUDA (nvcc was not found at build time)");
#endif
    }
    return errf(err, "kernels: unknown backend %d", (int)backend);
}

void kctx_destroy(kctx *c) {
    if (ops(c)->destroy) ops(c)->destroy(c);
    free(c->blocks);
    memset(c, 0, sizeof *c);
}

size_t k_compute_size(const kctx *c) {
    return c->compute == K_BF16 ? 2 : 4;
}

void k_fail(kctx *c, const char *fmt, ...) {
    if (c->failed) return; /* the first failure is the one worth reporting */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->failure, sizeof c->failure, fmt, ap);
    va_end(ap);
    c->failed = 1;
}

int k_check(kctx *c, errbuf *err) {
    if (!c->failed) return 0;
    c->failed = 0;
    return errf(err, "%s", c->failure);
}

int k_sync(kctx *c, errbuf *err) {
    if (ops(c)->sync) ops(c)->sync(c);
    return k_check(c, err);
}

/* ---- host helpers (the same for every backend) ---- */

/* inv_freq[i] = theta^(-2i/hd); Llama 3 scaling as transformers' _compute_llama3_parameters:
 * wavelengths longer than original/low_freq_factor are slowed down by factor, those shorter
 * than original/high_freq_factor are kept, and those in between are interpolated. */
void k_rope_inv_freq(const k_rope_params *p, int head_dim, float *host_inv_freq) {
    double orig = p->original_max_position_embeddings;
    double low_freq_wavelen = orig / p->low_freq_factor;
    double high_freq_wavelen = orig / p->high_freq_factor;
    for (int i = 0; i < head_dim / 2; i++) {
        double inv_freq = 1.0 / pow(p->theta, 2.0 * i / head_dim);
        if (p->llama3) {
            double wavelen = 2.0 * M_PI / inv_freq;
            if (wavelen > low_freq_wavelen) {
                inv_freq /= p->factor;
            } else if (wavelen >= high_freq_wavelen) {
                double smooth = (orig / wavelen - p->low_freq_factor) /
                                (p->high_freq_factor - p->low_freq_factor);
                inv_freq = (1.0 - smooth) * inv_freq / p->factor + smooth * inv_freq;
            }
        }
        host_inv_freq[i] = (float)inv_freq;
    }
}

int64_t k_shift_labels(const int32_t *labels, int32_t *targets, int B, int T) {
    int64_t count = 0;
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            int32_t label = t + 1 < T ? labels[(size_t)b * T + t + 1] : K_IGNORE_INDEX;
            targets[(size_t)b * T + t] = label;
            if (label != K_IGNORE_INDEX) count++;
        }
    }
    return count;
}

/* ---- dispatch ---- */

/* ---- context memory, and the count of it ---- */

struct k_block {
    void *p;
    size_t bytes;
};

/* Remembers block p of `bytes` (a job makes a few dozen, long-lived: a list will do). */
static int remember_block(kctx *c, void *p, size_t bytes) {
    if (c->n_blocks == c->cap_blocks) {
        int cap = c->cap_blocks ? 2 * c->cap_blocks : 32;
        k_block *grown = realloc(c->blocks, (size_t)cap * sizeof *grown);
        if (!grown) return -1;
        c->blocks = grown;
        c->cap_blocks = cap;
    }
    c->blocks[c->n_blocks++] = (k_block){p, bytes};
    c->bytes_in_use += bytes;
    if (c->bytes_in_use > c->peak_bytes) c->peak_bytes = c->bytes_in_use;
    return 0;
}

static void forget_block(kctx *c, void *p) {
    for (int i = c->n_blocks - 1; i >= 0; i--)
        if (c->blocks[i].p == p) {
            c->bytes_in_use -= c->blocks[i].bytes;
            c->blocks[i] = c->blocks[--c->n_blocks];
            return;
        }
}

void *k_alloc(kctx *c, size_t bytes, errbuf *err) {
    void *p = ops(c)->alloc(c, bytes, err);
    if (p && remember_block(c, p, bytes)) {
        ops(c)->free(c, p);
        errf(err, "out of host memory counting context memory");
        return NULL;
    }
    return p;
}
void k_free(kctx *c, void *p) {
    if (!p) return;
    forget_block(c, p);
    ops(c)->free(c, p);
}
size_t k_bytes_in_use(const kctx *c) { return c->bytes_in_use; }
size_t k_peak_bytes(const kctx *c) { return c->peak_bytes; }
void *k_host_alloc(kctx *c, size_t bytes, errbuf *err) {
    return ops(c)->host_alloc(c, bytes, err);
}
void k_host_free(kctx *c, void *p) {
    if (p) ops(c)->host_free(c, p);
}
void k_copy_h2d(kctx *c, void *dst, const void *host_src, size_t bytes) {
    ops(c)->copy_h2d(c, dst, host_src, bytes);
}
void k_copy_d2h(kctx *c, void *host_dst, const void *src, size_t bytes) {
    ops(c)->copy_d2h(c, host_dst, src, bytes);
}
void k_copy_d2d(kctx *c, void *dst, const void *src, size_t bytes) {
    ops(c)->copy_d2d(c, dst, src, bytes);
}
void k_zero(kctx *c, void *p, size_t bytes) {
    ops(c)->zero(c, p, bytes);
}
void k_f32_to_compute(kctx *c, void *dst, const float *src, size_t n) {
    ops(c)->f32_to_compute(c, dst, src, n);
}
void k_compute_to_f32(kctx *c, float *dst, const void *src, size_t n) {
    ops(c)->compute_to_f32(c, dst, src, n);
}
void k_add(kctx *c, void *out, const void *a, const void *b, size_t n) {
    ops(c)->add(c, out, a, b, n);
}
void k_accumulate(kctx *c, void *dst, const void *src, size_t n) {
    ops(c)->accumulate(c, dst, src, n);
}

void k_add_f32(kctx *c, float *dst, const float *src, size_t n) {
    ops(c)->add_f32(c, dst, src, n);
}
void k_scale_f32(kctx *c, float *x, float s, size_t n) {
    ops(c)->scale_f32(c, x, s, n);
}
void k_sumsq_f32(kctx *c, float *out, const float *x, size_t n) {
    ops(c)->sumsq_f32(c, out, x, n);
}
void k_embedding_fwd(kctx *c, void *out, const int32_t *tokens, const void *wte, int N, int C,
                     int V) {
    ops(c)->embedding_fwd(c, out, tokens, wte, N, C, V);
}
void k_embedding_bwd(kctx *c, float *dwte, const void *dout, const int32_t *tokens, int N, int C,
                     int V) {
    ops(c)->embedding_bwd(c, dwte, dout, tokens, N, C, V);
}
void k_rmsnorm_fwd(kctx *c, void *out, float *rstd, const void *in, const void *w, int N, int C,
                   float eps) {
    ops(c)->rmsnorm_fwd(c, out, rstd, in, w, N, C, eps);
}
void k_rmsnorm_bwd(kctx *c, void *din, float *dw, const void *dout, const void *in, const void *w,
                   const float *rstd, int N, int C) {
    ops(c)->rmsnorm_bwd(c, din, dw, dout, in, w, rstd, N, C);
}
void k_rope(kctx *c, void *x, const float *inv_freq, int B, int T, int H, int hd, int inverse) {
    ops(c)->rope(c, x, inv_freq, B, T, H, hd, inverse);
}
void k_attention_fwd(kctx *c, void *out, float *lse, const void *q, const void *k, const void *v,
                     int B, int T, int Hq, int Hkv, int hd) {
    ops(c)->attention_fwd(c, out, lse, q, k, v, B, T, Hq, Hkv, hd);
}
void k_attention_bwd(kctx *c, void *dq, void *dk, void *dv, const void *dout, const void *q,
                     const void *k, const void *v, const void *out, const float *lse, int B, int T,
                     int Hq, int Hkv, int hd) {
    ops(c)->attention_bwd(c, dq, dk, dv, dout, q, k, v, out, lse, B, T, Hq, Hkv, hd);
}
void k_swiglu_fwd(kctx *c, void *out, const void *gate, const void *up, size_t n) {
    ops(c)->swiglu_fwd(c, out, gate, up, n);
}
void k_swiglu_bwd(kctx *c, void *dgate, void *dup, const void *dout, const void *gate,
                  const void *up, size_t n) {
    ops(c)->swiglu_bwd(c, dgate, dup, dout, gate, up, n);
}
void k_linear_fwd(kctx *c, void *out, const void *in, const void *w, int N, int I, int O) {
    ops(c)->linear_fwd(c, out, in, w, N, I, O);
}
void k_linear_bwd(kctx *c, void *din, float *dw, const void *dout, const void *in, const void *w,
                  int N, int I, int O, int accumulate_din) {
    ops(c)->linear_bwd(c, din, dw, dout, in, w, N, I, O, accumulate_din);
}
void k_cross_entropy(kctx *c, float *loss_sum, void *dlogits, const void *logits,
                     const int32_t *targets, int N, int V, float dscale) {
    ops(c)->cross_entropy(c, loss_sum, dlogits, logits, targets, N, V, dscale);
}
void k_adamw(kctx *c, float *p, const float *grad, float *m, float *v, size_t n, float lr,
             float beta1, float beta2, float eps, float weight_decay, int step, float grad_scale) {
    ops(c)->adamw(c, p, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, step, grad_scale);
}
