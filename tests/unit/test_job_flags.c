/* The command line (proto/job_flags): syntax, the other tools' flags, their refusals and
 * notes, the profiles of defaults. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "proto/job.h"
#include "proto/job_flags.h"

#define assert_contains(h, n)                                                              \
    do {                                                                                   \
        if (!strstr((h), (n))) fail_msg("message \"%s\" lacks \"%s\"", (h), (n));          \
    } while (0)

static char words[64][256];

/* `line` split at spaces into argv (argv[0] "fsdpd"), parsed and loaded into *j. */
static int load(const char *line, job_config *j, job_notes *notes, errbuf *err) {
    static char *argv[65];
    static job_args a;
    int argc = 0;
    argv[argc++] = "fsdpd";
    for (const char *p = line; *p;) {
        while (*p == ' ') p++;
        if (!*p) break;
        size_t n = strcspn(p, " ");
        snprintf(words[argc], sizeof words[argc], "%.*s", (int)n, p);
        argv[argc] = words[argc];
        argc++;
        p += n;
    }
    return job_args_parse(argc, argv, &a, err) || job_args_load(j, &a, notes, err) ? -1 : 0;
}

static void must_load(const char *line, job_config *j, job_notes *notes) {
    errbuf err = {""};
    if (load(line, j, notes, &err)) fail_msg("%s: %s", line, err.msg);
}

static void fails(const char *line, const char *needle) {
    static job_config j;
    errbuf err = {""};
    if (load(line, &j, NULL, &err) == 0) fail_msg("%s: accepted", line);
    assert_contains(err.msg, needle);
}

static bool noted(const job_notes *n, const char *needle) {
    for (int i = 0; i < n->n; i++)
        if (strstr(n->line[i], needle)) return true;
    return false;
}

static void resolve(job_config *j, int world) {
    errbuf err = {""};
    if (job_resolve(j, world, &err)) fail_msg("%s", err.msg);
}

static void test_syntax(void **state) {
    (void)state;
    static job_config j;
    must_load("--lr 3e-4 --train.seed 7 --data.packing --max_steps=9 --train.lr=1e-3", &j, NULL);
    assert_true(j.train.lr == 1e-3); /* the later flag wins */
    assert_int_equal(j.train.seed, 7);
    assert_true(j.data.packing);      /* bare: true */
    assert_int_equal(j.train.max_steps, 9);
    const char *words_true[] = {"true", "True", "1", "yes"}, *words_false[] = {"false", "False", "0", "no"};
    for (int i = 0; i < 4; i++) {
        char line[96];
        snprintf(line, sizeof line, "--data.packing %s --data.shuffle %s", words_true[i], words_false[i]);
        must_load(line, &j, NULL);
        assert_true(j.data.packing);
        assert_false(j.data.shuffle);
    }
    /* a bare boolean before another flag takes no value from it */
    must_load("--packing --max_steps 3", &j, NULL);
    assert_true(j.data.packing && j.train.max_steps == 3);
    fails("--data.packing maybe", "'maybe': unexpected argument");
    fails("--data.packing=maybe", "data.packing: 'maybe' is not a boolean");
    fails("--lr", "--lr: needs a value");
    fails("--lr --max_steps 3", "--lr: needs a value");
    fails("train.json", "'train.json': unexpected argument");
    fails("--learning_rat 1", "--learning_rat: unknown option (did you mean --learning_rate?)");
    fails("--max_step 1", "did you mean --max_steps?");
    fails("--seq_len 64", "did you mean --data.seq_len?");
    fails("--train.lrr 1", "train.lrr: unknown key (did you mean train.lr?)");
    fails("--trian.lr 1", "trian: unknown section (did you mean train?)");
}

