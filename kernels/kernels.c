/* kernels: the backend-neutral part of kernels.h.
 *
 * Context set-up, the sticky failure record, the host helpers that are the same for every
 * backend, and dispatch: one k_ops table per backend, generated from kernels_ops.h
 * (`.name = cpu_<name>`, `.name = cuda_<name>`), and the k_<name> functions that forward to
 * the table of the context's backend (generated for K_OP rows, written here for
 * K_OP_BY_HAND ones).  Adding a backend means writing its <prefix>_<name> functions, one
 * table here and its case in kctx_init. */
#include "kernels/kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_kernels.h"
#ifdef FSDP_HAVE_CUDA
#include "kernels/cuda/cuda_kernels.h"
#endif

/* One function pointer per op of kernels_ops.h, plus the two a backend may leave NULL. */
typedef struct k_ops {
    void (*sync)(kctx *c);    /* NULL: the backend runs every op synchronously */
    void (*destroy)(kctx *c); /* NULL: no backend state */
#define K_OP(name, params, args) void (*name) params;
#define K_OP_BY_HAND(ret, name, params) ret (*name) params;
#include "kernels/kernels_ops.h"
} k_ops;

static const k_ops cpu_ops = {
    .sync = cpu_sync,
    .destroy = cpu_destroy,
#define K_OP(name, params, args) .name = cpu_##name,
#define K_OP_BY_HAND(ret, name, params) .name = cpu_##name,
#include "kernels/kernels_ops.h"
};

#ifdef FSDP_HAVE_CUDA
static const k_ops cuda_ops = {
    .sync = cuda_sync,
    .destroy = cuda_destroy,
#define K_OP(name, params, args) .name = cuda_##name,
#define K_OP_BY_HAND(ret, name, params) .name = cuda_##name,
#include "kernels/kernels_ops.h"
};
#endif

/* The table of a context's backend.  kctx_init only accepts backends that have one, and a
 * zeroed kctx is a CPU context, so this never fails for a context in use. */
static const k_ops *ops(const kctx *c) {
#ifdef FSDP_HAVE_CUDA
    if (c->backend == K_CUDA) return &cuda_ops;
#else
    (void)c;
#endif
    return &cpu_ops;
}

/* ---- context and failures ---- */

int k_cuda_available(void) {
#ifdef FSDP_HAVE_CUDA
    return cuda_device_count();
#else
    return 0;
#endif
}

size_t k_cuda_device_memory(int device) {
#ifdef FSDP_HAVE_CUDA
    return cuda_device_memory(device);
#else
    (void)device;
    return 0;
#endif
}

int kctx_init(kctx *c, k_backend backend, int device, errbuf *err) {
    memset(c, 0, sizeof *c);
    c->device = device;
    switch (backend) {
    case K_CPU:
        c->backend = K_CPU;
        c->compute = K_F32;
        return 0;
    case K_CUDA:
#ifdef FSDP_HAVE_CUDA
        /* stream, cuBLASLt handle and workspace, error report; bf16 compute */
        c->backend = K_CUDA;
        c->compute = K_BF16;
        if (cuda_init(c, device, err)) {
            memset(c, 0, sizeof *c);
            return -1;
        }
        return 0;
#else
        return errf(err, "CUDA backend: this build has no CUDA (nvcc was not found at build time)");
#endif
    }
    return errf(err, "kernels: unknown backend %d", (int)backend);
}

void kctx_destroy(kctx *c) {
    if (ops(c)->destroy) ops(c)->destroy(c);
    free(c->blocks);
    memset(c, 0, sizeof *c);
}

int k_sync(kctx *c, errbuf *err) {
    if (ops(c)->sync) ops(c)->sync(c);
    return k_check(c, err);
}

int k_cpu_defer_copies(kctx *c, errbuf *err) {
    if (c->backend != K_CPU) return errf(err, "k_cpu_defer_copies: only the CPU backend defers copies");
    return cpu_defer_copies(c, err);
}

/* ---- host helpers (the same for every backend) ---- */

/* Llama 3 scaling as transformers' _compute_llama3_parameters: wavelengths longer than
 * original/low_freq_factor are slowed down by factor, those shorter than
 * original/high_freq_factor are kept, and those in between are interpolated. */
static double llama3_scaled(const k_rope_params *p, double inv_freq) {
    double orig = p->original_max_position_embeddings;
    double low_freq_wavelen = orig / p->low_freq_factor;
    double high_freq_wavelen = orig / p->high_freq_factor;
    double wavelen = 2.0 * M_PI / inv_freq;
    if (wavelen > low_freq_wavelen) return inv_freq / p->factor;
    if (wavelen < high_freq_wavelen) return inv_freq;
    double smooth = (orig / wavelen - p->low_freq_factor) / (p->high_freq_factor - p->low_freq_factor);
    return (1.0 - smooth) * inv_freq / p->factor + smooth * inv_freq;
}

/* yarn's find_correction_dim: the dimension that turns num_rotations times over the
 * original context. */
static double yarn_correction_dim(double rotations, int dim, double base, double orig) {
    return dim * log(orig / (rotations * 2 * M_PI)) / (2 * log(base));
}

/* YaRN as transformers' _compute_yarn_parameters: frequency i blends the interpolated
 * inv_freq / factor and the original by a linear ramp over the correction range of
 * beta_fast .. beta_slow rotations. */
