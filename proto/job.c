/* job: the job file's keys, defaults, overrides, resolution and checks; see job.h. */
#include "job.h"
#include "lora_layout.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <jansson.h>

#include "base/fileio.h"
#include "json_kind.h"

/* Choice keys are stored through an int pointer. */
_Static_assert(sizeof(job_init) == sizeof(int), "enum size");
_Static_assert(sizeof(job_dtype) == sizeof(int), "enum size");
_Static_assert(sizeof(job_data_format) == sizeof(int), "enum size");
_Static_assert(sizeof(job_bad_record) == sizeof(int), "enum size");
_Static_assert(sizeof(job_train_type) == sizeof(int), "enum size");
_Static_assert(sizeof(job_schedule) == sizeof(int), "enum size");
_Static_assert(sizeof(job_sharding) == sizeof(int), "enum size");
_Static_assert(sizeof(job_act_ckpt) == sizeof(int), "enum size");
_Static_assert(sizeof(job_backend) == sizeof(int), "enum size");

typedef enum key_type {
    K_INT,     /* int, range [min, max] */
    K_I64,     /* int64_t, range [min, max] */
    K_DOUBLE,  /* double, range with open or closed ends */
    K_BOOL,    /* bool */
    K_STRING,  /* char[size]; min is the minimum length */
    K_CHOICE,  /* an enum stored as int, named by `choices` */
    K_SIZE,    /* int64_t bytes: an integer, or a string such as "5GB" or "512MiB"; >= min */
    K_BETAS,   /* double[2], each in [0, 1) */
    K_TARGETS, /* lora.targets: a list of projection names */
    K_RESUME,  /* checkpoint.resume and checkpoint.resume_step */
    K_LOG_TO,  /* runtime.log_to: a list of destination names, JOB_LOG_* bits */
} key_type;

typedef struct choice {
    const char *name;
    int value;
} choice;

typedef struct job_key {
    const char *section, *name;
    key_type type;
    size_t offset, size;
    double min, max;
    bool open_min, open_max;
    const choice *choices; /* K_CHOICE: ended by a NULL name */
} job_key;

#define FIELD(f) offsetof(job_config, f), sizeof(((job_config *)0)->f)
#define RANGE(s, k, t, f, lo, hi, open_lo, open_hi) \
    {s, k, t, FIELD(f), lo, hi, open_lo, open_hi, NULL}
#define NUM(s, k, t, f, lo, hi) RANGE(s, k, t, f, lo, hi, false, false)
#define STR(s, k, f, min_len) RANGE(s, k, K_STRING, f, min_len, 0, false, false)
#define CHOICE(s, k, f, list) {s, k, K_CHOICE, FIELD(f), 0, 0, false, false, list}
#define OTHER(s, k, t, f) RANGE(s, k, t, f, 0, 0, false, false)

static const choice init_choices[] = {
    {"", JOB_INIT_PRETRAINED}, {"random", JOB_INIT_RANDOM}, {NULL, 0}};
static const choice model_dtype_choices[] = {
    {"auto", JOB_DTYPE_AUTO}, {"f32", JOB_DTYPE_F32}, {"bf16", JOB_DTYPE_BF16}, {NULL, 0}};
static const choice output_dtype_choices[] = {
    {"auto", JOB_DTYPE_AUTO}, {"bf16", JOB_DTYPE_BF16}, {"f32", JOB_DTYPE_F32}, {NULL, 0}};
static const choice format_choices[] = {
    {"alpaca", JOB_DATA_ALPACA}, {"chat", JOB_DATA_CHAT}, {"text", JOB_DATA_TEXT},
    {"tokens", JOB_DATA_TOKENS}, {"auto", JOB_DATA_AUTO}, {"preference", JOB_DATA_PREFERENCE}, {NULL, 0}};
static const choice truncation_mode_choices[] = {
    {"keep_start", JOB_TRUNC_KEEP_START}, {"keep_end", JOB_TRUNC_KEEP_END}, {NULL, 0}};
static const choice round_choices[] = {{"up", JOB_ROUND_UP}, {"down", JOB_ROUND_DOWN}, {NULL, 0}};
static const choice profile_choices[] = {
    {"fsdpd", JOB_PROFILE_FSDPD}, {"fsdp_qlora", JOB_PROFILE_FSDP_QLORA},
    {"trainer", JOB_PROFILE_TRAINER}, {NULL, 0}};
static const choice bad_record_choices[] = {
    {"skip", JOB_BAD_RECORD_SKIP}, {"fail", JOB_BAD_RECORD_FAIL}, {NULL, 0}};
static const choice train_type_choices[] = {
    {"full", JOB_TRAIN_FULL}, {"lora", JOB_TRAIN_LORA}, {"qlora", JOB_TRAIN_QLORA}, {NULL, 0}};
static const choice schedule_choices[] = {
    {"constant", JOB_SCHEDULE_CONSTANT}, {"linear", JOB_SCHEDULE_LINEAR},
    {"cosine", JOB_SCHEDULE_COSINE}, {NULL, 0}};
static const choice sharding_choices[] = {
    {"full_shard", JOB_SHARD_FULL}, {"shard_grad_op", JOB_SHARD_GRAD_OP},
    {"no_shard", JOB_SHARD_NONE}, {"hybrid_shard", JOB_SHARD_HYBRID}, {NULL, 0}};
static const choice act_ckpt_choices[] = {
    {"none", JOB_ACT_CKPT_NONE}, {"full", JOB_ACT_CKPT_FULL},
    {"selective", JOB_ACT_CKPT_SELECTIVE}, {"auto", JOB_ACT_CKPT_AUTO}, {NULL, 0}};
static const choice preflight_choices[] = {
    {"auto", JOB_PREFLIGHT_AUTO}, {"on", JOB_PREFLIGHT_ON}, {"off", JOB_PREFLIGHT_OFF}, {NULL, 0}};
static const choice backend_choices[] = {
    {"auto", JOB_BACKEND_AUTO}, {"cuda", JOB_BACKEND_CUDA}, {"cpu", JOB_BACKEND_CPU}, {NULL, 0}};
static const choice on_usr1_choices[] = {
    {"auto", JOB_USR1_AUTO}, {"checkpoint", JOB_USR1_CHECKPOINT}, {"requeue", JOB_USR1_REQUEUE}, {NULL, 0}};

static const choice objective_choices[] = {
    {"sft", JOB_OBJECTIVE_SFT}, {"dpo", JOB_OBJECTIVE_DPO}, {"orpo", JOB_OBJECTIVE_ORPO}, {NULL, 0}};
static const choice dpo_loss_choices[] = {
    {"sigmoid", JOB_DPO_SIGMOID}, {"robust", JOB_DPO_ROBUST}, {"ipo", JOB_DPO_IPO}, {NULL, 0}};

static const choice precision_choices[] = {
    {"bf16", JOB_PRECISION_BF16}, {"fp8", JOB_PRECISION_FP8}, {NULL, 0}};
static const choice fp8_scaling_choices[] = {
    {"tensorwise", JOB_FP8_TENSORWISE}, {"rowwise", JOB_FP8_ROWWISE}, {NULL, 0}};
static const choice fp8_format_choices[] = {{"e4m3", JOB_FP8_E4M3}, {"e5m2", JOB_FP8_E5M2}, {NULL, 0}};

static const char *const lora_modules[] = {
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};

static const char *const sections[] = {
    "model", "data", "train", "lora", "fsdp", "checkpoint", "output", "runtime", "fabric"};

