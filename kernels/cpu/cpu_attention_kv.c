/* CPU backend: generation's attention over a KV cache (k_attention_kv): the new tokens'
 * RoPE, their keys and values appended to the cache, then each new query over the cache up
 * to its own position.  The same arithmetic as cpu_rope and cpu_attention_fwd (angles,
 * scores and sums in double), so decoding a row token by token gives what the training
 * forward gives on the whole row. */
#include "kernels/cpu/cpu_kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Rotates the H heads of one token (x [H, hd]) to position pos, as cpu_rope does. */
static void rope_token(float *x, const float *inv_freq, int pos, int H, int hd) {
    int half = hd / 2;
    for (int i = 0; i < half; i++) {
        double angle = (double)pos * inv_freq[i];
        double cs = cos(angle), sn = sin(angle);
        for (int h = 0; h < H; h++) {
            float *v = x + (size_t)h * hd;
            double x1 = v[i], x2 = v[i + half];
            v[i] = (float)(x1 * cs - x2 * sn);
            v[i + half] = (float)(x2 * cs + x1 * sn);
        }
    }
}

static int check_args(kctx *c, const int32_t *pos, int B, int S, int T_max, int Hq, int Hkv,
                      int hd) {
    if (hd % 2) return k_fail(c, "attention_kv: head dim %d is odd", hd), -1;
    if (Hkv <= 0 || Hq <= 0 || Hq % Hkv)
        return k_fail(c, "attention_kv: %d query heads are not a multiple of %d key/value heads",
                      Hq, Hkv), -1;
    for (int b = 0; b < B; b++)
        if (pos[b] < 0 || pos[b] + S > T_max)
            return k_fail(c, "attention_kv: row %d's %d new tokens at position %d do not fit a "
                             "cache of %d", b, S, (int)pos[b], T_max), -1;
    return 0;
}

void cpu_attention_kv(kctx *c, void *out, void *q, void *k, const void *v, void *k_cache,
                      void *v_cache, const int32_t *pos, const float *inv_freq, int B, int S,
                      int T_max, int Hq, int Hkv, int hd) {
    if (B <= 0 || S <= 0 || check_args(c, pos, B, S, T_max, Hq, Hkv, hd)) return;
    float *Q = q, *K = k, *KC = k_cache, *VC = v_cache, *O = out;
    const float *V = v;
    size_t qrow = (size_t)Hq * hd, kvrow = (size_t)Hkv * hd;
    for (int b = 0; b < B; b++)
        for (int s = 0; s < S; s++) {
            size_t n = (size_t)b * S + s, at = (size_t)b * T_max + pos[b] + s;
            rope_token(Q + n * qrow, inv_freq, pos[b] + s, Hq, hd);
            rope_token(K + n * kvrow, inv_freq, pos[b] + s, Hkv, hd);
            memcpy(KC + at * kvrow, K + n * kvrow, kvrow * sizeof(float));
            memcpy(VC + at * kvrow, V + n * kvrow, kvrow * sizeof(float));
        }
    int T = pos[0] + S;
    for (int b = 1; b < B; b++) T = pos[b] + S > T ? pos[b] + S : T;
    double *p = malloc(((size_t)T + hd) * sizeof(double)); /* scores [T], then acc [hd] */
    if (!p) {
        k_fail(c, "attention_kv: out of host memory (T=%d, hd=%d)", T, hd);
        return;
    }
    double *acc = p + T, scale = 1.0 / sqrt(hd);
    int group = Hq / Hkv;
    for (int b = 0; b < B; b++)
        for (int s = 0; s < S; s++)
            for (int h = 0; h < Hq; h++) {
                const float *qr = Q + ((size_t)b * S + s) * qrow + (size_t)h * hd;
                const float *kc = KC + (size_t)b * T_max * kvrow + (size_t)(h / group) * hd;
                const float *vc = VC + (size_t)b * T_max * kvrow + (size_t)(h / group) * hd;
                int last = pos[b] + s;
                double max = -INFINITY, sum = 0.0;
                for (int j = 0; j <= last; j++) {
                    double d = 0.0;
                    for (int i = 0; i < hd; i++) d += (double)qr[i] * kc[(size_t)j * kvrow + i];
                    p[j] = scale * d;
                    if (p[j] > max) max = p[j];
                }
                for (int j = 0; j <= last; j++) sum += (p[j] = exp(p[j] - max));
                memset(acc, 0, (size_t)hd * sizeof(double));
                for (int j = 0; j <= last; j++)
                    for (int i = 0; i < hd; i++) acc[i] += p[j] * vc[(size_t)j * kvrow + i];
                float *orow = O + ((size_t)b * S + s) * qrow + (size_t)h * hd;
                for (int i = 0; i < hd; i++) orow[i] = (float)(acc[i] / sum);
            }
    free(p);
}
