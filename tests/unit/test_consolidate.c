/* consolidate: checkpoints written here with the proto/ckpt.h API (values a function of the
 * unit and element, so every output byte can be predicted) are consolidated and read back
 * with proto/safetensors.
 *
 * Run with arguments, the binary is instead one of the integration test's helpers:
 *   test_consolidate --write-checkpoint CONFIG.json CKPT_DIR N_FILES sparse|dense
 *     writes CKPT_DIR/step-000007 (+ latest) for that model: shard files whose master
 *     sections hold values (sparse: only in their first 4 KiB, zeros (holes) after, so a
 *     model of several GB costs no disk), AdamW moments all holes, CRCs right;
 *   test_consolidate --write-adapter-checkpoint MODEL_DIR PEFT_DIR CKPT_DIR N_FILES
 *     writes CKPT_DIR/step-000007 (+ latest): an adapter job's checkpoint whose masters are
 *     the PEFT adapter of PEFT_DIR, on the base MODEL_DIR (its path and fingerprint);
 *   test_consolidate --max-rss FILE CMD [ARGS...]
 *     runs CMD, writes its peak resident set (ru_maxrss, KiB) into FILE, exits with its
 *     status. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/bf16.h"
#include "base/crc32c.h"
#include "base/fileio.h"
#include "daemon/consolidate.h"
#include "proto/ckpt.h"
#include "proto/model_config.h"
#include "proto/peft.h"
#include "proto/safetensors.h"
#include "tests/unit/fixtures.h"

/* Flat sizes that 3 divides and 5 does not (padding with 5 files). */
static const char small_config[] =
    "{\"model_type\": \"llama\", \"hidden_size\": 36, \"intermediate_size\": 70,"
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
    " \"head_dim\": 10, \"vocab_size\": 61, \"max_position_embeddings\": 64,"
    " \"rms_norm_eps\": 1e-5, \"tie_word_embeddings\": %s, \"rope_theta\": 10000.0,"
    " \"bos_token_id\": 1, \"eos_token_id\": %s}";

#define STEP 7

/* ---- checkpoints ---- */

/* Element i of unit `unit`'s flat parameter `kind`: finite floats with full mantissas. */
static float value_of(int kind, int unit, uint64_t i) {
    uint64_t x = (uint64_t)unit * 0x9E3779B97F4A7C15ull ^ (i + 1) * 0xBF58476D1CE4E5B9ull ^
                 (uint64_t)kind * 0x94D049BB133111EBull;
    x ^= x >> 31;
    x *= 0xD6E8FEB86659FD93ull;
    x ^= x >> 32;
    uint32_t bits = ((uint32_t)x & 0x807fffffu) | (uint32_t)(100 + (x >> 40) % 50) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* The layout of the model for n_files files: unit 0 the embedding, 1..L the layers, L+1 the
 * final norm and the head, tensors in llama_config_params order. */
static int layout_for(const llama_config *c, int n_files, ckpt_layout *lo, errbuf *err) {
    int n = llama_config_params(c, NULL, 0), n_units = c->num_hidden_layers + 2;
    llama_param_info *p = calloc((size_t)n, sizeof *p);
    if (!p || ckpt_layout_alloc(lo, n_files, n_units, n, err)) {
        free(p);
        return -1;
    }
    llama_config_params(c, p, n);
    for (int i = 0; i < n; i++) {
        int u = p[i].layer >= 0 ? p[i].layer + 1 : i == 0 ? 0 : n_units - 1;
        ckpt_unit *U = &lo->units[u];
        ckpt_tensor *t = &lo->tensors[i];
        snprintf(t->name, sizeof t->name, "%s", p[i].name);
        t->ndim = p[i].ndim;
        t->shape[0] = p[i].shape[0];
        t->shape[1] = p[i].ndim == 2 ? p[i].shape[1] : 0;
        t->numel = (uint64_t)p[i].shape[0] * (uint64_t)(p[i].ndim == 2 ? p[i].shape[1] : 1);
        t->is_norm = p[i].is_norm;
        t->offset = U->numel;
        if (U->count++ == 0) U->first = i;
        U->numel += t->numel;
    }
    for (int u = 0; u < n_units; u++) {
        lo->units[u].padded = (lo->units[u].numel + (uint64_t)n_files - 1) / (uint64_t)n_files * (uint64_t)n_files;
        lo->units[u].shard = lo->units[u].padded / (uint64_t)n_files;
    }
    free(p);
    return ckpt_layout_check(lo, err);
}

/* A manifest's settings for a job of n_files ranks, without layout; files[] to be filled in. */
static int manifest_settings(ckpt_manifest *m, const char *config_text, int n_files, errbuf *err) {
    memset(m, 0, sizeof *m);
    m->step = m->optimizer_step = STEP;
    m->global_batch = 4;
    m->global_sample = STEP * 4;
    m->tokens_seen = 1000;
    m->seed = 3;
    m->world_size = n_files;
    snprintf(m->sharding, sizeof m->sharding, "full_shard");
    m->train = (ckpt_train_settings){.lr = 1e-3, .betas = {0.9, 0.95}, .eps = 1e-8, .total_steps = 10};
    snprintf(m->train.schedule, sizeof m->train.schedule, "constant");
    json_error_t je;
    m->model_config = json_loads(config_text, 0, &je);
    m->files = calloc((size_t)n_files, sizeof *m->files);
    if (!m->model_config || !m->files) return errf(err, "manifest: out of memory");
    return 0;
}

/* A manifest for the model, files[] to be filled in. */
static int manifest_for(ckpt_manifest *m, const char *config_text, int n_files, errbuf *err) {
    llama_config c;
    if (llama_config_parse(&c, config_text, strlen(config_text), "config", err) ||
        manifest_settings(m, config_text, n_files, err))
        return -1;
    return layout_for(&c, n_files, &m->layout, err);
}

/* Writes the manifest into CKPT/step-N and points CKPT/latest at it. */
static int commit_manifest(const ckpt_manifest *m, const char *ckpt, const char *step_name, errbuf *err) {
    char path[4096], *text;
    snprintf(path, sizeof path, "%s/%s/%s", ckpt, step_name, CKPT_MANIFEST);
    if (ckpt_manifest_to_json(m, &text, err)) return -1;
    file_chunk chunk = {text, strlen(text)};
    int rc = file_write_atomic(path, &chunk, 1, err);
    free(text);
    snprintf(path, sizeof path, "%s/%s", ckpt, CKPT_LATEST);
    if (rc == 0 && symlink(step_name, path) != 0) rc = errf(err, "%s: %s", path, strerror(errno));
    return rc;
}

/* Element e of unit's flat parameter `kind`, from ctx. */
typedef float (*value_fn)(const void *ctx, int kind, int unit, uint64_t e);

static float computed_value(const void *ctx, int kind, int unit, uint64_t e) {
    (void)ctx;
    return value_of(kind, unit, e);
}

/* The manifest's shard files, dense (ckpt_write_image), with the values of v, into
 * CKPT/step-000007, and the manifest committed. */
static int write_shards(const char *ckpt, ckpt_manifest *m, value_fn v, const void *ctx, errbuf *err) {
    char step_name[64], dir[1024], path[4096];
    const ckpt_layout *lo = &m->layout;
    ckpt_step_name(step_name, sizeof step_name, STEP);
    snprintf(dir, sizeof dir, "%s/%s", ckpt, step_name);
    if (file_mkdir(ckpt, err) || file_mkdir(dir, err)) return -1;
    for (int r = 0; r < lo->n_files; r++) {
        ckpt_file_header h;
        if (ckpt_plan(&h, lo, r, STEP, err)) return -1;
        unsigned char *image = calloc(1, h.file_bytes);
        if (!image) return errf(err, "out of memory");
        for (int i = 0; i < h.n_sections; i++) {
            const ckpt_section *s = &h.sections[i];
            const ckpt_unit *U = &lo->units[s->unit];
            float *dst = (float *)(image + s->offset);
            for (uint64_t j = 0; j < U->shard; j++) {
                uint64_t e = (uint64_t)r * U->shard + j;
                dst[j] = e < U->numel ? v(ctx, (int)s->kind, (int)s->unit, e) : 0.0f;
            }
        }
        ckpt_file_name(m->files[r].name, sizeof m->files[r].name, r, lo->n_files);
        snprintf(path, sizeof path, "%s/%s", dir, m->files[r].name);
        int rc = ckpt_write_image(path, image, &h, NULL, NULL, err);
        m->files[r].rank = r;
        m->files[r].bytes = h.file_bytes;
        m->files[r].header_crc = h.crc;
        free(image);
        ckpt_file_header_free(&h);
        if (rc) return -1;
    }
    return commit_manifest(m, ckpt, step_name, err);
}

/* CKPT/step-000007 with n_files dense shard files. */
static void write_checkpoint(const char *ckpt, const char *config_text, int n_files) {
    ckpt_manifest m;
    errbuf err = {{0}};
    assert_int_equal(manifest_for(&m, config_text, n_files, &err), 0);
    if (write_shards(ckpt, &m, computed_value, NULL, &err)) fail_msg("%s", err.msg);
    ckpt_manifest_free(&m);
}

/* ---- adapter checkpoints ---- */

static float adapter_value(const void *ctx, int kind, int unit, uint64_t e) {
    const float *const *units = ctx;
    return kind == CKPT_MASTER ? units[unit][e] : 0.0f;
}

/* An adapter job's checkpoint (n_files files) whose masters are the PEFT adapter in
 * peft_dir, trained on the base model in model_dir (its path and fingerprint recorded). */
static int write_adapter_checkpoint(const char *model_dir, const char *peft_dir, const char *ckpt,
                                    int n_files, errbuf *err) {
    char path[4096], *config;
    size_t len;
    llama_config mc;
    lora_layout lo;
    float **units;
    ckpt_manifest m;
    st_model base;
    snprintf(path, sizeof path, "%s/config.json", model_dir);
    if (file_read_all(path, 1 << 20, &config, &len, err)) return -1;
    int rc = llama_config_parse(&mc, config, len, path, err) || manifest_settings(&m, config, n_files, err) ? -1 : 0;
    free(config);
    if (rc || peft_load(peft_dir, &mc, &lo, &units, err)) return -1;
    rc = ckpt_layout_from_slots(&m.layout, n_files, lo.units, lo.n_units, lo.tensors, lo.n_tensors, err);
    m.has_adapter = 1;
    snprintf(m.adapter.type, sizeof m.adapter.type, "lora");
    m.adapter.lora = lo.cfg;
    if (rc == 0 && !realpath(model_dir, m.model_path)) rc = errf(err, "%s: %s", model_dir, strerror(errno));
    if (rc == 0 && (rc = st_model_open(&base, model_dir, err)) == 0) {
        st_model_fingerprint(&base, m.adapter.base_fingerprint);
        st_model_close(&base);
    }
    if (rc == 0) rc = write_shards(ckpt, &m, adapter_value, units, err);
    peft_units_free(units, lo.n_units);
    lora_layout_free(&lo);
    ckpt_manifest_free(&m);
    return rc;
}

/* ---- test fixtures ---- */

typedef struct fixture {
    char root[64];
    char ckpt[256], out[256];
    ckpt_manifest m; /* of the checkpoint written */
} fixture;

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static void remove_tree(const char *path) { nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS); }

