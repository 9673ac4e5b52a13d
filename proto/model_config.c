/* model_config: Hugging Face config.json read strictly and written; see model_config.h. */
#include "proto/model_config.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/fileio.h"
#include "base/path.h"
#include "proto/json_kind.h"

#define MAX_CONFIG_BYTES (16u << 20)
/* Bounds the parameter list (at most 14 per layer + 3) well inside an int. */
#define MAX_LAYERS 100000

/* ---- reading ------------------------------------------------------------------------ */

/* Where the values come from, for messages: the file name and the key's section
 * ("" at the top level, "rope_scaling." inside that object). */
typedef struct reader {
    const char *name;
    const char *section;
    errbuf *err;
} reader;

/* Looks key up.  Returns 1 with *v set when present and not null, 0 when absent or null
 * (an error when required), -1 on error. */
static int lookup(const reader *r, json_t *obj, const char *key, int required, json_t **v) {
    *v = json_object_get(obj, key);
    if (*v && !json_is_null(*v)) return 1;
    if (required && !*v)
        return errf(r->err, "%s: missing required key \"%s%s\"", r->name, r->section, key);
    if (required) return errf(r->err, "%s: \"%s%s\" is null", r->name, r->section, key);
    return 0;
}

static int type_error(const reader *r, const char *key, const char *want, const json_t *v) {
    return errf(r->err, "%s: \"%s%s\" must be %s, got %s", r->name, r->section, key, want,
                json_kind(v));
}

/* An integer key that must be positive; *out keeps its default when absent. */
static int read_size(const reader *r, json_t *obj, const char *key, int required, int *out) {
    json_t *v;
    int found = lookup(r, obj, key, required, &v);
    if (found <= 0) return found;
    if (!json_is_integer(v)) return type_error(r, key, "an integer", v);
    json_int_t n = json_integer_value(v);
    if (n <= 0 || n > INT_MAX)
        return errf(r->err,
                    "%s: \"%s%s\" must be a positive integer below 2^31, got %" JSON_INTEGER_FORMAT,
                    r->name, r->section, key, n);
    *out = (int)n;
    return 0;
}

static int read_number(const reader *r, json_t *obj, const char *key, int required,
                       double *out) {
    json_t *v;
    int found = lookup(r, obj, key, required, &v);
    if (found <= 0) return found;
    if (!json_is_number(v)) return type_error(r, key, "a number", v);
    *out = json_number_value(v);
    return 0;
}

static int read_bool(const reader *r, json_t *obj, const char *key, int *out) {
    json_t *v;
    int found = lookup(r, obj, key, 0, &v);
    if (found <= 0) return found;
    if (!json_is_boolean(v)) return type_error(r, key, "true or false", v);
    *out = json_is_true(v);
    return 0;
}

/* A string key; *out is NULL when absent or null. */
static int read_string(const reader *r, json_t *obj, const char *key, int required,
                       const char **out) {
    json_t *v;
    *out = NULL;
    int found = lookup(r, obj, key, required, &v);
    if (found <= 0) return found;
    if (!json_is_string(v)) return type_error(r, key, "a string", v);
    *out = json_string_value(v);
    return 0;
}

/* One token id: an integer from 0 to INT_MAX. */
static int read_id(const reader *r, const char *key, json_t *v, int *out) {
    if (!json_is_integer(v)) return type_error(r, key, "an integer or a list of integers", v);
    json_int_t id = json_integer_value(v);
    if (id < 0 || id > INT_MAX)
        return errf(r->err, "%s: \"%s\" token id %" JSON_INTEGER_FORMAT " out of range", r->name,
                    key, id);
    *out = (int)id;
    return 0;
}

/* bos: an integer or null; -1 when absent or null. */
static int read_token_id(const reader *r, json_t *obj, const char *key, int *out) {
    json_t *v;
    *out = -1;
    int found = lookup(r, obj, key, 0, &v);
    if (found <= 0) return found;
    return read_id(r, key, v, out);
}

