// The CUDA backend's causal attention on Hopper (sm_90a only; cuda_attention.cu dispatches here
// on a compute capability 9.0 device, and keeps its mma.sync kernels for sm_80-89).  The same
// contract as cuda_attention.cu: [B, T, H, hd] bf16 (hd 64 or 128), grouped-query heads, the
// log-sum-exp [B, Hq, T] in natural log, varlen documents (k_docs), a deterministic backward.
//
// What Hopper adds, after the FlashAttention-3 schedule:
//   - wgmma: a warpgroup (4 warps, 128 threads) multiplies 64 rows at a time, its B operand
//     (and A, except for the probabilities) read straight from shared memory through a matrix
//     descriptor; the fp32 accumulators of S = Q K^T become the bf16 A operand of O += P V in
//     registers (an accumulator's layout is the A fragment's, as with mma.sync);
//   - TMA: one thread copies whole tiles global -> shared (cp.async.bulk.tensor, 128-byte
//     swizzle: in row r of a 64-column chunk the 16-byte unit u sits at u ^ (r % 8), which
//     is the layout wgmma's SW128 descriptors read, without bank conflicts), rows past T
//     zero-filled by the hardware; completion is counted on an mbarrier in bytes;
//   - warp specialisation: a block is two consumer warpgroups (128 query rows; dK/dV: 128
//     key rows) and a producer warpgroup (one thread issues the copies; setmaxnreg gives its
//     registers to the consumers), which streams tiles through a STAGES-deep ring of buffers
//     guarded by full (TMA landed) and empty (both consumers done) mbarriers;
//   - overlap: within a consumer, tile j's first product is issued before tile j-1's second,
//     so that the softmax of tile j runs while the tensor cores work (the forward);
//     between the consumers, pingpong turns (named barriers) stagger their products.
// Measured on the H200 (bench/NOTES.md, F30): at Llama-2-7B T=2048 the forward runs 443
// TFLOP/s, forward+backward 358 (1.9x and 2.0x the mma.sync kernels, 0.84x and 0.80x cuDNN).
//
// The forward is persistent, a block a multiprocessor over the items (query head, batch, 128
// queries), taken a kv head's query heads at a time (fwd_item: its keys and values stay in
// L2); the backward a block per (kv head, batch, 128 keys) looping over the group's query heads, all
// five products in one kernel (see "backward" below).  Causal tiles past the diagonal are
// skipped whole, and varlen tiles before a document's start (or after its end).  Every output
// is summed in a fixed order (dQ's shares across blocks included): the same bits every run.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_attention_docs.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "cuda_attention_sm90.cu is built for sm_90a only (see the Makefile)"
#endif

#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

namespace {

// Warpgroups 0 and 1 compute; warpgroup 2 produces (one thread issues the copies).  The
// producer gives its registers to the consumers (setmaxnreg): 128 x 24 + 256 x 240 <= 64K.
constexpr int CONSUMERS = 2;
constexpr int THREADS = (CONSUMERS + 1) * 128;
constexpr int PRODUCER_REGS = 24, CONSUMER_REGS = 240;
constexpr int ROWS = 64 * CONSUMERS; // a block's queries (forward) or keys (backward)
// Buffers in the producer's ring: 3 (with 2, F30's backward ran 15% slower on the H200).
constexpr int STAGES = 3;
constexpr int SW = 128;              // bytes of a swizzled row: 64 bf16

__device__ __forceinline__ int imax(int a, int b) {
    return a > b ? a : b;
}

// ---- mbarriers, TMA ----

__device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

extern __shared__ __align__(1024) unsigned char sm90_smem[];

// The dynamic shared memory, from a 1024-byte boundary (the swizzle repeats every 1024 bytes,
// so a tile must start on one); launches ask for 1024 bytes more than they use.
__device__ __forceinline__ uint32_t smem_base() {
    return (smem_u32(sm90_smem) + 1023u) & ~1023u;
}

__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

// Makes the barriers' initialisation visible to the async proxy (TMA) and other threads.
__device__ __forceinline__ void mbar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

__device__ __forceinline__ void mbar_expect_bytes(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// Waits for the phase of parity `parity` to complete.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    asm volatile("{\n.reg .pred done;\nWAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra WAIT;\n}\n" ::"r"(bar),
                 "r"(parity)
                 : "memory");
}

// One box of a 4-D tensor map (columns, head, row, batch) into shared memory at dst.
__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap *map, int col, int head,
                                         int row, int batch, uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
                 "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(head), "r"(row), "r"(batch),
                 "r"(bar)
                 : "memory");
}

// `bytes` (a multiple of 16) contiguous bytes into shared memory at dst.
__device__ __forceinline__ void bulk_load(uint32_t dst, const void *src, uint32_t bytes,
                                          uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1], %2, [%3];\n" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}

// A tile of R rows x HD columns, as TMA writes it: HD/64 chunks of R swizzled rows.  Rows
// [row0, row0 + R) of one head; `bar` learns of every byte.
template <int R, int HD>
__device__ __forceinline__ void tma_tile(uint32_t dst, const CUtensorMap *map, int head, int row0,
                                         int batch, uint32_t bar) {
#pragma unroll
    for (int c = 0; c < HD / 64; c++) tma_load(dst + c * R * SW, map, c * 64, head, row0, batch, bar);
}

template <int N> __device__ __forceinline__ void regs_shrink() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N> __device__ __forceinline__ void regs_grow() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

// Pingpong: the two consumers take turns issuing their products, so that one's softmax runs
// while the other's products do (the forward and dQ without docs, where both take the same
// number of turns; dK/dV always, a turn a step).  Warpgroup wg waits at named barrier 3 + wg
// for the other's signal, issues, then signals the other; warpgroup 1 signals first.
__device__ __forceinline__ void bar_sync(int id, int n) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int n) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

__device__ __forceinline__ void turn_wait(int wg) {
    bar_sync(3 + wg, 256);
}
__device__ __forceinline__ void turn_pass(int wg) {
    bar_arrive(3 + (1 - wg), 256);
}

// Lets the other 127 threads of warpgroup `wg` meet this one (named barrier 1 + wg).
__device__ __forceinline__ void warpgroup_sync(int wg) {
    bar_sync(1 + wg, 128);
}

// ---- wgmma ----

// A shared-memory matrix descriptor, 128-byte swizzle: start address, leading and stride
// byte offsets (each >> 4), layout type 1 (SW128) in bits 62-63.
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr, uint32_t lead, uint32_t stride) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | (uint64_t)(lead >> 4) << 16 |
           (uint64_t)(stride >> 4) << 32 | 1ull << 62;
}

// Operand rows along M or N, K along the row (K-major; Q, K, V, dO as the multiplicand whose
// rows are the product's rows or columns): the 16 columns of k-step kk.  rows points at the
// operand's first row in chunk 0; chunks are `chunk` bytes apart; 8-row groups 1024.
__device__ __forceinline__ uint64_t desc_k_major(uint32_t rows, uint32_t chunk, int kk) {
    return smem_desc(rows + (kk / 4) * chunk + (kk % 4) * 32, 16, 8 * SW);
}

// Operand rows along K, M or N along the row (MN-major; V, dO, Q, K as the B of P V, P^T dO,
// dS^T Q, dS K): the 16 rows of k-step kk; 64-column chunks `chunk` bytes apart.
__device__ __forceinline__ uint64_t desc_mn_major(uint32_t tile, uint32_t chunk, int kk) {
    return smem_desc(tile + kk * 16 * SW, chunk, 8 * SW);
}

__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Keeps the compiler from moving reads or writes of registers across a wgmma wait (it does
// not know the asynchronous wgmma writes its accumulators and reads its A fragments).
__device__ __forceinline__ void reg_fence(float &x) {
    asm volatile("" : "+f"(x)::"memory");
}
__device__ __forceinline__ void reg_fence(uint32_t &x) {
    asm volatile("" : "+r"(x)::"memory");
}
// Every register of accumulators (float) or A fragments (uint32_t).
template <typename R, int N> __device__ __forceinline__ void regs_fence(R (&d)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) reg_fence(d[i][e]);
}

// d (64 x N, fp32 accumulators) = (accumulate ? d : 0) + A B: A and B in shared memory,
// both K-major (wgmma_ss), or A in registers and B MN-major (wgmma_rs).  Accumulator layout:
// warp w of the warpgroup holds rows 16w.., lane l rows l/4 and l/4 + 8, columns 2(l%4) and
// 2(l%4)+1 of each 8-column block; d[j] = {(r, c), (r, c+1), (r+8, c), (r+8, c+1)}.
template <int N>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 8][4], uint64_t a, uint64_t b,
                                         int accumulate);
template <int N>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t b,
                                         int accumulate);

// The wgmma instructions, one per shape: scale-d is `accumulate`, A and B unscaled; ss:
// neither transposed, rs: B MN-major.  The accumulator operand lists, 4 registers an 8-column
// block, and their "%n" strings:
#define ACC8(j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
#define ACC_N64 ACC8(0), ACC8(1), ACC8(2), ACC8(3), ACC8(4), ACC8(5), ACC8(6), ACC8(7)
#define ACC_N128                                                                            \
    ACC_N64, ACC8(8), ACC8(9), ACC8(10), ACC8(11), ACC8(12), ACC8(13), ACC8(14), ACC8(15)
