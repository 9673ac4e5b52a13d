/* peft: PEFT LoRA adapter directories in and out.  See peft.h. */
#include "proto/peft.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fileio.h"
#include "base/path.h"
#include "proto/json_kind.h"
#include "proto/safetensors.h"

/* PEFT's default target_modules for Llama (TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING). */
#define LLAMA_DEFAULT_TARGETS ((1u << LORA_Q) | (1u << LORA_V))

/* ---- writing adapter_config.json ---- */

/* Keys PEFT 0.21 writes whose value here is always null, with the features they select. */
static const char *const null_keys[] = {
    "alora_invocation_tokens", "arrow_config", "auto_mapping", "corda_config", "eva_config",
    "exclude_modules", "kasa_config", "layer_replication", "layers_pattern",
    "layers_to_transform", "lora_ga_config", "megatron_config", "modules_to_save",
    "monteclora_config", "revision", "target_parameters", "trainable_token_indices",
    "use_bdlora", "velora_config"};
static const char *const false_keys[] = {"ensure_weight_tying", "fan_in_fan_out", "lora_bias",
                                         "use_dora", "use_qalora"};
static const char *const empty_object_keys[] = {"alpha_pattern", "loftq_config", "rank_pattern"};
#define COUNT(a) (sizeof (a) / sizeof (a)[0])

static json_t *targets_json(unsigned targets) {
    json_t *list = json_array();
    for (int m = 0; list && m < LORA_MODULES; m++)
        if ((targets & (1u << m)) && json_array_append_new(list, json_string(lora_module_name(m))))
            list = (json_decref(list), NULL);
    return list;
}

/* lora_alpha as PEFT writes it: an integer when it is one (LoraConfig's type is int). */
static json_t *alpha_json(double alpha) {
    return alpha == floor(alpha) && fabs(alpha) < 1e15 ? json_integer((json_int_t)alpha)
                                                        : json_real(alpha);
}

/* 0 when every set succeeded (json_object_set_new steals v even on failure). */
static int set(json_t *o, const char *key, json_t *v) {
    return !v || json_object_set_new(o, key, v);
}

static json_t *config_json(const lora_config *c, const char *base_model) {
    json_t *o = json_object();
    int bad = !o;
    for (size_t i = 0; !bad && i < COUNT(null_keys); i++) bad = set(o, null_keys[i], json_null());
    for (size_t i = 0; !bad && i < COUNT(false_keys); i++) bad = set(o, false_keys[i], json_false());
    for (size_t i = 0; !bad && i < COUNT(empty_object_keys); i++)
        bad = set(o, empty_object_keys[i], json_object());
    if (!bad)
        bad = set(o, "base_model_name_or_path", json_string(base_model)) ||
              set(o, "bias", json_string("none")) || set(o, "inference_mode", json_true()) ||
              set(o, "init_lora_weights", json_true()) ||
              set(o, "lora_alpha", alpha_json(c->alpha)) ||
              set(o, "lora_dropout", json_real(c->dropout)) ||
              set(o, "megatron_core", json_string("megatron.core")) ||
              set(o, "peft_type", json_string("LORA")) ||
              set(o, "peft_version", json_string(PEFT_VERSION)) ||
              set(o, "qalora_group_size", json_integer(16)) || set(o, "r", json_integer(c->rank)) ||
              set(o, "target_modules", targets_json(c->targets)) ||
              set(o, "task_type", json_string("CAUSAL_LM")) ||
              set(o, "use_rslora", json_boolean(c->rslora));
    if (bad) json_decref(o);
    return bad ? NULL : o;
}