static fixture *fixture_new(const char *tie, const char *eos, int n_files) {
    fixture *f = calloc(1, sizeof *f);
    assert_non_null(f);
    snprintf(f->root, sizeof f->root, "/tmp/test_consolidate.XXXXXX");
    assert_non_null(mkdtemp(f->root));
    snprintf(f->ckpt, sizeof f->ckpt, "%s/ckpt", f->root);
    snprintf(f->out, sizeof f->out, "%s/out", f->root);
    char config[1024], step_dir[512];
    snprintf(config, sizeof config, small_config, tie, eos);
    write_checkpoint(f->ckpt, config, n_files);
    snprintf(step_dir, sizeof step_dir, "%s/step-%06d", f->ckpt, STEP);
    errbuf err;
    assert_int_equal(ckpt_manifest_load(&f->m, step_dir, &err), 0);
    return f;
}

static int setup_untied(void **state) {
    *state = fixture_new("false", "2", 3);
    return 0;
}

static int setup_padded(void **state) {
    *state = fixture_new("false", "2", 5);
    return 0;
}

static int setup_tied(void **state) {
    *state = fixture_new("true", "2", 2);
    return 0;
}

static int setup_eos_list(void **state) { /* Llama 3.1 style: several eos ids */
    *state = fixture_new("false", "[2, 5, 7]", 3);
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    ckpt_manifest_free(&f->m);
    remove_tree(f->root);
    free(f);
    return 0;
}

static consolidate_options options(const fixture *f, st_dtype dtype, consolidate_result *r) {
    return (consolidate_options){.ckpt = f->ckpt, .out = f->out, .dtype = dtype, .adapter_dtype = ST_F32,
                                 .shard_bytes = CONSOLIDATE_SHARD_SIZE, .threads = 2, .result = r};
}

static int exists(const char *dir, const char *name) {
    char path[4096];
    struct stat st;
    snprintf(path, sizeof path, "%s%s%s", dir, name ? "/" : "", name ? name : "");
    return stat(path, &st) == 0;
}

static json_t *load_json(const char *dir, const char *name) {
    char path[4096];
    json_error_t je;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    json_t *j = json_load_file(path, 0, &je);
    assert_non_null(j);
    return j;
}

