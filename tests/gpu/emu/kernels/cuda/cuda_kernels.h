/* A host emulation of the CUDA subset that kernels/cuda/cuda_attention.cu uses, so that its
 * kernels run (slowly) on a machine without a GPU: see tests/gpu/emulate_attention.cc.  It
 * stands in for the real kernels/cuda/cuda_kernels.h (this folder comes first on the include
 * path) and for the file's "device primitives" section (which the build deletes).
 *
 * A launch runs its blocks one after another; a block's threads are coroutines (ucontext).
 * A thread runs until it waits at a barrier (__syncthreads, __syncwarp, or any warp-wide
 * instruction: shuffles, ldmatrix, mma), then the scheduler resumes the first runnable thread
 * in priority order (thread 0 first, or the last thread first): one warp runs as far as it
 * can before the others, which exposes a missing barrier.  cp.async copies land either when
 * issued or only when a wait requires them.  Out-of-range shared or global accesses, barrier
 * deadlocks, diverged warp instructions and copies left in flight abort with a message. */
#ifndef FSDP_EMU_CUDA_KERNELS_H
#define FSDP_EMU_CUDA_KERNELS_H

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#include <functional>
#include <map>
#include <vector>

extern "C" {
#include "kernels/kctx.h"
}

/* ---- the language ---- */

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};

[[noreturn]] static void emu_die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void emu_die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "emulate_attention: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(2);
}

/* ---- bf16 ---- */

struct bf16 {
    uint16_t bits;
};
typedef bf16 __nv_bfloat16;

