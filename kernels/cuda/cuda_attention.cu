// The CUDA backend: causal attention with grouped-query heads, FlashAttention-2 style.  On a
// compute capability 9.0 device (H100, H200) head dims 64 and 128 go to cuda_attention_sm90.cu
// instead (wgmma, TMA; FSDP_CUDA_ATTENTION=mma keeps these kernels): these are the path of
// sm_80-89.
//
// Tensors are [B, T, H, hd] bf16 (hd 64 or 128); the log-sum-exp is [B, Hq, T] fp32, natural
// log.  No T x T matrix is ever stored: the forward pass walks tiles of keys and values for
// each tile of queries with an online softmax in fp32 (in the log2 domain: exp2 of the scores
// times log2(e)/sqrt(hd)), and the backward pass recomputes the probabilities
// P = exp(s - lse) from Q, K and the saved lse.
//
// Products run on the tensor cores (mma.sync m16n8k16: bf16 in, fp32 accumulate, sm_80 and
// later); ldmatrix moves operands from shared memory, cp.async copies tiles from global
// memory, double-buffered.  Each warp owns 16 rows of its block's tile:
//   forward: a block per (query head, batch, tile of 16*warps queries).  Q stays in registers;
//     64-key tiles of K and V stream through: S = Q K^T, online softmax, O += P V.
//   backward, deterministic (every output element is summed by one thread in a fixed order,
//   no atomics):
//     delta: D = rowsum(dO * O) and lse * log2(e) into scratch, rows padded to a multiple of 128;
//     dK/dV: a block per (kv head, batch, tile of 16*warps keys), looping over every query head
//       of the group and every query tile from the diagonal on: S^T = K Q^T, P^T,
//       dV += P^T dO, dP^T = V dO^T, dS^T = P^T (dP^T - D), dK += dS^T Q;
//     dQ: a block per (query head, batch, tile of 16*warps queries), looping over key tiles up
//       to the diagonal: S = Q K^T, P, dP = dO V^T, dS = P (dP - D), dQ += dS K.
// The tiles whose work is longest (most keys for the forward and dQ, most queries for dK/dV)
// are launched first.  Shared-memory rows are padded by 16 bytes so that the eight 16-byte rows
// an ldmatrix reads fall in different banks.  Blocks have 8 warps where their shared memory
// fits (sm_80, sm_90), else 4 (sm_86 and sm_89 give a block at most 99 KB).
//
// Varlen (k_docs, DOCS = true): a query sees only the keys of its document.  Document starts
// and ends never decrease along a row, so a query tile's keys begin at its first row's
// document start and a key tile's queries end at its last key's document end: the forward
// and dQ skip the key tiles before it, dK/dV the query tiles after it, and tiles that cross a
// boundary are masked per element.  Without docs (DOCS = false) the kernels are what they were
// before varlen: the same parameter struct, the varlen masks separate statements that fold
// away (their sm_90 PTX is the same, instruction for instruction).
//
// Sliding window (Mistral, window > 0): query t sees keys t - window + 1 .. t only.  The
// dispatchers below fold the window into document bounds (window_bounds): query t's keys start
// at max(its document's start, t - window + 1) and key j's queries end at min(its document's
// end, j + window).  Both still never decrease along a row, so the DOCS kernels (here and in
// cuda_attention_sm90.cu) run the band as they run documents: the key tiles before a query
// tile's band skipped, the query tiles after a key tile's band skipped, the band's edges
// masked per element.  RoPE's positions come from the documents themselves, not these bounds.
//
// tests/gpu/emulate_attention runs these kernels on the host: it replaces the section between
// the "device primitives" markers with an emulation of each instruction.
#include <math.h>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_attention_docs.cuh"

// ---- device primitives (begin) ----
extern __shared__ __align__(16) unsigned char cuda_attention_smem[];

__device__ __forceinline__ unsigned char *dynamic_smem() {
    return cuda_attention_smem;
}

__device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 bf16 matrices; lanes 8i..8i+7 give the row addresses of matrix i, which lands in
// r[i] (lane l holds row l/4, columns 2(l%4) and 2(l%4)+1).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// The same, each matrix transposed (lane l holds column l/4, rows 2(l%4) and 2(l%4)+1).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// d += A B for a 16x16 A (row-major fragments) and a 16x8 B (column-major fragments).
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats as bf16 (round to nearest even), lo in the low half.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// 16 bytes global -> shared, asynchronously; zeros instead when !valid (src is not read).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void *src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(valid ? 16 : 0)
                 : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits until at most N of this thread's committed groups of copies are still in flight.
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
// ---- device primitives (end) ----

#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f
#define STATS_PAD 128 // delta and lse rows are padded to a multiple of this (>= every tile)

struct fwd_params {
    bf16 *out;
    float *lse;
    const bf16 *q, *k, *v;
    int B, T, Hq, Hkv;
    float scale_log2; // log2(e) / sqrt(hd)
};

struct bwd_params {
    bf16 *dq, *dk, *dv;
    float *lse2, *delta; // scratch [B, Hq, Tp]: lse * log2(e) and rowsum(dO * O), zero past T
    const bf16 *dout, *q, *k, *v, *out;
    const float *lse;
    int B, T, Hq, Hkv, Tp;
    float scale, scale_log2;
};