/* Every tensor of the model in `dir` holds the checkpoint's master values, as dtype. */
static void assert_model_matches(const fixture *f, const char *dir, st_dtype dtype) {
    st_model model;
    errbuf err = {{0}};
    if (st_model_open(&model, dir, &err)) fail_msg("%s", err.msg);
    const ckpt_layout *lo = &f->m.layout;
    assert_int_equal(model.n_tensors, lo->n_tensors);
    for (int u = 0; u < lo->n_units; u++)
        for (int i = lo->units[u].first; i < lo->units[u].first + lo->units[u].count; i++) {
            const ckpt_tensor *t = &lo->tensors[i];
            const st_tensor *s = st_model_find(&model, t->name);
            assert_non_null(s);
            assert_int_equal(s->dtype, dtype);
            assert_int_equal(s->ndim, t->ndim);
            assert_int_equal(s->shape[0], t->shape[0]);
            if (t->ndim == 2) assert_int_equal(s->shape[1], t->shape[1]);
            for (uint64_t j = 0; j < t->numel; j++) {
                float want = value_of(CKPT_MASTER, u, t->offset + j);
                if (dtype == ST_F32) {
                    float have;
                    memcpy(&have, (const unsigned char *)s->data + 4 * j, 4);
                    if (memcmp(&have, &want, 4)) fail_msg("%s[%llu]: %g, want %g", t->name, (unsigned long long)j, have, want);
                } else {
                    uint16_t have;
                    memcpy(&have, (const unsigned char *)s->data + 2 * j, 2);
                    if (have != bf16_from_f32(want))
                        fail_msg("%s[%llu]: %04x, want %04x", t->name, (unsigned long long)j, have,
                                 bf16_from_f32(want));
                }
            }
        }
    st_model_close(&model);
}

/* Inside each file, tensors are sorted by name (st_file lists them in data order). */
static void assert_sorted_by_name(const char *path) {
    st_file file;
    errbuf err;
    if (st_open(&file, path, &err)) fail_msg("%s", err.msg);
    assert_string_equal(st_meta_get(&file, "format"), "pt");
    for (int i = 1; i < file.n_tensors; i++)
        assert_true(strcmp(file.tensors[i - 1].name, file.tensors[i].name) < 0);
    st_close(&file);
}

/* Flips one byte of shard file `file` at byte `at` of section (kind, unit). */
static void corrupt(const fixture *f, int file, int kind, int unit, uint64_t at) {
    char path[4096];
    ckpt_file_header h;
    errbuf err;
    snprintf(path, sizeof path, "%s/step-%06d/%s", f->ckpt, STEP, f->m.files[file].name);
    assert_int_equal(ckpt_plan(&h, &f->m.layout, file, STEP, &err), 0);
    uint64_t off = h.sections[ckpt_section_index(f->m.layout.n_units, kind, unit)].offset + at;
    ckpt_file_header_free(&h);
    int fd = open(path, O_RDWR);
    unsigned char byte;
    assert_true(fd >= 0);
    assert_int_equal(pread(fd, &byte, 1, (off_t)off), 1);
    byte ^= 0x10;
    assert_int_equal(pwrite(fd, &byte, 1, (off_t)off), 1);
    close(fd);
}

/* ---- tests ---- */

/* f32, many small files, a 4 KiB buffer (chunks cross the shard files' boundaries): every
 * value exact, files in checkpoint order, tensors by name inside, the index right. */
static void test_f32_sharded_exact(void **state) {
    fixture *f = *state;
    consolidate_result r;
    consolidate_options o = options(f, ST_F32, &r);
    o.shard_bytes = 30000;
    o.threads = 3;
    o.buffer_bytes = 4096;
    errbuf err = {{0}};
    if (consolidate(&o, &err)) fail_msg("%s", err.msg);
    assert_model_matches(f, f->out, ST_F32);
    assert_true(r.files > 3);
    assert_int_equal(r.tensors, f->m.layout.n_tensors);
    assert_int_equal(r.step, STEP);
    assert_false(exists(f->out, "model.safetensors"));
    assert_false(exists(f->root, "out.partial"));

    json_t *index = load_json(f->out, "model.safetensors.index.json");
    uint64_t total = 0;
    for (int i = 0; i < f->m.layout.n_tensors; i++) total += 4 * f->m.layout.tensors[i].numel;
    assert_int_equal(json_integer_value(json_object_get(json_object_get(index, "metadata"), "total_size")), total);
    assert_int_equal(r.bytes, total);
    json_t *map = json_object_get(index, "weight_map");
    assert_int_equal(json_object_size(map), f->m.layout.n_tensors);
    /* files follow checkpoint order: the embedding first, the head in the last file */
    char last[64];
    snprintf(last, sizeof last, "model-%05d-of-%05d.safetensors", r.files, r.files);
    assert_int_equal(strncmp(json_string_value(json_object_get(map, "model.embed_tokens.weight")), "model-00001-of-", 15), 0);
    assert_string_equal(json_string_value(json_object_get(map, "lm_head.weight")), last);
    for (int k = 1; k <= r.files; k++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/model-%05d-of-%05d.safetensors", f->out, k, r.files);
        assert_sorted_by_name(path);
        struct stat st;
        assert_int_equal(stat(path, &st), 0);
        assert_true(st.st_size <= 30000 + 4096); /* data within the shard size, plus header */
    }
    json_decref(index);

    json_t *config = load_json(f->out, "config.json");
    assert_string_equal(json_string_value(json_object_get(config, "dtype")), "float32");
    assert_string_equal(json_string_value(json_object_get(config, "model_type")), "llama");
    assert_int_equal(json_integer_value(json_object_get(config, "hidden_size")), 36);
    json_decref(config);
    json_t *gen = load_json(f->out, "generation_config.json");
    assert_int_equal(json_integer_value(json_object_get(gen, "bos_token_id")), 1);
    assert_true(json_is_integer(json_object_get(gen, "eos_token_id"))); /* an int stays an int */
    assert_int_equal(json_integer_value(json_object_get(gen, "eos_token_id")), 2);
    json_decref(gen);
}

/* bf16 (the default), one file when it fits: each value is the f32 one rounded to bf16. */
static void test_bf16_single_file(void **state) {
    fixture *f = *state;
    consolidate_result r;
    consolidate_options o = options(f, ST_BF16, &r);
    errbuf err = {{0}};
    if (consolidate(&o, &err)) fail_msg("%s", err.msg);
    assert_int_equal(r.files, 1);
    assert_true(exists(f->out, "model.safetensors"));
    assert_false(exists(f->out, "model.safetensors.index.json"));
    assert_model_matches(f, f->out, ST_BF16);
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", f->out);
    assert_sorted_by_name(path);
    json_t *config = load_json(f->out, "config.json");
    assert_string_equal(json_string_value(json_object_get(config, "dtype")), "bfloat16");
    json_decref(config);
}

/* Five files leave padding at the end of units; every thread count and a 1-float buffer
 * give the same bytes. */