static inline uint16_t emu_bf16_bits(float f) { /* round to nearest even */
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static inline float emu_bf16_value(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

template <int VEC> static inline void load_floats(float (&out)[VEC], const bf16 *p) {
    for (int j = 0; j < VEC; j++) out[j] = emu_bf16_value(p[j].bits);
}

/* ---- threads, blocks, the scheduler ---- */

struct emu_barrier {
    int expected, arrived;
    unsigned gen;
};

struct emu_copy {
    uint32_t dst;
    const void *src;
    bool valid;
    int group;
};

struct emu_thread {
    ucontext_t ctx;
    dim3 idx;
    bool done;
    emu_barrier *wait_on;
    unsigned wait_gen;
    unsigned collectives; /* warp-wide instructions so far: picks the slot set */
    int committed;        /* cp.async groups committed */
    std::vector<emu_copy> copies;
};

enum { EMU_MAX_THREADS = 1024, EMU_STACK = 256 << 10 };

/* A warp's exchange slots for one warp-wide instruction; two sets, alternating, so that a
 * lane that has left one instruction cannot overwrite what a slower lane still reads. */
struct emu_warp {
    emu_barrier bar;
    uint32_t slot[2][32][8];
    int kind[2][32];
};

static struct {
    emu_thread threads[EMU_MAX_THREADS];
    char *stacks[EMU_MAX_THREADS];
    int n_threads;
    emu_thread *cur;
    ucontext_t main_ctx;
    emu_barrier block_bar;
    emu_warp warps[EMU_MAX_THREADS / 32];
    dim3 block_idx, grid_dim, block_dim;
    unsigned char *smem;
    size_t smem_bytes;
    std::function<void()> body;
    /* settings */
    bool reverse; /* the last thread runs first */
    bool eager;   /* cp.async lands when issued */
    int smem_optin;
    std::map<const void *, size_t> smem_allowed; /* kernel -> cudaFuncSetAttribute bytes */
    std::vector<std::pair<const char *, size_t>> globals; /* registered device buffers */
    long launches, switches;
} emu;

#define threadIdx (emu.cur->idx)
#define blockIdx (emu.block_idx)
#define gridDim (emu.grid_dim)
#define blockDim (emu.block_dim)

static void emu_wait(emu_barrier *bar) {
    emu_thread *t = emu.cur;
    t->wait_on = bar;
    t->wait_gen = bar->gen;
    if (++bar->arrived == bar->expected) {
        bar->arrived = 0;
        bar->gen++;
    }
    emu.switches++;
    if (swapcontext(&t->ctx, &emu.main_ctx)) emu_die("swapcontext failed");
}

static void __syncthreads() {
    emu_wait(&emu.block_bar);
}

static inline int emu_lane() {
    return (int)(emu.cur->idx.x % 32);
}
static inline emu_warp *emu_my_warp() {
    return &emu.warps[emu.cur->idx.x / 32];
}

static void __syncwarp() {
    emu_wait(&emu_my_warp()->bar);
}

/* A warp-wide instruction: each lane puts its operands in its slot (up to 8 words), waits for
 * the whole warp, and returns the slot set, from which it reads every lane's operands. */
static uint32_t (*emu_exchange(int kind, const uint32_t *words, int n))[8] {
    emu_warp *w = emu_my_warp();
    int set = emu.cur->collectives++ & 1, lane = emu_lane();
    memcpy(w->slot[set][lane], words, (size_t)n * sizeof(uint32_t));
    w->kind[set][lane] = kind;
    emu_wait(&w->bar);
    for (int l = 0; l < 32; l++)
        if (w->kind[set][l] != kind)
            emu_die("block (%u,%u,%u) warp %u: lanes in different warp-wide instructions (%d, %d)",
                    blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x / 32, kind, w->kind[set][l]);
    return w->slot[set];
}

enum { EMU_SHFL = 1, EMU_LDMATRIX, EMU_LDMATRIX_T, EMU_MMA };

static float __shfl_xor_sync(unsigned mask, float v, int lane_mask) {
    if (mask != 0xffffffffu) emu_die("shuffle with a partial mask");
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    uint32_t(*all)[8] = emu_exchange(EMU_SHFL, &u, 1);
    memcpy(&v, &all[emu_lane() ^ lane_mask][0], sizeof v);
    return v;
}

/* ---- shared memory ---- */

static unsigned char *dynamic_smem() {
    return emu.smem;
}

static uint32_t smem_u32(const void *p) {
    const unsigned char *c = (const unsigned char *)p;
    if (c < emu.smem || c > emu.smem + emu.smem_bytes) emu_die("smem_u32 of a non-shared pointer");
    return (uint32_t)(c - emu.smem);
}

static unsigned char *emu_smem_at(uint32_t addr, size_t bytes, size_t align, const char *what) {
    if ((size_t)addr + bytes > emu.smem_bytes)
        emu_die("%s: shared address %u + %zu past the block's %zu bytes", what, addr, bytes,
                emu.smem_bytes);
    if (addr % align) emu_die("%s: shared address %u not %zu-byte aligned", what, addr, align);
    return emu.smem + addr;
}

static uint16_t emu_smem_b16(uint32_t addr) {
    uint16_t v;
    memcpy(&v, emu_smem_at(addr, 2, 2, "ldmatrix"), 2);
    return v;
}

/* lane l receives row l/4, columns 2(l%4), 2(l%4)+1 of matrix i; lanes 8i.. give its rows */
static void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
    uint32_t(*all)[8] = emu_exchange(EMU_LDMATRIX, &addr, 1);
    int l = emu_lane();
    for (int i = 0; i < 4; i++) {
        uint32_t row = all[i * 8 + l / 4][0];
        emu_smem_at(row, 16, 16, "ldmatrix row");
        r[i] = emu_smem_b16(row + (l % 4) * 4) | (uint32_t)emu_smem_b16(row + (l % 4) * 4 + 2) << 16;
    }
}

/* transposed: lane l receives column l/4, rows 2(l%4) and 2(l%4)+1 */
static void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
    uint32_t(*all)[8] = emu_exchange(EMU_LDMATRIX_T, &addr, 1);
    int l = emu_lane();
    for (int i = 0; i < 4; i++) {
        uint32_t row0 = all[i * 8 + (l % 4) * 2][0], row1 = all[i * 8 + (l % 4) * 2 + 1][0];
        emu_smem_at(row0, 16, 16, "ldmatrix row");
        emu_smem_at(row1, 16, 16, "ldmatrix row");
        r[i] = emu_smem_b16(row0 + (l / 4) * 2) | (uint32_t)emu_smem_b16(row1 + (l / 4) * 2) << 16;
    }
}

