/* job: the job file (what to train, on what, how) and its command-line overrides.
 *
 * A job file is a JSON object with up to eight sections: model, data, train, lora, fsdp,
 * checkpoint, output, runtime.  Every key has a default (configs/jobs/README.md lists them
 * all); an unknown section or key, a wrong JSON type, a value out of range or an unknown
 * choice is an error naming the key as "section.key".  A value whose feature is not built
 * yet is rejected ("fsdp.sharding: 'shard_grad_op' with adapters is not built yet"), never
 * ignored.
 *
 * How the daemon uses it:
 *   job_load(&j, path)                      file over the defaults
 *   job_args_apply (proto/job_flags.h)     the command line: overrides and other tools' flags
 *   job_resolve_runtime(&j, gpus_on_node)   backend, model dtype, workers per node
 *   job_resolve(&j, world_size)             fills the derived fields
 *   job_validate(&j, world_size)            checks (changes nothing)
 *   job_to_object(&j)                       sent to each worker inside CONFIG (proto/msg.h),
 *                                           which reads it back with job_from_object.
 *
 * job_config is a plain struct (strings are fixed arrays), so it can be copied by value. */
#ifndef FSDP_JOB_H
#define FSDP_JOB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "base/errbuf.h"
#include "base/path.h"
#include "lora_layout.h"

#define JOB_PATH_MAX PATH_BYTES
#define JOB_SOCKET_PATH_MAX 108 /* sizeof(sockaddr_un.sun_path), terminating NUL included */
#define JOB_NAME_MAX 32
#define JOB_HOST_MAX 256
#define JOB_MAX_TARGETS 16
#define JOB_FILE_MAX (1u << 20) /* job_load refuses larger files */
#define JOB_MAX_RECORD_BYTES (64ll << 20) /* data.max_record_bytes' default */
#define JOB_URI_MAX 512

/* runtime.log_to's destinations, a bit each (the job file names them: "stdout" (or "tqdm"),
 * "tensorboard", "mlflow"). */
enum { JOB_LOG_STDOUT = 1u << 0, JOB_LOG_TENSORBOARD = 1u << 1, JOB_LOG_MLFLOW = 1u << 2 };

typedef enum job_init { JOB_INIT_PRETRAINED, JOB_INIT_RANDOM } job_init;
typedef enum job_dtype { JOB_DTYPE_AUTO, JOB_DTYPE_F32, JOB_DTYPE_BF16 } job_dtype;
typedef enum job_data_format {
    JOB_DATA_TOKENS, JOB_DATA_ALPACA, JOB_DATA_CHAT, JOB_DATA_TEXT,
    JOB_DATA_AUTO, /* chosen from the file's content by the daemon (data_prepare) */
    JOB_DATA_PREFERENCE /* {prompt, chosen, rejected} pairs (train.objective dpo, orpo) */
} job_data_format;

/* data.truncation_mode (data.format preference): TRL's DPOConfig.truncation_mode. */
typedef enum job_truncation_mode { JOB_TRUNC_KEEP_START, JOB_TRUNC_KEEP_END } job_truncation_mode;
typedef enum job_bad_record { JOB_BAD_RECORD_FAIL, JOB_BAD_RECORD_SKIP } job_bad_record;
typedef enum job_train_type { JOB_TRAIN_FULL, JOB_TRAIN_LORA, JOB_TRAIN_QLORA } job_train_type;
typedef enum job_schedule {
    JOB_SCHEDULE_CONSTANT, JOB_SCHEDULE_LINEAR, JOB_SCHEDULE_COSINE
} job_schedule;
typedef enum job_sharding {
    JOB_SHARD_FULL, JOB_SHARD_GRAD_OP, JOB_SHARD_NONE, JOB_SHARD_HYBRID
} job_sharding;
typedef enum job_act_ckpt {
    JOB_ACT_CKPT_NONE, JOB_ACT_CKPT_FULL, JOB_ACT_CKPT_SELECTIVE, JOB_ACT_CKPT_AUTO
} job_act_ckpt;
typedef enum job_resume {
    JOB_RESUME_AUTO, JOB_RESUME_NEVER, JOB_RESUME_LATEST, JOB_RESUME_STEP,
    JOB_RESUME_FORCE /* latest, even a checkpoint of another job (every difference logged) */
} job_resume;
typedef enum job_backend { JOB_BACKEND_AUTO, JOB_BACKEND_CPU, JOB_BACKEND_CUDA } job_backend;
/* SIGUSR1: auto = requeue under SLURM (its time-limit warning), checkpoint elsewhere. */
typedef enum job_on_usr1 { JOB_USR1_AUTO, JOB_USR1_CHECKPOINT, JOB_USR1_REQUEUE } job_on_usr1;
typedef enum job_preflight { JOB_PREFLIGHT_AUTO, JOB_PREFLIGHT_ON, JOB_PREFLIGHT_OFF } job_preflight;
typedef enum job_round { JOB_ROUND_UP, JOB_ROUND_DOWN } job_round;
/* train.precision (F45): the decoder linears' GEMMs in bf16 (today's) or FP8, and FP8's
 * scaling (kernels' k_fp8_cast): one scale a tensor or one a row.  fp8: full fine-tunes, SFT. */
