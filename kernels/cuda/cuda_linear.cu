// The CUDA backend: linear layers through cuBLASLt (bf16 inputs, fp32 accumulation).
//
// cuBLASLt is column-major; a row-major matrix X[r, c] is the column-major matrix X^T with
// leading dimension c, so every product below is written for the transposes:
//   forward  out[N,O] = in[N,I] W[O,I]^T   is  out^T (O x N) = W^T^T (O x I) . in^T (I x N)
//            (linear_fwd_ld with accumulate: out +=, beta = 1)
//   din      din[N,I] = dout[N,O] W[O,I]   is  din^T (I x N) = W^T (I x O) . dout^T (O x N)
//   dw       dw[O,I] += dout^T[O,N] in[N,I] is  dw^T (I x O) += in^T (I x N) . dout (N x O)
// dw is fp32 (C = D, beta = 1); out and din are bf16.  Each shape's descriptors and the
// heuristic's algorithm are cached in the context (cuda_gemm).
//
// The FP8 GEMM (k_fp8_gemm, F45) is the forward's product, out[M,N] = a[M,K] b[N,K]^T, which
// is cuBLASLt's "TN" layout (A = b transposed, B = a) that its FP8 kernels require, with
// D = scale_A scale_B (A B): A's scale is b's inverse scale, B's is a's.  Tensorwise: one
// fp32 scale each (CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, the default); rowwise: the
// outer-vector mode (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F, cuBLASLt 12.9 and later: an
// M-vector for A and an N-vector for B in cuBLASLt's names, here b's N scales and a's M).
// Fast accumulation stays off (CUBLASLT_MATMUL_DESC_FAST_ACCUM 0: partial sums promoted to
// fp32 by cuBLASLt).
#include <string.h>

#include "kernels/cuda/cuda_kernels.h"

// Largest power of two (up to 256) that divides the address: what cuBLASLt may assume.
static int alignment_of(const void *p) {
    int a = 256;
    while (a > 1 && !cuda_aligned(p, (size_t)a)) a /= 2;
    return a;
}

static void destroy_gemm(cuda_gemm *g) {
    if (g->layout_a) (void)cublasLtMatrixLayoutDestroy(g->layout_a);
    if (g->layout_b) (void)cublasLtMatrixLayoutDestroy(g->layout_b);
    if (g->layout_c) (void)cublasLtMatrixLayoutDestroy(g->layout_c);
    if (g->desc) (void)cublasLtMatmulDescDestroy(g->desc);
    memset(g, 0, sizeof *g);
}

void cuda_gemm_cache_clear(cuda_impl *s) {
    for (int i = 0; i < CUDA_GEMM_CACHE; i++)
        if (s->gemms[i].used) destroy_gemm(&s->gemms[i]);
}

static int lt_failed(kctx *c, const char *what, const char *call, cublasStatus_t st) {
    k_fail(c, "%s: cuBLASLt %s failed: %s", what, call, cublasLtGetStatusString(st));
    return -1;
}

#define LT_CHECK(call, name)                                      \
    do {                                                          \
        cublasStatus_t st_ = (call);                              \
        if (st_ != CUBLAS_STATUS_SUCCESS) {                       \
            destroy_gemm(g);                                      \
            lt_failed(c, what, name, st_);                        \
            return NULL;                                          \
        }                                                         \
    } while (0)