static void yarn_inv_freq(const k_rope_params *p, int dim, float *out) {
    double orig = p->original_max_position_embeddings;
    double low = yarn_correction_dim(p->beta_fast, dim, p->theta, orig);
    double high = yarn_correction_dim(p->beta_slow, dim, p->theta, orig);
    if (p->truncate) {
        low = floor(low);
        high = ceil(high);
    }
    low = low > 0 ? low : 0;
    high = high < dim - 1 ? high : dim - 1;
    if (low == high) high += 0.001; /* as transformers: no division by zero */
    for (int i = 0; i < dim / 2; i++) {
        double extrapolation = 1.0 / pow(p->theta, 2.0 * i / dim);
        double ramp = (i - low) / (high - low);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        double keep = 1.0 - ramp; /* the extrapolation factor */
        out[i] = (float)(extrapolation / p->factor * (1.0 - keep) + extrapolation * keep);
    }
}

void k_rope_inv_freq(const k_rope_params *p, int head_dim, float *host_inv_freq) {
    if (p->kind == K_ROPE_YARN) {
        yarn_inv_freq(p, head_dim, host_inv_freq);
        return;
    }
    for (int i = 0; i < head_dim / 2; i++) {
        double inv_freq = 1.0 / pow(p->theta, 2.0 * i / head_dim);
        if (p->kind == K_ROPE_LLAMA3) inv_freq = llama3_scaled(p, inv_freq);
        if (p->kind == K_ROPE_LINEAR) inv_freq /= p->factor;
        host_inv_freq[i] = (float)inv_freq;
    }
}

int64_t k_shift_labels(const int32_t *labels, int32_t *targets, int B, int T) {
    int64_t count = 0;
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            int32_t label = t + 1 < T ? labels[(size_t)b * T + t + 1] : K_IGNORE_INDEX;
            targets[(size_t)b * T + t] = label;
            if (label != K_IGNORE_INDEX) count++;
        }
    }
    return count;
}

/* ---- dispatch: the K_OP_BY_HAND ops (context memory, and the count of it) ---- */

struct k_block {
    void *p;
    size_t bytes;
};

/* Remembers block p of `bytes` (a job makes a few dozen, long-lived: a list will do). */
static int remember_block(kctx *c, void *p, size_t bytes) {
    if (c->n_blocks == c->cap_blocks) {
        int cap = c->cap_blocks ? 2 * c->cap_blocks : 32;
        k_block *grown = realloc(c->blocks, (size_t)cap * sizeof *grown);
        if (!grown) return -1;
        c->blocks = grown;
        c->cap_blocks = cap;
    }
    c->blocks[c->n_blocks++] = (k_block){p, bytes};
    c->bytes_in_use += bytes;
    if (c->bytes_in_use > c->peak_bytes) c->peak_bytes = c->bytes_in_use;
    return 0;
}

static void forget_block(kctx *c, void *p) {
    for (int i = c->n_blocks - 1; i >= 0; i--)
        if (c->blocks[i].p == p) {
            c->bytes_in_use -= c->blocks[i].bytes;
            c->blocks[i] = c->blocks[--c->n_blocks];
            return;
        }
}

void k_set_memory_limit(kctx *c, size_t bytes) { c->memory_limit = bytes; }

/* Whether `bytes` more would bring the context memory past its limit (no overflow). */
static int passes_limit(const kctx *c, size_t bytes) {
    return c->memory_limit &&
           (c->bytes_in_use > c->memory_limit || bytes > c->memory_limit - c->bytes_in_use);
}

void *k_alloc(kctx *c, size_t bytes, errbuf *err) {
    if (passes_limit(c, bytes)) {
        errf(err, "runtime.gpu_memory_limit: allocating %zu bytes with %zu in use would pass "
                  "the limit of %zu bytes", bytes, c->bytes_in_use, c->memory_limit);
        return NULL;
    }
    void *p = ops(c)->alloc(c, bytes, err);
    if (p && remember_block(c, p, bytes)) {
        ops(c)->free(c, p);
        errf(err, "out of host memory counting context memory");
        return NULL;
    }
    return p;
}
void k_free(kctx *c, void *p) {
    if (!p) return;
    forget_block(c, p);
    ops(c)->free(c, p);
}
void *k_host_alloc(kctx *c, size_t bytes, errbuf *err) {
    return ops(c)->host_alloc(c, bytes, err);
}
void k_host_free(kctx *c, void *p) {
    if (p) ops(c)->host_free(c, p);
}

/* The copy lanes are checked here, so the backends index their lanes without. */
static int bad_lane(kctx *c, const char *op, int lane) {
    if (lane >= 0 && lane < K_COPY_LANES) return 0;
    k_fail(c, "%s: copy lane %d (the lanes are 0..%d)", op, lane, K_COPY_LANES - 1);
    return 1;
}

uint64_t k_copy_h2d_start(kctx *c, int lane, void *dst, const void *host_src, size_t bytes) {
    return bad_lane(c, "k_copy_h2d_start", lane) ? 0 : ops(c)->copy_h2d_start(c, lane, dst, host_src, bytes);
}

void k_copy_h2d_wait(kctx *c, int lane, uint64_t upto) {
    if (!bad_lane(c, "k_copy_h2d_wait", lane)) ops(c)->copy_h2d_wait(c, lane, upto);
}
size_t k_bytes_in_use(const kctx *c) { return c->bytes_in_use; }
size_t k_peak_bytes(const kctx *c) { return c->peak_bytes; }

/* ---- dispatch: the K_OP ops, forwarded as they are ---- */

#define K_OP(name, params, args) \
    void k_##name params { ops(c)->name args; }
#define K_OP_BY_HAND(ret, name, params) /* above */
#include "kernels/kernels_ops.h"
