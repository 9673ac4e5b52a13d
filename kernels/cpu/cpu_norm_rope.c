/* CPU backend: RMSNorm (as Hugging Face LlamaRMSNorm) and rotary position embedding
 * (Hugging Face rotate_half convention). */
#include "kernels/cpu/cpu_kernels.h"

#include <math.h>

void cpu_rmsnorm_fwd(kctx *c, void *out, float *rstd, const void *in, const void *w, int N, int C,
                     float eps) {
    (void)c;
    float *o = out;
    const float *x = in, *weight = w;
    for (int n = 0; n < N; n++) {
        const float *xr = x + (size_t)n * C;
        float *orow = o + (size_t)n * C;
        double ss = 0.0;
        for (int i = 0; i < C; i++) ss += (double)xr[i] * xr[i];
        double r = 1.0 / sqrt(ss / C + eps);
        rstd[n] = (float)r;
        for (int i = 0; i < C; i++) orow[i] = (float)(xr[i] * r * weight[i]);
    }
}

/* With out_i = x_i r w_i and r = (mean(x^2) + eps)^-1/2, dr/dx_j = -r^3 x_j / C, so
 *   din_j = r w_j g_j - x_j (r^3 / C) sum_i g_i w_i x_i,   dw_i = sum_n g_i x_i r. */
void cpu_rmsnorm_bwd(kctx *c, void *din, float *dw, const void *dout, const void *in,
                     const void *w, const float *rstd, int N, int C) {
    (void)c;
    float *dx = din;
    const float *g = dout, *x = in, *weight = w;
    for (int n = 0; n < N; n++) {
        const float *gr = g + (size_t)n * C, *xr = x + (size_t)n * C;
        float *dxr = dx + (size_t)n * C;
        double r = rstd[n];
        double dot = 0.0;
        for (int i = 0; i < C; i++) dot += (double)gr[i] * weight[i] * xr[i];
        double coef = r * r * r * dot / C;
        for (int i = 0; i < C; i++)
            dxr[i] = (float)(dxr[i] + (r * weight[i] * gr[i] - xr[i] * coef));
    }
    /* dw column by column, so each column's sum over rows is in double */
    for (int i = 0; dw && i < C; i++) {
        double sum = 0.0;
        for (int n = 0; n < N; n++) {
            size_t at = (size_t)n * C + i;
            sum += (double)g[at] * x[at] * rstd[n];
        }
        dw[i] = (float)(dw[i] + sum);
    }
}

/* Pairs (i, i + hd/2) rotate by angle pos * inv_freq[i] (negated for the inverse), pos = t or,
 * with docs, t - the start of the token's document. */
void cpu_rope(kctx *c, void *x, const float *inv_freq, const k_docs *docs, int B, int T, int H,
              int hd, int inverse) {
    if (hd % 2) {
        k_fail(c, "rope: head dim %d is odd", hd);
        return;
    }
    float *data = x;
    int half = hd / 2;
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            int pos = docs ? t - docs->start[(size_t)b * T + t] : t;
            for (int i = 0; i < half; i++) {
                double angle = (double)pos * inv_freq[i];
                double cs = cos(angle), sn = inverse ? -sin(angle) : sin(angle);
                for (int h = 0; h < H; h++) {
                    float *v = data + (((size_t)b * T + t) * H + h) * hd;
                    double x1 = v[i], x2 = v[i + half];
                    v[i] = (float)(x1 * cs - x2 * sn);
                    v[i + half] = (float)(x2 * cs + x1 * sn);
                }
            }
        }
    }
}