// Builds g for D (m x n) = op(A) op(B) (+ beta D): bf16 A and B, D of out_type.
static cuda_gemm *build_gemm(kctx *c, cuda_gemm *g, const char *what) {
    cuda_impl *s = cuda_state(c);
    cublasOperation_t ta = g->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t tb = g->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    LT_CHECK(cublasLtMatmulDescCreate(&g->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate");
    LT_CHECK(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta),
             "set TRANSA");
    LT_CHECK(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb),
             "set TRANSB");
    // Stored shapes: A is (k x m) when transposed else (m x k); B is (n x k) or (k x n).
    int a_rows = g->trans_a ? g->k : g->m, a_cols = g->trans_a ? g->m : g->k;
    int b_rows = g->trans_b ? g->n : g->k, b_cols = g->trans_b ? g->k : g->n;
    LT_CHECK(cublasLtMatrixLayoutCreate(&g->layout_a, g->type_a, a_rows, a_cols, g->ld_a),
             "MatrixLayoutCreate(A)");
    LT_CHECK(cublasLtMatrixLayoutCreate(&g->layout_b, g->type_b, b_rows, b_cols, g->ld_b),
             "MatrixLayoutCreate(B)");
    if (g->scale_mode >= 0) {
        int32_t mode = g->scale_mode;
        LT_CHECK(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode,
                                                sizeof mode), "set A_SCALE_MODE");
        LT_CHECK(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode,
                                                sizeof mode), "set B_SCALE_MODE");
    }
    LT_CHECK(cublasLtMatrixLayoutCreate(&g->layout_c, g->out_type, g->m, g->n, g->ld_c),
             "MatrixLayoutCreate(C)");

    cublasLtMatmulPreference_t pref;
    LT_CHECK(cublasLtMatmulPreferenceCreate(&pref), "MatmulPreferenceCreate");
    uint32_t align_a = g->align_a, align_b = g->align_b, align_c = g->align_c;
    cublasLtMatmulHeuristicResult_t result;
    int found = 0;
    const struct {
        cublasLtMatmulPreferenceAttributes_t attr;
        const void *value;
        size_t size;
    } prefs[] = {
        {CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &s->workspace_bytes, sizeof s->workspace_bytes},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof align_a},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof align_b},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof align_c},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c, sizeof align_c},
    };
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    for (size_t i = 0; st == CUBLAS_STATUS_SUCCESS && i < sizeof prefs / sizeof prefs[0]; i++)
        st = cublasLtMatmulPreferenceSetAttribute(pref, prefs[i].attr, prefs[i].value, prefs[i].size);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulAlgoGetHeuristic(s->lt, g->desc, g->layout_a, g->layout_b,
                                            g->layout_c, g->layout_c, pref, 1, &result, &found);
    (void)cublasLtMatmulPreferenceDestroy(pref);
    LT_CHECK(st, "AlgoGetHeuristic");
    if (found == 0) {
        destroy_gemm(g);
        k_fail(c, "%s: cuBLASLt has no algorithm for m=%d n=%d k=%d", what, g->m, g->n, g->k);
        return NULL;
    }
    g->algo = result.algo;
    g->used = 1;
    return g;
}

// The cached configuration for this product, built on first use (evicting round-robin).
static cuda_gemm *find_gemm(kctx *c, const cuda_gemm *key, const char *what) {
    cuda_impl *s = cuda_state(c);
    for (int i = 0; i < CUDA_GEMM_CACHE; i++) {
        cuda_gemm *g = &s->gemms[i];
        if (g->used && g->m == key->m && g->n == key->n && g->k == key->k &&
            g->trans_a == key->trans_a && g->trans_b == key->trans_b &&
            g->type_a == key->type_a && g->type_b == key->type_b &&
            g->scale_mode == key->scale_mode && g->out_type == key->out_type &&
            g->align_a == key->align_a && g->align_b == key->align_b &&
            g->align_c == key->align_c && g->ld_a == key->ld_a && g->ld_b == key->ld_b &&
            g->ld_c == key->ld_c)
            return g;
    }
    cuda_gemm *slot = NULL;
    for (int i = 0; i < CUDA_GEMM_CACHE && !slot; i++)
        if (!s->gemms[i].used) slot = &s->gemms[i];
    if (!slot) {
        slot = &s->gemms[s->next_evict];
        s->next_evict = (s->next_evict + 1) % CUDA_GEMM_CACHE;
        destroy_gemm(slot);
    }
    *slot = *key;
    return build_gemm(c, slot, what);
}

// Leading dimensions of a product's operands; 0: packed (A's and B's stored rows, D's m).
typedef struct gemm_lds {
    int a, b, d;
} gemm_lds;

// The cached configuration of D (m x n, column-major) = op(A) op(B) (+ beta D), A and B of
// types ta and tb (fp8 with scale_mode >= 0), leading dimensions ld.
static cuda_gemm *gemm_for(kctx *c, const char *what, const void *d, cudaDataType_t out_type,
                           const void *a, cudaDataType_t ta, int trans_a, const void *b,
                           cudaDataType_t tb, int trans_b, int m, int n, int k, int scale_mode,
                           gemm_lds ld) {
    cuda_gemm key;
    memset(&key, 0, sizeof key);
    key.m = m;
    key.n = n;
    key.k = k;
    key.trans_a = trans_a;
    key.trans_b = trans_b;
    key.type_a = ta;
    key.type_b = tb;
    key.scale_mode = scale_mode;
    key.out_type = out_type;
    key.align_a = alignment_of(a);
    key.align_b = alignment_of(b);
    key.align_c = alignment_of(d);
    key.ld_a = ld.a ? ld.a : trans_a ? k : m;
    key.ld_b = ld.b ? ld.b : trans_b ? n : k;
    key.ld_c = ld.d ? ld.d : m;
    return find_gemm(c, &key, what);
}

