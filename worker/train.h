/* train: the training loop of one worker — data, model, FSDP steps, learning-rate
 * schedule — independent of how the worker talks to its daemon (hooks carry that). */
#ifndef FSDP_TRAIN_H
#define FSDP_TRAIN_H

#include <stdint.h>

#include "kernels/kernels.h"
#include "proto/job.h"
#include "worker/comm.h"

typedef struct train_step_info {
    long step, total_steps;   /* step counts from 1 */
    double loss, lr, grad_norm;
    int64_t tokens;           /* unmasked targets of the global batch */
    double seconds;           /* wall time of the step */
    long layer_forwards;      /* decoder-layer forwards so far on this rank */
} train_step_info;

typedef struct train_hooks {
    void *arg;
    /* After every optimizer step. */
    void (*on_step)(void *arg, const train_step_info *info);
    /* Polled between steps: non-zero stops the loop cleanly. */
    int (*should_stop)(void *arg);
} train_hooks;

typedef struct train_env {
    const job_config *job; /* validated */
    int rank, world;
    comm *comm;            /* NULL when world is 1 */
    kctx *ctx;
    train_hooks hooks;
} train_env;

/* Runs the job's steps.  Returns 0 when every step ran (or a stop was requested), -1 with
 * the reason (naming the step and rank for a non-finite loss) otherwise.
 *
 * Test-only hooks (environment): FSDP_TEST_NAN_AT="STEP:RANK" makes that rank's loss NaN at
 * that step; FSDP_TEST_FINAL_PARAMS=PATH makes rank 0 write the final parameters (gathered,
 * fp32) to PATH as safetensors. */
int train_run(const train_env *env, errbuf *err);

#endif
