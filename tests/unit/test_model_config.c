/* Tests of proto/model_config: the golden model's config against its checkpoint, every
 * file in configs/models, both RoPE spellings, defaults, save -> load round trips, and
 * every rejection path.  Run from the repository root (tests/run.sh does). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "proto/model_config.h"
#include "proto/safetensors.h"
#include "tests/unit/fixtures.h"

/* ---------- helpers ---------- */

static void load_ok(llama_config *c, const char *path) {
    errbuf err = {{0}};
    if (llama_config_load(c, path, &err) < 0) fail_msg("%s", err.msg);
}

static int parse_text(llama_config *c, const char *json, errbuf *err) {
    return llama_config_parse(c, json, strlen(json), "test.json", err);
}

/* A small valid config. */
static const char *base_json =
    "{\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": 172,"
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
    " \"vocab_size\": 211, \"max_position_embeddings\": 64, \"rms_norm_eps\": 1e-5}";

/* Parses base_json with key set to value (JSON text), or removed when value is NULL. */
static int parse_with(llama_config *c, const char *key, const char *value, errbuf *err) {
    json_t *root = json_loads(base_json, 0, NULL);
    assert_non_null(root);
    if (value) {
        json_t *v = json_loads(value, JSON_DECODE_ANY, NULL);
        assert_non_null(v);
        assert_int_equal(json_object_set_new(root, key, v), 0);
    } else {
        assert_int_equal(json_object_del(root, key), 0);
    }
    char *text = json_dumps(root, 0);
    json_decref(root);
    assert_non_null(text);
    int rc = parse_text(c, text, err);
    free(text);
    return rc;
}

static void assert_configs_equal(const llama_config *a, const llama_config *b) {
    assert_int_equal(a->hidden_size, b->hidden_size);
    assert_int_equal(a->intermediate_size, b->intermediate_size);
    assert_int_equal(a->num_hidden_layers, b->num_hidden_layers);
    assert_int_equal(a->num_attention_heads, b->num_attention_heads);
    assert_int_equal(a->num_key_value_heads, b->num_key_value_heads);
    assert_int_equal(a->head_dim, b->head_dim);
    assert_int_equal(a->vocab_size, b->vocab_size);
    assert_int_equal(a->max_position_embeddings, b->max_position_embeddings);
    assert_true(a->rms_norm_eps == b->rms_norm_eps);
    assert_true(a->initializer_range == b->initializer_range);
    assert_int_equal(a->tie_word_embeddings, b->tie_word_embeddings);
    assert_int_equal(a->bos_token_id, b->bos_token_id);
    assert_int_equal(a->eos_token_id, b->eos_token_id);
    assert_int_equal(a->eos_is_list, b->eos_is_list);
    assert_int_equal(a->n_eos_token_ids, b->n_eos_token_ids);
    for (int i = 0; i < a->n_eos_token_ids; i++)
        assert_int_equal(a->eos_token_ids[i], b->eos_token_ids[i]);
    assert_string_equal(a->dtype, b->dtype);
    assert_int_equal(a->family, b->family);
    assert_int_equal(a->attention_bias, b->attention_bias);
    assert_int_equal(a->qk_norm, b->qk_norm);
    assert_int_equal(a->sliding_window, b->sliding_window);
    assert_int_equal(a->rope.type, b->rope.type);
    assert_true(a->rope.theta == b->rope.theta);
    if (a->rope.type == ROPE_LINEAR || a->rope.type == ROPE_YARN)
        assert_true(a->rope.factor == b->rope.factor);
    if (a->rope.type == ROPE_YARN) {
        assert_int_equal(a->rope.original_max_position_embeddings,
                         b->rope.original_max_position_embeddings);
        assert_true(a->rope.beta_fast == b->rope.beta_fast);
        assert_true(a->rope.beta_slow == b->rope.beta_slow);
        assert_int_equal(a->rope.truncate, b->rope.truncate);
        assert_true(a->rope.attention_factor == b->rope.attention_factor);
        assert_true(a->rope.mscale == b->rope.mscale);
        assert_true(a->rope.mscale_all_dim == b->rope.mscale_all_dim);
    }
    if (a->rope.type == ROPE_LLAMA3) {
        assert_true(a->rope.factor == b->rope.factor);
        assert_true(a->rope.low_freq_factor == b->rope.low_freq_factor);
        assert_true(a->rope.high_freq_factor == b->rope.high_freq_factor);
        assert_int_equal(a->rope.original_max_position_embeddings,
                         b->rope.original_max_position_embeddings);
    }
}

/* ---------- the golden model ---------- */