static void run_gemm(kctx *c, const char *what, cuda_gemm *g, void *d, const void *a,
                     const void *b, float beta) {
    cuda_impl *s = cuda_state(c);
    float alpha = 1.0f;
    cublasStatus_t st =
        cublasLtMatmul(s->lt, g->desc, &alpha, a, g->layout_a, b, g->layout_b, &beta, d,
                       g->layout_c, d, g->layout_c, &g->algo, s->workspace, s->workspace_bytes,
                       s->stream);
    if (st != CUBLAS_STATUS_SUCCESS) lt_failed(c, what, "Matmul", st);
}

// D (m x n, column-major) = op(A) op(B) + beta D, A and B bf16, leading dimensions ld.
static void matmul(kctx *c, const char *what, void *d, cudaDataType_t out_type, const void *a,
                   int trans_a, const void *b, int trans_b, int m, int n, int k, float beta,
                   gemm_lds ld) {
    cuda_gemm *g = gemm_for(c, what, d, out_type, a, CUDA_R_16BF, trans_a, b, CUDA_R_16BF,
                            trans_b, m, n, k, -1, ld);
    if (g) run_gemm(c, what, g, d, a, b, beta);
}

// out[N,O] = in[N,I] W[O,I]^T (+ out: beta 1, the sum taken in fp32 and rounded once), in's rows
// ld apart.
extern "C" void cuda_linear_fwd_ld(kctx *c, void *out, const void *in, int ld, const void *w, int N,
                                   int I, int O, int accumulate) {
    if (N <= 0 || I <= 0 || O <= 0) return;
    matmul(c, accumulate ? "linear_fwd (+=)" : "linear_fwd", out, CUDA_R_16BF, w, 1, in, 0, O, N, I,
           accumulate ? 1.0f : 0.0f, gemm_lds{0, ld, 0});
}

// dw with beta 0 (accumulate_dw 0): cuBLASLt reads no C, and the same algorithm (beta is no
// part of the cached configuration) gives the sums of beta 1 onto zeros.
extern "C" void cuda_linear_bwd_ld(kctx *c, void *din, float *dw, const void *dout, const void *in,
                                   int ld, const void *w, int N, int I, int O, int accumulate_din,
                                   int accumulate_dw) {
    if (N <= 0 || I <= 0 || O <= 0) return;
    if (din)
        matmul(c, "linear_bwd (din)", din, CUDA_R_16BF, w, 0, dout, 0, I, N, O,
               accumulate_din ? 1.0f : 0.0f, gemm_lds{0, 0, ld});
    if (dw)
        matmul(c, accumulate_dw ? "linear_bwd (dw +=)" : "linear_bwd (dw)", dw, CUDA_R_32F, in, 0, dout, 1,
               I, O, N, accumulate_dw ? 1.0f : 0.0f, gemm_lds{ld, 0, 0});
}

// ---- FP8 (see the top) ----

static cudaDataType_t fp8_type(fp8_format f) {
    return f == FP8_E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
}

// What cuBLASLt's FP8 kernels need that the op's contract cannot promise: 16-byte leading
// dimensions (K bytes of a and b, 2N bytes of out) and 16-byte aligned operands.
static int fp8_gemm_refused(kctx *c, const void *out, const void *a, const void *b, int N, int K) {
    if (K % 16 || N % 8) {
        k_fail(c, "fp8_gemm: cuBLASLt's FP8 GEMM needs K %% 16 == 0 and N %% 8 == 0, not "
               "N=%d K=%d", N, K);
        return 1;
    }
    if (!cuda_aligned(a, 16) || !cuda_aligned(b, 16) || !cuda_aligned(out, 16)) {
        k_fail(c, "fp8_gemm: cuBLASLt's FP8 GEMM needs 16-byte aligned a, b and out");
        return 1;
    }
    return 0;
}

// cuBLASLt's outer-vector scales (the rowwise mode) exist on sm_100 and later only: cuBLASLt
// 13 on an H200 (sm_90) answers AlgoGetHeuristic with CUBLAS_STATUS_INVALID_VALUE.  Refused
// there by name until the sm_90 way (unit scales, fp32 D, one fused pass that multiplies row i
// by sa[i], column j by sb[j] and rounds once to bf16) is built.
static int fp8_outer_vec_scales(kctx *c) {
    int dev, major;
    if (cuda_check_call(c, cudaGetDevice(&dev), "fp8_gemm (cudaGetDevice)") ||
        cuda_check_call(c, cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev),
                        "fp8_gemm (compute capability)"))
        return 0;
    if (major >= 10) return 1;
    k_fail(c, "fp8_gemm: rowwise FP8 scaling needs cuBLASLt's outer-vector scales (sm_100 and "
              "later): not built yet below sm_100 (this device: compute capability %d.x)", major);
    return 0;
}

