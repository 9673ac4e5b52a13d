/* The CUDA backend of kernels.h (built on kctx.h, never including kernels.h): bf16 storage,
 * fp32 accumulation.
 *
 * Compute dtype is K_BF16, so every `void *` buffer of kernels.h is a __nv_bfloat16 array in
 * device memory; `float *` buffers are fp32 device memory.  Every op is queued on the
 * context's stream; failures (launch errors, cuBLASLt status codes, bad tokens or targets
 * found on the device) are recorded with k_fail and reported by k_sync.
 *
 * The first part is the C interface that kernels/kernels.c dispatches to: cuda_<name> has
 * the signature and contract of the op k_<name> (kernels/kernels_ops.h).  The second part
 * (compiled only by nvcc) is what the .cu files share: the context's backend state and small
 * device helpers. */
#ifndef FSDP_CUDA_KERNELS_H
#define FSDP_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "base/errbuf.h"
#include "kernels/kctx.h"

/* cuda_device.cu: devices and contexts (what kctx_init, kctx_destroy and k_sync call) */
int cuda_device_count(void); /* usable devices; 0 when there is no driver or no device */
size_t cuda_device_memory(int device); /* its bytes; 0 when it does not exist */
/* Sets up c (backend and compute already set by kctx_init) on `device`: the calling thread's
 * current device becomes `device`, and later calls on c must come from a thread whose
 * current device it is. */
int cuda_init(kctx *c, int device, errbuf *err);
void cuda_destroy(kctx *c);
void cuda_sync(kctx *c);
/* Test hook for the comm watchdog: a kernel on `stream` (a cudaStream_t) that spins until
 * *flag (mapped pinned memory) becomes non-zero. */
void cuda_test_spin(void *stream, int *flag);

/* cuda_<name> for every op of kernels_ops.h.  Where they are: cuda_device.cu (memory and
 * copies), cuda_elementwise.cu (casts, accumulate, scale, add_f32, sumsq_f32, SwiGLU,
 * dropout),
 * cuda_embedding.cu, cuda_norm_rope.cu (RMSNorm, RoPE), cuda_attention.cu (head dim 64 or
 * 128; buffers 16-byte aligned; the others go to cuda_attention_generic.cu), cuda_linear.cu
 * (cuBLASLt; the FP8 GEMM too), cuda_fp8.cu (FP8 casts), cuda_loss_optim.cu (cross-entropy,
 * AdamW), cuda_nf4.cu (NF4 dequantization), cuda_attention_kv.cu (attention over a KV cache). */
#define K_OP(name, params, args) void cuda_##name params;
#define K_OP_BY_HAND(ret, name, params) ret cuda_##name params;
#include "kernels/kernels_ops.h"

/* The plain attention for head dims the tensor-core kernels do not take
 * (cuda_attention_generic.cu): any even head dim up to 256.  Same contract as the op. */
int cuda_attention_generic_supports(int hd);
void cuda_attention_generic_fwd(kctx *c, void *out, float *lse, const void *q, const void *k,
                                const void *v, const k_docs *docs, int window, int B, int T,
                                int Hq, int Hkv, int hd);
void cuda_attention_generic_bwd(kctx *c, void *dq, void *dk, void *dv, const void *dout,
                                const void *q, const void *k, const void *v, const void *out,
                                const float *lse, const k_docs *docs, int window, int B, int T,
                                int Hq, int Hkv, int hd);

/* The sm_90a attention (cuda_attention_sm90.cu; cuda_attention.cu dispatches to it).  setup
 * sets attention_sm90 on a compute capability 9.0 device unless FSDP_CUDA_ATTENTION=mma (the
 * mma.sync kernels; "wgmma" or unset: the default), and fails on any other value.  fwd has
 * the op's contract for hd 64 and 128; bwd that of the backward, given delta and lse2
 * (cuda_attention.cu's delta kernel, rows padded to Tp). */
int cuda_attention_sm90_setup(kctx *c, int device, errbuf *err);
void cuda_attention_sm90_fwd(kctx *c, void *out, float *lse, const void *q, const void *k,
                             const void *v, const k_docs *docs, int window, int B, int T, int Hq,
                             int Hkv, int hd);
