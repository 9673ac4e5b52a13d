/* CPU backend: cross-entropy over logits and the AdamW update. */
#include "kernels/cpu/cpu_kernels.h"

#include <math.h>
#include <string.h>

/* Each row: lse = max + log sum exp(x - max) (stable), loss = lse - x[target],
 * dlogits = dscale (exp(x - lse) - onehot).  dlogits may be logits: every element is read
 * before it is overwritten. */
void cpu_cross_entropy(kctx *c, float *loss_sum, void *dlogits, const void *logits,
                       const int32_t *targets, int N, int V, float dscale) {
    float *dx = dlogits;
    const float *x = logits;
    double total = 0.0;
    for (int n = 0; n < N; n++) {
        const float *xr = x + (size_t)n * V;
        float *dxr = dx ? dx + (size_t)n * V : NULL;
        int32_t target = targets[n];
        if (target == K_IGNORE_INDEX || target < 0 || target >= V) {
            if (target != K_IGNORE_INDEX)
                k_fail(c, "cross_entropy: target %d at row %d is outside the vocabulary [0, %d)",
                       target, n, V);
            if (dxr) memset(dxr, 0, (size_t)V * sizeof(float));
            continue;
        }
        double max = -INFINITY;
        for (int i = 0; i < V; i++)
            if (xr[i] > max) max = xr[i];
        double sum = 0.0;
        for (int i = 0; i < V; i++) sum += exp(xr[i] - max);
        double lse = max + log(sum);
        total += lse - xr[target];
        if (!dxr) continue;
        for (int i = 0; i < V; i++) {
            double prob = exp(xr[i] - lse);
            dxr[i] = (float)(dscale * (prob - (i == target ? 1.0 : 0.0)));
        }
    }
    *loss_sum = (float)(*loss_sum + total);
}

/* torch.optim.AdamW (not amsgrad, not fused), in double per element. */
void cpu_adamw(kctx *c, float *p, const float *grad, float *m, float *v, size_t n, float lr,
               float beta1, float beta2, float eps, float weight_decay, int step,
               float grad_scale, void *out) {
    if (step < 1) {
        k_fail(c, "adamw: step %d must count from 1", step);
        return;
    }
    double b1 = beta1, b2 = beta2;
    double step_size = lr / (1.0 - pow(b1, step));
    double bias_correction2_sqrt = sqrt(1.0 - pow(b2, step));
    double decay = 1.0 - (double)lr * weight_decay;
    for (size_t i = 0; i < n; i++) {
        double g = (double)grad[i] * grad_scale;
        double mi = b1 * m[i] + (1.0 - b1) * g;
        double vi = b2 * v[i] + (1.0 - b2) * g * g;
        double pi = p[i] * decay;
        pi -= step_size * mi / (sqrt(vi) / bias_correction2_sqrt + eps);
        m[i] = (float)mi;
        v[i] = (float)vi;
        p[i] = (float)pi;
    }
    if (out) cpu_f32_to_compute(c, out, p, n);
}
