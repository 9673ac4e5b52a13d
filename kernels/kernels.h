/* kernels: every op of a Llama training step behind one backend-neutral C API.
 *
 * A kctx carries the backend (CPU reference in fp32, CUDA in bf16) and, for CUDA, the
 * device and stream.  Buffers passed to ops live in the context's memory (host memory for
 * the CPU backend, device memory for CUDA) and come in two kinds:
 *   - `void *` buffers hold the context's compute dtype (kctx.compute: F32 on the CPU,
 *     BF16 on CUDA): activations, their gradients and gathered parameter copies;
 *   - `float *` buffers are always fp32: parameter gradients (accumulated, +=), master
 *     weights, optimizer state and small statistics (RMSNorm rstd, attention log-sum-exp).
 * Accumulation is always in fp32.
 *
 * Ops return nothing: like CUDA launches they may fail asynchronously, so a failure is
 * recorded in the context (the first one wins) and reported by k_sync()/k_check().
 *
 * Shapes: N = B*T token rows; C = hidden size; row-major throughout.  Linear weights use
 * the Hugging Face layout W[out, in], so y = x W^T.  Attention tensors are [B, T, H, hd]
 * (what a projection of [N, H*hd] gives, so no transposes). */
#ifndef FSDP_KERNELS_H
#define FSDP_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "../proto/errbuf.h"

typedef enum k_backend { K_CPU = 0, K_CUDA = 1 } k_backend;
typedef enum k_dtype { K_F32 = 0, K_BF16 = 1 } k_dtype;

#define K_IGNORE_INDEX (-100)

typedef struct k_block k_block;

typedef struct kctx {
    k_backend backend;
    k_dtype compute;
    int device;      /* CUDA device ordinal */
    void *stream;    /* cudaStream_t for CUDA */
    void *impl;      /* backend state (cuBLASLt handle, workspace, ...) */
    int failed;      /* sticky: the first failure since the last k_check */
    char failure[512];
    /* What k_alloc handed out and k_free did not take back (the backend's own workspace
     * not counted), and the most at any time; read them with k_bytes_in_use/k_peak_bytes. */
    size_t bytes_in_use, peak_bytes;
    k_block *blocks; /* each live block and its size */
    int n_blocks, cap_blocks;
} kctx;

/* Whether this build has the CUDA backend, and how many devices it sees (0 without). */
int k_cuda_available(void);

int kctx_init(kctx *c, k_backend backend, int device, errbuf *err);
void kctx_destroy(kctx *c);
size_t k_compute_size(const kctx *c); /* bytes per element of the compute dtype */

