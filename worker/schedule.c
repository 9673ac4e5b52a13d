/* schedule: the learning rate at each step, as the Hugging Face schedulers give it; see schedule.h. */
#include "worker/schedule.h"

#include <math.h>

double schedule_lr(const job_config *j, long step, long total) {
    double lr = j->train.lr, min_lr = j->train.min_lr;
    long warmup = job_warmup_steps(j, total);
    if (step < warmup) return lr * (double)step / (double)warmup;
    long decay_steps = total - warmup > 1 ? total - warmup : 1;
    double progress = (double)(step - warmup) / (double)decay_steps;
    if (progress > 1.0) progress = 1.0;
    double factor = 1.0;
    switch (j->train.schedule) {
    case JOB_SCHEDULE_CONSTANT: factor = 1.0; break;
    case JOB_SCHEDULE_LINEAR: factor = 1.0 - progress; break;
    case JOB_SCHEDULE_COSINE: factor = 0.5 * (1.0 + cos(M_PI * progress)); break;
    }
    return min_lr + (lr - min_lr) * factor;
}