// A launch's parameters: the plain ones, plus (varlen kernels only) the documents' bounds,
// [B, T] each (k_docs).  The plain kernels get a struct of the plain size, so their code is
// what it was before varlen existed.  starts()/ends() are NULL for them, and never read.
template <bool DOCS> struct fwd_args : fwd_params {
    __device__ __forceinline__ const int32_t *starts() const { return nullptr; }
};
template <> struct fwd_args<true> : fwd_params {
    const int32_t *doc_start;
    __device__ __forceinline__ const int32_t *starts() const { return doc_start; }
};
template <bool DOCS> struct bwd_args : bwd_params {
    __device__ __forceinline__ const int32_t *starts() const { return nullptr; }
    __device__ __forceinline__ const int32_t *ends() const { return nullptr; }
};
template <> struct bwd_args<true> : bwd_params {
    const int32_t *doc_start, *doc_end;
    __device__ __forceinline__ const int32_t *starts() const { return doc_start; }
    __device__ __forceinline__ const int32_t *ends() const { return doc_end; }
};

// Tile geometry: shared rows of HD bf16 plus 16 bytes of padding; warps of 16 rows.  The
// backward's tiles are narrower at hd 128 to keep two 16 x hd fp32 accumulators per warp (dK
// and dV, or Q and dO fragments and dQ) within 255 registers.
template <int HD, int NW> struct tiles {
    static constexpr int RB = (HD + 8) * 2; // bytes per shared row
    static constexpr int THREADS = NW * 32;
    static constexpr int ROWS = 16 * NW;                    // queries (fwd, dQ), keys (dK/dV)
    static constexpr int FWD_KEYS = 64;                     // keys per tile, forward
    static constexpr int DQ_KEYS = HD == 128 ? 32 : 64;     // keys per tile, dQ
    static constexpr int DKV_QUERIES = HD == 128 ? 32 : 64; // queries per step, dK/dV
    static constexpr size_t fwd_smem = (size_t)(ROWS + 4 * FWD_KEYS) * RB;
    static constexpr size_t dq_smem = (size_t)(2 * ROWS + 4 * DQ_KEYS) * RB;
    static constexpr size_t dkv_step = (size_t)2 * DKV_QUERIES * RB + 2 * DKV_QUERIES * 4;
    static constexpr size_t dkv_smem = (size_t)2 * ROWS * RB + 2 * dkv_step;
    static constexpr size_t bwd_smem = dkv_smem > dq_smem ? dkv_smem : dq_smem;
};

// Copies rows [row0, row0 + ROWS) of one head into a shared tile of padded rows.  head points
// at the head's row 0, rows are `stride` elements apart, rows at or past T become zeros.
template <int HD, int ROWS, int THREADS>
__device__ __forceinline__ void load_rows(uint32_t tile, const bf16 *head, size_t stride,
                                          int row0, int T) {
    constexpr int CHUNKS = HD / 8; // 16-byte pieces of a row
    constexpr int RB = (HD + 8) * 2;
    static_assert(ROWS * CHUNKS % THREADS == 0, "tile copy must split evenly over threads");
#pragma unroll
    for (int it = 0; it < ROWS * CHUNKS / THREADS; it++) {
        int i = threadIdx.x + it * THREADS, r = i / CHUNKS, ch = i % CHUNKS;
        bool valid = row0 + r < T;
        const bf16 *src = valid ? head + (size_t)(row0 + r) * stride + ch * 8 : head;
        cp_async_16(tile + r * RB + ch * 16, src, valid);
    }
}

// The double-buffered key/value pipeline of the forward and dq kernels: before tile j is
// used, tile j+1 is loaded into the other buffer (tile 0 was loaded before the loop), then
// tile j's copies are waited for and the block syncs.
template <int HD, int BN, int THREADS>
__device__ __forceinline__ void next_kv_tile(uint32_t sK, uint32_t sV, const bf16 *kh, const bf16 *vh,
                                             size_t kvs, int j, int n_tiles, int T) {
    constexpr int RB = (HD + 8) * 2;
    const int buf = j & 1;
    if (j + 1 < n_tiles) { // prefetch the next tile into the other buffer
        load_rows<HD, BN, THREADS>(sK + (buf ^ 1) * BN * RB, kh, kvs, (j + 1) * BN, T);
        load_rows<HD, BN, THREADS>(sV + (buf ^ 1) * BN * RB, vh, kvs, (j + 1) * BN, T);
        cp_async_commit();
        cp_async_wait<1>();
    } else {
        cp_async_wait<0>();
    }
    __syncthreads();
}

// Lane offsets (bytes) into a tile of padded rows for the three ldmatrix patterns:
// an A fragment (16x16, row-major) at rows r0.., columns c0..;
__device__ __forceinline__ uint32_t a_offset(int lane, int RB) {
    return (lane % 16) * RB + (lane / 16) * 16;
}
// B fragments for two 8-column blocks from a tile stored [n][k] (rows are B's columns);
__device__ __forceinline__ uint32_t b_rows_offset(int lane, int RB) {
    return ((lane % 8) + (lane / 16) * 8) * RB + ((lane / 8) % 2) * 16;
}
// B fragments for two 8-column blocks from a tile stored [k][n] (transposed by ldmatrix).
__device__ __forceinline__ uint32_t b_cols_offset(int lane, int RB) {
    return ((lane % 8) + ((lane / 8) % 2) * 8) * RB + (lane / 16) * 16;
}

// The A fragments of a warp's 16 x K rows (a_tile includes a_offset).
template <int K, int RB>
__device__ __forceinline__ void load_a(uint32_t (&a)[K / 16][4], uint32_t a_tile) {
#pragma unroll
    for (int kk = 0; kk < K / 16; kk++) ldmatrix_x4(a[kk], a_tile + kk * 32);
}

