/* Tests of proto/safetensors: round trips, the exact byte layout, sharded model
 * directories, every rejection path of the reader, and the bf16/f16 conversions. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <ftw.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/bf16.h"
#include "proto/safetensors.h"
#include "tests/unit/fixtures.h"

/* ---------- helpers ---------- */

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static int make_tmpdir(void **state) {
    char *dir = strdup("/tmp/test_safetensors.XXXXXX");
    assert_non_null(dir);
    assert_non_null(mkdtemp(dir));
    *state = dir;
    return 0;
}

static int remove_tmpdir(void **state) {
    nftw(*state, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    free(*state);
    return 0;
}

static char *join(const char *dir, const char *name) {
    char *p;
    assert_true(asprintf(&p, "%s/%s", dir, name) > 0);
    return p;
}

static int file_exists(const char *dir, const char *name) {
    char *p = join(dir, name);
    int ok = access(p, F_OK) == 0;
    free(p);
    return ok;
}

static uint8_t *read_all(const char *path, size_t *len) {
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    assert_int_equal(fseek(fp, 0, SEEK_END), 0);
    long n = ftell(fp);
    assert_true(n >= 0);
    rewind(fp);
    uint8_t *buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, fp), (size_t)n);
    fclose(fp);
    *len = (size_t)n;
    return buf;
}

static void write_raw(const char *path, const void *buf, size_t len) {
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(buf, 1, len, fp), len);
    assert_int_equal(fclose(fp), 0);
}

/* An image: 8-byte little-endian length, the header text as given, then data_len bytes. */
static uint8_t *image(const char *header, size_t data_len, size_t *len) {
    size_t n = strlen(header);
    uint8_t *buf = calloc(1, 8 + n + data_len + 1);
    assert_non_null(buf);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)n >> (8 * i));
    memcpy(buf + 8, header, n);
    for (size_t i = 0; i < data_len; i++) buf[8 + n + i] = (uint8_t)i;
    *len = 8 + n + data_len;
    return buf;
}

/* Parses an image that must be rejected with a message containing want. */
static void expect_reject(const char *header, size_t data_len, const char *want) {
    size_t len;
    uint8_t *buf = image(header, data_len, &len);
    st_file f;
    errbuf err = {{0}};
    assert_int_equal(st_parse(&f, buf, len, "bad.safetensors", &err), -1);
    if (!strstr(err.msg, want) || !strstr(err.msg, "bad.safetensors"))
        fail_msg("header %s: message '%s' lacks '%s'", header, err.msg, want);
    assert_int_equal(f.n_tensors, 0); /* st_parse cleaned up */
    assert_null(f.tensors);
    free(buf);
}

static void expect_accept(const char *header, size_t data_len, int n_tensors) {
    size_t len;
    uint8_t *buf = image(header, data_len, &len);
    st_file f;
    errbuf err = {{0}};
    if (st_parse(&f, buf, len, "good.safetensors", &err) < 0) fail_msg("%s: %s", header, err.msg);
    assert_int_equal(f.n_tensors, n_tensors);
    st_close(&f);
    free(buf);
}

/* ---------- dtypes ---------- */

static void test_dtypes(void **state) {
    (void)state;
    static const char *names[] = {"F64", "F32", "F16", "BF16", "I64",
                                  "I32", "I16", "I8",  "U8",   "BOOL"};
    static const size_t sizes[] = {8, 4, 2, 2, 8, 4, 2, 1, 1, 1};
    for (int d = 0; d < ST_DTYPE_COUNT; d++) {
        st_dtype out;
        assert_string_equal(st_dtype_name((st_dtype)d), names[d]);
        assert_int_equal(st_dtype_size((st_dtype)d), sizes[d]);
        assert_int_equal(st_dtype_parse(names[d], &out), 0);
        assert_int_equal(out, d);
    }
    st_dtype out;
    assert_int_equal(st_dtype_parse("f32", &out), -1);
    assert_int_equal(st_dtype_parse("F8_E4M3", &out), -1);
    assert_int_equal(st_dtype_size(ST_DTYPE_COUNT), 0);
}

/* ---------- round trips ---------- */