extern "C" void cuda_fp8_gemm(kctx *c, void *out, const uint8_t *a, const float *a_scale_inv,
                              fp8_format fa, const uint8_t *b, const float *b_scale_inv,
                              fp8_format fb, int M, int N, int K, k_fp8_scaling scaling) {
    if (k_fp8_bad_args(c, "fp8_gemm", fa, fb, scaling, 1) || M <= 0 || N <= 0 || K <= 0 ||
        fp8_gemm_refused(c, out, a, b, N, K))
        return;
    const char *what = "fp8_gemm";
    if (scaling == K_FP8_ROWWISE && !fp8_outer_vec_scales(c)) return;
    if (!cuda_aligned(a_scale_inv, 16) || !cuda_aligned(b_scale_inv, 16)) {
        // cublasLtMatmul answers "not supported" for a scale at a 4-byte boundary (the H200)
        k_fail(c, "fp8_gemm: cuBLASLt's FP8 GEMM needs 16-byte aligned scales");
        return;
    }
    int mode = scaling == K_FP8_ROWWISE ? CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F
                                        : CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
    cuda_gemm *g = gemm_for(c, what, out, CUDA_R_16BF, b, fp8_type(fb), 1, a, fp8_type(fa), 0, N,
                            M, K, mode, gemm_lds{0, 0, 0});
    if (!g) return;
    const void *sa = b_scale_inv, *sb = a_scale_inv; // cuBLASLt's A is b, its B is a
    cublasStatus_t st = cublasLtMatmulDescSetAttribute(
        g->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb,
                                            sizeof sb);
    if (st != CUBLAS_STATUS_SUCCESS) {
        lt_failed(c, what, "set A/B_SCALE_POINTER", st);
        return;
    }
    run_gemm(c, what, g, out, b, a, 0.0f);
}

// ---- biases ----

// out[n, o] += bias[o], added in fp32, one element a thread.
__global__ void bias_fwd_kernel(bf16 *out, const bf16 *bias, int O, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16_rn(__bfloat162float(out[i]) + __bfloat162float(bias[i % O]));
}

extern "C" void cuda_bias_fwd(kctx *c, void *out, const void *bias, int N, int O) {
    if (N <= 0 || O <= 0) return;
    size_t n = (size_t)N * O;
    bias_fwd_kernel<<<cuda_blocks(n, 256), 256, 0, cuda_stream(c)>>>((bf16 *)out,
                                                                      (const bf16 *)bias, O, n);
    cuda_check_launch(c, "bias_fwd");
}

// The column sums of dout in two passes, each in a fixed order (deterministic): pass 1 has
// block (x, y) sum rows y, y + BIAS_PARTS, ... of columns x * 256 .. into partial[y, :];
// pass 2 adds the BIAS_PARTS partials of each column in order onto dbias.
#define BIAS_PARTS 64

__global__ void bias_partial_kernel(float *partial, const bf16 *dout, int N, int O) {
    int o = blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= O) return;
    float acc = 0.0f;
    for (int n = blockIdx.y; n < N; n += BIAS_PARTS) acc += __bfloat162float(dout[(size_t)n * O + o]);
    partial[(size_t)blockIdx.y * O + o] = acc;
}

__global__ void bias_sum_kernel(float *dbias, const float *partial, int O) {
    int o = blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= O) return;
    float acc = 0.0f;
    for (int p = 0; p < BIAS_PARTS; p++) acc += partial[(size_t)p * O + o];
    dbias[o] += acc;
}

extern "C" void cuda_bias_bwd(kctx *c, float *dbias, const void *dout, int N, int O) {
    if (N <= 0 || O <= 0) return;
    float *partial = (float *)cuda_scratch(c, (size_t)BIAS_PARTS * O * sizeof(float), "bias_bwd scratch");
    if (!partial) return;
    unsigned cols = (unsigned)((O + 255) / 256);
    bias_partial_kernel<<<dim3(cols, BIAS_PARTS), 256, 0, cuda_stream(c)>>>(partial, (const bf16 *)dout, N, O);
    cuda_check_launch(c, "bias_bwd");
    bias_sum_kernel<<<cols, 256, 0, cuda_stream(c)>>>(dbias, partial, O);
    cuda_check_launch(c, "bias_bwd (sum)");
}
