/* kernels_ops.h: every op a backend implements, each signature written once.
 *
 * An X-macro list, included (no include guard) after kernels.h's types, with two row macros
 * the includer defines first (this file #undefs both at its end):
 *
 *   K_OP(name, (params), (args))        void k_<name>(params), forwarded as is to the backend;
 *   K_OP_BY_HAND(ret, name, (params))   ret k_<name>(params), whose forwarder kernels.c writes
 *                                       by hand (it counts the memory, or accepts NULL).
 *
 * From each row come: the public k_<name> declaration (kernels.h), the k_ops table member and
 * the backend tables (kernels.c, `.name = cpu_<name>` and `.name = cuda_<name>`), each
 * backend's declaration (cpu_<name> in cpu/cpu_kernels.h, cuda_<name> in cuda/cuda_kernels.h)
 * and, for K_OP rows, the forwarder k_<name> (kernels.c).  The comment above a row, which
 * starts with the public name (grep for it), is the contract of k_<name>; kernels.h says what
 * the buffers, shapes and failures mean.
 *
 * In a row, params start with `kctx *c` (the forwarder dispatches on c) and args name the
 * params in order: the forwarder passes args on as they are.
 *
 * Adding an op: a row here (with its contract), cpu_<name> in kernels/cpu/ and cuda_<name>
 * (extern "C") in kernels/cuda/, and a check in tests/unit/test_kernels_cpu.c and
 * tests/gpu/check_kernels.c.  Nothing else is written by hand. */

/* ---- memory (in the context's memory space) ---- */

/* k_alloc: `bytes` of context memory, zeroed (counted: k_bytes_in_use). */
K_OP_BY_HAND(void *, alloc, (kctx *c, size_t bytes, errbuf *err))
/* k_free: gives back what k_alloc gave; NULL is fine. */
K_OP_BY_HAND(void, free, (kctx *c, void *p))
/* k_host_alloc: host memory the backend copies fastest from and to (pinned on CUDA), zeroed. */
K_OP_BY_HAND(void *, host_alloc, (kctx *c, size_t bytes, errbuf *err))
/* k_host_free: gives back what k_host_alloc gave; NULL is fine. */
K_OP_BY_HAND(void, host_free, (kctx *c, void *p))
/* k_copy_h2d: from pageable host memory the copy has consumed the source when it returns; from
 * pinned memory (k_host_alloc) it has not: keep the source until k_sync.  Either side of
 * k_copy_h2d and k_copy_d2h may also be host memory (CPU offload keeps shards there), and
 * k_copy_h2d's both sides context memory (a copy ordered with the compute, fsdp's FP8 gathers). */
K_OP(copy_h2d, (kctx *c, void *dst, const void *host_src, size_t bytes),
     (c, dst, host_src, bytes))
/* k_copy_h2d_start: queues dst = host_src on copy lane `lane` (K_COPY_PARAMS or
 * K_COPY_ACTIVATIONS: a copy stream each, in order within a lane, independent of the other),
 * after the compute queued so far (which may still read dst), to overlap the compute queued
 * next; compute queued after a k_copy_h2d_wait that covers it reads dst.  host_src must stay
 * as it is until then, and be pinned (k_host_alloc) or registered (k_host_register) for the
 * copy to run asynchronously.  Returns the copy's ticket, what k_copy_h2d_wait takes: the
 * lane's copies started so far (1, 2, ...), or 0 where the copy has run already (the CPU
 * backend copies at once, unless k_cpu_defer_copies).  Either side
 * may be host memory: it also copies device to pinned host memory (fsdp.offload_activations'
 * layer inputs). */
K_OP_BY_HAND(uint64_t, copy_h2d_start, (kctx *c, int lane, void *dst, const void *host_src, size_t bytes))
/* k_copy_h2d_wait: compute queued from here on waits for lane's copies up to ticket `upto`
 * (K_COPY_ALL: every one so far; 0: none), not for the ones started after it. */
K_OP_BY_HAND(void, copy_h2d_wait, (kctx *c, int lane, uint64_t upto))
/* k_host_register: host memory [p, p + bytes) becomes a copy source (writable: and a copy
 * destination, k_copy_d2h's) as fast as pinned memory until k_host_unregister(p).  Memory only
 * read (a mapped model image) is registered read-only; a failure (a device that cannot
 * register read-only memory) is recorded, and copies from p still work, staged by the driver.
 * Nothing to do on the CPU backend. */
