/* The checkpoint format (proto/ckpt): names, the shard-file header, writing and verifying
 * files, the manifest, re-slicing reads across files, and the checkpoint directory. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "base/crc32c.h"
#include "base/fileio.h"
#include "proto/ckpt.h"
#include "proto/ckpt_lock.h"

static char tmpdir[] = "/tmp/fsdp-test-ckpt-XXXXXX";

static const char *in_tmp(const char *name) {
    static char buf[4][512];
    static int i;
    i = (i + 1) % 4;
    snprintf(buf[i], sizeof buf[i], "%s/%s", tmpdir, name);
    return buf[i];
}

/* ---- a small layout: unit 0 one 5x3 matrix; unit 1 a 4x2 matrix and a norm of 3 ---- */

static void make_layout(ckpt_layout *lo, int n_files) {
    errbuf err;
    assert_int_equal(ckpt_layout_alloc(lo, n_files, 2, 3, &err), 0);
    ckpt_tensor t[3] = {
        {.name = "a.weight", .offset = 0, .numel = 15, .ndim = 2, .shape = {5, 3}},
        {.name = "b.weight", .offset = 0, .numel = 8, .ndim = 2, .shape = {4, 2}},
        {.name = "b.norm", .offset = 8, .numel = 3, .ndim = 1, .shape = {3, 0}, .is_norm = 1},
    };
    memcpy(lo->tensors, t, sizeof t);
    uint64_t numel[2] = {15, 11};
    for (int u = 0; u < 2; u++) {
        uint64_t padded = (numel[u] + (uint64_t)n_files - 1) / (uint64_t)n_files * (uint64_t)n_files;
        lo->units[u] = (ckpt_unit){.numel = numel[u], .padded = padded,
                                   .shard = padded / (uint64_t)n_files, .first = u, .count = u + 1};
    }
    assert_int_equal(ckpt_layout_check(lo, &err), 0);
}

/* The value a test checkpoint holds at element i of (kind, unit): padding is zero. */
static float value_at(const ckpt_layout *lo, int kind, int unit, uint64_t i) {
    if (i >= lo->units[unit].numel) return 0.0f;
    return (float)(kind * 1000 + unit * 100) + (float)i * 0.25f;
}

/* Writes every file of a checkpoint of step 7 into dir and fills the manifest. */
static void write_checkpoint(const char *dir, const ckpt_layout *lo, ckpt_manifest *m) {
    errbuf err;
    mkdir(dir, 0755);
    memset(m, 0, sizeof *m);
    m->step = m->optimizer_step = 7;
    m->global_batch = 4;
    m->global_sample = 28;
    m->tokens_seen = 1234;
    m->seed = 9;
    m->world_size = lo->n_files;
    strcpy(m->sharding, "full_shard");
    strcpy(m->model_path, "/models/llama \"3.1\" 8B");
    m->train = (ckpt_train_settings){.lr = 1e-3, .min_lr = 1e-4, .weight_decay = 0.1,
                                     .betas = {0.9, 0.95}, .eps = 1e-8, .clip_norm = 1.0,
                                     .schedule = "cosine", .warmup_steps = 2, .warmup_round = "up", .total_steps = 20,
                                     .objective = "dpo", .dpo_beta = 0.25, .dpo_loss = "ipo", .orpo_lambda = 0.1};
    m->model_config = json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f}", "model_type",
                                "llama", "hidden_size", 8, "intermediate_size", 16,
                                "num_hidden_layers", 1, "num_attention_heads", 2,
                                "num_key_value_heads", 2, "vocab_size", 32,
                                "max_position_embeddings", 64, "rms_norm_eps", 1e-5, "rope_theta",
                                10000.0);
    assert_int_equal(ckpt_layout_alloc(&m->layout, lo->n_files, lo->n_units, lo->n_tensors, &err), 0);
    memcpy(m->layout.units, lo->units, (size_t)lo->n_units * sizeof *lo->units);
    memcpy(m->layout.tensors, lo->tensors, (size_t)lo->n_tensors * sizeof *lo->tensors);
    m->files = calloc((size_t)lo->n_files, sizeof *m->files);
    assert_non_null(m->files);
    for (int r = 0; r < lo->n_files; r++) {
        ckpt_file_header h;
        assert_int_equal(ckpt_plan(&h, lo, r, 7, &err), 0);
        uint8_t *image = calloc(1, h.file_bytes);
        assert_non_null(image);
        for (int i = 0; i < h.n_sections; i++) {
            const ckpt_section *s = &h.sections[i];
            const ckpt_unit *U = &lo->units[s->unit];
            float *dst = (float *)(image + s->offset);
            for (uint64_t e = 0; e < U->shard; e++)
                dst[e] = value_at(lo, (int)s->kind, (int)s->unit, (uint64_t)r * U->shard + e);
        }
        char path[600];
        ckpt_file_name(m->files[r].name, sizeof m->files[r].name, r, lo->n_files);
        snprintf(path, sizeof path, "%s/%s", dir, m->files[r].name);
        assert_int_equal(ckpt_write_image(path, image, &h, NULL, NULL, &err), 0);
        m->files[r].rank = r;
        m->files[r].bytes = h.file_bytes;
        m->files[r].header_crc = h.crc;
        free(image);
        ckpt_file_header_free(&h);
    }
    char *text;
    char path[600];
    assert_int_equal(ckpt_manifest_to_json(m, &text, &err), 0);
    snprintf(path, sizeof path, "%s/%s", dir, CKPT_MANIFEST);
    file_chunk c = {text, strlen(text)};
    assert_int_equal(file_write_atomic(path, &c, 1, &err), 0);
    free(text);
}

