/* model_config: the Hugging Face config.json of a Llama-family decoder, read and written.
 *
 * Families (model_type): "llama" (or absent), "qwen2" (Qwen2 / Qwen2.5: bias on q, k and
 * v), "qwen3" (per-head RMSNorm q_norm / k_norm before RoPE, head_dim of its own) and
 * "mistral" (sliding_window: an int or null; absent is transformers' default 4096).
 * Qwen's own sliding window (use_sliding_window true, or a "sliding_attention" layer) is
 * refused as not built.
 *
 * RoPE comes in two spellings: older files carry top-level "rope_theta" and an optional
 * "rope_scaling" object; newer ones (transformers >= 5) carry "rope_parameters"
 * {"rope_theta", "rope_type", ...}.  Both are accepted; rope types "default", "llama3",
 * "linear" and "yarn" are supported (as transformers' modeling_rope_utils computes them)
 * and anything else is an error naming the type. */
#ifndef FSDP_MODEL_CONFIG_H
#define FSDP_MODEL_CONFIG_H

#include <stdint.h>

#include <jansson.h>

#include "base/errbuf.h"

#define LLAMA_MAX_EOS_IDS 16 /* a longer "eos_token_id" list is refused */

typedef enum rope_type { ROPE_DEFAULT, ROPE_LLAMA3, ROPE_LINEAR, ROPE_YARN } rope_type;

typedef struct rope_config {
    rope_type type;
    double theta;
    double factor; /* llama3, linear and yarn */
    /* llama3 */
    double low_freq_factor;
    double high_freq_factor;
    int original_max_position_embeddings; /* llama3 and yarn */
    /* yarn: beta_fast (default 32), beta_slow (1), truncate (true), and attention_factor,
     * which scales cos and sin (default from factor, mscale and mscale_all_dim; 0 here
     * when the file gives none, so that a saved file says what was read) */
    double beta_fast, beta_slow;
    int truncate;
    double attention_factor, mscale, mscale_all_dim;
} rope_config;

/* The decoder families (model_type). */
typedef enum llama_family {
    FAMILY_LLAMA, FAMILY_QWEN2, FAMILY_QWEN3, FAMILY_MISTRAL, FAMILY_COUNT
} llama_family;
/* "llama", "qwen2", ...; and the transformers class, "LlamaForCausalLM", ... */
const char *llama_family_model_type(llama_family f);
const char *llama_family_architecture(llama_family f);
/* The family of a model_type string (NULL: llama); -1 when it is none of ours. */
int llama_family_of(const char *model_type, llama_family *out);

typedef struct llama_config {
    llama_family family;
    int attention_bias; /* q, k and v projections with bias (qwen2) */
    int qk_norm;        /* q_norm and k_norm, RMSNorm weights [head_dim] (qwen3) */
    int sliding_window; /* a query sees the keys less than this far back; 0: all (mistral) */
    int hidden_size;
    int intermediate_size;
    int num_hidden_layers;
    int num_attention_heads;
    int num_key_value_heads; /* defaults to num_attention_heads */
    int head_dim;            /* defaults to hidden_size / num_attention_heads */
    int vocab_size;
    int max_position_embeddings;
    double rms_norm_eps;
    double initializer_range; /* default 0.02 */
    int tie_word_embeddings;  /* default false */
    int bos_token_id; /* -1 when absent or null */
    /* "eos_token_id" is an integer, null, or a list (Llama 3.1: [128001, 128008, 128009]).
     * eos_token_ids holds all of them (one for an integer, none for null or []),
     * eos_token_id the first (-1 when none), and eos_is_list says the file gave a list, so
     * llama_config_save writes back what was read: an integer stays an integer, a list a
     * list.  Code that sets eos_token_id by hand with eos_is_list 0 needs nothing else. */
    int eos_token_id;
    int eos_is_list;
    int n_eos_token_ids;
    int eos_token_ids[LLAMA_MAX_EOS_IDS];
    rope_config rope;
    char dtype[16]; /* "dtype" (or older "torch_dtype"), e.g. "bfloat16"; "" when absent */
} llama_config;

/* Parses config.json text; `name` is used in messages.  Checks the model_type (a family
 * above), positive sizes, heads dividing evenly (num_attention_heads % num_key_value_heads
 * == 0), no bias but Qwen2's (attention_bias / mlp_bias false), hidden_act silu. */
int llama_config_parse(llama_config *c, const char *json, size_t len, const char *name,
                       errbuf *err);
/* The same from a parsed JSON object (a config sent in a message). */
int llama_config_from_json(llama_config *c, const json_t *root, const char *name, errbuf *err);
/* config.json as transformers' config class of the family writes it (LlamaConfig,
 * Qwen2Config, ...: its model_type and architectures; a new reference, NULL when out of
 * memory); llama_config_from_json reads it back unchanged. */
json_t *llama_config_to_json(const llama_config *c);
/* Reads DIR/config.json (or a path to a .json file). */
int llama_config_load(llama_config *c, const char *path, errbuf *err);
/* Writes config.json in the newer spelling (rope_parameters), atomically. */
int llama_config_save(const llama_config *c, const char *path, errbuf *err);

/* The "eos_token_id" value to write: the list when the config gave one, else the integer
 * (null when -1).  New reference; NULL when out of memory. */
json_t *llama_config_eos_json(const llama_config *c);

/* The longest sequence the config's positions cover: max_position_embeddings, or what its RoPE
 * scaling stretches the original length to, factor x original_max_position_embeddings (llama3
 * and yarn, the types that name the length they were trained at; Qwen's 32k with yarn factor 4
 * covers 128k), whichever is longer.  linear names no original length: its
 * max_position_embeddings is taken as the scaled one (LongChat's 16384 with factor 8). */
int64_t llama_config_max_positions(const llama_config *c);
/* 0 when seq_len fits llama_config_max_positions; else an error naming both numbers, the
 * quantity ("what": "data.seq_len") and the config ("name": its path). */
int llama_config_check_seq_len(const llama_config *c, const char *what, int64_t seq_len, const char *name,
                               errbuf *err);

/* RoPE's attention factor, which multiplies cos and sin (so q.k by its square): yarn's
 * (given, or from factor, mscale and mscale_all_dim as transformers infers it), else 1. */
double rope_attention_factor(const rope_config *rope);

/* Parameter counting (HF names: model.embed_tokens.weight, model.layers.N.*, model.norm.weight,
 * lm_head.weight unless tied; Qwen2's q/k/v biases and Qwen3's q_norm/k_norm in the layers). */
uint64_t llama_config_num_params(const llama_config *c);
/* One decoder layer's (every layer alike). */
uint64_t llama_config_layer_params(const llama_config *c);

/* The HF parameter list of the model, in checkpoint order.  Fills up to max entries and
 * returns the total count (call with max 0 to size).  Shapes are [rows, cols] or [n]. */
typedef struct llama_param_info {
    char name[96];
    int ndim;
    int64_t shape[2];
    int layer;    /* -1 for embedding / final norm / head */
    int is_norm;  /* RMSNorm weights: initialised to 1, no weight decay in training */
    int is_bias;  /* biases: initialised to 0, no weight decay in training */
} llama_param_info;
int llama_config_params(const llama_config *c, llama_param_info *out, int max);

#endif