/* eos: an integer, null, or a list of integers (Llama 3.1), every one kept (see the header). */
static int read_eos_ids(const reader *r, json_t *obj, llama_config *c) {
    json_t *v;
    c->eos_token_id = -1;
    c->eos_is_list = 0;
    c->n_eos_token_ids = 0;
    int found = lookup(r, obj, "eos_token_id", 0, &v);
    if (found <= 0) return found;
    if (!json_is_array(v)) {
        if (read_id(r, "eos_token_id", v, &c->eos_token_id) < 0) return -1;
        c->eos_token_ids[c->n_eos_token_ids++] = c->eos_token_id;
        return 0;
    }
    c->eos_is_list = 1;
    if (json_array_size(v) > LLAMA_MAX_EOS_IDS)
        return errf(r->err, "%s: \"eos_token_id\" lists %zu ids, more than %d", r->name,
                    json_array_size(v), LLAMA_MAX_EOS_IDS);
    for (size_t i = 0; i < json_array_size(v); i++)
        if (read_id(r, "eos_token_id", json_array_get(v, i), &c->eos_token_ids[c->n_eos_token_ids++]) < 0)
            return -1;
    if (c->n_eos_token_ids > 0) c->eos_token_id = c->eos_token_ids[0];
    return 0;
}

static const char *const family_types[FAMILY_COUNT] = {"llama", "qwen2", "qwen3", "mistral"};
static const char *const family_archs[FAMILY_COUNT] = {
    "LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM"};

const char *llama_family_model_type(llama_family f) {
    return f >= 0 && f < FAMILY_COUNT ? family_types[f] : "unknown";
}

const char *llama_family_architecture(llama_family f) {
    return f >= 0 && f < FAMILY_COUNT ? family_archs[f] : "unknown";
}

int llama_family_of(const char *model_type, llama_family *out) {
    *out = FAMILY_LLAMA;
    for (int f = 0; model_type && f < FAMILY_COUNT; f++)
        if (!strcmp(model_type, family_types[f])) {
            *out = (llama_family)f;
            return 0;
        }
    return model_type ? -1 : 0;
}

/* model_type: one of the families (absent: llama). */
static int read_family(const reader *r, json_t *root, llama_family *out) {
    const char *s;
    if (read_string(r, root, "model_type", 0, &s) < 0) return -1;
    if (llama_family_of(s, out) == 0) return 0;
    return errf(r->err, "%s: model_type \"%s\" is not supported (llama, qwen2, qwen3, mistral)",
                r->name, s);
}

/* Keys that select a different architecture than ours must hold our value if present. */
static int check_string_is(const reader *r, json_t *root, const char *key, const char *want) {
    const char *s;
    if (read_string(r, root, key, 0, &s) < 0) return -1;
    if (s && strcmp(s, want))
        return errf(r->err, "%s: %s \"%s\" is not supported (only \"%s\")", r->name, key, s,
                    want);
    return 0;
}

static int check_false(const reader *r, json_t *root, const char *key, const char *why) {
    int on = 0;
    if (read_bool(r, root, key, &on) < 0) return -1;
    if (on) return errf(r->err, "%s: %s true is not supported (%s)", r->name, key, why);
    return 0;
}

/* Qwen's sliding window (on the layers from max_window_layers) is not built: refused when
 * use_sliding_window is true or a layer_types entry is not "full_attention". */
static int check_qwen_full_attention(const reader *r, json_t *root) {
    int on = 0;
    if (read_bool(r, root, "use_sliding_window", &on) < 0) return -1;
    if (on) return errf(r->err, "%s: use_sliding_window true is not built yet", r->name);
    json_t *types = json_object_get(root, "layer_types");
    if (!types || json_is_null(types)) return 0;
    if (!json_is_array(types)) return type_error(r, "layer_types", "a list", types);
    for (size_t i = 0; i < json_array_size(types); i++) {
        const char *t = json_string_value(json_array_get(types, i));
        if (!t || strcmp(t, "full_attention"))
            return errf(r->err, "%s: layer_types[%zu] is %s, only \"full_attention\" is built",
                        r->name, i, t ? t : json_kind(json_array_get(types, i)));
    }
    return 0;
}

/* Mistral's sliding_window: an int, or null (none); absent is transformers' default 4096. */
static int read_mistral_window(const reader *r, json_t *root, int *window) {
    json_t *v = json_object_get(root, "sliding_window");
    *window = v ? 0 : 4096;
    return read_size(r, root, "sliding_window", 0, window);
}

