/* Unit tests for proto/job: defaults, the example job, bad job files, overrides and aliases,
 * validation, sizes, runtime resolution and the job_to_object / job_from_object round trip.
 * Run from the repository root (tests/run.sh does). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "proto/job.h"
#include "proto/job_flags.h"

#define EXAMPLE "configs/jobs/example-full.json"

static int parse(job_config *j, const char *text, errbuf *err) {
    return job_parse_text(j, text, strlen(text), "test.json", err);
}

static void assert_contains(const char *msg, const char *part) {
    if (!strstr(msg, part)) fail_msg("message \"%s\" lacks \"%s\"", msg, part);
}

/* What the daemon does with a job once its world size is known. */
static int resolve_and_validate(job_config *j, int world, errbuf *err) {
    return job_resolve(j, world, err) || job_validate(j, world, err) ? -1 : 0;
}

static void must_override(job_config *j, const char *arg) {
    errbuf err = {""};
    if (job_apply_override(j, arg, &err) != 0) fail_msg("%s: %s", arg, err.msg);
}

static void override_fails(job_config *j, const char *arg, const char *part) {
    errbuf err = {""};
    if (job_apply_override(j, arg, &err) == 0) fail_msg("%s was accepted", arg);
    assert_contains(err.msg, part);
}

static void test_defaults_are_valid(void **state) {
    (void)state;
    job_config j;
    errbuf err = {""};
    job_defaults(&j);
    assert_int_equal(j.data.seq_len, 512);
    assert_int_equal(j.train.global_batch, 8);
    assert_true(j.train.lr == 2e-5);
    assert_int_equal(j.train.schedule, JOB_SCHEDULE_COSINE);
    assert_int_equal(j.lora.n_targets, 7); /* all-linear */
    assert_string_equal(j.lora.targets[6], "down_proj");
    assert_int_equal(j.output.shard_size, 5000000000LL);
    assert_true(j.output.consolidate);
    assert_string_equal(j.checkpoint.dir, ""); /* job_resolve: OUTPUT_DIR.checkpoints */
    assert_int_equal(j.checkpoint.max_failed_saves, 3);
    /* the stall watch: 300 s past the longest healthy wait unless given */
    assert_int_equal(job_stall_timeout_s(&j), 900);
    j.checkpoint.timeout_s = 1200;
    assert_int_equal(job_stall_timeout_s(&j), 1500);
    j.runtime.stall_timeout_s = 2000;
    assert_int_equal(job_stall_timeout_s(&j), 2000);
    j.runtime.stall_timeout_s = 0, j.checkpoint.timeout_s = 600;
    /* Packing is off unless asked for; no evaluation split unless asked for. */
    assert_false(j.data.packing);
    assert_true(j.data.eval_fraction == 0);
    assert_int_equal(j.data.on_bad_record, JOB_BAD_RECORD_FAIL);
    assert_int_equal(parse(&j, "{\"data\":{\"packing\":false,\"eval_fraction\":0,"
                               "\"on_bad_record\":\"fail\"}}", &err), 0);

    /* The only keys without a usable default are the model and the data. */
    assert_int_equal(resolve_and_validate(&j, 1, &err), -1);
    assert_contains(err.msg, "model.path: required");
    strcpy(j.model.path, "models/llama");
    assert_int_equal(resolve_and_validate(&j, 1, &err), -1);
    assert_contains(err.msg, "data.path: required");
    strcpy(j.data.path, "data/train.tokens");
    if (resolve_and_validate(&j, 1, &err)) fail_msg("%s", err.msg);
    assert_int_equal(j.train.grad_accum, 8);
    assert_string_equal(j.runtime.metrics, "output/metrics.jsonl");
    /* Beside the output, not inside it (F36); a trailing slash does not move it inside. */
    assert_string_equal(j.checkpoint.dir, "output.checkpoints");
    job_config k;
    job_defaults(&k);
    strcpy(k.output.dir, "/runs/llama-qlora//");
    assert_int_equal(job_resolve(&k, 1, &err), 0);
    assert_string_equal(k.checkpoint.dir, "/runs/llama-qlora.checkpoints");
    assert_int_equal(job_apply_override(&k, "--checkpoint.resume=force", &err), 0);
    assert_int_equal(k.checkpoint.resume, JOB_RESUME_FORCE);
    json_t *obj = job_to_object(&k, &err);
    assert_non_null(obj);
    assert_string_equal(json_string_value(json_object_get(json_object_get(obj, "checkpoint"), "resume")), "force");
    json_decref(obj);
    if (resolve_and_validate(&j, 8, &err)) fail_msg("%s", err.msg);
    assert_int_equal(j.train.grad_accum, 1);

    /* No final save leaves nothing to consolidate. */
    assert_true(j.checkpoint.save_final);
    j.checkpoint.save_final = false;
    assert_int_equal(resolve_and_validate(&j, 1, &err), -1);
    assert_contains(err.msg, "checkpoint.save_final");
    j.output.consolidate = false;
    if (resolve_and_validate(&j, 1, &err)) fail_msg("%s", err.msg);
}

static void test_example_full_parses(void **state) {
    (void)state;
    job_config j;
    errbuf err = {""};
    if (job_load(&j, EXAMPLE, &err)) fail_msg("%s", err.msg);
    assert_int_equal(j.model.init, JOB_INIT_RANDOM);
    assert_string_equal(j.model.config, "configs/models/tiny.json");
    assert_int_equal(j.model.dtype, JOB_DTYPE_F32);
    assert_int_equal(j.data.seq_len, 128);
    assert_true(j.data.eval_fraction == 0);
    assert_false(j.data.packing);
    assert_int_equal(j.data.on_bad_record, JOB_BAD_RECORD_FAIL);
    assert_int_equal(j.train.micro_batch, 2);
    assert_int_equal(j.train.max_steps, 100);
    assert_true(j.train.lr == 3e-4);
    assert_true(j.train.betas[1] == 0.95);
    assert_int_equal(j.train.seed, 1234);
    assert_int_equal(j.fsdp.activation_checkpointing, JOB_ACT_CKPT_FULL);
    assert_int_equal(j.checkpoint.keep, 3);
    assert_int_equal(j.output.shard_size, 5000000000LL);
    assert_int_equal(j.runtime.backend, JOB_BACKEND_CPU);
    assert_string_equal(j.runtime.metrics, "runs/example/metrics.jsonl");
    if (resolve_and_validate(&j, 2, &err)) fail_msg("%s", err.msg);
    assert_int_equal(j.train.grad_accum, 2);

    /* It sets every key: the strict reader (which requires them all) accepts it too. */
    FILE *f = fopen(EXAMPLE, "rb");
    assert_non_null(f);
    char text[8192];
    size_t n = fread(text, 1, sizeof text, f);
    fclose(f);
    assert_true(n > 0 && n < sizeof text);
    job_config strict;
    json_t *root = json_loadb(text, n, 0, NULL);
    assert_non_null(root);
    if (job_from_object(&strict, root, &err)) fail_msg("%s", err.msg);
    json_decref(root);
}

/* A job file that must be rejected (by job_parse_text, or by job_resolve/job_validate with `world`
 * ranks when it parses), with a message holding both parts. */
typedef struct bad_case {
    const char *json;
    int world;
    const char *part1, *part2;
} bad_case;

#define MD "\"model\":{\"path\":\"m\"},\"data\":{\"path\":\"d\"}"

