/* Unit tests for proto/run_record (run.json: round trip, strict decoder) and daemon/run_report
 * (the derived values of a full, a LoRA and a QLoRA job, job.json reloading to the same job,
 * the ETA). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/clock.h"
#include "base/fileio.h"
#include "daemon/run_report.h"
#include "proto/job.h"
#include "proto/run_record.h"
#include "proto/status.h"

/* The small model of tests/integration/lib.sh: hidden 36, intermediate 70, 2 layers, 4 heads
 * of 10, 2 KV heads, vocabulary 61, untied. */
static const char *model_json =
    "{\"model_type\": \"llama\", \"hidden_size\": 36, \"intermediate_size\": 70, \"num_hidden_layers\": 2,"
    " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 10, \"vocab_size\": 61,"
    " \"max_position_embeddings\": 64, \"rms_norm_eps\": 1e-5, \"tie_word_embeddings\": false,"
    " \"rope_theta\": 10000.0, \"bos_token_id\": 1, \"eos_token_id\": 2}";

/* Counted by hand: embed 61 x 36, a layer q 36x40, k and v 36x20, o 40x36, gate, up, down
 * 36x70 each, two norms of 36; the final norm; lm_head 61 x 36. */
#define SMALL_TOTAL (61 * 36 + 2 * (1440 + 720 + 720 + 1440 + 3 * 2520 + 72) + 36 + 61 * 36)
/* An adapter of rank r on a module: r x (in + out). */
#define ADAPTER_ALL(r) (2 * (r) * ((36 + 40) + 2 * (36 + 20) + (40 + 36) + 3 * (36 + 70)))
#define ADAPTER_QV(r) (2 * (r) * ((36 + 40) + (36 + 20)))

typedef struct fixture {
    job_config job;
    llama_config cfg;
    json_t *config;
    char dir[64];
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    json_error_t je;
    errbuf err;
    f->config = json_loads(model_json, 0, &je);
    assert_non_null(f->config);
    assert_int_equal(llama_config_from_json(&f->cfg, f->config, "model", &err), 0);
    strcpy(f->dir, "/tmp/test_run_report.XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    job_config *j = &f->job;
    job_defaults(j);
    snprintf(j->model.path, sizeof j->model.path, "%s/base", f->dir);
    snprintf(j->data.path, sizeof j->data.path, "%s/data.tokens", f->dir);
    snprintf(j->output.dir, sizeof j->output.dir, "%s/out", f->dir);
    j->data.seq_len = 20;
    j->train.global_batch = 24;
    j->train.micro_batch = 3;
    j->train.max_steps = 5;
    j->runtime.backend = JOB_BACKEND_CPU;
    j->runtime.workers_per_node = 2;
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->dir);
    assert_int_equal(system(cmd), 0);
    json_decref(f->config);
    free(f);
    return 0;
}

/* The job resolved for 1 node x 2 workers and its derived values. */
static void derive(fixture *f, run_record *r) {
    errbuf err;
    assert_int_equal(job_resolve_runtime(&f->job, 0, &err), 0);
    assert_int_equal(job_resolve(&f->job, 2, &err), 0);
    int rc = run_report_derive(r, &f->job, &f->cfg, f->config, "", 0, 1, 2, 0, &err);
    if (rc) fail_msg("%s", err.msg);
}

static void test_full(void **state) {
    fixture *f = *state;
    static run_record r;
    derive(f, &r);
    assert_int_equal(r.world_size, 2);
    assert_int_equal(r.micro_batch, 3);
    assert_int_equal(r.grad_accum, 4); /* 24 / (3 x 2) */
    assert_int_equal(r.global_batch, 24);
    assert_int_equal(r.tokens_per_step, 24 * 20);
    assert_int_equal(r.max_steps, 5);
    assert_int_equal(r.total_params, SMALL_TOTAL);
    assert_int_equal(r.trainable_params, SMALL_TOTAL);
    assert_string_equal(r.train_type, "full");
    assert_int_equal(r.n_lora_targets, 0);
    assert_string_equal(r.quant, "none");
    assert_string_equal(r.compute_dtype, "f32");
    assert_true(r.peak_gpu_bytes > 0);
    assert_non_null(strstr(r.recompute, "none"));
    assert_string_equal(r.output_dir, f->job.output.dir);
}