void cuda_attention_sm90_bwd(kctx *c, void *dq, void *dk, void *dv, const void *dout,
                             const void *q, const void *k, const void *v, const float *lse2,
                             const float *delta, int Tp, void *scratch, const k_docs *docs,
                             int window, int B, int T, int Hq, int Hkv, int hd);
/* The bytes of scratch cuda_attention_sm90_bwd needs (16-byte aligned): dQ's fp32
 * accumulators for the kv heads of one launch, and their semaphores. */
size_t cuda_attention_sm90_bwd_scratch(int B, int Tp, int Hq, int Hkv, int hd);

#ifdef __cplusplus
}
#endif

/* ---- shared by the .cu files only ---- */
#ifdef __CUDACC__

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

typedef __nv_bfloat16 bf16;

/* Bad input found by a kernel (a token or target outside the vocabulary).  The first one is
 * kept in device memory and turned into a k_fail message by cuda_sync. */
enum cuda_input_error_code {
    CUDA_INPUT_OK = 0,
    CUDA_EMBEDDING_TOKEN,
    CUDA_EMBEDDING_BWD_TOKEN,
    CUDA_CE_TARGET
};
typedef struct cuda_input_error {
    int code;
    int value, row, limit;
} cuda_input_error;

/* One cached cuBLASLt matmul configuration (descriptors and the heuristic's algorithm). */
typedef struct cuda_gemm {
    int used;
    int m, n, k, trans_a, trans_b, align_a, align_b, align_c;
    int ld_a, ld_b, ld_c; /* leading dimensions (column-major): packed, or a slice's */
    cudaDataType_t type_a, type_b, out_type; /* bf16 A and B, or fp8 (k_fp8_gemm) */
    int scale_mode; /* fp8: the cublasLtMatmulMatrixScale_t of A and B; else -1 */
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t layout_a, layout_b, layout_c;
    cublasLtMatmulAlgo_t algo;
} cuda_gemm;

#define CUDA_GEMM_CACHE 64

/* The backend state behind kctx.impl. */
/* A copy lane (k_copy_h2d_start): its stream and, for the last COPY_EVENTS copies, an event
 * recorded after each (copy t's is done[(t - 1) % COPY_EVENTS]).  A wait for a copy older
 * than that waits for the newer copy now recorded in its event: later, never too early. */
#define COPY_EVENTS 8
typedef struct cuda_copy_lane {
    cudaStream_t stream;
    cudaEvent_t done[COPY_EVENTS];
    uint64_t started;
} cuda_copy_lane;

typedef struct cuda_impl {
    cudaStream_t stream;
    cublasLtHandle_t lt;
    void *workspace; /* cuBLASLt's */
    size_t workspace_bytes;
    void *scratch; /* reductions' partial results; grows on demand */
    size_t scratch_bytes;
    cuda_input_error *error; /* device memory */
    int smem_optin;          /* the most dynamic shared memory a block may have */
    int sm_count;            /* streaming multiprocessors (persistent kernels' grids) */
    int attention_sm90;      /* attention runs cuda_attention_sm90.cu's kernels (sm_90 device) */
    void *tensor_map_encode; /* the driver's cuTensorMapEncodeTiled, when attention_sm90 */
    cuda_copy_lane copy_lanes[K_COPY_LANES]; /* k_copy_h2d_start's, made on first use */
    cudaEvent_t copy_ready;
    cuda_gemm gemms[CUDA_GEMM_CACHE];
    int next_evict;
} cuda_impl;

static inline cuda_impl *cuda_state(const kctx *c) {
    return (cuda_impl *)c->impl;
}
static inline cudaStream_t cuda_stream(const kctx *c) {
    return cuda_state(c)->stream;
}

/* Records a failed launch of `what` (the last error of this thread) in c. */
void cuda_check_launch(kctx *c, const char *what);
/* Records a failed CUDA call; returns nonzero when it failed. */
int cuda_check_call(kctx *c, cudaError_t e, const char *what);
/* A device buffer of at least `bytes` shared by the ops of c (stream-ordered, so one op's
 * use never overlaps another's).  NULL after a k_fail. */