static void test_golden_config_matches_checkpoint(void **state) {
    (void)state;
    char dir[4096], file[4200];
    fixture_path(dir, sizeof dir, "golden/tiny-mha");
    llama_config c;
    load_ok(&c, dir); /* a directory: reads dir/config.json */
    assert_int_equal(c.hidden_size, 64);
    assert_int_equal(c.intermediate_size, 172);
    assert_int_equal(c.num_hidden_layers, 2);
    assert_int_equal(c.num_attention_heads, 4);
    assert_int_equal(c.num_key_value_heads, 4);
    assert_int_equal(c.head_dim, 16);
    assert_int_equal(c.vocab_size, 211);
    assert_int_equal(c.max_position_embeddings, 64);
    assert_true(c.rms_norm_eps == 1e-5);
    assert_true(c.initializer_range == 0.02);
    assert_int_equal(c.tie_word_embeddings, 0);
    assert_int_equal(c.bos_token_id, 1);
    assert_int_equal(c.eos_token_id, 2);
    assert_string_equal(c.dtype, "float32");
    assert_int_equal(c.rope.type, ROPE_DEFAULT);
    assert_true(c.rope.theta == 10000.0);

    /* Every parameter the config lists is in the checkpoint with that shape, and nothing
     * else is: the counts agree with the file. */
    snprintf(file, sizeof file, "%s/model.safetensors", dir);
    st_file f;
    errbuf err = {{0}};
    if (st_open(&f, file, &err) < 0) fail_msg("%s", err.msg);
    int n = llama_config_params(&c, NULL, 0);
    assert_int_equal(n, 21);
    assert_int_equal(n, f.n_tensors);
    llama_param_info *p = calloc((size_t)n, sizeof *p);
    assert_non_null(p);
    assert_int_equal(llama_config_params(&c, p, n), n);
    uint64_t numel = 0;
    for (int i = 0; i < f.n_tensors; i++) numel += f.tensors[i].numel;
    for (int i = 0; i < n; i++) {
        const st_tensor *t = st_find(&f, p[i].name);
        if (!t) fail_msg("%s not in the golden checkpoint", p[i].name);
        assert_int_equal(t->ndim, p[i].ndim);
        for (int d = 0; d < p[i].ndim; d++) assert_int_equal(t->shape[d], p[i].shape[d]);
    }
    assert_int_equal(llama_config_num_params(&c), numel);
    assert_int_equal(numel, 126144);
    free(p);
    st_close(&f);
}

/* ---------- configs/models ---------- */

static void test_every_model_file_parses(void **state) {
    (void)state;
    DIR *d = opendir("configs/models");
    assert_non_null(d);
    int files = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len < 5 || strcmp(e->d_name + len - 5, ".json")) continue;
        char path[512];
        snprintf(path, sizeof path, "configs/models/%s", e->d_name);
        llama_config c;
        load_ok(&c, path);
        assert_true(llama_config_num_params(&c) > 0);
        files++;
    }
    closedir(d);
    assert_true(files >= 14);
}

static void test_model_file_values(void **state) {
    (void)state;
    static const struct {
        const char *file;
        uint64_t params; /* the published counts */
        int kv_heads, head_dim;
    } models[] = {
        {"configs/models/tiny.json", 19286272, 4, 32},
        {"configs/models/llama-1.1b.json", 1100048384, 4, 64},
        {"configs/models/llama2-7b.json", 6738415616, 32, 128},
        {"configs/models/llama2-13b.json", 13015864320, 40, 128},
        {"configs/models/llama2-70b.json", 68976648192, 8, 128},
        {"configs/models/llama3.1-8b.json", 8030261248, 8, 128},
        {"configs/models/llama3.1-70b.json", 70553706496, 8, 128},
        {"configs/models/qwen2.5-7b.json", 7615616512, 4, 128},
        {"configs/models/qwen2.5-14b.json", 14770033664, 8, 128},
        {"configs/models/qwen2.5-32b.json", 32763876352, 8, 128},
        {"configs/models/qwen2.5-72b.json", 72706203648, 8, 128},
        {"configs/models/qwen3-8b.json", 8190735360, 8, 128},
        {"configs/models/qwen3-32b.json", 32762123264, 8, 128},
        {"configs/models/mistral-7b-v0.3.json", 7248023552, 8, 128},
    };
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        llama_config c;
        load_ok(&c, models[i].file);
        if (llama_config_num_params(&c) != models[i].params)
            fail_msg("%s: %llu parameters, expected %llu", models[i].file,
                     (unsigned long long)llama_config_num_params(&c),
                     (unsigned long long)models[i].params);
        assert_int_equal(c.num_key_value_heads, models[i].kv_heads);
        assert_int_equal(c.head_dim, models[i].head_dim);
    }

    llama_config c;
    load_ok(&c, "configs/models/llama3.1-8b.json"); /* older spelling, llama3 scaling */
    assert_int_equal(c.rope.type, ROPE_LLAMA3);
    assert_true(c.rope.theta == 500000.0);
    assert_true(c.rope.factor == 8.0);
    assert_true(c.rope.low_freq_factor == 1.0);
    assert_true(c.rope.high_freq_factor == 4.0);
    assert_int_equal(c.rope.original_max_position_embeddings, 8192);
    assert_int_equal(c.max_position_embeddings, 131072);
    assert_int_equal(c.vocab_size, 128256);
    assert_int_equal(c.bos_token_id, 128000);
    assert_int_equal(c.eos_token_id, 128001); /* the first of the list */
    assert_true(c.eos_is_list);               /* and the whole list is kept */
    assert_int_equal(c.n_eos_token_ids, 3);
    assert_int_equal(c.eos_token_ids[0], 128001);
    assert_int_equal(c.eos_token_ids[1], 128008);
    assert_int_equal(c.eos_token_ids[2], 128009);
    assert_string_equal(c.dtype, "bfloat16"); /* from "torch_dtype" */

    load_ok(&c, "configs/models/llama2-7b.json"); /* no rope_theta, rope_scaling null */
    assert_int_equal(c.rope.type, ROPE_DEFAULT);
    assert_true(c.rope.theta == 10000.0);

    load_ok(&c, "configs/models/tiny.json"); /* newer spelling */
    assert_int_equal(c.rope.type, ROPE_DEFAULT);
    assert_true(c.rope.theta == 10000.0);
    assert_int_equal(c.num_attention_heads, 8);
}