// acc (16 x N) += A B^T: A in registers (16 x K), B N x K rows of a shared tile
// (b_tile includes b_rows_offset).
template <int N, int K, int RB>
__device__ __forceinline__ void mma_regs_rows(float (&acc)[N / 8][4], const uint32_t (&a)[K / 16][4],
                                              uint32_t b_tile) {
#pragma unroll
    for (int kk = 0; kk < K / 16; kk++) {
#pragma unroll
        for (int nn = 0; nn < N / 16; nn++) {
            uint32_t b[4];
            ldmatrix_x4(b, b_tile + nn * 16 * RB + kk * 32);
            mma_16816(acc[2 * nn], a[kk], b[0], b[1]);
            mma_16816(acc[2 * nn + 1], a[kk], b[2], b[3]);
        }
    }
}

// acc (16 x N) += A B^T with A 16 x K rows of a shared tile (a_tile includes a_offset).
template <int N, int K, int RB>
__device__ __forceinline__ void mma_rows_rows(float (&acc)[N / 8][4], uint32_t a_tile,
                                              uint32_t b_tile) {
#pragma unroll
    for (int kk = 0; kk < K / 16; kk++) {
        uint32_t a[4];
        ldmatrix_x4(a, a_tile + kk * 32);
#pragma unroll
        for (int nn = 0; nn < N / 16; nn++) {
            uint32_t b[4];
            ldmatrix_x4(b, b_tile + nn * 16 * RB + kk * 32);
            mma_16816(acc[2 * nn], a, b[0], b[1]);
            mma_16816(acc[2 * nn + 1], a, b[2], b[3]);
        }
    }
}