/* Flips one byte of a file at off. */
static void flip_byte(const char *path, off_t off) {
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    unsigned char b;
    assert_int_equal(pread(fd, &b, 1, off), 1);
    b ^= 0x40;
    assert_int_equal(pwrite(fd, &b, 1, off), 1);
    close(fd);
}

/* ---- tests ---- */

static void test_names(void **state) {
    (void)state;
    char buf[64];
    int64_t step;
    int attempt;
    assert_int_equal(ckpt_step_name(buf, sizeof buf, 400), 0);
    assert_string_equal(buf, "step-000400");
    assert_int_equal(ckpt_step_name(buf, sizeof buf, 12345678), 0);
    assert_string_equal(buf, "step-12345678");
    assert_int_equal(ckpt_partial_name(buf, sizeof buf, 400, 3), 0);
    assert_string_equal(buf, "step-000400.partial.3");
    assert_int_equal(ckpt_file_name(buf, sizeof buf, 1, 16), 0);
    assert_string_equal(buf, "rank-00001-of-00016.bin");
    assert_int_equal(ckpt_step_name(buf, 5, 400), -1);
    assert_int_equal(ckpt_step_name(buf, 12, 400), 0); /* exactly fits: 11 chars and the NUL */
    assert_int_equal(ckpt_step_name(buf, 11, 400), -1);
    assert_int_equal(ckpt_partial_name(buf, 21, 400, 3), -1);
    assert_int_equal(ckpt_file_name(buf, 23, 1, 16), -1);

    /* A path that does not fit is an error naming it, not a truncated file name. */
    static char long_dir[5000];
    memset(long_dir, 'd', sizeof long_dir - 1);
    ckpt_manifest m;
    errbuf err = {""};
    assert_int_equal(ckpt_manifest_load(&m, long_dir, &err), -1);
    assert_non_null(strstr(err.msg, "path too long (more than 4095 bytes): ddd"));
    assert_non_null(strstr(err.msg, ".../manifest.json"));

    assert_int_equal(ckpt_parse_step_name("step-000400", &step), 1);
    assert_int_equal(step, 400);
    assert_int_equal(ckpt_parse_step_name("step-000400.partial.3", &step), 0);
    assert_int_equal(ckpt_parse_step_name("step-", &step), 0);
    assert_int_equal(ckpt_parse_step_name("step-12a", &step), 0);
    assert_int_equal(ckpt_parse_step_name("latest", &step), 0);
    assert_int_equal(ckpt_parse_partial_name("step-000400.partial.3", &step, &attempt), 1);
    assert_int_equal(step, 400);
    assert_int_equal(attempt, 3);
    assert_int_equal(ckpt_parse_partial_name("step-000400", &step, &attempt), 0);
    assert_int_equal(ckpt_parse_partial_name("step-000400.partial.", &step, &attempt), 0);
    assert_int_equal(ckpt_parse_partial_name("step-1.partial.2x", &step, &attempt), 0);
}

static void test_layout_check_and_json(void **state) {
    (void)state;
    ckpt_layout lo, back;
    errbuf err;
    make_layout(&lo, 3);
    assert_int_equal(lo.units[1].padded, 12);
    assert_int_equal(lo.units[1].shard, 4);
    json_t *j = ckpt_layout_to_json(&lo);
    assert_non_null(j);
    assert_int_equal(ckpt_layout_from_json(&back, j, 3, "t", &err), 0);
    assert_int_equal(back.n_tensors, 3);
    assert_string_equal(back.tensors[2].name, "b.norm");
    assert_int_equal(back.tensors[2].is_norm, 1);
    assert_int_equal(back.tensors[1].shape[1], 2);
    assert_memory_equal(back.units, lo.units, sizeof *lo.units * 2);
    ckpt_layout_free(&back);
    /* the same units read for another file count do not add up */
    assert_int_equal(ckpt_layout_from_json(&back, j, 4, "t", &err), -1);
    assert_non_null(strstr(err.msg, "padded"));
    json_decref(j);
    /* a tensor that does not start where the one before ended */
    lo.tensors[2].offset = 9;
    assert_int_equal(ckpt_layout_check(&lo, &err), -1);
    assert_non_null(strstr(err.msg, "b.norm"));
    ckpt_layout_free(&lo);
}

