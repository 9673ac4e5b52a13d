/* gemm_algos: how far cuBLASLt's first heuristic answer is from the fastest of its first
 * ALGOS answers, at a model's GEMM shapes (the CUDA backend takes the first: cuda_linear.cu).
 * For each product of a decoder layer (forward, input gradient, weight gradient), as
 * cuda_linear.cu lays it out (bf16 A and B, fp32 compute; bf16 D, or fp32 D += for the weight
 * gradients), it asks cuBLASLt for up to ALGOS algorithms with the backend's 32 MiB workspace
 * and times each (3 warm-ups, REPS timed runs, CUDA events, random data), then prints the
 * first's TFLOP/s, the fastest's and which answer that was.
 *
 *   cc -O2 -std=c11 -I/usr/local/cuda/include bench/gemm_algos.c -L/usr/local/cuda/lib64 \
 *      -lcublasLt -lcudart -o gemm_algos && ./gemm_algos [TOKENS HIDDEN INTERMEDIATE]
 *
 * Defaults: Llama-2-7B at 4 x 2048 tokens (8192 4096 11008).  Not part of the product or of
 * `make`: an experiment's tool, run on the device machine. */
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

enum { ALGOS = 16, WARMUP = 3, REPS = 20 };

#define CHECK_CUDA(call)                                                                    \
    do {                                                                                    \
        cudaError_t e_ = (call);                                                            \
        if (e_ != cudaSuccess) {                                                            \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)
#define CHECK_LT(call)                                                                      \
    do {                                                                                    \
        cublasStatus_t s_ = (call);                                                         \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                  \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,                   \
                    cublasLtGetStatusString(s_));                                           \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)

/* Column-major D (m x n) = op(A) op(B) (+ D): cuda_linear.cu's products. */
typedef struct product {
    const char *name;
    int m, n, k, trans_a, trans_b, f32_out; /* f32_out: fp32 D, beta 1 (weight gradients) */
} product;

static void *random_bf16(size_t n) {
    unsigned short *h = malloc(n * 2);
    if (!h) exit(1);
    unsigned x = 12345;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        h[i] = (unsigned short)(0x3c00 + (x >> 22)); /* bf16 in [0.0078, 0.0156): no overflow */
    }
    void *d;
    CHECK_CUDA(cudaMalloc(&d, n * 2));
    CHECK_CUDA(cudaMemcpy(d, h, n * 2, cudaMemcpyHostToDevice));
    free(h);
    return d;
}

static float time_algo(cublasLtHandle_t lt, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t la,
                       cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc, const cublasLtMatmulAlgo_t *algo,
                       const void *a, const void *b, void *c, float beta, void *ws, size_t ws_bytes,
                       cudaEvent_t e0, cudaEvent_t e1) {
    const float alpha = 1.0f;
    for (int r = 0; r < WARMUP + REPS; r++) {
        if (r == WARMUP) CHECK_CUDA(cudaEventRecord(e0, 0));
        if (cublasLtMatmul(lt, desc, &alpha, a, la, b, lb, &beta, c, lc, c, lc, algo, ws, ws_bytes, 0) !=
            CUBLAS_STATUS_SUCCESS)
            return -1;
    }
    CHECK_CUDA(cudaEventRecord(e1, 0));
    CHECK_CUDA(cudaEventSynchronize(e1));
    float ms;
    CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
    return ms / REPS;
}

