/* proto/peft: the golden PEFT adapter (golden/tiny-mha/lora, written by PEFT 0.21) reads back
 * as lora_expected.safetensors's adamw.*; the config written is the golden one; write and
 * read round trip; every refusal says what and why. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <ftw.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/fileio.h"
#include "proto/peft.h"
#include "proto/safetensors.h"
#include "tests/unit/fixtures.h"

static void golden_path(char *out, size_t n, const char *name) {
    fixture_path(out, n, "golden/tiny-mha/%s", name);
}

static llama_config golden_model(void) {
    char path[4096];
    llama_config c;
    errbuf err = {{0}};
    golden_path(path, sizeof path, "config.json");
    if (llama_config_load(&c, path, &err)) fail_msg("%s", err.msg);
    return c;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static void make_tmp(char *dir, size_t n) {
    snprintf(dir, n, "/tmp/test_peft.XXXXXX");
    assert_non_null(mkdtemp(dir));
}

static void remove_tmp(const char *dir) { nftw(dir, remove_entry, 8, FTW_DEPTH | FTW_PHYS); }

/* ---- the golden adapter ---- */

static void test_golden_config(void **state) {
    (void)state;
    char path[4096];
    lora_config c;
    errbuf err = {{0}};
    golden_path(path, sizeof path, "lora/" PEFT_CONFIG_NAME);
    if (peft_read_config(&c, path, &err)) fail_msg("%s", err.msg);
    assert_int_equal(c.rank, 8);
    assert_true(c.alpha == 16.0);
    assert_true(c.dropout == 0.0);
    assert_int_equal(c.rslora, 0);
    assert_int_equal(c.targets, LORA_ALL_LINEAR);
    assert_true(lora_scale(&c) == 2.0);
}

/* Every tensor equals lora_expected's adamw.<name with .default>, bit for bit. */
static void test_golden_weights(void **state) {
    (void)state;
    char dir[4096], path[4096];
    llama_config mc = golden_model();
    lora_layout lo;
    float **units;
    errbuf err = {{0}};
    golden_path(dir, sizeof dir, "lora");
    if (peft_load(dir, &mc, &lo, &units, &err)) fail_msg("%s", err.msg);
    assert_int_equal(lo.n_tensors, 2 * 7 * mc.num_hidden_layers);
    st_file expected;
    golden_path(path, sizeof path, "lora_expected.safetensors");
    if (st_open(&expected, path, &err)) fail_msg("%s", err.msg);
    for (int i = 0; i < lo.n_tensors; i++) {
        const llama_tensor_slot *s = &lo.tensors[i];
        char name[256];
        const char *tail = strstr(s->name, ".weight");
        snprintf(name, sizeof name, "adamw.%.*s.default.weight", (int)(tail - s->name), s->name);
        const st_tensor *t = st_find(&expected, name);
        if (!t) fail_msg("no %s in lora_expected", name);
        assert_int_equal(t->numel, s->numel);
        float *want = malloc(s->numel * sizeof *want);
        assert_non_null(want);
        assert_int_equal(st_read_f32(t, 0, s->numel, want, &err), 0);
        if (memcmp(want, units[s->unit] + s->offset, s->numel * sizeof *want))
            fail_msg("%s differs from %s", s->name, name);
        free(want);
    }
    st_close(&expected);
    peft_units_free(units, lo.n_units);
    lora_layout_free(&lo);
}

/* target_modules as a sorted JSON list, for comparing sets. */
static void sort_targets(json_t *config) {
    json_t *list = json_object_get(config, "target_modules");
    size_t n = json_array_size(list);
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n; j++)
            if (strcmp(json_string_value(json_array_get(list, i)), json_string_value(json_array_get(list, j))) > 0) {
                json_t *a = json_incref(json_array_get(list, i)), *b = json_incref(json_array_get(list, j));
                json_array_set_new(list, i, b);
                json_array_set_new(list, j, a);
            }
}

/* The config written from the golden settings is PEFT's, key for key (target_modules as a
 * set: PEFT writes a Python set). */