/* Records a failure in c (first wins).  For backends, not for callers. */
void k_fail(kctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Reports and clears the sticky failure: 0 when none. */
int k_check(kctx *c, errbuf *err);
/* Waits for queued work, then k_check. */
int k_sync(kctx *c, errbuf *err);

/* ---- memory (in the context's memory space) ---- */
void *k_alloc(kctx *c, size_t bytes, errbuf *err); /* zeroed */
void k_free(kctx *c, void *p);
size_t k_bytes_in_use(const kctx *c); /* context memory allocated now (k_alloc, not freed) */
size_t k_peak_bytes(const kctx *c);   /* the most of it at any time since kctx_init */
/* Host memory the backend copies fastest from and to (pinned on CUDA), zeroed. */
void *k_host_alloc(kctx *c, size_t bytes, errbuf *err);
void k_host_free(kctx *c, void *p);
void k_copy_h2d(kctx *c, void *dst, const void *host_src, size_t bytes);
void k_copy_d2h(kctx *c, void *host_dst, const void *src, size_t bytes); /* synchronous */
void k_copy_d2d(kctx *c, void *dst, const void *src, size_t bytes);
void k_zero(kctx *c, void *p, size_t bytes);

/* ---- casts and elementwise ---- */
void k_f32_to_compute(kctx *c, void *dst, const float *src, size_t n);
void k_compute_to_f32(kctx *c, float *dst, const void *src, size_t n);
void k_add(kctx *c, void *out, const void *a, const void *b, size_t n); /* out = a + b */
void k_accumulate(kctx *c, void *dst, const void *src, size_t n);       /* dst += src */
void k_add_f32(kctx *c, float *dst, const float *src, size_t n);        /* dst += src, fp32 */
void k_scale_f32(kctx *c, float *x, float s, size_t n);                 /* x *= s */
/* *out += sum(x^2), accumulated in double on the CPU; out is one fp32 in context memory. */
void k_sumsq_f32(kctx *c, float *out, const float *x, size_t n);

/* ---- embedding ---- */
/* out[n,:] = wte[tokens[n],:].  Tokens must be in [0, V) (checked on the CPU). */
void k_embedding_fwd(kctx *c, void *out, const int32_t *tokens, const void *wte, int N, int C,
                     int V);
/* dwte[tokens[n],:] += dout[n,:] (deterministic order). */
void k_embedding_bwd(kctx *c, float *dwte, const void *dout, const int32_t *tokens, int N, int C,
                     int V);

/* ---- RMSNorm: out = in * rstd * w, rstd = 1/sqrt(mean(in^2) + eps) ---- */
void k_rmsnorm_fwd(kctx *c, void *out, float *rstd, const void *in, const void *w, int N, int C,
                   float eps);
/* din += d/din; dw += d/dw. */
void k_rmsnorm_bwd(kctx *c, void *din, float *dw, const void *dout, const void *in, const void *w,
                   const float *rstd, int N, int C);

/* ---- RoPE (Hugging Face rotate_half convention: pairs (i, i + hd/2)) ----
 * x is [B, T, H, hd], rotated in place by angle pos * inv_freq[i], pos = t (0..T-1);
 * inverse != 0 rotates by the negative angle, which is the backward pass.
 * inv_freq is fp32 [hd/2] in context memory; k_rope_inv_freq fills it on the host. */
void k_rope(kctx *c, void *x, const float *inv_freq, int B, int T, int H, int hd, int inverse);
typedef struct k_rope_params {
    double theta;
    int llama3; /* apply Llama 3 frequency scaling */
    double factor, low_freq_factor, high_freq_factor;
    int original_max_position_embeddings;
} k_rope_params;
void k_rope_inv_freq(const k_rope_params *p, int head_dim, float *host_inv_freq);

/* ---- causal attention with grouped-query heads ----
 * q [B,T,Hq,hd], k/v [B,T,Hkv,hd], Hq % Hkv == 0 (query head h uses kv head h / (Hq/Hkv)),
 * scale 1/sqrt(hd).  lse [B,Hq,T] (fp32) is saved for the backward pass. */
void k_attention_fwd(kctx *c, void *out, float *lse, const void *q, const void *k, const void *v,
                     int B, int T, int Hq, int Hkv, int hd);
/* Writes (overwrites) dq, dk, dv. */
void k_attention_bwd(kctx *c, void *dq, void *dk, void *dv, const void *dout, const void *q,
                     const void *k, const void *v, const void *out, const float *lse, int B, int T,
                     int Hq, int Hkv, int hd);

/* ---- SwiGLU: out = silu(gate) * up ---- */
void k_swiglu_fwd(kctx *c, void *out, const void *gate, const void *up, size_t n);
/* Writes (overwrites) dgate and dup. */
void k_swiglu_bwd(kctx *c, void *dgate, void *dup, const void *dout, const void *gate,
                  const void *up, size_t n);

/* ---- linear layers (GEMM): out[N,O] = in[N,I] W[O,I]^T ---- */
void k_linear_fwd(kctx *c, void *out, const void *in, const void *w, int N, int I, int O);
/* din = dout W (accumulate_din: din += ...), skipped when din is NULL;
 * dw += dout^T in, skipped when dw is NULL. */
void k_linear_bwd(kctx *c, void *din, float *dw, const void *dout, const void *in, const void *w,
                  int N, int I, int O, int accumulate_din);

/* ---- cross-entropy ----
 * targets[n] is the label for row n (already shifted) or K_IGNORE_INDEX.
 * *loss_sum (one fp32 in context memory) += sum of -log softmax(logits[n])[targets[n]]
 * over unmasked rows.  When dlogits is not NULL it receives
 * dscale * (softmax - onehot) for unmasked rows and 0 for masked ones; dlogits may be
 * the logits buffer itself (in place). */
void k_cross_entropy(kctx *c, float *loss_sum, void *dlogits, const void *logits,
                     const int32_t *targets, int N, int V, float dscale);
/* Host helper: the Hugging Face label shift.  targets[b,t] = labels[b,t+1] for t < T-1 and
 * K_IGNORE_INDEX for t = T-1.  Returns the number of unmasked targets. */
int64_t k_shift_labels(const int32_t *labels, int32_t *targets, int B, int T);

/* ---- AdamW (PyTorch semantics) over fp32 shards ----
 * g_eff = grad * grad_scale; p -= lr*wd*p; m = b1 m + (1-b1) g_eff;
 * v = b2 v + (1-b2) g_eff^2; p -= (lr / (1-b1^step)) * m / (sqrt(v)/sqrt(1-b2^step) + eps).
 * step counts from 1. */
void k_adamw(kctx *c, float *p, const float *grad, float *m, float *v, size_t n, float lr,
             float beta1, float beta2, float eps, float weight_decay, int step, float grad_scale);

#endif