static void test_plan_and_header(void **state) {
    (void)state;
    ckpt_layout lo;
    ckpt_file_header h, back;
    errbuf err;
    make_layout(&lo, 2);
    assert_int_equal(ckpt_plan(&h, &lo, 1, 42, &err), 0);
    assert_int_equal(h.n_sections, 6);
    assert_int_equal(h.header_block, 4096);
    /* kind-major order, every section aligned, back to back */
    for (int i = 0; i < h.n_sections; i++) {
        assert_int_equal(h.sections[i].kind, 1 + i / 2);
        assert_int_equal(h.sections[i].unit, i % 2);
        assert_int_equal(h.sections[i].offset % CKPT_ALIGN, 0);
        assert_int_equal(h.sections[i].bytes, lo.units[i % 2].shard * 4);
        h.sections[i].crc = 0x1000u + (uint32_t)i;
    }
    assert_int_equal(h.file_bytes, h.sections[5].offset + h.sections[5].bytes);
    uint8_t block[4096];
    ckpt_encode_header(&h, block);
    assert_memory_equal(block, "FSDPCKPT", 8);
    assert_int_equal(ckpt_decode_header(&back, block, sizeof block, "f", &err), 0);
    assert_int_equal(back.rank, 1);
    assert_int_equal(back.n_files, 2);
    assert_int_equal(back.step, 42);
    assert_int_equal(back.crc, h.crc);
    assert_int_equal(back.sections[4].crc, 0x1004u);
    assert_int_equal(back.sections[3].offset, h.sections[3].offset);
    ckpt_file_header_free(&back);

    block[70] ^= 1; /* inside the section table */
    assert_int_equal(ckpt_decode_header(&back, block, sizeof block, "f.bin", &err), -1);
    assert_non_null(strstr(err.msg, "f.bin: header CRC32C mismatch"));
    block[70] ^= 1;
    block[8] = 9; /* version */
    assert_int_equal(ckpt_decode_header(&back, block, sizeof block, "f", &err), -1);
    assert_non_null(strstr(err.msg, "version 9"));
    block[0] = 'X';
    assert_int_equal(ckpt_decode_header(&back, block, sizeof block, "f", &err), -1);
    assert_non_null(strstr(err.msg, "bad magic"));
    assert_int_equal(ckpt_decode_header(&back, block, 10, "f", &err), -1);
    ckpt_file_header_free(&h);
    ckpt_layout_free(&lo);
}

static void sample_identity(ckpt_identity *id) {
    memset(id, 0, sizeof *id);
    strcpy(id->train_type, "full");
    memset(id->model_fingerprint, 'a', 64);
    strcpy(id->optimizer, "adamw");
    strcpy(id->data.source, "jsonl");
    memset(id->data.sha256, 'b', 64);
    memset(id->data.tokenizer_sha256, 'c', 64);
    strcpy(id->data_format, "chat");
    strcpy(id->data_template, "llama3");
    id->seq_len = 512;
    id->packing = 1;
    id->eval_fraction = 0.05;
    id->max_steps = 100;
    id->epochs = 1;
}