static void test_config_written_is_pefts(void **state) {
    (void)state;
    char path[4096];
    errbuf err = {{0}};
    json_error_t je;
    lora_config c = {.rank = 8, .alpha = 16, .dropout = 0, .targets = LORA_ALL_LINEAR};
    golden_path(path, sizeof path, "lora/" PEFT_CONFIG_NAME);
    json_t *golden = json_load_file(path, 0, &je);
    char *text = peft_config_text(&c, "tiny-mha", &err);
    assert_non_null(golden);
    if (!text) fail_msg("%s", err.msg);
    json_t *mine = json_loads(text, 0, &je);
    assert_non_null(mine);
    sort_targets(golden);
    sort_targets(mine);
    const char *key;
    json_t *v;
    json_object_foreach(golden, key, v) {
        json_t *w = json_object_get(mine, key);
        if (!w) fail_msg("key %s not written", key);
        if (!json_equal(v, w)) fail_msg("key %s differs", key);
    }
    assert_int_equal(json_object_size(mine), json_object_size(golden));
    assert_int_equal(text[strlen(text) - 1], '\n');
    assert_non_null(strstr(text, "\"lora_alpha\": 16,")); /* an integer, as PEFT writes it */
    free(text);
    json_decref(golden);
    json_decref(mine);
}

/* ---- round trip ---- */

static void test_round_trip(void **state) {
    (void)state;
    char dir[64], path[4096];
    llama_config mc = golden_model();
    lora_config c = {.rank = 3, .alpha = 5.5, .rslora = 1, .dropout = 0.125,
                     .targets = (1u << LORA_K) | (1u << LORA_DOWN)};
    lora_layout lo, back;
    errbuf err = {{0}};
    make_tmp(dir, sizeof dir);
    assert_int_equal(lora_layout_init(&lo, &mc, &c, &err), 0);
    float **units = peft_units_new(&lo, &err), **read;
    assert_non_null(units);
    for (int u = 0; u < lo.n_units; u++)
        for (size_t i = 0; i < lo.units[u].numel; i++) units[u][i] = (float)(u * 1000 + (int)i) * 0.001f - 0.3f;
    if (peft_save(dir, &lo, (const float *const *)units, "/models/base", &err)) fail_msg("%s", err.msg);
    if (peft_load(dir, &mc, &back, &read, &err)) fail_msg("%s", err.msg);
    assert_int_equal(back.cfg.rank, 3);
    assert_true(back.cfg.alpha == 5.5);
    assert_true(back.cfg.dropout == 0.125);
    assert_int_equal(back.cfg.rslora, 1);
    assert_int_equal(back.cfg.targets, c.targets);
    for (int u = 0; u < lo.n_units; u++)
        assert_memory_equal(units[u], read[u], lo.units[u].numel * sizeof(float));
    /* the file as the safetensors package writes it: F32, sorted names, format pt */
    st_file f;
    snprintf(path, sizeof path, "%s/%s", dir, PEFT_WEIGHTS_NAME);
    if (st_open(&f, path, &err)) fail_msg("%s", err.msg);
    assert_int_equal(f.n_tensors, 2 * 2 * mc.num_hidden_layers);
    assert_string_equal(st_meta_get(&f, "format"), "pt");
    for (int i = 0; i < f.n_tensors; i++) {
        assert_int_equal(f.tensors[i].dtype, ST_F32);
        if (i) assert_true(strcmp(f.tensors[i - 1].name, f.tensors[i].name) < 0);
    }
    assert_non_null(st_find(&f, "base_model.model.model.layers.1.mlp.down_proj.lora_A.weight"));
    st_close(&f);
    char *text;
    size_t len;
    snprintf(path, sizeof path, "%s/%s", dir, PEFT_CONFIG_NAME);
    assert_int_equal(file_read_all(path, 1 << 20, &text, &len, &err), 0);
    assert_non_null(strstr(text, "\"base_model_name_or_path\": \"/models/base\""));
    assert_non_null(strstr(text, "\"use_rslora\": true"));
    free(text);
    peft_units_free(units, lo.n_units);
    peft_units_free(read, back.n_units);
    lora_layout_free(&lo);
    lora_layout_free(&back);
    remove_tmp(dir);
}

/* ---- the config's refusals and defaults ---- */

static void expect_config_error(const char *members, const char *needle) {
    char text[1024];
    lora_config c;
    errbuf err = {{0}};
    snprintf(text, sizeof text, "{\"peft_type\": \"LORA\", \"target_modules\": [\"q_proj\"]%s%s}",
             members[0] ? ", " : "", members);
    if (peft_parse_config(&c, text, strlen(text), "cfg.json", &err) == 0)
        fail_msg("accepted: %s", text);
    if (!strstr(err.msg, needle)) fail_msg("for %s: message '%s' lacks '%s'", members, err.msg, needle);
    assert_non_null(strstr(err.msg, "cfg.json"));
}

