/* run_record: OUTPUT_DIR/run.json, what fsdpd derived for a job and, once it ended, how it went
 * (F39).  fsdpd writes it at the start of each run, before the model loads (beside job.json,
 * the resolved job), and again at the end with the summary; `fsdpctl status --output DIR`
 * reads it after the job.  One JSON object, every key required, no other key:
 *
 *   "format": "fsdpd-run", "version": 1,
 *   "fsdpd_version" (git describe at build time), "cuda_archs" (the build's, "" without CUDA),
 *   "started" (seconds since the epoch), "job_id" (SLURM_JOB_ID, "" outside SLURM),
 *   "restart" (fsdpd's restarts before this run), "backend" ("cpu", "cuda"),
 *   "world_size", "nodes", "workers_per_node",
 *   "micro_batch", "grad_accum", "global_batch" (= micro_batch x grad_accum x world_size),
 *   "seq_len", "tokens_per_step" (global_batch x seq_len: the tokens a step computes),
 *   "max_steps" (0: "epochs" passes, the count known once the data loads), "epochs",
 *   "train_type" ("full", "lora", "qlora"), "total_params" (the model's), "trainable_params",
 *   "lora_rank", "lora_alpha", "lora_scale", "lora_targets" (a list of module names; 0, 0, 0
 *   and [] for a full fine-tune), "quant" ("none", "nf4", "nf4-bnb": the base as saved),
 *   "cpu_offload", "offload_params", "recompute" (the activation-checkpointing plan in words),
 *   "peak_gpu_bytes" (the memory plan's peak a worker), "compute_dtype", "storage_dtype"
 *   ("f32", "bf16"), "dtypes" (both in words), "checkpoint_dir", "output_dir",
 *   "resume_from" (a checkpoint directory, "" for none), "resume_step",
 *   "summary": null while the job runs, then
 *     {"ended", "steps", "tokens" (label tokens), "tokens_computed", "wall_s", "tokens_per_s",
 *      "mfu" (null on the CPU backend), "final_loss", "final_eval_loss", "best_eval_loss"
 *      (null without eval), "best_eval_step", "checkpoints" (the committed ones kept, names),
 *      "adapter" (the output is a PEFT adapter), "load" (the line that loads the output)}. */
#ifndef FSDP_RUN_RECORD_H
#define FSDP_RUN_RECORD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/errbuf.h"
#include "base/path.h"

#define RUN_RECORD_FILE "run.json"
#define RUN_RECORD_FORMAT "fsdpd-run"
#define RUN_RECORD_VERSION 1
#define RUN_RECORD_MAX (256u << 10) /* bytes a run.json may hold */
#define RUN_MAX_TARGETS 7
#define RUN_MAX_KEPT 16

typedef struct run_summary {
    int64_t ended, steps, tokens, tokens_computed;
    double wall_s, tokens_per_s;
    bool has_mfu;
    double mfu;
    double final_loss;
    bool has_eval;
    double final_eval_loss, best_eval_loss;
    int64_t best_eval_step;
    int n_checkpoints;
    char checkpoints[RUN_MAX_KEPT][64];
    bool adapter;
    char load[2 * PATH_BYTES + 128];
} run_summary;

typedef struct run_record {
    char fsdpd_version[64], cuda_archs[128];
    int64_t started;
    char job_id[64];
    int64_t restart;
    char backend[8];
    int64_t world_size, nodes, workers_per_node;
    int64_t micro_batch, grad_accum, global_batch, seq_len, tokens_per_step, max_steps, epochs;
    char train_type[8];
    int64_t total_params, trainable_params;
    int64_t lora_rank;
    double lora_alpha, lora_scale;
    int n_lora_targets;
    char lora_targets[RUN_MAX_TARGETS][16];
    char quant[16];
    bool cpu_offload, offload_params;
    char recompute[192];
    int64_t peak_gpu_bytes;
    char compute_dtype[8], storage_dtype[8], dtypes[96];
    char checkpoint_dir[PATH_BYTES], output_dir[PATH_BYTES], resume_from[PATH_BYTES];
    int64_t resume_step;
    bool has_summary;
    run_summary summary;
} run_record;

/* The record as JSON text (indented, malloc'd into *text); -1 when a string is not UTF-8. */
int run_record_to_json(const run_record *r, char **text, errbuf *err);
/* Parses run.json text: every key present, of its type and in range, no other key (in the
 * summary too); `name` starts every message.  *r is zeroed first, and again on error. */
int run_record_parse(run_record *r, const char *text, size_t len, const char *name, errbuf *err);
/* Reads DIR/run.json (at most RUN_RECORD_MAX bytes). */
int run_record_load(run_record *r, const char *output_dir, errbuf *err);

#endif