static void test_padding_and_threads(void **state) {
    fixture *f = *state;
    errbuf err = {{0}};
    for (int threads = 1; threads <= 4; threads += 3) {
        consolidate_options o = options(f, ST_F32, NULL);
        o.threads = threads;
        o.shard_bytes = 10000;
        o.buffer_bytes = threads == 1 ? 4 : 0;
        if (consolidate(&o, &err)) fail_msg("%s", err.msg);
        assert_model_matches(f, f->out, ST_F32);
        remove_tree(f->out);
    }
}

/* CKPT itself (its latest) or the step directory; not a checkpoint; a missing one. */
static void test_checkpoint_paths(void **state) {
    fixture *f = *state;
    errbuf err = {{0}};
    char step_dir[512];
    snprintf(step_dir, sizeof step_dir, "%s/step-%06d/", f->ckpt, STEP);
    consolidate_options o = options(f, ST_F32, NULL);
    o.ckpt = step_dir;
    if (consolidate(&o, &err)) fail_msg("%s", err.msg);
    assert_model_matches(f, f->out, ST_F32);

    o.ckpt = f->root; /* neither a manifest nor a latest */
    assert_int_equal(consolidate(&o, &err), -1);
    assert_non_null(strstr(err.msg, "not a checkpoint"));
    char missing[512];
    snprintf(missing, sizeof missing, "%s/none", f->root);
    o.ckpt = missing;
    assert_int_equal(consolidate(&o, &err), -1);
    assert_non_null(strstr(err.msg, missing));
    char link[512];
    snprintf(link, sizeof link, "%s/latest", f->ckpt);
    assert_int_equal(unlink(link), 0);
    assert_int_equal(symlink("step-000099", link), 0);
    o.ckpt = f->ckpt;
    assert_int_equal(consolidate(&o, &err), -1);
    assert_non_null(strstr(err.msg, "step-000099"));
}

/* A corrupt master section is refused, naming the file and the unit; nothing is left. */
static void test_corrupt_master(void **state) {
    fixture *f = *state;
    errbuf err = {{0}};
    corrupt(f, 1, CKPT_MASTER, 2, 1000);
    consolidate_options o = options(f, ST_BF16, NULL);
    assert_int_equal(consolidate(&o, &err), -1);
    assert_non_null(strstr(err.msg, "rank-00001-of-00003.bin"));
    assert_non_null(strstr(err.msg, "master of unit 2: CRC32C mismatch"));
    assert_false(exists(f->out, NULL));
    assert_false(exists(f->root, "out.partial"));
}

/* Only master sections are read: a corrupt AdamW moment does not matter. */
static void test_moments_not_read(void **state) {
    fixture *f = *state;
    errbuf err = {{0}};
    corrupt(f, 2, CKPT_EXP_AVG_SQ, 1, 8);
    consolidate_options o = options(f, ST_F32, NULL);
    if (consolidate(&o, &err)) fail_msg("%s", err.msg);
    assert_model_matches(f, f->out, ST_F32);
}

/* A byte of padding (past the unit's last tensor, read by no tensor) is checked too. */
static void test_corrupt_padding(void **state) {
    fixture *f = *state;
    errbuf err = {{0}};
    int last = f->m.layout.n_units - 1;
    const ckpt_unit *U = &f->m.layout.units[last];
    assert_true(U->padded > U->numel); /* 2232 elements in 5 files */
    corrupt(f, 4, CKPT_MASTER, last, (U->shard - 1) * 4 + 3);
    consolidate_options o = options(f, ST_F32, NULL);
    assert_int_equal(consolidate(&o, &err), -1);
    assert_non_null(strstr(err.msg, "rank-00004-of-00005.bin"));
    assert_non_null(strstr(err.msg, "CRC32C mismatch"));
}

/* A truncated shard file is refused, naming it, before anything is written. */
static void test_truncated_file(void **state) {
    fixture *f = *state;
    errbuf err = {{0}};
    char path[4096];
    snprintf(path, sizeof path, "%s/step-%06d/%s", f->ckpt, STEP, f->m.files[0].name);
    assert_int_equal(truncate(path, (off_t)f->m.files[0].bytes - 100), 0);
    consolidate_options o = options(f, ST_F32, NULL);
    assert_int_equal(consolidate(&o, &err), -1);
    assert_non_null(strstr(err.msg, "rank-00000-of-00003.bin"));
    assert_false(exists(f->root, "out.partial"));
}

static void write_text(const char *dir, const char *name, const char *text) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    fputs(text, fp);
    assert_int_equal(fclose(fp), 0);
}

static int file_equals(const char *dir, const char *name, const char *text) {
    char path[4096], *have;
    size_t len;
    errbuf err;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (file_read_all(path, 1 << 20, &have, &len, &err)) return 0;
    int same = len == strlen(text) && memcmp(have, text, len) == 0;
    free(have);
    return same;
}

/* An existing OUT (fsdpd's output.dir): other files kept, stale weights removed, the model
 * replaced; a stale OUT.partial is cleared first. */
static void test_existing_output(void **state) {
    fixture *f = *state;
    errbuf err = {{0}};
    char partial[512];
    snprintf(partial, sizeof partial, "%s.partial", f->out);
    assert_int_equal(mkdir(f->out, 0755), 0);
    assert_int_equal(mkdir(partial, 0755), 0);
    write_text(f->out, "metrics.jsonl", "{\"step\": 1}\n");
    write_text(f->out, "model-00001-of-00009.safetensors", "stale");
    write_text(f->out, "model.safetensors.index.json", "{}");
    write_text(f->out, "config.json", "{}");
    write_text(partial, "model.safetensors", "interrupted");
    consolidate_options o = options(f, ST_F32, NULL);
    if (consolidate(&o, &err)) fail_msg("%s", err.msg);
    assert_true(file_equals(f->out, "metrics.jsonl", "{\"step\": 1}\n"));
    assert_false(exists(f->out, "model-00001-of-00009.safetensors"));
    assert_false(exists(f->out, "model.safetensors.index.json"));
    assert_false(exists(partial, NULL));
    assert_model_matches(f, f->out, ST_F32);
    /* an OUT that is a file is refused */
    write_text(f->root, "file", "x");
    snprintf(partial, sizeof partial, "%s/file", f->root);
    o.out = partial;
    assert_int_equal(consolidate(&o, &err), -1);
    assert_non_null(strstr(err.msg, "not a directory"));
}