/* What the family adds to Llama's layers, and the bias keys it must not set. */
static int read_family_keys(const reader *r, json_t *root, llama_config *c) {
    c->attention_bias = c->family == FAMILY_QWEN2;
    c->qk_norm = c->family == FAMILY_QWEN3;
    c->sliding_window = 0;
    const char *why = c->family == FAMILY_QWEN2 ? "Qwen2's o_proj has no bias" : "no bias in this family";
    if (c->family != FAMILY_QWEN2 && check_false(r, root, "attention_bias", why) < 0) return -1;
    if (check_false(r, root, "mlp_bias", "no bias in this family") < 0) return -1;
    if (c->family == FAMILY_QWEN2 || c->family == FAMILY_QWEN3)
        return check_qwen_full_attention(r, root);
    if (c->family == FAMILY_MISTRAL) return read_mistral_window(r, root, &c->sliding_window);
    return 0;
}

/* llama3's four scaling values. */
static int read_llama3(const reader *r, json_t *obj, rope_config *rope) {
    if (read_number(r, obj, "factor", 1, &rope->factor) < 0 ||
        read_number(r, obj, "low_freq_factor", 1, &rope->low_freq_factor) < 0 ||
        read_number(r, obj, "high_freq_factor", 1, &rope->high_freq_factor) < 0 ||
        read_size(r, obj, "original_max_position_embeddings", 1,
                  &rope->original_max_position_embeddings) < 0)
        return -1;
    /* The llama3 formula divides by these and by their difference. */
    if (!(rope->factor > 0) || !(rope->low_freq_factor > 0) ||
        !(rope->high_freq_factor > rope->low_freq_factor))
        return errf(r->err,
                    "%s: %sllama3 needs factor > 0 and high_freq_factor > low_freq_factor > 0 "
                    "(factor %g, low %g, high %g)",
                    r->name, r->section, rope->factor, rope->low_freq_factor,
                    rope->high_freq_factor);
    return 0;
}

/* yarn's values, defaults as transformers' _compute_yarn_parameters (original_max_position_
 * embeddings: max_position_embeddings, as standardize_rope_params sets it). */
static int read_yarn(const reader *r, json_t *obj, int max_positions, rope_config *rope) {
    rope->original_max_position_embeddings = max_positions;
    rope->beta_fast = 32;
    rope->beta_slow = 1;
    rope->truncate = 1;
    if (read_number(r, obj, "factor", 1, &rope->factor) < 0 ||
        read_size(r, obj, "original_max_position_embeddings", 0,
                  &rope->original_max_position_embeddings) < 0 ||
        read_number(r, obj, "beta_fast", 0, &rope->beta_fast) < 0 ||
        read_number(r, obj, "beta_slow", 0, &rope->beta_slow) < 0 ||
        read_bool(r, obj, "truncate", &rope->truncate) < 0 ||
        read_number(r, obj, "attention_factor", 0, &rope->attention_factor) < 0 ||
        read_number(r, obj, "mscale", 0, &rope->mscale) < 0 ||
        read_number(r, obj, "mscale_all_dim", 0, &rope->mscale_all_dim) < 0)
        return -1;
    if (!(rope->factor >= 1) || !(rope->beta_fast > 0) || !(rope->beta_slow > 0) ||
        !(rope->attention_factor >= 0))
        return errf(r->err,
                    "%s: %syarn needs factor >= 1, beta_fast and beta_slow > 0 and "
                    "attention_factor >= 0 (factor %g, beta_fast %g, beta_slow %g, "
                    "attention_factor %g)",
                    r->name, r->section, rope->factor, rope->beta_fast, rope->beta_slow,
                    rope->attention_factor);
    return 0;
}

/* rope_type (or the older "type") and its scaling values. */
static int read_rope_kind(const reader *r, json_t *obj, int max_positions, rope_config *rope) {
    const char *type;
    const char *key = json_object_get(obj, "type") && !json_object_get(obj, "rope_type")
                          ? "type"
                          : "rope_type";
    if (read_string(r, obj, key, 1, &type) < 0) return -1;
    if (!strcmp(type, "default")) {
        rope->type = ROPE_DEFAULT;
        return 0;
    }
    if (!strcmp(type, "llama3")) {
        rope->type = ROPE_LLAMA3;
        return read_llama3(r, obj, rope);
    }
    if (!strcmp(type, "yarn")) {
        rope->type = ROPE_YARN;
        return read_yarn(r, obj, max_positions, rope);
    }
    if (!strcmp(type, "linear")) {
        rope->type = ROPE_LINEAR;
        if (read_number(r, obj, "factor", 1, &rope->factor) < 0) return -1;
        if (!(rope->factor > 0))
            return errf(r->err, "%s: %slinear needs factor > 0, got %g", r->name, r->section,
                        rope->factor);
        return 0;
    }
    return errf(r->err,
                "%s: %s%s \"%s\" is not supported (only \"default\", \"llama3\", \"linear\" "
                "and \"yarn\")",
                r->name, r->section, key, type);
}