// acc (16 x N) += P B: P the fp32 accumulators of a 16 x K product (rounded to bf16 here), B
// K x N rows of a shared tile (b_tile includes b_cols_offset).  An accumulator's layout is the
// A fragment's, so P needs no shuffle.
template <int N, int K, int RB>
__device__ __forceinline__ void mma_acc_cols(float (&acc)[N / 8][4], const float (&p)[K / 8][4],
                                             uint32_t b_tile) {
#pragma unroll
    for (int kk = 0; kk < K / 16; kk++) {
        uint32_t a[4] = {pack_bf16(p[2 * kk][0], p[2 * kk][1]),
                         pack_bf16(p[2 * kk][2], p[2 * kk][3]),
                         pack_bf16(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                         pack_bf16(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
        for (int nn = 0; nn < N / 16; nn++) {
            uint32_t b[4];
            ldmatrix_x4_trans(b, b_tile + kk * 16 * RB + nn * 32);
            mma_16816(acc[2 * nn], a, b[0], b[1]);
            mma_16816(acc[2 * nn + 1], a, b[2], b[3]);
        }
    }
}

template <int N> __device__ __forceinline__ void zero_acc(float (&acc)[N][4]) {
#pragma unroll
    for (int j = 0; j < N; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[j][i] = 0.0f;
}

// Writes a warp's 16 x HD accumulator as bf16 rows [row0, row0 + 16) of one head (rows at or
// past T are dropped), row g scaled by scale[0] and row g + 8 by scale[1].  The rows go
// through `stage`, 16 padded shared rows only this warp uses, so that global stores are 16
// bytes wide.  In an accumulator, lane l holds rows l/4 and l/4 + 8, columns 2(l%4) and
// 2(l%4)+1 of each 8-column block.
template <int HD>
__device__ __forceinline__ void store_rows(const float (&acc)[HD / 8][4], const float (&scale)[2],
                                           unsigned char *stage, bf16 *head, size_t stride,
                                           int row0, int T) {
    constexpr int RB = (HD + 8) * 2, CHUNKS = HD / 8;
    const int lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
#pragma unroll
    for (int j = 0; j < HD / 8; j++)
#pragma unroll
        for (int r = 0; r < 2; r++)
            *reinterpret_cast<uint32_t *>(stage + (g + 8 * r) * RB + (j * 8 + 2 * t4) * 2) =
                pack_bf16(acc[j][2 * r] * scale[r], acc[j][2 * r + 1] * scale[r]);
    __syncwarp();
#pragma unroll
    for (int it = 0; it < 16 * CHUNKS / 32; it++) {
        int i = lane + it * 32, r = i / CHUNKS, ch = i % CHUNKS;
        if (row0 + r < T)
            *reinterpret_cast<uint4 *>(head + (size_t)(row0 + r) * stride + ch * 8) =
                *reinterpret_cast<const uint4 *>(stage + r * RB + ch * 16);
    }
}

// ---- forward ----

template <int HD, int NW, bool DOCS>
__global__ void __launch_bounds__(NW * 32) attention_fwd_kernel(const fwd_args<DOCS> p) {
    typedef tiles<HD, NW> G;
    constexpr int RB = G::RB, BM = G::ROWS, BN = G::FWD_KEYS;
    unsigned char *smem = dynamic_smem();
    const uint32_t sQ = smem_u32(smem), sK = sQ + BM * RB, sV = sK + 2 * BN * RB;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
    const int h = blockIdx.x, b = blockIdx.y, m = gridDim.z - 1 - blockIdx.z;
    const int kvh = h / (p.Hq / p.Hkv), T = p.T;
    const int q0 = m * BM, row_lo = q0 + warp * 16; // the warp's rows: row_lo .. row_lo + 15
    const size_t qs = (size_t)p.Hq * HD, kvs = (size_t)p.Hkv * HD;
    const bf16 *qh = p.q + (size_t)b * T * qs + (size_t)h * HD;
    const bf16 *kh = p.k + (size_t)b * T * kvs + (size_t)kvh * HD;
    const bf16 *vh = p.v + (size_t)b * T * kvs + (size_t)kvh * HD;
    const int n_tiles = (imin(T, q0 + BM) - 1) / BN + 1; // key tiles up to the diagonal
    const query_docs docs =
        query_docs_of<DOCS>(p.starts(), b, T, row_lo, g, row_lo, row_lo + 15);
    const int j0 = DOCS ? p.starts()[(size_t)b * T + q0] / BN : 0; // the block's first key tile

    load_rows<HD, BM, G::THREADS>(sQ, qh, qs, q0, T);
    cp_async_commit();
    load_rows<HD, BN, G::THREADS>(sK + (j0 & 1) * BN * RB, kh, kvs, j0 * BN, T);
    load_rows<HD, BN, G::THREADS>(sV + (j0 & 1) * BN * RB, vh, kvs, j0 * BN, T);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    uint32_t qf[HD / 16][4];
    load_a<HD, RB>(qf, sQ + warp * 16 * RB + a_offset(lane, RB));

    float o[HD / 8][4], row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};
    zero_acc(o);
    for (int j = j0; j < n_tiles; j++) {
        const int buf = j & 1;
        next_kv_tile<HD, BN, G::THREADS>(sK, sV, kh, vh, kvs, j, n_tiles, T);
        // else every key of the tile is past the warp's rows, or (varlen) before their documents
        if (j * BN <= row_lo + 15 && (!DOCS || j * BN + BN - 1 >= docs.lo)) {
            float s[BN / 8][4];
            zero_acc(s);
            mma_regs_rows<BN, HD, RB>(s, qf, sK + buf * BN * RB + b_rows_offset(lane, RB));
            // some key past some row, or (varlen) before some row's document
            const bool masked = j * BN + BN - 1 > row_lo || (DOCS && j * BN < docs.hi);
#pragma unroll
            for (int r = 0; r < 2; r++) { // rows g and g + 8
                const int row = row_lo + g + 8 * r;
                float top = -INFINITY;
#pragma unroll
                for (int jn = 0; jn < BN / 8; jn++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        float x = s[jn][2 * r + e] * p.scale_log2;
                        const int key = j * BN + jn * 8 + 2 * t4 + e;
                        if (masked && key > row) x = -INFINITY;
                        if (DOCS && masked && key < docs.first[r]) x = -INFINITY; // other document
                        s[jn][2 * r + e] = x;
                        top = fmaxf(top, x);
                    }
                top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 1)); // the row's 4 lanes
                top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 2));
                const float new_max = fmaxf(row_max[r], top);
                // Key 0 is in every row's first tile, so new_max is finite (varlen: a row's
                // first tiles may be masked whole); the guard keeps exp2(-inf - -inf) from ever
                // making a NaN.
                const float base = new_max == -INFINITY ? 0.0f : new_max;
                const float rescale = exp2f(row_max[r] - base);
                float sum = 0.0f;
#pragma unroll
                for (int jn = 0; jn < BN / 8; jn++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        float e_ = exp2f(s[jn][2 * r + e] - base);
                        s[jn][2 * r + e] = e_;
                        sum += e_;
                    }
                row_sum[r] = row_sum[r] * rescale + sum; // this lane's part of the row
                row_max[r] = new_max;
#pragma unroll
                for (int dn = 0; dn < HD / 8; dn++) {
                    o[dn][2 * r] *= rescale;
                    o[dn][2 * r + 1] *= rescale;
                }
            }
            mma_acc_cols<HD, BN, RB>(o, s, sV + buf * BN * RB + b_cols_offset(lane, RB));
        }
        __syncthreads(); // the next prefetch overwrites this tile's buffer
    }

    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 1);
        row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 2);
        inv[r] = 1.0f / row_sum[r];
    }
    // The warp's own Q rows are free now: stage the output there.
    store_rows<HD>(o, inv, smem + warp * 16 * RB, p.out + (size_t)b * T * qs + (size_t)h * HD,
                   qs, row_lo, T);
    if (t4 == 0) {
        float *lse = p.lse + ((size_t)b * p.Hq + h) * T;
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int row = row_lo + g + 8 * r;
            if (row < T) lse[row] = (row_max[r] + log2f(row_sum[r])) * LN2;
        }
    }
}

// ---- backward ----

// delta = rowsum(dO * O) and lse2 = lse * log2(e) for every row (b, h, t) of [B, Hq, Tp];
// zeros for t >= T.  HD/8 lanes a row, 8 elements each, summed in a fixed order.
template <int HD> __global__ void __launch_bounds__(256) attention_delta_kernel(const bwd_params p) {
    constexpr int LANES = HD / 8, ROWS = 256 / LANES;
    const size_t row = (size_t)blockIdx.x * ROWS + threadIdx.x / LANES; // grid covers B*Hq*Tp
    const int part = threadIdx.x % LANES;
    const int t = (int)(row % p.Tp);
    const size_t bh = row / p.Tp;
    float d = 0.0f;
    if (t < p.T) {
        const size_t b = bh / p.Hq, h = bh % p.Hq;
        const size_t at = ((b * p.T + t) * p.Hq + h) * HD + part * 8;
        float x[8], y[8];
        load_floats<8>(x, p.dout + at);
        load_floats<8>(y, p.out + at);
#pragma unroll
        for (int i = 0; i < 8; i++) d += x[i] * y[i];
    }
#pragma unroll
    for (int offset = LANES / 2; offset > 0; offset /= 2)
        d += __shfl_xor_sync(0xffffffffu, d, offset);
    if (part == 0) {
        p.delta[row] = d;
        p.lse2[row] = t < p.T ? p.lse[bh * p.T + t] * LOG2E : 0.0f;
    }
}