static void test_roundtrip_every_dtype(void **state) {
    char *path = join(*state, "all.safetensors");
    uint8_t bytes[ST_DTYPE_COUNT][96];
    st_wtensor t[ST_DTYPE_COUNT];
    char names[ST_DTYPE_COUNT][32];
    for (int d = 0; d < ST_DTYPE_COUNT; d++) {
        for (int i = 0; i < 96; i++) bytes[d][i] = (uint8_t)(d * 31 + i * 7);
        snprintf(names[d], sizeof names[d], "layer.%d.%s", d, st_dtype_name((st_dtype)d));
        /* shape [2, 3, 8/size... ] so each tensor is 48 bytes: 2*3*(8/size) elements */
        size_t sz = st_dtype_size((st_dtype)d);
        t[d] = (st_wtensor){.name = names[d], .dtype = (st_dtype)d, .ndim = 3,
                            .shape = {2, 3, (int64_t)(8 / sz)}, .data = bytes[d]};
    }
    st_meta meta[] = {{"step", "7"}, {"job", "tiny"}};
    errbuf err = {{0}};
    if (st_write(path, t, ST_DTYPE_COUNT, meta, 2, &err) < 0) fail_msg("%s", err.msg);
    assert_false(file_exists(*state, "all.safetensors.tmp"));

    st_file f;
    if (st_open(&f, path, &err) < 0) fail_msg("%s", err.msg);
    assert_int_equal(f.n_tensors, ST_DTYPE_COUNT);
    assert_string_equal(st_meta_get(&f, "format"), "pt");
    assert_string_equal(st_meta_get(&f, "step"), "7");
    assert_string_equal(st_meta_get(&f, "job"), "tiny");
    assert_null(st_meta_get(&f, "missing"));
    for (int d = 0; d < ST_DTYPE_COUNT; d++) {
        assert_string_equal(f.tensors[d].name, names[d]); /* data order == write order */
        const st_tensor *x = st_find(&f, names[d]);
        assert_ptr_equal(x, &f.tensors[d]);
        assert_int_equal(x->dtype, d);
        assert_int_equal(x->ndim, 3);
        assert_int_equal(x->shape[0], 2);
        assert_int_equal(x->shape[1], 3);
        assert_int_equal(x->shape[2], 8 / st_dtype_size((st_dtype)d));
        assert_int_equal(x->numel, 48 / st_dtype_size((st_dtype)d));
        assert_int_equal(x->nbytes, 48);
        assert_memory_equal(x->data, bytes[d], 48);
        /* zero copy: the view lies inside the mapping */
        assert_true((const uint8_t *)x->data >= (const uint8_t *)f.map &&
                    (const uint8_t *)x->data + 48 <= (const uint8_t *)f.map + f.map_len);
    }
    assert_null(st_find(&f, "nope"));
    st_close(&f);
    free(path);
}

static void test_byte_layout(void **state) {
    char *path = join(*state, "layout.safetensors");
    float a[3] = {1.0f, -2.5f, 3.25f};
    int32_t b[2] = {7, -9};
    st_wtensor t[] = {
        {.name = "a", .dtype = ST_F32, .ndim = 1, .shape = {3}, .data = a},
        {.name = "b", .dtype = ST_I32, .ndim = 2, .shape = {1, 2}, .data = b},
        {.name = "s", .dtype = ST_F32, .ndim = 0, .data = a}, /* a scalar: one element */
    };
    errbuf err = {{0}};
    if (st_write(path, t, 3, NULL, 0, &err) < 0) fail_msg("%s", err.msg);
    size_t len;
    uint8_t *buf = read_all(path, &len);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | buf[i];
    assert_int_equal(n % 8, 0);
    assert_int_equal(len, 8 + n + 12 + 8 + 4);
    const char *want = "{\"__metadata__\":{\"format\":\"pt\"},"
                       "\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]},"
                       "\"b\":{\"dtype\":\"I32\",\"shape\":[1,2],\"data_offsets\":[12,20]},"
                       "\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[20,24]}}";
    size_t w = strlen(want);
    assert_true(w <= n && n < w + 8);
    assert_memory_equal(buf + 8, want, w);
    for (size_t i = w; i < n; i++) assert_int_equal(buf[8 + i], ' ');
    assert_memory_equal(buf + 8 + n, a, 12);
    assert_memory_equal(buf + 8 + n + 12, b, 8);
    assert_memory_equal(buf + 8 + n + 20, a, 4);
    free(buf);
    free(path);
}

static void test_empty_file(void **state) {
    char *path = join(*state, "empty.safetensors");
    errbuf err = {{0}};
    if (st_write(path, NULL, 0, NULL, 0, &err) < 0) fail_msg("%s", err.msg);
    st_file f;
    if (st_open(&f, path, &err) < 0) fail_msg("%s", err.msg);
    assert_int_equal(f.n_tensors, 0);
    assert_string_equal(st_meta_get(&f, "format"), "pt");
    st_close(&f);
    expect_accept("{}      ", 0, 0);
    expect_accept("{\"__metadata__\":{}}", 0, 0);
    free(path);
}

