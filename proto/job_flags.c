/* job_flags: the command line, fsdpd's overrides and other tools' flags; see job_flags.h. */
#include "job_flags.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* Which tool a flag comes from: a line of one tool's flags takes that tool's defaults. */
enum { QLORA = 1, TRAINER = 2, BOTH = QLORA | TRAINER };

/* What a flag leaves for the rules that need the whole line (finish). */
typedef struct flag_state {
    job_notes *notes;
    bool batch;          /* --batch_size / --per_device_train_batch_size */
    int clip;            /* --apply_gradient_clipping: -1 not given, 0, 1 */
    double grad_norm;    /* --grad_norm; NAN: not given */
    int qlora_schedule;  /* --lr_scheduler (fsdp_qlora's): -1, or a job_schedule */
    bool trainer_constant; /* --lr_scheduler_type constant: no warm-up */
    bool eval_off;       /* --eval_strategy no */
} flag_state;

typedef struct flag flag;
typedef int (*flag_fn)(job_config *j, const flag *f, const char *value, flag_state *st, errbuf *err);
struct flag {
    const char *name;
    unsigned from;
    bool boolean;
    const char *key;  /* the job key its value sets, when that is all it does */
    flag_fn apply;    /* when it does more */
    const char *text; /* refuse: why and what to do; note: the note */
};