/* Every key of the job file, in the order job_to_object writes them. */
static const job_key keys[] = {
    STR("model", "path", model.path, 0),
    CHOICE("model", "init", model.init, init_choices),
    STR("model", "config", model.config, 0),
    CHOICE("model", "dtype", model.dtype, model_dtype_choices),

    STR("data", "path", data.path, 0),
    CHOICE("data", "format", data.format, format_choices),
    STR("data", "template", data.template_name, 0),
    STR("data", "text_field", data.text_field, 1),
    NUM("data", "seq_len", K_INT, data.seq_len, 2, 1 << 20),
    OTHER("data", "shuffle", K_BOOL, data.shuffle),
    OTHER("data", "packing", K_BOOL, data.packing),
    OTHER("data", "truncate", K_BOOL, data.truncate),
    CHOICE("data", "truncation_mode", data.truncation_mode, truncation_mode_choices),
    RANGE("data", "eval_fraction", K_DOUBLE, data.eval_fraction, 0, 1, false, true),
    CHOICE("data", "on_bad_record", data.on_bad_record, bad_record_choices),
    NUM("data", "max_record_bytes", K_SIZE, data.max_record_bytes, 1, INFINITY),

    CHOICE("train", "defaults", train.defaults, profile_choices),
    CHOICE("train", "type", train.type, train_type_choices),
    NUM("train", "global_batch", K_INT, train.global_batch, 1, INT_MAX),
    NUM("train", "micro_batch", K_INT, train.micro_batch, 1, 1 << 20),
    NUM("train", "accumulation", K_INT, train.accumulation, 0, 1 << 20),
    NUM("train", "max_steps", K_INT, train.max_steps, 0, INT_MAX),
    NUM("train", "eval_interval", K_INT, train.eval_interval, 0, INT_MAX),
    STR("train", "sample_prompts", train.sample_prompts, 0),
    NUM("train", "sample_every", K_INT, train.sample_every, 0, INT_MAX),
    NUM("train", "sample_max_new_tokens", K_INT, train.sample_max_new_tokens, 1, 1 << 20),
    NUM("train", "epochs", K_INT, train.epochs, 1, 1000000),
    NUM("train", "lr", K_DOUBLE, train.lr, 0, INFINITY),
    CHOICE("train", "schedule", train.schedule, schedule_choices),
    NUM("train", "warmup_steps", K_INT, train.warmup_steps, 0, INT_MAX),
    RANGE("train", "warmup_ratio", K_DOUBLE, train.warmup_ratio, 0, 1, false, true),
    CHOICE("train", "warmup_round", train.warmup_round, round_choices),
    NUM("train", "min_lr", K_DOUBLE, train.min_lr, 0, INFINITY),
    NUM("train", "weight_decay", K_DOUBLE, train.weight_decay, 0, INFINITY),
    RANGE("train", "betas", K_BETAS, train.betas, 0, 1, false, true),
    RANGE("train", "eps", K_DOUBLE, train.eps, 0, INFINITY, true, false),
    NUM("train", "clip_norm", K_DOUBLE, train.clip_norm, 0, INFINITY),
    NUM("train", "seed", K_I64, train.seed, 0, INFINITY),
    CHOICE("train", "objective", train.objective, objective_choices),
    RANGE("train", "dpo_beta", K_DOUBLE, train.dpo_beta, 0, INFINITY, true, false),
    CHOICE("train", "dpo_loss", train.dpo_loss, dpo_loss_choices),
    RANGE("train", "dpo_label_smoothing", K_DOUBLE, train.dpo_label_smoothing, 0, 0.5, false, true),
    RANGE("train", "orpo_lambda", K_DOUBLE, train.orpo_lambda, 0, INFINITY, true, false),
    CHOICE("train", "precision", train.precision, precision_choices),
    CHOICE("train", "fp8_scaling", train.fp8_scaling, fp8_scaling_choices),
    OTHER("train", "fp8_all_gather", K_BOOL, train.fp8_all_gather),
    CHOICE("train", "fp8_grad_format", train.fp8_grad_format, fp8_format_choices),

    NUM("lora", "rank", K_INT, lora.rank, 1, 65536),
    RANGE("lora", "alpha", K_DOUBLE, lora.alpha, 0, INFINITY, true, false),
    RANGE("lora", "dropout", K_DOUBLE, lora.dropout, 0, 1, false, true),
    OTHER("lora", "targets", K_TARGETS, lora.targets),
    OTHER("lora", "rslora", K_BOOL, lora.rslora),
    STR("lora", "init_from", lora.init_from, 0),

    CHOICE("fsdp", "sharding", fsdp.sharding, sharding_choices),
    CHOICE("fsdp", "activation_checkpointing", fsdp.activation_checkpointing, act_ckpt_choices),
    OTHER("fsdp", "cpu_offload", K_BOOL, fsdp.cpu_offload),
    OTHER("fsdp", "offload_params", K_BOOL, fsdp.offload_params),
    OTHER("fsdp", "offload_activations", K_BOOL, fsdp.offload_activations),
    NUM("fsdp", "mlp_chunk", K_INT, fsdp.mlp_chunk, 0, 1 << 20),
    OTHER("fsdp", "forward_prefetch", K_BOOL, fsdp.forward_prefetch),
    OTHER("fsdp", "backward_prefetch", K_BOOL, fsdp.backward_prefetch),

    STR("checkpoint", "dir", checkpoint.dir, 0),
    NUM("checkpoint", "interval_steps", K_INT, checkpoint.interval_steps, 0, INT_MAX),
    NUM("checkpoint", "keep", K_INT, checkpoint.keep, 1, INT_MAX),
    OTHER("checkpoint", "async", K_BOOL, checkpoint.async),
    OTHER("checkpoint", "save_final", K_BOOL, checkpoint.save_final),
    NUM("checkpoint", "timeout_s", K_INT, checkpoint.timeout_s, 1, INT_MAX),
    OTHER("checkpoint", "resume", K_RESUME, checkpoint.resume),
    NUM("checkpoint", "max_failed_saves", K_INT, checkpoint.max_failed_saves, 1, INT_MAX),
    NUM("checkpoint", "memory_interval_steps", K_INT, checkpoint.memory_interval_steps, -1, INT_MAX),

    STR("output", "dir", output.dir, 1),
    CHOICE("output", "dtype", output.dtype, output_dtype_choices),
    NUM("output", "shard_size", K_SIZE, output.shard_size, 1, INFINITY),
    OTHER("output", "consolidate", K_BOOL, output.consolidate),
    OTHER("output", "merge", K_BOOL, output.merge),

    CHOICE("runtime", "backend", runtime.backend, backend_choices),
    NUM("runtime", "workers_per_node", K_INT, runtime.workers_per_node, 0, 1024),
    NUM("runtime", "heartbeat_s", K_INT, runtime.heartbeat_s, 1, INT_MAX),
    NUM("runtime", "max_restarts", K_INT, runtime.max_restarts, 0, INT_MAX),
    OTHER("runtime", "allow_shrink", K_BOOL, runtime.allow_shrink),
    NUM("runtime", "spare_nodes", K_INT, runtime.spare_nodes, 0, INT_MAX),
    NUM("runtime", "straggler_factor", K_DOUBLE, runtime.straggler_factor, 0, 1000),
    NUM("runtime", "straggler_steps", K_INT, runtime.straggler_steps, 1, INT_MAX),
    NUM("runtime", "stop_grace_s", K_INT, runtime.stop_grace_s, 0, INT_MAX),
    CHOICE("runtime", "on_usr1", runtime.on_usr1, on_usr1_choices),
    STR("runtime", "status_socket", runtime.status_socket, 0),
    STR("runtime", "bind_addr", runtime.bind_addr, 0),
    NUM("runtime", "join_timeout_s", K_INT, runtime.join_timeout_s, 1, INT_MAX),
    NUM("runtime", "node_timeout_s", K_INT, runtime.node_timeout_s, 2, INT_MAX),
    STR("runtime", "metrics", runtime.metrics, 0),
    NUM("runtime", "comm_timeout_s", K_INT, runtime.comm_timeout_s, 1, INT_MAX),
    NUM("runtime", "stall_timeout_s", K_INT, runtime.stall_timeout_s, 0, INT_MAX),
    NUM("runtime", "log_every", K_INT, runtime.log_every, 1, INT_MAX),
    NUM("runtime", "gpu_memory_limit", K_SIZE, runtime.gpu_memory_limit, 0, INFINITY),
    OTHER("runtime", "log_to", K_LOG_TO, runtime.log_to),
    STR("runtime", "mlflow_uri", runtime.mlflow_uri, 0),
    STR("runtime", "mlflow_experiment", runtime.mlflow_experiment, 1),
    OTHER("runtime", "log_required", K_BOOL, runtime.log_required),

    OTHER("fabric", "require", K_BOOL, fabric.require),
    CHOICE("fabric", "preflight", fabric.preflight, preflight_choices),
    NUM("fabric", "min_busbw_gbps", K_DOUBLE, fabric.min_busbw_gbps, 0, INFINITY),
};

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))
_Static_assert(COUNT(keys) <= JOB_KEYS_MAX, "job_config.given has a bit for every key");
_Static_assert(sizeof(job_profile) == sizeof(int), "enum size");
_Static_assert(sizeof(job_round) == sizeof(int), "enum size");

static const char *choice_name(const choice *c, int value) {
    for (; c->name; c++)
        if (c->value == value) return c->name;
    return NULL;
}

const char *job_sharding_name(job_sharding s) { return choice_name(sharding_choices, (int)s); }
const char *job_data_format_name(job_data_format f) { return choice_name(format_choices, (int)f); }
const char *job_train_type_name(job_train_type t) { return choice_name(train_type_choices, (int)t); }
const char *job_schedule_name(job_schedule s) { return choice_name(schedule_choices, (int)s); }
const char *job_objective_name(job_objective o) { return choice_name(objective_choices, (int)o); }
const char *job_dpo_loss_name(job_dpo_loss l) { return choice_name(dpo_loss_choices, (int)l); }
const char *job_profile_name(job_profile p) { return choice_name(profile_choices, (int)p); }

int job_profile_from_name(const char *name, job_profile *out) {
    for (const choice *c = profile_choices; c->name; c++)
        if (strcmp(c->name, name) == 0) {
            *out = (job_profile)c->value;
            return 0;
        }
    return -1;
}

/* Member by member into zeroed storage: job configs built alike stay equal byte for byte
 * (job_defaults), padding included. */
static void lora_config_of(const job_config *j, lora_config *out) {
    memset(out, 0, sizeof *out);
    out->rank = j->lora.rank;
    out->alpha = j->lora.alpha;
    out->rslora = j->lora.rslora;
    out->dropout = j->lora.dropout;
    for (int t = 0; t < j->lora.n_targets && t < JOB_MAX_TARGETS; t++) {
        int m = lora_module_from_name(j->lora.targets[t]);
        if (m >= 0) out->targets |= 1u << m;
    }
}

void job_defaults(job_config *j) {
    memset(j, 0, sizeof *j);
    j->model.init = JOB_INIT_PRETRAINED;
    j->model.dtype = JOB_DTYPE_AUTO;

    j->data.format = JOB_DATA_TOKENS;
    j->data.seq_len = 512;
    j->data.shuffle = true;
    j->data.packing = false; /* DESIGN.md's default is true; false keeps a token cache's rows as they are */
    j->data.eval_fraction = 0;
    j->data.on_bad_record = JOB_BAD_RECORD_FAIL;
    j->data.max_record_bytes = JOB_MAX_RECORD_BYTES;
    j->data.truncate = true;
    strcpy(j->data.text_field, "text");

    j->train.type = JOB_TRAIN_FULL;
    j->train.global_batch = 8;
    j->train.micro_batch = 1;
    j->train.max_steps = 0;
    j->train.epochs = 1;
    j->train.lr = 2e-5;
    j->train.schedule = JOB_SCHEDULE_COSINE;
    j->train.warmup_steps = 0;
    j->train.min_lr = 0;
    j->train.weight_decay = 0;
    j->train.betas[0] = 0.9;
    j->train.betas[1] = 0.999;
    j->train.eps = 1e-8;
    j->train.clip_norm = 1.0;
    j->train.seed = 42;
    j->train.sample_max_new_tokens = 64;
    j->train.objective = JOB_OBJECTIVE_SFT;
    j->train.dpo_beta = 0.1;    /* TRL's DPOConfig.beta */
    j->train.dpo_loss = JOB_DPO_SIGMOID;
    j->train.orpo_lambda = 0.1; /* TRL's ORPOConfig.beta */
    j->train.precision = JOB_PRECISION_BF16;
    j->train.fp8_scaling = JOB_FP8_TENSORWISE;
    j->train.fp8_all_gather = true;
    j->train.fp8_grad_format = JOB_FP8_E4M3;

    j->lora.rank = 8;
    j->lora.alpha = 16;
    j->lora.dropout = 0.05;
    j->lora.n_targets = (int)COUNT(lora_modules); /* all-linear */
    for (size_t i = 0; i < COUNT(lora_modules); i++) strcpy(j->lora.targets[i], lora_modules[i]);

    j->fsdp.sharding = JOB_SHARD_FULL;
    j->fsdp.activation_checkpointing = JOB_ACT_CKPT_NONE;
    j->fsdp.cpu_offload = false;
    j->fsdp.forward_prefetch = true;
    j->fsdp.backward_prefetch = true;

    j->checkpoint.dir[0] = '\0'; /* job_resolve: OUTPUT_DIR.checkpoints */
    j->checkpoint.interval_steps = 0;
    j->checkpoint.keep = 2;
    j->checkpoint.async = true;
    j->checkpoint.save_final = true;
    j->checkpoint.timeout_s = 600;
    j->checkpoint.resume = JOB_RESUME_AUTO;
    j->checkpoint.max_failed_saves = 3;
    j->checkpoint.memory_interval_steps = -1;

    strcpy(j->output.dir, "output");
    j->output.dtype = JOB_DTYPE_AUTO; /* a model bf16, an adapter f32 (PEFT's) */
    j->output.shard_size = 5000000000LL;
    j->output.consolidate = true;

    j->runtime.backend = JOB_BACKEND_AUTO;
    j->runtime.workers_per_node = 0;
    j->runtime.heartbeat_s = 10;
    j->runtime.max_restarts = 0;
    j->runtime.stop_grace_s = 30;
    j->runtime.on_usr1 = JOB_USR1_AUTO;
    j->runtime.comm_timeout_s = 600;
    j->runtime.log_every = 1;
    j->runtime.join_timeout_s = 300;
    j->runtime.node_timeout_s = 60;
    j->runtime.straggler_factor = 1.5;
    j->runtime.straggler_steps = 10;
    strcpy(j->runtime.mlflow_experiment, "Default"); /* the one every MLflow server has */
    j->fabric.require = true;
    lora_config_of(j, &j->lora.config); /* the defaults' own, as job_resolve derives it */
}