// One step of the dK/dV loop: query head h, query tile i.  Its buffer holds Q rows, dO rows,
// then lse2 and delta for the tile's queries.
template <int HD, int NW>
__device__ __forceinline__ void load_dkv_step(const bwd_params &p, uint32_t step_buf, int b, int h,
                                              int i) {
    typedef tiles<HD, NW> G;
    constexpr int BQ = G::DKV_QUERIES, RB = G::RB;
    const size_t qs = (size_t)p.Hq * HD;
    const size_t head = (size_t)b * p.T * qs + (size_t)h * HD;
    load_rows<HD, BQ, G::THREADS>(step_buf, p.q + head, qs, i * BQ, p.T);
    load_rows<HD, BQ, G::THREADS>(step_buf + BQ * RB, p.dout + head, qs, i * BQ, p.T);
    const size_t stats = ((size_t)b * p.Hq + h) * p.Tp + (size_t)i * BQ; // < Tp: padded rows
    if (threadIdx.x < BQ / 4)
        cp_async_16(step_buf + 2 * BQ * RB + threadIdx.x * 16, p.lse2 + stats + threadIdx.x * 4,
                    true);
    else if (threadIdx.x < BQ / 2)
        cp_async_16(step_buf + 2 * BQ * RB + BQ * 4 + (threadIdx.x - BQ / 4) * 16,
                    p.delta + stats + (threadIdx.x - BQ / 4) * 4, true);
}