K_OP(host_register, (kctx *c, const void *p, size_t bytes, int writable), (c, p, bytes, writable))
K_OP(host_unregister, (kctx *c, const void *p), (c, p))
/* k_copy_d2h: synchronous, host_dst holds the data on return. */
K_OP(copy_d2h, (kctx *c, void *host_dst, const void *src, size_t bytes),
     (c, host_dst, src, bytes))
/* k_zero: sets `bytes` bytes at p to 0. */
K_OP(zero, (kctx *c, void *p, size_t bytes), (c, p, bytes))

/* ---- casts and elementwise ---- */

/* k_f32_to_compute: dst = src in the compute dtype (bf16: rounded to nearest even). */
K_OP(f32_to_compute, (kctx *c, void *dst, const float *src, size_t n), (c, dst, src, n))
/* k_compute_to_f32: dst = src in fp32 (exact). */
K_OP(compute_to_f32, (kctx *c, float *dst, const void *src, size_t n), (c, dst, src, n))
/* k_accumulate: dst += src (compute dtype). */
K_OP(accumulate, (kctx *c, void *dst, const void *src, size_t n), (c, dst, src, n))
/* k_add_f32: dst += src, fp32. */
K_OP(add_f32, (kctx *c, float *dst, const float *src, size_t n), (c, dst, src, n))
/* k_sumsq_f32: *out += sum(x^2), accumulated in double on the CPU; out is one fp32 in context
 * memory. */
K_OP(sumsq_f32, (kctx *c, float *out, const float *x, size_t n), (c, out, x, n))

/* ---- embedding ---- */

/* k_embedding_fwd: out[n,:] = wte[tokens[n],:].  Tokens must be in [0, V) (checked on the CPU). */
K_OP(embedding_fwd,
     (kctx *c, void *out, const int32_t *tokens, const void *wte, int N, int C, int V),
     (c, out, tokens, wte, N, C, V))
/* k_embedding_bwd: dwte[tokens[n],:] += dout[n,:] (deterministic order). */
K_OP(embedding_bwd,
     (kctx *c, float *dwte, const void *dout, const int32_t *tokens, int N, int C, int V),
     (c, dwte, dout, tokens, N, C, V))

/* ---- RMSNorm: out = in * rstd * w, rstd = 1/sqrt(mean(in^2) + eps) ---- */

/* k_rmsnorm_fwd: out and rstd [N] (fp32, saved for the backward pass). */
K_OP(rmsnorm_fwd,
     (kctx *c, void *out, float *rstd, const void *in, const void *w, int N, int C, float eps),
     (c, out, rstd, in, w, N, C, eps))
/* k_rmsnorm_bwd: din += d/din; dw += d/dw, skipped when dw is NULL (a frozen norm). */
K_OP(rmsnorm_bwd,
     (kctx *c, void *din, float *dw, const void *dout, const void *in, const void *w,
      const float *rstd, int N, int C),
     (c, din, dw, dout, in, w, rstd, N, C))

/* ---- RoPE (Hugging Face rotate_half convention: pairs (i, i + hd/2)) ---- */

/* k_rope: x is [B, T, H, hd], rotated in place by angle pos * inv_freq[i], pos = t (0..T-1),
 * or with docs (kctx.h) t - docs->start[b, t], the position in the token's document;
 * inverse != 0 rotates by the negative angle, which is the backward pass.
 * inv_freq is fp32 [hd/2] in context memory; k_rope_inv_freq (kernels.h) fills it on the
 * host. */
K_OP(rope,
     (kctx *c, void *x, const float *inv_freq, const k_docs *docs, int B, int T, int H, int hd,
      int inverse),
     (c, x, inv_freq, docs, B, T, H, hd, inverse))

/* ---- causal attention with grouped-query heads ---- */

/* k_attention_fwd: q [B,T,Hq,hd], k/v [B,T,Hkv,hd], Hq % Hkv == 0 (query head h uses kv
 * head h / (Hq/Hkv)), scale 1/sqrt(hd).  lse [B,Hq,T] (fp32) is saved for the backward pass.
 * docs NULL: causal over the whole row; else (varlen, kctx.h) query t sees keys
 * docs->start[b,t] .. t only, so no token attends across a document boundary.
 * window > 0 (Mistral's sliding window) narrows that to keys j > t - window: a band of
 * `window` keys ending at the query (transformers' sliding_window_overlay); 0: no window. */