/* Newer files: "rope_parameters" {rope_theta, rope_type, ...}.  Older: top-level
 * "rope_theta" and an optional "rope_scaling" object. */
static int read_rope(const reader *top, json_t *root, int max_positions, rope_config *rope) {
    memset(rope, 0, sizeof *rope);
    rope->type = ROPE_DEFAULT;
    rope->theta = 10000.0;
    json_t *params = json_object_get(root, "rope_parameters");
    if (params && !json_is_null(params)) {
        if (!json_is_object(params)) return type_error(top, "rope_parameters", "an object", params);
        reader r = {top->name, "rope_parameters.", top->err};
        if (read_number(&r, params, "rope_theta", 0, &rope->theta) < 0 ||
            read_rope_kind(&r, params, max_positions, rope) < 0)
            return -1;
    } else {
        if (read_number(top, root, "rope_theta", 0, &rope->theta) < 0) return -1;
        json_t *scaling = json_object_get(root, "rope_scaling");
        if (scaling && !json_is_null(scaling)) {
            if (!json_is_object(scaling))
                return type_error(top, "rope_scaling", "an object", scaling);
            reader r = {top->name, "rope_scaling.", top->err};
            if (read_rope_kind(&r, scaling, max_positions, rope) < 0) return -1;
        }
    }
    if (!(rope->theta > 0))
        return errf(top->err, "%s: rope_theta must be positive, got %g", top->name, rope->theta);
    return 0;
}

static int read_dtype(const reader *r, json_t *root, char *out, size_t size) {
    const char *key = json_object_get(root, "torch_dtype") && !json_object_get(root, "dtype")
                          ? "torch_dtype"
                          : "dtype";
    const char *s;
    if (read_string(r, root, key, 0, &s) < 0) return -1;
    if (!s) return 0;
    if (strlen(s) >= size) return errf(r->err, "%s: %s \"%.40s\" is too long", r->name, key, s);
    strcpy(out, s);
    return 0;
}

static int read_config(llama_config *c, json_t *root, const reader *r) {
    if (!json_is_object(root))
        return errf(r->err, "%s: top level must be a JSON object, got %s", r->name,
                    json_kind(root));
    if (read_family(r, root, &c->family) < 0 ||
        check_string_is(r, root, "hidden_act", "silu") < 0 || read_family_keys(r, root, c) < 0)
        return -1;
    if (read_size(r, root, "hidden_size", 1, &c->hidden_size) < 0 ||
        read_size(r, root, "intermediate_size", 1, &c->intermediate_size) < 0 ||
        read_size(r, root, "num_hidden_layers", 1, &c->num_hidden_layers) < 0 ||
        read_size(r, root, "num_attention_heads", 1, &c->num_attention_heads) < 0 ||
        read_size(r, root, "vocab_size", 1, &c->vocab_size) < 0 ||
        read_size(r, root, "max_position_embeddings", 1, &c->max_position_embeddings) < 0)
        return -1;
    c->num_key_value_heads = c->num_attention_heads;
    c->head_dim = 0;
    c->initializer_range = 0.02;
    if (read_size(r, root, "num_key_value_heads", 0, &c->num_key_value_heads) < 0 ||
        read_size(r, root, "head_dim", 0, &c->head_dim) < 0 ||
        read_number(r, root, "rms_norm_eps", 1, &c->rms_norm_eps) < 0 ||
        read_number(r, root, "initializer_range", 0, &c->initializer_range) < 0 ||
        read_bool(r, root, "tie_word_embeddings", &c->tie_word_embeddings) < 0 ||
        read_token_id(r, root, "bos_token_id", &c->bos_token_id) < 0 ||
        read_eos_ids(r, root, c) < 0 ||
        read_dtype(r, root, c->dtype, sizeof c->dtype) < 0 ||
        read_rope(r, root, c->max_position_embeddings, &c->rope) < 0)
        return -1;
    return 0;
}

