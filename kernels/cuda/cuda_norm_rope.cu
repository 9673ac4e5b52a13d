// The CUDA backend: RMSNorm (as Hugging Face LlamaRMSNorm, in fp32) and rotary position
// embedding (Hugging Face rotate_half convention).
#include "kernels/cuda/cuda_kernels.h"

#define THREADS 256
#define RMSNORM_BWD_BLOCKS 512 // a fixed grid: the same dw partial sums on every run and device

// Rows are read as packs of 8 bf16 when every row starts on a 16-byte boundary.
static bool rows_vec8(int C, const void *a, const void *b, const void *d) {
    return C % 8 == 0 && cuda_aligned(a, 16) && cuda_aligned(b, 16) && cuda_aligned(d, 16);
}

// ---- RMSNorm ----

// out = in * rstd * w, rstd = 1/sqrt(mean(in^2) + eps).  One block per row.
template <int VEC>
__global__ void rmsnorm_fwd_kernel(bf16 *out, float *rstd, const bf16 *in, const bf16 *w, int C,
                                   float eps) {
    size_t row = (size_t)blockIdx.x * C;
    const bf16 *x = in + row;
    float ss = 0.0f;
    for (int i = threadIdx.x * VEC; i < C; i += blockDim.x * VEC) {
        float v[VEC];
        load_floats<VEC>(v, x + i);
#pragma unroll
        for (int j = 0; j < VEC; j++) ss += v[j] * v[j];
    }
    ss = block_sum(ss);
    float r = rsqrtf(ss / C + eps);
    if (threadIdx.x == 0) rstd[blockIdx.x] = r;
    for (int i = threadIdx.x * VEC; i < C; i += blockDim.x * VEC) {
        float v[VEC], wv[VEC];
        load_floats<VEC>(v, x + i);
        load_floats<VEC>(wv, w + i);
#pragma unroll
        for (int j = 0; j < VEC; j++) v[j] = v[j] * r * wv[j];
        store_floats<VEC>(out + row + i, v);
    }
}

extern "C" void cuda_rmsnorm_fwd(kctx *c, void *out, float *rstd, const void *in, const void *w,
                                 int N, int C, float eps) {
    if (N <= 0 || C <= 0) return;
    bf16 *o = (bf16 *)out;
    const bf16 *x = (const bf16 *)in, *wt = (const bf16 *)w;
    if (rows_vec8(C, out, in, w))
        rmsnorm_fwd_kernel<8><<<N, THREADS, 0, cuda_stream(c)>>>(o, rstd, x, wt, C, eps);
    else
        rmsnorm_fwd_kernel<1><<<N, THREADS, 0, cuda_stream(c)>>>(o, rstd, x, wt, C, eps);
    cuda_check_launch(c, "rmsnorm_fwd");
}

// With out_i = x_i r w_i and r = (mean(x^2) + eps)^-1/2:
//   din_j += r w_j g_j - x_j (r^3 / C) sum_i g_i w_i x_i,   dw_i += sum_n g_i x_i r.
// Each block takes rows blockIdx.x, blockIdx.x + gridDim.x, ...: it updates their din and sums
// their dw terms in shared memory (each thread owns the same columns in every row, so no
// atomics), then writes that sum to dw_partial[blockIdx.x, :].  dw_partial NULL (a frozen
// norm): din only, no shared memory.
template <int VEC>
__global__ void rmsnorm_bwd_kernel(bf16 *din, float *dw_partial, const bf16 *dout,
                                   const bf16 *in, const bf16 *w, const float *rstd, int N,
                                   int C) {
    extern __shared__ __align__(32) float dw_acc[]; // [C] when dw_partial
    const bool with_dw = dw_partial != NULL;
    for (int i = threadIdx.x * VEC; with_dw && i < C; i += blockDim.x * VEC) {
        float zero[VEC];
#pragma unroll
        for (int j = 0; j < VEC; j++) zero[j] = 0.0f;
        store_floats<VEC>(dw_acc + i, zero);
    }
    for (int n = blockIdx.x; n < N; n += gridDim.x) {
        size_t row = (size_t)n * C;
        const bf16 *g = dout + row, *x = in + row;
        bf16 *dx = din + row;
        float r = rstd[n];
        float dot = 0.0f;
        for (int i = threadIdx.x * VEC; i < C; i += blockDim.x * VEC) {
            float gv[VEC], wv[VEC], xv[VEC];
            load_floats<VEC>(gv, g + i);
            load_floats<VEC>(wv, w + i);
            load_floats<VEC>(xv, x + i);
#pragma unroll
            for (int j = 0; j < VEC; j++) dot += gv[j] * wv[j] * xv[j];
        }
        dot = block_sum(dot);
        float coef = r * r * r * dot / C;
        for (int i = threadIdx.x * VEC; i < C; i += blockDim.x * VEC) {
            float gv[VEC], wv[VEC], xv[VEC], dv[VEC], acc[VEC];
            load_floats<VEC>(gv, g + i);
            load_floats<VEC>(wv, w + i);
            load_floats<VEC>(xv, x + i);
            load_floats<VEC>(dv, dx + i);
#pragma unroll
            for (int j = 0; j < VEC; j++) dv[j] += r * wv[j] * gv[j] - xv[j] * coef;
            store_floats<VEC>(dx + i, dv);
            if (!with_dw) continue;
            load_floats<VEC>(acc, dw_acc + i);
#pragma unroll
            for (int j = 0; j < VEC; j++) acc[j] += gv[j] * xv[j] * r;
            store_floats<VEC>(dw_acc + i, acc);
        }
    }
    for (int i = threadIdx.x * VEC; with_dw && i < C; i += blockDim.x * VEC) {
        float acc[VEC];
        load_floats<VEC>(acc, dw_acc + i);
        store_floats<VEC>(dw_partial + (size_t)blockIdx.x * C + i, acc);
    }
}