#define REGS_0_31                                                                           \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, " \
    "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define REGS_32_63                                                                          \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, " \
    "%49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define SET_P(n) "{\n.reg .pred p;\nsetp.ne.b32 p, %" #n ", 0;\n"
#define WGMMA(n) "wgmma.mma_async.sync.aligned.m64n" #n "k16.f32.bf16.bf16 "

template <>
__device__ __forceinline__ void wgmma_ss<64>(float (&d)[8][4], uint64_t a, uint64_t b,
                                             int accumulate) {
    asm volatile(SET_P(34) WGMMA(64) "{" REGS_0_31 "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : ACC_N64
                 : "l"(a), "l"(b), "r"(accumulate));
}
template <>
__device__ __forceinline__ void wgmma_ss<128>(float (&d)[16][4], uint64_t a, uint64_t b,
                                              int accumulate) {
    asm volatile(SET_P(66) WGMMA(128) "{" REGS_0_31 ", " REGS_32_63 "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : ACC_N128
                 : "l"(a), "l"(b), "r"(accumulate));
}
template <>
__device__ __forceinline__ void wgmma_rs<64>(float (&d)[8][4], const uint32_t (&a)[4], uint64_t b,
                                             int accumulate) {
    asm volatile(SET_P(37) WGMMA(64) "{" REGS_0_31 "}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                 : ACC_N64
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}
template <>
__device__ __forceinline__ void wgmma_rs<128>(float (&d)[16][4], const uint32_t (&a)[4],
                                              uint64_t b, int accumulate) {
    asm volatile(SET_P(69) WGMMA(128) "{" REGS_0_31 ", " REGS_32_63 "}, {%64, %65, %66, %67}, "
                                                                    "%68, p, 1, 1, 1;\n}\n"
                 : ACC_N128
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}
#undef ACC8
#undef ACC_N64
#undef ACC_N128
#undef REGS_0_31
#undef REGS_32_63
#undef SET_P
#undef WGMMA

// 2^x (MUFU.EX2, denormals flushed: the probabilities they would be are below bf16's anyway).
__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// Two floats as bf16 (round to nearest even), lo in the low half.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// The A fragment of k-step kk (16 columns) of a 64 x K accumulator, rounded to bf16.
template <int K>
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&p)[K / 8][4], int kk) {
    a[0] = pack_bf16(p[2 * kk][0], p[2 * kk][1]);
    a[1] = pack_bf16(p[2 * kk][2], p[2 * kk][3]);
    a[2] = pack_bf16(p[2 * kk + 1][0], p[2 * kk + 1][1]);
    a[3] = pack_bf16(p[2 * kk + 1][2], p[2 * kk + 1][3]);
}

template <int N> __device__ __forceinline__ void zero_acc(float (&acc)[N][4]) {
#pragma unroll
    for (int j = 0; j < N; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[j][i] = 0.0f;
}

// The products, issued (wgmma_fence, then one wgmma per k-step) and left running: the caller
// commits them as a group (wgmma_commit), later waits for it (wgmma_wait<pending>) and then
// fences the accumulators (and for gemm_rs the A fragments, which must stay untouched until
// then) with regs_fence.
//
// acc (64 x N) = A B^T, A (64 x K) and B (N x K) K-major tiles in shared memory.
template <int N, int K>
__device__ __forceinline__ void gemm_ss(float (&acc)[N / 8][4], uint32_t a_rows, uint32_t a_chunk,
                                        uint32_t b_rows, uint32_t b_chunk) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < K / 16; kk++)
        wgmma_ss<N>(acc, desc_k_major(a_rows, a_chunk, kk), desc_k_major(b_rows, b_chunk, kk),
                    kk > 0);
}

// acc (64 x N) += A B: A the bf16 fragments of a 64 x K matrix (acc_to_frags), B K x N,
// MN-major in shared memory (64-column chunks `b_chunk` bytes apart).
template <int N, int K>
__device__ __forceinline__ void gemm_rs(float (&acc)[N / 8][4], const uint32_t (&a)[K / 16][4],
                                        uint32_t b_tile, uint32_t b_chunk) {
    regs_fence(acc);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < K / 16; kk++) wgmma_rs<N>(acc, a[kk], desc_mn_major(b_tile, b_chunk, kk), 1);
}

// The bf16 A fragments of a 64 x K accumulator.
template <int K>
__device__ __forceinline__ void acc_to_frags(uint32_t (&a)[K / 16][4], const float (&p)[K / 8][4]) {
#pragma unroll
    for (int kk = 0; kk < K / 16; kk++) acc_to_a<K>(a[kk], p, kk);
}

// Writes a warpgroup's 64 x HD accumulator as bf16 rows [row0, row0 + 64) of one head (rows at
// or past T are dropped), row r scaled by scale[r] (this lane's rows g and g + 8 of its warp).
// The rows go through `stage` (64 swizzled rows in HD/64 chunks `chunk` bytes apart, only
// this warpgroup's) so that global stores are 16 bytes wide.
template <int HD>
__device__ __forceinline__ void store_rows(const float (&acc)[HD / 8][4], const float (&scale)[2],
                                           uint32_t stage, uint32_t chunk, bf16 *head,
                                           size_t stride, int row0, int T, int wg) {
    const int tid = threadIdx.x % 128, w = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
#pragma unroll
    for (int j = 0; j < HD / 8; j++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int row = w * 16 + g + 8 * r; // row % 8 == g
            const uint32_t at = stage + (j / 8) * chunk + row * SW + (((j % 8) ^ g) * 16) + t4 * 4;
            const uint32_t v = pack_bf16(acc[j][2 * r] * scale[r], acc[j][2 * r + 1] * scale[r]);
            asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at), "r"(v) : "memory");
        }
    warpgroup_sync(wg);
    constexpr int UNITS = HD / 8; // 16-byte units of a row
#pragma unroll
    for (int it = 0; it < 64 * UNITS / 128; it++) {
        const int i = tid + it * 128, row = i / UNITS, u = i % UNITS;
        if (row0 + row >= T) continue;
        const uint32_t at = stage + (u / 8) * chunk + row * SW + (((u % 8) ^ (row % 8)) * 16);
        uint4 v;
        asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "r"(at));
        *reinterpret_cast<uint4 *>(head + (size_t)(row0 + row) * stride + u * 8) = v;
    }
}

// ---- the key/value stream of the forward ----

constexpr uint32_t RING_BARS_BYTES = 8 * (1 + 4 * STAGES); // ring_bars

// A block's shared memory: its ROWS query rows, then a ring of STAGES key tiles and STAGES
// value tiles of BN rows, then the mbarriers (the ring's, then the query rows' `read`: both
// consumers are done with them).
template <int HD, int BN> struct stream_smem {
    static constexpr uint32_t ROWS_BYTES = ROWS * HD * 2, KV_BYTES = BN * HD * 2;
    static constexpr uint32_t K = ROWS_BYTES, V = K + STAGES * KV_BYTES;
    static constexpr uint32_t BARS = V + STAGES * KV_BYTES, Q_READ = BARS + RING_BARS_BYTES;
    static constexpr size_t BYTES = Q_READ + 8 + 1024;
};

// The mbarriers at `at`: the fixed tiles landed (the forward's Q; the backward's K and V);
// ring stage s's keys (values) landed; its keys (values) read by both consumers.  The
// backward's ring holds one kind of step (its k_full and k_empty).
struct ring_bars {
    uint32_t at;
    __device__ __forceinline__ uint32_t fixed_full() const { return at; }
    __device__ __forceinline__ uint32_t k_full(int s) const { return at + 8 * (1 + s); }
    __device__ __forceinline__ uint32_t v_full(int s) const { return at + 8 * (1 + STAGES + s); }
    __device__ __forceinline__ uint32_t k_empty(int s) const { return at + 8 * (1 + 2 * STAGES + s); }
    __device__ __forceinline__ uint32_t v_empty(int s) const { return at + 8 * (1 + 3 * STAGES + s); }
    // A consumer's n key/value tiles from ring position pos, waited for and released unread
    // (varlen: tiles before its documents that the other consumer reads).
    __device__ __forceinline__ void skip(int pos, int n) const {
        for (int it = pos; it < pos + n; it++) {
            const int s = it % STAGES;
            mbar_wait(k_full(s), (it / STAGES) & 1);
            mbar_arrive(k_empty(s));
            mbar_wait(v_full(s), (it / STAGES) & 1);
            mbar_arrive(v_empty(s));
        }
    }
    // By thread 0 before the block's first __syncthreads.
    __device__ __forceinline__ void init() const {
        mbar_init(fixed_full(), 1);
        for (int s = 0; s < STAGES; s++) {
            mbar_init(k_full(s), 1);
            mbar_init(v_full(s), 1);
            mbar_init(k_empty(s), CONSUMERS * 128);
            mbar_init(v_empty(s), CONSUMERS * 128);
        }
        mbar_init_fence();
    }
};

// The producer of the forward's item `done` (the block's items before it): rows q0.. of
// query head h once (when the last item's are read), then key/value tiles j0 .. n_tiles-1 of
// kv head kvh, from ring position pos on.
template <int HD, int BN>
__device__ void stream_produce(const CUtensorMap *q, const CUtensorMap *k, const CUtensorMap *v,
                               uint32_t base, int h, int kvh, int b, int q0, int j0, int n_tiles,
                               int done, int pos) {
    typedef stream_smem<HD, BN> L;
    const ring_bars bars = {base + L::BARS};
    if (done > 0) mbar_wait(base + L::Q_READ, (done - 1) & 1);
    mbar_expect_bytes(bars.fixed_full(), L::ROWS_BYTES);
    tma_tile<ROWS, HD>(base, q, h, q0, b, bars.fixed_full());
    for (int it = pos; it < pos + n_tiles - j0; it++) {
        const int s = it % STAGES, j = j0 + it - pos;
        if (it >= STAGES) mbar_wait(bars.k_empty(s), (it / STAGES - 1) & 1);
        mbar_expect_bytes(bars.k_full(s), L::KV_BYTES);
        tma_tile<BN, HD>(base + L::K + s * L::KV_BYTES, k, kvh, j * BN, b, bars.k_full(s));
        if (it >= STAGES) mbar_wait(bars.v_empty(s), (it / STAGES - 1) & 1);
        mbar_expect_bytes(bars.v_full(s), L::KV_BYTES);
        tma_tile<BN, HD>(base + L::V + s * L::KV_BYTES, v, kvh, j * BN, b, bars.v_full(s));
    }
}

// A block's work: a (head, batch, query tile).
struct block_work {
    int head, batch, tile;
};

// ---- forward ----

struct fwd_tma {
    CUtensorMap q, k, v; // [B, T, H, hd]: boxes of 64 columns x 1 head x ROWS (q), FWD_KEYS rows
    bf16 *out;
    float *lse;
    const int32_t *doc_start; // varlen only: [B, T]
    int B, T, Hq, Hkv;
    float scale_log2; // log2(e) / sqrt(hd)
};