static int validate(llama_config *c, const char *name, errbuf *err) {
    if (c->num_hidden_layers > MAX_LAYERS)
        return errf(err, "%s: num_hidden_layers %d is above the limit of %d", name,
                    c->num_hidden_layers, MAX_LAYERS);
    if (c->num_attention_heads % c->num_key_value_heads)
        return errf(err,
                    "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d",
                    name, c->num_attention_heads, c->num_key_value_heads);
    if (!c->head_dim) {
        if (c->hidden_size % c->num_attention_heads)
            return errf(err,
                        "%s: hidden_size %d is not a multiple of num_attention_heads %d and "
                        "head_dim is not given",
                        name, c->hidden_size, c->num_attention_heads);
        c->head_dim = c->hidden_size / c->num_attention_heads;
    }
    if (!(c->rms_norm_eps > 0))
        return errf(err, "%s: rms_norm_eps must be positive, got %g", name, c->rms_norm_eps);
    if (!(c->initializer_range >= 0))
        return errf(err, "%s: initializer_range must not be negative, got %g", name,
                    c->initializer_range);
    return 0;
}

int llama_config_from_json(llama_config *c, const json_t *root, const char *name, errbuf *err) {
    llama_config parsed = {0};
    reader r = {name, "", err};
    if (read_config(&parsed, (json_t *)root, &r) < 0 || validate(&parsed, name, err) < 0) return -1;
    *c = parsed;
    return 0;
}

int llama_config_parse(llama_config *c, const char *json, size_t len, const char *name,
                       errbuf *err) {
    json_error_t jerr;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return errf(err, "%s: invalid JSON at line %d column %d: %s", name, jerr.line,
                    jerr.column, jerr.text);
    int rc = llama_config_from_json(c, root, name, err);
    json_decref(root);
    return rc;
}

int llama_config_load(llama_config *c, const char *path, errbuf *err) {
    char file[PATH_BYTES];
    struct stat st;
    int is_dir = stat(path, &st) == 0 && S_ISDIR(st.st_mode);
    int n = snprintf(file, sizeof file, is_dir ? "%s/config.json" : "%s", path);
    if (n < 0 || (size_t)n >= sizeof file) return errf(err, "%s: path too long", path);
    char *text;
    size_t len;
    if (file_read_all(file, MAX_CONFIG_BYTES, &text, &len, err) < 0) return -1;
    int rc = llama_config_parse(c, text, len, file, err);
    free(text);
    return rc;
}

/* ---- writing ------------------------------------------------------------------------ */

static json_t *token_json(int id) { return id < 0 ? json_null() : json_integer(id); }

json_t *llama_config_eos_json(const llama_config *c) {
    if (!c->eos_is_list) return token_json(c->eos_token_id);
    json_t *list = json_array();
    for (int i = 0; list && i < c->n_eos_token_ids; i++)
        if (json_array_append_new(list, json_integer(c->eos_token_ids[i])))
            list = (json_decref(list), NULL);
    return list;
}

static const char *const rope_names[] = {"default", "llama3", "linear", "yarn"};