static const bad_case bad_cases[] = {
    {"{\"trian\":{\"lr\":1}}", 1, "trian: unknown section", "did you mean train?"},
    {"{\"optimizer\":{}}", 1, "optimizer: unknown section", "sections: model, data"},
    {"{\"train\":{\"lrr\":1}}", 1, "train.lrr: unknown key", "did you mean train.lr?"},
    {"{\"train\":{\"foo\":1}}", 1, "train.foo: unknown key", "train has: defaults, type, global_batch"},
    {"{\"train\":{\"lr\":\"fast\"}}", 1, "train.lr: expected a number, got a string", NULL},
    {"{\"train\":{\"lr\":-1e-4}}", 1, "train.lr: -0.0001 is out of range", "must be >= 0"},
    {"{\"train\":{\"global_batch\":-4}}", 1, "train.global_batch: -4 is out of range", NULL},
    {"{\"train\":{\"global_batch\":2.5}}", 1, "train.global_batch: expected an integer", NULL},
    {"{\"train\":{\"global_batch\":4294967296}}", 1, "train.global_batch: 4294967296 is out", NULL},
    {"{\"train\":{\"betas\":[0.9,1.0]}}", 1, "train.betas[1]: 1 is out of range", "[0, 1)"},
    {"{\"train\":{\"betas\":[-0.1,0.9]}}", 1, "train.betas[0]: -0.1 is out of range", NULL},
    {"{\"train\":{\"betas\":[0.9]}}", 1, "train.betas: expected a list of two numbers", NULL},
    {"{\"train\":{\"betas\":0.9}}", 1, "train.betas: expected a list of two numbers", NULL},
    {"{\"train\":{\"eps\":0}}", 1, "train.eps: 0 is out of range", "must be > 0"},
    {"{\"train\":{\"schedule\":\"cosine_with_restarts\"}}", 1,
     "train.schedule: unknown choice 'cosine_with_restarts'", "constant, linear, cosine"},
    {"{" MD ",\"lora\":{\"init_from\":\"adapter\"}}", 1, "lora.init_from: only with train.type lora", NULL},
    {"{" MD ",\"train\":{\"type\":\"lora\"},\"output\":{\"merge\":true,\"consolidate\":false},"
     "\"checkpoint\":{\"save_final\":false}}", 1, "output.merge: needs output.consolidate", NULL},
    {"{\"lora\":{\"rank\":0}}", 1, "lora.rank", NULL},
    {"{\"lora\":{\"targets\":\"all\"}}", 1, "lora.targets: expected \"all-linear\" or a list", NULL},
    {"{\"lora\":{\"targets\":[]}}", 1, "lora.targets: expected \"all-linear\" or a list", NULL},
    {"{\"lora\":{\"rslora\":1}}", 1, "lora.rslora", NULL},
    {"{\"lora\":{\"targets\":[\"q_proj\",\"x\"]}}", 1, "lora.targets[1]: unknown module 'x'", NULL},
    {"{" MD ",\"train\":{\"type\":\"lora\"},\"fsdp\":{\"sharding\":\"shard_grad_op\"}}", 1,
     "fsdp.sharding: 'shard_grad_op' with adapters (train.type lora or qlora) is not built yet", NULL},
    {"{" MD ",\"fsdp\":{\"sharding\":\"shard_grad_op\",\"cpu_offload\":true}}", 1,
     "fsdp.sharding: 'shard_grad_op' with fsdp.cpu_offload is not built yet", NULL},
    {"{\"fsdp\":{\"sharding\":\"zero3\"}}", 1, "fsdp.sharding: unknown choice 'zero3'",
     "full_shard, shard_grad_op, no_shard, hybrid_shard"},
    {"{\"fsdp\":{\"activation_checkpointing\":\"some\"}}", 1,
     "fsdp.activation_checkpointing: unknown choice 'some'", "none, full, selective, auto"},
    {"{" MD ",\"fsdp\":{\"offload_params\":true}}", 1, "fsdp.offload_params: a full fine-tune's parameters are its master shards", NULL},
    {"{" MD ",\"fsdp\":{\"mlp_chunk\":4096}}", 1,
     "fsdp.mlp_chunk: the MLP in chunks recomputes each chunk in the backward: it needs "
     "fsdp.activation_checkpointing full or selective (auto: not built yet)", NULL},
    {"{" MD ",\"train\":{\"type\":\"lora\"},\"lora\":{\"dropout\":0.1},\"fsdp\":{\"mlp_chunk\":4096,"
     "\"activation_checkpointing\":\"full\"}}", 1,
     "fsdp.mlp_chunk with lora.dropout 0.1: not built yet", NULL},
    {"{\"fsdp\":{\"mlp_chunk\":-1}}", 1, "fsdp.mlp_chunk: -1 is out of range", NULL},
    {"{" MD ",\"fsdp\":{\"offload_activations\":true,\"activation_checkpointing\":\"selective\"}}", 1,
     "fsdp.offload_activations: moves the layer inputs that full recompute keeps: it needs "
     "fsdp.activation_checkpointing full", NULL},
    {"{\"fsdp\":{\"forward_prefetch\":1}}", 1,
     "fsdp.forward_prefetch: expected true or false, got an integer", NULL},
    {"{\"data\":{\"seq_len\":1}}", 1, "data.seq_len: 1 is out of range", "[2, 1048576]"},
    {"{\"data\":{\"eval_fraction\":1}}", 1, "data.eval_fraction: 1 is out of range", NULL},
    {"{\"data\":{\"on_bad_record\":\"warn\"}}", 1, "data.on_bad_record: unknown choice", "skip, fail"},
    {"{\"model\":{\"dtype\":\"fp16\"}}", 1, "model.dtype: unknown choice 'fp16'", "auto, f32, bf16"},
    {"{\"model\":{\"init\":\"zeros\"}}", 1, "model.init: unknown choice 'zeros'", "\"\", random"},
    {"{\"model\":{\"path\":7}}", 1, "model.path: expected a string, got an integer", NULL},
    {"{\"checkpoint\":{\"keep\":0}}", 1, "checkpoint.keep: 0 is out of range", NULL},
    {"{\"checkpoint\":{\"timeout_s\":0}}", 1, "checkpoint.timeout_s: 0 is out of range", NULL},
    {"{\"output\":{\"dir\":\"/\"}}", 1, "checkpoint.dir: cannot derive it from output.dir '/'", NULL},
    {"{\"checkpoint\":{\"max_failed_saves\":0}}", 1, "checkpoint.max_failed_saves: 0 is out of range", NULL},
    {"{\"checkpoint\":{\"resume\":\"step-x\"}}", 1, "checkpoint.resume: unknown choice 'step-x'",
     "auto, never, latest, force, step-N"},
    {"{\"output\":{\"shard_size\":\"5XB\"}}", 1, "output.shard_size: '5XB' is not a size", NULL},
    {"{\"output\":{\"shard_size\":0}}", 1, "output.shard_size: 0 is out of range", NULL},
    {"{\"runtime\":{\"gpu_memory_limit\":-1}}", 1, "runtime.gpu_memory_limit: -1 is out of range",
     "must be >= 0 bytes"},
    {"{\"runtime\":{\"gpu_memory_limit\":\"22 GiB\"}}", 1,
     "runtime.gpu_memory_limit: '22 GiB' is not a size", NULL},
    {"{\"runtime\":{\"gpu_memory_limit\":1.5}}", 1, "runtime.gpu_memory_limit: expected a size", NULL},
    {"{\"output\":{\"dtype\":\"f16\"}}", 1, "output.dtype: unknown choice 'f16'", "auto, bf16, f32"},
    {"{\"runtime\":{\"heartbeat_s\":0}}", 1, "runtime.heartbeat_s: 0 is out of range", NULL},
    {"{\"runtime\":{\"stall_timeout_s\":-1}}", 1, "runtime.stall_timeout_s: -1 is out of range", NULL},
    {"{" MD ",\"runtime\":{\"stall_timeout_s\":600}}", 1,
     "runtime.stall_timeout_s: 600 s is not longer than a healthy step may wait",
     "runtime.comm_timeout_s 600 s for a collective, checkpoint.timeout_s 600 s"},
    {"{" MD ",\"runtime\":{\"stall_timeout_s\":700,\"comm_timeout_s\":800}}", 1,
     "runtime.stall_timeout_s: 700 s is not longer", "comm_timeout_s 800 s"},
    {"{" MD ",\"runtime\":{\"stall_timeout_s\":12,\"heartbeat_s\":6,\"comm_timeout_s\":5},"
     "\"checkpoint\":{\"timeout_s\":5}}", 1,
     "runtime.stall_timeout_s: 12 s is not longer than two heartbeats", "runtime.heartbeat_s 6 s"},
    {"{\"runtime\":{\"status_socket\":\"/tmp/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
     "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.sock\"}}", 1,
     "runtime.status_socket: ", "is too long (at most 107)"},
    {"{\"train\":[]}", 1, "train: expected an object, got a list", NULL},
    {"[]", 1, "expected a JSON object at the top level, got a list", NULL},
    {"{\"train\":{\"lr\":1,\"lr\":2}}", 1, "duplicate", NULL},
    {"{\"train\":{\"lr\":}}", 1, "test.json:1:", NULL},
    /* cross-field rules, found by job_resolve and job_validate */
    {"{" MD "}", 3, "train.global_batch: 8 is not a multiple of train.micro_batch (1) x world "
                    "size (3) = 3", "use 6 or 9"},
    {"{" MD ",\"train\":{\"global_batch\":2,\"micro_batch\":2}}", 2,
     "train.global_batch: 2 is smaller than train.micro_batch (2) x world size (2) = 4", NULL},
    {"{" MD ",\"train\":{\"lr\":1e-5,\"min_lr\":1e-4}}", 1, "train.min_lr: 0.0001 is above "
                                                           "train.lr", NULL},
    {"{" MD ",\"train\":{\"max_steps\":5,\"warmup_steps\":10}}", 1,
     "train.warmup_steps: 10 is more than train.max_steps (5)", NULL},
    {"{\"data\":{\"path\":\"d\"}}", 1, "model.path: required", "model.init"},
    {"{\"model\":{\"init\":\"random\"},\"data\":{\"path\":\"d\"}}", 1,
     "model.config: required with model.init \"random\"", NULL},
    {"{\"model\":{\"init\":\"random\",\"config\":\"c.json\",\"path\":\"m\"},\"data\":{\"path\":"
     "\"d\"}}", 1, "model.path: set together with model.init \"random\"", NULL},
    {"{\"model\":{\"path\":\"m\",\"config\":\"c.json\"},\"data\":{\"path\":\"d\"}}", 1,
     "model.config: only used with model.init \"random\"", NULL},
    {"{\"model\":{\"path\":\"m\"}}", 1, "data.path: required", NULL},
};

