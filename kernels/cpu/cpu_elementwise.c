/* CPU backend: elementwise ops, squared norms and SwiGLU. */
#include "kernels/cpu/cpu_kernels.h"

#include <math.h>

#include "base/philox.h"

void cpu_accumulate(kctx *c, void *dst, const void *src, size_t n) {
    (void)c;
    float *d = dst;
    const float *s = src;
    for (size_t i = 0; i < n; i++) d[i] += s[i];
}

/* The compute dtype is fp32 here, so fp32 accumulation is the same loop. */
void cpu_add_f32(kctx *c, float *dst, const float *src, size_t n) { cpu_accumulate(c, dst, src, n); }

void cpu_sumsq_f32(kctx *c, float *out, const float *x, size_t n) {
    (void)c;
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) sum += (double)x[i] * x[i];
    *out = (float)(*out + sum);
}

void cpu_scale(kctx *c, void *x, float s, size_t n) {
    (void)c;
    float *p = x;
    for (size_t i = 0; i < n; i++) p[i] *= s;
}

void cpu_dropout(kctx *c, void *out, const void *in, const int64_t *samples, uint64_t seed,
                 uint32_t site, int B, int T, int cols, float p, int accumulate) {
    if (!(p >= 0.0f && p < 1.0f)) {
        k_fail(c, "dropout: probability %g is outside [0, 1)", (double)p);
        return;
    }
    float *o = out;
    const float *x = in;
    uint32_t threshold = philox_dropout_threshold(p);
    float keep_scale = 1.0f / (1.0f - p);
    size_t row = (size_t)T * (size_t)cols;
    for (int b = 0; b < B; b++)
        for (size_t e = 0; e < row; e++) {
            size_t i = (size_t)b * row + e;
            float v = philox_dropout_keep(seed, (uint64_t)samples[b], site, e, threshold)
                          ? x[i] * keep_scale : 0.0f;
            o[i] = accumulate ? o[i] + v : v;
        }
}

static double sigmoid(double x) {
    return 1.0 / (1.0 + exp(-x)); /* exp overflows to inf for very negative x: gives 0 */
}

void cpu_swiglu_fwd(kctx *c, void *out, const void *gate, const void *up, size_t n) {
    (void)c;
    float *o = out;
    const float *g = gate, *u = up;
    for (size_t i = 0; i < n; i++) o[i] = (float)(g[i] * sigmoid(g[i]) * u[i]);
}

/* silu'(g) = s + g s (1 - s) with s = sigmoid(g). */
void cpu_swiglu_bwd(kctx *c, void *dgate, void *dup, const void *dout, const void *gate,
                    const void *up, size_t n) {
    (void)c;
    float *dg = dgate, *du = dup;
    const float *d = dout, *g = gate, *u = up;
    for (size_t i = 0; i < n; i++) {
        /* read everything first: the outputs may alias the inputs */
        double gi = g[i], ui = u[i], di = d[i];
        double s = sigmoid(gi);
        dg[i] = (float)(di * ui * s * (1.0 + gi * (1.0 - s)));
        du[i] = (float)(di * gi * s);
    }
}