/* Tokenizer files and generation_config.json come from the source model directory. */
static void test_tokenizer_copied(void **state) {
    fixture *f = *state;
    errbuf err = {{0}};
    consolidate_result r;
    char src[512];
    snprintf(src, sizeof src, "%s/src", f->root);
    assert_int_equal(mkdir(src, 0755), 0);
    write_text(src, "tokenizer.json", "{\"model\": {}}");
    write_text(src, "tokenizer_config.json", "{\"bos_token\": \"<s>\"}");
    write_text(src, "generation_config.json", "{\"temperature\": 0.6}");
    consolidate_options o = options(f, ST_BF16, &r);
    o.tokenizer_from = src;
    if (consolidate(&o, &err)) fail_msg("%s", err.msg);
    assert_int_equal(r.tokenizer_files, 2);
    assert_true(file_equals(f->out, "tokenizer.json", "{\"model\": {}}"));
    assert_true(file_equals(f->out, "tokenizer_config.json", "{\"bos_token\": \"<s>\"}"));
    assert_true(file_equals(f->out, "generation_config.json", "{\"temperature\": 0.6}"));
    assert_false(exists(f->out, "tokenizer.model"));
    remove_tree(f->out);
    snprintf(src, sizeof src, "%s/none", f->root);
    assert_int_equal(consolidate(&o, &err), -1);
    assert_non_null(strstr(err.msg, src));
}

/* The manifest's model_path becomes path (rewritten in the step directory). */
static void set_model_path(fixture *f, const char *path) {
    char step_dir[512], file[600], *text;
    errbuf err = {{0}};
    snprintf(f->m.model_path, sizeof f->m.model_path, "%s", path);
    snprintf(step_dir, sizeof step_dir, "%s/step-%06d", f->ckpt, STEP);
    snprintf(file, sizeof file, "%s/%s", step_dir, CKPT_MANIFEST);
    assert_int_equal(ckpt_manifest_to_json(&f->m, &text, &err), 0);
    file_chunk chunk = {text, strlen(text)};
    assert_int_equal(file_write_atomic(file, &chunk, 1, &err), 0);
    free(text);
}

/* Without tokenizer_from, the files come from the model directory the manifest records;
 * tokenizer_from still overrides it; a recorded directory that is gone is a warning. */
static void test_tokenizer_from_manifest(void **state) {
    fixture *f = *state;
    errbuf err = {{0}};
    consolidate_result r;
    char model[512], other[512];
    snprintf(model, sizeof model, "%s/model", f->root);
    snprintf(other, sizeof other, "%s/other", f->root);
    assert_int_equal(mkdir(model, 0755), 0);
    assert_int_equal(mkdir(other, 0755), 0);
    write_text(model, "tokenizer.json", "{\"model\": \"recorded\"}");
    write_text(model, "special_tokens_map.json", "{}");
    write_text(model, "generation_config.json", "{\"top_p\": 0.9}");
    write_text(other, "tokenizer.json", "{\"model\": \"other\"}");
    set_model_path(f, model);
    consolidate_options o = options(f, ST_BF16, &r);
    if (consolidate(&o, &err)) fail_msg("%s", err.msg);
    assert_int_equal(r.tokenizer_files, 2);
    assert_string_equal(r.tokenizer_source, model);
    assert_string_equal(r.warning, "");
    assert_true(file_equals(f->out, "tokenizer.json", "{\"model\": \"recorded\"}"));
    assert_true(file_equals(f->out, "special_tokens_map.json", "{}"));
    assert_true(file_equals(f->out, "generation_config.json", "{\"top_p\": 0.9}"));
    assert_false(exists(f->out, "tokenizer_config.json"));
    remove_tree(f->out);

    o.tokenizer_from = other; /* overrides the manifest's */
    if (consolidate(&o, &err)) fail_msg("%s", err.msg);
    assert_int_equal(r.tokenizer_files, 1);
    assert_true(file_equals(f->out, "tokenizer.json", "{\"model\": \"other\"}"));
    assert_false(exists(f->out, "special_tokens_map.json"));
    remove_tree(f->out);

    o.tokenizer_from = NULL;
    remove_tree(model);
    if (consolidate(&o, &err)) fail_msg("%s", err.msg);
    assert_int_equal(r.tokenizer_files, 0);
    assert_non_null(strstr(r.warning, model));
    assert_non_null(strstr(r.warning, "No such file or directory"));
    assert_false(exists(f->out, "tokenizer.json"));
    assert_true(exists(f->out, "model.safetensors"));
}

/* Llama 3.1's list of eos ids: config.json and generation_config.json keep the whole list. */
static void test_eos_list_kept(void **state) {
    fixture *f = *state;
    errbuf err = {{0}};
    consolidate_options o = options(f, ST_BF16, NULL);
    if (consolidate(&o, &err)) fail_msg("%s", err.msg);
    const char *files[] = {"config.json", "generation_config.json"};
    for (size_t i = 0; i < 2; i++) {
        json_t *j = load_json(f->out, files[i]);
        json_t *eos = json_object_get(j, "eos_token_id");
        if (!json_is_array(eos) || json_array_size(eos) != 3) fail_msg("%s: eos_token_id is not the list", files[i]);
        assert_int_equal(json_integer_value(json_array_get(eos, 0)), 2);
        assert_int_equal(json_integer_value(json_array_get(eos, 1)), 5);
        assert_int_equal(json_integer_value(json_array_get(eos, 2)), 7);
        json_decref(j);
    }
    llama_config c;
    assert_int_equal(llama_config_load(&c, f->out, &err), 0);
    assert_int_equal(c.n_eos_token_ids, 3);
}

/* A FIFO among the source model's tokenizer files is refused, not waited on (the alarm's
 * default action ends the test binary if opening it blocks). */
static void test_tokenizer_fifo_refused(void **state) {
    fixture *f = *state;
    errbuf err = {{0}};
    char src[512], fifo[600];
    snprintf(src, sizeof src, "%s/src", f->root);
    assert_int_equal(mkdir(src, 0755), 0);
    snprintf(fifo, sizeof fifo, "%s/tokenizer.json", src);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    consolidate_options o = options(f, ST_BF16, NULL);
    o.tokenizer_from = src;
    alarm(10);
    assert_int_equal(consolidate(&o, &err), -1);
    alarm(0);
    assert_non_null(strstr(err.msg, fifo));
    assert_non_null(strstr(err.msg, "is a FIFO, not a regular file"));
}

/* Tied embeddings: no lm_head.weight. */
static void test_tied(void **state) {
    fixture *f = *state;
    errbuf err = {{0}};
    consolidate_options o = options(f, ST_F32, NULL);
    if (consolidate(&o, &err)) fail_msg("%s", err.msg);
    assert_model_matches(f, f->out, ST_F32);
    st_model model;
    assert_int_equal(st_model_open(&model, f->out, &err), 0);
    assert_null(st_model_find(&model, "lm_head.weight"));
    st_model_close(&model);
}

static void test_bad_options(void **state) {
    fixture *f = *state;
    errbuf err = {{0}};
    consolidate_options o = options(f, ST_F16, NULL);
    assert_int_equal(consolidate(&o, &err), -1);
    assert_non_null(strstr(err.msg, "F16"));
    o = options(f, ST_F32, NULL);
    o.threads = 0;
    assert_int_equal(consolidate(&o, &err), -1);
    assert_non_null(strstr(err.msg, "threads"));
    o = options(f, ST_F32, NULL);
    o.buffer_bytes = 6;
    assert_int_equal(consolidate(&o, &err), -1);
    assert_false(exists(f->out, NULL));
}