static void note(flag_state *st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(flag_state *st, const char *fmt, ...) {
    if (!st->notes || st->notes->n >= JOB_NOTES_MAX) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(st->notes->line[st->notes->n++], JOB_NOTE_BYTES, fmt, ap);
    va_end(ap);
}

static int bool_value(const flag *f, const char *value, bool *out, errbuf *err) {
    if (job_parse_bool(value ? value : "true", out))
        return errf(err, "--%s: '%s' is not a boolean (true, false, True, False, 1, 0, yes or no)", f->name, value);
    return 0;
}

static int set(job_config *j, const flag *f, const char *key, const char *text, errbuf *err) {
    return job_set_text(j, key, text, err) ? errprefix(err, "--%s", f->name) : 0;
}

/* ---- the flags' own rules ---- */

static int refuse(job_config *j, const flag *f, const char *value, flag_state *st, errbuf *err) {
    (void)j, (void)value, (void)st;
    return errf(err, "--%s: %s", f->name, f->text);
}

static int accept_with_note(job_config *j, const flag *f, const char *value, flag_state *st, errbuf *err) {
    (void)j, (void)err;
    note(st, "--%s %s: %s", f->name, value ? value : "true", f->text);
    return 0;
}

/* A boolean flag whose true is not built yet (false is what fsdpd does). */
static int refuse_true(job_config *j, const flag *f, const char *value, flag_state *st, errbuf *err) {
    (void)j, (void)st;
    bool on;
    if (bool_value(f, value, &on, err)) return -1;
    return on ? errf(err, "--%s true: %s", f->name, f->text) : 0;
}

static int train_type(job_config *j, const flag *f, const char *value, flag_state *st, errbuf *err) {
    (void)st;
    if (!strcmp(value, "custom_qlora"))
        return errf(err, "--train_type custom_qlora: use qlora: the same NF4 + LoRA (fsdp_qlora's custom_qlora "
                         "is its own LoRA layer around the same 4-bit weights)");
    if (!strcmp(value, "custom_lora"))
        return errf(err, "--train_type custom_lora: use lora: the same LoRA (fsdp_qlora's own layer)");
    static const char *const later[] = {"hqq_lora", "hqq_dora", "bnb_dora", "bnb_llama_pro", "hqq_llama_pro", "hf_qlora"};
    for (size_t i = 0; i < COUNT(later); i++)
        if (!strcmp(value, later[i]))
            return errf(err, "--train_type %s: not built yet (fsdpd trains full, lora and qlora: NF4 weights "
                             "with LoRA, as bitsandbytes stores them)", value);
    return set(j, f, "train.type", value, err);
}

static int accumulation(job_config *j, const flag *f, const char *value, flag_state *st, errbuf *err) {
    (void)st;
    char *end;
    errno = 0;
    long x = strtol(value, &end, 10);
    if (errno || *end || end == value || x < 1)
        return errf(err, "--%s: '%s' is not a positive integer", f->name, value);
    return set(j, f, "train.accumulation", value, err);
}

static int batch(job_config *j, const flag *f, const char *value, flag_state *st, errbuf *err) {
    st->batch = true;
    return set(j, f, "train.micro_batch", value, err);
}

/* A Hugging Face hub id ("owner/name", which the other tools download) and no path here:
 * one slash, no such file, no such directory as its owner part, and for data no file
 * extension of a data file.  fsdpd reads local files. */
static bool hub_id(const char *s, bool data) {
    const char *slash = strchr(s, '/');
    if (!slash || slash == s || strchr(slash + 1, '/') || !slash[1] || strchr(".~", s[0])) return false;
    for (const char *p = s; *p; p++)
        if (!isalnum((unsigned char)*p) && !strchr("-_./", *p)) return false;
    static const char *const extensions[] = {".jsonl", ".json", ".tokens", ".txt"};
    for (size_t i = 0; data && i < COUNT(extensions); i++) {
        size_t n = strlen(s), e = strlen(extensions[i]);
        if (n > e && !strcmp(s + n - e, extensions[i])) return false;
    }
    char owner[JOB_PATH_MAX];
    snprintf(owner, sizeof owner, "%.*s", (int)(slash - s), s);
    return access(s, F_OK) != 0 && access(owner, F_OK) != 0;
}

static int dataset(job_config *j, const flag *f, const char *value, flag_state *st, errbuf *err) {
    (void)st;
    static const char *const names[] = {"alpaca", "alpaca_sample", "dummy", "guanaco", "sql", "orca_math", "chat"};
    for (size_t d = 0; d < COUNT(names); d++)
        if (!strcmp(value, names[d]) && access(value, F_OK) != 0)
            return errf(err, "--%s: '%s' is a data set name of fsdp_qlora's, which downloads it; fsdpd trains "
                             "on a file: give its path (JSONL records, or a token cache: configs/jobs/README.md)",
                        f->name, value);
    if (hub_id(value, true))
        return errf(err, "--%s: '%s' looks like a Hugging Face hub id and is no file here; fsdpd reads local "
                         "files (compute nodes have no network): download it first (huggingface-cli download "
                         "%s --repo-type dataset --local-dir DIR) and give --%s DIR/FILE.jsonl",
                    f->name, value, value, f->name);
    if (set(j, f, "data.path", value, err)) return -1;
    /* The other tools read their data sets by their fields: so does fsdpd, unless told. */
    if (!job_key_given(j, "data.format")) j->data.format = JOB_DATA_AUTO;
    return 0;
}

static int model_name(job_config *j, const flag *f, const char *value, flag_state *st, errbuf *err) {
    (void)st;
    if (hub_id(value, false))
        return errf(err, "--%s: '%s' looks like a Hugging Face hub id and is no directory here; fsdpd loads "
                         "local model directories (compute nodes have no network): download it first "
                         "(huggingface-cli download %s --local-dir DIR) and give --%s DIR",
                    f->name, value, value, f->name);
    return set(j, f, "model.path", value, err);
}

static int checkpointing(job_config *j, const flag *f, const char *value, flag_state *st, errbuf *err) {
    (void)st;
    bool on;
    if (bool_value(f, value, &on, err)) return -1;
    return set(j, f, "fsdp.activation_checkpointing", on ? "full" : "none", err);
}

/* fsdp_qlora's flag is torch's CPUOffload(offload_params=True): the parameters too. */
static int cpu_offload(job_config *j, const flag *f, const char *value, flag_state *st, errbuf *err) {
    (void)st;
    bool on;
    if (bool_value(f, value, &on, err)) return -1;
    const char *v = on ? "true" : "false";
    return set(j, f, "fsdp.cpu_offload", v, err) || set(j, f, "fsdp.offload_params", v, err) ? -1 : 0;
}

static int targets(job_config *j, const flag *f, const char *value, flag_state *st, errbuf *err) {
    (void)st;
    /* fsdp_qlora's names: all = every linear but o_proj, default = PEFT's Llama default. */
    if (!strcmp(value, "all")) value = "k_proj,q_proj,v_proj,up_proj,down_proj,gate_proj";
    else if (!strcmp(value, "default")) value = "q_proj,v_proj";
    return set(j, f, "lora.targets", value, err);
}

/* fsdp_qlora's --precision (its README writes mp_bf16 and so on).  fsdpd keeps fp32 master
 * weights and AdamW state always and computes the matrix products in bf16 on GPUs (fp32 on
 * the CPU backend). */
static int precision(job_config *j, const flag *f, const char *value, flag_state *st, errbuf *err) {
    (void)j;
    const char *p = strncmp(value, "mp_", 3) == 0 ? value + 3 : value;
    if (!strcmp(p, "bf16") || !strcmp(p, "bf16_autocast") || !strcmp(p, "bf16_buffers_autocast")) {
        note(st, "--precision %s: fsdpd computes in bf16 on GPUs (fp32 on the CPU backend) with fp32 master weights, "
                 "gradients reduced in fp32 and fp32 AdamW state%s", value,
             !strcmp(p, "bf16") ? " (fsdp_qlora's bf16 keeps the weights and AdamW state in bf16: fsdpd's update is "
                                  "the more exact one)" : "");
        return 0;
    }
    if (!strcmp(p, "fp32"))
        return errf(err, "--precision %s: not built yet: fsdpd computes in bf16 on GPUs (fp32 only on the CPU "
                         "backend); use bf16", value);
    if (!strcmp(p, "fp16_autocast") || !strcmp(p, "fp16"))
        return errf(err, "--precision %s: not built yet: fp16 needs loss scaling, which fsdpd does not have; use "
                         "bf16 (the same speed on the GPUs fsdpd runs on)", value);
    return errf(err, "--%s: '%s' is none of fp32, bf16, fp16_autocast, bf16_autocast, bf16_buffers_autocast",
                f->name, value);
}

static int save_model(job_config *j, const flag *f, const char *value, flag_state *st, errbuf *err) {
    bool on;
    if (bool_value(f, value, &on, err)) return -1;
    if (!on)
        note(st, "--save_model false: no model is written to output.dir (output.consolidate false); the last "
                 "checkpoint is still saved, in checkpoint.dir");
    return set(j, f, "output.consolidate", on ? "true" : "false", err);
}

static int apply_clipping(job_config *j, const flag *f, const char *value, flag_state *st, errbuf *err) {
    (void)j;
    bool on;
    if (bool_value(f, value, &on, err)) return -1;
    st->clip = on;
    return 0;
}

static int grad_norm(job_config *j, const flag *f, const char *value, flag_state *st, errbuf *err) {
    (void)j;
    char *end;
    errno = 0;
    double x = strtod(value, &end);
    if (errno || *end || end == value || !(x > 0) || !isfinite(x))
        return errf(err, "--%s: '%s' is not a positive number", f->name, value);
    st->grad_norm = x;
    return 0;
}

/* fsdp_qlora's optimizers: its adamw is torch's AdamW with betas (0.9, 0.95), eps 1e-5. */
static int optimizer(job_config *j, const flag *f, const char *value, flag_state *st, errbuf *err) {
    (void)st;
    if (!strcmp(value, "adamw") || !strcmp(value, "fused_adamw"))
        return set(j, f, "train.betas", "0.9,0.95", err) || set(j, f, "train.eps", "1e-5", err) ? -1 : 0;
    return errf(err, "--optimizer %s: not built yet: fsdpd trains with AdamW (--optimizer adamw)", value);
}

/* HF's optimizers: adamw_torch and its fused form are torch's AdamW, which fsdpd computes. */
static int optim(job_config *j, const flag *f, const char *value, flag_state *st, errbuf *err) {
    (void)j, (void)f, (void)st;
    if (!strcmp(value, "adamw_torch") || !strcmp(value, "adamw_torch_fused") || !strcmp(value, "adamw_hf"))
        return 0;
    return errf(err, "--optim %s: not built yet: fsdpd trains with torch's AdamW (--optim adamw_torch, "
                     "--adam_beta1/2, --adam_epsilon)", value);
}

static int qlora_schedule(job_config *j, const flag *f, const char *value, flag_state *st, errbuf *err) {
    static const char *const names[] = {[JOB_SCHEDULE_CONSTANT] = "constant", [JOB_SCHEDULE_LINEAR] = "linear",
                                        [JOB_SCHEDULE_COSINE] = "cosine"};
    for (size_t i = 0; i < COUNT(names); i++)
        if (!strcmp(value, names[i])) {
            st->qlora_schedule = (int)i;
            return set(j, f, "train.schedule", value, err);
        }
    return errf(err, "--lr_scheduler: '%s' is none of constant, linear, cosine (fsdp_qlora's)", value);
}

/* transformers' get_scheduler: constant has no warm-up, constant_with_warmup is fsdpd's
 * constant with train.warmup_*. */
static int trainer_schedule(job_config *j, const flag *f, const char *value, flag_state *st, errbuf *err) {
    if (!strcmp(value, "constant")) st->trainer_constant = true;
    else st->trainer_constant = false;
    if (!strcmp(value, "constant") || !strcmp(value, "constant_with_warmup"))
        return set(j, f, "train.schedule", "constant", err);
    if (!strcmp(value, "linear") || !strcmp(value, "cosine")) return set(j, f, "train.schedule", value, err);
    return errf(err, "--lr_scheduler_type %s: not built yet (fsdpd has linear, cosine, constant and "
                     "constant_with_warmup)", value);
}

static int epochs(job_config *j, const flag *f, const char *value, flag_state *st, errbuf *err) {
    (void)st;
    char *end;
    errno = 0;
    double x = strtod(value, &end);
    if (errno || *end || end == value || !isfinite(x) || x < 1 || x > INT_MAX)
        return errf(err, "--%s: '%s' is not a number of epochs (>= 1)", f->name, value);
    if (x != floor(x))
        return errf(err, "--%s %s: a fraction of an epoch is not built yet: give whole epochs, or --max_steps",
                    f->name, value);
    char whole[32];
    snprintf(whole, sizeof whole, "%.0f", x);
    return set(j, f, "train.epochs", whole, err);
}

static int beta(job_config *j, const flag *f, const char *value, flag_state *st, errbuf *err) {
    (void)st;
    char pair[96];
    if (f->name[strlen(f->name) - 1] == '1') snprintf(pair, sizeof pair, "%s,%.17g", value, j->train.betas[1]);
    else snprintf(pair, sizeof pair, "%.17g,%s", j->train.betas[0], value);
    return set(j, f, "train.betas", pair, err);
}

static int strategy(const flag *f, const char *value, errbuf *err) {
    if (!strcmp(value, "steps") || !strcmp(value, "no")) return 0;
    if (!strcmp(value, "epoch"))
        return errf(err, "--%s epoch: not built yet: fsdpd counts in steps (--%s steps with the --*_steps flag)",
                    f->name, f->name);
    return errf(err, "--%s: '%s' is none of no, steps, epoch", f->name, value);
}

static int eval_strategy(job_config *j, const flag *f, const char *value, flag_state *st, errbuf *err) {
    (void)j;
    if (strategy(f, value, err)) return -1;
    st->eval_off = !strcmp(value, "no");
    return 0;
}

static int save_strategy(job_config *j, const flag *f, const char *value, flag_state *st, errbuf *err) {
    if (strategy(f, value, err)) return -1;
    if (strcmp(value, "no")) return 0;
    note(st, "--save_strategy no: no checkpoints during training; the last one is still saved (the output is "
             "made from it)");
    return set(j, f, "checkpoint.interval_steps", "0", err);
}

static int logging_strategy(job_config *j, const flag *f, const char *value, flag_state *st, errbuf *err) {
    (void)j, (void)st;
    if (strategy(f, value, err)) return -1;
    if (!strcmp(value, "no"))
        return errf(err, "--logging_strategy no: fsdpd always logs its steps and writes metrics.jsonl; "
                         "--logging_steps N thins the step lines");
    return 0;
}

/* true: the latest checkpoint; false: none; a path: fsdpd's step-N directory in its
 * checkpoint.dir (a Trainer's checkpoint-N holds torch state fsdpd cannot read). */
static int resume(job_config *j, const flag *f, const char *value, flag_state *st, errbuf *err) {
    (void)st;
    bool on;
    if (!job_parse_bool(value, &on)) return set(j, f, "checkpoint.resume", on ? "latest" : "never", err);
    const char *slash = strrchr(value, '/');
    const char *base = slash ? slash + 1 : value;
    char dir[JOB_PATH_MAX];
    int n = snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - value) : 1, slash ? value : ".");
    if (strncmp(base, "step-", 5) || n < 0 || (size_t)n >= sizeof dir || access(value, F_OK) != 0)
        return errf(err, "--%s: '%s' is not an fsdpd checkpoint (CHECKPOINT_DIR/step-N); fsdpd resumes its own "
                         "checkpoints, not a Trainer's checkpoint-N (true: the latest in checkpoint.dir)",
                    f->name, value);
    return set(j, f, "checkpoint.dir", dir, err) || set(j, f, "checkpoint.resume", base, err) ? -1 : 0;
}