// The forward's items (head, batch, query tile) in rank order: sections of one kv head's
// query heads (of one batch row), in a section the longest tiles first, the heads inside.
// The blocks running at once then read the key and value tiles of one or two kv heads, which
// stay in L2: in the blocks' grid order (head fastest, then batch, then tile) 132 blocks read
// 132 different heads' keys, and at Llama-2-7B T=8192 the forward read 17.6 GB from DRAM for
// 0.5 GB of keys and values (L2 hit rate 27%, DRAM at 78% of its peak); in sections 1.4 GB
// (88%), and 515 -> 563-597 TFLOP/s (bench/NOTES.md, F44).  Sections of as many kv heads as
// fill half of L2 measured between the two.  Persistent: a block a multiprocessor takes an
// item a round in a snake order, block i the round's i-th, then the next round's i-th from
// the end, which evens out the blocks' sums.
__device__ __forceinline__ int fwd_items(const fwd_tma &p) {
    return p.Hq * p.B * ((p.T + ROWS - 1) / ROWS);
}
__device__ __forceinline__ int fwd_item_rank(int round, int items) {
    // Read again each round (asm volatile: not hoisted out of the loops): with docs, ptxas
    // kept them across the producer's loop, in its 24 registers, by spilling them.
    int g, i;
    asm volatile("mov.u32 %0, %%nctaid.x;\n" : "=r"(g));
    asm volatile("mov.u32 %0, %%ctaid.x;\n" : "=r"(i));
    if (g == items) return round ? items : i;
    return round * g + (round % 2 ? g - 1 - i : i);
}
__device__ __forceinline__ block_work fwd_item(const fwd_tma &p, int rank) {
    const int tiles = (p.T + ROWS - 1) / ROWS, group = p.Hq / p.Hkv;
    const int sec = rank / (group * tiles), r = rank % (group * tiles);
    const int bh = sec * group + r % group; // batch * Hq + head
    return {bh % p.Hq, bh / p.Hq, tiles - 1 - r / group};
}

constexpr int FWD_KEYS = 128; // keys a tile
static_assert(FWD_KEYS == ROWS, "every forward tile up to the diagonal has keys both warpgroups see");
template <int HD> using fwd_smem = stream_smem<HD, FWD_KEYS>;

// The online softmax of one tile for this lane's rows g and g + 8: scores s (masked here)
// become probabilities exp2(s * scale_log2 - max) (one FFMA and one EX2 each); the running
// max (of the raw scores) and sum are updated, and rescale[r] is what the output
// accumulator's row must be multiplied by.  masked: some key of the tile may be past a row,
// or (varlen) before its document (first[r]: the row's first key).
template <int BN, bool DOCS>
__device__ __forceinline__ void softmax_tile(float (&s)[BN / 8][4], float (&row_max)[2],
                                             float (&row_sum)[2], float (&rescale)[2],
                                             float scale_log2, int key0, int row_lo, bool masked,
                                             const int (&first)[2]) {
    const int lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
    // The mask behind a branch (masked is warp-uniform): folded into the loop below, as
    // selects, it cost every tile its per-key compares (varlen: two compares, a predicate
    // combine and a select a score, ~30% of the loop's instructions), masked or not.
    if (masked) {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int row = row_lo + g + 8 * r;
#pragma unroll
            for (int jn = 0; jn < BN / 8; jn++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int key = key0 + jn * 8 + 2 * t4 + e;
                    if (key > row || (DOCS && key < first[r])) // past the row, another document
                        s[jn][2 * r + e] = -INFINITY;
                }
        }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float top = -INFINITY;
#pragma unroll
        for (int jn = 0; jn < BN / 8; jn++)
#pragma unroll
            for (int e = 0; e < 2; e++) top = fmaxf(top, s[jn][2 * r + e]);
        top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 1)); // the row's 4 lanes
        top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 2));
        const float new_max = fmaxf(row_max[r], top);
        // A row's tiles may all be masked so far (varlen); the guard keeps -inf - -inf from
        // ever making a NaN.
        const float base = new_max == -INFINITY ? 0.0f : new_max * scale_log2;
        rescale[r] = ex2(row_max[r] * scale_log2 - base);
        float sum = 0.0f;
#pragma unroll
        for (int jn = 0; jn < BN / 8; jn++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const float x = ex2(fmaf(s[jn][2 * r + e], scale_log2, -base));
                s[jn][2 * r + e] = x;
                sum += x;
            }
        row_sum[r] = row_sum[r] * rescale[r] + sum; // this lane's part of the row
        row_max[r] = new_max;
    }
}

template <int HD>
__device__ __forceinline__ void rescale_rows(float (&o)[HD / 8][4], const float (&rescale)[2]) {
#pragma unroll
    for (int dn = 0; dn < HD / 8; dn++)
#pragma unroll
        for (int e = 0; e < 4; e++) o[dn][e] *= rescale[e / 2];
}

// O (or any accumulator of rows) straight from the registers to global memory, scaled by
// row: this lane's rows g and g + 8 of the warp's 16 from row_lo, two columns a store.
template <int HD>
__device__ __forceinline__ void store_acc(const float (&acc)[HD / 8][4], const float (&scale)[2],
                                          bf16 *head, size_t stride, int row_lo, int T) {
    const int lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = row_lo + g + 8 * r;
        if (row >= T) continue;
        bf16 *at = head + (size_t)row * stride + 2 * t4;
#pragma unroll
        for (int j = 0; j < HD / 8; j++)
            *reinterpret_cast<uint32_t *>(at + j * 8) =
                pack_bf16(acc[j][2 * r] * scale[r], acc[j][2 * r + 1] * scale[r]);
    }
}

// A consumer warpgroup: its 64 query rows of the block's item `done` against every key tile
// the producer streams (from ring position pos).
template <int HD, bool DOCS>
__device__ void fwd_consume(const fwd_tma &p, uint32_t base, int h, int b, int q0, int j0,
                            int n_tiles, int done, int pos) {
    typedef fwd_smem<HD> L;
    constexpr int BN = FWD_KEYS;
    const ring_bars bars = {base + L::BARS};
    const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    const int g = lane / 4, T = p.T;
    const int wg_lo = q0 + wg * 64, row_lo = wg_lo + warp * 16; // the warp's rows
    const query_docs docs =
        query_docs_of<DOCS>(p.doc_start, b, T, row_lo, g, wg_lo, row_lo + 15);
    const uint32_t sQ = base + wg * 64 * SW;
    const uint32_t sK = base + L::K, sV = base + L::V;
    // The warpgroup's first tile with keys of its documents (without docs, j0); tiles from
    // there to the diagonal all have keys its rows see (FWD_KEYS == ROWS).
    // (docs.lo, a load, broadcast from lane 0: ptxas then knows it, and so the ring
    // positions and the descriptors built from them, warp-uniform, and keeps them in uniform
    // registers as without docs.)
    const int jw = DOCS ? imax(j0, __shfl_sync(0xffffffffu, docs.lo, 0) / BN) : j0;
    float o[HD / 8][4], row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};
    float rescale[2] = {1.0f, 1.0f};
    uint32_t pa[BN / 16][4]; // the previous tile's probabilities, bf16
    zero_acc(o);
    mbar_wait(bars.fixed_full(), done & 1);
    // Tile j's S = Q K^T is issued, then tile j-1's O += P V: the softmax of j runs while the
    // second product does (O is rescaled, by tile j-1's factor, before it).
    // Both take the same number of turns: with documents the warpgroup whose first tile is
    // later (warpgroup 1: warpgroup 0's first tile is the item's, j0) takes one idle turn a
    // tile before it, and releases that tile in it, unread.  Released all before its first
    // turn, the ring's fourth tile would wait for a slot that warpgroup 0 frees only after
    // a turn of warpgroup 1's: both stalled, the kernel never ended (Llama-1.1B on packed
    // text, a document starting 4 key tiles past its item's first; check_attention --stress).
    if (wg == 1) turn_pass(wg);
    for (int i = 0; i < jw - j0; i++) {
        turn_wait(wg);
        bars.skip(pos + i, 1);
        turn_pass(wg);
    }
    { // the first tile: its S alone (a loop of uniform bodies keeps ptxas from serialising)
        const int it = pos + jw - j0, s = it % STAGES;
        float sc[BN / 8][4];
        mbar_wait(bars.k_full(s), (it / STAGES) & 1);
        turn_wait(wg);
        gemm_ss<BN, HD>(sc, sQ, ROWS * SW, sK + s * L::KV_BYTES, BN * SW);
        wgmma_commit();
        turn_pass(wg);
        wgmma_wait<0>();
        regs_fence(sc);
        mbar_arrive(bars.k_empty(s));
        if (jw == n_tiles - 1) mbar_arrive(base + L::Q_READ); // the last S: Q is free
        const bool masked = jw * BN + BN - 1 > row_lo || (DOCS && jw * BN < docs.hi);
        softmax_tile<BN, DOCS>(sc, row_max, row_sum, rescale, p.scale_log2, jw * BN, row_lo,
                               masked, docs.first);
        acc_to_frags<BN>(pa, sc);
    }
    for (int j = jw + 1; j < n_tiles; j++) {
        const int it = pos + j - j0, s = it % STAGES, ps = (it + STAGES - 1) % STAGES;
        float sc[BN / 8][4];
        mbar_wait(bars.k_full(s), (it / STAGES) & 1);
        turn_wait(wg);
        gemm_ss<BN, HD>(sc, sQ, ROWS * SW, sK + s * L::KV_BYTES, BN * SW);
        wgmma_commit();
        rescale_rows<HD>(o, rescale);
        mbar_wait(bars.v_full(ps), ((it - 1) / STAGES) & 1);
        gemm_rs<HD, BN>(o, pa, sV + ps * L::KV_BYTES, BN * SW);
        wgmma_commit();
        turn_pass(wg);
        wgmma_wait<1>();
        regs_fence(sc);
        mbar_arrive(bars.k_empty(s));
        if (j == n_tiles - 1) mbar_arrive(base + L::Q_READ);
        const bool masked = j * BN + BN - 1 > row_lo || (DOCS && j * BN < docs.hi);
        softmax_tile<BN, DOCS>(sc, row_max, row_sum, rescale, p.scale_log2, j * BN, row_lo, masked,
                               docs.first);
        wgmma_wait<0>();
        regs_fence(o);
        regs_fence(pa);
        mbar_arrive(bars.v_empty(ps));
        acc_to_frags<BN>(pa, sc);
    }
    {
        const int it = pos + n_tiles - 1 - j0, s = it % STAGES;
        rescale_rows<HD>(o, rescale);
        mbar_wait(bars.v_full(s), (it / STAGES) & 1);
        turn_wait(wg);
        gemm_rs<HD, BN>(o, pa, sV + s * L::KV_BYTES, BN * SW);
        wgmma_commit();
        turn_pass(wg);
        if (wg == 0) turn_wait(wg); // warpgroup 1's last signal
        wgmma_wait<0>();
        regs_fence(o);
        regs_fence(pa);
        mbar_arrive(bars.v_empty(s));
    }

    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 1);
        row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 2);
        inv[r] = 1.0f / row_sum[r];
    }
    const size_t qs = (size_t)p.Hq * HD;
    // From the registers: the query rows' shared memory holds the next item's already.
    store_acc<HD>(o, inv, p.out + (size_t)b * T * qs + (size_t)h * HD, qs, row_lo, T);
    if (lane % 4 == 0) {
        float *lse = p.lse + ((size_t)b * p.Hq + h) * T;
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int row = row_lo + g + 8 * r;
            if (row < T) lse[row] = (row_max[r] * p.scale_log2 + log2f(row_sum[r])) * LN2;
        }
    }
}

