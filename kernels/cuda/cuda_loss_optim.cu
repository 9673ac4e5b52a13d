// The CUDA backend: cross-entropy over bf16 logits and the AdamW update over fp32 shards.
#include <math.h>

#include "kernels/cuda/cuda_kernels.h"

#define CE_THREADS 256
#define CE_UNROLL 6 // packs a thread loads before it uses the first
#define CE_LOG2E 1.4426950408889634f
#define CE_LN2 0.6931471805599453f

// ---- cross-entropy ----

// 2^y by the special-function unit (ex2.approx: relative error about 2^-22; 0 at -inf): the
// softmax's exponentials, two an element, as exp(x - m) = 2^(x log2(e) - m log2(e)) with the
// argument one fma.
__device__ inline float fast_exp2(float y) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(y));
    return r;
}

// Softmax state in base 2: m2 a running max of x log2(e), s the sum of 2^(x log2(e) - m2).
// Merges (m2b, sb) into (m2, s).
__device__ inline void softmax_merge(float &m2, float &s, float m2b, float sb) {
    float top = fmaxf(m2, m2b);
    if (top == -INFINITY) return; // both still empty
    s = s * exp2f(m2 - top) + sb * exp2f(m2b - top);
    m2 = top;
}

// The softmax state of the whole block, returned to every thread, in a fixed order.
__device__ inline void block_softmax_merge(float &m2, float &s) {
    __shared__ float max_part[32], sum_part[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2)
        softmax_merge(m2, s, __shfl_xor_sync(0xffffffffu, m2, offset),
                      __shfl_xor_sync(0xffffffffu, s, offset));
    if (lane == 0) {
        max_part[warp] = m2;
        sum_part[warp] = s;
    }
    __syncthreads();
    m2 = lane < warps ? max_part[lane] : -INFINITY;
    s = lane < warps ? sum_part[lane] : 0.0f;
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2)
        softmax_merge(m2, s, __shfl_xor_sync(0xffffffffu, m2, offset),
                      __shfl_xor_sync(0xffffffffu, s, offset));
}

// A pack of 8 moved as one 16-byte access (a copy of the struct through a reference may be
// split into its 8 elements: 4-way bank conflicts in shared memory).
template <int VEC>
__device__ inline cuda_pack<bf16, VEC> pack_load(const cuda_pack<bf16, VEC> *p) {
    if constexpr (VEC == 8) {
        uint4 u = *reinterpret_cast<const uint4 *>(p);
        cuda_pack<bf16, VEC> r;
        memcpy(&r, &u, sizeof r);
        return r;
    } else {
        return *p;
    }
}
template <int VEC> __device__ inline void pack_store_zero(cuda_pack<bf16, VEC> *p) {
    if constexpr (VEC == 8) {
        *reinterpret_cast<uint4 *>(p) = make_uint4(0, 0, 0, 0);
    } else {
        cuda_pack<bf16, VEC> zero;
#pragma unroll
        for (int e = 0; e < VEC; e++) zero.v[e] = __float2bfloat16_rn(0.0f);
        *p = zero;
    }
}

// Adds the VEC logits of a pack to a thread's softmax state.
template <int VEC>
__device__ inline void softmax_add(float &m2, float &s, const cuda_pack<bf16, VEC> &pk) {
    float v[VEC];
#pragma unroll
    for (int e = 0; e < VEC; e++) v[e] = __bfloat162float(pk.v[e]);
    float top = v[0];
#pragma unroll
    for (int e = 1; e < VEC; e++) top = fmaxf(top, v[e]);
    top *= CE_LOG2E;
    if (top > m2) { // a new max: rescale the sum (rare once a row is under way)
        s *= fast_exp2(m2 - top);
        m2 = top;
    }
    if (m2 == -INFINITY) return; // every logit so far is -inf
    float sum = 0.0f;
#pragma unroll
    for (int e = 0; e < VEC; e++) sum += fast_exp2(fmaf(v[e], CE_LOG2E, -m2));
    s += sum;
}

// dscale (softmax - onehot) of the pack of elements first.. first + VEC - 1 of a row whose
// log-sum-exp is lse2 / log2(e).
template <int VEC>
__device__ inline cuda_pack<bf16, VEC> softmax_grad(const cuda_pack<bf16, VEC> &pk, int first,
                                                    int target, float lse2, float dscale) {
    float v[VEC];
#pragma unroll
    for (int e = 0; e < VEC; e++)
        v[e] = fast_exp2(fmaf(__bfloat162float(pk.v[e]), CE_LOG2E, -lse2));
    if ((unsigned)(target - first) < (unsigned)VEC) // the pack holding the target
#pragma unroll
        for (int e = 0; e < VEC; e++)
            if (first + e == target) v[e] -= 1.0f;
    cuda_pack<bf16, VEC> out;
#pragma unroll
    for (int e = 0; e < VEC; e++) out.v[e] = __float2bfloat16_rn(v[e] * dscale);
    return out;
}

