/* step_scalars: the figures of one of rank 0's METRICS that runtime.log_to's destinations
 * (TensorBoard, MLflow) get, under the same names in both:
 *   train/loss, train/lr, train/grad_norm, train/tokens_per_s (the step's label tokens over its
 *   seconds, as the step line), memory/bytes, memory/peak_bytes (metrics.jsonl's mem_bytes and
 *   mem_peak_bytes), and eval/loss at a step with an eval loss. */
#ifndef FSDP_STEP_SCALARS_H
#define FSDP_STEP_SCALARS_H

#include <stddef.h>

#include "proto/msg.h"

#define STEP_SCALARS_MAX 7

typedef struct step_scalar {
    const char *name;
    double value;
} step_scalar;

/* The step's scalars into out; their count. */
size_t step_scalars(const msg_metrics *m, step_scalar out[STEP_SCALARS_MAX]);

#endif