char *peft_config_text(const lora_config *c, const char *base_model, errbuf *err) {
    json_t *o = config_json(c, base_model ? base_model : "");
    /* json.dumps(indent=2, sort_keys=True), as save_pretrained writes it */
    char *text = o ? json_dumps(o, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
    json_decref(o);
    size_t len = text ? strlen(text) : 0;
    char *with_newline = text ? realloc(text, len + 2) : NULL;
    if (!with_newline) {
        free(text);
        errf(err, "%s: out of memory", PEFT_CONFIG_NAME);
        return NULL;
    }
    memcpy(with_newline + len, "\n", 2);
    return with_newline;
}

int peft_write_config(const char *path, const lora_config *c, const char *base_model,
                      errbuf *err) {
    char *text = peft_config_text(c, base_model, err);
    if (!text) return errprefix(err, "%s", path);
    file_chunk chunk = {text, strlen(text)};
    int rc = file_write_atomic(path, &chunk, 1, err);
    free(text);
    return rc;
}

/* ---- reading adapter_config.json ---- */

/* Keys whose value selects a feature fsdpd does not build unless it is null, false, {} or []
 * (absent is the same); what the feature is, for the message. */
static const struct feature_key {
    const char *key, *feature;
} feature_keys[] = {
    {"use_dora", "DoRA"},
    {"fan_in_fan_out", "fan_in_fan_out (Conv1D-style transposed weights)"},
    {"rank_pattern", "a rank per module (rank_pattern)"},
    {"alpha_pattern", "an alpha per module (alpha_pattern)"},
    {"layers_to_transform", "adapting only some layers"},
    {"modules_to_save", "fully trained extra modules (modules_to_save)"},
    {"lora_bias", "a bias on lora_B"},
    {"use_qalora", "QALoRA"},
    {"layer_replication", "layer replication"},
    {"target_parameters", "adapting parameters (target_parameters)"},
    {"trainable_token_indices", "trainable tokens"},
    {"exclude_modules", "excluding modules"},
    {"alora_invocation_tokens", "activated LoRA (aLoRA)"},
    {"use_bdlora", "BD-LoRA"},
    {"megatron_config", "Megatron parallel linears"},
    {"arrow_config", "Arrow routing"},
    {"kasa_config", "KaSA"},
    {"monteclora_config", "MonteCLoRA"},
    {"velora_config", "VeLoRA"},
};

static int is_neutral(const json_t *v) {
    return !v || json_is_null(v) || json_is_false(v) ||
           (json_is_object(v) && json_object_size(v) == 0) ||
           (json_is_array(v) && json_array_size(v) == 0);
}

/* v as short JSON text for a message. */
static void short_text(const json_t *v, char *out, size_t n) {
    char *text = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    snprintf(out, n, "%s", text ? text : "?");
    if (text && strlen(text) >= n && n > 4) memcpy(out + n - 4, "...", 4);
    free(text);
}

static int refuse_features(const json_t *root, const char *name, errbuf *err) {
    char text[64];
    for (size_t i = 0; i < COUNT(feature_keys); i++) {
        const json_t *v = json_object_get(root, feature_keys[i].key);
        if (is_neutral(v)) continue;
        short_text(v, text, sizeof text);
        return errf(err, "%s: \"%s\": %s: %s is not built yet", name, feature_keys[i].key, text,
                    feature_keys[i].feature);
    }
    return 0;
}

/* A string key that must be one of the allowed values (absent and null allowed when
 * null_ok); anything else is "not built yet". */
static int check_choice(const json_t *root, const char *key, const char *const *allowed,
                        int null_ok, const char *what, const char *name, errbuf *err) {
    const json_t *v = json_object_get(root, key);
    if (!v || (null_ok && json_is_null(v))) return 0;
    for (; json_is_string(v) && *allowed; allowed++)
        if (strcmp(json_string_value(v), *allowed) == 0) return 0;
    char text[64];
    short_text(v, text, sizeof text);
    return errf(err, "%s: \"%s\": %s: not built yet (%s)", name, key, text, what);
}

static int read_peft_type(const json_t *root, const char *name, errbuf *err) {
    const json_t *v = json_object_get(root, "peft_type");
    if (!v) return errf(err, "%s: \"peft_type\": missing (expected \"LORA\")", name);
    if (!json_is_string(v)) return errf(err, "%s: \"peft_type\": %s, expected \"LORA\"", name, json_kind(v));
    if (strcmp(json_string_value(v), "LORA") != 0)
        return errf(err, "%s: \"peft_type\": \"%s\": not built yet (LORA only)", name,
                    json_string_value(v));
    return 0;
}

/* init_lora_weights: how the adapter was initialized; the ones that also change the base
 * weights (PiSSA, OLoRA, LoftQ, CorDA, EVA...) need that changed base, which is not the
 * model directory's. */
static int read_init(const json_t *root, const char *name, errbuf *err) {
    const json_t *v = json_object_get(root, "init_lora_weights");
    if (!v || json_is_boolean(v)) return 0;
    static const char *const allowed[] = {"gaussian", NULL};
    return check_choice(root, "init_lora_weights", allowed, 0,
                        "true, false or \"gaussian\": other inits change the base weights", name, err);
}

static int read_number(const json_t *root, const char *key, double dflt, double *out,
                       const char *name, errbuf *err) {
    const json_t *v = json_object_get(root, key);
    *out = dflt;
    if (!v) return 0;
    if (!json_is_number(v)) return errf(err, "%s: \"%s\": %s, expected a number", name, key, json_kind(v));
    *out = json_number_value(v);
    return 0;
}

static int read_rank(const json_t *root, lora_config *c, const char *name, errbuf *err) {
    const json_t *v = json_object_get(root, "r");
    c->rank = 8;
    if (!v) return 0;
    if (!json_is_integer(v)) return errf(err, "%s: \"r\": %s, expected an integer", name, json_kind(v));
    json_int_t r = json_integer_value(v);
    if (r < 1 || r > PEFT_MAX_RANK)
        return errf(err, "%s: \"r\": %lld, expected 1 to %d", name, (long long)r, PEFT_MAX_RANK);
    c->rank = (int)r;
    return 0;
}

static int read_numbers(const json_t *root, lora_config *c, const char *name, errbuf *err) {
    const json_t *rs = json_object_get(root, "use_rslora");
    if (read_rank(root, c, name, err) || read_number(root, "lora_alpha", 8, &c->alpha, name, err) ||
        read_number(root, "lora_dropout", 0, &c->dropout, name, err))
        return -1;
    if (!(c->alpha > 0) || !isfinite(c->alpha))
        return errf(err, "%s: \"lora_alpha\": %g, expected a positive number", name, c->alpha);
    if (!(c->dropout >= 0 && c->dropout < 1))
        return errf(err, "%s: \"lora_dropout\": %g, expected 0 <= dropout < 1", name, c->dropout);
    if (rs && !json_is_boolean(rs))
        return errf(err, "%s: \"use_rslora\": %s, expected true or false", name, json_kind(rs));
    c->rslora = rs && json_is_true(rs);
    return 0;
}

static int read_targets(const json_t *root, unsigned *targets, const char *name, errbuf *err) {
    const json_t *v = json_object_get(root, "target_modules");
    *targets = 0;
    if (!v || json_is_null(v)) {
        *targets = LLAMA_DEFAULT_TARGETS;
        return 0;
    }
    if (json_is_string(v)) {
        if (strcmp(json_string_value(v), "all-linear") == 0) {
            *targets = LORA_ALL_LINEAR;
            return 0;
        }
        return errf(err, "%s: \"target_modules\": \"%s\": a regular expression is not built yet "
                         "(a list of module names or \"all-linear\")", name, json_string_value(v));
    }
    if (!json_is_array(v) || json_array_size(v) == 0)
        return errf(err, "%s: \"target_modules\": %s, expected a list of module names or "
                         "\"all-linear\"", name, json_is_array(v) ? "an empty list" : json_kind(v));
    for (size_t i = 0; i < json_array_size(v); i++) {
        const json_t *e = json_array_get(v, i);
        int m = json_is_string(e) ? lora_module_from_name(json_string_value(e)) : -1;
        if (!json_is_string(e))
            return errf(err, "%s: \"target_modules\"[%zu]: %s, expected a module name", name, i, json_kind(e));
        if (m < 0)
            return errf(err, "%s: \"target_modules\": \"%s\": adapting that module is not built yet "
                             "(q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)",
                        name, json_string_value(e));
        *targets |= 1u << m;
    }
    return 0;
}

int peft_parse_config(lora_config *c, const char *text, size_t len, const char *name,
                      errbuf *err) {
    static const char *const bias_ok[] = {"none", NULL}, *const task_ok[] = {"CAUSAL_LM", NULL};
    json_error_t je;
    memset(c, 0, sizeof *c);
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) return errf(err, "%s: line %d: %s", name, je.line, je.text);
    int rc = 0;
    if (!json_is_object(root)) rc = errf(err, "%s: %s, expected an object", name, json_kind(root));
    if (rc == 0) rc = read_peft_type(root, name, err);
    if (rc == 0) rc = refuse_features(root, name, err);
    if (rc == 0) rc = check_choice(root, "bias", bias_ok, 0, "only \"none\"", name, err);
    if (rc == 0) rc = check_choice(root, "task_type", task_ok, 1, "only CAUSAL_LM", name, err);
    if (rc == 0) rc = read_init(root, name, err);
    if (rc == 0) rc = read_numbers(root, c, name, err);
    if (rc == 0) rc = read_targets(root, &c->targets, name, err);
    json_decref(root);
    return rc;
}

