// The CUDA backend: FP8 casts of bf16 tensors with tensorwise or rowwise scaling (F45).
//
// The rounding is the hardware's cvt.rn.satfinite (cuda_fp8.h's __nv_cvt_float_to_fp8 with
// __NV_SATFINITE; sm_89 and up, a software path on older devices): nearest even, saturated to
// +-max, NaN to 0x7f, which base/fp8.h's fp8_from_f32 (the CPU reference) does too; the
// scale and its inverse are base/fp8.h's, computed from the same amax on every thread, and
// each value is multiplied by it in fp32 (one product, nothing to fuse), so the codes are the
// CPU's bit for bit (tests/gpu/check_kernels).
//
// Rowwise: one block a row (blocks loop over rows): the block reads its row once for the
// amax (a fixed-order block max), then again, from L1/L2 where it just was, to cast it: one
// pass over HBM.  Tensorwise needs the whole tensor's amax before the first value is cast, so
// it is two kernels, two passes: the amax (each block's max folded into one word in scratch
// with atomicMax on the bits, which orders non-negative floats as unsigned integers: exact and
// deterministic whatever the order) then the cast; the second reads bf16 again (from L2 where
// the tensor fits in it).  A grid-wide barrier would save a launch, not the second read.
// Rows whose length is a multiple of 8 on 16-byte aligned buffers go 8 values a thread (a
// 16-byte load, an 8-byte store); anything else one value a thread.  The transposed cast
// (k_fp8_cast_t, for the backward's operands) is at the end.
#include "kernels/cuda/cuda_kernels.h"

#include <cuda_fp8.h>

#define THREADS 256
#define MAX_BLOCKS 2048

static __device__ inline uint8_t to_fp8(float x, fp8_format fmt) {
    return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, fmt == FP8_E4M3 ? __NV_E4M3 : __NV_E5M2);
}