static void test_param_list_order_and_shapes(void **state) {
    (void)state;
    llama_config c;
    load_ok(&c, "configs/models/llama3.1-8b.json");
    llama_param_info p[16];
    int n = llama_config_params(&c, p, 16); /* fills only the first 16 */
    assert_int_equal(n, 1 + 32 * 9 + 2);
    static const char *first_layer[] = {
        "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
        "model.layers.0.self_attn.v_proj.weight", "model.layers.0.self_attn.o_proj.weight",
        "model.layers.0.mlp.gate_proj.weight",    "model.layers.0.mlp.up_proj.weight",
        "model.layers.0.mlp.down_proj.weight",    "model.layers.0.input_layernorm.weight",
        "model.layers.0.post_attention_layernorm.weight",
    };
    assert_string_equal(p[0].name, "model.embed_tokens.weight");
    assert_int_equal(p[0].shape[0], 128256);
    assert_int_equal(p[0].shape[1], 4096);
    assert_int_equal(p[0].layer, -1);
    for (int i = 0; i < 9; i++) {
        assert_string_equal(p[1 + i].name, first_layer[i]);
        assert_int_equal(p[1 + i].layer, 0);
    }
    assert_int_equal(p[2].shape[0], 8 * 128); /* k_proj: kv heads x head_dim */
    assert_int_equal(p[4].shape[0], 4096);    /* o_proj [C, Hq*hd] */
    assert_int_equal(p[4].shape[1], 32 * 128);
    assert_int_equal(p[7].shape[0], 4096); /* down_proj [C, F] */
    assert_int_equal(p[7].shape[1], 14336);
    assert_int_equal(p[8].ndim, 1);
    assert_true(p[8].is_norm && p[9].is_norm && !p[7].is_norm);
    assert_string_equal(p[10].name, "model.layers.1.self_attn.q_proj.weight");

    llama_param_info all[300];
    assert_int_equal(llama_config_params(&c, all, 300), n);
    assert_string_equal(all[n - 2].name, "model.norm.weight");
    assert_string_equal(all[n - 1].name, "lm_head.weight");
    assert_int_equal(all[n - 1].ndim, 2);

    c.tie_word_embeddings = 1; /* tied: no lm_head, one embedding fewer */
    assert_int_equal(llama_config_params(&c, all, 300), n - 1);
    assert_string_equal(all[n - 2].name, "model.norm.weight");
    assert_int_equal(llama_config_num_params(&c), 8030261248 - 128256ull * 4096);
}

/* ---------- spellings and defaults ---------- */

static void test_rope_spellings(void **state) {
    (void)state;
    llama_config c;
    errbuf err = {{0}};
    static const char *llama3_newer =
        "{\"rope_theta\": 500000.0, \"rope_type\": \"llama3\", \"factor\": 32.0,"
        " \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0,"
        " \"original_max_position_embeddings\": 8192}";
    static const char *llama3_older_type =
        "{\"type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 1,"
        " \"high_freq_factor\": 4, \"original_max_position_embeddings\": 8192}";

    if (parse_with(&c, "rope_parameters", llama3_newer, &err) < 0) fail_msg("%s", err.msg);
    assert_int_equal(c.rope.type, ROPE_LLAMA3);
    assert_true(c.rope.theta == 500000.0);
    assert_true(c.rope.factor == 32.0);

    if (parse_with(&c, "rope_scaling", llama3_older_type, &err) < 0) fail_msg("%s", err.msg);
    assert_int_equal(c.rope.type, ROPE_LLAMA3);
    assert_true(c.rope.theta == 10000.0); /* no top-level rope_theta: the default */
    assert_true(c.rope.high_freq_factor == 4.0);

    if (parse_with(&c, "rope_scaling", "{\"rope_type\": \"default\"}", &err) < 0)
        fail_msg("%s", err.msg);
    assert_int_equal(c.rope.type, ROPE_DEFAULT);

    if (parse_with(&c, "rope_theta", "1000000", &err) < 0) fail_msg("%s", err.msg);
    assert_true(c.rope.theta == 1e6);

    if (parse_with(&c, "rope_parameters", "{\"rope_type\": \"default\"}", &err) < 0)
        fail_msg("%s", err.msg);
    assert_true(c.rope.theta == 10000.0);
}

/* data.seq_len above max_position_embeddings: only where the RoPE scaling covers it, the
 * refusal naming both numbers. */
static void assert_seq_len(const llama_config *c, int64_t covered) {
    errbuf err = {{0}};
    assert_int_equal(llama_config_max_positions(c), covered);
    if (llama_config_check_seq_len(c, "data.seq_len", covered, "test.json", &err))
        fail_msg("%s", err.msg);
    assert_int_equal(llama_config_check_seq_len(c, "data.seq_len", covered + 1, "test.json", &err), -1);
    char want[128];
    snprintf(want, sizeof want, "data.seq_len %lld is longer than the %lld positions test.json covers "
             "(max_position_embeddings %d", (long long)covered + 1, (long long)covered,
             c->max_position_embeddings);
    if (!strstr(err.msg, want)) fail_msg("'%s' lacks '%s'", err.msg, want);
}