K_OP(attention_fwd,
     (kctx *c, void *out, float *lse, const void *q, const void *k, const void *v,
      const k_docs *docs, int window, int B, int T, int Hq, int Hkv, int hd),
     (c, out, lse, q, k, v, docs, window, B, T, Hq, Hkv, hd))
/* k_attention_bwd: writes (overwrites) dq, dk, dv; docs and window as the forward's. */
K_OP(attention_bwd,
     (kctx *c, void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k,
      const void *v, const void *out, const float *lse, const k_docs *docs, int window, int B,
      int T, int Hq, int Hkv, int hd),
     (c, dq, dk, dv, dout, q, k, v, out, lse, docs, window, B, T, Hq, Hkv, hd))

/* k_attention_kv: generation's attention over a KV cache.  S new tokens a row: q [B,S,Hq,hd]
 * and k, v [B,S,Hkv,hd], as the projections give them (before RoPE); row b's new tokens sit
 * at positions pos[b] .. pos[b]+S-1 (pos: int32 [B], context memory; pos[b] + S <= T_max).
 * Rotates q and k in place by RoPE at those positions (k_rope's convention and inv_freq),
 * writes k and v into the caches k_cache, v_cache [B,T_max,Hkv,hd] at those positions, and
 * out [B,S,Hq,hd] = the attention of each new query over cache positions 0 .. its own (scale
 * 1/sqrt(hd), query head h uses kv head h / (Hq/Hkv)).  Cache positions past pos[b] + S are
 * neither read nor written.  What k_rope then k_attention_fwd give on the whole row. */
K_OP(attention_kv,
     (kctx *c, void *out, void *q, void *k, const void *v, void *k_cache, void *v_cache,
      const int32_t *pos, const float *inv_freq, int B, int S, int T_max, int Hq, int Hkv,
      int hd),
     (c, out, q, k, v, k_cache, v_cache, pos, inv_freq, B, S, T_max, Hq, Hkv, hd))

/* ---- SwiGLU: out = silu(gate) * up ---- */

/* k_swiglu_fwd: out = silu(gate) * up, elementwise. */
K_OP(swiglu_fwd, (kctx *c, void *out, const void *gate, const void *up, size_t n),
     (c, out, gate, up, n))
/* k_swiglu_bwd: writes (overwrites) dgate and dup, which may be gate and up (in place). */
K_OP(swiglu_bwd,
     (kctx *c, void *dgate, void *dup, const void *dout, const void *gate, const void *up,
      size_t n),
     (c, dgate, dup, dout, gate, up, n))

/* ---- linear layers (GEMM): out[N,O] = in[N,I] W[O,I]^T ---- */

/* k_linear_fwd_ld: out = in W^T (accumulate: out += in W^T, the sum taken in fp32 and rounded
 * once), in's rows ld >= I apart (a column slice of a wider matrix: a fused LoRA group's inner
 * activations); k_linear_fwd and k_linear_fwd_acc (kernels.h) are packed (ld = I). */
K_OP(linear_fwd_ld,
     (kctx *c, void *out, const void *in, int ld, const void *w, int N, int I, int O, int accumulate),
     (c, out, in, ld, w, N, I, O, accumulate))
/* k_linear_bwd_ld: din = dout W (accumulate_din: din += ...), skipped when din is NULL;
 * dw += dout^T in (accumulate_dw 0: dw = ..., its old contents never read: whatever was
 * there, a NaN too, is gone), skipped when dw is NULL.  in and din are [N, I] with rows
 * ld >= I apart (a column slice of a wider matrix: the fused LoRA A's inner activations);
 * k_linear_bwd (kernels.h) is ld = I and dw +=. */
K_OP(linear_bwd_ld,
     (kctx *c, void *din, float *dw, const void *dout, const void *in, int ld, const void *w,
      int N, int I, int O, int accumulate_din, int accumulate_dw),
     (c, din, dw, dout, in, ld, w, N, I, O, accumulate_din, accumulate_dw))

/* ---- biases (Qwen2's q, k and v projections) ---- */

/* k_bias_fwd: out[n,:] += bias, out [N,O] and bias [O] in the compute dtype. */
K_OP(bias_fwd, (kctx *c, void *out, const void *bias, int N, int O), (c, out, bias, N, O))
/* k_bias_bwd: dbias[o] += sum over n of dout[n,o], dbias fp32 [O] (the sum in fp32 or better,
 * in a fixed order). */
K_OP(bias_bwd, (kctx *c, float *dbias, const void *dout, int N, int O), (c, dbias, dout, N, O))

/* ---- LoRA (DESIGN.md, LoRA and QLoRA): y = x W^T + scale * B(A(dropout(x))) ---- */