int peft_read_config(lora_config *c, const char *path, errbuf *err) {
    char *text;
    size_t len;
    if (file_read_all(path, PEFT_CONFIG_MAX, &text, &len, err)) return -1;
    int rc = peft_parse_config(c, text, len, path, err);
    free(text);
    return rc;
}

/* ---- adapter_model.safetensors ---- */

float **peft_units_new(const lora_layout *lo, errbuf *err) {
    float **units = calloc((size_t)lo->n_units, sizeof *units);
    for (int u = 0; units && u < lo->n_units; u++)
        if (!(units[u] = calloc(lo->units[u].numel ? lo->units[u].numel : 1, sizeof **units))) {
            peft_units_free(units, u);
            units = NULL;
        }
    if (!units) errf(err, "adapters: out of memory for %d layers", lo->n_units);
    return units;
}

void peft_units_free(float **units, int n_units) {
    for (int u = 0; units && u < n_units; u++) free(units[u]);
    free(units);
}

/* The layout's slot for a file's tensor, checked; NULL with the reason. */
static const llama_tensor_slot *slot_of(const lora_layout *lo, const st_tensor *t,
                                        const char *path, errbuf *err) {
    if (strstr(t->name, ".default.")) {
        errf(err, "%s: tensor %s: \".default\" is PEFT's in-memory adapter name, which saved "
                  "adapter files do not have (save_pretrained drops it)", path, t->name);
        return NULL;
    }
    const llama_tensor_slot *s = lora_layout_find(lo, t->name);
    if (!s) {
        errf(err, "%s: tensor %s: not one of this adapter's (rank %d on %d layers; "
                  "adapter_config.json's target_modules)", path, t->name, lo->cfg.rank, lo->n_layers);
        return NULL;
    }
    if (t->dtype != ST_F32 && t->dtype != ST_BF16 && t->dtype != ST_F16) {
        errf(err, "%s: tensor %s: dtype %s, expected F32, BF16 or F16", path, t->name,
             st_dtype_name(t->dtype));
        return NULL;
    }
    if (t->ndim != 2) {
        errf(err, "%s: tensor %s: %d dimension%s, expected [%lld, %lld]", path, t->name, t->ndim,
             t->ndim == 1 ? "" : "s", (long long)s->shape[0], (long long)s->shape[1]);
        return NULL;
    }
    if (t->shape[0] != s->shape[0] || t->shape[1] != s->shape[1]) {
        errf(err, "%s: tensor %s: shape [%lld, %lld], expected [%lld, %lld]", path, t->name,
             (long long)t->shape[0], (long long)t->shape[1], (long long)s->shape[0],
             (long long)s->shape[1]);
        return NULL;
    }
    return s;
}