static void test_fsdp_qlora_defaults(void **state) {
    (void)state;
    static job_config j;
    static job_notes notes;
    /* --batch_size alone: fsdp_qlora's line, its defaults, its batch (no accumulation) */
    must_load("--batch_size 8", &j, &notes);
    assert_int_equal(j.train.defaults, JOB_PROFILE_FSDP_QLORA);
    assert_true(noted(&notes, "defaults: fsdp_qlora's (the command line uses its flags, e.g. --batch_size"));
    assert_int_equal(j.train.type, JOB_TRAIN_QLORA);
    assert_true(j.train.lr == 1e-5);
    assert_int_equal(j.train.schedule, JOB_SCHEDULE_CONSTANT);
    assert_int_equal(j.lora.rank, 64);
    assert_true(j.lora.alpha == 16 && j.lora.dropout == 0.1);
    assert_int_equal(j.lora.n_targets, 6);
    for (int t = 0; t < 6; t++) assert_string_not_equal(j.lora.targets[t], "o_proj");
    assert_true(j.train.clip_norm == 0 && j.train.weight_decay == 0.1);
    assert_true(j.train.betas[0] == 0.9 && j.train.betas[1] == 0.95 && j.train.eps == 1e-5);
    assert_int_equal(j.train.seed, 42);
    assert_int_equal(j.train.epochs, 1);
    assert_int_equal(j.fsdp.activation_checkpointing, JOB_ACT_CKPT_FULL);
    resolve(&j, 2);
    assert_int_equal(j.train.global_batch, 8 * 1 * 2);
    /* with accumulation */
    must_load("--batch_size 8 --gradient_accumulation_steps 2", &j, NULL);
    resolve(&j, 2);
    assert_int_equal(j.train.global_batch, 32);
    assert_int_equal(j.train.grad_accum, 2);
    /* fsdpd's defaults on request; --batch_size alone still means micro x 1 x ranks */
    must_load("--defaults fsdpd --batch_size 3", &j, NULL);
    assert_int_equal(j.train.defaults, JOB_PROFILE_FSDPD);
    assert_true(j.train.lr == 2e-5);
    assert_int_equal(j.lora.rank, 8);
    resolve(&j, 2);
    assert_int_equal(j.train.global_batch, 6);
    /* fsdpd's own keys only: fsdpd's defaults, its global batch 8 */
    must_load("--train.lr 1e-4", &j, NULL);
    assert_int_equal(j.train.defaults, JOB_PROFILE_FSDPD);
    resolve(&j, 2);
    assert_int_equal(j.train.global_batch, 8);
    fails("--defaults unsloth", "--defaults: 'unsloth' is none of fsdpd, fsdp_qlora, trainer");
}

static void test_trainer_defaults(void **state) {
    (void)state;
    static job_config j;
    must_load("--per_device_train_batch_size 2 --learning_rate 5e-5", &j, NULL);
    assert_int_equal(j.train.defaults, JOB_PROFILE_TRAINER);
    assert_int_equal(j.train.type, JOB_TRAIN_FULL);
    assert_int_equal(j.train.schedule, JOB_SCHEDULE_LINEAR);
    assert_true(j.train.clip_norm == 1.0 && j.train.weight_decay == 0 && j.train.eps == 1e-8);
    assert_true(j.train.betas[1] == 0.999);
    assert_int_equal(j.train.epochs, 3);
    resolve(&j, 4);
    assert_int_equal(j.train.global_batch, 8);
    fails("--per_device_train_batch_size 2 --batch_size 2",
          "mixes fsdp_qlora's flags (--batch_size) and the Trainer's (--per_device_train_batch_size)");
    must_load("--defaults trainer --per_device_train_batch_size 2 --batch_size 2", &j, NULL);
}