/* fsdp_qlora's --log_to and the Trainer's --report_to: runtime.log_to (its wandb refusal
 * says how to get there through TensorBoard). */
static int logging_to(job_config *j, const flag *f, const char *value, flag_state *st, errbuf *err) {
    if (!strcmp(value, "all"))
        return errf(err, "--%s all: name the destinations (tensorboard, mlflow, stdout or none): fsdpd has no "
                         "list of installed integrations to take", f->name);
    if (!strcmp(value, "tqdm") || !strcmp(value, "stdout"))
        note(st, "--%s %s: fsdpd's step lines (and metrics.jsonl, always written)", f->name, value);
    return set(j, f, "runtime.log_to", value, err);
}

static int bf16(job_config *j, const flag *f, const char *value, flag_state *st, errbuf *err) {
    (void)j;
    bool on;
    if (bool_value(f, value, &on, err)) return -1;
    if (!on)
        return errf(err, "--bf16 false: not built yet: fsdpd computes in bf16 on GPUs (fp32 only on the CPU backend)");
    note(st, "--bf16 true: fsdpd computes in bf16 on GPUs (fp32 on the CPU backend), with fp32 master weights and "
             "AdamW state, as the Trainer's bf16 mixed precision does");
    return 0;
}

static int push_to_hub(job_config *j, const flag *f, const char *value, flag_state *st, errbuf *err) {
    (void)j, (void)st;
    bool on;
    if (bool_value(f, value, &on, err)) return -1;
    if (!on) return 0;
    return errf(err, "--push_to_hub: fsdpd does not upload (compute nodes usually have no network): after the job, "
                     "upload the output from a login node: huggingface-cli upload REPO_ID OUTPUT_DIR");
}