static void test_seq_len_policy(void **state) {
    (void)state;
    llama_config c;
    errbuf err = {{0}};
    if (parse_text(&c, base_json, &err) < 0) fail_msg("%s", err.msg);
    assert_seq_len(&c, 64); /* no scaling: max_position_embeddings */
    /* yarn factor 4 from the config's 64 (Qwen's 32k to 128k), or from a given original */
    if (parse_with(&c, "rope_scaling", "{\"rope_type\": \"yarn\", \"factor\": 4.0}", &err) < 0)
        fail_msg("%s", err.msg);
    assert_seq_len(&c, 256);
    if (parse_with(&c, "rope_scaling", "{\"type\": \"yarn\", \"factor\": 2.5,"
                   " \"original_max_position_embeddings\": 40}", &err) < 0)
        fail_msg("%s", err.msg);
    assert_seq_len(&c, 100);
    /* linear names no original length: max_position_embeddings is the scaled one */
    if (parse_with(&c, "rope_scaling", "{\"type\": \"linear\", \"factor\": 8.0}", &err) < 0)
        fail_msg("%s", err.msg);
    assert_seq_len(&c, 64);
    /* llama3 factor 32 from 8192 (Llama 3.2) goes past max_position_embeddings 64 */
    if (parse_with(&c, "rope_scaling", "{\"rope_type\": \"llama3\", \"factor\": 32.0, \"low_freq_factor\": 1.0,"
                   " \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8}", &err) < 0)
        fail_msg("%s", err.msg);
    assert_seq_len(&c, 256);
    load_ok(&c, "configs/models/llama3.1-8b.json"); /* 8 x 8192 is less than its 131072 */
    assert_seq_len(&c, 131072);
    assert_int_equal(llama_config_check_seq_len(&c, "data.seq_len", 400000, "llama3.1-8b", &err), -1);
    assert_non_null(strstr(err.msg, "rope_type llama3"));
}

static void test_defaults(void **state) {
    (void)state;
    llama_config c;
    errbuf err = {{0}};
    if (parse_with(&c, "num_key_value_heads", NULL, &err) < 0) fail_msg("%s", err.msg);
    assert_int_equal(c.num_key_value_heads, 4); /* = heads */
    assert_int_equal(c.head_dim, 16);           /* = hidden / heads */
    assert_true(c.initializer_range == 0.02);
    assert_int_equal(c.tie_word_embeddings, 0);
    assert_int_equal(c.bos_token_id, -1);
    assert_int_equal(c.eos_token_id, -1);
    assert_string_equal(c.dtype, "");

    if (parse_with(&c, "head_dim", "null", &err) < 0) fail_msg("%s", err.msg);
    assert_int_equal(c.head_dim, 16);
    if (parse_with(&c, "head_dim", "128", &err) < 0) fail_msg("%s", err.msg);
    assert_int_equal(c.head_dim, 128); /* need not equal hidden / heads */
    if (parse_with(&c, "eos_token_id", "null", &err) < 0) fail_msg("%s", err.msg);
    assert_int_equal(c.eos_token_id, -1);
    assert_int_equal(c.n_eos_token_ids, 0);
    assert_false(c.eos_is_list);
    if (parse_with(&c, "eos_token_id", "[7, 8]", &err) < 0) fail_msg("%s", err.msg);
    assert_int_equal(c.eos_token_id, 7);
    assert_true(c.eos_is_list);
    assert_int_equal(c.n_eos_token_ids, 2);
    assert_int_equal(c.eos_token_ids[1], 8);
    if (parse_with(&c, "eos_token_id", "[]", &err) < 0) fail_msg("%s", err.msg);
    assert_int_equal(c.eos_token_id, -1);
    assert_true(c.eos_is_list);
    assert_int_equal(c.n_eos_token_ids, 0);
    if (parse_with(&c, "eos_token_id", "5", &err) < 0) fail_msg("%s", err.msg);
    assert_int_equal(c.eos_token_id, 5);
    assert_false(c.eos_is_list);
    assert_int_equal(c.n_eos_token_ids, 1);
    assert_int_equal(c.eos_token_ids[0], 5);
    if (parse_with(&c, "tie_word_embeddings", "true", &err) < 0) fail_msg("%s", err.msg);
    assert_int_equal(c.tie_word_embeddings, 1);
    if (parse_with(&c, "model_type", NULL, &err) < 0) fail_msg("%s", err.msg);
    if (parse_with(&c, "attention_bias", "false", &err) < 0) fail_msg("%s", err.msg);
    if (parse_with(&c, "hidden_act", "\"silu\"", &err) < 0) fail_msg("%s", err.msg);
}

/* ---------- save -> load ---------- */

static void round_trip(const char *dir, const llama_config *c) {
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    errbuf err = {{0}};
    if (llama_config_save(c, path, &err) < 0) fail_msg("%s", err.msg);
    llama_config back;
    load_ok(&back, dir);
    assert_configs_equal(c, &back);
    assert_int_equal(access(path, F_OK), 0);
}