// The max over the block, returned to every thread (blockDim.x a multiple of 32).
static __device__ inline float block_max(float v) {
    __shared__ float partial[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
#pragma unroll
    for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = lane < warps ? partial[lane] : 0.0f;
#pragma unroll
    for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    return v;
}

// max |x| over this thread's packs p0, p0 + step, ... < packs (fmaxf, max.f32, drops every NaN,
// quiet or signaling, as the CPU's max_abs).
template <int VEC>
static __device__ inline float thread_amax(const bf16 *x, size_t p0, size_t step, size_t packs) {
    float m = 0.0f;
    for (size_t p = p0; p < packs; p += step) {
        float v[VEC];
        load_floats<VEC>(v, x + p * VEC);
#pragma unroll
        for (int j = 0; j < VEC; j++) m = fmaxf(m, fabsf(v[j]));
    }
    return m;
}

template <int VEC>
static __device__ inline void cast_packs(uint8_t *out, const bf16 *x, float scale, fp8_format fmt,
                                         size_t p0, size_t step, size_t packs) {
    for (size_t p = p0; p < packs; p += step) {
        float v[VEC];
        load_floats<VEC>(v, x + p * VEC);
        cuda_pack<uint8_t, VEC> o;
#pragma unroll
        for (int j = 0; j < VEC; j++) o.v[j] = to_fp8(__fmul_rn(v[j], scale), fmt);
        *reinterpret_cast<cuda_pack<uint8_t, VEC> *>(out + p * VEC) = o;
    }
}

template <int VEC>
__global__ void amax_kernel(unsigned *amax_bits, const bf16 *x, size_t packs) {
    size_t step = (size_t)gridDim.x * blockDim.x;
    float m = block_max(thread_amax<VEC>(x, (size_t)blockIdx.x * blockDim.x + threadIdx.x, step, packs));
    if (threadIdx.x == 0) atomicMax(amax_bits, __float_as_uint(m));
}

template <int VEC>
__global__ void cast_tensor_kernel(uint8_t *out, float *scale_inv, const bf16 *x,
                                   const unsigned *amax_bits, fp8_format fmt, size_t packs) {
    float scale = fp8_scale(__uint_as_float(*amax_bits), fmt);
    if (blockIdx.x == 0 && threadIdx.x == 0) scale_inv[0] = fp8_inverse_scale(scale);
    cast_packs<VEC>(out, x, scale, fmt, (size_t)blockIdx.x * blockDim.x + threadIdx.x,
                    (size_t)gridDim.x * blockDim.x, packs);
}

template <int VEC>
__global__ void cast_rows_kernel(uint8_t *out, float *scale_inv, const bf16 *x, int rows,
                                 int cols, fp8_format fmt) {
    size_t packs = (size_t)cols / VEC;
    for (int r = blockIdx.x; r < rows; r += gridDim.x) {
        const bf16 *row = x + (size_t)r * cols;
        float scale = fp8_scale(block_max(thread_amax<VEC>(row, threadIdx.x, blockDim.x, packs)), fmt);
        if (threadIdx.x == 0) scale_inv[r] = fp8_inverse_scale(scale);
        cast_packs<VEC>(out + (size_t)r * cols, row, scale, fmt, threadIdx.x, blockDim.x, packs);
    }
}

static unsigned grid(size_t items) {
    size_t b = (items + THREADS - 1) / THREADS;
    return (unsigned)(b < MAX_BLOCKS ? (b ? b : 1) : MAX_BLOCKS);
}

// `words` amax words in scratch, zeroed on the stream (NULL after a k_fail).
static unsigned *amax_words(kctx *c, size_t words, const char *what) {
    unsigned *amax = (unsigned *)cuda_scratch(c, words * sizeof(unsigned), what);
    if (!amax || cuda_check_call(c, cudaMemsetAsync(amax, 0, words * sizeof *amax, cuda_stream(c)), what))
        return NULL;
    return amax;
}

// The whole tensor's amax (n values, VEC a thread) into one zeroed scratch word.
template <int VEC> static unsigned *tensor_amax(kctx *c, const bf16 *x, size_t n, const char *what) {
    unsigned *amax = amax_words(c, 1, what);
    if (!amax) return NULL;
    amax_kernel<VEC><<<grid(n / VEC), THREADS, 0, cuda_stream(c)>>>(amax, x, n / VEC);
    cuda_check_launch(c, what);
    return amax;
}

template <int VEC>
static void cast(kctx *c, uint8_t *out, float *scale_inv, const bf16 *x, int rows, int cols,
                 fp8_format fmt, k_fp8_scaling scaling) {
    cudaStream_t s = cuda_stream(c);
    if (scaling == K_FP8_ROWWISE) {
        unsigned blocks = (unsigned)(rows < 4 * MAX_BLOCKS ? rows : 4 * MAX_BLOCKS);
        cast_rows_kernel<VEC><<<blocks, THREADS, 0, s>>>(out, scale_inv, x, rows, cols, fmt);
        return;
    }
    size_t packs = (size_t)rows * (size_t)cols / VEC;
    unsigned *amax = tensor_amax<VEC>(c, x, (size_t)rows * (size_t)cols, "fp8_cast (amax)");
    if (amax)
        cast_tensor_kernel<VEC><<<grid(packs), THREADS, 0, s>>>(out, scale_inv, x, amax, fmt, packs);
}

extern "C" void cuda_fp8_cast(kctx *c, uint8_t *out, float *scale_inv, const void *in, int rows,
                              int cols, fp8_format fmt, k_fp8_scaling scaling) {
    if (k_fp8_bad_args(c, "fp8_cast", fmt, fmt, scaling, 0) || rows <= 0 || cols <= 0) return;
    const bf16 *x = (const bf16 *)in;
    if (cols % 8 == 0 && cuda_aligned(x, 16) && cuda_aligned(out, 8))
        cast<8>(c, out, scale_inv, x, rows, cols, fmt, scaling);
    else
        cast<1>(c, out, scale_inv, x, rows, cols, fmt, scaling);
    cuda_check_launch(c, "fp8_cast");
}

// ---- the transposed cast (k_fp8_cast_t) ----
//
// Rowwise scales of the transpose are the columns' amaxes: a first kernel, a thread a column
// over a slice of TILE_ROWS rows (reads coalesced along the row), folds each slice's max into
// the column's scratch word with atomicMax (exact, deterministic); tensorwise takes the whole
// tensor's amax as k_fp8_cast does.  Then 32 x 32 tiles through shared memory: read along in's
// rows, written along out's rows, each value times its column's scale (or the tensor's).
#define TILE 32
#define TILE_ROWS 256

__global__ void col_amax_kernel(unsigned *amax_bits, const bf16 *x, int rows, int cols) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= cols) return;
    int i0 = blockIdx.y * TILE_ROWS, i1 = i0 + TILE_ROWS < rows ? i0 + TILE_ROWS : rows;
    float m = 0.0f;
    for (int i = i0; i < i1; i++) m = fmaxf(m, fabsf(__bfloat162float(x[(size_t)i * cols + j])));
    atomicMax(amax_bits + j, __float_as_uint(m));
}