static const flag flags[] = {
    /* fsdp_qlora's train.py */
    {"train_type", QLORA, false, NULL, train_type, NULL},
    {"batch_size", QLORA, false, NULL, batch, NULL},
    {"context_length", QLORA, false, "data.seq_len", NULL, NULL},
    {"num_epochs", QLORA, false, "train.epochs", NULL, NULL},
    {"dataset", QLORA, false, NULL, dataset, NULL},
    {"precision", QLORA, false, NULL, precision, NULL},
    {"use_cpu_offload", QLORA, true, NULL, cpu_offload, NULL},
    {"use_activation_cpu_offload", QLORA, true, "fsdp.offload_activations", NULL, NULL},
    {"reentrant_checkpointing", QLORA, true, NULL, accept_with_note,
     "no meaning in fsdpd: it has no autograd to re-enter; what is recomputed is fsdp.activation_checkpointing "
     "(--use_gradient_checkpointing)"},
    {"save_model", QLORA, true, NULL, save_model, NULL},
    {"lora_rank", QLORA, false, "lora.rank", NULL, NULL},
    {"lora_alpha", QLORA, false, "lora.alpha", NULL, NULL},
    {"lora_dropout", QLORA, false, "lora.dropout", NULL, NULL},
    {"lora_target_modules", QLORA, false, NULL, targets, NULL},
    {"lr", QLORA, false, "train.lr", NULL, NULL},
    {"lr_scheduler", QLORA, false, NULL, qlora_schedule, NULL},
    {"apply_gradient_clipping", QLORA, true, NULL, apply_clipping, NULL},
    {"grad_norm", QLORA, false, NULL, grad_norm, NULL},
    {"wd", QLORA, false, "train.weight_decay", NULL, NULL},
    {"optimizer", QLORA, false, NULL, optimizer, NULL},
    {"log_to", QLORA, false, NULL, logging_to, NULL},
    {"verbose", QLORA, true, NULL, accept_with_note,
     "fsdpd's log already says what it decided (the resolved job at the start); there is no more verbose level"},
    {"profile", QLORA, true, NULL, refuse_true,
     "not built yet in the job; bench/step_profile.sh profiles fsdpd's steps with Nsight Systems"},
    {"world_size", QLORA, false, NULL, refuse,
     "fsdpd runs one worker per GPU on every node SLURM gives the job (or on this machine): drop it; "
     "--runtime.workers_per_node N uses N GPUs a node"},
    {"master_port", QLORA, false, NULL, refuse,
     "fsdpd's nodes find each other through SLURM (PMIx or its rendezvous file) and choose their ports: drop it"},
    {"master_addr", QLORA, false, NULL, refuse,
     "fsdpd's nodes find each other through SLURM (PMIx or its rendezvous file): drop it; "
     "--runtime.bind_addr chooses this node's address"},
    /* transformers' TrainingArguments and TRL's SFTConfig */
    {"per_device_train_batch_size", TRAINER, false, NULL, batch, NULL},
    {"per_device_eval_batch_size", TRAINER, false, NULL, accept_with_note,
     "fsdpd evaluates at the training micro-batch; the eval loss (a mean over every held-out token) does not "
     "depend on it"},
    {"learning_rate", TRAINER, false, "train.lr", NULL, NULL},
    {"lr_scheduler_type", TRAINER, false, NULL, trainer_schedule, NULL},
    {"warmup_ratio", TRAINER, false, "train.warmup_ratio", NULL, NULL},
    {"warmup_steps", TRAINER, false, "train.warmup_steps", NULL, NULL},
    {"weight_decay", TRAINER, false, "train.weight_decay", NULL, NULL},
    {"max_grad_norm", TRAINER, false, "train.clip_norm", NULL, NULL},
    {"num_train_epochs", TRAINER, false, NULL, epochs, NULL},
    {"max_seq_len", TRAINER, false, "data.seq_len", NULL, NULL},
    {"max_seq_length", TRAINER, false, "data.seq_len", NULL, NULL},
    {"packing", TRAINER, true, "data.packing", NULL, NULL},
    {"bf16", TRAINER, true, NULL, bf16, NULL},
    {"dataset_text_field", TRAINER, false, "data.text_field", NULL, NULL},
    {"dataset_name", TRAINER, false, NULL, dataset, NULL},
    {"eval_steps", TRAINER, false, "train.eval_interval", NULL, NULL},
    {"eval_strategy", TRAINER, false, NULL, eval_strategy, NULL},
    {"evaluation_strategy", TRAINER, false, NULL, eval_strategy, NULL},
    {"save_steps", TRAINER, false, "checkpoint.interval_steps", NULL, NULL},
    {"save_total_limit", TRAINER, false, "checkpoint.keep", NULL, NULL},
    {"save_strategy", TRAINER, false, NULL, save_strategy, NULL},
    {"logging_strategy", TRAINER, false, NULL, logging_strategy, NULL},
    {"resume_from_checkpoint", TRAINER, false, NULL, resume, NULL},
    {"report_to", TRAINER, false, NULL, logging_to, NULL},
    {"gradient_checkpointing", TRAINER, true, NULL, checkpointing, NULL},
    {"use_flash_attn", TRAINER, true, NULL, accept_with_note,
     "fsdpd's attention is always its fused (flash) kernel; the same math either way"},
    {"optim", TRAINER, false, NULL, optim, NULL},
    {"adam_beta1", TRAINER, false, NULL, beta, NULL},
    {"adam_beta2", TRAINER, false, NULL, beta, NULL},
    {"adam_epsilon", TRAINER, false, "train.eps", NULL, NULL},
    {"push_to_hub", TRAINER, true, NULL, push_to_hub, NULL},
    /* both tools' */
    {"model_name", BOTH, false, NULL, model_name, NULL},
    {"gradient_accumulation_steps", BOTH, false, NULL, accumulation, NULL},
    {"max_steps", BOTH, false, "train.max_steps", NULL, NULL},
    {"output_dir", BOTH, false, "output.dir", NULL, NULL},
    {"seed", BOTH, false, "train.seed", NULL, NULL},
    {"logging_steps", BOTH, false, "runtime.log_every", NULL, NULL},
    {"use_gradient_checkpointing", BOTH, true, NULL, checkpointing, NULL},
};