typedef enum job_precision { JOB_PRECISION_BF16, JOB_PRECISION_FP8 } job_precision;
typedef enum job_fp8_scaling { JOB_FP8_TENSORWISE, JOB_FP8_ROWWISE } job_fp8_scaling;
typedef enum job_fp8_format { JOB_FP8_E4M3, JOB_FP8_E5M2 } job_fp8_format;

/* train.objective (worker/fsdp_pref.h): supervised, or preference pairs; train.dpo_loss. */
typedef enum job_objective { JOB_OBJECTIVE_SFT, JOB_OBJECTIVE_DPO, JOB_OBJECTIVE_ORPO } job_objective;
typedef enum job_dpo_loss { JOB_DPO_SIGMOID, JOB_DPO_ROBUST, JOB_DPO_IPO } job_dpo_loss;
/* train.defaults: whose defaults the keys a job does not give take (job_apply_profile). */
typedef enum job_profile { JOB_PROFILE_FSDPD, JOB_PROFILE_FSDP_QLORA, JOB_PROFILE_TRAINER } job_profile;

#define JOB_KEYS_MAX 128 /* room in job_config.given; proto/job.c asserts the table fits */

typedef struct job_config {
    struct {
        char path[JOB_PATH_MAX];   /* Hugging Face model directory */
        job_init init;             /* "" (load model.path) or "random" */
        char config[JOB_PATH_MAX]; /* config.json for init "random" */
        job_dtype dtype;           /* parameter storage; auto: f32 on cpu, bf16 on cuda */
    } model;
    struct {
        char path[JOB_PATH_MAX];
        job_data_format format;
        char template_name[JOB_NAME_MAX]; /* key "template" */
        char text_field[JOB_NAME_MAX];    /* data.format text: the record's field ("text") */
        int seq_len;
        bool shuffle;              /* false: records in file order */
        bool packing;
        double eval_fraction;      /* held out for evaluation, chosen by sample index */
        job_bad_record on_bad_record;
        bool truncate;             /* cut samples longer than seq_len (false: a bad record) */
        job_truncation_mode truncation_mode; /* preference: which end of a long side is kept */
        int64_t max_record_bytes;  /* a longer JSONL line is a bad record (its memory is bounded) */
    } data;
    struct {
        job_profile defaults; /* key "defaults" */
        job_train_type type;
        int global_batch; /* sequences per optimizer step, whole job */
        int micro_batch;  /* sequences per forward/backward, per rank */
        int accumulation; /* micro-batches a rank accumulates a step; 0: from global_batch */
        int max_steps;    /* 0: run train.epochs epochs */
        int eval_interval;   /* eval loss every N steps (0: at the end only), with data.eval_fraction */
        /* Samples during training: a JSONL of prompts ("" none), generated greedily every
         * sample_every steps (0: at each evaluation, else at the end) and after the last. */
        char sample_prompts[JOB_PATH_MAX];
        int sample_every;
        int sample_max_new_tokens;
        int epochs;
        double lr;
        job_schedule schedule;
        int warmup_steps;
        double warmup_ratio; /* with warmup_steps 0: ratio x total steps, rounded up (the
                              * Trainer's) or down (warmup_round, fsdp_qlora's int()) */
        job_round warmup_round;
        double min_lr;
        double weight_decay;
        double betas[2];
        double eps;
        double clip_norm; /* 0: no clipping */
        int64_t seed;
        /* Preference tuning (F49): the objective; DPO's beta, loss and label smoothing;
         * ORPO's lambda (TRL's ORPOConfig.beta).  global_batch and micro_batch count pairs. */
        job_objective objective;
        double dpo_beta;
        job_dpo_loss dpo_loss;
        double dpo_label_smoothing;
        double orpo_lambda;
        job_precision precision;     /* F45 */
        job_fp8_scaling fp8_scaling; /* with precision fp8 */
        bool fp8_all_gather;         /* with precision fp8: the FP8 layers gathered as e4m3 codes */
        job_fp8_format fp8_grad_format; /* with precision fp8: the output gradients' format */
        /* Not a job-file key: derived by job_resolve, global_batch / (micro_batch x world
         * size) (train.accumulation holds the same once resolved). */
        int grad_accum;
    } train;
    struct {
        int rank;
        double alpha;
        double dropout;
        int n_targets;
        char targets[JOB_MAX_TARGETS][JOB_NAME_MAX]; /* the file may say "all-linear" */
        bool rslora;                 /* scale alpha / sqrt(rank) */
        char init_from[JOB_PATH_MAX]; /* "": fresh adapters; else a PEFT adapter directory */
        /* Not a job-file key: derived by job_resolve, the one place it is (every reader
         * takes it from here): lora.* as proto/lora_layout.h takes them. */
        lora_config config;
    } lora;
    struct {
        job_sharding sharding;
        job_act_ckpt activation_checkpointing;
        bool cpu_offload;    /* master and AdamW state on the host, the step there */
        bool offload_params; /* parameter shards streamed from host memory at each use */
        /* the layer inputs full recompute keeps that do not fit the device's budget in
         * pinned host memory (model/memory_plan.h decides how many) */
        bool offload_activations;
        /* each layer's MLP this many tokens at a time (0: all at once), with its MLP
         * recomputed: the [tokens, intermediate] buffers become [mlp_chunk, intermediate] */
        int mlp_chunk;
        bool forward_prefetch;
        bool backward_prefetch;
    } fsdp;
    struct {
        char dir[JOB_PATH_MAX]; /* "": OUTPUT_DIR.checkpoints, beside output.dir (job_resolve) */
        int interval_steps; /* 0: only at the end */
        bool save_final;    /* save after the last step (synchronously) */
        int keep;
        bool async;
        int timeout_s;
        job_resume resume;
        int64_t resume_step; /* for JOB_RESUME_STEP ("step-N") */
        int max_failed_saves; /* consecutive failed saves that stop the job */
        /* In-memory checkpoints (daemon/memory_ckpt.h): every N steps at most (and never past
         * 1% of the time in the copy), 0 off; -1 auto, which job_resolve sets: 1 with
         * runtime.max_restarts or runtime.spare_nodes, else 0. */
        int memory_interval_steps;
    } checkpoint;
    struct {
        char dir[JOB_PATH_MAX];
        job_dtype dtype; /* bf16, f32 or auto: a model (and output.merge's) bf16, an adapter f32 */
        int64_t shard_size; /* bytes */
        bool consolidate;
        bool merge;         /* adapter jobs: also the merged model, in output.dir/merged */
    } output;
    struct {
        job_backend backend;
        int workers_per_node; /* 0: one per GPU, or 2 on the CPU backend */
        int heartbeat_s;
        int max_restarts;
        bool allow_shrink;    /* a restart goes on without the nodes a failure took away */
        int spare_nodes;      /* the last nodes of the allocation, joined but idle until one is needed */
        double straggler_factor; /* a rank this many times the median's own step time is slow (0: off) */
        int straggler_steps;     /* for this many steps in a row: a straggler, named */
        int stop_grace_s;
        job_on_usr1 on_usr1;
        char status_socket[JOB_SOCKET_PATH_MAX]; /* "": chosen by the daemon */
        char bind_addr[JOB_HOST_MAX]; /* this node's address for the other nodes; "": its name's */
        int join_timeout_s;           /* how long the nodes wait for each other */
        int node_timeout_s;           /* a node's daemon not heard from for this long is dead */
        char metrics[JOB_PATH_MAX];               /* "": output.dir/metrics.jsonl */
        int comm_timeout_s;
        int stall_timeout_s;      /* 0: job_stall_timeout_s's default */
    int log_every;            /* the step line every N steps (the last and eval steps always) */
        int64_t gpu_memory_limit; /* bytes of context memory per worker; 0: none */
        unsigned log_to;          /* JOB_LOG_* bits */
        char mlflow_uri[JOB_URI_MAX];        /* the tracking server, http:// or https:// */
        char mlflow_experiment[JOB_HOST_MAX]; /* its experiment's name */
        bool log_required;        /* an unreachable tracking server fails the job at start */
    } runtime;
    struct {
        bool require;          /* refuse to start when EFA is present but no NCCL plugin loads */
        job_preflight preflight; /* the network check at start; auto: on for several nodes */
        double min_busbw_gbps; /* the check's floor, GB/s of bus bandwidth (0: none) */
    } fabric;
    /* Not a key: which keys a job file or an override gave (bit i: the table's key i), so
     * that a value given is told from a default (job_key_given). */
    uint64_t given[JOB_KEYS_MAX / 64];
} job_config;