static json_t *rope_json(const rope_config *rope) {
    json_t *o = json_object();
    if (!o) return NULL;
    int failed = json_object_set_new(o, "rope_theta", json_real(rope->theta));
    failed |= json_object_set_new(o, "rope_type", json_string(rope_names[rope->type]));
    if (rope->type != ROPE_DEFAULT) failed |= json_object_set_new(o, "factor", json_real(rope->factor));
    if (rope->type == ROPE_LLAMA3) {
        failed |= json_object_set_new(o, "low_freq_factor", json_real(rope->low_freq_factor));
        failed |= json_object_set_new(o, "high_freq_factor", json_real(rope->high_freq_factor));
    }
    if (rope->type == ROPE_LLAMA3 || rope->type == ROPE_YARN)
        failed |= json_object_set_new(o, "original_max_position_embeddings",
                                      json_integer(rope->original_max_position_embeddings));
    if (rope->type == ROPE_YARN) {
        failed |= json_object_set_new(o, "beta_fast", json_real(rope->beta_fast));
        failed |= json_object_set_new(o, "beta_slow", json_real(rope->beta_slow));
        failed |= json_object_set_new(o, "truncate", json_boolean(rope->truncate));
        /* only what the file gave: 0 means "infer", as an absent key does */
        if (rope->attention_factor > 0)
            failed |= json_object_set_new(o, "attention_factor", json_real(rope->attention_factor));
        if (rope->mscale != 0) failed |= json_object_set_new(o, "mscale", json_real(rope->mscale));
        if (rope->mscale_all_dim != 0)
            failed |= json_object_set_new(o, "mscale_all_dim", json_real(rope->mscale_all_dim));
    }
    if (failed) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* yarn's get_mscale. */
static double yarn_mscale(double scale, double mscale) {
    return scale <= 1 ? 1.0 : 0.1 * mscale * log(scale) + 1.0;
}

double rope_attention_factor(const rope_config *rope) {
    if (rope->type != ROPE_YARN) return 1.0;
    if (rope->attention_factor > 0) return rope->attention_factor;
    if (rope->mscale != 0 && rope->mscale_all_dim != 0)
        return yarn_mscale(rope->factor, rope->mscale) / yarn_mscale(rope->factor, rope->mscale_all_dim);
    return yarn_mscale(rope->factor, 1.0);
}

int64_t llama_config_max_positions(const llama_config *c) {
    const rope_config *r = &c->rope;
    int64_t scaled = 0;
    if (r->type == ROPE_LLAMA3 || r->type == ROPE_YARN)
        scaled = (int64_t)(r->factor * r->original_max_position_embeddings);
    return scaled > c->max_position_embeddings ? scaled : c->max_position_embeddings;
}

int llama_config_check_seq_len(const llama_config *c, const char *what, int64_t seq_len, const char *name,
                               errbuf *err) {
    int64_t covered = llama_config_max_positions(c);
    if (seq_len <= covered) return 0;
    return errf(err,
                "%s %lld is longer than the %lld positions %s covers "
                "(max_position_embeddings %d, rope_type %s): give config.json a rope_scaling that "
                "covers it (yarn or llama3: factor x original_max_position_embeddings >= %lld)",
                what, (long long)seq_len, (long long)covered, name, c->max_position_embeddings,
                rope_names[c->rope.type], (long long)seq_len);
}

/* The keys a family's config class adds to Llama's (or has instead of them). */
static int family_json(const llama_config *c, json_t *o) {
    int failed = 0;
    if (c->family == FAMILY_LLAMA) {
        failed |= json_object_set_new(o, "attention_bias", json_false());
        failed |= json_object_set_new(o, "pretraining_tp", json_integer(1));
    }
    if (c->family == FAMILY_QWEN3) failed |= json_object_set_new(o, "attention_bias", json_false());
    if (c->family != FAMILY_QWEN2 && c->family != FAMILY_QWEN3) {
        failed |= json_object_set_new(o, "mlp_bias", json_false());
    } else {
        failed |= json_object_set_new(o, "use_sliding_window", json_false());
        failed |= json_object_set_new(o, "max_window_layers", json_integer(c->num_hidden_layers));
    }
    if (c->family != FAMILY_LLAMA)
        failed |= json_object_set_new(o, "sliding_window", c->sliding_window
                                                               ? json_integer(c->sliding_window)
                                                               : json_null());
    return failed;
}

/* The keys transformers' config class of the family writes, so AutoConfig/AutoModel load
 * the file as that class. */
json_t *llama_config_to_json(const llama_config *c) {
    json_t *o = json_object();
    if (!o) return NULL;
    int failed = 0;
    failed |= json_object_set_new(o, "architectures", json_pack("[s]", llama_family_architecture(c->family)));
    failed |= json_object_set_new(o, "model_type", json_string(llama_family_model_type(c->family)));
    failed |= json_object_set_new(o, "hidden_act", json_string("silu"));
    failed |= family_json(c, o);
    failed |= json_object_set_new(o, "attention_dropout", json_real(0.0));
    failed |= json_object_set_new(o, "use_cache", json_false());
    failed |= json_object_set_new(o, "pad_token_id", json_null());
    failed |= json_object_set_new(o, "hidden_size", json_integer(c->hidden_size));
    failed |= json_object_set_new(o, "intermediate_size", json_integer(c->intermediate_size));
    failed |= json_object_set_new(o, "num_hidden_layers", json_integer(c->num_hidden_layers));
    failed |= json_object_set_new(o, "num_attention_heads", json_integer(c->num_attention_heads));
    failed |= json_object_set_new(o, "num_key_value_heads", json_integer(c->num_key_value_heads));
    failed |= json_object_set_new(o, "head_dim", json_integer(c->head_dim));
    failed |= json_object_set_new(o, "vocab_size", json_integer(c->vocab_size));
    failed |= json_object_set_new(o, "max_position_embeddings",
                                  json_integer(c->max_position_embeddings));
    failed |= json_object_set_new(o, "rms_norm_eps", json_real(c->rms_norm_eps));
    failed |= json_object_set_new(o, "initializer_range", json_real(c->initializer_range));
    failed |= json_object_set_new(o, "tie_word_embeddings", json_boolean(c->tie_word_embeddings));
    failed |= json_object_set_new(o, "bos_token_id", token_json(c->bos_token_id));
    failed |= json_object_set_new(o, "eos_token_id", llama_config_eos_json(c));
    failed |= json_object_set_new(o, "rope_parameters", rope_json(&c->rope));
    if (c->dtype[0]) { /* "dtype" for transformers >= 4.56, "torch_dtype" for older */
        failed |= json_object_set_new(o, "dtype", json_string(c->dtype));
        failed |= json_object_set_new(o, "torch_dtype", json_string(c->dtype));
    }
    if (failed) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* JSON_REAL_PRECISION for the reals: 15 significant digits print the values configs hold
 * (1e-5, 0.02, 500000.0) plainly, where jansson's default of 17 would write
 * 1.0000000000000001e-05; more digits only when a value needs them to come back exact. */
static int real_precision(const llama_config *c) {
    const double reals[] = {c->rms_norm_eps,         c->initializer_range,
                            c->rope.theta,           c->rope.factor,
                            c->rope.low_freq_factor, c->rope.high_freq_factor,
                            c->rope.beta_fast,       c->rope.beta_slow,
                            c->rope.attention_factor, c->rope.mscale,
                            c->rope.mscale_all_dim};
    for (int digits = 15; digits < 17; digits++) {
        int exact = 1;
        for (size_t i = 0; i < sizeof reals / sizeof reals[0] && exact; i++) {
            char s[32];
            snprintf(s, sizeof s, "%.*g", digits, reals[i]);
            exact = strtod(s, NULL) == reals[i];
        }
        if (exact) return digits;
    }
    return 17;
}

int llama_config_save(const llama_config *c, const char *path, errbuf *err) {
    json_t *root = llama_config_to_json(c);
    if (!root) return errf(err, "%s: out of memory building config.json", path);
    size_t flags = JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(real_precision(c));
    char *text = json_dumps(root, flags);
    json_decref(root);
    if (!text) return errf(err, "%s: out of memory formatting config.json", path);
    file_chunk chunks[] = {{text, strlen(text)}, {"\n", 1}}; /* HF ends the file with one */
    int rc = file_write_atomic(path, chunks, 2, err);
    free(text);
    return rc;
}

/* ---- parameters --------------------------------------------------------------------- */

typedef enum dim { DIM_NONE, DIM_HIDDEN, DIM_FFN, DIM_Q, DIM_KV, DIM_VOCAB, DIM_HEAD } dim;

/* Which configs have a tensor. */
typedef enum need { NEED_ALWAYS, NEED_BIAS, NEED_QK_NORM } need;

/* One decoder layer, in checkpoint order (= the FSDP flat order, DESIGN.md): Llama's nine,
 * then the families' extras (model_layout.h). */
static const struct layer_param {
    const char *name;
    dim rows, cols; /* cols DIM_NONE: a vector */
    need when;
    int is_bias;
} layer_params[] = {
    {"self_attn.q_proj.weight", DIM_Q, DIM_HIDDEN, NEED_ALWAYS, 0},
    {"self_attn.k_proj.weight", DIM_KV, DIM_HIDDEN, NEED_ALWAYS, 0},
    {"self_attn.v_proj.weight", DIM_KV, DIM_HIDDEN, NEED_ALWAYS, 0},
    {"self_attn.o_proj.weight", DIM_HIDDEN, DIM_Q, NEED_ALWAYS, 0},
    {"mlp.gate_proj.weight", DIM_FFN, DIM_HIDDEN, NEED_ALWAYS, 0},
    {"mlp.up_proj.weight", DIM_FFN, DIM_HIDDEN, NEED_ALWAYS, 0},
    {"mlp.down_proj.weight", DIM_HIDDEN, DIM_FFN, NEED_ALWAYS, 0},
    {"input_layernorm.weight", DIM_HIDDEN, DIM_NONE, NEED_ALWAYS, 0},
    {"post_attention_layernorm.weight", DIM_HIDDEN, DIM_NONE, NEED_ALWAYS, 0},
    {"self_attn.q_proj.bias", DIM_Q, DIM_NONE, NEED_BIAS, 1},
    {"self_attn.k_proj.bias", DIM_KV, DIM_NONE, NEED_BIAS, 1},
    {"self_attn.v_proj.bias", DIM_KV, DIM_NONE, NEED_BIAS, 1},
    {"self_attn.q_norm.weight", DIM_HEAD, DIM_NONE, NEED_QK_NORM, 0},
    {"self_attn.k_norm.weight", DIM_HEAD, DIM_NONE, NEED_QK_NORM, 0},
};
#define LAYER_PARAMS (int)(sizeof layer_params / sizeof layer_params[0])

static int has_param(const llama_config *c, need when) {
    return when == NEED_ALWAYS || (when == NEED_BIAS && c->attention_bias) ||
           (when == NEED_QK_NORM && c->qk_norm);
}

static int64_t dim_size(const llama_config *c, dim d) {
    switch (d) {
    case DIM_NONE: return 1;
    case DIM_HIDDEN: return c->hidden_size;
    case DIM_FFN: return c->intermediate_size;
    case DIM_Q: return (int64_t)c->num_attention_heads * c->head_dim;
    case DIM_KV: return (int64_t)c->num_key_value_heads * c->head_dim;
    case DIM_VOCAB: return c->vocab_size;
    case DIM_HEAD: return c->head_dim;
    }
    return 0;
}

/* Appends one entry when it fits; always counts it. */
static void add_param(const llama_config *c, llama_param_info *out, int max, int *n, int layer,
                      const char *name, dim rows, dim cols, int is_bias) {
    if (*n < max) {
        llama_param_info *p = &out[*n];
        if (layer < 0)
            snprintf(p->name, sizeof p->name, "%s", name);
        else
            snprintf(p->name, sizeof p->name, "model.layers.%d.%s", layer, name);
        p->ndim = cols == DIM_NONE ? 1 : 2;
        p->shape[0] = dim_size(c, rows);
        p->shape[1] = cols == DIM_NONE ? 0 : dim_size(c, cols);
        p->layer = layer;
        p->is_bias = is_bias;
        p->is_norm = cols == DIM_NONE && !is_bias;
    }
    (*n)++;
}

int llama_config_params(const llama_config *c, llama_param_info *out, int max) {
    int n = 0;
    add_param(c, out, max, &n, -1, "model.embed_tokens.weight", DIM_VOCAB, DIM_HIDDEN, 0);
    for (int l = 0; l < c->num_hidden_layers; l++)
        for (int i = 0; i < LAYER_PARAMS; i++)
            if (has_param(c, layer_params[i].when))
                add_param(c, out, max, &n, l, layer_params[i].name, layer_params[i].rows,
                          layer_params[i].cols, layer_params[i].is_bias);
    add_param(c, out, max, &n, -1, "model.norm.weight", DIM_HIDDEN, DIM_NONE, 0);
    if (!c->tie_word_embeddings)
        add_param(c, out, max, &n, -1, "lm_head.weight", DIM_VOCAB, DIM_HIDDEN, 0);
    return n;
}

uint64_t llama_config_layer_params(const llama_config *c) {
    uint64_t layer = 0;
    for (int i = 0; i < LAYER_PARAMS; i++)
        if (has_param(c, layer_params[i].when))
            layer += (uint64_t)dim_size(c, layer_params[i].rows) *
                     (uint64_t)dim_size(c, layer_params[i].cols);
    return layer;
}

uint64_t llama_config_num_params(const llama_config *c) {
    uint64_t embed = (uint64_t)dim_size(c, DIM_VOCAB) * (uint64_t)dim_size(c, DIM_HIDDEN);
    uint64_t layer = llama_config_layer_params(c);
    uint64_t total = embed + layer * (uint64_t)c->num_hidden_layers + (uint64_t)c->hidden_size;
    return c->tie_word_embeddings ? total : total + embed;
}
