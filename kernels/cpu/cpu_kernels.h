/* The CPU backend of kernels.h: the fp32 reference implementation.
 *
 * Compute dtype is K_F32, so every `void *` buffer of kernels.h is a float array in host
 * memory.  Reductions (norms, softmax sums, losses) accumulate in double so that this
 * backend matches Hugging Face's float64 outputs to about 1e-5 relative.  Linear layers go
 * through CBLAS (OpenBLAS); the caller chooses its thread count.
 *
 * Each function has the signature and contract of the kernels.h op of the same name with
 * the `k_` prefix replaced by `cpu_`; kernels/kernels.c dispatches to them. */
#ifndef FSDP_CPU_KERNELS_H
#define FSDP_CPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"
#include "proto/errbuf.h"

/* cpu_memory.c: host memory and the (trivial, fp32 -> fp32) casts */
void *cpu_alloc(kctx *c, size_t bytes, errbuf *err);
void cpu_free(kctx *c, void *p);
void cpu_copy(kctx *c, void *dst, const void *src, size_t bytes); /* h2d, d2h and d2d alike */
void cpu_zero(kctx *c, void *p, size_t bytes);
void cpu_f32_to_compute(kctx *c, void *dst, const float *src, size_t n);
void cpu_compute_to_f32(kctx *c, float *dst, const void *src, size_t n);

/* cpu_elementwise.c */
void cpu_add(kctx *c, void *out, const void *a, const void *b, size_t n);
void cpu_accumulate(kctx *c, void *dst, const void *src, size_t n);
void cpu_add_f32(kctx *c, float *dst, const float *src, size_t n);
void cpu_scale_f32(kctx *c, float *x, float s, size_t n);
void cpu_sumsq_f32(kctx *c, float *out, const float *x, size_t n);
void cpu_swiglu_fwd(kctx *c, void *out, const void *gate, const void *up, size_t n);
void cpu_swiglu_bwd(kctx *c, void *dgate, void *dup, const void *dout, const void *gate,
                    const void *up, size_t n);

/* cpu_embedding.c */
void cpu_embedding_fwd(kctx *c, void *out, const int32_t *tokens, const void *wte, int N, int C,
                       int V);
void cpu_embedding_bwd(kctx *c, float *dwte, const void *dout, const int32_t *tokens, int N,
                       int C, int V);

/* cpu_norm_rope.c */
void cpu_rmsnorm_fwd(kctx *c, void *out, float *rstd, const void *in, const void *w, int N, int C,
                     float eps);
void cpu_rmsnorm_bwd(kctx *c, void *din, float *dw, const void *dout, const void *in,
                     const void *w, const float *rstd, int N, int C);
void cpu_rope(kctx *c, void *x, const float *inv_freq, int B, int T, int H, int hd, int inverse);

/* cpu_attention.c */
void cpu_attention_fwd(kctx *c, void *out, float *lse, const void *q, const void *k,
                       const void *v, int B, int T, int Hq, int Hkv, int hd);
void cpu_attention_bwd(kctx *c, void *dq, void *dk, void *dv, const void *dout, const void *q,
                       const void *k, const void *v, const void *out, const float *lse, int B,
                       int T, int Hq, int Hkv, int hd);

/* cpu_linear.c */
void cpu_linear_fwd(kctx *c, void *out, const void *in, const void *w, int N, int n_in,
                    int n_out);
void cpu_linear_bwd(kctx *c, void *din, float *dw, const void *dout, const void *in,
                    const void *w, int N, int n_in, int n_out, int accumulate_din);

/* cpu_loss_optim.c */
void cpu_cross_entropy(kctx *c, float *loss_sum, void *dlogits, const void *logits,
                       const int32_t *targets, int N, int V, float dscale);
void cpu_adamw(kctx *c, float *p, const float *grad, float *m, float *v, size_t n, float lr,
               float beta1, float beta2, float eps, float weight_decay, int step,
               float grad_scale);

#endif