/* Rows a sample of train.global_batch / micro_batch is: 2 for a preference objective (a
 * pair: chosen and rejected), else 1. */
static inline int job_rows_per_sample(const job_config *j) {
    return j->train.objective == JOB_OBJECTIVE_SFT ? 1 : 2;
}

/* "full_shard", "shard_grad_op", "no_shard", "hybrid_shard" (the job file's), NULL for
 * another value. */
const char *job_sharding_name(job_sharding s);
/* "tokens", "alpaca", "chat", "text" (data.format's), NULL for another value. */
const char *job_data_format_name(job_data_format f);
/* "full", "lora", "qlora" (train.type's); "constant", "linear", "cosine" (train.schedule's);
 * NULL for another value. */
const char *job_train_type_name(job_train_type t);
const char *job_schedule_name(job_schedule s);
const char *job_objective_name(job_objective o);
const char *job_dpo_loss_name(job_dpo_loss l);

/* Sets every key to its default (the whole struct is zeroed first, so two configs built
 * the same way compare equal with memcmp). */
void job_defaults(job_config *j);

/* Reads a job file over the defaults; messages start with the path. */
int job_load(job_config *j, const char *path, errbuf *err);
/* The same over profile `profile`'s defaults (job_profile; -1: the one the file names in
 * train.defaults, else fsdpd's). */