// A thread's round of packs k0, k0 + step, ... (CE_UNROLL of them, those below packs), loaded
// before any is used: that many loads in flight.
template <int VEC>
__device__ inline void load_round(cuda_pack<bf16, VEC> (&pk)[CE_UNROLL], const cuda_pack<bf16, VEC> *x,
                                  int k0, int step, int packs) {
#pragma unroll
    for (int u = 0; u < CE_UNROLL; u++)
        if (k0 + u * step < packs) pk[u] = x[k0 + u * step];
}

// One block per row n, one pass over the logits where the row fits in shared memory: each
// thread loads its packs k = threadIdx.x + j * blockDim.x (CE_UNROLL loads in flight), adds
// them to its softmax state (online, base 2) and keeps packs k < cached in shared memory;
// then the block's state gives lse, row_loss[n] = lse - x[target], and when dlogits is not
// NULL each thread writes dlogits = dscale (exp(x - lse) - onehot) of its own packs, from
// shared memory (k < cached) or read again from logits (the rest; cached is all the packs,
// or a multiple of blockDim.x, so the rest are whole rounds).  A masked row (K_IGNORE_INDEX)
// or a bad target (reported) gives no loss and a zero gradient.  dlogits may be logits: a
// thread writes only packs it alone read, and x[target] is read (by thread 0) before the
// block's barrier.
template <int VEC>
__global__ void __launch_bounds__(CE_THREADS, 3)
    cross_entropy_kernel(float *row_loss, bf16 *dlogits, const bf16 *logits,
                         const int32_t *targets, int V, int cached, float dscale,
                         cuda_input_error *err) {
    typedef cuda_pack<bf16, VEC> pack;
    extern __shared__ __align__(16) unsigned char ce_smem[];
    pack *cache = reinterpret_cast<pack *>(ce_smem); // packs [0, cached) of the row
    const int packs = V / VEC, step = blockDim.x;
    int n = blockIdx.x;
    size_t row = (size_t)n * V;
    pack *d = dlogits ? reinterpret_cast<pack *>(dlogits + row) : NULL;
    int target = targets[n];
    if (target < 0 || target >= V) {
        if (threadIdx.x == 0) {
            if (target != K_IGNORE_INDEX) cuda_report(err, CUDA_CE_TARGET, target, n, V);
            row_loss[n] = 0.0f;
        }
        for (int k = threadIdx.x; d && k < packs; k += step) pack_store_zero<VEC>(d + k);
        return;
    }
    const pack *x = reinterpret_cast<const pack *>(logits + row);
    float x_target = threadIdx.x == 0 ? __bfloat162float(logits[row + target]) : 0.0f;
    float m2 = -INFINITY, s = 0.0f;
    for (int k0 = threadIdx.x; k0 < packs; k0 += step * CE_UNROLL) {
        pack pk[CE_UNROLL];
        load_round<VEC>(pk, x, k0, step, packs);
#pragma unroll
        for (int u = 0; u < CE_UNROLL; u++) {
            int k = k0 + u * step;
            if (k >= packs) break;
            if (k < cached) cache[k] = pk[u];
            softmax_add<VEC>(m2, s, pk[u]);
        }
    }
    block_softmax_merge(m2, s);
    float lse2 = m2 + log2f(s);
    if (threadIdx.x == 0) row_loss[n] = lse2 * CE_LN2 - x_target;
    if (!d) return;
    for (int k = threadIdx.x; k < cached; k += step)
        d[k] = softmax_grad<VEC>(pack_load<VEC>(cache + k), k * VEC, target, lse2, dscale);
    for (int k0 = cached + threadIdx.x; k0 < packs; k0 += step * CE_UNROLL) {
        pack pk[CE_UNROLL];
        load_round<VEC>(pk, x, k0, step, packs);
#pragma unroll
        for (int u = 0; u < CE_UNROLL; u++) {
            int k = k0 + u * step;
            if (k >= packs) break;
            d[k] = softmax_grad<VEC>(pk[u], k * VEC, target, lse2, dscale);
        }
    }
}

// *loss_sum += sum of the row losses, in double, in a fixed order.
__global__ void loss_sum_kernel(float *loss_sum, const float *row_loss, int N) {
    double acc = 0.0;
    for (int i = threadIdx.x; i < N; i += blockDim.x) acc += row_loss[i];
    acc = block_sum(acc);
    if (threadIdx.x == 0) *loss_sum = (float)(*loss_sum + acc);
}