/* fsdp_qlora's train.py: its argument defaults, its AdamW (betas 0.9/0.95, eps 1e-5), its
 * LoRA targets ("all": every linear but o_proj), gradient checkpointing on, no clipping
 * unless --apply_gradient_clipping.  Its constant schedule has no warm-up; a batch is
 * batch_size x accumulation x ranks. */
static void fsdp_qlora_defaults(job_config *j) {
    static const char *const targets[] = {"k_proj", "q_proj", "v_proj", "up_proj", "down_proj", "gate_proj"};
    j->train.type = JOB_TRAIN_QLORA;
    j->train.micro_batch = 1;
    j->train.accumulation = 1;
    j->train.epochs = 1;
    j->train.lr = 1e-5;
    j->train.schedule = JOB_SCHEDULE_CONSTANT;
    j->train.weight_decay = 0.1;
    j->train.betas[0] = 0.9;
    j->train.betas[1] = 0.95;
    j->train.eps = 1e-5;
    j->train.clip_norm = 0;
    j->train.seed = 42;
    j->data.seq_len = 512;
    j->lora.rank = 64;
    j->lora.alpha = 16;
    j->lora.dropout = 0.1;
    memset(j->lora.targets, 0, sizeof j->lora.targets);
    for (size_t i = 0; i < COUNT(targets); i++) strcpy(j->lora.targets[i], targets[i]);
    j->lora.n_targets = (int)COUNT(targets);
    j->fsdp.activation_checkpointing = JOB_ACT_CKPT_FULL;
}

/* transformers' TrainingArguments: lr 5e-5, linear decay, no warm-up, no weight decay, AdamW
 * (0.9, 0.999, 1e-8), clipping at 1.0, 3 epochs, 8 sequences a device, seed 42. */
static void trainer_defaults(job_config *j) {
    j->train.micro_batch = 8;
    j->train.accumulation = 1;
    j->train.epochs = 3;
    j->train.lr = 5e-5;
    j->train.schedule = JOB_SCHEDULE_LINEAR;
    j->train.weight_decay = 0;
    j->train.betas[0] = 0.9;
    j->train.betas[1] = 0.999;
    j->train.eps = 1e-8;
    j->train.clip_norm = 1.0;
    j->train.seed = 42;
}

void job_apply_profile(job_config *j, job_profile p) {
    job_defaults(j);
    j->train.defaults = p;
    if (p == JOB_PROFILE_FSDP_QLORA) fsdp_qlora_defaults(j);
    else if (p == JOB_PROFILE_TRAINER) trainer_defaults(j);
    lora_config_of(j, &j->lora.config);
}

/* ---- looking keys up, and suggesting the one that was meant ---- */

static bool is_section(const char *name) {
    for (size_t i = 0; i < COUNT(sections); i++)
        if (strcmp(sections[i], name) == 0) return true;
    return false;
}

static const job_key *find_key(const char *section, const char *name) {
    for (size_t i = 0; i < COUNT(keys); i++)
        if (strcmp(keys[i].section, section) == 0 && strcmp(keys[i].name, name) == 0)
            return &keys[i];
    return NULL;
}

/* "section.key" */
static const job_key *find_full_key(const char *full) {
    for (size_t i = 0; i < COUNT(keys); i++) {
        size_t n = strlen(keys[i].section);
        if (strncmp(full, keys[i].section, n) == 0 && full[n] == '.' &&
            strcmp(full + n + 1, keys[i].name) == 0)
            return &keys[i];
    }
    return NULL;
}