// The forward's item: its head, batch, first query row, key tiles j0 .. n_tiles - 1.
struct fwd_work {
    int h, b, kvh, q0, j0, n_tiles;
};
template <bool DOCS> __device__ __forceinline__ fwd_work fwd_work_of(const fwd_tma &p, int rank) {
    const block_work w = fwd_item(p, rank);
    fwd_work f;
    f.h = w.head;
    f.b = w.batch;
    f.kvh = f.h / (p.Hq / p.Hkv);
    f.q0 = w.tile * ROWS;
    f.n_tiles = (imin(p.T, f.q0 + ROWS) - 1) / FWD_KEYS + 1; // up to the diagonal
    f.j0 = DOCS ? p.doc_start[(size_t)f.b * p.T + f.q0] / FWD_KEYS : 0;
    return f;
}

template <int HD, bool DOCS>
__global__ void __launch_bounds__(THREADS, 1) attention_fwd_sm90(const __grid_constant__ fwd_tma p) {
    typedef fwd_smem<HD> L;
    const uint32_t base = smem_base();
    if (threadIdx.x == 0) {
        mbar_init(base + L::Q_READ, CONSUMERS * 128);
        ring_bars{base + L::BARS}.init(); // and the fence after every init
    }
    __syncthreads();
    // Both roles walk the same items; pos: the ring position of an item's first key tile.
    const int items = fwd_items(p);
    if (threadIdx.x / 128 == CONSUMERS) {
        regs_shrink<PRODUCER_REGS>();
        if (threadIdx.x != CONSUMERS * 128) return;
        for (int done = 0, pos = 0, rank; (rank = fwd_item_rank(done, items)) < items; done++) {
            const fwd_work f = fwd_work_of<DOCS>(p, rank);
            stream_produce<HD, FWD_KEYS>(&p.q, &p.k, &p.v, base, f.h, f.kvh, f.b, f.q0, f.j0,
                                         f.n_tiles, done, pos);
            pos += f.n_tiles - f.j0;
        }
        return;
    }
    regs_grow<CONSUMER_REGS>();
    for (int done = 0, pos = 0, rank; (rank = fwd_item_rank(done, items)) < items; done++) {
        fwd_work f = fwd_work_of<DOCS>(p, rank);
        if (DOCS) f.j0 = __shfl_sync(0xffffffffu, f.j0, 0); // a load: warp-uniform (see jw)
        fwd_consume<HD, DOCS>(p, base, f.h, f.b, f.q0, f.j0, f.n_tiles, done, pos);
        pos += f.n_tiles - f.j0;
    }
}

// ---- backward ----
//
// One kernel of five products (FlashAttention-3's): a block per (kv head, batch, 128 keys)
// loops over the group's query heads and the query tiles that see its keys, and each step
// computes S^T, dP^T, dV += P^T dO, dK += dS^T Q and this step's share of dQ = dS K.  dK and
// dV stay in registers; the dQ shares of every key block are summed in fp32 in global memory
// (dq_accum), in a fixed order, then cast to bf16 (dq_convert_sm90):
//   - each step's share goes through shared memory; a writer warp (of the producer
//     warpgroup) adds it with one bulk reduction (cp.reduce.async.bulk .add.f32), the tile's
//     first share with a bulk store (no zeroing);
//   - the order: the key blocks that see a query tile add their shares from the diagonal's
//     block down, kept by a semaphore per (batch, query head, query tile) in global memory that
//     counts the shares added so far; a block waits for its turn (how far below the diagonal
//     it is) and counts itself once its share has landed.  The same additions in the same
//     order every run: the same bits;
//   - the schedule keeps the waits away, and the query tiles and accumulators a share reads
//     and adds to in L2 (bwd_item).  MHA (up): a block per key block walks its
//     query tiles up from its diagonal, the diagonal's share of a tile first, so a block
//     reaches a tile after every block above it has (they start no later and reach it
//     sooner); a (batch, head)'s key blocks are launched together, from the last one down: a
//     head's tiles (2 MB at T 2048) are what its blocks read, from L2.  GQA (down, group times
//     longer blocks over group times the tiles): the first key block's share first, and
//     persistent blocks in lockstep (bwd_item): a (batch, kv head)'s key blocks are laid out
//     in rows of `width` blocks, a block a persistent block, snaking (row 0 left to right,
//     row 1 right to left, ...); even rows walk down from the last tile, odd rows up from
//     their diagonals.  With two rows, block k and block NB-1-k share a persistent block,
//     and every persistent block has the same work, so every row starts at once, and the
//     blocks of a row are all at the same tile at the same time (down: last - t/group; up,
//     the rows' lengths cancelling: t/group - 2 for whole tiles): the Q, dO and accumulator
//     tiles that a row's blocks share stay in L2 between the blocks' reads and adds.
//     (Launched a block a key block, the first key blocks first, the later waves started as
//     earlier blocks ended, tens of steps apart: at Llama-2-70B T 2048 the backward read
//     2.8 GB and wrote 1.5 GB to DRAM for 0.3 GB of inputs, L2 hit rate 54%; bench/NOTES.md,
//     F44.)  GQA with documents (packed text, a sliding window's band) runs that launch, a
//     block a key block walking down: its key blocks' walks differ in length, so paired rows
//     were unbalanced (a window of 4096: 14% slower in rows).
//     Either way a block waits only on blocks whose shares come before its own: MHA's were
//     launched before it; GQA's are lower key blocks, launched before it (with documents),
//     or run earlier in its persistent block's rows or in another persistent block (at most
//     one a multiprocessor), so no wait is ever on a block that cannot start.

struct bwd_tma {
    CUtensorMap q, dout, k, v; // boxes: BQ rows of q and dout, ROWS rows of k and v
    bf16 *dq, *dk, *dv;
    float *dq_accum;                    // the launch's heads: [B, heads, Tp / BQ tiles, BQ * HD]
    int *dq_sem;                        // [B, heads, Tp / BQ]: shares added, zeroed a launch
    const float *lse2, *delta;          // [B, Hq, Tp]: lse * log2(e), rowsum(dO * O); 0 past T
    const int32_t *doc_start, *doc_end; // varlen only: [B, T]
    int B, T, Hq, Hkv, Tp;
    int kv0, n_kv; // the launch's kv heads: kv0 .. kv0 + n_kv - 1 (dq_accum's budget)
    int down;      // GQA: the first key block's share first (dq_turn); rows: bwd_rows
    int width;     // rows: key blocks a row, a persistent block each (launch_bwd)
    float scale, scale_log2;
};

// Whether the backward runs GQA's persistent rows (bwd_item, launch_bwd): the kernel's items
// and the launch's grid are chosen by this one test.
template <bool DOCS> __host__ __device__ __forceinline__ bool bwd_rows(const bwd_tma &p) {
    return p.down && !DOCS;
}

constexpr int BQ = 64; // queries a step

// dQ's share is computed by both consumers: at head dim 128 each takes 64 of its columns over
// the block's 128 keys (N split); at 64 each takes all columns over its own 64 keys and the
// two are added in shared memory (K split).
template <int HD> struct dq_split {
    static constexpr bool N = HD == 128;
};

// K and V (ROWS rows each), a ring of STAGES steps (Q, dO: BQ rows), a ring of two dS
// (BQ x ROWS bf16, K-major: a query's keys along its row, 64-key chunks), the step's dQ share
// (BQ x HD fp32, as the accumulators lie: see stage_at), the steps' statistics (lse2, delta),
// the mbarriers (the steps' ring_bars, then dS's, then the block's K and V free for the next
// item's).
template <int HD> struct dkv_smem {
    static constexpr uint32_t KV_BYTES = ROWS * HD * 2, TILE = BQ * HD * 2;
    static constexpr uint32_t STEP = 2 * TILE, DS_BYTES = BQ * ROWS * 2;
    static constexpr uint32_t STATS_STEP = 2 * BQ * 4; // lse2 and delta
    static constexpr uint32_t K = 0, V = KV_BYTES, STEPS = 2 * KV_BYTES;
    static constexpr uint32_t DS = STEPS + STAGES * STEP;
    static constexpr uint32_t DQ = DS + 2 * DS_BYTES, DQ_BYTES = BQ * HD * 4;
    static constexpr uint32_t STATS = DQ + DQ_BYTES;
    static constexpr uint32_t BARS = STATS + STAGES * STATS_STEP;
    static constexpr uint32_t DS_BARS = BARS + RING_BARS_BYTES;
    static constexpr uint32_t KV_FREE = DS_BARS + 4 * 8; // both consumers done with K and V
    static constexpr size_t BYTES = KV_FREE + 8 + 1024;
    static_assert(TILE % 1024 == 0 && DS_BYTES % 1024 == 0, "tiles start on 1024 bytes");
};

