/* fsdp_generate: greedy (or sampled) replies through the sharded model, for samples during
 * training (train.sample_prompts): model/llama_generate's gen_run over a forward that gathers
 * each unit as a training forward does (fsdp_gather_unit: the embedding, each decoder layer,
 * the tied embedding again, the head; with LoRA or QLoRA a decoder layer's adapters merged into
 * a copy of its gathered, dequantized base), runs it on the new tokens (model/llama_decode's
 * llama_layer_decode, llama_head_logits) and drops it, so no rank ever holds the whole model:
 * only one or two units and the KV caches of the prompts.
 *
 * Every rank takes part in every gather, so every rank runs the same forwards: each decodes
 * every prompt, in one batch of rows (a prompt's prefill in its own row, then one token of
 * every row a pass).  The logits of each pass are rank 0's, broadcast: every rank then picks
 * the same tokens and stops at the same pass, whatever rounding a device's kernels do. */
#ifndef FSDP_FSDP_GENERATE_H
#define FSDP_FSDP_GENERATE_H

#include "base/errbuf.h"
#include "model/llama_generate.h"
#include "worker/fsdp.h"

/* Replies to the n prompts (gen_run's rules) into replies[n] (gen_replies_free).
 * Collective: every rank calls it with the same prompts and options. */
int fsdp_generate(fsdp *f, const gen_prompt *prompts, int n, const gen_options *o,
                  gen_reply *replies, errbuf *err);

#endif