static inline float emu_half(uint32_t word, int k) {
    return emu_bf16_value((uint16_t)(word >> (16 * (k % 2))));
}

/* m16n8k16, A row-major: a[0] rows 0-7 cols 0-7, a[1] rows 8-15 cols 0-7, a[2] rows 0-7
 * cols 8-15, a[3] rows 8-15 cols 8-15, lane l holding row l/4, cols 2(l%4), +1 of each.
 * B column-major: b0 rows (k) 0-7, b1 rows 8-15, lane l holding col l/4, rows 2(l%4), +1.
 * C: c[0..1] row l/4, c[2..3] row l/4 + 8, columns 2(l%4), +1. */
static void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    uint32_t mine[6] = {a[0], a[1], a[2], a[3], b0, b1};
    uint32_t(*all)[8] = emu_exchange(EMU_MMA, mine, 6);
    int l = emu_lane();
    for (int i = 0; i < 4; i++) {
        int row = l / 4 + 8 * (i / 2), col = 2 * (l % 4) + i % 2;
        float acc = 0.0f;
        for (int k = 0; k < 16; k++) {
            float x = emu_half(all[(row % 8) * 4 + (k % 8) / 2][(row >= 8) + 2 * (k >= 8)], k);
            float y = emu_half(all[col * 4 + (k % 8) / 2][4 + (k >= 8)], k);
            acc += x * y;
        }
        d[i] += acc;
    }
}

static uint32_t pack_bf16(float lo, float hi) {
    return emu_bf16_bits(lo) | (uint32_t)emu_bf16_bits(hi) << 16;
}

/* ---- global memory and cp.async ---- */

static void emu_check_global(const void *p, size_t bytes, const char *what) {
    const char *c = (const char *)p;
    for (auto &g : emu.globals)
        if (c >= g.first && c + bytes <= g.first + g.second) return;
    emu_die("%s: %zu bytes at %p are in no device buffer", what, bytes, p);
}

static void emu_land(const emu_copy &cp) {
    unsigned char *dst = emu_smem_at(cp.dst, 16, 16, "cp.async");
    if (cp.valid)
        memcpy(dst, cp.src, 16);
    else
        memset(dst, 0, 16);
}

static void cp_async_16(uint32_t dst, const void *src, bool valid) {
    emu_smem_at(dst, 16, 16, "cp.async");
    if (valid) emu_check_global(src, 16, "cp.async source");
    if ((uintptr_t)src % 16) emu_die("cp.async source %p not 16-byte aligned", src);
    emu_copy cp = {dst, src, valid, emu.cur->committed};
    if (emu.eager)
        emu_land(cp);
    else
        emu.cur->copies.push_back(cp);
}

static void cp_async_commit() {
    emu.cur->committed++;
}

template <int N> static void cp_async_wait() {
    emu_thread *t = emu.cur;
    std::vector<emu_copy> left;
    for (auto &cp : t->copies)
        if (cp.group < t->committed - N)
            emu_land(cp);
        else
            left.push_back(cp);
    t->copies.swap(left);
}

/* ---- the runtime ---- */

typedef void *cudaStream_t;
typedef int cudaError_t;
enum { cudaSuccess = 0 };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize };

template <typename P>
static cudaError_t cudaFuncSetAttribute(void (*kernel)(P), cudaFuncAttribute, int bytes) {
    emu.smem_allowed[(const void *)kernel] = (size_t)bytes;
    return cudaSuccess;
}

