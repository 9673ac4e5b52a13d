/* The CPU backend of kernels.h (built on kctx.h, never including kernels.h): the fp32
 * reference implementation.
 *
 * Compute dtype is K_F32, so every `void *` buffer of kernels.h is a float array in host
 * memory.  Reductions (norms, softmax sums, losses) accumulate in double so that this
 * backend matches Hugging Face's float64 outputs to about 1e-5 relative.  Linear layers go
 * through CBLAS (OpenBLAS); the caller chooses its thread count.
 *
 * cpu_<name> has the signature and contract of the op k_<name> (kernels/kernels_ops.h);
 * kernels/kernels.c dispatches to them. */
#ifndef FSDP_CPU_KERNELS_H
#define FSDP_CPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "base/errbuf.h"
#include "kernels/kctx.h"

/* cpu_<name> for every op of kernels_ops.h.  Where they are: cpu_memory.c (memory, copies,
 * the fp32 -> fp32 casts), cpu_elementwise.c (accumulate, add_f32, sumsq_f32, SwiGLU),
 * cpu_embedding.c, cpu_norm_rope.c (RMSNorm, RoPE), cpu_attention.c, cpu_linear.c,
 * cpu_loss_optim.c (cross-entropy, AdamW), cpu_nf4.c (NF4 dequantization), cpu_fp8.c (FP8),
 * cpu_attention_kv.c (attention over a KV cache). */
#define K_OP(name, params, args) void cpu_##name params;
#define K_OP_BY_HAND(ret, name, params) ret cpu_##name params;
#include "kernels/kernels_ops.h"

/* k_cpu_defer_copies (cpu_memory.c): c->impl becomes the queue of deferred copies, run by
 * cpu_copy_h2d_wait and cpu_sync, freed by cpu_destroy. */
int cpu_defer_copies(kctx *c, errbuf *err);
void cpu_sync(kctx *c);
void cpu_destroy(kctx *c);

#endif
