// The CUDA backend: causal attention with grouped-query heads.  Not built yet (issue F10):
// both passes fail the context, so a run on the CUDA backend stops with this message at its
// next k_sync instead of computing with unwritten outputs.
#include "kernels/cuda/cuda_kernels.h"

extern "C" void kcuda_attention_fwd(kctx *c, void *out, float *lse, const void *q, const void *k,
                                    const void *v, int B, int T, int Hq, int Hkv, int hd) {
    (void)out, (void)lse, (void)q, (void)k, (void)v, (void)B, (void)T, (void)Hq, (void)Hkv,
        (void)hd;
    k_fail(c, "CUDA attention: not built yet (F10)");
}

extern "C" void kcuda_attention_bwd(kctx *c, void *dq, void *dk, void *dv, const void *dout,
                                    const void *q, const void *k, const void *v, const void *out,
                                    const float *lse, int B, int T, int Hq, int Hkv, int hd) {
    (void)dq, (void)dk, (void)dv, (void)dout, (void)q, (void)k, (void)v, (void)out, (void)lse,
        (void)B, (void)T, (void)Hq, (void)Hkv, (void)hd;
    k_fail(c, "CUDA attention: not built yet (F10)");
}
