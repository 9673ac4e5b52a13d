// The CUDA backend: token embedding lookup and its deterministic backward pass.
//
// Backward: rows are grouped by token with a stable radix sort of (token, row) pairs (CUB),
// so each token's rows sit together in row order; the block that meets the first row of a
// token sums all of that token's rows in that order and adds the sum into dwte once.  No
// floating-point atomics, so the result is the same on every run.
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/cuda_kernels.h"

#define THREADS 128

static size_t round_up(size_t n, size_t to) {
    return (n + to - 1) / to * to;
}

// out[n,:] = wte[tokens[n],:]; a token outside [0, V) gives a zero row and a report.
// One block per row.
template <int VEC>
__global__ void embedding_fwd_kernel(bf16 *out, const int32_t *tokens, const bf16 *wte, int C,
                                     int V, cuda_input_error *err) {
    int n = blockIdx.x;
    int tok = tokens[n];
    bool valid = tok >= 0 && tok < V;
    if (!valid && threadIdx.x == 0) cuda_report(err, CUDA_EMBEDDING_TOKEN, tok, n, V);
    const bf16 *src = wte + (size_t)(valid ? tok : 0) * C;
    bf16 *dst = out + (size_t)n * C;
    for (int i = threadIdx.x * VEC; i < C; i += blockDim.x * VEC) {
        float x[VEC];
        load_floats<VEC>(x, src + i);
        if (!valid) {
#pragma unroll
            for (int j = 0; j < VEC; j++) x[j] = 0.0f;
        }
        store_floats<VEC>(dst + i, x); // bf16 -> float -> bf16 is exact
    }
}

extern "C" void cuda_embedding_fwd(kctx *c, void *out, const int32_t *tokens, const void *wte,
                                   int N, int C, int V) {
    if (N <= 0 || C <= 0) return;
    bf16 *o = (bf16 *)out;
    const bf16 *table = (const bf16 *)wte;
    cuda_input_error *err = cuda_state(c)->error;
    if (C % 8 == 0 && cuda_aligned(out, 16) && cuda_aligned(wte, 16))
        embedding_fwd_kernel<8><<<N, THREADS, 0, cuda_stream(c)>>>(o, tokens, table, C, V, err);
    else
        embedding_fwd_kernel<1><<<N, THREADS, 0, cuda_stream(c)>>>(o, tokens, table, C, V, err);
    cuda_check_launch(c, "embedding_fwd");
}

// keys[n] = tokens[n], or V (sorted last, then skipped) for a token outside [0, V), which is
// reported; rows[n] = n.
__global__ void embedding_keys_kernel(unsigned *keys, int *rows, const int32_t *tokens, int N,
                                      int V, cuda_input_error *err) {
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    int tok = tokens[n];
    if (tok < 0 || tok >= V) {
        cuda_report(err, CUDA_EMBEDDING_BWD_TOKEN, tok, n, V);
        tok = V;
    }
    keys[n] = (unsigned)tok;
    rows[n] = n;
}

// Block (i, slice): when sorted position i starts a run of equal keys, sums that run's dout
// rows (in row order: the sort is stable) over this block's columns and adds the sum into
// dwte[key].  Every other block returns at once.
template <int VEC>
__global__ void embedding_bwd_kernel(float *dwte, const bf16 *dout, const unsigned *keys,
                                     const int *rows, int N, int C, int V) {
    int i = blockIdx.x;
    unsigned key = keys[i];
    if (key == (unsigned)V || (i > 0 && keys[i - 1] == key)) return;
    int col = (blockIdx.y * blockDim.x + threadIdx.x) * VEC;
    if (col >= C) return;
    int end = i + 1;
    while (end < N && keys[end] == key) end++;
    float acc[VEC];
#pragma unroll
    for (int j = 0; j < VEC; j++) acc[j] = 0.0f;
#pragma unroll 4
    for (int r = i; r < end; r++) {
        float x[VEC];
        load_floats<VEC>(x, dout + (size_t)rows[r] * C + col);
#pragma unroll
        for (int j = 0; j < VEC; j++) acc[j] += x[j];
    }
    float *grad = dwte + (size_t)key * C + col;
    float g[VEC];
    load_floats<VEC>(g, grad);
#pragma unroll
    for (int j = 0; j < VEC; j++) g[j] += acc[j];
    store_floats<VEC>(grad, g);
}

extern "C" void cuda_embedding_bwd(kctx *c, float *dwte, const void *dout,
                                   const int32_t *tokens, int N, int C, int V) {
    if (N <= 0 || C <= 0) return;
    cudaStream_t stream = cuda_stream(c);
    int bits = 1; // enough key bits for 0..V (V marks bad tokens)
    while (bits < 31 && (1 << bits) <= V) bits++;

    // scratch: keys, rows, sorted keys, sorted rows, then CUB's temporary storage
    size_t temp_bytes = 0;
    if (cuda_check_call(c,
                        cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes,
                                                        (const unsigned *)nullptr,
                                                        (unsigned *)nullptr, (const int *)nullptr,
                                                        (int *)nullptr, N, 0, bits, stream),
                        "embedding_bwd: sizing the sort"))
        return;
    size_t array_bytes = round_up((size_t)N * sizeof(int), 256);
    char *scratch = (char *)cuda_scratch(c, 4 * array_bytes + temp_bytes, "embedding_bwd scratch");
    if (!scratch) return;
    unsigned *keys = (unsigned *)scratch, *sorted_keys = (unsigned *)(scratch + 2 * array_bytes);
    int *rows = (int *)(scratch + array_bytes);
    int *sorted_rows = (int *)(scratch + 3 * array_bytes);
    void *temp = scratch + 4 * array_bytes;

    embedding_keys_kernel<<<(N + 255) / 256, 256, 0, stream>>>(keys, rows, tokens, N, V,
                                                               cuda_state(c)->error);
    cuda_check_launch(c, "embedding_bwd (keys)");
    if (cuda_check_call(c,
                        cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys, sorted_keys, rows,
                                                        sorted_rows, N, 0, bits, stream),
                        "embedding_bwd: sorting rows by token"))
        return;

    const bf16 *d = (const bf16 *)dout;
    if (C % 8 == 0 && cuda_aligned(dwte, 32) && cuda_aligned(dout, 16)) {
        dim3 grid(N, (C + THREADS * 8 - 1) / (THREADS * 8));
        embedding_bwd_kernel<8><<<grid, THREADS, 0, stream>>>(dwte, d, sorted_keys, sorted_rows,
                                                              N, C, V);
    } else {
        dim3 grid(N, (C + THREADS - 1) / THREADS);
        embedding_bwd_kernel<1><<<grid, THREADS, 0, stream>>>(dwte, d, sorted_keys, sorted_rows,
                                                              N, C, V);
    }
    cuda_check_launch(c, "embedding_bwd");
}
