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
// inverse).  The angles' sines and cosines are computed in double: pos * inv_freq reaches
// 1e5 radians at long contexts, where fp32 would lose about 1e-2 of the angle.  They depend
// on the position only, so a call first tabulates them for positions 0..T-1 (T x hd/2 pairs,
// 1 MiB at T = 2048, hd = 128, in the backend's scratch: L2-resident while the rotation
// reads it); the rotation is then a stream over x, read and written once, 16-byte packs.
// doc_start: NULL, or each token's document start (k_docs), its position then t - start.
__global__ void rope_table_kernel(float2 *table, const float *inv_freq, int T, int half) {
    size_t total = (size_t)T * half;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (size_t)gridDim.x * blockDim.x) {
        int pos = (int)(idx / half), i = (int)(idx % half);
        double sn, cs;
        sincos((double)pos * inv_freq[i], &sn, &cs);
        table[idx] = make_float2((float)cs, (float)sn);
    }
}

// One thread a (token, head, pack of VEC pairs): VEC elements at i and VEC at i + hd/2.
// Consecutive threads take consecutive packs of a head, then the next head, so a warp reads
// whole heads.  I: the index type (32 bits when the packs fit, saving 64-bit divisions).
template <int VEC, typename I>
__global__ void rope_apply_kernel(bf16 *x, const float2 *table, const int32_t *doc_start, I BT,
                                  int T, int H, int hd, int inverse) {
    const int half = hd / 2, packs = half / VEC;
    const I total = BT * (I)H * (I)packs;
    for (I idx = (I)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += (I)gridDim.x * blockDim.x) {
        I r = idx / (I)packs; // (token, head) row
        int p = (int)(idx - r * (I)packs);
        I bt = r / (I)H;
        int t = (int)(bt % (I)T), pos = doc_start ? t - doc_start[bt] : t;
        const float2 *angle = table + (size_t)pos * half + p * VEC;
        bf16 *v = x + (size_t)r * hd + p * VEC;
        cuda_pack<bf16, VEC> lo = *reinterpret_cast<const cuda_pack<bf16, VEC> *>(v);
        cuda_pack<bf16, VEC> hi = *reinterpret_cast<const cuda_pack<bf16, VEC> *>(v + half);
        float x1[VEC], x2[VEC];
#pragma unroll
        for (int e = 0; e < VEC; e++) {
            float2 cs = angle[e];
            float c = cs.x, s = inverse ? -cs.y : cs.y;
            float a = __bfloat162float(lo.v[e]), b = __bfloat162float(hi.v[e]);
            x1[e] = a * c - b * s;
            x2[e] = b * c + a * s;
        }
        store_floats<VEC>(v, x1);
        store_floats<VEC>(v + half, x2);
    }
}

template <int VEC>
static void launch_rope_apply(kctx *c, bf16 *x, const float2 *table, const int32_t *doc_start,
                              size_t BT, int T, int H, int hd, int inverse) {
    size_t total = BT * H * (hd / 2 / VEC);
    unsigned blocks = cuda_blocks(total, THREADS);
    if (total < (1ull << 31))
        rope_apply_kernel<VEC, uint32_t><<<blocks, THREADS, 0, cuda_stream(c)>>>(
            x, table, doc_start, (uint32_t)BT, T, H, hd, inverse);
    else
        rope_apply_kernel<VEC, size_t><<<blocks, THREADS, 0, cuda_stream(c)>>>(
            x, table, doc_start, BT, T, H, hd, inverse);
}

extern "C" void cuda_rope(kctx *c, void *x, const float *inv_freq, const k_docs *docs, int B,
                          int T, int H, int hd, int inverse) {
    if (hd % 2) {
        k_fail(c, "rope: head dim %d is odd", hd);
        return;
    }
    if (B <= 0 || T <= 0 || H <= 0 || hd <= 0) return;
    int half = hd / 2;
    float2 *table = (float2 *)cuda_scratch(c, (size_t)T * half * sizeof(float2), "rope table");
    if (!table) return;
    rope_table_kernel<<<cuda_blocks((size_t)T * half, THREADS), THREADS, 0, cuda_stream(c)>>>(
        table, inv_freq, T, half);
    cuda_check_launch(c, "rope (table)");
    bf16 *v = (bf16 *)x;
    const int32_t *start = docs ? docs->start : NULL;
    size_t BT = (size_t)B * T;
    if (half % 8 == 0 && cuda_aligned(x, 16))
        launch_rope_apply<8>(c, v, table, start, BT, T, H, hd, inverse);
    else
        launch_rope_apply<1>(c, v, table, start, BT, T, H, hd, inverse);
    cuda_check_launch(c, "rope");
}