/* Levenshtein distance; names longer than 63 bytes are never close to ours. */
static int edit_distance(const char *a, const char *b) {
    size_t na = strlen(a), nb = strlen(b);
    if (na > 63 || nb > 63) return INT_MAX;
    int prev[64], cur[64];
    for (size_t j = 0; j <= nb; j++) prev[j] = (int)j;
    for (size_t i = 1; i <= na; i++) {
        cur[0] = (int)i;
        for (size_t j = 1; j <= nb; j++) {
            int sub = prev[j - 1] + (a[i - 1] != b[j - 1]);
            int del = prev[j] + 1, ins = cur[j - 1] + 1;
            cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
        memcpy(prev, cur, sizeof prev);
    }
    return prev[nb];
}

/* Keeps `candidate` in *best when it is the closest to `word` so far and close enough to
 * be a typo of it (about one edit per three characters). */
static void consider(const char *word, const char *candidate, const char **best, int *best_d) {
    int d = edit_distance(word, candidate);
    if (d <= (int)strlen(candidate) / 3 + 1 && d < *best_d) {
        *best = candidate;
        *best_d = d;
    }
}

static int unknown_section(const char *name, errbuf *err) {
    const char *best = NULL;
    int best_d = INT_MAX;
    for (size_t i = 0; i < COUNT(sections); i++) consider(name, sections[i], &best, &best_d);
    if (best) return errf(err, "%s: unknown section (did you mean %s?)", name, best);
    return errf(err, "%s: unknown section (sections: model, data, train, lora, fsdp, "
                     "checkpoint, output, runtime, fabric)", name);
}

static int unknown_key(const char *section, const char *name, errbuf *err) {
    const char *best = NULL;
    int best_d = INT_MAX;
    char list[512] = "";
    size_t used = 0;
    for (size_t i = 0; i < COUNT(keys); i++) {
        if (strcmp(keys[i].section, section) != 0) continue;
        consider(name, keys[i].name, &best, &best_d);
        int n = snprintf(list + used, sizeof list - used, "%s%s", used ? ", " : "", keys[i].name);
        if (n > 0 && (size_t)n < sizeof list - used) used += (size_t)n;
    }
    if (best)
        return errf(err, "%s.%s: unknown key (did you mean %s.%s?)", section, name, section,
                    best);
    return errf(err, "%s.%s: unknown key (%s has: %s)", section, name, section, list);
}

/* ---- reading one value ---- */

static int wrong_type(const job_key *k, const char *expected, const json_t *v, errbuf *err) {
    return errf(err, "%s.%s: expected %s, got %s", k->section, k->name, expected, json_kind(v));
}

static bool in_range(const job_key *k, double x) {
    if (isnan(x)) return false;
    if (k->open_min ? x <= k->min : x < k->min) return false;
    if (k->open_max ? x >= k->max : x > k->max) return false;
    return true;
}

/* "must be >= 0", "must be in [0, 1)" */
static void describe_range(const job_key *k, char *buf, size_t size) {
    if (isinf(k->max))
        snprintf(buf, size, "must be %s %.15g", k->open_min ? ">" : ">=", k->min);
    else
        snprintf(buf, size, "must be in %c%.15g, %.15g%c", k->open_min ? '(' : '[', k->min,
                 k->max, k->open_max ? ')' : ']');
}

static int set_integer(void *field, const job_key *k, const json_t *v, errbuf *err) {
    if (!json_is_integer(v)) return wrong_type(k, "an integer", v, err);
    json_int_t x = json_integer_value(v);
    if (!in_range(k, (double)x)) {
        char range[96];
        describe_range(k, range, sizeof range);
        return errf(err, "%s.%s: %lld is out of range (%s)", k->section, k->name, (long long)x,
                    range);
    }
    if (k->type == K_INT) *(int *)field = (int)x;
    else *(int64_t *)field = x;
    return 0;
}

/* `what` names the key, or an element of it ("train.betas[1]"). */
static int read_real(const job_key *k, const char *what, const json_t *v, double *out,
                     errbuf *err) {
    if (!json_is_number(v)) return wrong_type(k, "a number", v, err);
    double x = json_number_value(v);
    if (!in_range(k, x)) {
        char range[96];
        describe_range(k, range, sizeof range);
        return errf(err, "%s: %.15g is out of range (%s)", what, x, range);
    }
    *out = x;
    return 0;
}

static int set_string(char *field, const job_key *k, const json_t *v, errbuf *err) {
    if (!json_is_string(v)) return wrong_type(k, "a string", v, err);
    const char *s = json_string_value(v);
    size_t n = json_string_length(v);
    if (strlen(s) != n) return errf(err, "%s.%s: contains a NUL character", k->section, k->name);
    if (n >= k->size)
        return errf(err, "%s.%s: %zu bytes is too long (at most %zu)", k->section, k->name, n,
                    k->size - 1);
    if ((double)n < k->min) return errf(err, "%s.%s: must not be empty", k->section, k->name);
    memset(field, 0, k->size);
    memcpy(field, s, n);
    return 0;
}

static void choice_list(const choice *c, char *buf, size_t size) {
    size_t used = 0;
    buf[0] = '\0';
    for (; c->name; c++) {
        int n = snprintf(buf + used, size - used, "%s%s", used ? ", " : "",
                         c->name[0] ? c->name : "\"\"");
        if (n < 0 || (size_t)n >= size - used) return;
        used += (size_t)n;
    }
}

static int set_choice(int *field, const job_key *k, const json_t *v, errbuf *err) {
    if (!json_is_string(v)) return wrong_type(k, "a string", v, err);
    const char *s = json_string_value(v);
    for (const choice *c = k->choices; c->name; c++) {
        if (strcmp(c->name, s) == 0) {
            *field = c->value;
            return 0;
        }
    }
    char list[256];
    choice_list(k->choices, list, sizeof list);
    return errf(err, "%s.%s: unknown choice '%s' (valid: %s)", k->section, k->name, s, list);
}

/* "5GB" = 5 * 1000^3 bytes, "5GiB" = 5 * 1024^3; the suffix is case-insensitive and a bare
 * number is bytes. */
static int parse_size(const char *s, int64_t *out) {
    static const struct {
        const char *suffix;
        int64_t mult;
    } units[] = {
        {"", 1}, {"B", 1}, {"KB", 1000}, {"MB", 1000000}, {"GB", 1000000000},
        {"TB", 1000000000000LL}, {"KiB", 1LL << 10}, {"MiB", 1LL << 20}, {"GiB", 1LL << 30},
        {"TiB", 1LL << 40},
    };
    int64_t n = 0;
    const char *p = s;
    if (!isdigit((unsigned char)*p)) return -1;
    for (; isdigit((unsigned char)*p); p++) {
        if (n > (INT64_MAX - 9) / 10) return -1;
        n = n * 10 + (*p - '0');
    }
    for (size_t i = 0; i < COUNT(units); i++) {
        if (strcasecmp(p, units[i].suffix) != 0) continue;
        if (n > INT64_MAX / units[i].mult) return -1;
        *out = n * units[i].mult;
        return 0;
    }
    return -1;
}

static int set_size(int64_t *field, const job_key *k, const json_t *v, errbuf *err) {
    int64_t bytes;
    if (json_is_integer(v)) {
        bytes = json_integer_value(v);
    } else if (json_is_string(v)) {
        if (parse_size(json_string_value(v), &bytes) != 0)
            return errf(err, "%s.%s: '%s' is not a size (bytes, or a number followed by KB, MB, "
                             "GB, TB, KiB, MiB, GiB or TiB)", k->section, k->name,
                        json_string_value(v));
    } else {
        return wrong_type(k, "a size (bytes, or a string such as \"5GB\")", v, err);
    }
    if ((double)bytes < k->min)
        return errf(err, "%s.%s: %lld is out of range (must be >= %.0f byte%s)", k->section,
                    k->name, (long long)bytes, k->min, k->min == 1 ? "" : "s");
    *field = bytes;
    return 0;
}

static int set_betas(double *field, const job_key *k, const json_t *v, errbuf *err) {
    if (!json_is_array(v) || json_array_size(v) != 2)
        return errf(err, "%s.%s: expected a list of two numbers, got %s%s", k->section, k->name,
                    json_kind(v), json_is_array(v) ? " of another length" : "");
    double b[2];
    for (size_t i = 0; i < 2; i++) {
        char what[64];
        snprintf(what, sizeof what, "%s.%s[%zu]", k->section, k->name, i);
        if (read_real(k, what, json_array_get(v, i), &b[i], err)) return -1;
    }
    field[0] = b[0];
    field[1] = b[1];
    return 0;
}

static int set_targets(job_config *j, const job_key *k, const json_t *v, errbuf *err) {
    if (json_is_string(v) && strcmp(json_string_value(v), "all-linear") == 0) {
        memset(j->lora.targets, 0, sizeof j->lora.targets);
        for (size_t m = 0; m < COUNT(lora_modules); m++)
            snprintf(j->lora.targets[m], JOB_NAME_MAX, "%s", lora_modules[m]);
        j->lora.n_targets = (int)COUNT(lora_modules);
        return 0;
    }
    size_t n = json_is_array(v) ? json_array_size(v) : 0;
    if (!json_is_array(v) || n == 0 || n > JOB_MAX_TARGETS)
        return errf(err, "%s.%s: expected \"all-linear\" or a list of 1 to %d module names, got %s",
                    k->section, k->name, JOB_MAX_TARGETS, json_is_array(v) ? "an empty list" : json_kind(v));
    char names[JOB_MAX_TARGETS][JOB_NAME_MAX];
    memset(names, 0, sizeof names);
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_array_get(v, i);
        if (!json_is_string(e))
            return errf(err, "%s.%s[%zu]: expected a string, got %s", k->section, k->name, i,
                        json_kind(e));
        const char *s = json_string_value(e);
        bool known = false;
        for (size_t m = 0; m < COUNT(lora_modules); m++) known |= strcmp(s, lora_modules[m]) == 0;
        if (!known)
            return errf(err, "%s.%s[%zu]: unknown module '%s' (valid: q_proj, k_proj, v_proj, "
                             "o_proj, gate_proj, up_proj, down_proj)", k->section, k->name, i, s);
        for (size_t p = 0; p < i; p++)
            if (strcmp(names[p], s) == 0)
                return errf(err, "%s.%s[%zu]: '%s' is listed twice", k->section, k->name, i, s);
        snprintf(names[i], JOB_NAME_MAX, "%s", s);
    }
    memcpy(j->lora.targets, names, sizeof names);
    j->lora.n_targets = (int)n;
    return 0;
}

/* runtime.log_to's names, in the order job_to_object writes them; "tqdm" is stdout's other
 * name (the step lines), "none" an empty list (the Trainer's report_to spelling). */
static const choice log_to_names[] = {
    {"stdout", JOB_LOG_STDOUT}, {"tensorboard", JOB_LOG_TENSORBOARD}, {"mlflow", JOB_LOG_MLFLOW},
    {"tqdm", JOB_LOG_STDOUT}, {"none", 0}, {NULL, 0}};

static int log_to_name(const job_key *k, size_t i, const char *s, unsigned *bits, errbuf *err) {
    if (!strcmp(s, "wandb"))
        return errf(err, "%s.%s[%zu]: 'wandb' is not built yet: compute nodes usually have no network. "
                         "Log to tensorboard and upload its event files from a machine that has: "
                         "wandb sync --sync-tensorboard OUTPUT_DIR/tensorboard", k->section, k->name, i);
    for (const choice *c = log_to_names; c->name; c++)
        if (!strcmp(c->name, s)) {
            *bits |= (unsigned)c->value;
            return 0;
        }
    return errf(err, "%s.%s[%zu]: unknown destination '%s' (valid: stdout, tqdm, tensorboard, mlflow, none)",
                k->section, k->name, i, s);
}

/* A list of names, or one name as a string. */
static int set_log_to(unsigned *field, const job_key *k, const json_t *v, errbuf *err) {
    unsigned bits = 0;
    if (json_is_string(v)) {
        if (log_to_name(k, 0, json_string_value(v), &bits, err)) return -1;
        *field = bits;
        return 0;
    }
    if (!json_is_array(v)) return wrong_type(k, "a list of destination names", v, err);
    for (size_t i = 0; i < json_array_size(v); i++) {
        const json_t *e = json_array_get(v, i);
        if (!json_is_string(e))
            return errf(err, "%s.%s[%zu]: expected a string, got %s", k->section, k->name, i, json_kind(e));
        if (!strcmp(json_string_value(e), "none") && json_array_size(v) > 1)
            return errf(err, "%s.%s[%zu]: 'none' with other destinations", k->section, k->name, i);
        if (log_to_name(k, i, json_string_value(e), &bits, err)) return -1;
    }
    *field = bits;
    return 0;
}

static json_t *get_log_to(unsigned bits) {
    json_t *v = json_array();
    for (const choice *c = log_to_names; v && c->name && strcmp(c->name, "tqdm"); c++)
        if ((bits & (unsigned)c->value) && json_array_append_new(v, json_string(c->name))) {
            json_decref(v);
            v = NULL;
        }
    return v;
}

static int set_resume(job_config *j, const job_key *k, const json_t *v, errbuf *err) {
    if (!json_is_string(v)) return wrong_type(k, "a string", v, err);
    const char *s = json_string_value(v);
    static const choice modes[] = {
        {"auto", JOB_RESUME_AUTO}, {"never", JOB_RESUME_NEVER}, {"latest", JOB_RESUME_LATEST},
        {"force", JOB_RESUME_FORCE}};
    for (size_t i = 0; i < COUNT(modes); i++) {
        if (strcmp(s, modes[i].name) == 0) {
            j->checkpoint.resume = (job_resume)modes[i].value;
            j->checkpoint.resume_step = 0;
            return 0;
        }
    }
    int64_t step = 0;
    const char *p = s + 5;
    bool ok = strncmp(s, "step-", 5) == 0 && isdigit((unsigned char)*p);
    for (; ok && *p; p++) {
        ok = isdigit((unsigned char)*p) && step <= (INT64_MAX - 9) / 10;
        step = step * 10 + (*p - '0');
    }
    if (!ok)
        return errf(err, "%s.%s: unknown choice '%s' (valid: auto, never, latest, force, step-N)",
                    k->section, k->name, s);
    j->checkpoint.resume = JOB_RESUME_STEP;
    j->checkpoint.resume_step = step;
    return 0;
}

static int set_value(job_config *j, const job_key *k, const json_t *v, errbuf *err);

/* Sets the key and records that it was given (job_key_given). */
static int set_key(job_config *j, const job_key *k, const json_t *v, errbuf *err) {
    if (set_value(j, k, v, err)) return -1;
    size_t i = (size_t)(k - keys);
    j->given[i / 64] |= 1ull << (i % 64);
    return 0;
}

