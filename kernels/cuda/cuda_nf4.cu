// The CUDA backend: NF4 dequantization (QLoRA's frozen base weights, bf16 out).
//
// Memory-bound (half a byte in, two bytes out per weight), so: each thread takes a pack of 16
// consecutive values (8 bytes of packed, one 8-byte load; two 16-byte stores of bf16), all in
// one 64-value block, so its absmax is looked up once.  The code tables live in __constant__
// memory (base/nf4_tables.h, the values proto/nf4.c and the CPU kernel use) and are copied to
// shared memory at each block's start: the 16 values of a pack index the code table with
// different codes, which shared memory serves in one access (16 entries, 16 banks) where the
// constant cache would serialise them.  Grids are capped so that blocks loop and the copy is
// paid rarely.  Buffers not aligned for the packs (or the < 16 values of a tail) go through a
// one-value-per-thread kernel.  Math as the CPU's: code * absmax in fp32 (the nested absmax
// with __fmul_rn/__fadd_rn, never fused), then one rounding to bf16.
#include "kernels/cuda/cuda_kernels.h"

#include "base/nf4_tables.h"

#define THREADS 256
#define MAX_BLOCKS 2048 // 8 blocks of 256 threads on each of 132 SMs (H200) fit twice over
#define PACK 16         // values a thread takes at once

__constant__ float nf4_code_const[16] = NF4_CODE_VALUES;
__constant__ float nf4_dynamic_map_const[256] = NF4_DYNAMIC_MAP_VALUES;

struct nf4_smem {
    float code[16];
    float map[256]; // used under double quantization only
};

template <bool NESTED> __device__ inline void load_tables(nf4_smem &t) {
    for (int i = threadIdx.x; i < 16; i += blockDim.x) t.code[i] = nf4_code_const[i];
    if (NESTED)
        for (int i = threadIdx.x; i < 256; i += blockDim.x) t.map[i] = nf4_dynamic_map_const[i];
    __syncthreads();
}

// Block b's absmax: fp32 as stored, or map[code] * nested + offset (two fp32 roundings).
template <bool NESTED>
__device__ inline float block_absmax(const nf4_smem &t, const void *absmax, const float *nested,
                                     float offset, size_t b) {
    if (!NESTED) return __ldg((const float *)absmax + b);
    float centred = __fmul_rn(t.map[__ldg((const uint8_t *)absmax + b)], __ldg(nested + b / NF4_NESTED_BLOCK));
    return __fadd_rn(centred, offset);
}

// Packs of 16 values: packed 8-byte aligned, out 16-byte aligned.
template <bool NESTED>
__global__ void nf4_dequant_packs_kernel(bf16 *out, const uint2 *packed, const void *absmax,
                                         const float *nested, float offset, size_t packs) {
    __shared__ nf4_smem t;
    load_tables<NESTED>(t);
    CUDA_FOR_EACH_PACK(p, packs) {
        uint2 bytes = __ldg(packed + p);
        float scale = block_absmax<NESTED>(t, absmax, nested, offset, p * PACK / NF4_BLOCK);
        cuda_pack<bf16, 8> lo, hi;
#pragma unroll
        for (int j = 0; j < 4; j++) { // byte j of each word: first value in the high nibble
            uint32_t a = (bytes.x >> (8 * j)) & 0xffu, b = (bytes.y >> (8 * j)) & 0xffu;
            lo.v[2 * j] = __float2bfloat16_rn(t.code[a >> 4] * scale);
            lo.v[2 * j + 1] = __float2bfloat16_rn(t.code[a & 15] * scale);
            hi.v[2 * j] = __float2bfloat16_rn(t.code[b >> 4] * scale);
            hi.v[2 * j + 1] = __float2bfloat16_rn(t.code[b & 15] * scale);
        }
        cuda_pack<bf16, 8> *o = reinterpret_cast<cuda_pack<bf16, 8> *>(out + p * PACK);
        o[0] = lo;
        o[1] = hi;
    }
}

// One value a thread, values first .. n-1 (any alignment).
template <bool NESTED>
__global__ void nf4_dequant_values_kernel(bf16 *out, const uint8_t *packed, const void *absmax,
                                          const float *nested, float offset, size_t first,
                                          size_t n) {
    __shared__ nf4_smem t;
    load_tables<NESTED>(t);
    for (size_t i = first + (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint8_t byte = __ldg(packed + i / 2), code = i % 2 ? byte & 15 : byte >> 4;
        float scale = block_absmax<NESTED>(t, absmax, nested, offset, i / NF4_BLOCK);
        out[i] = __float2bfloat16_rn(t.code[code] * scale);
    }
}

static unsigned grid(size_t items) {
    size_t b = (items + THREADS - 1) / THREADS;
    return (unsigned)(b < MAX_BLOCKS ? (b ? b : 1) : MAX_BLOCKS);
}

template <bool NESTED>
static void dequant(kctx *c, bf16 *out, const uint8_t *packed, const void *absmax,
                    const float *nested, float offset, size_t n) {
    cudaStream_t s = cuda_stream(c);
    size_t packs = cuda_aligned(packed, 8) && cuda_aligned(out, 16) ? n / PACK : 0;
    if (packs)
        nf4_dequant_packs_kernel<NESTED><<<grid(packs), THREADS, 0, s>>>(out, (const uint2 *)packed, absmax, nested, offset, packs);
    size_t first = packs * PACK;
    if (first < n)
        nf4_dequant_values_kernel<NESTED><<<grid(n - first), THREADS, 0, s>>>(out, packed, absmax, nested, offset, first, n);
}

extern "C" void cuda_nf4_dequant(kctx *c, void *out, const uint8_t *packed, const void *absmax,
                                 const float *nested_absmax, float offset, size_t n) {
    if (!n) return;
    if (nested_absmax)
        dequant<true>(c, (bf16 *)out, packed, absmax, nested_absmax, offset, n);
    else
        dequant<false>(c, (bf16 *)out, packed, absmax, NULL, offset, n);
    cuda_check_launch(c, "nf4_dequant");
}
