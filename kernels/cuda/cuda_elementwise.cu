// The CUDA backend: casts, elementwise ops (scale, dropout), the sum of squares and SwiGLU.
//
// Each kernel handles VEC consecutive elements per thread: 16-byte accesses (8 bf16 or 4
// floats) when n is a multiple of that and every pointer is aligned for it, else one element
// (VEC = 1).  Grids are capped (cuda_blocks), so kernels loop over their packs.  Math is fp32;
// bf16 results are rounded to nearest even.
#include "kernels/cuda/cuda_kernels.h"

#include "base/philox.h"

#define THREADS 256

// ---- casts ----

// dst = bf16(src)
template <int VEC> __global__ void f32_to_bf16_kernel(bf16 *dst, const float *src, size_t packs) {
    CUDA_FOR_EACH_PACK(p, packs) {
        float x[VEC];
        load_floats<VEC>(x, src + p * VEC);
        store_floats<VEC>(dst + p * VEC, x);
    }
}

// dst = float(src) (exact)
template <int VEC> __global__ void bf16_to_f32_kernel(float *dst, const bf16 *src, size_t packs) {
    CUDA_FOR_EACH_PACK(p, packs) {
        float x[VEC];
        load_floats<VEC>(x, src + p * VEC);
        store_floats<VEC>(dst + p * VEC, x);
    }
}

extern "C" void cuda_f32_to_compute(kctx *c, void *dst, const float *src, size_t n) {
    if (!n) return;
    if (n % 4 == 0 && cuda_aligned(src, 16) && cuda_aligned(dst, 8))
        CUDA_LAUNCH_PACKS(f32_to_bf16_kernel, 4, n, (bf16 *)dst, src);
    else
        CUDA_LAUNCH_PACKS(f32_to_bf16_kernel, 1, n, (bf16 *)dst, src);
    cuda_check_launch(c, "f32_to_compute");
}

extern "C" void cuda_compute_to_f32(kctx *c, float *dst, const void *src, size_t n) {
    if (!n) return;
    if (n % 4 == 0 && cuda_aligned(dst, 16) && cuda_aligned(src, 8))
        CUDA_LAUNCH_PACKS(bf16_to_f32_kernel, 4, n, dst, (const bf16 *)src);
    else
        CUDA_LAUNCH_PACKS(bf16_to_f32_kernel, 1, n, dst, (const bf16 *)src);
    cuda_check_launch(c, "compute_to_f32");
}

// ---- bf16 elementwise ----

// dst += src, added in fp32 (T: bf16 or float)
template <int VEC, typename T> __global__ void accumulate_kernel(T *dst, const T *src, size_t packs) {
    CUDA_FOR_EACH_PACK(p, packs) {
        float x[VEC], y[VEC];
        load_floats<VEC>(x, dst + p * VEC);
        load_floats<VEC>(y, src + p * VEC);
#pragma unroll
        for (int j = 0; j < VEC; j++) x[j] += y[j];
        store_floats<VEC>(dst + p * VEC, x);
    }
}

static bool bf16_vec8(size_t n, const void *a, const void *b, const void *d) {
    return n % 8 == 0 && cuda_aligned(a, 16) && cuda_aligned(b, 16) && cuda_aligned(d, 16);
}

extern "C" void cuda_accumulate(kctx *c, void *dst, const void *src, size_t n) {
    if (!n) return;
    bf16 *d = (bf16 *)dst;
    const bf16 *s = (const bf16 *)src;
    if (bf16_vec8(n, dst, dst, src))
        CUDA_LAUNCH_PACKS(accumulate_kernel, 8, n, d, s);
    else
        CUDA_LAUNCH_PACKS(accumulate_kernel, 1, n, d, s);
    cuda_check_launch(c, "accumulate");
}

// x *= s
template <int VEC> __global__ void scale_kernel(bf16 *x, float s, size_t packs) {
    CUDA_FOR_EACH_PACK(p, packs) {
        float v[VEC];
        load_floats<VEC>(v, x + p * VEC);
#pragma unroll
        for (int j = 0; j < VEC; j++) v[j] *= s;
        store_floats<VEC>(x + p * VEC, v);
    }
}

extern "C" void cuda_scale(kctx *c, void *x, float s, size_t n) {
    if (!n) return;
    bf16 *p = (bf16 *)x;
    if (n % 8 == 0 && cuda_aligned(x, 16))
        CUDA_LAUNCH_PACKS(scale_kernel, 8, n, p, s);
    else
        CUDA_LAUNCH_PACKS(scale_kernel, 1, n, p, s);
    cuda_check_launch(c, "scale");
}

// ---- dropout ----

