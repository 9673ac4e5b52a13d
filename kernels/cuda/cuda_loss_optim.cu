// The CUDA backend: cross-entropy over bf16 logits and the AdamW update over fp32 shards.
#include <math.h>

#include "kernels/cuda/cuda_kernels.h"

#define CE_THREADS 512

// ---- cross-entropy ----

// Merges softmax state (m2, s2) into (m, s): m is a running max and s the sum of exp(x - m).
__device__ inline void softmax_merge(float &m, float &s, float m2, float s2) {
    float top = fmaxf(m, m2);
    if (top == -INFINITY) return; // both still empty
    s = s * expf(m - top) + s2 * expf(m2 - top);
    m = top;
}

// The softmax state of the whole block, returned to every thread, in a fixed order.
__device__ inline void block_softmax_merge(float &m, float &s) {
    __shared__ float max_part[32], sum_part[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2)
        softmax_merge(m, s, __shfl_xor_sync(0xffffffffu, m, offset),
                      __shfl_xor_sync(0xffffffffu, s, offset));
    if (lane == 0) {
        max_part[warp] = m;
        sum_part[warp] = s;
    }
    __syncthreads();
    m = lane < warps ? max_part[lane] : -INFINITY;
    s = lane < warps ? sum_part[lane] : 0.0f;
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2)
        softmax_merge(m, s, __shfl_xor_sync(0xffffffffu, m, offset),
                      __shfl_xor_sync(0xffffffffu, s, offset));
}

// One block per row n: lse = max + log sum exp(x - max) in fp32 (one pass, online),
// row_loss[n] = lse - x[target], and when dlogits is not NULL
// dlogits = dscale (exp(x - lse) - onehot).  A masked row (K_IGNORE_INDEX) or a bad target
// (reported) gives no loss and a zero gradient.  dlogits may be logits: the only element
// read by another thread than its writer is x[target], read before the block's barrier.
template <int VEC>
__global__ void cross_entropy_kernel(float *row_loss, bf16 *dlogits, const bf16 *logits,
                                     const int32_t *targets, int V, float dscale,
                                     cuda_input_error *err) {
    int n = blockIdx.x;
    size_t row = (size_t)n * V;
    int target = targets[n];
    if (target < 0 || target >= V) {
        if (threadIdx.x == 0) {
            if (target != K_IGNORE_INDEX) cuda_report(err, CUDA_CE_TARGET, target, n, V);
            row_loss[n] = 0.0f;
        }
        if (!dlogits) return;
        float zero[VEC];
#pragma unroll
        for (int j = 0; j < VEC; j++) zero[j] = 0.0f;
        for (int i = threadIdx.x * VEC; i < V; i += blockDim.x * VEC)
            store_floats<VEC>(dlogits + row + i, zero);
        return;
    }
    const bf16 *x = logits + row;
    float x_target = __bfloat162float(x[target]);
    float m = -INFINITY, s = 0.0f;
    for (int i = threadIdx.x * VEC; i < V; i += blockDim.x * VEC) {
        float v[VEC];
        load_floats<VEC>(v, x + i);
        float top = m;
#pragma unroll
        for (int j = 0; j < VEC; j++) top = fmaxf(top, v[j]);
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < VEC; j++) sum += expf(v[j] - top);
        softmax_merge(m, s, top, sum);
    }
    block_softmax_merge(m, s);
    float lse = m + logf(s);
    if (threadIdx.x == 0) row_loss[n] = lse - x_target;
    if (!dlogits) return;
    bf16 *d = dlogits + row;
    for (int i = threadIdx.x * VEC; i < V; i += blockDim.x * VEC) {
        float v[VEC];
        load_floats<VEC>(v, x + i);
#pragma unroll
        for (int j = 0; j < VEC; j++)
            v[j] = dscale * (expf(v[j] - lse) - (i + j == target ? 1.0f : 0.0f));
        store_floats<VEC>(d + i, v);
    }
}

