// Causal GQA attention for head dims the tensor-core kernels (cuda_attention.cu) do not
// take: any even head dim up to 256, e.g. the 16 and 32 of small test models.  Plain and
// slow on purpose — one warp per query row (forward, dQ) or key row (dK, dV), fp32 math,
// online softmax, no atomics, so the backward is deterministic like the fast path.  With
// k_docs (varlen) a query row's keys start at its document's start and a key row's queries
// end at its document's end; a sliding window (window > 0) starts them no earlier than
// t - window + 1 and ends them before j + window.
#include <cuda_runtime.h>
#include <math.h>

#include "kernels/cuda/cuda_kernels.h"

#define GEN_MAX_HD 256
#define GEN_PER_LANE (GEN_MAX_HD / 32)
#define GEN_WARPS 4

struct gen_shape {
    int B, T, Hq, Hkv, hd;
    float scale;
    const int32_t *doc_start, *doc_end; // k_docs, or NULL: one document per row
    int window;                         // 0: none
};

// The first key query (b, t) sees, and one past the last query key (b, j) is seen by.
__device__ inline int gen_first_key(const gen_shape &s, int b, int t) {
    int first = s.doc_start ? s.doc_start[(size_t)b * s.T + t] : 0;
    return s.window > 0 && t - s.window + 1 > first ? t - s.window + 1 : first;
}
__device__ inline int gen_query_end(const gen_shape &s, int b, int j) {
    int end = s.doc_end ? s.doc_end[(size_t)b * s.T + j] : s.T;
    return s.window > 0 && j + s.window < end ? j + s.window : end;
}

// Row (b, h, t) of a [B, T, H, hd] tensor.
__device__ inline size_t gen_row(const gen_shape &s, int b, int t, int h, int H) {
    return (((size_t)b * s.T + t) * H + h) * s.hd;
}

// Lane's share of a row: elements lane, lane+32, ... into x (zero past hd).
__device__ inline void gen_load(float (&x)[GEN_PER_LANE], const bf16 *row, int hd, int lane) {
#pragma unroll
    for (int i = 0; i < GEN_PER_LANE; i++) {
        int e = lane + 32 * i;
        x[i] = e < hd ? __bfloat162float(row[e]) : 0.0f;
    }
}

__device__ inline float gen_dot(const float (&a)[GEN_PER_LANE], const float (&b)[GEN_PER_LANE]) {
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < GEN_PER_LANE; i++) s += a[i] * b[i];
    return warp_sum(s);
}

__device__ inline void gen_store(bf16 *row, const float (&x)[GEN_PER_LANE], float mul, int hd,
                                 int lane) {
#pragma unroll
    for (int i = 0; i < GEN_PER_LANE; i++) {
        int e = lane + 32 * i;
        if (e < hd) row[e] = __float2bfloat16_rn(x[i] * mul);
    }
}

// Forward: query row (b, h, t) against keys first_key..t; out and the natural-log lse.
__global__ void attention_generic_fwd(bf16 *out, float *lse, const bf16 *q, const bf16 *k,
                                      const bf16 *v, gen_shape s) {
    size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32;
    if (row >= (size_t)s.B * s.Hq * s.T) return;
    int t = (int)(row % s.T), h = (int)(row / s.T % s.Hq), b = (int)(row / s.T / s.Hq);
    int kvh = h / (s.Hq / s.Hkv);
    float qv[GEN_PER_LANE], acc[GEN_PER_LANE] = {0}, kv[GEN_PER_LANE], vv[GEN_PER_LANE];
    gen_load(qv, q + gen_row(s, b, t, h, s.Hq), s.hd, lane);
    float m = -INFINITY, l = 0.0f;
    for (int j = gen_first_key(s, b, t); j <= t; j++) {
        gen_load(kv, k + gen_row(s, b, j, kvh, s.Hkv), s.hd, lane);
        gen_load(vv, v + gen_row(s, b, j, kvh, s.Hkv), s.hd, lane);
        float x = gen_dot(qv, kv) * s.scale, m_new = fmaxf(m, x);
        float keep = expf(m - m_new), p = expf(x - m_new);
        l = l * keep + p;
#pragma unroll
        for (int i = 0; i < GEN_PER_LANE; i++) acc[i] = acc[i] * keep + p * vv[i];
        m = m_new;
    }
    gen_store(out + gen_row(s, b, t, h, s.Hq), acc, 1.0f / l, s.hd, lane);
    if (lane == 0) lse[((size_t)b * s.Hq + h) * s.T + t] = m + logf(l);
}