static const flag *find_flag(const char *name) {
    for (size_t i = 0; i < COUNT(flags); i++)
        if (!strcmp(flags[i].name, name)) return &flags[i];
    return NULL;
}

static int unknown_flag(const char *name, errbuf *err) {
    if (strchr(name, '.')) {
        errbuf key_err;
        job_config scratch;
        job_defaults(&scratch);
        job_set_text(&scratch, name, "", &key_err); /* names the section or key that is wrong */
        return errf(err, "%s", key_err.msg);
    }
    const char *best = NULL;
    int best_d = INT_MAX;
    for (size_t i = 0; i < COUNT(flags); i++) {
        int d = job_typo_distance(name, flags[i].name);
        if (d < best_d) best = flags[i].name, best_d = d;
    }
    int key_d;
    const char *key = job_nearest_key(name, &key_d);
    if (key && key_d < best_d) best = key;
    if (best) return errf(err, "--%s: unknown option (did you mean --%s?)", name, best);
    return errf(err, "--%s: unknown option (overrides look like --section.key=value; configs/jobs/README.md "
                     "lists the flags of fsdp_qlora and the Trainer fsdpd takes)", name);
}

/* Whether flag `name` is a boolean, which may stand bare; -1 when there is no such flag. */
static int flag_kind(const char *name) {
    if (!strcmp(name, "job") || !strcmp(name, "defaults")) return 0;
    const flag *f = find_flag(name);
    if (f) return f->boolean;
    int t = job_key_type(name);
    return t < 0 ? -1 : t == JOB_KEY_BOOL;
}