// *loss_sum += sum of the row losses, in double, in a fixed order.
__global__ void loss_sum_kernel(float *loss_sum, const float *row_loss, int N) {
    double acc = 0.0;
    for (int i = threadIdx.x; i < N; i += blockDim.x) acc += row_loss[i];
    acc = block_sum(acc);
    if (threadIdx.x == 0) *loss_sum = (float)(*loss_sum + acc);
}

extern "C" void cuda_cross_entropy(kctx *c, float *loss_sum, void *dlogits, const void *logits,
                                   const int32_t *targets, int N, int V, float dscale) {
    if (N <= 0 || V <= 0) return;
    float *row_loss = (float *)cuda_scratch(c, (size_t)N * sizeof(float), "cross_entropy scratch");
    if (!row_loss) return;
    bf16 *d = (bf16 *)dlogits;
    const bf16 *x = (const bf16 *)logits;
    cuda_input_error *err = cuda_state(c)->error;
    cudaStream_t stream = cuda_stream(c);
    if (V % 8 == 0 && cuda_aligned(logits, 16) && (!dlogits || cuda_aligned(dlogits, 16)))
        cross_entropy_kernel<8><<<N, CE_THREADS, 0, stream>>>(row_loss, d, x, targets, V, dscale,
                                                              err);
    else
        cross_entropy_kernel<1><<<N, CE_THREADS, 0, stream>>>(row_loss, d, x, targets, V, dscale,
                                                              err);
    cuda_check_launch(c, "cross_entropy");
    loss_sum_kernel<<<1, 1024, 0, stream>>>(loss_sum, row_loss, N);
    cuda_check_launch(c, "cross_entropy (loss sum)");
}

// ---- AdamW ----

// torch.optim.AdamW (not amsgrad), in fp32 per element; the bias corrections come from the
// host: step_size = lr / (1 - beta1^step), bc2_sqrt = sqrt(1 - beta2^step), decay = 1 - lr wd.
template <int VEC>
__global__ void adamw_kernel(float *p, const float *grad, float *m, float *v, float beta1,
                             float beta2, float eps, float decay, float step_size, float bc2_sqrt,
                             float grad_scale, size_t packs) {
    CUDA_FOR_EACH_PACK(k, packs) {
        size_t at = k * VEC;
        float pv[VEC], gv[VEC], mv[VEC], vv[VEC];
        load_floats<VEC>(pv, p + at);
        load_floats<VEC>(gv, grad + at);
        load_floats<VEC>(mv, m + at);
        load_floats<VEC>(vv, v + at);
#pragma unroll
        for (int j = 0; j < VEC; j++) {
            float g = gv[j] * grad_scale;
            mv[j] = beta1 * mv[j] + (1.0f - beta1) * g;
            vv[j] = beta2 * vv[j] + (1.0f - beta2) * g * g;
            pv[j] = pv[j] * decay - step_size * mv[j] / (sqrtf(vv[j]) / bc2_sqrt + eps);
        }
        store_floats<VEC>(p + at, pv);
        store_floats<VEC>(m + at, mv);
        store_floats<VEC>(v + at, vv);
    }
}

extern "C" void cuda_adamw(kctx *c, float *p, const float *grad, float *m, float *v, size_t n,
                           float lr, float beta1, float beta2, float eps, float weight_decay,
                           int step, float grad_scale) {
    if (step < 1) {
        k_fail(c, "adamw: step %d must count from 1", step);
        return;
    }
    if (!n) return;
    float step_size = (float)(lr / (1.0 - pow((double)beta1, step)));
    float bc2_sqrt = (float)sqrt(1.0 - pow((double)beta2, step));
    float decay = (float)(1.0 - (double)lr * weight_decay);
    if (n % 4 == 0 && cuda_aligned(p, 16) && cuda_aligned(grad, 16) && cuda_aligned(m, 16) &&
        cuda_aligned(v, 16))
        CUDA_LAUNCH_PACKS(adamw_kernel, 4, n, p, grad, m, v, beta1, beta2, eps, decay, step_size,
                          bc2_sqrt, grad_scale);
    else
        CUDA_LAUNCH_PACKS(adamw_kernel, 1, n, p, grad, m, v, beta1, beta2, eps, decay, step_size,
                          bc2_sqrt, grad_scale);
    cuda_check_launch(c, "adamw");
}