// amax_bits: one word (tensorwise, per_col 0) or one a column (per_col 1).
__global__ void cast_t_kernel(uint8_t *out, float *scale_inv, const bf16 *x, const unsigned *amax_bits,
                              int per_col, int rows, int cols, fp8_format fmt) {
    __shared__ float tile[TILE][TILE + 1];
    int i0 = blockIdx.y * TILE, j0 = blockIdx.x * TILE;
    for (int r = threadIdx.y; r < TILE; r += blockDim.y) {
        int i = i0 + r, j = j0 + threadIdx.x;
        if (i < rows && j < cols) tile[r][threadIdx.x] = __bfloat162float(x[(size_t)i * cols + j]);
    }
    __syncthreads();
    for (int r = threadIdx.y; r < TILE; r += blockDim.y) {
        int j = j0 + r, i = i0 + threadIdx.x; // out row j, column i
        if (j >= cols) continue;
        float scale = fp8_scale(__uint_as_float(amax_bits[per_col ? j : 0]), fmt);
        if (blockIdx.y == 0 && threadIdx.x == 0 && (per_col || j == 0)) scale_inv[j] = fp8_inverse_scale(scale);
        if (i < rows) out[(size_t)j * rows + i] = to_fp8(__fmul_rn(tile[threadIdx.x][r], scale), fmt);
    }
}

// Rows and columns multiples of 8 (x 16-byte, out 8-byte aligned: every shape of the model's
// projections): 64 x 64 tiles, 8 values a thread each way, a 16-byte load along in's rows and
// an 8-byte store along out's (the 32 x 32 kernel above moves 2 bytes in, 1 byte out a
// thread, 8.5x off the copy's bandwidth).  The same products, so the same codes.
#define VTILE 64
__global__ void __launch_bounds__(256) cast_t8_kernel(uint8_t *out, float *scale_inv, const bf16 *x,
                                                      const unsigned *amax_bits, int per_col, int rows,
                                                      int cols, fp8_format fmt) {
    __shared__ float tile[VTILE][VTILE + 1];
    int i0 = blockIdx.y * VTILE, j0 = blockIdx.x * VTILE;
    int part = threadIdx.x % 8, line = threadIdx.x / 8; // 8 threads a line of 64 values, 32 lines a pass
    for (int r = line; r < VTILE; r += 32) {
        int i = i0 + r, j = j0 + part * 8;
        if (i >= rows || j >= cols) continue;
        float v[8];
        load_floats<8>(v, x + (size_t)i * cols + j);
#pragma unroll
        for (int k = 0; k < 8; k++) tile[r][part * 8 + k] = v[k];
    }
    __syncthreads();
    for (int r = line; r < VTILE; r += 32) {
        int j = j0 + r, i = i0 + part * 8; // out row j, columns i .. i + 7
        if (j >= cols) continue;
        float scale = fp8_scale(__uint_as_float(amax_bits[per_col ? j : 0]), fmt);
        if (blockIdx.y == 0 && part == 0 && (per_col || j == 0)) scale_inv[j] = fp8_inverse_scale(scale);
        if (i >= rows) continue;
        cuda_pack<uint8_t, 8> o;
#pragma unroll
        for (int k = 0; k < 8; k++) o.v[k] = to_fp8(__fmul_rn(tile[part * 8 + k][r], scale), fmt);
        *reinterpret_cast<cuda_pack<uint8_t, 8> *>(out + (size_t)j * rows + i) = o;
    }
}