// dS's ring: slot s written by both consumers (full), read by both consumers' dQ products
// (empty).
struct ds_bars {
    uint32_t at;
    __device__ __forceinline__ uint32_t full(int s) const { return at + 8 * s; }
    __device__ __forceinline__ uint32_t empty(int s) const { return at + 8 * (2 + s); }
    __device__ __forceinline__ void init() const { // by thread 0, before ring_bars' init
        for (int s = 0; s < 2; s++) {
            mbar_init(full(s), CONSUMERS * 128);
            mbar_init(empty(s), CONSUMERS * 128);
        }
    }
};

// Named barriers (0: __syncthreads, 1-2: warpgroup_sync, 3-4: the turns).
constexpr int BAR_END = 5;      // both consumers' products done with K (256)
constexpr int BAR_DQ_SUM = 7;   // K split: warpgroup 0's share staged (256)
constexpr int BAR_DQ_FULL = 8;  // the share staged, for the writer (256 + 32)
constexpr int BAR_DQ_EMPTY = 9; // the writer has read the stage (256 + 32)
constexpr int DQ_BAR_THREADS = CONSUMERS * 128 + 32; // BAR_DQ_FULL, BAR_DQ_EMPTY
constexpr int WRITER_WARP = CONSUMERS * 4 + 1; // the producer's second warp

// Makes this thread's shared-memory writes visible to the async proxy (wgmma, bulk copies).
__device__ __forceinline__ void fence_async_smem() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Four 8x8 bf16 matrices, as an mma accumulator holds them (r[i]: matrix i), stored
// transposed: lane l gives the address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void stmatrix_trans(uint32_t addr, const uint32_t (&r)[4]) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(
                     addr),
                 "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
                 : "memory");
}

// ---- the dQ writer: bulk copies and the semaphores ----

__device__ __forceinline__ void bulk_store(float *dst, uint32_t src, uint32_t bytes) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst),
                 "r"(src), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void bulk_reduce_add(float *dst, uint32_t src, uint32_t bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(
                     dst),
                 "r"(src), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void bulk_commit() {
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// The committed bulk copies have read their shared memory (read) or are complete.
__device__ __forceinline__ void bulk_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
__device__ __forceinline__ void bulk_wait_done() {
    asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

__device__ __forceinline__ int load_acquire(const int *p) {
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}
// Orders this thread's generic-proxy global accesses with its async-proxy (bulk) ones.
__device__ __forceinline__ void fence_async_global() {
    asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

// Counts a share as added: its bulk writes (async proxy) before the release.
__device__ __forceinline__ void release_count(int *p) {
    fence_async_global();
    asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(p) : "memory");
}

// A backward block's work and the order of its steps: the group's query heads inside, the
// query tiles that see its keys (first, the diagonal's, .. last) outside, walked up from the
// diagonal or down to it (walk_down; bwd_item chooses).
struct bwd_walk {
    int kvh, b, n, first, last, group;
    int walk_down; // the walk: from the last tile down (else from the diagonal up)
    __device__ __forceinline__ int steps() const { return group * (last - first + 1); }
};
// A walk's step: query head and tile, moved on a step at a time (no division by the group
// size, a runtime value: in the producer's and the writer's 24 registers its temporaries
// were what spilled).
struct bwd_step {
    int head, tile;
    __device__ __forceinline__ static bwd_step start(const bwd_walk &w) {
        return {w.kvh * w.group, w.walk_down ? w.last : w.first};
    }
    __device__ __forceinline__ void next(const bwd_walk &w) {
        if (++head == (w.kvh + 1) * w.group) {
            head = w.kvh * w.group;
            tile += w.walk_down ? -1 : 1;
        }
    }
};

// The query tiles of key block w.n: from its diagonal to the row's end, or (varlen) to the end
// of its last key's document.
template <bool DOCS> __device__ __forceinline__ void walk_tiles(const bwd_tma &p, bwd_walk &w) {
    const int k0 = w.n * ROWS;
    const int q_end = DOCS ? p.doc_end[(size_t)w.b * p.T + imin(k0 + ROWS, p.T) - 1] : p.T;
    w.first = k0 / BQ;
    w.last = (q_end - 1) / BQ;
}

// Item idx (0, 1, ..) of this block: BWD_ITEM (w set), BWD_SKIP (a row's slot past the last
// key block) or BWD_END.  MHA: one, the grid's (key blocks, kv heads of the launch, batch),
// a (batch, head)'s key blocks neighbours, the last one first.  GQA with documents: one, the
// grid's (kv heads, batch, key blocks), the first key blocks of every pair first, walking
// down.  GQA: the grid is `lanes` x width persistent blocks; round r gives lane l the (batch,
// kv head) pair r * lanes + l, whose key blocks the lane's blocks take a row at a time (see
// "backward" above).
enum { BWD_END, BWD_ITEM, BWD_SKIP };
template <bool DOCS> __device__ __forceinline__ int bwd_item(const bwd_tma &p, int idx, bwd_walk &w) {
    w.group = p.Hq / p.Hkv;
    if (!bwd_rows<DOCS>(p)) {
        if (idx > 0) return BWD_END;
        w.kvh = p.kv0 + (int)(p.down ? blockIdx.x : blockIdx.y);
        w.b = (int)(p.down ? blockIdx.y : blockIdx.z);
        w.n = (int)(p.down ? blockIdx.z : gridDim.x - 1 - blockIdx.x);
        w.walk_down = p.down;
        walk_tiles<DOCS>(p, w);
        return BWD_ITEM;
    }
    // The grid's size and this block's index read again each item (asm volatile: not hoisted),
    // as fwd_item_rank's: kept across the producer's loop they would spill its 24 registers.
    int grid, block;
    asm volatile("mov.u32 %0, %%nctaid.x;\n" : "=r"(grid));
    asm volatile("mov.u32 %0, %%ctaid.x;\n" : "=r"(block));
    const int nb = (p.T + ROWS - 1) / ROWS, rows = (nb + p.width - 1) / p.width;
    const int lanes = grid / p.width, slot = block % p.width;
    const int row = idx % rows, pair = idx / rows * lanes + block / p.width;
    if (pair >= p.B * p.n_kv) return BWD_END;
    w.n = row * p.width + (row % 2 ? p.width - 1 - slot : slot);
    if (w.n >= nb) return BWD_SKIP;
    w.kvh = p.kv0 + pair % p.n_kv;
    w.b = pair / p.n_kv;
    w.walk_down = row % 2 == 0;
    walk_tiles<DOCS>(p, w);
    return BWD_ITEM;
}

// An item's K and V, once the consumers are done with the last item's (done: the block's
// items so far).
template <int HD>
__device__ __forceinline__ void dkv_load_kv(const bwd_tma &p, uint32_t base, const bwd_walk &w,
                                            int done) {
    typedef dkv_smem<HD> L;
    const ring_bars bars = {base + L::BARS};
    if (done > 0) mbar_wait(base + L::KV_FREE, (done - 1) & 1);
    mbar_expect_bytes(bars.fixed_full(), 2 * L::KV_BYTES);
    tma_tile<ROWS, HD>(base + L::K, &p.k, w.kvh, w.n * ROWS, w.b, bars.fixed_full());
    tma_tile<ROWS, HD>(base + L::V, &p.v, w.kvh, w.n * ROWS, w.b, bars.fixed_full());
}

// Step g's Q, dO and statistics into the ring, once its slot is free.
template <int HD>
__device__ __forceinline__ void dkv_load_step(const bwd_tma &p, uint32_t base, int b,
                                              const bwd_step &st, int g) {
    typedef dkv_smem<HD> L;
    const ring_bars bars = {base + L::BARS};
    const int s = g % STAGES;
    const uint32_t step = base + L::STEPS + s * L::STEP, full = bars.k_full(s);
    const uint32_t stats = base + L::STATS + s * L::STATS_STEP;
    if (g >= STAGES) mbar_wait(bars.k_empty(s), (g / STAGES - 1) & 1);
    mbar_expect_bytes(full, 2 * L::TILE + L::STATS_STEP);
    tma_tile<BQ, HD>(step, &p.q, st.head, st.tile * BQ, b, full);
    tma_tile<BQ, HD>(step + L::TILE, &p.dout, st.head, st.tile * BQ, b, full);
    const size_t at = ((size_t)b * p.Hq + st.head) * p.Tp + (size_t)st.tile * BQ; // padded
    bulk_load(stats, p.lse2 + at, BQ * 4, full);
    bulk_load(stats + BQ * 4, p.delta + at, BQ * 4, full);
}

// The dK/dV producer, for an item: K and V, and every step's Q, dO and statistics.  done: the
// block's items so far; pos: their steps (the ring's position).  After the first item, K and
// V wait for the consumers to end the last one (its dK and dV go out through K's and V's
// shared memory): the first steps' Q and dO, whose slots are free by then, load before them.
template <int HD>
__device__ void dkv_produce_item(const bwd_tma &p, uint32_t base, const bwd_walk &w, int done,
                                 int pos) {
    const int end = pos + w.steps(), early = done > 0 ? imin(pos + STAGES, end) : pos;
    bwd_step st = bwd_step::start(w);
    int g = pos;
    for (; g < early; g++, st.next(w)) dkv_load_step<HD>(p, base, w.b, st, g);
    dkv_load_kv<HD>(p, base, w, done);
    for (; g < end; g++, st.next(w)) dkv_load_step<HD>(p, base, w.b, st, g);
}

// This block's place in the order of a query tile's dQ shares.
template <bool DOCS> __device__ __forceinline__ int dq_turn(const bwd_tma &p, const bwd_walk &w, int tile) {
    if (!p.down) return tile * BQ / ROWS - w.n;
    // the first key block the tile's first query sees (its document's) goes first
    const int lo = DOCS ? p.doc_start[(size_t)w.b * p.T + tile * BQ] / ROWS : 0;
    return w.n - lo;
}

// The dQ writer's (one warp's) work for an item: every step, once the consumers have staged
// the share, it waits for the tile's semaphore to reach this block's turn, adds the share
// (the first stores it), frees the stage (unless the block has no later step: total, from pos,
// this item's first), and counts the share once it has landed.
template <int HD, bool DOCS>
__device__ void dq_write_item(const bwd_tma &p, uint32_t base, const bwd_walk &w, int pos,
                              int total) {
    typedef dkv_smem<HD> L;
    const int lane = threadIdx.x % 32, tiles = p.Tp / BQ, n_steps = w.steps();
    bwd_step st = bwd_step::start(w);
    for (int it = 0; it < n_steps; it++, st.next(w)) {
        const size_t tile =
            ((size_t)w.b * p.n_kv * w.group + (st.head - p.kv0 * w.group)) * tiles + st.tile;
        bar_sync(BAR_DQ_FULL, DQ_BAR_THREADS);
        if (lane == 0) {
            const int turn = dq_turn<DOCS>(p, w, st.tile);
            while (load_acquire(p.dq_sem + tile) != turn) {
            }
            fence_async_global();
            float *dst = p.dq_accum + tile * (BQ * HD);
            if (turn == 0)
                bulk_store(dst, base + L::DQ, L::DQ_BYTES);
            else
                bulk_reduce_add(dst, base + L::DQ, L::DQ_BYTES);
            bulk_commit();
            bulk_wait_read();
        }
        __syncwarp();
        if (pos + it + 1 < total) bar_arrive(BAR_DQ_EMPTY, DQ_BAR_THREADS);
        if (lane == 0) {
            bulk_wait_done();
            release_count(p.dq_sem + tile);
        }
        __syncwarp(); // bar.sync is aligned: the whole warp at once
    }
}

// acc (64 x N) = A B: A (64 x K) K-major in shared memory, B (K x N) MN-major (a K row's N
// columns along the row, 64-column chunks `b_chunk` bytes apart).
template <int N>
__device__ __forceinline__ void wgmma_ss_mn(float (&d)[N / 8][4], uint64_t a, uint64_t b,
                                            int accumulate);
template <>
__device__ __forceinline__ void wgmma_ss_mn<64>(float (&d)[8][4], uint64_t a, uint64_t b,
                                                int accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, "
                 "%17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                 "%32, %33, p, 1, 1, 0, 1;\n}\n"
                 : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]),
                   "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]),
                   "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]),
                   "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
                   "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]),
                   "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
                   "+f"(d[7][2]), "+f"(d[7][3])
                 : "l"(a), "l"(b), "r"(accumulate));
}

