/* llama_generate: the decoding loop and the sampler, over any forward that runs new tokens
 * of rows through a KV cache (gen_model: the whole-model llama_decoder for fsdpctl generate;
 * the sharded model for samples during training).
 *
 * Prompts go in groups of the model's rows: each prompt's tokens in one pass of its own row
 * (its prefill), then one token a row a pass for the whole group until every row has stopped
 * (a stop id, max_new_tokens, or the row's last position).  Sampling follows transformers'
 * generate: the logits divided by the temperature, then top-k (the k largest logits kept,
 * ties at the k-th kept too), then top-p (the most probable tokens whose mass before them is
 * below p kept, at least one), and a draw from the softmax of what is left.  The uniform of
 * prompt i's new token t is rng_uniform(seed, stream(RNG_PURPOSE_SAMPLE, i), t): a sample is
 * a function of the seed, the prompt and the logits, whatever the batch. */
#ifndef FSDP_LLAMA_GENERATE_H
#define FSDP_LLAMA_GENERATE_H

#include <stddef.h>
#include <stdint.h>

#include "base/errbuf.h"

typedef struct gen_sampling {
    int greedy;         /* the argmax (the first of equal logits), as do_sample=False */
    double temperature; /* > 0 */
    double top_p;       /* (0, 1]; 1: off */
    int top_k;          /* >= 0; 0: off */
    uint64_t seed;
} gen_sampling;

/* Refuses a temperature <= 0 (or not finite) with sampling, top_p outside (0, 1] and a
 * negative top_k; the messages name the flag (--temperature, --top-p, --top-k). */
int gen_sampling_check(const gen_sampling *s, errbuf *err);

/* The distribution a sampled token is drawn from: probs[V] (double, summing to 1, zero for
 * the tokens top-k and top-p remove) from logits[V].  order: scratch int32 [V]. */
void gen_distribution(const gen_sampling *s, const float *logits, int V, double *probs,
                      int32_t *order);
/* One token: the argmax when greedy, else a draw from gen_distribution with uniform u in
 * [0, 1).  probs, order: scratch [V]. */
int32_t gen_pick(const gen_sampling *s, const float *logits, int V, double u, double *probs,
                 int32_t *order);

/* A forward over a KV cache: S new tokens (host [B*S]) of rows row0 .. row0+B-1 at positions
 * pos[b] .. pos[b]+S-1, the logits after each row's last one into logits (host fp32 [B, V]). */
typedef struct gen_model {
    void *self;
    int (*forward)(void *self, int row0, int B, int S, const int32_t *tokens,
                   const int32_t *pos, float *logits, errbuf *err);
    int vocab_size;
    int rows;          /* rows of its cache */
    int max_positions; /* positions a row */
} gen_model;

typedef struct gen_prompt {
    const int32_t *ids;
    int n;
} gen_prompt;

typedef enum gen_stop {
    GEN_STOP_ID = 1,     /* a stop id was generated (it is the reply's last token) */
    GEN_STOP_LENGTH,     /* max_new_tokens */
    GEN_STOP_POSITIONS,  /* the row's positions ran out */
} gen_stop;
const char *gen_stop_name(gen_stop s); /* "stop", "length", "positions" */

typedef struct gen_options {
    int max_new_tokens;
    const int32_t *stop_ids;
    int n_stop;
    gen_sampling sampling;
    /* Called for each new token as it comes (may be NULL); non-zero stops the run (that
     * return value). */
    int (*on_token)(void *user, int prompt, int32_t id);
    void *user;
} gen_options;

typedef struct gen_reply {
    int32_t *ids; /* malloc'd [n] */
    int n;
    gen_stop stop;
} gen_reply;

/* Generates a reply for each of the n prompts into replies[n] (free with gen_replies_free).
 * A prompt that is empty or needs more positions than the model has is an error naming it. */
int gen_run(const gen_model *m, const gen_prompt *prompts, int n, const gen_options *o,
            gen_reply *replies, errbuf *err);
void gen_replies_free(gen_reply *replies, int n);

#endif
