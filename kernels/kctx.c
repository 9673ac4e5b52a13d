/* kctx: the context's failure record and dtype size (kctx.h). */
#include "kernels/kctx.h"

#include <stdarg.h>
#include <stdio.h>

size_t k_compute_size(const kctx *c) {
    return c->compute == K_BF16 ? 2 : 4;
}

void k_fail(kctx *c, const char *fmt, ...) {
    if (c->failed) return; /* the first failure is the one worth reporting */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->failure, sizeof c->failure, fmt, ap);
    va_end(ap);
    c->failed = 1;
}

int k_check(kctx *c, errbuf *err) {
    if (!c->failed) return 0;
    c->failed = 0;
    return errf(err, "%s", c->failure);
}

int k_fp8_bad_args(kctx *c, const char *op, fp8_format fa, fp8_format fb, k_fp8_scaling scaling,
                   int gemm) {
    if ((fa != FP8_E4M3 && fa != FP8_E5M2) || (fb != FP8_E4M3 && fb != FP8_E5M2)) {
        k_fail(c, "%s: fp8 format %d is neither e4m3 (%d) nor e5m2 (%d)",
               op, fa != FP8_E4M3 && fa != FP8_E5M2 ? (int)fa : (int)fb, FP8_E4M3, FP8_E5M2);
        return 1;
    }
    if (scaling != K_FP8_TENSORWISE && scaling != K_FP8_ROWWISE) {
        k_fail(c, "%s: fp8 scaling %d is neither tensorwise (%d) nor rowwise (%d)", op,
               (int)scaling, K_FP8_TENSORWISE, K_FP8_ROWWISE);
        return 1;
    }
    if (gemm && fa == FP8_E5M2 && fb == FP8_E5M2) {
        k_fail(c, "%s: e5m2 x e5m2 is not a product cuBLASLt has (one side must be e4m3)", op);
        return 1;
    }
    return 0;
}