/* F36: the identity block round-trips, is strictly decoded, and compares field by field. */
static void test_identity(void **state) {
    (void)state;
    ckpt_layout lo;
    ckpt_manifest m, back;
    errbuf err;
    make_layout(&lo, 2);
    char dir[512];
    snprintf(dir, sizeof dir, "%s", in_tmp("id"));
    write_checkpoint(dir, &lo, &m);
    m.has_identity = 1;
    sample_identity(&m.identity);
    char *text;
    assert_int_equal(ckpt_manifest_to_json(&m, &text, &err), 0);
    assert_int_equal(ckpt_manifest_parse(&back, text, strlen(text), "m", &err), 0);
    assert_true(back.has_identity);
    assert_string_equal(back.identity.data_template, "llama3");
    assert_string_equal(back.identity.data.tokenizer_sha256, m.identity.data.tokenizer_sha256);
    assert_int_equal(back.identity.packing, 1);

    ckpt_difference d[CKPT_MAX_DIFFERENCES];
    ckpt_identity job = m.identity;
    assert_int_equal(ckpt_identity_compare(&back, &job, &m.train, NULL, d), 0);
    strcpy(job.train_type, "lora");
    job.data.sha256[0] = 'f';
    job.max_steps = 200;
    ckpt_train_settings train = m.train;
    train.lr = 2e-3;
    assert_int_equal(ckpt_identity_compare(&back, &job, &train, NULL, d), 4);
    assert_string_equal(d[0].field, "train.type");
    assert_string_equal(d[0].checkpoint, "full");
    assert_string_equal(d[0].job, "lora");
    assert_false(d[0].allowed);
    assert_string_equal(d[1].field, "data (sha256)");
    assert_string_equal(d[2].field, "train.max_steps");
    assert_true(d[2].allowed);
    assert_string_equal(d[3].field, "train.lr");
    assert_string_equal(d[3].job, "0.002");
    /* F49: the objective and its settings round-trip and are compared (never allowed) */
    assert_string_equal(back.train.objective, "dpo");
    assert_string_equal(back.train.dpo_loss, "ipo");
    assert_float_equal(back.train.dpo_beta, 0.25, 0);
    train = m.train;
    strcpy(train.objective, "orpo");
    train.orpo_lambda = 0.5;
    assert_int_equal(ckpt_identity_compare(&back, &m.identity, &train, NULL, d), 2);
    assert_string_equal(d[0].field, "train.objective");
    assert_string_equal(d[0].checkpoint, "dpo");
    assert_false(d[0].allowed);
    assert_string_equal(d[1].field, "train.orpo_lambda");
    ckpt_manifest_free(&back);
    /* a manifest from before F49 (no objective keys) reads as SFT with the defaults */
    char *old = strdup(text), *key = strstr(old, "\"objective\"");
    assert_non_null(key);
    memcpy(key, "\"objectivX\"", 11); /* "train" without its objective */
    assert_int_equal(ckpt_manifest_parse(&back, old, strlen(old), "m", &err), 0);
    assert_string_equal(back.train.objective, "sft");
    free(old);
    ckpt_manifest_free(&back);

    /* strict: a bad value is refused naming the key; a manifest without it is unknown */
    char *bad = strdup(text), *at = strstr(bad, "\"adamw\"");
    assert_non_null(at);
    memcpy(at + 1, "sgd  ", 5);
    assert_int_equal(ckpt_manifest_parse(&back, bad, strlen(bad), "m", &err), -1);
    assert_non_null(strstr(err.msg, "identity.optimizer"));
    free(bad);
    m.has_identity = 0;
    free(text);
    assert_int_equal(ckpt_manifest_to_json(&m, &text, &err), 0);
    assert_int_equal(ckpt_manifest_parse(&back, text, strlen(text), "m", &err), 0);
    assert_false(back.has_identity);
    assert_int_equal(ckpt_identity_compare(&back, &job, &m.train, NULL, d), 1);
    assert_string_equal(d[0].field, "identity");
    assert_false(d[0].allowed);
    ckpt_manifest_free(&back);
    free(text);
    ckpt_manifest_free(&m);
    ckpt_layout_free(&lo);
}