// Packs of a row kept in shared memory: all of them where the row fits in half an SM's
// shared memory (two blocks or more an SM: one row's load overlaps another's reduction and
// writes); else what fits there, rounded down to whole rounds of the block.  -1: failed.
static int ce_cached_packs(kctx *c, int V, int vec) {
    int per_sm = 0;
    if (cuda_check_call(c, cudaDeviceGetAttribute(&per_sm,
                                                  cudaDevAttrMaxSharedMemoryPerMultiprocessor,
                                                  c->device),
                        "cross_entropy: reading the shared memory of an SM"))
        return -1;
    int budget = per_sm / 2 - 2048; // 1 KB a block the runtime keeps, and the static arrays
    if (budget > cuda_state(c)->smem_optin) budget = cuda_state(c)->smem_optin;
    int packs = V / vec, fit = budget > 0 ? budget / (int)(vec * sizeof(bf16)) : 0;
    return fit >= packs ? packs : fit / CE_THREADS * CE_THREADS;
}

template <int VEC>
static void launch_cross_entropy(kctx *c, float *row_loss, bf16 *d, const bf16 *x,
                                 const int32_t *targets, int N, int V, float dscale) {
    int cached = ce_cached_packs(c, V, VEC);
    if (cached < 0) return;
    size_t smem = (size_t)cached * VEC * sizeof(bf16);
    if (cuda_check_call(c,
                        cudaFuncSetAttribute(cross_entropy_kernel<VEC>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)smem),
                        "cross_entropy: raising the shared-memory limit") ||
        cuda_check_call(c,
                        cudaFuncSetAttribute(cross_entropy_kernel<VEC>,
                                             cudaFuncAttributePreferredSharedMemoryCarveout,
                                             cudaSharedmemCarveoutMaxShared),
                        "cross_entropy: preferring shared memory to L1"))
        return;
    cross_entropy_kernel<VEC><<<N, CE_THREADS, smem, cuda_stream(c)>>>(
        row_loss, d, x, targets, V, cached, dscale, cuda_state(c)->error);
}

extern "C" void cuda_cross_entropy(kctx *c, float *loss_sum, void *dlogits, const void *logits,
                                   const int32_t *targets, int N, int V, float dscale) {
    if (N <= 0 || V <= 0) return;
    float *row_loss = (float *)cuda_scratch(c, (size_t)N * sizeof(float), "cross_entropy scratch");
    if (!row_loss) return;
    bf16 *d = (bf16 *)dlogits;
    const bf16 *x = (const bf16 *)logits;
    if (V % 8 == 0 && cuda_aligned(logits, 16) && (!dlogits || cuda_aligned(dlogits, 16)))
        launch_cross_entropy<8>(c, row_loss, d, x, targets, N, V, dscale);
    else
        launch_cross_entropy<1>(c, row_loss, d, x, targets, N, V, dscale);
    cuda_check_launch(c, "cross_entropy");
    loss_sum_kernel<<<1, 1024, 0, cuda_stream(c)>>>(loss_sum, row_loss, N);
    cuda_check_launch(c, "cross_entropy (loss sum)");
}

// ---- AdamW ----

// torch.optim.AdamW (not amsgrad), in fp32 per element; the bias corrections come from the
// host: step_size = lr / (1 - beta1^step), bc2_sqrt = sqrt(1 - beta2^step), decay = 1 - lr wd.
// out (NULL: none) receives bf16(p) as f32_to_bf16_kernel rounds it.
template <int VEC>
__global__ void adamw_kernel(float *p, const float *grad, float *m, float *v, bf16 *out, float beta1,
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
        if (out) store_floats<VEC>(out + at, pv);
    }
}

extern "C" void cuda_adamw(kctx *c, float *p, const float *grad, float *m, float *v, size_t n,
                           float lr, float beta1, float beta2, float eps, float weight_decay,
                           int step, float grad_scale, void *out) {
    if (step < 1) {
        k_fail(c, "adamw: step %d must count from 1", step);
        return;
    }
    if (!n) return;
    float step_size = (float)(lr / (1.0 - pow((double)beta1, step)));
    float bc2_sqrt = (float)sqrt(1.0 - pow((double)beta2, step));
    float decay = (float)(1.0 - (double)lr * weight_decay);
    bf16 *o = (bf16 *)out;
    if (n % 4 == 0 && cuda_aligned(p, 16) && cuda_aligned(grad, 16) && cuda_aligned(m, 16) &&
        cuda_aligned(v, 16) && (!o || cuda_aligned(o, 8)))
        CUDA_LAUNCH_PACKS(adamw_kernel, 4, n, p, grad, m, v, o, beta1, beta2, eps, decay, step_size,
                          bc2_sqrt, grad_scale);
    else
        CUDA_LAUNCH_PACKS(adamw_kernel, 1, n, p, grad, m, v, o, beta1, beta2, eps, decay, step_size,
                          bc2_sqrt, grad_scale);
    cuda_check_launch(c, "adamw");
}