/* k_scale: x *= s elementwise, compute dtype, in place (one rounding). */
K_OP(scale, (kctx *c, void *x, float s, size_t n), (c, x, s, n))
/* k_dropout: in and out are [B, T, cols] (compute dtype); out = in * keep / (1 - p), or with
 * accumulate out += in * keep / (1 - p), where keep for element (b, t, j) is
 * philox_dropout_keep(seed, samples[b], site, t * cols + j, philox_dropout_threshold(p))
 * (base/philox.h): a pure function of the sample, the site and the element, so the backward
 * (the same call on the gradient, with accumulate 1) and any recomputation see the same mask
 * on either backend.  samples: int64 [B] in context memory, each row's global sample index.
 * 0 <= p < 1 (else a failure); out may be in when accumulate is 0. */
K_OP(dropout,
     (kctx *c, void *out, const void *in, const int64_t *samples, uint64_t seed, uint32_t site,
      int B, int T, int cols, float p, int accumulate),
     (c, out, in, samples, seed, site, B, T, cols, p, accumulate))

/* ---- NF4 (QLoRA) ---- */

/* k_nf4_dequant: out[n] (compute dtype) = the n weights of one tensor quantized to NF4 as
 * bitsandbytes stores them (proto/nf4.h), dequantized.  packed: uint8 [(n + 1) / 2], two
 * 4-bit codes a byte, the first value in the high nibble.  Blocks of NF4_BLOCK (64) values
 * share an absmax (base/nf4_tables.h), blocks = ceil(n / 64):
 *   - nested_absmax NULL (single quantization): absmax is fp32 [blocks];
 *   - else (double quantization): absmax is uint8 [blocks], codes of the 8-bit dynamic map,
 *     and block b's absmax = NF4_DYNAMIC_MAP_VALUES[absmax[b]] * nested_absmax[b / 256] +
 *     offset, two fp32 roundings (bnb's dequantize_blockwise, then + offset); nested_absmax
 *     is fp32 [ceil(blocks / 256)].
 * Value i = NF4_CODE_VALUES[code i] * its block's absmax in fp32, then rounded once to the
 * compute dtype (bf16: nearest even; exact on the CPU), which is proto/nf4's nf4_dequantize.
 * QLoRA's frozen base (DESIGN.md, LoRA and QLoRA) runs it before each GEMM of a layer.
 * Every pointer is context memory; overwrites out. */
K_OP(nf4_dequant,
     (kctx *c, void *out, const uint8_t *packed, const void *absmax, const float *nested_absmax,
      float offset, size_t n),
     (c, out, packed, absmax, nested_absmax, offset, n))

/* ---- FP8 (F45; base/fp8.h: the formats, their rounding and the scale) ---- */

/* k_fp8_cast: in [rows, cols] (compute dtype) to fp8: out[i] = fp8_from_f32(in[i] * scale, fmt)
 * (the product in fp32, one rounding to fp8, saturating), scale = fp8_scale(amax, fmt) and
 * amax = max |in| (NaNs ignored) over the whole tensor (K_FP8_TENSORWISE) or over the row
 * (K_FP8_ROWWISE); scale_inv[0] (tensorwise) or scale_inv[r] (rowwise) = fp8_inverse_scale
 * (scale), what k_fp8_gemm multiplies by.  out: uint8 [rows * cols]; scale_inv: fp32 [1] or
 * [rows]; context memory; both overwritten. */
K_OP(fp8_cast,
     (kctx *c, uint8_t *out, float *scale_inv, const void *in, int rows, int cols, fp8_format fmt,
      k_fp8_scaling scaling),
     (c, out, scale_inv, in, rows, cols, fmt, scaling))
/* k_fp8_cast_t: k_fp8_cast of in's transpose: out [cols, rows], out[j, i] = fp8_from_f32(
 * in[i, j] * scale, fmt), amax over the whole tensor (K_FP8_TENSORWISE) or over each column of
 * in, a row of out (K_FP8_ROWWISE); scale_inv fp32 [1] or [cols].  The operands of the
 * backward's FP8 GEMMs (W^T for din, dout^T and in^T for dw: their contracting dimension is
 * the rows of what the forward holds). */
K_OP(fp8_cast_t,
     (kctx *c, uint8_t *out, float *scale_inv, const void *in, int rows, int cols, fp8_format fmt,
      k_fp8_scaling scaling),
     (c, out, scale_inv, in, rows, cols, fmt, scaling))
