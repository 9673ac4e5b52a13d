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

// One thread per (b, t, i < hd/2), looping over the heads: pairs (i, i + hd/2) rotate by
// angle t * inv_freq[i] (negated for the inverse).  The angle and its sine and cosine are
// computed in double: t * inv_freq reaches 1e5 radians at long contexts, where fp32 would
// lose about 1e-2 of the angle.
// doc_start: NULL, or each token's document start (k_docs), its position then t - start.
__global__ void rope_kernel(bf16 *x, const float *inv_freq, const int32_t *doc_start, int B,
                            int T, int H, int hd, int inverse) {
    int half = hd / 2;
    size_t total = (size_t)B * T * half;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (size_t)gridDim.x * blockDim.x) {
        int i = (int)(idx % half);
        size_t bt = idx / half;
        int t = (int)(bt % T), pos = doc_start ? t - doc_start[bt] : t;
        double sn, cs;
        sincos((double)pos * inv_freq[i], &sn, &cs);
        float c = (float)cs, s = inverse ? (float)-sn : (float)sn;
        bf16 *v = x + bt * H * hd;
        for (int h = 0; h < H; h++, v += hd) {
            float x1 = __bfloat162float(v[i]), x2 = __bfloat162float(v[i + half]);
            v[i] = __float2bfloat16_rn(x1 * c - x2 * s);
            v[i + half] = __float2bfloat16_rn(x2 * c + x1 * s);
        }
    }
}

extern "C" void cuda_rope(kctx *c, void *x, const float *inv_freq, const k_docs *docs, int B,
                          int T, int H, int hd, int inverse) {
    if (hd % 2) {
        k_fail(c, "rope: head dim %d is odd", hd);
        return;
    }
    size_t total = (size_t)B * T * (hd / 2);
    if (B <= 0 || T <= 0 || H <= 0 || total == 0) return;
    rope_kernel<<<cuda_blocks(total, THREADS), THREADS, 0, cuda_stream(c)>>>(
        (bf16 *)x, inv_freq, docs ? docs->start : NULL, B, T, H, hd, inverse);
    cuda_check_launch(c, "rope");
}