int job_args_parse(int argc, char **argv, job_args *a, errbuf *err) {
    memset(a, 0, sizeof *a);
    for (int i = 1; i < argc; i++) {
        const char *w = argv[i];
        if (!strcmp(w, "-h") || !strcmp(w, "--help")) {
            a->help = true;
            continue;
        }
        if (strncmp(w, "--", 2) != 0 || !w[2])
            return errf(err, "'%s': unexpected argument (flags look like --name value or --name=value)", w);
        const char *eq = strchr(w, '='), *value = NULL, *name = w + 2;
        if (a->n >= JOB_ARGS_MAX) return errf(err, "more than %d flags", JOB_ARGS_MAX);
        if (eq) {
            size_t n = (size_t)(eq - name);
            if (n == 0 || n >= sizeof a->names[0]) return errf(err, "'%s': no flag name before '=' (or a long one)", w);
            memcpy(a->names[a->n], name, n);
            a->names[a->n][n] = '\0';
            name = a->names[a->n];
            value = eq + 1;
        }
        int kind = flag_kind(name);
        if (kind < 0) return unknown_flag(name, err);
        if (!eq && i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0) {
            bool b;
            if (!kind || !job_parse_bool(argv[i + 1], &b)) value = argv[++i];
        }
        if (!value && !kind) return errf(err, "--%s: needs a value (--%s VALUE or --%s=VALUE)", name, name, name);
        if (!strcmp(name, "job")) a->job_path = value;
        else if (!strcmp(name, "defaults") || !strcmp(name, "train.defaults")) a->defaults = value;
        else a->arg[a->n++] = (job_arg){name, value};
    }
    return 0;
}