static void test_bad_job_files(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
        const bad_case *c = &bad_cases[i];
        job_config j;
        errbuf err = {""};
        int rc = parse(&j, c->json, &err);
        if (rc == 0) {
            rc = resolve_and_validate(&j, c->world, &err);
            if (rc == 0) fail_msg("case %zu accepted: %s", i, c->json);
        } else if (strncmp(err.msg, "test.json", 9) != 0) {
            fail_msg("case %zu: message \"%s\" does not start with the file name", i, err.msg);
        }
        assert_contains(err.msg, c->part1);
        if (c->part2) assert_contains(err.msg, c->part2);
    }
}

static void test_malformed_json_has_position(void **state) {
    (void)state;
    job_config j;
    errbuf err = {""};
    assert_int_equal(parse(&j, "{\n  \"train\": {\n    \"lr\": 1e-4,\n  }\n}", &err), -1);
    assert_contains(err.msg, "test.json:4:3:"); /* line 4, column 3: the '}' after the comma */
    assert_int_equal(parse(&j, "", &err), -1);
    assert_contains(err.msg, "test.json:");
    assert_int_equal(job_parse_text(&j, "{\"a\":\0}", 7, "nul.json", &err), -1);
    assert_contains(err.msg, "nul.json:1:");
}

static void test_job_load_errors(void **state) {
    (void)state;
    job_config j;
    errbuf err = {""};
    assert_int_equal(job_load(&j, "/nonexistent/job.json", &err), -1);
    assert_contains(err.msg, "/nonexistent/job.json: open: No such file");

    char path[] = "/tmp/test_job_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    const char *text = "{\"train\": {\"lr\": \"x\"}}";
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    assert_int_equal(job_load(&j, path, &err), -1);
    assert_contains(err.msg, path);
    assert_contains(err.msg, "train.lr: expected a number");

    /* A file over JOB_FILE_MAX is refused before parsing. */
    assert_int_equal(ftruncate(fd, JOB_FILE_MAX + 1), 0);
    assert_int_equal(job_load(&j, path, &err), -1);
    assert_contains(err.msg, "larger than");
    close(fd);
    unlink(path);
}

/* F25: the JSONL formats, templates, skip and truncate are accepted; a template name that is
 * not a built-in one is refused.  (Whether data.path is JSONL or a token cache is decided by
 * its content, by fsdpd: daemon/data_prepare.h, test_chat_data.sh; never by its name here.) */
static void test_data_keys(void **state) {
    (void)state;
    job_config j;
    job_defaults(&j);
    errbuf err;
    assert_true(j.data.truncate);
    strcpy(j.model.path, "models/llama");
    must_override(&j, "--data.path=chat.jsonl");
    if (resolve_and_validate(&j, 1, &err)) fail_msg("%s", err.msg);
    must_override(&j, "--data.format=chat");
    must_override(&j, "--data.template=llama2");
    must_override(&j, "--data.on_bad_record=skip");
    must_override(&j, "--data.truncate=false");
    assert_int_equal(j.data.format, JOB_DATA_CHAT);
    assert_int_equal(j.data.on_bad_record, JOB_BAD_RECORD_SKIP);
    assert_false(j.data.truncate);
    if (resolve_and_validate(&j, 1, &err)) fail_msg("%s", err.msg);
    must_override(&j, "--data.template=vicuna");
    assert_int_equal(resolve_and_validate(&j, 1, &err), -1);
    assert_contains(err.msg, "data.template: 'vicuna' is not one of llama3, llama2, chatml, qwen2, qwen2.5, qwen3, mistral, mistral-v3, mistral-tekken, alpaca, auto");
}

/* F45: train.precision, train.fp8_scaling and train.fp8_all_gather, strictly read; fp8
 * refused where not built, the FP8 keys refused without it, FP8 gathers with rowwise scales or
 * cpu_offload refused. */
static void test_precision_keys(void **state) {
    (void)state;
    errbuf err;
    job_config j;
    job_defaults(&j);
    assert_int_equal(j.train.precision, JOB_PRECISION_BF16);
    assert_int_equal(j.train.fp8_scaling, JOB_FP8_TENSORWISE);
    override_fails(&j, "--train.precision=fp16", "train.precision");
    override_fails(&j, "--train.fp8_scaling=blockwise", "train.fp8_scaling");
    assert_int_equal(j.train.fp8_grad_format, JOB_FP8_E4M3);
    override_fails(&j, "--train.fp8_grad_format=e3m4", "train.fp8_grad_format");
    strcpy(j.model.path, "models/llama");
    strcpy(j.data.path, "data.jsonl");
    must_override(&j, "--train.precision=bf16");
    if (resolve_and_validate(&j, 1, &err)) fail_msg("%s", err.msg);
    job_config k = j;
    must_override(&k, "--train.fp8_scaling=rowwise");
    assert_int_equal(k.train.fp8_scaling, JOB_FP8_ROWWISE);
    assert_int_equal(resolve_and_validate(&k, 1, &err), -1);
    assert_contains(err.msg, "train.fp8_scaling: \"rowwise\" is set but train.precision is not fp8");
    must_override(&k, "--train.precision=fp8");
    assert_int_equal(k.train.precision, JOB_PRECISION_FP8);
    assert_true(k.train.fp8_all_gather); /* the default */
    assert_int_equal(resolve_and_validate(&k, 1, &err), -1);
    assert_contains(err.msg, "train.fp8_all_gather with train.fp8_scaling rowwise is not built yet");
    must_override(&k, "--train.fp8_all_gather=false");
    if (resolve_and_validate(&k, 1, &err)) fail_msg("%s", err.msg); /* a full fine-tune, SFT */
    job_config e5 = k, e5_bf16 = j;
    must_override(&e5, "--train.fp8_grad_format=e5m2");
    assert_int_equal(e5.train.fp8_grad_format, JOB_FP8_E5M2);
    if (resolve_and_validate(&e5, 1, &err)) fail_msg("%s", err.msg);
    must_override(&e5_bf16, "--train.fp8_grad_format=e5m2");
    assert_int_equal(resolve_and_validate(&e5_bf16, 1, &err), -1);
    assert_contains(err.msg, "train.fp8_grad_format: \"e5m2\" is set but train.precision is not fp8");
    job_config off = j, gathers = k;
    must_override(&off, "--train.fp8_all_gather=false");
    assert_int_equal(resolve_and_validate(&off, 1, &err), -1);
    assert_contains(err.msg, "train.fp8_all_gather: false is set but train.precision is not fp8");
    must_override(&gathers, "--train.fp8_scaling=tensorwise");
    must_override(&gathers, "--train.fp8_all_gather=true");
    if (resolve_and_validate(&gathers, 1, &err)) fail_msg("%s", err.msg);
    must_override(&gathers, "--fsdp.cpu_offload=true");
    assert_int_equal(resolve_and_validate(&gathers, 1, &err), -1);
    assert_contains(err.msg, "train.fp8_all_gather with fsdp.cpu_offload is not built yet");
    job_config lora = k, dpo = k;
    must_override(&lora, "--train.type=lora");
    assert_int_equal(resolve_and_validate(&lora, 1, &err), -1);
    assert_contains(err.msg, "train.precision fp8 with train.type 'lora' is not built yet");
    must_override(&dpo, "--train.objective=dpo");
    assert_int_equal(resolve_and_validate(&dpo, 1, &err), -1);
    assert_contains(err.msg, "train.precision fp8 with a preference objective is not built yet");
}

/* F49: train.objective and its settings, strictly read; what is not built refused. */
static void test_objective_keys(void **state) {
    (void)state;
    errbuf err;
    job_config j;
    job_defaults(&j);
    assert_int_equal(j.train.objective, JOB_OBJECTIVE_SFT);
    assert_true(j.train.dpo_beta == 0.1 && j.train.orpo_lambda == 0.1 && j.train.dpo_label_smoothing == 0);
    override_fails(&j, "--train.objective=kto", "train.objective");
    override_fails(&j, "--train.dpo_beta=0", "train.dpo_beta");
    override_fails(&j, "--train.dpo_label_smoothing=0.5", "train.dpo_label_smoothing");
    override_fails(&j, "--train.dpo_loss=hinge", "train.dpo_loss");
    override_fails(&j, "--train.orpo_lambda=-1", "train.orpo_lambda");
    strcpy(j.model.path, "models/llama");
    strcpy(j.data.path, "pairs.tokens");
    const char *lora_dpo[] = {"--train.type=lora", "--train.objective=dpo", "--train.dpo_beta=0.2",
                              "--train.dpo_loss=robust", "--train.dpo_label_smoothing=0.1"};
    for (size_t i = 0; i < sizeof lora_dpo / sizeof lora_dpo[0]; i++) must_override(&j, lora_dpo[i]);
    if (resolve_and_validate(&j, 1, &err)) fail_msg("%s", err.msg);
    assert_int_equal(j.train.dpo_loss, JOB_DPO_ROBUST);
    assert_int_equal(job_rows_per_sample(&j), 2);
    static const struct {
        const char *override, *want;
    } refused[] = {
        {"--data.packing=true", "data.packing: packing the pairs of train.objective 'dpo' is not built yet"},
        {"--data.eval_fraction=0.1", "data.eval_fraction: the held-out loss of train.objective 'dpo' is not built yet"},
        {"--data.format=chat", "trains on pairs: data.format preference (JSONL {prompt, chosen, rejected}) or a token cache of pairs, not chat records"},
        {"--data.truncation_mode=keep_end", "data.truncation_mode: \"keep_end\" is set but data.format is not preference"},
        {"--fsdp.cpu_offload=true", "fsdp.cpu_offload with train.objective 'dpo' is not built yet"},
        {"--train.orpo_lambda=0.5", "train.orpo_lambda: 0.5 is set but train.objective is not orpo"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        job_config k = j;
        must_override(&k, refused[i].override);
        assert_int_equal(resolve_and_validate(&k, 1, &err), -1);
        assert_contains(err.msg, refused[i].want);
    }
    job_config full = j; /* a full fine-tune's reference: the frozen copy of its start weights */
    must_override(&full, "--train.type=full");
    if (resolve_and_validate(&full, 1, &err)) fail_msg("%s", err.msg);
    must_override(&full, "--fsdp.cpu_offload=true");
    assert_int_equal(resolve_and_validate(&full, 1, &err), -1);
    assert_contains(err.msg, "fsdp.cpu_offload with train.objective 'dpo' is not built yet");
    job_config p = j; /* the JSONL preference format, both truncation modes */
    must_override(&p, "--data.format=preference");
    must_override(&p, "--data.truncation_mode=keep_end");
    if (resolve_and_validate(&p, 1, &err)) fail_msg("%s", err.msg);
    assert_int_equal(p.data.truncation_mode, JOB_TRUNC_KEEP_END);
    override_fails(&p, "--data.truncation_mode=keep_middle", "data.truncation_mode");
    must_override(&p, "--train.objective=sft");
    must_override(&p, "--train.dpo_beta=0.1");
    must_override(&p, "--train.dpo_loss=sigmoid");
    must_override(&p, "--train.dpo_label_smoothing=0");
    assert_int_equal(resolve_and_validate(&p, 1, &err), -1);
    assert_contains(err.msg, "data.format: preference records are pairs, for train.objective dpo or orpo (not sft)");
    must_override(&j, "--train.objective=orpo");
    assert_int_equal(resolve_and_validate(&j, 1, &err), -1);
    assert_contains(err.msg, "train.dpo_beta: 0.2 is set but train.objective is not dpo");
    must_override(&j, "--train.dpo_beta=0.1");
    must_override(&j, "--train.dpo_loss=sigmoid");
    must_override(&j, "--train.dpo_label_smoothing=0");
    must_override(&j, "--train.type=full");
    if (resolve_and_validate(&j, 1, &err)) fail_msg("%s", err.msg); /* ORPO needs no reference */
    must_override(&j, "--train.objective=sft");
    assert_int_equal(job_rows_per_sample(&j), 1);
}

/* F37: a value whose feature the job does not use is refused naming the key and why; the
 * same key at its default (spelled out in the file, or never named) is not "set". */
/* A job of 2 workers a node over a model and a token cache, with overrides a and b (NULL: none). */
static void two_worker_job(job_config *j, const char *a, const char *b) {
    job_defaults(j);
    strcpy(j->model.path, "models/llama");
    strcpy(j->data.path, "data.tokens");
    j->runtime.workers_per_node = 2;
    assert_int_equal(j->checkpoint.memory_interval_steps, -1);
    if (a) must_override(j, a);
    if (b) must_override(j, b);
}

/* checkpoint.memory_interval_steps: auto is on (1) only when a failure is recovered inside the
 * job; a value of the user's stays; with the shard files on node 0 alone (no_shard,
 * hybrid_shard on several nodes) auto is off and a value is refused as not built. */
static void test_memory_interval(void **state) {
    (void)state;
    errbuf err = {""};
    static const struct {
        const char *override;
        int world, want;
    } cases[] = {
        {NULL, 4, 0},
        {"--runtime.max_restarts=2", 4, 1},
        {"--runtime.spare_nodes=1", 4, 1},
        {"--checkpoint.memory_interval_steps=5", 4, 5},
        {"--checkpoint.memory_interval_steps=0", 4, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        job_config j;
        two_worker_job(&j, cases[i].override, NULL);
        if (resolve_and_validate(&j, cases[i].world, &err)) fail_msg("%s: %s", cases[i].override, err.msg);
        if (j.checkpoint.memory_interval_steps != cases[i].want)
            fail_msg("%s: %d, want %d", cases[i].override, j.checkpoint.memory_interval_steps, cases[i].want);
    }
    job_config j;
    two_worker_job(&j, "--runtime.max_restarts=1", "--fsdp.sharding=hybrid_shard");
    if (resolve_and_validate(&j, 4, &err)) fail_msg("%s", err.msg);
    assert_int_equal(j.checkpoint.memory_interval_steps, 0); /* two nodes: off */
    two_worker_job(&j, "--fsdp.sharding=no_shard", "--checkpoint.memory_interval_steps=1");
    if (resolve_and_validate(&j, 2, &err)) fail_msg("one node: %s", err.msg);
    assert_int_equal(resolve_and_validate(&j, 4, &err), -1);
    assert_contains(err.msg, "checkpoint.memory_interval_steps with fsdp.sharding 'no_shard' on several nodes is not "
                             "built yet");
    override_fails(&j, "--checkpoint.memory_interval_steps=-2", "checkpoint.memory_interval_steps");
}

static void test_unused_values_refused(void **state) {
    (void)state;
    static const struct {
        const char *override, *want;
    } cases[] = {
        {"--lora.rank=16", "lora.rank: 16 is set but train.type is full: adapters are not trained in a full fine-tune"},
        {"--lora_alpha=32", "lora.alpha: 32.0 is set but train.type is full"},
        {"--lora.dropout=0", "lora.dropout: 0.0 is set but train.type is full"},
        {"--lora.targets=q_proj,v_proj", "lora.targets: [\"q_proj\",\"v_proj\"] is set but train.type is full"},
        {"--lora.rslora=true", "lora.rslora: true is set but train.type is full"},
        {"--train.eval_interval=5", "train.eval_interval: 5 is set but data.eval_fraction is 0: no data is held out"},
        {"--data.template=llama3", "data.template: \"llama3\" is set but data.format is tokens: a token cache was "
                                   "templated, truncated and filtered when it was made"},
        {"--data.truncate=false", "data.truncate: false is set but data.format is tokens"},
        {"--data.on_bad_record=skip", "data.on_bad_record: \"skip\" is set but data.format is tokens"},
    };
    errbuf err;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        job_config j;
        job_defaults(&j);
        strcpy(j.model.path, "models/llama");
        strcpy(j.data.path, "data.tokens");
        must_override(&j, cases[i].override);
        assert_int_equal(resolve_and_validate(&j, 1, &err), -1);
        assert_contains(err.msg, cases[i].want);
    }
    /* the same keys where they are used: accepted */
    job_config j;
    job_defaults(&j);
    strcpy(j.model.path, "models/llama");
    strcpy(j.data.path, "data.jsonl");
    const char *used[] = {"--train.type=lora", "--lora.rank=16", "--lora.rslora=true", "--data.eval_fraction=0.1",
                          "--train.eval_interval=5", "--data.format=chat", "--data.template=llama3",
                          "--data.truncate=false", "--data.on_bad_record=skip"};
    for (size_t i = 0; i < sizeof used / sizeof used[0]; i++) must_override(&j, used[i]);
    if (resolve_and_validate(&j, 1, &err)) fail_msg("%s", err.msg);
    /* output.shard_size: an adapter is one file; with output.merge it sizes the merged model */
    must_override(&j, "--output.shard_size=1GB");
    assert_int_equal(resolve_and_validate(&j, 1, &err), -1);
    assert_contains(err.msg, "output.shard_size: 1000000000 is set but an adapter job's output is one "
                             "adapter_model.safetensors, never sharded");
    must_override(&j, "--output.merge=true");
    if (resolve_and_validate(&j, 1, &err)) fail_msg("%s", err.msg);
    /* output.dtype is built for adapters (the adapter is written in it) */
    must_override(&j, "--output.merge=false");
    must_override(&j, "--output.shard_size=5GB");
    must_override(&j, "--output.dtype=bf16");
    if (resolve_and_validate(&j, 1, &err)) fail_msg("%s", err.msg);
    /* defaults spelled out in a full fine-tune's file are not set */
    const char *file = "{\"model\": {\"path\": \"m\"}, \"data\": {\"path\": \"d.tokens\", \"template\": \"\", "
                       "\"truncate\": true, \"on_bad_record\": \"fail\"}, \"train\": {\"type\": \"full\", "
                       "\"eval_interval\": 0}, \"lora\": {\"rank\": 8, \"alpha\": 16, \"dropout\": 0.05, "
                       "\"targets\": \"all-linear\", \"rslora\": false, \"init_from\": \"\"}, "
                       "\"output\": {\"shard_size\": \"5GB\"}}";
    assert_int_equal(job_parse_text(&j, file, strlen(file), "t.json", &err), 0);
    if (resolve_and_validate(&j, 1, &err)) fail_msg("%s", err.msg);
}

static void test_overrides(void **state) {
    (void)state;
    job_config j;
    job_defaults(&j);
    must_override(&j, "--train.lr=1e-4");
    assert_true(j.train.lr == 1e-4);
    must_override(&j, "--fsdp.sharding=no_shard");
    assert_int_equal(j.fsdp.sharding, JOB_SHARD_NONE);
    must_override(&j, "--train.betas=0.9,0.95");
    assert_true(j.train.betas[0] == 0.9 && j.train.betas[1] == 0.95);
    must_override(&j, "--train.betas=[0.8, 0.99]");
    assert_true(j.train.betas[0] == 0.8 && j.train.betas[1] == 0.99);
    must_override(&j, "--data.packing=false");
    assert_false(j.data.packing);
    assert_true(j.data.shuffle); /* the default */
    must_override(&j, "--data.shuffle=false");
    assert_false(j.data.shuffle);
    must_override(&j, "--train.seed=7");
    assert_int_equal(j.train.seed, 7);
    must_override(&j, "--checkpoint.resume=step-400");
    assert_int_equal(j.checkpoint.resume, JOB_RESUME_STEP);
    assert_int_equal(j.checkpoint.resume_step, 400);
    must_override(&j, "--checkpoint.resume=latest");
    assert_int_equal(j.checkpoint.resume, JOB_RESUME_LATEST);
    must_override(&j, "--output.shard_size=512MiB");
    assert_int_equal(j.output.shard_size, 512LL << 20);
    must_override(&j, "--model.path=/models/llama-2-7b");
    assert_string_equal(j.model.path, "/models/llama-2-7b");
    must_override(&j, "--runtime.status_socket=");
    assert_string_equal(j.runtime.status_socket, "");
    must_override(&j, "--lora.targets=q_proj,k_proj,v_proj,o_proj"); /* the default: allowed */

    override_fails(&j, "train.lr=1", "an override looks like --section.key=value");
    override_fails(&j, "--train.lr", "missing '=value'");
    override_fails(&j, "--=1", "an override looks like");
    override_fails(&j, "--train.lr=abc", "train.lr: 'abc' is not a number");
    override_fails(&j, "--train.lr=", "train.lr: '' is not a number");
    override_fails(&j, "--train.lr=nan", "not a number");
    override_fails(&j, "--train.seed=12x", "train.seed: '12x' is not an integer");
    override_fails(&j, "--data.packing=maybe", "data.packing: 'maybe' is not a boolean");
    must_override(&j, "--data.packing=true");
    assert_true(j.data.packing);
    must_override(&j, "--data.eval_fraction=0.1");
    assert_true(j.data.eval_fraction == 0.1);
    must_override(&j, "--train.eval_interval=50");
    assert_int_equal(j.train.eval_interval, 50);
    override_fails(&j, "--train.global_batch=-1", "train.global_batch: -1 is out of range");
    override_fails(&j, "--train.betas=0.9", "train.betas: expected a list of two numbers");
    override_fails(&j, "--train.betas=0.9,x", "train.betas: 'x' is not a number");
    override_fails(&j, "--train.betas=[0.9,", "train.betas: '[0.9,' is not a JSON list");
    override_fails(&j, "--train.lrr=1", "train.lrr: unknown key (did you mean train.lr?)");
    override_fails(&j, "--trian.lr=1", "trian: unknown section (did you mean train?)");
    must_override(&j, "--fsdp.activation_checkpointing=selective");
    assert_int_equal(j.fsdp.activation_checkpointing, JOB_ACT_CKPT_SELECTIVE);
    must_override(&j, "--fsdp.activation_checkpointing=auto");
    assert_int_equal(j.fsdp.activation_checkpointing, JOB_ACT_CKPT_AUTO);
    must_override(&j, "--fsdp.activation_checkpointing=none");
    must_override(&j, "--fsdp.sharding=hybrid_shard");
    assert_int_equal(j.fsdp.sharding, JOB_SHARD_HYBRID);
    must_override(&j, "--fsdp.sharding=shard_grad_op");
    assert_int_equal(j.fsdp.sharding, JOB_SHARD_GRAD_OP);
    must_override(&j, "--fsdp.sharding=no_shard");
    must_override(&j, "--lora.targets=q_proj,v_proj");
    assert_int_equal(j.lora.n_targets, 2);
    assert_string_equal(j.lora.targets[1], "v_proj");
    must_override(&j, "--lora.targets=all-linear");
    assert_int_equal(j.lora.n_targets, 7);
    /* A failed override leaves the key as it was. */
    assert_true(j.train.lr == 1e-4);
    assert_int_equal(j.fsdp.sharding, JOB_SHARD_NONE);
}

static void test_aliases(void **state) {
    (void)state;
    job_config j;
    errbuf err = {""};
    job_defaults(&j);
    must_override(&j, "--lr=3e-4");
    assert_true(j.train.lr == 3e-4);
    must_override(&j, "--max_steps=7");
    assert_int_equal(j.train.max_steps, 7);
    must_override(&j, "--batch_size=2");
    assert_int_equal(j.train.micro_batch, 2);
    must_override(&j, "--context_length=1024");
    assert_int_equal(j.data.seq_len, 1024);
    must_override(&j, "--num_epochs=3");
    assert_int_equal(j.train.epochs, 3);
    must_override(&j, "--output_dir=out2");
    assert_string_equal(j.output.dir, "out2");
    must_override(&j, "--dataset=data/alpaca.tokens");
    assert_string_equal(j.data.path, "data/alpaca.tokens");
    must_override(&j, "--train_type=full");
    assert_int_equal(j.train.type, JOB_TRAIN_FULL);
    must_override(&j, "--model.path=m");

    /* global_batch = micro_batch 2 x 4 steps x world size 2. */
    must_override(&j, "--gradient_accumulation_steps=4");
    assert_int_equal(j.train.global_batch, 8); /* not resolved before the world size is known */
    if (resolve_and_validate(&j, 2, &err)) fail_msg("%s", err.msg);
    assert_int_equal(j.train.global_batch, 16);
    assert_int_equal(j.train.grad_accum, 4);
    assert_int_equal(j.train.accumulation, 4);

    must_override(&j, "--lora_rank=16");
    assert_int_equal(j.lora.rank, 16);
    must_override(&j, "--lora_alpha=32");
    assert_true(j.lora.alpha == 32);
    must_override(&j, "--lora_dropout=0.1");
    assert_true(j.lora.dropout == 0.1);
    must_override(&j, "--lora_target_modules=all"); /* fsdp_qlora's: every linear but o_proj */
    assert_int_equal(j.lora.n_targets, 6);
    for (int t = 0; t < 6; t++) assert_string_not_equal(j.lora.targets[t], "o_proj");
    must_override(&j, "--lora_target_modules=default"); /* PEFT's Llama default */
    assert_int_equal(j.lora.n_targets, 2);
    assert_string_equal(j.lora.targets[0], "q_proj");
    assert_string_equal(j.lora.targets[1], "v_proj");
    must_override(&j, "--lora_target_modules=up_proj,down_proj");
    assert_int_equal(j.lora.n_targets, 2);
    override_fails(&j, "--lora_target_modules=everything", "unknown module 'everything'");
    must_override(&j, "--train_type=lora");
    assert_int_equal(j.train.type, JOB_TRAIN_LORA);
    must_override(&j, "--use_gradient_checkpointing=true");
    assert_int_equal(j.fsdp.activation_checkpointing, JOB_ACT_CKPT_FULL);
    must_override(&j, "--use_gradient_checkpointing=false");
    assert_int_equal(j.fsdp.activation_checkpointing, JOB_ACT_CKPT_NONE);
    override_fails(&j, "--use_gradient_checkpointing=maybe", "'maybe' is not a boolean");
    must_override(&j, "--use_cpu_offload=true"); /* fsdp_qlora's: CPUOffload(offload_params=True) */
    assert_true(j.fsdp.cpu_offload && j.fsdp.offload_params);
    must_override(&j, "--use_cpu_offload=false");
    assert_true(!j.fsdp.cpu_offload && !j.fsdp.offload_params);
    must_override(&j, "--model_name=/models/llama");
    assert_string_equal(j.model.path, "/models/llama");
    override_fails(&j, "--dataset=alpaca", "a data set name of fsdp_qlora's");
    must_override(&j, "--dataset=data/alpaca.jsonl");
    must_override(&j, "--train_type=qlora");
    assert_int_equal(j.train.type, JOB_TRAIN_QLORA);
    override_fails(&j, "--lr=fast", "--lr: train.lr: 'fast' is not a number");
    override_fails(&j, "--gradient_accumulation_steps=0", "is not a positive integer");
    override_fails(&j, "--learning_rat=1", "--learning_rat: unknown option");
    override_fails(&j, "--max_step=1", "did you mean --max_steps?");
    override_fails(&j, "--seq_len=64", "did you mean --data.seq_len?");
}

static void test_gradient_accumulation_too_large(void **state) {
    (void)state;
    job_config j;
    errbuf err = {""};
    job_defaults(&j);
    strcpy(j.model.path, "m");
    strcpy(j.data.path, "d");
    must_override(&j, "--batch_size=1048576");
    must_override(&j, "--gradient_accumulation_steps=100000");
    assert_int_equal(resolve_and_validate(&j, 8, &err), -1);
    assert_contains(err.msg, "is too large");
}

static void test_sizes(void **state) {
    (void)state;
    static const struct {
        const char *text;
        long long bytes;
    } ok[] = {
        {"5GB", 5000000000LL}, {"5GiB", 5LL << 30}, {"512MiB", 512LL << 20},
        {"100KB", 100000},     {"1kib", 1024},      {"2MB", 2000000},
        {"12", 12},            {"7B", 7},           {"1TiB", 1LL << 40},
    };
    job_config j;
    errbuf err = {""};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        char json[128];
        snprintf(json, sizeof json, "{\"output\":{\"shard_size\":\"%s\"}}", ok[i].text);
        if (parse(&j, json, &err)) fail_msg("%s: %s", ok[i].text, err.msg);
        assert_int_equal(j.output.shard_size, ok[i].bytes);
    }
    assert_int_equal(parse(&j, "{\"output\":{\"shard_size\":123}}", &err), 0);
    assert_int_equal(j.output.shard_size, 123);
    static const char *const bad[] = {"", "GB", "5 GB", "5.5GB", "-5GB", "5PB",
                                      "99999999999999999999", "9999999999999GB"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char json[128];
        snprintf(json, sizeof json, "{\"output\":{\"shard_size\":\"%s\"}}", bad[i]);
        if (parse(&j, json, &err) == 0) fail_msg("size '%s' was accepted", bad[i]);
        assert_contains(err.msg, "output.shard_size");
    }
    assert_int_equal(parse(&j, "{\"output\":{\"shard_size\":true}}", &err), -1);
    assert_contains(err.msg, "output.shard_size: expected a size");

    /* runtime.gpu_memory_limit: none by default, 0 (none) allowed, sizes as above */
    assert_int_equal(parse(&j, "{}", &err), 0);
    assert_int_equal(j.runtime.gpu_memory_limit, 0);
    assert_int_equal(parse(&j, "{\"runtime\":{\"gpu_memory_limit\":\"22GiB\"}}", &err), 0);
    assert_int_equal(j.runtime.gpu_memory_limit, 22LL << 30);
    assert_int_equal(parse(&j, "{\"runtime\":{\"gpu_memory_limit\":0}}", &err), 0);
    assert_int_equal(j.runtime.gpu_memory_limit, 0);
    must_override(&j, "--runtime.gpu_memory_limit=80GB");
    assert_int_equal(j.runtime.gpu_memory_limit, 80000000000LL);
    override_fails(&j, "--runtime.gpu_memory_limit=lots", "runtime.gpu_memory_limit: 'lots' is not a size");
}

/* runtime.log_to: names in a list (or one as a string), comma separated on the command line,
 * wandb refused with the recipe, the mlflow keys only with mlflow. */
static void test_log_to(void **state) {
    (void)state;
    job_config j;
    errbuf err = {""};
    assert_int_equal(parse(&j, "{}", &err), 0);
    assert_int_equal(j.runtime.log_to, 0);
    assert_string_equal(j.runtime.mlflow_experiment, "Default");
    assert_int_equal(parse(&j, "{\"runtime\":{\"log_to\":[\"tensorboard\",\"tqdm\"]}}", &err), 0);
    assert_int_equal(j.runtime.log_to, JOB_LOG_TENSORBOARD | JOB_LOG_STDOUT);
    assert_int_equal(parse(&j, "{\"runtime\":{\"log_to\":\"mlflow\"}}", &err), 0);
    assert_int_equal(j.runtime.log_to, JOB_LOG_MLFLOW);
    assert_int_equal(parse(&j, "{\"runtime\":{\"log_to\":[\"none\"]}}", &err), 0);
    assert_int_equal(j.runtime.log_to, 0);
    must_override(&j, "--runtime.log_to=tensorboard,mlflow");
    assert_int_equal(j.runtime.log_to, JOB_LOG_TENSORBOARD | JOB_LOG_MLFLOW);
    must_override(&j, "--runtime.log_to=[\"stdout\"]");
    assert_int_equal(j.runtime.log_to, JOB_LOG_STDOUT);
    must_override(&j, "--runtime.log_to=none");
    assert_int_equal(j.runtime.log_to, 0);
    override_fails(&j, "--runtime.log_to=tensorboard,wandb",
                   "runtime.log_to[1]: 'wandb' is not built yet: compute nodes usually have no network");
    override_fails(&j, "--runtime.log_to=wandb", "wandb sync --sync-tensorboard OUTPUT_DIR/tensorboard");
    override_fails(&j, "--runtime.log_to=comet", "runtime.log_to[0]: unknown destination 'comet'");
    override_fails(&j, "--runtime.log_to=", "unknown destination ''");
    assert_int_equal(parse(&j, "{\"runtime\":{\"log_to\":[\"none\",\"mlflow\"]}}", &err), -1);
    assert_contains(err.msg, "runtime.log_to[0]: 'none' with other destinations");
    assert_int_equal(parse(&j, "{\"runtime\":{\"log_to\":[1]}}", &err), -1);
    assert_contains(err.msg, "runtime.log_to[0]: expected a string, got an integer");
    assert_int_equal(parse(&j, "{\"runtime\":{\"log_to\":{}}}", &err), -1);
    assert_contains(err.msg, "runtime.log_to: expected a list of destination names, got an object");

    /* job_to_object writes the canonical names, which read back the same */
    assert_int_equal(parse(&j, "{" MD ",\"runtime\":{\"log_to\":[\"mlflow\",\"tqdm\",\"tensorboard\"],"
                               "\"mlflow_uri\":\"http://127.0.0.1:5000\"}}", &err), 0);
    assert_int_equal(resolve_and_validate(&j, 1, &err), 0);
    json_t *o = job_to_object(&j, &err);
    assert_non_null(o);
    char *text = json_dumps(json_object_get(json_object_get(o, "runtime"), "log_to"), JSON_COMPACT);
    assert_string_equal(text, "[\"stdout\",\"tensorboard\",\"mlflow\"]");
    free(text);
    job_config back;
    if (job_from_object(&back, o, &err)) fail_msg("%s", err.msg);
    assert_int_equal(back.runtime.log_to, j.runtime.log_to);
    json_decref(o);

    /* mlflow needs an http(s) URI; its keys and log_required are refused without it */
    static const bad_case bad[] = {
        {"{" MD ",\"runtime\":{\"log_to\":[\"mlflow\"]}}", 1, "runtime.mlflow_uri: required with runtime.log_to mlflow", NULL},
        {"{" MD ",\"runtime\":{\"log_to\":[\"mlflow\"],\"mlflow_uri\":\"file:///tmp/mlruns\"}}", 1,
         "runtime.mlflow_uri: 'file:///tmp/mlruns': only an http:// or https:// tracking server is built", NULL},
        {"{" MD ",\"runtime\":{\"mlflow_uri\":\"http://x\"}}", 1, "runtime.mlflow_uri: \"http://x\" is set but runtime.log_to has no mlflow", NULL},
        {"{" MD ",\"runtime\":{\"log_to\":[\"tensorboard\"],\"mlflow_experiment\":\"e\"}}", 1,
         "runtime.mlflow_experiment: \"e\" is set but runtime.log_to has no mlflow", NULL},
        {"{" MD ",\"runtime\":{\"log_required\":true}}", 1, "runtime.log_required: true is set but runtime.log_to has no mlflow", NULL},
        {"{\"runtime\":{\"mlflow_experiment\":\"\"}}", 1, "runtime.mlflow_experiment: must not be empty", NULL},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = parse(&j, bad[i].json, &err);
        if (rc == 0) rc = resolve_and_validate(&j, bad[i].world, &err);
        if (rc == 0) fail_msg("accepted: %s", bad[i].json);
        assert_contains(err.msg, bad[i].part1);
    }
}

static void test_resolve_runtime(void **state) {
    (void)state;
    job_config j;
    errbuf err = {""};
    job_defaults(&j);
    assert_int_equal(job_resolve_runtime(&j, 0, &err), 0); /* auto: cpu without a GPU */
    assert_int_equal(j.runtime.backend, JOB_BACKEND_CPU);
    assert_int_equal(j.runtime.workers_per_node, 2);
    assert_int_equal(j.model.dtype, JOB_DTYPE_F32);
    job_defaults(&j);
    assert_int_equal(job_resolve_runtime(&j, 8, &err), 0); /* ... cuda with one */
    assert_int_equal(j.runtime.backend, JOB_BACKEND_CUDA);
    assert_int_equal(j.runtime.workers_per_node, 8);

    job_defaults(&j);
    j.runtime.backend = JOB_BACKEND_CUDA;
    assert_int_equal(job_resolve_runtime(&j, 0, &err), -1);
    assert_contains(err.msg, "runtime.backend: 'cuda' but this node has no GPU");
    assert_int_equal(job_resolve_runtime(&j, 8, &err), 0);
    assert_int_equal(j.runtime.workers_per_node, 8);
    assert_int_equal(j.model.dtype, JOB_DTYPE_BF16);
    j.runtime.workers_per_node = 9;
    assert_int_equal(job_resolve_runtime(&j, 8, &err), -1);
    assert_contains(err.msg, "runtime.workers_per_node: 9 workers cannot share 8 GPUs evenly");
    j.runtime.workers_per_node = 3; /* three ranks on one GPU */
    assert_int_equal(job_resolve_runtime(&j, 1, &err), 0);
    strcpy(j.model.path, "m");
    strcpy(j.data.path, "d");
    j.train.global_batch = 3;
    assert_int_equal(resolve_and_validate(&j, 3, &err), 0);
    assert_int_equal(job_resolve_runtime(&j, -1, &err), -1);
}

/* A config filled in by code goes through the same per-key checks. */
static void test_validate_rechecks_keys(void **state) {
    (void)state;
    job_config j;
    errbuf err = {""};
    job_defaults(&j);
    strcpy(j.model.path, "m");
    strcpy(j.data.path, "d");
    assert_int_equal(resolve_and_validate(&j, 1, &err), 0);
    j.train.lr = -1;
    assert_int_equal(job_validate(&j, 1, &err), -1);
    assert_contains(err.msg, "train.lr: -1 is out of range");
    j.train.lr = NAN;
    assert_int_equal(job_validate(&j, 1, &err), -1);
    assert_contains(err.msg, "train.lr: nan is not a finite number");
    j.train.lr = 1e-3;
    j.train.schedule = (job_schedule)99;
    assert_int_equal(job_validate(&j, 1, &err), -1);
    assert_contains(err.msg, "train.schedule: invalid value 99");
    j.train.schedule = JOB_SCHEDULE_LINEAR;
    j.fsdp.sharding = JOB_SHARD_GRAD_OP;
    j.train.type = JOB_TRAIN_LORA;
    assert_int_equal(job_validate(&j, 1, &err), -1);
    assert_contains(err.msg, "'shard_grad_op' with adapters (train.type lora or qlora) is not built yet");
    j.train.type = JOB_TRAIN_FULL;
    j.fsdp.sharding = JOB_SHARD_HYBRID;
    assert_int_equal(job_validate(&j, 1, &err), 0);
    j.fsdp.sharding = JOB_SHARD_FULL;
    j.lora.rank = 0;
    assert_int_equal(job_validate(&j, 1, &err), -1);
    assert_contains(err.msg, "lora.rank");
    j.lora.rank = 8;
    j.output.merge = true;
    assert_int_equal(job_validate(&j, 1, &err), -1);
    assert_contains(err.msg, "output.merge: only with train.type lora or qlora");
    j.output.merge = false;
    assert_int_equal(job_validate(&j, 0, &err), -1);
    assert_contains(err.msg, "world size 0");
    assert_int_equal(job_validate(&j, 1, &err), 0);
}

/* job_validate only checks: an unresolved job is refused, and left as it was; job_resolve
 * fills the derived fields, and resolving again changes nothing. */
static void test_validate_changes_nothing(void **state) {
    (void)state;
    static job_config j, before;
    errbuf err = {""};
    job_defaults(&j);
    strcpy(j.model.path, "m");
    strcpy(j.data.path, "d");
    must_override(&j, "--batch_size=2");
    must_override(&j, "--gradient_accumulation_steps=3");
    before = j;
    assert_int_equal(job_validate(&j, 2, &err), -1);
    assert_contains(err.msg, "train.grad_accum: not resolved for world size 2 (job_resolve first)");
    assert_memory_equal(&j, &before, sizeof j);

    if (job_resolve(&j, 2, &err)) fail_msg("%s", err.msg);
    assert_int_equal(j.train.global_batch, 2 * 3 * 2);
    assert_int_equal(j.train.grad_accum, 3);
    assert_int_equal(j.train.accumulation, 3);
    assert_string_equal(j.runtime.metrics, "output/metrics.jsonl");
    before = j;
    if (job_validate(&j, 2, &err)) fail_msg("%s", err.msg);
    if (job_resolve(&j, 2, &err)) fail_msg("%s", err.msg);
    assert_memory_equal(&j, &before, sizeof j);

    /* Resolved for one world size is not resolved for another. */
    assert_int_equal(job_validate(&j, 3, &err), -1); /* 12 divides into 2 x 3, but not 3 times */
    assert_contains(err.msg, "not resolved for world size 3");
    j.runtime.metrics[0] = '\0';
    assert_int_equal(job_validate(&j, 2, &err), -1);
    assert_contains(err.msg, "runtime.metrics: not resolved");
}

static void test_round_trip(void **state) {
    (void)state;
    job_config a, b;
    errbuf err = {""};
    if (job_load(&a, EXAMPLE, &err)) fail_msg("%s", err.msg);
    must_override(&a, "--checkpoint.resume=step-1200");
    must_override(&a, "--train.lr=1.2345678901234567e-4");
    must_override(&a, "--data.packing=false");
    must_override(&a, "--model.dtype=auto");
    if (job_resolve_runtime(&a, 0, &err) || resolve_and_validate(&a, 4, &err))
        fail_msg("%s", err.msg);

    json_t *obj = job_to_object(&a, &err);
    if (!obj) fail_msg("%s", err.msg);
    const json_t *ck = json_object_get(obj, "checkpoint"), *out = json_object_get(obj, "output");
    assert_string_equal(json_string_value(json_object_get(ck, "resume")), "step-1200");
    assert_int_equal(json_integer_value(json_object_get(out, "shard_size")), 5000000000LL);
    /* model.dtype auto resolved */
    assert_string_equal(json_string_value(json_object_get(json_object_get(obj, "model"), "dtype")), "f32");

    if (job_from_object(&b, obj, &err)) fail_msg("%s", err.msg);
    /* grad_accum is derived, so not carried: job_resolve recomputes it. */
    assert_int_equal(job_validate(&b, 4, &err), -1);
    assert_contains(err.msg, "train.grad_accum: not resolved for world size 4");
    if (resolve_and_validate(&b, 4, &err)) fail_msg("%s", err.msg);
    /* `given` says where values came from (a read-back config gives every key), not what
     * they are. */
    memcpy(b.given, a.given, sizeof a.given);
    assert_memory_equal(&a, &b, sizeof a);
    json_t *again = job_to_object(&b, &err);
    assert_true(json_equal(obj, again));
    json_decref(again);

    /* The strict reader wants every key; a job file may leave any out. */
    json_t *train = json_object_get(obj, "train");
    json_object_set(train, "xx", json_object_get(train, "lr"));
    json_object_del(train, "lr");
    assert_int_equal(job_from_object(&b, obj, &err), -1);
    assert_contains(err.msg, "CONFIG: train.xx: unknown key");
    json_decref(obj);
    json_t *partial = json_pack("{s:{s:f}}", "train", "lr", 1e-4);
    assert_int_equal(job_from_object(&b, partial, &err), -1);
    json_decref(partial);
    assert_contains(err.msg, "CONFIG: model.path: missing");
    assert_int_equal(job_parse_text(&b, "{\"train\":{\"lr\":1e-4}}", 21, "job.json", &err), 0);
}

/* What nodes must share: the per-node keys left out, the first difference named with both
 * values, nested model_config keys included, a missing key shown as absent. */
static void test_shared_settings_diff(void **state) {
    (void)state;
    job_config a, b;
    errbuf err;
    job_defaults(&a);
    job_defaults(&b);
    snprintf(b.runtime.bind_addr, sizeof b.runtime.bind_addr, "10.0.0.2");
    snprintf(b.runtime.metrics, sizeof b.runtime.metrics, "/tmp/n1.jsonl");
    snprintf(b.runtime.status_socket, sizeof b.runtime.status_socket, "/tmp/n1.sock");
    json_t *model_a = json_pack("{s:i, s:f}", "hidden_size", 36, "rms_norm_eps", 1e-5);
    json_t *model_b = json_pack("{s:i, s:f}", "hidden_size", 36, "rms_norm_eps", 1e-6);
    json_t *sa = job_shared_settings(&a, model_a, &err), *sb = job_shared_settings(&b, model_a, &err);
    assert_non_null(sa);
    assert_non_null(sb);
    job_difference d;
    assert_int_equal(job_settings_diff(sa, sb, &d), 0);
    json_decref(sb);
    b.train.lr = 0.02;
    b.data.seq_len = 99; /* "data" sorts before "train": the first difference */
    sb = job_shared_settings(&b, model_a, &err);
    assert_int_equal(job_settings_diff(sa, sb, &d), 1);
    assert_string_equal(d.key, "data.seq_len");
    assert_string_equal(d.b, "99");
    json_decref(sb);
    b.data.seq_len = a.data.seq_len;
    sb = job_shared_settings(&b, model_a, &err);
    assert_int_equal(job_settings_diff(sa, sb, &d), 1);
    assert_string_equal(d.key, "train.lr");
    assert_string_equal(d.a, "2e-5");
    assert_string_equal(d.b, "0.02");
    json_decref(sb);
    b.train.lr = a.train.lr;
    sb = job_shared_settings(&b, model_b, &err);
    assert_int_equal(job_settings_diff(sa, sb, &d), 1);
    assert_string_equal(d.key, "model_config.rms_norm_eps");
    json_object_del(json_object_get(sb, "model_config"), "rms_norm_eps");
    assert_int_equal(job_settings_diff(sa, sb, &d), 1);
    assert_string_equal(d.b, "(absent)");
    json_decref(sa);
    json_decref(sb);
    json_decref(model_a);
    json_decref(model_b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_are_valid),
        cmocka_unit_test(test_example_full_parses),
        cmocka_unit_test(test_bad_job_files),
        cmocka_unit_test(test_malformed_json_has_position),
        cmocka_unit_test(test_job_load_errors),
        cmocka_unit_test(test_overrides),
        cmocka_unit_test(test_data_keys),
        cmocka_unit_test(test_unused_values_refused),
        cmocka_unit_test(test_memory_interval),
        cmocka_unit_test(test_objective_keys),
        cmocka_unit_test(test_precision_keys),
        cmocka_unit_test(test_aliases),
        cmocka_unit_test(test_gradient_accumulation_too_large),
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_log_to),
        cmocka_unit_test(test_resolve_runtime),
        cmocka_unit_test(test_validate_rechecks_keys),
        cmocka_unit_test(test_validate_changes_nothing),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_shared_settings_diff),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
