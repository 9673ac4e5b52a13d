// The CUDA backend: generation's attention over a KV cache (k_attention_kv).  Two kernels:
// RoPE of the new tokens' q and k (the angles as cuda_rope computes them: sincos in double,
// rounded to fp32) with k and v appended to the cache, then one block per (row, new token,
// query head) running the softmax over the cache in chunks of keys (a running max and sum,
// rescaled at each chunk), fp32 throughout.  Decoding is memory-bound: one warp a key reads
// its row coalesced, and each thread owns output dims.
#include "kernels/cuda/cuda_kernels.h"

#include <math.h>

#define THREADS 256
#define KV_THREADS 128 // 4 warps; each thread owns dims t and t + 128 of the output
#define KV_CHUNK 256   // keys scored at a time (shared memory)
#define KV_MAX_HD 256

// One thread per (new token, head, rotated pair) of q and k, then per element of v: rotates
// q and k in place and writes k and v into the caches.  A position past the cache (the CPU
// backend fails on it; callers check) is skipped rather than written out of bounds.
__global__ void rope_append_kernel(bf16 *q, bf16 *k, const bf16 *v, bf16 *k_cache,
                                   bf16 *v_cache, const int32_t *pos, const float *inv_freq,
                                   int B, int S, int T_max, int Hq, int Hkv, int hd) {
    const int half = hd / 2;
    const size_t tokens = (size_t)B * S, qpairs = (size_t)Hq * half, kpairs = (size_t)Hkv * half;
    const size_t kvrow = (size_t)Hkv * hd, per_token = qpairs + kpairs + kvrow;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < tokens * per_token;
         idx += (size_t)gridDim.x * blockDim.x) {
        size_t n = idx / per_token, r = idx % per_token;
        int b = (int)(n / S), s = (int)(n % S), p = pos[b] + s;
        if (pos[b] < 0 || pos[b] + S > T_max) continue;
        bf16 *cache_row = k_cache + ((size_t)b * T_max + p) * kvrow;
        if (r >= qpairs + kpairs) { // v: copied into the cache
            size_t e = r - qpairs - kpairs;
            v_cache[((size_t)b * T_max + p) * kvrow + e] = v[n * kvrow + e];
            continue;
        }
        int is_k = r >= qpairs;
        size_t pr = is_k ? r - qpairs : r;
        int h = (int)(pr / half), i = (int)(pr % half);
        bf16 *x = is_k ? k + n * kvrow + (size_t)h * hd : q + n * Hq * (size_t)hd + (size_t)h * hd;
        double sn, cs;
        sincos((double)p * inv_freq[i], &sn, &cs);
        float c = (float)cs, si = (float)sn;
        float a = __bfloat162float(x[i]), bb = __bfloat162float(x[i + half]);
        bf16 x1 = __float2bfloat16_rn(a * c - bb * si), x2 = __float2bfloat16_rn(bb * c + a * si);
        x[i] = x1, x[i + half] = x2;
        if (is_k) cache_row[(size_t)h * hd + i] = x1, cache_row[(size_t)h * hd + i + half] = x2;
    }
}

