/* kctx: the kernels context, and what every backend needs of it.
 *
 * A kctx carries the backend (CPU reference in fp32, CUDA in bf16) and, for CUDA, the
 * device and stream.  This header is what the backends (kernels/cpu/, kernels/cuda/) build
 * on: the context type, its dtypes and the sticky failure record.  They never include
 * kernels.h (the public API, whose forwarders in kernels.c include the backends' headers), so
 * the modules do not include each other.  Callers include kernels.h, which includes this.
 *
 * Ops return nothing: like CUDA launches they may fail asynchronously, so a failure is
 * recorded in the context (the first one wins) and reported by k_sync()/k_check(). */
#ifndef FSDP_KCTX_H
#define FSDP_KCTX_H

#include <stddef.h>
#include <stdint.h>

#include "base/errbuf.h"
#include "base/fp8.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum k_backend { K_CPU = 0, K_CUDA = 1 } k_backend;
typedef enum k_dtype { K_F32 = 0, K_BF16 = 1 } k_dtype;

#define K_IGNORE_INDEX (-100)

/* k_copy_h2d_start's lanes: in-order copy streams independent of each other (fsdp's streamed
 * parameters, its offloaded activations); K_COPY_ALL: every copy of a lane so far. */
enum { K_COPY_PARAMS = 0, K_COPY_ACTIVATIONS = 1, K_COPY_LANES = 2 };
#define K_COPY_ALL UINT64_MAX

/* FP8 scaling (k_fp8_cast, k_fp8_gemm; base/fp8.h has the formats and the scale): one amax,
 * scale and inverse scale for the whole tensor, or one for each row. */
typedef enum k_fp8_scaling { K_FP8_TENSORWISE = 0, K_FP8_ROWWISE = 1 } k_fp8_scaling;

/* The documents of a packed batch (k_rope, k_attention_fwd, k_attention_bwd): for each token
 * (b, t) of a [B, T] batch, row positions [start, end) of the document holding it, int32 [B*T]
 * in context memory.  Within a row the documents tile 0..T-1: start[t] = t or start[t-1], end
 * likewise, start <= t < end.  A token attends to the keys j of its document with j <= t
 * (start <= j), and its RoPE position is t - start.  The struct itself is host memory; an op
 * given NULL docs treats every row as one document (positions 0..T-1), at the unpacked
 * speed. */
typedef struct k_docs {
    const int32_t *start, *end;
} k_docs;

typedef struct k_block k_block; /* kernels.c's record of one k_alloc block */

typedef struct kctx {
    k_backend backend;
    k_dtype compute;
    int device;      /* CUDA device ordinal */
    void *stream;    /* cudaStream_t for CUDA */
    void *impl;      /* backend state (cuBLASLt handle, workspace, ...) */
    int failed;      /* sticky: the first failure since the last k_check */
    char failure[512];
    /* What k_alloc handed out and k_free did not take back (the backend's own workspace
     * not counted), and the most at any time; read them with k_bytes_in_use/k_peak_bytes. */
    size_t bytes_in_use, peak_bytes;
    size_t memory_limit; /* k_set_memory_limit: k_alloc refuses to pass it; 0: none */
    k_block *blocks; /* each live block and its size */
    int n_blocks, cap_blocks;
} kctx;

size_t k_compute_size(const kctx *c); /* bytes per element of the compute dtype */

/* Records a failure in c (first wins).  For backends, not for callers. */
void k_fail(kctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Reports and clears the sticky failure: 0 when none. */
int k_check(kctx *c, errbuf *err);

/* The checks both backends make of k_fp8_cast's and k_fp8_gemm's (gemm != 0) enums: a format
 * or scaling that is none of the enum's, or (gemm) e5m2 on both sides, is recorded with k_fail
 * naming op; nonzero then. */
int k_fp8_bad_args(kctx *c, const char *op, fp8_format fa, fp8_format fb, k_fp8_scaling scaling,
                   int gemm);

#ifdef __cplusplus
}
#endif

#endif