static int set_value(job_config *j, const job_key *k, const json_t *v, errbuf *err) {
    char *field = (char *)j + k->offset;
    char what[128];
    snprintf(what, sizeof what, "%s.%s", k->section, k->name);
    switch (k->type) {
    case K_INT:
    case K_I64: return set_integer(field, k, v, err);
    case K_DOUBLE: return read_real(k, what, v, (double *)field, err);
    case K_BOOL:
        if (!json_is_boolean(v)) return wrong_type(k, "true or false", v, err);
        *(bool *)field = json_is_true(v);
        return 0;
    case K_STRING: return set_string(field, k, v, err);
    case K_CHOICE: return set_choice((int *)field, k, v, err);
    case K_SIZE: return set_size((int64_t *)field, k, v, err);
    case K_BETAS: return set_betas((double *)field, k, v, err);
    case K_TARGETS: return set_targets(j, k, v, err);
    case K_RESUME: return set_resume(j, k, v, err);
    case K_LOG_TO: return set_log_to((unsigned *)field, k, v, err);
    }
    return errf(err, "%s: unknown key type %d", what, (int)k->type);
}

/* ---- writing one value ---- */

static json_t *oom(errbuf *err) {
    errf(err, "out of memory");
    return NULL;
}

static json_t *get_real(const job_key *k, double x, errbuf *err) {
    if (!isfinite(x)) {
        errf(err, "%s.%s: %g is not a finite number", k->section, k->name, x);
        return NULL;
    }
    json_t *v = json_real(x);
    return v ? v : oom(err);
}

/* The key's value as JSON (a new reference), or NULL when the struct holds something no
 * job file could express. */
static json_t *get_key(const job_config *j, const job_key *k, errbuf *err) {
    const char *field = (const char *)j + k->offset;
    json_t *v = NULL;
    switch (k->type) {
    case K_INT: v = json_integer(*(const int *)field); break;
    case K_I64:
    case K_SIZE: v = json_integer(*(const int64_t *)field); break;
    case K_DOUBLE: return get_real(k, *(const double *)field, err);
    case K_BOOL: v = json_boolean(*(const bool *)field); break;
    case K_STRING:
        v = json_stringn(field, strnlen(field, k->size));
        if (!v) {
            errf(err, "%s.%s: not valid UTF-8", k->section, k->name);
            return NULL;
        }
        return v;
    case K_CHOICE:
        for (const choice *c = k->choices; c->name; c++)
            if (c->value == *(const int *)field) v = json_string(c->name);
        if (!v) {
            errf(err, "%s.%s: invalid value %d", k->section, k->name, *(const int *)field);
            return NULL;
        }
        return v;
    case K_BETAS:
        v = json_array();
        for (int i = 0; v && i < 2; i++) {
            json_t *b = get_real(k, ((const double *)field)[i], err);
            if (!b || json_array_append_new(v, b)) {
                json_decref(v);
                return NULL;
            }
        }
        break;
    case K_TARGETS:
        v = json_array();
        for (int i = 0; v && i < j->lora.n_targets && i < JOB_MAX_TARGETS; i++) {
            const char *name = j->lora.targets[i];
            if (json_array_append_new(v, json_stringn(name, strnlen(name, JOB_NAME_MAX)))) {
                json_decref(v);
                v = NULL;
            }
        }
        break;
    case K_RESUME: {
        static const char *const names[] = {[JOB_RESUME_AUTO] = "auto", [JOB_RESUME_NEVER] = "never",
                                            [JOB_RESUME_LATEST] = "latest", [JOB_RESUME_FORCE] = "force"};
        char buf[32];
        if (j->checkpoint.resume == JOB_RESUME_STEP)
            snprintf(buf, sizeof buf, "step-%lld", (long long)j->checkpoint.resume_step);
        else if ((unsigned)j->checkpoint.resume < COUNT(names) && names[j->checkpoint.resume])
            snprintf(buf, sizeof buf, "%s", names[j->checkpoint.resume]);
        else {
            errf(err, "%s.%s: invalid value %d", k->section, k->name, (int)j->checkpoint.resume);
            return NULL;
        }
        v = json_string(buf);
        break;
    }
    case K_LOG_TO: v = get_log_to(*(const unsigned *)field); break;
    }
    return v ? v : oom(err);
}


/* ---- job files ---- */

static int apply_object(job_config *j, const json_t *root, bool strict, errbuf *err) {
    if (!json_is_object(root))
        return errf(err, "expected a JSON object at the top level, got %s", json_kind(root));
    const char *sname, *kname;
    json_t *section, *value;
    json_object_foreach((json_t *)root, sname, section) {
        if (!is_section(sname)) return unknown_section(sname, err);
        if (!json_is_object(section))
            return errf(err, "%s: expected an object, got %s", sname, json_kind(section));
        json_object_foreach(section, kname, value) {
            const job_key *k = find_key(sname, kname);
            if (!k) return unknown_key(sname, kname, err);
            if (set_key(j, k, value, err)) return -1;
        }
    }
    for (size_t i = 0; strict && i < COUNT(keys); i++) {
        const json_t *s = json_object_get(root, keys[i].section);
        if (!json_object_get(s, keys[i].name))
            return errf(err, "%s.%s: missing (a resolved config carries every key)",
                        keys[i].section, keys[i].name);
    }
    return 0;
}

/* The profile a job file names in train.defaults, applied before its other keys (so that
 * they override it); `profile` >= 0 (the command line's --defaults) is used instead. */
static int start_from_profile(job_config *j, const json_t *root, int profile, errbuf *err) {
    job_defaults(j);
    const json_t *named = json_object_get(json_object_get(root, "train"), "defaults");
    if (profile < 0 && named) {
        if (set_key(j, find_key("train", "defaults"), named, err)) return -1;
        profile = (int)j->train.defaults;
    }
    if (profile >= 0) job_apply_profile(j, (job_profile)profile);
    return 0;
}

static int parse(job_config *j, const char *json, size_t len, const char *name, int profile, errbuf *err) {
    json_error_t je;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) return errf(err, "%s:%d:%d: %s", name, je.line, je.column, je.text);
    int rc = start_from_profile(j, root, profile, err) || apply_object(j, root, false, err) ? -1 : 0;
    json_decref(root);
    if (rc) return errprefix(err, "%s", name);
    if (profile >= 0) j->train.defaults = (job_profile)profile;
    return 0;
}

int job_parse_text(job_config *j, const char *json, size_t len, const char *name,
                   errbuf *err) {
    return parse(j, json, len, name, -1, err);
}

int job_load_profile(job_config *j, const char *path, int profile, errbuf *err) {
    char *text = NULL;
    size_t len = 0;
    if (file_read_all(path, JOB_FILE_MAX, &text, &len, err)) return -1;
    int rc = parse(j, text, len, path, profile, err);
    free(text);
    return rc;
}

int job_load(job_config *j, const char *path, errbuf *err) { return job_load_profile(j, path, -1, err); }

static void mark_given(job_config *j, const char *full, bool given) {
    const job_key *k = find_full_key(full);
    size_t i = (size_t)(k - keys);
    if (given) j->given[i / 64] |= 1ull << (i % 64);
    else j->given[i / 64] &= ~(1ull << (i % 64));
}

bool job_key_given(const job_config *j, const char *full) {
    const job_key *k = find_full_key(full);
    if (!k) return false;
    size_t i = (size_t)(k - keys);
    return (j->given[i / 64] >> (i % 64)) & 1;
}

/* ---- command-line overrides ---- */

static bool parse_integer(const char *s, long long *out) {
    char *end;
    if (!*s || isspace((unsigned char)*s)) return false;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (errno || *end) return false;
    *out = x;
    return true;
}

static bool parse_real(const char *s, double *out) {
    char *end;
    if (!*s || isspace((unsigned char)*s)) return false;
    errno = 0;
    double x = strtod(s, &end);
    if (errno || *end || !isfinite(x)) return false;
    *out = x;
    return true;
}

/* One item of a comma-separated list. */
static json_t *list_item(const job_key *k, const char *p, size_t n, errbuf *err) {
    char item[64];
    if (n >= sizeof item) {
        errf(err, "%s.%s: list item '%.*s' is too long", k->section, k->name, (int)n, p);
        return NULL;
    }
    memcpy(item, p, n);
    item[n] = '\0';
    if (k->type == K_TARGETS || k->type == K_LOG_TO) {
        json_t *e = json_string(item);
        if (!e) errf(err, "%s.%s: '%s' is not valid UTF-8", k->section, k->name, item);
        return e;
    }
    double x;
    if (!parse_real(item, &x)) {
        errf(err, "%s.%s: '%s' is not a number", k->section, k->name, item);
        return NULL;
    }
    json_t *e = json_real(x);
    return e ? e : oom(err);
}

/* A list value: JSON text ("[0.9, 0.95]") or comma separated ("0.9,0.95"). */
static json_t *list_from_text(const job_key *k, const char *text, errbuf *err) {
    if (text[0] == '[') {
        json_error_t je;
        json_t *v = json_loads(text, 0, &je);
        if (!v) errf(err, "%s.%s: '%s' is not a JSON list: %s", k->section, k->name, text, je.text);
        return v;
    }
    json_t *list = json_array();
    if (!list) return oom(err);
    for (const char *p = text;; p++) {
        size_t n = strcspn(p, ",");
        json_t *e = list_item(k, p, n, err);
        if (!e) {
            json_decref(list);
            return NULL;
        }
        if (json_array_append_new(list, e)) {
            json_decref(list);
            return oom(err);
        }
        p += n;
        if (!*p) return list;
    }
}

/* An override's value text as the JSON a job file would hold for the key. */
static json_t *value_from_text(const job_key *k, const char *text, errbuf *err) {
    long long i;
    double x;
    json_t *v = NULL;
    switch (k->type) {
    case K_INT:
    case K_I64:
        if (!parse_integer(text, &i)) {
            errf(err, "%s.%s: '%s' is not an integer", k->section, k->name, text);
            return NULL;
        }
        v = json_integer(i);
        break;
    case K_DOUBLE:
        if (!parse_real(text, &x)) {
            errf(err, "%s.%s: '%s' is not a number", k->section, k->name, text);
            return NULL;
        }
        v = json_real(x);
        break;
    case K_BOOL: {
        bool b;
        if (job_parse_bool(text, &b)) {
            errf(err, "%s.%s: '%s' is not a boolean (true, false, True, False, 1, 0, yes or no)",
                 k->section, k->name, text);
            return NULL;
        }
        v = json_boolean(b);
        break;
    }
    case K_STRING:
    case K_CHOICE:
    case K_SIZE:
    case K_RESUME:
        v = json_string(text);
        if (!v) errf(err, "%s.%s: '%s' is not valid UTF-8", k->section, k->name, text);
        return v;
    case K_TARGETS:
        if (strcmp(text, "all-linear") == 0) return json_string(text);
        return list_from_text(k, text, err);
    case K_BETAS:
    case K_LOG_TO: return list_from_text(k, text, err);
    }
    return v ? v : oom(err);
}

