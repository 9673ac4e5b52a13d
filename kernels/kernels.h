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
 * The context type and its failure record (k_fail, k_check) are in kctx.h.
 *
 * Shapes: N = B*T token rows; C = hidden size; row-major throughout.  Linear weights use
 * the Hugging Face layout W[out, in], so y = x W^T.  Attention tensors are [B, T, H, hd]
 * (what a projection of [N, H*hd] gives, so no transposes). */
#ifndef FSDP_KERNELS_H
#define FSDP_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kctx.h" /* kctx, k_backend, k_dtype, K_IGNORE_INDEX, k_fail, k_check */

/* Whether this build has the CUDA backend, and how many devices it sees (0 without). */
int k_cuda_available(void);
/* Device `device`'s memory in bytes (0 without CUDA or that device); creates no context. */
size_t k_cuda_device_memory(int device);

int kctx_init(kctx *c, k_backend backend, int device, errbuf *err);
void kctx_destroy(kctx *c);
/* Waits for queued work, then k_check. */
int k_sync(kctx *c, errbuf *err);

/* ---- the ops: k_alloc, k_copy_h2d, k_linear_fwd, ... ----
 * Each op is one row of kernels_ops.h, with its contract: K_OP(name, (params), (args))
 * declares void k_<name>(params) here, K_OP_BY_HAND(ret, name, (params)) ret k_<name>(params).
 * The ops it declares (for grep and ctags, which do not expand the rows; tests/integration/
 * test_layers.sh checks this list against kernels_ops.h):
 *   k_alloc k_free k_host_alloc k_host_free k_copy_h2d k_copy_h2d_start k_copy_h2d_wait
 *   k_host_register k_host_unregister k_copy_d2h k_zero k_f32_to_compute k_compute_to_f32
 *   k_accumulate k_add_f32 k_sumsq_f32 k_embedding_fwd k_embedding_bwd k_rmsnorm_fwd
 *   k_rmsnorm_bwd k_rope k_attention_fwd k_attention_bwd k_attention_kv k_swiglu_fwd
 *   k_swiglu_bwd k_linear_fwd_ld k_linear_bwd_ld k_bias_fwd k_bias_bwd k_scale k_dropout
 *   k_nf4_dequant k_fp8_cast k_fp8_cast_t k_fp8_amax_f32 k_fp8_cast_f32 k_fp8_transpose k_fp8_gemm k_cross_entropy k_adamw */
#define K_OP(name, params, args) void k_##name params;
#define K_OP_BY_HAND(ret, name, params) ret k_##name params;
#include "kernels_ops.h"

/* ---- what is not a backend op ---- */

/* The linear ops on packed operands (rows I apart): out = in W^T, out += in W^T, and the
 * backward. */
static inline void k_linear_fwd(kctx *c, void *out, const void *in, const void *w, int N, int I, int O) {
    k_linear_fwd_ld(c, out, in, I, w, N, I, O, 0);
}
static inline void k_linear_fwd_acc(kctx *c, void *out, const void *in, const void *w, int N, int I,
                                    int O) {
    k_linear_fwd_ld(c, out, in, I, w, N, I, O, 1);
}
static inline void k_linear_bwd(kctx *c, void *din, float *dw, const void *dout, const void *in,
                                const void *w, int N, int I, int O, int accumulate_din) {
    k_linear_bwd_ld(c, din, dw, dout, in, I, w, N, I, O, accumulate_din, 1);
}

size_t k_bytes_in_use(const kctx *c); /* context memory allocated now (k_alloc, not freed) */
size_t k_peak_bytes(const kctx *c);   /* the most of it at any time since kctx_init */
/* At most `bytes` of context memory from here on (runtime.gpu_memory_limit; 0: no limit):
 * k_alloc refuses, with a message naming the request, what is in use and the limit, an
 * allocation that would bring k_bytes_in_use past it. */
void k_set_memory_limit(kctx *c, size_t bytes);
/* Tests, the CPU backend: from here on k_copy_h2d_start's copies run at the next
 * k_copy_h2d_wait or k_sync, as late as a GPU's copy stream may run them (the CPU otherwise
 * copies at once), so that a consumer that does not wait reads stale data and a source
 * overwritten before the wait is copied overwritten.  0, or -1 when out of memory or on
 * another backend. */
int k_cpu_defer_copies(kctx *c, errbuf *err);

/* RoPE frequencies for k_rope, computed on the host as transformers' modeling_rope_utils
 * does: inv_freq[i] = theta^(-2i/hd), with the scaling of p->kind. */
typedef enum k_rope_kind { K_ROPE_DEFAULT, K_ROPE_LLAMA3, K_ROPE_LINEAR, K_ROPE_YARN } k_rope_kind;
typedef struct k_rope_params {
    double theta;
    k_rope_kind kind;
    double factor;                        /* llama3, linear, yarn */
    double low_freq_factor, high_freq_factor; /* llama3 */
    int original_max_position_embeddings; /* llama3, yarn */
    double beta_fast, beta_slow;          /* yarn */
    int truncate;                         /* yarn: the correction range rounded outwards */
} k_rope_params;
void k_rope_inv_freq(const k_rope_params *p, int head_dim, float *host_inv_freq);

/* Host helper: the Hugging Face label shift for k_cross_entropy.  targets[b,t] = labels[b,t+1]
 * for t < T-1 and K_IGNORE_INDEX for t = T-1.  Returns the number of unmasked targets. */
int64_t k_shift_labels(const int32_t *labels, int32_t *targets, int B, int T);

#endif