static void test_save_round_trip(void **state) {
    (void)state;
    char dir[] = "/tmp/test_model_config.XXXXXX";
    assert_non_null(mkdtemp(dir));
    char golden[4096];
    fixture_path(golden, sizeof golden, "golden/tiny-mha");
    const char *sources[] = {golden, "configs/models/tiny.json", "configs/models/llama2-70b.json",
                             "configs/models/llama3.1-8b.json"};
    for (size_t i = 0; i < sizeof sources / sizeof sources[0]; i++) {
        llama_config c;
        load_ok(&c, sources[i]);
        round_trip(dir, &c);
    }
    /* Odd values survive exactly; -1 token ids come back as -1 (written as null). */
    llama_config c;
    load_ok(&c, "configs/models/tiny.json");
    c.rms_norm_eps = 1.0 / 3.0;
    c.initializer_range = 0.1;
    c.bos_token_id = -1;
    c.tie_word_embeddings = 1;
    c.dtype[0] = '\0';
    round_trip(dir, &c);

    /* The file is what transformers expects: the newer RoPE spelling and the fixed keys. */
    load_ok(&c, "configs/models/llama3.1-8b.json");
    snprintf(c.dtype, sizeof c.dtype, "bfloat16");
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    errbuf err = {{0}};
    if (llama_config_save(&c, path, &err) < 0) fail_msg("%s", err.msg);
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    assert_non_null(root);
    json_t *arch = json_array_get(json_object_get(root, "architectures"), 0);
    assert_string_equal(json_string_value(arch), "LlamaForCausalLM");
    assert_string_equal(json_string_value(json_object_get(root, "model_type")), "llama");
    assert_string_equal(json_string_value(json_object_get(root, "hidden_act")), "silu");
    assert_string_equal(json_string_value(json_object_get(root, "dtype")), "bfloat16");
    assert_string_equal(json_string_value(json_object_get(root, "torch_dtype")), "bfloat16");
    assert_true(json_is_false(json_object_get(root, "attention_bias")));
    assert_true(json_is_false(json_object_get(root, "mlp_bias")));
    assert_true(json_is_false(json_object_get(root, "use_cache")));
    assert_null(json_object_get(root, "rope_scaling"));
    assert_null(json_object_get(root, "rope_theta"));
    json_t *rope = json_object_get(root, "rope_parameters");
    assert_string_equal(json_string_value(json_object_get(rope, "rope_type")), "llama3");
    assert_true(json_number_value(json_object_get(rope, "rope_theta")) == 500000.0);
    assert_int_equal(json_integer_value(json_object_get(rope, "original_max_position_embeddings")),
                     8192);
    /* Llama 3.1's three eos ids, written back as the list they were. */
    json_t *eos = json_object_get(root, "eos_token_id");
    assert_true(json_is_array(eos));
    assert_int_equal(json_array_size(eos), 3);
    assert_int_equal(json_integer_value(json_array_get(eos, 0)), 128001);
    assert_int_equal(json_integer_value(json_array_get(eos, 1)), 128008);
    assert_int_equal(json_integer_value(json_array_get(eos, 2)), 128009);
    json_decref(root);
    /* An integer eos stays an integer. */
    load_ok(&c, "configs/models/tiny.json");
    if (llama_config_save(&c, path, &err) < 0) fail_msg("%s", err.msg);
    root = json_load_file(path, 0, &jerr);
    assert_non_null(root);
    assert_true(json_is_integer(json_object_get(root, "eos_token_id")));
    assert_int_equal(json_integer_value(json_object_get(root, "eos_token_id")), 2);
    json_decref(root);
    load_ok(&c, "configs/models/llama3.1-8b.json");
    snprintf(c.dtype, sizeof c.dtype, "bfloat16");
    if (llama_config_save(&c, path, &err) < 0) fail_msg("%s", err.msg);
    /* Reals in their shortest exact form, as Python writes them. */
    FILE *fp = fopen(path, "r");
    assert_non_null(fp);
    char text[8192];
    size_t len = fread(text, 1, sizeof text - 1, fp);
    fclose(fp);
    text[len] = '\0';
    assert_non_null(strstr(text, "\"rms_norm_eps\": 1e-5,"));
    assert_non_null(strstr(text, "\"rope_theta\": 500000.0,"));
    assert_int_equal(text[len - 1], '\n');
    /* No temporary file is left behind. */
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') assert_string_equal(e->d_name, "config.json");
    closedir(d);

    assert_int_equal(unlink(path), 0);
    assert_int_equal(rmdir(dir), 0);
}


/* ---------- families ---------- */

static void test_golden_families(void **state) {
    (void)state;
    static const struct {
        const char *dir;
        llama_family family;
        int bias, qk_norm, window, head_dim, tied;
    } goldens[] = {
        {"tiny-qwen2", FAMILY_QWEN2, 1, 0, 0, 16, 0},
        {"tiny-qwen3", FAMILY_QWEN3, 0, 1, 0, 24, 1},
        {"tiny-mistral-sw", FAMILY_MISTRAL, 0, 0, 12, 16, 0},
        {"tiny-mha", FAMILY_LLAMA, 0, 0, 0, 16, 0},
    };
    for (size_t i = 0; i < sizeof goldens / sizeof goldens[0]; i++) {
        char dir[4096], file[4200];
        fixture_path(dir, sizeof dir, "golden/%s", goldens[i].dir);
        llama_config c;
        load_ok(&c, dir);
        assert_int_equal(c.family, goldens[i].family);
        assert_int_equal(c.attention_bias, goldens[i].bias);
        assert_int_equal(c.qk_norm, goldens[i].qk_norm);
        assert_int_equal(c.sliding_window, goldens[i].window);
        assert_int_equal(c.head_dim, goldens[i].head_dim);
        assert_int_equal(c.tie_word_embeddings, goldens[i].tied);
        /* the parameter list is the checkpoint's, biases and q/k norms included */
        snprintf(file, sizeof file, "%s/model.safetensors", dir);
        st_file f;
        errbuf err = {{0}};
        if (st_open(&f, file, &err) < 0) fail_msg("%s", err.msg);
        int n = llama_config_params(&c, NULL, 0);
        llama_param_info *p = calloc((size_t)n, sizeof *p);
        assert_non_null(p);
        llama_config_params(&c, p, n);
        uint64_t numel = 0;
        for (int j = 0; j < n; j++) {
            const st_tensor *t = st_find(&f, p[j].name);
            if (!t) fail_msg("%s: %s is not in the checkpoint", dir, p[j].name);
            assert_int_equal(t->ndim, p[j].ndim);
            assert_int_equal(t->shape[0], p[j].shape[0]);
            if (p[j].ndim == 2) assert_int_equal(t->shape[1], p[j].shape[1]);
            assert_int_equal(p[j].is_bias, strstr(p[j].name, ".bias") != NULL);
            assert_int_equal(p[j].is_norm, strstr(p[j].name, "norm.weight") != NULL);
            numel += (uint64_t)t->shape[0] * (uint64_t)(t->ndim == 2 ? t->shape[1] : 1);
        }
        assert_int_equal(n, f.n_tensors);
        assert_int_equal(numel, llama_config_num_params(&c));
        free(p);
        st_close(&f);
    }
}