extern "C" void cuda_fp8_cast_t(kctx *c, uint8_t *out, float *scale_inv, const void *in, int rows,
                                int cols, fp8_format fmt, k_fp8_scaling scaling) {
    if (k_fp8_bad_args(c, "fp8_cast_t", fmt, fmt, scaling, 0) || rows <= 0 || cols <= 0) return;
    const bf16 *x = (const bf16 *)in;
    cudaStream_t s = cuda_stream(c);
    const char *what = "fp8_cast_t (amax)";
    unsigned *amax;
    int vec = rows % 8 == 0 && cols % 8 == 0 && cuda_aligned(x, 16) && cuda_aligned(out, 8);
    if (scaling == K_FP8_ROWWISE) {
        amax = amax_words(c, (size_t)cols, what);
        if (!amax) return;
        dim3 blocks((unsigned)((cols + THREADS - 1) / THREADS), (unsigned)((rows + TILE_ROWS - 1) / TILE_ROWS));
        col_amax_kernel<<<blocks, THREADS, 0, s>>>(amax, x, rows, cols);
        cuda_check_launch(c, what);
    } else if (!(amax = vec ? tensor_amax<8>(c, x, (size_t)rows * (size_t)cols, what)
                            : tensor_amax<1>(c, x, (size_t)rows * (size_t)cols, what))) {
        return;
    }
    int per_col = scaling == K_FP8_ROWWISE;
    if (vec) {
        dim3 tiles((unsigned)((cols + VTILE - 1) / VTILE), (unsigned)((rows + VTILE - 1) / VTILE));
        cast_t8_kernel<<<tiles, 256, 0, s>>>(out, scale_inv, x, amax, per_col, rows, cols, fmt);
    } else {
        dim3 tiles((unsigned)((cols + TILE - 1) / TILE), (unsigned)((rows + TILE - 1) / TILE));
        cast_t_kernel<<<tiles, dim3(TILE, 8), 0, s>>>(out, scale_inv, x, amax, per_col, rows, cols, fmt);
    }
    cuda_check_launch(c, "fp8_cast_t");
}

// ---- FP8 gathers: casts from fp32 masters, with a scale fixed beforehand ----
//
// compute(x) is k_f32_to_compute's rounding to bf16 (round to nearest even), so the amax and
// the codes are those of k_fp8_cast on the bf16 copy of the same values.