static void test_lora(void **state) {
    fixture *f = *state;
    static run_record r;
    f->job.train.type = JOB_TRAIN_LORA;
    f->job.lora.rank = 4;
    f->job.lora.alpha = 8;
    derive(f, &r);
    assert_string_equal(r.train_type, "lora");
    assert_int_equal(r.total_params, SMALL_TOTAL);
    assert_int_equal(r.trainable_params, ADAPTER_ALL(4));
    assert_int_equal(r.lora_rank, 4);
    assert_true(r.lora_alpha == 8 && r.lora_scale == 2);
    assert_int_equal(r.n_lora_targets, 7);
    assert_string_equal(r.lora_targets[0], "q_proj");
    assert_string_equal(r.lora_targets[6], "down_proj");
    assert_string_equal(r.quant, "none");
}

static void test_qlora(void **state) {
    fixture *f = *state;
    static run_record r;
    job_config *j = &f->job;
    j->train.type = JOB_TRAIN_QLORA;
    j->lora.rank = 16;
    j->lora.alpha = 16;
    j->lora.rslora = true;
    j->lora.n_targets = 2;
    strcpy(j->lora.targets[0], "q_proj");
    strcpy(j->lora.targets[1], "v_proj");
    j->fsdp.cpu_offload = true;
    j->fsdp.activation_checkpointing = JOB_ACT_CKPT_FULL;
    j->model.dtype = JOB_DTYPE_BF16;
    derive(f, &r);
    assert_string_equal(r.train_type, "qlora");
    assert_int_equal(r.trainable_params, ADAPTER_QV(16));
    assert_int_equal(r.n_lora_targets, 2);
    assert_string_equal(r.lora_targets[0], "q_proj");
    assert_string_equal(r.lora_targets[1], "v_proj");
    assert_true(r.lora_scale == 4); /* 16 / sqrt(16) */
    assert_string_equal(r.quant, "nf4");
    assert_true(r.cpu_offload);
    assert_non_null(strstr(r.recompute, "full"));
    /* the CPU backend only rounds the stored weights */
    assert_string_equal(r.storage_dtype, "bf16");
    assert_string_equal(r.compute_dtype, "f32");
    assert_non_null(strstr(r.dtypes, "bf16 storage, fp32 compute"));
    assert_non_null(strstr(r.dtypes, "the CPU backend computes and checkpoints in fp32"));
}

/* job.json loads back (as fsdpd --job and fsdpctl plan load it) to the same job; run.json to
 * the same record. */
static void test_files_reload(void **state) {
    fixture *f = *state;
    static run_record r, back_r;
    static job_config back;
    errbuf err;
    f->job.train.type = JOB_TRAIN_LORA;
    f->job.lora.rank = 4;
    f->job.train.lr = 1e-5;
    f->job.runtime.log_every = 10;
    derive(f, &r);
    assert_int_equal(file_mkdir_p(f->job.output.dir, &err), 0);
    /* the output record beside the status sockets: here, in TMPDIR/fsdpd-UID */
    setenv("TMPDIR", f->dir, 1);
    setenv("XDG_RUNTIME_DIR", "", 1);
    unsetenv("SLURM_JOB_ID");
    if (run_report_start(&r, &f->job, &err)) fail_msg("%s", err.msg);
    char record[PATH_BYTES + 128], *text, named[PATH_BYTES];
    size_t len;
    snprintf(record, sizeof record, "%s/fsdpd-%u/fsdpd-local-%d.output", f->dir, (unsigned)geteuid(), (int)getpid());
    if (file_read_private(record, 8192, &text, &len, &err)) fail_msg("%s", err.msg);
    assert_int_equal(status_output_record_parse(text, len, named, sizeof named, record, &err), 0);
    free(text);
    assert_non_null(strstr(named, "/out"));
    assert_int_equal(strncmp(named, "/tmp/", 5), 0);
    char path[PATH_BYTES + 16];
    snprintf(path, sizeof path, "%s/job.json", f->job.output.dir);
    if (job_load(&back, path, &err)) fail_msg("%s", err.msg);
    assert_int_equal(job_resolve_runtime(&back, 0, &err), 0);
    assert_int_equal(job_resolve(&back, 2, &err), 0);
    json_t *a = job_to_object(&f->job, &err), *b = job_to_object(&back, &err);
    assert_true(json_equal(a, b));
    assert_int_equal(back.train.grad_accum, f->job.train.grad_accum);
    assert_int_equal(back.runtime.log_every, 10);
    json_decref(a);
    json_decref(b);
    if (run_record_load(&back_r, f->job.output.dir, &err)) fail_msg("%s", err.msg);
    assert_memory_equal(&r, &back_r, sizeof r);
}