// D[b, h, t] = dout . out for each query row, for the backward kernels.
__global__ void attention_generic_delta(float *delta, const bf16 *dout, const bf16 *out,
                                        gen_shape s) {
    size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32;
    if (row >= (size_t)s.B * s.Hq * s.T) return;
    int t = (int)(row % s.T), h = (int)(row / s.T % s.Hq), b = (int)(row / s.T / s.Hq);
    float a[GEN_PER_LANE], c[GEN_PER_LANE];
    gen_load(a, dout + gen_row(s, b, t, h, s.Hq), s.hd, lane);
    gen_load(c, out + gen_row(s, b, t, h, s.Hq), s.hd, lane);
    float d = gen_dot(a, c);
    if (lane == 0) delta[((size_t)b * s.Hq + h) * s.T + t] = d;
}

// dQ for query row (b, h, t): scale * sum_j P_tj (dP_tj - D_t) k_j.
__global__ void attention_generic_dq(bf16 *dq, const bf16 *dout, const bf16 *q, const bf16 *k,
                                     const bf16 *v, const float *lse, const float *delta,
                                     gen_shape s) {
    size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32;
    if (row >= (size_t)s.B * s.Hq * s.T) return;
    int t = (int)(row % s.T), h = (int)(row / s.T % s.Hq), b = (int)(row / s.T / s.Hq);
    int kvh = h / (s.Hq / s.Hkv);
    size_t stat = ((size_t)b * s.Hq + h) * s.T + t;
    float qv[GEN_PER_LANE], dov[GEN_PER_LANE], kv[GEN_PER_LANE], vv[GEN_PER_LANE];
    float acc[GEN_PER_LANE] = {0};
    gen_load(qv, q + gen_row(s, b, t, h, s.Hq), s.hd, lane);
    gen_load(dov, dout + gen_row(s, b, t, h, s.Hq), s.hd, lane);
    for (int j = gen_first_key(s, b, t); j <= t; j++) {
        gen_load(kv, k + gen_row(s, b, j, kvh, s.Hkv), s.hd, lane);
        gen_load(vv, v + gen_row(s, b, j, kvh, s.Hkv), s.hd, lane);
        float p = expf(gen_dot(qv, kv) * s.scale - lse[stat]);
        float ds = p * (gen_dot(dov, vv) - delta[stat]);
#pragma unroll
        for (int i = 0; i < GEN_PER_LANE; i++) acc[i] += ds * kv[i];
    }
    gen_store(dq + gen_row(s, b, t, h, s.Hq), acc, s.scale, s.hd, lane);
}