static void test_mappings(void **state) {
    (void)state;
    static job_config j;
    static job_notes notes;
    must_load("--lr_scheduler cosine --lr 2e-4", &j, NULL); /* fsdp_qlora's: 10% warm-up, down to 10% */
    assert_int_equal(j.train.schedule, JOB_SCHEDULE_COSINE);
    assert_true(j.train.warmup_ratio == 0.1 && j.train.warmup_round == JOB_ROUND_DOWN);
    assert_true(j.train.min_lr == 0.1 * 2e-4);
    must_load("--lr_scheduler linear", &j, NULL);
    assert_true(j.train.min_lr == 0 && j.train.warmup_ratio == 0.1);
    must_load("--apply_gradient_clipping true", &j, NULL);
    assert_true(j.train.clip_norm == 0.3);
    must_load("--grad_norm 0.5 --apply_gradient_clipping True", &j, NULL);
    assert_true(j.train.clip_norm == 0.5);
    must_load("--apply_gradient_clipping false --defaults fsdpd", &j, NULL);
    assert_true(j.train.clip_norm == 0);
    must_load("--wd 0.01 --seed 3 --num_epochs 2 --context_length 1024 --lora_target_modules default", &j, NULL);
    assert_true(j.train.weight_decay == 0.01);
    assert_int_equal(j.train.seed, 3);
    assert_int_equal(j.train.epochs, 2);
    assert_int_equal(j.data.seq_len, 1024);
    assert_int_equal(j.lora.n_targets, 2);
    must_load("--use_cpu_offload true --save_model false", &j, &notes);
    assert_true(j.fsdp.cpu_offload && j.fsdp.offload_params && !j.output.consolidate);
    assert_true(noted(&notes, "--save_model false: no model is written"));
    must_load("--optimizer adamw --defaults fsdpd", &j, NULL);
    assert_true(j.train.betas[1] == 0.95 && j.train.eps == 1e-5);
    /* the Trainer's */
    must_load("--lr_scheduler_type constant_with_warmup --warmup_steps 5", &j, NULL);
    assert_int_equal(j.train.schedule, JOB_SCHEDULE_CONSTANT);
    assert_int_equal(j.train.warmup_steps, 5);
    must_load("--lr_scheduler_type cosine --warmup_ratio 0.03 --max_grad_norm 0.7 --weight_decay 0.01 "
              "--adam_beta1 0.8 --adam_beta2 0.98 --adam_epsilon 1e-6 --num_train_epochs 2.0 --max_seq_length 256 "
              "--packing True --dataset_text_field content --logging_steps 25 --eval_steps 100 --save_steps 250 "
              "--save_total_limit 4 --gradient_checkpointing --optim adamw_torch_fused --seed 9",
              &j, NULL);
    assert_true(j.train.warmup_ratio == 0.03 && j.train.warmup_round == JOB_ROUND_UP);
    assert_true(j.train.clip_norm == 0.7 && j.train.weight_decay == 0.01);
    assert_true(j.train.betas[0] == 0.8 && j.train.betas[1] == 0.98 && j.train.eps == 1e-6);
    assert_int_equal(j.train.epochs, 2);
    assert_int_equal(j.data.seq_len, 256);
    assert_true(j.data.packing);
    assert_string_equal(j.data.text_field, "content");
    assert_int_equal(j.runtime.log_every, 25);
    assert_int_equal(j.train.eval_interval, 100);
    assert_int_equal(j.checkpoint.interval_steps, 250);
    assert_int_equal(j.checkpoint.keep, 4);
    assert_int_equal(j.fsdp.activation_checkpointing, JOB_ACT_CKPT_FULL);
    assert_int_equal(j.train.seed, 9);
    must_load("--eval_steps 100 --eval_strategy no", &j, &notes);
    assert_int_equal(j.train.eval_interval, 0);
    assert_true(noted(&notes, "--eval_strategy no: no evaluation"));
    must_load("--save_steps 10 --save_strategy no", &j, NULL);
    assert_int_equal(j.checkpoint.interval_steps, 0);
    must_load("--resume_from_checkpoint true --learning_rate 1e-4", &j, NULL);
    assert_int_equal(j.checkpoint.resume, JOB_RESUME_LATEST);
    char dir[] = "/tmp/job-flags-XXXXXX", step[64], line[128];
    assert_non_null(mkdtemp(dir));
    snprintf(step, sizeof step, "%s/step-000004", dir);
    assert_int_equal(mkdir(step, 0755), 0);
    snprintf(line, sizeof line, "--resume_from_checkpoint %s --learning_rate 1e-4", step);
    must_load(line, &j, NULL);
    assert_string_equal(j.checkpoint.dir, dir);
    assert_int_equal(j.checkpoint.resume, JOB_RESUME_STEP);
    assert_int_equal(j.checkpoint.resume_step, 4);
    rmdir(step);
    rmdir(dir);
    /* --output_dir places the checkpoints beside the output, unless checkpoint.dir is given */
    must_load("--output_dir runs/a --learning_rate 1e-4", &j, NULL);
    resolve(&j, 1);
    assert_string_equal(j.checkpoint.dir, "runs/a.checkpoints");
    must_load("--output_dir runs/a --checkpoint.dir ck", &j, NULL);
    resolve(&j, 1);
    assert_string_equal(j.checkpoint.dir, "ck");
    /* a data set flag reads the file's format from its records */
    must_load("--dataset d.jsonl", &j, NULL);
    assert_int_equal(j.data.format, JOB_DATA_AUTO);
    must_load("--data.format text --dataset d.jsonl", &j, NULL);
    assert_int_equal(j.data.format, JOB_DATA_TEXT);
}