template <int K>
__device__ __forceinline__ void gemm_ss_mn64(float (&acc)[8][4], uint32_t a_rows, uint32_t a_chunk,
                                             uint32_t b_tile, uint32_t b_chunk) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < K / 16; kk++)
        wgmma_ss_mn<64>(acc, desc_k_major(a_rows, a_chunk, kk), desc_mn_major(b_tile, b_chunk, kk),
                        kk > 0);
}

// This warpgroup's dS^T (its 64 keys x BQ queries, the bf16 fragments of dkv_consume) into
// dS's chunk of its keys, transposed: rows are queries.
__device__ __forceinline__ void store_ds(uint32_t ds, const uint32_t (&df)[BQ / 16][4], int wg) {
    const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, m = lane / 8, r = lane % 8;
    const uint32_t chunk = ds + wg * BQ * SW;
    const int unit = 2 * warp + (m % 2); // 8 keys: this warp's 16, first or second half
#pragma unroll
    for (int kk = 0; kk < BQ / 16; kk++) {
        const int query = 16 * kk + 8 * (m / 2) + r; // query % 8 == r
        stmatrix_trans(chunk + query * SW + ((unit ^ r) << 4), df[kk]);
    }
}

// The share's staging: accumulator register j (0-7) of thread t of the consumer that computed
// columns chunk c is the float4 at ((c * 8 + j) * 128 + t) (16-byte stores, no conflicts);
// dq_convert_sm90 reads the same layout from dq_accum.
__device__ __forceinline__ uint32_t stage_at(uint32_t stage, int c, int j) {
    return stage + (uint32_t)(((c * 8 + j) * 128 + threadIdx.x % 128) * 16);
}

__device__ __forceinline__ void stage_store(uint32_t at, const float (&a)[4]) {
    asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(at), "f"(a[0]), "f"(a[1]),
                 "f"(a[2]), "f"(a[3])
                 : "memory");
}

__device__ __forceinline__ void stage_add(uint32_t at, float (&a)[4]) {
    float s[4];
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(s[0]), "=f"(s[1]), "=f"(s[2]), "=f"(s[3])
                 : "r"(at)
                 : "memory");
#pragma unroll
    for (int e = 0; e < 4; e++) a[e] = s[e] + a[e];
}

// dS^T of step it (this warpgroup's bf16 fragments df) into slot it % 2 of dS's ring, once
// both consumers' products of step it - 2 are done with the slot.
template <int HD>
__device__ __forceinline__ void ds_put(uint32_t base, const uint32_t (&df)[BQ / 16][4], int wg,
                                       int it) {
    typedef dkv_smem<HD> L;
    const ds_bars bars = {base + L::DS_BARS};
    const int s = it % 2;
    if (it >= 2) mbar_wait(bars.empty(s), (it / 2 - 1) & 1);
    store_ds(base + L::DS + s * L::DS_BYTES, df, wg);
    fence_async_smem();
    mbar_arrive(bars.full(s));
}

// Issues the dQ share of step it from slot it % 2 (once both consumers' dS are there): at head
// dim 128 this warpgroup's 64 columns over the block's keys, at 64 every column over its keys.
// (real false: an item's first step, whose product of nothing is issued all the same, so that
// ptxas keeps the products asynchronous, and dropped: step g = pos - 1's slot, never waited.)
template <int HD>
__device__ __forceinline__ void dq_issue(float (&dq)[8][4], uint32_t base, int wg, int g,
                                         bool real) {
    typedef dkv_smem<HD> L;
    const ds_bars bars = {base + L::DS_BARS};
    const int s = (g + 2) % 2; // g >= -1
    const uint32_t ds = base + L::DS + s * L::DS_BYTES;
    if (real) mbar_wait(bars.full(s), (g / 2) & 1);
    if (dq_split<HD>::N)
        gemm_ss_mn64<ROWS>(dq, ds, BQ * SW, base + L::K + wg * ROWS * SW, ROWS * SW);
    else
        gemm_ss_mn64<64>(dq, ds + wg * BQ * SW, BQ * SW, base + L::K + wg * 64 * SW, ROWS * SW);
    wgmma_commit();
}

// After dq_issue's product of step it has completed: the slot released, the share staged for
// the writer (at head dim 64 warpgroup 1 adds its share to warpgroup 0's).
template <int HD>
__device__ __forceinline__ void dq_stage(const float (&dq)[8][4], uint32_t base, int wg, int it) {
    typedef dkv_smem<HD> L;
    const ds_bars bars = {base + L::DS_BARS};
    const uint32_t stage = base + L::DQ;
    mbar_arrive(bars.empty(it % 2));
    bar_sync(BAR_DQ_EMPTY, DQ_BAR_THREADS);
    const int c = dq_split<HD>::N ? wg : 0;
    if (!dq_split<HD>::N && wg == 1) bar_sync(BAR_DQ_SUM, 256); // warpgroup 0's share first
#pragma unroll
    for (int j = 0; j < 8; j++) {
        float v[4] = {dq[j][0], dq[j][1], dq[j][2], dq[j][3]};
        if (!dq_split<HD>::N && wg == 1) stage_add(stage_at(stage, c, j), v);
        stage_store(stage_at(stage, c, j), v);
    }
    fence_async_smem();
    if (!dq_split<HD>::N && wg == 0) bar_arrive(BAR_DQ_SUM, 256);
    bar_arrive(BAR_DQ_FULL, DQ_BAR_THREADS);
}

// The shared floats at address `at` (a plain pointer, so the compiler may keep them in
// registers across a loop body; the mbarrier waits are compiler barriers).
__device__ __forceinline__ const float *smem_floats(uint32_t at) {
    return reinterpret_cast<const float *>(sm90_smem + (at - smem_u32(sm90_smem)));
}