static void test_write_rejects(void **state) {
    char *path = join(*state, "rejected.safetensors");
    float x[4] = {0};
    errbuf err = {{0}};
    st_wtensor dup[] = {{.name = "w", .dtype = ST_F32, .ndim = 1, .shape = {4}, .data = x},
                        {.name = "w", .dtype = ST_F32, .ndim = 1, .shape = {4}, .data = x}};
    assert_int_equal(st_write(path, dup, 2, NULL, 0, &err), -1);
    assert_non_null(strstr(err.msg, "duplicate tensor name 'w'"));

    st_wtensor bad_dtype = {.name = "w", .dtype = (st_dtype)42, .ndim = 1, .shape = {4}, .data = x};
    assert_int_equal(st_write(path, &bad_dtype, 1, NULL, 0, &err), -1);
    assert_non_null(strstr(err.msg, "dtype"));

    st_wtensor neg = {.name = "neg", .dtype = ST_F32, .ndim = 2, .shape = {2, -2}, .data = x};
    assert_int_equal(st_write(path, &neg, 1, NULL, 0, &err), -1);
    assert_non_null(strstr(err.msg, "'neg'"));
    assert_non_null(strstr(err.msg, "negative"));

    st_wtensor deep = {.name = "deep", .dtype = ST_F32, .ndim = ST_MAX_DIMS + 1, .data = x};
    assert_int_equal(st_write(path, &deep, 1, NULL, 0, &err), -1);
    assert_non_null(strstr(err.msg, "ndim"));

    st_wtensor empty = {.name = "", .dtype = ST_F32, .ndim = 1, .shape = {4}, .data = x};
    assert_int_equal(st_write(path, &empty, 1, NULL, 0, &err), -1);
    assert_non_null(strstr(err.msg, "empty name"));

    st_wtensor reserved = {.name = "__metadata__", .dtype = ST_U8, .ndim = 1, .shape = {1}, .data = x};
    assert_int_equal(st_write(path, &reserved, 1, NULL, 0, &err), -1);
    assert_non_null(strstr(err.msg, "reserved"));

    st_meta dup_meta[] = {{"k", "1"}, {"k", "2"}};
    assert_int_equal(st_write(path, dup, 1, dup_meta, 2, &err), -1);
    assert_non_null(strstr(err.msg, "'k'"));

    assert_false(file_exists(*state, "rejected.safetensors"));
    assert_false(file_exists(*state, "rejected.safetensors.tmp"));
    free(path);
}

/* ---------- model directories ---------- */

/* Six tensors of 256, 256, 1024, 256, 256, 256 bytes; with shards of 600 bytes the greedy
 * split is {t0,t1} {t2} {t3,t4} {t5}: t2 is larger than a shard and gets its own file. */
#define N_MODEL 6
static float model_data[N_MODEL][256];
static char model_names[N_MODEL][32];
static void model_tensors(st_wtensor *t) {
    static const int64_t rows[N_MODEL] = {1, 1, 4, 1, 1, 1};
    for (int i = 0; i < N_MODEL; i++) {
        for (int j = 0; j < 256; j++) model_data[i][j] = (float)(i * 1000 + j);
        snprintf(model_names[i], sizeof model_names[i], "model.layers.%d.weight", i);
        t[i] = (st_wtensor){.name = model_names[i], .dtype = ST_F32, .ndim = 2,
                            .shape = {rows[i], 64}, .data = model_data[i]};
    }
}

static void check_model(const char *dir, int n_files) {
    st_model m;
    errbuf err = {{0}};
    if (st_model_open(&m, dir, &err) < 0) fail_msg("%s", err.msg);
    assert_int_equal(m.n_files, n_files);
    assert_int_equal(m.n_tensors, N_MODEL);
    for (int i = 1; i < m.n_tensors; i++)
        assert_true(strcmp(m.tensors[i - 1]->name, m.tensors[i]->name) < 0);
    for (int i = 0; i < N_MODEL; i++) {
        const st_tensor *t = st_model_find(&m, model_names[i]);
        assert_non_null(t);
        assert_string_equal(t->name, model_names[i]);
        assert_int_equal(t->dtype, ST_F32);
        assert_int_equal(t->nbytes, i == 2 ? 1024 : 256);
        assert_memory_equal(t->data, model_data[i], t->nbytes);
    }
    assert_null(st_model_find(&m, "model.layers.9.weight"));
    assert_null(st_model_find(&m, ""));
    st_model_close(&m);
}

