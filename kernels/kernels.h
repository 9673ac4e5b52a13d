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

#include "base/errbuf.h"

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

/* ---- the ops: k_alloc, k_copy_h2d, k_linear_fwd, ... ----
 * Each op is one row of kernels_ops.h, with its contract: K_OP(name, (params), (args))
 * declares void k_<name>(params) here, K_OP_BY_HAND(ret, name, (params)) ret k_<name>(params). */
#define K_OP(name, params, args) void k_##name params;
#define K_OP_BY_HAND(ret, name, params) ret k_##name params;
#include "kernels_ops.h"

/* ---- what is not a backend op ---- */

size_t k_bytes_in_use(const kctx *c); /* context memory allocated now (k_alloc, not freed) */
size_t k_peak_bytes(const kctx *c);   /* the most of it at any time since kctx_init */

/* RoPE frequencies for k_rope, computed on the host: inv_freq[i] = theta^(-2i/hd), with the
 * Llama 3 scaling when p->llama3. */
typedef struct k_rope_params {
    double theta;
    int llama3; /* apply Llama 3 frequency scaling */
    double factor, low_freq_factor, high_freq_factor;
    int original_max_position_embeddings;
} k_rope_params;
void k_rope_inv_freq(const k_rope_params *p, int head_dim, float *host_inv_freq);

/* Host helper: the Hugging Face label shift for k_cross_entropy.  targets[b,t] = labels[b,t+1]
 * for t < T-1 and K_IGNORE_INDEX for t = T-1.  Returns the number of unmasked targets. */
int64_t k_shift_labels(const int32_t *labels, int32_t *targets, int B, int T);

#endif