/* The summary from the progress: the figures, the best eval (not the last), the committed
 * checkpoints only, how to load the output; and run.json holds it. */
static void test_summary(void **state) {
    fixture *f = *state;
    static run_record r, back;
    errbuf err;
    f->job.train.type = JOB_TRAIN_LORA;
    derive(f, &r);
    char dir[PATH_BYTES + 64];
    const char *names[] = {"step-000002", "step-000004", "step-000006.partial.1", "superseded", "latest-x"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(dir, sizeof dir, "%s/%s", f->job.checkpoint.dir, names[i]);
        assert_int_equal(file_mkdir_p(dir, &err), 0);
    }
    assert_int_equal(file_mkdir_p(f->job.output.dir, &err), 0);
    run_progress p = {.started = clock_now_s() - 5};
    for (int s = 1; s <= 4; s++) run_report_note_step(&p, s, 4, 3.0 - s * 0.1, 100 + s, 100 * s + s * (s + 1) / 2, 0.5);
    run_report_note_eval(&p, 2, 1.0);
    run_report_note_eval(&p, 4, 1.5);
    if (run_report_finish(&r, &f->job, &p, &err)) fail_msg("%s", err.msg);
    const run_summary *s = &r.summary;
    assert_true(r.has_summary);
    assert_int_equal(s->steps, 4);
    assert_int_equal(s->tokens, 410);
    assert_int_equal(s->tokens_computed, 4 * r.tokens_per_step);
    assert_true(s->tokens_per_s > 205 - 1e-9 && s->tokens_per_s < 205 + 1e-9); /* 410 / 2 s */
    assert_true(s->wall_s >= 5);
    assert_true(s->final_loss > 2.6 - 1e-9 && s->final_loss < 2.6 + 1e-9);
    assert_true(s->has_eval && s->final_eval_loss == 1.5 && s->best_eval_loss == 1.0);
    assert_int_equal(s->best_eval_step, 2);
    assert_int_equal(s->n_checkpoints, 2);
    assert_string_equal(s->checkpoints[0], "step-000002");
    assert_string_equal(s->checkpoints[1], "step-000004");
    assert_false(s->has_mfu); /* the CPU backend */
    assert_true(s->adapter);
    assert_non_null(strstr(s->load, "PeftModel.from_pretrained(base, \""));
    if (run_record_load(&back, f->job.output.dir, &err)) fail_msg("%s", err.msg);
    assert_memory_equal(&r, &back, sizeof r);
}