/* The lock file's holder round-trips; anything else is refused. */
static void test_lock_file(void **state) {
    (void)state;
    ckpt_lock_holder h = {.job_id = "4711", .host = "n0", .pid = 42, .start_time = 123456789, .boot_id = "b-1",
                          .started = 1700000000}, back;
    errbuf err;
    char *text, who[256];
    assert_int_equal(ckpt_lock_to_json(&h, &text, &err), 0);
    assert_int_equal(ckpt_lock_parse(&back, text, strlen(text), "L", &err), 0);
    assert_memory_equal(&h, &back, sizeof h);
    ckpt_lock_describe(&back, who, sizeof who);
    assert_string_equal(who, "SLURM job 4711, host n0, pid 42, since 2023-11-14 22:13:20 UTC");
    free(text);
    static const char *const bad[] = {
        "{}", "[]", "not json",
        "{\"format\":\"fsdpd-lock\",\"version\":2,\"job_id\":\"\",\"host\":\"h\",\"pid\":1,\"start_time\":1,\"boot_id\":\"\",\"started\":0}",
        "{\"format\":\"fsdpd-lock\",\"version\":1,\"job_id\":\"\",\"host\":\"h\",\"pid\":0,\"start_time\":1,\"boot_id\":\"\",\"started\":0}",
        "{\"format\":\"fsdpd-lock\",\"version\":1,\"job_id\":\"\",\"host\":\"h\",\"pid\":1,\"start_time\":1,\"boot_id\":\"\",\"started\":0,\"x\":1}",
        "{\"format\":\"fsdpd-lock\",\"version\":1,\"job_id\":\"\",\"host\":\"h\",\"pid\":1,\"start_time\":-1,\"boot_id\":\"\",\"started\":0}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(ckpt_lock_parse(&back, bad[i], strlen(bad[i]), "L", &err), -1);
    assert_non_null(strstr(err.msg, "start_time"));
}

static void test_write_verify_and_manifest(void **state) {
    (void)state;
    ckpt_layout lo;
    ckpt_manifest m, back;
    errbuf err;
    make_layout(&lo, 2);
    char dir[512];
    snprintf(dir, sizeof dir, "%s", in_tmp("wv"));
    write_checkpoint(dir, &lo, &m);
    assert_int_equal(ckpt_manifest_load(&back, dir, &err), 0);
    assert_int_equal(back.step, 7);
    assert_int_equal(back.global_sample, 28);
    assert_int_equal(back.tokens_seen, 1234);
    assert_int_equal(back.seed, 9);
    assert_float_equal(back.train.betas[1], 0.95, 0);
    assert_float_equal(back.train.lr, 1e-3, 0);
    assert_string_equal(back.train.schedule, "cosine");
    assert_string_equal(back.model_path, "/models/llama \"3.1\" 8B");
    assert_int_equal(back.files[1].header_crc, m.files[1].header_crc);
    assert_int_equal(back.layout.units[1].shard, 6);
    assert_int_equal(ckpt_verify(dir, &back, 1, &err), 0);

    /* every section's CRC is in the header, the header's in the manifest */
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, m.files[1].name);
    ckpt_file_header h;
    int fd = open(path, O_RDONLY);
    assert_int_equal(ckpt_read_header(&h, fd, path, &err), 0);
    close(fd);
    float expect[6];
    for (int e = 0; e < 6; e++) expect[e] = value_at(&lo, CKPT_EXP_AVG, 1, 6 + (uint64_t)e);
    assert_int_equal(h.sections[3].crc, crc32c(0, expect, sizeof expect));

    /* a flipped data byte: the header still checks out, the section does not */
    flip_byte(path, (off_t)h.sections[3].offset + 5);
    assert_int_equal(ckpt_verify(dir, &back, 0, &err), 0);
    assert_int_equal(ckpt_verify(dir, &back, 1, &err), -1);
    assert_non_null(strstr(err.msg, "rank-00001-of-00002.bin"));
    assert_non_null(strstr(err.msg, "section exp_avg of unit 1: CRC32C mismatch"));
    flip_byte(path, (off_t)h.sections[3].offset + 5);
    assert_int_equal(ckpt_verify(dir, &back, 1, &err), 0);

    /* a flipped header byte, a truncated file, a missing file */
    flip_byte(path, 33);
    assert_int_equal(ckpt_verify(dir, &back, 0, &err), -1);
    assert_non_null(strstr(err.msg, "rank-00001-of-00002.bin: header CRC32C mismatch"));
    flip_byte(path, 33);
    assert_int_equal(truncate(path, (off_t)h.file_bytes - 1), 0);
    assert_int_equal(ckpt_verify(dir, &back, 0, &err), -1);
    assert_non_null(strstr(err.msg, "truncated"));
    assert_int_equal(unlink(path), 0);
    assert_int_equal(ckpt_verify(dir, &back, 0, &err), -1);
    assert_non_null(strstr(err.msg, "rank-00001-of-00002.bin: missing"));
    ckpt_file_header_free(&h);

    ckpt_manifest_free(&back);
    ckpt_manifest_free(&m);
    ckpt_layout_free(&lo);
}