// One thread per group of 4 consecutive elements e = 4q .. 4q+3 of row b (a row is a sample's
// T * cols elements; its last group may be shorter): one Philox block decides all four
// (philox_dropout_keep4, the CPU's philox_dropout_keep), so the masks are the CPU's bit for
// bit.  VEC4: rows of a multiple of 4 elements and 8-byte aligned buffers, so a group is one
// 8-byte load (two when accumulating) and one store.  The product is rounded on its own
// (__fmul_rn: no FMA with the accumulation), as on the CPU, then the result once to bf16.
template <bool VEC4>
__global__ void dropout_kernel(bf16 *out, const bf16 *in, const int64_t *samples, uint64_t seed,
                               uint32_t site, size_t row, size_t row_groups, size_t groups,
                               uint32_t threshold, float keep_scale, int accumulate) {
    CUDA_FOR_EACH_PACK(g, groups) {
        size_t b = g / row_groups, q = g - b * row_groups, e = 4 * q, at = b * row + e;
        int count = VEC4 || row - e >= 4 ? 4 : (int)(row - e);
        int keep[4];
        philox_dropout_keep4(seed, (uint64_t)samples[b], site, q, threshold, keep);
        float x[4] = {0.0f, 0.0f, 0.0f, 0.0f}, o[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (VEC4) {
            load_floats<4>(x, in + at);
            if (accumulate) load_floats<4>(o, out + at);
        } else {
            for (int j = 0; j < count; j++) {
                x[j] = __bfloat162float(in[at + j]);
                if (accumulate) o[j] = __bfloat162float(out[at + j]);
            }
        }
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float v = keep[j] ? __fmul_rn(x[j], keep_scale) : 0.0f;
            o[j] = accumulate ? o[j] + v : v;
        }
        if (VEC4) {
            store_floats<4>(out + at, o);
        } else {
            for (int j = 0; j < count; j++) out[at + j] = __float2bfloat16_rn(o[j]);
        }
    }
}

extern "C" void cuda_dropout(kctx *c, void *out, const void *in, const int64_t *samples,
                             uint64_t seed, uint32_t site, int B, int T, int cols, float p,
                             int accumulate) {
    if (!(p >= 0.0f && p < 1.0f)) {
        k_fail(c, "dropout: probability %g is outside [0, 1)", (double)p);
        return;
    }
    if (B <= 0 || T <= 0 || cols <= 0) return;
    size_t row = (size_t)T * (size_t)cols, row_groups = (row + 3) / 4;
    size_t groups = (size_t)B * row_groups;
    uint32_t threshold = philox_dropout_threshold(p);
    float keep_scale = 1.0f / (1.0f - p);
    bf16 *o = (bf16 *)out;
    const bf16 *x = (const bf16 *)in;
    unsigned blocks = cuda_blocks(groups, THREADS);
    if (row % 4 == 0 && cuda_aligned(out, 8) && cuda_aligned(in, 8))
        dropout_kernel<true><<<blocks, THREADS, 0, cuda_stream(c)>>>(
            o, x, samples, seed, site, row, row_groups, groups, threshold, keep_scale, accumulate);
    else
        dropout_kernel<false><<<blocks, THREADS, 0, cuda_stream(c)>>>(
            o, x, samples, seed, site, row, row_groups, groups, threshold, keep_scale, accumulate);
    cuda_check_launch(c, "dropout");
}

// ---- fp32 elementwise ----

extern "C" void cuda_add_f32(kctx *c, float *dst, const float *src, size_t n) {
    if (!n) return;
    if (n % 4 == 0 && cuda_aligned(dst, 16) && cuda_aligned(src, 16))
        CUDA_LAUNCH_PACKS(accumulate_kernel, 4, n, dst, src);
    else
        CUDA_LAUNCH_PACKS(accumulate_kernel, 1, n, dst, src);
    cuda_check_launch(c, "add_f32");
}

// ---- sum of squares: deterministic two-pass reduction in double ----

#define SUMSQ_BLOCKS 1024 // a fixed grid: the same partial sums on every run and device