static void run(cublasLtHandle_t lt, const product *p, void *ws, size_t ws_bytes) {
    cublasOperation_t ta = p->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = p->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasLtMatmulDesc_t desc;
    CHECK_LT(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    int a_rows = p->trans_a ? p->k : p->m, a_cols = p->trans_a ? p->m : p->k;
    int b_rows = p->trans_b ? p->n : p->k, b_cols = p->trans_b ? p->k : p->n;
    cudaDataType_t out = p->f32_out ? CUDA_R_32F : CUDA_R_16BF;
    cublasLtMatrixLayout_t la, lb, lc;
    CHECK_LT(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, a_rows, a_cols, a_rows));
    CHECK_LT(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, b_rows, b_cols, b_rows));
    CHECK_LT(cublasLtMatrixLayoutCreate(&lc, out, p->m, p->n, p->m));
    cublasLtMatmulPreference_t pref;
    CHECK_LT(cublasLtMatmulPreferenceCreate(&pref));
    CHECK_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                  sizeof ws_bytes));
    cublasLtMatmulHeuristicResult_t found[ALGOS];
    int n_found = 0;
    CHECK_LT(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, ALGOS, found, &n_found));
    void *a = random_bf16((size_t)a_rows * a_cols), *b = random_bf16((size_t)b_rows * b_cols), *c;
    size_t c_bytes = (size_t)p->m * p->n * (p->f32_out ? 4 : 2);
    CHECK_CUDA(cudaMalloc(&c, c_bytes));
    CHECK_CUDA(cudaMemset(c, 0, c_bytes));
    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
    double flops = 2.0 * p->m * p->n * p->k;
    float first = -1, best = -1;
    int best_i = -1;
    for (int i = 0; i < n_found; i++) {
        float ms = time_algo(lt, desc, la, lb, lc, &found[i].algo, a, b, c, p->f32_out ? 1.0f : 0.0f, ws,
                             ws_bytes, e0, e1);
        if (ms <= 0) continue;
        if (i == 0) first = ms;
        if (best < 0 || ms < best) best = ms, best_i = i;
    }
    printf("%-14s m %5d n %5d k %5d: %2d answers; first %7.1f TFLOP/s (%.3f ms), fastest #%d %7.1f (%.3f ms): %+.1f%%\n",
           p->name, p->m, p->n, p->k, n_found, first > 0 ? flops / first / 1e9 : 0, first, best_i,
           best > 0 ? flops / best / 1e9 : 0, best, first > 0 && best > 0 ? 100.0 * (first / best - 1) : 0);
    fflush(stdout);
    CHECK_CUDA(cudaFree(a));
    CHECK_CUDA(cudaFree(b));
    CHECK_CUDA(cudaFree(c));
    CHECK_CUDA(cudaEventDestroy(e0));
    CHECK_CUDA(cudaEventDestroy(e1));
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(desc);
}

int main(int argc, char **argv) {
    int N = argc > 1 ? atoi(argv[1]) : 8192, C = argc > 2 ? atoi(argv[2]) : 4096;
    int I = argc > 3 ? atoi(argv[3]) : 11008;
    if (N <= 0 || C <= 0 || I <= 0) return fprintf(stderr, "usage: gemm_algos [TOKENS HIDDEN INTERMEDIATE]\n"), 2;
    /* out[N,O] = in[N,I] W[O,I]^T: m O, n N, k I, A = W (T); din[N,I] = dout[N,O] W[O,I]: m I,
     * n N, k O; dw[O,I] += dout^T in: m I, n O, k N, B = dout (T), fp32 D */
    const product products[] = {
        {"fwd C->C", C, N, C, 1, 0, 0},   {"fwd C->I", I, N, C, 1, 0, 0},   {"fwd I->C", C, N, I, 1, 0, 0},
        {"din C->C", C, N, C, 0, 0, 0},   {"din C->I", C, N, I, 0, 0, 0},   {"din I->C", I, N, C, 0, 0, 0},
        {"dw C->C", C, C, N, 0, 1, 1},    {"dw C->I", C, I, N, 0, 1, 1},    {"dw I->C", I, C, N, 0, 1, 1},
        {"lora A 192", 192, N, C, 1, 0, 0}, {"lora B 64", C, N, 64, 1, 0, 0},
    };
    cublasLtHandle_t lt;
    CHECK_LT(cublasLtCreate(&lt));
    size_t ws_bytes = (size_t)32 << 20;
    void *ws;
    CHECK_CUDA(cudaMalloc(&ws, ws_bytes));
    struct cudaDeviceProp prop;
    CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    printf("%s, cuBLASLt %zu; tokens %d, hidden %d, intermediate %d\n", prop.name, cublasLtGetVersion(), N, C, I);
    for (size_t i = 0; i < sizeof products / sizeof products[0]; i++) run(lt, &products[i], ws, ws_bytes);
    CHECK_CUDA(cudaFree(ws));
    cublasLtDestroy(lt);
    return 0;
}