static void test_family_keys(void **state) {
    (void)state;
    llama_config c;
    errbuf err = {{0}};
    /* Mistral: sliding_window absent is transformers' 4096, null none, an int that int. */
    if (parse_with(&c, "model_type", "\"mistral\"", &err) < 0) fail_msg("%s", err.msg);
    assert_int_equal(c.family, FAMILY_MISTRAL);
    assert_int_equal(c.sliding_window, 4096);
    load_ok(&c, "configs/models/mistral-7b-v0.3.json");
    assert_int_equal(c.sliding_window, 0);
    assert_true(c.rope.theta == 1e6);
    /* Qwen2.5: biases, rope_theta 1e6, an unused sliding_window (use_sliding_window false) */
    load_ok(&c, "configs/models/qwen2.5-7b.json");
    assert_int_equal(c.family, FAMILY_QWEN2);
    assert_true(c.attention_bias && !c.qk_norm && c.sliding_window == 0);
    assert_true(c.rope.theta == 1e6);
    load_ok(&c, "configs/models/qwen3-32b.json");
    assert_int_equal(c.family, FAMILY_QWEN3);
    assert_true(!c.attention_bias && c.qk_norm);
    assert_int_equal(c.head_dim, 128); /* 64 heads of 128 over hidden 5120: q_proj not square */
    assert_string_equal(llama_family_model_type(FAMILY_QWEN3), "qwen3");
    assert_string_equal(llama_family_architecture(FAMILY_MISTRAL), "MistralForCausalLM");

    /* Qwen2.5's YaRN, in the spelling its model card gives */
    load_ok(&c, "configs/models/qwen2.5-7b.json");
    json_t *root = llama_config_to_json(&c);
    assert_non_null(root);
    assert_int_equal(json_object_del(root, "rope_parameters"), 0);
    assert_int_equal(json_object_set_new(root, "rope_scaling",
                                         json_pack("{s:f,s:i,s:s}", "factor", 4.0,
                                                   "original_max_position_embeddings", 32768,
                                                   "type", "yarn")),
                     0);
    char *text = json_dumps(root, 0);
    json_decref(root);
    assert_non_null(text);
    if (parse_text(&c, text, &err) < 0) fail_msg("%s", err.msg);
    free(text);
    assert_int_equal(c.rope.type, ROPE_YARN);
    assert_true(c.rope.factor == 4.0 && c.rope.beta_fast == 32 && c.rope.beta_slow == 1);
    assert_true(c.rope.truncate && c.rope.attention_factor == 0);
    assert_int_equal(c.rope.original_max_position_embeddings, 32768);
    assert_true(fabs(rope_attention_factor(&c.rope) - (0.1 * log(4.0) + 1)) < 1e-15);
    /* without original_max_position_embeddings: max_position_embeddings (64 here) */
    if (parse_with(&c, "rope_scaling", "{\"type\": \"yarn\", \"factor\": 2, \"mscale\": 2,"
                                       " \"mscale_all_dim\": 1}", &err) < 0)
        fail_msg("%s", err.msg);
    assert_int_equal(c.rope.original_max_position_embeddings, 64);
    assert_true(fabs(rope_attention_factor(&c.rope) - (0.2 * log(2.0) + 1) / (0.1 * log(2.0) + 1)) < 1e-15);
    if (parse_with(&c, "rope_scaling", "{\"type\": \"yarn\", \"factor\": 2, \"attention_factor\": 0.5}",
                   &err) < 0)
        fail_msg("%s", err.msg);
    assert_true(rope_attention_factor(&c.rope) == 0.5);
    if (parse_with(&c, "rope_scaling", "{\"type\": \"linear\", \"factor\": 2}", &err) < 0)
        fail_msg("%s", err.msg);
    assert_int_equal(c.rope.type, ROPE_LINEAR);
    assert_true(rope_attention_factor(&c.rope) == 1.0);
}