static void test_model_sharded(void **state) {
    char *dir = join(*state, "sharded"); /* st_write_model creates it */
    st_wtensor t[N_MODEL];
    model_tensors(t);
    errbuf err = {{0}};
    if (st_write_model(dir, t, N_MODEL, 600, &err) < 0) fail_msg("%s", err.msg);
    static const char *files[] = {"model-00001-of-00004.safetensors", "model-00002-of-00004.safetensors",
                                  "model-00003-of-00004.safetensors", "model-00004-of-00004.safetensors"};
    static const int shard_of[N_MODEL] = {0, 0, 1, 2, 2, 3};
    for (int i = 0; i < 4; i++) assert_true(file_exists(dir, files[i]));
    assert_false(file_exists(dir, "model-00005-of-00004.safetensors"));
    assert_false(file_exists(dir, "model.safetensors"));
    assert_false(file_exists(dir, "model.safetensors.index.json.tmp"));

    char *index = join(dir, "model.safetensors.index.json");
    json_error_t jerr;
    json_t *root = json_load_file(index, 0, &jerr);
    if (!root) fail_msg("%s: %s", index, jerr.text);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(root, "metadata"),
                                                        "total_size")),
                     5 * 256 + 1024);
    json_t *map = json_object_get(root, "weight_map");
    assert_int_equal(json_object_size(map), N_MODEL);
    for (int i = 0; i < N_MODEL; i++)
        assert_string_equal(json_string_value(json_object_get(map, model_names[i])),
                            files[shard_of[i]]);
    json_decref(root);

    st_file f;
    char *p = join(dir, files[2]);
    if (st_open(&f, p, &err) < 0) fail_msg("%s", err.msg);
    assert_int_equal(f.n_tensors, 2);
    assert_string_equal(f.tensors[0].name, model_names[3]);
    st_close(&f);
    free(p);

    check_model(dir, 4);
    free(index);
    free(dir);
}

static void test_model_single_replaces_index(void **state) {
    char *dir = join(*state, "single");
    st_wtensor t[N_MODEL];
    model_tensors(t);
    errbuf err = {{0}};
    if (st_write_model(dir, t, N_MODEL, 600, &err) < 0) fail_msg("%s", err.msg);
    assert_true(file_exists(dir, "model.safetensors.index.json"));
    /* everything fits: one file, and the old index no longer shadows it */
    if (st_write_model(dir, t, N_MODEL, 1u << 20, &err) < 0) fail_msg("%s", err.msg);
    assert_true(file_exists(dir, "model.safetensors"));
    assert_false(file_exists(dir, "model.safetensors.index.json"));
    check_model(dir, 1);
    /* the exact total also fits in one file */
    if (st_write_model(dir, t, N_MODEL, 5 * 256 + 1024, &err) < 0) fail_msg("%s", err.msg);
    check_model(dir, 1);

    st_wtensor dup[2] = {t[0], t[0]};
    assert_int_equal(st_write_model(dir, dup, 2, 300, &err), -1);
    assert_non_null(strstr(err.msg, "duplicate tensor name"));
    free(dir);
}

static void write_text(const char *dir, const char *name, const char *text) {
    char *p = join(dir, name);
    write_raw(p, text, strlen(text));
    free(p);
}

static void expect_model_reject(const char *dir, const char *want) {
    st_model m;
    errbuf err = {{0}};
    assert_int_equal(st_model_open(&m, dir, &err), -1);
    if (!strstr(err.msg, want)) fail_msg("message '%s' lacks '%s'", err.msg, want);
    assert_int_equal(m.n_files, 0);
    assert_null(m.tensors);
}

static void write_one(const char *dir, const char *file, const char *n1, const char *n2) {
    static const float x[4] = {1, 2, 3, 4};
    st_wtensor t[2] = {{.name = n1, .dtype = ST_F32, .ndim = 1, .shape = {4}, .data = x},
                       {.name = n2, .dtype = ST_F32, .ndim = 1, .shape = {2}, .data = x}};
    char *p = join(dir, file);
    errbuf err = {{0}};
    if (st_write(p, t, n2 ? 2 : 1, NULL, 0, &err) < 0) fail_msg("%s", err.msg);
    free(p);
}

