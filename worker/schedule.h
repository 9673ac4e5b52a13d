/* schedule: the learning rate at each optimizer step, as the Hugging Face schedulers give it
 * (get_{constant,linear,cosine}_schedule_with_warmup), with a floor of train.min_lr. */
#ifndef FSDP_SCHEDULE_H
#define FSDP_SCHEDULE_H

#include "proto/job.h"

/* The learning rate of optimizer step `step` (0-based) of `total` steps: a linear warmup
 * from 0 over job_warmup_steps (train.warmup_steps, or train.warmup_ratio of the steps),
 * then constant, linear or cosine decay from lr to min_lr. */
double schedule_lr(const job_config *j, long step, long total);

#endif