/* ---- adapter checkpoints: a PEFT adapter directory, and the merged model ---- */

/* An adapter checkpoint of the golden adapter (PEFT 0.21 wrote it) on the golden model. */
static int setup_adapter(void **state) {
    fixture *f = calloc(1, sizeof *f);
    char model[4096], peft[4096], step_dir[512];
    errbuf err = {{0}};
    assert_non_null(f);
    snprintf(f->root, sizeof f->root, "/tmp/test_consolidate.XXXXXX");
    assert_non_null(mkdtemp(f->root));
    snprintf(f->ckpt, sizeof f->ckpt, "%s/ckpt", f->root);
    snprintf(f->out, sizeof f->out, "%s/out", f->root);
    fixture_path(model, sizeof model, "golden/tiny-mha");
    fixture_path(peft, sizeof peft, "golden/tiny-mha/lora");
    if (write_adapter_checkpoint(model, peft, f->ckpt, 3, &err)) fail_msg("%s", err.msg);
    snprintf(step_dir, sizeof step_dir, "%s/step-%06d", f->ckpt, STEP);
    assert_int_equal(ckpt_manifest_load(&f->m, step_dir, &err), 0);
    assert_true(f->m.has_adapter);
    *state = f;
    return 0;
}

/* dir's adapter equals the golden one, value for value. */
static void assert_golden_adapter(const char *dir) {
    char golden[4096];
    llama_config mc;
    lora_layout lo, want_lo;
    float **units, **want;
    errbuf err = {{0}};
    fixture_path(golden, sizeof golden, "golden/tiny-mha/config.json");
    assert_int_equal(llama_config_load(&mc, golden, &err), 0);
    fixture_path(golden, sizeof golden, "golden/tiny-mha/lora");
    if (peft_load(dir, &mc, &lo, &units, &err)) fail_msg("%s", err.msg);
    assert_int_equal(peft_load(golden, &mc, &want_lo, &want, &err), 0);
    assert_int_equal(lo.cfg.rank, 8);
    assert_true(lo.cfg.alpha == 16.0);
    assert_int_equal(lo.cfg.targets, LORA_ALL_LINEAR);
    for (int u = 0; u < lo.n_units; u++)
        assert_memory_equal(units[u], want[u], lo.units[u].numel * sizeof(float));
    peft_units_free(units, lo.n_units);
    peft_units_free(want, want_lo.n_units);
    lora_layout_free(&lo);
    lora_layout_free(&want_lo);
}

/* OUT is a PEFT adapter directory: weights in the adapter dtype (F32 here, whatever the
 * model dtype), the config naming the base, no model files. */
static void test_adapter_directory(void **state) {
    fixture *f = *state;
    consolidate_result r;
    consolidate_options o = options(f, ST_BF16, &r);
    errbuf err = {{0}};
    if (consolidate(&o, &err)) fail_msg("%s", err.msg);
    assert_true(r.adapter);
    assert_int_equal(r.tensors, 28);
    assert_golden_adapter(f->out);
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", f->out, PEFT_WEIGHTS_NAME);
    assert_sorted_by_name(path);
    st_file file;
    assert_int_equal(st_open(&file, path, &err), 0);
    for (int i = 0; i < file.n_tensors; i++) assert_int_equal(file.tensors[i].dtype, ST_F32);
    st_close(&file);
    json_t *config = load_json(f->out, PEFT_CONFIG_NAME);
    assert_string_equal(json_string_value(json_object_get(config, "base_model_name_or_path")), f->m.model_path);
    assert_string_equal(json_string_value(json_object_get(config, "peft_type")), "LORA");
    json_decref(config);
    assert_false(exists(f->out, "config.json"));
    assert_false(exists(f->out, "model.safetensors"));
    assert_false(exists(f->out, "merged"));
    assert_false(exists(f->root, "out.partial"));
}

/* adapter_dtype bf16 (output.dtype bf16, F37): adapter_model.safetensors in BF16, each value
 * the golden fp32 one rounded to bf16, and the model dtype does not change it. */
static void test_adapter_bf16(void **state) {
    fixture *f = *state;
    consolidate_result r;
    consolidate_options o = options(f, ST_F32, &r);
    o.adapter_dtype = ST_BF16;
    errbuf err = {{0}};
    if (consolidate(&o, &err)) fail_msg("%s", err.msg);
    char path[4096], golden[4096];
    snprintf(path, sizeof path, "%s/%s", f->out, PEFT_WEIGHTS_NAME);
    fixture_path(golden, sizeof golden, "golden/tiny-mha/lora/%s", PEFT_WEIGHTS_NAME);
    st_file file, want;
    assert_int_equal(st_open(&file, path, &err), 0);
    assert_int_equal(st_open(&want, golden, &err), 0);
    assert_int_equal(file.n_tensors, 28);
    uint64_t bytes = 0;
    for (int i = 0; i < file.n_tensors; i++) {
        const st_tensor *t = &file.tensors[i], *w = st_find(&want, t->name);
        assert_int_equal(t->dtype, ST_BF16);
        assert_non_null(w);
        assert_int_equal(t->numel, w->numel);
        bytes += t->nbytes;
        for (uint64_t e = 0; e < t->numel; e++) {
            float a, b;
            assert_int_equal(st_read_f32(t, e, 1, &a, &err), 0);
            assert_int_equal(st_read_f32(w, e, 1, &b, &err), 0);
            assert_true(a == bf16_to_f32(bf16_from_f32(b)));
        }
    }
    assert_int_equal(r.bytes, bytes);
    st_close(&file);
    st_close(&want);
    o.adapter_dtype = ST_F16;
    assert_int_not_equal(consolidate(&o, &err), 0);
    assert_non_null(strstr(err.msg, "adapter dtype F16 (bf16 or f32 only)"));
}

/* Relative error of dir's merged tensor `name` against lora_expected's merged.<name>. */
static double merged_error(const st_model *model, const st_file *expected, const char *name) {
    char want_name[256];
    snprintf(want_name, sizeof want_name, "merged.%s", name);
    const st_tensor *t = st_model_find(model, name), *w = st_find(expected, want_name);
    assert_non_null(t);
    assert_non_null(w);
    assert_int_equal(t->numel, w->numel);
    double diff = 0, ref = 0;
    for (uint64_t i = 0; i < t->numel; i++) {
        float a, b;
        errbuf err;
        assert_int_equal(st_read_f32(t, i, 1, &a, &err), 0);
        assert_int_equal(st_read_f32(w, i, 1, &b, &err), 0);
        diff += ((double)a - b) * ((double)a - b);
        ref += (double)b * b;
    }
    return sqrt(diff / ref);
}

