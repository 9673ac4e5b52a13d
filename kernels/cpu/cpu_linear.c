/* CPU backend: linear layers through CBLAS.  Weights are W[O, I] (Hugging Face layout).
 * (The sizes are not called I and O here: cblas.h pulls in complex.h, which defines I.) */
#include "kernels/cpu/cpu_kernels.h"

#include <cblas.h>

/* out[N,O] (+)= in[N,I] W[O,I]^T, in's rows ld apart */
void cpu_linear_fwd_ld(kctx *c, void *out, const void *in, int ld, const void *w, int N, int n_in,
                       int n_out, int accumulate) {
    (void)c;
    if (N <= 0 || n_in <= 0 || n_out <= 0) return;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, n_out, n_in, 1.0f, in, ld, w, n_in,
                accumulate ? 1.0f : 0.0f, out, n_out);
}

/* din[N,I] (+)= dout[N,O] W[O,I];  dw[O,I] (+)= dout[N,O]^T in[N,I] (beta 0: BLAS reads no
 * dw); in and din rows ld apart. */
void cpu_linear_bwd_ld(kctx *c, void *din, float *dw, const void *dout, const void *in, int ld,
                       const void *w, int N, int n_in, int n_out, int accumulate_din, int accumulate_dw) {
    (void)c;
    if (N <= 0 || n_in <= 0 || n_out <= 0) return;
    if (din)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, n_in, n_out, 1.0f, dout, n_out,
                    w, n_in, accumulate_din ? 1.0f : 0.0f, din, ld);
    if (dw)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n_out, n_in, N, 1.0f, dout, n_out,
                    in, ld, accumulate_dw ? 1.0f : 0.0f, dw, n_in);
}

/* out[n,:] += bias */
void cpu_bias_fwd(kctx *c, void *out, const void *bias, int N, int n_out) {
    (void)c;
    float *o = out;
    const float *b = bias;
    for (int n = 0; n < N; n++)
        for (int j = 0; j < n_out; j++) o[(size_t)n * n_out + j] += b[j];
}

/* dbias[o] += sum_n dout[n,o], each column's sum in double over the rows in order. */
void cpu_bias_bwd(kctx *c, float *dbias, const void *dout, int N, int n_out) {
    (void)c;
    const float *g = dout;
    for (int j = 0; j < n_out; j++) {
        double sum = 0.0;
        for (int n = 0; n < N; n++) sum += g[(size_t)n * n_out + j];
        dbias[j] = (float)(dbias[j] + sum);
    }
}