// dw[i] += sum over blocks b of dw_partial[b, i], in a fixed order: thread (x, y) of a 32 x 32
// block sums rows y, y + 32, ... of column blockIdx.x * 32 + x (a warp reads 32 adjacent
// columns), then row y = 0 adds the 32 sums in order.
__global__ void rmsnorm_dw_kernel(float *dw, const float *dw_partial, int blocks, int C) {
    __shared__ float sums[32][33]; // padded: no bank conflicts reading a column
    int i = blockIdx.x * 32 + threadIdx.x;
    float acc = 0.0f;
    if (i < C)
        for (int b = threadIdx.y; b < blocks; b += 32) acc += dw_partial[(size_t)b * C + i];
    sums[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y != 0 || i >= C) return;
    float total = 0.0f;
    for (int y = 0; y < 32; y++) total += sums[y][threadIdx.x];
    dw[i] += total;
}

template <int VEC>
static void launch_rmsnorm_bwd(kctx *c, int blocks, size_t smem, bf16 *din, float *partial,
                               const bf16 *dout, const bf16 *in, const bf16 *w,
                               const float *rstd, int N, int C) {
    if (smem > 48 * 1024 &&
        cuda_check_call(c,
                        cudaFuncSetAttribute(rmsnorm_bwd_kernel<VEC>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)smem),
                        "rmsnorm_bwd: raising the shared-memory limit"))
        return;
    rmsnorm_bwd_kernel<VEC><<<blocks, THREADS, smem, cuda_stream(c)>>>(din, partial, dout, in,
                                                                        w, rstd, N, C);
}

// dw NULL (a frozen norm): din only; no shared memory, no partials, no dw sum.
extern "C" void cuda_rmsnorm_bwd(kctx *c, void *din, float *dw, const void *dout,
                                 const void *in, const void *w, const float *rstd, int N,
                                 int C) {
    if (N <= 0 || C <= 0) return;
    size_t smem = dw ? (size_t)C * sizeof(float) : 0;
    if (smem + 1024 > (size_t)cuda_state(c)->smem_optin) { // 1 KB: block_sum's static array
        k_fail(c, "rmsnorm_bwd: hidden size %d needs %zu bytes of shared memory per block; "
                  "this device allows %d", C, smem, cuda_state(c)->smem_optin);
        return;
    }
    int blocks = N < RMSNORM_BWD_BLOCKS ? N : RMSNORM_BWD_BLOCKS;
    float *partial = NULL;
    if (dw) {
        partial = (float *)cuda_scratch(c, (size_t)blocks * C * sizeof(float),
                                        "rmsnorm_bwd scratch");
        if (!partial) return;
    }
    bf16 *dx = (bf16 *)din;
    const bf16 *g = (const bf16 *)dout, *x = (const bf16 *)in, *wt = (const bf16 *)w;
    if (rows_vec8(C, din, dout, in) && cuda_aligned(w, 16))
        launch_rmsnorm_bwd<8>(c, blocks, smem, dx, partial, g, x, wt, rstd, N, C);
    else
        launch_rmsnorm_bwd<1>(c, blocks, smem, dx, partial, g, x, wt, rstd, N, C);
    cuda_check_launch(c, "rmsnorm_bwd");
    if (!dw) return;
    rmsnorm_dw_kernel<<<(C + 31) / 32, dim3(32, 32), 0, cuda_stream(c)>>>(dw, partial, blocks, C);
    cuda_check_launch(c, "rmsnorm_bwd (dw)");
}