static void test_manifest_errors(void **state) {
    (void)state;
    ckpt_layout lo;
    ckpt_manifest m, back;
    errbuf err;
    make_layout(&lo, 2);
    write_checkpoint(in_tmp("me"), &lo, &m);
    char *text;
    assert_int_equal(ckpt_manifest_to_json(&m, &text, &err), 0);
    json_t *root = json_loads(text, 0, NULL);
    free(text);
    struct {
        const char *key;
        json_t *value;
        const char *want;
    } cases[] = {
        {"format", json_string("other"), "not a checkpoint manifest"},
        {"version", json_integer(2), "manifest version 2"},
        {"global_sample", json_integer(27), "global_sample"},
        {"step", json_string("7"), "\"step\""},
        {"n_files", json_integer(3), "3 files from 2 ranks"},
        {"world_size", json_integer(1), "2 files from 1 ranks"},
        {"model_config", json_null(), "model_config"},
        {"files", json_array(), "\"files\""},
        {"model_path", json_null(), "\"model_path\": missing or not a string"},
        {"model_path", json_integer(3), "\"model_path\": missing or not a string"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_t *copy = json_deep_copy(root);
        json_object_set_new(copy, cases[i].key, cases[i].value);
        char *t = json_dumps(copy, 0);
        assert_int_equal(ckpt_manifest_parse(&back, t, strlen(t), "m.json", &err), -1);
        if (!strstr(err.msg, cases[i].want)) fail_msg("%s: got '%s'", cases[i].key, err.msg);
        free(t);
        json_decref(copy);
    }
    /* a manifest without model_path (as written before F17) still reads: the directory is
     * unknown */
    json_t *old = json_deep_copy(root);
    assert_int_equal(json_object_del(old, "model_path"), 0);
    char *old_text = json_dumps(old, 0);
    if (ckpt_manifest_parse(&back, old_text, strlen(old_text), "m.json", &err)) fail_msg("%s", err.msg);
    assert_string_equal(back.model_path, "");
    ckpt_manifest_free(&back);
    free(old_text);
    json_decref(old);
    /* "" (a job of init random) is a model_path */
    json_t *random_init = json_deep_copy(root);
    json_object_set_new(random_init, "model_path", json_string(""));
    char *random_text = json_dumps(random_init, 0);
    assert_int_equal(ckpt_manifest_parse(&back, random_text, strlen(random_text), "m.json", &err), 0);
    assert_string_equal(back.model_path, "");
    ckpt_manifest_free(&back);
    free(random_text);
    json_decref(random_init);
    /* a file of the wrong size */
    json_t *copy = json_deep_copy(root);
    json_object_set_new(json_array_get(json_object_get(copy, "files"), 1), "bytes", json_integer(5));
    char *t = json_dumps(copy, 0);
    assert_int_equal(ckpt_manifest_parse(&back, t, strlen(t), "m.json", &err), -1);
    assert_non_null(strstr(err.msg, "rank-00001-of-00002.bin: 5 bytes"));
    free(t);
    json_decref(copy);
    assert_int_equal(ckpt_manifest_parse(&back, "{", 1, "m.json", &err), -1);
    assert_non_null(strstr(err.msg, "m.json: not JSON"));
    json_decref(root);
    ckpt_manifest_free(&m);
    ckpt_layout_free(&lo);
}

static void test_check_model(void **state) {
    (void)state;
    ckpt_layout lo;
    ckpt_manifest m;
    errbuf err;
    make_layout(&lo, 1);
    write_checkpoint(in_tmp("cm"), &lo, &m);
    char *text = json_dumps(m.model_config, 0);
    llama_config cfg;
    assert_int_equal(llama_config_parse(&cfg, text, strlen(text), "c", &err), 0);
    free(text);
    assert_int_equal(ckpt_manifest_check_model(&m, &cfg, "m.json", &err), 0);
    cfg.hidden_size = 16;
    assert_int_equal(ckpt_manifest_check_model(&m, &cfg, "m.json", &err), -1);
    assert_non_null(strstr(err.msg, "another model: hidden_size 8"));
    cfg.hidden_size = 8;
    cfg.tie_word_embeddings = 1;
    assert_int_equal(ckpt_manifest_check_model(&m, &cfg, "m.json", &err), -1);
    assert_non_null(strstr(err.msg, "tie_word_embeddings"));
    ckpt_manifest_free(&m);
    ckpt_layout_free(&lo);
}

/* Checkpoints of 1, 2 and 3 files read back through every range, across file boundaries
 * and into the padding. */
static void test_read_range_reslices(void **state) {
    (void)state;
    for (int n_files = 1; n_files <= 3; n_files++) {
        ckpt_layout lo;
        ckpt_manifest m;
        ckpt_reader r;
        errbuf err;
        char name[32];
        make_layout(&lo, n_files);
        snprintf(name, sizeof name, "rr%d", n_files);
        write_checkpoint(in_tmp(name), &lo, &m);
        assert_int_equal(ckpt_reader_open(&r, in_tmp(name), &m, &err), 0);
        for (int kind = 1; kind <= CKPT_KINDS; kind++)
            for (int u = 0; u < 2; u++)
                for (uint64_t first = 0; first < 17; first++)
                    for (uint64_t n = 1; first + n <= 17; n += 3) {
                        float got[17];
                        assert_int_equal(ckpt_read_range(&r, kind, u, first, n, got, &err), 0);
                        for (uint64_t i = 0; i < n; i++)
                            assert_true(got[i] == value_at(&lo, kind, u, first + i));
                    }
        ckpt_reader_close(&r);
        ckpt_manifest_free(&m);
        ckpt_layout_free(&lo);
    }
}

static void test_read_range_checks_crc(void **state) {
    (void)state;
    ckpt_layout lo;
    ckpt_manifest m;
    ckpt_reader r;
    errbuf err;
    make_layout(&lo, 3);
    char dir[512];
    snprintf(dir, sizeof dir, "%s", in_tmp("rc"));
    write_checkpoint(dir, &lo, &m);
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, m.files[2].name);
    ckpt_file_header plan;
    assert_int_equal(ckpt_plan(&plan, &lo, 2, 7, &err), 0);
    /* the master section of unit 0 in file 2: elements 10..14 */
    flip_byte(path, (off_t)plan.sections[0].offset + 2);
    assert_int_equal(ckpt_reader_open(&r, dir, &m, &err), 0);
    float got[15];
    assert_int_equal(ckpt_read_range(&r, CKPT_MASTER, 0, 0, 10, got, &err), 0); /* files 0, 1 */
    assert_int_equal(ckpt_read_range(&r, CKPT_MASTER, 0, 12, 1, got, &err), -1);
    assert_non_null(strstr(err.msg, "rank-00002-of-00003.bin: section master of unit 0: CRC32C mismatch"));
    ckpt_reader_close(&r);
    /* a missing file is named when first needed */
    assert_int_equal(unlink(path), 0);
    assert_int_equal(ckpt_reader_open(&r, dir, &m, &err), 0);
    assert_int_equal(ckpt_read_range(&r, CKPT_EXP_AVG, 1, 11, 1, got, &err), 0); /* padding */
    assert_true(got[0] == 0.0f);
    assert_int_equal(ckpt_read_range(&r, CKPT_EXP_AVG, 1, 10, 1, got, &err), -1);
    assert_non_null(strstr(err.msg, "rank-00002-of-00003.bin: missing"));
    ckpt_reader_close(&r);
    ckpt_file_header_free(&plan);
    ckpt_manifest_free(&m);
    ckpt_layout_free(&lo);
}

