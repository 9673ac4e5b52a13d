/* requeue: fsdpd puts its own SLURM job back in the queue after a stop that committed a
 * checkpoint (DESIGN.md, "Signals and SLURM").
 *
 * The supervisor stops a run with SUPERVISOR_PREEMPTED after a synchronous checkpoint of the
 * step in progress on SIGTERM (a preemption: SLURM sends the steps SIGCONT + SIGTERM, then
 * SIGKILL after GraceTime) and on SIGUSR1 when it means requeue (requeue_on_usr1: the
 * time-limit warning of `--signal=USR1@N`).  Then, under SLURM, node 0 runs `scontrol requeue
 * $SLURM_JOB_ID` and fsdpd exits 0: a job that exits inside GraceTime ends COMPLETED and
 * SLURM would not requeue it itself.  The requeued run (SLURM_RESTART_COUNT=1, ...) resumes
 * from `latest`.  A run that committed no checkpoint past the one it started from does not
 * requeue (no loop of runs that never get anywhere), nor one whose job is no longer RUNNING
 * (`scontrol show job`: after `scancel` it is COMPLETING, and a requeue would bring the
 * cancelled job back — observed on 22.05): it exits 1.
 *
 * SIGUSR1 may come before the supervisor's loop handles it (the warning can come up to a
 * minute early, before a requeued run is set up): requeue_catch_early_usr1, fsdpd's first
 * instruction, keeps it from killing fsdpd, and the supervisor takes it over
 * (requeue_take_early_usr1) once its loop listens. */
#ifndef FSDP_REQUEUE_H
#define FSDP_REQUEUE_H

#include <stdint.h>

#include "base/errbuf.h"
#include "daemon/slurm.h"
#include "proto/job.h"

/* Catches SIGUSR1 until the supervisor's loop handles it (and again between runs). */
void requeue_catch_early_usr1(void);
/* 1 (once) when a SIGUSR1 was caught so. */
int requeue_take_early_usr1(void);

/* Whether SIGUSR1 stops the job for a requeue (runtime.on_usr1; auto: under SLURM). */
int requeue_on_usr1(const job_config *job);

/* The step of checkpoint.dir's `latest`, -1 when there is none. */
int requeue_latest_step(const job_config *job, int64_t *step, errbuf *err);
/* The same when fsdpd starts: -1 (logged) when `latest` cannot be read, which the run may
 * mend (checkpoint.resume never) or fail on by itself. */
int64_t requeue_start_step(const job_config *job);

/* After a run the supervisor stopped with SUPERVISOR_PREEMPTED (why: its message): requeues
 * the job when it may (see above) and returns fsdpd's exit status.  start_step is `latest`
 * when fsdpd started (requeue_latest_step).  scontrol is looked up in PATH. */
int requeue_after_stop(const job_config *job, const slurm_env *env, int64_t start_step, const char *why);

#endif
