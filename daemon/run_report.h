/* run_report: a run that explains itself (F39).  At the start, before the model loads, the
 * job as resolved (grouped by section, each key set away from its default marked with *) and
 * what fsdpd derived from it, in the log and as two files written atomically:
 * OUTPUT_DIR/job.json (the resolved job as a job file: every key; `fsdpd --job` and `fsdpctl
 * plan` load it and get the same job) and OUTPUT_DIR/run.json (proto/run_record.h).  At the end
 * the summary (steps, tokens, wall time, tokens/s, MFU on GPUs, losses, the checkpoints kept,
 * the output and how to load it), in the log and added to run.json. */
#ifndef FSDP_RUN_REPORT_H
#define FSDP_RUN_REPORT_H

#include <jansson.h>

#include "base/errbuf.h"
#include "proto/job.h"
#include "proto/model_config.h"
#include "proto/run_record.h"

#define RUN_JOB_FILE "job.json"

/* The derived values of job j (resolved and validated for nodes x workers ranks) over the
 * model of config cfg (its config.json object `config`, for the base's quantization),
 * resuming from resume_dir ("" or NULL: none) at resume_step, into *r (no summary); the
 * start time is now, the version and CUDA architectures this build's. */
int run_report_derive(run_record *r, const job_config *j, const llama_config *cfg, const json_t *config,
                      const char *resume_dir, long long resume_step, int nodes, int workers, int restart,
                      errbuf *err);

/* The resolved block into the log (daemon/log.h), then job.json and run.json in output.dir. */
int run_report_start(const run_record *r, const job_config *j, errbuf *err);

/* What the run measured, from rank 0's METRICS (run_report_note_step) and eval losses. */
typedef struct run_progress {
    double started;                  /* clock_now_s() at the run's start */
    long long steps_run;             /* steps of this run (a resumed run's first is resume_step + 1) */
    long long last_step, total_steps, tokens_seen, tokens_run;
    double seconds_run, last_loss;
    double recent[16];               /* the last steps' seconds, a ring */
    int n_recent;
    int has_eval;
    double final_eval, best_eval;
    long long best_eval_step;
} run_progress;

/* Notes one step; and the step line's figures: elapsed seconds since the start, the ETA (the
 * mean of the last steps' seconds x the steps left; -1 before any step). */
void run_report_note_step(run_progress *p, long long step, long long total_steps, double loss, long long tokens,
                          long long tokens_seen, double seconds);
void run_report_note_eval(run_progress *p, long long step, double eval_loss);
double run_report_eta(const run_progress *p);
/* "1h02m03s", "4m05s", "12s" into out. */
void run_report_duration(double seconds, char *out, size_t n);

/* The summary from p into r (the checkpoints kept listed from checkpoint.dir), logged, and
 * run.json written again. */
int run_report_finish(run_record *r, const job_config *j, const run_progress *p, errbuf *err);

#endif