/* merge: OUT/merged is the golden merged model (PEFT's merge_and_unload) within 1e-6. */
static void test_adapter_merged(void **state) {
    fixture *f = *state;
    consolidate_result r;
    consolidate_options o = options(f, ST_F32, &r);
    o.merge = 1;
    errbuf err = {{0}};
    if (consolidate(&o, &err)) fail_msg("%s", err.msg);
    assert_golden_adapter(f->out);
    char merged[512], path[4096];
    snprintf(merged, sizeof merged, "%s/merged", f->out);
    st_model model;
    st_file expected;
    if (st_model_open(&model, merged, &err)) fail_msg("%s", err.msg);
    fixture_path(path, sizeof path, "golden/tiny-mha/lora_expected.safetensors");
    assert_int_equal(st_open(&expected, path, &err), 0);
    int compared = 0;
    for (int i = 0; i < expected.n_tensors; i++) {
        if (strncmp(expected.tensors[i].name, "merged.", 7)) continue;
        double e = merged_error(&model, &expected, expected.tensors[i].name + 7);
        if (!(e <= 1e-6)) fail_msg("%s: relative error %g", expected.tensors[i].name, e);
        compared++;
    }
    assert_int_equal(compared, model.n_tensors);
    assert_int_equal(r.merged_tensors, model.n_tensors);
    st_close(&expected);
    st_model_close(&model);
    json_t *config = load_json(merged, "config.json");
    assert_string_equal(json_string_value(json_object_get(config, "dtype")), "float32");
    json_decref(config);
    assert_true(exists(merged, "generation_config.json"));
}

/* An existing OUT (fsdpd's output.dir) keeps its other files and loses stale model files. */
static void test_adapter_existing_output(void **state) {
    fixture *f = *state;
    errbuf err = {{0}};
    char merged[512];
    snprintf(merged, sizeof merged, "%s/merged", f->out);
    assert_int_equal(mkdir(f->out, 0755), 0);
    assert_int_equal(mkdir(merged, 0755), 0);
    write_text(f->out, "metrics.jsonl", "{}\n");
    write_text(f->out, "config.json", "{}");
    write_text(f->out, "model.safetensors", "stale");
    write_text(merged, "config.json", "{}");
    consolidate_options o = options(f, ST_BF16, NULL);
    if (consolidate(&o, &err)) fail_msg("%s", err.msg);
    assert_golden_adapter(f->out);
    assert_true(exists(f->out, "metrics.jsonl"));
    assert_false(exists(f->out, "config.json"));
    assert_false(exists(f->out, "model.safetensors"));
    assert_false(exists(f->out, "merged")); /* stale: another adapter's merge */
    o.merge = 1;
    if (consolidate(&o, &err)) fail_msg("%s", err.msg);
    assert_true(exists(merged, "model.safetensors"));
    assert_true(exists(f->out, "metrics.jsonl"));
}

/* The manifest's model_path rewritten, with fingerprint fp (NULL: unchanged). */
static void set_base(fixture *f, const char *path, const char *fp) {
    if (fp) snprintf(f->m.adapter.base_fingerprint, sizeof f->m.adapter.base_fingerprint, "%s", fp);
    set_model_path(f, path);
}

static void test_merge_refusals(void **state) {
    fixture *f = *state;
    errbuf err = {{0}};
    char bnb4[4096];
    consolidate_options o = options(f, ST_F32, NULL);
    o.merge = 1;
    char model_path[sizeof f->m.model_path];
    snprintf(model_path, sizeof model_path, "%s", f->m.model_path);
    set_base(f, model_path, "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef");
    assert_int_equal(consolidate(&o, &err), -1);
    assert_non_null(strstr(err.msg, "not the base model the adapters were trained on"));
    assert_false(exists(f->out, NULL));
    assert_false(exists(f->root, "out.partial"));

    st_model base;
    fixture_path(bnb4, sizeof bnb4, "golden/tiny-mha/bnb4");
    assert_int_equal(st_model_open(&base, bnb4, &err), 0);
    st_model_fingerprint(&base, f->m.adapter.base_fingerprint);
    st_model_close(&base);
    set_base(f, bnb4, NULL);
    assert_int_equal(consolidate(&o, &err), -1);
    assert_non_null(strstr(err.msg, "quantized (bitsandbytes NF4): merging into a quantized base is not built yet"));

    set_base(f, "", NULL);
    assert_int_equal(consolidate(&o, &err), -1);
    assert_non_null(strstr(err.msg, "records no base model directory"));
    assert_false(exists(f->out, NULL));
}

static void test_merge_needs_adapter(void **state) {
    fixture *f = *state;
    errbuf err = {{0}};
    consolidate_options o = options(f, ST_F32, NULL);
    o.merge = 1;
    assert_int_equal(consolidate(&o, &err), -1);
    assert_non_null(strstr(err.msg, "a full fine-tune's checkpoint: there is no adapter to merge"));
    assert_false(exists(f->out, NULL));
}

/* consolidate_merge: the golden base and adapter; a directory that is no adapter. */
static void test_merge_directories(void **state) {
    fixture *f = *state;
    char model[4096], peft[4096];
    consolidate_result r;
    errbuf err = {{0}};
    fixture_path(model, sizeof model, "golden/tiny-mha");
    fixture_path(peft, sizeof peft, "golden/tiny-mha/lora");
    merge_options o = {.model_dir = model, .adapter_dir = peft, .out = f->out, .dtype = ST_BF16,
                       .shard_bytes = 100000, .threads = 2, .result = &r};
    if (consolidate_merge(&o, &err)) fail_msg("%s", err.msg);
    assert_true(r.files > 1);
    assert_true(exists(f->out, "model.safetensors.index.json"));
    json_t *config = load_json(f->out, "config.json");
    assert_string_equal(json_string_value(json_object_get(config, "dtype")), "bfloat16");
    json_decref(config);
    o.adapter_dir = model; /* no adapter_config.json */
    assert_int_equal(consolidate_merge(&o, &err), -1);
    assert_non_null(strstr(err.msg, PEFT_CONFIG_NAME));
}

/* ---- the integration test's and the benchmark's helpers ---- */

/* Writes n bytes of zeros into the CRC. */
static uint32_t crc_zeros(uint32_t crc, uint64_t n) {
    static const unsigned char zeros[1 << 16];
    for (; n > 0; n -= n < sizeof zeros ? n : sizeof zeros)
        crc = crc32c(crc, zeros, n < sizeof zeros ? (size_t)n : sizeof zeros);
    return crc;
}

#define VALUES_CHUNK (1 << 18) /* floats written at a time */

/* A shard file of its planned size: master sections hold their values (all of them when
 * dense, the first 4 KiB otherwise), the rest is holes; CRCs and header right. */