static void test_refusals_and_notes(void **state) {
    (void)state;
    static job_config j;
    static job_notes notes;
    fails("--train_type custom_qlora", "use qlora: the same NF4 + LoRA");
    fails("--train_type custom_lora", "use lora");
    fails("--train_type hqq_lora", "--train_type hqq_lora: not built yet");
    fails("--world_size 2", "--world_size: fsdpd runs one worker per GPU on every node SLURM gives the job");
    fails("--master_port 12356", "--master_port: fsdpd's nodes find each other through SLURM");
    fails("--dataset alpaca", "--dataset: 'alpaca' is a data set name of fsdp_qlora's, which downloads it");
    fails("--model_name meta-llama/Llama-2-70b-hf",
          "--model_name: 'meta-llama/Llama-2-70b-hf' looks like a Hugging Face hub id and is no directory here");
    fails("--dataset_name smangrul/code-chat-assistant-v1", "huggingface-cli download smangrul/code-chat-assistant-v1");
    fails("--log_to wandb", "--log_to: runtime.log_to[0]: 'wandb' is not built yet: compute nodes usually have no "
                            "network. Log to tensorboard");
    fails("--report_to wandb --learning_rate 1e-4", "wandb sync --sync-tensorboard OUTPUT_DIR/tensorboard");
    fails("--report_to all", "--report_to all: name the destinations");
    fails("--push_to_hub True", "upload the output from a login node: huggingface-cli upload REPO_ID OUTPUT_DIR");
    fails("--precision fp32", "--precision fp32: not built yet");
    fails("--precision mp_fp16_autocast", "not built yet: fp16 needs loss scaling");
    fails("--precision fp8", "is none of fp32, bf16");
    fails("--lr_scheduler_type cosine_with_restarts", "--lr_scheduler_type cosine_with_restarts: not built yet");
    fails("--lr_scheduler_type constant --warmup_steps 10", "use constant_with_warmup");
    fails("--grad_norm 0.5", "fsdp_qlora clips only with --apply_gradient_clipping true");
    fails("--num_train_epochs 2.5", "a fraction of an epoch is not built yet");
    fails("--optim adafactor", "--optim adafactor: not built yet");
    fails("--optimizer sgd", "--optimizer sgd: not built yet");
    fails("--eval_strategy epoch", "--eval_strategy epoch: not built yet");
    fails("--logging_strategy no", "fsdpd always logs its steps");
    fails("--gradient_accumulation_steps 0", "is not a positive integer");
    fails("--resume_from_checkpoint out/checkpoint-500", "not an fsdpd checkpoint");
    fails("--bf16 False", "--bf16 false: not built yet");
    must_load("--reentrant_checkpointing true --use_activation_cpu_offload false --precision mp_bf16_buffers_autocast "
              "--log_to stdout --verbose --profile false",
              &j, &notes);
    assert_true(noted(&notes, "--reentrant_checkpointing true: no meaning in fsdpd"));
    assert_true(noted(&notes, "--precision mp_bf16_buffers_autocast: fsdpd computes in bf16"));
    assert_true(noted(&notes, "--log_to stdout: fsdpd's step lines"));
    assert_int_equal(j.runtime.log_to, JOB_LOG_STDOUT);
    assert_false(j.fsdp.offload_activations);
    must_load("--use_activation_cpu_offload true", &j, NULL); /* F46: with fsdp_qlora's full recompute */
    assert_true(j.fsdp.offload_activations && j.fsdp.activation_checkpointing == JOB_ACT_CKPT_FULL);
    must_load("--report_to tensorboard,mlflow --learning_rate 1e-4", &j, NULL);
    assert_int_equal(j.runtime.log_to, JOB_LOG_TENSORBOARD | JOB_LOG_MLFLOW);
    must_load("--report_to none --learning_rate 1e-4", &j, NULL);
    assert_int_equal(j.runtime.log_to, 0);
    assert_true(noted(&notes, "--verbose true: fsdpd's log already says"));
    must_load("--use_flash_attn True --per_device_eval_batch_size 4 --bf16 True --push_to_hub False", &j, &notes);
    assert_true(noted(&notes, "--use_flash_attn True: fsdpd's attention is always its fused"));
    assert_true(noted(&notes, "--per_device_eval_batch_size 4: fsdpd evaluates at the training micro-batch"));
    assert_true(noted(&notes, "--bf16 true: fsdpd computes in bf16"));
}