/* ---- applying them ---- */

static int apply_one(job_config *j, const job_arg *arg, flag_state *st, errbuf *err) {
    const flag *f = find_flag(arg->name);
    if (!f) {
        return job_set_text(j, arg->name, arg->value ? arg->value : "true", err); /* errors name the key */
    }
    if (f->apply) return f->apply(j, f, arg->value, st, err);
    if (f->boolean && !arg->value) return set(j, f, f->key, "true", err);
    return set(j, f, f->key, arg->value, err);
}

/* The rules that need the whole line. */
static int finish(job_config *j, flag_state *st, errbuf *err) {
    /* A batch size with no global batch: micro-batch x accumulation x ranks. */
    if (st->batch && !job_key_given(j, "train.global_batch") && j->train.accumulation == 0)
        j->train.accumulation = 1;
    /* fsdp_qlora clips only with --apply_gradient_clipping (at --grad_norm, default 0.3). */
    if (st->clip < 1 && !isnan(st->grad_norm))
        return errf(err, "--grad_norm %g: fsdp_qlora clips only with --apply_gradient_clipping true: add it (or drop "
                         "--grad_norm)", st->grad_norm);
    if (st->clip >= 0) j->train.clip_norm = st->clip ? (isnan(st->grad_norm) ? 0.3 : st->grad_norm) : 0;
    /* fsdp_qlora's schedules: constant, or linear / cosine warming up over 10% of the steps;
     * its cosine ends at 10% of lr. */
    if (st->qlora_schedule >= 0) {
        j->train.warmup_steps = 0;
        j->train.warmup_ratio = st->qlora_schedule == JOB_SCHEDULE_CONSTANT ? 0 : 0.1;
        j->train.warmup_round = JOB_ROUND_DOWN; /* its int(0.1 x steps) */
        j->train.min_lr = st->qlora_schedule == JOB_SCHEDULE_COSINE ? 0.1 * j->train.lr : 0;

    }
    if (st->trainer_constant && (j->train.warmup_steps > 0 || j->train.warmup_ratio > 0))
        return errf(err, "--lr_scheduler_type constant has no warm-up in transformers (get_constant_schedule): use "
                         "constant_with_warmup, or drop --warmup_steps / --warmup_ratio");
    if (st->eval_off && j->train.eval_interval > 0) {
        note(st, "--eval_strategy no: no evaluation, --eval_steps %d unused (as in transformers)",
             j->train.eval_interval);
        j->train.eval_interval = 0;
    }
    return 0;
}