/* The output record's strict reading: one absolute path and a newline. */
static void test_output_record(void **state) {
    (void)state;
    char out[64], path[128];
    errbuf err;
    assert_int_equal(status_output_record_parse("/runs/x/out\n", 12, out, sizeof out, "r", &err), 0);
    assert_string_equal(out, "/runs/x/out");
    const char *bad[] = {"runs/x\n", "/a\n/b\n", "/a", "\n", ""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(status_output_record_parse(bad[i], strlen(bad[i]), out, sizeof out, "r", &err), -1);
    assert_int_equal(status_output_record_parse("/a\0b\n", 5, out, sizeof out, "r", &err), -1);
    char longer[80];
    memset(longer, 'a', sizeof longer);
    longer[0] = '/';
    longer[79] = '\n';
    assert_int_equal(status_output_record_parse(longer, sizeof longer, out, sizeof out, "r", &err), -1);
    assert_int_equal(status_output_record_path(path, sizeof path, "/run/user/1", "123", &err), 0);
    assert_string_equal(path, "/run/user/1/fsdpd-123.output");
    assert_int_equal(status_output_record_path(path, sizeof path, "/d", "../x", &err), -1);
}

/* The ETA: the mean of the last 16 steps' seconds times the steps left. */
static void test_eta(void **state) {
    (void)state;
    run_progress p = {0};
    assert_true(run_report_eta(&p) < 0);
    for (int s = 1; s <= 20; s++) run_report_note_step(&p, s, 100, 1.0, 10, 10 * s, (double)s);
    /* seconds 5 .. 20: mean 12.5, 80 steps left */
    assert_true(run_report_eta(&p) > 999.999 && run_report_eta(&p) < 1000.001);
    assert_int_equal(p.tokens_run, 200);
    assert_int_equal(p.tokens_seen, 200);
    run_report_note_eval(&p, 10, 2.0);
    run_report_note_eval(&p, 20, 2.5);
    assert_true(p.best_eval == 2.0 && p.best_eval_step == 10 && p.final_eval == 2.5);
    char d[32];
    run_report_duration(3723, d, sizeof d);
    assert_string_equal(d, "1h02m03s");
    run_report_duration(59.4, d, sizeof d);
    assert_string_equal(d, "59s");
}

/* run.json's decoder: a record round-trips; a missing key, an unknown one, a wrong type and
 * inconsistent batch figures are refused, naming the key. */
static void test_record_strict(void **state) {
    fixture *f = *state;
    static run_record r, back;
    errbuf err;
    derive(f, &r);
    r.has_summary = true;
    r.summary.steps = 5;
    r.summary.has_eval = true;
    r.summary.final_eval_loss = 1.5;
    r.summary.best_eval_loss = 1.25;
    r.summary.n_checkpoints = 1;
    strcpy(r.summary.checkpoints[0], "step-000005");
    char *text;
    assert_int_equal(run_record_to_json(&r, &text, &err), 0);
    assert_int_equal(run_record_parse(&back, text, strlen(text), "run.json", &err), 0);
    assert_memory_equal(&r, &back, sizeof r);
    json_t *o = json_loads(text, 0, NULL);
    free(text);
    struct {
        const char *key, *value, *says;
    } bad[] = {
        {"global_batch", "25", "global_batch 25 is not"},
        {"world_size", "3", "world_size 3"},
        {"lora_targets", "\"q_proj\"", "\"lora_targets\": expected a list"},
        {"backend", "\"tpu\"", "backend"},
        {"extra", "1", "unknown key \"extra\""},
        {"version", "2", "\"version\""},
        {"started", "-1", "\"started\": -1 is negative"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_t *c = json_deep_copy(o);
        json_object_set_new(c, bad[i].key, json_loads(bad[i].value, JSON_DECODE_ANY, NULL));
        char *t = json_dumps(c, 0);
        assert_int_equal(run_record_parse(&back, t, strlen(t), "run.json", &err), -1);
        if (!strstr(err.msg, bad[i].says)) fail_msg("%s: %s", bad[i].key, err.msg);
        free(t);
        json_decref(c);
    }
    json_t *c = json_deep_copy(o);
    json_object_del(c, "seq_len");
    char *t = json_dumps(c, 0);
    assert_int_equal(run_record_parse(&back, t, strlen(t), "run.json", &err), -1);
    assert_non_null(strstr(err.msg, "\"seq_len\" is missing"));
    free(t);
    json_decref(c);
    c = json_deep_copy(o);
    json_object_set_new(json_object_get(c, "summary"), "final_eval_loss", json_null());
    t = json_dumps(c, 0);
    assert_int_equal(run_record_parse(&back, t, strlen(t), "run.json", &err), -1);
    assert_non_null(strstr(err.msg, "both numbers or both null"));
    free(t);
    json_decref(c);
    json_decref(o);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_full, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lora, setup, teardown),
        cmocka_unit_test_setup_teardown(test_qlora, setup, teardown),
        cmocka_unit_test_setup_teardown(test_files_reload, setup, teardown),
        cmocka_unit_test(test_eta),
        cmocka_unit_test(test_output_record),
        cmocka_unit_test_setup_teardown(test_summary, setup, teardown),
        cmocka_unit_test_setup_teardown(test_record_strict, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