int peft_read_weights(const char *path, const lora_layout *lo, float *const *units,
                      errbuf *err) {
    st_file f;
    if (st_open(&f, path, err)) return -1;
    unsigned char *seen = calloc((size_t)lo->n_tensors + 1, 1);
    int rc = seen ? 0 : errf(err, "%s: out of memory", path);
    for (int i = 0; rc == 0 && i < f.n_tensors; i++) {
        const llama_tensor_slot *s = slot_of(lo, &f.tensors[i], path, err);
        rc = s ? st_read_f32(&f.tensors[i], 0, s->numel, units[s->unit] + s->offset, err) : -1;
        if (rc == 0)
            rc = st_check_finite(units[s->unit] + s->offset, s->numel, 0, path, s->name,
                                 "a non-finite adapter is refused", err);
        if (rc == 0) seen[s - lo->tensors] = 1;
    }
    for (int i = 0; rc == 0 && i < lo->n_tensors; i++)
        if (!seen[i]) rc = errf(err, "%s: tensor %s: missing", path, lo->tensors[i].name);
    free(seen);
    st_close(&f);
    return rc;
}

static int cmp_wtensor_name(const void *a, const void *b) {
    return strcmp(((const st_wtensor *)a)->name, ((const st_wtensor *)b)->name);
}