static void test_config_refusals(void **state) {
    (void)state;
    static const char *const cases[][2] = {
        {"\"use_dora\": true", "\"use_dora\": true: DoRA is not built yet"},
        {"\"bias\": \"all\"", "\"bias\": \"all\": not built yet"},
        {"\"bias\": \"lora_only\"", "\"bias\": \"lora_only\": not built yet"},
        {"\"fan_in_fan_out\": true", "\"fan_in_fan_out\": true: fan_in_fan_out"},
        {"\"rank_pattern\": {\"q_proj\": 4}", "\"rank_pattern\": {\"q_proj\":4}: a rank per module"},
        {"\"alpha_pattern\": {\"q_proj\": 4}", "\"alpha_pattern\""},
        {"\"layers_to_transform\": [0]", "\"layers_to_transform\": [0]: adapting only some layers is not built yet"},
        {"\"layers_to_transform\": 1", "\"layers_to_transform\": 1:"},
        {"\"modules_to_save\": [\"lm_head\"]", "\"modules_to_save\": [\"lm_head\"]: fully trained extra modules"},
        {"\"use_dora\": 1", "\"use_dora\": 1: DoRA is not built yet"},
        {"\"lora_bias\": true", "\"lora_bias\""},
        {"\"init_lora_weights\": \"pissa\"", "\"init_lora_weights\": \"pissa\": not built yet"},
        {"\"task_type\": \"SEQ_CLS\"", "\"task_type\": \"SEQ_CLS\": not built yet"},
        {"\"r\": 0", "\"r\": 0, expected 1 to"},
        {"\"r\": 2.5", "\"r\": a real number, expected an integer"},
        {"\"lora_alpha\": -1", "\"lora_alpha\": -1, expected a positive number"},
        {"\"lora_alpha\": \"16\"", "\"lora_alpha\": a string, expected a number"},
        {"\"lora_dropout\": 1", "\"lora_dropout\": 1, expected 0 <= dropout < 1"},
        {"\"use_rslora\": \"yes\"", "\"use_rslora\": a string, expected true or false"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) expect_config_error(cases[i][0], cases[i][1]);
}

static void expect_parse_error(const char *text, const char *needle) {
    lora_config c;
    errbuf err = {{0}};
    if (peft_parse_config(&c, text, strlen(text), "cfg.json", &err) == 0) fail_msg("accepted: %s", text);
    if (!strstr(err.msg, needle)) fail_msg("for %s: message '%s' lacks '%s'", text, err.msg, needle);
}

static void test_config_type_and_targets(void **state) {
    (void)state;
    expect_parse_error("{\"target_modules\": [\"q_proj\"]}", "\"peft_type\": missing (expected \"LORA\")");
    expect_parse_error("{\"peft_type\": \"IA3\"}", "\"peft_type\": \"IA3\": not built yet (LORA only)");
    expect_parse_error("{\"peft_type\": 3}", "\"peft_type\": an integer, expected \"LORA\"");
    expect_parse_error("[1]", "cfg.json: a list, expected an object");
    expect_parse_error("{\"peft_type\": \"LORA\"", "cfg.json: line 1:");
    expect_parse_error("{\"peft_type\": \"LORA\", \"target_modules\": [\"q_proj\", \"lm_head\"]}",
                       "\"target_modules\": \"lm_head\": adapting that module is not built yet");
    expect_parse_error("{\"peft_type\": \"LORA\", \"target_modules\": \".*q_proj\"}",
                       "\"target_modules\": \".*q_proj\": a regular expression is not built yet");
    expect_parse_error("{\"peft_type\": \"LORA\", \"target_modules\": []}", "\"target_modules\": an empty list");
    expect_parse_error("{\"peft_type\": \"LORA\", \"target_modules\": [7]}",
                       "\"target_modules\"[0]: an integer, expected a module name");

    lora_config c;
    errbuf err = {{0}};
    static const char all_linear[] = "{\"peft_type\": \"LORA\", \"target_modules\": \"all-linear\", "
                                     "\"r\": 16, \"lora_alpha\": 32.5, \"init_lora_weights\": \"gaussian\", "
                                     "\"task_type\": null, \"modules_to_save\": [], \"some_future_key\": 1}";
    if (peft_parse_config(&c, all_linear, strlen(all_linear), "cfg.json", &err)) fail_msg("%s", err.msg);
    assert_int_equal(c.targets, LORA_ALL_LINEAR);
    assert_int_equal(c.rank, 16);
    assert_true(c.alpha == 32.5);
    /* LoraConfig's defaults; PEFT's Llama targets */
    static const char bare[] = "{\"peft_type\": \"LORA\"}";
    if (peft_parse_config(&c, bare, strlen(bare), "cfg.json", &err)) fail_msg("%s", err.msg);
    assert_int_equal(c.rank, 8);
    assert_true(c.alpha == 8.0);
    assert_true(c.dropout == 0.0);
    assert_int_equal(c.rslora, 0);
    assert_int_equal(c.targets, (1u << LORA_Q) | (1u << LORA_V));
}

/* ---- the weights' refusals ---- */

typedef struct weights_case {
    lora_layout lo;
    float **units;
    char dir[64], path[4096];
} weights_case;

static void weights_case_new(weights_case *w) {
    llama_config mc = golden_model();
    lora_config c = {.rank = 2, .alpha = 4, .targets = 1u << LORA_Q};
    errbuf err = {{0}};
    make_tmp(w->dir, sizeof w->dir);
    snprintf(w->path, sizeof w->path, "%s/%s", w->dir, PEFT_WEIGHTS_NAME);
    assert_int_equal(lora_layout_init(&w->lo, &mc, &c, &err), 0);
    assert_non_null(w->units = peft_units_new(&w->lo, &err));
}

static void weights_case_free(weights_case *w) {
    peft_units_free(w->units, w->lo.n_units);
    lora_layout_free(&w->lo);
    remove_tmp(w->dir);
}

/* Writes the layout's tensors with tensor `which` renamed, given `rows` (-1: flattened),
 * retyped or dropped, and checks the reader's message. */
static void expect_weights_error(weights_case *w, int which, const char *rename, int rows,
                                 st_dtype dtype, int drop, const char *needle) {
    static float zeros[64 * 64];
    st_wtensor t[16];
    int n = 0;
    errbuf err = {{0}};
    for (int i = 0; i < w->lo.n_tensors; i++) {
        const llama_tensor_slot *s = &w->lo.tensors[i];
        if (i == which && drop) continue;
        t[n] = (st_wtensor){.name = s->name, .dtype = ST_F32, .ndim = 2,
                            .shape = {s->shape[0], s->shape[1]}, .data = zeros};
        if (i == which && rename) t[n].name = rename;
        if (i == which && rows > 0) t[n].shape[0] = rows;
        if (i == which && rows < 0) t[n].ndim = 1, t[n].shape[0] = s->shape[0] * s->shape[1];
        if (i == which) t[n].dtype = dtype;
        n++;
    }
    assert_int_equal(st_write(w->path, t, n, NULL, 0, &err), 0);
    if (peft_read_weights(w->path, &w->lo, w->units, &err) == 0) fail_msg("accepted (%s)", needle);
    if (!strstr(err.msg, needle)) fail_msg("message '%s' lacks '%s'", err.msg, needle);
}

static void test_weights_refusals(void **state) {
    (void)state;
    weights_case w;
    weights_case_new(&w);
    expect_weights_error(&w, 0, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight", 0,
                         ST_F32, 0, "\".default\" is PEFT's in-memory adapter name");
    expect_weights_error(&w, 0, "base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight", 0, ST_F32,
                         0, "tensor base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight: not one of this adapter's");
    expect_weights_error(&w, 1, NULL, 3, ST_F32, 0,
                         "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight: shape [3, 2], expected [64, 2]");
    expect_weights_error(&w, 2, NULL, 0, ST_I32, 0, "dtype I32, expected F32, BF16 or F16");
    expect_weights_error(&w, 2, NULL, -1, ST_F32, 0,
                         "base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight: 1 dimension, expected [2, 64]");
    expect_weights_error(&w, 3, NULL, 0, ST_F32, 1,
                         "tensor base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight: missing");
    /* BF16 and F16 are read */
    static uint16_t ones[64 * 64];
    for (size_t i = 0; i < sizeof ones / sizeof ones[0]; i++) ones[i] = 0x3f80; /* bf16 1.0 */
    st_wtensor t[4];
    errbuf err = {{0}};
    for (int i = 0; i < w.lo.n_tensors; i++) {
        const llama_tensor_slot *s = &w.lo.tensors[i];
        t[i] = (st_wtensor){.name = s->name, .dtype = ST_BF16, .ndim = 2, .shape = {s->shape[0], s->shape[1]}, .data = ones};
    }
    assert_int_equal(st_write(w.path, t, w.lo.n_tensors, NULL, 0, &err), 0);
    if (peft_read_weights(w.path, &w.lo, w.units, &err)) fail_msg("%s", err.msg);
    assert_true(w.units[1][0] == 1.0f && w.units[1][w.lo.units[1].numel - 1] == 1.0f);
    weights_case_free(&w);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_config),
        cmocka_unit_test(test_golden_weights),
        cmocka_unit_test(test_config_written_is_pefts),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_config_refusals),
        cmocka_unit_test(test_config_type_and_targets),
        cmocka_unit_test(test_weights_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