static void test_model_rejects(void **state) {
    const char *dir = *state;
    expect_model_reject(dir, "model.safetensors: open"); /* nothing there */

    write_one(dir, "a.safetensors", "a", NULL);
    write_one(dir, "b.safetensors", "b", NULL);
    write_one(dir, "c.safetensors", "c1", "c2");
    write_one(dir, "d.safetensors", "a", NULL);
    const char *idx = "model.safetensors.index.json";

    write_text(dir, idx, "{\"weight_map\":{\"a\":\"a.safetensors\",\"b\":\"b.safetensors\"}}");
    st_model m;
    errbuf err = {{0}};
    if (st_model_open(&m, dir, &err) < 0) fail_msg("%s", err.msg);
    assert_int_equal(m.n_files, 2);
    assert_int_equal(m.n_tensors, 2);
    assert_non_null(st_model_find(&m, "b"));
    st_model_close(&m);

    write_text(dir, idx, "{\"weight_map\":{\"a\":\"../a.safetensors\"}}");
    expect_model_reject(dir, "weight_map['a'] is not a plain file name");
    write_text(dir, idx, "{\"weight_map\":{\"a\":\"..\"}}");
    expect_model_reject(dir, "not a plain file name");
    write_text(dir, idx, "{\"weight_map\":{\"a\":7}}");
    expect_model_reject(dir, "not a plain file name");
    write_text(dir, idx, "{\"weight_map\":{\"a\":\"a.safetensors\",\"b\":\"a.safetensors\"}}");
    expect_model_reject(dir, "tensor 'b' is not in a.safetensors");
    write_text(dir, idx, "{\"weight_map\":{\"a\":\"b.safetensors\",\"b\":\"a.safetensors\"}}");
    expect_model_reject(dir, "tensor 'a' is in");
    write_text(dir, idx, "{\"weight_map\":{\"c1\":\"c.safetensors\"}}");
    expect_model_reject(dir, "tensor 'c2' of");
    write_text(dir, idx, "{\"weight_map\":{\"a\":\"a.safetensors\",\"x\":\"d.safetensors\"}}");
    expect_model_reject(dir, "tensor 'a' is in both");
    write_text(dir, idx, "{\"weight_map\":{\"z\":\"zz.safetensors\"}}");
    expect_model_reject(dir, "zz.safetensors: open");
    write_text(dir, idx, "{\"metadata\":{}}");
    expect_model_reject(dir, "missing weight_map");
    write_text(dir, idx, "{\"weight_map\":{\"a\":\"a.safetensors\",\"a\":\"a.safetensors\"}}");
    expect_model_reject(dir, "duplicate");
    write_text(dir, idx, "{\"weight_map\":");
    expect_model_reject(dir, idx);
}

/* ---------- reader rejections ---------- */

#define T(name, dtype, shape, b, e) \
    "\"" name "\":{\"dtype\":\"" dtype "\",\"shape\":" shape ",\"data_offsets\":[" #b "," #e "]}"

static void test_reject_header(void **state) {
    (void)state;
    expect_accept("{" T("w", "F32", "[2]", 0, 8) "}", 8, 1);
    expect_accept("{" T("w", "F32", "[2]", 0, 8) "}   ", 8, 1); /* padding */
    expect_accept("{" T("z", "F32", "[0,3]", 0, 0) "," T("w", "U8", "[]", 0, 1) "}", 1, 2);

    /* the length prefix */
    uint8_t short_buf[7] = {2, 0, 0, 0, 0, 0, 0};
    st_file f;
    errbuf err = {{0}};
    assert_int_equal(st_parse(&f, short_buf, sizeof short_buf, "short.st", &err), -1);
    assert_non_null(strstr(err.msg, "short.st: file is 7 bytes, shorter"));

    uint8_t zero[16] = {0};
    assert_int_equal(st_parse(&f, zero, sizeof zero, "zero.st", &err), -1);
    assert_non_null(strstr(err.msg, "zero.st: header length is 0"));

    size_t len;
    uint8_t *buf = image("{}", 0, &len);
    buf[0] = 3; /* 3 > the 2 header bytes present */
    assert_int_equal(st_parse(&f, buf, len, "past.st", &err), -1);
    assert_non_null(strstr(err.msg, "past.st: header length 3 past end of file"));
    buf[0] = 0, buf[4] = 1; /* 4 GiB */
    assert_int_equal(st_parse(&f, buf, len, "huge.st", &err), -1);
    assert_non_null(strstr(err.msg, "huge.st: header length 4294967296 larger than"));
    memset(buf, 0xff, 8);
    assert_int_equal(st_parse(&f, buf, len, "huge.st", &err), -1);
    assert_non_null(strstr(err.msg, "larger than"));
    free(buf);

    /* the JSON */
    expect_reject("[1,2]", 0, "does not start with '{'");
    expect_reject(" {}", 0, "does not start with '{'");
    expect_reject("{\"a\":", 0, "bad header JSON");
    expect_reject("{} x", 0, "bad header JSON");
    expect_reject("{" T("w", "F32", "[1]", 0, 4) "," T("w", "F32", "[1]", 4, 8) "}", 8,
                  "duplicate");
    expect_reject("{\"w\":[1]}", 0, "tensor 'w': entry is not an object");
}