int peft_write_weights(const char *path, const lora_layout *lo, const float *const *units,
                       errbuf *err) {
    st_wtensor *t = calloc((size_t)lo->n_tensors + 1, sizeof *t);
    if (!t) return errf(err, "%s: out of memory", path);
    for (int i = 0; i < lo->n_tensors; i++) {
        const llama_tensor_slot *s = &lo->tensors[i];
        t[i] = (st_wtensor){.name = s->name, .dtype = ST_F32, .ndim = 2,
                            .shape = {s->shape[0], s->shape[1]}, .data = units[s->unit] + s->offset};
    }
    qsort(t, (size_t)lo->n_tensors, sizeof *t, cmp_wtensor_name);
    int rc = st_write(path, t, lo->n_tensors, NULL, 0, err);
    free(t);
    return rc;
}

/* ---- the directory ---- */

int peft_load(const char *dir, const llama_config *mcfg, lora_layout *lo, float ***units,
              errbuf *err) {
    char path[PATH_BYTES];
    lora_config c;
    *units = NULL;
    if (path_join(path, PATH_BYTES, dir, PEFT_CONFIG_NAME, err) || peft_read_config(&c, path, err) ||
        lora_layout_init(lo, mcfg, &c, err))
        return -1;
    if (!(*units = peft_units_new(lo, err)) || path_join(path, PATH_BYTES, dir, PEFT_WEIGHTS_NAME, err) ||
        peft_read_weights(path, lo, *units, err)) {
        peft_units_free(*units, lo->n_units);
        *units = NULL;
        lora_layout_free(lo);
        return -1;
    }
    return 0;
}

int peft_save(const char *dir, const lora_layout *lo, const float *const *units,
              const char *base_model, errbuf *err) {
    char path[PATH_BYTES];
    if (path_join(path, PATH_BYTES, dir, PEFT_WEIGHTS_NAME, err) ||
        peft_write_weights(path, lo, units, err) ||
        path_join(path, PATH_BYTES, dir, PEFT_CONFIG_NAME, err))
        return -1;
    return peft_write_config(path, &lo->cfg, base_model, err);
}