// A consumer warpgroup, an item: its 64 keys against every step; dK and dV in registers, dQ's
// shares a step behind (ds_put, dq_issue, dq_stage); then dK and dV out, and K and V freed.
template <int HD, bool DOCS>
__device__ void dkv_consume_item(const bwd_tma &p, uint32_t base, const bwd_walk &w, int done,
                                 int pos) {
    typedef dkv_smem<HD> L;
    const ring_bars bars = {base + L::BARS};
    const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    const int g = lane / 4, t4 = lane % 4, T = p.T, kvh = w.kvh, b = w.b, k0 = w.n * ROWS;
    const int n_steps = w.steps();
    const int wg_lo = k0 + wg * 64, k_lo = wg_lo + warp * 16; // the warp's keys k_lo..+15
    // varlen: lo, the smallest end of the warp's keys; hi, the largest of the warpgroup's
    const key_docs docs = key_docs_of<DOCS>(p.doc_end, b, T, k_lo, g, k_lo, wg_lo + 63);
    const uint32_t sK = base + L::K + wg * 64 * SW, sV = base + L::V + wg * 64 * SW;
    float dk[HD / 8][4], dv[HD / 8][4];
    zero_acc(dk);
    zero_acc(dv);
    // The consumers take turns issuing S^T and dP^T (pingpong), a turn a step.
    if (wg == 1) turn_pass(wg);
    mbar_wait(bars.fixed_full(), done & 1);
    bwd_step st = bwd_step::start(w);
    for (int it = 0; it < n_steps; it++, st.next(w)) {
        const int gs = pos + it, s = gs % STAGES, q0 = st.tile * BQ;
        const uint32_t sQ = base + L::STEPS + s * L::STEP, sdO = sQ + L::TILE;
        const float *lse2 = smem_floats(base + L::STATS + s * L::STATS_STEP), *delta = lse2 + BQ;
        uint32_t df[BQ / 16][4];
        mbar_wait(bars.k_full(s), (gs / STAGES) & 1);
        // else every query is before the warpgroup's keys, or (varlen) past their documents
        if (q0 + BQ - 1 >= wg_lo && (!DOCS || q0 < docs.hi)) {
            float st[BQ / 8][4], dpt[BQ / 8][4]; // S^T then P^T then dS^T; dP^T: rows are keys
            turn_wait(wg);
            gemm_ss<BQ, HD>(st, sK, ROWS * SW, sQ, BQ * SW);
            gemm_ss<BQ, HD>(dpt, sV, ROWS * SW, sdO, BQ * SW);
            wgmma_commit();
            turn_pass(wg);
            wgmma_wait<0>();
            regs_fence(st);
            regs_fence(dpt);
            const bool masked = q0 < k_lo + 15 || q0 + BQ > T || (DOCS && q0 + BQ > docs.lo);
#pragma unroll
            for (int jn = 0; jn < BQ / 8; jn++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    st[jn][e] = ex2(fmaf(st[jn][e], p.scale_log2, -lse2[jn * 8 + 2 * t4 + e % 2]));
            if (masked) { // warp-uniform: the compares only on the tiles that need them (the forward's)
#pragma unroll
                for (int jn = 0; jn < BQ / 8; jn++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int key = k_lo + g + 8 * (e / 2), col = jn * 8 + 2 * t4 + e % 2;
                        if (q0 + col < key || q0 + col >= T || (DOCS && q0 + col >= docs.end[e / 2]))
                            st[jn][e] = 0.0f; // before the key, past the row, another document
                    }
            }
            uint32_t pf[BQ / 16][4];
            acc_to_frags<BQ>(pf, st);
            gemm_rs<HD, BQ>(dv, pf, sdO, BQ * SW); // runs while dS^T is computed
            wgmma_commit();
#pragma unroll
            for (int jn = 0; jn < BQ / 8; jn++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    st[jn][e] *= dpt[jn][e] - delta[jn * 8 + 2 * t4 + e % 2];
            acc_to_frags<BQ>(df, st);
            gemm_rs<HD, BQ>(dk, df, sQ, BQ * SW); // runs while dS goes to shared memory
            wgmma_commit();
            wgmma_wait<1>(); // dV's: its fragments' registers free for dQ's accumulators
            regs_fence(dv);
            regs_fence(pf);
        } else { // a turn all the same: both warpgroups take one a step; dS is zero
            turn_wait(wg);
            turn_pass(wg);
#pragma unroll
            for (int kk = 0; kk < BQ / 16; kk++)
#pragma unroll
                for (int e = 0; e < 4; e++) df[kk][e] = 0u;
        }
        // dS of this step to shared memory; the previous step's dQ share (its dS has been
        // there since then, so the other consumer's half is rarely waited for: the two stay
        // half a step apart, the pingpong)
        ds_put<HD>(base, df, wg, gs);
        float dq[8][4];
        dq_issue<HD>(dq, base, wg, gs - 1, it > 0); // it 0: a product of nothing, dropped
        wgmma_wait<0>();
        regs_fence(dk);
        regs_fence(df);
        if (it > 0) {
            regs_fence(dq);
            dq_stage<HD>(dq, base, wg, gs - 1);
        }
        mbar_arrive(bars.k_empty(s));
    }
    { // the last step's share
        float dq[8][4];
        dq_issue<HD>(dq, base, wg, pos + n_steps - 1, true);
        wgmma_wait<0>();
        regs_fence(dq);
        dq_stage<HD>(dq, base, wg, pos + n_steps - 1);
    }
    if (wg == 0) turn_wait(wg); // warpgroup 1's last signal
    // Both consumers' products are done with K (the N split reads the other's rows): stage
    // each one's results in its own K and V rows.
    bar_sync(BAR_END, 256);
    const size_t kvs = (size_t)p.Hkv * HD, at = (size_t)b * T * kvs + (size_t)kvh * HD;
    const float dk_scale[2] = {p.scale, p.scale}, one[2] = {1.0f, 1.0f};
    store_rows<HD>(dk, dk_scale, sK, ROWS * SW, p.dk + at, kvs, wg_lo, T, wg);
    store_rows<HD>(dv, one, sV, ROWS * SW, p.dv + at, kvs, wg_lo, T, wg);
    fence_async_smem(); // the next item's K and V come by TMA
    mbar_arrive(base + L::KV_FREE);
}

// Each role walks the block's items (bwd_item); done: items so far, pos: their steps.
#define FOR_EACH_BWD_ITEM(w, done, pos)                                                     \
    for (int idx_ = 0, done = 0, pos = 0, got_;                                             \
         (got_ = bwd_item<DOCS>(p, idx_, w)) != BWD_END;                                    \
         idx_++, done += got_ == BWD_ITEM, pos += got_ == BWD_ITEM ? w.steps() : 0)          \
        if (got_ == BWD_ITEM)

template <int HD, bool DOCS> __device__ void dkv_produce(const bwd_tma &p, uint32_t base) {
    bwd_walk w;
    FOR_EACH_BWD_ITEM(w, done, pos) dkv_produce_item<HD>(p, base, w, done, pos);
}

// The dQ writer (one warp): the stage free at first, then freed each step once read while a
// later step will fill it (total: the block's steps).
template <int HD, bool DOCS> __device__ void dq_write(const bwd_tma &p, uint32_t base) {
    bwd_walk w;
    int total = 0;
    FOR_EACH_BWD_ITEM(w, done, pos) total = pos + w.steps();
    if (total > 0) bar_arrive(BAR_DQ_EMPTY, DQ_BAR_THREADS);
    FOR_EACH_BWD_ITEM(w, done, pos) dq_write_item<HD, DOCS>(p, base, w, pos, total);
}

template <int HD, bool DOCS> __device__ void dkv_consume(const bwd_tma &p, uint32_t base) {
    bwd_walk w;
    FOR_EACH_BWD_ITEM(w, done, pos) dkv_consume_item<HD, DOCS>(p, base, w, done, pos);
}
#undef FOR_EACH_BWD_ITEM

template <int HD, bool DOCS>
__global__ void __launch_bounds__(THREADS, 1) attention_bwd_sm90(const __grid_constant__ bwd_tma p) {
    typedef dkv_smem<HD> L;
    const uint32_t base = smem_base();
    if (threadIdx.x == 0) {
        mbar_init(base + L::KV_FREE, CONSUMERS * 128);
        ds_bars{base + L::DS_BARS}.init();
        ring_bars{base + L::BARS}.init(); // and the fence after every init
    }
    __syncthreads();
    if (threadIdx.x / 128 == CONSUMERS) {
        regs_shrink<PRODUCER_REGS>();
        const int warp = threadIdx.x / 32;
        if (threadIdx.x == CONSUMERS * 128)
            dkv_produce<HD, DOCS>(p, base);
        else if (warp == WRITER_WARP)
            dq_write<HD, DOCS>(p, base);
        return;
    }
    regs_grow<CONSUMER_REGS>();
    dkv_consume<HD, DOCS>(p, base);
}

// dQ = scale * dq_accum as bf16, a thread per float4 of the launch's accumulators (the layout
// of stage_at: tile, column chunk, register, thread).
template <int HD> __global__ void dq_convert_sm90(const __grid_constant__ bwd_tma p) {
    const int group = p.Hq / p.Hkv, heads = p.n_kv * group, tiles = p.Tp / BQ;
    constexpr int PER_TILE = BQ * HD / 4;
    const size_t total = (size_t)p.B * heads * tiles * PER_TILE;
    const float4 *acc = reinterpret_cast<const float4 *>(p.dq_accum);
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        const int f = (int)(i % PER_TILE);
        const size_t tile = i / PER_TILE;
        const int qt = (int)(tile % tiles), hc = (int)(tile / tiles % heads);
        const int b = (int)(tile / tiles / heads);
        const int t = f % 128, j = f / 128 % 8, c = f / 1024, lane = t % 32;
        const int row = qt * BQ + (t / 32) * 16 + lane / 4, col = c * 64 + j * 8 + 2 * (lane % 4);
        if (row >= p.T) continue;
        const float4 v = acc[i];
        const size_t h = (size_t)p.kv0 * group + hc, qs = (size_t)p.Hq * HD;
        bf16 *out = p.dq + ((size_t)b * p.T + row) * qs + h * HD + col;
        *reinterpret_cast<uint32_t *>(out) = pack_bf16(v.x * p.scale, v.y * p.scale);
        if (row + 8 < p.T)
            *reinterpret_cast<uint32_t *>(out + 8 * qs) = pack_bf16(v.z * p.scale, v.w * p.scale);
    }
}

} // namespace

// ---- host side ----

// A 4-D map over [B, T, H, hd] bf16 at base: boxes of 64 columns, one head, `rows` rows;
// 128-byte swizzle; rows past T read as zeros.
static int encode_map(kctx *c, CUtensorMap *map, const void *base, int B, int T, int H, int hd,
                      int rows) {
    const cuuint64_t dims[4] = {(cuuint64_t)hd, (cuuint64_t)H, (cuuint64_t)T, (cuuint64_t)B};
    const cuuint64_t strides[3] = {(cuuint64_t)hd * 2, (cuuint64_t)H * hd * 2,
                                   (cuuint64_t)T * H * hd * 2};
    const cuuint32_t box[4] = {64, 1, (cuuint32_t)rows, 1}, step[4] = {1, 1, 1, 1};
    PFN_cuTensorMapEncodeTiled_v12000 encode =
        (PFN_cuTensorMapEncodeTiled_v12000)cuda_state(c)->tensor_map_encode;
    CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<void *>(base), dims,
                        strides, box, step, CU_TENSOR_MAP_INTERLEAVE_NONE,
                        CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        k_fail(c, "CUDA attention (sm_90a): cuTensorMapEncodeTiled failed (CUresult %d) for "
                  "B=%d T=%d H=%d hd=%d", (int)r, B, T, H, hd);
        return -1;
    }
    return 0;
}

template <typename Kernel> static int allow_smem(kctx *c, Kernel kernel, size_t bytes) {
    if (bytes > (size_t)cuda_state(c)->smem_optin) {
        k_fail(c, "CUDA attention (sm_90a): a block needs %zu bytes of shared memory, the device "
                  "gives %d", bytes, cuda_state(c)->smem_optin);
        return -1;
    }
    return cuda_check_call(c,
                           cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                (int)bytes),
                           "attention (sm_90a): cudaFuncSetAttribute");
}