// ---- RoPE ----

// Pairs (i, i + hd/2) of every head rotate by angle pos * inv_freq[i] (negated for the
// inverse).  The angle and its sine and cosine are computed in double: pos * inv_freq reaches
// 1e5 radians at long contexts, where fp32 would lose about 1e-2 of the angle.
// doc_start: NULL, or each token's document start (k_docs), its position then t - start.
__device__ inline void rope_angle(float &c, float &s, const float *inv_freq,
                                  const int32_t *doc_start, size_t bt, int T, int i,
                                  int inverse) {
    int t = (int)(bt % T), pos = doc_start ? t - doc_start[bt] : t;
    double sn, cs;
    sincos((double)pos * inv_freq[i], &sn, &cs);
    c = (float)cs;
    s = inverse ? (float)-sn : (float)sn;
}

#define ROPE_ITEMS 2                      // pair-packs a thread holds at once
#define ROPE_WORK (THREADS * ROPE_ITEMS)  // pair-packs a block takes per group of tokens
#define ROPE_SMEM (16 * 1024)             // angles per block: 8 blocks still fit on an SM
#define ROPE_SMEM_MAX (48 * 1024)         // past this (hd > 12288), rope_scalar_kernel

// A block takes `tokens` consecutive tokens (bt = b * T + t) at a time: their hd/2 angles
// each, once, into shared memory (cosines, then sines, [tokens][hd/2] floats), then every
// (token, head, pack of VEC pairs) of the group, VEC elements at i and VEC at i + hd/2, as
// 16-byte loads and stores when VEC = 8.  Consecutive threads take consecutive packs of a
// head, then the next head, so a warp reads whole heads.  A thread loads its first
// ROPE_ITEMS pair-packs before it computes angles, so the loads are in flight meanwhile.
template <int VEC>
__global__ void rope_tokens_kernel(bf16 *x, const float *inv_freq, const int32_t *doc_start,
                                   size_t BT, int T, int H, int hd, int tokens, int inverse) {
    extern __shared__ __align__(32) float rope_angles[]; // load_floats<8>: 32-byte packs
    const int half = hd / 2, packs = half / VEC;
    float *cos_s = rope_angles, *sin_s = rope_angles + (size_t)tokens * half;
    size_t groups = (BT + tokens - 1) / tokens;
    for (size_t g = blockIdx.x; g < groups; g += gridDim.x) {
        size_t bt0 = g * tokens;
        int ntok = BT - bt0 < (size_t)tokens ? (int)(BT - bt0) : tokens;
        int items = ntok * H * packs; // pair-packs of the group
        bf16 *base = x + bt0 * H * hd; // head 0 of token bt0
        cuda_pack<bf16, VEC> lo[ROPE_ITEMS], hi[ROPE_ITEMS];
        for (int first = 0; first < items; first += blockDim.x * ROPE_ITEMS) {
#pragma unroll
            for (int j = 0; j < ROPE_ITEMS; j++) { // item = (token k, head h) row r, pack p
                int item = first + j * blockDim.x + threadIdx.x;
                if (item >= items) break;
                int r = item / packs, p = item - r * packs;
                bf16 *v = base + (size_t)r * hd + p * VEC;
                lo[j] = *reinterpret_cast<const cuda_pack<bf16, VEC> *>(v);
                hi[j] = *reinterpret_cast<const cuda_pack<bf16, VEC> *>(v + half);
            }
            if (first == 0) { // this group's angles
                for (int a = threadIdx.x; a < ntok * half; a += blockDim.x) {
                    int k = a / half;
                    rope_angle(cos_s[a], sin_s[a], inv_freq, doc_start, bt0 + k, T, a - k * half,
                               inverse);
                }
                __syncthreads();
            }
#pragma unroll
            for (int j = 0; j < ROPE_ITEMS; j++) {
                int item = first + j * blockDim.x + threadIdx.x;
                if (item >= items) break;
                int r = item / packs, p = item - r * packs, k = r / H;
                float cv[VEC], sv[VEC];
                load_floats<VEC>(cv, cos_s + k * half + p * VEC);
                load_floats<VEC>(sv, sin_s + k * half + p * VEC);
                float x1[VEC], x2[VEC];
#pragma unroll
                for (int e = 0; e < VEC; e++) {
                    float a = __bfloat162float(lo[j].v[e]), b = __bfloat162float(hi[j].v[e]);
                    x1[e] = a * cv[e] - b * sv[e];
                    x2[e] = b * cv[e] + a * sv[e];
                }
                bf16 *v = base + (size_t)r * hd + p * VEC;
                store_floats<VEC>(v, x1);
                store_floats<VEC>(v + half, x2);
            }
        }
        __syncthreads(); // the next group overwrites the angles
    }
}