// dK, dV for key row (b, kvh, j): over the group's query heads and queries j <= t < query_end.
__global__ void attention_generic_dkdv(bf16 *dk, bf16 *dv, const bf16 *dout, const bf16 *q,
                                       const bf16 *k, const bf16 *v, const float *lse,
                                       const float *delta, gen_shape s) {
    size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32;
    if (row >= (size_t)s.B * s.Hkv * s.T) return;
    int j = (int)(row % s.T), kvh = (int)(row / s.T % s.Hkv), b = (int)(row / s.T / s.Hkv);
    int group = s.Hq / s.Hkv;
    float kv[GEN_PER_LANE], vv[GEN_PER_LANE], qv[GEN_PER_LANE], dov[GEN_PER_LANE];
    float dk_acc[GEN_PER_LANE] = {0}, dv_acc[GEN_PER_LANE] = {0};
    gen_load(kv, k + gen_row(s, b, j, kvh, s.Hkv), s.hd, lane);
    gen_load(vv, v + gen_row(s, b, j, kvh, s.Hkv), s.hd, lane);
    const int t_end = gen_query_end(s, b, j);
    for (int h = kvh * group; h < (kvh + 1) * group; h++) {
        for (int t = j; t < t_end; t++) {
            size_t stat = ((size_t)b * s.Hq + h) * s.T + t;
            gen_load(qv, q + gen_row(s, b, t, h, s.Hq), s.hd, lane);
            gen_load(dov, dout + gen_row(s, b, t, h, s.Hq), s.hd, lane);
            float p = expf(gen_dot(qv, kv) * s.scale - lse[stat]);
            float ds = p * (gen_dot(dov, vv) - delta[stat]);
#pragma unroll
            for (int i = 0; i < GEN_PER_LANE; i++) {
                dv_acc[i] += p * dov[i];
                dk_acc[i] += ds * qv[i];
            }
        }
    }
    gen_store(dk + gen_row(s, b, j, kvh, s.Hkv), dk_acc, s.scale, s.hd, lane);
    gen_store(dv + gen_row(s, b, j, kvh, s.Hkv), dv_acc, 1.0f, s.hd, lane);
}

static unsigned gen_blocks(size_t rows) {
    return (unsigned)((rows + GEN_WARPS - 1) / GEN_WARPS);
}

extern "C" int cuda_attention_generic_supports(int hd) {
    return hd > 0 && hd % 2 == 0 && hd <= GEN_MAX_HD;
}

static gen_shape gen_shape_of(const k_docs *docs, int window, int B, int T, int Hq, int Hkv,
                              int hd) {
    return gen_shape{B, T, Hq, Hkv, hd, 1.0f / sqrtf((float)hd), docs ? docs->start : NULL,
                     docs ? docs->end : NULL, window};
}

extern "C" void cuda_attention_generic_fwd(kctx *c, void *out, float *lse, const void *q,
                                           const void *k, const void *v, const k_docs *docs,
                                           int window, int B, int T, int Hq, int Hkv, int hd) {
    gen_shape s = gen_shape_of(docs, window, B, T, Hq, Hkv, hd);
    attention_generic_fwd<<<gen_blocks((size_t)B * Hq * T), 32 * GEN_WARPS, 0, cuda_stream(c)>>>(
        (bf16 *)out, lse, (const bf16 *)q, (const bf16 *)k, (const bf16 *)v, s);
    cuda_check_launch(c, "attention forward (generic head dim)");
}

extern "C" void cuda_attention_generic_bwd(kctx *c, void *dq, void *dk, void *dv,
                                           const void *dout, const void *q, const void *k,
                                           const void *v, const void *out, const float *lse,
                                           const k_docs *docs, int window, int B, int T, int Hq,
                                           int Hkv, int hd) {
    gen_shape s = gen_shape_of(docs, window, B, T, Hq, Hkv, hd);
    size_t q_rows = (size_t)B * Hq * T;
    float *delta = (float *)cuda_scratch(c, q_rows * sizeof(float), "attention backward");
    if (!delta) return;
    unsigned threads = 32 * GEN_WARPS;
    attention_generic_delta<<<gen_blocks(q_rows), threads, 0, cuda_stream(c)>>>(
        delta, (const bf16 *)dout, (const bf16 *)out, s);
    attention_generic_dq<<<gen_blocks(q_rows), threads, 0, cuda_stream(c)>>>(
        (bf16 *)dq, (const bf16 *)dout, (const bf16 *)q, (const bf16 *)k, (const bf16 *)v, lse,
        delta, s);
    attention_generic_dkdv<<<gen_blocks((size_t)B * Hkv * T), threads, 0, cuda_stream(c)>>>(
        (bf16 *)dk, (bf16 *)dv, (const bf16 *)dout, (const bf16 *)q, (const bf16 *)k,
        (const bf16 *)v, lse, delta, s);
    cuda_check_launch(c, "attention backward (generic head dim)");
}