static int stop_at_half(void *arg, uint64_t written, uint64_t total) {
    (*(int *)arg)++;
    return written >= total / 2;
}

static void test_write_abandoned(void **state) {
    (void)state;
    ckpt_layout lo;
    ckpt_file_header h;
    errbuf err;
    make_layout(&lo, 1);
    assert_int_equal(ckpt_plan(&h, &lo, 0, 1, &err), 0);
    uint8_t *image = calloc(1, h.file_bytes);
    int calls = 0;
    const char *path = in_tmp("abandoned.bin");
    assert_int_equal(ckpt_write_image(path, image, &h, stop_at_half, &calls, &err), -1);
    assert_non_null(strstr(err.msg, "abandoned"));
    assert_true(calls >= 2);
    assert_int_equal(access(path, F_OK), -1); /* removed */
    /* written once, the file exists: the second attempt does not overwrite it */
    assert_int_equal(ckpt_write_image(path, image, &h, NULL, NULL, &err), 0);
    assert_int_equal(ckpt_write_image(path, image, &h, NULL, NULL, &err), -1);
    assert_non_null(strstr(err.msg, "exists"));
    free(image);
    ckpt_file_header_free(&h);
    ckpt_layout_free(&lo);
}

/* An image sealed in place (in-memory checkpoints) is the file ckpt_write_image writes: the
 * same bytes through ckpt_write_sealed; unsealed, its header no longer decodes; a section
 * changed after the seal fails its CRC. */
static void test_sealed_image(void **state) {
    (void)state;
    ckpt_layout lo;
    ckpt_file_header h, back;
    errbuf err;
    make_layout(&lo, 2);
    assert_int_equal(ckpt_plan(&h, &lo, 1, 9, &err), 0);
    uint8_t *image = calloc(1, h.file_bytes), *copy = malloc(h.file_bytes);
    assert_non_null(image);
    assert_non_null(copy);
    for (int i = 0; i < h.n_sections; i++)
        for (uint64_t b = 0; b < h.sections[i].bytes; b++) image[h.sections[i].offset + b] = (uint8_t)(b * 7 + (uint64_t)i);
    memcpy(copy, image, h.file_bytes);
    assert_int_not_equal(ckpt_decode_header(&back, image, h.file_bytes, "image", &err), 0); /* never sealed */
    ckpt_seal_image(image, &h);
    uint32_t crc = h.crc;
    assert_int_equal(ckpt_decode_header(&back, image, h.file_bytes, "image", &err), 0);
    assert_int_equal(back.step, 9);
    assert_int_equal(back.crc, crc);
    ckpt_file_header_free(&back);
    const char *sealed = in_tmp("sealed.bin"), *written = in_tmp("written.bin");
    unlink(sealed);
    unlink(written);
    assert_int_equal(ckpt_write_sealed(sealed, image, &h, NULL, NULL, &err), 0);
    assert_int_equal(ckpt_write_image(written, copy, &h, NULL, NULL, &err), 0);
    assert_int_equal(h.crc, crc);
    void *a, *b;
    size_t na, nb;
    assert_int_equal(file_map_readonly(sealed, &a, &na, &err), 0);
    assert_int_equal(file_map_readonly(written, &b, &nb, &err), 0);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, na);
    munmap(a, na);
    munmap(b, nb);
    ckpt_unseal_image(image);
    assert_int_not_equal(ckpt_decode_header(&back, image, h.file_bytes, "image", &err), 0);
    assert_non_null(strstr(err.msg, "magic"));
    free(image);
    free(copy);
    ckpt_file_header_free(&h);
    ckpt_layout_free(&lo);
}

static void test_n_files(void **state) {
    (void)state;
    job_config j;
    job_defaults(&j);
    j.runtime.workers_per_node = 4;
    assert_int_equal(ckpt_n_files(&j, 8), 8);
    j.fsdp.sharding = JOB_SHARD_HYBRID;
    assert_int_equal(ckpt_n_files(&j, 8), 4);
    j.fsdp.sharding = JOB_SHARD_NONE;
    assert_int_equal(ckpt_n_files(&j, 8), 1);
}