/* Each family's config.json comes back as it went, under its own model_type and class. */
static void test_family_round_trip(void **state) {
    (void)state;
    char dir[] = "/tmp/test_model_config.XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    static const struct {
        const char *file, *model_type, *arch;
    } files[] = {
        {"configs/models/qwen2.5-72b.json", "qwen2", "Qwen2ForCausalLM"},
        {"configs/models/qwen3-8b.json", "qwen3", "Qwen3ForCausalLM"},
        {"configs/models/mistral-7b-v0.3.json", "mistral", "MistralForCausalLM"},
        {"configs/models/llama3.1-8b.json", "llama", "LlamaForCausalLM"},
    };
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        llama_config c, back;
        load_ok(&c, files[i].file);
        if (i == 2) c.sliding_window = 4096; /* an int survives too */
        if (i == 0) {
            c.rope.type = ROPE_YARN, c.rope.factor = 4, c.rope.beta_fast = 16;
            c.rope.beta_slow = 2, c.rope.truncate = 0, c.rope.mscale = 0.7;
            c.rope.original_max_position_embeddings = 32768;
        }
        errbuf err = {{0}};
        if (llama_config_save(&c, path, &err) < 0) fail_msg("%s", err.msg);
        load_ok(&back, path);
        assert_configs_equal(&c, &back);
        json_error_t jerr;
        json_t *root = json_load_file(path, 0, &jerr);
        assert_non_null(root);
        assert_string_equal(json_string_value(json_object_get(root, "model_type")), files[i].model_type);
        assert_string_equal(json_string_value(json_array_get(json_object_get(root, "architectures"), 0)),
                            files[i].arch);
        json_decref(root);
    }
    assert_int_equal(unlink(path), 0);
    assert_int_equal(rmdir(dir), 0);
}

/* ---------- rejections ---------- */

static void expect_error(int rc, const errbuf *err, const char *needle) {
    assert_int_equal(rc, -1);
    if (!strstr(err->msg, needle))
        fail_msg("message \"%s\" does not name \"%s\"", err->msg, needle);
}

static void test_rejects_bad_json(void **state) {
    (void)state;
    llama_config c;
    errbuf err = {{0}};
    expect_error(parse_text(&c, "{\"hidden_size\": 64,", &err), &err, "test.json");
    expect_error(parse_text(&c, "", &err), &err, "invalid JSON");
    expect_error(parse_text(&c, "[1, 2]", &err), &err, "object");
    expect_error(parse_text(&c, "{\"hidden_size\": 1, \"hidden_size\": 2}", &err), &err,
                 "hidden_size");
    /* Length is honoured: the text past len is not read. */
    const char *two = "{}{\"x\": 1}";
    expect_error(llama_config_parse(&c, two, 1, "cut.json", &err), &err, "cut.json");

    expect_error(llama_config_load(&c, "/nonexistent/config.json", &err), &err,
                 "/nonexistent/config.json");
    expect_error(llama_config_load(&c, "configs", &err), &err, "configs/config.json");
}

/* Parses base_json as model_type family with key set to value (JSON text). */
static int parse_family_with(llama_config *c, const char *family, const char *key,
                             const char *value, errbuf *err) {
    json_t *root = json_loads(base_json, 0, NULL);
    assert_non_null(root);
    assert_int_equal(json_object_set_new(root, "model_type", json_string(family)), 0);
    json_t *v = json_loads(value, JSON_DECODE_ANY, NULL);
    assert_non_null(v);
    assert_int_equal(json_object_set_new(root, key, v), 0);
    char *text = json_dumps(root, 0);
    json_decref(root);
    assert_non_null(text);
    int rc = parse_text(c, text, err);
    free(text);
    return rc;
}

