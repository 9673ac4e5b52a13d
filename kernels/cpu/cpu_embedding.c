/* CPU backend: token embedding lookup and its (deterministic) backward pass. */
#include "kernels/cpu/cpu_kernels.h"

#include <string.h>

void cpu_embedding_fwd(kctx *c, void *out, const int32_t *tokens, const void *wte, int N, int C,
                       int V) {
    float *o = out;
    const float *table = wte;
    for (int n = 0; n < N; n++) {
        float *row = o + (size_t)n * C;
        int32_t tok = tokens[n];
        if (tok < 0 || tok >= V) {
            k_fail(c, "embedding: token %d at row %d is outside the vocabulary [0, %d)", tok, n,
                   V);
            memset(row, 0, (size_t)C * sizeof(float));
            continue;
        }
        memcpy(row, table + (size_t)tok * C, (size_t)C * sizeof(float));
    }
}

/* Rows are added in order n = 0..N-1, so repeated tokens always sum the same way. */
void cpu_embedding_bwd(kctx *c, float *dwte, const void *dout, const int32_t *tokens, int N,
                       int C, int V) {
    const float *d = dout;
    for (int n = 0; n < N; n++) {
        int32_t tok = tokens[n];
        if (tok < 0 || tok >= V) {
            k_fail(c, "embedding backward: token %d at row %d is outside the vocabulary [0, %d)",
                   tok, n, V);
            continue;
        }
        float *grad = dwte + (size_t)tok * C;
        const float *row = d + (size_t)n * C;
        for (int i = 0; i < C; i++) grad[i] += row[i];
    }
}