template <int HD, bool DOCS> static void launch_fwd(kctx *c, const fwd_tma &p) {
    const size_t smem = fwd_smem<HD>::BYTES;
    if (allow_smem(c, attention_fwd_sm90<HD, DOCS>, smem)) return;
    const int items = p.Hq * p.B * ((p.T + ROWS - 1) / ROWS); // fwd_items
    const int sms = cuda_state(c)->sm_count, grid = items < sms ? items : sms; // persistent
    attention_fwd_sm90<HD, DOCS><<<grid, THREADS, smem, cuda_stream(c)>>>(p);
    cuda_check_launch(c, "attention forward (sm_90a)");
}

// The backward for the kv heads kv0 .. kv0 + n_kv - 1: the semaphores zeroed, the kernel,
// then dQ from the accumulators.
// GQA's rows (bwd_item): a key block a persistent block, all at once, if they fit the device;
// else two rows (key block k beside nb - 1 - k: every persistent block the same work), or
// rows of a device's width at the longest.  Sets p.width; returns the lanes, the (batch, kv
// head) pairs a round.
static int bwd_lanes(bwd_tma &p, int sms) {
    const int nb = (p.T + ROWS - 1) / ROWS, pairs = p.B * p.n_kv;
    if ((long)pairs * nb <= sms) p.width = nb;
    else p.width = (nb + 1) / 2 <= sms ? (nb + 1) / 2 : sms;
    const int lanes = sms / p.width;
    return lanes < pairs ? lanes : pairs;
}

template <int HD, bool DOCS> static void launch_bwd(kctx *c, bwd_tma p) {
    if (allow_smem(c, attention_bwd_sm90<HD, DOCS>, dkv_smem<HD>::BYTES)) return;
    const size_t tiles = (size_t)p.B * p.n_kv * (p.Hq / p.Hkv) * (p.Tp / BQ);
    if (cuda_check_call(c, cudaMemsetAsync(p.dq_sem, 0, tiles * sizeof(int), cuda_stream(c)),
                        "attention backward (sm_90a): zeroing the dQ semaphores"))
        return;

    const unsigned key_blocks = (p.T + ROWS - 1) / ROWS;
    const bool rows = bwd_rows<DOCS>(p);
    const int lanes = rows ? bwd_lanes(p, cuda_state(c)->sm_count) : 0; // sets p.width
    const dim3 grid = rows ? dim3(lanes * p.width)
                           : p.down ? dim3(p.n_kv, p.B, key_blocks) : dim3(key_blocks, p.n_kv, p.B);
    attention_bwd_sm90<HD, DOCS><<<grid, THREADS, dkv_smem<HD>::BYTES, cuda_stream(c)>>>(p);
    cuda_check_launch(c, "attention backward (sm_90a)");
    const size_t float4s = tiles * BQ * HD / 4;
    dq_convert_sm90<HD><<<cuda_blocks(float4s, 256), 256, 0, cuda_stream(c)>>>(p);
    cuda_check_launch(c, "attention backward (dQ; sm_90a)");
}

// dq_accum's budget: the backward runs as many kv heads a launch as fit (at least one).
#define DQ_ACCUM_BUDGET ((size_t)256 << 20)

static size_t dq_accum_bytes_per_kv(int B, int Tp, int Hq, int Hkv, int hd) {
    return (size_t)B * (Hq / Hkv) * Tp * hd * sizeof(float);
}

// As many as fit, spread evenly over the launches they take (at Llama-2-7B B 4 T 8192, 15 fit:
// 11, 11 and 10, not 15, 15 and 2, whose last launch is mostly its blocks' tail).
static int kv_heads_a_launch(int B, int Tp, int Hq, int Hkv, int hd) {
    size_t n = DQ_ACCUM_BUDGET / dq_accum_bytes_per_kv(B, Tp, Hq, Hkv, hd);
    const int fit = n < 1 ? 1 : n > (size_t)Hkv ? Hkv : (int)n;
    const int launches = (Hkv + fit - 1) / fit;
    return (Hkv + launches - 1) / launches;
}

extern "C" size_t cuda_attention_sm90_bwd_scratch(int B, int Tp, int Hq, int Hkv, int hd) {
    const size_t n = (size_t)kv_heads_a_launch(B, Tp, Hq, Hkv, hd);
    const size_t sems = (size_t)B * n * (Hq / Hkv) * (Tp / BQ) * sizeof(int);
    return n * dq_accum_bytes_per_kv(B, Tp, Hq, Hkv, hd) + (sems + 255) / 256 * 256;
}

extern "C" int cuda_attention_sm90_setup(kctx *c, int device, errbuf *err) {
    cuda_impl *s = cuda_state(c);
    int major = 0, minor = 0;
    cudaError_t e;
    if ((e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device)) !=
            cudaSuccess ||
        (e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device)) !=
            cudaSuccess)
        return errf(err, "CUDA backend on device %d: reading the compute capability: %s", device,
                    cudaGetErrorString(e));
    const char *choice = getenv("FSDP_CUDA_ATTENTION");
    if (choice && strcmp(choice, "mma") && strcmp(choice, "wgmma"))
        return errf(err, "FSDP_CUDA_ATTENTION=%s: expected \"wgmma\" (the sm_90a kernels, the "
                         "default on Hopper) or \"mma\" (the mma.sync kernels)", choice);
    s->attention_sm90 = 0;
    if (major != 9 || minor != 0 || (choice && !strcmp(choice, "mma"))) return 0;
    cudaDriverEntryPointQueryResult found;
    if ((e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &s->tensor_map_encode,
                                              12000, cudaEnableDefault, &found)) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess || !s->tensor_map_encode)
        return errf(err, "CUDA backend on device %d: the driver has no cuTensorMapEncodeTiled "
                         "(TMA, for the sm_90a attention): %s", device,
                    e != cudaSuccess ? cudaGetErrorString(e) : "symbol not found");
    s->attention_sm90 = 1;
    return 0;
}

extern "C" void cuda_attention_sm90_fwd(kctx *c, void *out, float *lse, const void *q,
                                        const void *k, const void *v, const k_docs *docs,
                                        int window, int B, int T, int Hq, int Hkv, int hd) {
    if (window) { // cuda_attention.cu folds a window into docs before it calls here
        k_fail(c, "attention (sm90): a sliding window must come as document bounds");
        return;
    }
    fwd_tma p;
    memset(&p, 0, sizeof p);
    if (encode_map(c, &p.q, q, B, T, Hq, hd, ROWS) || encode_map(c, &p.k, k, B, T, Hkv, hd, FWD_KEYS) ||
        encode_map(c, &p.v, v, B, T, Hkv, hd, FWD_KEYS))
        return;
    p.out = (bf16 *)out;
    p.lse = lse;
    p.doc_start = docs ? docs->start : nullptr;
    p.B = B;
    p.T = T;
    p.Hq = Hq;
    p.Hkv = Hkv;
    p.scale_log2 = LOG2E / sqrtf((float)hd);
    if (hd == 64)
        docs ? launch_fwd<64, true>(c, p) : launch_fwd<64, false>(c, p);
    else
        docs ? launch_fwd<128, true>(c, p) : launch_fwd<128, false>(c, p);
}

extern "C" void cuda_attention_sm90_bwd(kctx *c, void *dq, void *dk, void *dv, const void *dout,
                                        const void *q, const void *k, const void *v,
                                        const float *lse2, const float *delta, int Tp,
                                        void *scratch, const k_docs *docs, int window, int B,
                                        int T, int Hq, int Hkv, int hd) {
    if (window) { // as the forward's
        k_fail(c, "attention backward (sm90): a sliding window must come as document bounds");
        return;
    }
    if (Tp % BQ || ((uintptr_t)scratch & 15)) {
        k_fail(c, "attention backward (sm90): rows padded to %d (not a multiple of %d) or "
                  "scratch not 16-byte aligned", Tp, BQ);
        return;
    }
    bwd_tma p;
    memset(&p, 0, sizeof p);
    p.dq = (bf16 *)dq;
    p.dk = (bf16 *)dk;
    p.dv = (bf16 *)dv;
    p.lse2 = lse2;
    p.delta = delta;
    p.doc_start = docs ? docs->start : nullptr;
    p.doc_end = docs ? docs->end : nullptr;
    // GQA: the first key block's share first, in lockstep rows without documents (bwd_item;
    // H100, 70B T 2048/8192: 365/455 TFLOP/s, against 280/381 launched a block a key block,
    // the first key blocks first, and 248/282 on an H200 walking up); MHA up (325/418 against 268/367
    // down at 7B on an H200, launched a block a key block), where a head's accumulators stay
    // in L2 (bench/NOTES.md).
    p.down = Hq > Hkv;
    p.B = B;
    p.T = T;
    p.Hq = Hq;
    p.Hkv = Hkv;
    p.Tp = Tp;
    p.scale = 1.0f / sqrtf((float)hd);
    p.scale_log2 = p.scale * LOG2E;
    const int per_launch = kv_heads_a_launch(B, Tp, Hq, Hkv, hd);
    p.dq_accum = (float *)scratch;
    p.dq_sem = (int *)((char *)scratch + per_launch * dq_accum_bytes_per_kv(B, Tp, Hq, Hkv, hd));
    if (encode_map(c, &p.q, q, B, T, Hq, hd, BQ) || encode_map(c, &p.dout, dout, B, T, Hq, hd, BQ) ||
        encode_map(c, &p.k, k, B, T, Hkv, hd, ROWS) || encode_map(c, &p.v, v, B, T, Hkv, hd, ROWS))
        return;
    for (p.kv0 = 0; p.kv0 < Hkv; p.kv0 += per_launch) {
        p.n_kv = Hkv - p.kv0 < per_launch ? Hkv - p.kv0 : per_launch;
        if (hd == 64)
            docs ? launch_bwd<64, true>(c, p) : launch_bwd<64, false>(c, p);
        else
            docs ? launch_bwd<128, true>(c, p) : launch_bwd<128, false>(c, p);
    }
}