static void state_init(flag_state *st, job_notes *notes) {
    *st = (flag_state){.notes = notes, .clip = -1, .grad_norm = NAN, .qlora_schedule = -1};
}

int job_apply_override(job_config *j, const char *arg, errbuf *err) {
    const char *eq = strchr(arg, '=');
    if (strncmp(arg, "--", 2) != 0) return errf(err, "'%s': an override looks like --section.key=value", arg);
    if (!eq) return errf(err, "'%s': missing '=value' (an override looks like --section.key=value)", arg);
    char name[96];
    size_t n = (size_t)(eq - arg - 2);
    if (n == 0 || n >= sizeof name) return errf(err, "'%s': an override looks like --section.key=value", arg);
    memcpy(name, arg + 2, n);
    name[n] = '\0';
    if (flag_kind(name) < 0) return unknown_flag(name, err);
    flag_state st;
    state_init(&st, NULL);
    job_arg one = {name, eq + 1};
    return apply_one(j, &one, &st, err) || finish(j, &st, err) ? -1 : 0;
}

/* Without --job and --defaults: a line of fsdp_qlora's flags takes its defaults, one of the
 * Trainer's takes the Trainer's (both kinds: the user must say). */
static int choose_profile(const job_args *a, job_profile *p, const char **example, errbuf *err) {
    const char *seen[3] = {NULL, NULL, NULL};
    for (int i = 0; i < a->n; i++) {
        const flag *f = find_flag(a->arg[i].name);
        if (f && f->from != BOTH && !seen[f->from]) seen[f->from] = f->name;
    }
    if (seen[QLORA] && seen[TRAINER])
        return errf(err, "the command line mixes fsdp_qlora's flags (--%s) and the Trainer's (--%s): say whose "
                         "defaults the rest takes with --defaults fsdp_qlora, trainer or fsdpd",
                    seen[QLORA], seen[TRAINER]);
    *p = seen[QLORA] ? JOB_PROFILE_FSDP_QLORA : seen[TRAINER] ? JOB_PROFILE_TRAINER : JOB_PROFILE_FSDPD;
    *example = seen[QLORA] ? seen[QLORA] : seen[TRAINER];
    return 0;
}

int job_args_load(job_config *j, const job_args *a, job_notes *notes, errbuf *err) {
    if (notes) notes->n = 0;
    flag_state st;
    state_init(&st, notes);
    job_profile p = JOB_PROFILE_FSDPD;
    const char *example = NULL;
    if (a->defaults && job_profile_from_name(a->defaults, &p))
        return errf(err, "--defaults: '%s' is none of fsdpd, fsdp_qlora, trainer", a->defaults);
    if (!a->defaults && !a->job_path && choose_profile(a, &p, &example, err)) return -1;
    if (a->job_path) {
        if (job_load_profile(j, a->job_path, a->defaults ? (int)p : -1, err)) return -1;
    } else {
        job_apply_profile(j, p);
    }
    if (example)
        note(&st, "defaults: %s's (the command line uses its flags, e.g. --%s; --defaults fsdpd keeps fsdpd's)",
             job_profile_name(p), example);
    for (int i = 0; i < a->n; i++)
        if (apply_one(j, &a->arg[i], &st, err)) return -1;
    return finish(j, &st, err);
}
