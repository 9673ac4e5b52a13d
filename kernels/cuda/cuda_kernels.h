/* The CUDA backend of kernels.h: bf16 storage, fp32 accumulation.
 *
 * Compute dtype is K_BF16, so every `void *` buffer of kernels.h is a __nv_bfloat16 array in
 * device memory; `float *` buffers are fp32 device memory.  Every op is queued on the
 * context's stream; failures (launch errors, cuBLASLt status codes, bad tokens or targets
 * found on the device) are recorded with k_fail and reported by k_sync.
 *
 * The first part is the C interface that kernels/kernels.c dispatches to: each function has
 * the signature and contract of the kernels.h op of the same name with the `k_` prefix
 * replaced by `kcuda_`.  The second part (compiled only by nvcc) is what the .cu files
 * share: the context's backend state and small device helpers. */
#ifndef FSDP_CUDA_KERNELS_H
#define FSDP_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "kernels/kernels.h"
#include "proto/errbuf.h"

/* cuda_device.cu: devices, contexts, memory, casts */
int kcuda_device_count(void); /* usable devices; 0 when there is no driver or no device */
/* Sets up c (backend and compute already set by kctx_init) on `device`: the calling thread's
 * current device becomes `device`, and later calls on c must come from a thread whose
 * current device it is. */
int kcuda_init(kctx *c, int device, errbuf *err);
void kcuda_destroy(kctx *c);
void kcuda_sync(kctx *c);
void *kcuda_alloc(kctx *c, size_t bytes, errbuf *err);
void kcuda_free(kctx *c, void *p);
void *kcuda_host_alloc(kctx *c, size_t bytes, errbuf *err);
void kcuda_host_free(kctx *c, void *p);
/* Test hook for the comm watchdog: a kernel on `stream` (a cudaStream_t) that spins until
 * *flag (mapped pinned memory) becomes non-zero. */
void kcuda_test_spin(void *stream, int *flag);
/* From pageable host memory the copy has consumed the source when it returns; from pinned
 * memory it has not (keep the source until k_sync). */
void kcuda_copy_h2d(kctx *c, void *dst, const void *host_src, size_t bytes);
void kcuda_copy_d2h(kctx *c, void *host_dst, const void *src, size_t bytes);
void kcuda_copy_d2d(kctx *c, void *dst, const void *src, size_t bytes);
void kcuda_zero(kctx *c, void *p, size_t bytes);

/* cuda_elementwise.cu */
void kcuda_f32_to_compute(kctx *c, void *dst, const float *src, size_t n);
void kcuda_compute_to_f32(kctx *c, float *dst, const void *src, size_t n);
void kcuda_add(kctx *c, void *out, const void *a, const void *b, size_t n);
void kcuda_accumulate(kctx *c, void *dst, const void *src, size_t n);
void kcuda_add_f32(kctx *c, float *dst, const float *src, size_t n);
void kcuda_scale_f32(kctx *c, float *x, float s, size_t n);
void kcuda_sumsq_f32(kctx *c, float *out, const float *x, size_t n);
void kcuda_swiglu_fwd(kctx *c, void *out, const void *gate, const void *up, size_t n);
void kcuda_swiglu_bwd(kctx *c, void *dgate, void *dup, const void *dout, const void *gate,
                      const void *up, size_t n);

/* cuda_embedding.cu */
void kcuda_embedding_fwd(kctx *c, void *out, const int32_t *tokens, const void *wte, int N,
                         int C, int V);
void kcuda_embedding_bwd(kctx *c, float *dwte, const void *dout, const int32_t *tokens, int N,
                         int C, int V);

/* cuda_norm_rope.cu */
void kcuda_rmsnorm_fwd(kctx *c, void *out, float *rstd, const void *in, const void *w, int N,
                       int C, float eps);
void kcuda_rmsnorm_bwd(kctx *c, void *din, float *dw, const void *dout, const void *in,
                       const void *w, const float *rstd, int N, int C);
void kcuda_rope(kctx *c, void *x, const float *inv_freq, int B, int T, int H, int hd,
                int inverse);

/* cuda_attention.cu (head dim 64 or 128; buffers 16-byte aligned) */
void kcuda_attention_fwd(kctx *c, void *out, float *lse, const void *q, const void *k,
                         const void *v, int B, int T, int Hq, int Hkv, int hd);
void kcuda_attention_bwd(kctx *c, void *dq, void *dk, void *dv, const void *dout,
                         const void *q, const void *k, const void *v, const void *out,
                         const float *lse, int B, int T, int Hq, int Hkv, int hd);
/* The plain path for head dims the tensor-core kernels do not take (cuda_attention_generic.cu):
 * any even head dim up to 256. */
int kcuda_attention_generic_supports(int hd);
void kcuda_attention_generic_fwd(kctx *c, void *out, float *lse, const void *q, const void *k,
                                 const void *v, int B, int T, int Hq, int Hkv, int hd);
void kcuda_attention_generic_bwd(kctx *c, void *dq, void *dk, void *dv, const void *dout,
                                 const void *q, const void *k, const void *v, const void *out,
                                 const float *lse, int B, int T, int Hq, int Hkv, int hd);

/* cuda_linear.cu (cuBLASLt) */
void kcuda_linear_fwd(kctx *c, void *out, const void *in, const void *w, int N, int I, int O);
void kcuda_linear_bwd(kctx *c, void *din, float *dw, const void *dout, const void *in,
                      const void *w, int N, int I, int O, int accumulate_din);