// One thread per (b, t, i < hd/2), looping over the heads: for head dims whose angles would
// not fit in shared memory (hd > 12288).
__global__ void rope_scalar_kernel(bf16 *x, const float *inv_freq, const int32_t *doc_start,
                                   int B, int T, int H, int hd, int inverse) {
    int half = hd / 2;
    size_t total = (size_t)B * T * half;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (size_t)gridDim.x * blockDim.x) {
        int i = (int)(idx % half);
        size_t bt = idx / half;
        float c, s;
        rope_angle(c, s, inv_freq, doc_start, bt, T, i, inverse);
        bf16 *v = x + bt * H * hd;
        for (int h = 0; h < H; h++, v += hd) {
            float x1 = __bfloat162float(v[i]), x2 = __bfloat162float(v[i + half]);
            v[i] = __float2bfloat16_rn(x1 * c - x2 * s);
            v[i + half] = __float2bfloat16_rn(x2 * c + x1 * s);
        }
    }
}

// Tokens per block: enough for ROPE_WORK pair-packs, as many as ROPE_SMEM of angles allows.
template <int VEC>
static void launch_rope_tokens(kctx *c, bf16 *x, const float *inv_freq,
                               const int32_t *doc_start, size_t BT, int T, int H, int hd,
                               int inverse) {
    size_t angle_bytes = (size_t)hd * sizeof(float); // cos and sin of hd/2 angles
    size_t per_token = (size_t)H * (hd / 2 / VEC);
    size_t tokens = per_token >= ROPE_WORK ? 1 : ROPE_WORK / per_token;
    if (tokens * angle_bytes > ROPE_SMEM) tokens = ROPE_SMEM / angle_bytes;
    if (tokens < 1) tokens = 1;
    if (tokens > BT) tokens = BT;
    size_t groups = (BT + tokens - 1) / tokens;
    unsigned blocks = groups < (1u << 20) ? (unsigned)groups : 1u << 20;
    rope_tokens_kernel<VEC><<<blocks, THREADS, tokens * angle_bytes, cuda_stream(c)>>>(
        x, inv_freq, doc_start, BT, T, H, hd, (int)tokens, inverse);
}

extern "C" void cuda_rope(kctx *c, void *x, const float *inv_freq, const k_docs *docs, int B,
                          int T, int H, int hd, int inverse) {
    if (hd % 2) {
        k_fail(c, "rope: head dim %d is odd", hd);
        return;
    }
    if (B <= 0 || T <= 0 || H <= 0 || hd <= 0) return;
    bf16 *v = (bf16 *)x;
    const int32_t *start = docs ? docs->start : NULL;
    size_t BT = (size_t)B * T;
    if ((size_t)hd * sizeof(float) > ROPE_SMEM_MAX)
        rope_scalar_kernel<<<cuda_blocks(BT * (hd / 2), THREADS), THREADS, 0, cuda_stream(c)>>>(
            v, inv_freq, start, B, T, H, hd, inverse);
    else if ((hd / 2) % 8 == 0 && cuda_aligned(x, 16))
        launch_rope_tokens<8>(c, v, inv_freq, start, BT, T, H, hd, inverse);
    else
        launch_rope_tokens<1>(c, v, inv_freq, start, BT, T, H, hd, inverse);
    cuda_check_launch(c, "rope");
}