static void emu_entry() {
    emu.body();
    emu_thread *t = emu.cur;
    if (!t->copies.empty())
        emu_die("block (%u,%u,%u) thread %u ended with cp.async copies in flight", blockIdx.x,
                blockIdx.y, blockIdx.z, t->idx.x);
    t->done = true;
    swapcontext(&t->ctx, &emu.main_ctx);
}

static bool emu_runnable(const emu_thread *t) {
    return !t->done && (!t->wait_on || t->wait_on->gen != t->wait_gen);
}

/* A fresh coroutine for thread i of the block (a function of its own: getcontext returns
 * twice). */
static __attribute__((noinline)) void emu_start_thread(int i) {
    emu_thread *t = &emu.threads[i];
    t->idx = dim3((unsigned)i);
    t->done = false;
    t->wait_on = NULL;
    t->collectives = 0;
    t->committed = 0;
    t->copies.clear();
    if (!emu.stacks[i] && !(emu.stacks[i] = (char *)malloc(EMU_STACK))) emu_die("out of memory");
    if (getcontext(&t->ctx)) emu_die("getcontext failed");
    t->ctx.uc_stack.ss_sp = emu.stacks[i];
    t->ctx.uc_stack.ss_size = EMU_STACK;
    t->ctx.uc_link = &emu.main_ctx;
    makecontext(&t->ctx, emu_entry, 0);
}

static void emu_run_block() {
    int n = emu.n_threads;
    emu.block_bar = {n, 0, 0};
    for (int w = 0; w < (n + 31) / 32; w++) emu.warps[w].bar = {32, 0, 0};
    for (int i = 0; i < n; i++) emu_start_thread(i);
    for (;;) {
        emu_thread *next = NULL;
        int left = 0;
        for (int k = 0; k < n; k++) {
            emu_thread *t = &emu.threads[emu.reverse ? n - 1 - k : k];
            left += !t->done;
            if (!next && emu_runnable(t)) next = t;
        }
        if (!next) {
            if (left) emu_die("block (%u,%u,%u): %d threads wait at barriers that never complete",
                              blockIdx.x, blockIdx.y, blockIdx.z, left);
            return;
        }
        next->wait_on = NULL;
        emu.cur = next;
        if (swapcontext(&emu.main_ctx, &next->ctx)) emu_die("swapcontext failed");
    }
}

/* What `kernel<<<grid, threads, smem, stream>>>(params)` becomes in the emulated build. */
template <typename P>
static void emu_launch(void (*kernel)(P), dim3 grid, int threads, size_t smem, cudaStream_t,
                       P params) {
    if (threads <= 0 || threads > EMU_MAX_THREADS || threads % 32)
        emu_die("launch with %d threads a block", threads);
    if (grid.y > 65535 || grid.z > 65535) emu_die("grid (%u,%u,%u) too large", grid.x, grid.y, grid.z);
    if (smem > (size_t)emu.smem_optin) emu_die("launch with %zu bytes of shared memory", smem);
    if (smem > 48 * 1024) {
        auto it = emu.smem_allowed.find((const void *)kernel);
        if (it == emu.smem_allowed.end() || it->second < smem)
            emu_die("launch with %zu bytes of shared memory without cudaFuncSetAttribute", smem);
    }
    const size_t guard = 64;
    emu.smem_bytes = smem;
    emu.grid_dim = grid;
    emu.block_dim = dim3((unsigned)threads);
    emu.n_threads = threads;
    emu.body = [kernel, params] { kernel(params); };
    emu.launches++;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                /* fresh shared memory each block, all ones (NaN as bf16) past a guard */
                emu.smem = (unsigned char *)malloc(smem + guard);
                if (!emu.smem) emu_die("out of memory");
                memset(emu.smem, 0xff, smem + guard);
                emu.block_idx = dim3(x, y, z);
                emu_run_block();
                for (size_t i = smem; i < smem + guard; i++)
                    if (emu.smem[i] != 0xff)
                        emu_die("block (%u,%u,%u) wrote past its shared memory", x, y, z);
                free(emu.smem);
                emu.smem = NULL;
            }
}