static int set_from_text(job_config *j, const job_key *k, const char *text, errbuf *err) {
    json_t *v = value_from_text(k, text, err);
    if (!v) return -1;
    int rc = set_key(j, k, v, err);
    json_decref(v);
    return rc;
}

int job_typo_distance(const char *word, const char *candidate) {
    int d = edit_distance(word, candidate);
    return d <= (int)strlen(candidate) / 3 + 1 ? d : INT_MAX;
}

int job_parse_bool(const char *text, bool *out) {
    static const char *const words[][2] = {{"true", "false"}, {"True", "False"}, {"1", "0"},
                                           {"yes", "no"}, {"TRUE", "FALSE"}};
    for (size_t i = 0; i < COUNT(words); i++)
        for (int v = 0; v < 2; v++)
            if (strcmp(text, words[i][v]) == 0) {
                *out = v == 0;
                return 0;
            }
    return -1;
}

int job_key_type(const char *full) {
    const job_key *k = find_full_key(full);
    if (!k) return -1;
    return k->type == K_BOOL ? JOB_KEY_BOOL : JOB_KEY_VALUE;
}

int job_set_text(job_config *j, const char *full, const char *text, errbuf *err) {
    const char *dot = strchr(full, '.');
    if (!dot) return errf(err, "'%s': a key is section.key", full);
    char section[32];
    size_t n = (size_t)(dot - full);
    if (n >= sizeof section) return unknown_section(full, err);
    memcpy(section, full, n);
    section[n] = '\0';
    if (!is_section(section)) return unknown_section(section, err);
    const job_key *k = find_key(section, dot + 1);
    if (!k) return unknown_key(section, dot + 1, err);
    return set_from_text(j, k, text, err);
}

const char *job_nearest_key(const char *word, int *distance) {
    static char full[JOB_KEYS_MAX][64];
    const char *best = NULL;
    int best_d = INT_MAX;
    for (size_t i = 0; i < COUNT(keys); i++) {
        snprintf(full[i], sizeof full[i], "%s.%s", keys[i].section, keys[i].name);
        consider(word, full[i], &best, &best_d);
        if (strcmp(word, keys[i].name) == 0 && best_d > 0) {
            best = full[i];
            best_d = 1;
        }
    }
    *distance = best_d;
    return best;
}

/* ---- resolution and cross-field rules ---- */

int job_resolve_runtime(job_config *j, int gpus_on_node, errbuf *err) {
    if (gpus_on_node < 0) return errf(err, "GPUs on this node: %d is negative", gpus_on_node);
    if (j->runtime.backend == JOB_BACKEND_AUTO)
        j->runtime.backend = gpus_on_node > 0 ? JOB_BACKEND_CUDA : JOB_BACKEND_CPU;
    bool cuda = j->runtime.backend == JOB_BACKEND_CUDA;
    if (cuda && gpus_on_node == 0)
        return errf(err, "runtime.backend: 'cuda' but this node has no GPU");
    if (j->runtime.workers_per_node == 0)
        j->runtime.workers_per_node = cuda ? gpus_on_node : 2;
    /* More workers than GPUs share them evenly (collectives then go through host memory:
     * a way to run several ranks on one GPU, not a way to train fast). */
    else if (cuda && j->runtime.workers_per_node > gpus_on_node &&
             j->runtime.workers_per_node % gpus_on_node != 0)
        return errf(err, "runtime.workers_per_node: %d workers cannot share %d GPUs evenly",
                    j->runtime.workers_per_node, gpus_on_node);
    if (j->model.dtype == JOB_DTYPE_AUTO) j->model.dtype = cuda ? JOB_DTYPE_BF16 : JOB_DTYPE_F32;
    return 0;
}

/* Runs every key through the same checks as a job file value (on a copy: assigning a key
 * writes it). */
static int check_keys(const job_config *j, errbuf *err) {
    job_config *scratch = malloc(sizeof *scratch);
    if (!scratch) return errf(err, "out of memory checking the job's keys");
    *scratch = *j;
    int rc = 0;
    for (size_t i = 0; i < COUNT(keys) && rc == 0; i++) {
        json_t *v = get_key(j, &keys[i], err);
        if (!v) {
            rc = -1;
            break;
        }
        rc = set_key(scratch, &keys[i], v, err);
        json_decref(v);
    }
    free(scratch);
    return rc;
}

static int check_model(const job_config *j, errbuf *err) {
    if (j->model.init == JOB_INIT_RANDOM) {
        if (!j->model.config[0])
            return errf(err, "model.config: required with model.init \"random\" (a config.json, "
                             "e.g. configs/models/tiny.json)");
        if (j->model.path[0])
            return errf(err, "model.path: set together with model.init \"random\" (use one or "
                             "the other)");
        return 0;
    }
    if (!j->model.path[0])
        return errf(err, "model.path: required (a Hugging Face model directory), or set "
                         "model.init to \"random\" and model.config");
    if (j->model.config[0])
        return errf(err, "model.config: only used with model.init \"random\" (a pretrained "
                         "model's config is model.path/config.json)");
    return 0;
}

static int check_world(int world_size, errbuf *err) {
    return world_size < 1 ? errf(err, "world size %d: must be at least 1", world_size) : 0;
}

/* global_batch must divide into micro_batch x world_size; the quotient is grad_accum. */
static int check_batch_divides(const job_config *j, int world_size, errbuf *err) {
    long long micro = j->train.micro_batch;
    if (micro < 1) /* job_resolve may run before check_keys has seen it */
        return errf(err, "train.micro_batch: %lld is below 1", micro);
    long long unit = micro * world_size, gb = j->train.global_batch;
    if (gb % unit == 0) return 0;
    long long lower = gb / unit * unit;
    if (lower == 0)
        return errf(err, "train.global_batch: %lld is smaller than train.micro_batch (%lld) x "
                         "world size (%d) = %lld; use %lld or a multiple of it", gb, micro,
                    world_size, unit, unit);
    return errf(err, "train.global_batch: %lld is not a multiple of train.micro_batch (%lld) "
                     "x world size (%d) = %lld; use %lld or %lld", gb, micro, world_size,
                unit, lower, lower + unit);
}

static int grad_accum_of(const job_config *j, int world_size) {
    return (int)(j->train.global_batch / ((long long)j->train.micro_batch * world_size));
}

/* The batch from what was given: train.accumulation given makes global_batch micro_batch x
 * accumulation x world size (both given must agree); global_batch given is used as it is;
 * neither: the profile's accumulation when it has one (fsdp_qlora's, the Trainer's: 1),
 * else the default global_batch.  Then train.accumulation holds the resolved grad_accum. */
static int resolve_batch(job_config *j, int world_size, errbuf *err) {
    long long micro = j->train.micro_batch, acc = j->train.accumulation;
    bool acc_given = job_key_given(j, "train.accumulation"), gb_given = job_key_given(j, "train.global_batch");
    if (acc > 0 && (acc_given || !gb_given)) {
        long long gb = micro * acc * world_size;
        if (gb > INT_MAX)
            return errf(err, "train.accumulation: %lld x train.micro_batch (%lld) x world size (%d) = %lld is "
                             "too large", acc, micro, world_size, gb);
        if (gb_given && gb != j->train.global_batch)
            return errf(err, "train.accumulation (--gradient_accumulation_steps) %lld and train.global_batch %d "
                             "disagree: %lld x micro-batch %lld x world size %d = %lld; give one of them",
                        acc, j->train.global_batch, acc, micro, world_size, gb);
        j->train.global_batch = (int)gb;
    }
    if (check_batch_divides(j, world_size, err)) return -1;
    j->train.grad_accum = grad_accum_of(j, world_size);
    j->train.accumulation = j->train.grad_accum;
    /* Resolved: global_batch is the batch from now on (a checkpoint may replace it, and
     * resolving again must not derive it back from accumulation). */
    mark_given(j, "train.global_batch", true);
    mark_given(j, "train.accumulation", false);
    return 0;
}

/* An empty runtime.metrics becomes output.dir/metrics.jsonl. */
static int resolve_metrics(job_config *j, errbuf *err) {
    if (j->runtime.metrics[0]) return 0;
    int n = snprintf(j->runtime.metrics, sizeof j->runtime.metrics, "%s/metrics.jsonl",
                     j->output.dir);
    if (n < 0 || (size_t)n >= sizeof j->runtime.metrics) {
        j->runtime.metrics[0] = '\0';
        return errf(err, "runtime.metrics: output.dir/metrics.jsonl is longer than %d bytes",
                    JOB_PATH_MAX - 1);
    }
    return 0;
}

/* An empty checkpoint.dir becomes OUTPUT_DIR.checkpoints: beside output.dir, not inside it (the
 * output stays a model directory to upload), and two jobs with different outputs never meet. */
static int resolve_checkpoint_dir(job_config *j, errbuf *err) {
    if (j->checkpoint.dir[0]) return 0;
    size_t n = strlen(j->output.dir);
    while (n > 1 && j->output.dir[n - 1] == '/') n--;
    if (n == 0 || (n == 1 && j->output.dir[0] == '/'))
        return errf(err, "checkpoint.dir: cannot derive it from output.dir '%s' (set checkpoint.dir)",
                    j->output.dir);
    int len = snprintf(j->checkpoint.dir, sizeof j->checkpoint.dir, "%.*s.checkpoints", (int)n, j->output.dir);
    if (len < 0 || (size_t)len >= sizeof j->checkpoint.dir) {
        j->checkpoint.dir[0] = '\0';
        return errf(err, "checkpoint.dir: OUTPUT_DIR.checkpoints is longer than %d bytes", JOB_PATH_MAX - 1);
    }
    return 0;
}

/* The waits a healthy step may hold a rank for: a collective, a synchronous save. */
static int longest_healthy_wait_s(const job_config *j) {
    return j->runtime.comm_timeout_s > j->checkpoint.timeout_s ? j->runtime.comm_timeout_s
                                                                : j->checkpoint.timeout_s;
}