template <int HD, int NW, bool DOCS>
__global__ void __launch_bounds__(NW * 32) attention_dkdv_kernel(const bwd_args<DOCS> p) {
    typedef tiles<HD, NW> G;
    constexpr int RB = G::RB, BK = G::ROWS, BQ = G::DKV_QUERIES;
    unsigned char *smem = dynamic_smem();
    const uint32_t sK = smem_u32(smem), sV = sK + BK * RB, steps = sV + BK * RB;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
    const int kvh = blockIdx.x, b = blockIdx.y, n = blockIdx.z, T = p.T;
    const int group = p.Hq / p.Hkv, k0 = n * BK, k_lo = k0 + warp * 16; // warp's keys k_lo..+15
    const size_t kvs = (size_t)p.Hkv * HD;
    const size_t kv_head = (size_t)b * T * kvs + (size_t)kvh * HD;
    // query tiles from the diagonal to the row's end, or (varlen) the last key's document's
    const int q_end = DOCS ? p.ends()[(size_t)b * T + imin(k0 + BK, T) - 1] : T;
    const int first = k0 / BQ, per_head = (q_end - 1) / BQ + 1 - first;
    const int n_steps = group * per_head;
    const key_docs docs = key_docs_of<DOCS>(p.ends(), b, T, k_lo, g, k_lo, k_lo + 15);

    load_rows<HD, BK, G::THREADS>(sK, p.k + kv_head, kvs, k0, T);
    load_rows<HD, BK, G::THREADS>(sV, p.v + kv_head, kvs, k0, T);
    load_dkv_step<HD, NW>(p, steps, b, kvh * group, first);
    cp_async_commit();

    float dk[HD / 8][4], dv[HD / 8][4];
    zero_acc(dk);
    zero_acc(dv);
    for (int s = 0; s < n_steps; s++) {
        const int buf = s & 1;
        if (s + 1 < n_steps) {
            load_dkv_step<HD, NW>(p, steps + (buf ^ 1) * (uint32_t)G::dkv_step, b,
                                  kvh * group + (s + 1) / per_head, first + (s + 1) % per_head);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const int q0 = (first + s % per_head) * BQ;
        // else every query of the tile is before the warp's keys, or (varlen) past their documents
        if (q0 + BQ - 1 >= k_lo && (!DOCS || q0 < docs.hi)) {
            const uint32_t sQ = steps + buf * (uint32_t)G::dkv_step, sdO = sQ + BQ * RB;
            const float *lse2 = reinterpret_cast<const float *>(smem + (sQ - sK) + 2 * BQ * RB);
            const float *delta = lse2 + BQ;
            float st[BQ / 8][4]; // S^T, then P^T, then dS^T: rows are keys, columns queries
            zero_acc(st);
            mma_rows_rows<BQ, HD, RB>(st, sK + warp * 16 * RB + a_offset(lane, RB),
                                      sQ + b_rows_offset(lane, RB));
            const bool masked = q0 < k_lo + 15 || q0 + BQ > T || (DOCS && q0 + BQ > docs.lo);
#pragma unroll
            for (int jn = 0; jn < BQ / 8; jn++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int key = k_lo + g + 8 * (e / 2), col = jn * 8 + 2 * t4 + e % 2;
                    float pr = exp2f(st[jn][e] * p.scale_log2 - lse2[col]);
                    if (masked && (q0 + col < key || q0 + col >= T)) pr = 0.0f;
                    if (DOCS && masked && q0 + col >= docs.end[e / 2]) pr = 0.0f; // other document
                    st[jn][e] = pr;
                }
            mma_acc_cols<HD, BQ, RB>(dv, st, sdO + b_cols_offset(lane, RB));
            float dpt[BQ / 8][4];
            zero_acc(dpt);
            mma_rows_rows<BQ, HD, RB>(dpt, sV + warp * 16 * RB + a_offset(lane, RB),
                                      sdO + b_rows_offset(lane, RB));
#pragma unroll
            for (int jn = 0; jn < BQ / 8; jn++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    st[jn][e] *= dpt[jn][e] - delta[jn * 8 + 2 * t4 + e % 2];
            mma_acc_cols<HD, BQ, RB>(dk, st, sQ + b_cols_offset(lane, RB));
        }
        __syncthreads(); // the next prefetch overwrites this step's buffer
    }

    // Each warp's K and V rows were read by that warp alone: stage its results there.
    const float dk_scale[2] = {p.scale, p.scale}, one[2] = {1.0f, 1.0f};
    store_rows<HD>(dk, dk_scale, smem + warp * 16 * RB, p.dk + kv_head, kvs, k_lo, T);
    store_rows<HD>(dv, one, smem + (BK + warp * 16) * RB, p.dv + kv_head, kvs, k_lo, T);
}

template <int HD, int NW, bool DOCS>
__global__ void __launch_bounds__(NW * 32) attention_dq_kernel(const bwd_args<DOCS> p) {
    typedef tiles<HD, NW> G;
    constexpr int RB = G::RB, BM = G::ROWS, BN = G::DQ_KEYS;
    unsigned char *smem = dynamic_smem();
    const uint32_t sQ = smem_u32(smem), sdO = sQ + BM * RB, sK = sdO + BM * RB,
                   sV = sK + 2 * BN * RB;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
    const int h = blockIdx.x, b = blockIdx.y, m = gridDim.z - 1 - blockIdx.z;
    const int kvh = h / (p.Hq / p.Hkv), T = p.T;
    const int q0 = m * BM, row_lo = q0 + warp * 16;
    const size_t qs = (size_t)p.Hq * HD, kvs = (size_t)p.Hkv * HD;
    const size_t q_head = (size_t)b * T * qs + (size_t)h * HD;
    const bf16 *kh = p.k + (size_t)b * T * kvs + (size_t)kvh * HD;
    const bf16 *vh = p.v + (size_t)b * T * kvs + (size_t)kvh * HD;
    const int n_tiles = (imin(T, q0 + BM) - 1) / BN + 1;
    const query_docs docs =
        query_docs_of<DOCS>(p.starts(), b, T, row_lo, g, row_lo, row_lo + 15);
    const int j0 = DOCS ? p.starts()[(size_t)b * T + q0] / BN : 0; // the block's first key tile

    const size_t stats = ((size_t)b * p.Hq + h) * p.Tp; // rows < Tp: padded
    float lse2[2], delta[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        lse2[r] = p.lse2[stats + row_lo + g + 8 * r];
        delta[r] = p.delta[stats + row_lo + g + 8 * r];
    }

    load_rows<HD, BM, G::THREADS>(sQ, p.q + q_head, qs, q0, T);
    load_rows<HD, BM, G::THREADS>(sdO, p.dout + q_head, qs, q0, T);
    cp_async_commit();
    load_rows<HD, BN, G::THREADS>(sK + (j0 & 1) * BN * RB, kh, kvs, j0 * BN, T);
    load_rows<HD, BN, G::THREADS>(sV + (j0 & 1) * BN * RB, vh, kvs, j0 * BN, T);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    uint32_t qf[HD / 16][4], dof[HD / 16][4];
    load_a<HD, RB>(qf, sQ + warp * 16 * RB + a_offset(lane, RB));
    load_a<HD, RB>(dof, sdO + warp * 16 * RB + a_offset(lane, RB));

    float dq[HD / 8][4];
    zero_acc(dq);
    for (int j = j0; j < n_tiles; j++) {
        const int buf = j & 1;
        next_kv_tile<HD, BN, G::THREADS>(sK, sV, kh, vh, kvs, j, n_tiles, T);
        if (j * BN <= row_lo + 15 && (!DOCS || j * BN + BN - 1 >= docs.lo)) {
            const uint32_t kt = sK + buf * BN * RB, vt = sV + buf * BN * RB;
            float s[BN / 8][4], dp[BN / 8][4];
            zero_acc(s);
            zero_acc(dp);
            mma_regs_rows<BN, HD, RB>(s, qf, kt + b_rows_offset(lane, RB));
            mma_regs_rows<BN, HD, RB>(dp, dof, vt + b_rows_offset(lane, RB));
            const bool masked = j * BN + BN - 1 > row_lo || (DOCS && j * BN < docs.hi);
#pragma unroll
            for (int jn = 0; jn < BN / 8; jn++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int r = e / 2, row = row_lo + g + 8 * r;
                    float pr = exp2f(s[jn][e] * p.scale_log2 - lse2[r]);
                    if (masked && j * BN + jn * 8 + 2 * t4 + e % 2 > row) pr = 0.0f;
                    if (DOCS && masked && j * BN + jn * 8 + 2 * t4 + e % 2 < docs.first[r])
                        pr = 0.0f; // another document
                    s[jn][e] = pr * (dp[jn][e] - delta[r]); // dS
                }
            mma_acc_cols<HD, BN, RB>(dq, s, kt + b_cols_offset(lane, RB));
        }
        __syncthreads();
    }
    const float dq_scale[2] = {p.scale, p.scale};
    store_rows<HD>(dq, dq_scale, smem + warp * 16 * RB, p.dq + q_head, qs, row_lo, T);
}

// ---- host side ----

// Fails c (and returns -1) unless these kernels take the shapes and buffers.
static int check_args(kctx *c, const char *op, const void *const *bufs, int n_bufs, int B,
                      int T, int Hq, int Hkv, int hd) {
    if (B < 0 || T < 0) {
        k_fail(c, "%s: bad shape B=%d T=%d", op, B, T);
        return -1;
    }
    if (Hkv <= 0 || Hq <= 0 || Hq % Hkv != 0) {
        k_fail(c, "%s: %d query heads are not a multiple of %d key/value heads", op, Hq, Hkv);
        return -1;
    }
    if (hd != 64 && hd != 128 && !cuda_attention_generic_supports(hd)) {
        k_fail(c, "CUDA %s: head dim %d is not supported (even, at most 256)", op, hd);
        return -1;
    }
    if (B > 65535 || (T + 15) / 16 > 65535) {
        k_fail(c, "CUDA %s: B=%d T=%d is past the grid's limits", op, B, T);
        return -1;
    }
    for (int i = 0; i < n_bufs; i++)
        if (!cuda_aligned(bufs[i], 16)) {
            k_fail(c, "CUDA %s: buffers must be 16-byte aligned", op);
            return -1;
        }
    return 0;
}

// Lets `kernel` have `bytes` of dynamic shared memory; fails c when the device has less.
template <typename Kernel> static int allow_smem(kctx *c, Kernel kernel, size_t bytes) {
    if (bytes > (size_t)cuda_state(c)->smem_optin) {
        k_fail(c, "CUDA attention: a block needs %zu bytes of shared memory, the device gives %d",
               bytes, cuda_state(c)->smem_optin);
        return -1;
    }
    return cuda_check_call(c,
                           cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                (int)bytes),
                           "attention: cudaFuncSetAttribute");
}

template <int HD, int NW, bool DOCS> static void launch_fwd(kctx *c, const fwd_args<DOCS> &p) {
    typedef tiles<HD, NW> G;
    if (allow_smem(c, attention_fwd_kernel<HD, NW, DOCS>, G::fwd_smem)) return;
    dim3 grid(p.Hq, p.B, (p.T + G::ROWS - 1) / G::ROWS);
    attention_fwd_kernel<HD, NW, DOCS><<<grid, G::THREADS, G::fwd_smem, cuda_stream(c)>>>(p);
    cuda_check_launch(c, "attention forward");
}

// The backward's first kernel (both paths): delta and lse2 into scratch.
template <int HD> static void launch_delta(kctx *c, const bwd_params &p) {
    constexpr int ROWS = 256 / (HD / 8); // delta rows per block; divides Tp
    unsigned delta_blocks = (unsigned)((size_t)p.B * p.Hq * p.Tp / ROWS);
    attention_delta_kernel<HD><<<delta_blocks, 256, 0, cuda_stream(c)>>>(p);
    cuda_check_launch(c, "attention backward (delta)");
}

template <int HD, int NW, bool DOCS> static void launch_bwd(kctx *c, const bwd_args<DOCS> &p) {
    typedef tiles<HD, NW> G;
    if (allow_smem(c, attention_dkdv_kernel<HD, NW, DOCS>, G::dkv_smem) ||
        allow_smem(c, attention_dq_kernel<HD, NW, DOCS>, G::dq_smem))
        return;
    launch_delta<HD>(c, p); // the delta kernel takes no documents
    dim3 kv_grid(p.Hkv, p.B, (p.T + G::ROWS - 1) / G::ROWS);
    attention_dkdv_kernel<HD, NW, DOCS><<<kv_grid, G::THREADS, G::dkv_smem, cuda_stream(c)>>>(p);
    cuda_check_launch(c, "attention backward (dK, dV)");
    dim3 q_grid(p.Hq, p.B, (p.T + G::ROWS - 1) / G::ROWS);
    attention_dq_kernel<HD, NW, DOCS><<<q_grid, G::THREADS, G::dq_smem, cuda_stream(c)>>>(p);
    cuda_check_launch(c, "attention backward (dQ)");
}

// 8 warps a block where that block's shared memory fits the device, else 4.
template <int HD, bool DOCS> static void attention_fwd(kctx *c, const fwd_args<DOCS> &p) {
    if (tiles<HD, 8>::fwd_smem <= (size_t)cuda_state(c)->smem_optin)
        launch_fwd<HD, 8, DOCS>(c, p);
    else
        launch_fwd<HD, 4, DOCS>(c, p);
}

template <int HD, bool DOCS> static void attention_bwd(kctx *c, const bwd_args<DOCS> &p) {
    if (tiles<HD, 8>::bwd_smem <= (size_t)cuda_state(c)->smem_optin)
        launch_bwd<HD, 8, DOCS>(c, p);
    else
        launch_bwd<HD, 4, DOCS>(c, p);
}

// The kernels for head dim HD, with the varlen masking only when there are docs.
template <int HD>
static void attention_fwd_hd(kctx *c, const fwd_params &p, const k_docs *docs) {
    if (docs)
        attention_fwd<HD, true>(c, fwd_args<true>{p, docs->start});
    else
        attention_fwd<HD, false>(c, fwd_args<false>{p});
}

template <int HD>
static void attention_bwd_hd(kctx *c, const bwd_params &p, const k_docs *docs) {
    if (docs)
        attention_bwd<HD, true>(c, bwd_args<true>{p, docs->start, docs->end});
    else
        attention_bwd<HD, false>(c, bwd_args<false>{p});
}

// The bounds of window_bounds (see the top of this file) for n = B * T tokens, THREADS a
// block (one parameter struct and a templated launch on one line: what the emulation build
// rewrites, tests/gpu/Makefile).
struct window_args {
    int32_t *start, *end;
    const int32_t *doc_start, *doc_end; // NULL: one document a row
    int T, window;
    size_t n;
};

template <int THREADS> __global__ void window_bounds_kernel(const window_args a) {
    for (size_t i = (size_t)blockIdx.x * THREADS + threadIdx.x; i < a.n;
         i += (size_t)gridDim.x * THREADS) {
        int t = (int)(i % a.T);
        int first = a.doc_start ? a.doc_start[i] : 0, stop = a.doc_end ? a.doc_end[i] : a.T;
        a.start[i] = t - a.window + 1 > first ? t - a.window + 1 : first;
        a.end[i] = t + a.window < stop ? t + a.window : stop;
    }
}

// The bounds the tensor-core kernels run a window as, in bounds (2 * B * T int32 of device
// memory); docs unchanged when there is no window or it is no shorter than the row.
static const k_docs *window_bounds(kctx *c, const k_docs *docs, int window, int B, int T,
                                   int32_t *bounds, k_docs *out) {
    if (window <= 0 || window >= T) return docs;
    const size_t n = (size_t)B * T;
    const window_args a = {bounds, bounds + n, docs ? docs->start : NULL, docs ? docs->end : NULL,
                           T, window, n};
    window_bounds_kernel<256><<<cuda_blocks(n, 256), 256, 0, cuda_stream(c)>>>(a);
    cuda_check_launch(c, "attention (sliding window bounds)");
    *out = k_docs{bounds, bounds + n};
    return out;
}

static int check_window(kctx *c, const char *op, int window) {
    if (window >= 0) return 0;
    k_fail(c, "%s: sliding window %d is negative", op, window);
    return -1;
}

extern "C" void cuda_attention_fwd(kctx *c, void *out, float *lse, const void *q, const void *k,
                                   const void *v, const k_docs *docs, int window, int B, int T,
                                   int Hq, int Hkv, int hd) {
    const void *bufs[] = {out, lse, q, k, v};
    if (check_args(c, "attention", bufs, 5, B, T, Hq, Hkv, hd) ||
        check_window(c, "attention", window) || B == 0 || T == 0)
        return;
    if (hd != 64 && hd != 128) {
        cuda_attention_generic_fwd(c, out, lse, q, k, v, docs, window, B, T, Hq, Hkv, hd);
        return;
    }
    k_docs banded;
    int32_t *bounds = NULL;
    if (window > 0 && window < T &&
        !(bounds = (int32_t *)cuda_scratch(c, 2 * (size_t)B * T * sizeof(int32_t), "attention")))
        return;
    docs = window_bounds(c, docs, window, B, T, bounds, &banded);
    if (cuda_state(c)->attention_sm90) {
        cuda_attention_sm90_fwd(c, out, lse, q, k, v, docs, 0, B, T, Hq, Hkv, hd);
        return;
    }
    fwd_params p = {(bf16 *)out, lse, (const bf16 *)q, (const bf16 *)k, (const bf16 *)v,
                    B, T, Hq, Hkv, LOG2E / sqrtf((float)hd)};
    if (hd == 64)
        attention_fwd_hd<64>(c, p, docs);
    else
        attention_fwd_hd<128>(c, p, docs);
}

extern "C" void cuda_attention_bwd(kctx *c, void *dq, void *dk, void *dv, const void *dout,
                                   const void *q, const void *k, const void *v, const void *out,
                                   const float *lse, const k_docs *docs, int window, int B,
                                   int T, int Hq, int Hkv, int hd) {
    const void *bufs[] = {dq, dk, dv, dout, q, k, v, out, lse};
    if (check_args(c, "attention backward", bufs, 9, B, T, Hq, Hkv, hd) ||
        check_window(c, "attention backward", window) || B == 0 || T == 0)
        return;
    if (hd != 64 && hd != 128) {
        cuda_attention_generic_bwd(c, dq, dk, dv, dout, q, k, v, out, lse, docs, window, B, T,
                                   Hq, Hkv, hd);
        return;
    }
    const int Tp = (T + STATS_PAD - 1) / STATS_PAD * STATS_PAD;
    const size_t rows = (size_t)B * Hq * Tp, tokens = (size_t)B * T;
    // delta and lse2, the sm_90a kernel's dQ accumulators, then the window's bounds (one
    // scratch buffer: a second request could move the first)
    const int sm90 = cuda_state(c)->attention_sm90;
    const size_t accum = sm90 ? cuda_attention_sm90_bwd_scratch(B, Tp, Hq, Hkv, hd) : 0;
    float *scratch = (float *)cuda_scratch(c, 2 * rows * sizeof(float) + accum +
                                                  2 * tokens * sizeof(int32_t),
                                           "attention backward");
    if (!scratch) return;
    k_docs banded;
    docs = window_bounds(c, docs, window, B, T, (int32_t *)((char *)(scratch + 2 * rows) + accum),
                         &banded);
    const float scale = 1.0f / sqrtf((float)hd);
    bwd_params p = {(bf16 *)dq, (bf16 *)dk, (bf16 *)dv, scratch, scratch + rows,
                    (const bf16 *)dout, (const bf16 *)q, (const bf16 *)k, (const bf16 *)v,
                    (const bf16 *)out, lse, B, T, Hq, Hkv, Tp, scale, scale * LOG2E};
    if (sm90) {
        hd == 64 ? launch_delta<64>(c, p) : launch_delta<128>(c, p);
        cuda_attention_sm90_bwd(c, dq, dk, dv, dout, q, k, v, p.lse2, p.delta, Tp,
                                scratch + 2 * rows, docs, 0, B, T, Hq, Hkv, hd);
        return;
    }
    if (hd == 64)
        attention_bwd_hd<64>(c, p, docs);
    else
        attention_bwd_hd<128>(c, p, docs);
}