// partial[block] = sum of x^2 over the packs this block strides over
template <int VEC> __global__ void sumsq_partial_kernel(double *partial, const float *x, size_t packs) {
    double acc = 0.0;
    CUDA_FOR_EACH_PACK(p, packs) {
        float v[VEC];
        load_floats<VEC>(v, x + p * VEC);
#pragma unroll
        for (int j = 0; j < VEC; j++) acc += (double)v[j] * v[j];
    }
    acc = block_sum(acc);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// *out += sum of the partials, in order
__global__ void sumsq_finish_kernel(float *out, const double *partial, int count) {
    double acc = 0.0;
    for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partial[i];
    acc = block_sum(acc);
    if (threadIdx.x == 0) *out = (float)(*out + acc);
}

extern "C" void cuda_sumsq_f32(kctx *c, float *out, const float *x, size_t n) {
    if (!n) return;
    int vec = n % 4 == 0 && cuda_aligned(x, 16) ? 4 : 1;
    size_t packs = n / vec;
    size_t wanted = (packs + THREADS - 1) / THREADS;
    int blocks = wanted < SUMSQ_BLOCKS ? (int)wanted : SUMSQ_BLOCKS;
    double *partial =
        (double *)cuda_scratch(c, (size_t)blocks * sizeof(double), "sumsq_f32 scratch");
    if (!partial) return;
    if (vec == 4)
        sumsq_partial_kernel<4><<<blocks, THREADS, 0, cuda_stream(c)>>>(partial, x, packs);
    else
        sumsq_partial_kernel<1><<<blocks, THREADS, 0, cuda_stream(c)>>>(partial, x, packs);
    cuda_check_launch(c, "sumsq_f32");
    sumsq_finish_kernel<<<1, 1024, 0, cuda_stream(c)>>>(out, partial, blocks);
    cuda_check_launch(c, "sumsq_f32 (finish)");
}

// ---- SwiGLU ----

__device__ inline float sigmoid(float x) {
    return 1.0f / (1.0f + expf(-x)); // expf overflows to inf for very negative x: gives 0
}

// out = silu(gate) * up
template <int VEC>
__global__ void swiglu_fwd_kernel(bf16 *out, const bf16 *gate, const bf16 *up, size_t packs) {
    CUDA_FOR_EACH_PACK(p, packs) {
        float g[VEC], u[VEC];
        load_floats<VEC>(g, gate + p * VEC);
        load_floats<VEC>(u, up + p * VEC);
#pragma unroll
        for (int j = 0; j < VEC; j++) g[j] = g[j] * sigmoid(g[j]) * u[j];
        store_floats<VEC>(out + p * VEC, g);
    }
}

extern "C" void cuda_swiglu_fwd(kctx *c, void *out, const void *gate, const void *up, size_t n) {
    if (!n) return;
    bf16 *o = (bf16 *)out;
    const bf16 *g = (const bf16 *)gate, *u = (const bf16 *)up;
    if (bf16_vec8(n, out, gate, up))
        CUDA_LAUNCH_PACKS(swiglu_fwd_kernel, 8, n, o, g, u);
    else
        CUDA_LAUNCH_PACKS(swiglu_fwd_kernel, 1, n, o, g, u);
    cuda_check_launch(c, "swiglu_fwd");
}

// dgate = dout * up * silu'(gate), silu'(g) = s (1 + g (1 - s)) with s = sigmoid(g);
// dup = dout * silu(gate).  Every input is read before an output is written (they may alias).
template <int VEC>
__global__ void swiglu_bwd_kernel(bf16 *dgate, bf16 *dup, const bf16 *dout, const bf16 *gate,
                                  const bf16 *up, size_t packs) {
    CUDA_FOR_EACH_PACK(p, packs) {
        float d[VEC], g[VEC], u[VEC];
        load_floats<VEC>(d, dout + p * VEC);
        load_floats<VEC>(g, gate + p * VEC);
        load_floats<VEC>(u, up + p * VEC);
        float dg[VEC], du[VEC];
#pragma unroll
        for (int j = 0; j < VEC; j++) {
            float s = sigmoid(g[j]);
            dg[j] = d[j] * u[j] * s * (1.0f + g[j] * (1.0f - s));
            du[j] = d[j] * g[j] * s;
        }
        store_floats<VEC>(dgate + p * VEC, dg);
        store_floats<VEC>(dup + p * VEC, du);
    }
}

extern "C" void cuda_swiglu_bwd(kctx *c, void *dgate, void *dup, const void *dout,
                                const void *gate, const void *up, size_t n) {
    if (!n) return;
    bf16 *dg = (bf16 *)dgate, *du = (bf16 *)dup;
    const bf16 *d = (const bf16 *)dout, *g = (const bf16 *)gate, *u = (const bf16 *)up;
    if (bf16_vec8(n, dgate, dup, dout) && cuda_aligned(gate, 16) && cuda_aligned(up, 16))
        CUDA_LAUNCH_PACKS(swiglu_bwd_kernel, 8, n, dg, du, d, g, u);
    else
        CUDA_LAUNCH_PACKS(swiglu_bwd_kernel, 1, n, dg, du, d, g, u);
    cuda_check_launch(c, "swiglu_bwd");
}