/* A job file over a profile: its keys win; a file's own train.defaults is applied first. */
static void test_job_file_and_profile(void **state) {
    (void)state;
    static job_config j;
    char path[] = "/tmp/job-flags-file-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    const char *text = "{\"train\": {\"lr\": 3e-4, \"type\": \"full\"}, \"data\": {\"path\": \"d\"}}";
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    char line[128];
    snprintf(line, sizeof line, "--job %s --defaults fsdp_qlora --seed 5", path);
    must_load(line, &j, NULL);
    assert_true(j.train.lr == 3e-4);                 /* the file's */
    assert_int_equal(j.train.type, JOB_TRAIN_FULL);  /* the file's */
    assert_true(j.train.eps == 1e-5);                /* the profile's */
    assert_int_equal(j.train.seed, 5);               /* the flag's */
    assert_int_equal(j.train.defaults, JOB_PROFILE_FSDP_QLORA);
    /* a job file's flags of one tool never choose the defaults: the file's are fsdpd's */
    snprintf(line, sizeof line, "--job %s --batch_size 2", path);
    must_load(line, &j, NULL);
    assert_int_equal(j.train.defaults, JOB_PROFILE_FSDPD);
    assert_true(j.train.eps == 1e-8);
    /* lora.* at the profile's defaults is no "lora set in a full fine-tune" */
    strcpy(j.model.path, "m");
    errbuf err = {""};
    snprintf(line, sizeof line, "--job %s --defaults fsdp_qlora", path);
    must_load(line, &j, NULL);
    strcpy(j.model.path, "m");
    if (job_resolve(&j, 1, &err) || job_validate(&j, 1, &err)) fail_msg("%s", err.msg);
    FILE *f = fopen(path, "w");
    fputs("{\"train\": {\"defaults\": \"fsdp_qlora\"}, \"lora\": {\"rank\": 4}}", f);
    fclose(f);
    if (job_load(&j, path, &err)) fail_msg("%s", err.msg);
    assert_int_equal(j.lora.rank, 4);
    assert_true(j.lora.dropout == 0.1 && j.train.lr == 1e-5);
    unlink(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_syntax),
        cmocka_unit_test(test_fsdp_qlora_defaults),
        cmocka_unit_test(test_trainer_defaults),
        cmocka_unit_test(test_mappings),
        cmocka_unit_test(test_refusals_and_notes),
        cmocka_unit_test(test_job_file_and_profile),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