/* cuda_loss_optim.cu */
void kcuda_cross_entropy(kctx *c, float *loss_sum, void *dlogits, const void *logits,
                         const int32_t *targets, int N, int V, float dscale);
void kcuda_adamw(kctx *c, float *p, const float *grad, float *m, float *v, size_t n, float lr,
                 float beta1, float beta2, float eps, float weight_decay, int step,
                 float grad_scale);

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
 * kept in device memory and turned into a k_fail message by kcuda_sync. */
enum kc_error_code { KC_OK = 0, KC_EMBEDDING_TOKEN, KC_EMBEDDING_BWD_TOKEN, KC_CE_TARGET };
typedef struct kc_error {
    int code;
    int value, row, limit;
} kc_error;

/* One cached cuBLASLt matmul configuration (descriptors and the heuristic's algorithm). */
typedef struct kc_gemm {
    int used;
    int m, n, k, trans_a, trans_b, align_a, align_b, align_c;
    cudaDataType_t out_type;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t layout_a, layout_b, layout_c;
    cublasLtMatmulAlgo_t algo;
} kc_gemm;

#define KC_GEMM_CACHE 64

/* The backend state behind kctx.impl. */
typedef struct kc_impl {
    cudaStream_t stream;
    cublasLtHandle_t lt;
    void *workspace; /* cuBLASLt's */
    size_t workspace_bytes;
    void *scratch; /* reductions' partial results; grows on demand */
    size_t scratch_bytes;
    kc_error *error;      /* device memory */
    int smem_optin;       /* the most dynamic shared memory a block may have */
    kc_gemm gemms[KC_GEMM_CACHE];
    int next_evict;
} kc_impl;

static inline kc_impl *kc_state(const kctx *c) {
    return (kc_impl *)c->impl;
}
static inline cudaStream_t kc_stream(const kctx *c) {
    return kc_state(c)->stream;
}

/* Records a failed launch of `what` (the last error of this thread) in c. */
void kc_check_launch(kctx *c, const char *what);
/* Records a failed CUDA call; returns nonzero when it failed. */
int kc_check_call(kctx *c, cudaError_t e, const char *what);
/* A device buffer of at least `bytes` shared by the ops of c (stream-ordered, so one op's
 * use never overlaps another's).  NULL after a k_fail. */
void *kc_scratch(kctx *c, size_t bytes, const char *what);
/* Destroys the cached matmul configurations (cuda_linear.cu). */
void kc_gemm_cache_clear(kc_impl *s);

static inline int kc_aligned(const void *p, size_t bytes) {
    return (uintptr_t)p % bytes == 0;
}

/* Blocks for a one-element-per-thread launch over `count` items, capped (kernels then loop). */
static inline unsigned kc_blocks(size_t count, unsigned threads) {
    size_t b = (count + threads - 1) / threads;
    return (unsigned)(b < (1u << 20) ? (b ? b : 1) : (1u << 20));
}

/* Launches kernel<VEC> on c's stream over n elements as n / VEC packs (the kernel's last
 * argument), 256 threads a block; the kernel loops with KC_FOR_EACH_PACK. */
#define KC_LAUNCH_PACKS(kernel, VEC, n, ...)                                                \
    kernel<VEC><<<kc_blocks((n) / (VEC), 256), 256, 0, kc_stream(c)>>>(__VA_ARGS__, \
                                                                       (n) / (VEC))
#define KC_FOR_EACH_PACK(p, packs)                                                  \
    for (size_t p = (size_t)blockIdx.x * blockDim.x + threadIdx.x; p < (packs); \
         p += (size_t)gridDim.x * blockDim.x)

/* VEC consecutive elements moved with one load or store (16 bytes for 8 bf16 or 4 floats). */
template <typename T, int VEC> struct alignas(sizeof(T) * VEC) kc_pack {
    T v[VEC];
};

template <int VEC> __device__ inline void load_floats(float (&out)[VEC], const bf16 *p) {
    kc_pack<bf16, VEC> pk = *reinterpret_cast<const kc_pack<bf16, VEC> *>(p);
#pragma unroll
    for (int j = 0; j < VEC; j++) out[j] = __bfloat162float(pk.v[j]);
}
template <int VEC> __device__ inline void load_floats(float (&out)[VEC], const float *p) {
    kc_pack<float, VEC> pk = *reinterpret_cast<const kc_pack<float, VEC> *>(p);
#pragma unroll
    for (int j = 0; j < VEC; j++) out[j] = pk.v[j];
}
template <int VEC> __device__ inline void store_floats(bf16 *p, const float (&in)[VEC]) {
    kc_pack<bf16, VEC> pk;
#pragma unroll
    for (int j = 0; j < VEC; j++) pk.v[j] = __float2bfloat16_rn(in[j]);
    *reinterpret_cast<kc_pack<bf16, VEC> *>(p) = pk;
}
template <int VEC> __device__ inline void store_floats(float *p, const float (&in)[VEC]) {
    kc_pack<float, VEC> pk;
#pragma unroll
    for (int j = 0; j < VEC; j++) pk.v[j] = in[j];
    *reinterpret_cast<kc_pack<float, VEC> *>(p) = pk;
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

/* Keeps the first bad-input report of a launch sequence (see kc_error). */
__device__ inline void kc_report(kc_error *e, int code, int value, int row, int limit) {
    if (atomicCAS(&e->code, KC_OK, code) == KC_OK) {
        e->value = value;
        e->row = row;
        e->limit = limit;
    }
}

#endif /* __CUDACC__ */

#endif