void *cuda_scratch(kctx *c, size_t bytes, const char *what);
/* Destroys the cached matmul configurations (cuda_linear.cu). */
void cuda_gemm_cache_clear(cuda_impl *s);

static inline int cuda_aligned(const void *p, size_t bytes) {
    return (uintptr_t)p % bytes == 0;
}

/* Blocks for a one-element-per-thread launch over `count` items, capped (kernels then loop). */
static inline unsigned cuda_blocks(size_t count, unsigned threads) {
    size_t b = (count + threads - 1) / threads;
    return (unsigned)(b < (1u << 20) ? (b ? b : 1) : (1u << 20));
}

/* Launches kernel<VEC> on c's stream over n elements as n / VEC packs (the kernel's last
 * argument), 256 threads a block; the kernel loops with CUDA_FOR_EACH_PACK. */
#define CUDA_LAUNCH_PACKS(kernel, VEC, n, ...)                                                \
    kernel<VEC><<<cuda_blocks((n) / (VEC), 256), 256, 0, cuda_stream(c)>>>(__VA_ARGS__, \
                                                                           (n) / (VEC))
#define CUDA_FOR_EACH_PACK(p, packs)                                                  \
    for (size_t p = (size_t)blockIdx.x * blockDim.x + threadIdx.x; p < (packs); \
         p += (size_t)gridDim.x * blockDim.x)

/* VEC consecutive elements moved with one load or store (16 bytes for 8 bf16 or 4 floats). */
template <typename T, int VEC> struct alignas(sizeof(T) * VEC) cuda_pack {
    T v[VEC];
};

template <int VEC> __device__ inline void load_floats(float (&out)[VEC], const bf16 *p) {
    cuda_pack<bf16, VEC> pk = *reinterpret_cast<const cuda_pack<bf16, VEC> *>(p);
#pragma unroll
    for (int j = 0; j < VEC; j++) out[j] = __bfloat162float(pk.v[j]);
}
template <int VEC> __device__ inline void load_floats(float (&out)[VEC], const float *p) {
    cuda_pack<float, VEC> pk = *reinterpret_cast<const cuda_pack<float, VEC> *>(p);
#pragma unroll
    for (int j = 0; j < VEC; j++) out[j] = pk.v[j];
}
template <int VEC> __device__ inline void store_floats(bf16 *p, const float (&in)[VEC]) {
    cuda_pack<bf16, VEC> pk;
#pragma unroll
    for (int j = 0; j < VEC; j++) pk.v[j] = __float2bfloat16_rn(in[j]);
    *reinterpret_cast<cuda_pack<bf16, VEC> *>(p) = pk;
}
template <int VEC> __device__ inline void store_floats(float *p, const float (&in)[VEC]) {
    cuda_pack<float, VEC> pk;
#pragma unroll
    for (int j = 0; j < VEC; j++) pk.v[j] = in[j];
    *reinterpret_cast<cuda_pack<float, VEC> *>(p) = pk;
}

template <typename T> __device__ inline T warp_sum(T v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

/* Sum over the block, returned to every thread, in a fixed order (deterministic).  blockDim.x
 * must be a multiple of 32; every thread of the block must call it. */
template <typename T> __device__ inline T block_sum(T v) {
    __shared__ T partial[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    v = warp_sum(v);
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = lane < warps ? partial[lane] : (T)0;
    v = warp_sum(v);
    __syncthreads(); /* partial may be reused by the next call */
    return v;
}

/* Keeps the first bad-input report of a launch sequence (see cuda_input_error). */
__device__ inline void cuda_report(cuda_input_error *e, int code, int value, int row, int limit) {
    if (atomicCAS(&e->code, CUDA_INPUT_OK, code) == CUDA_INPUT_OK) {
        e->value = value;
        e->row = row;
        e->limit = limit;
    }
}

#endif /* __CUDACC__ */

#endif