/* ---- the backend's shared part (kernels/cuda/cuda_kernels.h, emulated) ---- */

typedef struct cuda_impl {
    cudaStream_t stream;
    int smem_optin;
    int attention_sm90; /* always 0: the emulation is of cuda_attention.cu's mma.sync kernels */
    std::vector<float> scratch;
} cuda_impl;

static inline cuda_impl *cuda_state(const kctx *c) {
    return (cuda_impl *)c->impl;
}
static inline cudaStream_t cuda_stream(const kctx *c) {
    return cuda_state(c)->stream;
}
static inline void cuda_check_launch(kctx *, const char *) {}
static inline int cuda_check_call(kctx *, cudaError_t e, const char *) {
    return e != cudaSuccess;
}
static inline int cuda_aligned(const void *p, size_t bytes) {
    return (uintptr_t)p % bytes == 0;
}
/* As the real header's: blocks for a one-element-per-thread launch, capped. */
static inline unsigned cuda_blocks(size_t count, unsigned threads) {
    size_t b = (count + threads - 1) / threads;
    return (unsigned)(b < (1u << 20) ? (b ? b : 1) : (1u << 20));
}
/* Fresh each call (NaN-filled) and registered as a device buffer in place of the last. */
static void *cuda_scratch(kctx *c, size_t bytes, const char *) {
    cuda_impl *s = cuda_state(c);
    for (size_t i = 0; i < emu.globals.size(); i++)
        if (emu.globals[i].first == (const char *)s->scratch.data())
            emu.globals.erase(emu.globals.begin() + (long)i);
    s->scratch.assign(bytes / sizeof(float) + 1, NAN);
    emu.globals.push_back({(const char *)s->scratch.data(), bytes});
    return s->scratch.data();
}

/* cuda_<name> for every op, as the real header declares them (cuda_attention.cu defines the
 * attention ones; the others are not emulated). */
extern "C" {
#define K_OP(name, params, args) void cuda_##name params;
#define K_OP_BY_HAND(ret, name, params) ret cuda_##name params;
#include "kernels/kernels_ops.h"
}

/* The sm_90a kernels (cuda_attention_sm90.cu: wgmma, TMA) are not emulated; attention_sm90
 * is 0, so these are never called. */
static inline void cuda_attention_sm90_fwd(kctx *, void *, float *, const void *, const void *,
                                           const void *, const k_docs *, int, int, int, int, int,
                                           int) {
    emu_die("the sm_90a attention is not emulated");
}
static inline void cuda_attention_sm90_bwd(kctx *, void *, void *, void *, const void *,
                                           const void *, const void *, const void *, const float *,
                                           const float *, int, void *, const k_docs *, int, int,
                                           int, int, int, int) {
    emu_die("the sm_90a attention is not emulated");
}
static inline size_t cuda_attention_sm90_bwd_scratch(int, int, int, int, int) { return 0; }

/* The plain path for other head dims is CUDA-only (cuda_attention_generic.cu); the emulation
 * covers the tensor-core kernels, so head dims 64 and 128 only. */
static inline int cuda_attention_generic_supports(int) { return 0; }
static inline void cuda_attention_generic_fwd(kctx *, void *, float *, const void *, const void *,
                                              const void *, const k_docs *, int, int, int, int,
                                              int, int) {
    emu_die("generic attention is not emulated");
}
static inline void cuda_attention_generic_bwd(kctx *, void *, void *, void *, const void *,
                                              const void *, const void *, const void *,
                                              const void *, const float *, const k_docs *, int,
                                              int, int, int, int, int) {
    emu_die("generic attention is not emulated");
}

#endif
