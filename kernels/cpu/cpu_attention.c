/* CPU backend: causal scaled-dot-product attention with grouped-query heads, over whole rows
 * or, with k_docs (varlen), over the documents packed in each row.
 *
 * The plain O(T^2) algorithm, one query row at a time, in double.  The forward pass saves
 * the log-sum-exp of each row's scores so the backward pass can recompute the
 * probabilities P = exp(s - lse) instead of storing them.  Query t of row b sees keys
 * first_key(b, t) .. t: 0 without docs, its document's start with them, and with a sliding
 * window no key window or more back. */
#include "kernels/cpu/cpu_kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Offset of element (b, t, h, 0) of a [B, T, H, hd] tensor. */
static size_t at(int b, int t, int h, int T, int H, int hd) {
    return (((size_t)b * T + t) * H + h) * hd;
}

static double dot(const float *a, const float *b, int n) {
    double s = 0.0;
    for (int i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

static int check_heads(kctx *c, const char *op, int Hq, int Hkv) {
    if (Hkv > 0 && Hq > 0 && Hq % Hkv == 0) return 0;
    k_fail(c, "%s: %d query heads are not a multiple of %d key/value heads", op, Hq, Hkv);
    return -1;
}

/* Fails c unless docs (when given) tile every row into documents as kctx.h says. */
static int check_docs(kctx *c, const char *op, const k_docs *docs, int B, int T) {
    if (!docs) return 0;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            size_t i = (size_t)b * T + t;
            int32_t s = docs->start[i], e = docs->end[i];
            int bad = s > t || e <= t || e > T ||
                      (t > 0 && s != t && s != docs->start[i - 1]) ||
                      (t > 0 && s == t && docs->end[i - 1] != t) ||
                      (t > 0 && s != t && e != docs->end[i - 1]);
            if (bad) {
                k_fail(c, "%s: document bounds [%d, %d) of token [%d,%d] do not tile the row "
                          "of %d", op, (int)s, (int)e, b, t, T);
                return -1;
            }
        }
    return 0;
}

/* The first key query t of row b sees: its document's start (0 without docs), or with a
 * window (> 0) t - window + 1 when that is later. */
static int first_key(const k_docs *docs, int window, int b, int t, int T) {
    int first = docs ? docs->start[(size_t)b * T + t] : 0;
    return window > 0 && t - window + 1 > first ? t - window + 1 : first;
}

static int check_window(kctx *c, const char *op, int window) {
    if (window >= 0) return 0;
    k_fail(c, "%s: sliding window %d is negative", op, window);
    return -1;
}

void cpu_attention_fwd(kctx *c, void *out, float *lse, const void *q, const void *k,
                       const void *v, const k_docs *docs, int window, int B, int T, int Hq,
                       int Hkv, int hd) {
    if (check_heads(c, "attention", Hq, Hkv) || check_docs(c, "attention", docs, B, T) ||
        check_window(c, "attention", window))
        return;
    float *o = out;
    const float *Q = q, *K = k, *V = v;
    double *p = malloc(((size_t)T + hd) * sizeof(double)); /* scores [T], then acc [hd] */
    if (!p) {
        k_fail(c, "attention: out of host memory (T=%d, hd=%d)", T, hd);
        return;
    }
    double *acc = p + T;
    double scale = 1.0 / sqrt(hd);
    int group = Hq / Hkv;
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < Hq; h++) {
            int g = h / group;
            for (int t = 0; t < T; t++) {
                const float *qr = Q + at(b, t, h, T, Hq, hd);
                const int j0 = first_key(docs, window, b, t, T);
                double max = -INFINITY;
                for (int j = j0; j <= t; j++) {
                    p[j] = scale * dot(qr, K + at(b, j, g, T, Hkv, hd), hd);
                    if (p[j] > max) max = p[j];
                }
                double sum = 0.0;
                for (int j = j0; j <= t; j++) {
                    p[j] = exp(p[j] - max);
                    sum += p[j];
                }
                memset(acc, 0, (size_t)hd * sizeof(double));
                for (int j = j0; j <= t; j++) {
                    const float *vr = V + at(b, j, g, T, Hkv, hd);
                    for (int d = 0; d < hd; d++) acc[d] += p[j] * vr[d];
                }
                float *orow = o + at(b, t, h, T, Hq, hd);
                for (int d = 0; d < hd; d++) orow[d] = (float)(acc[d] / sum);
                lse[((size_t)b * Hq + h) * T + t] = (float)(max + log(sum));
            }
        }
    }
    free(p);
}