static void test_rejects_family_values(void **state) {
    (void)state;
    static const struct {
        const char *family, *key, *value, *needle;
    } cases[] = {
        {"qwen2", "use_sliding_window", "true", "use_sliding_window true is not built yet"},
        {"qwen3", "use_sliding_window", "true", "use_sliding_window true is not built yet"},
        {"qwen2", "layer_types", "[\"full_attention\", \"sliding_attention\"]", "layer_types[1]"},
        {"qwen3", "layer_types", "[7]", "layer_types[0]"},
        {"qwen2", "layer_types", "\"full_attention\"", "layer_types"},
        {"qwen3", "attention_bias", "true", "attention_bias true"},
        {"qwen2", "mlp_bias", "true", "mlp_bias true"},
        {"mistral", "attention_bias", "true", "attention_bias true"},
        {"mistral", "sliding_window", "0", "sliding_window"},
        {"mistral", "sliding_window", "-4096", "sliding_window"},
        {"mistral", "sliding_window", "\"4096\"", "sliding_window"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        llama_config c;
        errbuf err = {{0}};
        int rc = parse_family_with(&c, cases[i].family, cases[i].key, cases[i].value, &err);
        if (rc != -1)
            fail_msg("case %zu (%s: %s = %s) was accepted", i, cases[i].family, cases[i].key,
                     cases[i].value);
        expect_error(rc, &err, cases[i].needle);
    }
    /* and what the families allow */
    llama_config c;
    errbuf err = {{0}};
    if (parse_family_with(&c, "qwen2", "layer_types", "[\"full_attention\"]", &err) < 0 ||
        parse_family_with(&c, "qwen2", "attention_bias", "true", &err) < 0 || /* q/k/v have it */
        parse_family_with(&c, "qwen3", "use_sliding_window", "false", &err) < 0)
        fail_msg("%s", err.msg);
}

static void test_rejects_bad_values(void **state) {
    (void)state;
    static const struct {
        const char *key, *value; /* value NULL: key removed */
        const char *needle;      /* the message must contain it */
    } cases[] = {
        {"hidden_size", NULL, "hidden_size"},
        {"vocab_size", NULL, "vocab_size"},
        {"rms_norm_eps", NULL, "rms_norm_eps"},
        {"hidden_size", "\"64\"", "hidden_size"},
        {"hidden_size", "64.0", "integer"},
        {"hidden_size", "null", "hidden_size"},
        {"num_hidden_layers", "[2]", "num_hidden_layers"},
        {"rms_norm_eps", "\"1e-5\"", "rms_norm_eps"},
        {"tie_word_embeddings", "0", "tie_word_embeddings"},
        {"bos_token_id", "\"<s>\"", "bos_token_id"},
        {"eos_token_id", "[\"</s>\"]", "eos_token_id"},
        {"eos_token_id", "-2", "eos_token_id"},
        {"eos_token_id", "[1, -2]", "eos_token_id"},
        {"eos_token_id", "[1, null]", "eos_token_id"},
        {"eos_token_id", "[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]", "more than 16"},
        {"model_type", "\"gemma\"", "gemma"},
        {"model_type", "7", "model_type"},
        {"hidden_act", "\"gelu\"", "gelu"},
        {"attention_bias", "true", "attention_bias"},
        {"mlp_bias", "true", "mlp_bias"},
        {"num_key_value_heads", "3", "num_key_value_heads"},
        {"num_attention_heads", "5", "not a multiple"}, /* 64 % 5 and 5 % 2 */
        {"hidden_size", "-64", "hidden_size"},
        {"intermediate_size", "0", "intermediate_size"},
        {"vocab_size", "-1", "vocab_size"},
        {"num_hidden_layers", "4294967296", "num_hidden_layers"},
        {"num_hidden_layers", "1000000", "num_hidden_layers"},
        {"head_dim", "-16", "head_dim"},
        {"rms_norm_eps", "0", "rms_norm_eps"},
        {"rms_norm_eps", "-1e-5", "rms_norm_eps"},
        {"initializer_range", "-0.02", "initializer_range"},
        {"dtype", "\"a-very-long-dtype-name\"", "dtype"},
        {"torch_dtype", "16", "torch_dtype"},
        {"rope_theta", "0", "rope_theta"},
        {"rope_theta", "\"10000\"", "rope_theta"},
        {"rope_scaling", "{\"rope_type\": \"yarn\", \"factor\": 0.5}", "yarn needs factor >= 1"},
        {"rope_scaling", "{\"rope_type\": \"yarn\", \"factor\": 4, \"beta_fast\": 0}", "beta_fast"},
        {"rope_scaling", "{\"rope_type\": \"yarn\", \"factor\": 4, \"truncate\": 1}", "truncate"},
        {"rope_scaling", "{\"rope_type\": \"yarn\", \"factor\": 4,"
                         " \"original_max_position_embeddings\": 0}", "original_max_position_embeddings"},
        {"rope_scaling", "{\"type\": \"linear\", \"factor\": -2.0}", "linear needs factor > 0"},
        {"rope_scaling", "{\"type\": \"linear\"}", "rope_scaling.factor"},
        {"rope_scaling", "{\"rope_type\": \"dynamic\", \"factor\": 2.0}", "dynamic"},
        {"rope_scaling", "{\"factor\": 2.0}", "rope_scaling.rope_type"},
        {"rope_scaling", "[]", "rope_scaling"},
        {"rope_parameters", "{\"rope_type\": \"yarn\", \"rope_theta\": 1e4}", "rope_parameters.factor"},
        {"rope_parameters", "\"default\"", "rope_parameters"},
        {"rope_parameters", "{\"rope_type\": \"default\", \"rope_theta\": -1}", "rope_theta"},
        {"rope_parameters",
         "{\"rope_type\": \"llama3\", \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0,"
         " \"original_max_position_embeddings\": 8192}",
         "rope_parameters.factor"},
        {"rope_scaling",
         "{\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0,"
         " \"high_freq_factor\": 4.0}",
         "original_max_position_embeddings"},
        {"rope_scaling",
         "{\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 4.0,"
         " \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}",
         "high_freq_factor"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        llama_config c;
        memset(&c, 0x5a, sizeof c);
        llama_config before = c;
        errbuf err = {{0}};
        int rc = parse_with(&c, cases[i].key, cases[i].value, &err);
        if (rc != -1)
            fail_msg("case %zu (%s = %s) was accepted", i, cases[i].key,
                     cases[i].value ? cases[i].value : "absent");
        expect_error(rc, &err, cases[i].needle);
        expect_error(rc, &err, "test.json");
        assert_memory_equal(&c, &before, sizeof c); /* untouched on error */
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_config_matches_checkpoint),
        cmocka_unit_test(test_every_model_file_parses),
        cmocka_unit_test(test_model_file_values),
        cmocka_unit_test(test_param_list_order_and_shapes),
        cmocka_unit_test(test_rope_spellings),
        cmocka_unit_test(test_seq_len_policy),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_save_round_trip),
        cmocka_unit_test(test_golden_families),
        cmocka_unit_test(test_family_keys),
        cmocka_unit_test(test_family_round_trip),
        cmocka_unit_test(test_rejects_bad_json),
        cmocka_unit_test(test_rejects_bad_values),
        cmocka_unit_test(test_rejects_family_values),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