int job_stall_timeout_s(const job_config *j) {
    if (j->runtime.stall_timeout_s > 0) return j->runtime.stall_timeout_s;
    int wait = longest_healthy_wait_s(j);
    return wait > INT_MAX - 300 ? INT_MAX : wait + 300;
}

/* A stall timeout given must outlast what a healthy step may wait for, and a heartbeat. */
static int check_stall_timeout(const job_config *j, errbuf *err) {
    int given = j->runtime.stall_timeout_s, wait = longest_healthy_wait_s(j);
    if (given == 0) return 0;
    if (given <= wait)
        return errf(err, "runtime.stall_timeout_s: %d s is not longer than a healthy step may wait "
                         "(runtime.comm_timeout_s %d s for a collective, checkpoint.timeout_s %d s "
                         "for a synchronous save)", given, j->runtime.comm_timeout_s, j->checkpoint.timeout_s);
    if (given <= 2 * j->runtime.heartbeat_s)
        return errf(err, "runtime.stall_timeout_s: %d s is not longer than two heartbeats "
                         "(runtime.heartbeat_s %d s), which carry the progress it watches", given,
                    j->runtime.heartbeat_s);
    return 0;
}

int job_warmup_steps(const job_config *j, long long total_steps) {
    if (j->train.warmup_steps > 0 || j->train.warmup_ratio <= 0) return j->train.warmup_steps;
    double x = j->train.warmup_ratio * (double)total_steps;
    double w = j->train.warmup_round == JOB_ROUND_DOWN ? floor(x) : ceil(x);
    return w > INT_MAX ? INT_MAX : (int)w;
}

/* Whether every rank's shard file is written on the rank's own node, as an in-memory
 * checkpoint needs (each node keeps its own ranks' files): not so for no_shard and
 * hybrid_shard on several nodes, whose files node 0's ranks alone write. */
static int files_on_own_node(const job_config *j, int world_size) {
    int one_node = j->runtime.workers_per_node == 0 || world_size <= j->runtime.workers_per_node;
    return one_node || j->fsdp.sharding == JOB_SHARD_FULL || j->fsdp.sharding == JOB_SHARD_GRAD_OP;
}

/* checkpoint.memory_interval_steps auto: on when a failure can be recovered inside the job. */
static void resolve_memory(job_config *j, int world_size) {
    if (j->checkpoint.memory_interval_steps >= 0) return;
    int recovers = j->runtime.max_restarts > 0 || j->runtime.spare_nodes > 0;
    j->checkpoint.memory_interval_steps = recovers && files_on_own_node(j, world_size) ? 1 : 0;
}

int job_resolve(job_config *j, int world_size, errbuf *err) {
    if (check_world(world_size, err) || resolve_batch(j, world_size, err) ||
        resolve_metrics(j, err) || resolve_checkpoint_dir(j, err))
        return -1;
    resolve_memory(j, world_size);
    lora_config_of(j, &j->lora.config);
    return 0;
}

/* What job_resolve fills must be filled, and agree with what it derives from. */
static int check_resolved(const job_config *j, int world_size, errbuf *err) {
    if (j->train.grad_accum != grad_accum_of(j, world_size) || j->train.accumulation != j->train.grad_accum)
        return errf(err, "train.grad_accum: not resolved for world size %d (job_resolve first)",
                    world_size);
    if (!j->runtime.metrics[0])
        return errf(err, "runtime.metrics: not resolved (job_resolve first)");
    if (!j->checkpoint.dir[0])
        return errf(err, "checkpoint.dir: not resolved (job_resolve first)");
    lora_config want;
    lora_config_of(j, &want);
    if (!lora_config_same_adapters(&want, &j->lora.config) || want.dropout != j->lora.config.dropout)
        return errf(err, "lora.config: not resolved from lora.* (job_resolve first)");
    return 0;
}

static int check_schedule(const job_config *j, errbuf *err) {
    if (j->train.min_lr > j->train.lr)
        return errf(err, "train.min_lr: %.15g is above train.lr (%.15g)", j->train.min_lr,
                    j->train.lr);
    if (j->train.max_steps > 0 && j->train.warmup_steps > j->train.max_steps)
        return errf(err, "train.warmup_steps: %d is more than train.max_steps (%d)",
                    j->train.warmup_steps, j->train.max_steps);
    return 0;
}

/* The template names data/chat_template.h knows ("" = auto); fsdpd resolves auto. */
static int check_data(const job_config *j, errbuf *err) {
    static const char *const templates[] = {"",        "auto",       "llama3",         "llama2",
                                            "chatml",  "qwen2",      "qwen2.5",        "qwen3",
                                            "mistral",
                                            "mistral-v3", "mistral-tekken", "alpaca"};
    if (!j->data.path[0])
        return errf(err, "data.path: required (a token cache, made by fsdpctl tokenize, or a "
                         "JSONL file with data.format alpaca, chat, text or preference)");
    for (size_t i = 0; i < COUNT(templates); i++)
        if (!strcmp(j->data.template_name, templates[i])) return 0;
    return errf(err, "data.template: '%s' is not one of llama3, llama2, chatml, qwen2, qwen2.5, qwen3, "
                     "mistral, mistral-v3, mistral-tekken, alpaca, auto", j->data.template_name);
}

/* Adapter keys: only with an adapter job, whose frozen base is a model directory. */
static int check_adapters(const job_config *j, errbuf *err) {
    bool adapters = j->train.type != JOB_TRAIN_FULL;
    if (!adapters && j->lora.init_from[0])
        return errf(err, "lora.init_from: only with train.type lora or qlora");
    if (j->fsdp.mlp_chunk && j->fsdp.activation_checkpointing != JOB_ACT_CKPT_FULL &&
        j->fsdp.activation_checkpointing != JOB_ACT_CKPT_SELECTIVE)
        return errf(err, "fsdp.mlp_chunk: the MLP in chunks recomputes each chunk in the backward: it needs "
                         "fsdp.activation_checkpointing full or selective (auto: not built yet)");
    if (j->fsdp.mlp_chunk && adapters && j->lora.dropout > 0)
        return errf(err, "fsdp.mlp_chunk with lora.dropout %g: not built yet (the adapters' dropout masks are "
                         "drawn for whole rows); set lora.dropout 0", j->lora.dropout);
    if (j->fsdp.offload_activations && j->fsdp.activation_checkpointing != JOB_ACT_CKPT_FULL)
        return errf(err, "fsdp.offload_activations: moves the layer inputs that full recompute keeps: it needs "
                         "fsdp.activation_checkpointing full");
    if (!adapters && j->fsdp.offload_params && !j->fsdp.cpu_offload)
        return errf(err, "fsdp.offload_params: a full fine-tune's parameters are its master shards: "
                         "it needs fsdp.cpu_offload, which keeps them on the host");
    if (!adapters && j->output.merge)
        return errf(err, "output.merge: only with train.type lora or qlora (a full fine-tune's "
                         "output is the whole model already)");
    if (j->output.merge && !j->output.consolidate)
        return errf(err, "output.merge: needs output.consolidate (the merged model is written from "
                         "the consolidated adapter)");
    return 0;
}

static void value_text(const json_t *v, char *out, size_t n);

/* Whether key `section.name` of j holds another value than job_defaults gives it (*text: that
 * value as JSON).  "Set" means changed from the default: a default is never refused, whatever
 * the job file spells out, and job_validate needs no record of what the file or the overrides
 * named. */
static int key_set(const job_config *j, const job_config *defaults, const job_key *k, bool *set, char *text,
                   size_t n, errbuf *err) {
    json_t *a = get_key(j, k, err), *b = a ? get_key(defaults, k, err) : NULL;
    if (!b) {
        json_decref(a);
        return -1;
    }
    *set = !json_equal(a, b);
    value_text(a, text, n);
    json_decref(a);
    json_decref(b);
    return 0;
}

/* Values that would be accepted and then ignored: refused, naming the key and why. */
static int check_unused(const job_config *j, errbuf *err) {
    job_config *d = malloc(sizeof *d);
    if (!d) return errf(err, "out of memory checking the job's keys");
    job_apply_profile(d, j->train.defaults); /* "set": changed from the defaults the job took */
    bool adapters = j->train.type != JOB_TRAIN_FULL, tokens = j->data.format == JOB_DATA_TOKENS;
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < COUNT(keys); i++) {
        const job_key *k = &keys[i];
        const char *why = NULL;
        if (!strcmp(k->section, "lora") && !adapters)
            why = "train.type is full: adapters are not trained in a full fine-tune (set train.type lora "
                  "or qlora, or leave lora.* at its defaults)";
        else if (!strcmp(k->section, "data") && tokens &&
                 (!strcmp(k->name, "template") || !strcmp(k->name, "truncate") || !strcmp(k->name, "on_bad_record")))
            why = "data.format is tokens: a token cache was templated, truncated and filtered when it was "
                  "made (fsdpctl tokenize); the key applies to JSONL data (data.format alpaca, chat, text or preference)";
        else if (!strcmp(k->section, "data") && !strcmp(k->name, "truncation_mode") && j->data.format != JOB_DATA_PREFERENCE)
            why = "data.format is not preference (the key is TRL's truncation_mode, for pairs)";
        else if (!strcmp(k->section, "train") && !strncmp(k->name, "dpo_", 4) && j->train.objective != JOB_OBJECTIVE_DPO)
            why = "train.objective is not dpo";
        else if (!strcmp(k->section, "train") && !strcmp(k->name, "orpo_lambda") && j->train.objective != JOB_OBJECTIVE_ORPO)
            why = "train.objective is not orpo";
        else if (!strcmp(k->section, "train") && !strncmp(k->name, "fp8_", 4) && j->train.precision != JOB_PRECISION_FP8)
            why = "train.precision is not fp8";
        else if (!strcmp(k->section, "runtime") && !strncmp(k->name, "mlflow_", 7) && !(j->runtime.log_to & JOB_LOG_MLFLOW))
            why = "runtime.log_to has no mlflow";
        else if (!strcmp(k->section, "runtime") && !strcmp(k->name, "log_required") && !(j->runtime.log_to & JOB_LOG_MLFLOW))
            why = "runtime.log_to has no mlflow (it is what may be unreachable at the start)";
        else if (!strcmp(k->section, "output") && !strcmp(k->name, "shard_size") && adapters && !j->output.merge)
            why = "an adapter job's output is one adapter_model.safetensors, never sharded (PEFT's layout); "
                  "output.shard_size applies to the merged model of output.merge";
        else if (!strcmp(k->section, "train") && !strncmp(k->name, "sample_", 7) && strcmp(k->name, "sample_prompts") &&
                 !j->train.sample_prompts[0])
            why = "train.sample_prompts is not: there are no prompts to sample";
        if (!why) continue;
        bool set;
        char text[160];
        rc = key_set(j, d, k, &set, text, sizeof text, err);
        if (rc == 0 && set) rc = errf(err, "%s.%s: %s is set but %s", k->section, k->name, text, why);
    }
    free(d);
    if (rc) return -1;
    if (j->train.eval_interval > 0 && j->data.eval_fraction == 0)
        return errf(err, "train.eval_interval: %d is set but data.eval_fraction is 0: no data is held out to "
                         "evaluate (set data.eval_fraction, e.g. 0.05)", j->train.eval_interval);
    return 0;
}