int job_load_profile(job_config *j, const char *path, int profile, errbuf *err);
/* Parses job-file text over the defaults; `name` starts every message.  Per-key checks
 * (type, range, choices, not built yet) happen here; cross-field rules in job_validate.
 * A file's train.defaults is applied before its other keys. */
int job_parse_text(job_config *j, const char *json, size_t len, const char *name,
                   errbuf *err);

/* job_defaults, then profile p's (train.defaults): fsdpd's own, fsdp_qlora's train.py's,
 * or transformers' TrainingArguments' (configs/jobs/README.md lists them). */
void job_apply_profile(job_config *j, job_profile p);
/* "fsdpd", "fsdp_qlora", "trainer"; NULL for another value / -1 for an unknown name. */
const char *job_profile_name(job_profile p);
int job_profile_from_name(const char *name, job_profile *out);

/* Whether key "section.key" was given by the job file or an override (not a default). */
bool job_key_given(const job_config *j, const char *full);
/* Sets key "section.key" from command-line text (a number, a boolean word, a string, a
 * list as JSON or comma separated), as an override does; errors name the key. */
int job_set_text(job_config *j, const char *full, const char *text, errbuf *err);
/* JOB_KEY_BOOL or JOB_KEY_VALUE for key "section.key", -1 when there is none. */
enum { JOB_KEY_VALUE, JOB_KEY_BOOL };
int job_key_type(const char *full);
/* The key "section.key" closest to `word` (a typo of it, or its name alone), or NULL;
 * *distance: how far. */