__device__ inline float block_max(float v) {
    __shared__ float partial[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = lane < warps ? partial[lane] : -INFINITY;
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    __syncthreads();
    return v;
}

// Block (n = b*S + s, h): query s of row b (at position pos[b] + s) over cache keys 0 .. that.
__global__ void __launch_bounds__(KV_THREADS)
attention_kv_kernel(bf16 *out, const bf16 *q, const bf16 *k_cache, const bf16 *v_cache,
                    const int32_t *pos, int S, int T_max, int Hq, int Hkv, int hd, float scale) {
    __shared__ float qs[KV_MAX_HD], sc[KV_CHUNK];
    const int n = blockIdx.x, h = blockIdx.y, b = n / S, s = n % S;
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, warps = KV_THREADS / 32;
    const int g = h / (Hq / Hkv);
    if (pos[b] < 0 || pos[b] + S > T_max) return; // skipped by rope_append_kernel too
    const int last = pos[b] + s;
    const size_t kvrow = (size_t)Hkv * hd;
    const bf16 *kc = k_cache + (size_t)b * T_max * kvrow + (size_t)g * hd;
    const bf16 *vc = v_cache + (size_t)b * T_max * kvrow + (size_t)g * hd;
    for (int i = tid; i < hd; i += KV_THREADS)
        qs[i] = __bfloat162float(q[((size_t)n * Hq + h) * hd + i]);
    __syncthreads();
    float m = -INFINITY, l = 0.0f, acc[KV_MAX_HD / KV_THREADS] = {0.0f, 0.0f};
    for (int c0 = 0; c0 <= last; c0 += KV_CHUNK) {
        int count = min(KV_CHUNK, last + 1 - c0);
        for (int j = warp; j < count; j += warps) {
            const bf16 *kr = kc + (size_t)(c0 + j) * kvrow;
            float d = 0.0f;
            for (int i = lane; i < hd; i += 32) d += qs[i] * __bfloat162float(kr[i]);
            d = warp_sum(d);
            if (lane == 0) sc[j] = d * scale;
        }
        __syncthreads();
        float cmax = -INFINITY;
        for (int j = tid; j < count; j += KV_THREADS) cmax = fmaxf(cmax, sc[j]);
        float m_new = fmaxf(m, block_max(cmax));
        float part = 0.0f;
        for (int j = tid; j < count; j += KV_THREADS) part += (sc[j] = expf(sc[j] - m_new));
        __syncthreads();
        float alpha = expf(m - m_new); // 0 on the first chunk (m = -inf)
        l = l * alpha + block_sum(part);
        m = m_new;
#pragma unroll
        for (int a = 0; a < KV_MAX_HD / KV_THREADS; a++) {
            int d = tid + a * KV_THREADS;
            if (d >= hd) continue;
            float sum = 0.0f;
            for (int j = 0; j < count; j++) sum += sc[j] * __bfloat162float(vc[(size_t)(c0 + j) * kvrow + d]);
            acc[a] = acc[a] * alpha + sum;
        }
        __syncthreads(); // sc is rewritten by the next chunk
    }
#pragma unroll
    for (int a = 0; a < KV_MAX_HD / KV_THREADS; a++) {
        int d = tid + a * KV_THREADS;
        if (d < hd) out[((size_t)n * Hq + h) * hd + d] = __float2bfloat16_rn(acc[a] / l);
    }
}

extern "C" void cuda_attention_kv(kctx *c, void *out, void *q, void *k, const void *v,
                                  void *k_cache, void *v_cache, const int32_t *pos,
                                  const float *inv_freq, int B, int S, int T_max, int Hq, int Hkv,
                                  int hd) {
    if (hd % 2 || hd > KV_MAX_HD) {
        k_fail(c, "attention_kv: head dim %d is odd or above %d", hd, KV_MAX_HD);
        return;
    }
    if (Hkv <= 0 || Hq <= 0 || Hq % Hkv) {
        k_fail(c, "attention_kv: %d query heads are not a multiple of %d key/value heads", Hq, Hkv);
        return;
    }
    if (B <= 0 || S <= 0) return;
    size_t total = (size_t)B * S * ((size_t)(Hq + Hkv) * (hd / 2) + (size_t)Hkv * hd);
    rope_append_kernel<<<cuda_blocks(total, THREADS), THREADS, 0, cuda_stream(c)>>>(
        (bf16 *)q, (bf16 *)k, (const bf16 *)v, (bf16 *)k_cache, (bf16 *)v_cache, pos, inv_freq, B,
        S, T_max, Hq, Hkv, hd);
    cuda_check_launch(c, "attention_kv (rope and append)");
    dim3 grid((unsigned)(B * S), (unsigned)Hq);
    attention_kv_kernel<<<grid, KV_THREADS, 0, cuda_stream(c)>>>(
        (bf16 *)out, (const bf16 *)q, (const bf16 *)k_cache, (const bf16 *)v_cache, pos, S, T_max,
        Hq, Hkv, hd, 1.0f / sqrtf((float)hd));
    cuda_check_launch(c, "attention_kv");
}