/* runtime.log_to mlflow: a tracking server over HTTP(S). */
static int check_logging(const job_config *j, errbuf *err) {
    const char *uri = j->runtime.mlflow_uri;
    if (!(j->runtime.log_to & JOB_LOG_MLFLOW)) return 0;
    if (!uri[0])
        return errf(err, "runtime.mlflow_uri: required with runtime.log_to mlflow (the tracking server, "
                         "e.g. http://127.0.0.1:5000)");
    if (strncmp(uri, "http://", 7) && strncmp(uri, "https://", 8))
        return errf(err, "runtime.mlflow_uri: '%s': only an http:// or https:// tracking server is built "
                         "(a local file store or databricks URI is not built yet)", uri);
    return 0;
}

/* Preference objectives (F49): what is built of them. */
static int check_objective(const job_config *j, errbuf *err) {
    const char *name = choice_name(objective_choices, (int)j->train.objective);
    if (j->train.objective == JOB_OBJECTIVE_SFT && j->data.format == JOB_DATA_PREFERENCE)
        return errf(err, "data.format: preference records are pairs, for train.objective dpo or orpo (not sft)");
    if (j->train.objective == JOB_OBJECTIVE_SFT) return 0;
    if (j->data.packing)
        return errf(err, "data.packing: packing the pairs of train.objective '%s' is not built yet", name);
    if (j->data.eval_fraction > 0)
        return errf(err, "data.eval_fraction: the held-out loss of train.objective '%s' is not built yet", name);
    if (j->data.format != JOB_DATA_TOKENS && j->data.format != JOB_DATA_AUTO && j->data.format != JOB_DATA_PREFERENCE)
        return errf(err, "data.format: train.objective '%s' trains on pairs: data.format preference (JSONL "
                         "{prompt, chosen, rejected}) or a token cache of pairs, not %s records", name,
                    job_data_format_name(j->data.format));
    if (j->fsdp.cpu_offload)
        return errf(err, "fsdp.cpu_offload with train.objective '%s' is not built yet", name);
    return 0;
}

/* train.precision (F45): FP8 decoder projections for full fine-tunes of the SFT objective
 * (an adapter's frozen base and DPO's bf16 reference are not built with them). */
static int check_precision(const job_config *j, errbuf *err) {
    if (j->train.precision != JOB_PRECISION_FP8) return 0;
    if (j->train.type != JOB_TRAIN_FULL)
        return errf(err, "train.precision fp8 with train.type '%s' is not built yet (a full fine-tune trains in FP8)",
                    j->train.type == JOB_TRAIN_LORA ? "lora" : "qlora");
    if (j->train.objective != JOB_OBJECTIVE_SFT)
        return errf(err, "train.precision fp8 with a preference objective is not built yet");
    if (j->train.fp8_all_gather && j->train.fp8_scaling == JOB_FP8_ROWWISE)
        return errf(err, "train.fp8_all_gather with train.fp8_scaling rowwise is not built yet (the gathered codes "
                         "carry one scale a tensor): set train.fp8_all_gather false");
    if (j->train.fp8_all_gather && j->fsdp.cpu_offload)
        return errf(err, "train.fp8_all_gather with fsdp.cpu_offload is not built yet (the codes are cast from "
                         "masters in GPU memory): set train.fp8_all_gather false");
    return 0;
}

/* Strategies built for part of the jobs only. */
static int check_memory(const job_config *j, int world_size, errbuf *err) {
    if (j->checkpoint.memory_interval_steps < 0)
        return errf(err, "checkpoint.memory_interval_steps: not resolved (job_resolve first)");
    if (j->checkpoint.memory_interval_steps > 0 && !files_on_own_node(j, world_size))
        return errf(err, "checkpoint.memory_interval_steps with fsdp.sharding '%s' on several nodes is not built "
                    "yet (its shard files are written on node 0 alone)", job_sharding_name(j->fsdp.sharding));
    return 0;
}

static int check_sharding(const job_config *j, errbuf *err) {
    if (j->fsdp.sharding == JOB_SHARD_GRAD_OP && (j->train.type != JOB_TRAIN_FULL || j->fsdp.cpu_offload))
        return errf(err, "fsdp.sharding: 'shard_grad_op' with %s is not built yet",
                    j->train.type != JOB_TRAIN_FULL ? "adapters (train.type lora or qlora)" : "fsdp.cpu_offload");
    return 0;
}

int job_validate(const job_config *j, int world_size, errbuf *err) {
    if (check_world(world_size, err) || check_keys(j, err) || check_model(j, err) ||
        check_batch_divides(j, world_size, err) || check_resolved(j, world_size, err) ||
        check_schedule(j, err))
        return -1;
    if (check_data(j, err) || check_stall_timeout(j, err) || check_memory(j, world_size, err)) return -1;
    if (j->runtime.straggler_factor != 0 && j->runtime.straggler_factor <= 1)
        return errf(err, "runtime.straggler_factor: %g is not above 1 (a rank that many times the median's step "
                    "time is a straggler; 0 turns the watch off)", j->runtime.straggler_factor);
    if (j->runtime.node_timeout_s <= j->runtime.heartbeat_s)
        return errf(err, "runtime.node_timeout_s: %d s is not longer than runtime.heartbeat_s (%d s), the "
                    "period of the heartbeats it waits for", j->runtime.node_timeout_s, j->runtime.heartbeat_s);
    if (j->output.consolidate && !j->checkpoint.save_final)
        return errf(err, "output.consolidate: needs checkpoint.save_final (the output is the "
                         "final checkpoint, consolidated); set one of them to false");
    return check_adapters(j, err) || check_objective(j, err) || check_sharding(j, err) || check_logging(j, err) ||
                   check_precision(j, err) || check_unused(j, err) ? -1
                                                                   : 0;
}

json_t *job_to_object(const job_config *j, errbuf *err) {
    json_t *root = json_object();
    if (!root) return errf(err, "out of memory"), NULL;
    for (size_t i = 0; i < COUNT(keys); i++) {
        json_t *section = json_object_get(root, keys[i].section);
        if (!section) {
            section = json_object();
            if (json_object_set_new(root, keys[i].section, section)) {
                json_decref(root);
                return errf(err, "out of memory"), NULL;
            }
        }
        json_t *v = get_key(j, &keys[i], err);
        if (!v) {
            json_decref(root);
            return NULL;
        }
        if (json_object_set_new(section, keys[i].name, v)) {
            json_decref(root);
            return errf(err, "out of memory"), NULL;
        }
    }
    return root;
}

int job_from_object(job_config *j, const json_t *root, errbuf *err) {
    job_defaults(j);
    return apply_object(j, root, true, err) ? errprefix(err, "CONFIG") : 0;
}

/* The keys that may differ from node to node: where a node listens and writes its own files. */
static const char *const node_own_keys[] = {"bind_addr", "status_socket", "metrics"};

json_t *job_shared_settings(const job_config *j, const json_t *model_config, errbuf *err) {
    json_t *root = job_to_object(j, err);
    if (!root) return NULL;
    json_t *runtime = json_object_get(root, "runtime");
    for (size_t i = 0; i < COUNT(node_own_keys); i++) json_object_del(runtime, node_own_keys[i]);
    json_t *model = model_config ? json_deep_copy(model_config) : json_null();
    if (!model || json_object_set_new(root, "model_config", model)) {
        json_decref(root);
        return errf(err, "out of memory"), NULL;
    }
    return root;
}

static void value_text(const json_t *v, char *out, size_t n) {
    char *text = v ? json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT | JSON_REAL_PRECISION(12)) : NULL;
    snprintf(out, n, "%s", v ? (text ? text : "(unprintable)") : "(absent)");
    free(text);
}

static int cmp_keys(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* The members of a and b (either may be NULL) as one sorted list without repeats, malloc'd. */
static const char **union_keys(const json_t *a, const json_t *b, size_t *n) {
    size_t cap = json_object_size(a) + json_object_size(b), k = 0;
    const char **keys = malloc((cap ? cap : 1) * sizeof *keys);
    const char *key;
    json_t *v;
    if (!keys) return NULL;
    json_object_foreach((json_t *)a, key, v) keys[k++] = key;
    json_object_foreach((json_t *)b, key, v) if (!json_object_get(a, key)) keys[k++] = key;
    qsort(keys, k, sizeof *keys, cmp_keys);
    *n = k;
    return keys;
}

static int diff_at(const json_t *a, const json_t *b, const char *prefix, job_difference *out) {
    if (json_is_object(a) && json_is_object(b)) {
        size_t n;
        const char **keys = union_keys(a, b, &n);
        int found = keys ? 0 : -1;
        for (size_t i = 0; keys && i < n && !found; i++) {
            char key[sizeof out->key];
            snprintf(key, sizeof key, "%s%s%s", prefix, *prefix ? "." : "", keys[i]);
            found = diff_at(json_object_get(a, keys[i]), json_object_get(b, keys[i]), key, out);
        }
        free(keys);
        if (found >= 0) return found;
    } else if (a && b && json_equal((json_t *)a, (json_t *)b)) {
        return 0;
    }
    snprintf(out->key, sizeof out->key, "%s", *prefix ? prefix : "(the whole job)");
    value_text(a, out->a, sizeof out->a);
    value_text(b, out->b, sizeof out->b);
    return 1;
}

int job_settings_diff(const json_t *a, const json_t *b, job_difference *out) { return diff_at(a, b, "", out); }