static int write_shard_file(const char *path, ckpt_file_header *h, const ckpt_layout *lo, int dense,
                            errbuf *err) {
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd < 0) return errf(err, "%s: %s", path, strerror(errno));
    int rc = ftruncate(fd, (off_t)h->file_bytes) ? errf(err, "%s: %s", path, strerror(errno)) : 0;
    float *values = malloc(VALUES_CHUNK * sizeof *values);
    if (rc == 0 && !values) rc = errf(err, "out of memory");
    for (int i = 0; rc == 0 && i < h->n_sections; i++) {
        ckpt_section *s = &h->sections[i];
        const ckpt_unit *U = &lo->units[s->unit];
        uint64_t n = s->kind != CKPT_MASTER ? 0 : dense ? U->shard : U->shard < 1024 ? U->shard : 1024;
        s->crc = 0;
        for (uint64_t first = 0; rc == 0 && first < n; first += VALUES_CHUNK) {
            size_t count = n - first < VALUES_CHUNK ? (size_t)(n - first) : VALUES_CHUNK;
            for (size_t j = 0; j < count; j++) {
                uint64_t e = h->rank * U->shard + first + j;
                values[j] = e < U->numel ? value_of(CKPT_MASTER, (int)s->unit, e) : 0.0f;
            }
            s->crc = crc32c(s->crc, values, count * 4);
            rc = file_pwrite_full(fd, values, count * 4, (off_t)(s->offset + first * 4), path, err);
        }
        s->crc = crc_zeros(s->crc, s->bytes - n * 4);
    }
    void *block = rc == 0 ? malloc(h->header_block) : NULL;
    if (rc == 0 && !block) rc = errf(err, "out of memory");
    if (rc == 0) {
        ckpt_encode_header(h, block);
        rc = file_pwrite_full(fd, block, h->header_block, 0, path, err);
    }
    free(block);
    free(values);
    if (close(fd) && rc == 0) rc = errf(err, "%s: close: %s", path, strerror(errno));
    return rc;
}

static int write_test_checkpoint(const char *config_path, const char *ckpt, int n_files, int dense,
                                 errbuf *err) {
    char *config, step_name[64], dir[1024], path[4096];
    size_t len;
    ckpt_manifest m;
    if (n_files < 1) return errf(err, "%d files", n_files);
    if (file_read_all(config_path, 1 << 20, &config, &len, err)) return -1;
    int rc = manifest_for(&m, config, n_files, err);
    free(config);
    ckpt_step_name(step_name, sizeof step_name, STEP);
    snprintf(dir, sizeof dir, "%s/%s", ckpt, step_name);
    if (rc == 0) rc = file_mkdir(ckpt, err) || file_mkdir(dir, err) ? -1 : 0;
    for (int r = 0; rc == 0 && r < n_files; r++) {
        ckpt_file_header h;
        if (ckpt_plan(&h, &m.layout, r, STEP, err)) {
            rc = -1;
            break;
        }
        ckpt_file_name(m.files[r].name, sizeof m.files[r].name, r, n_files);
        snprintf(path, sizeof path, "%s/%s", dir, m.files[r].name);
        rc = write_shard_file(path, &h, &m.layout, dense, err);
        m.files[r].rank = r;
        m.files[r].bytes = h.file_bytes;
        m.files[r].header_crc = h.crc;
        ckpt_file_header_free(&h);
    }
    if (rc == 0) rc = commit_manifest(&m, ckpt, step_name, err);
    ckpt_manifest_free(&m);
    return rc;
}

static int max_rss(const char *out, char **argv) {
    pid_t pid = fork();
    if (pid < 0) return perror("fork"), 1;
    if (pid == 0) {
        execvp(argv[0], argv);
        perror(argv[0]);
        _exit(127);
    }
    int status;
    struct rusage ru;
    if (wait4(pid, &status, 0, &ru) < 0) return perror("wait4"), 1;
    FILE *f = fopen(out, "w");
    if (!f || fprintf(f, "%ld\n", ru.ru_maxrss) < 0 || fclose(f)) return perror(out), 1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int main(int argc, char **argv) {
    if (argc == 6 && !strcmp(argv[1], "--write-checkpoint") &&
        (!strcmp(argv[5], "sparse") || !strcmp(argv[5], "dense"))) {
        errbuf err;
        if (write_test_checkpoint(argv[2], argv[3], atoi(argv[4]), !strcmp(argv[5], "dense"), &err) == 0)
            return 0;
        fprintf(stderr, "test_consolidate: %s\n", err.msg);
        return 1;
    }
    if (argc == 6 && !strcmp(argv[1], "--write-adapter-checkpoint")) {
        errbuf err;
        if (write_adapter_checkpoint(argv[2], argv[3], argv[4], atoi(argv[5]), &err) == 0) return 0;
        fprintf(stderr, "test_consolidate: %s\n", err.msg);
        return 1;
    }
    if (argc >= 4 && !strcmp(argv[1], "--max-rss")) return max_rss(argv[2], argv + 3);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_f32_sharded_exact, setup_untied, teardown),
        cmocka_unit_test_setup_teardown(test_bf16_single_file, setup_untied, teardown),
        cmocka_unit_test_setup_teardown(test_padding_and_threads, setup_padded, teardown),
        cmocka_unit_test_setup_teardown(test_checkpoint_paths, setup_untied, teardown),
        cmocka_unit_test_setup_teardown(test_corrupt_master, setup_untied, teardown),
        cmocka_unit_test_setup_teardown(test_moments_not_read, setup_untied, teardown),
        cmocka_unit_test_setup_teardown(test_corrupt_padding, setup_padded, teardown),
        cmocka_unit_test_setup_teardown(test_truncated_file, setup_untied, teardown),
        cmocka_unit_test_setup_teardown(test_existing_output, setup_untied, teardown),
        cmocka_unit_test_setup_teardown(test_tokenizer_copied, setup_untied, teardown),
        cmocka_unit_test_setup_teardown(test_tokenizer_from_manifest, setup_untied, teardown),
        cmocka_unit_test_setup_teardown(test_eos_list_kept, setup_eos_list, teardown),
        cmocka_unit_test_setup_teardown(test_tokenizer_fifo_refused, setup_untied, teardown),
        cmocka_unit_test_setup_teardown(test_tied, setup_tied, teardown),
        cmocka_unit_test_setup_teardown(test_bad_options, setup_untied, teardown),
        cmocka_unit_test_setup_teardown(test_adapter_directory, setup_adapter, teardown),
        cmocka_unit_test_setup_teardown(test_adapter_bf16, setup_adapter, teardown),
        cmocka_unit_test_setup_teardown(test_adapter_merged, setup_adapter, teardown),
        cmocka_unit_test_setup_teardown(test_adapter_existing_output, setup_adapter, teardown),
        cmocka_unit_test_setup_teardown(test_merge_refusals, setup_adapter, teardown),
        cmocka_unit_test_setup_teardown(test_merge_needs_adapter, setup_untied, teardown),
        cmocka_unit_test_setup_teardown(test_merge_directories, setup_untied, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