static void test_resolve_and_list(void **state) {
    (void)state;
    ckpt_layout lo;
    ckpt_manifest m;
    errbuf err;
    char out[600];
    int64_t *steps;
    int n;
    char dir[512];
    snprintf(dir, sizeof dir, "%s", in_tmp("dir"));
    mkdir(dir, 0755);
    assert_int_equal(ckpt_resolve(dir, JOB_RESUME_AUTO, 0, out, sizeof out, &err), 0);
    assert_int_equal(ckpt_resolve(dir, JOB_RESUME_LATEST, 0, out, sizeof out, &err), -1);
    assert_non_null(strstr(err.msg, "latest: no checkpoint to resume from"));
    assert_int_equal(ckpt_resolve(in_tmp("nothing"), JOB_RESUME_AUTO, 0, out, sizeof out, &err), 0);

    make_layout(&lo, 1);
    write_checkpoint(in_tmp("dir/step-000003"), &lo, &m);
    ckpt_manifest_free(&m);
    write_checkpoint(in_tmp("dir/step-000010"), &lo, &m);
    ckpt_manifest_free(&m);
    mkdir(in_tmp("dir/step-000012"), 0755);          /* no manifest */
    mkdir(in_tmp("dir/step-000011.partial.1"), 0755); /* being written */
    assert_int_equal(symlink("step-000010", in_tmp("dir/latest")), 0);

    assert_int_equal(ckpt_resolve(dir, JOB_RESUME_AUTO, 0, out, sizeof out, &err), 1);
    assert_string_equal(out, in_tmp("dir/step-000010"));
    assert_int_equal(ckpt_resolve(dir, JOB_RESUME_NEVER, 0, out, sizeof out, &err), 0);
    assert_int_equal(ckpt_resolve(dir, JOB_RESUME_STEP, 3, out, sizeof out, &err), 1);
    assert_string_equal(out, in_tmp("dir/step-000003"));
    assert_int_equal(ckpt_resolve(dir, JOB_RESUME_STEP, 12, out, sizeof out, &err), -1);
    assert_non_null(strstr(err.msg, "step-000012: not a committed checkpoint"));
    assert_int_equal(ckpt_resolve(dir, JOB_RESUME_STEP, 4, out, sizeof out, &err), -1);

    assert_int_equal(ckpt_list(dir, &steps, &n, &err), 0);
    assert_int_equal(n, 2);
    assert_int_equal(steps[0], 3);
    assert_int_equal(steps[1], 10);
    free(steps);

    /* latest pointing at something that is not a checkpoint */
    assert_int_equal(unlink(in_tmp("dir/latest")), 0);
    assert_int_equal(symlink("step-000012", in_tmp("dir/latest")), 0);
    assert_int_equal(ckpt_resolve(dir, JOB_RESUME_AUTO, 0, out, sizeof out, &err), -1);
    assert_non_null(strstr(err.msg, "not a committed checkpoint"));

    /* latest that is not a symbolic link (a copied checkpoint dir, a file): named, and what it
     * should be said (readlink alone says "Invalid argument") */
    assert_int_equal(unlink(in_tmp("dir/latest")), 0);
    FILE *f = fopen(in_tmp("dir/latest"), "w");
    assert_non_null(f);
    assert_int_equal(fputs("step-000010\n", f) >= 0, 1);
    assert_int_equal(fclose(f), 0);
    static const job_resume modes[] = {JOB_RESUME_AUTO, JOB_RESUME_LATEST};
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        assert_int_equal(ckpt_resolve(dir, modes[i], 0, out, sizeof out, &err), -1);
        assert_non_null(strstr(err.msg, in_tmp("dir/latest: is a regular file")));
        assert_non_null(strstr(err.msg, "should be a symbolic link to a step-N directory"));
    }
    assert_int_equal(unlink(in_tmp("dir/latest")), 0);
    assert_int_equal(mkdir(in_tmp("dir/latest"), 0755), 0);
    assert_int_equal(ckpt_resolve(dir, JOB_RESUME_AUTO, 0, out, sizeof out, &err), -1);
    assert_non_null(strstr(err.msg, in_tmp("dir/latest: is a directory")));
    assert_null(strstr(err.msg, "Invalid argument"));
    ckpt_layout_free(&lo);
}

static int setup(void **state) {
    (void)state;
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_layout_check_and_json),
        cmocka_unit_test(test_plan_and_header),
        cmocka_unit_test(test_write_verify_and_manifest),
        cmocka_unit_test(test_manifest_errors),
        cmocka_unit_test(test_check_model),
        cmocka_unit_test(test_read_range_reslices),
        cmocka_unit_test(test_read_range_checks_crc),
        cmocka_unit_test(test_write_abandoned),
        cmocka_unit_test(test_sealed_image),
        cmocka_unit_test(test_n_files),
        cmocka_unit_test(test_resolve_and_list),
        cmocka_unit_test(test_identity),
        cmocka_unit_test(test_lock_file),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