/* For query row t of head h, with P_j = exp(scale q.k_j - lse) for the keys j it sees:
 *   dP_j = dout.v_j,  D = dout.out,  dS_j = P_j (dP_j - D);
 *   dq = scale sum_j dS_j k_j,  dk_j += scale dS_j q,  dv_j += P_j dout.
 * dk and dv sum over every query row and every query head of the kv head's group, so they
 * are accumulated in double per (batch, kv head) and written once. */
void cpu_attention_bwd(kctx *c, void *dq, void *dk, void *dv, const void *dout, const void *q,
                       const void *k, const void *v, const void *out, const float *lse,
                       const k_docs *docs, int window, int B, int T, int Hq, int Hkv, int hd) {
    if (check_heads(c, "attention backward", Hq, Hkv) ||
        check_docs(c, "attention backward", docs, B, T) ||
        check_window(c, "attention backward", window))
        return;
    float *dQ = dq, *dK = dk, *dV = dv;
    const float *dO = dout, *Q = q, *K = k, *V = v, *O = out;
    size_t th = (size_t)T * hd;
    double *p = malloc((2 * (size_t)T + hd + 2 * th) * sizeof(double));
    if (!p) {
        k_fail(c, "attention backward: out of host memory (T=%d, hd=%d)", T, hd);
        return;
    }
    double *ds = p + T, *dq_acc = ds + T, *dk_acc = dq_acc + hd, *dv_acc = dk_acc + th;
    double scale = 1.0 / sqrt(hd);
    int group = Hq / Hkv;
    for (int b = 0; b < B; b++) {
        for (int g = 0; g < Hkv; g++) {
            memset(dk_acc, 0, 2 * th * sizeof(double)); /* dk_acc and dv_acc */
            for (int h = g * group; h < (g + 1) * group; h++) {
                for (int t = 0; t < T; t++) {
                    const float *qr = Q + at(b, t, h, T, Hq, hd);
                    const float *dor = dO + at(b, t, h, T, Hq, hd);
                    double row_lse = lse[((size_t)b * Hq + h) * T + t];
                    double D = dot(dor, O + at(b, t, h, T, Hq, hd), hd);
                    const int j0 = first_key(docs, window, b, t, T);
                    for (int j = j0; j <= t; j++) {
                        const float *kr = K + at(b, j, g, T, Hkv, hd);
                        const float *vr = V + at(b, j, g, T, Hkv, hd);
                        p[j] = exp(scale * dot(qr, kr, hd) - row_lse);
                        ds[j] = p[j] * (dot(dor, vr, hd) - D);
                    }
                    memset(dq_acc, 0, (size_t)hd * sizeof(double));
                    for (int j = j0; j <= t; j++) {
                        const float *kr = K + at(b, j, g, T, Hkv, hd);
                        double *dkr = dk_acc + (size_t)j * hd, *dvr = dv_acc + (size_t)j * hd;
                        for (int d = 0; d < hd; d++) {
                            dq_acc[d] += ds[j] * kr[d];
                            dkr[d] += ds[j] * qr[d];
                            dvr[d] += p[j] * dor[d];
                        }
                    }
                    float *dqr = dQ + at(b, t, h, T, Hq, hd);
                    for (int d = 0; d < hd; d++) dqr[d] = (float)(scale * dq_acc[d]);
                }
            }
            for (int j = 0; j < T; j++) {
                float *dkr = dK + at(b, j, g, T, Hkv, hd), *dvr = dV + at(b, j, g, T, Hkv, hd);
                for (int d = 0; d < hd; d++) {
                    dkr[d] = (float)(scale * dk_acc[(size_t)j * hd + d]);
                    dvr[d] = (float)dv_acc[(size_t)j * hd + d];
                }
            }
        }
    }
    free(p);
}