static __device__ inline float as_compute(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

template <int VEC> __global__ void amax_f32_kernel(unsigned *amax_bits, const float *x, size_t packs) {
    float m = 0.0f;
    CUDA_FOR_EACH_PACK(p, packs) {
        float v[VEC];
        load_floats<VEC>(v, x + p * VEC);
#pragma unroll
        for (int j = 0; j < VEC; j++) m = fmaxf(m, fabsf(as_compute(v[j])));
    }
    m = block_max(m);
    if (threadIdx.x == 0) atomicMax(amax_bits, __float_as_uint(m));
}

extern "C" void cuda_fp8_amax_f32(kctx *c, float *amax, const float *x, size_t n) {
    cudaStream_t s = cuda_stream(c);
    if (cuda_check_call(c, cudaMemsetAsync(amax, 0, sizeof *amax, s), "fp8_amax_f32") || !n) return;
    unsigned *bits = reinterpret_cast<unsigned *>(amax); // non-negative floats order as their bits
    if (n % 4 == 0 && cuda_aligned(x, 16))
        amax_f32_kernel<4><<<grid(n / 4), THREADS, 0, s>>>(bits, x, n / 4);
    else
        amax_f32_kernel<1><<<grid(n), THREADS, 0, s>>>(bits, x, n);
    cuda_check_launch(c, "fp8_amax_f32");
}

template <int VEC>
__global__ void cast_f32_kernel(uint8_t *out, const float *x, const float *scale, fp8_format fmt, size_t packs) {
    float sc = *scale;
    CUDA_FOR_EACH_PACK(p, packs) {
        float v[VEC];
        load_floats<VEC>(v, x + p * VEC);
        cuda_pack<uint8_t, VEC> o;
#pragma unroll
        for (int j = 0; j < VEC; j++) o.v[j] = to_fp8(__fmul_rn(as_compute(v[j]), sc), fmt);
        *reinterpret_cast<cuda_pack<uint8_t, VEC> *>(out + p * VEC) = o;
    }
}

extern "C" void cuda_fp8_cast_f32(kctx *c, uint8_t *out, const float *x, size_t n, const float *scale,
                                  fp8_format fmt) {
    if (k_fp8_bad_args(c, "fp8_cast_f32", fmt, fmt, K_FP8_TENSORWISE, 0) || !n) return;
    if (n % 4 == 0 && cuda_aligned(x, 16) && cuda_aligned(out, 4))
        CUDA_LAUNCH_PACKS(cast_f32_kernel, 4, n, out, x, scale, fmt);
    else
        CUDA_LAUNCH_PACKS(cast_f32_kernel, 1, n, out, x, scale, fmt);
    cuda_check_launch(c, "fp8_cast_f32");
}

// The byte transpose: 64 x 64 tiles through shared memory, 4 bytes a thread each way where
// rows and columns are multiples of 4 (every projection's), one byte a thread otherwise.
template <int VEC>
__global__ void __launch_bounds__(256) transpose_kernel(uint8_t *out, const uint8_t *in, int rows, int cols) {
    __shared__ uint8_t tile[VTILE][VTILE + 4];
    const int per_line = VTILE / VEC, lines = 256 / per_line;
    int i0 = blockIdx.y * VTILE, j0 = blockIdx.x * VTILE;
    int part = threadIdx.x % per_line, line = threadIdx.x / per_line;
    for (int r = line; r < VTILE; r += lines) {
        int i = i0 + r, j = j0 + part * VEC;
        if (i >= rows || j >= cols) continue;
        cuda_pack<uint8_t, VEC> v = *reinterpret_cast<const cuda_pack<uint8_t, VEC> *>(in + (size_t)i * cols + j);
#pragma unroll
        for (int k = 0; k < VEC; k++) tile[r][part * VEC + k] = v.v[k];
    }
    __syncthreads();
    for (int r = line; r < VTILE; r += lines) {
        int j = j0 + r, i = i0 + part * VEC; // out row j, columns i .. i + VEC - 1
        if (j >= cols || i >= rows) continue;
        cuda_pack<uint8_t, VEC> o;
#pragma unroll
        for (int k = 0; k < VEC; k++) o.v[k] = tile[part * VEC + k][r];
        *reinterpret_cast<cuda_pack<uint8_t, VEC> *>(out + (size_t)j * rows + i) = o;
    }
}

extern "C" void cuda_fp8_transpose(kctx *c, uint8_t *out, const uint8_t *in, int rows, int cols) {
    if (rows <= 0 || cols <= 0) return;
    dim3 tiles((unsigned)((cols + VTILE - 1) / VTILE), (unsigned)((rows + VTILE - 1) / VTILE));
    if (rows % 4 == 0 && cols % 4 == 0 && cuda_aligned(in, 4) && cuda_aligned(out, 4))
        transpose_kernel<4><<<tiles, 256, 0, cuda_stream(c)>>>(out, in, rows, cols);
    else
        transpose_kernel<1><<<tiles, 256, 0, cuda_stream(c)>>>(out, in, rows, cols);
    cuda_check_launch(c, "fp8_transpose");
}