static void test_reject_entries(void **state) {
    (void)state;
    expect_reject("{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "tensor 'w': missing dtype");
    expect_reject("{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, "tensor 'w': missing shape");
    expect_reject("{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "tensor 'w': missing data_offsets");
    expect_reject("{" T("w", "F8", "[1]", 0, 1) "}", 1, "tensor 'w': unknown dtype F8");
    expect_reject("{\"w\":{\"dtype\":1,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "unknown dtype");
    expect_reject("{" T("w", "F32", "[2,-1]", 0, 0) "}", 0, "tensor 'w': shape[1]");
    expect_reject("{" T("w", "F32", "[1.5]", 0, 4) "}", 4, "shape[0]");
    expect_reject("{" T("w", "F32", "3", 0, 12) "}", 12, "shape is not an array");
    expect_reject("{" T("w", "U8", "[1,1,1,1,1,1,1,1,1]", 0, 1) "}", 1, "more than 8");
    expect_reject("{" T("w", "F32", "[4294967296,4294967296,4]", 0, 4) "}", 4, "overflows");
    expect_reject("{" T("w", "F32", "[3]", 0, 8) "}", 8, "tensor 'w': F32 shape needs 12 bytes");
    expect_reject("{" T("w", "F32", "[2]", 8, 0) "}", 8, "tensor 'w': data_offsets begin 8 > end 0");
    expect_reject("{" T("w", "F32", "[2]", 4, 12) "}", 8, "tensor 'w': data_offsets [4, 12] out of range");
    expect_reject("{" T("w", "F32", "[2]", -1, 7) "}", 8, "non-negative");
    expect_reject("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0]}}", 1, "[begin, end]");
    expect_reject("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1,2]}}", 1, "[begin, end]");
    expect_reject("{" T("", "U8", "[1]", 0, 1) "}", 1, "empty name");
    char long_name[400], header[600];
    memset(long_name, 'n', sizeof long_name - 1);
    long_name[sizeof long_name - 1] = 0;
    snprintf(header, sizeof header,
             "{\"%s\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", long_name);
    expect_reject(header, 1, "longer than 255 bytes");
}

static void test_reject_layout(void **state) {
    (void)state;
    expect_reject("{" T("a", "F32", "[2]", 0, 8) "," T("b", "F32", "[2]", 4, 12) "}", 12,
                  "tensor 'b' overlaps tensor 'a'");
    expect_reject("{" T("a", "F32", "[2]", 0, 8) "," T("b", "F32", "[2]", 0, 8) "}", 8, "overlaps");
    expect_reject("{" T("a", "F32", "[2]", 0, 8) "," T("b", "F32", "[1]", 12, 16) "}", 16,
                  "gap of 4 bytes before tensor 'b'");
    expect_reject("{" T("a", "F32", "[1]", 4, 8) "}", 8, "gap of 4 bytes before tensor 'a'");
    expect_reject("{" T("a", "F32", "[2]", 0, 8) "}", 11, "3 trailing bytes after the last tensor");
    expect_reject("{}", 5, "5 trailing bytes");
    /* offsets in any header order, as long as they tile the data */
    expect_accept("{" T("b", "F32", "[1]", 8, 12) "," T("a", "F32", "[2]", 0, 8) "}", 12, 2);
}

static void test_reject_metadata(void **state) {
    (void)state;
    expect_reject("{\"__metadata__\":{\"step\":7}}", 0, "__metadata__ value of 'step' is not a string");
    expect_reject("{\"__metadata__\":{\"a\":\"b\",\"n\":null}}", 0, "'n' is not a string");
    expect_reject("{\"__metadata__\":[\"pt\"]}", 0, "__metadata__ is not an object");
    expect_reject("{\"__metadata__\":{\"a\":\"b\",\"a\":\"c\"}}", 0, "duplicate");
}

static void test_open_errors(void **state) {
    const char *dir = *state;
    char *path = join(dir, "t.safetensors");
    float x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    st_wtensor t[] = {{.name = "first", .dtype = ST_F32, .ndim = 1, .shape = {4}, .data = x},
                      {.name = "last", .dtype = ST_F32, .ndim = 1, .shape = {4}, .data = x + 4}};
    errbuf err = {{0}};
    if (st_write(path, t, 2, NULL, 0, &err) < 0) fail_msg("%s", err.msg);
    size_t len;
    uint8_t *buf = read_all(path, &len);

    st_file f;
    write_raw(path, buf, len - 2); /* truncated in the middle of the data */
    assert_int_equal(st_open(&f, path, &err), -1);
    assert_non_null(strstr(err.msg, path));
    assert_non_null(strstr(err.msg, "tensor 'last': data_offsets [16, 32] out of range"));

    write_raw(path, buf, 40); /* truncated in the middle of the header */
    assert_int_equal(st_open(&f, path, &err), -1);
    assert_non_null(strstr(err.msg, "past end of file"));

    write_raw(path, buf, 5);
    assert_int_equal(st_open(&f, path, &err), -1);
    assert_non_null(strstr(err.msg, "shorter than the 8-byte header length"));
    assert_null(f.map);

    write_raw(path, buf, 0);
    assert_int_equal(st_open(&f, path, &err), -1);
    assert_non_null(strstr(err.msg, "file is 0 bytes"));

    assert_int_equal(st_open(&f, dir, &err), -1);
    assert_non_null(strstr(err.msg, "not a regular file"));

    char *missing = join(dir, "missing.safetensors");
    assert_int_equal(st_open(&f, missing, &err), -1);
    assert_non_null(strstr(err.msg, "missing.safetensors: open: No such file"));

    write_raw(path, buf, len); /* intact again */
    if (st_open(&f, path, &err) < 0) fail_msg("%s", err.msg);
    assert_memory_equal(st_find(&f, "last")->data, x + 4, 16);
    st_close(&f);
    free(missing);
    free(buf);
    free(path);
}

/* ---------- the golden model ---------- */

static void test_golden(void **state) {
    (void)state;
    char dir[4096], path[4096];
    fixture_path(dir, sizeof dir, "golden/tiny-mha");
    fixture_path(path, sizeof path, "golden/tiny-mha/model.safetensors");
    st_file f;
    errbuf err = {{0}};
    if (st_open(&f, path, &err) < 0) fail_msg("%s", err.msg);
    assert_int_equal(f.n_tensors, 21);
    assert_string_equal(st_meta_get(&f, "format"), "pt");
    const st_tensor *e = st_find(&f, "model.embed_tokens.weight");
    assert_non_null(e);
    assert_int_equal(e->dtype, ST_F32);
    assert_int_equal(e->ndim, 2);
    assert_int_equal(e->shape[0], 211);
    assert_int_equal(e->shape[1], 64);
    assert_int_equal(e->nbytes, 211 * 64 * 4);
    const float *w = e->data;
    for (uint64_t i = 0; i < e->numel; i++) assert_true(isfinite(w[i]));
    st_close(&f);

    st_model m;
    if (st_model_open(&m, dir, &err) < 0) fail_msg("%s", err.msg);
    assert_int_equal(m.n_files, 1);
    assert_int_equal(m.n_tensors, 21);
    assert_non_null(st_model_find(&m, "model.embed_tokens.weight"));
    assert_non_null(st_model_find(&m, "model.norm.weight"));
    st_model_close(&m);
}

/* ---------- conversions ---------- */

static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void test_bf16(void **state) {
    (void)state;
    assert_int_equal(bf16_from_f32(1.0f), 0x3f80);
    assert_int_equal(bf16_from_f32(-2.0f), 0xc000);
    assert_int_equal(bf16_from_f32(0.0f), 0x0000);
    assert_int_equal(bf16_from_f32(-0.0f), 0x8000);
    /* ties go to the even neighbour; anything past the tie rounds up */
    assert_int_equal(bf16_from_f32(from_bits(0x3f808000)), 0x3f80); /* tie, 0x3f80 even */
    assert_int_equal(bf16_from_f32(from_bits(0x3f818000)), 0x3f82); /* tie, 0x3f81 odd */
    assert_int_equal(bf16_from_f32(from_bits(0x3f808001)), 0x3f81);
    assert_int_equal(bf16_from_f32(from_bits(0x3f807fff)), 0x3f80);
    assert_int_equal(bf16_from_f32(from_bits(0x7f7fffff)), 0x7f80); /* FLT_MAX rounds to inf */
    assert_int_equal(bf16_from_f32(INFINITY), 0x7f80);
    assert_int_equal(bf16_from_f32(-INFINITY), 0xff80);
    uint16_t nan = bf16_from_f32(NAN);
    assert_true((nan & 0x7f80) == 0x7f80 && (nan & 0x7f) != 0);
    /* a NaN whose payload is only in the low bits must not become inf */
    assert_true(isnan(bf16_to_f32(bf16_from_f32(from_bits(0x7f800001)))));
    assert_true(isnan(bf16_to_f32(bf16_from_f32(from_bits(0xffc00000)))));
    assert_true(bf16_to_f32(0x3f80) == 1.0f);
    assert_true(bf16_to_f32(0x4049) == 3.140625f);
    for (uint32_t h = 0; h < 0x10000; h++) /* every finite bf16 survives the round trip */
        if ((h & 0x7f80) != 0x7f80) assert_int_equal(bf16_from_f32(bf16_to_f32((uint16_t)h)), h);
}

static void test_f16(void **state) {
    (void)state;
    assert_int_equal(f16_from_f32(1.0f), 0x3c00);
    assert_int_equal(f16_from_f32(-2.0f), 0xc000);
    assert_int_equal(f16_from_f32(65504.0f), 0x7bff);      /* the largest half */
    assert_int_equal(f16_from_f32(65519.0f), 0x7bff);      /* below the tie: stays finite */
    assert_int_equal(f16_from_f32(65520.0f), 0x7c00);      /* tie rounds to inf */
    assert_int_equal(f16_from_f32(1e10f), 0x7c00);
    assert_int_equal(f16_from_f32(-INFINITY), 0xfc00);
    assert_int_equal(f16_from_f32(ldexpf(1, -14)), 0x0400); /* smallest normal */
    assert_int_equal(f16_from_f32(ldexpf(1, -24)), 0x0001); /* smallest subnormal */
    assert_int_equal(f16_from_f32(ldexpf(1, -25)), 0x0000); /* tie to even: 0 */
    assert_int_equal(f16_from_f32(ldexpf(1.5f, -25)), 0x0001);
    assert_int_equal(f16_from_f32(ldexpf(3, -25)), 0x0002); /* 1.5 units: tie to even 2 */
    assert_int_equal(f16_from_f32(ldexpf(1023, -24)), 0x03ff);
    assert_int_equal(f16_from_f32(ldexpf(1023.5f, -24)), 0x0400); /* rounds up into normal */
    assert_int_equal(f16_from_f32(1e-30f), 0x0000);
    assert_int_equal(f16_from_f32(-1e-30f), 0x8000);
    assert_int_equal(f16_from_f32(from_bits(0x3f801000)), 0x3c00); /* tie, even */
    assert_int_equal(f16_from_f32(from_bits(0x3f803000)), 0x3c02); /* tie, odd: up */
    assert_true(isnan(f16_to_f32(f16_from_f32(NAN))));
    assert_true(isnan(f16_to_f32(f16_from_f32(from_bits(0x7f800001)))));
    assert_true(f16_to_f32(0x0001) == ldexpf(1, -24));
    assert_true(f16_to_f32(0x03ff) == ldexpf(1023, -24));
    assert_true(f16_to_f32(0x8200) == -ldexpf(1, -15));
    assert_true(f16_to_f32(0x7bff) == 65504.0f);
    assert_true(isinf(f16_to_f32(0x7c00)));
    for (uint32_t h = 0; h < 0x10000; h++) /* every non-NaN half survives the round trip */
        if ((h & 0x7fff) <= 0x7c00) assert_int_equal(f16_from_f32(f16_to_f32((uint16_t)h)), h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dtypes),
        cmocka_unit_test_setup_teardown(test_roundtrip_every_dtype, make_tmpdir, remove_tmpdir),
        cmocka_unit_test_setup_teardown(test_byte_layout, make_tmpdir, remove_tmpdir),
        cmocka_unit_test_setup_teardown(test_empty_file, make_tmpdir, remove_tmpdir),
        cmocka_unit_test_setup_teardown(test_write_rejects, make_tmpdir, remove_tmpdir),
        cmocka_unit_test_setup_teardown(test_model_sharded, make_tmpdir, remove_tmpdir),
        cmocka_unit_test_setup_teardown(test_model_single_replaces_index, make_tmpdir,
                                        remove_tmpdir),
        cmocka_unit_test_setup_teardown(test_model_rejects, make_tmpdir, remove_tmpdir),
        cmocka_unit_test(test_reject_header),
        cmocka_unit_test(test_reject_entries),
        cmocka_unit_test(test_reject_layout),
        cmocka_unit_test(test_reject_metadata),
        cmocka_unit_test_setup_teardown(test_open_errors, make_tmpdir, remove_tmpdir),
        cmocka_unit_test(test_golden),
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_f16),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