const char *job_nearest_key(const char *word, int *distance);
/* The edit distance of word from candidate when it is close enough to be a typo of it
 * (about one edit per three characters), else INT_MAX. */
int job_typo_distance(const char *word, const char *candidate);
/* true/false, True/False, TRUE/FALSE, 1/0, yes/no into *out; -1 for another word. */
int job_parse_bool(const char *text, bool *out);

/* runtime.stall_timeout_s in effect: a rank whose training makes no progress (no step, no
 * evaluation batch, no sample reply) for this long is hung (a GPU kernel that does not finish:
 * one GPU has no collective to time out), and the job stops.  0 (the default): 300 s more than
 * the longest wait that is not a hang, max(runtime.comm_timeout_s, checkpoint.timeout_s). */
int job_stall_timeout_s(const job_config *j);

/* Warm-up steps of a run of total_steps optimizer steps: train.warmup_steps, or with it 0,
 * train.warmup_ratio x total_steps rounded as train.warmup_round says (up: transformers'
 * get_warmup_steps; down: fsdp_qlora's int()). */
int job_warmup_steps(const job_config *j, long long total_steps);

/* Resolves what depends on the machine: runtime.backend auto (cpu until the CUDA backend
 * is built), runtime.workers_per_node 0 (gpus_on_node on cuda, 2 on cpu) and model.dtype
 * auto (bf16 on cuda, f32 on cpu). */
int job_resolve_runtime(job_config *j, int gpus_on_node, errbuf *err);

/* Fills what a job of world_size ranks derives: train.global_batch from train.accumulation
 * when that was given (or the profile has one and global_batch was not given),
 * train.grad_accum (global_batch / (micro_batch x world_size), which must divide; also
 * written back to train.accumulation), an empty runtime.metrics
 * (output.dir/metrics.jsonl) and an empty checkpoint.dir (OUTPUT_DIR.checkpoints: beside the
 * output, never inside it, so two jobs with different outputs never share checkpoints) and
 * lora.config (the adapter settings as proto/lora_layout.h takes them).  Running it again
 * changes nothing but grad_accum and lora.config, which it recomputes (after a checkpoint's
 * global_batch, or for a job read back with job_from_object, which carries neither). */
int job_resolve(job_config *j, int world_size, errbuf *err);

/* Checks, changing nothing: every key again (a config may have been filled in by code), the
 * cross-field rules for a job of world_size ranks (global_batch divisible by micro_batch x
 * world_size, min_lr <= lr, model.path or init "random" with model.config, data.path set,
 * ...) and that job_resolve has filled the derived fields for this world size. */
int job_validate(const job_config *j, int world_size, errbuf *err);

/* The whole config (every key) as a JSON object (a new reference; NULL with the reason):
 * derived fields are not included, job_resolve recomputes them.  job_from_object reads it
 * back like job_parse_text, but every key must be present, so a daemon and a worker that
 * disagree on the keys fail loudly (the CONFIG message carries the job this way). */
json_t *job_to_object(const job_config *j, errbuf *err);
int job_from_object(job_config *j, const json_t *root, errbuf *err);

/* What every node of one job must agree on (the JOIN of daemon/cluster.h carries it):
 * job_to_object less the keys that are each node's own (runtime.bind_addr,
 * runtime.status_socket, runtime.metrics), with the model's config.json (model_config, may
 * be NULL) as the member "model_config".  A new reference, NULL with the reason. */
json_t *job_shared_settings(const job_config *j, const json_t *model_config, errbuf *err);

/* The first difference between two such objects, keys walked in sorted order and nested
 * objects entered ("train.lr", "model_config.hidden_size"): 1 with that key and both
 * values as compact JSON text ("(absent)" for a missing key), each cut to fit; 0 when equal. */
typedef struct job_difference {
    char key[128];
    char a[160], b[160];
} job_difference;
int job_settings_diff(const json_t *a, const json_t *b, job_difference *out);

#endif