/* FP8 gathers (train.fp8_all_gather, worker/fsdp.c): a weight cast straight from its fp32
 * master shard, with a tensorwise scale fixed once a step over the whole tensor.
 * k_fp8_amax_f32: amax[0] = max |x[i]| over n values as the compute dtype holds them
 * (rounded as k_f32_to_compute rounds: bf16 on CUDA, fp32 itself on the CPU), NaNs ignored,
 * 0 when n is 0: k_fp8_cast's amax of the tensor that k_f32_to_compute(x) would give.  amax:
 * fp32 [1], context memory, overwritten. */
K_OP(fp8_amax_f32, (kctx *c, float *amax, const float *x, size_t n), (c, amax, x, n))
/* k_fp8_cast_f32: out[i] = fp8_from_f32(compute(x[i]) * scale[0], fmt), compute() the
 * rounding of k_fp8_amax_f32 and scale[0] (context memory) what fp8_scale gives: the codes
 * k_fp8_cast writes for k_f32_to_compute(x) under the same scale. */
K_OP(fp8_cast_f32, (kctx *c, uint8_t *out, const float *x, size_t n, const float *scale, fp8_format fmt),
     (c, out, x, n, scale, fmt))
/* k_fp8_transpose: out [cols, rows] = in [rows, cols]'s transpose, bytes (codes under one
 * tensorwise scale: the transposed cast's codes, without reading the compute dtype again). */
K_OP(fp8_transpose, (kctx *c, uint8_t *out, const uint8_t *in, int rows, int cols), (c, out, in, rows, cols))
/* k_fp8_gemm: out[M,N] (compute dtype, overwritten) = sa * sb * sum_k a[m,k] b[n,k], the "TN"
 * product of k_linear_fwd (a the input, b the weight, both K-contiguous) on fp8 codes, a in
 * format fa and b in fb (not both e5m2: cuBLASLt has no such product); sa, sb their inverse
 * scales (k_fp8_cast): a_scale_inv[0] and b_scale_inv[0] (K_FP8_TENSORWISE) or a_scale_inv[m]
 * and b_scale_inv[n] (K_FP8_ROWWISE).  Exact products, fp32 sums, the scaled sum rounded to
 * bf16 on either backend (the CPU stores the bf16 value in fp32).  CUDA (cuBLASLt) needs
 * K % 16 == 0 and N % 8 == 0 (16-byte leading dimensions) and 16-byte aligned a, b, out and
 * scales;
 * anything else fails, naming what. */
K_OP(fp8_gemm,
     (kctx *c, void *out, const uint8_t *a, const float *a_scale_inv, fp8_format fa,
      const uint8_t *b, const float *b_scale_inv, fp8_format fb, int M, int N, int K,
      k_fp8_scaling scaling),
     (c, out, a, a_scale_inv, fa, b, b_scale_inv, fb, M, N, K, scaling))

/* ---- cross-entropy ---- */

/* k_cross_entropy: targets[n] is the label for row n (already shifted) or K_IGNORE_INDEX.
 * *loss_sum (one fp32 in context memory) += sum of -log softmax(logits[n])[targets[n]]
 * over unmasked rows.  When dlogits is not NULL it receives
 * dscale * (softmax - onehot) for unmasked rows and 0 for masked ones; dlogits may be
 * the logits buffer itself (in place). */
K_OP(cross_entropy,
     (kctx *c, float *loss_sum, void *dlogits, const void *logits, const int32_t *targets, int N,
      int V, float dscale),
     (c, loss_sum, dlogits, logits, targets, N, V, dscale))

/* ---- AdamW (PyTorch semantics) over fp32 shards ---- */

/* k_adamw: g_eff = grad * grad_scale; p -= lr*wd*p; m = b1 m + (1-b1) g_eff;
 * v = b2 v + (1-b2) g_eff^2; p -= (lr / (1-b1^step)) * m / (sqrt(v)/sqrt(1-b2^step) + eps).
 * step counts from 1.  out: NULL, or [n] in the compute dtype that receives the new p as
 * k_f32_to_compute(out, p, n) would write it (fsdp's compute copies: the cast in the same
 * pass, not a second read of p). */
K_OP(adamw,
     (kctx *c, float *p, const float *grad, float *m, float *v, size_t n, float lr, float beta1,
      float beta2, float eps, float weight_decay, int step, float grad_scale, void *out),
     (c, p, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, step, grad_scale, out))

#undef K_OP
#undef K_OP_BY_HAND
